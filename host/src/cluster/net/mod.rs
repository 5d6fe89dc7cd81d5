//! The links between replicas: TCP, one outbound connection per peer, each
//! opened with a hello naming its sender and holding the cluster's secret
//! (a peer without it is dropped before anything it sends is read).
//!
//! With the cluster's TLS (`tls_dir` in the cluster file, see [`super::pki`])
//! every link is mutual TLS 1.3 first: the side that connects checks the
//! other is the replica it dialled, the side that accepts checks the hello's
//! sender is the one the certificate names; so the secret crosses no wire
//! in clear, and nothing a listener saw can be replayed. Without it the
//! links are plain TCP, for loopback (the replica refuses other addresses).
//!
//! Either way a link speaks only for its sender: a Raft message whose
//! `from` is not the link's sender or whose `to` is not this replica, or a
//! forward from another origin, closes the link.
//!
//! ```text
//! frame = u32 length (of kind and body) | u8 kind | body
//!   0 hello     u64 sender id (0: an operator's tool), secret
//!   1 raft      a Raft message (protobuf)
//!   2 forward   u64 origin, batch (a follower's requests, for the leader to propose)
//!   3 status?   (empty)            4 status    text, `key=value` per line
//!   5 change?   text: `add <id> raft=<addr> [mqtt=<addr>]` or `remove <id>`
//!   6 change    text: `ok ...` or `error: ...`
//!   7 raft in   u32 group, a Raft message of that group (a partition, see
//!               `super::partition`; group 0's go as kind 1)
//!   8 forward in  u32 group, u64 origin, batch (group 0's go as kind 2)
//!   9 partitions  u32: the sender's store is in that many partitions (sent
//!               right after the hello by a replica with more than one)
//!  10 layout  u32 partitions, u64 tenants: the same, by a replica serving
//!               tenants (`--config`), with the fingerprint of their names
//!               in order (their groups' numbers follow that order); then
//!               `u64 placement` (below), and the names themselves:
//!               `u32 count`, per tenant `u8 length, name`
//!  11 change in  u32 group, text as kind 5: a membership change for that
//!               group's leader to propose (a replica of several groups
//!               changes each through its own leader)
//!  12 agent   u32 group, batch: what the sender's clients sent to a group
//!               the sender does not hold (requests, disconnects, its new
//!               life; every `via` the sender's), for a replica holding it
//!               to serve as its own clients' (see `super::placement`)
//!  13 shipped u32 group, outputs (`shipped`): replies and notifications of
//!               a group for the receiver's clients, from a replica holding it
//!  14 placement  the groups' moves the cluster agreed (`super::placement::
//!               Moves`, encoded): taken if newer than the receiver's
//! ```
//!
//! Kind 10 carries a third field, `u64 placement` (the fingerprint of where
//! the groups are; 0: everywhere), when the cluster file has `copies` below
//! its replicas or the replica serves tenants. With the tenants' names, two
//! replicas are linked when one's tenants are the other's first ones (the
//! cluster adds tenants while running: a replica started before an addition
//! names fewer, and numbers the groups it has alike).
//!
//! Replicas whose stores have different numbers of partitions would put a
//! key in different groups, and replicas with different tenants would put
//! a tenant's entries in another's group: a link between them is closed at
//! once (a replica takes a replica's link only if its first frame after
//! the hello names the same layout; none said is one partition and no
//! tenants).
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

use super::pki::Tls;

const HELLO: u8 = 0;
const RAFT: u8 = 1;
const FORWARD: u8 = 2;
const STATUS_REQUEST: u8 = 3;
const STATUS: u8 = 4;
const CHANGE_REQUEST: u8 = 5;
const CHANGE: u8 = 6;
const RAFT_IN: u8 = 7;
const FORWARD_IN: u8 = 8;
const PARTITIONS: u8 = 9;
const LAYOUT: u8 = 10;
const CHANGE_IN: u8 = 11;
const AGENT: u8 = 12;
const SHIPPED: u8 = 13;
const PLACEMENT: u8 = 14;

pub mod shipped;

/// The largest frame read (a snapshot of the whole state travels in one).
pub(crate) const MAX_FRAME: usize = 1 << 30;

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
pub(crate) const MAX_SECRET: usize = HELLO_MAX - 9;

/// Frames waiting for one peer, at most.
const QUEUE: usize = 4096;

/// The read buffer of an inbound link.
const READ_BUFFER: usize = 64 * 1024;

/// What the links hand the replica.
#[derive(Debug)]
pub(crate) enum PeerEvent {
    /// A Raft message of a group.
    Raft(u32, Message),
    /// Requests a follower received, for the leader to propose.
    Forward {
        /// The group (partition) they are for.
        group: u32,
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
    /// Another replica asks this one, as a group's leader, to propose a
    /// membership change in that group (the request's text).
    ChangeIn(u32, String),
    /// What a replica's clients sent to a group it does not hold, for this
    /// one (holding it) to serve as its agent.
    Agent {
        /// The group.
        group: u32,
        /// The replica whose clients sent it.
        from: u64,
        /// In the guest's batch encoding.
        batch: Vec<u8>,
    },
    /// Replies and notifications of a group this replica does not hold,
    /// for its clients.
    Shipped {
        /// The group.
        group: u32,
        /// The replica holding it that sent them.
        from: u64,
        /// The outputs, as the guest made them.
        outputs: Vec<crate::Output>,
    },
    /// The groups' moves a peer knows of.
    Placement {
        /// The peer.
        from: u64,
        /// The moves.
        moves: super::placement::Moves,
    },
}

/// Who an end of a link is, and what proves it: the id its hello names
/// (a replica's, or 0 for an operator's tool), the cluster's secret, and
/// its TLS when the cluster has it.
#[derive(Debug, Clone)]
pub struct Credentials {
    id: u64,
    secret: Arc<[u8]>,
    tls: Option<Arc<Tls>>,
    /// The partitions of its store (1 for an operator's tool).
    partitions: u32,
    /// The fingerprint of its tenants (0: none, the one store).
    tenants: u64,
    /// Its tenants' names, in order (none: the one store).
    names: Arc<[String]>,
    /// The fingerprint of where its cluster's groups are (0: every group
    /// on every replica).
    placement: u64,
}

impl Credentials {
    /// The credentials of `id` (with TLS, the certificate's).
    pub fn new(id: u64, secret: &[u8], tls: Option<Tls>) -> Credentials {
        Credentials {
            id: tls.as_ref().map_or(id, Tls::id),
            secret: secret.into(),
            tls: tls.map(Arc::new),
            partitions: 1,
            tenants: 0,
            names: Arc::new([]),
            placement: 0,
        }
    }

    /// The same, for a replica of a cluster whose groups are placed on
    /// some of its replicas, with that placement's fingerprint (0: every
    /// group on every replica).
    pub fn with_placement(self, placement: u64) -> Credentials {
        Credentials { placement, ..self }
    }

    /// The same, for a replica serving the tenants `names`, in order
    /// (at least one).
    pub fn with_tenants(self, names: &[String]) -> Credentials {
        Credentials {
            tenants: crate::cluster::node::fingerprint(names),
            names: names.into(),
            ..self
        }
    }

    /// The frame that says its store's layout right after its hello, if
    /// it has more than one partition or tenants.
    fn layout(&self) -> Option<Vec<u8>> {
        if self.tenants != 0 || self.placement != 0 {
            let mut body = self.partitions.to_le_bytes().to_vec();
            body.extend_from_slice(&self.tenants.to_le_bytes());
            if self.placement != 0 || !self.names.is_empty() {
                body.extend_from_slice(&self.placement.to_le_bytes());
            }
            if !self.names.is_empty() {
                body.extend_from_slice(&(self.names.len() as u32).to_le_bytes());
                for name in self.names.iter() {
                    // Names are at most 64 bytes (the config says so).
                    let name = &name.as_bytes()[..name.len().min(255)];
                    body.push(name.len() as u8);
                    body.extend_from_slice(name);
                }
            }
            return Some(frame(LAYOUT, &body));
        }
        (self.partitions > 1).then(|| frame(PARTITIONS, &self.partitions.to_le_bytes()))
    }

    /// The same, for a replica whose store is in `partitions` partitions.
    pub fn with_partitions(self, partitions: u32) -> Credentials {
        Credentials { partitions, ..self }
    }

    /// The id its hello names.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether its links are TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// A link's byte stream: TCP, or TLS on TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// How long opening a link (TCP, and the TLS handshake) may take: a peer
/// that accepts and then says nothing is tried again, not waited on.
const DIAL_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(5)
};

/// Opens a link to replica `peer` at `addr`.
async fn dial(addr: SocketAddr, peer: u64, who: &Credentials) -> Result<Box<dyn Io>> {
    let open = async {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = match &who.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(tls.connect(tcp, peer).await.with_context(|| {
                format!("{addr} (is it replica {peer}, with a certificate of this cluster's CA?)")
            })?),
        };
        Ok(stream)
    };
    tokio::time::timeout(DIAL_WAIT, open)
        .await
        .with_context(|| format!("{addr}: no link within {DIAL_WAIT:?}"))?
}

/// A frame to send.
#[derive(Debug)]
enum Frame {
    Raft(u32, Message),
    Forward(u32, u64, Vec<u8>),
    ChangeIn(u32, String),
    Agent(u32, Vec<u8>),
    Shipped(u32, Vec<u8>),
    Placement(Vec<u8>),
}

/// The sending side: a queue per peer.
#[derive(Debug)]
pub struct Links {
    who: Credentials,
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
    /// Starts a link to each of `peers` (id, address) from replica `who`;
    /// what arrives is sent to `events`.
    pub fn start(
        who: Credentials,
        peers: &[(u64, SocketAddr)],
        events: mpsc::Sender<PeerEvent>,
    ) -> Links {
        let mut links = Links {
            who,
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
        if peer == self.who.id || self.peers.contains_key(&peer) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        self.peers.insert(peer, tx);
        tokio::spawn(outbound(
            self.who.clone(),
            peer,
            addr,
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

    /// Sends a Raft message of `group` (dropped if its peer's queue is
    /// full).
    pub fn send(&self, group: u32, m: Message) {
        let to = m.to;
        self.queue(to, Frame::Raft(group, m));
    }

    /// Forwards requests of `group` to its leader.
    pub fn forward(&self, group: u32, leader: u64, origin: u64, batch: Vec<u8>) {
        self.queue(leader, Frame::Forward(group, origin, batch));
    }

    /// Asks `leader`, group `group`'s, to propose the membership change
    /// `request` (its text) in that group.
    pub fn change_in(&self, group: u32, leader: u64, request: String) {
        self.queue(leader, Frame::ChangeIn(group, request));
    }

    /// Sends `agent`, a replica holding group `group`, what this replica's
    /// clients sent to it (`batch`, the guest's encoding).
    pub fn agent(&self, group: u32, agent: u64, batch: Vec<u8>) {
        self.queue(agent, Frame::Agent(group, batch));
    }

    /// Sends `to` the outputs of group `group` for its clients (`outputs`,
    /// [`shipped::encode`]d).
    pub fn ship(&self, group: u32, to: u64, outputs: Vec<u8>) {
        self.queue(to, Frame::Shipped(group, outputs));
    }

    /// Tells `to` the groups' moves this replica knows of (`moves`,
    /// encoded).
    pub fn placement(&self, to: u64, moves: Vec<u8>) {
        self.queue(to, Frame::Placement(moves));
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
    who: Credentials,
    peer: u64,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Frame>,
    events: mpsc::Sender<PeerEvent>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut logged = false;
    loop {
        let stream = match dial(addr, peer, &who).await {
            Ok(s) => s,
            Err(e) => {
                if !logged {
                    // A TLS failure (another replica, or an impostor, at
                    // the address) is worth an operator's eye.
                    if who.tls() && format!("{e:#}").contains("TLS") {
                        warn!(peer, %addr, error = %format!("{e:#}"), "replica link refused; retrying");
                    } else {
                        info!(peer, %addr, error = %format!("{e:#}"), "replica unreachable; retrying");
                    }
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
        if logged {
            info!(peer, %addr, "replica reachable again");
        }
        logged = false;
        backoff = Duration::from_millis(50);
        let mut w = BufWriter::new(stream);
        // The hello goes at once: a peer closes a link that says nothing
        // for 5 s, and a link between two followers may carry nothing
        // until an election (whose first votes would then be lost).
        let layout = who.layout().unwrap_or_default();
        if w.write_all(&hello(who.id, &who.secret)).await.is_err()
            || w.write_all(&layout).await.is_err()
            || w.flush().await.is_err()
        {
            continue;
        }
        let failed = loop {
            let Some(f) = rx.recv().await else { return };
            let bytes = match f {
                Frame::Raft(group, m) => match m.write_to_bytes() {
                    Ok(b) if group == 0 => frame(RAFT, &b),
                    Ok(b) => frame(RAFT_IN, &[group.to_le_bytes().as_slice(), &b].concat()),
                    Err(e) => {
                        warn!(error = %e, "a Raft message that does not encode");
                        continue;
                    }
                },
                Frame::ChangeIn(group, text) => frame(
                    CHANGE_IN,
                    &[group.to_le_bytes().as_slice(), text.as_bytes()].concat(),
                ),
                Frame::Agent(group, batch) => {
                    frame(AGENT, &[group.to_le_bytes().as_slice(), &batch].concat())
                }
                Frame::Shipped(group, outputs) => frame(
                    SHIPPED,
                    &[group.to_le_bytes().as_slice(), &outputs].concat(),
                ),
                Frame::Placement(moves) => frame(PLACEMENT, &moves),
                Frame::Forward(group, origin, batch) => {
                    let mut body = Vec::with_capacity(12 + batch.len());
                    if group != 0 {
                        body.extend_from_slice(&group.to_le_bytes());
                    }
                    body.extend_from_slice(&origin.to_le_bytes());
                    body.extend_from_slice(&batch);
                    frame(if group == 0 { FORWARD } else { FORWARD_IN }, &body)
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
pub async fn accept(listener: TcpListener, who: Credentials, events: mpsc::Sender<PeerEvent>) {
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
        let who = who.clone();
        let events = events.clone();
        tokio::spawn(async move {
            if let Err(e) = inbound(stream, &who, events, admitted).await {
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
    tcp: TcpStream,
    me: &Credentials,
    events: mpsc::Sender<PeerEvent>,
    admitted: Admitted,
) -> Result<()> {
    // The handshake and the first frame, the hello (small), come soon.
    let (stream, from) = tokio::time::timeout(HELLO_WAIT, async {
        let (mut stream, cert): (Box<dyn Io>, _) = match &me.tls {
            None => (Box::new(tcp), None),
            Some(tls) => {
                let (s, cert) = tls.accept(tcp).await?;
                (Box::new(s), Some(cert))
            }
        };
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let len = u32::from_le_bytes(len) as usize;
        if !(9..=HELLO_MAX).contains(&len) {
            bail!("not a hello");
        }
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await?;
        if body[0] != HELLO {
            bail!("not a hello");
        }
        let from = u64::from_le_bytes(body[1..9].try_into().expect("8"));
        use subtle::ConstantTimeEq as _;
        if !bool::from(body[9..].ct_eq(&me.secret)) {
            warn!(
                claimed = from,
                "a replica link with the wrong secret: closed"
            );
            bail!("wrong secret");
        }
        if let Some(cert) = cert
            && !super::pki::holds(&cert, from)
        {
            warn!(
                claimed = from,
                "a replica link whose certificate names someone else: closed"
            );
            bail!("claims to be {from}, its certificate says otherwise");
        }
        Ok((stream, from))
    })
    .await
    .context("no hello in time")??;
    drop(admitted);
    // Frames come many at a time (a round's messages of every group): read
    // them from a buffer, not with three reads of the socket each.
    let mut stream = tokio::io::BufReader::with_capacity(READ_BUFFER, stream);
    let mut first = true;
    loop {
        let Some((kind, body)) = read_frame(&mut stream).await? else {
            return Ok(());
        };
        if std::mem::take(&mut first) && same_layout(kind, &body, from, me)? {
            continue; // its layout frame
        }
        // Group 0's frames carry no group (as before partitions).
        let (kind, group, body) = match kind {
            RAFT_IN | FORWARD_IN if body.len() >= 4 => (
                if kind == RAFT_IN { RAFT } else { FORWARD },
                u32::from_le_bytes(body[..4].try_into().expect("4")),
                &body[4..],
            ),
            RAFT_IN | FORWARD_IN => bail!("a frame of kind {kind} without its group"),
            _ => (kind, 0, &body[..]),
        };
        let event = match kind {
            RAFT => {
                let m = Message::parse_from_bytes(body).context("a Raft message")?;
                if m.from != from || m.to != me.id {
                    warn!(
                        link = from,
                        from = m.from,
                        to = m.to,
                        "a Raft message that is not from the link's replica to this one: link closed (two replicas at one address, or a forgery)"
                    );
                    bail!(
                        "a message from {} to {} on the link of {from}",
                        m.from,
                        m.to
                    );
                }
                PeerEvent::Raft(group, m)
            }
            FORWARD if body.len() >= 8 => {
                let origin = u64::from_le_bytes(body[..8].try_into().expect("8"));
                if origin != from || from == 0 {
                    warn!(
                        link = from,
                        origin, "requests forwarded on another replica's behalf: link closed"
                    );
                    bail!("a forward from {origin} on the link of {from}");
                }
                PeerEvent::Forward {
                    group,
                    origin,
                    batch: body[8..].to_vec(),
                }
            }
            AGENT if body.len() >= 4 && from != 0 => PeerEvent::Agent {
                group: u32::from_le_bytes(body[..4].try_into().expect("4")),
                from,
                batch: body[4..].to_vec(),
            },
            SHIPPED if body.len() >= 4 && from != 0 => PeerEvent::Shipped {
                group: u32::from_le_bytes(body[..4].try_into().expect("4")),
                from,
                outputs: shipped::decode(&body[4..]).context("shipped outputs")?,
            },
            PLACEMENT if from != 0 => PeerEvent::Placement {
                from,
                moves: super::placement::Moves::decode(body).context("a placement")?,
            },
            CHANGE_IN if body.len() >= 4 && from != 0 => PeerEvent::ChangeIn(
                u32::from_le_bytes(body[..4].try_into().expect("4")),
                String::from_utf8_lossy(&body[4..]).into_owned(),
            ),
            STATUS_REQUEST | CHANGE_REQUEST => {
                let (tx, rx) = oneshot::channel();
                let asked = if kind == STATUS_REQUEST {
                    PeerEvent::Status(tx)
                } else {
                    PeerEvent::Change(String::from_utf8_lossy(body).into_owned(), tx)
                };
                if events.send(asked).await.is_err() {
                    return Ok(());
                }
                let text = rx.await.unwrap_or_default();
                let answer = if kind == STATUS_REQUEST {
                    STATUS
                } else {
                    CHANGE
                };
                stream.write_all(&frame(answer, text.as_bytes())).await?;
                stream.flush().await?;
                continue;
            }
            k => bail!("a frame of unknown kind {k}"),
        };
        if events.send(event).await.is_err() {
            return Ok(());
        }
    }
}

/// The first frame after a link's hello: whether its sender's store has as
/// many partitions and the same tenants as `me`'s (see the top);
/// `Ok(true)` when the frame was the layout frame (nothing more to do with
/// it). An operator's tool need not say, and knows no tenants.
fn same_layout(kind: u8, body: &[u8], from: u64, me: &Credentials) -> Result<bool> {
    let mut names = None;
    let (partitions, tenants, placement) = match kind {
        PARTITIONS if body.len() == 4 => {
            (u32::from_le_bytes(body[..4].try_into().expect("4")), 0, 0)
        }
        PARTITIONS => bail!("a partitions frame of {} bytes", body.len()),
        LAYOUT if body.len() >= 12 && body.len() != 16 => {
            if body.len() > 20 {
                names = Some(layout_names(&body[20..])?);
            }
            (
                u32::from_le_bytes(body[..4].try_into().expect("4")),
                u64::from_le_bytes(body[4..12].try_into().expect("8")),
                body.get(12..20)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8"))),
            )
        }
        LAYOUT => bail!("a layout frame of {} bytes", body.len()),
        _ if from == 0 => (me.partitions, me.tenants, me.placement),
        _ => (1, 0, 0),
    };
    if from != 0 && placement != me.placement {
        warn!(
            peer = from,
            "a replica that places the groups elsewhere: link closed (every replica's cluster file must name the same replicas and `copies`)"
        );
        bail!("replica {from} places the groups elsewhere than this one");
    }
    if partitions != me.partitions {
        warn!(
            peer = from,
            theirs = partitions,
            ours = me.partitions,
            "a replica whose store has another number of partitions: link closed (every replica's cluster file must name the same `partitions`)"
        );
        bail!(
            "replica {from} has {partitions} partitions, this one {}",
            me.partitions
        );
    }
    let same_tenants = match &names {
        // One's tenants are the other's first ones: the cluster added
        // tenants since one of them started.
        Some(names) if !me.names.is_empty() => {
            let n = names.len().min(me.names.len());
            names[..n] == me.names[..n]
        }
        _ => tenants == me.tenants,
    };
    if from != 0 && !same_tenants {
        warn!(
            peer = from,
            "a replica serving other tenants: link closed (every replica serves the tenants the cluster was founded with, in their order, then those it added: `statestore cluster status` shows them; a new replica's --config must name them in that order)"
        );
        bail!("replica {from} serves other tenants than this one");
    }
    Ok(matches!(kind, PARTITIONS | LAYOUT))
}

/// The tenants' names a layout frame ends with (see the top).
fn layout_names(mut rest: &[u8]) -> Result<Vec<String>> {
    let Some((count, tail)) = rest.split_first_chunk::<4>() else {
        bail!("a layout frame's tenants cut short");
    };
    rest = tail;
    let count = u32::from_le_bytes(*count);
    let mut names = Vec::new();
    for _ in 0..count {
        let Some((&len, tail)) = rest.split_first() else {
            bail!("a layout frame's tenants cut short");
        };
        if tail.len() < len as usize {
            bail!("a layout frame's tenants cut short");
        }
        let (name, tail) = tail.split_at(len as usize);
        names.push(String::from_utf8_lossy(name).into_owned());
        rest = tail;
    }
    if !rest.is_empty() {
        bail!("a layout frame with {} bytes after its tenants", rest.len());
    }
    Ok(names)
}

/// Asks replica `peer` at `addr` for its status (`cluster status`).
pub async fn status(addr: SocketAddr, peer: u64, who: &Credentials) -> Result<String> {
    ask(addr, peer, who, STATUS_REQUEST, b"").await
}

/// Asks replica `peer` at `addr` (the leader) for a membership change: its
/// answer, `ok ...` or `error: ...`.
pub async fn change(
    addr: SocketAddr,
    peer: u64,
    who: &Credentials,
    request: &str,
) -> Result<String> {
    ask(addr, peer, who, CHANGE_REQUEST, request.as_bytes()).await
}

/// An operator's question to replica `peer` at `addr`, and its answer.
async fn ask(
    addr: SocketAddr,
    peer: u64,
    who: &Credentials,
    kind: u8,
    body: &[u8],
) -> Result<String> {
    let s = dial(addr, peer, who).await?;
    ask_on(s, addr, who, kind, body).await
}

async fn ask_on(
    mut s: Box<dyn Io>,
    addr: SocketAddr,
    who: &Credentials,
    kind: u8,
    body: &[u8],
) -> Result<String> {
    let answer = if kind == STATUS_REQUEST {
        STATUS
    } else {
        CHANGE
    };
    s.write_all(&hello(who.id, &who.secret)).await?;
    if let Some(layout) = who.layout() {
        s.write_all(&layout).await?;
    }
    s.write_all(&frame(kind, body)).await?;
    s.flush().await?;
    match read_frame(&mut s).await? {
        Some((k, body)) if k == answer => Ok(String::from_utf8_lossy(&body).into_owned()),
        Some((k, _)) => bail!("{addr} answered with a frame of kind {k}"),
        None => bail!("{addr} closed the link (is the secret right?)"),
    }
}

#[cfg(test)]
mod tests;
