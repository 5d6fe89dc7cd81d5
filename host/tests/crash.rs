//! Crash tests a user would believe: the real binary, a real data directory,
//! SIGKILL at random moments under load, and a really full disk.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use statestore_tests::broker::{RawClient, free_port, prop, text};
use statestore_tests::process::Server;
use statestore_tests::resp;

fn statestore() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statestore"));
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-crash-test-cache"),
    );
    c
}

fn durable(port: u16, dir: &std::path::Path) -> Command {
    let mut c = statestore();
    c.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(dir)
    .args(["--fsync", "always"]);
    c
}

/// What a key may hold after a crash: its last acknowledged state, or the
/// result of an operation in flight when the server died.
#[derive(Debug, Clone, Default)]
struct KeyState {
    /// `(value, version)` acknowledged last; `None` = deleted or never set.
    acked: Option<(String, String)>,
    /// An unacknowledged SET value (`Some(None)` = an unacknowledged DEL).
    in_flight: Option<Option<String>>,
}

/// One client writing its own keys until the server dies or the budget ends.
async fn writer(
    port: u16,
    id: usize,
    round: usize,
    keys: Arc<Mutex<BTreeMap<String, KeyState>>>,
    seed: u64,
) {
    let mut c = RawClient::connect(port, &format!("crash-writer-{id}-{round}")).await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    let mut rng = seed;
    let started = Instant::now();
    for n in 0..2000u32 {
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = format!("c{id}-k{}", rng % 8);
        let set = rng % 10 < 7;
        let value = format!("c{id}-r{round}-n{n}");
        keys.lock()
            .expect("lock")
            .entry(key.clone())
            .or_default()
            .in_flight = Some(set.then(|| value.clone()));
        let parts: Vec<&[u8]> = if set {
            vec![b"SET", key.as_bytes(), value.as_bytes()]
        } else {
            vec![b"DEL", key.as_bytes()]
        };
        let props = c.request_properties();
        let Some(r) = c
            .call_within(resp(&parts), props, Duration::from_secs(2))
            .await
        else {
            return; // the server is gone; this operation stays in flight
        };
        let mut k = keys.lock().expect("lock");
        let st = k.entry(key).or_default();
        st.in_flight = None;
        match (set, text(&r).as_str()) {
            (true, "+OK\r\n") => {
                st.acked = Some((value, prop(&r, "__ts").expect("version").to_string()))
            }
            (false, ":1\r\n" | ":0\r\n") => st.acked = None,
            (_, other) => panic!("unexpected reply {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = std::env::temp_dir().join(format!("statestore-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let keys: Arc<Mutex<BTreeMap<String, KeyState>>> = Arc::default();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    eprintln!("seed {seed}");
    for round in 0..4 {
        let port = free_port();
        let server = Server::spawn(durable(port, &dir));
        let tasks: Vec<_> = (0..4)
            .map(|id| {
                tokio::spawn(writer(
                    port,
                    id,
                    round,
                    keys.clone(),
                    seed.wrapping_mul(id as u64 + 7),
                ))
            })
            .collect();
        seed = seed.rotate_left(11) ^ 0x9E37_79B9_7F4A_7C15;
        let delay = 300 + seed % 700;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        server.kill9();
        for t in tasks {
            t.await.expect("writer");
        }
        // Restart on the same data dir and check every key.
        let port = free_port();
        let server = Server::spawn(durable(port, &dir));
        let mut reader = RawClient::connect(port, &format!("crash-reader-{round}")).await;
        let rt = reader.response_topic();
        reader.subscribe(&rt).await;
        let mut k = keys.lock().expect("lock").clone();
        assert!(
            k.values().any(|s| s.acked.is_some()),
            "the load wrote something"
        );
        for (key, st) in k.iter_mut() {
            let r = reader.call(&[b"GET", key.as_bytes()]).await;
            let got = text(&r);
            let acked = match &st.acked {
                Some((v, ver)) => {
                    got == format!("${}\r\n{v}\r\n", v.len())
                        && prop(&r, "__ts") == Some(ver.as_str())
                }
                None => got == "$-1\r\n",
            };
            let in_flight = match &st.in_flight {
                Some(Some(v)) => got == format!("${}\r\n{v}\r\n", v.len()),
                Some(None) => got == "$-1\r\n",
                None => false,
            };
            assert!(
                acked || in_flight,
                "round {round}: {key} reads {got:?} ({:?}); expected {st:?}\n{}",
                prop(&r, "__ts"),
                server.log()
            );
            // Whatever was read is now the acknowledged state.
            if in_flight && !acked {
                st.acked = match &st.in_flight {
                    Some(Some(v)) => {
                        Some((v.clone(), prop(&r, "__ts").unwrap_or_default().to_string()))
                    }
                    _ => None,
                };
            }
            st.in_flight = None;
        }
        *keys.lock().expect("lock") = k;
        reader.disconnect().await;
        server.kill9();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gets_error_replies_and_nothing_half_applied() {
    // A real 160 KiB tmpfs as the data dir, in a private mount namespace
    // (unshare maps us to root in it, so this also works unprivileged). The
    // shell fills the filesystem to the last byte once the first server
    // stops and runs a second one on it: it must start, recover exactly
    // what was acknowledged and serve reads, and refuse
    // writes until the test says to free space (a file in `free`, which
    // the namespace does not cover), when the shell deletes its filler.
    let dir = std::env::temp_dir().join(format!("statestore-full-{}", std::process::id()));
    let free = std::env::temp_dir().join(format!("statestore-full-free-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::create_dir_all(&free).expect("mkdir");
    let (port, port2) = (free_port(), free_port());
    let bin = env!("CARGO_BIN_EXE_statestore");
    let script = format!(
        r#"mount -t tmpfs -o size=160k tmpfs "$1" || exit 1
"{bin}" serve --listen 127.0.0.1:{port} --data-dir "$1"
dd if=/dev/zero of="$1/filler" bs=1k 2>/dev/null
(i=0; while [ ! -e "$2/now" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; rm -f "$1/filler") &
exec "{bin}" serve --listen 127.0.0.1:{port2} --data-dir "$1""#
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-rm", "sh", "-c", &script, "sh"])
        .arg(&dir)
        .arg(&free)
        .env(
            "STATESTORE_CACHE_DIR",
            std::env::temp_dir().join("statestore-crash-test-cache"),
        );
    let server = Server::spawn(cmd);
    let mut c = RawClient::connect(port, "filler").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    let value = vec![b'x'; 24 * 1024];
    let mut failed_at = None;
    for i in 0..40 {
        let key = format!("big-{i}");
        let r = c.call(&[b"SET", key.as_bytes(), &value]).await;
        match prop(&r, "__stat") {
            Some("200") => assert_eq!(text(&r), "+OK\r\n"),
            Some("500") => {
                assert!(
                    prop(&r, "__stMsg").is_some_and(|m| m.contains("durable")),
                    "{r:?}"
                );
                failed_at = Some(i);
                break;
            }
            other => panic!("unexpected status {other:?}"),
        }
    }
    let failed_at = failed_at.expect("the disk fills up");
    assert!(failed_at > 0, "some writes fit");
    // Still serving; acknowledged keys intact; the failed one not applied.
    let mut want = format!("${}\r\n", value.len()).into_bytes();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\n");
    let r = c.call(&[b"GET", b"big-0"]).await;
    assert!(r.payload == want, "big-0 is intact");
    let failed_key = format!("big-{failed_at}");
    assert_eq!(
        text(&c.call(&[b"GET", failed_key.as_bytes()]).await),
        "$-1\r\n",
        "nothing half-applied"
    );
    assert!(
        server.log().contains("cannot write the journal"),
        "{}",
        server.log()
    );
    // A small write still fits where the failed one was taken back.
    assert_eq!(text(&c.call(&[b"SET", b"small", b"fits"]).await), "+OK\r\n");
    // Restart on the same filesystem: exactly the acknowledged writes.
    let term = Command::new("pkill")
        // Anchored: the wrapping shell's command line holds the same words.
        .args([
            "-TERM",
            "-f",
            &format!("^{bin} serve --listen 127.0.0.1:{port} "),
        ])
        .status()
        .expect("pkill");
    assert!(term.success());
    let start = Instant::now();
    while !server.log().contains(&format!("listen=127.0.0.1:{port2}")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no restart:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = RawClient::connect(port2, "checker").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in 0..failed_at {
        let r = c.call(&[b"GET", format!("big-{i}").as_bytes()]).await;
        assert!(
            r.payload == want,
            "big-{i} after the restart:\n{}",
            server.log()
        );
    }
    assert_eq!(
        text(&c.call(&[b"GET", failed_key.as_bytes()]).await),
        "$-1\r\n"
    );
    assert_eq!(text(&c.call(&[b"GET", b"small"]).await), "$4\r\nfits\r\n");
    // The disk is full to the last byte: writes get 500, nothing applied.
    let r = c.call(&[b"SET", b"while-full", b"x"]).await;
    assert_eq!(prop(&r, "__stat"), Some("500"), "{}", server.log());
    assert_eq!(text(&c.call(&[b"GET", b"while-full"]).await), "$-1\r\n");
    // Space returns: writes succeed again, without a restart.
    std::fs::write(free.join("now"), "").expect("signal");
    let start = Instant::now();
    loop {
        let r = c.call(&[b"SET", b"after-full", b"y"]).await;
        if text(&r) == "+OK\r\n" {
            break;
        }
        assert_eq!(prop(&r, "__stat"), Some("500"));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "writes did not come back:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text(&c.call(&[b"GET", b"after-full"]).await), "$1\r\ny\r\n");
    server.kill9();
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_dir_all(&free);
}

/// Through the real binary: a byte flipped in the middle of the
/// log (valid records after it) refuses the start with the file and the
/// byte, leaving the files as they were; `--recover-damaged-log` then
/// starts with what precedes the damage and keeps the damaged segment
/// aside as `<name>.damaged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_refuses_the_start_until_recovery_is_asked_for() {
    let dir = std::env::temp_dir().join(format!("statestore-flip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.display().to_string();
    let cache = std::env::temp_dir().join("statestore-crash-test-cache");
    let serve = |port: u16, extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_statestore"));
        cmd.env("STATESTORE_CACHE_DIR", &cache)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--data-dir", data.as_str(), "--fsync", "always"])
            .args(extra);
        cmd
    };
    let port = free_port();
    let server = Server::spawn(serve(port, &[]));
    let mut c = RawClient::connect(port, "flipper").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in 0..60 {
        let key = format!("k{i:02}");
        assert_eq!(
            text(&c.call(&[b"SET", key.as_bytes(), &[b'v'; 100]]).await),
            "+OK\r\n"
        );
    }
    c.kill();
    server.kill9();
    // The newest segment, a byte in its middle flipped.
    let mut logs: Vec<_> = std::fs::read_dir(&dir)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("wal-"))
        })
        .collect();
    logs.sort();
    let log = logs.last().expect("a log segment").clone();
    let mut bytes = std::fs::read(&log).expect("read log");
    // In the middle of its frames (it is zero-filled ahead of them).
    let written = bytes.iter().rposition(|&b| b != 0).expect("frames");
    let at = written / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&log, &bytes).expect("write log");
    let out = serve(free_port(), &[]).output().expect("run");
    assert!(!out.status.success(), "started on a damaged log");
    let err = String::from_utf8_lossy(&out.stderr);
    let name = log.file_name().expect("name").to_string_lossy().to_string();
    assert!(
        err.contains(&name)
            && err.contains("is damaged at byte")
            && err.contains("--recover-damaged-log"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&log).expect("read"),
        bytes,
        "the files are untouched"
    );
    // Asked for: the prefix before the damage, and the segment kept aside.
    let port = free_port();
    let server = Server::spawn(serve(port, &["--recover-damaged-log"]));
    let aside = log.with_file_name(format!("{name}.damaged"));
    assert_eq!(std::fs::read(&aside).expect("the damaged copy"), bytes);
    let mut c = RawClient::connect(port, "checker").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(
        text(&c.call(&[b"GET", b"k00"]).await),
        format!("$100\r\n{}\r\n", "v".repeat(100)),
        "the first write survives"
    );
    assert_eq!(text(&c.call(&[b"SET", b"after", b"a"]).await), "+OK\r\n");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
