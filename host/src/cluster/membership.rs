//! A replica's membership: changes proposed (one at a time) and applied,
//! the leadership handed over, and the voters and learners it counts.

use anyhow::{Context, Result, bail};
use raft::prelude::{ConfChange, ConfChangeType, Entry};

use super::{Change, Members, Replica};
use crate::Backend;

impl<B: Backend> Replica<B> {
    /// Proposes a membership change (as leader; one at a time: a change
    /// proposed and not yet applied is refused here, where raft-rs would
    /// drop it without a word).
    pub fn propose_change(&mut self, change: &Change) -> Result<()> {
        self.must_lead()?;
        if self.node.raft.pending_conf_index > self.applied {
            bail!("a membership change is still in progress: retry once it is applied");
        }
        let voters = self.voters();
        let mut cc = ConfChange::default();
        match change {
            Change::Add { id, record } => {
                if *id == 0 {
                    bail!("replica id 0 is reserved");
                }
                if voters.contains(id) {
                    bail!("replica {id} is already a member");
                }
                cc.set_change_type(ConfChangeType::AddNode);
                cc.node_id = *id;
                cc.context = record.clone().into();
            }
            Change::Learner(id) => {
                if *id == 0 || voters.contains(id) || self.learners().contains(id) {
                    bail!("replica {id} is a voter or learner already (or id 0)");
                }
                cc.set_change_type(ConfChangeType::AddLearnerNode);
                cc.node_id = *id;
            }
            Change::Remove(id) if self.learners().contains(id) => {
                cc.set_change_type(ConfChangeType::RemoveNode);
                cc.node_id = *id;
            }
            Change::Remove(id) => {
                if !voters.contains(id) {
                    bail!("replica {id} is not a member (members: {voters:?})");
                }
                if voters.len() == 1 {
                    bail!("replica {id} is the last member");
                }
                if *id == self.id {
                    bail!("replica {id} leads: move the leadership first");
                }
                cc.set_change_type(ConfChangeType::RemoveNode);
                cc.node_id = *id;
            }
        }
        self.node
            .propose_conf_change(vec![], cc)
            .context("proposing a membership change")
    }

    /// Asks `to` (a voter) to take over the leadership.
    pub fn transfer_leader(&mut self, to: u64) {
        self.wake();
        self.node.transfer_leader(to);
    }

    /// Whether, as leader, its members ([`Replica::voters`]) are the
    /// cluster's: it has committed an entry of its own term (so it knows
    /// everything committed before it) and applied all it has committed. A
    /// leader just elected may not have applied a membership change its
    /// predecessor committed: its members are then out of date.
    pub fn membership_settled(&self) -> bool {
        self.is_leader()
            && self.node.raft.commit_to_current_term()
            && self.applied >= self.node.raft.raft_log.committed
    }

    /// The learners (members without a vote), as this replica has applied
    /// them.
    pub fn learners(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .node
            .raft
            .prs()
            .conf()
            .learners()
            .iter()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    /// The voting members, as this replica has applied them.
    pub fn voters(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.node.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    /// The address records of the replicas added while running.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// How many membership changes it has applied (or snapshots
    /// installed): a host keeps its links in step when this moves.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Whether it waits to join: no membership yet (until the leader's
    /// snapshot).
    pub fn joining(&self) -> bool {
        self.node.raft.prs().conf().voters().ids().is_empty()
    }

    /// Applies a committed membership change.
    pub(super) fn apply_change(&mut self, entry: &Entry) -> Result<()> {
        use protobuf::Message as _;
        let cc = ConfChange::parse_from_bytes(&entry.data)
            .with_context(|| format!("log entry {}: a membership change", entry.index))?;
        if cc.get_change_type() == ConfChangeType::RemoveNode
            && cc.node_id == self.id
            && self.is_leader()
        {
            // A leader that leaves the membership steps down first
            // (raft-rs 0.7 cannot lead without itself: it stops on it).
            // The others elect a leader among themselves.
            tracing::info!(replica = self.id, "removed while leading: steps down");
            let term = self.node.raft.term;
            self.node.raft.become_follower(term, raft::INVALID_ID);
        }
        let conf = self.node.apply_conf_change(&cc).with_context(|| {
            format!(
                "applying the membership change of log entry {}",
                entry.index
            )
        })?;
        match cc.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                if !cc.context.is_empty() {
                    self.members.insert(cc.node_id, cc.context.to_vec());
                }
                self.compact_now = true;
            }
            ConfChangeType::RemoveNode => {
                self.members.remove(&cc.node_id);
            }
        }
        tracing::info!(
            replica = self.id,
            index = entry.index,
            change = ?cc.get_change_type(),
            node = cc.node_id,
            voters = ?conf.voters,
            "membership changed"
        );
        self.node.mut_store().set_conf_state(conf);
        self.changes += 1;
        Ok(())
    }
}
