//! `serve --metrics ADDR`, through the real binary: a bounded load of
//! known shape, then a scrape whose counters, histogram counts and
//! gauges must say exactly what the load did; `/readyz` and `/healthz`.
//! Both modes.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use statestore_tests::broker::{Mosquitto, RawClient, free_port, text};
use statestore_tests::http_get;
use statestore_tests::process::Server;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statestore"));
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-metrics-test-cache"),
    );
    c
}

/// Every sample of a scrape: `name{labels}` to value.
fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, body) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn value(m: &BTreeMap<String, f64>, sample: &str) -> f64 {
    m.get(sample).copied().unwrap_or(0.0)
}

/// Scrapes until `check` holds (gauges are read from the guest about once
/// a second), or fails with the last scrape.
fn eventually(port: u16, what: &str, check: impl Fn(&BTreeMap<String, f64>) -> bool) {
    let start = Instant::now();
    loop {
        let m = scrape(port);
        if check(&m) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: {m:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

const T: &str = "tenant=\"default\"";

/// The load: 200 SETs of distinct keys, 100 GETs, 10 SCANs, a KEYNOTIFY
/// and 5 SETs of the observed key (5 notifications), 3 keys that expire.
async fn load(port: u16, metrics: u16) -> usize {
    let mut c = RawClient::connect(port, "metrics-load").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in 0..200 {
        let k = format!("m/{i}");
        assert_eq!(
            text(&c.call(&[b"SET", k.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    // Mid-load, the counters already say what happened so far.
    let m = scrape(metrics);
    let sets = format!("statestore_requests_total{{{T},verb=\"SET\"}}");
    assert_eq!(value(&m, &sets), 200.0, "{sets}");
    // (A latency is observed once its reply is out: just after the client has it.)
    eventually(metrics, "latency count mid-load", |m| {
        value(
            m,
            &format!("statestore_request_duration_seconds_count{{{T}}}"),
        ) == 200.0
    });
    for i in 0..100 {
        let k = format!("m/{i}");
        assert_eq!(text(&c.call(&[b"GET", k.as_bytes()]).await), "$1\r\nv\r\n");
    }
    for _ in 0..10 {
        assert!(text(&c.call(&[b"SCAN", b"m/1*"]).await).starts_with("*1\r\n*111\r\n"));
    }
    assert_eq!(text(&c.call(&[b"KEYNOTIFY", b"watched"]).await), "+OK\r\n");
    for i in 0..5 {
        let v = format!("{i}");
        assert_eq!(
            text(&c.call(&[b"SET", b"watched", v.as_bytes()]).await),
            "+OK\r\n"
        );
    }
    for i in 0..3 {
        let k = format!("short/{i}");
        assert_eq!(
            text(&c.call(&[b"SET", k.as_bytes(), b"v", b"PX", b"100"]).await),
            "+OK\r\n"
        );
    }
    c.disconnect().await;
    200 + 100 + 10 + 1 + 5 + 3
}

/// `observers`: registrations left after the load's client went away (an
/// external store hears of disconnects only with `--client-events`).
fn check_counts(metrics: u16, requests: usize, observers: f64) {
    let m = scrape(metrics);
    for (verb, n) in [
        ("SET", 208.0),
        ("GET", 100.0),
        ("SCAN", 10.0),
        ("KEYNOTIFY", 1.0),
        ("DEL", 0.0),
    ] {
        let sample = format!("statestore_requests_total{{{T},verb=\"{verb}\"}}");
        assert_eq!(value(&m, &sample), n, "{sample}");
    }
    let ok = format!("statestore_replies_total{{outcome=\"ok\",status=\"200\",{T}}}");
    assert_eq!(value(&m, &ok), requests as f64, "{ok}");
    let count = format!("statestore_request_duration_seconds_count{{{T}}}");
    let inf = format!("statestore_request_duration_seconds_bucket{{{T},le=\"+Inf\"}}");
    eventually(metrics, "a latency per request", |m| {
        value(m, &count) == requests as f64 && value(m, &inf) == requests as f64
    });
    assert_eq!(
        value(&m, &format!("statestore_notifications_total{{{T}}}")),
        5.0
    );
    // 200 keys, the observed one; the 3 short ones expire (by the timer).
    eventually(metrics, "gauges after expiry", |m| {
        value(m, &format!("statestore_keys{{{T}}}")) == 201.0
            && value(m, &format!("statestore_expirations_total{{{T}}}")) == 3.0
            && value(m, &format!("statestore_keynotify_registrations{{{T}}}")) == observers
    });
    let m = scrape(metrics);
    assert!(value(&m, &format!("statestore_key_value_bytes{{{T}}}")) >= 201.0 * 3.0);
    assert!(value(&m, &format!("statestore_guest_calls_total{{{T}}}")) >= 300.0);
    assert!(value(&m, &format!("statestore_guest_memory_bytes{{{T}}}")) >= 65536.0);
    // Every write's reply is kept for retries; nothing was retried.
    assert!(value(&m, &format!("statestore_dedup_entries{{{T}}}")) >= 200.0);
    assert_eq!(
        value(&m, &format!("statestore_dedup_hits_total{{{T}}}")),
        0.0
    );
    assert_eq!(value(&m, &format!("statestore_tenant_up{{{T}}}")), 1.0);
    assert_eq!(http_get(metrics, "/healthz").0, 200);
}

fn wait_ready(metrics: u16) {
    let start = Instant::now();
    while http_get(metrics, "/readyz").0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(30), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_says_what_the_load_did_embedded() {
    let dir = std::env::temp_dir().join(format!("statestore-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (port, metrics) = (free_port(), free_port());
    let mut c = bin();
    c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics", &format!("127.0.0.1:{metrics}")])
        .arg("--data-dir")
        .arg(&dir);
    let server = Server::spawn(c);
    wait_ready(metrics);
    let requests = load(port, metrics).await;
    check_counts(metrics, requests, 0.0);
    let m = scrape(metrics);
    // Durable: every write and its kept reply are journaled, each batch fsynced.
    assert!(value(&m, &format!("statestore_journal_records_total{{{T}}}")) >= 416.0);
    assert!(value(&m, &format!("statestore_journal_bytes_total{{{T}}}")) > 416.0 * 20.0);
    assert!(
        value(
            &m,
            &format!("statestore_journal_fsync_duration_seconds_count{{{T}}}")
        ) >= 200.0
    );
    // The load's client has gone: no connections. Nothing was dropped
    // for a session at its byte limit.
    eventually(metrics, "connections", |m| {
        value(m, "statestore_connections") == 0.0
    });
    assert_eq!(value(&m, "statestore_queue_dropped_total"), 0.0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `statestore serve` through `broker` as `client_id`, with `args` and
/// metrics (their port), serving.
fn through(broker: &Mosquitto, client_id: &str, args: &[&str]) -> (Server, u16) {
    let metrics = free_port();
    let mut c = bin();
    c.args([
        "serve",
        "--broker",
        &format!("mqtt://127.0.0.1:{}", broker.port),
        "--client-id",
        client_id,
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
    ])
    .args(args)
    .env("RUST_LOG", "info");
    let server = Server::spawn_until(c, "subscribed; serving");
    wait_ready(metrics);
    (server, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_says_what_the_load_did_through_mosquitto() {
    let broker = Mosquitto::start();
    let (_server, metrics) = through(&broker, "statestore-metrics", &[]);
    let requests = load(broker.port, metrics).await;
    check_counts(metrics, requests, 1.0);
}

#[test]
fn a_taken_metrics_port_is_a_clear_error() {
    // Before any recovery starts.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let o = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .output()
        .expect("runs");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot listen for metrics"),
        "{o:?}"
    );
}

/// Through an external broker with `--response-topics sdk`, a request
/// whose response topic is not its requester's (someone else's topic, or
/// no identity at all) is not answered: nothing is published there, not
/// even a refusal (the store would be a deputy publishing where an
/// attacker points). It is logged and counted in
/// `statestore_requests_ignored_total`; proper requests are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_response_topic_is_not_its_requesters_is_not_answered_there() {
    let broker = Mosquitto::start();
    let (server, metrics) = through(&broker, "statestore-deputy", &["--response-topics", "sdk"]);
    let mut victim = RawClient::connect(broker.port, "billing").await;
    victim.subscribe("protected/billing/commands").await;
    let mut attacker = RawClient::connect(broker.port, "attacker").await;
    let own = attacker.response_topic();
    attacker.subscribe(&own).await;
    // Someone else's topic; and the victim's SDK-shaped topic.
    for topic in [
        "protected/billing/commands".to_string(),
        own.replace("attacker", "billing"),
    ] {
        let mut props = attacker.request_properties();
        props.response_topic = Some(topic);
        attacker
            .publish_request(statestore_tests::resp(&[b"GET", b"k"]), props)
            .await;
    }
    // A proper request is answered (and comes after the others).
    let r = attacker.call(&[b"SET", b"k", b"v"]).await;
    assert_eq!(text(&r), "+OK\r\n");
    assert!(
        victim.recv(Duration::from_millis(500)).await.is_none(),
        "something was published to the victim's topic"
    );
    assert!(attacker.recv(Duration::from_millis(200)).await.is_none());
    eventually(metrics, "ignored requests counted", |m| {
        value(m, &format!("statestore_requests_ignored_total{{{T}}}")) == 2.0
    });
    assert!(server.log().contains("not answered"), "{}", server.log());
}
