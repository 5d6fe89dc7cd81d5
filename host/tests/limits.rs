//! Robustness against large and hostile input, against the real binary with
//! its default limits, on loopback, with real MQTT5 clients: large replies,
//! the largest allowed value, values past the limit, and the resident
//! memory they cost.

use std::process::Command;
use std::time::Duration;

use statestore_tests::broker::{RawClient, free_port, prop, text};
use statestore_tests::process::Server;

fn serve(port: u16, extra: &[&str]) -> Server {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statestore"));
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-limits-test-cache"),
    )
    .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
    .args(extra);
    Server::spawn(c)
}

async fn client(port: u16, id: &str) -> RawClient {
    let mut c = RawClient::connect(port, id).await;
    let rt = c.response_topic();
    c.subscribe(&rt).await;
    c
}

/// Subscribes a raw rumqttc client to `filter` (QoS 1) and polls its
/// event loop until the SUBACK.
async fn subscribed(
    client: &rumqttc::v5::AsyncClient,
    eventloop: &mut rumqttc::v5::EventLoop,
    filter: &str,
) {
    use rumqttc::v5::Event;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    client
        .subscribe(filter, QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::SubAck(_))) => return,
            Ok(_) => {}
            Err(e) => panic!("subscribing to {filter}: {e}"),
        }
    }
}

fn bulk(value: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", value.len()).into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

/// 60 pipelined GETs of an 8 MiB value, and one GET of the
/// largest value the defaults allow (16 MiB), all return the value; no
/// key is lost and the guest never fails (a volatile store, which used to
/// restart empty). A value past the limit gets the quota error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_replies_are_delivered_and_nothing_is_lost() {
    let port = free_port();
    let server = serve(port, &[]);
    let mut c = client(port, "large-replies").await;
    for i in 0..20 {
        let k = format!("small{i}");
        assert_eq!(
            text(&c.call(&[b"SET", k.as_bytes(), b"v"]).await),
            "+OK\r\n"
        );
    }
    let eight: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    assert_eq!(text(&c.call(&[b"SET", b"eight", &eight]).await), "+OK\r\n");
    // 60 GETs in flight at once: one batch of 480 MiB of replies, before.
    let get = statestore_tests::resp(&[b"GET", b"eight"]);
    let mut correlations = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let mut props = c.request_properties();
        props.message_expiry_interval = Some(120);
        correlations.insert(props.correlation_data.clone().expect("correlation"));
        c.publish_request(get.clone(), props).await;
    }
    let expected = bulk(&eight);
    for n in 0..60 {
        let r = c
            .recv(Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("reply {n} of 60"));
        assert_eq!(prop(&r, "__stat"), Some("200"), "reply {n}");
        assert!(
            r.payload == expected,
            "reply {n}: {} bytes",
            r.payload.len()
        );
        let corr = r
            .properties
            .as_ref()
            .and_then(|p| p.correlation_data.clone())
            .expect("correlation");
        assert!(correlations.remove(&corr), "one reply per request");
    }
    // The largest value allowed by default, and one byte more.
    let largest = vec![b'L'; 16 << 20];
    assert_eq!(
        text(&c.call(&[b"SET", b"largest", &largest]).await),
        "+OK\r\n"
    );
    let r = c.call(&[b"GET", b"largest"]).await;
    assert!(r.payload == bulk(&largest), "{} bytes", r.payload.len());
    let over = vec![b'O'; (16 << 20) + 1];
    assert_eq!(
        text(&c.call(&[b"SET", b"over", &over]).await),
        "-ERR the quota has been exceeded\r\n"
    );
    for i in 0..20 {
        let k = format!("small{i}");
        assert_eq!(
            text(&c.call(&[b"GET", k.as_bytes()]).await),
            "$1\r\nv\r\n",
            "{k}"
        );
    }
    let log = server.log();
    assert!(!log.contains("guest failed"), "{log}");
}

/// A packet past --max-packet-mib is refused by the broker
/// (the client is disconnected), and the store goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packet_past_the_limit_is_refused() {
    let port = free_port();
    let _server = serve(port, &["--max-packet-mib", "1"]);
    let mut c = client(port, "too-big").await;
    let big = vec![b'x'; 2 << 20];
    let props = c.request_properties();
    c.publish_request(statestore_tests::resp(&[b"SET", b"k", &big]), props)
        .await;
    assert!(
        c.recv(Duration::from_secs(3)).await.is_none(),
        "no reply to a refused packet"
    );
    let mut other = client(port, "fine").await;
    assert_eq!(text(&other.call(&[b"SET", b"k", b"1"]).await), "+OK\r\n");
    assert_eq!(text(&other.call(&[b"GET", b"k"]).await), "$1\r\n1\r\n");
}

/// Connections from one address past the limit are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_limited() {
    let port = free_port();
    let _server = serve(port, &["--max-connections-per-address", "3"]);
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(client(port, &format!("conn-{i}")).await);
    }
    let refused = RawClient::try_connect(port, "conn-3", None).await;
    assert!(refused.is_err(), "the fourth connection is refused");
    held.pop().expect("one").disconnect().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = client(port, "conn-4").await;
    assert_eq!(text(&again.call(&[b"SET", b"k", b"1"]).await), "+OK\r\n");
}

/// A snapshot of more than 128 MiB of state succeeds (wasmtime
/// refused to move more than 128 MiB out of the guest in one call), the log
/// is cut, and a restart recovers from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_of_more_than_128_mib_succeed() {
    let dir = std::env::temp_dir().join(format!("statestore-limits-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let durable = |port: u16| {
        let dir = dir.to_str().expect("utf-8 path").to_string();
        serve(
            port,
            &[
                "--data-dir",
                &dir,
                "--fsync",
                "no",
                "--snapshot-log-mib",
                "140",
            ],
        )
    };
    let port = free_port();
    let server = durable(port);
    let mut c = client(port, "snapshots").await;
    let value = |i: u8| vec![i; 15 << 20];
    for i in 0..10u8 {
        let k = format!("v{i}");
        // 15 MiB through a debug build on a busy machine: a minute at most.
        let props = c.request_properties();
        let r = c
            .call_within(
                statestore_tests::resp(&[b"SET", k.as_bytes(), &value(i)]),
                props,
                Duration::from_secs(60),
            )
            .await
            .expect("a reply within 60 s");
        assert_eq!(
            text(&r),
            "+OK\r\n",
            "{k}: status {:?} {:?}",
            prop(&r, "__stat"),
            prop(&r, "__stMsg")
        );
    }
    // The snapshot is written in the background.
    let snapshot = || {
        std::fs::read_dir(&dir)
            .expect("data dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
            .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    let started = std::time::Instant::now();
    while snapshot() <= 128 << 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no snapshot above 128 MiB:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = server.log();
    assert!(
        !log.contains("cannot take a snapshot") && !log.contains("guest failed"),
        "{log}"
    );
    server.kill9();
    let port = free_port();
    let _server = durable(port);
    let mut c = client(port, "snapshots-2").await;
    for i in 0..10u8 {
        let k = format!("v{i}");
        let r = c.call(&[b"GET", k.as_bytes()]).await;
        assert!(r.payload == bulk(&value(i)), "{k} after the restart");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A flood of KEYNOTIFY registrations (20,000 of 8 KiB
/// keys from one client) and of requests whose replies the dedup cache
/// would keep (10,000 with 256-byte correlation data, 4,000-byte response
/// topics and the longest message expiry) is answered with the quota error
/// and bounded caching, charged to the flooding client over all its
/// response topics (4 MiB): the owner's keys and its cached replies stay,
/// and the server's resident
/// memory grows by less than 96 MiB, or 320 MiB with the memory journal of
/// a volatile store (it grew by 335 MiB and by 1.5 GiB). The journal's
/// share: the log, and a snapshot of the dedup cache (whose 32 MiB take
/// about twice that in a snapshot, which writes each reply's topic twice)
/// in the guest's memory and in the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_registrations_and_cached_replies_stay_bounded() {
    // A small inbound budget: requests waiting for the store are bounded
    // by it (64 MiB by default), and a slow (debug) build lets them wait.
    flood(&["--no-memory-journal", "--inbound-mib", "4"], 96).await;
    flood(&["--inbound-mib", "4"], 320).await;
}

async fn flood(extra: &[&str], bound_mib: u64) {
    let port = free_port();
    let server = serve(port, extra);
    let mut owner = client(port, "owner").await;
    for i in 0..10 {
        let k = format!("owned{i}");
        assert_eq!(
            text(&owner.call(&[b"SET", k.as_bytes(), b"mine"]).await),
            "+OK\r\n"
        );
    }
    // A request whose reply the owner may need again: retried after the
    // flood, it must get its original answer from the dedup cache (a
    // second execution of SET NX would not be +OK).
    let mut once = owner.request_properties();
    once.message_expiry_interval = Some(120);
    let set_once = statestore_tests::resp(&[b"SET", b"once", b"v", b"NX"]);
    let first = owner
        .call_with(set_once.clone(), once.clone())
        .await
        .expect("reply");
    assert_eq!(text(&first), "+OK\r\n");
    let before = server.rss_kib();
    let mut hostile = client(port, "flooder").await;
    let notify = |i: u32| {
        let mut key = format!("{i:08}").into_bytes();
        key.resize(8 << 10, b'k');
        statestore_tests::resp(&[b"KEYNOTIFY", &key])
    };
    for i in 0..20_000 {
        let props = hostile.request_properties();
        hostile.publish_request(notify(i), props).await;
    }
    let (mut ok, mut quota) = (0, 0);
    for n in 0..20_000 {
        let r = hostile
            .recv(Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("reply {n} of 20,000"));
        match &*text(&r) {
            "+OK\r\n" => ok += 1,
            "-ERR the quota has been exceeded\r\n" => quota += 1,
            other => panic!("{other}"),
        }
    }
    assert!(
        ok <= 1000 && quota >= 19_000,
        "{ok} registered, {quota} refused"
    );
    for i in 0..10_000u32 {
        let mut props = hostile.request_properties();
        let mut corr = i.to_be_bytes().to_vec();
        corr.resize(256, 0);
        props.correlation_data = Some(corr.into());
        props.response_topic = Some(format!("flood/{i}/{}", "t".repeat(4000)));
        props.message_expiry_interval = Some(u32::MAX);
        let key = format!("f{}", i % 50);
        hostile
            .publish_request(statestore_tests::resp(&[b"DEL", key.as_bytes()]), props)
            .await;
    }
    // Handled in order: once this is answered, so is the flood.
    assert_eq!(
        text(&hostile.call(&[b"GET", b"owned0"]).await),
        "$4\r\nmine\r\n"
    );
    let after = server.rss_kib();
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("{extra:?}: resident memory grew by {grown_mib} MiB (bound {bound_mib})");
    assert!(
        grown_mib < bound_mib,
        "{extra:?}: resident memory grew by {grown_mib} MiB"
    );
    for i in 0..10 {
        let k = format!("owned{i}");
        assert_eq!(
            text(&owner.call(&[b"GET", k.as_bytes()]).await),
            "$4\r\nmine\r\n"
        );
    }
    // The flooder spread 40 MiB of cached replies over 10,000 response
    // topics: charged to it as one client, they pushed out its own oldest,
    // not the owner's.
    let again = owner.call_with(set_once, once).await.expect("reply");
    assert_eq!(
        text(&again),
        "+OK\r\n",
        "{extra:?}: the owner's cached reply was forgotten"
    );
    let log = server.log();
    assert!(!log.contains("guest failed"), "{log}");
}

/// A stalled subscriber (connected, its socket no longer read)
/// holds at most `--max-queued-mib` of messages in the broker, counted in
/// bytes (queued and unacknowledged), not 1,000 messages of any size: 100
/// messages of 1 MiB for it leave about 8 MiB held, the rest are dropped
/// for it alone, and it gets the first ones when it reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_holds_at_most_its_queue_bytes() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let port = free_port();
    let server = serve(port, &["--max-queued-mib", "8"]);
    let mut o = MqttOptions::new("stalled", "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(120))
        .set_clean_start(true)
        .set_max_packet_size(Some(statestore::transport::external::MAX_PACKET));
    let (stalled, mut eventloop) = AsyncClient::new(o, 16);
    subscribed(&stalled, &mut eventloop, "feed/#").await;
    // From here its event loop is not polled: nothing reads its socket.
    let before = server.rss_kib();
    let mut publisher = client(port, "publisher").await;
    let payload = vec![7u8; 1 << 20];
    for _ in 0..100 {
        publisher
            .client
            .publish("feed/x", QoS::AtLeastOnce, false, payload.clone())
            .await
            .expect("publish");
    }
    // One connection's packets are handled in order: once this is
    // answered, the broker has routed all 100.
    assert_eq!(text(&publisher.call(&[b"GET", b"k"]).await), "$-1\r\n");
    let grown_mib = server.rss_kib().saturating_sub(before) / 1024;
    eprintln!("resident memory grew by {grown_mib} MiB for 100 MiB sent to a stalled subscriber");
    assert!(grown_mib < 48, "resident memory grew by {grown_mib} MiB");
    // It reads again: the messages held for it, and no more.
    let mut received = 0;
    while let Ok(event) = tokio::time::timeout(Duration::from_secs(3), eventloop.poll()).await {
        match event {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                assert_eq!(p.payload.len(), 1 << 20);
                received += 1;
            }
            Ok(_) => {}
            Err(e) => panic!("the subscriber: {e}"),
        }
    }
    assert!(
        (1..=10).contains(&received),
        "{received} of 100 messages were held for the stalled subscriber"
    );
    // The broker still serves, and the subscriber gets new messages.
    publisher
        .client
        .publish("feed/y", QoS::AtLeastOnce, false, b"small".to_vec())
        .await
        .expect("publish");
    let next = loop {
        match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => break p,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("the subscriber: {e}"),
            Err(_) => panic!("no message after the subscriber caught up"),
        }
    };
    assert_eq!(&next.payload[..], b"small");
}

/// End to end: 24 overwrites of a 1 MB value
/// under a 16 MiB memory cap once left a durable store unable to start
/// again (replay lowered up to 1,024 records into the guest at once). It
/// restarts after SIGKILL with the last value and serves; a byte quota that
/// cannot fit the memory cap is refused at start, with the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_capped_durable_store_restarts_after_large_overwrites() {
    let dir = std::env::temp_dir().join(format!("statestore-capped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.display().to_string();
    let args = ["--data-dir", data.as_str(), "--memory-mib", "16"];
    let port = free_port();
    let server = serve(port, &args);
    let mut c = client(port, "capped").await;
    let mut last = Vec::new();
    for i in 0..24u8 {
        last = vec![i; 1_000_000];
        assert_eq!(
            text(&c.call(&[b"SET", b"big", &last]).await),
            "+OK\r\n",
            "overwrite {i}"
        );
    }
    assert_eq!(text(&c.call(&[b"SET", b"small", b"s"]).await), "+OK\r\n");
    c.kill();
    server.kill9();
    let server = serve(port, &args);
    let mut c = client(port, "capped-again").await;
    let r = c.call(&[b"GET", b"big"]).await;
    assert!(r.payload == bulk(&last), "{} bytes", r.payload.len());
    assert_eq!(text(&c.call(&[b"GET", b"small"]).await), "$1\r\ns\r\n");
    assert_eq!(text(&c.call(&[b"SET", b"after", b"a"]).await), "+OK\r\n");
    let log = server.log();
    assert!(!log.contains("guest failed"), "{log}");
    drop(server);
    // A quota more than a third of the cap cannot fit: refused at start.
    let out = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--memory-mib", "16", "--max-bytes-mib", "8"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-bytes 8MiB is more than a third of --memory 16MiB"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client cannot make the broker keep its session longer than
/// `--max-session-expiry`: a client asking for an hour, gone for longer
/// than the cap, finds no session when it comes back (and one when it
/// comes back within the cap, so sessions are kept at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_is_cut_to_the_maximum() {
    use rumqttc::v5::mqttbytes::v5::{ConnAck, Packet};
    use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};

    async fn connect(port: u16, clean: bool) -> (AsyncClient, EventLoop, ConnAck) {
        let mut o = MqttOptions::new("sleeper", "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(30))
            .set_clean_start(clean)
            .set_session_expiry_interval(Some(3600));
        let (client, mut eventloop) = AsyncClient::new(o, 16);
        loop {
            match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
                Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => return (client, eventloop, ack),
                Ok(Ok(_)) => {}
                other => panic!("connect: {other:?}"),
            }
        }
    }
    async fn leave(client: AsyncClient, mut eventloop: EventLoop) {
        client.disconnect().await.expect("disconnect");
        while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), eventloop.poll()).await {
        }
    }

    let port = free_port();
    let _server = serve(port, &["--max-session-expiry", "2"]);
    let (client, mut eventloop, ack) = connect(port, true).await;
    if let Some(granted) = ack.properties.and_then(|p| p.session_expiry_interval) {
        assert!(granted <= 2, "the broker granted {granted} s");
    }
    subscribed(&client, &mut eventloop, "held/#").await;
    leave(client, eventloop).await;
    // Back within the cap: the session is there.
    let (client, eventloop, ack) = connect(port, false).await;
    assert!(ack.session_present, "no session kept at all");
    leave(client, eventloop).await;
    // Back after twice the cap (the client asked for an hour): gone.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_client, _eventloop, ack) = connect(port, false).await;
    assert!(
        !ack.session_present,
        "the session outlived --max-session-expiry 2"
    );
}

/// The broker no longer takes requests faster than the store
/// handles them. 48 SETs of 4 MiB (192 MiB) published at once, under
/// `--inbound-mib 4`: the publisher's connection is not read while 4 MiB
/// wait for the store, so the server's peak resident memory grows by far
/// less than what was sent (it took 286 MiB in 0.8 s before), and every
/// SET is answered +OK, in order, with the last value kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_publisher_waits_for_the_store() {
    let port = free_port();
    let server = serve(port, &["--no-memory-journal", "--inbound-mib", "4"]);
    let mut c = client(port, "fast").await;
    assert_eq!(text(&c.call(&[b"SET", b"warm", b"up"]).await), "+OK\r\n");
    let before = server.peak_rss_kib();
    let mut sent = Vec::new();
    for i in 0..48u8 {
        let value = vec![i; 4 << 20];
        let mut props = c.request_properties();
        props.message_expiry_interval = Some(300);
        sent.push(props.correlation_data.clone());
        c.publish_request(statestore_tests::resp(&[b"SET", b"big", &value]), props)
            .await;
    }
    for (n, corr) in sent.iter().enumerate() {
        let r = c
            .recv(Duration::from_secs(120))
            .await
            .unwrap_or_else(|| panic!("reply {n} of 48"));
        let got = r
            .properties
            .as_ref()
            .and_then(|p| p.correlation_data.clone());
        assert_eq!(got, *corr, "in order");
        assert_eq!(text(&r), "+OK\r\n");
    }
    let grown_mib = server.peak_rss_kib().saturating_sub(before) / 1024;
    eprintln!("peak resident memory grew by {grown_mib} MiB for 192 MiB of requests");
    assert!(
        grown_mib < 96,
        "peak resident memory grew by {grown_mib} MiB"
    );
    let r = c.call(&[b"GET", b"big"]).await;
    assert!(r.payload == bulk(&[47u8; 4 << 20]), "the last value");
}

/// `127.0.0.<n>`: another address of the loopback interface.
fn loopback(n: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, n])
}

/// Whether the server has closed `s` already (reads end at once).
fn is_closed(s: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match s.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Connections that never send a CONNECT are bounded per address (and in
/// all) from accept, and closed a short time after accept, with the
/// server's soft limit on open files at the usual 1,024: 1,100 idle
/// connections from one address hold at most 100 places, honest clients
/// connect meanwhile, and the idle ones (and one that sent half a CONNECT)
/// are all closed once --connect-timeout-secs has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_no_connect_are_bounded_and_closed() {
    use statestore_tests::raw_mqtt::{Connect, tcp_from};
    use tokio::io::AsyncWriteExt;
    let port = free_port();
    // The server raises its soft limit to the hard one at start.
    let mut c = Command::new("sh");
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-limits-test-cache"),
    )
    .args(["-c", "ulimit -Sn 1024 && exec \"$0\" \"$@\""])
    .arg(env!("CARGO_BIN_EXE_statestore"))
    .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
    .args(["--connect-timeout-secs", "3"]);
    let server = Server::spawn(c);
    // Ready: one client connects.
    client(port, "first").await.disconnect().await;
    let mut idle = Vec::new();
    for _ in 0..1_100 {
        match tcp_from(loopback(2), port).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connecting: {e}"),
        }
    }
    let mut half = tcp_from(loopback(3), port).await.expect("connect");
    let connect = Connect {
        client_id: "half",
        ..Connect::default()
    }
    .packet();
    half.write_all(&connect[..6]).await.expect("write");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open = idle.iter().filter(|s| !is_closed(s)).count();
    assert!(
        open <= 100,
        "{open} idle connections from one address still open"
    );
    // Honest clients are not locked out.
    let mut honest = client(port, "honest").await;
    assert_eq!(text(&honest.call(&[b"SET", b"k", b"v"]).await), "+OK\r\n");
    // Past the timeout, every connection without a CONNECT is closed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let open = idle.iter().filter(|s| !is_closed(s)).count();
    assert_eq!(open, 0, "idle connections outlived the connect timeout");
    assert!(is_closed(&half), "half a CONNECT outlived the timeout");
    assert_eq!(text(&honest.call(&[b"GET", b"k"]).await), "$1\r\nv\r\n");
    assert!(
        server.log().contains("raised the soft limit on open files")
            || server.log().contains("could not raise"),
        "{}",
        server.log()
    );
}

/// CONNACK reason codes.
const ACCEPTED: u8 = 0x00;
const BAD_PASSWORD: u8 = 0x86;
const QUOTA_EXCEEDED: u8 = 0x97;
const RATE_EXCEEDED: u8 = 0x9F;

/// Password guesses are bounded per address, not per connection: 40
/// guesses at once from one address get at most --max-failed-logins
/// judged, the rest (and then the right password too) are refused
/// unjudged with 0x9F; another address is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_guesses_are_bounded_per_address() {
    use statestore_tests::raw_mqtt::{Connect, connect_from};
    let dir = std::env::temp_dir().join(format!("statestore-guesses-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    std::fs::write(&users, statestore_tests::ALICE_SECRET).expect("users");
    let port = free_port();
    let metrics = free_port();
    let users_arg = users.to_string_lossy().to_string();
    let metrics_arg = format!("127.0.0.1:{metrics}");
    let _server = serve(
        port,
        &[
            "--users-file",
            &users_arg,
            "--max-failed-logins",
            "5",
            "--metrics",
            &metrics_arg,
        ],
    );
    // Ready (and a right password costs no guess).
    let ok = Connect {
        client_id: "alice-1",
        credentials: Some(("alice", "secret")),
        ..Connect::default()
    };
    let (code, _first) = connect_from(loopback(1), port, &ok).await.expect("connect");
    assert_eq!(code, ACCEPTED);
    let mut guesses = tokio::task::JoinSet::new();
    for i in 0..40 {
        guesses.spawn(async move {
            let id = format!("guess-{i}");
            let guess = Connect {
                client_id: &id,
                credentials: Some(("alice", "wrong")),
                ..Connect::default()
            };
            connect_from(loopback(2), port, &guess)
                .await
                .map(|(code, _)| code)
        });
    }
    let mut codes = Vec::new();
    while let Some(r) = guesses.join_next().await {
        codes.push(r.expect("task").expect("a CONNACK"));
    }
    let judged = codes.iter().filter(|&&c| c == BAD_PASSWORD).count();
    let unjudged = codes.iter().filter(|&&c| c == RATE_EXCEEDED).count();
    assert_eq!((judged, unjudged), (5, 35), "{codes:?}");
    // The right password from that address is not judged either.
    let (code, _) = connect_from(
        loopback(2),
        port,
        &Connect {
            client_id: "alice-2",
            ..ok.clone()
        },
    )
    .await
    .expect("connack");
    assert_eq!(code, RATE_EXCEEDED);
    // Another address logs in.
    let (code, _) = connect_from(
        loopback(3),
        port,
        &Connect {
            client_id: "alice-3",
            ..ok.clone()
        },
    )
    .await
    .expect("connack");
    assert_eq!(code, ACCEPTED);
    // Each unjudged CONNECT is counted.
    let (_, body) = statestore_tests::http_get(metrics, "/metrics");
    assert!(
        body.contains("statestore_broker_refused_total{reason=\"login_rate\"} 36"),
        "{body}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sessions, connected or parked, are bounded per address and in all, and
/// what parked sessions hold together is bounded: a session past a bound
/// is refused with 0x97 (resuming one's own is not), a session that ended
/// frees its place, and a message past --max-queued-total-mib is dropped
/// for the parked session it was for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_per_address_and_in_all() {
    use rumqttc::v5::mqttbytes::QoS;
    use statestore_tests::raw_mqtt::{Connect, connect_from};
    let port = free_port();
    let _server = serve(
        port,
        &[
            "--max-sessions-per-address",
            "3",
            "--max-sessions",
            "6",
            "--max-queued-total-mib",
            "1",
        ],
    );
    let parked = |id: &'static str| Connect {
        client_id: id,
        resume_for: Some(300),
        ..Connect::default()
    };
    // Three parked sessions from 127.0.0.2 (each connection dropped).
    for id in ["p1", "p2", "p3"] {
        let (code, s) = connect_from(loopback(2), port, &parked(id))
            .await
            .expect("connack");
        assert_eq!(code, ACCEPTED, "{id}");
        drop(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, _) = connect_from(loopback(2), port, &parked("p4"))
        .await
        .expect("connack");
    assert_eq!(code, QUOTA_EXCEEDED, "a fourth session from one address");
    let (code, _p1) = connect_from(loopback(2), port, &parked("p1"))
        .await
        .expect("connack");
    assert_eq!(code, ACCEPTED, "resuming its own session");
    // Two parked sessions on another address subscribed to big/t, and a
    // clean one: six in all.
    for id in ["q1", "q2"] {
        let mut c = RawClient::try_connect_persistent(port, id, None)
            .await
            .expect(id);
        c.subscribe("big/t").await;
        c.disconnect().await;
    }
    let (code, clean) = connect_from(
        loopback(4),
        port,
        &Connect {
            client_id: "c1",
            ..Connect::default()
        },
    )
    .await
    .expect("connack");
    assert_eq!(code, ACCEPTED);
    let (code, _) = connect_from(loopback(5), port, &parked("r1"))
        .await
        .expect("connack");
    assert_eq!(code, QUOTA_EXCEEDED, "a seventh session in all");
    // A clean session ends with its connection: its place is free.
    drop(clean);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, r1) = connect_from(
        loopback(5),
        port,
        &Connect {
            client_id: "r1",
            ..Connect::default()
        },
    )
    .await
    .expect("connack");
    assert_eq!(code, ACCEPTED);
    drop(r1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 600 KiB for each parked subscriber: 1 MiB in all holds one.
    let publisher = client(port, "publisher").await;
    publisher
        .client
        .publish("big/t", QoS::AtLeastOnce, false, vec![7u8; 600 << 10])
        .await
        .expect("publish");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = 0;
    for id in ["q1", "q2"] {
        let mut c = RawClient::try_connect_persistent(port, id, None)
            .await
            .expect(id);
        if c.recv(Duration::from_secs(2)).await.is_some() {
            got += 1;
        }
        c.disconnect().await;
    }
    assert_eq!(
        got, 1,
        "one parked session's message was dropped at the total bound"
    );
}
