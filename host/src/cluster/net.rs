//! The links between replicas: TCP, one outbound connection per peer, each
//! opened with the cluster's secret (a peer without it is dropped before
//! anything it sends is read).
//!
//! ```text
//! frame = u32 length (of kind and body) | u8 kind | body
//!   0 hello     u64 sender id (0: an operator's tool), secret
//!   1 raft      a Raft message (protobuf)
//!   2 forward   u64 origin, batch (a follower's requests, for the leader to propose)
//!   3 status?   (empty)            4 status    text, `key=value` per line
//!   5 change?   text: `add <id> raft=<addr> [mqtt=<addr>]` or `remove <id>`
//!   6 change    text: `ok ...` or `error: ...`
//! ```
//!
//! Sending never waits: a frame for a peer whose queue is full is dropped
//! (Raft sends again), and the replica is told the peer is unreachable.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use protobuf::Message as _;
use raft::prelude::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

const HELLO: u8 = 0;
const RAFT: u8 = 1;
const FORWARD: u8 = 2;
const STATUS_REQUEST: u8 = 3;
const STATUS: u8 = 4;
const CHANGE_REQUEST: u8 = 5;
const CHANGE: u8 = 6;

/// The largest frame read (a snapshot of the whole state travels in one).
pub const MAX_FRAME: usize = 1 << 30;

/// How long a link may stay silent before its hello (then it is closed).
/// A replica and the operator's tools send it as soon as they connect.
const HELLO_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(200)
} else {
    Duration::from_secs(2)
};

/// Links that have not yet said their hello, at most: in all, and from
/// one address. One more is closed at once, so that idle connections to
/// the raft port cannot use up the process's file descriptors.
const PENDING_MAX: usize = if cfg!(test) { 16 } else { 128 };
const PENDING_PER_ADDRESS: usize = if cfg!(test) { 4 } else { 16 };

/// The largest hello frame: its kind, the sender id and the secret.
const HELLO_MAX: usize = 4096;

/// The longest secret a hello can carry.
pub const MAX_SECRET: usize = HELLO_MAX - 9;

/// Frames waiting for one peer, at most.
const QUEUE: usize = 4096;

/// What the links hand the replica.
#[derive(Debug)]
pub enum PeerEvent {
    /// A Raft message.
    Raft(Message),
    /// Requests a follower received, for the leader to propose.
    Forward {
        /// The replica that received them (it publishes the replies).
        origin: u64,
        /// In the guest's batch encoding.
        batch: Vec<u8>,
    },
    /// A peer could not be reached.
    Unreachable(u64),
    /// An operator asks for the replica's status.
    Status(oneshot::Sender<String>),
    /// An operator asks for a membership change (`cluster add`, `cluster
    /// remove`): the request's text, and where the answer goes.
    Change(String, oneshot::Sender<String>),
}

/// A frame to send.
#[derive(Debug)]
enum Frame {
    Raft(Message),
    Forward(u64, Vec<u8>),
}

/// The sending side: a queue per peer.
#[derive(Debug)]
pub struct Links {
    id: u64,
    secret: Vec<u8>,
    peers: HashMap<u64, mpsc::Sender<Frame>>,
    events: mpsc::Sender<PeerEvent>,
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.extend_from_slice(
        &u32::try_from(body.len() + 1)
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.push(kind);
    out.extend_from_slice(body);
    out
}

fn hello(id: u64, secret: &[u8]) -> Vec<u8> {
    let mut body = id.to_le_bytes().to_vec();
    body.extend_from_slice(secret);
    frame(HELLO, &body)
}

async fn read_frame(s: &mut (impl AsyncReadExt + Unpin)) -> Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        bail!("a frame of {len} bytes");
    }
    let mut kind = [0u8; 1];
    s.read_exact(&mut kind).await?;
    let mut body = vec![0u8; len - 1];
    s.read_exact(&mut body).await?;
    Ok(Some((kind[0], body)))
}

impl Links {
    /// Starts a link to each of `peers` (id, address) from replica `id`;
    /// what arrives is sent to `events`.
    pub fn start(
        id: u64,
        peers: &[(u64, SocketAddr)],
        secret: &[u8],
        events: mpsc::Sender<PeerEvent>,
    ) -> Links {
        let mut links = Links {
            id,
            secret: secret.to_vec(),
            peers: HashMap::new(),
            events,
        };
        for &(peer, addr) in peers {
            links.add(peer, addr);
        }
        links
    }

    /// Starts a link to `peer` at `addr` (none to itself; a link already
    /// there stays).
    pub fn add(&mut self, peer: u64, addr: SocketAddr) {
        if peer == self.id || self.peers.contains_key(&peer) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        self.peers.insert(peer, tx);
        tokio::spawn(outbound(
            self.id,
            peer,
            addr,
            self.secret.clone(),
            rx,
            self.events.clone(),
        ));
    }

    /// Stops the link to `peer`.
    pub fn remove(&mut self, peer: u64) {
        self.peers.remove(&peer);
    }

    /// The peers it links to.
    pub fn peers(&self) -> Vec<u64> {
        self.peers.keys().copied().collect()
    }

    /// Sends a Raft message (dropped if its peer's queue is full).
    pub fn send(&self, m: Message) {
        let to = m.to;
        self.queue(to, Frame::Raft(m));
    }

    /// Forwards requests to the leader.
    pub fn forward(&self, leader: u64, origin: u64, batch: Vec<u8>) {
        self.queue(leader, Frame::Forward(origin, batch));
    }

    fn queue(&self, to: u64, f: Frame) {
        let Some(tx) = self.peers.get(&to) else {
            debug!(
                peer = to,
                "a message for a replica with no link (not a member, or no address known)"
            );
            return;
        };
        if tx.try_send(f).is_err() {
            let _ = self.events.try_send(PeerEvent::Unreachable(to));
        }
    }
}

/// Keeps a connection to `peer` and writes its frames.
async fn outbound(
    id: u64,
    peer: u64,
    addr: SocketAddr,
    secret: Vec<u8>,
    mut rx: mpsc::Receiver<Frame>,
    events: mpsc::Sender<PeerEvent>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut logged = false;
    loop {
        let stream = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => {
                if !logged {
                    info!(peer, %addr, error = %e, "replica unreachable; retrying");
                    logged = true;
                }
                if rx.is_closed() {
                    return; // no longer a member
                }
                // What queued meanwhile is stale: Raft sends again.
                while rx.try_recv().is_ok() {}
                let _ = events.try_send(PeerEvent::Unreachable(peer));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if logged {
            info!(peer, %addr, "replica reachable again");
        }
        logged = false;
        backoff = Duration::from_millis(50);
        let mut w = BufWriter::new(stream);
        // The hello goes at once: a peer closes a link that says nothing
        // for 5 s, and a link between two followers may carry nothing
        // until an election (whose first votes would then be lost).
        if w.write_all(&hello(id, &secret)).await.is_err() || w.flush().await.is_err() {
            continue;
        }
        let failed = loop {
            let Some(f) = rx.recv().await else { return };
            let bytes = match f {
                Frame::Raft(m) => match m.write_to_bytes() {
                    Ok(b) => frame(RAFT, &b),
                    Err(e) => {
                        warn!(error = %e, "a Raft message that does not encode");
                        continue;
                    }
                },
                Frame::Forward(origin, batch) => {
                    let mut body = origin.to_le_bytes().to_vec();
                    body.extend_from_slice(&batch);
                    frame(FORWARD, &body)
                }
            };
            if let Err(e) = w.write_all(&bytes).await {
                break e;
            }
            // Write what is queued together, then flush once.
            if rx.is_empty()
                && let Err(e) = w.flush().await
            {
                break e;
            }
        };
        debug!(peer, error = %failed, "link to a replica broken; reconnecting");
        let _ = events.try_send(PeerEvent::Unreachable(peer));
    }
}

/// Accepts the links of the other replicas (and status requests) on
/// `listener`.
pub async fn accept(listener: TcpListener, secret: Vec<u8>, events: mpsc::Sender<PeerEvent>) {
    let pending = Arc::new(Mutex::new(Pending::default()));
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accepting a replica link");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(admitted) = Pending::admit(&pending, from.ip()) else {
            // Closed at once; said at most every 10 s.
            if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                warned = Some(std::time::Instant::now());
                warn!(%from, in_all = PENDING_MAX, per_address = PENDING_PER_ADDRESS, "raft port: too many links waiting for their hello; closing new ones");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let secret = secret.clone();
        let events = events.clone();
        tokio::spawn(async move {
            if let Err(e) = inbound(stream, &secret, events, admitted).await {
                debug!(%from, error = %format!("{e:#}"), "replica link closed");
            }
        });
    }
}

/// The links waiting for their hello, by address.
#[derive(Default)]
struct Pending {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// One link counted in [`Pending`] until it is dropped.
struct Admitted {
    pending: Arc<Mutex<Pending>>,
    ip: IpAddr,
}

impl Pending {
    fn admit(pending: &Arc<Mutex<Pending>>, ip: IpAddr) -> Option<Admitted> {
        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
        let from_ip = p.by_address.get(&ip).copied().unwrap_or(0);
        if p.total >= PENDING_MAX || from_ip >= PENDING_PER_ADDRESS {
            return None;
        }
        p.total += 1;
        p.by_address.insert(ip, from_ip + 1);
        Some(Admitted {
            pending: pending.clone(),
            ip,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.total -= 1;
        if let Some(n) = p.by_address.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                p.by_address.remove(&self.ip);
            }
        }
    }
}

async fn inbound(
    mut stream: TcpStream,
    secret: &[u8],
    events: mpsc::Sender<PeerEvent>,
    admitted: Admitted,
) -> Result<()> {
    // The first frame is the hello, small, and soon.
    let first = tokio::time::timeout(HELLO_WAIT, async {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let len = u32::from_le_bytes(len) as usize;
        if !(9..=HELLO_MAX).contains(&len) {
            bail!("not a hello");
        }
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await?;
        Ok(body)
    })
    .await
    .context("no hello in time")??;
    if first[0] != HELLO {
        bail!("not a hello");
    }
    let from = u64::from_le_bytes(first[1..9].try_into().expect("8"));
    use subtle::ConstantTimeEq as _;
    if !bool::from(first[9..].ct_eq(secret)) {
        warn!(
            claimed = from,
            "a replica link with the wrong secret: closed"
        );
        bail!("wrong secret");
    }
    drop(admitted);
    let (mut r, mut w) = stream.into_split();
    while let Some((kind, body)) = read_frame(&mut r).await? {
        let event = match kind {
            RAFT => PeerEvent::Raft(Message::parse_from_bytes(&body).context("a Raft message")?),
            FORWARD if body.len() >= 8 => PeerEvent::Forward {
                origin: u64::from_le_bytes(body[..8].try_into().expect("8")),
                batch: body[8..].to_vec(),
            },
            STATUS_REQUEST => {
                let (tx, rx) = oneshot::channel();
                if events.send(PeerEvent::Status(tx)).await.is_err() {
                    return Ok(());
                }
                let text = rx.await.unwrap_or_default();
                w.write_all(&frame(STATUS, text.as_bytes())).await?;
                w.flush().await?;
                continue;
            }
            CHANGE_REQUEST => {
                let (tx, rx) = oneshot::channel();
                let text = String::from_utf8_lossy(&body).into_owned();
                if events.send(PeerEvent::Change(text, tx)).await.is_err() {
                    return Ok(());
                }
                let text = rx.await.unwrap_or_default();
                w.write_all(&frame(CHANGE, text.as_bytes())).await?;
                w.flush().await?;
                continue;
            }
            k => bail!("a frame of unknown kind {k}"),
        };
        if events.send(event).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Asks the replica at `addr` for its status (`cluster status`).
pub async fn status(addr: SocketAddr, secret: &[u8]) -> Result<String> {
    ask(addr, secret, STATUS_REQUEST, b"", STATUS).await
}

/// Asks the replica at `addr` (the leader) for a membership change: its
/// answer, `ok ...` or `error: ...`.
pub async fn change(addr: SocketAddr, secret: &[u8], request: &str) -> Result<String> {
    ask(addr, secret, CHANGE_REQUEST, request.as_bytes(), CHANGE).await
}

/// An operator's question to the replica at `addr`, and its answer.
async fn ask(addr: SocketAddr, secret: &[u8], kind: u8, body: &[u8], answer: u8) -> Result<String> {
    let s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    ask_on(s, addr, secret, kind, body, answer).await
}

async fn ask_on(
    mut s: TcpStream,
    addr: SocketAddr,
    secret: &[u8],
    kind: u8,
    body: &[u8],
    answer: u8,
) -> Result<String> {
    s.write_all(&hello(0, secret)).await?;
    s.write_all(&frame(kind, body)).await?;
    s.flush().await?;
    match read_frame(&mut s).await? {
        Some((k, body)) if k == answer => Ok(String::from_utf8_lossy(&body).into_owned()),
        Some((k, _)) => bail!("{addr} answered with a frame of kind {k}"),
        None => bail!("{addr} closed the link (is the secret right?)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn listening() -> (SocketAddr, mpsc::Receiver<PeerEvent>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(accept(listener, b"the-right-secret-16".to_vec(), tx));
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
            Some(PeerEvent::Forward { origin, batch }) => {
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
        let mut links = Links::start(1, &[], b"the-right-secret-16", events);
        links.add(2, addr);
        links.add(1, addr); // itself: no link
        assert_eq!(links.peers(), [2]);
        tokio::time::sleep(HELLO_WAIT * 3).await;
        links.forward(2, 1, b"batch".to_vec());
        match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
            Ok(Some(PeerEvent::Forward { origin, batch })) => {
                assert_eq!((origin, &batch[..]), (1, &b"batch"[..]));
            }
            other => panic!("the first frame after a silence: {other:?}"),
        }
        links.remove(2);
        assert!(links.peers().is_empty());
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
        let asked = tokio::spawn(async move {
            ask_on(s, addr, b"the-right-secret-16", STATUS_REQUEST, b"", STATUS).await
        });
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
                connect_from([127, 0, 0, 1], addr).await,
                addr,
                b"the-right-secret-16",
                STATUS_REQUEST,
                b"",
                STATUS,
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
            connect_from([127, 0, 0, 100], addr).await,
            addr,
            b"the-right-secret-16",
            STATUS_REQUEST,
            b"",
            STATUS,
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
        let text = tokio::spawn(status(addr, b"the-right-secret-16"));
        match rx.recv().await {
            Some(PeerEvent::Status(reply)) => reply.send("id=1\n".into()).expect("reply"),
            other => panic!("{other:?}"),
        }
        assert_eq!(text.await.expect("join").expect("status"), "id=1\n");
    }
}
