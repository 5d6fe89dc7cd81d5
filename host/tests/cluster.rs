//! Three `statestore serve --cluster` processes on loopback, with
//! the unmodified Azure IoT Operations SDK as their clients:
//! - every replica serves the SDK (writes and reads on followers are
//!   forwarded to the leader), and a notification reaches an observer
//!   connected to another replica than the writer;
//! - under a write load on every replica, the leader and a follower are
//!   killed (SIGKILL) again and again and restarted: every acknowledged SET
//!   reads back with its value and version from any replica, and every
//!   acknowledged DEL stays deleted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_iot_operations_services::state_store::{Operation, SetOptions};
use statestore::cluster::partition::partition_of;
use statestore_tests::broker::{RawClient, free_port, prop, text};
use statestore_tests::links::Proxy;
use statestore_tests::process::Server;
use statestore_tests::sdk::Sdk;

const T: Duration = Duration::from_secs(2);

/// An SDK client of the replica on `port`, reconnecting for as long as it
/// takes (its replica may be down for a while).
async fn sdk(port: u16, id: &str) -> Sdk {
    let settings = statestore_tests::sdk::plain(port, id)
        .keep_alive(Duration::from_secs(5))
        .build()
        .expect("mqtt settings");
    Sdk::start(settings, None, Duration::from_millis(500)).await
}

/// `statestore serve --cluster` (its file to follow). Replicas share a
/// cache of the compiled component: compiling it in every one of the many
/// processes these tests start (a debug build's compiler) takes seconds of
/// CPU each, enough on a busy machine to miss a start deadline.
fn serve_cluster() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_statestore"));
    cmd.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-cluster-test-cache"),
    )
    .args(["serve", "--cluster"]);
    cmd
}

/// Three replicas' files in a fresh directory.
struct Cluster {
    dir: PathBuf,
    mqtt: Vec<u16>,
    /// Where each replica listens for the others.
    raft: Vec<u16>,
    /// Each replica's `--metrics` port.
    metrics: Vec<u16>,
    servers: Vec<Option<Server>>,
    /// The port of the external broker the replicas serve through, if any.
    broker: Option<u16>,
    /// `links[i][j]`: the proxy replica `i` reaches replica `j` through
    /// (`None` for `i == j`), if the links can be cut.
    links: Vec<Vec<Option<Proxy>>>,
    /// More arguments of every replica's `serve`.
    args: Vec<String>,
}

impl Cluster {
    /// Replicas started with `args` added to their `serve`.
    fn with_args(replicas: usize, args: &[&str]) -> Cluster {
        let raft: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        let args = args.iter().map(|a| (*a).to_string()).collect();
        Cluster::build_with_raft(replicas, None, raft, Vec::new(), args, "", |_, _, raft| {
            raft
        })
    }

    /// Replicas serving the tenants of the config file `config` (its
    /// text), each store in `partitions` partitions.
    fn with_tenants(replicas: usize, partitions: u32, config: &str) -> Cluster {
        Cluster::with_tenants_on(replicas, partitions, config, None)
    }

    /// [`Cluster::with_tenants`], serving through the external broker on
    /// `broker` (if any).
    fn with_tenants_on(
        replicas: usize,
        partitions: u32,
        config: &str,
        broker: Option<u16>,
    ) -> Cluster {
        let path = std::env::temp_dir().join(format!(
            "statestore-tenants-{}-{}.toml",
            std::process::id(),
            free_port()
        ));
        std::fs::write(&path, config).expect("config");
        let raft: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        let args = vec!["--config".to_string(), path.display().to_string()];
        Cluster::build_with_raft(
            replicas,
            broker,
            raft,
            Vec::new(),
            args,
            &format!("partitions = {partitions}\n"),
            |_, _, raft| raft,
        )
    }

    /// Replicas of a store in `partitions` partitions.
    fn with_partitions(replicas: usize, partitions: u32) -> Cluster {
        Cluster::with_layout(replicas, &format!("partitions = {partitions}\n"))
    }

    /// Replicas whose cluster file has `layout` (lines of it: partitions,
    /// copies).
    fn with_layout(replicas: usize, layout: &str) -> Cluster {
        let raft: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        Cluster::build_with_raft(
            replicas,
            None,
            raft,
            Vec::new(),
            Vec::new(),
            layout,
            |_, _, raft| raft,
        )
    }

    fn new(replicas: usize) -> Cluster {
        Cluster::with_broker(replicas, None)
    }

    fn with_broker(replicas: usize, broker: Option<u16>) -> Cluster {
        Cluster::build(replicas, broker, Vec::new(), |_, _, raft| raft)
    }

    /// Replicas whose links to each other go through proxies the test can
    /// cut ([`Cluster::cut`]): replica `i`'s file names replica `j` at the
    /// proxy `links[i][j]`.
    async fn with_links(replicas: usize) -> Cluster {
        let raft: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        let mut links = Vec::new();
        for i in 0..replicas {
            let mut row = Vec::new();
            for (j, &port) in raft.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    Some(Proxy::start(([127, 0, 0, 1], port).into()).await)
                });
            }
            links.push(row);
        }
        let ports: Vec<Vec<u16>> = links
            .iter()
            .map(|row| {
                row.iter()
                    .map(|p| p.as_ref().map_or(0, |p| p.addr.port()))
                    .collect()
            })
            .collect();
        Cluster::build_with_raft(
            replicas,
            None,
            raft,
            links,
            Vec::new(),
            "",
            move |i, j, raft| {
                if i == j { raft } else { ports[i][j] }
            },
        )
    }

    /// Cuts what replica `from` sends to replica `to`.
    fn cut(&self, from: usize, to: usize) {
        self.links[from][to].as_ref().expect("a proxied link").cut();
    }

    /// Heals every link.
    fn heal(&self) {
        for p in self.links.iter().flatten().flatten() {
            p.heal();
        }
    }

    fn build(
        replicas: usize,
        broker: Option<u16>,
        links: Vec<Vec<Option<Proxy>>>,
        peer: impl Fn(usize, usize, u16) -> u16,
    ) -> Cluster {
        let raft: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        Cluster::build_with_raft(replicas, broker, raft, links, Vec::new(), "", peer)
    }

    /// The files (replica `i` names replica `j`'s raft port `peer(i, j,
    /// its port)`, and `direct.toml` names every one's own, for the
    /// operator's commands), then the replicas.
    fn build_with_raft(
        replicas: usize,
        broker: Option<u16>,
        raft: Vec<u16>,
        links: Vec<Vec<Option<Proxy>>>,
        args: Vec<String>,
        layout: &str,
        peer: impl Fn(usize, usize, u16) -> u16,
    ) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "statestore-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("secret"), "a-test-secret-of-enough-bytes\n").expect("secret");
        let mqtt: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        let file = |i: usize, peer: &dyn Fn(usize, usize, u16) -> u16| {
            let mut f = format!(
                "id = {}\ndata_dir = \"replica-{}\"\nsecret_file = \"secret\"\ntls_dir = \"tls\"\n{layout}",
                i + 1,
                i + 1
            );
            for (j, &port) in raft.iter().enumerate() {
                f.push_str(&format!(
                    "\n[[replica]]\nid = {}\nraft = \"127.0.0.1:{}\"\nmqtt = \"127.0.0.1:{}\"\n",
                    j + 1,
                    peer(i, j, port),
                    mqtt[j]
                ));
            }
            f
        };
        for i in 0..replicas {
            std::fs::write(dir.join(format!("replica-{}.toml", i + 1)), file(i, &peer))
                .expect("file");
        }
        std::fs::write(dir.join("direct.toml"), file(0, &|_, _, raft| raft)).expect("file");
        // Every link between replicas is mutual TLS, as an operator sets
        // it up: `cluster certs` makes the cluster's CA and certificates.
        let (ok, out) = cluster_command(&dir.join("direct.toml"), &["certs"]);
        assert!(ok && out.contains("replica-1.key"), "cluster certs:\n{out}");
        let mut c = Cluster {
            dir,
            mqtt,
            raft,
            metrics: (0..replicas).map(|_| free_port()).collect(),
            servers: Vec::new(),
            broker,
            links,
            args,
        };
        for i in 0..replicas {
            let s = c.spawn(i);
            c.servers.push(Some(s));
        }
        c
    }

    fn file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("replica-{}.toml", i + 1))
    }

    fn spawn(&self, i: usize) -> Server {
        let mut cmd = serve_cluster();
        cmd.arg(self.file(i))
            .args(["--metrics", &format!("127.0.0.1:{}", self.metrics[i])])
            .args(&self.args)
            .env("RUST_LOG", "info");
        match self.broker {
            Some(port) => {
                cmd.args(["--broker", &format!("mqtt://127.0.0.1:{port}")]);
                Server::spawn_until(cmd, "subscribed; serving")
            }
            None => Server::spawn(cmd),
        }
    }

    /// Writes the cluster file of a new replica, the next one (id n, its
    /// file `replica-<n>.toml`): `settings` after its secret and TLS lines,
    /// then the replicas at `peers` and itself (`own`: more lines of its
    /// entry); then starts it. Its raft and mqtt ports.
    fn start_new(&mut self, settings: &str, peers: &[usize], own: &str) -> (u16, u16) {
        let (raft, mqtt) = (free_port(), free_port());
        let id = self.raft.len() + 1;
        let mut f = format!(
            "id = {id}\ndata_dir = \"replica-{id}\"\nsecret_file = \"secret\"\ntls_dir = \"tls\"\n{settings}"
        );
        for &i in peers {
            f.push_str(&format!(
                "\n[[replica]]\nid = {}\nraft = \"127.0.0.1:{}\"\nmqtt = \"127.0.0.1:{}\"\n",
                i + 1,
                self.raft[i],
                self.mqtt[i]
            ));
        }
        f.push_str(&format!(
            "\n[[replica]]\nid = {id}\nraft = \"127.0.0.1:{raft}\"\nmqtt = \"127.0.0.1:{mqtt}\"\n{own}"
        ));
        std::fs::write(self.dir.join(format!("replica-{id}.toml")), f).expect("file");
        self.mqtt.push(mqtt);
        self.raft.push(raft);
        self.metrics.push(free_port());
        let s = self.spawn(id - 1);
        self.servers.push(Some(s));
        (raft, mqtt)
    }

    /// Starts replica `i` expecting it to refuse to start: its log.
    fn start_refused(&self, i: usize) -> String {
        let mut child = serve_cluster()
            .arg(self.file(i))
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start statestore");
        let log = statestore_tests::process::capture_stderr(&mut child);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                // Its last words reach the log a moment after it exits.
                std::thread::sleep(Duration::from_millis(200));
                let log = log.lock().expect("log").clone();
                assert!(!status.success(), "exited {status}:\n{log}");
                return log;
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("it started:\n{}", log.lock().expect("log"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replica `i`'s data directory.
    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("replica-{}", i + 1))
    }

    /// `cluster status`: (exit success, output).
    fn status(&self) -> (bool, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_statestore"))
            .args(["cluster", "status", "--cluster"])
            .arg(self.dir.join("direct.toml"))
            .output()
            .expect("cluster status");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// The leader's index, once one is known to a majority.
    fn leader(&self, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            let (ok, text) = self.status();
            let leader = text.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 1 && f[1] == "leader")
                    .then(|| f[0].parse::<usize>().ok())
                    .flatten()
            });
            if ok && let Some(id) = leader {
                return id - 1;
            }
            assert!(start.elapsed() < within, "no leader:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every replica answers and has applied what the leader has.
    fn settled(&self, within: Duration) -> String {
        let start = Instant::now();
        loop {
            let (ok, text) = self.status();
            let rows: Vec<&str> = text
                .lines()
                .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
                .collect();
            let all_caught_up = rows.len() == self.mqtt.len()
                && rows.iter().all(|r| {
                    let f: Vec<&str> = r.split_whitespace().collect();
                    f.len() >= 7 && f[6] == "0"
                });
            if ok && all_caught_up {
                return text;
            }
            assert!(start.elapsed() < within, "not settled:\n{text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The samples of replica `port`'s `/metrics` named `name` (any labels).
fn metric(port: u16, name: &str) -> Vec<(String, f64)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics port");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    raw.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{'))
        })
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What each replica said last: the cause of a failure.
            for (i, s) in self.servers.iter().enumerate() {
                if let Some(s) = s {
                    let log = s.log();
                    let tail: Vec<&str> = log.lines().rev().take(60).collect();
                    eprintln!("--- replica {} (last lines of its log) ---", i + 1);
                    for l in tail.iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
        }
        self.servers.clear();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn dir_exists(p: &Path) -> bool {
    p.is_dir()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_serves_the_sdk_and_notifications_cross_replicas() {
    let c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let writer = sdk(c.mqtt[follower], "cluster-writer").await;
    let observer = sdk(c.mqtt[other], "cluster-observer").await;
    let mut obs = observer
        .ss
        .observe(b"watched".to_vec(), T)
        .await
        .expect("observe on a follower")
        .response;
    let set = writer
        .ss
        .set(
            b"watched".to_vec(),
            b"v1".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("set on a follower");
    let version = set.version.expect("a version").to_string();
    let n = tokio::time::timeout(T, obs.recv_notification())
        .await
        .expect("a notification across replicas")
        .expect("observation open")
        .0;
    assert_eq!(n.operation, Operation::Set(b"v1".to_vec()));
    assert_eq!(n.version.to_string(), version);
    for port in &c.mqtt {
        let reader = sdk(*port, &format!("cluster-reader-{port}")).await;
        let got = reader.ss.get(b"watched".to_vec(), T).await.expect("get");
        assert_eq!(got.response, Some(b"v1".to_vec()), "replica on {port}");
        assert_eq!(got.version.map(|v| v.to_string()), Some(version.clone()));
        reader.close().await;
    }
    // Every replica's store metrics show the key (its guest's sizes, read
    // every second).
    for port in &c.metrics {
        let deadline = Instant::now() + T;
        while sample(*port, "statestore_keys", "tenant=\"default\"") != Some(1.0) {
            assert!(
                Instant::now() < deadline,
                "statestore_keys on {port}: {:?}",
                metric(*port, "statestore_keys")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let del = writer
        .ss
        .del(b"watched".to_vec(), None, T)
        .await
        .expect("del");
    assert_eq!(del.response, 1);
    let n = tokio::time::timeout(T, obs.recv_notification())
        .await
        .expect("a DELETE notification")
        .expect("open")
        .0;
    assert_eq!(n.operation, Operation::Del);
    writer.close().await;
    observer.close().await;
    assert!(dir_exists(&c.dir));
    // Metrics per replica: who leads, the indexes, commit latency of the
    // requests the follower forwarded, each replica's lag.
    let one = |port: u16, name: &str| -> f64 {
        metric(port, name)
            .first()
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name} on {port}"))
    };
    assert_eq!(one(c.metrics[leader], "statestore_raft_is_leader"), 1.0);
    assert_eq!(one(c.metrics[follower], "statestore_raft_is_leader"), 0.0);
    assert!(one(c.metrics[follower], "statestore_raft_applied_index") >= 3.0);
    assert!(one(c.metrics[follower], "statestore_raft_term") >= 1.0);
    assert!(
        one(
            c.metrics[follower],
            "statestore_raft_commit_duration_seconds_count"
        ) >= 2.0
    );
    assert!(one(c.metrics[follower], "statestore_raft_leader_changes_total") >= 1.0);
    let lags = metric(c.metrics[leader], "statestore_raft_replica_lag_entries");
    assert_eq!(lags.len(), 3, "{lags:?}");
    // Whether a leader is known, which, and when each peer was last heard
    // from (a leader hears from every member, a follower from the leader).
    assert_eq!(one(c.metrics[follower], "statestore_raft_has_leader"), 1.0);
    assert_eq!(
        one(c.metrics[follower], "statestore_raft_leader"),
        (leader + 1) as f64
    );
    let heard = metric(
        c.metrics[leader],
        "statestore_raft_peer_last_heard_timestamp_seconds",
    );
    assert_eq!(heard.len(), 2, "{heard:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs_f64();
    assert!(heard.iter().all(|(_, t)| now - t < 10.0), "{heard:?}");
    // The embedded broker's traffic, the build and the process.
    assert!(
        one(
            c.metrics[follower],
            "statestore_broker_messages_received_total"
        ) >= 1.0
    );
    assert!(
        one(
            c.metrics[follower],
            "statestore_broker_messages_delivered_total"
        ) >= 1.0
    );
    let build = metric(c.metrics[follower], "statestore_build_info");
    assert!(
        build.len() == 1 && build[0].0.contains("component_sha256=\""),
        "{build:?}"
    );
    assert!(one(c.metrics[follower], "process_resident_memory_bytes") > 0.0);
    // Each replica answered its reader's GET with a read index (no log
    // entry), the leader and the followers alike.
    for port in &c.metrics {
        let reads = metric(*port, "statestore_raft_reads_total");
        let by_index = reads
            .iter()
            .find(|(k, _)| k.contains("path=\"index\""))
            .map_or(0.0, |(_, v)| *v);
        assert!(by_index >= 1.0, "replica metrics on {port}: {reads:?}");
    }
    // The store's metrics of one process, per replica: the requests each
    // took, the replies it published (and their latency), notifications,
    // its guest, its Raft log as its journal.
    let count =
        |i: usize, name: &str, labels: &str| sample(c.metrics[i], name, labels).unwrap_or(0.0);
    assert_eq!(
        count(follower, "statestore_requests_total", "verb=\"SET\""),
        1.0
    );
    assert_eq!(
        count(follower, "statestore_requests_total", "verb=\"DEL\""),
        1.0
    );
    assert_eq!(
        count(other, "statestore_requests_total", "verb=\"SET\""),
        0.0
    );
    assert!(count(other, "statestore_requests_total", "verb=\"KEYNOTIFY\"") >= 1.0);
    // SET, its GET, DEL.
    assert!(count(follower, "statestore_replies_total", "outcome=\"ok\"") >= 3.0);
    assert!(count(follower, "statestore_request_duration_seconds_count", "") >= 3.0);
    // Each replica hands the SET's and the DEL's notifications to its
    // broker (which delivers them where the observer is); each runs its
    // guest and syncs its log.
    for i in 0..3 {
        for (name, at_least) in [
            ("statestore_notifications_total", 2.0),
            ("statestore_guest_calls_total", 3.0),
            ("statestore_guest_memory_bytes", 1.0),
            ("statestore_journal_records_total", 3.0),
            ("statestore_journal_fsync_duration_seconds_count", 1.0),
        ] {
            assert!(count(i, name, "") >= at_least, "{name} on replica {i}");
        }
    }
}

/// A client of the replica on `mqtt` that observes `key`, once replica
/// `metrics` (a metrics port) counts 1 KEYNOTIFY registration.
async fn observer_of(mqtt: u16, id: &str, key: &[u8], metrics: u16) -> RawClient {
    let mut observer = RawClient::connect(mqtt, id).await;
    observer.subscribe(&observer.response_topic()).await;
    let reply = observer.call(&[b"KEYNOTIFY", key]).await;
    assert_eq!(prop(&reply, "__stat"), Some("200"), "{}", text(&reply));
    registrations_become(metrics, 1.0, "the registration shows").await;
    observer
}

/// Waits (up to 20 s) until replica `metrics` (a metrics port) counts
/// `count` KEYNOTIFY registrations.
async fn registrations_become(metrics: u16, count: f64, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = sample(metrics, "statestore_keynotify_registrations", "");
        if now == Some(count) {
            return;
        }
        assert!(Instant::now() < deadline, "{why}: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of replica `port`'s sample of `name` whose labels contain
/// `labels` (and the tenant `default`).
fn sample(port: u16, name: &str, labels: &str) -> Option<f64> {
    metric(port, name)
        .into_iter()
        .find(|(k, _)| {
            k.split(['{', ' ']).next() == Some(name)
                && k.contains(labels)
                && k.contains("tenant=\"default\"")
        })
        .map(|(_, v)| v)
}

/// A client that sends a SET and then a GET of the same key without
/// waiting (one batch, often) reads its own write, on the leader and on a
/// follower: its GET goes through the log behind the SET, not with a read
/// index that could predate it. (On loopback the commit usually wins the
/// race anyway; the routing itself is `cluster::node`'s unit test
/// `a_read_behind_its_clients_write_goes_through_the_log`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_its_own_pipelined_writes_on_any_replica() {
    let c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    for (name, replica) in [("leader", leader), ("follower", (leader + 1) % 3)] {
        let mut client = RawClient::connect(c.mqtt[replica], &format!("pipelined-{name}")).await;
        let topic = client.response_topic();
        client.subscribe(&topic).await;
        let mut gets = HashMap::new();
        for n in 0..40 {
            let key = format!("{name}-{n}");
            let value = format!("value {n}");
            let set = client.request_properties();
            client
                .publish_request(
                    statestore_tests::resp(&[b"SET", key.as_bytes(), value.as_bytes()]),
                    set,
                )
                .await;
            let get = client.request_properties();
            let corr = get.correlation_data.clone().expect("correlation");
            client
                .publish_request(statestore_tests::resp(&[b"GET", key.as_bytes()]), get)
                .await;
            gets.insert(corr.to_vec(), value);
        }
        let mut answered = 0;
        while answered < gets.len() {
            let p = client
                .recv(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("{name}: {answered} of {} GETs answered", gets.len()));
            let corr = p
                .properties
                .as_ref()
                .and_then(|x| x.correlation_data.clone())
                .expect("correlation");
            if let Some(value) = gets.get(&corr.to_vec()) {
                let want = format!("${}\r\n{value}\r\n", value.len());
                assert_eq!(
                    String::from_utf8_lossy(&p.payload),
                    want,
                    "{name}: a GET right after its SET"
                );
                answered += 1;
            }
        }
        client.disconnect().await;
    }
}

/// What the writers saw acknowledged.
#[derive(Default)]
struct Acked {
    /// key -> (value, version) of acknowledged SETs.
    sets: HashMap<String, (Vec<u8>, String)>,
    /// Keys whose DEL was acknowledged.
    deleted: Vec<String>,
    /// Keys a DEL was sent for without an answer: either may have happened.
    unsure: Vec<String>,
}

async fn write_load(port: u16, name: String, stop: Arc<AtomicBool>, acked: Arc<Mutex<Acked>>) {
    let sdk = sdk(port, &name).await;
    let mut n = 0u64;
    let mut mine: Vec<String> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        if n.is_multiple_of(5)
            && let Some(key) = mine.pop()
        {
            match sdk.ss.del(key.clone().into_bytes(), None, T).await {
                Ok(r) => {
                    assert_eq!(r.response, 1, "DEL of acknowledged {key}");
                    let mut a = acked.lock().expect("lock");
                    a.sets.remove(&key);
                    a.deleted.push(key);
                }
                Err(_) => {
                    {
                        let mut a = acked.lock().expect("lock");
                        a.sets.remove(&key);
                        a.unsure.push(key);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        }
        let key = format!("{name}-{n}");
        let value = format!("value {n} of {name}").into_bytes();
        match sdk
            .ss
            .set(
                key.clone().into_bytes(),
                value.clone(),
                T,
                None,
                SetOptions::default(),
            )
            .await
        {
            Ok(r) if r.response => {
                let version = r.version.expect("a version").to_string();
                acked
                    .lock()
                    .expect("lock")
                    .sets
                    .insert(key.clone(), (value, version));
                mine.push(key);
            }
            Ok(_) => panic!("an unconditional SET of {key} was not applied"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    sdk.close().await;
}

/// A [`write_load`] on each replica's broker (`mqtt`), until `stop`.
fn writers_on_every_replica(
    mqtt: &[u16],
    stop: &Arc<AtomicBool>,
    acked: &Arc<Mutex<Acked>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    writers_named("", mqtt, stop, acked)
}

/// [`writers_on_every_replica`] whose client ids start with `prefix`.
fn writers_named(
    prefix: &str,
    mqtt: &[u16],
    stop: &Arc<AtomicBool>,
    acked: &Arc<Mutex<Acked>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    mqtt.iter()
        .enumerate()
        .map(|(i, port)| {
            tokio::spawn(write_load(
                *port,
                format!("{prefix}writer-{i}"),
                stop.clone(),
                acked.clone(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_killing_the_leader_and_a_follower_again_and_again() {
    let mut c = Cluster::new(3);
    c.leader(Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers = writers_on_every_replica(&c.mqtt, &stop, &acked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut kills = Vec::new();
    for round in 0..6 {
        let leader = tokio::task::block_in_place(|| c.leader(Duration::from_secs(20)));
        let victim = if round % 2 == 0 {
            leader
        } else {
            (leader + 1 + (round / 2) % 2) % 3
        };
        let before = acked.lock().expect("lock").sets.len();
        if let Some(s) = c.servers[victim].take() {
            s.kill9();
        }
        kills.push((round, victim, victim == leader));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let during = acked.lock().expect("lock").sets.len();
        eprintln!(
            "round {round}: killed replica {} ({}); {} writes acknowledged while it was down",
            victim + 1,
            if victim == leader {
                "leader"
            } else {
                "follower"
            },
            during.saturating_sub(before)
        );
        let s = tokio::task::block_in_place(|| c.spawn(victim));
        c.servers[victim] = Some(s);
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let status = tokio::task::block_in_place(|| c.settled(Duration::from_secs(30)));
    eprintln!("{status}");
    if std::env::var_os("STATESTORE_CLUSTER_LOGS").is_some() {
        for (i, s) in c.servers.iter().enumerate() {
            if let Some(s) = s {
                eprintln!("--- replica {} ---\n{}", i + 1, s.log());
            }
        }
    }
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let (sets, dels, unsure) = every_acknowledged_write_reads_back(&c.mqtt, &acked).await;
    eprintln!(
        "{sets} acknowledged SETs and {dels} DELs checked on every replica ({unsure} DELs unanswered); kills: {kills:?}"
    );
}

/// Reads every write `acked` holds from every replica in turn (on the
/// embedded brokers at `mqtt`): each acknowledged SET with its value and
/// version, each acknowledged DEL still deleted. Returns how many SETs,
/// DELs and unanswered DELs there were.
async fn every_acknowledged_write_reads_back(mqtt: &[u16], acked: &Acked) -> (usize, usize, usize) {
    reads_back_to("", mqtt, acked).await
}

/// [`every_acknowledged_write_reads_back`] to readers whose client ids
/// start with `prefix`.
async fn reads_back_to(prefix: &str, mqtt: &[u16], acked: &Acked) -> (usize, usize, usize) {
    assert!(
        acked.sets.len() >= 50,
        "writes went on through the kills: {} acknowledged",
        acked.sets.len()
    );
    assert!(!acked.deleted.is_empty(), "some DELs were acknowledged");
    // Every acknowledged write, read from every replica in turn.
    let readers = [
        sdk(mqtt[0], &format!("{prefix}check-0")).await,
        sdk(mqtt[1], &format!("{prefix}check-1")).await,
        sdk(mqtt[2], &format!("{prefix}check-2")).await,
    ];
    let mut sets: Vec<_> = acked.sets.iter().collect();
    sets.sort();
    for (i, (key, (value, version))) in sets.iter().enumerate() {
        let got = get_answered(&readers[i % 3], key).await;
        assert_eq!(
            got.response.as_ref(),
            Some(value),
            "acknowledged SET of {key} lost"
        );
        assert_eq!(
            got.version.map(|v| v.to_string()).as_ref(),
            Some(version),
            "{key}"
        );
    }
    for (i, key) in acked.deleted.iter().enumerate() {
        let got = get_answered(&readers[i % 3], key).await;
        assert_eq!(got.response, None, "acknowledged DEL of {key} undone");
    }
    for r in readers {
        r.close().await;
    }
    (acked.sets.len(), acked.deleted.len(), acked.unsure.len())
}

/// A GET of `key` through `reader`, sent again (at most twice more) if it
/// is not answered in time, as an SDK's user would: a read that reaches a
/// group while its leadership is handed over (a replica just restarted
/// taking back its place) can go unanswered. A wrong answer is never
/// retried: only the timeout is.
async fn get_answered(
    reader: &Sdk,
    key: &str,
) -> azure_iot_operations_services::state_store::Response<Option<Vec<u8>>> {
    let mut attempt = 0;
    loop {
        match reader.ss.get(key.as_bytes().to_vec(), T).await {
            Ok(got) => return got,
            Err(e) if attempt < 2 && format!("{e:?}").contains("kind: Timeout") => {
                eprintln!("GET {key} not answered in {T:?}; sent again");
                attempt += 1;
            }
            Err(e) => panic!("get {key}: {e:?}"),
        }
    }
}

/// Whether `observer` gets a notification for `key` within `wait`
/// (anything else it receives is skipped).
async fn notified(
    observer: &mut statestore_tests::broker::RawClient,
    key: &[u8],
    wait: Duration,
) -> bool {
    let topic = statestore_guest::notify::topic(&observer.id, key);
    let until = Instant::now() + wait;
    while let Some(p) = observer
        .recv(until.saturating_duration_since(Instant::now()))
        .await
    {
        if p.topic.as_ref() == topic.as_bytes() {
            return true;
        }
    }
    false
}

/// SETs `key` through `writer`.
async fn set(writer: &mut statestore_tests::broker::RawClient, key: &[u8]) {
    let reply = writer.call(&[b"SET", key, b"v"]).await;
    assert_eq!(&reply.payload[..], b"+OK\r\n");
}

/// SETs `key` through `writer` until `observer` is no longer notified of
/// it (what it registered was dropped), for at most 15 s (else `why`).
async fn set_until_unobserved(
    writer: &mut statestore_tests::broker::RawClient,
    observer: &mut statestore_tests::broker::RawClient,
    key: &[u8],
    why: &str,
) {
    let start = Instant::now();
    loop {
        set(writer, key).await;
        if !notified(observer, key, Duration::from_millis(700)).await {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{why}");
    }
}

/// Sends `kill -SIG` to `pid`.
fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// KEYNOTIFY registrations belong to the connection that made them, across
/// replicas (the guest's `via`):
/// - a client that moves from replica A to B keeps what it registered
///   through B when A reports its disconnect late (A was stopped: its
///   report reaches the log after the registration through B);
/// - what it registered through A goes with that report;
/// - a replica that restarts drops what its earlier life's clients
///   registered (their connections died with it), instead of leaving it
///   to be delivered to the client wherever it reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keynotify_registrations_follow_the_connection_that_made_them() {
    use statestore_tests::broker::RawClient;
    let mut c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    let id = "moving-observer";
    let filter = |client: &RawClient| {
        format!(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/#",
            client
                .id
                .bytes()
                .map(|b| format!("{b:02X}"))
                .collect::<String>()
        )
    };
    let mut writer = RawClient::connect(c.mqtt[b], "via-writer").await;
    writer.subscribe(&writer.response_topic()).await;

    // 1. Registered through A; A stops; the client moves to B and
    //    registers another key there; A comes back and reports the
    //    disconnect.
    let mut on_a = RawClient::connect(c.mqtt[a], id).await;
    on_a.subscribe(&on_a.response_topic()).await;
    let reply = on_a.call(&[b"KEYNOTIFY", b"via-a"]).await;
    assert_eq!(&reply.payload[..], b"+OK\r\n");
    let pid_a = c.servers[a].as_ref().expect("up").pid();
    signal(pid_a, "STOP");
    on_a.kill();
    let mut on_b = RawClient::connect(c.mqtt[b], id).await;
    on_b.subscribe(&on_b.response_topic()).await;
    on_b.subscribe(&filter(&on_b)).await;
    let reply = on_b.call(&[b"KEYNOTIFY", b"via-b"]).await;
    assert_eq!(&reply.payload[..], b"+OK\r\n");
    signal(pid_a, "CONT");
    // A's report drops what was registered through A (until then B
    // delivers its notifications to the client's session there)...
    set_until_unobserved(
        &mut writer,
        &mut on_b,
        b"via-a",
        "A's disconnect report never dropped the registration made through A",
    )
    .await;
    // ...and leaves what was registered through B.
    set(&mut writer, b"via-b").await;
    assert!(
        notified(&mut on_b, b"via-b", T).await,
        "a late disconnect from A dropped a registration made through B"
    );

    // 2. Registered through A; A dies; the client reconnects to B without
    //    registering: B delivers the orphan's notifications until A's new
    //    life drops it.
    on_b.kill();
    let mut on_a = RawClient::connect(c.mqtt[a], id).await;
    on_a.subscribe(&on_a.response_topic()).await;
    let reply = on_a.call(&[b"KEYNOTIFY", b"orphan"]).await;
    assert_eq!(&reply.payload[..], b"+OK\r\n");
    if let Some(s) = c.servers[a].take() {
        s.kill9();
    }
    on_a.kill();
    let mut on_b = RawClient::connect(c.mqtt[b], id).await;
    on_b.subscribe(&filter(&on_b)).await;
    set(&mut writer, b"orphan").await;
    assert!(
        notified(&mut on_b, b"orphan", T).await,
        "the registration outlives its replica until that replica starts again"
    );
    c.servers[a] = Some(c.spawn(a));
    c.settled(Duration::from_secs(30));
    set_until_unobserved(
        &mut writer,
        &mut on_b,
        b"orphan",
        "A's new life never dropped its earlier life's registrations",
    )
    .await;
    on_b.disconnect().await;
    writer.disconnect().await;
}

/// Tenants through external brokers: the `plant` tenant on one mosquitto
/// and the `lab` tenant on another (its `broker`). Each replica connects
/// once per tenant, sharing each tenant's request topic with the other
/// replicas;
/// each tenant's keys and notifications are its own; the SDK scenarios pass
/// for the `lab` tenant; a `shop` tenant added while running, on a third
/// mosquitto not started yet, is served by every replica's new connection
/// once that broker is there (the replicas serving the others meanwhile);
/// with a replica killed, the others answer all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_a_cluster_serve_through_an_external_broker() {
    let broker = statestore_tests::broker::Mosquitto::start();
    let lab_broker = statestore_tests::broker::Mosquitto::start();
    let lab_port = lab_broker.port;
    let config = format!(
        "[[tenant]]\nname = \"plant\"\nclient_id_prefixes = [\"plant-\"]\n\n[[tenant]]\nname = \"lab\"\ndefault = true\nbroker = \"mqtt://127.0.0.1:{lab_port}\"\n"
    );
    let mut c = Cluster::with_tenants_on(3, 1, &config, Some(broker.port));
    // Every replica subscribed for both tenants.
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in c.servers.iter().flatten() {
        while s.log().matches("subscribed; serving").count() < 2 {
            assert!(Instant::now() < deadline, "{}", s.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    c.leader(Duration::from_secs(20));
    let mut plant = RawClient::connect(broker.port, "plant-client").await;
    plant.subscribe(&plant.response_topic()).await;
    let mut lab = RawClient::connect(lab_port, "lab-client").await;
    lab.subscribe(&lab.response_topic()).await;
    let mut watcher = RawClient::connect(lab_port, "lab-watcher").await;
    watcher.subscribe(&watcher.response_topic()).await;
    // Through a broker, an observer subscribes to its notifications.
    let notify_topic = statestore_guest::notify::topic("lab-watcher", b"shared-key");
    watcher.subscribe(&notify_topic).await;
    let got = watcher.call(&[b"KEYNOTIFY", b"shared-key"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    let got = plant.call(&[b"SET", b"shared-key", b"plant's"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    let got = lab.call(&[b"SET", b"shared-key", b"lab's"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    assert!(notified(&mut watcher, b"shared-key", Duration::from_secs(5)).await);
    assert!(
        !notified(&mut watcher, b"shared-key", Duration::from_secs(1)).await,
        "the plant's change was not the lab's to see"
    );
    assert_eq!(
        text(&plant.call(&[b"GET", b"shared-key"]).await),
        "$7\r\nplant's\r\n"
    );
    assert_eq!(
        text(&lab.call(&[b"GET", b"shared-key"]).await),
        "$5\r\nlab's\r\n"
    );
    for (name, scenario) in sdk_scenarios() {
        eprintln!("{name}");
        tokio::time::timeout(Duration::from_secs(120), scenario(lab_port))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    let shop_port = statestore_tests::broker::free_port();
    std::fs::write(
        &c.args[1],
        format!("{config}\n[[tenant]]\nname = \"shop\"\nclient_id_prefixes = [\"shop-\"]\nbroker = \"mqtt://127.0.0.1:{shop_port}\"\n"),
    )
    .expect("config");
    let (ok, out) = cluster_command(&c.file(0), &["tenant", "add", "shop"]);
    assert!(ok && out.contains("served by replicas 1, 2, 3"), "{out}");
    // Its broker is not there yet: the replicas try again, and serve the
    // other tenants meanwhile.
    for s in c.servers.iter().flatten() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s
            .log()
            .contains("cannot connect the tenant to the broker yet")
        {
            assert!(Instant::now() < deadline, "{}", s.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        text(&lab.call(&[b"GET", b"shared-key"]).await),
        "$5\r\nlab's\r\n"
    );
    let _shop_broker = statestore_tests::broker::Mosquitto::start_on(shop_port);
    for s in c.servers.iter().flatten() {
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.log().matches("subscribed; serving").count() < 3 {
            assert!(Instant::now() < deadline, "{}", s.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut shop = RawClient::connect(shop_port, "shop-client").await;
    shop.subscribe(&shop.response_topic()).await;
    assert_eq!(text(&shop.call(&[b"GET", b"shared-key"]).await), "$-1\r\n");
    assert_eq!(
        text(&shop.call(&[b"SET", b"shared-key", b"shop's"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&shop.call(&[b"GET", b"shared-key"]).await),
        "$6\r\nshop's\r\n"
    );
    assert_eq!(
        text(&lab.call(&[b"GET", b"shared-key"]).await),
        "$5\r\nlab's\r\n"
    );
    c.servers[0].take().expect("running").kill9();
    for (client, key) in [
        (&mut plant, b"after-kill-p"),
        (&mut lab, b"after-kill-l"),
        (&mut shop, b"after-kill-s"),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let props = client.request_properties();
            let payload = statestore_tests::resp(&[b"SET", key, b"v"]);
            let got = client
                .call_within(payload, props, Duration::from_secs(5))
                .await;
            if got.as_ref().is_some_and(|g| text(g) == "+OK\r\n") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no answer after a replica died: {got:?}"
            );
        }
    }
    for client in [plant, lab, watcher, shop] {
        client.disconnect().await;
    }
}

/// External mode: three replicas serve through one mosquitto, sharing the
/// request topic (`$share/statestore/...`); the SDK talks to the broker.
/// An observer gets every change of a key, in order, whichever replica
/// took it (the leader publishes notifications). With one replica killed,
/// the others answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_request_topic_of_an_external_broker() {
    let broker = statestore_tests::broker::Mosquitto::start();
    let mut c = Cluster::with_broker(3, Some(broker.port));
    let leader = c.leader(Duration::from_secs(20));
    let a = sdk(broker.port, "ext-writer").await;
    let observer = sdk(broker.port, "ext-observer").await;
    let mut obs = observer
        .ss
        .observe(b"ext-watched".to_vec(), T)
        .await
        .expect("observe through a shared subscription")
        .response;
    let mut changes = Vec::new();
    for i in 0..20 {
        let value = format!("v{i}").into_bytes();
        let r =
            a.ss.set(
                b"ext-watched".to_vec(),
                value.clone(),
                T,
                None,
                SetOptions::default(),
            )
            .await
            .expect("set an observed key");
        changes.push((value, r.version.expect("a version").to_string()));
    }
    for (value, version) in &changes {
        let n = statestore_tests::scenarios::next(&mut obs).await;
        assert_eq!(n.operation, Operation::Set(value.clone()));
        assert_eq!(&n.version.to_string(), version);
    }
    observer.close().await;
    let mut versions = Vec::new();
    for i in 0..30 {
        let r =
            a.ss.set(
                format!("ext-{i}").into_bytes(),
                b"v".to_vec(),
                T,
                None,
                SetOptions::default(),
            )
            .await
            .expect("set through a shared subscription");
        versions.push(r.version.expect("a version").to_string());
    }
    // Every replica took a share of the requests.
    for (i, s) in c.servers.iter().enumerate() {
        let log = s.as_ref().expect("up").log();
        assert!(
            log.contains("$share/statestore/"),
            "replica {}: {log}",
            i + 1
        );
    }
    // A follower dies: the others go on. (Requests the broker had queued
    // for its session wait for it; the SDK's retry goes to another.)
    let victim = (leader + 1) % 3;
    if let Some(s) = c.servers[victim].take() {
        s.kill9();
    }
    let mut ok = 0;
    for i in 0..20 {
        if a.ss
            .set(
                format!("ext-after-{i}").into_bytes(),
                b"w".to_vec(),
                T,
                None,
                SetOptions::default(),
            )
            .await
            .is_ok()
        {
            ok += 1;
        }
    }
    eprintln!("{ok} of 20 writes answered with a replica down");
    assert!(ok >= 18, "{ok} of 20 writes answered with a replica down");
    for (i, version) in versions.iter().enumerate() {
        let got =
            a.ss.get(format!("ext-{i}").into_bytes(), T)
                .await
                .expect("get");
        assert_eq!(got.response, Some(b"v".to_vec()));
        assert_eq!(got.version.map(|v| v.to_string()).as_ref(), Some(version));
    }
    a.close().await;
}

/// External mode: a replica acknowledges (PUBACK) a request only once it
/// has answered it, so a broker that hands a dead subscriber's
/// unacknowledged messages to another member of the shared subscription
/// (EMQX does; mosquitto keeps them for a persistent session) loses none
/// that was not committed. Seen from the broker's own log: with the other
/// two replicas stopped nothing commits, and the replica that took a
/// request does not acknowledge it until the others are back and its reply
/// is out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_replica_acknowledges_a_request_once_it_has_answered_it() {
    use statestore_tests::broker::RawClient;
    let broker = statestore_tests::broker::Mosquitto::start_verbose();
    let c = Cluster::with_broker(3, Some(broker.port));
    let leader = c.leader(Duration::from_secs(20));
    let others = [(leader + 1) % 3, (leader + 2) % 3];
    let pid = |i: usize| c.servers[i].as_ref().expect("up").pid();
    for &o in &others {
        signal(pid(o), "STOP");
    }
    let mut client = RawClient::connect(broker.port, "ack-probe").await;
    client.subscribe(&client.response_topic()).await;
    let mut waiting = Vec::new();
    for i in 0..6 {
        let props = client.request_properties();
        waiting.push(props.correlation_data.clone());
        let key = format!("acked-{i}");
        client
            .publish_request(
                statestore_tests::resp(&[b"SET", key.as_bytes(), b"v"]),
                props,
            )
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let me = format!("statestore-{}", leader + 1);
    let count = |what: &str| {
        broker
            .log()
            .lines()
            .filter(|l| l.contains(&format!("{what} {me} ")))
            .count()
    };
    let requests = broker
        .log()
        .lines()
        .filter(|l| {
            l.contains(&format!("Sending PUBLISH to {me} ")) && l.contains("command/invoke'")
        })
        .count();
    assert!(
        requests >= 1,
        "the broker gave {me} no request:\n{}",
        broker.log()
    );
    let early = count("Received PUBACK from");
    for &o in &others {
        signal(pid(o), "CONT");
    }
    assert_eq!(
        early,
        0,
        "{me} acknowledged requests it could not commit:\n{}",
        broker.log()
    );
    let until = Instant::now() + Duration::from_secs(30);
    while !waiting.is_empty() {
        let p = client
            .recv(until.saturating_duration_since(Instant::now()))
            .await
            .unwrap_or_else(|| panic!("{} requests unanswered", waiting.len()));
        let corr = p
            .properties
            .as_ref()
            .and_then(|x| x.correlation_data.clone());
        waiting.retain(|w| *w != corr);
    }
    let until = Instant::now() + Duration::from_secs(5);
    while count("Received PUBACK from") < requests {
        assert!(
            Instant::now() < until,
            "{me} did not acknowledge its answered requests:\n{}",
            broker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.disconnect().await;
}

/// Runs `statestore cluster <args> --cluster FILE`: (exit success, stdout
/// and stderr).
fn cluster_command(file: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .arg("cluster")
        .args(args)
        .arg("--cluster")
        .arg(file)
        .output()
        .expect("statestore cluster");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A dead machine replaced while the cluster serves, the way an operator
/// does it: `cluster remove` the dead replica, start a new one (a new id,
/// an empty data directory, `join = true`) and `cluster add` it. It catches
/// up from the leader's snapshot: every key written before reads back
/// from it with its version, and writes through it work. Then the leader
/// is removed: it hands the leadership over first, and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_is_replaced_by_a_new_one_while_the_cluster_serves() {
    a_dead_replica_replaced(1).await;
}

/// The same with the store in 3 partitions: each change is made in every
/// partition's group, each through its own leader (`cluster add` and
/// `remove` return once every group has it), the new replica joins every
/// group from its leader's snapshot, and the removed leader hands over
/// every group it leads. The key observed through the dead replica is in
/// the partition the dead replica led: its registration still goes when
/// the removal applies before that group has a new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_of_a_store_in_partitions_is_replaced_while_it_serves() {
    a_dead_replica_replaced(3).await;
}

async fn a_dead_replica_replaced(partitions: u32) {
    let mut c = if partitions == 1 {
        Cluster::new(3)
    } else {
        Cluster::with_partitions(3, partitions)
    };
    if partitions == 3 {
        // Partition p led by replica p + 1.
        let spread = "partitions: 3 (the table shows partition 0); replica 1 leads 0; replica 2 leads 1; replica 3 leads 2";
        tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    }
    let leader = c.leader(Duration::from_secs(20));
    let dead = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    // A key of the partition the dead replica leads (partition `dead` when
    // there are 3).
    let observed = (0..20)
        .map(|i| format!("before-{i}"))
        .find(|k| partitions == 1 || partition_of(k.as_bytes(), partitions) as usize == dead)
        .expect("a key in every partition");
    let writer = sdk(c.mqtt[other], "membership-writer").await;
    let mut versions = Vec::new();
    for i in 0..20 {
        let set = writer
            .ss
            .set(
                format!("before-{i}").into_bytes(),
                format!("v{i}").into_bytes(),
                T,
                None,
                SetOptions::default(),
            )
            .await
            .expect("set");
        versions.push(set.version.expect("a version").to_string());
    }
    // A client of the replica that will die observes a key.
    let observer = observer_of(
        c.mqtt[dead],
        "membership-observer",
        observed.as_bytes(),
        c.metrics[leader],
    )
    .await;
    c.servers[dead].take().expect("running").kill9();
    observer.kill();
    // Remove the dead replica (through any replica's file).
    let (ok, out) = cluster_command(&c.file(other), &["remove", "--id", &(dead + 1).to_string()]);
    assert!(ok, "cluster remove:\n{out}");
    assert!(
        out.contains(&format!("replica {} removed", dead + 1)),
        "{out}"
    );
    // What its client registered through it goes with it.
    registrations_become(
        c.metrics[leader],
        0.0,
        "registrations through a removed replica",
    )
    .await;
    // Its successor: replica 4, new ports, an empty data directory, and a
    // certificate of the cluster's CA.
    let (ok, out) = cluster_command(&c.file(leader), &["certs", "--id", "4"]);
    assert!(ok, "cluster certs:\n{out}");
    assert!(
        out.contains("replica-4.pem")
            && !out.contains("replica-1.pem")
            && !out.contains("ca.pem\n"),
        "only replica 4's are new:\n{out}"
    );
    let settings = format!("join = true\npartitions = {partitions}\n");
    let (raft4, mqtt4) = c.start_new(&settings, &[leader, other], "");
    let (ok, out) = cluster_command(
        &c.file(leader),
        &[
            "add",
            "--id",
            "4",
            "--raft",
            &format!("127.0.0.1:{raft4}"),
            "--mqtt",
            &format!("127.0.0.1:{mqtt4}"),
        ],
    );
    assert!(ok, "cluster add:\n{out}");
    let mut members = [leader + 1, other + 1, 4];
    members.sort_unstable();
    let members = members
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    assert!(out.contains(&format!("members: {members}")), "{out}");
    // `cluster add` returned once every member had applied the addition,
    // replica 4 too (from the leader's snapshot): no member is left
    // counting the old membership, and replica 4 is not behind.
    assert!(
        out.contains("every member that answers has applied it"),
        "{out}"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["cluster", "status", "-o", "json", "--cluster"])
        .arg(c.file(leader))
        .output()
        .expect("cluster status");
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    let rows = json["replicas"].as_array().expect("replicas");
    for id in [leader + 1, other + 1, 4] {
        let row = rows
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("replica {id} in {json}"));
        assert_eq!(row["member"], true, "{json}");
        let lag = row["lag"].as_u64().unwrap_or_else(|| panic!("{json}"));
        assert!(lag <= 5, "replica {id} is {lag} entries behind: {json}");
    }
    // Replica 4 serves what was written before it existed, once it has
    // caught up (a GET through it waits for its read index).
    let reader = sdk(mqtt4, "membership-reader").await;
    for (i, version) in versions.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = reader.ss.get(format!("before-{i}").into_bytes(), T).await;
            if let Ok(got) = &got
                && got.response.is_some()
            {
                assert_eq!(got.response, Some(format!("v{i}").into_bytes()));
                assert_eq!(
                    got.version.as_ref().map(ToString::to_string).as_ref(),
                    Some(version)
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "before-{i} on replica 4: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    reader
        .ss
        .set(
            b"after".to_vec(),
            b"via-4".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("a write through the new replica");
    let got = writer.ss.get(b"after".to_vec(), T).await.expect("get");
    assert_eq!(got.response, Some(b"via-4".to_vec()));
    // It is a member of every partition's group, each with its own log.
    for p in (0..partitions).filter(|_| partitions > 1) {
        let state = c
            .dir
            .join("replica-4")
            .join(format!("partition-{p}"))
            .join("raft-state");
        assert!(state.is_file(), "{}", state.display());
    }
    // The status names the members: the removed replica is not one.
    let (ok, out) = cluster_command(&c.file(leader), &["status"]);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("members: {members}")), "{out}");
    // Removing the leader: it hands over, then leaves and stops.
    let (ok, out) = cluster_command(
        &c.file(other),
        &["remove", "--id", &(leader + 1).to_string()],
    );
    assert!(ok, "cluster remove (the leader):\n{out}");
    // The hand-over is progress, not an error.
    assert!(out.contains("the leadership moves to replica"), "{out}");
    assert!(!out.contains("error"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.servers[leader].as_mut().expect("running").exited() {
        assert!(Instant::now() < deadline, "the removed leader still runs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        c.servers[leader]
            .as_ref()
            .expect("kept")
            .log()
            .contains("was removed from the cluster"),
        "the removed replica says why it stopped"
    );
    c.servers[leader] = None;
    // Two members left, both up: writes go on (the first may meet the
    // election that follows the leader leaving).
    let mut set = None;
    for _ in 0..2 {
        set = writer
            .ss
            .set(
                b"after-2".to_vec(),
                b"v".to_vec(),
                T,
                None,
                SetOptions::default(),
            )
            .await
            .ok();
        if set.is_some() {
            break;
        }
    }
    let set = set.expect("a write once the two members have a leader");
    assert!(set.version.is_some());
    let got = reader
        .ss
        .get(b"after-2".to_vec(), T)
        .await
        .expect("get on replica 4");
    assert_eq!(got.response, Some(b"v".to_vec()));
    writer.close().await;
    reader.close().await;
}

/// A replica that has lost its majority holds its clients' requests for a
/// leader, within its bound (64 MiB): 80 requests of 1 MiB, sent to no
/// leader, all get the protocol's 503 "not applied, retry" (the oldest at
/// once, past the bound; the rest after 5 s without a leader), none is
/// lost without an answer, and the replica goes on serving once its peers
/// are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_a_majority_refuses_what_it_cannot_hold_with_a_503() {
    let mut c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    let lone = (leader + 1) % 3;
    let others: Vec<usize> = (0..3).filter(|i| *i != lone).collect();
    for &i in &others {
        c.servers[i].take().expect("running").kill9();
    }
    // Past an election timeout: it knows it has no leader, so what it takes
    // now is sent nowhere (a request forwarded to the dead leader would be
    // "outcome unknown", a 408).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut client = RawClient::connect(c.mqtt[lone], "held-requests").await;
    client.subscribe(&client.response_topic()).await;
    // A small one first: held, then refused.
    let reply = client.call(&[b"SET", b"small", b"v"]).await;
    assert_eq!(prop(&reply, "__stat"), Some("503"), "{}", text(&reply));
    let value = vec![b'x'; 1 << 20];
    let mut asked = std::collections::HashSet::new();
    for i in 0..80u32 {
        let props = client.request_properties();
        asked.insert(props.correlation_data.clone().expect("set").to_vec());
        client
            .publish_request(
                statestore_tests::resp(&[b"SET", format!("held-{i}").as_bytes(), &value]),
                props,
            )
            .await;
    }
    let mut statuses = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !asked.is_empty() {
        let Some((corr, p)) = next_answer(&mut client, deadline).await else {
            break;
        };
        if asked.remove(&corr) {
            *statuses
                .entry(prop(&p, "__stat").unwrap_or("none").to_string())
                .or_insert(0) += 1;
        }
    }
    assert!(
        asked.is_empty(),
        "{} requests never answered; answered: {statuses:?}",
        asked.len()
    );
    assert_eq!(statuses.get("503"), Some(&80), "{statuses:?}");
    let log = c.servers[lone].as_ref().expect("running").log();
    assert!(
        log.contains("requests waiting for a leader past"),
        "the bound was reached and said so"
    );
    // `cluster status` says a majority is missing, with the members as the
    // replica that answered last knew them; and the same as JSON.
    let (ok, said) = c.status();
    assert!(!ok, "{said}");
    assert!(
        said.contains("a majority is missing: 1 of 3 members answer and 2 are needed"),
        "{said}"
    );
    assert!(
        said.contains(&format!("(last known, from replica {}", lone + 1)),
        "{said}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["cluster", "status", "-o", "json", "--cluster"])
        .arg(c.dir.join("direct.toml"))
        .output()
        .expect("cluster status");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["healthy"], false, "{json}");
    assert_eq!(json["members_up"], 1, "{json}");
    assert_eq!(json["majority"], 2, "{json}");
    assert_eq!(json["members"], serde_json::json!([1, 2, 3]), "{json}");
    // A client command sent now gets 503s and tries again until the
    // cluster has a leader (within its --timeout): it succeeds once the
    // peers are back.
    let cli = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["set", "from-the-cli", "v", "--timeout", "60s", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{}", c.mqtt[lone]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("statestore set");
    tokio::time::sleep(Duration::from_secs(7)).await;
    // Its peers back: it serves again.
    for &i in &others {
        let s = c.spawn(i);
        c.servers[i] = Some(s);
    }
    c.leader(Duration::from_secs(20));
    let out = cli.wait_with_output().expect("set ends");
    assert!(out.status.success(), "{out:?}");
    let reply = client.call(&[b"SET", b"after", b"v"]).await;
    assert_eq!(prop(&reply, "__stat"), Some("200"), "{}", text(&reply));
    client.disconnect().await;
}

/// The next answer `client` gets before `deadline`, and its correlation
/// data.
async fn next_answer(
    client: &mut RawClient,
    deadline: Instant,
) -> Option<(Vec<u8>, rumqttc::v5::mqttbytes::v5::Publish)> {
    while Instant::now() < deadline {
        let Some(p) = client.recv(Duration::from_secs(1)).await else {
            continue;
        };
        let corr = p
            .properties
            .as_ref()
            .and_then(|x| x.correlation_data.clone())
            .expect("correlation data")
            .to_vec();
        return Some((corr, p));
    }
    None
}

/// Every message on `client` with correlation data `corr` that comes
/// within `wait`.
async fn answers_to(
    client: &mut RawClient,
    corr: &[u8],
    wait: Duration,
) -> Vec<rumqttc::v5::mqttbytes::v5::Publish> {
    let deadline = Instant::now() + wait;
    let mut found = Vec::new();
    while let Some(p) = client
        .recv(deadline.saturating_duration_since(Instant::now()))
        .await
    {
        if p.properties
            .as_ref()
            .and_then(|x| x.correlation_data.as_deref())
            == Some(corr)
        {
            found.push(p);
        }
    }
    found
}

/// Nothing reaches the leader any more, but it still sends (a one-way
/// cut): a `SET lock mine NX` it took reaches the followers, which elect a
/// new leader and apply it. The old leader, hearing no leader, cannot know
/// that: its client gets a 408 "outcome unknown" (the SDKs' timeout), not
/// a 503 "not applied, retry", which would be a lie (the lock is taken,
/// and a retry would find it held by "someone else"); and once the cut
/// heals and the old leader applies the entry, no second answer follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_outcome_a_one_way_cut_hides_is_answered_408_once() {
    let c = Cluster::with_links(3).await;
    let leader = c.leader(Duration::from_secs(20));
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let mut client = RawClient::connect(c.mqtt[leader], "one-way-cut").await;
    client.subscribe(&client.response_topic()).await;
    let warm = client.call(&[b"SET", b"warm", b"v"]).await;
    assert_eq!(prop(&warm, "__stat"), Some("200"), "{}", text(&warm));
    for &j in &others {
        c.cut(j, leader);
    }
    let mut props = client.request_properties();
    props.message_expiry_interval = Some(60);
    let corr = props.correlation_data.clone().expect("set").to_vec();
    let request = statestore_tests::resp(&[b"SET", b"lock", b"mine", b"NX"]);
    client.publish_request(request.clone(), props.clone()).await;
    let first = answers_to(&mut client, &corr, Duration::from_secs(20)).await;
    assert_eq!(first.len(), 1, "one answer while cut off: {first:?}");
    let answer = &first[0];
    assert_eq!(prop(answer, "__stat"), Some("408"), "{answer:?}");
    assert_eq!(prop(answer, "__propName"), Some("ExecutionTimeout"));
    assert_eq!(prop(answer, "__propVal"), Some("PT5S"));
    assert!(answer.payload.is_empty());
    // It was applied: the new leader committed it.
    let mut reader = RawClient::connect(c.mqtt[others[0]], "one-way-reader").await;
    reader.subscribe(&reader.response_topic()).await;
    let got = reader.call(&[b"GET", b"lock"]).await;
    assert_eq!(text(&got), "$4\r\nmine\r\n", "{got:?}");
    // Healed: the old leader catches up and applies it too, and says
    // nothing more about it.
    c.heal();
    c.settled(Duration::from_secs(30));
    let later = answers_to(&mut client, &corr, Duration::from_secs(3)).await;
    assert!(later.is_empty(), "a second answer: {later:?}");
    let got = client.call(&[b"GET", b"lock"]).await;
    assert_eq!(text(&got), "$4\r\nmine\r\n", "{got:?}");
    // Asking again with the same correlation data gets the outcome (the
    // replicated dedup cache's first reply).
    client.publish_request(request, props).await;
    let again = answers_to(&mut client, &corr, Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(prop(&again[0], "__stat"), Some("200"), "{:?}", again[0]);
    assert_eq!(text(&again[0]), "+OK\r\n");
    client.disconnect().await;
    reader.disconnect().await;
}

/// A raft address beyond loopback is refused without the cluster's TLS
/// (the links would be plain TCP, and their hello would carry the secret
/// in clear), as a plain MQTT listener beyond loopback is; with it the
/// replica starts.
#[test]
fn a_raft_address_beyond_loopback_needs_the_clusters_tls() {
    let dir = std::env::temp_dir().join(format!("statestore-raft-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("secret"), "a-test-secret-of-enough-bytes\n").expect("secret");
    let file = dir.join("replica-1.toml");
    let replicas = format!(
        "\n[[replica]]\nid = 1\nraft = \"0.0.0.0:{}\"\nmqtt = \"127.0.0.1:{}\"\n",
        free_port(),
        free_port()
    );
    let plain = format!("id = 1\ndata_dir = \"replica-1\"\nsecret_file = \"secret\"\n{replicas}");
    std::fs::write(&file, &plain).expect("file");
    // What `serve` says when it refuses to start.
    let refused = || {
        let out = serve_cluster().arg(&file).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{err}");
        err
    };
    let err = refused();
    assert!(
        err.contains("refusing to listen for replicas on 0.0.0.0")
            && err.contains("statestore cluster certs")
            && err.contains("--allow-insecure"),
        "{err}"
    );
    // With `tls_dir` but no certificates yet: told how to make them.
    std::fs::write(
        &file,
        plain.replace("secret\"\n", "secret\"\ntls_dir = \"tls\"\n"),
    )
    .expect("file");
    let err = refused();
    assert!(
        err.contains("tls/ca.pem") && err.contains("statestore cluster certs"),
        "{err}"
    );
    let (ok, said) = cluster_command(&file, &["certs"]);
    assert!(ok, "{said}");
    let server = Server::spawn_until(
        {
            let mut cmd = serve_cluster();
            cmd.arg(&file).env("RUST_LOG", "info");
            cmd
        },
        "replica started",
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of a GET reply (`None`: no key).
fn bulk(payload: &[u8]) -> Option<Vec<u8>> {
    let rest = payload.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\r')?;
    let len: usize = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    rest.get(nl + 2..nl + 2 + len).map(<[u8]>::to_vec)
}

/// What one client saw: each key's operations, and the answers it got.
#[derive(Default)]
struct Seen {
    /// Per key: every operation, with its invocation and answer times (µs).
    histories: Vec<Vec<statestore::cluster::linear::Event>>,
    /// (status, payload) of each answered correlation.
    answers: HashMap<Vec<u8>, (String, Vec<u8>)>,
    ok: usize,
    unavailable: usize,
    unknown: usize,
}

/// Client `name` on `port`: SETs, GETs and DELs of `keys` keys until
/// `until`, each waiting up to 12 s for its answer, recorded in `seen`.
async fn history_client(
    port: u16,
    name: String,
    keys: usize,
    start: Instant,
    until: Instant,
    seen: Arc<Mutex<Seen>>,
) {
    use statestore::cluster::linear::{Event, Op};
    let mut client = RawClient::connect(port, &name).await;
    client.subscribe(&client.response_topic()).await;
    let mut rng = name.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| {
        h.rotate_left(5) ^ u64::from(b)
    });
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut n = 0u64;
    let us = |start: Instant| start.elapsed().as_micros() as u64;
    while Instant::now() < until {
        let k = (next() % keys as u64) as usize;
        let key = format!("hot-{k}");
        n += 1;
        let (op, payload) = match next() % 5 {
            0 | 1 => {
                let v = format!("{name}-{n}").into_bytes();
                (
                    Op::Set(v.clone()),
                    statestore_tests::resp(&[b"SET", key.as_bytes(), &v]),
                )
            }
            2 | 3 => (
                Op::Get(None),
                statestore_tests::resp(&[b"GET", key.as_bytes()]),
            ),
            _ => (
                Op::Del(None),
                statestore_tests::resp(&[b"DEL", key.as_bytes()]),
            ),
        };
        let props = client.request_properties();
        let corr = props.correlation_data.clone().expect("set").to_vec();
        let call = us(start);
        client.publish_request(payload, props).await;
        let deadline = Instant::now() + Duration::from_secs(12);
        let mut answer = None;
        while let Some(p) = client
            .recv(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            let c = p
                .properties
                .as_ref()
                .and_then(|x| x.correlation_data.clone())
                .map(|c| c.to_vec())
                .unwrap_or_default();
            let got = (
                prop(&p, "__stat").unwrap_or("").to_string(),
                p.payload.to_vec(),
            );
            let mut seen = seen.lock().expect("seen");
            if let Some(first) = seen.answers.get(&c) {
                assert_eq!(*first, got, "request {c:?} answered twice differently");
                continue;
            }
            seen.answers.insert(c.clone(), got.clone());
            if c == corr {
                answer = Some(got);
                break;
            }
        }
        let ret = us(start);
        let mut seen = seen.lock().expect("seen");
        if seen.histories.len() < keys {
            seen.histories.resize(keys, Vec::new());
        }
        let event = match answer {
            Some((status, payload)) if status == "200" => {
                seen.ok += 1;
                let op = match op {
                    Op::Set(v) => {
                        assert_eq!(payload, b"+OK\r\n", "SET {key}");
                        Op::Set(v)
                    }
                    Op::Get(_) => Op::Get(bulk(&payload)),
                    Op::Del(_) => Op::Del(Some(match &payload[..] {
                        b":1\r\n" => true,
                        b":0\r\n" => false,
                        other => panic!("DEL {key}: {:?}", String::from_utf8_lossy(other)),
                    })),
                };
                Some(Event {
                    op,
                    call,
                    ret: Some(ret),
                })
            }
            // Never sent to a leader: never applied.
            Some((status, _)) if status == "503" => {
                seen.unavailable += 1;
                None
            }
            // Outcome unknown (408, or no answer): it may take effect at
            // any time after its call, or never.
            Some((status, _)) if status == "408" => {
                seen.unknown += 1;
                Some(Event {
                    op,
                    call,
                    ret: None,
                })
            }
            None => {
                seen.unknown += 1;
                Some(Event {
                    op,
                    call,
                    ret: None,
                })
            }
            Some((status, payload)) => panic!("{status} {:?}", String::from_utf8_lossy(&payload)),
        };
        if let Some(e) = event {
            seen.histories[k].push(e);
        }
    }
    client.disconnect().await;
}

/// Clients on all three replicas SET, GET and DEL three keys while the
/// links between the replicas are cut and healed again and again (a
/// replica cut off both ways, every link into the leader cut while it
/// still sends, one link one way): every key's history is linearizable
/// (200 answers with what they returned; 408s and unanswered requests as
/// unknown, which may have taken effect; 503s as never applied), and no
/// request is answered twice differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_stay_linearizable_while_links_are_cut_and_healed() {
    const KEYS: usize = 3;
    let c = Cluster::with_links(3).await;
    c.leader(Duration::from_secs(20));
    let start = Instant::now();
    let until = start + Duration::from_secs(35);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clients: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(history_client(
                c.mqtt[i],
                format!("history-{i}"),
                KEYS,
                start,
                until,
                seen.clone(),
            ))
        })
        .collect();
    let clients = async {
        for h in clients {
            h.await.expect("a client failed");
        }
    };
    let chaos = async {
        let mut cuts = 0;
        let mut round = 0u64;
        while Instant::now() < until {
            c.heal();
            tokio::time::sleep(Duration::from_millis(800)).await;
            round += 1;
            let leader = tokio::task::block_in_place(|| c.leader(Duration::from_secs(20)));
            match round % 4 {
                0 => {
                    // A replica cut off both ways.
                    let lone = (round as usize / 4) % 3;
                    for j in (0..3).filter(|j| *j != lone) {
                        c.cut(lone, j);
                        c.cut(j, lone);
                    }
                }
                1 => {
                    // Nothing reaches the leader; it still sends.
                    for j in (0..3).filter(|j| *j != leader) {
                        c.cut(j, leader);
                    }
                }
                2 => c.cut(leader, (leader + 1) % 3),
                _ => {
                    // The leader cut off both ways.
                    for j in (0..3).filter(|j| *j != leader) {
                        c.cut(leader, j);
                        c.cut(j, leader);
                    }
                }
            }
            cuts += 1;
            // Most cuts are over before a request waits out its 5 s for
            // a leader; every third one is not.
            let ms = if round.is_multiple_of(3) {
                8_000
            } else {
                2_500
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        c.heal();
        cuts
    };
    let ((), cuts) = tokio::join!(clients, chaos);
    c.settled(Duration::from_secs(30));
    let seen = seen.lock().expect("seen");
    eprintln!(
        "{cuts} cuts; {} answered 200, {} 503, {} unknown",
        seen.ok, seen.unavailable, seen.unknown
    );
    assert!(
        cuts >= 5 && seen.ok > 50 && seen.unavailable + seen.unknown > 0,
        "the run did what it is for: requests answered, and some cut off from a leader"
    );
    for (k, history) in seen.histories.iter().enumerate() {
        // A GET with no answer said nothing and changed nothing.
        let history: Vec<_> = history
            .iter()
            .filter(|e| e.ret.is_some() || !matches!(e.op, statestore::cluster::linear::Op::Get(_)))
            .cloned()
            .collect();
        let verdict = statestore::cluster::linear::check(&history, 50_000_000);
        assert_ne!(
            verdict,
            statestore::cluster::linear::Verdict::Not,
            "hot-{k} is not linearizable ({} operations):\n{history:?}",
            history.len()
        );
    }
}

/// The current Raft log file in a replica's data directory.
fn current_log(data: &Path) -> PathBuf {
    let g = std::fs::read_to_string(data.join("raft-log.current")).expect("raft-log.current");
    data.join(format!("raft-log.{}", g.trim()))
}

/// Where each record of a Raft log file ends (`u32 len | u32 crc | len
/// bytes`), up to the zeros the file is filled with ahead of its records.
fn record_ends(data: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut p = 0;
    while p + 8 <= data.len() {
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
        if len == 0 {
            break;
        }
        p += 8 + len;
        ends.push(p);
    }
    ends
}

fn copy_files(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).expect("dir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        let kind = e.file_type().expect("type");
        if kind.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        } else if kind.is_dir() {
            copy_files(&e.path(), &to.join(e.file_name())); // a partition's
        }
    }
}

/// A way to damage a data directory, what it is, and what the refusal to
/// start must say.
type Damage = (&'static str, fn(&Path), &'static str);

/// 20 SETs acknowledged by replica 0 (the only one), which is then
/// killed: a copy of its data directory as it was left.
async fn twenty_acknowledged_then_killed(c: &mut Cluster, client_id: &str) -> PathBuf {
    c.leader(Duration::from_secs(20));
    let mut client = RawClient::connect(c.mqtt[0], client_id).await;
    client.subscribe(&client.response_topic()).await;
    for i in 0..20 {
        let reply = client
            .call(&[b"SET", format!("key-{i}").as_bytes(), b"v"])
            .await;
        assert_eq!(text(&reply), "+OK\r\n", "{reply:?}");
    }
    client.kill();
    c.servers[0].take().expect("running").kill9();
    let pristine = c.dir.join("pristine");
    copy_files(&c.data_dir(0), &pristine);
    pristine
}

/// Each of `cases` done to a copy of `pristine`: replica 0 refuses to
/// start, saying what is missing and how to recover.
fn each_refused(c: &Cluster, pristine: &Path, cases: &[Damage]) {
    for (what, damage, says) in cases {
        copy_files(pristine, &c.data_dir(0));
        damage(&c.data_dir(0));
        let log = c.start_refused(0);
        assert!(
            log.contains(says)
                && log.contains("refusing to start")
                && log.contains("cluster rejoin"),
            "{what}:\n{log}"
        );
    }
}

/// Replica 0 serves the 20 keys of [`twenty_acknowledged_then_killed`].
async fn twenty_read_back(c: &Cluster, client_id: &str) {
    let mut client = RawClient::connect(c.mqtt[0], client_id).await;
    client.subscribe(&client.response_topic()).await;
    for i in 0..20 {
        let got = client.call(&[b"GET", format!("key-{i}").as_bytes()]).await;
        assert_eq!(text(&got), "$1\r\nv\r\n", "key-{i}");
    }
    client.disconnect().await;
}

/// A one-replica cluster acknowledges 20 SETs (`--fsync always`) and is
/// killed. Its log deleted, emptied, cut at a record boundary or inside a
/// record, or `raft-log.current` naming a generation that is not there:
/// each time it refuses to start, saying what is missing and how to
/// recover (it started with 0, 0, 15, 16 and 0 of the 20 keys, without a
/// word or with a false "torn tail"). Intact, it starts with all 20 (and
/// says that a `join = true` left in its file is ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_lost_acknowledged_writes_refuses_to_start() {
    let mut c = Cluster::new(1);
    let pristine = twenty_acknowledged_then_killed(&mut c, "twenty").await;
    let data = c.data_dir(0);
    let cases: [Damage; 5] = [
        (
            "deleted",
            |d| std::fs::remove_file(current_log(d)).expect("rm"),
            "is missing",
        ),
        (
            "emptied",
            |d| std::fs::write(current_log(d), b"").expect("empty"),
            "holds no entries",
        ),
        (
            "cut at a record boundary",
            |d| {
                let p = current_log(d);
                let bytes = std::fs::read(&p).expect("read");
                let ends = record_ends(&bytes);
                std::fs::write(&p, &bytes[..ends[ends.len() * 3 / 4]]).expect("cut");
            },
            "was cut short",
        ),
        (
            "cut inside a record",
            |d| {
                let p = current_log(d);
                let bytes = std::fs::read(&p).expect("read");
                let ends = record_ends(&bytes);
                std::fs::write(&p, &bytes[..ends[ends.len() * 3 / 4] + 5]).expect("cut");
            },
            "cut inside a record",
        ),
        (
            "a missing generation",
            |d| std::fs::write(d.join("raft-log.current"), b"9999").expect("current"),
            "raft-log.9999 is missing",
        ),
    ];
    each_refused(&c, &pristine, &cases);
    // Rejoining needs others to rejoin from.
    let (ok, out) = cluster_command(&c.file(0), &["rejoin"]);
    assert!(
        !ok && out.contains("a cluster of one cannot rejoin"),
        "{out}"
    );
    copy_files(&pristine, &data);
    // A founding replica's file that says `join = true` by mistake: it
    // starts from its log all the same, and says what to fix.
    let text_of_file = std::fs::read_to_string(c.file(0)).expect("file");
    std::fs::write(c.file(0), format!("join = true\n{text_of_file}")).expect("file");
    c.servers[0] = Some(c.spawn(0));
    c.leader(Duration::from_secs(20));
    let log = c.servers[0].as_ref().expect("running").log();
    assert!(log.contains("`join = true` is ignored"), "{log}");
    twenty_read_back(&c, "twenty-back").await;
}

/// A one-replica cluster whose store is in 2 partitions (so its rounds go
/// through its round journal) acknowledges 20 SETs and is killed. The
/// journal deleted or damaged before its last record, or a partition's log
/// emptied (short of what `raft-state` says was synced): each time it
/// refuses to start and says what is missing. A partition's log cut past
/// what was synced is read from the journal: it starts with all 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_partitions_refuses_a_lost_journal_and_reads_past_a_cut_log() {
    let mut c = Cluster::with_partitions(1, 2);
    let pristine = twenty_acknowledged_then_killed(&mut c, "journaled").await;
    let data = c.data_dir(0);
    let cases: [Damage; 3] = [
        (
            "journal deleted",
            |d| std::fs::remove_file(d.join("raft-journal")).expect("rm"),
            "raft-journal is missing",
        ),
        (
            "a byte of the journal flipped, good records after it",
            |d| {
                let p = d.join("raft-journal");
                let mut bytes = std::fs::read(&p).expect("read");
                let first = record_ends(&bytes)[0];
                bytes[first / 2] ^= 0x20;
                std::fs::write(&p, &bytes).expect("flip");
            },
            "damaged",
        ),
        (
            "a partition's log emptied",
            |d| std::fs::write(current_log(&d.join("partition-0")), b"").expect("empty"),
            "was cut short",
        ),
    ];
    each_refused(&c, &pristine, &cases);
    // Cut past what was synced: the journal has the rest.
    copy_files(&pristine, &data);
    for p in 0..2 {
        let log = current_log(&data.join(format!("partition-{p}")));
        let bytes = std::fs::read(&log).expect("read");
        let ends = record_ends(&bytes);
        std::fs::write(&log, &bytes[..ends[ends.len() / 2]]).expect("cut");
    }
    c.servers[0] = Some(c.spawn(0));
    c.leader(Duration::from_secs(20));
    twenty_read_back(&c, "journaled-back").await;
}

/// A follower whose log file was deleted refuses to start; `statestore
/// cluster rejoin` (the others serving) keeps its term and vote, moves
/// what is left aside and has the leader remove it and add it back; started
/// again, it catches up and serves every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_lost_its_log_rejoins_and_catches_up() {
    a_follower_that_lost_a_log_rejoins(1).await;
}

/// The same for a store in 2 partitions: one partition's log deleted,
/// `cluster rejoin` sets every group's log aside (each keeping the newest
/// term and vote of its files and the round journal) and the journal too,
/// and the replica is removed from and added back to every group. Then a
/// partition's directory lost whole is refused, not started as a new
/// member's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_partitions_that_lost_a_log_rejoins_and_catches_up() {
    a_follower_that_lost_a_log_rejoins(2).await;
}

async fn a_follower_that_lost_a_log_rejoins(partitions: u32) {
    let mut c = if partitions == 1 {
        Cluster::new(3)
    } else {
        Cluster::with_partitions(3, partitions)
    };
    let leader = c.leader(Duration::from_secs(20));
    let f = (leader + 1) % 3;
    let mut writer = RawClient::connect(c.mqtt[leader], "before-loss").await;
    writer.subscribe(&writer.response_topic()).await;
    for i in 0..20 {
        let reply = writer
            .call(&[b"SET", format!("key-{i}").as_bytes(), b"v"])
            .await;
        assert_eq!(text(&reply), "+OK\r\n", "{reply:?}");
    }
    c.settled(Duration::from_secs(30));
    c.servers[f].take().expect("running").kill9();
    let dirs: Vec<PathBuf> = if partitions == 1 {
        vec![c.data_dir(f)]
    } else {
        (0..partitions)
            .map(|p| c.data_dir(f).join(format!("partition-{p}")))
            .collect()
    };
    std::fs::remove_file(current_log(&dirs[0])).expect("rm");
    let log = c.start_refused(f);
    assert!(
        log.contains("is missing") && log.contains("cluster rejoin"),
        "{log}"
    );
    let (ok, out) = cluster_command(&c.file(f), &["rejoin"]);
    assert!(ok, "{out}");
    assert!(out.contains("kept") && out.contains("rejoins"), "{out}");
    // It returned once the members that answer (not the stopped replica)
    // had applied its re-addition, not only the leader.
    assert!(
        out.contains(&format!("replica {} does not answer yet", f + 1)),
        "{out}"
    );
    let discarded = |dir: &Path| {
        std::fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("discarded-"))
            .count()
    };
    for dir in &dirs {
        assert!(
            discarded(dir) > 0,
            "moved aside, not deleted: {}",
            dir.display()
        );
    }
    if partitions > 1 {
        assert!(out.contains("the round journal moved aside"), "{out}");
        assert!(!c.data_dir(f).join("raft-journal").exists());
    }
    // Written while it was away, too.
    let reply = writer.call(&[b"SET", b"while-away", b"v"]).await;
    assert_eq!(text(&reply), "+OK\r\n");
    c.servers[f] = Some(c.spawn(f));
    c.settled(Duration::from_secs(30));
    let mut reader = RawClient::connect(c.mqtt[f], "after-rejoin").await;
    reader.subscribe(&reader.response_topic()).await;
    for key in (0..20)
        .map(|i| format!("key-{i}"))
        .chain(["while-away".to_string()])
    {
        let got = reader.call(&[b"GET", key.as_bytes()]).await;
        assert_eq!(text(&got), "$1\r\nv\r\n", "{key}");
    }
    writer.disconnect().await;
    reader.disconnect().await;
    if partitions > 1 {
        c.servers[f].take().expect("running").kill9();
        std::fs::remove_dir_all(&dirs[1]).expect("rm -r");
        let log = c.start_refused(f);
        assert!(log.contains("hold(s) no Raft log"), "{log}");
    }
}

/// The SDK scenarios one process passes (`statestore_tests::scenarios`:
/// conditions, versions, fencing, notifications, leased locks, MiB values,
/// the CLI, SCAN through `list_keys`), each against a cluster of its own,
/// its clients on a follower (they forward to the leader and read with a
/// read index).
macro_rules! on_a_follower {
    ($($name:ident),* $(,)?) => {
        mod sdk_on_a_follower {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let c = super::Cluster::new(3);
                    let leader = c.leader(std::time::Duration::from_secs(20));
                    statestore_tests::scenarios::$name(c.mqtt[(leader + 1) % 3]).await;
                }
            )*
        }
    };
}

statestore_tests::sdk_scenarios!(on_a_follower);

/// A client's disconnect that its replica reported to a leader which then
/// died (stopped here, so the report sits unread in its socket) is
/// reported again to the next leader: the registrations it made through
/// that replica go (`statestore_keynotify_registrations` back to 0), not
/// only when the replica restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_reported_to_a_leader_that_dies_reaches_the_next_one() {
    let mut c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    let follower = (leader + 1) % 3;
    let observer = observer_of(c.mqtt[follower], "gone-observer", b"k", c.metrics[follower]).await;
    // The leader stops; the observer leaves at once, before its replica
    // notices: the report goes to the stopped leader.
    let pid = c.servers[leader].as_ref().expect("running").pid();
    signal(pid, "STOP");
    observer.disconnect().await;
    // A new leader among the other two, then the report again.
    registrations_become(
        c.metrics[follower],
        0.0,
        "the registration of a client gone stays",
    )
    .await;
    c.servers[leader].take().expect("stopped").kill9();
}

/// A replica removed while it was down, started again, learns from the
/// leader that it is no member and stops, saying so: the others send it
/// nothing, so its own log never tells it, and it would otherwise wait as a
/// candidate for ever while its clients get 503s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_removed_while_down_stops_when_it_comes_back() {
    let mut c = Cluster::new(3);
    let leader = c.leader(Duration::from_secs(20));
    let gone = (leader + 1) % 3;
    c.servers[gone].take().expect("running").kill9();
    let (ok, out) = cluster_command(
        &c.file(leader),
        &["remove", "--id", &(gone + 1).to_string()],
    );
    assert!(ok, "cluster remove:\n{out}");
    let mut back = c.spawn(gone);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !back.exited() {
        assert!(
            Instant::now() < deadline,
            "the removed replica still runs:\n{}",
            back.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = back.log();
    assert!(
        log.contains(&format!(
            "replica {} is not a member of the cluster",
            gone + 1
        )),
        "{log}"
    );
    // The two members go on.
    let (ok, text) = c.status();
    assert!(ok, "the two members after the removed one stopped:\n{text}");
}

/// A request that makes the guest fail (a trap, a loop its fuel stops,
/// memory past its cap) is a poison entry once committed: every replica
/// makes its guest again from its snapshot and log, skips that request and
/// goes on alike, where one failure used to stop them all. Its client gets
/// 500; the requests sent with it get their answers; a replica restarted
/// afterwards applies the log again the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fails_the_guest_is_answered_500_and_the_cluster_goes_on() {
    let mut c = Cluster::with_args(
        3,
        &[
            "--component",
            statestore_tests::FAULTY_WASM,
            "--memory-mib",
            "64",
            "--call-ms",
            "200",
        ],
    );
    let leader = c.leader(Duration::from_secs(20));
    let follower = (leader + 1) % 3;
    let mut client = RawClient::connect(c.mqtt[follower], "poison").await;
    client.subscribe(&client.response_topic()).await;
    let build = client.call(&[b"GET", b"__fault/build"]).await;
    assert_eq!(
        text(&build),
        "$15\r\nfault-injection\r\n",
        "the faulty build"
    );
    for fault in ["trap", "loop", "grow"] {
        // The fault between two innocent requests, sent together (one
        // batch, one log entry, as far as the replica's batching goes).
        let requests: Vec<Vec<u8>> = vec![
            statestore_tests::resp(&[b"SET", format!("before-{fault}").as_bytes(), b"1"]),
            statestore_tests::resp(&[b"SET", format!("__fault/{fault}").as_bytes(), b"v"]),
            statestore_tests::resp(&[b"SET", format!("after-{fault}").as_bytes(), b"1"]),
        ];
        let mut asked = Vec::new();
        for r in requests {
            let props = client.request_properties();
            asked.push(props.correlation_data.clone().expect("set").to_vec());
            client.publish_request(r, props).await;
        }
        let mut got: HashMap<Vec<u8>, (String, String)> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < asked.len() {
            let Some((corr, p)) = next_answer(&mut client, deadline).await else {
                break;
            };
            let stat = prop(&p, "__stat").unwrap_or("none").to_string();
            assert!(
                got.insert(corr, (stat, text(&p))).is_none(),
                "{fault}: one answer per request"
            );
        }
        let answer = |i: usize| got.get(&asked[i]).cloned().unwrap_or_default();
        assert_eq!(
            answer(0),
            ("200".into(), "+OK\r\n".into()),
            "{fault}: before"
        );
        assert_eq!(answer(1).0, "500", "{fault}: the fault {:?}", answer(1));
        assert_eq!(
            answer(2),
            ("200".into(), "+OK\r\n".into()),
            "{fault}: after"
        );
    }
    // Every replica went on, alike: each serves every innocent key.
    let check = |port: u16, who: String| async move {
        let mut reader = RawClient::connect(port, &who).await;
        reader.subscribe(&reader.response_topic()).await;
        for fault in ["trap", "loop", "grow"] {
            for key in [format!("before-{fault}"), format!("after-{fault}")] {
                let got = reader.call(&[b"GET", key.as_bytes()]).await;
                assert_eq!(text(&got), "$1\r\n1\r\n", "{who}: {key}");
            }
            let got = reader
                .call(&[b"GET", format!("__fault/{fault}").as_bytes()])
                .await;
            assert_eq!(
                text(&got),
                "$-1\r\n",
                "{who}: the fault's key was never set"
            );
        }
        reader.disconnect().await;
    };
    for i in 0..3 {
        check(c.mqtt[i], format!("poison-reader-{i}")).await;
    }
    for i in 0..3 {
        let log = c.servers[i].as_ref().expect("running").log();
        assert!(
            log.contains("the guest failed applying a log entry"),
            "replica {}: {log}",
            i + 1
        );
    }
    // A replica started again applies its log again, poison entries
    // skipped alike, and serves.
    c.servers[follower].take().expect("running").kill9();
    c.servers[follower] = Some(c.spawn(follower));
    c.settled(Duration::from_secs(60));
    check(c.mqtt[follower], "poison-reader-again".into()).await;
    client.disconnect().await;
}

/// Every SDK scenario, one after the other, through a follower of a
/// cluster whose third replica is cut off: both ways, then only what it
/// sends, then only what it receives (its links through proxies), healed
/// between scenarios. The majority serves each scenario as if nothing were
/// cut; the third replica, healed, catches up with all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_scenarios_pass_while_a_minority_is_cut_off() {
    let all = sdk_scenarios();
    let c = Cluster::with_links(3).await;
    let leader = c.leader(Duration::from_secs(20));
    let (serving, lone) = ((leader + 1) % 3, (leader + 2) % 3);
    for (i, (name, scenario)) in all.into_iter().enumerate() {
        c.heal();
        for other in [leader, serving] {
            match i % 3 {
                0 => {
                    c.cut(lone, other);
                    c.cut(other, lone);
                }
                1 => c.cut(lone, other),
                _ => c.cut(other, lone),
            }
        }
        eprintln!(
            "{name}: replica {} cut off ({})",
            lone + 1,
            ["both ways", "what it sends", "what it receives"][i % 3]
        );
        tokio::time::timeout(Duration::from_secs(120), scenario(c.mqtt[serving]))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    c.heal();
    let status = c.settled(Duration::from_secs(60));
    // The leader never changed: a cut-off minority disturbs no one.
    assert_eq!(c.leader(Duration::from_secs(5)), leader, "{status}");
    // What the last scenario wrote reads the same through the healed one.
    let mut reader = RawClient::connect(c.mqtt[lone], "healed-reader").await;
    reader.subscribe(&reader.response_topic()).await;
    let got = reader.call(&[b"GET", b"scan/k00042"]).await;
    assert_eq!(text(&got), "$1\r\nv\r\n", "{status}");
    reader.disconnect().await;
}

/// Waits until `cluster status` says the partitions are led as `want`
/// (its `partitions:` line); returns the status.
fn partitions_led(c: &Cluster, want: &str, within: Duration) -> String {
    let start = Instant::now();
    loop {
        let (_, text) = c.status();
        if text.lines().any(|l| l == want) {
            return text;
        }
        assert!(start.elapsed() < within, "not led as {want:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A store in 4 partitions on 3 replicas: each partition its own Raft
/// group with its own log, leaderships spread (partition p on the
/// (p mod 3)-th replica), the unmodified SDK scenarios pass (SCAN walking
/// the partitions exactly once among them), and under a write load on every
/// replica the replica leading two partitions is killed and restarted:
/// every acknowledged write reads back from every replica, the returning
/// replica takes its partitions back, and the count of partitions cannot
/// change under a living store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_in_partitions_keeps_its_writes_and_spreads_its_leaders() {
    let mut c = Cluster::with_partitions(3, 4);
    let spread = "partitions: 4 (the table shows partition 0); replica 1 leads 0,3; replica 2 leads 1; replica 3 leads 2";
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    for i in 0..3 {
        for p in 0..4 {
            let state = c
                .data_dir(i)
                .join(format!("partition-{p}"))
                .join("raft-state");
            assert!(state.is_file(), "{}", state.display());
        }
    }
    let all = sdk_scenarios();
    for (name, scenario) in all {
        eprintln!("{name}");
        tokio::time::timeout(Duration::from_secs(120), scenario(c.mqtt[1]))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers = writers_on_every_replica(&c.mqtt, &stop, &acked);
    // Replica 1 leads partitions 0 and 3: they elect new leaders.
    first_killed_and_back(&mut c, spread, &stop, writers).await;
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let (sets, dels, unsure) = every_acknowledged_write_reads_back(&c.mqtt, &acked).await;
    eprintln!(
        "{sets} acknowledged SETs and {dels} DELs checked on every replica ({unsure} DELs unanswered)"
    );
    // The number of partitions is the store's for life.
    c.servers[2] = None;
    let file = std::fs::read_to_string(c.file(2)).expect("file");
    std::fs::write(c.file(2), file.replace("partitions = 4", "partitions = 2")).expect("file");
    let log = c.start_refused(2);
    assert!(
        log.contains("holds a store in 4 partition(s) and the cluster file says `partitions = 2`"),
        "{log}"
    );
    // Started afresh with another count, it is not linked: it would put
    // keys in other groups. The others say why.
    let _ = std::fs::remove_dir_all(c.data_dir(2));
    third_started_unlinked(&mut c, "another number of partitions: link closed").await;
}

/// A cluster of 4 replicas whose file says `copies = 3`, its store in 4
/// partitions: each group on 3 of the replicas (group `g` on the `g`-th and
/// the two after it), so each replica keeps 3 groups' logs and is the
/// place of one's leader. A client of any replica uses every key: what its
/// replica does not hold goes to a replica that does, and the answer comes
/// back; an observer is notified through a replica that does not hold its
/// key's group. The unmodified SDK scenarios pass through the replica that
/// does not hold group 0; under a write load on every replica the replica
/// holding groups 0, 2 and 3 is killed and restarted, and every
/// acknowledged write reads back from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_on_3_of_4_replicas_serve_every_key_through_every_replica() {
    let mut c = Cluster::with_layout(4, "partitions = 4\ncopies = 3\n");
    let spread = "partitions: 4 (the table shows the first group each replica holds); replica 1 leads 0; replica 2 leads 1; replica 3 leads 2; replica 4 leads 3";
    let status =
        tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    assert!(
        status.contains("groups placed (`copies = 3`): replica 1 holds 0,2,3; replica 2 holds 0,1,3; replica 3 holds 0-2; replica 4 holds 1-3"),
        "{status}"
    );
    for (i, holds) in [[0, 2, 3], [0, 1, 3], [0, 1, 2], [1, 2, 3]]
        .iter()
        .enumerate()
    {
        for p in 0..4 {
            let state = c
                .data_dir(i)
                .join(format!("partition-{p}"))
                .join("raft-state");
            assert_eq!(state.is_file(), holds.contains(&p), "{}", state.display());
        }
    }
    let key_in = |p: u32| {
        (0..)
            .map(|i| format!("placed-{i}"))
            .find(|k| partition_of(k.as_bytes(), 4) == p)
            .expect("a key")
    };
    // Replica 1 does not hold group 1: its observer of a key there is
    // notified of a change written through replica 3.
    let mut observer = RawClient::connect(c.mqtt[0], "placed-observer").await;
    observer.subscribe(&observer.response_topic()).await;
    let got = observer.call(&[b"KEYNOTIFY", key_in(1).as_bytes()]).await;
    assert_eq!(text(&got), "+OK\r\n");
    let mut writer = RawClient::connect(c.mqtt[2], "placed-writer").await;
    writer.subscribe(&writer.response_topic()).await;
    for p in 0..4 {
        let got = writer
            .call(&[b"SET", key_in(p).as_bytes(), format!("v{p}").as_bytes()])
            .await;
        assert_eq!(text(&got), "+OK\r\n", "partition {p}");
    }
    assert!(notified(&mut observer, key_in(1).as_bytes(), Duration::from_secs(5)).await);
    for (i, port) in c.mqtt.iter().enumerate() {
        let mut reader = RawClient::connect(*port, &format!("placed-reader-{i}")).await;
        reader.subscribe(&reader.response_topic()).await;
        for p in 0..4 {
            let got = reader.call(&[b"GET", key_in(p).as_bytes()]).await;
            assert_eq!(
                text(&got),
                format!("$2\r\nv{p}\r\n"),
                "partition {p} through replica {}",
                i + 1
            );
        }
        reader.disconnect().await;
    }
    for client in [observer, writer] {
        client.disconnect().await;
    }
    // Replica 1 sent its clients' requests of group 1 to an agent, and got
    // their answers and the notification back.
    let agents = |i: usize, what: &str| -> f64 {
        metric(c.metrics[i], "statestore_cluster_agent_total")
            .into_iter()
            .filter(|(k, _)| k.contains(&format!("what=\"{what}\"")))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(agents(0, "sent") >= 2.0, "{}", agents(0, "sent"));
    assert!(agents(0, "received") >= 3.0, "{}", agents(0, "received"));
    assert!((1..4).map(|i| agents(i, "served")).sum::<f64>() >= 2.0);
    for (name, scenario) in sdk_scenarios() {
        eprintln!("{name}");
        tokio::time::timeout(Duration::from_secs(120), scenario(c.mqtt[3]))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers = writers_on_every_replica(&c.mqtt, &stop, &acked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.servers[0].take().expect("running").kill9();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = tokio::task::block_in_place(|| c.spawn(0));
    c.servers[0] = Some(s);
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let (sets, dels, _) = reads_back_to("placed-", &c.mqtt[1..], &acked).await;
    eprintln!("{sets} acknowledged SETs and {dels} DELs read back");
}

/// Groups placed (4 replicas, `copies = 3`), and one group's copy moved
/// while every replica takes writes: `cluster move` takes group 1 (on 2, 3
/// and 4, led by 2) from replica 2 to replica 1. Replica 1 opens it empty
/// and catches up, becomes a voter, replica 2 hands over the leadership
/// and is removed, and, the move settled, drops its copy and directory.
/// Every acknowledged write reads back through every replica; both
/// replicas, restarted, keep the new placement (kept in their data
/// directories); a move that cannot be made is refused and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_moves_to_another_replica_while_every_replica_writes() {
    let mut c = Cluster::with_layout(4, "partitions = 4\ncopies = 3\n");
    let spread = "partitions: 4 (the table shows the first group each replica holds); replica 1 leads 0; replica 2 leads 1; replica 3 leads 2; replica 4 leads 3";
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    let file = c.file(0);
    let refused = |args: &[&str], why: &str| {
        let (ok, out) = cluster_command(&file, args);
        assert!(!ok && out.contains(why), "{args:?}: {out}");
    };
    tokio::task::block_in_place(|| {
        refused(
            &["move", "--group", "1", "--from", "2", "--to", "3"],
            "replica 3 holds group 1 already",
        );
        refused(
            &["move", "--group", "1", "--from", "1", "--to", "2"],
            "replica 1 does not hold group 1",
        );
        refused(
            &["move", "--group", "9", "--from", "2", "--to", "1"],
            "groups 0 to 3",
        );
        refused(
            &["move", "--group", "1", "--from", "2", "--to", "7"],
            "replica 7 is not a member",
        );
        // A placed cluster replaces a replica; it does not rejoin it.
        let (ok, out) = cluster_command(&c.file(3), &["rejoin"]);
        assert!(
            !ok && out.contains("a replica is not rejoined there"),
            "{out}"
        );
    });
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers = writers_named("moving-", &c.mqtt, &stop, &acked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, out) = tokio::task::block_in_place(|| {
        cluster_command(
            &file,
            &[
                "move", "--group", "1", "--from", "2", "--to", "1", "--wait", "90",
            ],
        )
    });
    assert!(
        ok && out.contains("group 1 moved from replica 2 to 1"),
        "{out}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let (_, status) = c.status();
    assert!(
        status.contains("groups placed (`copies = 3`): replica 1 holds 0-3; replica 2 holds 0,3; replica 3 holds 0-2; replica 4 holds 1-3"),
        "{status}"
    );
    assert!(
        status.contains("moves: 2 agreed; none under way"),
        "{status}"
    );
    let group_1 = |i: usize| c.data_dir(i).join("partition-1").join("raft-state");
    assert!(group_1(0).is_file() && !dir_exists(&c.data_dir(1).join("partition-1")));
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let (sets, dels, _) = reads_back_to("moving-", &c.mqtt, &acked).await;
    assert!(sets > 0, "writes were acknowledged");
    eprintln!("{sets} acknowledged SETs and {dels} DELs read back through every replica");
    // Both restarted: they keep the new placement, and serve every key.
    for i in [0, 1] {
        c.servers[i].take().expect("running").kill9();
        let s = tokio::task::block_in_place(|| c.spawn(i));
        c.servers[i] = Some(s);
    }
    let moved = "groups placed (`copies = 3`): replica 1 holds 0-3; replica 2 holds 0,3; replica 3 holds 0-2; replica 4 holds 1-3";
    tokio::task::block_in_place(|| {
        let start = Instant::now();
        loop {
            let (_, text) = c.status();
            if text.contains(moved) && !text.contains("without a leader") {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "{text}");
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    assert!(!dir_exists(&c.data_dir(1).join("partition-1")));
    let (sets, _, _) = reads_back_to("moving-", &c.mqtt, &acked).await;
    assert!(sets > 0);
    // A move to a replica that is down waits; sent back, it is done, and
    // the replica, back, holds nothing of it.
    c.servers[3].take().expect("running").kill9();
    let (ok, out) = tokio::task::block_in_place(|| {
        cluster_command(
            &file,
            &[
                "move", "--group", "0", "--from", "3", "--to", "4", "--wait", "4",
            ],
        )
    });
    assert!(!ok && out.contains("has not moved"), "{out}");
    let (_, status) = c.status();
    assert!(status.contains("moving group 0 from 3 to 4"), "{status}");
    let (ok, out) = tokio::task::block_in_place(|| {
        cluster_command(
            &file,
            &[
                "move", "--group", "0", "--from", "4", "--to", "3", "--wait", "60",
            ],
        )
    });
    assert!(
        ok && out.contains("group 0 moved from replica 4 to 3"),
        "{out}"
    );
    let s = tokio::task::block_in_place(|| c.spawn(3));
    c.servers[3] = Some(s);
    tokio::task::block_in_place(|| {
        let start = Instant::now();
        loop {
            let (_, text) = c.status();
            if text.contains(moved) && text.contains("moves: 5 agreed; none under way") {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{text}");
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    assert!(!dir_exists(&c.data_dir(3).join("partition-0")));
}

/// How many groups `cluster status` says replica `id` holds (`holds 0,2-3`).
fn held_by(status: &str, id: usize) -> usize {
    let Some(line) = status.lines().find(|l| l.starts_with("groups placed")) else {
        return 0;
    };
    let list = line.split_once(": ").map_or("", |(_, rest)| rest);
    let Some(held) = list
        .split("; ")
        .find_map(|part| part.strip_prefix(&format!("replica {id} holds ")))
    else {
        return 0;
    };
    held.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().expect("n") - a.parse::<usize>().expect("n") + 1,
            None => 1,
        })
        .sum()
}

/// `cluster status` until `done` says so (at most `within`).
fn status_until(c: &Cluster, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let (_, text) = c.status();
        if done(&text) {
            return text;
        }
        assert!(start.elapsed() < within, "{text}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A placed cluster (4 replicas, `copies = 3`, 8 groups: 6 on each) grown
/// and shrunk while every replica takes writes. Replica 5 starts holding
/// nothing (its file marks it `added = true`); `cluster add` makes it a
/// member, and group 0's leader moves groups to it one at a time, from the
/// most loaded replicas, until it holds its share (4 of the 24 copies).
/// `cluster remove` of replica 2 moves its groups away first, one at a
/// time, then it leaves (and stops); replica 3, killed, is removed while
/// down, and told so when it comes back, stops. Every acknowledged write
/// reads back through replicas 1, 4 and 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placed_cluster_grows_and_shrinks_one_move_at_a_time() {
    let mut c = Cluster::with_layout(4, "partitions = 8\ncopies = 3\n");
    tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(60), |t| {
            (1..=4).all(|id| held_by(t, id) == 6) && t.contains("leader: replica")
        })
    });
    let (ok, out) = cluster_command(&c.file(0), &["certs", "--id", "5"]);
    assert!(ok, "cluster certs:\n{out}");
    // Replica 5: the cluster's file, and its own entry `added = true`.
    let (raft5, mqtt5) = tokio::task::block_in_place(|| {
        c.start_new(
            "partitions = 8\ncopies = 3\n",
            &[0, 1, 2, 3],
            "added = true\n",
        )
    });
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers = writers_named("growing-", &c.mqtt[..4], &stop, &acked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, out) = tokio::task::block_in_place(|| {
        cluster_command(
            &c.file(0),
            &[
                "add",
                "--id",
                "5",
                "--raft",
                &format!("127.0.0.1:{raft5}"),
                "--mqtt",
                &format!("127.0.0.1:{mqtt5}"),
            ],
        )
    });
    assert!(
        ok && out.contains("replica 5 added; members: 1, 2, 3, 4, 5"),
        "{out}"
    );
    let grown = tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(120), |t| {
            held_by(t, 5) == 4 && t.contains("none under way")
        })
    });
    assert_eq!(
        (1..=5).map(|id| held_by(&grown, id)).sum::<usize>(),
        24,
        "{grown}"
    );
    assert!((1..=4).all(|id| held_by(&grown, id) == 5), "{grown}");
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&c.file(0), &["remove", "--id", "2"]));
    assert!(
        ok && out.contains("replica 2 removed; members: 1, 3, 4, 5"),
        "{out}"
    );
    let shrunk = tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(30), |t| {
            !t.contains("replica 2 holds")
        })
    });
    assert_eq!(
        [1, 3, 4, 5]
            .iter()
            .map(|&id| held_by(&shrunk, id))
            .sum::<usize>(),
        24,
        "{shrunk}"
    );
    // Told it left, replica 2 stops.
    let mut two = c.servers[1].take().expect("running");
    let start = Instant::now();
    while !two.exited() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "replica 2 still runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Removed already: said so, nothing proposed.
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&c.file(0), &["remove", "--id", "2"]));
    assert!(
        !ok && out.contains("replica 2 is not a member; members: 1, 3, 4, 5"),
        "{out}"
    );
    // Replica 3 dies and is removed while down: its groups move to the
    // three left (each then holds every group). Started again, it is told
    // it left, and stops.
    c.servers[2].take().expect("running").kill9();
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&c.file(0), &["remove", "--id", "3"]));
    assert!(
        ok && out.contains("replica 3 removed; members: 1, 4, 5"),
        "{out}"
    );
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&c.file(0), &["remove", "--id", "4"]));
    assert!(!ok && out.contains("2 members would stay"), "{out}");
    let log = tokio::task::block_in_place(|| c.start_refused(2));
    assert!(log.contains("was removed from the cluster"), "{log}");
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let (_, status) = c.status();
    assert!(
        [1, 4, 5].iter().all(|&id| held_by(&status, id) == 8),
        "{status}"
    );
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let (sets, dels, _) =
        reads_back_to("growing-", &[c.mqtt[0], c.mqtt[3], c.mqtt[4]], &acked).await;
    eprintln!("{sets} acknowledged SETs and {dels} DELs read back through replicas 1, 4 and 5");
}

/// Tenants added to and removed from a placed cluster (4 replicas, `copies
/// = 3`, 4 partitions): the replicas not holding group 0 learn the tenants
/// from the placement their peers pass on, each opens the groups of the
/// added tenant that the formula puts on it (group g on the (g mod 4)-th
/// replica and the two after), and a tenant's client on any replica uses
/// every key (through agents where its replica does not hold the key's
/// group), apart from the other tenant's; removed, the tenant's clients are
/// refused on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_come_and_go_in_a_placed_cluster() {
    let plant = "[[tenant]]\nname = \"plant\"\nclient_id_prefixes = [\"plant-\"]\n";
    let lab = "\n[[tenant]]\nname = \"lab\"\nclient_id_prefixes = [\"lab-\"]\n";
    let config = std::env::temp_dir().join(format!(
        "statestore-placed-tenants-{}-{}.toml",
        std::process::id(),
        free_port()
    ));
    std::fs::write(&config, plant).expect("config");
    let raft: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let args = vec!["--config".to_string(), config.display().to_string()];
    let c = Cluster::build_with_raft(
        4,
        None,
        raft,
        Vec::new(),
        args,
        "partitions = 4\ncopies = 3\n",
        |_, _, port| port,
    );
    tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(60), |t| {
            (1..=4).all(|id| held_by(t, id) == 3) && t.contains("leader: replica")
        })
    });
    // Every replica's --config names it first (here they share one).
    std::fs::write(&config, format!("{plant}{lab}")).expect("config");
    let file = c.file(3);
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&file, &["tenant", "add", "lab"]));
    assert!(
        ok && out.contains("tenant lab added; served by replicas 1, 2, 3, 4"),
        "{out}"
    );
    let status = tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(30), |t| {
            (1..=4).all(|id| held_by(t, id) == 6)
        })
    });
    assert!(
        status.contains("replica 1 holds 0,2-4,6,7; replica 2 holds 0,1,3-5,7; replica 3 holds 0-2,4-6; replica 4 holds 1-3,5-7"),
        "{status}"
    );
    // Replica 4 (not holding group 0) holds the lab's partition 1 (group
    // 5), not its partition 0 (group 4).
    let lab_dir = |i: usize, p: u32| {
        c.data_dir(i)
            .join("tenant-lab")
            .join(format!("partition-{p}"))
    };
    assert!(lab_dir(3, 1).join("raft-state").is_file() && !dir_exists(&lab_dir(3, 0)));
    let key_in = |p: u32| {
        (0..)
            .map(|i| format!("placed-tenant-{i}"))
            .find(|k| partition_of(k.as_bytes(), 4) == p)
            .expect("a key")
    };
    let mut planter = RawClient::connect(c.mqtt[0], "plant-writer").await;
    planter.subscribe(&planter.response_topic()).await;
    let mut labber = RawClient::connect(c.mqtt[3], "lab-writer").await;
    labber.subscribe(&labber.response_topic()).await;
    for p in 0..4 {
        let key = key_in(p);
        let got = planter.call(&[b"SET", key.as_bytes(), b"plant's"]).await;
        assert_eq!(text(&got), "+OK\r\n", "plant, partition {p}");
        let got = labber.call(&[b"SET", key.as_bytes(), b"lab's"]).await;
        assert_eq!(text(&got), "+OK\r\n", "lab, partition {p}");
    }
    for client in [planter, labber] {
        client.disconnect().await;
    }
    for (i, port) in c.mqtt.iter().enumerate() {
        let mut reader = RawClient::connect(*port, &format!("lab-reader-{i}")).await;
        reader.subscribe(&reader.response_topic()).await;
        for p in 0..4 {
            let got = reader.call(&[b"GET", key_in(p).as_bytes()]).await;
            assert_eq!(
                text(&got),
                "$5\r\nlab's\r\n",
                "partition {p} through replica {}",
                i + 1
            );
        }
        reader.disconnect().await;
    }
    let (ok, out) =
        tokio::task::block_in_place(|| cluster_command(&file, &["tenant", "remove", "lab"]));
    assert!(ok && out.contains("tenant lab removed"), "{out}");
    tokio::task::block_in_place(|| {
        status_until(&c, Duration::from_secs(30), |t| {
            (1..=4).all(|id| held_by(t, id) == 3)
        })
    });
    for port in &c.mqtt {
        let mut gone = RawClient::connect(*port, "lab-gone").await;
        gone.subscribe(&gone.response_topic()).await;
        let got = gone.call(&[b"GET", key_in(0).as_bytes()]).await;
        assert_eq!(text(&got), "-ERR not authorized\r\n");
        gone.disconnect().await;
    }
    let mut planter = RawClient::connect(c.mqtt[3], "plant-reader").await;
    planter.subscribe(&planter.response_topic()).await;
    let got = planter.call(&[b"GET", key_in(1).as_bytes()]).await;
    assert_eq!(text(&got), "$7\r\nplant's\r\n");
    planter.disconnect().await;
}

/// A store in 2 partitions whose groups go quiet (idle for over a second:
/// no heartbeats, and a replica skips their routers' ticks) still expires
/// a key on time: a quiet leader's router ticks whenever an expiry is due,
/// and its observer is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_expires_while_its_group_is_quiet() {
    let c = Cluster::with_partitions(3, 2);
    let spread =
        "partitions: 2 (the table shows partition 0); replica 1 leads 0; replica 2 leads 1";
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    let mut client = RawClient::connect(c.mqtt[2], "quiet-expiry").await;
    client.subscribe(&client.response_topic()).await;
    for key in [b"quiet-0".as_slice(), b"quiet-1".as_slice()] {
        let got = client.call(&[b"KEYNOTIFY", key]).await;
        assert_eq!(text(&got), "+OK\r\n");
        let got = client.call(&[b"SET", key, b"v", b"PX", b"4000"]).await;
        assert_eq!(text(&got), "+OK\r\n");
    }
    // Quiet after about 1.3 s of nothing to do.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = client.call(&[b"GET", b"quiet-0"]).await;
    assert_eq!(text(&got), "$1\r\nv\r\n", "not expired yet");
    // Both expiries notified (in either order).
    let mut waiting: Vec<String> = [b"quiet-0".as_slice(), b"quiet-1".as_slice()]
        .iter()
        .map(|k| statestore_guest::notify::topic("quiet-expiry", k))
        .collect();
    let until = Instant::now() + Duration::from_secs(8);
    while !waiting.is_empty() {
        let p = client
            .recv(until.saturating_duration_since(Instant::now()))
            .await
            .unwrap_or_else(|| panic!("no expiry notified on {waiting:?}"));
        waiting.retain(|t| t.as_bytes() != p.topic.as_ref());
    }
    for key in [b"quiet-0".as_slice(), b"quiet-1".as_slice()] {
        assert_eq!(text(&client.call(&[b"GET", key]).await), "$-1\r\n");
    }
    client.disconnect().await;
}

/// Groups placed (4 replicas, `copies = 3`): a write through a replica not
/// holding its key's group, sent just after the group's agent (its leader
/// too) is killed, is answered: unanswered, it goes to the group's next
/// holder, which serves it once the group has a new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_agent_dies_goes_to_the_next_holder() {
    let mut c = Cluster::with_layout(4, "partitions = 4\ncopies = 3\n");
    let spread = "partitions: 4 (the table shows the first group each replica holds); replica 1 leads 0; replica 2 leads 1; replica 3 leads 2; replica 4 leads 3";
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    // Group 0 is on replicas 1, 2 and 3; replica 4's agent for it is 1.
    let key = (0..)
        .map(|i| format!("agent-{i}"))
        .find(|k| partition_of(k.as_bytes(), 4) == 0)
        .expect("a key");
    let mut client = RawClient::connect(c.mqtt[3], "agent-dies").await;
    client.subscribe(&client.response_topic()).await;
    let got = client.call(&[b"SET", key.as_bytes(), b"before"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    c.servers[0].take().expect("running").kill9();
    let props = client.request_properties();
    let payload = statestore_tests::resp(&[b"SET", key.as_bytes(), b"after"]);
    let got = client
        .call_within(payload, props, Duration::from_secs(20))
        .await
        .expect("an answer from the next holder");
    assert_eq!(text(&got), "+OK\r\n");
    let got = client.call(&[b"GET", key.as_bytes()]).await;
    assert_eq!(text(&got), "$5\r\nafter\r\n");
    client.disconnect().await;
}

/// Two tenants (`--config`) on 3 replicas, each store in 2 partitions:
/// every tenant's partition is a Raft group of its own (4 groups, leaders
/// spread), with its own log under `tenant-<name>`; a client sees only its
/// tenant's keys and notifications; the unmodified SDK scenarios pass on
/// the default tenant; under a write load of both tenants on every replica
/// the replica leading two groups is killed and restarted, and every
/// acknowledged write reads back in its own tenant only. The tenants are
/// the data directory's for life (served in its order, whatever
/// `--config`'s; one missing from `--config` refused), and a replica
/// founded with others is not linked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_raft_groups_of_their_own_on_the_same_replicas() {
    let config = "[[tenant]]\nname = \"plant\"\nclient_id_prefixes = [\"plant-\"]\n\n[[tenant]]\nname = \"lab\"\ndefault = true\n";
    let mut c = Cluster::with_tenants(3, 2, config);
    let spread = "partitions: 4 (the table shows partition 0); replica 1 leads 0,3; replica 2 leads 1; replica 3 leads 2";
    tokio::task::block_in_place(|| partitions_led(&c, spread, Duration::from_secs(60)));
    for i in 0..3 {
        let dir = c.data_dir(i);
        assert_eq!(
            std::fs::read_to_string(dir.join("tenants")).expect("tenants"),
            "plant\nlab\n"
        );
        for tenant in ["plant", "lab"] {
            for p in 0..2 {
                let state = dir
                    .join(format!("tenant-{tenant}"))
                    .join(format!("partition-{p}"))
                    .join("raft-state");
                assert!(state.is_file(), "{}", state.display());
            }
        }
    }
    // The same key in each tenant, written through different replicas,
    // read and observed through a third.
    let mut plant = RawClient::connect(c.mqtt[0], "plant-writer").await;
    plant.subscribe(&plant.response_topic()).await;
    let mut lab = RawClient::connect(c.mqtt[1], "lab-writer").await;
    lab.subscribe(&lab.response_topic()).await;
    let mut watcher = RawClient::connect(c.mqtt[2], "lab-watcher").await;
    watcher.subscribe(&watcher.response_topic()).await;
    let got = watcher.call(&[b"KEYNOTIFY", b"shared-key"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    let ok = "+OK\r\n";
    assert_eq!(
        text(&plant.call(&[b"SET", b"shared-key", b"plant's"]).await),
        ok
    );
    assert_eq!(
        text(&lab.call(&[b"SET", b"shared-key", b"lab's"]).await),
        ok
    );
    // One notification: the lab's SET, not the plant's.
    assert!(notified(&mut watcher, b"shared-key", Duration::from_secs(5)).await);
    assert!(
        !notified(&mut watcher, b"shared-key", Duration::from_secs(1)).await,
        "the plant's change was not the lab's to see"
    );
    let mut plant_reader = RawClient::connect(c.mqtt[2], "plant-reader").await;
    plant_reader.subscribe(&plant_reader.response_topic()).await;
    let got = plant_reader.call(&[b"GET", b"shared-key"]).await;
    assert_eq!(text(&got), "$7\r\nplant's\r\n");
    let got = watcher.call(&[b"GET", b"shared-key"]).await;
    assert_eq!(text(&got), "$5\r\nlab's\r\n");
    for client in [plant, lab, watcher, plant_reader] {
        client.disconnect().await;
    }
    for (name, scenario) in sdk_scenarios() {
        eprintln!("{name}");
        tokio::time::timeout(Duration::from_secs(120), scenario(c.mqtt[1]))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked_plant = Arc::new(Mutex::new(Acked::default()));
    let acked_lab = Arc::new(Mutex::new(Acked::default()));
    let mut writers = writers_named("plant-", &c.mqtt, &stop, &acked_plant);
    writers.extend(writers_named("lab-", &c.mqtt, &stop, &acked_lab));
    // Replica 1 leads groups 0 (the plant's partition 0) and 3 (the
    // lab's partition 1).
    first_killed_and_back(&mut c, spread, &stop, writers).await;
    let acked_plant = std::mem::take(&mut *acked_plant.lock().expect("lock"));
    let acked_lab = std::mem::take(&mut *acked_lab.lock().expect("lock"));
    let (sets, dels, _) = reads_back_to("plant-", &c.mqtt, &acked_plant).await;
    eprintln!("plant: {sets} acknowledged SETs and {dels} DELs read back on every replica");
    let (sets, dels, _) = reads_back_to("lab-", &c.mqtt, &acked_lab).await;
    eprintln!("lab: {sets} acknowledged SETs and {dels} DELs read back on every replica");
    // Neither tenant sees the other's keys.
    let lab_reader = sdk(c.mqtt[2], "lab-stranger").await;
    for key in acked_plant.sets.keys().take(20) {
        let got = lab_reader
            .ss
            .get(key.as_bytes().to_vec(), T)
            .await
            .expect("get");
        assert_eq!(got.response, None, "the plant's {key} seen by the lab");
    }
    lab_reader.close().await;
    // The tenants are the data directory's for life.
    c.servers[2] = None;
    std::fs::write(&c.args[1], "[[tenant]]\nname = \"lab\"\ndefault = true\n").expect("config");
    let log = c.start_refused(2);
    assert!(
        log.contains("\"plant\" and --config does not name it"),
        "{log}"
    );
    let reordered = "[[tenant]]\nname = \"lab\"\ndefault = true\n\n[[tenant]]\nname = \"plant\"\nclient_id_prefixes = [\"plant-\"]\n";
    std::fs::write(&c.args[1], reordered).expect("config");
    // Started afresh with them in another order, it is not linked: a
    // tenant's entries would go to another's group. The others say why.
    let _ = std::fs::remove_dir_all(c.data_dir(2));
    third_started_unlinked(&mut c, "a replica serving other tenants: link closed").await;
}

/// A tenant added to a running cluster (`cluster tenant add`, once every
/// replica's `--config` names it): refused while the leader's config does
/// not name it; then every replica opens its group (after the founding
/// tenant's: each replica now of two groups whose logs sync themselves)
/// and serves its clients, apart from the founding tenant's; a replica
/// that was down when it was added opens it as it catches up, and one
/// restarted opens it from its data directory (its two groups now synced
/// through the round journal); the unmodified SDK scenarios pass on it; a
/// replica added to the cluster later joins both tenants' groups. Then the
/// tenant is removed (the first one cannot be): its clients are of no
/// tenant on every replica, its name is not used again; a tenant added
/// and removed while a replica is down keeps its number there too (the
/// next one added is the same group on every replica).
/// (The external-broker test adds one to replicas of two groups.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_added_while_running_is_served_by_every_replica_and_removed() {
    let plant = "[[tenant]]\nname = \"plant\"\nclient_id_prefixes = [\"plant-\"]\n";
    let mut c = Cluster::with_tenants(3, 1, plant);
    tokio::task::block_in_place(|| c.leader(Duration::from_secs(20)));
    let file = c.file(0);
    let (ok, out) = cluster_command(&file, &["tenant", "add", "lab"]);
    assert!(!ok && out.contains("names no tenant \"lab\""), "{out}");
    // Replica 3 is down while the cluster adds it.
    c.servers[2].take().expect("running").kill9();
    std::fs::write(
        &c.args[1],
        format!("{plant}\n[[tenant]]\nname = \"lab\"\ndefault = true\n"),
    )
    .expect("config");
    let (ok, out) = cluster_command(&file, &["tenant", "add", "lab"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("tenant lab added; served by replicas 1, 2"),
        "{out}"
    );
    let (ok, out) = cluster_command(&file, &["tenant", "add", "lab"]);
    assert!(
        ok && out.contains("tenant lab is the cluster's already"),
        "{out}"
    );
    // The same key in both tenants, through different replicas.
    let mut planter = RawClient::connect(c.mqtt[0], "plant-writer").await;
    planter.subscribe(&planter.response_topic()).await;
    let mut lab = RawClient::connect(c.mqtt[1], "lab-writer").await;
    lab.subscribe(&lab.response_topic()).await;
    let mut watcher = RawClient::connect(c.mqtt[0], "lab-watcher").await;
    watcher.subscribe(&watcher.response_topic()).await;
    let got = watcher.call(&[b"KEYNOTIFY", b"both"]).await;
    assert_eq!(text(&got), "+OK\r\n");
    assert_eq!(
        text(&planter.call(&[b"SET", b"both", b"plant's"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&lab.call(&[b"SET", b"both", b"lab's"]).await),
        "+OK\r\n"
    );
    assert!(notified(&mut watcher, b"both", Duration::from_secs(5)).await);
    assert!(
        !notified(&mut watcher, b"both", Duration::from_secs(1)).await,
        "the plant's change was not the lab's to see"
    );
    assert_eq!(
        text(&planter.call(&[b"GET", b"both"]).await),
        "$7\r\nplant's\r\n"
    );
    for client in [planter, lab, watcher] {
        client.disconnect().await;
    }
    // Replica 1 counts the requests its clients sent the added tenant.
    let keynotify = metric(c.metrics[0], "statestore_requests_total");
    assert!(
        keynotify
            .iter()
            .any(|(l, v)| l.contains("tenant=\"lab\"") && l.contains("KEYNOTIFY") && *v >= 1.0),
        "{keynotify:?}"
    );
    // Replica 3 comes back: it applies the addition as it catches up.
    let s = tokio::task::block_in_place(|| c.spawn(2));
    c.servers[2] = Some(s);
    reads_lab_within(c.mqtt[2], "lab-reader", "replica 3").await;
    let (_, status) = tokio::task::block_in_place(|| c.status());
    assert!(status.contains("tenants: plant, lab\n"), "{status}");
    assert!(!status.contains(" serves: "), "{status}");
    for i in 0..3 {
        let dir = c.data_dir(i);
        assert_eq!(
            std::fs::read_to_string(dir.join("tenants")).expect("tenants"),
            "plant\n+lab\n"
        );
        let state = dir.join("tenant-lab").join("raft-state");
        assert!(state.is_file(), "{}", state.display());
    }
    // Restarted, replica 2 opens it from its data directory.
    c.servers[1].take().expect("running").kill9();
    let s = tokio::task::block_in_place(|| c.spawn(1));
    c.servers[1] = Some(s);
    let log = c.servers[1].as_ref().map(|s| s.log()).unwrap_or_default();
    assert!(
        !log.contains("serving a tenant the cluster added"),
        "opened at start, not added: {log}"
    );
    for (name, scenario) in sdk_scenarios() {
        eprintln!("{name}");
        tokio::time::timeout(Duration::from_secs(120), scenario(c.mqtt[1]))
            .await
            .unwrap_or_else(|_| panic!("{name} did not finish in 120 s"));
    }
    let mut planter = RawClient::connect(c.mqtt[1], "plant-reader").await;
    planter.subscribe(&planter.response_topic()).await;
    assert_eq!(
        text(&planter.call(&[b"GET", b"both"]).await),
        "$7\r\nplant's\r\n"
    );
    planter.disconnect().await;
    // Replica 3 replaced by replica 4, whose --config names the cluster's
    // tenants in the cluster's order: it joins both tenants' groups.
    c.servers[2].take().expect("running").kill9();
    let (ok, out) = cluster_command(&c.file(0), &["remove", "--id", "3"]);
    assert!(ok, "cluster remove:\n{out}");
    let (ok, out) = cluster_command(&c.file(0), &["certs", "--id", "4"]);
    assert!(ok, "cluster certs:\n{out}");
    let (raft4, mqtt4) =
        tokio::task::block_in_place(|| c.start_new("join = true\npartitions = 1\n", &[0, 1], ""));
    let raft4 = format!("127.0.0.1:{raft4}");
    let mqtt4_addr = format!("127.0.0.1:{mqtt4}");
    let add = ["add", "--id", "4", "--raft", &raft4, "--mqtt", &mqtt4_addr];
    let (ok, out) = cluster_command(&c.file(0), &add);
    assert!(ok, "cluster add:\n{out}");
    reads_lab_within(mqtt4, "lab-late", "replica 4").await;
    // Removed: the first tenant cannot go; the lab goes everywhere, its
    // clients are of no tenant, its name is not used again, and a replica
    // restarted without it in --config serves the plant.
    let file = c.file(0);
    let (ok, out) = cluster_command(&file, &["tenant", "remove", "plant"]);
    assert!(!ok && out.contains("is the first"), "{out}");
    let (ok, out) = cluster_command(&file, &["tenant", "remove", "lab"]);
    assert!(ok && out.contains("tenant lab removed"), "{out}");
    assert!(!out.contains("not yet"), "{out}");
    let (ok, out) = cluster_command(&file, &["tenant", "remove", "lab"]);
    assert!(
        ok && out.contains("tenant lab is not the cluster's"),
        "{out}"
    );
    let (ok, out) = cluster_command(&file, &["tenant", "add", "lab"]);
    assert!(!ok && out.contains("not used again"), "{out}");
    for port in [c.mqtt[0], c.mqtt[1], mqtt4] {
        let mut gone = RawClient::connect(port, "lab-gone").await;
        gone.subscribe(&gone.response_topic()).await;
        let got = gone.call(&[b"GET", b"both"]).await;
        assert_eq!(text(&got), "-ERR not authorized\r\n");
        gone.disconnect().await;
    }
    // While replica 2 is down, a tenant comes and goes: restarted, it
    // keeps that tenant's number without opening it, so the next tenant
    // is the same group on every replica.
    c.servers[1].take().expect("running").kill9();
    let shop = "\n[[tenant]]\nname = \"shop\"\nclient_id_prefixes = [\"shop-\"]\n";
    std::fs::write(&c.args[1], format!("{plant}{shop}")).expect("config");
    let (ok, out) = cluster_command(&file, &["tenant", "add", "shop"]);
    assert!(
        ok && out.contains("tenant shop added; served by replicas 1, 4"),
        "{out}"
    );
    let (ok, out) = cluster_command(&file, &["tenant", "remove", "shop"]);
    assert!(ok && out.contains("tenant shop removed"), "{out}");
    std::fs::write(&c.args[1], plant).expect("config");
    let s = tokio::task::block_in_place(|| c.spawn(1));
    c.servers[1] = Some(s);
    let garden = "\n[[tenant]]\nname = \"garden\"\ndefault = true\n";
    std::fs::write(&c.args[1], format!("{plant}{garden}")).expect("config");
    let (ok, out) = cluster_command(&file, &["tenant", "add", "garden"]);
    assert!(
        ok && out.contains("tenant garden added; served by replicas 1, 2, 4"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(c.data_dir(1).join("tenants")).expect("tenants"),
        "plant\n+lab\n+shop\n+garden\n-lab\n-shop\n"
    );
    let mut gardener = RawClient::connect(c.mqtt[1], "gardener").await;
    gardener.subscribe(&gardener.response_topic()).await;
    assert_eq!(
        text(&gardener.call(&[b"SET", b"both", b"garden's"]).await),
        "+OK\r\n"
    );
    gardener.disconnect().await;
    let reader = sdk(mqtt4, "garden-reader").await;
    let got = reader.ss.get(b"both".to_vec(), T).await.expect("get");
    assert_eq!(got.response.as_deref(), Some(b"garden's".as_slice()));
    reader.close().await;
    let mut planter = RawClient::connect(c.mqtt[1], "plant-after").await;
    planter.subscribe(&planter.response_topic()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let props = planter.request_properties();
        let payload = statestore_tests::resp(&[b"GET", b"both"]);
        let got = planter
            .call_within(payload, props, Duration::from_secs(5))
            .await;
        if got.as_ref().is_some_and(|g| text(g) == "$7\r\nplant's\r\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the plant after a restart: {got:?}"
        );
    }
    planter.disconnect().await;
    let (_, status) = tokio::task::block_in_place(|| c.status());
    assert!(status.contains("tenants: plant, garden\n"), "{status}");
}

/// Reads `both` through the broker on `port` (an SDK client `id`) until
/// it is the lab's value, for at most 30 s (else `who` does not serve it).
async fn reads_lab_within(port: u16, id: &str, who: &str) {
    let reader = sdk(port, id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = reader.ss.get(b"both".to_vec(), T).await;
        if let Ok(got) = &got
            && got.response.as_deref() == Some(b"lab's".as_slice())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{who} does not serve the lab: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    reader.close().await;
}

/// Under the `writers`' load, replica 1 is killed and restarted; once its
/// groups are led as `spread` again, the writers stop and the replicas
/// settle.
async fn first_killed_and_back(
    c: &mut Cluster,
    spread: &str,
    stop: &AtomicBool,
    writers: Vec<tokio::task::JoinHandle<()>>,
) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(s) = c.servers[0].take() {
        s.kill9();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = tokio::task::block_in_place(|| c.spawn(0));
    c.servers[0] = Some(s);
    // Back and caught up, it takes its groups back.
    tokio::task::block_in_place(|| partitions_led(c, spread, Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let status = tokio::task::block_in_place(|| c.settled(Duration::from_secs(30)));
    eprintln!("{status}");
}

/// Starts replica 3 (of another layout than the others'); both others
/// close its links and say `why`.
async fn third_started_unlinked(c: &mut Cluster, why: &str) {
    let s = tokio::task::block_in_place(|| c.spawn(2));
    c.servers[2] = Some(s);
    let deadline = Instant::now() + Duration::from_secs(20);
    let said = |i: usize| c.servers[i].as_ref().is_some_and(|s| s.log().contains(why));
    while !(said(0) && said(1)) {
        assert!(Instant::now() < deadline, "the others took its links");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One of the SDK scenarios, against the broker on a port.
type Scenario = fn(u16) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Every SDK scenario, by name.
fn sdk_scenarios() -> Vec<(&'static str, Scenario)> {
    macro_rules! scenarios {
        ($($name:ident),* $(,)?) => {
            vec![$((
                stringify!($name),
                (|port| Box::pin(statestore_tests::scenarios::$name(port))) as Scenario,
            )),*]
        };
    }
    statestore_tests::sdk_scenarios!(scenarios)
}

/// A first port of `n` consecutive free loopback ports.
fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let base = free_port();
        if base > u16::MAX - n {
            continue;
        }
        let all_free =
            (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// `scripts/cluster` as an operator runs it with a prebuilt binary
/// (`STATESTORE_BIN`: no cargo build): three replicas on loopback that
/// serve, a healthy `cluster status -o json`, a client that fails over from
/// a dead address, and Ctrl-C (SIGTERM) stopping all three.
#[test]
fn the_cluster_script_runs_a_prebuilt_binary() {
    let dir =
        std::env::temp_dir().join(format!("statestore-cluster-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mqtt = free_ports(6);
    let raft = mqtt + 3;
    let bin = env!("CARGO_BIN_EXE_statestore");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster");
    // Its stdout (where it says it serves) onto the stderr a Server reads.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "exec bash \"$0\" 1>&2"])
        .arg(&script)
        .env("STATESTORE_BIN", bin)
        .env("STATESTORE_CLUSTER_DIR", &dir)
        .env("STATESTORE_MQTT_BASE", mqtt.to_string())
        .env("STATESTORE_RAFT_BASE", raft.to_string())
        .env("STATESTORE_FSYNC", "no")
        .env(
            "STATESTORE_CACHE_DIR",
            std::env::temp_dir().join("statestore-cluster-test-cache"),
        );
    let server = Server::spawn_until(cmd, "==> serving on");
    let log = server.log();
    assert!(!log.contains("Compiling"), "{log}");
    let out = Command::new(bin)
        .args(["cluster", "status", "-o", "json", "--cluster"])
        .arg(dir.join("replica-1.toml"))
        .output()
        .expect("cluster status");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["members"], serde_json::json!([1, 2, 3]), "{json}");
    // A client that names a dead address first, then two replicas.
    let brokers = format!(
        "mqtt://127.0.0.1:{},mqtt://127.0.0.1:{mqtt},mqtt://127.0.0.1:{}",
        free_port(),
        mqtt + 1
    );
    let set = Command::new(bin)
        .args([
            "set",
            "scripted",
            "v",
            "--timeout",
            "20s",
            "--broker",
            &brokers,
        ])
        .output()
        .expect("set");
    assert!(set.status.success(), "{set:?}");
    let get = Command::new(bin)
        .args(["get", "scripted", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{}", mqtt + 2))
        .output()
        .expect("get");
    assert_eq!(get.stdout, b"v", "{get:?}");
    // SIGTERM (as Ctrl-C): the script stops its replicas and exits.
    signal(server.pid(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut server = server;
    while !server.exited() {
        assert!(Instant::now() < deadline, "the script still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", mqtt)).is_ok(),
        "replica 1 stopped with the script"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
