//! Replication (issue 20, `../shared/design/HA.md`): the guest as a
//! replicated state machine, on TiKV's `raft` crate (raft-rs). This module
//! is the only one that knows Raft.
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
//! Step 1 (this): replicas over raft-rs's in-memory storage, the entry
//! format, proposing and applying, and the simulation that checks them.
//! Still to come: the journal as the Raft log store (durability per fsync
//! policy), snapshots for replicas that fall behind, the network transport,
//! `serve --cluster`, forwarding, read index, `cluster status`.

pub mod sim;

use anyhow::{Context, Result, bail};
use raft::prelude::{ConfState, Entry, EntryType, Message};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};
use statestore_guest::wire;

use crate::{Backend, Input, Output};

/// The format version of an entry this build writes and reads.
pub const ENTRY_VERSION: u8 = 1;

/// An entry of the log, as proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The replica that received the inputs (it publishes the replies).
    pub origin: u64,
    /// The leader's time, ms.
    pub now: u64,
    /// The inputs, in the guest's batch encoding.
    pub batch: &'a [u8],
}

/// Encodes an entry of `inputs`.
pub fn encode_entry(origin: u64, now: u64, inputs: &[Input<'_>]) -> Vec<u8> {
    let batch = wire::encode_batch(inputs);
    let mut out = Vec::with_capacity(17 + batch.len());
    out.push(ENTRY_VERSION);
    out.extend_from_slice(&origin.to_le_bytes());
    out.extend_from_slice(&now.to_le_bytes());
    out.extend_from_slice(&batch);
    out
}

/// Decodes an entry (its batch is left to the guest).
pub fn decode_entry(data: &[u8]) -> Result<EntryRef<'_>> {
    let Some((&version, rest)) = data.split_first() else {
        bail!("an empty log entry");
    };
    if version != ENTRY_VERSION {
        bail!("log entry format {version} (this build reads {ENTRY_VERSION})");
    }
    if rest.len() < 16 {
        bail!("a log entry of {} bytes", data.len());
    }
    let (origin, rest) = rest.split_at(8);
    let (now, batch) = rest.split_at(8);
    Ok(EntryRef {
        origin: u64::from_le_bytes(origin.try_into().expect("8 bytes")),
        now: u64::from_le_bytes(now.try_into().expect("8 bytes")),
        batch,
    })
}

/// The outputs of one applied entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// Its index in the log.
    pub index: u64,
    /// The replica that received its inputs.
    pub origin: u64,
    /// The `now` it was applied with.
    pub now: u64,
    /// Every output the guest made of it (the origin publishes them).
    pub outputs: Vec<Output>,
}

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

/// One replica: its Raft node over its log storage, and its guest.
pub struct Replica<B: Backend> {
    id: u64,
    node: RawNode<MemStorage>,
    store: B,
    /// Index of the last entry applied to the guest.
    applied: u64,
    /// The `now` of the last entry applied.
    applied_now: u64,
    /// The newest `now` of any entry in the log: what a leader stamps at
    /// least.
    log_now: u64,
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

/// A fresh log for a cluster of `voters`: every replica starts from the
/// same membership (static, to start with).
pub fn new_storage(voters: &[u64]) -> MemStorage {
    MemStorage::new_with_conf_state(ConfState::from((voters.to_vec(), vec![])))
}

impl<B: Backend> Replica<B> {
    /// Replica `id` over `storage` (a fresh one from [`new_storage`], or
    /// the log it kept across a restart) with an empty guest `store`: the
    /// committed entries are applied to it again from the start of the log.
    pub fn new(id: u64, storage: MemStorage, store: B, timing: Timing) -> Result<Replica<B>> {
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
            applied: 0,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&config, storage, &logger).context("starting the Raft node")?;
        let mut replica = Replica {
            id,
            node,
            store,
            applied: 0,
            applied_now: 0,
            log_now: 0,
        };
        replica.log_now = replica.newest_now_in_log();
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

    /// Its guest.
    pub fn store_mut(&mut self) -> &mut B {
        &mut self.store
    }

    /// One tick of its logical clock (elections, heartbeats).
    pub fn tick(&mut self) {
        self.node.tick();
    }

    /// A Raft message from a peer.
    pub fn step(&mut self, message: Message) -> Result<()> {
        self.node.step(message).context("a Raft message")
    }

    /// Proposes `inputs`, received by `origin`, at the leader's `clock`
    /// (stamped with at least the newest `now` in the log). Only a leader
    /// takes proposals; the others refuse (the caller forwards or retries).
    pub fn propose(&mut self, origin: u64, inputs: &[Input<'_>], clock: u64) -> Result<u64> {
        if !self.is_leader() {
            bail!(
                "replica {} does not lead (leader: {})",
                self.id,
                self.leader()
            );
        }
        let now = clock.max(self.log_now);
        self.node
            .propose(vec![], encode_entry(origin, now, inputs))
            .context("proposing")?;
        self.log_now = now;
        Ok(now)
    }

    /// Does what Raft has ready: persists new entries and state, returns the
    /// messages to send to peers, and applies the committed entries to the
    /// guest (their outputs, in order).
    pub fn ready(&mut self) -> Result<(Vec<Message>, Vec<Applied>)> {
        let mut messages = Vec::new();
        let mut applied = Vec::new();
        if !self.node.has_ready() {
            return Ok((messages, applied));
        }
        let mut ready = self.node.ready();
        messages.extend(ready.take_messages());
        if !ready.snapshot().is_empty() {
            bail!("snapshots are not handled yet");
        }
        let committed = ready.take_committed_entries();
        self.apply(committed, &mut applied)?;
        let store = self.node.store().clone();
        for e in ready.entries() {
            if let Ok(d) = decode_entry(&e.data) {
                self.log_now = self.log_now.max(d.now);
            }
        }
        store
            .wl()
            .append(ready.entries())
            .context("appending to the log")?;
        if let Some(hs) = ready.hs() {
            store.wl().set_hardstate(hs.clone());
        }
        messages.extend(ready.take_persisted_messages());
        let mut light = self.node.advance(ready);
        if let Some(commit) = light.commit_index() {
            store.wl().mut_hard_state().set_commit(commit);
        }
        messages.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed, &mut applied)?;
        self.node.advance_apply();
        Ok((messages, applied))
    }

    /// Applies committed entries to the guest.
    fn apply(&mut self, entries: Vec<Entry>, out: &mut Vec<Applied>) -> Result<()> {
        for entry in entries {
            self.applied = entry.index;
            if entry.data.is_empty() || entry.get_entry_type() != EntryType::EntryNormal {
                // A new leader's empty entry, or a membership change
                // (static membership for now).
                continue;
            }
            let e =
                decode_entry(&entry.data).with_context(|| format!("log entry {}", entry.index))?;
            let now = e.now.max(self.applied_now);
            self.applied_now = now;
            let outputs = self
                .store
                .handle_wire(e.batch, now)
                .with_context(|| format!("applying log entry {}", entry.index))?;
            out.push(Applied {
                index: entry.index,
                origin: e.origin,
                now,
                outputs,
            });
        }
        Ok(())
    }
}
