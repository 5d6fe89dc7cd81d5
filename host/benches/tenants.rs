//! Many tenants in one process: instantiation time per tenant (pooled, vs a
//! plain engine in the same run), resident memory per idle tenant (vs the
//! guest's own linear memory), and a request to every one of them to show
//! they are all live (vs the same requests to a single tenant).
//!
//! ```text
//! cargo bench -p statestore --bench tenants            # 2,000 tenants
//! cargo bench -p statestore --bench tenants -- --quick # 1,000 tenants
//! TENANTS=5000 cargo bench -p statestore --bench tenants
//! ```
//!
//! Under `cargo test --benches` (no `--bench` argument) it runs once with 20.

use std::hint::black_box;
use std::time::Instant;

use statestore::store::StoreOptions;
use statestore::store::tenant::{Fleet, Tenant};
use statestore::{InboundMessage, Output, Runtime, StoreLimits};
use statestore_guest::rpc::REQUEST_TOPIC;

/// A `/proc/self/status` field, in bytes.
fn status_bytes(field: &str) -> usize {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn request(n: u32, parts: &[&[u8]]) -> InboundMessage {
    let mut payload = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        payload.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        payload.extend_from_slice(p);
        payload.extend_from_slice(b"\r\n");
    }
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload,
        qos: 1,
        response_topic: Some("clients/bench/response".into()),
        correlation_data: Some(n.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        user_properties: vec![(
            "__ts".into(),
            format!("{:015}:00000:bench", statestore::store::driver::now_ms()),
        )],
        ..InboundMessage::default()
    }
}

fn ok(outputs: &[Output]) -> bool {
    outputs
        .iter()
        .any(|o| matches!(o, Output::Publish(m) if m.payload == b"+OK\r\n"[..]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = if let Some(n) = std::env::var("TENANTS").ok().and_then(|v| v.parse().ok()) {
        n
    } else if !args.iter().any(|a| a == "--bench") {
        20
    } else if args.iter().any(|a| a == "--quick") {
        1_000
    } else {
        2_000
    };
    let limits = StoreLimits {
        memory_bytes: Some(64 << 20),
        call_ms: Some(1000),
    };
    let opts = StoreOptions::volatile("StateStore", "statestore");

    // Baseline: the same component on a plain engine (no pool, no epoch).
    let plain = Runtime::new().expect("component");
    let rounds = 50.min(n);
    let t = Instant::now();
    for _ in 0..rounds {
        black_box(
            plain
                .instantiate(&statestore::Config::default())
                .expect("instantiate"),
        );
    }
    let plain_us = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;

    let rss0 = status_bytes("VmRSS:");
    let vm0 = status_bytes("VmSize:");
    let mut fleet = Fleet::new(n, 64 << 20, None).expect("engine");
    let runtime = fleet
        .runtime_from_bytes(statestore::GUEST_COMPONENT, limits)
        .expect("component");
    let rss1 = status_bytes("VmRSS:");
    let t = Instant::now();
    let mut tenants: Vec<Tenant> = (0..n)
        .map(|i| Tenant::open(&format!("t{i}"), runtime.clone(), &opts).expect("tenant"))
        .collect();
    let open_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let rss2 = status_bytes("VmRSS:");
    let vm2 = status_bytes("VmSize:");
    let linear = tenants[0].store_mut().memory_bytes();

    // One SET and one GET to every tenant: all live.
    let now = statestore::store::driver::now_ms();
    let t = Instant::now();
    for (i, tenant) in tenants.iter_mut().enumerate() {
        let id = u32::try_from(i).unwrap_or(u32::MAX);
        let out = tenant
            .handle(&[request(id, &[b"SET", b"k", b"v"])], now)
            .expect("SET");
        assert!(ok(&out), "tenant {i} answered");
        black_box(
            tenant
                .handle(&[request(id, &[b"GET", b"k"])], now)
                .expect("GET"),
        );
    }
    let spread_us = t.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;
    let rss3 = status_bytes("VmRSS:");
    // The same requests to one tenant (its cache lines stay warm).
    let one = &mut tenants[0];
    let t = Instant::now();
    for i in 0..n {
        let id = u32::try_from(i + n).unwrap_or(u32::MAX);
        black_box(
            one.handle(&[request(id, &[b"SET", b"k", b"v"])], now)
                .expect("SET"),
        );
        black_box(
            one.handle(&[request(id, &[b"GET", b"k"])], now)
                .expect("GET"),
        );
    }
    let single_us = t.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;

    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!("## {n} tenants in one process (pooling allocator, 64 MiB cap each)\n");
    println!("| measure | value | baseline (same run) | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| instantiate a tenant (pooled, with its store) | {open_us:.1} us | {plain_us:.1} us plain engine | {:.2} |",
        open_us / plain_us
    );
    let per_idle = rss2.saturating_sub(rss1) / n;
    println!(
        "| resident memory per idle tenant | {:.0} KiB | {:.0} KiB of guest linear memory | {:.2} |",
        per_idle as f64 / 1024.0,
        linear as f64 / 1024.0,
        per_idle as f64 / linear as f64
    );
    println!(
        "| resident after one SET+GET each | {:.0} KiB per tenant | | |",
        rss3.saturating_sub(rss1) as f64 / n as f64 / 1024.0
    );
    println!(
        "| request, each to another tenant | {spread_us:.1} us | {single_us:.1} us all to one tenant | {:.2} |",
        spread_us / single_us
    );
    println!(
        "| live tenants | {n} | | |\n| process RSS | {:.0} MiB (engine and pool {:.0} MiB) | | |\n| address space reserved | {:.0} GiB | | |",
        mib(rss3),
        mib(rss1.saturating_sub(rss0)),
        vm2.saturating_sub(vm0) as f64 / (1u64 << 30) as f64
    );
}
