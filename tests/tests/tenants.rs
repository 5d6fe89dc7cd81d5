//! Tenants (a sandboxed multi-tenant store in one process): isolation
//! of faults, limits and quotas, routing of clients, and hot upgrades under
//! load, with the embedded broker and real MQTT5 clients.
//!
//! The faulty tenants run the guest built with its `fault-injection` feature
//! (`guest/src/fault.rs`, built by this crate's build script): `SET
//! __fault/loop` spins forever, `SET __fault/grow` allocates without bound,
//! `SET __fault/trap` panics, and `GET __fault/build` tells that build apart.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use statestore::config::Matcher;
use statestore::store::StoreOptions;
use statestore::store::driver::Control;
use statestore::store::journal::{Fsync, SnapshotPolicy};
use statestore::store::tenant::{Fleet, Tenant};
use statestore::transport::embedded::{EmbeddedServer, Route, TenantHandle};
use statestore::{InboundMessage, Output, Persist, PublishKind, StoreLimits};
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::types::Quota;
use statestore_tests::broker::{RawClient, prop, text};
use statestore_tests::{resp, response_topic};
use tokio::sync::oneshot;

/// The guest with deliberate faults.
fn faulty_wasm() -> Vec<u8> {
    std::fs::read(env!("STATESTORE_FAULTY_WASM")).expect("the faulty component was built")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "statestore-tenants-{name}-{}-{}",
        std::process::id(),
        statestore::transport::external::now_ms()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn durable(dir: PathBuf) -> StoreOptions {
    StoreOptions {
        persist: Persist::All,
        data_dir: Some(dir),
        fsync: Fsync::Always,
        snapshots: SnapshotPolicy::default(),
        ..StoreOptions::volatile("StateStore", "statestore-under-test")
    }
}

fn prefix(p: &str) -> Route {
    Route {
        matcher: Matcher {
            client_id_prefixes: vec![p.into()],
            ..Matcher::default()
        },
        default: false,
    }
}

/// What a tenant runs and how it is limited.
struct Def {
    name: &'static str,
    route: Route,
    wasm: Vec<u8>,
    limits: StoreLimits,
    store: StoreOptions,
}

/// The embedded broker serving `defs`, on a free port.
struct Server {
    port: u16,
    tenants: Vec<TenantHandle>,
    fleet: Fleet,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(defs: Vec<Def>) -> Server {
        let mut fleet = Fleet::new(defs.len(), 64 << 20, None).expect("engine");
        let mut tenants = Vec::new();
        for d in defs {
            let runtime = fleet
                .runtime_from_bytes(&d.wasm, d.limits)
                .expect("the component loads");
            let tenant = Tenant::open(d.name, runtime, &d.store).expect("the tenant opens");
            tenants.push((tenant, d.route));
        }
        let server = EmbeddedServer::start_tenants(
            "127.0.0.1:0".parse().expect("address"),
            "statestore-under-test",
            tenants,
        )
        .await
        .expect("the broker starts");
        let port = server.local_addr().port();
        let handles = server.tenants().to_vec();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Server {
            port,
            tenants: handles,
            fleet,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(self) {
        self.stop_result().await.expect("ran without error");
    }

    /// Stops it and returns how it ended.
    async fn stop_result(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("stops within 10 s")
            .expect("join")
    }
}

async fn client(port: u16, id: &str) -> RawClient {
    let mut c = RawClient::connect(port, id).await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    c
}

/// SETs and GETs of its own keys until `stop` (at least `min` and at most
/// `max` rounds); every reply must be right. Returns the rounds done.
async fn healthy_load(
    port: u16,
    id: String,
    min: usize,
    max: usize,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut c = client(port, &id).await;
    let mut n = 0;
    while n < max && (n < min || !stop.load(Ordering::SeqCst)) {
        let key = format!("{id}/k{}", n % 50);
        let value = format!("v{n}");
        let r = c.call(&[b"SET", key.as_bytes(), value.as_bytes()]).await;
        assert_eq!(prop(&r, "__stat"), Some("200"), "{id}: SET #{n}: {r:?}");
        assert_eq!(text(&r), "+OK\r\n", "{id}: SET #{n}");
        let r = c.call(&[b"GET", key.as_bytes()]).await;
        assert_eq!(
            text(&r),
            format!("${}\r\n{value}\r\n", value.len()),
            "{id}: GET #{n}"
        );
        n += 1;
    }
    c.disconnect().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_tenants_restart_alone_while_a_healthy_tenant_is_under_load() {
    let dir = temp_dir("isolation");
    let faulty = faulty_wasm();
    let def = |name: &'static str, wasm: Vec<u8>, limits: StoreLimits| Def {
        name,
        route: prefix(&format!("{name}-")),
        wasm,
        limits,
        store: durable(dir.join(name)),
    };
    let server = Server::start(vec![
        def(
            "good",
            statestore::GUEST_COMPONENT.to_vec(),
            StoreLimits {
                memory_bytes: Some(64 << 20),
                call_ms: Some(1000),
            },
        ),
        def(
            "looper",
            faulty.clone(),
            StoreLimits {
                memory_bytes: Some(64 << 20),
                call_ms: Some(200),
            },
        ),
        def(
            "hog",
            faulty.clone(),
            StoreLimits {
                memory_bytes: Some(32 << 20),
                call_ms: Some(5000),
            },
        ),
        def(
            "crasher",
            faulty,
            StoreLimits {
                memory_bytes: Some(64 << 20),
                call_ms: Some(1000),
            },
        ),
    ])
    .await;
    let port = server.port;
    let done = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(healthy_load(
                port,
                format!("good-{i}"),
                20,
                2000,
                done.clone(),
            ))
        })
        .collect();

    for (tenant, fault, why) in [
        ("looper", "loop", "CPU deadline"),
        ("hog", "grow", "memory cap of 32 MiB"),
        ("crasher", "trap", "a panic"),
    ] {
        let mut c = client(port, &format!("{tenant}-1")).await;
        for round in 0..2 {
            let before = format!("before{round}");
            assert_eq!(
                text(&c.call(&[b"SET", before.as_bytes(), b"1"]).await),
                "+OK\r\n"
            );
            let key = format!("__fault/{fault}");
            let started = Instant::now();
            let r = c.call(&[b"SET", key.as_bytes(), b"x"]).await;
            assert_eq!(prop(&r, "__stat"), Some("500"), "{tenant}: {r:?}");
            let msg = prop(&r, "__stMsg").unwrap_or_default();
            assert!(msg.contains(why), "{tenant}: {msg}");
            assert!(r.payload.is_empty());
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{tenant}: the fault was stopped"
            );
            // Restarted from its journal: what it acknowledged is there.
            for k in 0..=round {
                let r = c.call(&[b"GET", format!("before{k}").as_bytes()]).await;
                assert_eq!(text(&r), "$1\r\n1\r\n", "{tenant} after fault {round}");
            }
            let r = c.call(&[b"GET", key.as_bytes()]).await;
            assert_eq!(text(&r), "$-1\r\n", "nothing of the failed request stayed");
        }
        c.disconnect().await;
    }
    done.store(true, Ordering::SeqCst);
    for l in load {
        let rounds = l.await.expect("the healthy clients saw only right answers");
        assert!(rounds >= 20);
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request to the state store from `client`.
fn request(client: &str, corr: u32, parts: &[&[u8]]) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: resp(parts),
        qos: 1,
        response_topic: Some(response_topic(client)),
        correlation_data: Some(corr.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        content_type: Some("application/octet-stream".into()),
        payload_format_indicator: Some(0),
        user_properties: vec![
            (
                "__ts".into(),
                format!(
                    "{:015}:00000:{client}",
                    statestore::transport::external::now_ms()
                ),
            ),
            ("__protVer".into(), "1.0".into()),
            ("__srcId".into(), client.into()),
        ],
        client_id: Some(client.into()),
        received_at: None,
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// A server hands a batch to its tenant a call into the guest at a time
/// (`Tenant::handle_some`), and publishes each call's outputs before the
/// next, so a batch of large replies is never held whole: each call's
/// replies stay within the guest's output budget plus one reply, and
/// every request is answered once, in order.
#[test]
fn a_batch_of_large_replies_is_handed_over_a_call_at_a_time() {
    let mut tenant = Tenant::open(
        "large",
        statestore_tests::wasm_runtime().clone(),
        &StoreOptions::volatile("StateStore", "statestore-under-test"),
    )
    .expect("tenant");
    let now = statestore::transport::external::now_ms();
    let value = vec![b'v'; 5 << 20];
    let out = tenant
        .handle(&[request("c", 0, &[b"SET", b"big", &value])], now)
        .expect("set");
    assert_eq!(replies(&out)[0].2, b"+OK\r\n");
    let batch: Vec<_> = (1..=10)
        .map(|n| request("c", n, &[b"GET", b"big"]))
        .collect();
    let (mut rest, mut calls, mut answered) = (&batch[..], 0, Vec::new());
    while !rest.is_empty() {
        let (outputs, handled) = tenant.handle_some(rest, now).expect("handled");
        let bytes: usize = replies(&outputs).iter().map(|r| r.2.len()).sum();
        assert!(
            bytes <= statestore_guest::OUTPUT_BUDGET + value.len() + 64,
            "one call handed over {bytes} bytes"
        );
        for (corr, _, payload) in replies(&outputs) {
            assert_eq!(payload.len(), value.len() + 12, "a whole GET reply");
            answered.push(u32::from_be_bytes(corr.try_into().expect("4 bytes")));
        }
        rest = &rest[handled..];
        calls += 1;
    }
    assert_eq!(answered, (1..=10).collect::<Vec<_>>());
    assert!(calls >= 5, "50 MiB of replies in {calls} calls");
}

fn replies(outputs: &[Output]) -> Vec<(Vec<u8>, String, Vec<u8>)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Publish(m) if m.kind == PublishKind::Response => Some((
                m.correlation_data.as_deref().unwrap_or_default().to_vec(),
                m.user_property("__stat").unwrap_or("").to_string(),
                m.payload.to_vec(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_batch_with_a_faulty_request_fails_only_that_request() {
    let dir = temp_dir("batch");
    let mut fleet = Fleet::new(1, 64 << 20, None).expect("engine");
    let runtime = fleet
        .runtime_from_bytes(&faulty_wasm(), StoreLimits::default())
        .expect("loads");
    let mut tenant = Tenant::open("t", runtime, &durable(dir.clone())).expect("opens");
    let metrics = statestore::metrics::Metrics::new().expect("metrics");
    tenant.set_metrics(metrics.tenant("t"));
    let now = statestore::transport::external::now_ms();
    let batch = [
        request("c", 1, &[b"SET", b"a", b"1"]),
        request("c", 2, &[b"SET", b"__fault/trap", b"x"]),
        request("c", 3, &[b"SET", b"b", b"2"]),
    ];
    let out = tenant.handle(&batch, now).expect("handled");
    let r = replies(&out);
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(
        r[0],
        (
            1u32.to_be_bytes().to_vec(),
            "200".into(),
            b"+OK\r\n".to_vec()
        )
    );
    assert_eq!(
        r[1],
        (2u32.to_be_bytes().to_vec(), "500".into(), Vec::new())
    );
    assert_eq!(
        r[2],
        (
            3u32.to_be_bytes().to_vec(),
            "200".into(),
            b"+OK\r\n".to_vec()
        )
    );
    assert_eq!(tenant.faults(), 2, "the batch, then the request alone");
    // Both restarts are counted, with their cause (a panic traps).
    assert!(
        metrics
            .render()
            .contains("statestore_guest_restarts_total{cause=\"trap\",tenant=\"t\"} 2"),
        "{}",
        metrics.render()
    );
    let out = tenant
        .handle(
            &[
                request("c", 4, &[b"GET", b"a"]),
                request("c", 5, &[b"GET", b"b"]),
            ],
            now,
        )
        .expect("handled");
    let r = replies(&out);
    assert_eq!(r[0].2, b"$1\r\n1\r\n");
    assert_eq!(r[1].2, b"$1\r\n2\r\n");
    drop(tenant);
    // The journal has both writes, and nothing of the fault.
    let runtime = fleet
        .runtime_from_bytes(statestore::GUEST_COMPONENT, StoreLimits::default())
        .expect("loads");
    let mut again = Tenant::open("t", runtime, &durable(dir.clone())).expect("reopens");
    let out = again
        .handle(&[request("c", 6, &[b"GET", b"b"])], now)
        .expect("handled");
    assert_eq!(replies(&out)[0].2, b"$1\r\n2\r\n");
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_memory_cap_below_the_guest_minimum_is_a_clear_error() {
    let mut fleet = Fleet::new(1, 64 << 20, None).expect("engine");
    let runtime = fleet
        .runtime_from_bytes(
            statestore::GUEST_COMPONENT,
            StoreLimits {
                memory_bytes: Some(64 << 10),
                call_ms: None,
            },
        )
        .expect("loads");
    let e = Tenant::open(
        "tiny",
        runtime,
        &StoreOptions::volatile("StateStore", "statestore"),
    )
    .expect_err("64 KiB is too little");
    assert!(format!("{e:#}").contains("tiny"), "{e:#}");
    // A cap above the fleet's is refused up front.
    let e = fleet
        .runtime_from_bytes(
            statestore::GUEST_COMPONENT,
            StoreLimits {
                memory_bytes: Some(128 << 20),
                call_ms: None,
            },
        )
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("restart"), "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_separate_quotas_hold_and_strangers_are_refused() {
    let limits = StoreLimits {
        memory_bytes: Some(64 << 20),
        call_ms: Some(1000),
    };
    let server = Server::start(vec![
        Def {
            name: "a",
            route: prefix("a-"),
            wasm: statestore::GUEST_COMPONENT.to_vec(),
            limits,
            store: StoreOptions {
                quota: Quota {
                    max_keys: Some(2),
                    ..Quota::default()
                },
                ..StoreOptions::volatile("StateStore", "statestore-under-test")
            },
        },
        Def {
            name: "b",
            route: Route {
                matcher: Matcher {
                    usernames: vec!["bob".into()],
                    password: Some("secret".into()),
                    ..Matcher::default()
                },
                default: false,
            },
            wasm: statestore::GUEST_COMPONENT.to_vec(),
            limits,
            store: StoreOptions::volatile("StateStore", "statestore-under-test"),
        },
    ])
    .await;
    let port = server.port;
    let mut a = client(port, "a-1").await;
    assert_eq!(text(&a.call(&[b"SET", b"k", b"A"]).await), "+OK\r\n");
    let mut b = RawClient::try_connect(port, "bobs-device", Some(("bob", "secret")))
        .await
        .expect("bob connects with his password");
    let rt = b.response_topic();
    b.subscribe(&rt).await;
    assert_eq!(
        text(&b.call(&[b"GET", b"k"]).await),
        "$-1\r\n",
        "b cannot see a's key"
    );
    assert_eq!(text(&b.call(&[b"SET", b"k", b"B"]).await), "+OK\r\n");
    assert_eq!(text(&a.call(&[b"GET", b"k"]).await), "$1\r\nA\r\n");
    // a's quota: two keys.
    assert_eq!(text(&a.call(&[b"SET", b"k2", b"2"]).await), "+OK\r\n");
    assert_eq!(
        text(&a.call(&[b"SET", b"k3", b"3"]).await),
        "-ERR the quota has been exceeded\r\n"
    );
    assert_eq!(text(&a.call(&[b"SET", b"k", b"updated"]).await), "+OK\r\n");
    // b has no quota.
    for i in 0..5 {
        let k = format!("b{i}");
        assert_eq!(
            text(&b.call(&[b"SET", k.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    // Nobody's client: there is no default tenant.
    let mut x = client(port, "x-1").await;
    let r = x.call(&[b"GET", b"k"]).await;
    assert_eq!(text(&r), "-ERR not authorized\r\n");
    assert_eq!(prop(&r, "__stat"), Some("200"));
    // bob's user name without his password.
    let refused = RawClient::try_connect(port, "mallory", Some(("bob", "guess"))).await;
    assert!(refused.is_err(), "a wrong password is refused");

    // Topics: clients of one tenant talk to each other; another
    // tenant's, and a client of none, hear nothing of it.
    let mut a2 = client(port, "a-2").await;
    for c in [&mut a, &mut a2, &mut b, &mut x] {
        c.subscribe("chat/#").await;
    }
    a2.client
        .publish("chat/a", QoS::AtLeastOnce, false, b"from a".to_vec())
        .await
        .expect("publish");
    let got = a
        .recv(Duration::from_secs(10))
        .await
        .expect("a-1 hears a-2");
    assert_eq!(&got.payload[..], b"from a");
    let got = a2
        .recv(Duration::from_secs(10))
        .await
        .expect("a-2 hears itself");
    assert_eq!(&got.payload[..], b"from a");
    b.client
        .publish("chat/b", QoS::AtLeastOnce, false, b"from b".to_vec())
        .await
        .expect("publish");
    let got = b
        .recv(Duration::from_secs(10))
        .await
        .expect("b hears itself");
    assert_eq!(&got.payload[..], b"from b", "b heard another tenant");
    // Nor through the store: a reply goes on the topic its requester asks
    // for, to its requester alone (not even to its own tenant's others).
    let mut props = a.request_properties();
    props.response_topic = Some("chat/reply".into());
    a.publish_request(resp(&[b"GET", b"k"]), props).await;
    let got = a
        .recv(Duration::from_secs(10))
        .await
        .expect("the reply on chat/reply");
    assert_eq!(&got.payload[..], b"$7\r\nupdated\r\n");
    assert!(
        a2.recv(Duration::from_millis(500)).await.is_none(),
        "another client got a's reply"
    );
    // bob proved who he is: nobody else may take his client id while his
    // session lasts, and he stays connected.
    let taken = RawClient::try_connect(port, "bobs-device", None).await;
    assert!(taken.is_err(), "an anonymous client took bob's client id");
    assert_eq!(text(&b.call(&[b"GET", b"k"]).await), "$1\r\nB\r\n");
    assert!(!b.was_disconnected());
    for (c, who) in [
        (&mut a, "a-1"),
        (&mut a2, "a-2"),
        (&mut b, "b"),
        (&mut x, "x"),
    ] {
        if let Some(m) = c.recv(Duration::from_millis(500)).await {
            panic!("{who} heard {:?} from another tenant", m.payload);
        }
    }
    a2.disconnect().await;
    x.disconnect().await;
    a.disconnect().await;
    b.disconnect().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_under_load_loses_no_write_and_drops_no_request() {
    let dir = temp_dir("upgrade");
    let limits = StoreLimits {
        memory_bytes: Some(64 << 20),
        call_ms: Some(1000),
    };
    let mut server = Server::start(vec![Def {
        name: "up",
        route: Route {
            matcher: Matcher::default(),
            default: true,
        },
        wasm: statestore::GUEST_COMPONENT.to_vec(),
        limits,
        store: durable(dir.clone()),
    }])
    .await;
    let port = server.port;
    let mut probe = client(port, "probe").await;
    assert_eq!(
        text(&probe.call(&[b"GET", b"__fault/build"]).await),
        "$-1\r\n"
    );
    // Writers: each SETs its own keys and keeps what was acknowledged.
    let writers: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("writer-{i}");
                let mut c = client(port, &id).await;
                let mut acked = Vec::new();
                for n in 0..150 {
                    let key = format!("{id}/{n}");
                    let value = format!("value-{n}");
                    let props = c.request_properties();
                    let r = c
                        .call_within(
                            resp(&[b"SET", key.as_bytes(), value.as_bytes()]),
                            props,
                            Duration::from_secs(10),
                        )
                        .await
                        .unwrap_or_else(|| panic!("{id}: request {n} got no reply"));
                    assert_eq!(text(&r), "+OK\r\n", "{id}: {n}");
                    acked.push((key, value));
                }
                c.disconnect().await;
                acked
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runtime = server
        .fleet
        .runtime_from_bytes(&faulty_wasm(), limits)
        .expect("the new build loads");
    let (done, outcome) = oneshot::channel();
    server.tenants[0]
        .control
        .send(Control::Upgrade {
            runtime,
            quota: Quota::default(),
            done,
        })
        .expect("the tenant runs");
    outcome
        .await
        .expect("answered")
        .expect("the upgrade succeeds");
    // The new build serves.
    let r = probe.call(&[b"GET", b"__fault/build"]).await;
    assert_eq!(text(&r), "$15\r\nfault-injection\r\n");
    let mut all = Vec::new();
    for w in writers {
        all.extend(w.await.expect("every writer got every reply"));
    }
    assert_eq!(all.len(), 450);
    for (key, value) in &all {
        let r = probe.call(&[b"GET", key.as_bytes()]).await;
        assert_eq!(
            text(&r),
            format!("${}\r\n{value}\r\n", value.len()),
            "{key} after the upgrade"
        );
    }
    probe.disconnect().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A component whose output list this host cannot read is refused when it
/// is loaded, with a typed error that says which versions differ, before
/// any store of it exists: an upgrade to it never reaches a tenant.
#[test]
fn a_component_with_unknown_formats_is_refused_at_load() {
    let mut fleet = Fleet::new(1, 64 << 20, None).expect("engine");
    let Err(err) = fleet.runtime_from_bytes(
        &statestore_tests::next_formats_wasm(),
        StoreLimits::default(),
    ) else {
        panic!("a component with the next output version loaded");
    };
    let incompatible = err
        .downcast_ref::<statestore::IncompatibleComponent>()
        .unwrap_or_else(|| panic!("not an IncompatibleComponent: {err:#}"));
    let reads = statestore_guest::wire::OUTPUTS_VERSION;
    assert_eq!(incompatible.outputs_version, reads + 1);
    assert_eq!(incompatible.reads, reads);
    let ok = fleet
        .runtime_from_bytes(statestore::GUEST_COMPONENT, StoreLimits::default())
        .expect("the built-in component loads");
    let f = ok.formats().expect("formats");
    assert!(
        f.batch_versions
            .contains(&statestore_guest::wire::BATCH_VERSION)
    );
    assert_eq!(f.outputs_version, statestore_guest::wire::OUTPUTS_VERSION);
}

/// A volatile tenant keeps a journal in memory: a guest fault restarts
/// it with everything it acknowledged; without the memory journal it
/// restarts empty, as before.
#[test]
fn a_volatile_tenant_keeps_what_it_acknowledged_across_a_fault() {
    let mut fleet = Fleet::new(2, 64 << 20, None).expect("engine");
    for memory_journal in [true, false] {
        let runtime = fleet
            .runtime_from_bytes(&faulty_wasm(), StoreLimits::default())
            .expect("loads");
        let opts = StoreOptions {
            memory_journal,
            ..StoreOptions::volatile("StateStore", "statestore")
        };
        let mut tenant = Tenant::open("v", runtime, &opts).expect("opens");
        let now = statestore::transport::external::now_ms();
        let out = tenant
            .handle(&[request("c", 1, &[b"SET", b"a", b"1"])], now)
            .expect("handled");
        assert_eq!(replies(&out)[0].2, b"+OK\r\n");
        let out = tenant
            .handle(&[request("c", 2, &[b"SET", b"__fault/trap", b"x"])], now)
            .expect("handled");
        assert_eq!(replies(&out)[0].1, "500");
        assert_eq!(tenant.faults(), 1);
        let out = tenant
            .handle(&[request("c", 3, &[b"GET", b"a"])], now)
            .expect("handled");
        let expected: &[u8] = if memory_journal {
            b"$1\r\n1\r\n"
        } else {
            b"$-1\r\n"
        };
        assert_eq!(
            replies(&out)[0].2,
            expected,
            "memory journal {memory_journal}"
        );
    }
}

/// A tenant that cannot go on (its restart from the journal failed) stops,
/// but its clients get 503 replies, never silence; the other tenant goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_tenant_answers_503() {
    let dir = temp_dir("stopped");
    let server = Server::start(vec![
        Def {
            name: "doomed",
            route: prefix("d-"),
            wasm: faulty_wasm(),
            limits: StoreLimits::default(),
            store: durable(dir.clone()),
        },
        Def {
            name: "fine",
            route: prefix("f-"),
            wasm: statestore::GUEST_COMPONENT.to_vec(),
            limits: StoreLimits::default(),
            store: StoreOptions::volatile("StateStore", "statestore-under-test"),
        },
    ])
    .await;
    let mut d = client(server.port, "d-1").await;
    assert_eq!(text(&d.call(&[b"SET", b"k", b"1"]).await), "+OK\r\n");
    // The journal's directory is gone, and a file stands in its place: the
    // restart after the next fault cannot read it.
    std::fs::remove_dir_all(&dir).expect("remove the data directory");
    std::fs::write(&dir, b"not a directory").expect("a file in its place");
    let r = d.call(&[b"SET", b"__fault/trap", b"x"]).await;
    assert_eq!(prop(&r, "__stat"), Some("503"), "{r:?}");
    for key in [&b"k"[..], b"other"] {
        let r = d.call(&[b"GET", key]).await;
        assert_eq!(prop(&r, "__stat"), Some("503"), "{r:?}");
        assert!(r.payload.is_empty());
        let msg = prop(&r, "__stMsg").unwrap_or_default();
        assert!(msg.contains("doomed") && msg.contains("stopped"), "{msg}");
    }
    let mut f = client(server.port, "f-1").await;
    assert_eq!(text(&f.call(&[b"SET", b"k", b"2"]).await), "+OK\r\n");
    assert_eq!(text(&f.call(&[b"GET", b"k"]).await), "$1\r\n2\r\n");
    let result = server.stop_result().await;
    let e = result.expect_err("the stopped tenant's error is reported at shutdown");
    assert!(format!("{e:#}").contains("doomed"), "{e:#}");
    let _ = std::fs::remove_file(&dir);
}
