//! Memory per key, and how expiry and notifications cost as keys and
//! observers grow (1 k, 100 k, 1 M), natively and in the wasm component, in
//! one run.
//!
//! ```sh
//! cargo bench -p statestore --bench scale            # 1k, 100k, 1M
//! cargo bench -p statestore --bench scale -- --quick # 1k, 100k
//! ```
//!
//! Under `cargo test --benches` (no `--bench` argument) it runs once at a tiny
//! size as a smoke test, so CI builds and exercises it.
//!
//! - **Memory per key**: keys are loaded with journal `put` records (what a
//!   restart replays), so no dedup reply is counted. Guest memory is the wasm
//!   instance's linear memory (what the process really holds for it, pages
//!   included); native is live heap bytes from a counting allocator (a 64-bit
//!   layout: pointers are twice the size).
//! - **Expiry**: a SET with PX into a store that already has N keys with a
//!   TTL, and the expiry of keys at a timeout, per key.
//! - **Notifications**: a SET on a key with one observer while N keys are
//!   observed (by N clients), and a SET on one key that N clients observe
//!   (per notification delivered).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use statestore::{Backend, Config, InboundMessage, NativeStore, Output, Runtime};
use statestore_guest::journal;
use statestore_guest::resp3;
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::table::{EntryRef, Version};

/// Counts live heap bytes, for the native store's memory. The only unsafe
/// code of the benches: a global allocator has to be.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a
// counter is updated beside it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const T0: u64 = 1_700_000_000_000;
const VALUE: &[u8] = b"value-0123456789"; // 16 bytes

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:07}").into_bytes() // 11 bytes
}

fn request(parts: &[&[u8]], corr: u64, client: &str) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: resp3::request(parts),
        qos: 1,
        response_topic: Some(format!("clients/{client}/statestore/response")),
        correlation_data: Some(corr.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        content_type: None,
        payload_format_indicator: None,
        user_properties: vec![
            ("__ts".into(), format!("{T0:015}:00000:{client}")),
            ("__protVer".into(), "1.0".into()),
        ],
        client_id: Some(client.into()),
        received_at: None,
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// Loads keys 0..n with journal records (batches of 10,000).
fn load(store: &mut dyn Backend, n: usize, expires_at: Option<u64>) {
    let mut i = 0;
    while i < n {
        let end = (i + 10_000).min(n);
        let records: Vec<Vec<u8>> = (i..end)
            .map(|k| {
                journal::put(
                    &key(k),
                    EntryRef {
                        value: VALUE,
                        version: Version {
                            wall: T0,
                            counter: k as u32,
                        },
                        fencing_token: None,
                        expires_at,
                        persist: true,
                    },
                )
            })
            .collect();
        store.replay(&records).expect("replay");
        i = end;
    }
}

fn native() -> NativeStore {
    NativeStore::new(Config::default()).expect("store")
}

/// Seconds per call of `f`, best of three rounds of `count` calls.
fn per_op(count: usize, mut f: impl FnMut(usize)) -> f64 {
    let mut best = f64::MAX;
    for round in 0..3 {
        let start = Instant::now();
        for i in 0..count {
            f(round * count + i);
        }
        best = best.min(start.elapsed().as_secs_f64() / count as f64);
    }
    best
}

fn us(s: f64) -> String {
    format!("{:.2}", s * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let sizes: Vec<usize> = if !bench {
        vec![1_000]
    } else if args.iter().any(|a| a == "--quick") {
        vec![1_000, 100_000]
    } else {
        vec![1_000, 100_000, 1_000_000]
    };
    let rt = Runtime::new().expect("component");
    let raw = key(0).len() + VALUE.len();

    println!("## Memory per key ({raw} bytes of key and value each)\n");
    println!(
        "| keys | TTL | wasm bytes/key | wasm overhead | native bytes/key | native overhead |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &sizes {
        for ttl in [None, Some(T0 + 3_600_000)] {
            let mut wasm = rt.instantiate(&Config::default()).expect("instantiate");
            let before = wasm.memory_bytes();
            load(&mut wasm, n, ttl);
            let wasm_per = (wasm.memory_bytes() - before) as f64 / n as f64;
            let live = LIVE.load(Ordering::Relaxed);
            let mut store = native();
            load(&mut store, n, ttl);
            let native_per = (LIVE.load(Ordering::Relaxed) - live) as f64 / n as f64;
            drop(store);
            println!(
                "| {n} | {} | {wasm_per:.1} | {:.1} | {native_per:.1} | {:.1} |",
                if ttl.is_some() { "yes" } else { "no" },
                wasm_per - raw as f64,
                native_per - raw as f64,
            );
        }
    }

    println!("\n## Expiry as keys with a TTL grow (us per key)\n");
    println!(
        "| keys with TTL | SET PX native | SET PX wasm | ratio | expire native | expire wasm | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let ops = if bench { 2_000 } else { 50 };
    for &n in &sizes {
        let mut row = Vec::new();
        let mut expire = Vec::new();
        for kind in ["native", "wasm"] {
            let mut store: Box<dyn Backend> = if kind == "wasm" {
                Box::new(rt.instantiate(&Config::default()).expect("instantiate"))
            } else {
                Box::new(native())
            };
            // N keys expiring late; the measured ones expire at T0 + 1000.
            load(&mut *store, n, Some(T0 + 3_600_000));
            let set = per_op(ops, |i| {
                let k = format!("ttl-{i}");
                let m = request(
                    &[b"SET", k.as_bytes(), VALUE, b"PX", b"1000"],
                    i as u64,
                    "c",
                );
                store.handle_messages(&[m], T0).expect("set");
            });
            // 3 rounds of `ops` keys are due at T0 + 1000: timer calls
            // expire them (4,096 a call, each but the last ending `more`).
            let start = Instant::now();
            loop {
                let outputs = store.timeout(T0 + 1_000).expect("timeout");
                match outputs.as_slice() {
                    [] => break,
                    [Output::More(0)] => continue,
                    other => panic!("nobody observes, nothing is journaled: {other:?}"),
                }
            }
            let exp = start.elapsed().as_secs_f64() / (3 * ops) as f64;
            row.push(set);
            expire.push(exp);
        }
        println!(
            "| {n} | {} | {} | {:.2} | {} | {} | {:.2} |",
            us(row[0]),
            us(row[1]),
            row[1] / row[0],
            us(expire[0]),
            us(expire[1]),
            expire[1] / expire[0],
        );
    }

    println!("\n## Every key due at once: the store keeps answering (wasm)\n");
    println!(
        "| keys due | calls to expire all | longest timer call | GET while expiring: median | longest | GET, nothing due: median | ratio of medians |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let mut store = rt.instantiate(&Config::default()).expect("instantiate");
        // Baseline: GETs on a store of n keys, none due.
        load(&mut store, n, Some(T0 + 3_600_000));
        let mut idle = Vec::new();
        for i in 0..200 {
            let k = key(i * 7 % n);
            let m = request(&[b"GET", &k], i as u64, "r");
            let start = Instant::now();
            store.handle_messages(&[m], T0).expect("get");
            idle.push(start.elapsed().as_secs_f64());
        }
        drop(store);
        // Every key due at T0 + 1000; a timer call and a GET in turn (as
        // the server's driver interleaves them), until nothing is left.
        let mut store = rt.instantiate(&Config::default()).expect("instantiate");
        load(&mut store, n, Some(T0 + 1_000));
        let (mut calls, mut longest_call, mut gets) = (0, 0f64, Vec::new());
        loop {
            let start = Instant::now();
            let outputs = store.timeout(T0 + 1_000).expect("timeout");
            longest_call = longest_call.max(start.elapsed().as_secs_f64());
            calls += 1;
            let m = request(&[b"GET", b"absent"], calls as u64, "r");
            let start = Instant::now();
            let replies = store.handle_messages(&[m], T0 + 1_000).expect("get");
            gets.push(start.elapsed().as_secs_f64());
            assert!(
                replies
                    .iter()
                    .any(|o| matches!(o, Output::Publish(p) if *p.payload == *b"$-1\r\n")),
                "a GET between timer calls is answered"
            );
            if outputs.is_empty() {
                break;
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let longest_get = gets.iter().copied().fold(0f64, f64::max);
        let (busy, quiet) = (median(&mut gets), median(&mut idle));
        println!(
            "| {n} | {calls} | {:.2} ms | {} us | {:.2} ms | {} us | {:.1} |",
            longest_call * 1e3,
            us(busy),
            longest_get * 1e3,
            us(quiet),
            busy / quiet,
        );
    }

    println!("\n## SCAN (keys listed per second, default pages of 1,000 keys)\n");
    println!(
        "| keys | all keys (`*`): native | wasm | ratio | none match (`x*`): native | wasm | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let mut all = Vec::new();
        let mut none = Vec::new();
        for kind in ["native", "wasm"] {
            let mut store: Box<dyn Backend> = if kind == "wasm" {
                Box::new(rt.instantiate(&Config::default()).expect("instantiate"))
            } else {
                Box::new(native())
            };
            load(&mut *store, n, None);
            let mut corr = 0;
            let rounds = if bench { 3 } else { 1 };
            let best = |store: &mut dyn Backend, pattern: &[u8], corr: &mut u64, want: usize| {
                let mut best = f64::MAX;
                for _ in 0..rounds {
                    let start = Instant::now();
                    let (keys, _) = scan_all(store, pattern, corr);
                    best = best.min(start.elapsed().as_secs_f64());
                    assert_eq!(keys, want);
                }
                n as f64 / best
            };
            all.push(best(&mut *store, b"*", &mut corr, n));
            none.push(best(&mut *store, b"x*", &mut corr, 0));
        }
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} |",
            all[0],
            all[1],
            all[1] / all[0],
            none[0],
            none[1],
            none[1] / none[0],
        );
    }

    println!("\n## Notifications as observers grow (us)\n");
    println!(
        "| observers | SET, 1 of N keys observed: native | wasm | ratio | SET, 1 key N observers, per notification: native | wasm | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let mut spread = Vec::new();
        let mut fan = Vec::new();
        for kind in ["native", "wasm"] {
            let new = || -> Box<dyn Backend> {
                if kind == "wasm" {
                    Box::new(rt.instantiate(&Config::default()).expect("instantiate"))
                } else {
                    Box::new(native())
                }
            };
            // N clients, each observing its own key.
            let mut store = new();
            register(&mut *store, n, key);
            spread.push(per_op(ops, |i| {
                let k = key(i % n);
                let m = request(&[b"SET", &k, VALUE], 1_000_000_000 + i as u64, "w");
                let out = store.handle_messages(&[m], T0).expect("set");
                assert_eq!(out.len(), 2, "one notification and the reply");
            }));
            drop(store);
            // N clients observing one key (fan-out; at most 100k: a SET to
            // 1M observers is 1M publishes).
            let fan_n = n.min(100_000);
            let mut store = new();
            register(&mut *store, fan_n, |_| b"hot".to_vec());
            let rounds = if bench {
                (200_000 / fan_n).clamp(3, 100)
            } else {
                2
            };
            let t = per_op(rounds, |i| {
                let m = request(&[b"SET", b"hot", VALUE], 2_000_000_000 + i as u64, "w");
                let out = store.handle_messages(&[m], T0).expect("set");
                assert_eq!(out.len(), fan_n + 1);
            });
            fan.push(t / fan_n as f64);
        }
        println!(
            "| {n} | {} | {} | {:.2} | {} | {} | {:.2} |",
            us(spread[0]),
            us(spread[1]),
            spread[1] / spread[0],
            us(fan[0]),
            us(fan[1]),
            fan[1] / fan[0],
        );
    }
}

/// Lists every key that matches `pattern`, page by page as a client
/// does; returns (keys, pages).
fn scan_all(store: &mut dyn Backend, pattern: &[u8], corr: &mut u64) -> (usize, usize) {
    let (mut keys, mut pages) = (0, 0);
    let mut token: Option<Vec<u8>> = None;
    loop {
        *corr += 1;
        let mut parts: Vec<&[u8]> = vec![b"SCAN", pattern];
        if let Some(t) = &token {
            parts.push(t);
        }
        let out = store
            .handle_messages(&[request(&parts, *corr, "scan")], T0)
            .expect("scan");
        let Some(Output::Publish(reply)) = out.last() else {
            panic!("no reply: {out:?}");
        };
        pages += 1;
        let p = &reply.payload[..];
        // *<1|2>\r\n*<k>\r\n ... [$<m>\r\n<token>\r\n]
        let line = |at: usize| {
            let end = at + p[at..].windows(2).position(|w| w == b"\r\n").expect("crlf");
            (
                std::str::from_utf8(&p[at + 1..end]).expect("digits"),
                end + 2,
            )
        };
        let (parts, at) = line(0);
        let (k, mut at) = line(at);
        let k = k.parse::<usize>().expect("count");
        keys += k;
        if parts == "1" {
            return (keys, pages);
        }
        for _ in 0..k {
            let (n, next) = line(at);
            at = next + n.parse::<usize>().expect("len") + 2;
        }
        let (n, at) = line(at);
        token = Some(p[at..at + n.parse::<usize>().expect("len")].to_vec());
    }
}

/// `n` clients (`obs-i`) each send KEYNOTIFY for `key_of(i)`.
fn register(store: &mut dyn Backend, n: usize, key_of: impl Fn(usize) -> Vec<u8>) {
    let mut i = 0;
    while i < n {
        let end = (i + 10_000).min(n);
        let batch: Vec<InboundMessage> = (i..end)
            .map(|c| {
                let k = key_of(c);
                request(&[b"KEYNOTIFY", &k], c as u64, &format!("obs-{c}"))
            })
            .collect();
        let out = store.handle_messages(&batch, T0).expect("keynotify");
        assert_eq!(out.len(), end - i);
        i = end;
    }
}
