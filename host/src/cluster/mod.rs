//! Replication: the guest as a replicated state machine, on TiKV's `raft`
//! crate (raft-rs). This module is the only one that knows Raft.
//!
//! Why raft-rs rather than openraft: it is sans-IO, as the guest is. The
//! host drives it (`tick`, `step`, `propose`, then a `Ready` to persist,
//! send and apply), so a whole cluster runs in one thread under a simulated
//! clock and network, replayable from a seed (`sim`), exactly as the guest
//! runs under simulated time. openraft owns its timers and tasks on tokio,
//! which a seeded simulation would have to wrap.
//!
//! What the log carries: the guest's *inputs*, in the guest's own batch
//! encoding (`wit/WIRE.md`), each stamped with the replica that received it
//! and the leader's time:
//!
//! ```text
//! entry = u8 version (1), u64 origin (replica id), u64 now (ms), batch
//! ```
//!
//! Every replica applies every committed entry to its own guest, in log
//! order, with the entry's `now` (never its own clock): the same inputs in
//! the same order give every replica the same state and the same outputs.
//! The replica an entry came from publishes its replies; the others drop
//! them. `now` never goes back along the log: a leader stamps at least the
//! newest `now` in its log, and a replica applies at least the last one
//! applied, so a new leader with a slower clock cannot make versions or
//! expiry go backwards.
//!
//! Membership: static at the start (the cluster files), changed while
//! running by Raft conf changes, one voter at a time ([`Change`],
//! `statestore cluster add` / `remove`). A conf change entry carries the
//! added replica's address record; [`Replica::members`] keeps those
//! records, and snapshots carry them. A replica that joins has no
//! membership until a snapshot names it; every replica snapshots when it
//! applies an addition, so that is how a new one always starts.
//!
//! The parts: `log` (the Raft log on disk, anchored by `raft-state`),
//! [`Replica`] (raft-rs and the guest), `router` (what a replica does with
//! its clients' requests, without I/O), `node` (one replica as a server:
//! the router and the replica over real links and a real transport), `net`
//! (the links between replicas), `probe` (asking the others who the
//! members are), `file` (the cluster file), `sim` (the whole cluster, the
//! same routers included, under simulated faults) and `linear` (the
//! linearizability checker the simulation and the tests use).

pub mod admin;
pub mod admin_tenants;
pub(crate) mod file;
mod format;
mod host_entries;
#[cfg(any(test, feature = "testing"))]
pub mod linear;
pub(crate) mod log;
mod membership;
pub(crate) mod net;
pub mod node;
pub(crate) mod operator;
pub mod partition;
mod persist;
pub(crate) mod pipeline;
pub(crate) mod pki;
pub mod placement;
pub(crate) mod probe;
pub mod quiet;
mod raft_log;
mod readies;
mod recover;
pub mod router;
#[cfg(any(test, feature = "testing"))]
pub mod sim;

#[cfg(any(test, feature = "testing"))]
pub(crate) use persist::persist_round;
pub(crate) use persist::{round_synced, round_to_sync, sync_files};

use anyhow::{Context, Result, bail};
use raft::prelude::{Entry, EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};

use format::decode_snapshot;
pub use format::{AgreedTenant, EntryRef, HostEntry, Tenancy};
pub(crate) use format::{Members, decode_entry, decode_host_entry, encode_entry};
pub use log::LogStore;
pub use readies::{Applying, Unpersisted, Unsynced};
use statestore_guest::wire;

use crate::{Backend, Input, Output};

/// The outputs of one applied entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// Its index in the log.
    pub index: u64,
    /// The replica that received its inputs.
    pub origin: u64,
    /// The `now` it was applied with.
    pub now: u64,
    /// Applied again after a restart: its outputs went out before.
    pub replayed: bool,
    /// This replica led the term the entry was appended in (in this life):
    /// it proposed it as leader. Exactly one replica applies an entry so
    /// (unless it crashes first), and it applies them in log order.
    pub led: bool,
    /// Every output the guest made of it (the origin publishes them).
    pub outputs: Vec<Output>,
    /// Its inputs the guest failed on (each a batch of one), and why: the
    /// origin answers them 500 (see [`Replica`]'s poison entries).
    pub failed: FailedInputs,
}

/// How many of the terms it led a replica remembers ([`Applied::led`]).
const LED_TERMS: usize = 16;

/// Inputs the guest failed on (each a batch of one), and why.
pub(crate) type FailedInputs = Vec<(Vec<u8>, String)>;

/// Election timing, in ticks.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A leader sends heartbeats this often.
    pub heartbeat: usize,
    /// A follower that hears no leader for a random time in
    /// `[election_min, election_max)` campaigns.
    pub election_min: usize,
    /// See `election_min`.
    pub election_max: usize,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat: 2,
            election_min: 10,
            election_max: 20,
        }
    }
}

/// When a replica makes a log entry durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Synced before the replica acknowledges it (to the leader, or as the
    /// leader counting itself): an acknowledged write survives the loss of
    /// power on every replica but a minority.
    Always,
    /// Synced by the caller now and then ([`Replica::sync`]); a replica
    /// acknowledges entries still in its page cache.
    Later,
}

/// When a replica compacts its log into a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Compaction {
    /// After this many entries applied since the last snapshot.
    pub entries: u64,
    /// Or after this many bytes of log.
    pub bytes: u64,
    /// Neither before the log is as long as the last snapshot, up to this
    /// many bytes (0: no such wait): a snapshot holds the whole state, so
    /// a large state is written at most once per as many bytes logged
    /// (its log, in memory too, at most as large as it).
    pub follow: u64,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            entries: 100_000,
            bytes: 64 << 20,
            follow: 1 << 30,
        }
    }
}

impl Compaction {
    /// Whether a snapshot is due: `since` entries applied after the last
    /// one, the log `log_bytes` long, the last snapshot `snapshot_bytes`.
    fn due(&self, since: u64, log_bytes: u64, snapshot_bytes: u64) -> bool {
        let follow = snapshot_bytes.min(self.follow);
        since > 0 && log_bytes >= follow && (since >= self.entries || log_bytes >= self.bytes)
    }
}

/// Makes a replica's guest: empty (`None`) or from a snapshot.
pub(crate) type MakeStore<B> = Box<dyn FnMut(Option<&[u8]>) -> Result<B> + Send>;

/// A change of membership to propose ([`Replica::propose_change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Replica `id` becomes a voter; `record` is how the others reach it.
    Add {
        /// Its id.
        id: u64,
        /// Its address record (opaque here).
        record: Vec<u8>,
    },
    /// Replica `id` leaves.
    Remove(u64),
    /// Replica `id` receives the log without a vote, until it has caught
    /// up (a group's copy moving to it); then [`Change::Add`] makes it a
    /// voter.
    Learner(u64),
}

/// What a replica knows of itself, for `cluster status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Its id.
    pub id: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    /// Its term.
    pub term: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Its commit index.
    pub commit: u64,
    /// Index of the last entry applied to its guest.
    pub applied: u64,
    /// Index of its last log entry.
    pub last_index: u64,
    /// Its last snapshot's index.
    pub snapshot: u64,
    /// As leader: each replica's matched index.
    pub matched: Vec<(u64, u64)>,
}

/// One replica: its Raft node over its log, and its guest.
pub struct Replica<B: Backend> {
    id: u64,
    node: RawNode<LogStore>,
    store: B,
    make: MakeStore<B>,
    durability: Durability,
    compaction: Compaction,
    /// Index of the last entry applied to the guest.
    applied: u64,
    /// The `now` of the last entry applied.
    applied_now: u64,
    /// The newest `now` of any entry in the log: what a leader stamps at
    /// least.
    log_now: u64,
    /// Entries up to here were applied before a restart: their outputs
    /// were published then.
    replayed_to: u64,
    /// The last terms this replica led in this life (a few: the entries
    /// being applied are of recent terms).
    led_terms: std::collections::VecDeque<u64>,
    /// Ticks each peer has spent waiting for a snapshot (as leader).
    snapshot_wait: std::collections::HashMap<u64, u32>,
    /// Read indexes Raft confirmed: (context, index), served once applied.
    read_states: Vec<(u64, u64)>,
    /// The address records of replicas added while running.
    members: Members,
    /// Membership changes applied (a counter the host watches).
    changes: u64,
    /// The groups' moves the cluster agreed (group 0's), and the tenants
    /// it added and removed while running, in the order it agreed
    /// (`moves.tenants`; see [`HostEntry`]).
    moves: placement::Moves,
    /// A membership change added a replica: snapshot now, so that it
    /// starts from a snapshot that names it, never from the log's start.
    compact_now: bool,
    /// Entries after the last snapshot whose inputs the guest failed on:
    /// their positions in the entry's batch (skipped when the guest is
    /// made again from the log).
    poisoned: std::collections::BTreeMap<u64, Vec<usize>>,
    /// Whether its clock is stopped for lack of anything to do.
    quiet: quiet::Quiet,
    /// A deferred ready that held a snapshot, not yet durable: its number.
    /// raft-rs takes the snapshot's index for applied (`advance_apply`)
    /// only once it is persisted: until then no deferred ready advances
    /// the applied index ([`Replica::ready_defer`]).
    snapshot_unpersisted: Option<u64>,
}

impl<B: Backend> std::fmt::Debug for Replica<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("role", &self.node.raft.state)
            .field("term", &self.node.raft.term)
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}

/// Ticks a peer may wait for a snapshot before it is sent again (a lost
/// snapshot message would otherwise hold it back for good).
const SNAPSHOT_RETRY_TICKS: u32 = 50;

impl<B: Backend> Replica<B> {
    /// Replica `id` over its `log` (fresh, or kept across a restart): its
    /// guest is made from the log's snapshot (or empty) by `make`, and the
    /// committed entries after it are applied again.
    pub fn new(
        id: u64,
        log: LogStore,
        mut make: MakeStore<B>,
        timing: Timing,
        durability: Durability,
        compaction: Compaction,
    ) -> Result<Replica<B>> {
        let snapshot = raft::Storage::snapshot(&log, 0, 0).ok();
        let (store, applied, applied_now, members, moves) = match &snapshot {
            Some(s) => {
                let d = decode_snapshot(&s.data)?;
                (
                    make(Some(d.guest))?,
                    s.get_metadata().index,
                    d.applied_now,
                    d.members,
                    // Snapshots before format 5 have no moves: their
                    // tenants are the snapshot's.
                    placement::Moves {
                        tenants: d.tenants,
                        ..d.moves
                    },
                )
            }
            None => (
                make(None)?,
                0,
                0,
                Members::new(),
                placement::Moves::default(),
            ),
        };
        let replayed_to = log.hard_state().commit;
        let config = raft::Config {
            id,
            heartbeat_tick: timing.heartbeat,
            election_tick: timing.election_min,
            min_election_tick: timing.election_min,
            max_election_tick: timing.election_max,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            applied,
            ..Default::default()
        };
        let logger = slog::Logger::root(raft_log::RaftLog, slog::o!("replica" => id));
        let node = RawNode::new(&config, log, &logger).context("starting the Raft node")?;
        let mut replica = Replica {
            id,
            node,
            store,
            make,
            durability,
            compaction,
            applied,
            applied_now,
            log_now: applied_now,
            replayed_to,
            led_terms: std::collections::VecDeque::new(),
            snapshot_wait: Default::default(),
            snapshot_unpersisted: None,
            read_states: Vec::new(),
            members,
            changes: 0,
            moves,
            compact_now: false,
            poisoned: Default::default(),
            quiet: Default::default(),
        };
        replica.log_now = replica.log_now.max(replica.newest_now_in_log());
        Ok(replica)
    }

    /// The newest `now` in the stored log (after a restart).
    fn newest_now_in_log(&self) -> u64 {
        let store = self.node.store();
        let (Ok(first), Ok(last)) = (
            raft::Storage::first_index(store),
            raft::Storage::last_index(store),
        ) else {
            return 0;
        };
        if last < first {
            return 0;
        }
        let entries = raft::Storage::entries(
            store,
            first,
            last + 1,
            None,
            raft::GetEntriesContext::empty(false),
        )
        .unwrap_or_default();
        entries
            .iter()
            .filter_map(|e| decode_entry(&e.data).ok().map(|d| d.now))
            .max()
            .unwrap_or(0)
    }

    /// Its id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether it leads.
    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The leader it knows of (0: none).
    pub fn leader(&self) -> u64 {
        self.node.raft.leader_id
    }

    /// Its current term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// Index of the last entry applied to its guest.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The newest `now` stamped on its log.
    pub fn log_now(&self) -> u64 {
        self.log_now
    }

    /// Its guest.
    pub fn store_mut(&mut self) -> &mut B {
        &mut self.store
    }

    /// What it knows of itself.
    pub fn status(&self) -> Status {
        let raft = &self.node.raft;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        let mut matched: Vec<(u64, u64)> = if self.is_leader() {
            raft.prs()
                .iter()
                .map(|(id, pr)| (*id, pr.matched))
                .collect()
        } else {
            Vec::new()
        };
        matched.sort_unstable();
        Status {
            id: self.id,
            role: role.into(),
            term: raft.term,
            leader: raft.leader_id,
            commit: raft.raft_log.committed,
            applied: self.applied,
            last_index: raft.raft_log.last_index(),
            snapshot: self.node.store().snapshot_index(),
            matched,
        }
    }

    /// One tick of its logical clock (elections, heartbeats), unless the
    /// group is quiet.
    pub fn tick(&mut self) {
        if self.is_quiet() {
            return;
        }
        self.idle_tick();
        self.node.tick();
        if self.is_leader() {
            // A snapshot message that was lost leaves its peer waiting:
            // after a while, report it failed, so it is sent again.
            let waiting: Vec<u64> = self
                .node
                .raft
                .prs()
                .iter()
                .filter(|(_, pr)| pr.state == raft::ProgressState::Snapshot)
                .map(|(id, _)| *id)
                .collect();
            self.snapshot_wait.retain(|id, _| waiting.contains(id));
            for id in waiting {
                let t = self.snapshot_wait.entry(id).or_default();
                *t += 1;
                if *t >= SNAPSHOT_RETRY_TICKS {
                    *t = 0;
                    self.node.report_snapshot(id, raft::SnapshotStatus::Failure);
                }
            }
        } else {
            self.snapshot_wait.clear();
        }
    }

    /// A Raft message from a peer.
    pub fn step(&mut self, message: Message) -> Result<()> {
        self.wake_for(message.msg_type);
        self.node.step(message).context("a Raft message")
    }

    /// A peer could not be reached: Raft probes it again (and a snapshot
    /// in flight to it is sent again).
    pub fn unreachable(&mut self, peer: u64) {
        self.node.report_unreachable(peer);
    }

    /// Proposes `inputs`, received by `origin`, at the leader's `clock`
    /// (stamped with at least the newest `now` in the log). Only a leader
    /// takes proposals; the others refuse (the caller forwards or retries).
    pub fn propose(&mut self, origin: u64, inputs: &[Input<'_>], clock: u64) -> Result<u64> {
        self.propose_wire(origin, &wire::encode_batch(inputs), clock)
    }

    /// [`Replica::propose`] of a batch already in the guest's encoding (a
    /// follower forwarded it).
    pub fn propose_wire(&mut self, origin: u64, batch: &[u8], clock: u64) -> Result<u64> {
        self.must_lead()?;
        let now = clock.max(self.log_now);
        self.node
            .propose(vec![], encode_entry(origin, now, batch))
            .context("proposing")?;
        self.log_now = now;
        Ok(now)
    }

    /// Wakes it for a proposal, which only a leader takes.
    fn must_lead(&mut self) -> Result<()> {
        self.wake();
        if !self.is_leader() {
            bail!(
                "replica {} does not lead (leader: {})",
                self.id,
                self.leader()
            );
        }
        Ok(())
    }

    /// Asks Raft for a read index for the reads `ctx` names: the leader's
    /// commit index once a majority confirmed it still leads (a heartbeat
    /// round, no log entry). [`Replica::take_reads`] returns `ctx` once this
    /// replica has applied that index; nothing comes back if the leader is
    /// unknown, changes, or has not yet committed an entry of its term (the
    /// caller gives up after a while and sends the reads through the log).
    pub fn read_index(&mut self, ctx: u64) {
        self.wake();
        self.node.read_index(ctx.to_le_bytes().to_vec());
    }

    /// Whether a read index may be asked for now: not on a leader that has
    /// not yet committed an entry of its term (raft-rs drops the request;
    /// such reads go through the log at once).
    pub fn may_read_index(&self) -> bool {
        !self.is_leader() || self.node.raft.commit_to_current_term()
    }

    /// The contexts of reads whose index this replica has applied: its
    /// state now reflects every write acknowledged before they arrived, so
    /// [`Replica::query`] may answer them.
    pub fn take_reads(&mut self) -> Vec<u64> {
        let applied = self.applied;
        let mut ready = Vec::new();
        self.read_states.retain(|&(ctx, index)| {
            if index <= applied {
                ready.push(ctx);
                false
            } else {
                true
            }
        });
        ready
    }

    /// Answers the reads of `batch` (the guest's encoding) on the applied
    /// state, at the `now` of the last entry applied: what they would get
    /// as the next entry of the log, without one.
    pub fn query(&mut self, batch: &[u8]) -> std::result::Result<Vec<Output>, crate::GuestError> {
        let now = self.applied_now;
        whole(&mut self.store, batch, |s, b| s.query_wire(b, now))
    }

    /// Records in `raft-state` what the round's sync made durable, once
    /// what depended on it has gone ([`LogStore::witness`]).
    pub fn witness(&mut self) -> Result<()> {
        self.node.mut_store().witness()
    }

    /// Makes what was written to the log durable ([`Durability::Later`]).
    pub fn sync(&mut self) -> Result<()> {
        self.node.mut_store().sync()
    }

    /// Does what Raft has ready, in three steps; this is the first: hands
    /// over the messages that may go at once (a leader's appends, before
    /// its own write reaches the disk, so the followers' writes and its own
    /// overlap), installs a leader's snapshot and applies the entries
    /// already committed, whose replies may go out now, before this
    /// replica's new entries reach its disk (a reply never waits for the
    /// fsync of later requests). The caller must then, before anything
    /// else, write what it returns ([`Replica::ready_write`]), make it
    /// durable (`persist_round`), and finish ([`Replica::ready_finish`]).
    /// With [`Applying::AfterSync`] the committed entries wait for
    /// [`Replica::ready_finish`].
    pub fn ready_apply(
        &mut self,
        send: &mut dyn FnMut(Message),
        applying: Applying,
    ) -> Result<(Vec<Applied>, Option<Unpersisted>)> {
        let mut applied = Vec::new();
        if !self.node.has_ready() {
            return Ok((applied, None));
        }
        // A leader's entries are applied after a ready of its term: the
        // term is known as led by then.
        let term = self.node.raft.term;
        if self.is_leader() && self.led_terms.back() != Some(&term) {
            if self.led_terms.len() == LED_TERMS {
                self.led_terms.pop_front();
            }
            self.led_terms.push_back(term);
        }
        let mut ready = self.node.ready();
        for m in ready.take_messages() {
            send(m);
        }
        for rs in ready.take_read_states() {
            if let Ok(ctx) = <[u8; 8]>::try_from(rs.request_ctx.as_slice()) {
                self.read_states.push((u64::from_le_bytes(ctx), rs.index));
            }
        }
        if !ready.snapshot().is_empty() {
            let snap = ready.snapshot().clone();
            self.install(snap)?;
        }
        let committed = ready.take_committed_entries();
        match applying {
            Applying::Now => {
                self.apply(committed, &mut applied)?;
                Ok((applied, Some(Unpersisted(ready, Vec::new()))))
            }
            Applying::AfterSync => Ok((applied, Some(Unpersisted(ready, committed)))),
        }
    }

    /// Whether raft-rs has anything for [`Replica::ready_apply`] (messages,
    /// entries to persist or apply, read states, a snapshot).
    pub fn has_ready(&self) -> bool {
        self.node.has_ready()
    }

    /// The second step of a ready ([`Replica::ready_apply`]): writes the
    /// new entries and state (not synced: `persist_round` does that).
    pub fn ready_write(&mut self, Unpersisted(ready, to_apply): Unpersisted) -> Result<Unsynced> {
        for e in ready.entries() {
            if let Ok(d) = decode_entry(&e.data) {
                self.log_now = self.log_now.max(d.now);
            }
        }
        let log = self.node.mut_store();
        log.append(ready.entries())?;
        if let Some(hs) = ready.hs() {
            log.set_hardstate(hs.clone())?;
        }
        Ok(Unsynced(ready, to_apply))
    }

    /// Whether the log must be synced between [`Replica::ready_write`] and
    /// [`Replica::ready_finish`].
    fn syncs_each_write(&self) -> bool {
        self.durability == Durability::Always
    }

    /// Whether its rounds may be pipelined ([`Replica::ready_defer`]):
    /// syncing each write (and `raft-state` behind).
    pub fn pipelines(&self) -> bool {
        self.syncs_each_write() && !self.node.store().is_anchor_first()
    }

    /// The last step of a ready whose entries are written and not yet
    /// durable, when its sync runs while the replica goes on (see
    /// `node::pipelined`): raft-rs takes the ready back at once, counts a
    /// leader's own entries toward a commit and applies entries only once
    /// [`Replica::persisted`] says they are durable; what they commit is
    /// applied at a later ready. The ready's number, and the messages that
    /// must wait for the sync (a follower's acknowledgements; a leader's
    /// went already).
    pub fn ready_defer(
        &mut self,
        Unsynced(mut ready, to_apply): Unsynced,
    ) -> Result<(u64, Vec<Message>)> {
        if !to_apply.is_empty() {
            bail!(
                "a pipelined round with committed entries left to apply (its ready was taken with `Applying::AfterSync`)"
            );
        }
        let number = ready.number();
        let held = ready.take_persisted_messages();
        if !ready.snapshot().is_empty() {
            self.snapshot_unpersisted = Some(number);
        }
        self.node.advance_append_async(ready);
        // What this ready committed was applied (`ready_apply`); a
        // snapshot's index is applied only once it is durable: raft-rs
        // refuses an applied index past what it was told is persisted.
        if self.snapshot_unpersisted.is_none() {
            self.node.advance_apply();
        }
        self.maybe_compact()?;
        Ok((number, held))
    }

    /// What the readies up to `number` wrote is durable.
    pub fn persisted(&mut self, number: u64) {
        self.node.on_persist_ready(number);
        if self.snapshot_unpersisted.is_some_and(|n| n <= number) {
            self.snapshot_unpersisted = None;
            self.node.advance_apply();
        }
    }

    /// Its log.
    pub fn log_mut(&mut self) -> &mut LogStore {
        self.node.mut_store()
    }

    /// The last step of a ready ([`Replica::ready_apply`]): sends what
    /// waited for the log, then applies what the ready left to apply
    /// ([`Applying::AfterSync`]) and what the sync committed.
    pub fn ready_finish(
        &mut self,
        Unsynced(mut ready, to_apply): Unsynced,
        send: &mut dyn FnMut(Message),
    ) -> Result<Vec<Applied>> {
        let mut applied = Vec::new();
        let persisted = ready.take_persisted_messages();
        let mut light = self.node.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.node.mut_store().set_commit(commit)?;
        }
        // The messages first: a follower's acknowledgement (what a commit
        // waits for) does not wait for the guest.
        persisted.into_iter().for_each(&mut *send);
        light.take_messages().into_iter().for_each(&mut *send);
        self.apply(to_apply, &mut applied)?;
        let committed = light.take_committed_entries();
        self.apply(committed, &mut applied)?;
        self.node.advance_apply();
        self.maybe_compact()?;
        Ok(applied)
    }

    /// A leader's snapshot: the guest is replaced by its state.
    fn install(&mut self, snap: Snapshot) -> Result<()> {
        let index = snap.get_metadata().index;
        let d = decode_snapshot(&snap.data)?;
        let now = d.applied_now;
        let store = (self.make)(Some(d.guest)).context("restoring a leader's snapshot")?;
        self.members = d.members;
        self.moves = placement::Moves {
            tenants: d.tenants,
            ..d.moves
        };
        self.changes += 1;
        self.node.mut_store().install(snap)?;
        self.store = store;
        self.applied = index;
        self.applied_now = now;
        self.log_now = self.log_now.max(now);
        self.poisoned.clear();
        tracing::info!(
            replica = self.id,
            index,
            "caught up from the leader's snapshot"
        );
        Ok(())
    }

    /// Takes a snapshot and compacts the log once it has grown enough.
    fn maybe_compact(&mut self) -> Result<()> {
        self.prune_poisoned();
        if self.compact_now {
            // A member was added: it must catch up from a snapshot, never
            // from the log's start, so the log is compacted before the
            // leader sends it anything (not behind).
            self.node.mut_store().finish_compaction()?;
            if self.applied > self.node.store().snapshot_index() {
                self.compact()?;
                self.node.mut_store().finish_compaction()?;
            }
            self.compact_now = false;
            return Ok(());
        }
        if self.node.mut_store().poll_compaction()? {
            return Ok(()); // one at a time
        }
        let log = self.node.store();
        let since = self.applied.saturating_sub(log.snapshot_index());
        if !self
            .compaction
            .due(since, log.bytes(), log.snapshot_bytes() as u64)
        {
            return Ok(());
        }
        self.compact()
    }

    /// Takes a snapshot at the applied index and drops the log before it
    /// (behind, once its file is written: [`LogStore::compact`]).
    pub fn compact(&mut self) -> Result<()> {
        if self.applied <= self.node.store().snapshot_index() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let last = self.node.store().snapshot_bytes();
        let mut data = log::SnapshotBuf::with_capacity(last + last / 8);
        format::snapshot_header(
            self.applied_now,
            &self.members,
            (&self.moves.tenants, &self.moves),
            data.buf(),
        );
        self.store
            .snapshot_into(crate::SnapshotScope::Everything, data.buf())
            .context("a snapshot of the guest")?;
        let applied = self.applied;
        self.node.mut_store().compact(applied, data, started)
    }

    /// Forgets the poison entries the snapshot in place holds: a guest is
    /// made again from that snapshot, never applying them again. Not those
    /// of a snapshot still being written (behind): until it is in place, a
    /// guest is made again from the one before, and the log after it.
    fn prune_poisoned(&mut self) {
        let held = self.node.store().snapshot_index();
        if self
            .poisoned
            .first_key_value()
            .is_some_and(|(i, _)| *i <= held)
        {
            self.poisoned = self.poisoned.split_off(&(held + 1));
        }
    }

    /// Finishes a compaction whose snapshot was written on its own thread
    /// ([`LogStore::snapshots_behind`]), if it is written.
    pub fn poll_compaction(&mut self) -> Result<()> {
        self.node.mut_store().poll_compaction().map(drop)
    }

    /// Waits for a snapshot being written on its own thread, and finishes
    /// its compaction (before the replica stops).
    pub fn finish_compaction(&mut self) -> Result<()> {
        self.node.mut_store().finish_compaction()
    }

    /// Records its log's appends, bytes, fsync and snapshot durations in
    /// `metrics` from now on.
    pub fn set_log_metrics(&mut self, metrics: crate::metrics::JournalMetrics) {
        self.node.mut_store().set_metrics(metrics);
    }

    /// Applies committed entries to the guest.
    fn apply(&mut self, entries: Vec<Entry>, out: &mut Vec<Applied>) -> Result<()> {
        for entry in entries {
            if entry.index <= self.applied {
                continue; // in the snapshot the guest was made from
            }
            self.applied = entry.index;
            match entry.get_entry_type() {
                EntryType::EntryConfChange => {
                    self.apply_change(&entry)?;
                    continue;
                }
                EntryType::EntryConfChangeV2 => {
                    bail!(
                        "log entry {}: a joint membership change (this build proposes none)",
                        entry.index
                    );
                }
                EntryType::EntryNormal if entry.data.is_empty() => continue, // a new leader's
                EntryType::EntryNormal => {}
            }
            if self.joining() {
                // The log's start without the membership it started with:
                // applying it could make this replica think it alone votes.
                bail!(
                    "log entry {} reached a replica that has no membership yet (it joins from a snapshot, never from the log's start)",
                    entry.index
                );
            }
            if let Some(host) = decode_host_entry(&entry.data) {
                self.apply_host(entry.index, host);
                continue;
            }
            let e =
                decode_entry(&entry.data).with_context(|| format!("log entry {}", entry.index))?;
            let now = e.now.max(self.applied_now);
            self.applied_now = now;
            let (outputs, failed) = match whole(&mut self.store, e.batch, |s, b| {
                s.handle_wire(b, now)
            }) {
                Ok(outputs) => (outputs, Vec::new()),
                Err(crate::GuestError::Refused(refused)) => {
                    // The same on every replica: nothing applied.
                    tracing::warn!(index = entry.index, error = %refused, "a log entry the guest refuses: skipped");
                    (Vec::new(), Vec::new())
                }
                Err(err @ (crate::GuestError::Failed(_) | crate::GuestError::BadOutputs(_))) => {
                    self.recover(entry.index, e.batch, now, &err)
                        .with_context(|| format!("applying log entry {}", entry.index))?
                }
            };
            out.push(Applied {
                index: entry.index,
                origin: e.origin,
                now,
                replayed: entry.index <= self.replayed_to,
                led: self.led_terms.contains(&entry.term),
                outputs,
                failed,
            });
        }
        Ok(())
    }
}

/// Every output of `call` on `batch`: a call that stops early (its output
/// budget) is made again with the rest of the batch, as on every replica.
fn whole<B: Backend>(
    store: &mut B,
    batch: &[u8],
    mut call: impl FnMut(&mut B, &[u8]) -> std::result::Result<Vec<Output>, crate::GuestError>,
) -> std::result::Result<Vec<Output>, crate::GuestError> {
    let mut outputs = Vec::new();
    let mut batch = std::borrow::Cow::Borrowed(batch);
    loop {
        let mut out = call(store, &batch)?;
        let count = wire::batch_count(&batch);
        let handled = wire::handled(&mut out, count);
        out.retain(|o| !matches!(o, Output::More(_)));
        outputs.extend(out);
        if handled >= count {
            return Ok(outputs);
        }
        // Our own encoding: a batch it cannot cut is one the guest refuses.
        batch = std::borrow::Cow::Owned(wire::batch_after(&batch, handled)?);
    }
}

#[cfg(test)]
mod tests {
    use super::Compaction;

    /// A snapshot is due after the entries or the bytes of log, and, with a
    /// state larger than the log's threshold, not before the log is as long
    /// as the last snapshot (up to `follow`).
    #[test]
    fn a_snapshot_is_due_once_the_log_is_as_long_as_the_last() {
        const MIB: u64 = 1 << 20;
        let c = Compaction::default();
        assert!(!c.due(0, 100 * MIB, 0), "nothing applied since");
        assert!(!c.due(99_999, 63 * MIB, MIB));
        assert!(c.due(100_000, MIB, MIB), "entries");
        assert!(c.due(10, 64 * MIB, 40 * MIB), "bytes");
        // A state of 500 MiB: not before 500 MiB of log.
        assert!(!c.due(100_000, 64 * MIB, 500 * MIB));
        assert!(!c.due(1_000_000, 499 * MIB, 500 * MIB));
        assert!(c.due(10, 500 * MIB, 500 * MIB));
        // Up to `follow`.
        assert!(c.due(10, 1024 * MIB, 4096 * MIB));
        let eager = Compaction { follow: 0, ..c };
        assert!(eager.due(100_000, MIB, 500 * MIB));
    }
}
