//! Quiet groups: a Raft group with nothing to do stops its clock, so that
//! a replica of many groups (partitions, tenants) does not spend its CPU
//! on the heartbeats and election timers of idle ones (256 idle groups
//! cost three replicas 18% of a core, 1,000 of them about half of one).
//!
//! The same idea as TiKV's hibernated regions, with nothing added to the
//! wire: each replica decides alone, from what it sees.
//!
//! - A **follower** stops its election clock once, for [`QUIET_AFTER`]
//!   ticks, it has heard nothing but heartbeats and has committed and
//!   applied all it has. It still answers heartbeats.
//! - The **leader** stops ticking (no more heartbeats) a few ticks later
//!   ([`LEADER_MARGIN`]: its followers have stopped their clocks by then),
//!   once every member has every entry, all of it is committed and
//!   applied, and no read, hand-over or membership change is under way.
//! - Anything else wakes a group: a proposal, a read index, a hand-over, a
//!   client's request or disconnect reaching its router, a Raft message
//!   other than a heartbeat (a vote, an append, a forwarded read). A woken
//!   leader starts its quorum check afresh.
//!
//! Raft's safety does not depend on clocks, only its liveness does: a
//! leader that dies while its group is quiet is noticed when a request
//! for the group reaches another replica (it wakes, its election clock
//! runs out, it campaigns; the other followers wake on its vote requests
//! and grant them once their own clock says the old leader is gone), and
//! a replica that restarts starts awake and campaigns, which wakes the
//! others. A member that lags keeps its leader awake.

use raft::StateRole;
use raft::eraftpb::MessageType;

use super::Replica;
use crate::Backend;

/// Ticks of nothing but heartbeats before a follower's clock stops (1 s).
pub const QUIET_AFTER: u32 = 20;

/// How many ticks longer the leader waits than its followers.
pub const LEADER_MARGIN: u32 = 6;

/// A replica's quiet state.
#[derive(Debug, Default)]
pub(super) struct Quiet {
    /// After how many idle ticks the group may go quiet (none: never).
    after: Option<u32>,
    /// Ticks since anything but heartbeats.
    idle: u32,
    /// Its clock is stopped.
    on: bool,
    /// How many times it went quiet.
    times: u64,
    /// How many times it woke from quiet.
    woke: u64,
}

impl<B: Backend> Replica<B> {
    /// Lets the group go quiet after `ticks` ticks of nothing to do (none:
    /// never, the default).
    pub fn set_quiet_after(&mut self, ticks: Option<u32>) {
        self.quiet.after = ticks;
        if ticks.is_none() {
            self.wake();
        }
    }

    /// Whether its clock is stopped.
    pub fn is_quiet(&self) -> bool {
        self.quiet.on
    }

    /// How many times it went quiet, and how many it woke.
    pub fn quiet_times(&self) -> (u64, u64) {
        (self.quiet.times, self.quiet.woke)
    }

    /// There is something to do: the clock runs again (and the idle count
    /// starts over).
    pub fn wake(&mut self) {
        self.quiet.idle = 0;
        if !std::mem::take(&mut self.quiet.on) {
            return;
        }
        self.quiet.woke += 1;
        if self.node.raft.state == StateRole::Leader {
            // Its followers have not answered while it was quiet: their
            // activity is counted from now.
            self.node.raft.election_elapsed = 0;
        }
    }

    /// Wakes the group for a peer's message other than a heartbeat.
    pub(super) fn wake_for(&mut self, kind: MessageType) {
        if !matches!(
            kind,
            MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse
        ) {
            self.wake();
        }
    }

    /// Counts an idle tick, and stops the clock once the group may rest.
    pub(super) fn idle_tick(&mut self) {
        let Some(after) = self.quiet.after else {
            return;
        };
        self.quiet.idle = self.quiet.idle.saturating_add(1);
        let leader = self.node.raft.state == StateRole::Leader;
        let wait = if leader { after + LEADER_MARGIN } else { after };
        if self.quiet.idle >= wait && self.may_rest() {
            self.quiet.on = true;
            self.quiet.times += 1;
        }
    }

    /// Whether nothing is under way that needs the clock.
    fn may_rest(&self) -> bool {
        let raft = &self.node.raft;
        let last = raft.raft_log.last_index();
        let all_in = raft.raft_log.committed == last && self.applied == last;
        match raft.state {
            StateRole::Follower => all_in && raft.leader_id != raft::INVALID_ID,
            StateRole::Leader => {
                all_in
                    && raft.prs().iter().all(|(_, pr)| pr.matched == last)
                    && raft.lead_transferee.is_none()
                    && raft.pending_read_count() == 0
                    && raft.pending_conf_index <= self.applied
                    && self.snapshot_wait.is_empty()
                    && self.read_states.is_empty()
            }
            StateRole::Candidate | StateRole::PreCandidate => false,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use raft::prelude::Message;

    use super::QUIET_AFTER;
    use crate::cluster::{Compaction, Durability, LogStore, Replica, Timing};
    use crate::store::storage::MemStorage;
    use crate::{Config, NativeStore};

    /// Three replicas of one group in memory, messages delivered at the
    /// next tick, a replica down when `None`.
    pub(crate) struct Three {
        pub(crate) replicas: Vec<Option<Replica<NativeStore>>>,
        pub(crate) wire: Vec<Message>,
    }

    impl Three {
        pub(crate) fn new() -> Three {
            let replicas = (1..=3)
                .map(|id| {
                    let disk = Arc::new(MemStorage::new());
                    let log = LogStore::open_with(disk, &[1, 2, 3], None, false).expect("log");
                    let make = Box::new(|s: Option<&[u8]>| match s {
                        None => NativeStore::new(Config::default()),
                        Some(s) => NativeStore::restore(Config::default(), s),
                    });
                    // Replica 1 times out first: it leads.
                    let min = 10 + 5 * (id as usize - 1);
                    let timing = Timing {
                        heartbeat: 2,
                        election_min: min,
                        election_max: min + 1,
                    };
                    let mut r = Replica::new(
                        id,
                        log,
                        make,
                        timing,
                        Durability::Later,
                        Compaction::default(),
                    )
                    .expect("replica");
                    r.set_quiet_after(Some(QUIET_AFTER));
                    Some(r)
                })
                .collect();
            Three {
                replicas,
                wire: Vec::new(),
            }
        }

        /// One tick: what was sent is delivered, every replica up ticks
        /// and does its ready. Returns how many messages it sent.
        pub(crate) fn tick(&mut self) -> usize {
            for m in std::mem::take(&mut self.wire) {
                if let Some(r) = self.replicas[m.to as usize - 1].as_mut() {
                    r.step(m).expect("step");
                }
            }
            let mut sent = Vec::new();
            for r in self.replicas.iter_mut().flatten() {
                r.tick();
                let (_, rest) = r
                    .ready_apply(&mut |m| sent.push(m), crate::cluster::Applying::Now)
                    .expect("ready");
                if let Some(rest) = rest {
                    let w = r.ready_write(rest).expect("write");
                    r.ready_finish(w, &mut |m| sent.push(m)).expect("finish");
                }
            }
            let n = sent.len();
            self.wire = sent;
            n
        }

        pub(crate) fn leader(&self) -> Option<u64> {
            self.replicas
                .iter()
                .flatten()
                .find(|r| r.is_leader())
                .map(Replica::id)
        }

        fn all_quiet(&self) -> bool {
            self.replicas.iter().flatten().all(Replica::is_quiet)
        }
    }

    /// An idle group stops its clocks (nothing crosses the wire any more,
    /// and nobody campaigns), wakes for a proposal, and goes quiet again;
    /// when its leader dies while it is quiet, a request reaching a
    /// follower wakes it, and it elects a new leader that takes proposals.
    #[test]
    fn an_idle_group_goes_quiet_and_wakes_for_what_comes_even_without_its_leader() {
        let mut g = Three::new();
        for _ in 0..200 {
            g.tick();
        }
        assert_eq!(g.leader(), Some(1));
        assert!(g.all_quiet(), "idle for 200 ticks");
        let sent: usize = (0..100).map(|_| g.tick()).sum();
        assert_eq!(sent, 0, "a quiet group sends nothing");
        assert_eq!(g.leader(), Some(1), "and nobody campaigns");
        // A proposal wakes the leader, its appends wake the followers.
        let leader = g.replicas[0].as_mut().expect("up");
        leader.propose(1, &[], 1_000).expect("propose");
        let index = leader.status().last_index;
        g.tick(); // the appends go out
        g.tick(); // and arrive
        assert!(!g.replicas.iter().flatten().any(Replica::is_quiet));
        for _ in 0..100 {
            g.tick();
        }
        assert!(g.replicas.iter().flatten().all(|r| r.applied() >= index));
        assert!(g.all_quiet(), "quiet again");
        // The leader dies; nothing happens until something comes.
        g.replicas[0] = None;
        for _ in 0..100 {
            g.tick();
        }
        assert!(g.all_quiet());
        // A client's request reaches replica 2: its router wakes it.
        g.replicas[1].as_mut().expect("up").wake();
        let mut elected = None;
        for t in 0..200 {
            g.tick();
            if let Some(l) = g.leader() {
                elected = Some((l, t));
                break;
            }
        }
        let (leader, ticks) = elected.expect("a new leader within 200 ticks");
        assert!(leader == 2 || leader == 3, "{leader}");
        eprintln!("replica {leader} elected {ticks} ticks after the wake");
        let r = g.replicas[leader as usize - 1].as_mut().expect("up");
        r.propose(leader, &[], 2_000)
            .expect("the new leader proposes");
        let index = r.status().last_index;
        for _ in 0..20 {
            g.tick();
        }
        assert!(g.replicas.iter().flatten().all(|r| r.applied() >= index));
    }
}
