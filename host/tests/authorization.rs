//! The authorization file end to end: `statestore serve --users-file
//! --authorization` with real MQTT5 clients on loopback. The broker
//! resources (Connect, Publish, Subscribe) are checked by the embedded
//! broker, the state store resources by the guest; substitutions, each key
//! type, attributes of password-file users, and a reload on SIGHUP while a
//! client writes.

use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PubAckReason;
use statestore_tests::broker::{RawClient, free_port, text};
use statestore_tests::process::Server;
use statestore_tests::resp;

// Written by mosquitto_passwd 2.0: alice/secret ($7$), bob, mallory and carol/hunter2 ($6$).
const USERS: &str = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==\nbob:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==\nmallory:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==\ncarol:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==\n";

/// The policy: as an operator writes a `BrokerAuthorization` resource.
fn policy(bob_later: bool) -> String {
    let later = if bob_later {
        "\n          - method: ReadWrite\n            keyType: Pattern\n            keys: [\"later/*\"]"
    } else {
        ""
    };
    format!(
        r##"apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata:
  name: test-policies
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      - principals:
          usernames: [alice]
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke", "chat/{{principal.username}}"]
          - method: Subscribe
            topics: ["clients/{{principal.clientId}}/#", "chat/#"]
        stateStoreResources:
          - method: ReadWrite
            keyType: Pattern
            keys: ["alice/*", "{{principal.attributes.team}}/*"]
          - method: Read
            keyType: String
            keys: ["shared"]
      - principals:
          usernames: [bob]
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"]
          - method: Subscribe
            topics: ["clients/{{principal.clientId}}/#"]
        stateStoreResources:
          - method: ReadWrite
            keyType: String
            keys: ["shared"]
          - method: ReadWrite
            keyType: Binary
            keys: ["AP8="]{later}
      - principals:
          usernames: [carol]
        brokerResources:
          - method: Connect
          - method: Subscribe
            topics: ["clients/{{principal.clientId}}/#"]
        stateStoreResources:
          - method: ReadWrite
            keyType: String
            keys: ["shared"]
      - principals:
          usernames: [mallory]
        brokerResources:
          - method: Publish
            topics: ["#"]
userAttributes:
  alice: {{ team: red }}
"##
    )
}

async fn user(port: u16, id: &str, name: &str, password: &str) -> RawClient {
    let mut c = RawClient::try_connect(port, id, Some((name, password)))
        .await
        .unwrap_or_else(|e| panic!("{name} connects: {e}"));
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    c
}

const DENIED: &str = "-ERR not authorized\r\n";

/// `statestore serve` with the users of [`USERS`] and `policy`, in a fresh
/// directory called `name`: the directory, the rules file (to rewrite and
/// reload), the MQTT port and the server.
fn serve_with_rules(
    name: &str,
    policy: &str,
) -> (std::path::PathBuf, std::path::PathBuf, u16, Server) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    let rules = dir.join("authz.yaml");
    std::fs::write(&users, USERS).expect("users");
    std::fs::write(&rules, policy).expect("policy");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_statestore"));
    cmd.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-authz-test-cache"),
    )
    .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
    .arg("--users-file")
    .arg(&users)
    .arg("--authorization")
    .arg(&rules);
    (dir, rules, port, Server::spawn(cmd))
}

/// How long a log line caused by another connection may take to show.
const LOG_WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_file_decides_connects_topics_and_keys() {
    let (dir, rules, port, server) = serve_with_rules("statestore-authz", &policy(false));

    // Connect: mallory's password is right, but no rule lets her connect.
    let refused = RawClient::try_connect(port, "m1", Some(("mallory", "hunter2"))).await;
    assert!(refused.is_err(), "mallory connected");
    server
        .wait_log("no authorization rule lets it connect", LOG_WAIT)
        .await;

    let mut alice = user(port, "alice-1", "alice", "secret").await;
    let mut bob = user(port, "bob-1", "bob", "hunter2").await;

    // Keys: a pattern, an attribute substituted, read-only text, binary.
    assert_eq!(
        text(&alice.call(&[b"SET", b"alice/1", b"a"]).await),
        "+OK\r\n"
    );
    assert_eq!(
        text(&alice.call(&[b"SET", b"red/x", b"r"]).await),
        "+OK\r\n"
    );
    assert_eq!(text(&alice.call(&[b"SET", b"blue/x", b"r"]).await), DENIED);
    assert_eq!(text(&alice.call(&[b"SET", b"shared", b"a"]).await), DENIED);
    assert_eq!(text(&alice.call(&[b"GET", b"shared"]).await), "$-1\r\n");
    assert_eq!(text(&bob.call(&[b"SET", b"shared", b"b"]).await), "+OK\r\n");
    assert_eq!(
        text(&bob.call(&[b"SET", b"\x00\xff", b"b"]).await),
        "+OK\r\n"
    );
    assert_eq!(text(&bob.call(&[b"SET", b"\x00\xfe", b"b"]).await), DENIED);
    assert_eq!(text(&bob.call(&[b"GET", b"alice/1"]).await), DENIED);
    assert_eq!(text(&bob.call(&[b"DEL", b"red/x"]).await), DENIED);
    assert_eq!(text(&alice.call(&[b"GET", b"shared"]).await), "$1\r\nb\r\n");
    // SCAN lists what its requester may read.
    assert_eq!(
        text(&alice.call(&[b"SCAN", b"*"]).await),
        "*1\r\n*3\r\n$7\r\nalice/1\r\n$5\r\nred/x\r\n$6\r\nshared\r\n"
    );
    assert_eq!(
        text(&bob.call(&[b"SCAN", b"*"]).await),
        "*1\r\n*1\r\n$6\r\nshared\r\n"
    );
    // A page whose work budget ends among keys bob may not read (long
    // keys, a long pattern) names none of them: its token is sealed, and
    // the scan goes on to its end.
    for i in 0..8 {
        let key = format!("alice/{i}{}", "x".repeat(10_000));
        assert_eq!(
            text(&alice.call(&[b"SET", key.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    // Long, with a `*`: each key costs the page its length times the
    // pattern's. It matches alice's long keys only (never listed to bob).
    let pattern = format!("*{}*", "x".repeat(1000));
    let mut token: Option<Vec<u8>> = None;
    let (mut pages, mut sealed) = (0, 0);
    loop {
        let mut parts: Vec<&[u8]> = vec![b"SCAN", pattern.as_bytes()];
        if let Some(t) = &token {
            parts.push(t);
        }
        let payload = bob.call(&parts).await.payload.to_vec();
        assert!(
            !payload.windows(6).any(|w| w == b"alice/")
                && (payload.starts_with(b"*2\r\n*0\r\n") || payload == b"*1\r\n*0\r\n"),
            "a page names a key bob may not read: {}",
            String::from_utf8_lossy(&payload[..payload.len().min(300)])
        );
        pages += 1;
        assert!(pages < 50, "the scan ends");
        // The page's token: its last bulk string, when it has two parts.
        if !payload.starts_with(b"*2\r\n") {
            break;
        }
        let at = payload
            .windows(3)
            .rposition(|w| w == b"\r\n$")
            .expect("a token")
            + 3;
        let nl = at
            + payload[at..]
                .iter()
                .position(|&b| b == b'\r')
                .expect("length");
        let len: usize = std::str::from_utf8(&payload[at..nl])
            .expect("digits")
            .parse()
            .expect("length");
        let t = payload[nl + 2..nl + 2 + len].to_vec();
        sealed += usize::from(t.starts_with(b"0;2;"));
        token = Some(t);
    }
    assert!(
        pages >= 2 && sealed > 0,
        "a page ended on a key bob may not read ({pages} pages)"
    );

    // Subscribe: a filter is allowed only if every topic it matches is.
    assert!(alice.try_subscribe("chat/#").await);
    assert!(!bob.try_subscribe("chat/#").await);
    assert!(!bob.try_subscribe("#").await);
    assert!(!alice.try_subscribe("clients/bob-1/#").await);
    // Publish: bob may not publish to chat/alice; it is never delivered.
    bob.client
        .publish("chat/alice", QoS::AtLeastOnce, false, b"forged".to_vec())
        .await
        .expect("publish");
    assert_eq!(
        bob.refused_puback(LOG_WAIT).await,
        Some(PubAckReason::NotAuthorized),
        "the forged publish is refused with 0x87"
    );
    // Nor can he make the store post there for him: a request whose
    // response topic he may not publish to is not answered.
    let mut props = bob.request_properties();
    props.response_topic = Some("chat/alice".into());
    bob.publish_request(resp(&[b"GET", b"shared"]), props).await;
    server.wait_log("request ignored", LOG_WAIT).await;
    // Bob's refusals are logged before alice publishes: were his message
    // or the store's reply delivered, it would reach alice first.
    server.wait_log("publish refused", LOG_WAIT).await;
    alice
        .client
        .publish("chat/alice", QoS::AtLeastOnce, false, b"hello".to_vec())
        .await
        .expect("publish");
    let first = alice
        .recv(Duration::from_secs(10))
        .await
        .expect("alice's own message");
    assert_eq!(&first.payload[..], b"hello", "bob's message was delivered");

    // carol may write "shared" but not publish requests: hers are refused
    // (0x87) and never reach the store.
    let mut carol = user(port, "carol-1", "carol", "hunter2").await;
    let props = carol.request_properties();
    carol
        .publish_request(resp(&[b"SET", b"shared", b"carol"]), props)
        .await;
    assert_eq!(
        carol.refused_puback(LOG_WAIT).await,
        Some(PubAckReason::NotAuthorized)
    );
    assert!(carol.recv(Duration::from_millis(500)).await.is_none());
    assert_eq!(text(&bob.call(&[b"GET", b"shared"]).await), "$1\r\nb\r\n");

    // A reload under load: alice writes throughout; bob gains later/*.
    assert_eq!(text(&bob.call(&[b"SET", b"later/1", b"b"]).await), DENIED);
    std::fs::write(&rules, policy(true)).expect("policy");
    let writer = tokio::spawn(async move {
        let mut ok = 0;
        for i in 0..300u32 {
            let key = format!("alice/load{i}");
            if text(&alice.call(&[b"SET", key.as_bytes(), b"v"]).await) == "+OK\r\n" {
                ok += 1;
            }
        }
        ok
    });
    server.hup();
    let started = Instant::now();
    loop {
        let r = text(&bob.call(&[b"SET", b"later/1", b"b"]).await);
        if r == "+OK\r\n" {
            break;
        }
        assert_eq!(r, DENIED);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the reload did not take: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        writer.await.expect("writer"),
        300,
        "a write failed during the reload"
    );
    server
        .wait_log("authorization rules reloaded", LOG_WAIT)
        .await;
    // A broken file changes nothing.
    std::fs::write(&rules, "rules: [").expect("policy");
    server.hup();
    let started = Instant::now();
    while !server.log().contains("reload failed") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(text(&bob.call(&[b"GET", b"later/1"]).await), "$1\r\nb\r\n");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rules for the reload test: alice reads and writes everything and
/// publishes and subscribes to `alerts/#`; bob may read `watched/*` and
/// subscribe to `alerts/#` until `revoked`.
fn watch_policy(revoked: bool) -> String {
    let (bob_topics, bob_keys) = if revoked {
        ("", "")
    } else {
        (
            ", \"alerts/#\"",
            "\n        stateStoreResources:\n          - method: Read\n            keyType: Pattern\n            keys: [\"watched/*\"]",
        )
    };
    format!(
        r##"rules:
      - principals:
          usernames: [alice]
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke", "alerts/#"]
          - method: Subscribe
            topics: ["clients/{{principal.clientId}}/#", "alerts/#"]
        stateStoreResources:
          - method: ReadWrite
            keyType: Pattern
            keys: ["*"]
      - principals:
          usernames: [bob]
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"]
          - method: Subscribe
            topics: ["clients/{{principal.clientId}}/#"{bob_topics}]{bob_keys}
"##
    )
}

/// Whether `c` receives nothing within a second.
async fn receives_nothing(c: &mut RawClient) -> Result<(), String> {
    match c.recv(Duration::from_secs(1)).await {
        None => Ok(()),
        Some(p) => Err(format!(
            "{} received {:?} on {:?}",
            c.id,
            String::from_utf8_lossy(&p.payload),
            String::from_utf8_lossy(&p.topic)
        )),
    }
}

/// Rules hold over time: after a reload takes bob's read right and his
/// `alerts/#` subscription away, the KEYNOTIFY registration he made before
/// sends him no notification, the subscription he made before delivers
/// nothing, nor does it when his persistent session is resumed (the
/// restored subscription is not checked at SUBSCRIBE, but every delivery
/// is checked against the rules in force). Alice, still allowed, gets both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_takes_away_notifications_and_restored_subscriptions() {
    let (dir, rules, port, server) =
        serve_with_rules("statestore-authz-reload", &watch_policy(false));

    // alice watches and subscribes; her writer (replies to it would take
    // her notifications for its own) writes and publishes.
    let mut alice = user(port, "alice-w", "alice", "secret").await;
    alice.subscribe("alerts/#").await;
    let mut writer = user(port, "alice-set", "alice", "secret").await;
    let bob_connects =
        || RawClient::try_connect_persistent(port, "bob-w", Some(("bob", "hunter2")));
    let mut bob = bob_connects().await.expect("bob connects");
    bob.subscribe(&bob.response_topic()).await;
    bob.subscribe("alerts/#").await;
    for c in [&mut alice, &mut bob] {
        assert_eq!(
            text(&c.call(&[b"KEYNOTIFY", b"watched/k"]).await),
            "+OK\r\n"
        );
    }
    // Allowed: both are told of a change, both get an alert.
    assert_eq!(
        text(&writer.call(&[b"SET", b"watched/k", b"1"]).await),
        "+OK\r\n"
    );
    let note = bob.recv(LOG_WAIT).await.expect("bob's notification");
    assert!(String::from_utf8_lossy(&note.topic).contains("/command/notify/"));
    assert!(alice.recv(LOG_WAIT).await.is_some(), "alice's notification");
    writer
        .publish_to("alerts/1", b"a1".to_vec(), Default::default())
        .await;
    assert_eq!(&bob.recv(LOG_WAIT).await.expect("alert").payload[..], b"a1");
    assert_eq!(
        &alice.recv(LOG_WAIT).await.expect("alert").payload[..],
        b"a1"
    );

    // The reload: bob may read nothing and subscribe to his replies only.
    std::fs::write(&rules, watch_policy(true)).expect("policy");
    server.hup();
    server
        .wait_log("authorization rules reloaded", LOG_WAIT)
        .await;
    // The broker's rules are in force once that is logged; the store's
    // reach its guest a moment later.
    let started = Instant::now();
    loop {
        let r = text(&bob.call(&[b"GET", b"watched/k"]).await);
        if r == DENIED {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the store's rules did not take: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!bob.try_subscribe("alerts/#").await, "a new subscription");

    // The registration made before sends him nothing.
    assert_eq!(
        text(&writer.call(&[b"SET", b"watched/k", b"2"]).await),
        "+OK\r\n"
    );
    let note = alice.recv(LOG_WAIT).await.expect("alice's notification");
    assert!(String::from_utf8_lossy(&note.topic).contains("/command/notify/"));
    receives_nothing(&mut bob).await.expect("no notification");

    // The subscription made before delivers nothing.
    writer
        .publish_to("alerts/2", b"a2".to_vec(), Default::default())
        .await;
    assert_eq!(
        &alice.recv(LOG_WAIT).await.expect("alert").payload[..],
        b"a2"
    );
    receives_nothing(&mut bob).await.expect("no live alert");

    // Nor when his session, with its subscription, is resumed.
    bob.disconnect().await;
    let mut bob = bob_connects().await.expect("bob resumes");
    writer
        .publish_to("alerts/3", b"a3".to_vec(), Default::default())
        .await;
    assert_eq!(
        &alice.recv(LOG_WAIT).await.expect("alert").payload[..],
        b"a3"
    );
    receives_nothing(&mut bob)
        .await
        .expect("no alert in the resumed session");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
