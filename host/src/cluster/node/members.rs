//! The membership as a replica sees it: an operator's change proposed,
//! and the replicas, links and registrations kept in step with what group
//! 0 applied.

use anyhow::{Context as _, Result, bail};
use statestore_guest::wire;
use tracing::{info, warn};

use super::{Node, ReplicaEntry};
use crate::cluster::Replica;
use crate::cluster::operator::{ChangeAnswer, ChangeRequest, ReplicaStatus};
use crate::{Input, WasmStore};

impl Node {
    /// An operator's change (`cluster add`, `remove`, `tenant ...`,
    /// `move`): what this replica does with it, and its answer.
    pub(super) fn operator_change(&mut self, request: &str) -> ChangeAnswer {
        match ChangeRequest::decode(request) {
            _ if let Some(name) = request.strip_prefix("tenant add ") => {
                self.add_tenant(name.trim())
            }
            _ if let Some(name) = request.strip_prefix("tenant remove ") => {
                self.remove_tenant(name.trim())
            }
            _ if let Some(words) = request.strip_prefix("move ") => {
                let n: Vec<u64> = words
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                match n[..] {
                    [group, from, to] => self.move_group(group as u32, from, to),
                    _ => ChangeAnswer::Refused("move <group> <from> <to>".into()),
                }
            }
            Ok(change) if !self.placement.everywhere() => self.placed_change(&change),
            Ok(change) if self.groups.len() > 1 => self.change_groups(&change),
            Ok(change) => self.change(change),
            Err(e) => ChangeAnswer::Refused(format!("{e:#}")),
        }
    }

    /// `key=value` lines, for `cluster status` (group 0's state, and with
    /// partitions the ones this replica leads).
    pub fn status_text(&self) -> String {
        // A member of a placed cluster may hold no group (one just added,
        // or one drained).
        let replica = self.groups.first().map(|g| &g.replica);
        let s = replica.map_or_else(
            || crate::cluster::Status {
                id: self.me,
                role: "member".into(),
                ..Default::default()
            },
            |r| r.status(),
        );
        ReplicaStatus {
            id: s.id,
            role: s.role.to_string(),
            term: s.term,
            leader: s.leader,
            commit: s.commit,
            applied: s.applied,
            last_index: s.last_index,
            snapshot: s.snapshot,
            matched: s.matched.clone(),
            mqtt: self
                .replicas
                .iter()
                .find(|r| r.id == s.id)
                .and_then(|r| r.mqtt),
            // Placed on some replicas, the members are the placement's.
            voters: match replica {
                Some(r) if self.placement.everywhere() => r.voters(),
                _ => self.placement.members(),
            },
            peers: self.replicas.iter().map(|r| (r.id, r.raft)).collect(),
            settled: replica.is_some_and(|r| r.membership_settled()),
            partitions: self.count(),
            leads: self
                .groups
                .iter()
                .filter(|g| g.replica.is_leader())
                .map(|g| g.id)
                .collect(),
            behind: self.groups_behind(),
            holds: if self.placement.everywhere() {
                Vec::new()
            } else {
                self.groups.iter().map(|g| g.id).collect()
            },
            tenants: if self.named {
                let serving = self.tenants.iter().enumerate();
                serving
                    .filter(|(t, _)| !self.removed(*t))
                    .map(|(_, n)| n.clone())
                    .collect()
            } else {
                Vec::new()
            },
            moves: self.placement.moves().version,
            moving: self
                .placement
                .moves()
                .moving
                .map(|m| (m.group, m.from, m.to)),
        }
        .encode()
    }

    /// With several groups, an operator's membership change: made in
    /// every group that has not applied it, each through its own leader
    /// (proposed here in the groups this replica leads, sent to the others'
    /// leaders). Asked of group 0's leader, as with one group; the
    /// operator's tool asks again until every group has it
    /// ([`Node::groups_behind`]).
    pub(super) fn change_groups(&mut self, request: &ChangeRequest) -> ChangeAnswer {
        let me = self.id();
        let leader = self.groups[0].replica.leader();
        if leader != me {
            return ChangeAnswer::AskAgain(format!("not the leader; leader={leader}"));
        }
        if let ChangeRequest::Add { id, raft, .. } = request
            && self.replicas.iter().any(|r| r.id != *id && r.raft == *raft)
        {
            return ChangeAnswer::Refused(format!("{raft} is already a member's address"));
        }
        let text = request.encode();
        let mut pending = 0;
        let mut moving = None;
        for g in 0..self.groups.len() {
            if applied_in(&self.groups[g].replica, request) {
                continue;
            }
            pending += 1;
            if let Some(to) = self.change_group(g, request)
                && g == 0
            {
                moving = Some(to);
            }
        }
        match moving {
            Some(to) => ChangeAnswer::Moving(format!(
                "replica {me} leads: the leadership moves to replica {to} first; leader={to}"
            )),
            None if pending == 0 => ChangeAnswer::Proposed(format!("every group has it: {text}")),
            None => ChangeAnswer::Proposed(format!("proposed in {pending} groups: {text}")),
        }
    }

    /// Makes the change in group `g` if it has not applied it: proposes it
    /// if this replica leads `g` (or, to remove itself, hands the
    /// leadership over first: the replica it goes to), or sends it to
    /// `g`'s leader.
    pub(super) fn change_group(&mut self, g: usize, request: &ChangeRequest) -> Option<u64> {
        let me = self.id();
        let replica = &mut self.groups[g].replica;
        if applied_in(replica, request) {
            return None;
        }
        if !replica.is_leader() {
            // A quiet group wakes: its leader may be the dead replica
            // being removed.
            replica.wake();
            let leader = replica.leader();
            if leader != 0 && leader != me {
                self.links
                    .change_in(self.groups[g].id, leader, request.encode());
            }
            return None;
        }
        let change = match request {
            ChangeRequest::Remove { id } if *id == me => {
                let to = successor(replica)?;
                replica.transfer_leader(to);
                return Some(to);
            }
            ChangeRequest::Remove { id } => crate::cluster::Change::Remove(*id),
            ChangeRequest::Add { id, .. } => crate::cluster::Change::Add {
                id: *id,
                record: request.record().unwrap_or_default().into_bytes(),
            },
        };
        match replica.propose_change(&change) {
            Ok(()) => {
                info!(replica = me, group = g, request = %request.encode(), "membership change proposed")
            }
            Err(e) => {
                tracing::debug!(group = g, error = %format!("{e:#}"), "membership change not proposed now (asked again)")
            }
        }
        None
    }

    /// How many groups have other members than group 0 (as this replica
    /// has applied them): a change under way.
    pub(super) fn groups_behind(&self) -> u32 {
        if !self.placement.everywhere() || self.groups.is_empty() {
            // Placed, each group has its own voters.
            return 0;
        }
        let mut first = self.groups[0].replica.voters();
        first.sort_unstable();
        let behind = self.groups[1..].iter().filter(|g| {
            let mut v = g.replica.voters();
            v.sort_unstable();
            v != first
        });
        behind.count() as u32
    }

    /// An operator's membership change: `add <id> raft=<addr> [mqtt=<addr>]`
    /// or `remove <id>`, proposed if this replica leads.
    pub(super) fn change(&mut self, request: ChangeRequest) -> ChangeAnswer {
        let replica = &self.groups[0].replica;
        let leader = replica.leader();
        if leader != replica.id() {
            return ChangeAnswer::AskAgain(format!("not the leader; leader={leader}"));
        }
        let change = match &request {
            ChangeRequest::Add { id, raft, .. } => {
                if self.replicas.iter().any(|r| r.id != *id && r.raft == *raft) {
                    return ChangeAnswer::Refused(format!("{raft} is already a member's address"));
                }
                crate::cluster::Change::Add {
                    id: *id,
                    record: request.record().unwrap_or_default().into_bytes(),
                }
            }
            ChangeRequest::Remove { id } if *id == replica.id() => {
                // A leader does not remove itself: it hands over first.
                let Some(to) = successor(replica) else {
                    return ChangeAnswer::Refused("no other member to lead".into());
                };
                self.groups[0].replica.transfer_leader(to);
                return ChangeAnswer::Moving(format!(
                    "replica {id} leads: the leadership moves to replica {to} first; leader={to}"
                ));
            }
            ChangeRequest::Remove { id } => crate::cluster::Change::Remove(*id),
        };
        let text = request.encode();
        match self.groups[0].replica.propose_change(&change) {
            Ok(()) => {
                info!(replica = self.id(), request = %text, "membership change proposed");
                ChangeAnswer::Proposed(format!("proposed: {text}"))
            }
            Err(e) if format!("{e:#}").contains("in progress") => {
                ChangeAnswer::AskAgain(format!("{e:#}"))
            }
            Err(e) => ChangeAnswer::Refused(format!("{e:#}")),
        }
    }

    /// Keeps `replicas` and the links in step with the membership the
    /// replica has applied (group 0's); a replica removed from it stops.
    pub(super) fn sync_members(&mut self) -> Result<()> {
        if !self.placement.everywhere() {
            // The members are the cluster file's, for good.
            return Ok(());
        }
        let changes = self.groups[0].replica.changes();
        if self.changes_seen == Some(changes) {
            return Ok(());
        }
        self.changes_seen = Some(changes);
        let voters = self.groups[0].replica.voters();
        let me = self.id();
        if voters.is_empty() {
            return Ok(()); // joining: the leader's snapshot brings them
        }
        if !voters.contains(&me) {
            bail!(
                "replica {me} was removed from the cluster (members: {voters:?}): it stops; to serve again it must be added back (`statestore cluster add`) with an empty data directory and `join = true`"
            );
        }
        let mut known = self.file_replicas.clone();
        for (id, record) in self.groups[0].replica.members() {
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
        // with it, in every group: each group's leader proposes it (see
        // `propose_drops`), whichever replica leads it when.
        let removed: Vec<u64> = self
            .replicas
            .iter()
            .map(|r| r.id)
            .filter(|id| !voters.contains(id))
            .collect();
        for group in &mut self.groups {
            group.drops.retain(|id| !voters.contains(id));
            for &id in &removed {
                if !group.drops.contains(&id) {
                    group.drops.push(id);
                }
            }
        }
        self.propose_drops();
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
}

impl Node {
    /// Proposes, in each group this replica leads, that what the clients of
    /// removed replicas registered through them goes: a life of each later
    /// than any (`replica-started` drops every registration of an earlier
    /// life). Every replica keeps the removals it has applied until it has
    /// proposed them as a group's leader (or the replica is a member again),
    /// so a group led by another replica, or by none, when the removal
    /// applied has them dropped by whichever replica leads it next; a drop
    /// proposed twice drops nothing more.
    pub(super) fn propose_drops(&mut self) {
        let me = self.id();
        let now = self.clock.now_ms();
        for group in &mut self.groups {
            if group.drops.is_empty() || !group.replica.is_leader() || group.router.via().is_none()
            {
                continue;
            }
            for id in std::mem::take(&mut group.drops) {
                let batch = wire::encode_batch(&[Input::ReplicaStarted(statestore_guest::Via {
                    replica: id,
                    started: u64::MAX,
                })]);
                match group.replica.propose_wire(me, &batch, now) {
                    Ok(_) => info!(
                        replica = me,
                        removed = id,
                        group = group.id,
                        "the registrations made through a removed replica go"
                    ),
                    Err(e) => {
                        warn!(removed = id, error = %format!("{e:#}"), "the registrations made through a removed replica stay for now (proposal refused; tried again next tick)");
                        group.drops.push(id);
                    }
                }
            }
        }
    }
}

/// The voter (not this replica) most up to date, to take over the
/// leadership of `replica`'s group.
pub(super) fn successor(replica: &Replica<WasmStore>) -> Option<u64> {
    let me = replica.id();
    let voters = replica.voters();
    replica
        .status()
        .matched
        .iter()
        .filter(|(id, _)| *id != me && voters.contains(id))
        .max_by_key(|(_, matched)| *matched)
        .map(|(id, _)| *id)
}

/// A replica's address record: `raft=<addr> [mqtt=<addr>]`.
pub(super) fn parse_record(id: u64, record: &[u8]) -> Result<ReplicaEntry> {
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
        added: true,
    })
}

/// Whether `replica`'s group has applied `request`: the replica is a
/// member, or is no longer one.
fn applied_in(replica: &Replica<WasmStore>, request: &ChangeRequest) -> bool {
    let add = matches!(request, ChangeRequest::Add { .. });
    replica.voters().contains(&request.id()) == add
}
