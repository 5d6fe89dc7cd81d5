//! The state machine natively and through the wasm component, operation by
//! operation, so the cost of the component boundary is a ratio measured in
//! the same run. `cargo bench -p statestore --bench guest`.
//!
//! Every request is a complete MQTT message as a host hands it over (topic,
//! properties, RESP3 payload), and every iteration takes all outputs, as a
//! host must. "per op" = one request handled and its outputs taken.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use statestore::{Backend, Config, InboundMessage, NativeStore, Runtime, WasmStore};
use statestore_guest::hlc::{Clock, Hlc};
use statestore_guest::resp3;
use statestore_guest::rpc::REQUEST_TOPIC;

const T0: u64 = 1_700_000_000_000;

fn request(parts: &[&[u8]], corr: u64, now: u64) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: resp3::request(parts),
        qos: 1,
        response_topic: Some("clients/bench/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response".into()),
        correlation_data: Some(corr.to_be_bytes().repeat(2)),
        message_expiry_interval: Some(10),
        content_type: Some("application/octet-stream".into()),
        payload_format_indicator: Some(0),
        user_properties: vec![
            ("__srcId".into(), "bench".into()),
            ("__ts".into(), format!("{now:015}:00000:bench")),
            ("__protVer".into(), "1.0".into()),
        ],
        client_id: None,
        received_at: None,
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

fn stores(rt: &Runtime) -> Vec<(&'static str, Box<dyn Backend>)> {
    let config = Config::default();
    let wasm: WasmStore = rt.instantiate(&config).expect("instantiate");
    let mut typed: WasmStore = rt.instantiate(&config).expect("instantiate");
    typed.use_typed_calls(true);
    vec![
        ("native", Box::new(NativeStore::new(config).expect("store"))),
        ("wasm", Box::new(wasm)),
        ("wasm-typed", Box::new(typed)),
    ]
}

/// Requests handled in batches of `batch` per call (wasm: one call crossing).
fn bench_requests(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    make: &dyn Fn(u64) -> Vec<&'static [u8]>,
) {
    let mut g = c.benchmark_group(name);
    for batch in [1usize, 16, 64] {
        g.throughput(Throughput::Elements(batch as u64));
        for (kind, mut store) in stores(rt) {
            // Pre-fill so GET / DEL find keys.
            let fill: Vec<InboundMessage> = (0..1000u64)
                .map(|i| request(&[b"SET", key(i), b"value-of-100-bytes"], 1_000_000 + i, T0))
                .collect();
            store.handle_messages(&fill, T0).expect("fill");
            let mut n = 0u64;
            g.bench_with_input(BenchmarkId::new(kind, batch), &batch, |b, &batch| {
                b.iter_batched(
                    || {
                        (0..batch)
                            .map(|_| {
                                n += 1;
                                request(&make(n), n, T0)
                            })
                            .collect::<Vec<_>>()
                    },
                    |msgs| store.handle_messages(&msgs, T0).expect("handle"),
                    criterion::BatchSize::SmallInput,
                );
            });
        }
    }
    g.finish();
}

static KEYS: std::sync::LazyLock<Vec<Vec<u8>>> = std::sync::LazyLock::new(|| {
    (0..1000)
        .map(|i| format!("key-{i:04}").into_bytes())
        .collect()
});

fn key(i: u64) -> &'static [u8] {
    &KEYS[(i % 1000) as usize]
}

fn benches(c: &mut Criterion) {
    let rt = Runtime::new().expect("component");
    // RESP3 decode of a small SET (native only: inside the guest it is part of every request).
    let set = resp3::request(&[
        b"SET",
        b"key-0001",
        b"value-of-100-bytes",
        b"NX",
        b"PX",
        b"1000",
    ]);
    c.bench_function("resp3_decode/set", |b| {
        b.iter(|| resp3::decode_request(std::hint::black_box(&set)))
    });
    // HLC receive + format.
    c.bench_function("hlc/receive_format", |b| {
        let mut clock = Clock::new("StateStore".into());
        let remote = Hlc {
            wall: T0,
            counter: 0,
            node: "client".into(),
        };
        let mut now = T0;
        b.iter(|| {
            now += 1;
            clock.receive(&remote, now).map(|h| h.to_string())
        })
    });
    // The floor of a call: an empty batch through handle-wire (lowering,
    // the call, lifting, post-return), and the host's share of a GET: encoding
    // the request and decoding its outputs.
    let mut empty = rt.instantiate(&Config::default()).expect("instantiate");
    c.bench_function("call/empty_batch_wasm", |b| {
        b.iter(|| empty.handle_messages(&[], T0).expect("call"))
    });
    let get = request(&[b"GET", key(1)], 1, T0);
    let mut probe = NativeStore::new(Config::default()).expect("store");
    c.bench_function("wire/host_encode_get", |b| {
        b.iter(|| statestore_guest::wire::encode_batch(&[statestore::Input::Message(&get)]))
    });
    // The reply as the guest writes it (the compact form).
    let batch = statestore_guest::wire::encode_batch(&[statestore::Input::Message(&get)]);
    let encoded = probe.0.handle_wire(&batch, T0).expect("get");
    c.bench_function("wire/host_decode_get_reply", |b| {
        b.iter(|| statestore_guest::wire::decode_outputs(&encoded, &batch).expect("decode"))
    });
    bench_requests(c, &rt, "set", &|_| {
        vec![b"SET", key(0), b"value-of-100-bytes"]
    });
    bench_requests(c, &rt, "get", &|n| vec![b"GET", key(n)]);
    bench_requests(c, &rt, "del", &|n| vec![b"DEL", key(n)]);
    // Notification fan-out: a SET on a key 100 clients observe.
    let mut g = c.benchmark_group("notify_fanout_100");
    for (kind, mut store) in stores(&rt) {
        let observe: Vec<InboundMessage> = (0..100u64)
            .map(|i| {
                let mut m = request(&[b"KEYNOTIFY", b"hot"], 5_000_000 + i, T0);
                m.client_id = Some(format!("observer-{i}"));
                m
            })
            .collect();
        store.handle_messages(&observe, T0).expect("observe");
        let mut n = 0u64;
        g.bench_function(kind, |b| {
            b.iter(|| {
                n += 1;
                store
                    .handle_messages(&[request(&[b"SET", b"hot", b"v"], n, T0)], T0)
                    .expect("set")
            })
        });
    }
    g.finish();
    // Expiry of 10,000 keys at one timeout.
    let mut g = c.benchmark_group("expire_10k");
    g.throughput(Throughput::Elements(10_000));
    for (kind, _) in stores(&rt).into_iter().filter(|(k, _)| *k != "wasm-typed") {
        g.bench_function(kind, |b| {
            b.iter_batched(
                || {
                    let mut store: Box<dyn Backend> = if kind == "wasm" {
                        Box::new(rt.instantiate(&Config::default()).expect("instantiate"))
                    } else {
                        Box::new(NativeStore::new(Config::default()).expect("store"))
                    };
                    let msgs: Vec<InboundMessage> = (0..10_000u64)
                        .map(|i| {
                            let k = format!("exp-{i}");
                            request(&[b"SET", k.as_bytes(), b"v", b"PX", b"1000"], i, T0)
                        })
                        .collect();
                    store.handle_messages(&msgs, T0).expect("fill");
                    store
                },
                |mut store| store.timeout(T0 + 1000).expect("timeout"),
                criterion::BatchSize::LargeInput,
            );
        });
    }
    g.finish();
}

criterion_group! {
    name = guest;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = benches
}
/// wasm/native per request measured in alternation: each round times one
/// batch natively and then the same-shaped batch in wasm, microseconds apart,
/// so that the machine's drift (these machines are shared) hits both; the
/// figure is the median of the per-round ratios. Printed before criterion's
/// own (sequential) measurements. Bounded: at most 2,000 rounds or 1.5 s per
/// row.
fn interleaved(rt: &Runtime, quick: bool) {
    use std::time::Instant;
    // The engine the servers run: pooling allocator, epoch interruption and
    // a per-call deadline (a one-tenant fleet's settings; a memory cap large
    // enough for the dedup cache of 128,000 SETs of the batch-64 row).
    let served_engine = statestore::runtime::wasm::engine(&statestore::EngineOptions {
        pool: Some(statestore::PoolOptions {
            instances: 6,
            max_memory: 1 << 30,
        }),
        epoch_interruption: true,
        fuel: false,
    })
    .expect("engine");
    let served = Runtime::load(&served_engine, statestore::GUEST_COMPONENT, None)
        .expect("component")
        .with_limits(statestore::StoreLimits {
            memory_bytes: Some(1 << 30),
            call_ms: Some(1000),
        });
    println!("wasm/native per request, interleaved rounds (median of per-round ratios):");
    println!(
        "| operation | batch | rounds | native us/op | wasm us/op | wasm / native | served us/op | served / native |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    type Make = fn(u64) -> Vec<&'static [u8]>;
    let ops: [(&str, Make); 3] = [
        ("SET", |_| vec![b"SET", key(0), b"value-of-100-bytes"]),
        ("GET", |n| vec![b"GET", key(n)]),
        ("DEL", |n| vec![b"DEL", key(n)]),
    ];
    for (name, make) in ops {
        for batch in [1usize, 16, 64] {
            let mut stores = stores(rt);
            stores.truncate(2); // native, wasm
            stores.push((
                "served",
                Box::new(served.instantiate(&Config::default()).expect("instantiate")),
            ));
            for (_, store) in &mut stores {
                let fill: Vec<InboundMessage> = (0..1000u64)
                    .map(|i| request(&[b"SET", key(i), b"value-of-100-bytes"], 1_000_000 + i, T0))
                    .collect();
                store.handle_messages(&fill, T0).expect("fill");
            }
            let (mut ratios, mut native, mut wasm) = (Vec::new(), Vec::new(), Vec::new());
            let (mut served_ratios, mut served_times) = (Vec::new(), Vec::new());
            let started = Instant::now();
            let max_rounds = if quick { 3 } else { 2_000 };
            let mut n = 0u64;
            while ratios.len() < max_rounds && started.elapsed().as_secs_f64() < 1.5 {
                let mut times = [0f64; 3];
                for (i, (_, store)) in stores.iter_mut().enumerate() {
                    let msgs: Vec<InboundMessage> = (0..batch)
                        .map(|j| {
                            n += 1;
                            // The same requests for both: n restarts per store.
                            let k = (ratios.len() * batch + j) as u64;
                            request(&make(k), n, T0)
                        })
                        .collect();
                    let t = Instant::now();
                    let out = store.handle_messages(&msgs, T0).expect("handle");
                    times[i] = t.elapsed().as_secs_f64() / batch as f64;
                    drop(out);
                }
                native.push(times[0]);
                wasm.push(times[1]);
                ratios.push(times[1] / times[0]);
                served_times.push(times[2]);
                served_ratios.push(times[2] / times[0]);
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let rounds = ratios.len();
            println!(
                "| {name} | {batch} | {rounds} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                median(&mut native) * 1e6,
                median(&mut wasm) * 1e6,
                median(&mut ratios),
                median(&mut served_times) * 1e6,
                median(&mut served_ratios)
            );
        }
    }
    println!();
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let rt = Runtime::new().expect("component");
    interleaved(&rt, !bench);
    drop(rt);
    guest();
    Criterion::default().configure_from_args().final_summary();
}
