//! Crash consistency of the journal on a crash-injecting storage (the way
//! redb's crash tests and openraft's log suite work): the journal runs on
//! `MemStorage`, which knows what a machine crash keeps (synced bytes of
//! files the directory named when last synced, optionally a torn unsynced
//! tail) and can make writes fail from some byte on (a full disk). After
//! every crash the store is recovered from what was kept, and every write
//! acknowledged under `--fsync always` must be there, every acknowledged
//! delete must stay deleted, and nothing unacknowledged may appear.
//!
//! Seeded and bounded: a failure names its seed and round.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use statestore::store::clock::{Clock, ManualClock};
use statestore::store::journal::{
    self, Fsync, Journal, JournalError, OnDamage, Recovery, SnapshotPolicy,
};
use statestore::store::storage::{MemStorage, Storage, conformance};
use statestore::{Backend, InboundMessage, Output, WasmStore};
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_tests::{durable_config, reply, resp, wasm_runtime};

const T0: u64 = 1_700_000_000_000;

/// Snapshots often, so that crashes fall between every kind of step.
fn policy() -> SnapshotPolicy {
    SnapshotPolicy {
        max_log_bytes: 2_000,
        max_interval: Duration::from_secs(3600),
        ..SnapshotPolicy::default()
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Node {
    store: WasmStore,
    journal: Journal,
}

/// Correlation data unique across recoveries (the dedup cache survives them
/// and would answer a reused one with its old reply).
static CORRELATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A journal (and the store it recovers) on `storage`.
fn open_journal(
    storage: &MemStorage,
    clock: &ManualClock,
) -> Result<(Journal, WasmStore, Recovery), JournalError> {
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    Journal::open_in(
        shared,
        wasm_runtime(),
        &durable_config(),
        Fsync::Always,
        policy(),
        clock,
        OnDamage::Refuse,
    )
}

impl Node {
    fn open(storage: &MemStorage, clock: &ManualClock) -> Node {
        let (journal, store, _) = open_journal(storage, clock).expect("recovers");
        Node { store, journal }
    }

    /// One request through the guest and the journal, as the driver does:
    /// the reply payload (a 500 has none) and its status.
    fn call(&mut self, parts: &[&[u8]], now: u64) -> (String, String) {
        let corr = CORRELATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let m = InboundMessage {
            topic: REQUEST_TOPIC.into(),
            payload: resp(parts),
            qos: 1,
            response_topic: Some("clients/t/response".into()),
            correlation_data: Some(corr.to_be_bytes().to_vec()),
            message_expiry_interval: Some(10),
            user_properties: vec![("__ts".into(), format!("{now}:0:t"))],
            ..Default::default()
        };
        let outputs = self.store.handle_messages(&[m], now).expect("guest");
        let outputs: Vec<Output> =
            journal::commit(&mut self.store, Some(&mut self.journal), outputs).expect("commit");
        let r = reply(&outputs);
        (
            String::from_utf8_lossy(&r.payload).into_owned(),
            r.user_property("__stat").unwrap_or_default().to_string(),
        )
    }
}

/// Every key ever written reads back as the model says: its last
/// acknowledged value, deleted, or absent if no write of it was acknowledged.
fn expect_state(
    node: &mut Node,
    model: &BTreeMap<String, Option<String>>,
    touched: &BTreeSet<String>,
    clock: &ManualClock,
    context: &str,
) {
    for key in touched {
        let (got, _) = node.call(&[b"GET", key.as_bytes()], clock.now_ms());
        let want = match model.get(key) {
            Some(Some(v)) => format!("${}\r\n{v}\r\n", v.len()),
            _ => "$-1\r\n".into(),
        };
        assert_eq!(got, want, "{context}: {key} after the crash");
    }
}

/// Random SET / DEL rounds, each ended by a crash at a random point (with or
/// without a torn tail, sometimes on a full disk); after each recovery the
/// store holds exactly the acknowledged state.
#[test]
fn acknowledged_writes_survive_every_crash() {
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let clock = ManualClock::at(T0);
        let mut storage = MemStorage::new();
        // The acknowledged state: key -> Some(value) | None (deleted); a key
        // only ever written by refused (500) requests is absent from it and
        // must stay absent.
        let mut model: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for round in 0..4 {
            let mut node = Node::open(&storage, &clock);
            expect_state(
                &mut node,
                &model,
                &touched,
                &clock,
                &format!("seed {seed} round {round}"),
            );
            let full_disk = rng.below(3) == 0;
            let ops = 5 + rng.below(60);
            for i in 0..ops {
                if full_disk && i == ops / 2 {
                    storage.set_space(Some(rng.below(200)));
                }
                clock.advance(1);
                let key = format!("k{}", rng.below(12));
                touched.insert(key.clone());
                let now = clock.now_ms();
                if rng.below(4) == 0 {
                    let (payload, stat) = node.call(&[b"DEL", key.as_bytes()], now);
                    if stat == "200" {
                        assert!(payload == ":1\r\n" || payload == ":0\r\n", "{payload}");
                        model.insert(key, None);
                    }
                } else {
                    let value =
                        format!("v{seed}-{round}-{i}-{}", "x".repeat(rng.below(90) as usize));
                    let (payload, stat) =
                        node.call(&[b"SET", key.as_bytes(), value.as_bytes()], now);
                    match stat.as_str() {
                        "200" => {
                            assert_eq!(payload, "+OK\r\n");
                            model.insert(key, Some(value));
                        }
                        // Not durable: not applied (the store reloaded).
                        "500" => assert!(full_disk, "a 500 without a full disk"),
                        other => panic!("status {other}"),
                    }
                }
            }
            // The machine crashes: the journal's threads and files are gone,
            // and what the storage kept is all there is.
            let torn = match rng.below(3) {
                0 => None,
                _ => Some(rng.below(64) as usize),
            };
            let kept = storage.crash(torn);
            drop(node);
            storage = kept;
        }
        // A last recovery checks the final round too.
        let mut node = Node::open(&storage, &clock);
        expect_state(
            &mut node,
            &model,
            &touched,
            &clock,
            &format!("seed {seed}, final"),
        );
    }
}

/// The storage the crash test relies on passes the suite every backend
/// passes (the directory backend runs it in its unit tests).
#[test]
fn mem_storage_passes_the_conformance_suite() -> std::io::Result<()> {
    conformance::all(&mut || {
        let s = MemStorage::new();
        (Box::new(s.clone()), Box::new(s))
    })
}

/// A journal on storage that another journal holds is refused.
#[test]
fn one_journal_per_storage() {
    let storage = MemStorage::new();
    let clock = ManualClock::at(T0);
    let _first = Node::open(&storage, &clock);
    assert!(open_journal(&storage, &clock).is_err());
}

/// A full disk does not stop a restart: the store starts, serves reads,
/// answers writes with 500 until there is room, and then takes writes
/// again, durably.
#[test]
fn a_full_disk_does_not_stop_a_restart() {
    let clock = ManualClock::at(T0);
    let storage = MemStorage::new();
    {
        let mut node = Node::open(&storage, &clock);
        assert_eq!(
            node.call(&[b"SET", b"a", b"1"], clock.now_ms()).0,
            "+OK\r\n"
        );
    }
    storage.set_space(Some(0));
    clock.advance(10);
    let mut node = Node::open(&storage, &clock);
    assert_eq!(node.call(&[b"GET", b"a"], clock.now_ms()).0, "$1\r\n1\r\n");
    let (payload, stat) = node.call(&[b"SET", b"b", b"2"], clock.now_ms());
    assert_eq!((payload.as_str(), stat.as_str()), ("", "500"));
    assert_eq!(node.call(&[b"GET", b"b"], clock.now_ms()).0, "$-1\r\n");
    storage.set_space(None);
    clock.advance(10);
    assert_eq!(
        node.call(&[b"SET", b"c", b"3"], clock.now_ms()).0,
        "+OK\r\n"
    );
    let kept = storage.crash(None);
    drop(node);
    let mut node = Node::open(&kept, &clock);
    assert_eq!(node.call(&[b"GET", b"a"], clock.now_ms()).0, "$1\r\n1\r\n");
    assert_eq!(node.call(&[b"GET", b"b"], clock.now_ms()).0, "$-1\r\n");
    assert_eq!(node.call(&[b"GET", b"c"], clock.now_ms()).0, "$1\r\n3\r\n");
}

/// A storage whose snapshot files cannot be written while `failing` is set;
/// it counts the attempts. Everything else is a [`MemStorage`].
#[derive(Debug)]
struct NoSnapshots {
    inner: MemStorage,
    failing: std::sync::atomic::AtomicBool,
    attempts: std::sync::atomic::AtomicU64,
}

impl Storage for NoSnapshots {
    fn lock(&self) -> std::io::Result<()> {
        self.inner.lock()
    }
    fn unlock(&self) {
        self.inner.unlock();
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.inner.list()
    }
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        self.inner.read(name)
    }
    fn create(&self, name: &str) -> std::io::Result<Box<dyn statestore::store::storage::LogFile>> {
        self.inner.create(name)
    }
    fn write_atomic(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if name.starts_with("snapshot") {
            self.attempts.fetch_add(1, SeqCst);
            if self.failing.load(SeqCst) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "no space for a snapshot (injected)",
                ));
            }
        }
        self.inner.write_atomic(name, bytes)
    }
    fn truncate(&self, name: &str, len: u64) -> std::io::Result<()> {
        self.inner.truncate(name, len)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        self.inner.sync_dir()
    }
    fn describe(&self) -> String {
        "snapshot-refusing memory".into()
    }
}

/// A failed snapshot backs off: while snapshots fail, the journal does not
/// try again on every batch (it used to, and a small SET took 725 ms);
/// after the pause it tries again, and once one succeeds the log is
/// truncated. No acknowledged write is lost meanwhile.
#[test]
fn a_failed_snapshot_backs_off() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = ManualClock::at(T0);
    let storage = Arc::new(NoSnapshots {
        inner: MemStorage::new(),
        failing: true.into(),
        attempts: 0.into(),
    });
    let shared: Arc<dyn Storage> = storage.clone();
    // Far longer than the first 80 writes take, so that "one attempt, then
    // a pause" is always checked (it was skipped on a slow machine).
    let pause = Duration::from_secs(5);
    let (journal, store, _) = Journal::open_in(
        shared,
        wasm_runtime(),
        &durable_config(),
        Fsync::Always,
        SnapshotPolicy {
            retry_after: pause,
            ..policy()
        },
        &clock,
        OnDamage::Refuse,
    )
    .expect("opens");
    let mut node = Node { store, journal };
    let value = vec![b'v'; 100];
    let set = |node: &mut Node, i: usize| {
        let key = format!("k{i}");
        let (payload, _) = node.call(&[b"SET", key.as_bytes(), &value], T0);
        assert_eq!(payload, "+OK\r\n");
    };
    // About 270 bytes of log a request: a snapshot is due every 8 or so;
    // the background write of the first fails at once.
    let started = std::time::Instant::now();
    let before = storage.attempts.load(SeqCst);
    for i in 0..40 {
        set(&mut node, i);
    }
    // The background write may not have run yet on a busy machine.
    while storage.attempts.load(SeqCst) == before {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no snapshot attempt"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // These notice the failure, and then are due for a snapshot again.
    for i in 40..80 {
        set(&mut node, i);
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < pause,
        "80 writes took {elapsed:?}: too slow to tell a pause from none"
    );
    assert_eq!(
        storage.attempts.load(SeqCst) - before,
        1,
        "one attempt, then a pause"
    );
    assert_eq!(node.journal.snapshots_failed(), 1);
    let logs = |s: &NoSnapshots| {
        s.inner
            .list()
            .expect("list")
            .into_iter()
            .filter(|n| n.starts_with("wal-"))
            .count()
    };
    let segments_before = logs(&storage);
    // After the pause, snapshots are taken again and the log is cut.
    std::thread::sleep(pause + Duration::from_millis(100));
    storage.failing.store(false, SeqCst);
    for i in 80..100 {
        set(&mut node, i);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(storage.attempts.load(SeqCst) >= before + 2);
    assert!(logs(&storage) <= segments_before, "the log was cut");
    for i in 0..100 {
        let key = format!("k{i}");
        let (payload, _) = node.call(&[b"GET", key.as_bytes()], T0);
        assert_eq!(payload.len(), 100 + 8, "{key}: {payload}");
    }
    drop(node);
    // Everything is recovered from the snapshot and the log.
    let shared: Arc<dyn Storage> = storage.clone();
    let (journal, store, _) = Journal::open_in(
        shared,
        wasm_runtime(),
        &durable_config(),
        Fsync::Always,
        policy(),
        &clock,
        OnDamage::Refuse,
    )
    .expect("recovers");
    let mut node = Node { store, journal };
    for i in 0..100 {
        let key = format!("k{i}");
        let (payload, _) = node.call(&[b"GET", key.as_bytes()], T0);
        assert_eq!(payload.len(), 100 + 8, "{key} after recovery");
    }
}

/// How many snapshots the journal on `storage` has taken: each starts a log
/// segment at once (its file may be written later, in the background).
fn snapshots_taken(storage: &MemStorage) -> u64 {
    storage
        .list()
        .expect("list")
        .iter()
        .filter_map(|n| n.strip_prefix("wal-")?.strip_suffix(".log")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// A journal that follows its snapshot's size (a memory journal's) lets its
/// log grow as long as the last snapshot before taking the next, and no
/// longer than the cap; without it, the policy's `max_log_bytes` alone
/// decides. Same writes both ways: 40 values of 1,000 bytes (a snapshot
/// of about 40 KB), then 20 more of 1,000 bytes (about 20 KB of log).
#[test]
fn a_log_that_follows_its_snapshot_grows_as_long_as_it() {
    let run = |follow: Option<u64>| {
        let clock = ManualClock::at(T0);
        // Volatile: snapshots are written at once, not by a thread whose
        // pace would decide how many are taken.
        let storage = MemStorage::volatile();
        let mut node = Node::open(&storage, &clock);
        if let Some(cap) = follow {
            node.journal.follow_snapshot_size(cap);
        }
        let value = "v".repeat(1_000);
        for i in 0..40 {
            let key = format!("k{i}");
            let (got, _) = node.call(&[b"SET", key.as_bytes(), value.as_bytes()], clock.now_ms());
            assert_eq!(got, "+OK\r\n");
        }
        node.journal.snapshot(&mut node.store).expect("snapshot");
        let before = snapshots_taken(&storage);
        for i in 0..20 {
            let key = format!("k{i}");
            node.call(&[b"SET", key.as_bytes(), value.as_bytes()], clock.now_ms());
        }
        snapshots_taken(&storage) - before
    };
    // 20 KB of log at 2,000 bytes a snapshot: about one every two writes.
    let plain = run(None);
    assert!(plain >= 8, "{plain}");
    assert_eq!(
        run(Some(1 << 20)),
        0,
        "20 KB of log is shorter than a 40 KB snapshot"
    );
    // Capped at 4,000 bytes: one every four writes or so.
    let capped = run(Some(4_000));
    assert!((3..=6).contains(&capped), "{capped}");
}
