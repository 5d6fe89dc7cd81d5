//! `statestore serve --broker` against a real mosquitto, checked with a plain
//! rumqttc MQTT5 client: the RPC envelope of spec §4 and §13 on the wire.

use std::time::Duration;

use bytes::Bytes;
use statestore::transport::external::ClientEvents;
use statestore_guest::notify;
use statestore_tests::broker::{Host, Mosquitto, RawClient, TestPki, prop, serve_options, text};
use statestore_tests::resp;

async fn setup(events: ClientEvents) -> (Mosquitto, Host, RawClient) {
    let broker = Mosquitto::start();
    let host = Host::start(serve_options(broker.url(), events)).await;
    let mut c = RawClient::connect(broker.port, "raw-c1").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    (broker, host, c)
}

#[tokio::test]
async fn reply_envelope() {
    let (_broker, host, mut c) = setup(ClientEvents::None).await;
    let props = c.request_properties();
    let sent_corr = props.correlation_data.clone();
    let r = c
        .call_with(resp(&[b"SET", b"k", b"v"]), props)
        .await
        .expect("reply");
    assert_eq!(text(&r), "+OK\r\n");
    assert_eq!(r.topic, Bytes::from(c.response_topic()));
    assert_eq!(r.qos, rumqttc::v5::mqttbytes::QoS::AtLeastOnce);
    let p = r.properties.clone().expect("properties");
    assert_eq!(p.correlation_data, sent_corr);
    assert_eq!(p.content_type.as_deref(), Some("application/octet-stream"));
    assert_eq!(p.payload_format_indicator, Some(0));
    let expiry = p.message_expiry_interval.expect("reply expiry");
    assert!((1..=10).contains(&expiry), "{expiry}");
    assert_eq!(prop(&r, "__stat"), Some("200"));
    assert_eq!(prop(&r, "__protVer"), Some("1.0"));
    assert_eq!(prop(&r, "__srcId"), Some("statestore-under-test"));
    let ts = prop(&r, "__ts").expect("__ts on SET");
    assert!(ts.ends_with(":StateStore"), "{ts}");
    let g = c.call(&[b"GET", b"k"]).await;
    assert_eq!(text(&g), "$1\r\nv\r\n");
    assert_eq!(prop(&g, "__ts"), Some(ts));
    let miss = c.call(&[b"GET", b"nokey"]).await;
    assert_eq!(text(&miss), "$-1\r\n");
    assert_eq!(prop(&miss, "__ts"), None);
    // A store error is still __stat 200.
    let e = c.call(&[b"MGET", b"a"]).await;
    assert_eq!(text(&e), "-ERR unknown command\r\n");
    assert_eq!(prop(&e, "__stat"), Some("200"));
    host.stop().await;
}

#[tokio::test]
async fn unsupported_version_is_505() {
    let (_broker, host, mut c) = setup(ClientEvents::None).await;
    let mut props = c.request_properties();
    for (n, v) in props.user_properties.iter_mut() {
        if n == "__protVer" {
            *v = "2.0".into();
        }
    }
    let r = c
        .call_with(resp(&[b"GET", b"k"]), props)
        .await
        .expect("reply");
    assert_eq!(prop(&r, "__stat"), Some("505"));
    assert_eq!(prop(&r, "__supProtMajVer"), Some("1"));
    assert_eq!(prop(&r, "__requestProtVer"), Some("2.0"));
    assert!(r.payload.is_empty());
    host.stop().await;
}

#[tokio::test]
async fn forbidden_response_topic_gets_nothing() {
    let (broker, host, mut c) = setup(ClientEvents::None).await;
    let mut spy = RawClient::connect(broker.port, "raw-spy").await;
    spy.subscribe("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/#")
        .await;
    let mut props = c.request_properties();
    props.response_topic =
        Some("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x".into());
    c.publish_request(resp(&[b"SET", b"bad", b"v"]), props)
        .await;
    let mut props = c.request_properties();
    props.response_topic = None;
    c.publish_request(resp(&[b"SET", b"bad", b"v"]), props)
        .await;
    assert!(
        spy.recv(Duration::from_millis(700)).await.is_none(),
        "nothing may be published"
    );
    // The server is alive and executed neither request.
    let r = c.call(&[b"GET", b"bad"]).await;
    assert_eq!(text(&r), "$-1\r\n");
    host.stop().await;
}

#[tokio::test]
async fn redelivered_request_is_answered_from_the_cache() {
    let (broker, host, mut c) = setup(ClientEvents::None).await;
    let mut watcher = RawClient::connect(broker.port, "raw-watch").await;
    let nt = notify::topic("raw-watch", b"d");
    watcher.subscribe(&nt).await;
    let props = watcher.request_properties();
    let rt = watcher.response_topic();
    watcher.subscribe(&rt).await;
    let r = watcher
        .call_with(resp(&[b"KEYNOTIFY", b"d"]), props)
        .await
        .expect("keynotify reply");
    assert_eq!(text(&r), "+OK\r\n");
    // The same request (same response topic and correlation data) twice.
    let props = c.request_properties();
    let first = c
        .call_with(resp(&[b"SET", b"d", b"v", b"NX"]), props.clone())
        .await
        .expect("first");
    let second = c
        .call_with(resp(&[b"SET", b"d", b"v", b"NX"]), props)
        .await
        .expect("second");
    assert_eq!(text(&first), "+OK\r\n");
    assert_eq!(
        text(&second),
        "+OK\r\n",
        "not executed again (it would be :-1)"
    );
    assert_eq!(prop(&first, "__ts"), prop(&second, "__ts"));
    let n = watcher
        .recv(Duration::from_secs(5))
        .await
        .expect("one notification");
    assert_eq!(n.topic, Bytes::from(nt.clone()));
    assert!(
        watcher.recv(Duration::from_millis(500)).await.is_none(),
        "exactly one notification"
    );
    host.stop().await;
}

#[tokio::test]
async fn queued_requests_survive_a_restart_and_expired_ones_are_dropped() {
    let broker = Mosquitto::start();
    let host = Host::start(serve_options(broker.url(), ClientEvents::None)).await;
    let mut c = RawClient::connect(broker.port, "raw-c1").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"1"]).await), "+OK\r\n");
    host.stop().await;
    // While the server is away: one request that expires, one that does not.
    let mut short = c.request_properties();
    short.message_expiry_interval = Some(1);
    let short_corr = short.correlation_data.clone();
    c.publish_request(resp(&[b"SET", b"k", b"expired"]), short)
        .await;
    let long = c.request_properties();
    let long_corr = long.correlation_data.clone();
    c.publish_request(resp(&[b"SET", b"k", b"2"]), long).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let host = Host::start(serve_options(broker.url(), ClientEvents::None)).await;
    let r = c
        .recv(Duration::from_secs(10))
        .await
        .expect("the queued request is served");
    assert_eq!(
        r.properties
            .as_ref()
            .and_then(|p| p.correlation_data.clone()),
        long_corr
    );
    assert_ne!(long_corr, short_corr);
    assert_eq!(text(&r), "+OK\r\n");
    assert!(
        c.recv(Duration::from_millis(500)).await.is_none(),
        "no reply to the expired request"
    );
    // The in-memory store restarted empty (durability is a separate feature);
    // the expired SET was never applied.
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$1\r\n2\r\n");
    host.stop().await;
}

#[tokio::test]
async fn large_keys_and_values() {
    let (_broker, host, mut c) = setup(ClientEvents::None).await;
    let key: Vec<u8> = (0..65_536u32).map(|i| (i % 256) as u8).collect();
    let value = vec![0xA5u8; 2 * 1024 * 1024];
    assert_eq!(text(&c.call(&[b"SET", &key, &value]).await), "+OK\r\n");
    let r = c.call(&[b"GET", &key]).await;
    assert_eq!(r.payload.len(), value.len() + 12);
    assert_eq!(&r.payload[10..10 + value.len()], &value[..]);
    host.stop().await;
}

#[tokio::test]
async fn mosquitto_disconnect_events_drop_registrations() {
    let (broker, host, mut writer) = setup(ClientEvents::MosquittoLog).await;
    for abrupt in [false, true] {
        let id = if abrupt { "raw-abrupt" } else { "raw-clean" };
        let mut obs = RawClient::connect(broker.port, id).await;
        let nt = notify::topic(id, b"watched");
        obs.subscribe(&nt).await;
        let rt = obs.response_topic();
        obs.subscribe(&rt).await;
        assert_eq!(
            text(&obs.call(&[b"KEYNOTIFY", b"watched"]).await),
            "+OK\r\n"
        );
        writer.call(&[b"SET", b"watched", b"1"]).await;
        let n = obs
            .recv(Duration::from_secs(5))
            .await
            .expect("notification while observing");
        assert_eq!(
            text(&n),
            "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\n1\r\n"
        );
        if abrupt {
            obs.kill();
        } else {
            obs.disconnect().await;
        }
        // Give the broker's log message time to reach the server.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut again = RawClient::connect(broker.port, id).await;
        again.subscribe(&nt).await;
        writer.call(&[b"SET", b"watched", b"2"]).await;
        assert!(
            again.recv(Duration::from_millis(700)).await.is_none(),
            "registrations were dropped at disconnect ({id})\n{}",
            broker.log()
        );
        again.disconnect().await;
    }
    host.stop().await;
}

#[tokio::test]
async fn serves_through_a_tls_listener() {
    let (broker, tls_port, cert) = Mosquitto::start_tls();
    let url = statestore::mqtt::BrokerUrl {
        host: "localhost".into(),
        port: tls_port,
        tls: true,
    };
    // The system roots do not trust a fresh self-signed certificate.
    let untrusted = statestore::transport::external::Server::connect(
        statestore_tests::wasm_runtime(),
        serve_options(url.clone(), ClientEvents::None),
    )
    .await;
    assert!(
        untrusted.is_err(),
        "an untrusted certificate must be refused"
    );
    // With --ca-file it is trusted.
    let mut opts = serve_options(url, ClientEvents::None);
    opts.ca_file = Some(cert);
    let host = Host::start(opts).await;
    let mut c = RawClient::connect(broker.port, "tls-client").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"over-tls"]).await), "+OK\r\n");
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$8\r\nover-tls\r\n");
    host.stop().await;
}

/// Our own connection proves who it is with a client certificate
/// (`--client-cert`, `--client-key`) to a broker that requires one:
/// mosquitto with `require_certificate true`.
#[tokio::test]
async fn serves_through_a_broker_that_requires_a_client_certificate() {
    let pki = TestPki::new("mtls-broker");
    let (broker, tls_port) = Mosquitto::start_tls_requiring_certificates(&pki);
    let url = statestore::mqtt::BrokerUrl {
        host: "localhost".into(),
        port: tls_port,
        tls: true,
    };
    let mut opts = serve_options(url.clone(), ClientEvents::None);
    opts.ca_file = Some(pki.ca.clone());
    opts.connect_timeout = Duration::from_secs(5);
    let refused = statestore::transport::external::Server::connect(
        statestore_tests::wasm_runtime(),
        opts.clone(),
    )
    .await;
    assert!(refused.is_err(), "connected without a client certificate");
    opts.client_cert = Some(statestore::mqtt::ClientCert {
        cert: pki.client_cert.clone(),
        key: pki.client_key.clone(),
    });
    let host = Host::start(opts).await;
    let mut c = RawClient::connect(broker.port, "mtls-client").await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"by-cert"]).await), "+OK\r\n");
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$7\r\nby-cert\r\n");
    host.stop().await;
}

/// Through a real broker (which vouches for nothing), a client that names
/// another as `__srcId` while its response topic is its own
/// `clients/<id>/...` is not answered, and cannot cancel the other's
/// KEYNOTIFY; the other's own requests go on.
#[tokio::test]
async fn a_spoofed_source_id_is_refused() {
    let (broker, host, mut attacker) = setup(ClientEvents::None).await;
    let mut victim = RawClient::connect(broker.port, "victim").await;
    let rt = victim.response_topic();
    victim.subscribe(&rt).await;
    assert_eq!(text(&victim.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
    let mut props = attacker.request_properties();
    for (name, value) in &mut props.user_properties {
        if name == "__srcId" {
            *value = "victim".into();
        }
    }
    // Not answered at all: its response topic is not the requester's.
    let r = attacker
        .call_within(
            resp(&[b"KEYNOTIFY", b"k", b"STOP"]),
            props,
            Duration::from_secs(1),
        )
        .await;
    assert!(r.is_none(), "{r:?}");
    // Still registered: a STOP of its own is +OK (not :0).
    assert_eq!(
        text(&victim.call(&[b"KEYNOTIFY", b"k", b"STOP"]).await),
        "+OK\r\n"
    );
    host.stop().await;
}
