//! One replica as a server: its [`Replica`] over a log in its data
//! directory, the links to its peers, and the MQTT transport its clients
//! use (the embedded broker or an external one), driven by one loop:
//!
//! ```text
//!   transport (requests, client gone) ──> leader? propose : forward to the leader
//!   peer links (Raft messages, forwarded requests, status) ──> step / propose
//!   tick (50 ms) ──> Raft tick; the leader proposes expiry when the guest is due
//!   after each: ready() ──> persist, send to peers, apply; publish what is ours
//! ```
//!
//! What is ours to publish: the replies to requests this replica received
//! (the entry's origin), and in the embedded mode every notification (the
//! broker delivers it only if the observer's session is here).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use statestore_guest::wire;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use super::file::{ClusterFile, ReadPath, ReplicaEntry};
use super::net::{Links, PeerEvent};
use super::{Compaction, Durability, LogStore, Replica, Timing};
use crate::clock::Clock;
use crate::driver::{Input as TransportInput, Transport};
use crate::journal::Fsync;
use crate::{Backend as _, Config, InboundMessage, Input, Output, PublishKind, Runtime, WasmStore};

/// A tick of a replica's Raft clock.
pub const TICK: Duration = Duration::from_millis(50);

/// Raft timing, in ticks: heartbeats every 100 ms, elections after 0.5 to
/// 1 s without a leader.
pub const TIMING: Timing = Timing {
    heartbeat: 2,
    election_min: 10,
    election_max: 20,
};

/// How long requests wait for a leader before they get a 503.
pub const HOLD: Duration = Duration::from_secs(5);

/// The most bytes of requests held while there is no leader.
const HOLD_BYTES: usize = 64 << 20;

/// How long a request sent to the leader is kept to be sent again if the
/// leader changes before it is applied.
const RESEND_WITHIN: Duration = Duration::from_secs(10);

/// The most bytes of requests kept for that.
const RESEND_BYTES: usize = 64 << 20;

/// How long a request sent to the leader waits to be applied before it is
/// sent again to the same leader (a forward lost with a broken link, or
/// refused by a leader about to step down): until [`RESEND_WITHIN`].
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The most client disconnects kept to be reported again to a new leader.
const GONE_KEPT: usize = 100_000;

/// How long reads wait for their read index before they go through the
/// log instead (the leader changed, or has not committed in its term yet).
const READ_WAIT: Duration = Duration::from_millis(500);

/// The most bytes of reads waiting for a read index (more go through the log).
const READ_BYTES: usize = 64 << 20;

/// Who publishes notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    /// Every replica hands every notification to its embedded broker,
    /// which delivers it if the observer's session is there.
    Everywhere,
    /// The replica that received the request publishes them (through an
    /// external broker, which routes them).
    Origin,
}

/// Requests waiting for a leader.
enum Held {
    Requests(Instant, Vec<InboundMessage>),
    Gone(Instant, String),
    /// This replica's new life: the registrations its earlier lives'
    /// connections made go (the guest's `replica-started`).
    Started(Instant),
}

/// A request sent to the leader, until it is applied.
struct Tracked {
    /// When it was first sent.
    at: Instant,
    /// When it was last sent.
    sent: Instant,
    message: InboundMessage,
}

/// Reads waiting for their read index.
struct PendingRead {
    at: Instant,
    messages: Vec<InboundMessage>,
    /// `messages` in the guest's encoding.
    batch: Vec<u8>,
    bytes: usize,
}

/// One replica, ready to serve.
pub struct Node {
    replica: Replica<WasmStore>,
    links: Links,
    events: mpsc::Receiver<PeerEvent>,
    clock: Arc<dyn Clock>,
    config: Config,
    fsync: Fsync,
    notify: Notify,
    held: VecDeque<Held>,
    held_bytes: usize,
    last_timer: Option<Instant>,
    /// The members, with their addresses (from the cluster file, or the
    /// record they were added with).
    replicas: Vec<ReplicaEntry>,
    /// The replicas of the cluster file.
    file_replicas: Vec<ReplicaEntry>,
    /// The replica's membership changes already reflected in `replicas`
    /// and the links.
    changes_seen: Option<u64>,
    accept: tokio::task::JoinHandle<()>,
    /// The leader and term last seen: a new one (the same replica elected
    /// again in a new term included) gets the requests not yet applied.
    leader_seen: (u64, u64),
    /// Requests proposed or forwarded and not yet applied, by response
    /// topic and correlation data: sent again to a new leader (a leader
    /// that dies or steps down loses what it had not committed), and to
    /// the same one after [`RETRY_AFTER`]. The replicated dedup cache
    /// answers one applied twice with its first reply.
    unapplied: HashMap<(String, Vec<u8>), Tracked>,
    unapplied_bytes: usize,
    /// Clients whose disconnect this replica reported (proposed or
    /// forwarded) in the last [`RESEND_WITHIN`], and that have sent nothing
    /// through it since: reported again to a new leader (a leader that
    /// dies loses what it had not committed). Safe to apply twice: it drops
    /// only what the client registered through this replica, and it has
    /// registered nothing here since.
    gone: HashMap<String, Instant>,
    /// How many of `unapplied` each response topic has: a read on a topic
    /// with a write in flight goes through the log behind it, so that a
    /// client reads its own writes even when it does not wait for them.
    unapplied_topics: HashMap<String, usize>,
    read_path: ReadPath,
    /// Reads waiting for their read index, by context.
    reads: HashMap<u64, PendingRead>,
    reads_bytes: usize,
    /// When `unapplied` was last rid of what is too old.
    forgot: Instant,
    /// The next read context: a random start, so that one from before a
    /// restart, still queued at the leader, is never taken for a new one.
    next_read: u64,
    metrics: Option<crate::metrics::ReplicaMetrics>,
    /// The store's own metrics, as one process keeps them for its tenant
    /// (`default`): requests taken here, replies and notifications
    /// published here, the latency of this replica's requests, the guest's
    /// sizes, the Raft log as its journal.
    store_metrics: Option<crate::metrics::TenantMetrics>,
    /// Where this replica's clients are connected, in its guest's terms:
    /// each request carries it, so that a KEYNOTIFY registration
    /// remembers it, and a disconnect this replica reports drops only what
    /// was registered through it (embedded mode; `None` through an
    /// external broker, whose client events are nobody's in particular).
    via: Option<statestore_guest::Via>,
    /// Asks the others who the members are while no leader is known.
    probe: super::probe::Probe,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens replica `file.id`: its log (recovered from its data
    /// directory), its guest (from the last snapshot, then the log), its
    /// listener for peers. `config` is the guest's, the same on every
    /// replica (its hash seed from [`ClusterFile::hash_seed`]).
    pub async fn open(
        file: &ClusterFile,
        runtime: Runtime,
        config: Config,
        fsync: Fsync,
        clock: Arc<dyn Clock>,
        notify: Notify,
    ) -> Result<Node> {
        let secret = file.secret()?;
        let disk = crate::storage::DirStorage::open(&file.data_dir).with_context(|| {
            format!("cannot open the data directory {}", file.data_dir.display())
        })?;
        let voters: Vec<u64> = if file.join {
            Vec::new()
        } else {
            file.replicas.iter().map(|r| r.id).collect()
        };
        let disk: Arc<dyn crate::storage::Storage> = Arc::new(disk);
        let log = LogStore::open(disk.clone(), &voters)?;
        let life = new_life(&*disk, clock.now_ms())?;
        let make_config = config.clone();
        let make = Box::new(move |snapshot: Option<&[u8]>| match snapshot {
            None => runtime.instantiate(&make_config),
            Some(s) => runtime.restore(&make_config, s),
        });
        let durability = match fsync {
            Fsync::Always => Durability::Always,
            Fsync::Everysec | Fsync::No => Durability::Later,
        };
        let started = Instant::now();
        let replica = Replica::new(
            file.id,
            log,
            make,
            TIMING,
            durability,
            Compaction::default(),
        )?;
        let me = file.me();
        let listener = TcpListener::bind(me.raft)
            .await
            .with_context(|| format!("cannot listen for replicas on {} (in use?)", me.raft))?;
        let (tx, events) = mpsc::channel(4096);
        let accept = tokio::spawn(super::net::accept(listener, secret.clone(), tx.clone()));
        let peers: Vec<(u64, SocketAddr)> = file.replicas.iter().map(|r| (r.id, r.raft)).collect();
        let links = Links::start(file.id, &peers, &secret, tx);
        let status = replica.status();
        info!(
            replica = file.id,
            replicas = file.replicas.len(),
            raft = %me.raft,
            data_dir = %file.data_dir.display(),
            term = status.term,
            snapshot = status.snapshot,
            last_index = status.last_index,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "replica started"
        );
        Ok(Node {
            replica,
            links,
            events,
            config,
            fsync,
            notify,
            held: VecDeque::new(),
            held_bytes: 0,
            last_timer: None,
            replicas: file.replicas.clone(),
            file_replicas: file.replicas.clone(),
            changes_seen: None,
            accept,
            leader_seen: (0, 0),
            unapplied: HashMap::new(),
            unapplied_bytes: 0,
            unapplied_topics: HashMap::new(),
            gone: HashMap::new(),
            read_path: file.reads,
            reads: HashMap::new(),
            reads_bytes: 0,
            forgot: Instant::now(),
            next_read: random_u64(),
            metrics: None,
            store_metrics: None,
            via: (notify == Notify::Everywhere).then_some(statestore_guest::Via {
                replica: file.id,
                started: life,
            }),
            clock,
            probe: super::probe::Probe::new(secret),
        })
    }

    /// Keeps `metrics` (the replica's) and `store` (the store's, as one
    /// process has them for its tenant) up to date from now on.
    pub fn set_metrics(
        &mut self,
        metrics: crate::metrics::ReplicaMetrics,
        store: crate::metrics::TenantMetrics,
    ) {
        self.replica.set_log_metrics(store.journal());
        self.metrics = Some(metrics);
        self.store_metrics = Some(store);
        self.refresh_store_metrics(true);
    }

    /// The guest's sizes and counters, if `force` or they are due.
    fn refresh_store_metrics(&mut self, force: bool) {
        let Some(m) = &mut self.store_metrics else {
            return;
        };
        if !force && !m.refresh_due() {
            return;
        }
        let store = self.replica.store_mut();
        if let Ok(stats) = store.stats() {
            m.refresh(&stats, store.calls(), store.memory_bytes());
        }
    }

    /// Counts the replies and notifications of `outputs`, about to be
    /// published.
    fn published(&self, outputs: &[Output]) {
        if let Some(m) = &self.store_metrics {
            m.published(outputs);
        }
    }

    fn refresh_metrics(&mut self) {
        self.refresh_store_metrics(false);
        let Some(m) = &self.metrics else { return };
        let s = self.replica.status();
        m.term.set(i64::try_from(s.term).unwrap_or(i64::MAX));
        m.is_leader.set(i64::from(s.role == "leader"));
        m.commit_index
            .set(i64::try_from(s.commit).unwrap_or(i64::MAX));
        m.applied_index
            .set(i64::try_from(s.applied).unwrap_or(i64::MAX));
        for r in &self.replicas {
            let lag = s
                .matched
                .iter()
                .find(|(id, _)| *id == r.id)
                .map_or(0, |(_, matched)| s.last_index.saturating_sub(*matched));
            m.lag
                .with_label_values(&[&r.id.to_string()])
                .set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Serves clients over `transport` until `shutdown` completes.
    pub async fn drive<T: Transport>(
        mut self,
        transport: &mut T,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sync = tokio::time::interval(Duration::from_secs(1));
        let result = loop {
            let step: Result<()> = tokio::select! {
                biased;
                () = shutdown.as_mut() => break Ok(()),
                event = self.events.recv() => match event {
                    Some(e) => {
                        // Everything already here, then one ready: one
                        // write to the disk for all of it.
                        let mut r = self.on_peer(e);
                        let mut n = 0;
                        while r.is_ok() && n < 1024 && let Ok(e) = self.events.try_recv() {
                            r = self.on_peer(e);
                            n += 1;
                        }
                        r
                    }
                    None => break Err(anyhow::anyhow!("the replica links stopped")),
                },
                event = transport.recv() => {
                    let Some(event) = event else {
                        break Err(anyhow::anyhow!("the transport stopped"));
                    };
                    let mut r = match transport.on_event(event).await? {
                        Some(TransportInput::Messages(mut m)) => {
                            for m in &mut m {
                                m.via = self.via;
                            }
                            if let Some(metrics) = &self.store_metrics {
                                metrics.requests(m.iter().map(|m| m.payload.as_slice()));
                            }
                            if !self.gone.is_empty() {
                                // Back through this replica: its disconnect
                                // is not to be reported again.
                                for m in &m {
                                    if let Some(c) = &m.client_id {
                                        self.gone.remove(c);
                                    }
                                }
                            }
                            self.submit(Held::Requests(Instant::now(), m))
                        }
                        Some(TransportInput::ClientGone(id)) => self.submit(Held::Gone(Instant::now(), id)),
                        None => Ok(()),
                    };
                    transport.settle().await?;
                    // And what the peers sent meanwhile: one ready for both.
                    while r.is_ok() && let Ok(e) = self.events.try_recv() {
                        r = self.on_peer(e);
                    }
                    r
                }
                _ = tick.tick() => match self.on_tick(transport).await {
                    Ok(()) => transport.tick().await,
                    Err(e) => Err(e),
                },
                _ = sync.tick(), if self.fsync == Fsync::Everysec => self.replica.sync(),
                answers = self.probe.answers() => {
                    match super::probe::removed(self.replica.id(), self.replica.applied(), &answers) {
                        Some(why) => Err(anyhow::anyhow!(why)),
                        None => Ok(()),
                    }
                }
            };
            if let Err(e) = step {
                break Err(e);
            }
            if let Err(e) = self.ready(transport).await {
                break Err(e);
            }
        };
        if let Err(e) = self.replica.sync() {
            warn!(error = %format!("{e:#}"), "syncing the Raft log at shutdown");
        }
        self.accept.abort();
        transport.close().await;
        if result.is_ok() {
            info!(replica = self.replica.id(), "replica stopped");
        }
        result
    }

    /// Serves what a client sent: its reads with a read index (see
    /// [`ReadPath`]), the rest through the log ([`Node::submit_log`]).
    fn submit(&mut self, held: Held) -> Result<()> {
        let Held::Requests(at, messages) = held else {
            self.submit_log(held);
            return Ok(());
        };
        if self.replica.leader() == 0 {
            self.hold(Held::Requests(at, messages));
            return Ok(());
        }
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        let positions = match self.replica.store_mut().reads(&wire::encode_batch(&inputs)) {
            Ok(p) => p,
            Err(crate::GuestError::Refused(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if positions.is_empty() {
            self.submit_log(Held::Requests(at, messages));
            return Ok(());
        }
        let index = self.read_path == ReadPath::Index && self.replica.may_read_index();
        let (reads, rest, by_log) =
            split_reads(messages, &positions, index, &self.unapplied_topics);
        if let Some(metrics) = &self.metrics {
            metrics.reads.with_label_values(&["log"]).inc_by(by_log);
        }
        if !reads.is_empty() {
            self.read(reads);
        }
        if !rest.is_empty() {
            self.submit_log(Held::Requests(at, rest));
        }
        Ok(())
    }

    /// Asks for a read index for `messages` (reads): answered once this
    /// replica has applied it, or through the log after [`READ_WAIT`].
    fn read(&mut self, messages: Vec<InboundMessage>) {
        let bytes: usize = messages.iter().map(crate::driver::message_bytes).sum();
        if self.reads_bytes + bytes > READ_BYTES {
            self.submit_log(Held::Requests(Instant::now(), messages));
            return;
        }
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        let batch = wire::encode_batch(&inputs);
        let ctx = self.next_read;
        self.next_read = self.next_read.wrapping_add(1);
        self.replica.read_index(ctx);
        self.reads_bytes += bytes;
        self.reads.insert(
            ctx,
            PendingRead {
                at: Instant::now(),
                messages,
                batch,
                bytes,
            },
        );
    }

    /// Reads that waited [`READ_WAIT`] go through the log.
    fn reads_to_log(&mut self) {
        let late: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.at.elapsed() >= READ_WAIT)
            .map(|(ctx, _)| *ctx)
            .collect();
        let mut messages = Vec::new();
        for ctx in late {
            if let Some(r) = self.reads.remove(&ctx) {
                self.reads_bytes = self.reads_bytes.saturating_sub(r.bytes);
                // Tracked from when they were taken.
                self.track(r.at, &r.messages);
                messages.extend(r.messages.into_iter().map(|m| (r.at, m)));
            }
        }
        if messages.is_empty() {
            return;
        }
        tracing::debug!(
            reads = messages.len(),
            "reads without a read index in time: through the log"
        );
        if let Some(metrics) = &self.metrics {
            metrics
                .reads
                .with_label_values(&["log"])
                .inc_by(messages.len() as u64);
        }
        self.submit_in_order(messages);
    }

    /// The answers to the reads whose read index has been applied.
    fn answer_reads(&mut self, out: &mut Vec<Output>) -> Result<()> {
        for ctx in self.replica.take_reads() {
            let Some(r) = self.reads.remove(&ctx) else {
                continue; // gone through the log meanwhile
            };
            self.reads_bytes = self.reads_bytes.saturating_sub(r.bytes);
            if let Some(metrics) = &self.metrics {
                metrics
                    .reads
                    .with_label_values(&["index"])
                    .inc_by(r.messages.len() as u64);
            }
            if let Some(metrics) = &self.store_metrics {
                metrics.answered(r.at, r.messages.len());
            }
            let outputs = match self.replica.query(&r.batch) {
                Ok(outputs) => outputs,
                Err(e) if matches!(e.downcast_ref(), Some(crate::GuestError::Refused(_))) => {
                    // Not ours to stop on (the batch is our own encoding):
                    // its clients retry.
                    warn!(error = %format!("{e:#}"), "reads the guest refused: not answered");
                    continue;
                }
                Err(e) => return Err(e),
            };
            out.extend(
                outputs
                    .into_iter()
                    .filter(|o| matches!(o, Output::Publish(_) | Output::Violation { .. })),
            );
        }
        Ok(())
    }

    /// Proposes (as leader), forwards (to the leader) or holds (no leader
    /// yet) what a client sent.
    fn submit_log(&mut self, held: Held) {
        let leader = self.replica.leader();
        if leader == 0 {
            self.hold(held);
            return;
        }
        let batch = match &held {
            Held::Requests(at, m) => {
                self.track(*at, m);
                let inputs: Vec<Input<'_>> = m.iter().map(Input::Message).collect();
                wire::encode_batch(&inputs)
            }
            Held::Gone(_, id) => match self.via {
                Some(via) => {
                    if self.gone.len() < GONE_KEPT {
                        self.gone.insert(id.clone(), Instant::now());
                    }
                    wire::encode_batch(&[Input::DisconnectedVia(id, via)])
                }
                None => wire::encode_batch(&[Input::Disconnected(id)]),
            },
            Held::Started(_) => match self.via {
                Some(via) => wire::encode_batch(&[Input::ReplicaStarted(via)]),
                None => return,
            },
        };
        let id = self.replica.id();
        if leader == id {
            let now = self.now();
            if let Err(e) = self.replica.propose_wire(id, &batch, now) {
                tracing::debug!(error = %format!("{e:#}"), "proposal refused; held");
                self.hold(held);
            }
        } else {
            self.links.forward(leader, id, batch);
        }
    }

    /// Keeps requests (taken at `at`) until they are applied (see
    /// `unapplied`); one already kept keeps its time.
    fn track(&mut self, at: Instant, messages: &[InboundMessage]) {
        for m in messages {
            let (Some(topic), Some(corr)) = (&m.response_topic, &m.correlation_data) else {
                continue;
            };
            if m.qos != 1
                || m.topic != statestore_guest::rpc::REQUEST_TOPIC
                || statestore_guest::rpc::check_response_topic(topic)
                    != statestore_guest::rpc::TopicCheck::Valid
            {
                continue; // never answered
            }
            let key = (topic.clone(), corr.clone());
            if self.unapplied.contains_key(&key) {
                continue;
            }
            let bytes = crate::driver::message_bytes(m);
            if self.unapplied_bytes + bytes > RESEND_BYTES {
                // Past the bound: forget what is too old to send again.
                self.forget_unapplied();
                if self.unapplied_bytes + bytes > RESEND_BYTES {
                    return;
                }
            }
            self.unapplied_bytes += bytes;
            *self.unapplied_topics.entry(topic.clone()).or_default() += 1;
            let now = Instant::now();
            self.unapplied.insert(
                key,
                Tracked {
                    at,
                    sent: now,
                    message: m.clone(),
                },
            );
        }
    }

    /// Forgets requests too old to send again ([`RESEND_WITHIN`]).
    fn forget_unapplied(&mut self) {
        self.unapplied.retain(|_, t| t.at.elapsed() < RESEND_WITHIN);
        self.unapplied_bytes = 0;
        self.unapplied_topics.clear();
        for ((topic, _), Tracked { message: m, .. }) in &self.unapplied {
            self.unapplied_bytes += crate::driver::message_bytes(m);
            *self.unapplied_topics.entry(topic.clone()).or_default() += 1;
        }
    }

    /// Applied: no longer to be sent again.
    fn untrack(&mut self, outputs: &[Output]) {
        if self.unapplied.is_empty() {
            return;
        }
        for o in outputs {
            if let Output::Publish(p) = o
                && p.kind != PublishKind::Notification
                && let Some(corr) = &p.correlation_data
                && let Some(Tracked { at, message: m, .. }) =
                    self.unapplied.remove(&(p.topic.to_string(), corr.to_vec()))
            {
                if let Some(metrics) = &self.metrics {
                    metrics.commit.observe(at.elapsed().as_secs_f64());
                }
                if let Some(metrics) = &self.store_metrics {
                    metrics.answered(at, 1);
                }
                self.unapplied_bytes = self
                    .unapplied_bytes
                    .saturating_sub(crate::driver::message_bytes(&m));
                let topic: &str = &p.topic;
                if let Some(n) = self.unapplied_topics.get_mut(topic) {
                    *n -= 1;
                    if *n == 0 {
                        self.unapplied_topics.remove(topic);
                    }
                }
            }
        }
    }

    /// A new leader: what the old one may have lost goes to it again, and
    /// this replica's start (`replica-started`, which the guest may apply
    /// any number of times: it drops only what earlier lives registered).
    fn resend(&mut self) {
        self.submit_log(Held::Started(Instant::now()));
        self.gone.retain(|_, at| at.elapsed() < RESEND_WITHIN);
        let gone: Vec<String> = self.gone.keys().cloned().collect();
        if !gone.is_empty() {
            info!(
                clients = gone.len(),
                "a new leader: client disconnects reported lately are reported to it again"
            );
        }
        for id in gone {
            self.submit_log(Held::Gone(Instant::now(), id));
        }
        self.forget_unapplied();
        // They stay tracked, with the time they were taken.
        let now = Instant::now();
        let mut all: Vec<(Instant, InboundMessage)> = self
            .unapplied
            .values_mut()
            .map(|t| {
                t.sent = now;
                (t.at, t.message.clone())
            })
            .collect();
        // Reads waiting for an index from the old leader will not get one:
        // they go through the log too.
        let reads: Vec<PendingRead> = self.reads.drain().map(|(_, r)| r).collect();
        self.reads_bytes = 0;
        if let Some(metrics) = &self.metrics {
            let n: usize = reads.iter().map(|r| r.messages.len()).sum();
            metrics.reads.with_label_values(&["log"]).inc_by(n as u64);
        }
        for r in reads {
            self.track(r.at, &r.messages);
            all.extend(r.messages.into_iter().map(|m| (r.at, m)));
        }
        if all.is_empty() {
            return;
        }
        info!(
            requests = all.len(),
            leader = self.replica.leader(),
            "a new leader: requests not yet applied are sent to it again"
        );
        self.submit_in_order(all);
    }

    /// No leader any more: what was sent to the old one and not applied
    /// waits for the next like a request just received (sent to it when
    /// there is one, a 503 "retry" if none comes within [`HOLD`]), and so
    /// do reads waiting for an index. (Left tracked, a request forwarded
    /// to a leader that died with the majority got no answer at all.)
    fn hold_unapplied(&mut self) {
        let mut all: Vec<(Instant, InboundMessage)> = self
            .unapplied
            .drain()
            .map(|(_, t)| (t.at, t.message))
            .collect();
        self.unapplied_bytes = 0;
        self.unapplied_topics.clear();
        self.reads_bytes = 0;
        for (_, r) in self.reads.drain() {
            all.extend(r.messages.into_iter().map(|m| (r.at, m)));
        }
        if all.is_empty() {
            return;
        }
        info!(
            requests = all.len(),
            "no leader: requests not yet applied wait for the next one"
        );
        all.sort_by_key(|(at, _)| *at);
        let now = Instant::now();
        let messages: Vec<InboundMessage> = all.into_iter().map(|(_, m)| m).collect();
        for chunk in messages.chunks(crate::driver::MAX_BATCH) {
            self.hold(Held::Requests(now, chunk.to_vec()));
        }
    }

    /// Submits `requests` (each with the time it was taken, already
    /// tracked) to the log again, in the order they were taken.
    fn submit_in_order(&mut self, mut requests: Vec<(Instant, InboundMessage)>) {
        requests.sort_by_key(|(at, _)| *at);
        let messages: Vec<InboundMessage> = requests.into_iter().map(|(_, m)| m).collect();
        for chunk in messages.chunks(crate::driver::MAX_BATCH) {
            self.submit_log(Held::Requests(Instant::now(), chunk.to_vec()));
        }
    }

    /// Sends again (to the same leader) what waited [`RETRY_AFTER`] since
    /// it was last sent: a forward can be lost on a link that broke, or
    /// reach a leader just as it steps down (and is elected again in a new
    /// term, which sends everything again too).
    fn retry(&mut self) {
        let mut late: Vec<(Instant, InboundMessage)> = Vec::new();
        for t in self.unapplied.values_mut() {
            // One its client no longer waits for is not sent again.
            let expired = t
                .message
                .message_expiry_interval
                .is_some_and(|s| t.at.elapsed() >= Duration::from_secs(u64::from(s)));
            if t.sent.elapsed() >= RETRY_AFTER && !expired {
                t.sent = Instant::now();
                late.push((t.at, t.message.clone()));
            }
        }
        if late.is_empty() {
            return;
        }
        tracing::debug!(
            requests = late.len(),
            "requests not applied in time: sent again"
        );
        self.submit_in_order(late);
    }

    fn hold(&mut self, held: Held) {
        let bytes = match &held {
            Held::Requests(_, m) => m.iter().map(crate::driver::message_bytes).sum(),
            Held::Gone(_, id) => id.len(),
            Held::Started(_) => 16,
        };
        if self.held_bytes + bytes > HOLD_BYTES {
            // Past the bound: these get their 503 at the next tick.
            warn!("requests waiting for a leader past {HOLD_BYTES} bytes: refused");
        }
        self.held_bytes += bytes;
        self.held.push_back(held);
    }

    fn on_peer(&mut self, event: PeerEvent) -> Result<()> {
        match event {
            PeerEvent::Raft(m) => {
                if let Err(e) = self.replica.step(m) {
                    tracing::debug!(error = %format!("{e:#}"), "a Raft message refused");
                }
            }
            PeerEvent::Forward { origin, batch } => {
                if !self.replicas.iter().any(|r| r.id == origin) {
                    warn!(
                        origin,
                        "forwarded requests from a replica not in the cluster file"
                    );
                } else if wire::decode_batch(&batch).is_err() {
                    warn!(origin, "forwarded requests that do not decode: dropped");
                } else if self.replica.is_leader() {
                    let now = self.now();
                    if let Err(e) = self.replica.propose_wire(origin, &batch, now) {
                        tracing::debug!(error = %format!("{e:#}"), "a forwarded proposal refused (its client retries)");
                    }
                } else {
                    tracing::debug!(
                        origin,
                        "forwarded requests reached a replica that no longer leads (their clients retry)"
                    );
                }
            }
            PeerEvent::Unreachable(peer) => self.replica.unreachable(peer),
            PeerEvent::Status(reply) => {
                let _ = reply.send(self.status_text());
            }
            PeerEvent::Change(request, reply) => {
                let answer = match self.change(&request) {
                    Ok(text) => format!("ok {text}"),
                    Err(e) => format!("error: {e:#}"),
                };
                let _ = reply.send(answer);
            }
        }
        Ok(())
    }

    /// An operator's membership change: `add <id> raft=<addr> [mqtt=<addr>]`
    /// or `remove <id>`, proposed if this replica leads.
    fn change(&mut self, request: &str) -> Result<String> {
        let mut words = request.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let id: u64 = words
            .next()
            .and_then(|w| w.parse().ok())
            .context("a replica id")?;
        let leader = self.replica.leader();
        if leader != self.replica.id() {
            bail!("not the leader; leader={leader}");
        }
        let change = match verb {
            "add" => {
                let record: Vec<&str> = words.collect();
                let entry = parse_record(id, record.join(" ").as_bytes())?;
                if self
                    .replicas
                    .iter()
                    .any(|r| r.id != id && r.raft == entry.raft)
                {
                    bail!("{} is already a member's address", entry.raft);
                }
                super::Change::Add {
                    id,
                    record: record.join(" ").into_bytes(),
                }
            }
            "remove" if id == self.replica.id() => {
                // A leader does not remove itself: it hands over first.
                let to = self.successor().context("no other member to lead")?;
                self.replica.transfer_leader(to);
                bail!("replica {id} leads: the leadership moves to replica {to}; leader={to}");
            }
            "remove" => super::Change::Remove(id),
            v => bail!("unknown change {v:?} (add, remove)"),
        };
        self.replica.propose_change(&change)?;
        info!(
            replica = self.replica.id(),
            request, "membership change proposed"
        );
        Ok(format!("proposed: {request}"))
    }

    /// The voter (not this replica) most up to date, to take over the
    /// leadership.
    fn successor(&self) -> Option<u64> {
        let me = self.replica.id();
        let voters = self.replica.voters();
        self.replica
            .status()
            .matched
            .iter()
            .filter(|(id, _)| *id != me && voters.contains(id))
            .max_by_key(|(_, matched)| *matched)
            .map(|(id, _)| *id)
    }

    /// Keeps `replicas` and the links in step with the membership the
    /// replica has applied; a replica removed from it stops.
    fn sync_members(&mut self) -> Result<()> {
        let changes = self.replica.changes();
        if self.changes_seen == Some(changes) {
            return Ok(());
        }
        self.changes_seen = Some(changes);
        let voters = self.replica.voters();
        let me = self.replica.id();
        if voters.is_empty() {
            return Ok(()); // joining: the leader's snapshot brings them
        }
        if !voters.contains(&me) {
            bail!(
                "replica {me} was removed from the cluster (members: {voters:?}): it stops; to serve again it must be added back (`statestore cluster add`) with an empty data directory and `join = true`"
            );
        }
        let mut known = self.file_replicas.clone();
        for (id, record) in self.replica.members() {
            if known.iter().any(|r| r.id == *id) {
                continue;
            }
            match parse_record(*id, record) {
                Ok(entry) => known.push(entry),
                Err(e) => {
                    warn!(replica = id, error = %format!("{e:#}"), "a member's address record")
                }
            }
        }
        known.retain(|r| voters.contains(&r.id));
        // What the clients of a replica that left registered through it goes
        // with it: a life of it later than any (proposed by the leader that
        // applied the removal; `replica-started` drops every registration
        // of an earlier life).
        if self.replica.is_leader() && self.via.is_some() {
            let removed: Vec<u64> = self
                .replicas
                .iter()
                .map(|r| r.id)
                .filter(|id| !voters.contains(id))
                .collect();
            for id in removed {
                let batch = wire::encode_batch(&[Input::ReplicaStarted(statestore_guest::Via {
                    replica: id,
                    started: u64::MAX,
                })]);
                let now = self.now();
                match self.replica.propose_wire(me, &batch, now) {
                    Ok(_) => info!(
                        replica = me,
                        removed = id,
                        "the registrations made through a removed replica go"
                    ),
                    Err(e) => {
                        warn!(removed = id, error = %format!("{e:#}"), "the registrations made through a removed replica stay (proposal refused)")
                    }
                }
            }
        }
        for r in &known {
            self.links.add(r.id, r.raft);
        }
        for peer in self.links.peers() {
            if !voters.contains(&peer) {
                info!(replica = me, peer, "no longer a member: its link is closed");
                self.links.remove(peer);
            }
        }
        if let Some(m) = &self.metrics {
            for r in &self.replicas {
                if !voters.contains(&r.id) {
                    let _ = m.lag.remove_label_values(&[&r.id.to_string()]);
                }
            }
        }
        for v in &voters {
            if !known.iter().any(|r| r.id == *v) {
                warn!(
                    replica = me,
                    member = v,
                    "no address known for a member (add it to the cluster file)"
                );
            }
        }
        self.replicas = known;
        Ok(())
    }

    /// `key=value` lines, for `cluster status`.
    pub fn status_text(&self) -> String {
        let s = self.replica.status();
        let matched: Vec<String> = s
            .matched
            .iter()
            .map(|(id, m)| format!("{id}:{m}"))
            .collect();
        let mqtt = self
            .replicas
            .iter()
            .find(|r| r.id == s.id)
            .and_then(|r| r.mqtt)
            .map_or(String::new(), |a| a.to_string());
        let voters: Vec<String> = self.replica.voters().iter().map(u64::to_string).collect();
        let peers: Vec<String> = self
            .replicas
            .iter()
            .map(|r| format!("{}@{}", r.id, r.raft))
            .collect();
        format!(
            "id={}\nrole={}\nterm={}\nleader={}\ncommit={}\napplied={}\nlast_index={}\nsnapshot={}\nmatched={}\nmqtt={}\nvoters={}\npeers={}\n",
            s.id,
            s.role,
            s.term,
            s.leader,
            s.commit,
            s.applied,
            s.last_index,
            s.snapshot,
            matched.join(","),
            mqtt,
            voters.join(","),
            peers.join(","),
        )
    }

    async fn on_tick<T: Transport>(&mut self, transport: &mut T) -> Result<()> {
        self.replica.tick();
        let me = self.replica.id();
        let peers = self
            .replicas
            .iter()
            .filter(|r| r.id != me)
            .map(|r| (r.id, r.raft))
            .collect();
        self.probe.tick(
            self.replica.leader(),
            self.replica.voters().contains(&me),
            peers,
        );
        if self.replica.is_leader()
            && !self.replica.voters().contains(&self.replica.id())
            && let Some(to) = self.successor()
        {
            // Removed while leading (proposed by an earlier leader).
            self.replica.transfer_leader(to);
        }
        self.refresh_metrics();
        let leader = self.replica.leader();
        let term = self.replica.term();
        if leader != self.leader_seen.0 || (leader != 0 && term != self.leader_seen.1) {
            info!(replica = self.replica.id(), leader, term, "leader changed");
            self.leader_seen = (leader, term);
            if let Some(m) = &self.metrics {
                m.leader_changes.inc();
            }
            if leader != 0 {
                self.resend();
            } else {
                self.hold_unapplied();
            }
        }
        // Held requests: to the leader once there is one; a 503 after HOLD.
        if leader != 0 {
            let held = std::mem::take(&mut self.held);
            self.held_bytes = 0;
            for h in held {
                self.submit(h)?;
            }
        }
        self.reads_to_log();
        if self.forgot.elapsed() >= Duration::from_secs(1) {
            // Requests never answered (expired, refused) age out; those
            // waiting too long go to the leader again.
            self.forget_unapplied();
            self.gone.retain(|_, at| at.elapsed() < RESEND_WITHIN);
            self.forgot = Instant::now();
            // A leader loses none of its own proposals without a new term.
            if leader != 0 && leader != self.replica.id() {
                self.retry();
            }
        }
        let mut refused = Vec::new();
        while let Some(h) = self.held.front() {
            let since = match h {
                Held::Requests(at, _) | Held::Gone(at, _) | Held::Started(at) => *at,
            };
            if since.elapsed() < HOLD && self.held_bytes <= HOLD_BYTES {
                break;
            }
            match self.held.pop_front() {
                Some(Held::Requests(_, m)) => {
                    self.held_bytes = self
                        .held_bytes
                        .saturating_sub(m.iter().map(crate::driver::message_bytes).sum());
                    refused.extend(m);
                }
                Some(Held::Gone(_, id)) => {
                    self.held_bytes = self.held_bytes.saturating_sub(id.len());
                }
                Some(Held::Started(_)) => {
                    self.held_bytes = self.held_bytes.saturating_sub(16);
                }
                None => break,
            }
        }
        if !refused.is_empty() {
            let now = self.now();
            let replies: Vec<Output> = refused
                .iter()
                .filter_map(|m| {
                    statestore_guest::StateMachine::host_reply(
                        &self.config,
                        m,
                        now,
                        statestore_guest::HostReply::Unavailable(
                            "no leader among the state store replicas; retry".into(),
                        ),
                    )
                })
                .map(Output::Publish)
                .collect();
            self.published(&replies);
            transport.emit(replies).await?;
        }
        // Expiry: the leader proposes a timer entry when the guest is due.
        if self.replica.is_leader()
            && self
                .last_timer
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(200))
        {
            let clock = self.now().max(self.replica.log_now());
            if let Some(due) = self.replica.store_mut().next_deadline()?
                && due <= clock
            {
                let id = self.replica.id();
                if self.replica.propose(id, &[], clock).is_ok() {
                    self.last_timer = Some(Instant::now());
                }
            }
        }
        Ok(())
    }

    /// Persists, sends, applies; publishes what is this replica's.
    async fn ready<T: Transport>(&mut self, transport: &mut T) -> Result<()> {
        // Replies to what was committed go out before this replica's new
        // entries are synced: they never wait for a later fsync.
        let links = &self.links;
        let (applied, rest) = self.replica.ready_apply(&mut |m| links.send(m))?;
        self.sync_members()?;
        self.publish(transport, applied).await?;
        if let Some(rest) = rest {
            let links = &self.links;
            let applied = self.replica.ready_persist(rest, &mut |m| links.send(m))?;
            self.sync_members()?;
            self.publish(transport, applied).await?;
        }
        Ok(())
    }

    /// Publishes what is this replica's of `applied`, and the answers to
    /// reads whose index is now applied.
    async fn publish<T: Transport>(
        &mut self,
        transport: &mut T,
        applied: Vec<super::Applied>,
    ) -> Result<()> {
        let id = self.replica.id();
        let mut out = Vec::new();
        for a in applied {
            if a.replayed {
                continue;
            }
            let ours = a.origin == id;
            if ours {
                self.untrack(&a.outputs);
            }
            for o in a.outputs {
                let publish = match &o {
                    Output::Publish(m) if m.kind == PublishKind::Notification => {
                        ours || self.notify == Notify::Everywhere
                    }
                    Output::Publish(_) | Output::Violation { .. } => ours,
                    Output::Journal(_) | Output::More(_) => false,
                };
                if publish {
                    out.push(o);
                }
            }
        }
        self.answer_reads(&mut out)?;
        if !out.is_empty() {
            self.published(&out);
            transport.emit(out).await?;
        }
        Ok(())
    }
}

/// Splits a batch into the reads to serve with a read index (`index`:
/// allowed now) and the rest, for the log, in order; and how many reads
/// are in the rest. `positions` are the reads (the guest's `reads`). A read
/// whose response topic has a write in flight (`unapplied`) or earlier in
/// the batch goes through the log behind it: a client reads its own writes
/// even when it does not wait for them.
fn split_reads(
    messages: Vec<InboundMessage>,
    positions: &[u32],
    index: bool,
    unapplied: &HashMap<String, usize>,
) -> (Vec<InboundMessage>, Vec<InboundMessage>, u64) {
    let mut reads = Vec::new();
    let mut rest = Vec::new();
    let mut by_log = 0;
    let mut writing: std::collections::HashSet<String> = Default::default();
    for (i, m) in messages.into_iter().enumerate() {
        let topic = m.response_topic.as_deref();
        if !positions.contains(&u32::try_from(i).unwrap_or(u32::MAX)) {
            if let Some(t) = topic {
                writing.insert(t.to_string());
            }
            rest.push(m);
        } else if index && !topic.is_some_and(|t| writing.contains(t) || unapplied.contains_key(t))
        {
            reads.push(m);
        } else {
            by_log += 1;
            rest.push(m);
        }
    }
    (reads, rest, by_log)
}

/// The start of this replica's new life (its `via.started`): now, or just
/// after the last one if the clock went back since (a life must start
/// after the ones before it, or `replica-started` would not drop their
/// registrations). Kept in `raft-life` in its data directory.
fn new_life(disk: &dyn crate::storage::Storage, now: u64) -> Result<u64> {
    const LIFE: &str = "raft-life";
    let last = match disk.read(LIFE) {
        Ok(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .context("raft-life is not a number")?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).context("reading raft-life"),
    };
    let started = now.max(last.saturating_add(1));
    disk.write_atomic(LIFE, started.to_string().as_bytes())
        .context("writing raft-life")?;
    Ok(started)
}

/// A replica's address record: `raft=<addr> [mqtt=<addr>]`.
fn parse_record(id: u64, record: &[u8]) -> Result<ReplicaEntry> {
    let text = std::str::from_utf8(record).context("an address record that is not UTF-8")?;
    let mut raft = None;
    let mut mqtt = None;
    for word in text.split_whitespace() {
        match word.split_once('=') {
            Some(("raft", a)) => raft = Some(a.parse().with_context(|| format!("raft={a}"))?),
            Some(("mqtt", a)) => mqtt = Some(a.parse().with_context(|| format!("mqtt={a}"))?),
            _ => bail!("{word:?} in an address record (raft=<addr> [mqtt=<addr>])"),
        }
    }
    Ok(ReplicaEntry {
        id,
        raft: raft.context("an address record without raft=<addr>")?,
        mqtt,
    })
}

/// A random u64 from the standard library's hasher keys (seeded by the
/// operating system).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(topic: &str, corr: u8) -> InboundMessage {
        InboundMessage {
            topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
            qos: 1,
            response_topic: Some(topic.into()),
            correlation_data: Some(vec![corr]),
            ..Default::default()
        }
    }

    fn corrs(messages: &[InboundMessage]) -> Vec<u8> {
        messages
            .iter()
            .map(|m| m.correlation_data.as_ref().expect("set")[0])
            .collect()
    }

    /// A life starts after the ones before it, even when the clock went
    /// back.
    #[test]
    fn a_new_life_starts_after_the_last_one() {
        let disk = crate::storage::MemStorage::new();
        assert_eq!(new_life(&disk, 1_000).expect("life"), 1_000);
        assert_eq!(new_life(&disk, 5_000).expect("life"), 5_000);
        assert_eq!(new_life(&disk, 4_000).expect("clock went back"), 5_001);
        assert_eq!(new_life(&disk, 5_001).expect("same ms"), 5_002);
    }

    /// Reads of other clients take the index; a client's read after its
    /// own write (earlier in the batch, or still in flight) stays behind
    /// it in the log, in order.
    #[test]
    fn a_read_behind_its_clients_write_goes_through_the_log() {
        // 0: a's write, 1: a's read, 2: b's read, 3: c's read (c has a
        // write in flight), 4: b's write, 5: b's read.
        let batch = vec![
            message("a", 0),
            message("a", 1),
            message("b", 2),
            message("c", 3),
            message("b", 4),
            message("b", 5),
        ];
        let in_flight = HashMap::from([("c".to_string(), 1)]);
        let (reads, rest, by_log) = split_reads(batch.clone(), &[1, 2, 3, 5], true, &in_flight);
        assert_eq!(corrs(&reads), [2]);
        assert_eq!(corrs(&rest), [0, 1, 3, 4, 5]);
        assert_eq!(by_log, 3);
        // Without the index (off, or a leader new to its term): all in
        // the log, in order.
        let (reads, rest, by_log) = split_reads(batch, &[1, 2, 3, 5], false, &HashMap::new());
        assert!(reads.is_empty());
        assert_eq!(corrs(&rest), [0, 1, 2, 3, 4, 5]);
        assert_eq!(by_log, 4);
    }
}
