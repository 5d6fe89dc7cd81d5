//! What only the embedded broker can do (spec §2.2, §2.3, §3.2, §11.6):
//! identity from the connection, notifications into the client's session
//! whatever its subscription (the .NET way), registrations dropped on every
//! disconnect, forbidden response topics answered by a disconnect.

use std::time::Duration;

use bytes::Bytes;
use statestore_guest::notify;
use statestore_guest::rpc::{REQUEST_TOPIC, STORE_ID};
use statestore_tests::broker::{Embedded, RawClient, prop, text};
use statestore_tests::resp;

const SET_1: &str = "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\n1\r\n";

/// A client that can make requests (subscribed to its response topic).
async fn client(port: u16, id: &str) -> RawClient {
    let mut c = RawClient::connect(port, id).await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_a_dotnet_style_subscription() {
    let store = Embedded::start().await;
    // The .NET SDK subscribes to .../<raw id>/command/notify, which never
    // matches .../<HEX(id)>/command/notify/<HEX(key)>.
    let mut dotnet = client(store.port, "dotnet-client").await;
    dotnet
        .subscribe(&format!(
            "clients/statestore/v1/{STORE_ID}/dotnet-client/command/notify"
        ))
        .await;
    assert_eq!(text(&dotnet.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
    let mut writer = client(store.port, "writer").await;
    assert_eq!(text(&writer.call(&[b"SET", b"k", b"1"]).await), "+OK\r\n");
    let n = dotnet
        .recv(Duration::from_secs(5))
        .await
        .expect("the notification is delivered");
    assert_eq!(n.topic, Bytes::from(notify::topic("dotnet-client", b"k")));
    assert_eq!(text(&n), SET_1);
    assert!(prop(&n, "__ts").is_some());
    assert!(
        dotnet.recv(Duration::from_millis(300)).await.is_none(),
        "exactly one copy"
    );
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_client_gets_exactly_one_copy() {
    let store = Embedded::start().await;
    let mut rust = client(store.port, "rust-client").await;
    // The Rust and Go SDKs subscribe to the matching filter.
    let filter =
        notify::topic("rust-client", b"k").replace("/command/notify/6B", "/command/notify/+");
    rust.subscribe(&filter).await;
    assert_eq!(text(&rust.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
    let mut writer = client(store.port, "writer").await;
    writer.call(&[b"SET", b"k", b"1"]).await;
    let n = rust
        .recv(Duration::from_secs(5))
        .await
        .expect("notification");
    assert_eq!(n.topic, Bytes::from(notify::topic("rust-client", b"k")));
    assert!(
        rust.recv(Duration::from_millis(300)).await.is_none(),
        "no duplicate through the subscription"
    );
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_drops_registrations_until_observed_again() {
    let store = Embedded::start().await;
    let mut writer = client(store.port, "writer").await;
    for abrupt in [false, true] {
        let id = if abrupt {
            "abrupt-client"
        } else {
            "clean-client"
        };
        let mut c = client(store.port, id).await;
        assert_eq!(text(&c.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
        writer.call(&[b"SET", b"k", b"1"]).await;
        assert_eq!(
            text(&c.recv(Duration::from_secs(5)).await.expect("observing")),
            SET_1
        );
        if abrupt {
            c.kill();
        } else {
            c.disconnect().await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut again = client(store.port, id).await;
        writer.call(&[b"SET", b"k", b"2"]).await;
        assert!(
            again.recv(Duration::from_millis(500)).await.is_none(),
            "{id}: no notification after reconnecting until it observes again"
        );
        assert_eq!(text(&again.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
        writer.call(&[b"SET", b"k", b"1"]).await;
        assert_eq!(
            text(
                &again
                    .recv(Duration::from_secs(5))
                    .await
                    .expect("observing again")
            ),
            SET_1
        );
        again.disconnect().await;
    }
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_observers_both_get_every_notification() {
    let store = Embedded::start().await;
    let mut a = client(store.port, "obs-a").await;
    let mut b = client(store.port, "obs-b").await;
    for c in [&mut a, &mut b] {
        assert_eq!(text(&c.call(&[b"KEYNOTIFY", b"shared"]).await), "+OK\r\n");
    }
    let mut writer = client(store.port, "writer").await;
    writer.call(&[b"SET", b"shared", b"1"]).await;
    writer.call(&[b"DEL", b"shared"]).await;
    for c in [&mut a, &mut b] {
        let set = c
            .recv(Duration::from_secs(5))
            .await
            .expect("SET notification");
        assert_eq!(text(&set), SET_1);
        let del = c
            .recv(Duration::from_secs(5))
            .await
            .expect("DELETE notification");
        assert_eq!(text(&del), "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    }
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_comes_from_the_connection_not_src_id() {
    let store = Embedded::start().await;
    let mut alice = client(store.port, "alice").await;
    alice
        .subscribe(&notify::topic("alice", b"k").replace("/command/notify/6B", "/command/notify/+"))
        .await;
    let mut mallory = client(store.port, "mallory").await;
    let mut props = mallory.request_properties();
    for (n, v) in props.user_properties.iter_mut() {
        if n == "__srcId" {
            *v = "alice".into();
        }
    }
    let r = mallory
        .call_with(resp(&[b"KEYNOTIFY", b"k"]), props)
        .await
        .expect("reply");
    assert_eq!(text(&r), "+OK\r\n");
    let mut writer = client(store.port, "writer").await;
    writer.call(&[b"SET", b"k", b"1"]).await;
    let n = mallory
        .recv(Duration::from_secs(5))
        .await
        .expect("mallory's own notification");
    assert_eq!(n.topic, Bytes::from(notify::topic("mallory", b"k")));
    assert!(
        alice.recv(Duration::from_millis(500)).await.is_none(),
        "nothing is sent in alice's name"
    );
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_response_topic_disconnects_the_client() {
    let store = Embedded::start().await;
    let mut bad = client(store.port, "bad-client").await;
    let mut props = bad.request_properties();
    props.response_topic = Some(format!("clients/statestore/v1/{STORE_ID}/x"));
    bad.publish_request(resp(&[b"SET", b"k", b"v"]), props)
        .await;
    let mut waited = 0;
    while !bad.was_disconnected() && waited < 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(
        bad.was_disconnected(),
        "the broker disconnects a client that uses a reserved response topic"
    );
    let mut good = client(store.port, "good-client").await;
    assert_eq!(
        text(&good.call(&[b"GET", b"k"]).await),
        "$-1\r\n",
        "and the request was not executed"
    );
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_consumed_by_the_store() {
    let store = Embedded::start().await;
    let mut snoop = RawClient::connect(store.port, "snoop").await;
    snoop.subscribe(REQUEST_TOPIC).await;
    let mut c = client(store.port, "requester").await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    assert!(
        snoop.recv(Duration::from_millis(500)).await.is_none(),
        "other subscribers do not get requests"
    );
    // Nor later: a request sent with the retain flag is not kept.
    let props = c.request_properties();
    let corr = props.correlation_data.clone();
    c.client
        .publish_with_properties(
            REQUEST_TOPIC,
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            true,
            resp(&[b"SET", b"k", b"retained"]),
            props,
        )
        .await
        .expect("publish");
    let reply = c.recv(Duration::from_secs(10)).await.expect("a reply");
    assert_eq!(reply.properties.and_then(|p| p.correlation_data), corr);
    let mut late = RawClient::connect(store.port, "late-snoop").await;
    late.subscribe(REQUEST_TOPIC).await;
    if let Some(m) = late.recv(Duration::from_millis(500)).await {
        panic!("a request was kept as a retained message: {}", text(&m));
    }
    store.stop().await;
}

/// A reply reaches its requester by the requester's own subscriptions, as
/// any message would: one copy, at the highest QoS of the subscriptions
/// that match its topic, with every one of their identifiers; and when
/// none matches, it is put into the requester's session all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_follows_its_requesters_own_subscriptions() {
    use rumqttc::v5::mqttbytes::QoS;
    let store = Embedded::start().await;
    let mut c = RawClient::connect(store.port, "overlapping").await;
    assert!(
        c.subscribe_with_id("clients/overlapping/r", QoS::AtMostOnce, 1)
            .await
    );
    assert!(
        c.subscribe_with_id("clients/overlapping/#", QoS::AtLeastOnce, 2)
            .await
    );
    // Another client's subscriptions to the topic change nothing.
    let mut other = RawClient::connect(store.port, "other").await;
    let _ = other.try_subscribe("clients/overlapping/r").await;
    let mut props = c.request_properties();
    props.response_topic = Some("clients/overlapping/r".into());
    let reply = c
        .call_with(resp(&[b"SET", b"k", b"v"]), props)
        .await
        .expect("a reply");
    assert_eq!(text(&reply), "+OK\r\n");
    assert_eq!(reply.qos, QoS::AtLeastOnce, "the highest matching QoS");
    let mut ids = reply
        .properties
        .expect("properties")
        .subscription_identifiers;
    ids.sort_unstable();
    assert_eq!(ids, [1, 2], "every matching subscription's identifier");
    assert!(
        c.recv(Duration::from_millis(300)).await.is_none(),
        "one copy"
    );
    assert!(other.recv(Duration::from_millis(300)).await.is_none());
    // No subscription matches: the reply comes anyway.
    let mut bare = RawClient::connect(store.port, "bare").await;
    let mut props = bare.request_properties();
    props.response_topic = Some("clients/bare/unsubscribed".into());
    let reply = bare
        .call_with(resp(&[b"GET", b"k"]), props)
        .await
        .expect("a reply with no subscription");
    assert_eq!(text(&reply), "$1\r\nv\r\n");
    store.stop().await;
}

/// The store's traffic is private with no rules file, by delivery: a
/// snoop may subscribe to anything (`#`, `clients/+/...`, the victim's own
/// topics, a shared subscription), and still gets none of another client's
/// replies or notifications; it cannot forge them, nor have the store reply
/// into another client's reply stream; ordinary topics work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_and_notifications_are_private() {
    let store = Embedded::start().await;
    let mut victim = client(store.port, "victim").await;
    let mut snoop = RawClient::connect(store.port, "snoop").await;
    let victim_notes =
        notify::topic("victim", b"k").replace("/command/notify/6B", "/command/notify/+");
    for filter in [
        "#",
        "+/#",
        "clients/#",
        "clients/+/services/#",
        "clients/victim/#",
        "$share/spies/clients/#",
        &format!("clients/statestore/v1/{STORE_ID}/+/command/notify/+"),
        victim_notes.as_str(),
    ] {
        assert!(snoop.try_subscribe(filter).await, "{filter} was refused");
    }
    assert!(victim.try_subscribe(&victim_notes).await);
    assert_eq!(text(&victim.call(&[b"KEYNOTIFY", b"k"]).await), "+OK\r\n");
    assert_eq!(
        text(&victim.call(&[b"SET", b"k", b"secret"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&victim.call(&[b"GET", b"k"]).await),
        "$6\r\nsecret\r\n"
    );
    // (The victim's calls read past its notification.) The snoop saw nothing.
    if let Some(m) = snoop.recv(Duration::from_millis(500)).await {
        panic!("the snoop got {:?} ({})", m.topic, text(&m));
    }
    // Forged replies and notifications are refused by the broker (PUBACK
    // 0x87), in every SDK's naming of the victim's reply stream.
    let mut mallory = RawClient::connect(store.port, "mallory").await;
    let forged = rumqttc::v5::mqttbytes::v5::PublishProperties {
        correlation_data: Some(bytes::Bytes::from_static(b"x")),
        ..Default::default()
    };
    let go_style = format!(
        "clients/{}/statestore/v1/{STORE_ID}/command/invoke/response",
        hex("victim")
    );
    for topic in [
        victim.response_topic(),
        go_style,
        notify::topic("victim", b"k"),
    ] {
        mallory
            .publish_to(&topic, b"$6\r\nforged\r\n".to_vec(), forged.clone())
            .await;
        assert_eq!(
            mallory.refused_puback(Duration::from_secs(5)).await,
            Some(rumqttc::v5::mqttbytes::v5::PubAckReason::NotAuthorized),
            "a forgery on {topic}"
        );
    }
    assert!(
        victim.recv(Duration::from_millis(500)).await.is_none(),
        "nothing forged arrives"
    );
    // A request whose response topic is the victim's is not answered.
    let mut props = mallory.request_properties();
    props.response_topic = Some(victim.response_topic());
    mallory.publish_request(resp(&[b"GET", b"k"]), props).await;
    assert!(victim.recv(Duration::from_millis(500)).await.is_none());
    // Ordinary MQTT between clients still works, `#` included.
    let mut sensors = RawClient::connect(store.port, "sensors").await;
    sensors.subscribe("sensors/#").await;
    mallory
        .publish_to("sensors/1", b"21.5".to_vec(), Default::default())
        .await;
    let m = sensors
        .recv(Duration::from_secs(5))
        .await
        .expect("sensors/1");
    assert_eq!(&m.payload[..], b"21.5");
    let m = snoop
        .recv(Duration::from_secs(5))
        .await
        .expect("# gets sensors/1");
    assert_eq!(&m.payload[..], b"21.5");
    store.stop().await;
}

fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02X}")).collect()
}

/// The Go SDK names its reply topic with its id in upper-case hex: the
/// subscription is granted and the replies come, to it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_style_client_gets_its_replies_on_its_hex_topic() {
    let store = Embedded::start().await;
    let mut go = RawClient::connect(store.port, "gosdk-client").await;
    let topic = format!(
        "clients/{}/statestore/v1/{STORE_ID}/command/invoke/response",
        hex("gosdk-client")
    );
    go.subscribe(&topic).await;
    let mut snoop = RawClient::connect(store.port, "snoop").await;
    snoop.subscribe("clients/+/statestore/#").await;
    let mut props = go.request_properties();
    props.response_topic = Some(topic.clone());
    go.publish_request(resp(&[b"SET", b"k", b"v"]), props).await;
    let reply = go.recv(Duration::from_secs(5)).await.expect("the reply");
    assert_eq!(reply.topic, Bytes::from(topic));
    assert_eq!(text(&reply), "+OK\r\n");
    assert!(snoop.recv(Duration::from_millis(500)).await.is_none());
    store.stop().await;
}

/// RPC between clients as Azure IoT Operations does it: an executor answers
/// an invoker on the invoker's `clients/<invoker>/...` topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_may_answer_an_invoker_on_its_clients_topic() {
    let store = Embedded::start().await;
    let mut invoker = RawClient::connect(store.port, "invoker").await;
    let response = "clients/invoker/rpc/increment/response";
    invoker.subscribe(response).await;
    let executor = RawClient::connect(store.port, "executor").await;
    executor
        .publish_to(response, b"42".to_vec(), Default::default())
        .await;
    let m = invoker
        .recv(Duration::from_secs(5))
        .await
        .expect("the answer");
    assert_eq!(&m.payload[..], b"42");
    store.stop().await;
}

/// `--strict-client-topics` keeps `clients/<id>/...` to its client: another
/// client may neither subscribe to a filter that reaches it nor publish
/// there; its own spaces (raw and hex) are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_client_topics_keep_clients_spaces_to_their_owners() {
    let store = Embedded::start_with(statestore::transport::embedded::BrokerOptions {
        client_topics: statestore::auth::isolation::ClientTopics::Strict,
        ..Default::default()
    })
    .await;
    let mut victim = client(store.port, "victim").await;
    let mut snoop = RawClient::connect(store.port, "snoop").await;
    for filter in ["#", "+/#", "clients/#", "clients/victim/#", "$share/g/#"] {
        assert!(!snoop.try_subscribe(filter).await, "{filter} was granted");
    }
    assert!(snoop.try_subscribe("clients/snoop/#").await);
    assert!(
        snoop
            .try_subscribe(&format!("clients/{}/#", hex("snoop")))
            .await
    );
    assert!(snoop.try_subscribe("sensors/#").await);
    snoop
        .publish_to(
            "clients/victim/rpc/response",
            b"x".to_vec(),
            Default::default(),
        )
        .await;
    assert_eq!(
        snoop.refused_puback(Duration::from_secs(5)).await,
        Some(rumqttc::v5::mqttbytes::v5::PubAckReason::NotAuthorized)
    );
    assert_eq!(text(&victim.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    store.stop().await;
}

/// A will message is published without the publish checks, so its topic
/// is checked at CONNECT: one that forges a reply or a notification is
/// refused. A client id with '/', '+' or '#' is refused: `a` would own
/// `a/b`'s reply stream under `clients/a/...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wills_and_client_ids_cannot_reach_another_clients_topics() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::LastWill;
    let store = Embedded::start().await;
    let victim = client(store.port, "victim").await;
    let will = |topic: String| {
        Some(LastWill::new(
            topic,
            "forged",
            QoS::AtLeastOnce,
            false,
            None,
        ))
    };
    for topic in [victim.response_topic(), notify::topic("victim", b"k")] {
        let refused =
            RawClient::try_connect_with(store.port, "willy", None, will(topic.clone())).await;
        assert!(refused.is_err(), "a will on {topic} was accepted");
    }
    let fine =
        RawClient::try_connect_with(store.port, "willy", None, will("sensors/last".into())).await;
    assert!(fine.is_ok(), "an ordinary will was refused");
    for id in ["victim/x", "a+b", "a#"] {
        let refused = RawClient::try_connect(store.port, id, None).await;
        let why = refused
            .err()
            .unwrap_or_else(|| panic!("client id {id:?} was accepted"));
        assert!(
            why.contains("ClientIdentifierNotValid"),
            "client id {id:?}: refused with {why}, want CONNACK 0x85"
        );
    }
    store.stop().await;
}

/// One connection more than `--max-connections-per-address` from one
/// address gets CONNACK 0x97 "quota exceeded"; closing one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_bounded_with_quota_exceeded() {
    let store = Embedded::start_with(statestore::transport::embedded::BrokerOptions {
        limits: statestore::transport::embedded::BrokerLimits {
            max_connections_per_address: 2,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let first = RawClient::connect(store.port, "first").await;
    let _second = RawClient::connect(store.port, "second").await;
    let refused = RawClient::try_connect(store.port, "third", None).await;
    let why = refused
        .err()
        .expect("a third connection from 127.0.0.1 was accepted");
    assert!(
        why.contains("QuotaExceeded"),
        "refused with {why}, want CONNACK 0x97"
    );
    first.disconnect().await;
    let mut room = false;
    for _ in 0..50 {
        if RawClient::try_connect(store.port, "third", None)
            .await
            .is_ok()
        {
            room = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(room, "no room after a connection closed");
    store.stop().await;
}

/// Retained messages: delivered to a later subscriber with the retain flag,
/// bounded (a new topic past the bound gets PUBACK 0x97, a replacement does
/// not), and kept across a restart in the data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_are_bounded_and_survive_a_restart() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::PubAckReason;
    let dir = std::env::temp_dir().join(format!("statestore-retained-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let options = || statestore::transport::embedded::BrokerOptions {
        limits: statestore::transport::embedded::BrokerLimits {
            max_retained: 2,
            ..Default::default()
        },
        data_dir: Some(dir.clone()),
        ..Default::default()
    };
    let store = Embedded::start_with(options()).await;
    let mut sensor = RawClient::connect(store.port, "sensor").await;
    for (topic, value) in [
        ("sensors/1", "21.5"),
        ("sensors/2", "19"),
        ("sensors/1", "22"),
    ] {
        sensor
            .client
            .publish(topic, QoS::AtLeastOnce, true, value.as_bytes().to_vec())
            .await
            .expect("publish");
    }
    sensor
        .client
        .publish(
            "sensors/3",
            QoS::AtLeastOnce,
            true,
            b"past the bound".to_vec(),
        )
        .await
        .expect("publish");
    assert_eq!(
        sensor.refused_puback(Duration::from_secs(5)).await,
        Some(PubAckReason::QuotaExceeded),
        "a third retained topic past --max-retained 2"
    );
    let mut reader = RawClient::connect(store.port, "reader").await;
    reader.subscribe("sensors/#").await;
    let mut got = Vec::new();
    while let Some(m) = reader.recv(Duration::from_secs(2)).await {
        assert!(m.retain, "delivered as retained");
        got.push((String::from_utf8_lossy(&m.topic).to_string(), text(&m)));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("sensors/1".into(), "22".into()),
            ("sensors/2".into(), "19".into())
        ]
    );
    store.stop().await;

    let again = Embedded::start_with(options()).await;
    let mut reader = RawClient::connect(again.port, "reader").await;
    reader.subscribe("sensors/1").await;
    let m = reader
        .recv(Duration::from_secs(5))
        .await
        .expect("the retained message after a restart");
    assert!(m.retain);
    assert_eq!(text(&m), "22");
    again.stop().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// Requests past the tenant's inbound budget (bytes of requests waiting
/// for the store) wait for room, their publisher's connection unread, and
/// every one of them is answered, in order: none is lost or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_inbound_budget_wait_and_are_all_answered() {
    let store = Embedded::start_with(statestore::transport::embedded::BrokerOptions {
        limits: statestore::transport::embedded::BrokerLimits {
            // About two requests of this test.
            inbound_bytes: 1024,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let mut c = client(store.port, "burst").await;
    const N: usize = 300;
    let value = vec![b'v'; 300];
    let mut sent = Vec::new();
    for i in 0..N {
        let props = c.request_properties();
        sent.push(props.correlation_data.clone().expect("correlation data"));
        let key = format!("k{i}");
        c.publish_request(resp(&[b"SET", key.as_bytes(), &value]), props)
            .await;
    }
    let mut answered = Vec::new();
    while answered.len() < N {
        let Some(reply) = c.recv(Duration::from_secs(20)).await else {
            panic!("{} of {N} requests answered", answered.len());
        };
        assert_eq!(text(&reply), "+OK\r\n");
        answered.push(
            reply
                .properties
                .and_then(|p| p.correlation_data)
                .expect("correlation data"),
        );
    }
    assert_eq!(answered, sent, "every request answered once, in order");
    assert_eq!(
        text(&c.call(&[b"GET", b"k299"]).await),
        "$300\r\n".to_string() + &"v".repeat(300) + "\r\n"
    );
    store.stop().await;
}

/// A request's PUBACK held for its reply (`ack_wait`, as a cluster
/// replica's broker holds it) comes with the reply, and comes all the same
/// when no reply does: a request without a response topic is not answered,
/// and its PUBACK comes once the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_puback_comes_without_a_reply() {
    use rumqttc::v5::mqttbytes::v5::PubAckReason;
    let store = Embedded::start_with(statestore::transport::embedded::BrokerOptions {
        ack_wait: Some(Duration::from_millis(200)),
        ..Default::default()
    })
    .await;
    let mut c = client(store.port, "held").await;
    assert_eq!(text(&c.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    assert_eq!(
        c.puback(Duration::from_secs(5)).await,
        Some(PubAckReason::Success)
    );
    let mut props = c.request_properties();
    props.response_topic = None;
    c.publish_request(resp(&[b"GET", b"k"]), props).await;
    assert_eq!(
        c.puback(Duration::from_secs(5)).await,
        Some(PubAckReason::Success),
        "the PUBACK of a request that gets no reply"
    );
    assert!(c.recv(Duration::from_millis(300)).await.is_none());
    // And the next request is answered as ever.
    assert_eq!(text(&c.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    store.stop().await;
}
