//! A durable store holding a large state: the time of a small SET, of a
//! snapshot and of a restart from disk, each as a ratio against a
//! baseline measured in the same run.
//!
//! ```sh
//! cargo bench -p statestore --bench big_state            # 200 MiB of state
//! cargo bench -p statestore --bench big_state -- --mib 50
//! ```
//!
//! Under `cargo test --benches` (no `--bench` argument) it runs once at
//! 4 MiB as a smoke test.
//!
//! - **Small SET**: median and p99 of a 100-byte SET (one request, through
//!   the tenant: guest, journal append, and whatever snapshot falls due) with
//!   the large state, against the same with an empty store.
//! - **Snapshot**: taking a durable snapshot out of the guest, against
//!   copying the same number of bytes in host memory (`memcpy`).
//! - **Restart**: opening the tenant from its data directory (the newest
//!   snapshot, then the log), against reading the directory's files.

use std::time::{Duration, Instant};

use statestore::store::StoreOptions;
use statestore::store::journal::{Fsync, SnapshotPolicy};
use statestore::store::tenant::{Fleet, Tenant};
use statestore::{Backend, InboundMessage, Persist, SnapshotScope, StoreLimits};
use statestore_guest::rpc::REQUEST_TOPIC;

const VALUE_BYTES: usize = 64 << 10;

fn request(corr: u64, parts: &[&[u8]]) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some("clients/bench/resp".into()),
        correlation_data: Some(corr.to_be_bytes().to_vec()),
        message_expiry_interval: Some(60),
        user_properties: vec![(
            "__ts".into(),
            format!("{}:0:bench", statestore::transport::external::now_ms()),
        )],
        client_id: Some("bench".into()),
        ..Default::default()
    }
}

fn options(dir: &std::path::Path) -> StoreOptions {
    StoreOptions {
        persist: Persist::All,
        data_dir: Some(dir.to_path_buf()),
        fsync: Fsync::No,
        snapshots: SnapshotPolicy::default(),
        ..StoreOptions::volatile("StateStore", "statestore")
    }
}

fn open(fleet: &mut Fleet, dir: &std::path::Path) -> Tenant {
    let runtime = fleet
        .runtime_from_bytes(
            statestore::GUEST_COMPONENT,
            StoreLimits {
                memory_bytes: Some(1 << 30),
                call_ms: None,
            },
        )
        .expect("loads");
    Tenant::open("bench", runtime, &options(dir)).expect("opens")
}

/// Median and 99th percentile of `n` small SETs, ms.
fn small_sets(tenant: &mut Tenant, corr: &mut u64, n: usize) -> (f64, f64) {
    let value = vec![b's'; 100];
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        *corr += 1;
        let key = format!("small{}", i % 100);
        let m = request(*corr, &[b"SET", key.as_bytes(), &value]);
        let started = Instant::now();
        let out = tenant.handle(&[m], tenant.now_ms()).expect("handled");
        times.push(started.elapsed());
        assert!(!out.is_empty());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(times[n / 2]), ms(times[n * 99 / 100]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let mib: usize = args
        .iter()
        .position(|a| a == "--mib")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 200 } else { 4 });
    let sets = if bench { 2000 } else { 50 };
    let root = std::env::temp_dir().join(format!("statestore-big-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut fleet = Fleet::new(2, 1 << 30, None).expect("engine");
    let mut corr = 0u64;

    // Baseline: an empty store.
    let mut empty = open(&mut fleet, &root.join("empty"));
    let (empty_median, empty_p99) = small_sets(&mut empty, &mut corr, sets);
    drop(empty);

    // The large state, in 64 KiB values.
    let dir = root.join("big");
    let mut tenant = open(&mut fleet, &dir);
    let value = vec![b'v'; VALUE_BYTES];
    for i in 0..(mib << 20) / VALUE_BYTES {
        corr += 1;
        let key = format!("big{i:08}");
        let m = request(corr, &[b"SET", key.as_bytes(), &value]);
        tenant.handle(&[m], tenant.now_ms()).expect("loaded");
    }
    let (median, p99) = small_sets(&mut tenant, &mut corr, sets);

    let started = Instant::now();
    let snapshot = tenant
        .store_mut()
        .snapshot_with(SnapshotScope::Durable)
        .expect("snapshot");
    let snapshot_time = started.elapsed();
    let started = Instant::now();
    let copy = snapshot.clone();
    let memcpy_time = started.elapsed();
    assert_eq!(copy.len(), snapshot.len());
    drop((copy, snapshot));
    drop(tenant);

    let started = Instant::now();
    let mut read = 0usize;
    for entry in std::fs::read_dir(&dir).expect("data dir").flatten() {
        read += std::fs::read(entry.path()).map(|b| b.len()).unwrap_or(0);
    }
    let read_time = started.elapsed();
    let started = Instant::now();
    let tenant = open(&mut fleet, &dir);
    let restart_time = started.elapsed();
    drop(tenant);
    let _ = std::fs::remove_dir_all(&root);

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("## A durable store with {mib} MiB of state ({VALUE_BYTES}-byte values, fsync no)\n");
    println!("| measure | with the state | baseline | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| small SET, median | {median:.3} ms | {empty_median:.3} ms (empty store) | {:.2} |",
        median / empty_median
    );
    println!(
        "| small SET, p99 | {p99:.3} ms | {empty_p99:.3} ms (empty store) | {:.2} |",
        p99 / empty_p99
    );
    println!(
        "| snapshot out of the guest | {:.1} ms | {:.1} ms (memcpy of it) | {:.1} |",
        ms(snapshot_time),
        ms(memcpy_time),
        snapshot_time.as_secs_f64() / memcpy_time.as_secs_f64().max(1e-9)
    );
    println!(
        "| restart from the data directory | {:.1} ms | {:.1} ms (reading its {} MiB) | {:.1} |",
        ms(restart_time),
        ms(read_time),
        read >> 20,
        restart_time.as_secs_f64() / read_time.as_secs_f64().max(1e-9)
    );
}
