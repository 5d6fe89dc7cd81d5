//! The data directory: records survive a reopen, torn and corrupt tails are
//! dropped and reported, keys that expired while down go at once, newer
//! formats are refused, and a version-1 fixture stays readable forever.

use std::path::{Path, PathBuf};
use std::time::Duration;

use statestore::store::clock::{Clock, ManualClock, SystemClock};
use statestore::store::journal::{
    Fsync, Journal, JournalError, OnDamage, Recovery, SnapshotPolicy,
};
use statestore::{Backend, InboundMessage, Output, WasmStore};
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_tests::{durable_config, reply, resp, wasm_runtime};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "statestore-durability-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

struct Store {
    store: WasmStore,
    journal: Journal,
    corr: u64,
}

impl Store {
    fn open(dir: &Path, policy: SnapshotPolicy) -> (Store, Recovery) {
        Store::open_at(dir, policy, &SystemClock)
    }

    /// [`Store::open`] with the clock that decides what expired while down.
    fn open_at(dir: &Path, policy: SnapshotPolicy, clock: &dyn Clock) -> (Store, Recovery) {
        Store::open_with(dir, policy, clock, OnDamage::Refuse)
    }

    /// [`Store::open_at`], choosing what a damaged log does.
    fn open_with(
        dir: &Path,
        policy: SnapshotPolicy,
        clock: &dyn Clock,
        on_damage: OnDamage,
    ) -> (Store, Recovery) {
        let (journal, store, recovery) = Journal::open(
            wasm_runtime(),
            &durable_config(),
            dir,
            Fsync::Always,
            policy,
            clock,
            on_damage,
        )
        .expect("open the data dir");
        (
            Store {
                store,
                journal,
                corr: 0,
            },
            recovery,
        )
    }

    /// A request as the SDK sends it at `now`, its reply payload and `__ts`.
    fn call(&mut self, parts: &[&[u8]], now: u64) -> (String, Option<String>) {
        self.corr += 1;
        let m = InboundMessage {
            topic: REQUEST_TOPIC.into(),
            payload: resp(parts),
            qos: 1,
            response_topic: Some("clients/t/response".into()),
            correlation_data: Some(format!("{:016}", self.corr + 1000 * now).into_bytes()),
            message_expiry_interval: Some(10),
            user_properties: vec![
                ("__ts".into(), format!("{now}:0:t")),
                ("__srcId".into(), "t".into()),
            ],
            ..Default::default()
        };
        let outputs = self.store.handle_messages(&[m], now).expect("handle");
        let outputs: Vec<Output> =
            statestore::store::journal::commit(&mut self.store, Some(&mut self.journal), outputs)
                .expect("commit");
        let r = reply(&outputs);
        (
            String::from_utf8_lossy(&r.payload).into_owned(),
            r.user_property("__ts").map(str::to_string),
        )
    }
}

/// The error of opening `dir`, which must fail.
fn open_error(dir: &Path, why: &str) -> JournalError {
    match Journal::open(
        wasm_runtime(),
        &durable_config(),
        dir,
        Fsync::Always,
        SnapshotPolicy::default(),
        &SystemClock,
        OnDamage::Refuse,
    ) {
        Ok(_) => panic!("opening {} must fail: {why}", dir.display()),
        Err(e) => e,
    }
}

fn now() -> u64 {
    statestore::store::clock::now_ms()
}

fn wal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

#[test]
fn an_empty_directory_starts_empty() {
    let dir = temp_dir("empty");
    let (mut s, rec) = Store::open(&dir, SnapshotPolicy::default());
    assert_eq!(rec, Recovery::default());
    assert_eq!(s.call(&[b"GET", b"k"], now()).0, "$-1\r\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writes_survive_reopening_across_snapshots() {
    let dir = temp_dir("reopen");
    // A tiny log limit: snapshots are taken while writing.
    let policy = SnapshotPolicy {
        max_log_bytes: 300,
        max_interval: Duration::from_secs(3600),
        ..SnapshotPolicy::default()
    };
    let mut versions = Vec::new();
    {
        let (mut s, _) = Store::open(&dir, policy);
        for i in 0..40u32 {
            let key = format!("k{}", i % 10);
            let (r, ts) = s.call(&[b"SET", key.as_bytes(), i.to_string().as_bytes()], now());
            assert_eq!(r, "+OK\r\n");
            versions.push((key, i, ts.expect("version")));
        }
        assert_eq!(s.call(&[b"DEL", b"k0"], now()).0, ":1\r\n");
    }
    let (mut s, rec) = Store::open(&dir, policy);
    assert!(rec.snapshot_seq.is_some(), "{rec:?}");
    for (key, i, ts) in versions.iter().skip(30) {
        let (r, got) = s.call(&[b"GET", key.as_bytes()], now());
        if key == "k0" {
            assert_eq!(r, "$-1\r\n");
        } else {
            assert_eq!(r, format!("${}\r\n{i}\r\n", i.to_string().len()));
            assert_eq!(got.as_ref(), Some(ts));
        }
    }
    // The directory holds one snapshot and one log segment, not the history.
    let files = std::fs::read_dir(&dir).expect("dir").count();
    assert!(files <= 4, "{files} files");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

fn write_three(dir: &Path) {
    let (mut s, _) = Store::open(dir, SnapshotPolicy::default());
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
        assert_eq!(
            s.call(&[b"SET", k.as_bytes(), v.as_bytes()], now()).0,
            "+OK\r\n"
        );
    }
}

#[test]
fn a_torn_last_record_is_dropped_and_reported() {
    let dir = temp_dir("torn");
    write_three(&dir);
    let wal = wal_files(&dir).pop().expect("a log segment");
    let len = written_len(&wal);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .expect("open")
        .set_len(len - 3)
        .expect("truncate");
    let (mut s, rec) = Store::open(&dir, SnapshotPolicy::default());
    assert!(rec.dropped_bytes > 0, "{rec:?}");
    assert_eq!(s.call(&[b"GET", b"a"], now()).0, "$1\r\n1\r\n");
    assert_eq!(s.call(&[b"GET", b"b"], now()).0, "$1\r\n2\r\n");
    // The last record was c's dedup reply; c's own put is intact.
    assert_eq!(s.call(&[b"GET", b"c"], now()).0, "$1\r\n3\r\n");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flipped_byte_before_valid_records_refuses_to_start() {
    let dir = temp_dir("flipped");
    write_three(&dir);
    let wal = wal_files(&dir).pop().expect("a log segment");
    let mut data = std::fs::read(&wal).expect("read");
    // Find b's value in the log and corrupt it: c's record follows, intact.
    let at = data
        .windows(5)
        .position(|w| w == b"\x01\x00\x00\x00b")
        .expect("b's record")
        + 6;
    data[at] ^= 0xFF;
    std::fs::write(&wal, &data).expect("write");
    // Not a torn tail: the start is refused and nothing is touched.
    let err = open_error(&dir, "damage before valid records");
    assert!(matches!(err, JournalError::Damaged { .. }), "{err:?}");
    assert!(err.to_string().contains("--recover-damaged-log"), "{err}");
    assert_eq!(
        std::fs::read(&wal).expect("read"),
        data,
        "the file is untouched"
    );
    // In the segment header too (it lost every record before).
    let mut header = data.clone();
    header[0] ^= 0xFF;
    std::fs::write(&wal, &header).expect("write");
    assert!(matches!(
        open_error(&dir, "damaged header"),
        JournalError::Damaged { .. }
    ));
    std::fs::write(&wal, &data).expect("write");
    // With the operator's flag: the prefix is kept, the damaged segment
    // copied aside as it was.
    let (mut s, rec) = Store::open_with(
        &dir,
        SnapshotPolicy::default(),
        &SystemClock,
        OnDamage::KeepPrefix,
    );
    let aside = wal.with_extension("log.damaged");
    assert_eq!(std::fs::read(&aside).expect("kept aside"), data);
    assert!(rec.dropped_bytes > 0, "{rec:?}");
    assert_eq!(s.call(&[b"GET", b"a"], now()).0, "$1\r\n1\r\n");
    assert_eq!(
        s.call(&[b"GET", b"b"], now()).0,
        "$-1\r\n",
        "the damaged record is not applied"
    );
    assert_eq!(
        s.call(&[b"GET", b"c"], now()).0,
        "$-1\r\n",
        "nor anything after it"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn keys_that_expired_while_down_are_gone() {
    let dir = temp_dir("expired");
    // Simulated time: the store is down for 300 ms of its clock.
    let clock = ManualClock::at(now());
    {
        let (mut s, _) = Store::open_at(&dir, SnapshotPolicy::default(), &clock);
        s.call(&[b"SET", b"short", b"v", b"PX", b"200"], clock.now_ms());
        s.call(&[b"SET", b"long", b"v", b"PX", b"600000"], clock.now_ms());
    }
    clock.advance(300);
    let (mut s, _) = Store::open_at(&dir, SnapshotPolicy::default(), &clock);
    // Expired by the clock at open, before any request arrives: the GET at
    // the very time of the open finds it gone.
    assert_eq!(s.call(&[b"GET", b"short"], clock.now_ms()).0, "$-1\r\n");
    assert_eq!(s.call(&[b"GET", b"long"], clock.now_ms()).0, "$1\r\nv\r\n");
    // And the expiry itself was logged: it stays expired after another
    // reopen, even one whose clock went back.
    drop(s);
    let early = ManualClock::at(clock.now_ms() - 250);
    let (mut s, _) = Store::open_at(&dir, SnapshotPolicy::default(), &early);
    assert_eq!(s.call(&[b"GET", b"short"], early.now_ms()).0, "$-1\r\n");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_redelivered_request_gets_its_reply_after_a_restart() {
    let dir = temp_dir("dedup");
    let m = InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: resp(&[b"SET", b"once", b"v", b"NX"]),
        qos: 1,
        response_topic: Some("clients/t/response".into()),
        correlation_data: Some(vec![7; 16]),
        message_expiry_interval: Some(30),
        user_properties: vec![("__ts".into(), format!("{}:0:t", now()))],
        ..Default::default()
    };
    let first = {
        let (mut s, _) = Store::open(&dir, SnapshotPolicy::default());
        let out = s
            .store
            .handle_messages(std::slice::from_ref(&m), now())
            .expect("handle");
        let out = statestore::store::journal::commit(&mut s.store, Some(&mut s.journal), out)
            .expect("commit");
        reply(&out).clone()
    };
    let (mut s, _) = Store::open(&dir, SnapshotPolicy::default());
    let out = s.store.handle_messages(&[m], now()).expect("handle");
    let again = reply(&out);
    assert_eq!(
        again.payload,
        &b"+OK\r\n"[..],
        "not executed again (it would be :-1)"
    );
    assert_eq!(again.user_property("__ts"), first.user_property("__ts"));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_is_used_by_one_process_at_a_time() {
    let dir = temp_dir("lock");
    let (_s, _) = Store::open(&dir, SnapshotPolicy::default());
    let err = open_error(&dir, "a second open fails");
    assert!(matches!(err, JournalError::InUse(_)), "{err:?}");
    assert!(
        format!("{err:#}").contains("in use by another statestore process"),
        "{err:#}"
    );
}

#[test]
fn newer_formats_are_refused_with_a_clear_error() {
    let dir = temp_dir("newer-wal");
    write_three(&dir);
    let wal = wal_files(&dir).pop().expect("segment");
    let mut data = std::fs::read(&wal).expect("read");
    data[8] = 2; // WAL format 2
    std::fs::write(&wal, &data).expect("write");
    let err = open_error(&dir, "refused");
    assert!(
        matches!(err, JournalError::NewerLog { version: 2, .. }),
        "{err:?}"
    );
    let text = format!("{:#}", anyhow::Error::from(err));
    assert!(
        text.contains("WAL format 2, newer than this build reads (1)"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let dir = temp_dir("newer-snapshot");
    write_three(&dir);
    let snap = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "snap"))
        .expect("a snapshot");
    let mut data = std::fs::read(&snap).expect("read");
    // A format newer than this build's.
    let newer = statestore_guest::snapshot::FORMAT_VERSION + 1;
    data[8] = u8::try_from(newer).expect("small");
    let n = data.len() - 4;
    let crc = crc32(&data[..n]);
    data[n..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&snap, &data).expect("write");
    let err = open_error(&dir, "refused");
    assert!(
        matches!(
            err,
            JournalError::NewerSnapshot {
                source: statestore::GuestError::Refused(
                    statestore_guest::Error::UnsupportedVersion(v)
                ),
                ..
            } if v == newer
        ),
        "{err:?}"
    );
    let err = anyhow::Error::from(err);
    assert!(
        format!("{err:#}").contains(&format!(
            "format version {newer} is newer than this build understands"
        )),
        "{err:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn crc32(data: &[u8]) -> u32 {
    // CRC-32 (IEEE), as the formats use; bitwise to keep the test self-contained.
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The checked-in version-1 data directory (`tests/fixtures/datadir-v1/`):
/// every future build must still read it. Re-create it (only when the format
/// version changes, keeping the old one) with STATESTORE_BLESS=1.
#[test]
fn the_version_1_fixture_still_reads() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/datadir-v1");
    // Far-future expiries, so the fixture's keys never expire.
    let far = 4_102_444_800_000u64 - now(); // 2100-01-01
    if std::env::var_os("STATESTORE_BLESS").is_some_and(|v| v == "1") {
        let _ = std::fs::remove_dir_all(&fixture);
        let (mut s, _) = Store::open(&fixture, SnapshotPolicy::default());
        s.call(&[b"SET", b"in-snapshot", b"1"], 1_700_000_000_000);
        s.call(&[b"SET", b"deleted", b"x"], 1_700_000_000_001);
        s.journal.snapshot(&mut s.store).expect("snapshot");
        s.call(
            &[b"SET", b"in-log", b"2", b"PX", far.to_string().as_bytes()],
            1_700_000_000_002,
        );
        s.call(&[b"DEL", b"deleted"], 1_700_000_000_003);
        s.call(&[b"SET", b"bin\0\r\n", b"\xff\x00"], 1_700_000_000_004);
        drop(s);
        let _ = std::fs::remove_file(fixture.join("LOCK"));
    }
    let dir = temp_dir("fixture");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for e in std::fs::read_dir(&fixture).expect("the fixture exists") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, dir.join(p.file_name().expect("name"))).expect("copy");
    }
    let (mut s, rec) = Store::open(&dir, SnapshotPolicy::default());
    assert!(rec.snapshot_seq.is_some() && rec.records >= 4, "{rec:?}");
    let t = now();
    assert_eq!(
        s.call(&[b"GET", b"in-snapshot"], t),
        (
            "$1\r\n1\r\n".into(),
            Some("001700000000000:00001:StateStore".into())
        )
    );
    assert_eq!(
        s.call(&[b"GET", b"in-log"], t),
        (
            "$1\r\n2\r\n".into(),
            Some("001700000000002:00001:StateStore".into())
        )
    );
    assert_eq!(s.call(&[b"GET", b"deleted"], t).0, "$-1\r\n");
    assert_eq!(s.call(&[b"GET", b"bin\0\r\n"], t).0, "$2\r\n\u{fffd}\0\r\n");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The length of a log segment without the zeros it is filled with ahead
/// of its frames.
fn written_len(wal: &std::path::Path) -> u64 {
    let data = std::fs::read(wal).expect("read");
    data.iter()
        .rposition(|&b| b != 0)
        .map_or(0, |p| p as u64 + 1)
}

#[test]
fn a_zero_filled_tail_is_the_end_not_a_tear() {
    // Segments are zero-filled ahead of their frames; after a machine
    // crash a file can also end in zeros where blocks were allocated.
    let dir = temp_dir("zeros");
    write_three(&dir);
    let wal = wal_files(&dir).pop().expect("segment");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&wal)
        .expect("open");
    std::io::Write::write_all(&mut f, &[0u8; 64]).expect("zeros");
    drop(f);
    let (mut s, rec) = Store::open(&dir, SnapshotPolicy::default());
    assert_eq!(rec.dropped_bytes, 0, "{rec:?}");
    assert_eq!(s.call(&[b"GET", b"c"], now()).0, "$1\r\n3\r\n");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unloadable_snapshot_stops_the_start_instead_of_losing_it() {
    let dir = temp_dir("bad-snapshot");
    write_three(&dir);
    let snap = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "snap"))
        .expect("a snapshot");
    let mut data = std::fs::read(&snap).expect("read");
    let mid = data.len() / 2;
    data[mid] ^= 0x55;
    std::fs::write(&snap, &data).expect("write");
    let err = open_error(&dir, "refused");
    assert!(
        matches!(err, JournalError::NoLoadableSnapshot { count: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("refusing to start"), "{err}");
    // Nothing was deleted.
    assert!(snap.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
