//! Groups moved between replicas (`statestore cluster move`), as a replica
//! carries them out. Group 0's leader proposes a move
//! ([`HostEntry::Move`]); applied, the group is on its new replicas in the
//! placement ([`Moves`]), which every replica takes: group 0's from their
//! own log, the others from their peers (each tells its peers the moves it
//! knows when they change and every [`TELL_EVERY`] ticks, and keeps them in
//! its data directory's `placement`). Then:
//!
//! ```text
//!   the replica it goes to   opens the group empty, as a joiner (no voters)
//!   the group's leader       adds it as a learner; it catches up (a snapshot)
//!                            makes it a voter once it has every committed entry
//!                            removes the replica it leaves (handing over first
//!                            if that is itself), one change at a time
//!                            asks group 0's replicas to settle the move
//!   group 0's leader         proposes it settled ([`HostEntry::Settle`])
//!   the replica it left      drops its copy and its directory
//! ```
//!
//! The replica it leaves keeps its copy (a voter, until removed) but sends
//! its clients' requests for the group to an agent from the start, like any
//! replica not holding it. Each step is taken from what the group's leader
//! sees, so a new leader takes over where the last one stopped.

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use tracing::{info, warn};

use super::Node;
use crate::cluster::operator::ChangeAnswer;
use crate::cluster::operator::ChangeRequest;
use crate::cluster::placement::{Move, Moves, Placement};
use crate::cluster::{Change, HostEntry, LogStore, Status};
use crate::store::storage::{DirStorage, Storage};

/// What a replica keeps of its ticks: how many since it started (the
/// moving group's steps every tick, the rest every second), the one at
/// which it last took a request, and the replicas told they left, with
/// when (their links closed a minute later).
#[derive(Default)]
pub(super) struct Rhythm {
    pub(super) ticks: u64,
    /// The tick at which it last took a request of a client, or one a peer
    /// forwarded or shipped (`None`: never): see `Node::sync_in_place`.
    pub(super) served: Option<u64>,
    /// The tick at which it last took a request of its own clients
    /// (`None`: never): see `Node::pipelined`.
    pub(super) clients: Option<u64>,
    pub(super) told_left: std::collections::HashMap<u64, std::time::Instant>,
}

/// The file of a replica's data directory keeping the newest moves it
/// knows of.
const FILE: &str = "placement";

/// How often, in ticks, a replica tells its peers the moves it knows of
/// (2 s), besides when they change.
pub(super) const TELL_EVERY: u32 = 40;

/// Where replica `file.id`'s cluster places its groups: the file's
/// formula, and with `copies` the moves its data directory `root` kept.
pub(super) fn placement(file: &super::ClusterFile, root: &dyn Storage) -> Result<Placement> {
    let mut placement = file.placement();
    if !placement.everywhere() {
        placement.set_moves(kept(root, file.id)?);
    }
    Ok(placement)
}

/// The moves replica `me`'s data directory kept (none: the formula
/// alone); a replica they say was removed does not start.
fn kept(root: &dyn Storage, me: u64) -> Result<Moves> {
    let moves = match root.read(FILE) {
        Ok(bytes) => Moves::decode(&bytes).context("the data directory's `placement` file")?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Moves::default(),
        Err(e) => return Err(e).context("reading the data directory's `placement` file"),
    };
    if moves.left.contains(&me) {
        bail!(
            "replica {me} was removed from the cluster: it does not start (its data directory may be deleted; a replica added again needs another id and an empty one)"
        );
    }
    Ok(moves)
}

/// The groups whose copy moved away from replica `me` (the placement
/// says), their directories (`dirs`, by group) removed if a crash left
/// them.
pub(super) fn moved_away(
    me: u64,
    placement: &crate::cluster::placement::Placement,
    dirs: &[Option<std::path::PathBuf>],
) -> Result<Vec<u32>> {
    let mut away = Vec::new();
    for &g in placement.moves().hosts.keys() {
        if placement.holds(me, g) || g as usize >= dirs.len() {
            continue;
        }
        away.push(g);
        if let Some(dir) = dirs[g as usize].as_ref().filter(|d| d.exists()) {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing {}, whose group moved away", dir.display()))?;
        }
    }
    Ok(away)
}

/// The next step the members of `placement` call for (of `count` groups,
/// those of removed tenants aside: `removed` by store of `per` groups), if
/// any: see [`Node::plan_moves`].
fn plan(placement: &Placement, count: u32, removed: &[bool], per: u32) -> Option<HostEntry> {
    let moves = placement.moves();
    let version = moves.version;
    let live: Vec<u32> = (0..count)
        .filter(|g| !removed.get((g / per) as usize).copied().unwrap_or(false))
        .collect();
    let members = placement.members();
    let load = |id: u64| live.iter().filter(|&&g| placement.holds(id, g)).count();
    let takers: Vec<u64> = members
        .iter()
        .copied()
        .filter(|m| !moves.draining.contains(m))
        .collect();
    let start = |group: u32, from: u64, to: u64| {
        let hosts = placement
            .hosts(group)
            .into_iter()
            .map(|h| if h == from { to } else { h })
            .collect();
        HostEntry::Move {
            version,
            to: Move { group, from, to },
            hosts,
        }
    };
    if let Some(&d) = moves.draining.first() {
        let Some(&g) = live.iter().find(|&&g| placement.holds(d, g)) else {
            return Some(HostEntry::Leave { version, id: d });
        };
        let to = takers
            .iter()
            .copied()
            .filter(|&t| !placement.holds(t, g))
            .min_by_key(|&t| (load(t), t))?;
        return Some(start(g, d, to));
    }
    let share = live.len() * placement.copies() / takers.len().max(1);
    for (&j, _) in moves.joined.iter().filter(|(j, _)| takers.contains(j)) {
        if load(j) >= share {
            continue;
        }
        // From the most loaded member holding a group the new one lacks.
        let (from, g) = takers
            .iter()
            .copied()
            .filter(|&m| m != j && load(m) > load(j) + 1)
            .max_by_key(|&m| (load(m), std::cmp::Reverse(m)))
            .and_then(|m| {
                live.iter()
                    .copied()
                    .find(|&g| placement.holds(m, g) && !placement.holds(j, g))
                    .map(|g| (m, g))
            })?;
        return Some(start(g, from, j));
    }
    None
}

/// The next step of a group's leader (`me`) towards the voters `target`.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Add this replica as a learner.
    Learner(u64),
    /// Make this learner, caught up, a voter.
    Promote(u64),
    /// Remove this voter or learner.
    Remove(u64),
    /// Hand the leadership to this voter (the leader is the one leaving).
    HandOver(u64),
    /// Nothing to do now (a learner catching up).
    Wait,
    /// The voters are the target.
    Done,
}

/// What a group's leader does next: one membership change at a time, a
/// replica added as a learner, made a voter once it has every committed
/// entry, and only then one removed (so the group keeps its number of
/// voters, and a majority of the old ones and of the new overlap).
fn next_step(me: u64, target: &[u64], voters: &[u64], learners: &[u64], status: &Status) -> Step {
    let caught_up = |id: u64| {
        status
            .matched
            .iter()
            .any(|&(r, m)| r == id && m >= status.commit)
    };
    if let Some(&t) = target
        .iter()
        .find(|t| !voters.contains(t) && !learners.contains(t))
    {
        return Step::Learner(t);
    }
    if let Some(&l) = learners.iter().find(|l| !target.contains(l)) {
        return Step::Remove(l);
    }
    if let Some(&t) = learners.iter().find(|l| target.contains(l)) {
        return if caught_up(t) {
            Step::Promote(t)
        } else {
            Step::Wait
        };
    }
    if let Some(&v) = voters.iter().find(|v| !target.contains(v)) {
        if v != me {
            return Step::Remove(v);
        }
        return match target
            .iter()
            .find(|&&t| voters.contains(&t) && caught_up(t))
        {
            Some(&to) => Step::HandOver(to),
            None => Step::Wait,
        };
    }
    Step::Done
}

impl Node {
    /// Takes `moves` if they are newer than this replica's: kept in its
    /// data directory first (a replica restarted after that holds what
    /// they say), then told to its peers and followed.
    pub(super) fn adopt_moves(&mut self, moves: Moves) -> Result<()> {
        if moves.version <= self.placement.moves().version || self.placement.everywhere() {
            return Ok(());
        }
        self.maker
            .root
            .write_atomic(FILE, &moves.encode())
            .context("writing the data directory's `placement` file")?;
        info!(replica = self.id(), version = moves.version, moving = ?moves.moving, "the groups' placement changed");
        self.placement.set_moves(moves);
        self.tell_moves();
        self.follow_members()?;
        self.follow_placement()
    }

    /// Tells replica `id`, which left the cluster (while it was down, say)
    /// and still sends Raft messages, the placement that says so (at most
    /// every 10 s): it stops. A link is opened to it for that, and closed
    /// again a minute later.
    pub(super) fn tell_left(&mut self, id: u64) {
        if self
            .rhythm
            .told_left
            .get(&id)
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(10))
        {
            return;
        }
        let moves = self.placement.moves();
        let addr = self
            .file_replicas
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.raft)
            .or_else(|| {
                moves
                    .joined
                    .get(&id)
                    .and_then(|rec| super::members::parse_record(id, rec).ok())
                    .map(|r| r.raft)
            });
        let Some(addr) = addr else {
            return;
        };
        info!(
            replica = self.id(),
            peer = id,
            "a replica that left the cluster still speaks: told so"
        );
        self.links.add(id, addr);
        self.links.placement(id, moves.encode());
        self.rhythm.told_left.insert(id, std::time::Instant::now());
    }

    /// The links opened to tell replicas that left, closed after a minute.
    fn close_told(&mut self) {
        let done: Vec<u64> = self
            .rhythm
            .told_left
            .iter()
            .filter(|(_, t)| t.elapsed() > std::time::Duration::from_secs(60))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.rhythm.told_left.remove(&id);
            self.links.remove(id);
        }
    }

    /// The replicas and links made what the placement's members are; a
    /// replica that left stops.
    fn follow_members(&mut self) -> Result<()> {
        let me = self.id();
        let moves = self.placement.moves();
        if moves.left.contains(&me) {
            bail!(
                "replica {me} was removed from the cluster (members: {:?}): it stops; its data directory may be deleted",
                self.placement.members()
            );
        }
        let members = self.placement.members();
        let mut known: Vec<super::ReplicaEntry> = self
            .file_replicas
            .iter()
            .filter(|r| members.contains(&r.id))
            .cloned()
            .collect();
        for (&id, record) in &moves.joined {
            if known.iter().any(|r| r.id == id) || !members.contains(&id) {
                continue;
            }
            match super::members::parse_record(id, record) {
                Ok(entry) => known.push(entry),
                Err(e) => {
                    warn!(member = id, error = %format!("{e:#}"), "a member's address record")
                }
            }
        }
        for r in &known {
            self.links.add(r.id, r.raft);
        }
        for peer in self.links.peers() {
            if !members.contains(&peer) && !self.rhythm.told_left.contains_key(&peer) {
                info!(replica = me, peer, "no longer a member: its link is closed");
                self.links.remove(peer);
            }
        }
        self.replicas = known;
        Ok(())
    }

    /// An operator's `cluster add` or `cluster remove` in a placed cluster
    /// (as group 0's leader): a replica added joins the members holding no
    /// group (then groups move to it, [`Node::plan_moves`]); one removed
    /// is drained first (its groups move away), then leaves.
    pub(super) fn placed_change(&mut self, request: &ChangeRequest) -> ChangeAnswer {
        let at = match self.group0_leader() {
            Ok(at) => at,
            Err(ask) => return ask,
        };
        let placement = self.agreed_placement(at);
        let replica = &mut self.groups[at].replica;
        let agreed = placement.moves();
        let members = placement.members();
        let entry = match request {
            ChangeRequest::Add { id, raft, .. } => {
                if members.contains(id) {
                    return ChangeAnswer::Proposed(format!("replica {id} is a member already"));
                }
                if agreed.left.contains(id) {
                    return ChangeAnswer::Refused(format!(
                        "replica {id} was a member and was removed: give the new replica another id"
                    ));
                }
                if self.replicas.iter().any(|r| r.raft == *raft) {
                    return ChangeAnswer::Refused(format!("{raft} is already a member's address"));
                }
                HostEntry::Join {
                    version: agreed.version,
                    id: *id,
                    record: request.record().unwrap_or_default().into_bytes(),
                }
            }
            ChangeRequest::Remove { id } => {
                if agreed.left.contains(id) {
                    // Asked again while its removal ends (the command asks
                    // every few seconds until the members say it left).
                    return ChangeAnswer::Proposed(format!("replica {id} has left"));
                }
                if !members.contains(id) {
                    return ChangeAnswer::Refused(format!(
                        "replica {id} is not a member (members: {members:?})"
                    ));
                }
                if agreed.draining.contains(id) {
                    return ChangeAnswer::Proposed(format!(
                        "replica {id} is leaving: its groups move away first"
                    ));
                }
                let staying = members
                    .iter()
                    .filter(|m| *m != id && !agreed.draining.contains(m))
                    .count();
                if staying < placement.copies() {
                    return ChangeAnswer::Refused(format!(
                        "replica {id} cannot leave: {staying} members would stay, and each group is on {} of them (add one first)",
                        placement.copies()
                    ));
                }
                HostEntry::Drain {
                    version: agreed.version,
                    id: *id,
                }
            }
        };
        match replica.propose_host(&entry) {
            Ok(()) => {
                info!(replica = replica.id(), request = %request.encode(), "proposed: a change of a placed cluster's members");
                ChangeAnswer::Proposed(format!("proposed: {}", request.encode()))
            }
            Err(e) => ChangeAnswer::AskAgain(format!("{e:#}")),
        }
    }

    /// Every second, as group 0's settled leader with no move under way:
    /// the next move the members call for. A member leaving gives its
    /// groups away (to the member holding fewest that can take them), and
    /// once it holds none it leaves; a member added while running takes
    /// groups from the most loaded until it holds its share (the groups'
    /// copies over the members, rounded down). Members the cluster was
    /// made with are not rebalanced among themselves (`cluster move` is
    /// the operator's).
    pub(super) fn plan_moves(&mut self) {
        let Ok(at) = self.group0_leader() else {
            return;
        };
        let placement = self.agreed_placement(at);
        if placement.moves().moving.is_some() {
            return;
        }
        let replica = &mut self.groups[at].replica;
        let Some(entry) = plan(&placement, self.slots.len() as u32, &self.removed, self.per) else {
            return;
        };
        match replica.propose_host(&entry) {
            Ok(()) => info!(
                replica = replica.id(),
                ?entry,
                "proposed: a step of a change of members"
            ),
            Err(e) => warn!(error = %format!("{e:#}"), "proposing a step of a change of members"),
        }
    }

    /// The placement with the moves group 0 (at `at`) agreed: what a
    /// proposal is checked against (this replica's may lag a round).
    fn agreed_placement(&self, at: usize) -> Placement {
        let mut placement = self.placement.clone();
        placement.set_moves(self.groups[at].replica.agreed_moves().clone());
        placement
    }

    /// Tells every peer the moves this replica knows of (none: nothing).
    pub(super) fn tell_moves(&self) {
        let moves = self.placement.moves();
        if moves.version == 0 {
            return;
        }
        let bytes = moves.encode();
        let me = self.id();
        for r in self.replicas.iter().filter(|r| r.id != me) {
            self.links.placement(r.id, bytes.clone());
        }
    }

    /// After a round: the moves group 0 agreed, if this replica holds it.
    pub(super) fn agreed_moves(&mut self) -> Result<()> {
        let Some(at) = self.group0() else {
            return Ok(());
        };
        let agreed = self.groups[at].replica.agreed_moves();
        if agreed.version > self.placement.moves().version {
            let agreed = agreed.clone();
            self.adopt_moves(agreed)?;
        }
        Ok(())
    }

    /// The groups this replica has, made what the placement says: one it
    /// now holds is opened empty (its leader sends it the rest), and one it
    /// left is dropped once its move is settled. Which groups ship their
    /// notifications to replicas without them follows too.
    fn follow_placement(&mut self) -> Result<()> {
        let me = self.id();
        let moving = self.placement.moves().moving;
        for g in 0..self.count() {
            let (held, hosts) = (
                self.slots[g as usize].is_some(),
                self.placement.holds(me, g),
            );
            if self.removed((g / self.per) as usize) {
                continue;
            }
            if hosts && !held {
                self.open_joining(g)?;
            } else if !hosts && held && moving.is_none_or(|m| m.group != g) {
                self.drop_group(g);
            }
        }
        let ship = self.maker.notify == super::Notify::Everywhere;
        for group in &mut self.groups {
            group.router.ship_notifications =
                ship && !self.placement.outsiders(group.id).is_empty();
        }
        Ok(())
    }

    /// Opens group `g`, which moves to this replica, empty: a joiner with
    /// no voters, until its leader adds it and sends it a snapshot.
    fn open_joining(&mut self, g: u32) -> Result<()> {
        let (t, p) = ((g / self.per) as usize, g % self.per);
        let store = self.stores[t]
            .as_ref()
            .with_context(|| format!("group {g}: its store is not served here"))?;
        let name = self.named.then(|| self.tenants[t].as_str());
        let Some(dir) = super::tenants::group_dir(&self.maker.data_dir, name, self.per, p) else {
            bail!("group {g} has no directory of its own");
        };
        if dir.exists() {
            // A copy this replica held before: the leader's is the one.
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing an old copy in {}", dir.display()))?;
        }
        let disk = DirStorage::open(&dir)
            .with_context(|| format!("cannot open the group's directory {}", dir.display()))?;
        let log = LogStore::open_with(Arc::new(disk), &[], None, self.maker.journaled)
            .with_context(|| format!("the log in {}", dir.display()))?;
        let ship = self.maker.notify == super::Notify::Everywhere;
        let mut group = self
            .maker
            .group(store, g, log, (p, self.per, self.named), ship)?;
        if let (Some(m), Some(replica)) = (self.store_metrics.get(t), &self.metrics) {
            group.replica.set_log_metrics(m.journal());
            group.router.metrics = Some(replica.clone());
            group.router.store_metrics = Some(m.clone());
        }
        let at = self.groups.partition_point(|x| x.id < g);
        self.groups.insert(at, group);
        self.index_groups();
        info!(replica = self.id(), group = g, dir = %dir.display(), "a group's copy moves here: opened empty, waiting for its leader");
        Ok(())
    }

    /// Drops group `g`, whose copy moved away: the group, then its
    /// directory (the placement, kept first, says it is not held here).
    fn drop_group(&mut self, g: u32) {
        self.groups.retain(|x| x.id != g);
        self.index_groups();
        let (t, p) = ((g / self.per) as usize, g % self.per);
        let name = self.named.then(|| self.tenants[t].as_str());
        if let Some(dir) = super::tenants::group_dir(&self.maker.data_dir, name, self.per, p)
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            warn!(group = g, dir = %dir.display(), error = %e, "the copy of a group that moved away could not be removed");
        }
        info!(
            replica = self.id(),
            group = g,
            "a group's copy moved away: dropped"
        );
    }

    /// `slots` made again from `groups`.
    pub(super) fn index_groups(&mut self) {
        self.slots = super::slots_of(&self.groups, self.slots.len());
    }

    /// In each group this replica leads (`only_moving`: the one moving),
    /// the next membership change towards where the placement puts it,
    /// and for a move done, group 0's replicas asked to settle it.
    pub(super) fn carry_moves(&mut self, only_moving: bool) {
        if !only_moving {
            self.close_told();
        }
        let moves = self.placement.moves();
        if moves.version == 0 || (only_moving && moves.moving.is_none()) {
            return;
        }
        let (me, moving) = (self.id(), moves.moving);
        for i in 0..self.groups.len() {
            let g = self.groups[i].id;
            if only_moving && moving.is_none_or(|m| m.group != g) {
                continue;
            }
            let replica = &mut self.groups[i].replica;
            if !replica.is_leader() || !replica.membership_settled() {
                continue;
            }
            let target = self.placement.hosts(g);
            let (voters, learners) = (replica.voters(), replica.learners());
            let step = next_step(me, &target, &voters, &learners, &replica.status());
            let change = match step {
                Step::Learner(id) => Change::Learner(id),
                Step::Promote(id) => Change::Add {
                    id,
                    record: Vec::new(),
                },
                Step::Remove(id) => Change::Remove(id),
                Step::HandOver(to) => {
                    info!(
                        replica = me,
                        group = g,
                        to,
                        "leaving the group: its leadership goes first"
                    );
                    replica.transfer_leader(to);
                    continue;
                }
                Step::Wait => continue,
                Step::Done => {
                    if let Some(m) = moving.filter(|m| m.group == g) {
                        self.ask_settle(m, self.placement.moves().version);
                    }
                    continue;
                }
            };
            match replica.propose_change(&change) {
                Ok(()) => info!(
                    replica = me,
                    group = g,
                    ?change,
                    "moving a group: a membership change proposed"
                ),
                Err(e) => {
                    tracing::debug!(group = g, error = %format!("{e:#}"), "a move's membership change not proposed now")
                }
            }
        }
    }

    /// Asks group 0's replicas (its leader proposes) to settle move `m`,
    /// done, at `version`.
    fn ask_settle(&mut self, m: Move, version: u64) {
        let text = format!("settle {} {version}", m.group);
        let me = self.id();
        for host in self.placement.hosts(0) {
            if host == me {
                self.settle(m.group, version);
            } else {
                self.links.change_in(0, host, text.clone());
            }
        }
    }

    /// As group 0's leader: proposes that the move of `group` under way at
    /// `version` is done (another replica, its group's leader, says so).
    pub(super) fn settle(&mut self, group: u32, version: u64) {
        let Ok(at) = self.group0_leader() else {
            return;
        };
        let replica = &mut self.groups[at].replica;
        let agreed = replica.agreed_moves();
        if agreed.version != version || agreed.moving.is_none_or(|m| m.group != group) {
            return;
        }
        match replica.propose_host(&HostEntry::Settle { version, group }) {
            Ok(()) => info!(
                replica = replica.id(),
                group, version, "proposed: a group's move is done"
            ),
            Err(e) => warn!(group, error = %format!("{e:#}"), "settling a move"),
        }
    }

    /// An operator's `move <group> <from> <to>` (as group 0's leader):
    /// proposes it, if it can be made.
    pub(super) fn move_group(&mut self, group: u32, from: u64, to: u64) -> ChangeAnswer {
        if self.placement.everywhere() {
            return ChangeAnswer::Refused(
                "every group is on every replica (the cluster file has no `copies` below its replicas): there is nothing to move".into(),
            );
        }
        let at = match self.group0_leader() {
            Ok(at) => at,
            Err(ask) => return ask,
        };
        let placement = self.agreed_placement(at);
        let replica = &mut self.groups[at].replica;
        if group >= self.slots.len() as u32 || self.removed[(group / self.per) as usize] {
            return ChangeAnswer::Refused(format!(
                "the cluster has groups 0 to {} (those of removed tenants aside)",
                self.slots.len() - 1
            ));
        }
        let agreed = placement.moves();
        let m = Move { group, from, to };
        if let Some(under_way) = agreed
            .moving
            .filter(|u| !(u.group == group && u.to == from))
        {
            return if under_way == m {
                ChangeAnswer::Proposed(format!("group {group} is moving from {from} to {to}"))
            } else {
                ChangeAnswer::AskAgain(format!(
                    "group {} is moving from {} to {}: one move at a time",
                    under_way.group, under_way.from, under_way.to
                ))
            };
        }
        let hosts = placement.hosts(group);
        let refused = if !hosts.contains(&from) {
            Some(format!(
                "replica {from} does not hold group {group} (its replicas: {hosts:?})"
            ))
        } else if hosts.contains(&to) {
            Some(format!("replica {to} holds group {group} already"))
        } else if !placement.members().contains(&to) {
            Some(format!(
                "replica {to} is not a member (members: {:?})",
                placement.members()
            ))
        } else if placement.moves().draining.contains(&to) {
            Some(format!("replica {to} is leaving the cluster"))
        } else {
            None
        };
        if let Some(why) = refused {
            return ChangeAnswer::Refused(why);
        }
        let hosts: Vec<u64> = hosts
            .into_iter()
            .map(|h| if h == from { to } else { h })
            .collect();
        let entry = HostEntry::Move {
            version: agreed.version,
            to: m,
            hosts,
        };
        match replica.propose_host(&entry) {
            Ok(()) => {
                info!(
                    replica = replica.id(),
                    group, from, to, "proposed: a group's move"
                );
                ChangeAnswer::Proposed(format!("proposed: group {group} from {from} to {to}"))
            }
            Err(e) => ChangeAnswer::AskAgain(format!("{e:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(me: u64, commit: u64, matched: &[(u64, u64)]) -> Status {
        Status {
            id: me,
            role: "leader".into(),
            term: 2,
            leader: me,
            commit,
            applied: commit,
            last_index: commit,
            snapshot: 0,
            matched: matched.to_vec(),
        }
    }

    /// Grown from 4 to 5 members (8 groups, 3 copies: 24), the new one
    /// takes groups from the most loaded until it holds its share (4), one
    /// move at a time; a member leaving gives its groups to those holding
    /// fewest, then leaves.
    #[test]
    fn a_new_member_takes_its_share_and_one_leaving_gives_its_groups_away() {
        let mut p = Placement::new(&[1, 2, 3, 4], Some(3));
        let mut moves = p.moves().clone();
        assert_eq!(plan(&p, 8, &[false], 8), None, "balanced");
        assert!(moves.join(0, 5, b"raft=127.0.0.1:7105".to_vec()));
        p.set_moves(moves.clone());
        assert_eq!(p.members(), vec![1, 2, 3, 4, 5]);
        let mut steps = 0;
        while let Some(entry) = plan(&p, 8, &[false], 8) {
            let HostEntry::Move { version, to, hosts } = entry else {
                panic!("{entry:?}");
            };
            assert_eq!(to.to, 5);
            assert!(moves.start(version, to, hosts));
            assert!(moves.settle(moves.version, to.group));
            p.set_moves(moves.clone());
            steps += 1;
            assert!(steps <= 4, "at most its share");
        }
        let load = |p: &Placement, id| p.held_by(id, 8).len();
        assert_eq!(
            (1..=5).map(|id| load(&p, id)).collect::<Vec<_>>(),
            [5, 5, 5, 5, 4]
        );
        assert!(moves.drain(moves.version, 2));
        p.set_moves(moves.clone());
        loop {
            match plan(&p, 8, &[false], 8).expect("a step") {
                HostEntry::Move { version, to, hosts } => {
                    assert_eq!(to.from, 2);
                    assert!(moves.start(version, to, hosts));
                    assert!(moves.settle(moves.version, to.group));
                }
                HostEntry::Leave { version, id } => {
                    assert!(moves.leave(version, id));
                    p.set_moves(moves.clone());
                    break;
                }
                other => panic!("{other:?}"),
            }
            p.set_moves(moves.clone());
        }
        assert_eq!(p.members(), vec![1, 3, 4, 5]);
        let loads = [1, 3, 4, 5].map(|id| load(&p, id));
        assert_eq!(loads.iter().sum::<usize>(), 24, "{loads:?}");
        assert!(loads.iter().max().expect("max") - loads.iter().min().expect("min") <= 2);
        assert!(
            !moves.join(moves.version, 2, Vec::new()),
            "an id not used again"
        );
    }

    /// A move of group {2, 3, 4} from 2 to 1, step by step, as its leader
    /// sees it: the new replica a learner, a voter once caught up, then
    /// the old one removed; led by the one leaving, it hands over first.
    #[test]
    fn a_move_adds_a_learner_promotes_it_then_removes_the_old_voter() {
        let target = [1, 3, 4];
        let s = status(3, 10, &[(2, 10), (3, 10), (4, 10)]);
        assert_eq!(next_step(3, &target, &[2, 3, 4], &[], &s), Step::Learner(1));
        let behind = status(3, 10, &[(1, 4), (2, 10), (3, 10), (4, 10)]);
        assert_eq!(next_step(3, &target, &[2, 3, 4], &[1], &behind), Step::Wait);
        let s = status(3, 10, &[(1, 10), (2, 10), (3, 10), (4, 10)]);
        assert_eq!(
            next_step(3, &target, &[2, 3, 4], &[1], &s),
            Step::Promote(1)
        );
        assert_eq!(
            next_step(3, &target, &[1, 2, 3, 4], &[], &s),
            Step::Remove(2)
        );
        assert_eq!(
            next_step(2, &target, &[1, 2, 3, 4], &[], &s),
            Step::HandOver(1)
        );
        assert_eq!(next_step(3, &target, &[1, 3, 4], &[], &s), Step::Done);
        // A move turned back: the learner that is no longer wanted goes.
        assert_eq!(
            next_step(3, &[2, 3, 4], &[2, 3, 4], &[1], &s),
            Step::Remove(1)
        );
    }
}
