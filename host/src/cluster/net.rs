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
use std::net::SocketAddr;
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
const HELLO_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(200)
} else {
    Duration::from_secs(5)
};

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
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accepting a replica link");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let secret = secret.clone();
        let events = events.clone();
        tokio::spawn(async move {
            if let Err(e) = inbound(stream, &secret, events).await {
                debug!(%from, error = %format!("{e:#}"), "replica link closed");
            }
        });
    }
}

async fn inbound(
    mut stream: TcpStream,
    secret: &[u8],
    events: mpsc::Sender<PeerEvent>,
) -> Result<()> {
    // The first frame is the hello, small, and soon.
    let first = tokio::time::timeout(HELLO_WAIT, async {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let len = u32::from_le_bytes(len) as usize;
        if !(9..=4096).contains(&len) {
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
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
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
