use super::*;

const SECRET: &[u8] = b"the-right-secret-16";

/// Replica (or tool) `id` on plain links.
fn plain(id: u64) -> Credentials {
    Credentials::new(id, SECRET, None)
}

async fn listening() -> (SocketAddr, mpsc::Receiver<PeerEvent>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept(listener, plain(1), tx));
    (addr, rx)
}

async fn send(addr: SocketAddr, secret: &[u8], frames: &[Vec<u8>]) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&hello(2, secret)).await.expect("hello");
    for f in frames {
        let _ = s.write_all(f).await;
    }
    let _ = s.flush().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn forward_frame() -> Vec<u8> {
    let mut body = 2u64.to_le_bytes().to_vec();
    body.extend_from_slice(b"batch");
    frame(FORWARD, &body)
}

#[tokio::test]
async fn a_link_without_the_secret_is_not_read() {
    let (addr, mut rx) = listening().await;
    send(addr, b"a-wrong-secret-of-16", &[forward_frame()]).await;
    send(addr, b"", &[forward_frame()]).await;
    assert!(
        rx.try_recv().is_err(),
        "nothing from a peer without the secret"
    );
    send(addr, b"the-right-secret-16", &[forward_frame()]).await;
    match rx.recv().await {
        Some(PeerEvent::Forward {
            group: 0,
            origin,
            batch,
        }) => {
            assert_eq!((origin, &batch[..]), (2, &b"batch"[..]));
        }
        other => panic!("{other:?}"),
    }
}

/// A link that carries nothing for longer than a peer waits for a
/// hello (two followers, between elections) still delivers its first
/// frame: its hello went at once. (Sent with its first frame, it came
/// too late, the peer had closed the link, and the first votes of an
/// election were lost.)
#[tokio::test]
async fn a_link_silent_for_long_delivers_its_first_frame() {
    let (addr, mut rx) = listening().await;
    let (events, _own) = mpsc::channel(16);
    let mut links = Links::start(plain(1), &[], events);
    links.add(2, addr);
    links.add(1, addr); // itself: no link
    assert_eq!(links.peers(), [2]);
    tokio::time::sleep(HELLO_WAIT * 3).await;
    links.forward(0, 2, 1, b"batch".to_vec());
    match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
        Ok(Some(PeerEvent::Forward {
            group: 0,
            origin,
            batch,
        })) => {
            assert_eq!((origin, &batch[..]), (1, &b"batch"[..]));
        }
        other => panic!("the first frame after a silence: {other:?}"),
    }
    links.remove(2);
    assert!(links.peers().is_empty());
}

/// Frames of a partition's group arrive tagged with it; group 0's as
/// before partitions.
#[tokio::test]
async fn frames_carry_their_group() {
    let (addr, mut rx) = listening().await;
    let (events, _own) = mpsc::channel(16);
    let links = Links::start(plain(2), &[(1, addr)], events);
    let mut m = Message::default();
    (m.from, m.to, m.term) = (2, 1, 3);
    links.send(5, m.clone());
    links.forward(7, 1, 2, b"in seven".to_vec());
    links.send(0, m);
    let mut got = Vec::new();
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
            Ok(Some(PeerEvent::Raft(group, m))) => got.push(format!("raft {group} {}", m.term)),
            Ok(Some(PeerEvent::Forward {
                group,
                origin,
                batch,
            })) => got.push(format!(
                "forward {group} {origin} {}",
                String::from_utf8_lossy(&batch)
            )),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, ["raft 5 3", "forward 7 2 in seven", "raft 0 3"]);
}

/// Replicas whose stores have other numbers of partitions put a key in
/// other groups, and replicas serving other tenants (or the same in
/// another order) put a tenant's entries in another's group: no link
/// between them carries anything; the same layout does (tenants: one's
/// the other's first ones, the cluster having added some since one
/// started), and an operator's tool (which knows no tenants) asks any of
/// them.
#[tokio::test]
async fn replicas_with_other_layouts_are_not_linked() {
    // (our partitions, tenants and placement, theirs, linked)
    for ((ours, our_tenants, our_place), (theirs, their_tenants, their_place), linked) in [
        ((4, 0, 0), (4, 0, 0), true),
        ((4, 0, 0), (2, 0, 0), false),
        ((4, 0, 0), (1, 0, 0), false),
        ((1, 0, 0), (2, 0, 0), false),
        ((1, 0, 0), (1, 0, 0), true),
        ((1, 7, 0), (1, 7, 0), true),
        ((1, 7, 0), (1, 8, 0), false),
        ((1, 7, 0), (1, 0, 0), false),
        ((1, 0, 0), (1, 7, 0), false),
        ((1, 7, 0), (1, 6, 0), true),
        ((1, 6, 0), (1, 7, 0), true),
        ((1, 6, 0), (1, 5, 0), true),
        ((1, 5, 0), (1, 7, 0), false),
        ((2, 7, 0), (2, 7, 0), true),
        ((2, 7, 0), (1, 7, 0), false),
        ((4, 0, 9), (4, 0, 9), true),
        ((4, 7, 9), (4, 7, 9), true),
        ((4, 7, 9), (4, 6, 9), true),
        ((4, 0, 9), (4, 0, 8), false),
        ((4, 0, 9), (4, 0, 0), false),
        ((4, 0, 0), (4, 0, 9), false),
    ] {
        let case =
            format!("{ours}/{our_tenants}/{our_place} vs {theirs}/{their_tenants}/{their_place}");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, mut rx) = mpsc::channel(16);
        // Tenants: 7 names a, b; 8 b, a; 6 a; 5 a, c; 0 none.
        let tenants = |n: u64| -> Vec<String> {
            let list: &[&str] = match n {
                7 => &["a", "b"],
                8 => &["b", "a"],
                6 => &["a"],
                5 => &["a", "c"],
                _ => &[],
            };
            list.iter().map(|s| (*s).to_string()).collect()
        };
        let with = |c: Credentials, n: u64| {
            if n == 0 {
                c
            } else {
                c.with_tenants(&tenants(n))
            }
        };
        let us = with(plain(1).with_partitions(ours), our_tenants).with_placement(our_place);
        let accepting = tokio::spawn(accept(listener, us, tx));
        let (events, _own) = mpsc::channel(16);
        let them =
            with(plain(2).with_partitions(theirs), their_tenants).with_placement(their_place);
        let links = Links::start(them, &[(1, addr)], events);
        let mut m = Message::default();
        (m.from, m.to, m.term) = (2, 1, 3);
        links.send(0, m);
        let got = tokio::time::timeout(Duration::from_millis(700), rx.recv()).await;
        match got {
            Ok(Some(PeerEvent::Raft(0, m))) => assert!(linked, "{case}: {m:?}"),
            Err(_) => assert!(!linked, "{case}: nothing arrived"),
            other => panic!("{case}: {other:?}"),
        }
        if ours > 1 || our_tenants != 0 {
            // A tool that says its file's count, and one that does not.
            let tool = if theirs == ours {
                plain(0).with_partitions(ours)
            } else {
                plain(0)
            };
            let asking = tokio::spawn(async move { status(addr, 1, &tool).await });
            match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
                Ok(Some(PeerEvent::Status(reply))) => reply.send("id=1\n".into()).expect("reply"),
                other => panic!("{case}: an operator's status request: {other:?}"),
            }
            assert_eq!(asking.await.expect("task").expect("status"), "id=1\n");
        }
        accepting.abort();
    }
}

/// Connects to `addr` from the loopback address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    socket.connect(addr).await.expect("connect")
}

/// A status request from `from`, answered by the test as the replica.
async fn status_from(
    from: [u8; 4],
    addr: SocketAddr,
    rx: &mut mpsc::Receiver<PeerEvent>,
) -> Result<String> {
    let s = connect_from(from, addr).await;
    let asked =
        tokio::spawn(
            async move { ask_on(Box::new(s), addr, &plain(0), STATUS_REQUEST, b"").await },
        );
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(PeerEvent::Status(reply))) => reply.send("id=1\n".into()).expect("reply"),
        Ok(other) => panic!("{other:?}"),
        Err(_) => {} // never asked: the link was closed
    }
    asked.await.expect("join")
}

#[tokio::test]
async fn links_waiting_for_their_hello_are_bounded() {
    let (addr, mut rx) = listening().await;
    // PENDING_PER_ADDRESS idle links from one address: one more from it
    // is closed unread, one from elsewhere is served.
    let mut idle = Vec::new();
    for _ in 0..PENDING_PER_ADDRESS {
        idle.push(connect_from([127, 0, 0, 1], addr).await);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let refused = tokio::time::timeout(
        HELLO_WAIT / 2,
        ask_on(
            Box::new(connect_from([127, 0, 0, 1], addr).await),
            addr,
            &plain(0),
            STATUS_REQUEST,
            b"",
        ),
    )
    .await
    .expect("closed at once, not after the hello wait");
    assert!(
        refused.is_err(),
        "a link past the per-address bound was served"
    );
    assert!(rx.try_recv().is_err());
    let served = status_from([127, 0, 0, 2], addr, &mut rx).await;
    assert_eq!(served.expect("another address is served"), "id=1\n");

    // In all: fill the bound from other addresses.
    for host in 3..(3 + (PENDING_MAX / PENDING_PER_ADDRESS) as u8) {
        for _ in 0..PENDING_PER_ADDRESS {
            idle.push(connect_from([127, 0, 0, host], addr).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let refused = ask_on(
        Box::new(connect_from([127, 0, 0, 100], addr).await),
        addr,
        &plain(0),
        STATUS_REQUEST,
        b"",
    )
    .await;
    assert!(refused.is_err(), "a link past the bound in all was served");
    // The silent ones are closed after HELLO_WAIT: room again.
    drop(idle);
    tokio::time::sleep(HELLO_WAIT).await;
    let served = status_from([127, 0, 0, 100], addr, &mut rx).await;
    assert_eq!(served.expect("served once the idle links went"), "id=1\n");
}

#[tokio::test]
async fn bad_frames_close_the_link_and_nothing_else() {
    let (addr, mut rx) = listening().await;
    let oversized = (u32::MAX).to_le_bytes().to_vec();
    let unknown = frame(99, b"x");
    let not_raft = frame(RAFT, &[0xff; 7]);
    for bad in [oversized, unknown, not_raft] {
        send(addr, b"the-right-secret-16", &[bad, forward_frame()]).await;
    }
    assert!(
        rx.try_recv().is_err(),
        "a link is closed at its first bad frame"
    );
    // The listener still takes links.
    let text = tokio::spawn(async move { status(addr, 1, &plain(0)).await });
    match rx.recv().await {
        Some(PeerEvent::Status(reply)) => reply.send("id=1\n".into()).expect("reply"),
        other => panic!("{other:?}"),
    }
    assert_eq!(text.await.expect("join").expect("status"), "id=1\n");
}

/// A raft message from `from` to `to`.
fn raft_frame(from: u64, to: u64) -> Vec<u8> {
    let m = Message {
        from,
        to,
        term: 7,
        ..Default::default()
    };
    frame(RAFT, &m.write_to_bytes().expect("encode"))
}

#[tokio::test]
async fn a_plain_link_speaks_only_for_the_replica_its_hello_names() {
    let (addr, mut rx) = listening().await;
    // The hello says 2: a message from 3, one for 2, or requests
    // forwarded for 3 close the link.
    for bad in [raft_frame(3, 1), raft_frame(2, 2), {
        let mut body = 3u64.to_le_bytes().to_vec();
        body.extend_from_slice(b"batch");
        frame(FORWARD, &body)
    }] {
        send(addr, SECRET, &[bad, forward_frame()]).await;
    }
    assert!(
        rx.try_recv().is_err(),
        "a link is closed at its first forgery"
    );
    send(addr, SECRET, &[raft_frame(2, 1)]).await;
    match rx.recv().await {
        Some(PeerEvent::Raft(0, m)) => assert_eq!((m.from, m.to, m.term), (2, 1, 7)),
        other => panic!("{other:?}"),
    }
}

/// The cluster's certificates for replicas 1, 2 and 3, in a new
/// directory; and a second CA's for replica 2.
fn pki(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let base = std::env::temp_dir().join(format!("statestore-net-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (ours, theirs) = (base.join("ours"), base.join("theirs"));
    super::super::pki::make(&ours, &[1, 2, 3]).expect("pki");
    super::super::pki::make(&theirs, &[2]).expect("another pki");
    (ours, theirs)
}

fn tls(dir: &std::path::Path, id: u64) -> Credentials {
    Credentials::new(id, SECRET, Some(Tls::load(dir, id).expect("load")))
}

/// Replica 1 on TLS links, listening.
async fn listening_tls(dir: &std::path::Path) -> (SocketAddr, mpsc::Receiver<PeerEvent>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept(listener, tls(dir, 1), tx));
    (addr, rx)
}

/// Opens a TLS link to `addr` as `who` (whose hello may claim another
/// id) and sends `frames`.
async fn send_tls(addr: SocketAddr, who: &Credentials, claim: u64, frames: &[Vec<u8>]) {
    let Ok(mut s) = dial(addr, 1, who).await else {
        return;
    };
    let _ = s.write_all(&hello(claim, &who.secret)).await;
    for f in frames {
        let _ = s.write_all(f).await;
    }
    let _ = s.flush().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn tls_links_take_only_the_replica_a_certificate_of_the_cluster_names() {
    let (ours, theirs) = pki("accept");
    let (addr, mut rx) = listening_tls(&ours).await;
    // Replica 2's certificate claiming to be 3; another CA's replica 2;
    // plain TCP with the right secret: nothing read.
    send_tls(addr, &tls(&ours, 2), 3, &[raft_frame(3, 1)]).await;
    send_tls(addr, &tls(&theirs, 2), 2, &[raft_frame(2, 1)]).await;
    send(addr, SECRET, &[raft_frame(2, 1)]).await;
    // Replica 2 forging a message of 3's.
    send_tls(addr, &tls(&ours, 2), 2, &[raft_frame(3, 1)]).await;
    assert!(
        rx.try_recv().is_err(),
        "nothing from a link that is not who it says"
    );
    // Replica 2 as itself.
    send_tls(
        addr,
        &tls(&ours, 2),
        2,
        &[raft_frame(2, 1), forward_frame()],
    )
    .await;
    match rx.recv().await {
        Some(PeerEvent::Raft(0, m)) => assert_eq!((m.from, m.to), (2, 1)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        rx.recv().await,
        Some(PeerEvent::Forward { origin: 2, .. })
    ));
    // The operator's tools ask, and are answered; not the other CA's.
    for (who, answered) in [(tls(&ours, 0), true), (tls(&theirs, 0), false)] {
        let asked = tokio::spawn(async move { status(addr, 1, &who).await });
        if answered {
            match rx.recv().await {
                Some(PeerEvent::Status(reply)) => reply.send("id=1\n".into()).expect("reply"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(asked.await.expect("join").is_ok(), answered);
    }
    std::fs::remove_dir_all(ours.parent().expect("base")).ok();
}

/// Accepts one connection at `listener` and returns what it sent in
/// `wait` (for a peer that connects, then sends).
async fn record(listener: TcpListener, wait: Duration) -> Vec<u8> {
    let (mut s, _) = listener.accept().await.expect("accept");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut got)).await;
    got
}

#[tokio::test]
async fn a_replica_sends_nothing_to_whoever_holds_a_peers_address_and_what_it_sent_cannot_be_replayed()
 {
    let (ours, _) = pki("dial");
    // An impostor with a certificate of the cluster, but replica 3's,
    // on replica 2's address: replica 1's link never gets past the
    // handshake, so it delivers nothing.
    let (impostor, mut impostor_rx) = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(accept(listener, tls(&ours, 3), tx));
        (addr, rx)
    };
    let (events, _own) = mpsc::channel(16);
    let mut links = Links::start(tls(&ours, 1), &[], events);
    links.add(2, impostor);
    links.forward(0, 2, 1, b"batch".to_vec());
    tokio::time::sleep(Duration::from_millis(300)).await;
    links.forward(0, 2, 1, b"batch".to_vec());
    assert!(
        tokio::time::timeout(Duration::from_millis(500), impostor_rx.recv())
            .await
            .is_err(),
        "a link delivered to a replica that is not its peer"
    );
    links.remove(2);

    // A listener that records: what replica 1 sends replica 2 holds no
    // secret (TLS from the first byte).
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let recorder = listener.local_addr().expect("addr");
    let recorded = tokio::spawn(record(listener, Duration::from_millis(500)));
    links.add(2, recorder);
    links.forward(0, 2, 1, b"batch".to_vec());
    let bytes = recorded.await.expect("join");
    assert!(!bytes.is_empty(), "the link connected");
    assert!(
        !bytes.windows(SECRET.len()).any(|w| w == SECRET),
        "the secret crossed the wire"
    );

    // What a real replica 2 sent to replica 1 (recorded on the way),
    // replayed to replica 1, is not read.
    let (addr, mut rx) = listening_tls(&ours).await;
    let tap = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let tap_addr = tap.local_addr().expect("addr");
    let tapped = tokio::spawn(async move {
        let (mut from, _) = tap.accept().await.expect("accept");
        let mut to = TcpStream::connect(addr).await.expect("connect");
        let (mut fr, mut fw) = from.split();
        let (mut tr, mut tw) = to.split();
        let mut sent = Vec::new();
        let (mut up, mut down) = ([0u8; 4096], [0u8; 4096]);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(800);
        loop {
            tokio::select! {
                n = fr.read(&mut up) => match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => { sent.extend_from_slice(&up[..n]); let _ = tw.write_all(&up[..n]).await; }
                },
                n = tr.read(&mut down) => match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => { let _ = fw.write_all(&down[..n]).await; }
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        sent
    });
    let (events, _own2) = mpsc::channel(16);
    let mut two = Links::start(tls(&ours, 2), &[], events);
    two.add(1, tap_addr);
    two.forward(0, 1, 2, b"batch".to_vec());
    match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
        Ok(Some(PeerEvent::Forward { origin: 2, .. })) => {}
        other => panic!("through the tap: {other:?}"),
    }
    let sent = tapped.await.expect("join");
    two.remove(2);
    let mut replay = TcpStream::connect(addr).await.expect("connect");
    let _ = replay.write_all(&sent).await;
    let _ = replay.flush().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "a replayed link was read"
    );
    std::fs::remove_dir_all(ours.parent().expect("base")).ok();
}

/// A peer that takes the connection and never answers the handshake
/// (a hung process, a black hole) is given up on in time, and tried
/// again: the link does not wait on it for ever.
#[tokio::test]
async fn a_silent_peer_is_given_up_on_in_time() {
    let (ours, _) = pki("silent");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s); // accepted, never read
        }
    });
    let started = std::time::Instant::now();
    let e = dial(addr, 2, &tls(&ours, 1)).await.err().expect("no link");
    assert!(started.elapsed() < DIAL_WAIT * 3, "{:?}", started.elapsed());
    assert!(format!("{e:#}").contains("no link within"), "{e:#}");
    held.abort();
    std::fs::remove_dir_all(ours.parent().expect("base")).ok();
}
