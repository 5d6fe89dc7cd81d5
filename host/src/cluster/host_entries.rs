//! Entries the hosts apply themselves ([`HostEntry`]): the tenants the
//! cluster adds and removes while running, and the groups it moves between
//! replicas ([`Moves`]), agreed in group 0's log. Every
//! replica of group 0 applies them in the log's order and records each
//! tenant added with the voters its groups start with, and each removed by
//! name; snapshots carry both ([`Tenancy`]), so a replica that catches up
//! from one learns them too. Opening and closing the tenants' groups is
//! the host's ([`crate::cluster::node`]).

use anyhow::{Context as _, Result};

use super::format::encode_host_entry;
use super::placement::Moves;
use super::{AgreedTenant, Backend, HostEntry, Replica, Tenancy};

impl<B: Backend> Replica<B> {
    /// Proposes `entry` (as leader).
    pub fn propose_host(&mut self, entry: &HostEntry) -> Result<()> {
        self.must_lead()?;
        self.node
            .propose(vec![], encode_host_entry(entry))
            .context("proposing")
    }

    /// The tenants the cluster added and removed while running, as this
    /// replica has applied them, in order.
    pub fn agreed_tenants(&self) -> &Tenancy {
        &self.moves.tenants
    }

    /// The groups' moves the cluster agreed, as this replica has applied
    /// them.
    pub fn agreed_moves(&self) -> &Moves {
        &self.moves
    }

    /// The tenants changed: the placement carries them, with a new
    /// version, for the replicas that do not hold group 0 where groups
    /// are placed.
    fn tenants_changed(&mut self) {
        self.moves.version += 1;
    }

    /// Applies host entry `index` (one that does not decode is skipped,
    /// alike on every replica).
    pub(super) fn apply_host(&mut self, index: u64, entry: Result<HostEntry>) {
        match entry {
            Ok(HostEntry::AddTenant(name)) => {
                if self.moves.tenants.added.iter().any(|t| t.name == name)
                    || self.moves.tenants.removed.contains(&name)
                {
                    tracing::info!(index, tenant = %name, "the tenant was added (or removed) before: nothing to do");
                    return;
                }
                let voters = self.voters();
                tracing::info!(replica = self.id, index, tenant = %name, ?voters, "the cluster adds a tenant");
                self.moves.tenants.added.push(AgreedTenant { name, voters });
                self.tenants_changed();
            }
            Ok(HostEntry::RemoveTenant(name)) => {
                if self.moves.tenants.removed.contains(&name) {
                    tracing::info!(index, tenant = %name, "the tenant was removed before: nothing to do");
                    return;
                }
                tracing::info!(replica = self.id, index, tenant = %name, "the cluster removes a tenant");
                self.moves.tenants.removed.push(name);
                self.tenants_changed();
            }
            Ok(HostEntry::Move { version, to, hosts }) => {
                if self.moves.start(version, to, hosts.clone()) {
                    tracing::info!(
                        replica = self.id,
                        index,
                        group = to.group,
                        from = to.from,
                        to = to.to,
                        ?hosts,
                        version = self.moves.version,
                        "the cluster moves a group's copy"
                    );
                } else {
                    tracing::info!(
                        index,
                        group = to.group,
                        version,
                        at = self.moves.version,
                        "a move proposed from another placement, or while one is under way: skipped"
                    );
                }
            }
            Ok(HostEntry::Settle { version, group }) => {
                if self.moves.settle(version, group) {
                    tracing::info!(
                        replica = self.id,
                        index,
                        group,
                        version = self.moves.version,
                        "a group's move is done"
                    );
                }
            }
            Ok(HostEntry::Join {
                version,
                id,
                record,
            }) => {
                if self.moves.join(version, id, record) {
                    tracing::info!(
                        replica = self.id,
                        index,
                        member = id,
                        version = self.moves.version,
                        "a replica joins the members (holding no group yet)"
                    );
                }
            }
            Ok(HostEntry::Drain { version, id }) => {
                if self.moves.drain(version, id) {
                    tracing::info!(
                        replica = self.id,
                        index,
                        member = id,
                        version = self.moves.version,
                        "a member is to leave: its groups move away first"
                    );
                }
            }
            Ok(HostEntry::Leave { version, id }) => {
                if self.moves.leave(version, id) {
                    tracing::info!(
                        replica = self.id,
                        index,
                        member = id,
                        version = self.moves.version,
                        "a member left"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(index, error = %format!("{e:#}"), "a host entry this build cannot apply: skipped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::quiet::tests::Three;
    use crate::cluster::{AgreedTenant, HostEntry, Tenancy};

    /// A tenant proposed once (or twice) is added once, on every replica,
    /// with the voters group 0 had; a follower does not propose; removed,
    /// it is not added again; the snapshot carries both lists.
    #[test]
    fn every_replica_agrees_on_a_tenant_added_and_snapshots_carry_it() {
        let mut g = Three::new();
        for _ in 0..100 {
            g.tick();
        }
        let leader = g.leader().expect("a leader") as usize;
        let add = HostEntry::AddTenant("lab".into());
        let follower = g.replicas[leader % 3].as_mut().expect("up");
        assert!(
            follower.propose_host(&add).is_err(),
            "a follower does not propose"
        );
        let r = g.replicas[leader - 1].as_mut().expect("up");
        r.propose_host(&add).expect("propose");
        r.propose_host(&add).expect("propose again");
        r.propose(1, &[], 1_000).expect("a batch after it");
        let index = r.status().last_index;
        for _ in 0..20 {
            g.tick();
        }
        let mut want = Tenancy {
            added: vec![AgreedTenant {
                name: "lab".into(),
                voters: vec![1, 2, 3],
            }],
            removed: Vec::new(),
        };
        for r in g.replicas.iter().flatten() {
            assert!(r.applied() >= index);
            assert_eq!(r.agreed_tenants(), &want, "replica {}", r.id());
        }
        // Removed (twice), then added again: removed for good.
        let r = g.replicas[leader - 1].as_mut().expect("up");
        let remove = HostEntry::RemoveTenant("lab".into());
        r.propose_host(&remove).expect("propose");
        r.propose_host(&remove).expect("propose again");
        r.propose_host(&add).expect("add again");
        r.propose(1, &[], 2_000).expect("a batch after it");
        let index = r.status().last_index;
        for _ in 0..20 {
            g.tick();
        }
        want.removed.push("lab".into());
        for r in g.replicas.iter().flatten() {
            assert!(r.applied() >= index);
            assert_eq!(r.agreed_tenants(), &want, "replica {}", r.id());
        }
        let r = g.replicas[leader - 1].as_mut().expect("up");
        r.compact().expect("snapshot");
        let snap = raft::Storage::snapshot(r.node.store(), 0, 0).expect("snapshot");
        let d = crate::cluster::format::decode_snapshot(&snap.data).expect("decode");
        assert_eq!(d.tenants, want);
    }
}
