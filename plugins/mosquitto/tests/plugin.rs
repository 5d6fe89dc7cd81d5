//! An unmodified mosquitto 2.0 (Debian's) with the plugin loaded, and real
//! clients: the Rust SDK scenarios every mode passes (notifications into
//! sessions included), privacy against a spy, forged `__srcId` and forged
//! replies, and durability across SIGKILL of mosquitto.

use std::path::PathBuf;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use statestore_tests::broker::{Mosquitto, RawClient, text};

/// The plugin cargo built with this test (`target/<profile>/deps/`, where
/// `cargo test` leaves the cdylib; `target/<profile>/` after `cargo build`).
fn plugin() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps dir");
    let name = "libstatestore_mosquitto.so";
    [deps.join(name), deps.parent().unwrap_or(deps).join(name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is missing: cargo build -p statestore-mosquitto"))
}

/// The compiled component, shared by the tests' brokers.
fn cache() -> String {
    std::env::temp_dir()
        .join("statestore-mosquitto-test-cache")
        .to_string_lossy()
        .into_owned()
}

fn broker(extra: &[(&str, &str)]) -> Mosquitto {
    let cache = cache();
    let mut options = vec![("cache_dir", cache.as_str())];
    options.extend_from_slice(extra);
    Mosquitto::start_with_plugin(&plugin(), &options)
}

/// The SDK scenarios (conditions, versions, fencing, observe and lock-wait
/// notifications, leased locks, MiB values, the CLI, SCAN), each against a
/// mosquitto of its own with the plugin: volatile (requests handled on
/// mosquitto's thread), and durable with `fsync always` (on the store's
/// own thread, replies after their fsync).
macro_rules! in_mosquitto {
    ($($name:ident),* $(,)?) => {
        mod sdk_in_mosquitto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let m = super::broker(&[]);
                    statestore_tests::scenarios::$name(m.port).await;
                }
            )*
        }
        mod sdk_in_mosquitto_fsync_always {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let dir = std::env::temp_dir().join(format!(
                        "statestore-mosquitto-{}-{}",
                        stringify!($name),
                        std::process::id()
                    ));
                    let _ = std::fs::remove_dir_all(&dir);
                    let data = dir.to_string_lossy().into_owned();
                    let m = super::broker(&[("data_dir", &data), ("fsync", "always")]);
                    statestore_tests::scenarios::$name(m.port).await;
                    drop(m);
                    let _ = std::fs::remove_dir_all(&dir);
                }
            )*
        }
    };
}

statestore_tests::sdk_scenarios!(in_mosquitto);

/// A spy subscribed to everything (and to the requests' topic, and to the
/// plugin's own topics) sees neither the victim's requests nor its replies
/// nor its notifications; a forged `__srcId` gets the forger its own
/// identity only; a forged reply on the victim's response topic is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_sees_forges_and_cancels_nothing() {
    let m = broker(&[]);
    let mut spy = RawClient::connect(m.port, "spy").await;
    spy.subscribe("#").await;
    // mosquitto's log as messages: a line the plugin logs while it handles
    // a request is checked for this subscriber (an ACL check from inside
    // the plugin's own callback).
    spy.subscribe("$SYS/broker/log/#").await;
    spy.subscribe("statestore/#").await;
    assert!(
        !spy.try_subscribe("$statestore/#").await,
        "the plugin's topics"
    );
    let mut victim = RawClient::connect(m.port, "victim").await;
    let rt = victim.response_topic();
    victim.subscribe(&rt).await;
    assert_eq!(
        text(&victim.call(&[b"SET", b"secret", b"s3cr3t"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&victim.call(&[b"KEYNOTIFY", b"secret"]).await),
        "+OK\r\n"
    );
    // The forger names the victim in __srcId and stops its registration:
    // the store sees the forger's own client id (nothing to stop).
    let mut forger = RawClient::connect(m.port, "forger").await;
    let frt = forger.response_topic();
    forger.subscribe(&frt).await;
    let mut props = forger.request_properties();
    for (name, value) in props.user_properties.iter_mut() {
        if name == "__srcId" {
            *value = "victim".into();
        }
    }
    let reply = forger
        .call_with(
            statestore_tests::resp(&[b"KEYNOTIFY", b"secret", b"STOP"]),
            props,
        )
        .await
        .expect("a reply to the forger");
    assert_eq!(
        text(&reply),
        ":0\r\n",
        "the victim's registration was stopped"
    );
    // A forged reply on the victim's response topic is refused (0x87).
    forger
        .client
        .publish(rt.clone(), QoS::AtLeastOnce, false, b"+OK\r\n".to_vec())
        .await
        .expect("publish");
    assert_eq!(
        forger.refused_puback(Duration::from_secs(5)).await,
        Some(rumqttc::v5::mqttbytes::v5::PubAckReason::NotAuthorized)
    );
    // The victim is still told of changes.
    let mut writer = RawClient::connect(m.port, "writer").await;
    let wrt = writer.response_topic();
    writer.subscribe(&wrt).await;
    assert_eq!(
        text(&writer.call(&[b"SET", b"secret", b"v2"]).await),
        "+OK\r\n"
    );
    let note = victim
        .recv(Duration::from_secs(5))
        .await
        .expect("the victim's notification");
    assert!(String::from_utf8_lossy(&note.topic).contains("/command/notify/"));
    // A request whose response topic is in the store's own space breaks
    // the protocol's rules: not answered, logged, its client disconnected.
    let mut props = forger.request_properties();
    props.response_topic =
        Some("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/forged".into());
    forger
        .publish_request(statestore_tests::resp(&[b"GET", b"secret"]), props)
        .await;
    let started = std::time::Instant::now();
    while !forger.was_disconnected() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the forger is still connected: {}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The spy saw none of it: no request, reply or notification (log lines
    // aside, which name no value).
    while let Some(p) = spy.recv(Duration::from_millis(500)).await {
        let topic = String::from_utf8_lossy(&p.topic).to_string();
        assert!(
            !p.payload.windows(6).any(|w| w == b"s3cr3t")
                && (topic.starts_with("$SYS/") || !topic.contains("statestore")),
            "the spy received {topic}"
        );
    }
}

/// What the store acknowledged survives SIGKILL of mosquitto, and a new
/// mosquitto with the plugin recovers it: with `fsync always` at once (the
/// store's own thread syncs every write before its reply leaves), with
/// `fsync everysec` a second later.
async fn acknowledged_writes_survive_sigkill(fsync: &str, settle: Duration) {
    let dir = std::env::temp_dir().join(format!(
        "statestore-mosquitto-data-{fsync}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.to_string_lossy().into_owned();
    let options = [("data_dir", data.as_str()), ("fsync", fsync)];
    let m = broker(&options);
    let mut c = RawClient::connect(m.port, "writer").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in 0..200u32 {
        let key = format!("k{i}");
        assert_eq!(
            text(&c.call(&[b"SET", key.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    tokio::time::sleep(settle).await;
    c.kill();
    drop(m);
    let m = broker(&options);
    let mut c = RawClient::connect(m.port, "reader").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in [0u32, 99, 199] {
        let key = format!("k{i}");
        assert_eq!(
            text(&c.call(&[b"GET", key.as_bytes()]).await),
            "$1\r\nv\r\n",
            "{key} after SIGKILL ({fsync})"
        );
    }
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill_with_fsync_always() {
    acknowledged_writes_survive_sigkill("always", Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill_with_fsync_everysec() {
    acknowledged_writes_survive_sigkill("everysec", Duration::from_millis(1500)).await;
}

/// SIGHUP reads `plugin_opt_component` again: a build the host cannot run
/// changes nothing (the store goes on serving), a good one takes over with
/// the state carried over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_upgrades_the_component_with_its_state() {
    let dir = std::env::temp_dir().join(format!(
        "statestore-mosquitto-upgrade-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("statestore.wasm");
    std::fs::write(&file, statestore::GUEST_COMPONENT).expect("component");
    let path = file.to_string_lossy().into_owned();
    let m = broker(&[("component", &path)]);
    let mut c = RawClient::connect(m.port, "upgrader").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"SET", b"kept", b"v1"]).await), "+OK\r\n");
    // A build no host reads: refused, the old one serves on.
    std::fs::write(&file, statestore_tests::next_formats_wasm()).expect("component");
    m.hup();
    m.wait_log("the component was not upgraded", Duration::from_secs(60));
    assert_eq!(text(&c.call(&[b"GET", b"kept"]).await), "$2\r\nv1\r\n");
    // A good build: it takes over, with the state.
    std::fs::write(&file, statestore::GUEST_COMPONENT).expect("component");
    m.hup();
    m.wait_log("statestore: now serving", Duration::from_secs(60));
    assert_eq!(text(&c.call(&[b"GET", b"kept"]).await), "$2\r\nv1\r\n");
    assert_eq!(text(&c.call(&[b"SET", b"after", b"v2"]).await), "+OK\r\n");
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `plugin_opt_metrics`: the same Prometheus families as `serve`, counted
/// by the plugin's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_plugins_requests() {
    let metrics_port = statestore_tests::broker::free_port();
    let addr = format!("127.0.0.1:{metrics_port}");
    let m = broker(&[("metrics", &addr)]);
    assert_eq!(statestore_tests::http_get(metrics_port, "/readyz").0, 200);
    let mut c = RawClient::connect(m.port, "counted").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    for i in 0..3 {
        let key = format!("m{i}");
        assert_eq!(
            text(&c.call(&[b"SET", key.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    assert_eq!(text(&c.call(&[b"GET", b"m0"]).await), "$1\r\nv\r\n");
    let (status, body) = statestore_tests::http_get(metrics_port, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "statestore_requests_total{tenant=\"default\",verb=\"SET\"} 3",
        "statestore_requests_total{tenant=\"default\",verb=\"GET\"} 1",
    ] {
        assert!(body.contains(line), "{line} not in {body}");
    }
}

/// With mosquitto checking passwords (`password_file`) and
/// `plugin_opt_trust_usernames`, the authorization file's key rules see the
/// verified user name and its attributes: alice reads and writes her own
/// keys and her team's, nothing else; a SIGHUP that gives her more takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_rules_see_mosquittos_verified_user_names() {
    let dir =
        std::env::temp_dir().join(format!("statestore-mosquitto-authz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, statestore_tests::ALICE_SECRET).expect("passwd");
    let rules = dir.join("authz.yaml");
    let policy = |extra: &str| {
        format!(
            "rules:\n  - principals:\n      usernames: [alice]\n    stateStoreResources:\n      - method: ReadWrite\n        keyType: Pattern\n        keys: [\"{{principal.username}}/*\", \"{{principal.attributes.team}}/*\"{extra}]\nuserAttributes:\n  alice: {{ team: red }}\n"
        )
    };
    std::fs::write(&rules, policy("")).expect("rules");
    let rules_arg = rules.to_string_lossy().into_owned();
    let m = {
        let cache = cache();
        Mosquitto::start_with_plugin_and(
            &plugin(),
            &[
                ("cache_dir", cache.as_str()),
                ("authorization", rules_arg.as_str()),
                ("trust_usernames", "true"),
            ],
            &format!("password_file {}\n", passwd.display()),
        )
    };
    let mut alice = RawClient::try_connect(m.port, "alice-1", Some(("alice", "secret")))
        .await
        .expect("alice connects");
    let rt = alice.response_topic();
    alice.subscribe(&rt).await;
    const DENIED: &str = "-ERR not authorized\r\n";
    assert_eq!(
        text(&alice.call(&[b"SET", b"alice/1", b"a"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&alice.call(&[b"SET", b"red/1", b"a"]).await),
        "+OK\r\n"
    );
    assert_eq!(text(&alice.call(&[b"SET", b"blue/1", b"a"]).await), DENIED);
    // An anonymous client (mosquitto allows them here) names nobody.
    let mut anon = RawClient::connect(m.port, "anon").await;
    let rt = anon.response_topic();
    anon.subscribe(&rt).await;
    assert_eq!(text(&anon.call(&[b"GET", b"alice/1"]).await), DENIED);
    // SIGHUP: blue/* too.
    std::fs::write(&rules, policy(", \"blue/*\"")).expect("rules");
    m.hup();
    m.wait_log("authorization rules reloaded", Duration::from_secs(30));
    assert_eq!(
        text(&alice.call(&[b"SET", b"blue/1", b"a"]).await),
        "+OK\r\n"
    );
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}
