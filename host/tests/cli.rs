//! The `statestore` binary as a user runs it: help, clear errors with a
//! non-zero exit, and a clean shutdown on SIGTERM while serving.

use std::process::{Child, Command, Output, Stdio};

use std::time::{Duration, Instant};

use statestore_tests::broker::{Mosquitto, RawClient, free_port, text};
use statestore_tests::process::{Server, capture_stderr, wait_for};

/// A child process killed (SIGKILL) and reaped when dropped, also when a
/// test panics (a bare `Child` would be left running).
struct Reaped(std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn statestore() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statestore"));
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-cli-test-cache"),
    );
    c
}

fn run(args: &[&str]) -> Output {
    statestore().args(args).output().expect("run statestore")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_describes_serve() {
    let o = run(&["serve", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--broker",
        "--client-id",
        "--node-id",
        "--client-events",
        "--component",
        "--session-expiry",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn unreachable_broker_is_a_clear_error() {
    let port = free_port(); // nothing listens there
    let url = format!("mqtt://127.0.0.1:{port}");
    let started = Instant::now();
    let o = run(&["serve", "--broker", &url, "--connect-timeout", "5"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot connect to the broker at {url}")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn bad_arguments_and_components_are_clear_errors() {
    let o = run(&["serve", "--broker", "http://x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mqtt://"), "{}", stderr(&o));

    let o = run(&[
        "serve",
        "--broker",
        "mqtt://127.0.0.1:1",
        "--component",
        "/nonexistent/x.wasm",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot read the component /nonexistent/x.wasm"),
        "{}",
        stderr(&o)
    );

    let junk = std::env::temp_dir().join(format!("statestore-junk-{}.wasm", std::process::id()));
    std::fs::write(&junk, b"\0asm junk").expect("write junk");
    let o = run(&[
        "serve",
        "--broker",
        "mqtt://127.0.0.1:1",
        "--component",
        junk.to_str().expect("utf-8 path"),
    ]);
    let _ = std::fs::remove_file(&junk);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not valid"), "{}", stderr(&o));
}

/// A SET and a GET through the serving binary, then SIGTERM; its exit status.
async fn set_get_then_sigterm(port: u16, child: &mut Child) -> std::process::ExitStatus {
    let mut c = RawClient::connect(port, "cli-client").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_exit(child, Duration::from_secs(10))
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        assert!(
            start.elapsed() < limit,
            "statestore did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_then_stops_cleanly_on_sigterm() {
    let broker = Mosquitto::start();
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let mut child = Reaped(
        statestore()
            .args(["serve", "--broker", &url, "--client-id", "cli-under-test"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start statestore"),
    );
    let log = capture_stderr(&mut child);
    wait_for(&log, "subscribed; serving", Duration::from_secs(30));
    let status = set_get_then_sigterm(broker.port, &mut child).await;
    wait_for(&log, "shutting down", Duration::from_secs(2));
    assert!(
        status.success(),
        "exit {status}: {}",
        log.lock().expect("log lock")
    );
}

#[test]
fn a_taken_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let o = run(&["serve", "--listen", &addr]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot listen on {addr} (is the port in use?)")),
        "{err}"
    );
}

#[test]
fn broker_and_listen_are_exclusive() {
    let o = run(&[
        "serve",
        "--listen",
        "127.0.0.1:1884",
        "--broker",
        "mqtt://127.0.0.1:1883",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// The threads of a process named like tokio's workers.
fn tokio_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "tokio-rt-worker")
        .count()
}

/// The default mode is a complete broker that serves and stops cleanly,
/// freeing its port; on one thread (the default: no tokio workers) or a pool
/// of `--threads` workers; `--threads 0` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_mode_is_a_complete_broker() {
    let o = run(&["serve", "--threads", "0"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("--threads"), "{}", stderr(&o));
    for (threads, workers) in [(None, 0), (Some("3"), 3)] {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = statestore();
        cmd.args(["serve", "--listen", &listen]);
        if let Some(n) = threads {
            cmd.args(["--threads", n]);
        }
        let mut child = Reaped(
            cmd.stderr(Stdio::piped())
                .spawn()
                .expect("start statestore"),
        );
        let log = capture_stderr(&mut child);
        wait_for(
            &log,
            "embedded MQTT broker listening",
            Duration::from_secs(30),
        );
        assert_eq!(tokio_workers(child.id()), workers, "--threads {threads:?}");
        let status = set_get_then_sigterm(port, &mut child).await;
        assert!(
            status.success(),
            "exit {status}: {}",
            log.lock().expect("log lock")
        );
        // The port is free again.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}

#[test]
fn bench_and_echo_run_against_a_real_store() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut store = Reaped(
        statestore()
            .args(["serve", "--listen", &listen, "--max-value", "1KiB"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve"),
    );
    let log = capture_stderr(&mut store);
    wait_for(&log, "listening", Duration::from_secs(30));
    let url = format!("mqtt://{listen}");
    let o = run(&[
        "bench",
        "--broker",
        &url,
        "--clients",
        "2",
        "--duration",
        "1",
        "--max-requests",
        "200",
        "--get-ratio",
        "0.5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        line.contains("requests=200 ") && line.contains("timeouts=0 errors=0"),
        "{line}"
    );
    // Refused requests are counted and said, and fail the command.
    let o = run(&[
        "bench",
        "--broker",
        &url,
        "--clients",
        "1",
        "--max-requests",
        "10",
        "--get-ratio",
        "0",
        "--value-size",
        "2048",
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("errors=10"),
        "{o:?}"
    );
    assert!(
        stderr(&o).contains(
            "10 of 10 requests were answered with an error (counted in the figures above); the first: -ERR"
        ),
        "{}",
        stderr(&o)
    );
    // The echo baseline on the same broker.
    let mut echo = Reaped(
        statestore()
            .args(["echo", "--broker", &url])
            .stderr(Stdio::null())
            .spawn()
            .expect("echo"),
    );
    std::thread::sleep(Duration::from_millis(500));
    let o = run(&[
        "bench",
        "--broker",
        &url,
        "--clients",
        "2",
        "--duration",
        "1",
        "--max-requests",
        "100",
        "--topic",
        "bench/echo",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("requests=100 "));
    let _ = echo.kill();
    let _ = echo.wait();
    let _ = store.kill();
    let _ = store.wait();
}

/// The built-in component with a custom section appended: a different build
/// (another content hash) that behaves the same.
fn rebuilt_component() -> Vec<u8> {
    let mut wasm = statestore::GUEST_COMPONENT.to_vec();
    // Custom section: id 0, size 9, name "test" (length 4), 4 bytes.
    wasm.extend_from_slice(&[0, 9, 4, b't', b'e', b's', b't', 1, 2, 3, 4]);
    wasm
}

fn tenants_config(dir: &std::path::Path, alpha_max_keys: u32) -> String {
    format!(
        r#"
[defaults]
data_root = "{data}"
memory_mib = 64

[[tenant]]
name = "alpha"
client_id_prefixes = ["alpha-"]
component = "{component}"
max_keys = {alpha_max_keys}

[[tenant]]
name = "beta"
default = true
"#,
        data = dir.join("data").display(),
        component = dir.join("alpha.wasm").display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_tenants_and_a_sighup_upgrade() {
    let dir = std::env::temp_dir().join(format!("statestore-cli-tenants-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("alpha.wasm"), statestore::GUEST_COMPONENT).expect("component");
    let config = dir.join("tenants.toml");
    std::fs::write(&config, tenants_config(&dir, 1)).expect("config");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Reaped(
        statestore()
            .args(["serve", "--listen", &listen, "--config"])
            .arg(&config)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start statestore"),
    );
    let log = capture_stderr(&mut child);
    wait_for(&log, "tenants started", Duration::from_secs(60));
    wait_for(&log, "listening", Duration::from_secs(10));
    let client = |id: &'static str| async move {
        let mut c = RawClient::connect(port, id).await;
        let rt = c.response_topic();
        c.subscribe(&rt).await;
        c
    };
    let mut alpha = client("alpha-1").await;
    let mut beta = client("someone").await;
    assert_eq!(text(&alpha.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    assert_eq!(
        text(&alpha.call(&[b"SET", b"k2", b"v"]).await),
        "-ERR the quota has been exceeded\r\n"
    );
    assert_eq!(
        text(&beta.call(&[b"GET", b"k"]).await),
        "$-1\r\n",
        "beta is separate"
    );
    assert_eq!(text(&beta.call(&[b"SET", b"k2", b"v"]).await), "+OK\r\n");

    // A new build of alpha's component and a larger quota, applied on SIGHUP.
    std::fs::write(dir.join("alpha.wasm"), rebuilt_component()).expect("new component");
    std::fs::write(&config, tenants_config(&dir, 3)).expect("config");
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    wait_for(&log, "upgraded", Duration::from_secs(30));
    assert!(log.lock().expect("log").contains("tenant=alpha"));
    assert_eq!(
        text(&alpha.call(&[b"GET", b"k"]).await),
        "$1\r\nv\r\n",
        "state kept"
    );
    assert_eq!(
        text(&alpha.call(&[b"SET", b"k2", b"v"]).await),
        "+OK\r\n",
        "new quota"
    );
    assert_eq!(text(&beta.call(&[b"GET", b"k2"]).await), "$1\r\nv\r\n");

    // A component whose output list this host cannot read is refused at
    // load, before any traffic moves: alpha keeps serving on the old one.
    std::fs::write(
        dir.join("alpha.wasm"),
        statestore_tests::next_formats_wasm(),
    )
    .expect("next-formats component");
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    wait_for(&log, "upgrade skipped", Duration::from_secs(30));
    assert!(
        log.lock()
            .expect("log")
            .contains(&format!(
                "writes output list version {}; this host writes batch version {} and reads output list version {}",
                statestore_guest::wire::OUTPUTS_VERSION + 1,
                statestore_guest::wire::BATCH_VERSION,
                statestore_guest::wire::OUTPUTS_VERSION
            )),
        "the refusal says why"
    );
    assert_eq!(
        text(&alpha.call(&[b"SET", b"k3", b"v"]).await),
        "+OK\r\n",
        "the old component serves on"
    );
    assert_eq!(text(&alpha.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = wait_exit(&mut child, Duration::from_secs(10));
    assert!(
        status.success(),
        "exit {status}: {}",
        log.lock().expect("log")
    );
    // Each tenant kept its own journal.
    assert!(dir.join("data/alpha").is_dir() && dir.join("data/beta").is_dir());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("statestore-cli-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("tenants.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"a\"\ndefault = true\nmax_kyes = 3\n",
    )
    .expect("config");
    let o = statestore()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("unknown key \"max_kyes\""), "{err}");
    assert!(err.contains("tenants.toml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `statestore component` writes the very build the binary serves, and its
/// WIT and contract; `--version` names the build's sha256.
#[test]
fn the_component_can_be_taken_away() {
    use sha2::{Digest, Sha256};
    let dir = std::env::temp_dir().join(format!("statestore-cli-component-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("statestore.wasm");
    let wit = dir.join("wit");
    let o = statestore()
        .args(["component", "--out"])
        .arg(&out)
        .arg("--wit")
        .arg(&wit)
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).expect("component written");
    assert_eq!(bytes, statestore::GUEST_COMPONENT);
    assert_eq!(
        std::fs::read_to_string(wit.join("store.wit")).expect("wit"),
        include_str!("../../wit/store.wit")
    );
    assert_eq!(
        std::fs::read_to_string(wit.join("WIRE.md")).expect("wire"),
        include_str!("../../wit/WIRE.md")
    );
    let hex: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let v = run(&["--version"]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        text.contains(&format!("component sha256 {hex}")) && text.contains("statestore:core@0.6.0"),
        "{text}"
    );
    // A path it cannot write is a clear error.
    let bad = run(&["component", "--out", "/nonexistent/dir/x.wasm"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("cannot write /nonexistent/dir/x.wasm"),
        "{}",
        stderr(&bad)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A graceful shutdown flushes the journal and says so: with `--fsync no`
/// the write is only in the page cache until then; after SIGTERM the log
/// reports the flushed log, and a restart has the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_reports_what_it_flushed() {
    let dir = std::env::temp_dir().join(format!("statestore-cli-flush-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port();
    let serve = |port: u16| {
        let mut c = statestore();
        c.args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--fsync",
            "no",
        ])
        .arg("--data-dir")
        .arg(&dir)
        .stderr(Stdio::piped());
        c
    };
    let mut child = Reaped(serve(port).spawn().expect("start statestore"));
    let log = capture_stderr(&mut child);
    wait_for(&log, "listening", Duration::from_secs(30));
    let status = set_get_then_sigterm(port, &mut child).await;
    assert!(status.success(), "{}", log.lock().expect("log"));
    let text_of_log = log.lock().expect("log").clone();
    let line = text_of_log
        .lines()
        .find(|l| l.contains("journal flushed"))
        .unwrap_or_else(|| panic!("no flush report:\n{text_of_log}"));
    assert!(
        line.contains("tenant=default") && line.contains("log_bytes="),
        "{line}"
    );
    assert!(!line.contains("log_bytes=0 "), "{line}");
    let port = free_port();
    let mut child = Reaped(serve(port).spawn().expect("restart statestore"));
    let log = capture_stderr(&mut child);
    wait_for(&log, "listening", Duration::from_secs(30));
    let mut c = RawClient::connect(port, "after-restart").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example systemd unit is valid and its ExecStart serves: run as
/// written, with the binary, data directory and port put in for this
/// machine; `systemd-analyze verify` checks the unit where systemd is
/// installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_systemd_unit_serves() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/statestore.service"
    ))
    .expect("examples/statestore.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let dir = std::env::temp_dir().join(format!("statestore-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (port, metrics) = (free_port(), free_port());
    let bin = env!("CARGO_BIN_EXE_statestore");
    let line = exec
        .replace("/usr/local/bin/statestore", bin)
        .replace("/var/lib/statestore/data", &dir.display().to_string())
        .replace("127.0.0.1:1883", &format!("127.0.0.1:{port}"))
        .replace("127.0.0.1:9464", &format!("127.0.0.1:{metrics}"));
    assert!(
        line.contains(&format!("--metrics 127.0.0.1:{metrics}")),
        "{line}"
    );
    assert_ne!(
        line, exec,
        "the unit names the binary, data directory and address"
    );
    if std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let copy = dir.with_extension("service");
        std::fs::write(&copy, unit.replace(exec, &line)).expect("write the unit");
        let v = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .output()
            .expect("systemd-analyze");
        assert!(
            v.stderr.is_empty() && v.status.success(),
            "{}",
            String::from_utf8_lossy(&v.stderr)
        );
        let _ = std::fs::remove_file(&copy);
    }
    let mut words = line.split_whitespace();
    let mut child = Reaped(
        Command::new(words.next().expect("a program"))
            .args(words)
            .env(
                "STATESTORE_CACHE_DIR",
                std::env::temp_dir().join("statestore-cli-test-cache"),
            )
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the unit's command"),
    );
    let log = capture_stderr(&mut child);
    wait_for(
        &log,
        "embedded MQTT broker listening",
        Duration::from_secs(30),
    );
    // Its metrics port answers (the metrics test checks what it says).
    let mut scrape = std::net::TcpStream::connect(("127.0.0.1", metrics)).expect("metrics port");
    std::io::Write::write_all(
        &mut scrape,
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .expect("request");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut scrape, &mut answer).expect("response");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let status = set_get_then_sigterm(port, &mut child).await;
    assert!(status.success(), "{}", log.lock().expect("log"));
    assert!(log.lock().expect("log").contains("journal flushed"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One config file for everything: `serve --config FILE` takes every
/// `serve` flag from its `[serve]` table, flags on the command line
/// override it, `config check` prints the effective settings, and an
/// unknown key is an error with its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_file_for_every_serve_flag() {
    let dir = std::env::temp_dir().join(format!(
        "statestore-cli-serve-config-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let file_port = free_port();
    let file = dir.join("statestore.toml");
    std::fs::write(
        &file,
        format!(
            "# one store\n[serve]\nlisten = \"127.0.0.1:{file_port}\"\nmax_value_mib = 1\nmemory_mib = 256\nmax_key = \"1KiB\"\nno_memory_journal = true\n"
        ),
    )
    .expect("write");
    // config check: the effective settings, and where each comes from.
    let o = statestore()
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("config check");
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("listen = \"127.0.0.1:{file_port}\"   # file")),
        "{out}"
    );
    // Keys by their old names (`memory_mib`: a bare number in MiB) or new.
    assert!(out.contains("memory = 256   # file"), "{out}");
    assert!(out.contains("max_key = \"1KiB\"   # file"), "{out}");
    assert!(out.contains("max_packet = \"32MiB\"   # default"), "{out}");
    assert!(out.contains("max_value_bytes = 1048576"), "{out}");
    // serve: the file's listen address and value limit.
    let serve_with = |extra: &[&str], port: u16| {
        let mut cmd = statestore();
        cmd.arg("serve").arg("--config").arg(&file).args(extra);
        Server::spawn_until(cmd, &format!("listen=127.0.0.1:{port}"))
    };
    let server = serve_with(&[], file_port);
    let mut c = RawClient::connect(file_port, "config-client").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    let over = vec![b'x'; (1 << 20) + 1];
    assert_eq!(
        text(&c.call(&[b"SET", b"k", &over]).await),
        "-ERR the quota has been exceeded\r\n"
    );
    server.kill9();
    // A flag overrides the file.
    let flag_port = free_port();
    serve_with(&["--listen", &format!("127.0.0.1:{flag_port}")], flag_port).kill9();
    // Unknown keys: errors with their line, in [serve] and in a tenant.
    std::fs::write(
        &file,
        "[serve]\nlisten = \"127.0.0.1:1\"\n\nmax_pakket_mib = 3\n",
    )
    .expect("write");
    for args in [vec!["config", "check"], vec!["serve", "--config"]] {
        let o = statestore().args(&args).arg(&file).output().expect("runs");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("line 4: unknown key \"max_pakket_mib\""),
            "{err}"
        );
    }
    // A bad value: named by its key and line in the file, not as a flag.
    std::fs::write(
        &file,
        "[serve]\nlisten = \"127.0.0.1:1\"\nmemory_mib = \"lots\"\n",
    )
    .expect("write");
    for args in [vec!["config", "check"], vec!["serve", "--config"]] {
        let o = statestore().args(&args).arg(&file).output().expect("runs");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("line 3: memory_mib = \"lots\" is not valid: \"lots\" is not a number"),
            "{err}"
        );
        assert!(!err.contains("--memory"), "{err}");
    }
    std::fs::write(&file, "[serve]\nfsync = \"sometimes\"\n").expect("write");
    let o = statestore()
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "line 2: fsync = \"sometimes\" is not valid: it must be one of always, everysec, no"
        ),
        "{err}"
    );
    std::fs::write(
        &file,
        "[[tenant]]\nname = \"a\"\ndefault = true\n\nmemroy_mib = 16\n",
    )
    .expect("write");
    let o = statestore()
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("line 5") && err.contains("memroy_mib"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Secure by default (until TLS and authentication land): the
/// embedded broker refuses to listen beyond loopback unless told
/// `--allow-insecure`, with a message that says what to do.
#[test]
fn listening_beyond_loopback_needs_allow_insecure() {
    let port = free_port();
    let addr = format!("0.0.0.0:{port}");
    let o = statestore()
        .args(["serve", "--listen", &addr])
        .output()
        .expect("runs");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("refusing to listen on {addr}")) && err.contains("--allow-insecure"),
        "{err}"
    );
    // With it, the check is passed: an address of no interface here
    // (TEST-NET-1) then fails at the bind, so no port is opened beyond
    // loopback by this test.
    let addr = format!("192.0.2.1:{port}");
    let o = statestore()
        .args(["serve", "--listen", &addr, "--allow-insecure"])
        .output()
        .expect("runs");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("refusing") && err.contains(&format!("cannot listen on {addr}")),
        "{err}"
    );
    // A TLS listener beyond loopback needs authentication (or the flag).
    let tls = format!("0.0.0.0:{}", free_port());
    let o = statestore()
        .args(["serve", "--tls-listen", &tls])
        .args([
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains(&format!(
                "refusing to listen with TLS on {tls} without authentication"
            ))
            && err.contains("--users-file")
            && err.contains("--client-ca"),
        "{err}"
    );
    // On loopback it passes the check; unreadable files are a clear error.
    let tls = format!("127.0.0.1:{}", free_port());
    let o = statestore()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--tls-listen", &tls])
        .args([
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("cannot set up TLS with --tls-cert /nonexistent/cert.pem"),
        "{err}"
    );
    // --tls-listen needs its certificate and key.
    let o = statestore()
        .args(["serve", "--tls-listen", &tls])
        .output()
        .expect("runs");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--tls-cert"),
        "{o:?}"
    );
}

/// Authentication: `--users-file` in the format `mosquitto_passwd`
/// writes; every client must be a user, and a client id held by a user
/// cannot be taken by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_file_authenticates_every_client() {
    // Written by mosquitto_passwd 2.0: alice/secret ($7$), bob/hunter2 ($6$).
    let users = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==\nbob:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==\n";
    let file = std::env::temp_dir().join(format!("statestore-users-{}", std::process::id()));
    std::fs::write(&file, users).expect("write");
    let port = free_port();
    let mut child = Reaped(
        statestore()
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--users-file",
            ])
            .arg(&file)
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve"),
    );
    let log = capture_stderr(&mut child);
    wait_for(&log, "listening", Duration::from_secs(30));
    // A user with the right password.
    let mut alice = RawClient::try_connect(port, "alice-id", Some(("alice", "secret")))
        .await
        .expect("alice connects");
    let rt = alice.response_topic();
    alice.subscribe(&rt).await;
    assert_eq!(text(&alice.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    // A wrong password, an unknown user, no user: refused (how many
    // guesses one address gets: `limits.rs`).
    for credentials in [Some(("alice", "Secret")), Some(("carol", "secret")), None] {
        let refused = RawClient::try_connect(port, "intruder", credentials).await;
        assert!(refused.is_err(), "{credentials:?} was let in");
    }
    // Another user cannot take alice's client id; alice stays connected.
    let taken = RawClient::try_connect(port, "alice-id", Some(("bob", "hunter2"))).await;
    assert!(taken.is_err(), "bob took alice's client id");
    assert_eq!(text(&alice.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    assert!(!alice.was_disconnected());
    // bob with his own id is fine.
    let mut bob = RawClient::try_connect(port, "bob-id", Some(("bob", "hunter2")))
        .await
        .expect("bob connects");
    let rt = bob.response_topic();
    bob.subscribe(&rt).await;
    assert_eq!(text(&bob.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
}

/// `serve` raises its soft limit on open files to the hard limit (each
/// connection is a file), whatever soft limit it was started with.
#[test]
fn serve_raises_its_open_files_limit() {
    let listen = format!("127.0.0.1:{}", free_port());
    // Started by a shell that lowers its soft limit first.
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -Sn 256 && exec \"$0\" serve --listen \"$1\""])
        .arg(env!("CARGO_BIN_EXE_statestore"))
        .arg(&listen)
        .env(
            "STATESTORE_CACHE_DIR",
            std::env::temp_dir().join("statestore-cli-test-cache"),
        )
        .stderr(Stdio::piped());
    let mut child = Reaped(command.spawn().expect("start statestore"));
    let log = capture_stderr(&mut child);
    wait_for(
        &log,
        "embedded MQTT broker listening",
        Duration::from_secs(30),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id()))
        .expect("/proc/PID/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a line on open files");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_ne!(fields[3], "256", "the soft limit was not raised: {line}");
    assert_eq!(
        fields[3], fields[4],
        "soft and hard limits on open files after start: {line}"
    );
    assert!(
        log.lock()
            .expect("log lock")
            .contains("raised the soft limit on open files"),
        "the raise is logged"
    );
}

/// Sizes and durations take units (a bare number is the old unit), and a
/// value out of range is refused at start, in those units.
#[test]
fn sizes_and_durations_take_units_and_are_checked() {
    let refused = |args: &[&str]| {
        let o = statestore().arg("serve").args(args).output().expect("runs");
        assert!(!o.status.success(), "{args:?}: {o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = refused(&["--memory", "8MiB"]);
    assert!(
        err.contains("--memory 8MiB is out of range: it must be from 16MiB to 4GiB"),
        "{err}"
    );
    let err = refused(&["--max-value", "5MB"]);
    assert!(err.contains("unknown unit \"mb\""), "{err}");
    // Old names, bare numbers in their unit: 400 MiB is past a third of 1 GiB.
    let err = refused(&["--max-bytes-mib", "400"]);
    assert!(
        err.contains("--max-bytes 400MiB is more than a third of --memory 1GiB"),
        "{err}"
    );
    let err = refused(&["--keep-alive", "2s"]);
    assert!(err.contains("--keep-alive 2s is out of range"), "{err}");
}
