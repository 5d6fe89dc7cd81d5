//! What a replica does with its clients' traffic, without I/O: the
//! requests it takes are proposed (as leader), forwarded to the leader, or
//! held while no leader is known; reads get a read index; what was sent and
//! not applied is sent again to a new leader; and every request gets at
//! most one answer. The server ([`super::node`]) and the simulation
//! (`super::sim`) drive the same [`Router`]: they hand it events with the
//! time ([`Now`]) and carry out its [`Effects`] (forwards to the leader,
//! replies to publish).
//!
//! # One meaning for every answer
//!
//! - `200`: the guest's reply to the request, applied from the log (or, for
//!   a read, answered at a read index).
//! - `503` ("retry"): the request was never sent to any leader (none was
//!   known within [`Limits::hold`]), so it is not in any log and never will
//!   be: retrying is safe.
//! - `408` (`__propName: ExecutionTimeout`): the request was sent to a
//!   leader and was not applied within [`Limits::hold`] of losing it: its
//!   outcome is unknown (a new leader may still commit it). The SDKs report
//!   it as a timeout, as when no reply comes at all; a client that must
//!   know reads the key. This replica publishes no other answer to it
//!   later ([`TIMED_OUT_WITHIN`]), unless the client sends it again.
//!
//! A request is never answered twice differently; the simulation checks it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Result;
use statestore_guest::wire;
use tracing::{info, warn};

mod answered;
mod bytes;
mod hold;
mod intake;
mod reads;

use answered::{Answered, Key, key_of};
use bytes::Count;
pub use bytes::SharedBytes;
use hold::Held;
use reads::split_reads;

use super::file::ReadPath;
use super::{Applied, Replica};
use crate::{Backend, Config, InboundMessage, Input, Output, PublishKind};

/// The time of an event: the monotonic instant (for the router's own
/// timeouts) and the replica's clock in ms (what a proposal is stamped with).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic time.
    pub at: Instant,
    /// Milliseconds since the epoch, from the replica's clock.
    pub ms: u64,
}

/// How long things wait.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests wait this long for a leader, then get a 503 (never sent)
    /// or a 408 (sent, outcome unknown).
    pub hold: Duration,
    /// A request sent to the leader is kept this long to be sent again if
    /// the leader changes before it is applied.
    pub resend_within: Duration,
    /// A request sent to the leader and not applied after this long is
    /// sent again to the same leader (a forward lost with a broken link,
    /// or refused by a leader about to step down), until `resend_within`.
    pub retry_after: Duration,
    /// Reads wait this long for their read index, then go through the log.
    pub read_wait: Duration,
    /// The leader proposes expiry at most this often.
    pub timer_every: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hold: Duration::from_secs(5),
            resend_within: Duration::from_secs(10),
            retry_after: Duration::from_secs(2),
            read_wait: Duration::from_millis(500),
            timer_every: Duration::from_millis(200),
        }
    }
}

/// The most bytes of requests held while there is no leader.
const HOLD_BYTES: usize = 64 << 20;

/// The most bytes of requests kept to be sent again.
const RESEND_BYTES: usize = 64 << 20;

/// The most client disconnects kept to be reported again to a new leader.
const GONE_KEPT: usize = 100_000;

/// The most bytes of reads waiting for a read index (more go through the log).
const READ_BYTES: usize = 64 << 20;

/// How long a request answered 408 gets no other answer from this replica.
pub const TIMED_OUT_WITHIN: Duration = Duration::from_secs(600);

/// The most bytes of requests answered 408 remembered for that (the oldest
/// are forgotten first).
const TIMED_OUT_BYTES: usize = 16 << 20;

/// How long a request sent more than once, once answered, gets no other
/// answer from this replica (a copy still in flight can be applied again:
/// a SET gets the same reply from the dedup cache, a GET may read another
/// value).
pub const ANSWERED_WITHIN: Duration = Duration::from_secs(60);

/// The most bytes of those remembered.
const ANSWERED_BYTES: usize = 32 << 20;

/// Who publishes notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    /// Every replica hands every notification to its embedded broker,
    /// which delivers it if the observer's session is there.
    Everywhere,
    /// Through an external broker, which routes them: the replica that
    /// led the term a change was appended in publishes its notifications
    /// (as it applies them, in log order; so an observer gets a key's
    /// notifications in order but around a change of leader, when the old
    /// leader may apply its last entries after the new one has published
    /// some; a leader that crashes before applying committed entries takes
    /// their notifications with it).
    Origin,
}

/// What a router did: requests by what happened to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Forwarded to the leader (each time).
    pub forwarded: u64,
    /// Held while no leader was known (each time).
    pub held: u64,
    /// Sent again to a new leader.
    pub resent: u64,
    /// Sent again to the same leader, not applied in time.
    pub retried: u64,
    /// Answered with a read index.
    pub index_reads: u64,
    /// Reads that got no read index in time and went through the log.
    pub reads_to_log: u64,
    /// Answered 503: never sent to a leader.
    pub unavailable: u64,
    /// Answered 408: sent, outcome unknown.
    pub unknown: u64,
}

/// What the driver carries out after each call.
#[derive(Debug, Default)]
pub struct Effects {
    /// Batches of requests (the guest's encoding) for the leader: `(leader,
    /// batch)`, this replica being their origin.
    pub forwards: Vec<(u64, Vec<u8>)>,
    /// Replies and notifications to publish.
    pub replies: Vec<Output>,
    /// Notifications for the clients of the replicas that do not hold the
    /// group (with [`Router::ship_notifications`], as its leader).
    pub outsiders: Vec<Output>,
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

/// Whether `m` is a request the store answers (QoS 1, on the request topic,
/// with correlation data and a valid response topic): one to keep until its
/// answer comes.
pub(crate) fn answered_at_all(m: &InboundMessage) -> bool {
    let (Some(topic), Some(_)) = (&m.response_topic, &m.correlation_data) else {
        return false;
    };
    m.qos == 1
        && m.topic == statestore_guest::rpc::REQUEST_TOPIC
        && statestore_guest::rpc::check_response_topic(topic)
            == statestore_guest::rpc::TopicCheck::Valid
}

/// A replica's routing of its clients' requests (see the module's doc).
pub struct Router {
    id: u64,
    config: Config,
    via: Option<statestore_guest::Via>,
    read_path: ReadPath,
    notify: Notify,
    limits: Limits,
    held: VecDeque<Held>,
    held_bytes: Count,
    last_timer: Option<Instant>,
    /// The guest's next deadline as of an applied index (it changes only
    /// with what is applied): not asked again every tick of an idle group.
    deadline: Option<(u64, Option<u64>)>,
    /// The leader and term last seen: a new one (the same replica elected
    /// again in a new term included) gets the requests not yet applied.
    leader_seen: (u64, u64),
    /// Requests proposed or forwarded and not yet applied, by response
    /// topic and correlation data: sent again to a new leader (a leader
    /// that dies or steps down loses what it had not committed), and to
    /// the same one after [`Limits::retry_after`]. The replicated dedup
    /// cache answers one applied twice with its first reply.
    unapplied: HashMap<Key, Tracked>,
    unapplied_bytes: Count,
    /// How many of `unapplied` each response topic has: a read on a topic
    /// with a write in flight goes through the log behind it, so that a
    /// client reads its own writes even when it does not wait for them.
    unapplied_topics: HashMap<String, usize>,
    /// Clients whose disconnect this replica reported (proposed or
    /// forwarded) in the last [`Limits::resend_within`], and that have sent
    /// nothing through it since: reported again to a new leader (a leader
    /// that dies loses what it had not committed). Safe to apply twice: it
    /// drops only what the client registered through this replica, and it
    /// has registered nothing here since.
    gone: HashMap<String, Instant>,
    /// Reads waiting for their read index, by context.
    reads: HashMap<u64, PendingRead>,
    reads_bytes: Count,
    /// When `unapplied` was last rid of what is too old.
    forgot: Instant,
    /// The next read context: a random start, so that one from before a
    /// restart, still queued at the leader, is never taken for a new one.
    next_read: u64,
    /// Requests answered 408.
    timed_out: Answered,
    /// Requests sent more than once, lately: a copy may be applied after
    /// the first.
    resent: Answered,
    /// Those of them answered.
    answered: Answered,
    /// What it did since [`Router::take_counts`].
    counts: Counts,
    /// The replica's metrics (`serve --cluster --metrics`).
    pub metrics: Option<crate::metrics::ReplicaMetrics>,
    /// The store's metrics, as one process keeps them for its tenant.
    pub store_metrics: Option<crate::metrics::TenantMetrics>,
    /// Some replicas do not hold the group: its leader hands what it
    /// applies of notifications over for their clients too
    /// ([`Effects::outsiders`]).
    pub ship_notifications: bool,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("id", &self.id)
            .field("held", &self.held.len())
            .field("unapplied", &self.unapplied.len())
            .field("reads", &self.reads.len())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// The router of replica `id`. `via`: where its clients are connected,
    /// in its guest's terms (embedded mode), carried by every request;
    /// `next_read`: the first read context (random on a server).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        config: Config,
        via: Option<statestore_guest::Via>,
        read_path: ReadPath,
        notify: Notify,
        limits: Limits,
        next_read: u64,
        now: Instant,
    ) -> Router {
        Router {
            id,
            config,
            via,
            read_path,
            notify,
            limits,
            held: VecDeque::new(),
            held_bytes: Count::default(),
            last_timer: None,
            deadline: None,
            leader_seen: (0, 0),
            unapplied: HashMap::new(),
            unapplied_bytes: Count::default(),
            unapplied_topics: HashMap::new(),
            gone: HashMap::new(),
            reads: HashMap::new(),
            reads_bytes: Count::default(),
            forgot: now,
            next_read,
            timed_out: Answered::new(TIMED_OUT_WITHIN, TIMED_OUT_BYTES),
            resent: Answered::new(ANSWERED_WITHIN, ANSWERED_BYTES),
            answered: Answered::new(ANSWERED_WITHIN, ANSWERED_BYTES),
            counts: Counts::default(),
            metrics: None,
            store_metrics: None,
            ship_notifications: false,
        }
    }

    /// Counts its bytes (of requests held, kept to be sent again and
    /// waiting for reads, and of its memories of answers) with the other
    /// routers given `shared`, against the same bounds: a replica of many
    /// groups holds no more than one would.
    pub fn share(&mut self, shared: &SharedBytes) {
        self.held_bytes.share(&shared.held);
        self.unapplied_bytes.share(&shared.unapplied);
        self.reads_bytes.share(&shared.reads);
        self.answered.bytes.share(&shared.answered);
        self.timed_out.bytes.share(&shared.timed_out);
        self.resent.bytes.share(&shared.resent);
    }

    /// Where this replica's clients are connected, in its guest's terms.
    pub fn via(&self) -> Option<statestore_guest::Via> {
        self.via
    }

    /// What it did since the last call.
    pub fn take_counts(&mut self) -> Counts {
        std::mem::take(&mut self.counts)
    }

    /// Serves what a client sent: its reads with a read index (see
    /// [`ReadPath`]), the rest through the log ([`Router::submit_log`]).
    fn submit<B: Backend>(
        &mut self,
        now: Now,
        held: Held,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        let Held::Requests { at, messages, sent } = held else {
            self.submit_log(now, held, replica, fx);
            return Ok(());
        };
        if replica.leader() == 0 {
            self.hold(Held::Requests { at, messages, sent });
            return Ok(());
        }
        if sent {
            // In flight already: a read index would answer it a second
            // time, and one answered meanwhile is done.
            let messages: Vec<InboundMessage> = messages
                .into_iter()
                .filter(|m| key_of(m).is_none_or(|k| !self.answered.contains(&k)))
                .collect();
            if !messages.is_empty() {
                self.submit_log(now, Held::Requests { at, messages, sent }, replica, fx);
            }
            return Ok(());
        }
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        let positions = match replica.store_mut().reads(&wire::encode_batch(&inputs)) {
            Ok(p) => p,
            Err(crate::GuestError::Refused(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if positions.is_empty() {
            self.submit_log(now, Held::Requests { at, messages, sent }, replica, fx);
            return Ok(());
        }
        let index = self.read_path == ReadPath::Index && replica.may_read_index();
        let (reads, rest, by_log) =
            split_reads(messages, &positions, index, &self.unapplied_topics);
        if let Some(metrics) = &self.metrics {
            metrics.reads.with_label_values(&["log"]).inc_by(by_log);
        }
        if !reads.is_empty() {
            self.read(now, reads, replica, fx);
        }
        if !rest.is_empty() {
            self.submit_log(
                now,
                Held::Requests {
                    at,
                    messages: rest,
                    sent,
                },
                replica,
                fx,
            );
        }
        Ok(())
    }

    /// Asks for a read index for `messages` (reads): answered once this
    /// replica has applied it, or through the log after
    /// [`Limits::read_wait`].
    fn read<B: Backend>(
        &mut self,
        now: Now,
        messages: Vec<InboundMessage>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) {
        let bytes: usize = messages
            .iter()
            .map(crate::store::driver::message_bytes)
            .sum();
        if self.reads_bytes.all() + bytes > READ_BYTES {
            self.submit_log(
                now,
                Held::Requests {
                    at: now.at,
                    messages,
                    sent: false,
                },
                replica,
                fx,
            );
            return;
        }
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        let batch = wire::encode_batch(&inputs);
        let ctx = self.next_read;
        self.next_read = self.next_read.wrapping_add(1);
        replica.read_index(ctx);
        self.reads_bytes.add(bytes);
        self.reads.insert(
            ctx,
            PendingRead {
                at: now.at,
                messages,
                batch,
                bytes,
            },
        );
    }

    /// Reads that waited [`Limits::read_wait`] go through the log.
    fn reads_to_log<B: Backend>(&mut self, now: Now, replica: &mut Replica<B>, fx: &mut Effects) {
        let wait = self.limits.read_wait;
        let late: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| now.at.saturating_duration_since(r.at) >= wait)
            .map(|(ctx, _)| *ctx)
            .collect();
        let mut messages = Vec::new();
        for ctx in late {
            if let Some(r) = self.reads.remove(&ctx) {
                self.reads_bytes.sub(r.bytes);
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
        self.counts.reads_to_log += messages.len() as u64;
        if let Some(metrics) = &self.metrics {
            metrics
                .reads
                .with_label_values(&["log"])
                .inc_by(messages.len() as u64);
        }
        self.submit_in_order(now, messages, false, replica, fx);
    }

    /// The answers to the reads whose read index has been applied.
    fn answer_reads<B: Backend>(
        &mut self,
        replica: &mut Replica<B>,
        out: &mut Vec<Output>,
    ) -> Result<()> {
        for ctx in replica.take_reads() {
            let Some(r) = self.reads.remove(&ctx) else {
                continue; // gone through the log meanwhile
            };
            self.reads_bytes.sub(r.bytes);
            self.counts.index_reads += r.messages.len() as u64;
            if let Some(metrics) = &self.metrics {
                metrics
                    .reads
                    .with_label_values(&["index"])
                    .inc_by(r.messages.len() as u64);
            }
            if let Some(metrics) = &self.store_metrics {
                metrics.answered(r.at, r.messages.len());
            }
            let outputs = match replica.query(&r.batch) {
                Ok(outputs) => outputs,
                Err(e @ crate::GuestError::Refused(_)) => {
                    // Not ours to stop on (the batch is our own encoding):
                    // its clients retry.
                    warn!(error = %format!("{e:#}"), "reads the guest refused: not answered");
                    continue;
                }
                Err(e) => return Err(anyhow::Error::from(e).context("answering reads")),
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
    fn submit_log<B: Backend>(
        &mut self,
        now: Now,
        held: Held,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) {
        let leader = replica.leader();
        if leader == 0 {
            self.hold(held);
            return;
        }
        let batch = match &held {
            Held::Requests { at, messages, sent } => {
                self.track(now, *at, messages);
                if *sent {
                    for k in messages.iter().filter_map(key_of) {
                        self.resent.insert(now.at, k);
                    }
                }
                let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
                wire::encode_batch(&inputs)
            }
            Held::Gone(_, id) => match self.via {
                Some(via) => {
                    if self.gone.len() < GONE_KEPT {
                        self.gone.insert(id.clone(), now.at);
                    }
                    wire::encode_batch(&[Input::DisconnectedVia(id, via)])
                }
                None => wire::encode_batch(&[Input::Disconnected(id)]),
            },
            Held::Started(_) => match self.via {
                Some(via) => wire::encode_batch(&[Input::ReplicaStarted(via)]),
                None => return,
            },
            Held::Agent(_, batch) => batch.clone(),
        };
        if leader == self.id {
            if let Err(e) = replica.propose_wire(self.id, &batch, now.ms) {
                tracing::debug!(error = %format!("{e:#}"), "proposal refused; held");
                // Sent before, perhaps (this may be a resend): unknown.
                let held = match held {
                    Held::Requests { at, messages, .. } => Held::Requests {
                        at,
                        messages,
                        sent: true,
                    },
                    other => other,
                };
                self.hold(held);
            }
        } else {
            self.counts.forwarded += match &held {
                Held::Requests { messages, .. } => messages.len() as u64,
                Held::Gone(..) | Held::Started(_) | Held::Agent(..) => 1,
            };
            fx.forwards.push((leader, batch));
        }
    }

    /// Keeps requests (taken at `at`) until they are applied (see
    /// `unapplied`); one already kept keeps its time.
    fn track(&mut self, now: Now, at: Instant, messages: &[InboundMessage]) {
        for m in messages {
            if !answered_at_all(m) {
                continue;
            }
            let Some(topic) = &m.response_topic else {
                continue;
            };
            let Some(key) = key_of(m) else { continue };
            if self.unapplied.contains_key(&key) {
                continue;
            }
            let bytes = crate::store::driver::message_bytes(m);
            if self.unapplied_bytes.all() + bytes > RESEND_BYTES {
                // Past the bound: forget what is too old to send again.
                self.forget_unapplied(now);
                if self.unapplied_bytes.all() + bytes > RESEND_BYTES {
                    return;
                }
            }
            self.unapplied_bytes.add(bytes);
            *self.unapplied_topics.entry(topic.clone()).or_default() += 1;
            self.unapplied.insert(
                key,
                Tracked {
                    at,
                    sent: now.at,
                    message: m.clone(),
                },
            );
        }
    }

    /// Forgets requests too old to send again ([`Limits::resend_within`]).
    /// Their clients get no answer from this replica unless one is applied.
    fn forget_unapplied(&mut self, now: Now) {
        let within = self.limits.resend_within;
        self.unapplied
            .retain(|_, t| now.at.saturating_duration_since(t.at) < within);
        self.recount();
    }

    fn recount(&mut self) {
        self.unapplied_topics.clear();
        let mut bytes = 0;
        for ((topic, _), Tracked { message: m, .. }) in &self.unapplied {
            bytes += crate::store::driver::message_bytes(m);
            *self.unapplied_topics.entry(topic.clone()).or_default() += 1;
        }
        self.unapplied_bytes.set(bytes);
    }

    /// No longer to be sent again (applied, or answered 408).
    fn untrack(&mut self, key: &Key) -> Option<Tracked> {
        let t = self.unapplied.remove(key)?;
        self.unapplied_bytes
            .sub(crate::store::driver::message_bytes(&t.message));
        if let Some(n) = self.unapplied_topics.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.unapplied_topics.remove(&key.0);
            }
        }
        Some(t)
    }

    /// Whether `m`, a reply to a request this replica took, is that
    /// request's first answer (then it is no longer sent again). One sent
    /// more than once may be applied more than once, and one answered 408
    /// may be applied after: only the first answer goes out.
    fn first_answer(&mut self, now: Now, m: &crate::OutboundMessage) -> bool {
        let Some(corr) = &m.correlation_data else {
            return true;
        };
        let key = (m.topic.to_string(), corr.to_vec());
        if self.timed_out.contains(&key) || self.answered.contains(&key) {
            return false;
        }
        if let Some(Tracked { at, .. }) = self.untrack(&key) {
            if let Some(metrics) = &self.metrics {
                metrics
                    .commit
                    .observe(now.at.saturating_duration_since(at).as_secs_f64());
            }
            if let Some(metrics) = &self.store_metrics {
                metrics.answered(at, 1);
            }
        }
        if self.resent.contains(&key) {
            self.answered.insert(now.at, key);
        }
        true
    }

    /// A new leader: what the old one may have lost goes to it again, and
    /// this replica's start (`replica-started`, which the guest may apply
    /// any number of times: it drops only what earlier lives registered).
    fn resend<B: Backend>(&mut self, now: Now, replica: &mut Replica<B>, fx: &mut Effects) {
        self.submit_log(now, Held::Started(now.at), replica, fx);
        let within = self.limits.resend_within;
        self.gone
            .retain(|_, at| now.at.saturating_duration_since(*at) < within);
        let gone: Vec<String> = self.gone.keys().cloned().collect();
        if !gone.is_empty() {
            info!(
                clients = gone.len(),
                "a new leader: client disconnects reported lately are reported to it again"
            );
        }
        for id in gone {
            self.submit_log(now, Held::Gone(now.at, id), replica, fx);
        }
        self.forget_unapplied(now);
        // They stay tracked, with the time they were taken.
        let mut sent: Vec<(Instant, InboundMessage)> = self
            .unapplied
            .values_mut()
            .map(|t| {
                t.sent = now.at;
                (t.at, t.message.clone())
            })
            .collect();
        // Reads waiting for an index from the old leader will not get one:
        // they go through the log too.
        let reads: Vec<PendingRead> = self.reads.drain().map(|(_, r)| r).collect();
        self.reads_bytes.set(0);
        if let Some(metrics) = &self.metrics {
            let n: usize = reads.iter().map(|r| r.messages.len()).sum();
            metrics.reads.with_label_values(&["log"]).inc_by(n as u64);
        }
        let reads: Vec<(Instant, InboundMessage)> = reads
            .into_iter()
            .flat_map(|r| r.messages.into_iter().map(move |m| (r.at, m)))
            .collect();
        if sent.is_empty() && reads.is_empty() {
            return;
        }
        info!(
            requests = sent.len() + reads.len(),
            leader = replica.leader(),
            "a new leader: requests not yet applied are sent to it again"
        );
        self.counts.resent += (sent.len() + reads.len()) as u64;
        sent.sort_by_key(|(at, _)| *at);
        self.submit_in_order(now, sent, true, replica, fx);
        self.submit_in_order(now, reads, false, replica, fx);
    }

    /// Submits `requests` (each with the time it was taken) to the log
    /// again, in the order they were taken.
    fn submit_in_order<B: Backend>(
        &mut self,
        now: Now,
        mut requests: Vec<(Instant, InboundMessage)>,
        sent: bool,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) {
        requests.sort_by_key(|(at, _)| *at);
        let mut i = 0;
        while i < requests.len() {
            let end = (i + crate::store::driver::MAX_BATCH).min(requests.len());
            let at = requests[i].0;
            let messages: Vec<InboundMessage> =
                requests[i..end].iter().map(|(_, m)| m.clone()).collect();
            // Tracked from when they were taken.
            self.track(now, at, &messages);
            self.submit_log(now, Held::Requests { at, messages, sent }, replica, fx);
            i = end;
        }
    }

    /// Sends again (to the same leader) what waited
    /// [`Limits::retry_after`] since it was last sent: a forward can be
    /// lost on a link that broke, or reach a leader just as it steps down
    /// (and is elected again in a new term, which sends everything again).
    fn retry<B: Backend>(&mut self, now: Now, replica: &mut Replica<B>, fx: &mut Effects) {
        let mut late: Vec<(Instant, InboundMessage)> = Vec::new();
        for t in self.unapplied.values_mut() {
            // One its client no longer waits for is not sent again.
            let expired = t.message.message_expiry_interval.is_some_and(|s| {
                now.at.saturating_duration_since(t.at) >= Duration::from_secs(u64::from(s))
            });
            if now.at.saturating_duration_since(t.sent) >= self.limits.retry_after && !expired {
                t.sent = now.at;
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
        self.counts.retried += late.len() as u64;
        self.submit_in_order(now, late, true, replica, fx);
    }

    /// Whether a tick would do nothing: the group is quiet (no leader
    /// change can come without waking it), nothing is held, in flight,
    /// waiting for a read index or remembered, and, as leader, no expiry is
    /// due by the deadline known for what it has applied. A replica of
    /// many idle groups skips their ticks.
    pub fn asleep<B: Backend>(&self, now: Now, replica: &Replica<B>) -> bool {
        if !replica.is_quiet()
            || !self.held.is_empty()
            || !self.unapplied.is_empty()
            || !self.reads.is_empty()
            || !self.gone.is_empty()
            || !self.timed_out.is_empty()
            || !self.resent.is_empty()
            || !self.answered.is_empty()
        {
            return false;
        }
        if !replica.is_leader() {
            return true;
        }
        let clock = now.ms.max(replica.log_now());
        match self.deadline {
            Some((at, next)) if at == replica.applied() => next.is_none_or(|due| due > clock),
            _ => false,
        }
    }

    /// A tick (after the replica's own): a new leader gets what waited
    /// for one; what waited too long is answered; reads late for their
    /// index go through the log; the leader proposes expiry when due.
    pub fn tick<B: Backend>(
        &mut self,
        now: Now,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        let leader = replica.leader();
        let term = replica.term();
        if leader != self.leader_seen.0 || (leader != 0 && term != self.leader_seen.1) {
            info!(replica = self.id, leader, term, "leader changed");
            self.leader_seen = (leader, term);
            if let Some(m) = &self.metrics {
                m.leader_changes.inc();
            }
            if leader != 0 {
                self.resend(now, replica, fx);
            } else {
                self.hold_unapplied(now);
            }
        }
        // Held requests: to the leader once there is one.
        if leader != 0 {
            let held = std::mem::take(&mut self.held);
            self.held_bytes.set(0);
            for h in held {
                self.submit(now, h, replica, fx)?;
            }
        }
        self.reads_to_log(now, replica, fx);
        if now.at.saturating_duration_since(self.forgot) >= Duration::from_secs(1) {
            // Requests never answered (expired, refused) age out; those
            // waiting too long go to the leader again.
            self.forget_unapplied(now);
            let within = self.limits.resend_within;
            self.gone
                .retain(|_, at| now.at.saturating_duration_since(*at) < within);
            self.timed_out.age(now.at);
            self.resent.age(now.at);
            self.answered.age(now.at);
            self.forgot = now.at;
            // A leader loses none of its own proposals without a new term.
            if leader != 0 && leader != self.id {
                self.retry(now, replica, fx);
            }
        }
        self.answer_held(now, fx);
        // Expiry: the leader proposes a timer entry when the guest is due.
        if replica.is_leader()
            && self
                .last_timer
                .is_none_or(|t| now.at.saturating_duration_since(t) >= self.limits.timer_every)
        {
            let clock = now.ms.max(replica.log_now());
            let applied = replica.applied();
            let next = match self.deadline {
                Some((at, next)) if at == applied => next,
                _ => {
                    let next = replica.store_mut().next_deadline()?;
                    self.deadline = Some((applied, next));
                    next
                }
            };
            if let Some(due) = next
                && due <= clock
                && replica.propose(self.id, &[], clock).is_ok()
            {
                self.last_timer = Some(now.at);
            }
        }
        Ok(())
    }

    /// 500 replies to the inputs of an entry the guest failed on (each a
    /// batch of one, and why).
    fn failure_replies(&self, failed: &[(Vec<u8>, String)], now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        for (one, why) in failed {
            let Ok(inputs) = wire::decode_batch(one) else {
                continue;
            };
            for input in inputs {
                let wire::InputRef::Message(m) = input else {
                    continue;
                };
                let msg = statestore_guest::InboundMessage {
                    topic: m.topic.to_string(),
                    qos: m.qos,
                    response_topic: m.response_topic.map(str::to_string),
                    correlation_data: m.correlation_data.map(<[u8]>::to_vec),
                    message_expiry_interval: m.message_expiry_interval,
                    received_at: m.received_at,
                    ..Default::default()
                };
                let text = format!("the state store failed while handling this request: {why}");
                if let Some(reply) = statestore_guest::StateMachine::host_reply(
                    &self.config,
                    &msg,
                    now,
                    statestore_guest::HostReply::InternalError(text),
                ) {
                    out.push(Output::Publish(reply));
                }
            }
        }
        out
    }

    /// What this replica publishes of `applied`, and the answers to reads
    /// whose index is now applied.
    pub fn applied<B: Backend>(
        &mut self,
        now: Now,
        applied: Vec<Applied>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        let ship = self.ship_notifications && replica.is_leader();
        for a in applied {
            if a.replayed {
                continue;
            }
            let ours = a.origin == self.id;
            let failed = if ours {
                self.failure_replies(&a.failed, a.now)
            } else {
                Vec::new()
            };
            for o in a.outputs.into_iter().chain(failed) {
                let publish = match &o {
                    Output::Publish(m) if m.kind == PublishKind::Notification => {
                        match self.notify {
                            Notify::Everywhere => true,
                            // One publisher at a time: the leader that
                            // appended the change, in log order.
                            Notify::Origin => a.led,
                        }
                    }
                    Output::Publish(m) => ours && self.first_answer(now, m),
                    Output::Violation { .. } => ours,
                    Output::Journal(_) | Output::More(_) => false,
                };
                if ship && matches!(&o, Output::Publish(m) if m.kind == PublishKind::Notification) {
                    fx.outsiders.push(o.clone());
                }
                if publish {
                    fx.replies.push(o);
                }
            }
        }
        self.answer_reads(replica, &mut fx.replies)
    }
}
