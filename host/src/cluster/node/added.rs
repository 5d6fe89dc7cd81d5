//! Tenants the cluster adds while running (`statestore cluster tenant
//! add`): group 0's leader proposes a [`HostEntry::AddTenant`]; every
//! replica, once its group 0 has applied it, opens the tenant's groups
//! (numbered after the others', with the voters the entry recorded), its
//! component and limits read from the replica's own `--config` (the
//! [`TenantSource`]), and its transport starts serving the tenant's clients
//! (reached as the source says: [`crate::store::driver::Reach`]). A replica whose `--config` does not name the tenant yet
//! says so and tries again every [`RETRY`]; meanwhile the others serve it.
//!
//! Crash-safe in this order: the groups' logs are created (each with its
//! voters), then the tenant is recorded in the data directory's `tenants`
//! (a replica restarted after that opens it like the others), then it is
//! served. A crash before the record leaves logs that nothing has written
//! to yet; group 0's log still holds the entry (or its snapshot the
//! tenant), so the replica opens them again when it applies it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tracing::{error, info};

use super::{Group, Node, NodeTenant};
use crate::cluster::operator::ChangeAnswer;
use crate::cluster::router::{Limits, Router, SharedBytes};
use crate::cluster::{AgreedTenant, Durability, HostEntry, LogStore};
use crate::store::driver::Reach;
use crate::store::storage::{DirStorage, Storage};

/// How often a replica tries again to open a tenant its `--config` did not
/// name.
pub(super) const RETRY: Duration = Duration::from_secs(10);

/// What a replica knows of a tenant it is told to open: its store (the
/// component compiled, its guest's configuration) and how its clients
/// reach it, from the replica's `--config` as it is on disk now.
pub type TenantSource = Box<dyn FnMut(&str) -> Result<(NodeTenant, Reach)> + Send>;

/// What a replica needs to open a group while serving: the settings every
/// one of its groups shares.
pub(super) struct Maker {
    pub(super) id: u64,
    pub(super) data_dir: PathBuf,
    pub(super) root: Arc<dyn Storage>,
    pub(super) durability: Durability,
    pub(super) raft_state: crate::cluster::file::RaftState,
    /// Its logs' records go through the round journal.
    pub(super) journaled: bool,
    pub(super) via: Option<statestore_guest::Via>,
    pub(super) reads: crate::cluster::file::ReadPath,
    pub(super) notify: super::Notify,
    /// The replica's bound on what its routers hold.
    pub(super) bytes: SharedBytes,
    /// Several groups (the idle ones stop their clocks).
    pub(super) many: bool,
}

impl Maker {
    /// Group `g` of `store` (its partition `p` of `per`) over `log`.
    pub(super) fn group(
        &self,
        store: &NodeTenant,
        g: u32,
        log: LogStore,
        (p, per, named): (u32, u32, bool),
        ship: bool,
    ) -> Result<Group> {
        let mut replica = store.replica(self.id, log, self.durability, (p, per, named))?;
        // Its snapshots written on a thread of their own: the loop goes
        // on meanwhile.
        replica.log_mut().snapshots_behind();
        if self.durability == Durability::Always && !self.journaled {
            match self.raft_state {
                // Its round's second sync (`raft-state`) on a thread of
                // its own: the loop goes on meanwhile.
                crate::cluster::file::RaftState::Behind => replica.log_mut().witness_behind()?,
                crate::cluster::file::RaftState::First => replica.log_mut().anchor_first(),
            }
        }
        let mut router = Router::new(
            self.id,
            store.config.clone(),
            self.via,
            self.reads,
            self.notify,
            Limits::default(),
            super::random_u64(),
            Instant::now(),
        );
        router.share(&self.bytes);
        router.ship_notifications = ship;
        if self.many {
            replica.set_quiet_after(Some(crate::cluster::quiet::QUIET_AFTER));
        }
        Ok(Group {
            id: g,
            replica,
            router,
            drops: Vec::new(),
        })
    }
}

/// The tenants added while running, on their way to being served.
#[derive(Default)]
pub(super) struct Added {
    /// Where their stores come from (`None`: a replica that cannot open
    /// any, say one without `--config`).
    pub(super) source: Option<TenantSource>,
    /// When opening each last failed.
    pub(super) failed: HashMap<String, Instant>,
    /// Opened, for the transport to serve: (tenant number, how).
    pub(super) opened: Vec<(usize, Reach)>,
    /// Closed (removed), for the transport to stop serving.
    pub(super) closed: Vec<usize>,
    /// Where a tenant's metrics are made (`--metrics`).
    pub(super) metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Node {
    /// Opens the tenants that group 0 has agreed to add and this replica
    /// does not serve yet, and closes those it agreed to remove.
    pub(super) fn open_agreed(&mut self) -> Result<()> {
        if !self.named {
            return Ok(());
        }
        // Group 0's own, or where groups are placed the placement's (which
        // every replica learns, holding group 0 or not).
        let tenancy = match self.group0() {
            _ if !self.placement.everywhere() => &self.placement.moves().tenants,
            Some(at) => self.groups[at].replica.agreed_tenants(),
            None => return Ok(()),
        };
        let closing: Vec<usize> = (0..self.tenants.len())
            .filter(|&t| !self.removed(t) && tenancy.removed.contains(&self.tenants[t]))
            .collect();
        let agreed: Vec<(AgreedTenant, bool)> = tenancy
            .added
            .iter()
            .filter(|a| !self.tenants.contains(&a.name))
            .map(|a| (a.clone(), tenancy.removed.contains(&a.name)))
            .collect();
        for t in closing {
            // Its record failing to be written is the replica's end: the
            // tenant would come back at its next start.
            self.close_tenant(t)?;
        }
        // In the order agreed: a tenant's number is its place, so one that
        // cannot be opened yet holds back those after it.
        for (a, removed) in agreed {
            if removed {
                // Added and removed before this replica opened it: its
                // number is taken all the same.
                self.hold_place(&a.name)?;
                continue;
            }
            if self
                .added
                .failed
                .get(&a.name)
                .is_some_and(|t| t.elapsed() < RETRY)
            {
                break;
            }
            match self.open_tenant(&a) {
                Ok(()) => {
                    self.added.failed.remove(&a.name);
                    info!(replica = self.id(), tenant = %a.name, number = self.tenants.len() - 1, partitions = self.per, voters = ?a.voters, "serving a tenant the cluster added");
                }
                Err(e) => {
                    self.added.failed.insert(a.name.clone(), Instant::now());
                    error!(replica = self.id(), tenant = %a.name, error = %format!("{e:#}"), "the cluster added a tenant this replica cannot serve yet (tried again every 10 s; tenants added after it wait for it): add it to this replica's --config, as on the others");
                    break;
                }
            }
        }
        Ok(())
    }

    /// Takes the next number for tenant `name`, which the cluster added and
    /// removed before this replica opened it: recorded as both, no group,
    /// and a place in the transport that takes no client.
    fn hold_place(&mut self, name: &str) -> Result<()> {
        super::tenants::record_added(&*self.maker.root, name)?;
        super::tenants::record_removed(&*self.maker.root, name)?;
        let t = self.tenants.len();
        self.slots.extend((0..self.per).map(|_| None));
        self.tenants.push(name.to_string());
        self.stores.push(None);
        self.removed.push(true);
        self.observers.push(super::Observers::default());
        if let Some(all) = &self.added.metrics {
            let m = all.tenant(name);
            m.stopped();
            self.store_metrics.push(m);
        }
        self.added.opened.push((t, Box::new(())));
        Ok(())
    }

    /// Closes tenant `t`, which the cluster removed: recorded as removed
    /// in `tenants` first (a replica restarted after that does not open
    /// it), then its groups dropped and its clients no longer served. Its
    /// data stays in its directory (`tenant-<name>`), for the operator to
    /// keep or delete; its name is not used again.
    fn close_tenant(&mut self, t: usize) -> Result<()> {
        let name = self.tenants[t].clone();
        super::tenants::record_removed(&*self.maker.root, &name)?;
        let per = self.per;
        let range = t as u32 * per..(t as u32 + 1) * per;
        self.groups.retain(|g| !range.contains(&g.id));
        self.index_groups();
        self.removed[t] = true;
        self.stores[t] = None;
        self.observers[t] = super::Observers::default();
        if let Some(m) = self.store_metrics.get(t) {
            m.stopped();
        }
        self.added.closed.push(t);
        info!(replica = self.id(), tenant = %name, number = t, "a tenant the cluster removed: its groups are closed, its data left in its directory");
        Ok(())
    }

    /// Opens tenant `a`'s groups (see the module's note on the order).
    fn open_tenant(&mut self, a: &AgreedTenant) -> Result<()> {
        let Some(source) = &mut self.added.source else {
            bail!("this replica was started without a way to open tenants while running");
        };
        let (store, reach) = source(&a.name)?;
        let t = self.tenants.len();
        let per = self.per;
        let me = self.id();
        // Every group of it, or where groups are placed those the formula
        // puts here (with their hosts as voters).
        let everywhere = self.placement.everywhere();
        let mut logs = Vec::with_capacity(per as usize);
        for p in 0..per {
            let g = t as u32 * per + p;
            if !everywhere && !self.placement.holds(me, g) {
                logs.push(None);
                continue;
            }
            let voters = if everywhere {
                a.voters.clone()
            } else {
                self.placement.hosts(g)
            };
            let dir = super::tenants::group_dir(&self.maker.data_dir, Some(&a.name), per, p)
                .context("a tenant's directory")?;
            let disk = DirStorage::open(&dir)
                .with_context(|| format!("cannot open the group's directory {}", dir.display()))?;
            let log = LogStore::open_with(Arc::new(disk), &voters, None, self.maker.journaled)
                .with_context(|| format!("the log in {}", dir.display()))?;
            logs.push(Some(log));
        }
        let mut groups = Vec::with_capacity(per as usize);
        let metrics = self.added.metrics.as_ref().map(|m| m.tenant(&a.name));
        let ship = self.maker.notify == super::Notify::Everywhere;
        for (p, log) in (0..per).zip(logs) {
            let g = t as u32 * per + p;
            let Some(log) = log else {
                groups.push(None);
                continue;
            };
            let ship = ship && !self.placement.outsiders(g).is_empty();
            let mut group = self.maker.group(&store, g, log, (p, per, true), ship)?;
            if let (Some(m), Some(replica)) = (&metrics, &self.metrics) {
                group.replica.set_log_metrics(m.journal());
                group.router.metrics = Some(replica.clone());
                group.router.store_metrics = Some(m.clone());
            }
            groups.push(Some(group));
        }
        super::tenants::record_added(&*self.maker.root, &a.name)?;
        for group in groups {
            match group {
                Some(group) => {
                    self.slots.push(Some(self.groups.len()));
                    self.groups.push(group);
                }
                None => self.slots.push(None),
            }
        }
        self.stores.push(Some(store));
        self.tenants.push(a.name.clone());
        self.removed.push(false);
        self.observers.push(super::Observers::default());
        if let Some(m) = metrics {
            self.store_metrics.push(m);
        }
        self.added.opened.push((t, reach));
        Ok(())
    }

    /// Hands the tenants opened and closed since the last call to
    /// `transport`.
    pub(super) async fn serve_opened<T: crate::store::driver::Transport>(
        &mut self,
        transport: &mut T,
    ) {
        for t in std::mem::take(&mut self.added.closed) {
            if let Err(e) = transport.remove_tenant(t).await {
                error!(tenant = %self.tenants[t], error = %format!("{e:#}"), "the transport cannot stop serving a removed tenant's clients (their requests are dropped)");
            }
        }
        for (t, reach) in std::mem::take(&mut self.added.opened) {
            let name = self.tenants[t].clone();
            match transport.add_tenant(t, reach).await {
                Ok(()) if self.removed(t) => {}
                Ok(()) => info!(tenant = %name, number = t, "the tenant's clients are served"),
                Err(e) => {
                    error!(tenant = %name, error = %format!("{e:#}"), "the tenant's groups are open but its clients cannot reach them through this replica")
                }
            }
        }
    }

    /// An operator's `tenant add <name>` (as group 0's leader): proposes
    /// the tenant, if this replica's `--config` names it.
    pub(super) fn add_tenant(&mut self, name: &str) -> ChangeAnswer {
        if let Some(refused) = self.may_change_tenants() {
            return refused;
        }
        let Some(at) = self.group0() else {
            return ChangeAnswer::AskAgain("this replica does not hold group 0".into());
        };
        let replica = &self.groups[at].replica;
        let leader = replica.leader();
        if replica.agreed_tenants().removed.iter().any(|t| t == name) {
            return ChangeAnswer::Refused(format!(
                "tenant {name:?} was removed: a removed tenant's name is not used again (its data may still be in its directory); choose another name"
            ));
        }
        if self.tenants.iter().any(|t| t == name)
            || replica
                .agreed_tenants()
                .added
                .iter()
                .any(|t| t.name == name)
        {
            return ChangeAnswer::Proposed(format!("tenant {name:?} is the cluster's already"));
        }
        if let Some(source) = &mut self.added.source
            && let Err(e) = source(name)
        {
            return ChangeAnswer::Refused(format!(
                "replica {leader} cannot serve tenant {name:?}: {e:#} (add it to every replica's --config first)"
            ));
        }
        self.propose_tenants(&HostEntry::AddTenant(name.to_string()))
    }

    /// Why this replica cannot change the cluster's tenants now, if it
    /// cannot: no tenants, groups placed, or not group 0's settled leader.
    fn may_change_tenants(&self) -> Option<ChangeAnswer> {
        if !self.named {
            return Some(ChangeAnswer::Refused(
                "this cluster serves one store (it was started without --config): it has no tenants to change".into(),
            ));
        }
        self.group0_leader().err()
    }

    /// Where group 0 is among the groups, if this replica holds it.
    pub(super) fn group0(&self) -> Option<usize> {
        self.slots.first().copied().flatten()
    }

    /// Where group 0 is among the groups, if this replica is its settled
    /// leader (the one to propose the cluster's changes); else the answer
    /// that says to ask again.
    pub(super) fn group0_leader(&self) -> std::result::Result<usize, ChangeAnswer> {
        let Some(at) = self.group0() else {
            return Err(ChangeAnswer::AskAgain(
                "this replica does not hold group 0".into(),
            ));
        };
        let replica = &self.groups[at].replica;
        if !replica.membership_settled() {
            return Err(ChangeAnswer::AskAgain(format!(
                "not the leader; leader={}",
                replica.leader()
            )));
        }
        Ok(at)
    }

    /// Proposes `entry` to group 0.
    fn propose_tenants(&mut self, entry: &HostEntry) -> ChangeAnswer {
        let Some(at) = self.group0() else {
            return ChangeAnswer::AskAgain("this replica does not hold group 0".into());
        };
        let replica = &mut self.groups[at].replica;
        let (verb, name) = match entry {
            HostEntry::AddTenant(name) => ("add", name),
            HostEntry::RemoveTenant(name) => ("remove", name),
            _ => {
                return ChangeAnswer::Refused("not a change of tenants".into());
            }
        };
        match replica.propose_host(entry) {
            Ok(()) => {
                info!(replica = replica.id(), tenant = %name, verb, "proposed: a change of tenants");
                ChangeAnswer::Proposed(format!("proposed: tenant {verb} {name}"))
            }
            Err(e) => ChangeAnswer::AskAgain(format!("{e:#}")),
        }
    }

    /// An operator's `tenant remove <name>` (as group 0's leader):
    /// proposes its removal. The first tenant cannot go: its group 0 keeps
    /// the cluster's membership and tenants.
    pub(super) fn remove_tenant(&mut self, name: &str) -> ChangeAnswer {
        if let Some(refused) = self.may_change_tenants() {
            return refused;
        }
        let Some(at) = self.group0() else {
            return ChangeAnswer::AskAgain("this replica does not hold group 0".into());
        };
        let replica = &self.groups[at].replica;
        if replica.agreed_tenants().removed.iter().any(|t| t == name) {
            return ChangeAnswer::Proposed(format!("tenant {name:?} was removed already"));
        }
        match self.tenants.iter().position(|t| t == name) {
            None => {
                return ChangeAnswer::Refused(format!(
                    "the cluster has no tenant {name:?} (its tenants: {})",
                    self.tenants.join(", ")
                ));
            }
            Some(0) => {
                return ChangeAnswer::Refused(format!(
                    "tenant {name:?} is the first: its group 0 keeps the cluster's membership and tenants, so it stays"
                ));
            }
            Some(_) => {}
        }
        self.propose_tenants(&HostEntry::RemoveTenant(name.to_string()))
    }
}
