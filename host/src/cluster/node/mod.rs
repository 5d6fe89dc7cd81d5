//! One replica as a server: its [`Replica`] over a log in its data
//! directory, the links to its peers, and the MQTT transport its clients
//! use (the embedded broker or an external one), driven by one loop:
//!
//! ```text
//!   transport (requests, client gone) ──> router: propose, forward to the leader, or hold
//!   peer links (Raft messages, forwarded requests, status) ──> step / router: propose
//!   tick (50 ms) ──> Raft tick; router: resend, answer what waited too long, expiry
//!   after each: ready() ──> persist, send to peers, apply; router: what to publish
//! ```
//!
//! The decisions are the [`Router`]'s (sans-IO, shared with the
//! simulation); this loop carries out its effects. What is ours to
//! publish: the replies to requests this replica received (the entry's
//! origin), at most one per request, and in the embedded mode every
//! notification (the broker delivers it only if the observer's session is
//! here).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use super::file::ClusterFile;
pub use super::file::{ReadPath, ReplicaEntry};
use crate::WasmStore;
use crate::cluster::log::journal::Journal;
use crate::cluster::net::{Links, PeerEvent};
use crate::cluster::operator::ChangeRequest;
use crate::cluster::router::{Effects, Now, Router};
use crate::cluster::{Applying, Durability, Replica, Timing};
use crate::store::clock::Clock;
use crate::store::driver::{Received, Transport};
use crate::store::journal::Fsync;

/// A tick of a replica's Raft clock.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// Raft timing, in ticks: heartbeats every 100 ms, elections after 0.5 to
/// 1 s without a leader.
pub(crate) const TIMING: Timing = Timing {
    heartbeat: 2,
    election_min: 10,
    election_max: 20,
};

pub use super::router::Notify;

mod added;
mod members;
mod metrics;
mod moves;
mod observers;
mod outside;
mod partitions;
mod pipelined;
mod tenants;
pub use added::TenantSource;
use members::successor;
use observers::{Gone, Observers};
use partitions::{SPREAD_EVERY, check_partitions, held_groups, open_logs, sync_pool};
pub use tenants::{NodeTenant, Stores, fingerprint};
pub(crate) use tenants::{group_dirs, recorded_tenants};

/// One Raft group of a replica: a store (the one store, or a tenant's),
/// or one partition of it (`partitions` in the cluster file; see
/// [`super::partition`]).
struct Group {
    /// Its number among the cluster's groups.
    id: u32,
    replica: Replica<WasmStore>,
    /// What to do with the clients' traffic for it.
    router: Router,
    /// Replicas removed from the membership whose clients' registrations
    /// this replica has yet to have dropped in this group, as its leader
    /// ([`Node::propose_drops`]).
    drops: Vec<u64>,
}

/// One replica, ready to serve.
pub struct Node {
    /// The groups it holds (every group, unless the cluster file places
    /// them on some replicas: `copies`), in order. The cluster's groups are
    /// one per partition of each store, tenant `t`'s partition `p` group
    /// `t * partitions + p`. The membership is its first group's (group
    /// 0's when every replica holds every group; the cluster file's when
    /// not, and then it does not change).
    groups: Vec<Group>,
    /// Where each of the cluster's groups is among `groups` (`None`: not
    /// held here).
    slots: Vec<Option<usize>>,
    /// Which replicas hold which groups (the cluster file's formula, and
    /// the moves the cluster agreed since).
    placement: crate::cluster::placement::Placement,
    /// Its id.
    me: u64,
    /// Its stores, by number (`None`: a tenant the cluster removed), to
    /// open a group that moves here.
    stores: Vec<Option<NodeTenant>>,
    /// Ticks since it started, the last with a request, and the replicas
    /// told they left.
    rhythm: moves::Rhythm,
    /// What it does for the groups it does not hold, and for the replicas
    /// that do not hold its groups.
    outside: outside::Outside,
    /// What the groups' routers asked for while serving another replica's
    /// clients (from a peer's frame), carried out at the next ready.
    waiting: Vec<(u32, Effects)>,
    /// The partitions of each store.
    per: u32,
    /// Its stores' names: the one store's (`default`), or the tenants'
    /// (those it was founded with, then those added while running).
    tenants: Vec<String>,
    /// Which of them the cluster removed (their numbers stay taken).
    removed: Vec<bool>,
    /// Whether it serves tenants (`--config`).
    named: bool,
    /// Opens a group while serving.
    maker: added::Maker,
    /// The tenants added while running, on their way to being served.
    added: added::Added,
    links: Links,
    events: mpsc::Receiver<PeerEvent>,
    clock: Arc<dyn Clock>,
    fsync: Fsync,
    /// The replicas that are members, with their addresses (from the cluster
    /// file, or the record they were added with).
    replicas: Vec<ReplicaEntry>,
    /// The replicas of the cluster file.
    file_replicas: Vec<ReplicaEntry>,
    /// The replica's membership changes already reflected in `replicas`
    /// and the links.
    changes_seen: Option<u64>,
    accept: tokio::task::JoinHandle<()>,
    metrics: Option<crate::metrics::ReplicaMetrics>,
    /// When each peer was last heard from, Unix seconds (for `metrics`).
    heard: std::collections::HashMap<u64, u64>,
    /// Asks the others who the members are while no leader is known.
    probe: super::probe::Probe,
    /// Each store's metrics (its guests' sizes summed over its groups).
    store_metrics: Vec<crate::metrics::TenantMetrics>,
    /// When each peer was last heard from (for moving leaderships to it).
    alive: std::collections::HashMap<u64, Instant>,
    /// Ticks until leaderships are looked at again ([`Node::spread_leaders`]).
    spread_in: u32,
    /// Threads that sync the partitions' logs together at the round
    /// journal's checkpoints (with partitions, under `--fsync always`).
    syncs: Option<rayon::ThreadPool>,
    /// With partitions, under `--fsync always`, the round journal: one sync
    /// per round for every group's log.
    journal: Option<Journal>,
    /// Its syncs under way while it goes on ([`pipelined`]).
    pipeline: pipelined::Syncs,
    /// Each store's clients that registered KEYNOTIFY, and in which
    /// partitions.
    observers: Vec<Observers>,
    /// When a frame for a partition this replica does not have was last
    /// reported.
    warned_partition: Option<Instant>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("replica", &self.me)
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens replica `file.id`: its logs (recovered from its data
    /// directory), its stores' guests (from the last snapshot, then the
    /// log), its listener for peers. A store's config is its guest's, the
    /// same on every replica (its hash seed from
    /// [`ClusterFile::hash_seed`]).
    pub async fn open(
        file: &ClusterFile,
        stores: Stores,
        fsync: Fsync,
        clock: Arc<dyn Clock>,
        notify: Notify,
    ) -> Result<Node> {
        let (stores, named) = stores.into_list();
        let root = crate::store::storage::DirStorage::open(&file.data_dir).with_context(|| {
            format!("cannot open the data directory {}", file.data_dir.display())
        })?;
        let root: Arc<dyn crate::store::storage::Storage> = Arc::new(root);
        let partitions = file.partitions;
        let (stores, served) = tenants::served(&*root, stores, named)?;
        let (names, founding) = (served.names.clone(), served.founding);
        let mut who = file.credentials()?;
        if named {
            who = who.with_tenants(&names);
        }
        check_partitions(&*root, partitions)?;
        let count = stores.len() * partitions as usize;
        let placement = moves::placement(file, &*root)?;
        let (held, voters) = held_groups(file, &placement, count)?;
        // The groups of tenants the cluster removed are not opened (their
        // numbers stay taken).
        let gone = |g: &u32| served.removed[(*g / partitions) as usize];
        let (held, voters): (Vec<u32>, Vec<Vec<u64>>) = held
            .into_iter()
            .zip(voters)
            .filter(|(g, _)| !gone(g))
            .unzip();
        // Those of removed tenants, and those whose copy moved away (their
        // directory too, if a crash left it).
        let mut removed_groups: Vec<u32> = (0..count as u32).filter(gone).collect();
        let all_dirs = tenants::group_dirs(&file.data_dir, named.then_some(&names[..]), partitions);
        removed_groups.extend(moves::moved_away(file.id, &placement, &all_dirs)?);
        let life = new_life(&*root, clock.now_ms())?;
        let durability = match fsync {
            Fsync::Always => Durability::Always,
            Fsync::Everysec | Fsync::No => Durability::Later,
        };
        let via = (notify == Notify::Everywhere).then_some(statestore_guest::Via {
            replica: file.id,
            started: life,
        });
        let started = Instant::now();
        // One group keeps syncing its log and `raft-state` itself (a log
        // that loses any synced byte is noticed); several make their
        // rounds durable through the round journal.
        let journaled = durability == Durability::Always && count > 1;
        let dirs: Vec<_> = held.iter().map(|&g| all_dirs[g as usize].clone()).collect();
        let (logs, journal) = open_logs(
            file,
            &root,
            (&held, count as u32, &removed_groups),
            &dirs,
            &voters,
            journaled,
        )?;
        let mut groups = Vec::with_capacity(count);
        let maker = added::Maker {
            id: file.id,
            data_dir: file.data_dir.clone(),
            root: root.clone(),
            durability,
            raft_state: file.raft_state,
            journaled,
            via,
            reads: file.reads,
            notify,
            // The groups' routers hold requests against the replica's bounds.
            bytes: crate::cluster::router::SharedBytes::default(),
            // Many groups: the idle ones stop their clocks.
            many: count > 1,
        };
        let ship = notify == Notify::Everywhere && !placement.everywhere();
        for (&g, log) in held.iter().zip(logs) {
            let (store, p) = (&stores[(g / partitions) as usize], g % partitions);
            let store = store.as_ref().context("a removed tenant's group")?;
            let ship = ship && !placement.outsiders(g).is_empty();
            groups.push(maker.group(store, g, log, (p, partitions, named), ship)?);
        }
        let syncs = journaled.then(|| sync_pool(count)).transpose()?;
        let me = file.me();
        let listener = TcpListener::bind(me.raft)
            .await
            .with_context(|| format!("cannot listen for replicas on {} (in use?)", me.raft))?;
        let (tx, events) = mpsc::channel(4096);
        let accept = tokio::spawn(super::net::accept(listener, who.clone(), tx.clone()));
        let peers: Vec<(u64, SocketAddr)> = file.replicas.iter().map(|r| (r.id, r.raft)).collect();
        let links = Links::start(who.clone(), &peers, tx);
        let status = groups
            .first()
            .map(|g| g.replica.status())
            .unwrap_or_default();
        let slots = slots_of(&groups, count);
        info!(
            replica = file.id,
            replicas = file.replicas.len(),
            partitions,
            groups = count,
            held = groups.len(),
            tenants = if named { names.len() } else { 0 },
            added_while_running = if named { names.len() - founding } else { 0 },
            raft = %me.raft,
            data_dir = %file.data_dir.display(),
            term = status.term,
            snapshot = status.snapshot,
            last_index = status.last_index,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "replica started"
        );
        Ok(Node {
            groups,
            slots,
            outside: outside::Outside::new(file.id, via),
            waiting: Vec::new(),
            placement,
            per: partitions,
            observers: names.iter().map(|_| Observers::default()).collect(),
            tenants: names,
            removed: served.removed,
            named,
            maker,
            added: added::Added::default(),
            links,
            events,
            fsync,
            replicas: file.replicas.clone(),
            file_replicas: file.replicas.clone(),
            changes_seen: None,
            accept,
            metrics: None,
            heard: std::collections::HashMap::new(),
            clock,
            probe: super::probe::Probe::new(who),
            store_metrics: Vec::new(),
            alive: std::collections::HashMap::new(),
            spread_in: SPREAD_EVERY,
            syncs,
            journal,
            pipeline: pipelined::Syncs::default(),
            warned_partition: None,
            stores,
            rhythm: moves::Rhythm::default(),
            me: file.id,
        })
    }

    /// Its stores' names, in order: the tenants', or the one store's.
    pub fn tenants(&self) -> &[String] {
        &self.tenants
    }

    /// Whether tenant `t` (of [`Node::tenants`]) was removed: its number
    /// stays taken, and nothing serves it.
    pub fn removed(&self, t: usize) -> bool {
        self.removed.get(t).copied().unwrap_or(false)
    }

    /// Whether it serves tenants (`--config`): the cluster may add more.
    pub fn serves_tenants(&self) -> bool {
        self.named
    }

    /// Where the stores of tenants the cluster adds while running come
    /// from (with `--config`: the file as it is then).
    pub fn set_tenant_source(&mut self, source: TenantSource) {
        self.added.source = Some(source);
    }

    fn now(&self) -> Now {
        Now {
            at: Instant::now(),
            ms: self.clock.now_ms(),
        }
    }

    /// This replica's id.
    fn id(&self) -> u64 {
        self.me
    }

    /// The number of the cluster's groups: each store's partitions.
    fn count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Forwards and publishes what group `g`'s router asks for (a SCAN
    /// page of a partition names it, see [`super::partition::reply`]), to
    /// the clients of the group's store.
    async fn carry_out<T: Transport>(
        &mut self,
        transport: &mut T,
        g: u32,
        mut fx: Effects,
    ) -> Result<()> {
        let id = self.id();
        for (leader, batch) in fx.forwards {
            self.links.forward(g, leader, id, batch);
        }
        if !fx.outsiders.is_empty() {
            let outputs = crate::cluster::net::shipped::encode(&fx.outsiders);
            let outsiders = self.placement.outsiders(g);
            if let Some(m) = &self.metrics {
                let n = fx.outsiders.len() * outsiders.len();
                m.agents.with_label_values(&["shipped"]).inc_by(n as u64);
            }
            for to in outsiders {
                self.links.ship(g, to, outputs.clone());
            }
        }
        if !fx.replies.is_empty() {
            let (t, p) = ((g / self.per) as usize, g % self.per);
            super::partition::replies(&mut fx.replies, p, self.per);
            self.outside.served_replies(g, &mut fx.replies, &self.links);
            self.published(t, &fx.replies);
            transport.emit_to(t, fx.replies).await?;
        }
        Ok(())
    }

    /// Requests clients of tenant `t` sent: each to its key's partition
    /// of the tenant's store.
    async fn requests<T: Transport>(
        &mut self,
        transport: &mut T,
        t: usize,
        messages: Vec<crate::InboundMessage>,
    ) -> Result<()> {
        let now = self.now();
        if self.removed(t) {
            // Sent before the cluster removed it.
            return Ok(());
        }
        let Some(observers) = self.observers.get_mut(t) else {
            bail!("requests of tenant {t}, which this replica does not serve");
        };
        observers.note(&messages, self.per);
        let by_partition = super::partition::split(messages, self.per);
        let first = t * self.per as usize;
        let mut result = Ok(());
        for (p, messages) in by_partition.into_iter().enumerate() {
            let g = (first + p) as u32;
            if messages.is_empty() {
                continue;
            }
            let Some(at) = self.slots[g as usize].filter(|_| self.placement.holds(self.id(), g))
            else {
                self.outside
                    .send_requests(g, messages, &self.placement, &self.links);
                continue;
            };
            let r = self
                .routed(transport, at, |router, replica, fx| {
                    router.requests(now, messages, replica, fx)
                })
                .await?;
            result = result.and(r);
        }
        result
    }

    /// A client of tenant `t` went away: the groups of its store where it
    /// registered KEYNOTIFY through this replica forget its registrations
    /// (the others have none of it to forget: no entry).
    async fn client_gone<T: Transport>(
        &mut self,
        transport: &mut T,
        t: usize,
        client: String,
    ) -> Result<()> {
        let now = self.now();
        if self.removed(t) {
            return Ok(());
        }
        let Some(observers) = self.observers.get(t) else {
            bail!("a client of tenant {t}, which this replica does not serve");
        };
        let first = t * self.per as usize;
        let groups: Vec<usize> = match observers.gone(&client) {
            Gone::Nowhere => return Ok(()),
            Gone::To(partitions) => partitions.into_iter().map(|p| first + p as usize).collect(),
            Gone::Everywhere => (first..first + self.per as usize).collect(),
        };
        let mut result = Ok(());
        for g in groups {
            let client = client.clone();
            let Some(at) = self.slots[g].filter(|_| self.placement.holds(self.id(), g as u32))
            else {
                self.outside
                    .send_gone(g as u32, &client, &self.placement, &self.links);
                continue;
            };
            let r = self
                .routed(transport, at, |router, replica, fx| {
                    router.client_gone(now, client, replica, fx)
                })
                .await?;
            result = result.and(r);
        }
        result
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
                result = pipelined::done(&mut self.pipeline), if self.pipeline.is_syncing() => self.synced(result),
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
                    self.rhythm.served = Some(self.rhythm.ticks);
                    self.rhythm.clients = Some(self.rhythm.ticks);
                    let mut taken = 0;
                    let mut r = self.client_event(transport, event, &mut taken).await;
                    // What else is waiting (other tenants' requests), up
                    // to a batch's worth: one ready for all of it.
                    while r.is_ok()
                        && taken < crate::store::driver::MAX_BATCH
                        && let Some(event) = transport.try_recv()
                    {
                        r = self.client_event(transport, event, &mut taken).await;
                    }
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
                _ = sync.tick(), if self.fsync == Fsync::Everysec => {
                    self.groups.iter_mut().try_for_each(|g| g.replica.sync())
                }
                answers = self.probe.answers() => {
                    match super::probe::removed(self.id(), self.groups.first().map_or(0, |g| g.replica.applied()), &answers) {
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
        if let Err(e) = self.drain().await {
            warn!(error = %format!("{e:#}"), "syncing the Raft log at shutdown");
        }
        for g in &mut self.groups {
            if let Err(e) = g.replica.finish_compaction() {
                warn!(error = %format!("{e:#}"), "compacting the Raft log at shutdown");
            }
            if let Err(e) = g.replica.sync() {
                warn!(error = %format!("{e:#}"), "syncing the Raft log at shutdown");
            }
        }
        self.accept.abort();
        transport.close().await;
        if result.is_ok() {
            info!(replica = self.id(), "replica stopped");
        }
        result
    }

    /// A client event from the transport, handed to its tenant's groups
    /// and settled; `taken` counts the requests (and departures).
    async fn client_event<T: Transport>(
        &mut self,
        transport: &mut T,
        event: T::Event,
        taken: &mut usize,
    ) -> Result<()> {
        let input = transport.on_event(event).await?;
        let t = transport.tenant();
        let r = match input {
            Some(Received::Messages(m)) => {
                *taken += m.len();
                self.requests(transport, t, m).await
            }
            Some(Received::ClientGone(id)) => {
                *taken += 1;
                self.client_gone(transport, t, id).await
            }
            None => Ok(()),
        };
        transport.settle().await?;
        r
    }

    /// The group of a peer's frame, if this replica has it.
    fn group(&mut self, g: u32, from: u64) -> Option<&mut Group> {
        let slot = self.slots.get(g as usize).copied().flatten();
        if slot.is_none() && !self.removed((g / self.per) as usize) {
            // Said at most every 10 s: such a peer sends it many times a second.
            if self
                .warned_partition
                .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
            {
                self.warned_partition = Some(Instant::now());
                warn!(
                    peer = from,
                    group = g,
                    groups = self.count(),
                    "a peer sent traffic for a group this replica does not have (dropped): every replica's cluster file must name the same `partitions`, replicas and `copies`, and every replica must serve the same tenants (a tenant the cluster just added is opened once this replica applies the addition)"
                );
            }
            return None;
        }
        slot.map(|at| &mut self.groups[at])
    }

    fn on_peer(&mut self, event: PeerEvent) -> Result<()> {
        match event {
            PeerEvent::Raft(_, m) if self.placement.moves().left.contains(&m.from) => {
                // A replica removed while it was down: it is told.
                self.tell_left(m.from);
            }
            PeerEvent::Raft(g, m) => {
                self.heard_from(m.from);
                if self.count() > 1 {
                    self.alive.insert(m.from, Instant::now());
                }
                if let Some(group) = self.group(g, m.from)
                    && let Err(e) = group.replica.step(m)
                {
                    tracing::debug!(error = %format!("{e:#}"), "a Raft message refused");
                }
            }
            PeerEvent::Forward {
                group: g,
                origin,
                batch,
            } => {
                self.rhythm.served = Some(self.rhythm.ticks);
                if !self.replicas.iter().any(|r| r.id == origin) {
                    warn!(
                        origin,
                        "forwarded requests from a replica not in the cluster file"
                    );
                } else {
                    let now = self.now();
                    if let Some(group) = self.group(g, origin) {
                        group
                            .router
                            .forwarded(now, origin, &batch, &mut group.replica);
                    }
                }
            }
            PeerEvent::Unreachable(peer) => {
                self.outside.unreachable(peer);
                for g in &mut self.groups {
                    g.replica.unreachable(peer);
                }
            }
            PeerEvent::Agent { group, from, batch } => {
                self.rhythm.served = Some(self.rhythm.ticks);
                self.agent_for(group, from, &batch);
            }
            PeerEvent::Shipped {
                group,
                from,
                outputs,
            } => {
                self.rhythm.served = Some(self.rhythm.ticks);
                self.outside.shipped(group, from, outputs, &self.placement);
            }
            PeerEvent::Placement { from, moves } => {
                if self.replicas.iter().any(|r| r.id == from) {
                    self.adopt_moves(moves)?;
                }
            }
            PeerEvent::ChangeIn(0, request) if request.starts_with("settle ") => {
                let mut words = request.split_whitespace().skip(1).map(str::parse::<u64>);
                if let (Some(Ok(group)), Some(Ok(version))) = (words.next(), words.next()) {
                    self.settle(group as u32, version);
                }
            }
            PeerEvent::ChangeIn(g, request) => match ChangeRequest::decode(&request) {
                Ok(change) if let Some(Some(at)) = self.slots.get(g as usize) => {
                    self.change_group(*at, &change);
                }
                Ok(_) => warn!(
                    group = g,
                    "a membership change for a group this replica does not have"
                ),
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "a membership change that does not decode")
                }
            },
            PeerEvent::Status(reply) => {
                let _ = reply.send(self.status_text());
            }
            PeerEvent::Change(request, reply) => {
                let answer = self.operator_change(&request);
                let _ = reply.send(answer.encode());
            }
        }
        Ok(())
    }

    async fn on_tick<T: Transport>(&mut self, transport: &mut T) -> Result<()> {
        for g in &mut self.groups {
            g.replica.tick();
            g.replica.poll_compaction()?;
        }
        let me = self.id();
        let peers = self
            .replicas
            .iter()
            .filter(|r| r.id != me)
            .map(|r| (r.id, r.raft))
            .collect();
        if self.placement.everywhere() {
            let first = &mut self.groups[0].replica;
            self.probe
                .tick(first.leader(), first.voters().contains(&me), peers);
            if first.is_leader()
                && !first.voters().contains(&me)
                && let Some(to) = successor(first)
            {
                // Removed while leading (proposed by an earlier leader).
                first.transfer_leader(to);
            }
        }
        self.refresh_metrics();
        self.rhythm.ticks += 1;
        if !self.placement.everywhere() {
            // Every group's steps every second; the moving group's every
            // tick (each step waits for the one before to apply).
            let every_second = self.rhythm.ticks.is_multiple_of(u64::from(SPREAD_EVERY));
            self.carry_moves(!every_second);
            if every_second {
                self.plan_moves();
            }
            if self
                .rhythm
                .ticks
                .is_multiple_of(u64::from(moves::TELL_EVERY))
            {
                self.tell_moves();
            }
        }
        self.spread_leaders();
        self.propose_drops();
        self.outside
            .tick(&self.placement, self.count(), &self.links);
        let now = self.now();
        let mut result = Ok(());
        for g in 0..self.groups.len() {
            let group = &self.groups[g];
            if group.router.asleep(now, &group.replica) {
                // A quiet group with nothing held, in flight or due.
                continue;
            }
            let r = self
                .routed(transport, g, |router, replica, fx| {
                    router.tick(now, replica, fx)
                })
                .await?;
            result = result.and(r);
        }
        result
    }

    /// Persists, sends, applies; publishes what is this replica's. Every
    /// group's new entries are written first, then made durable under
    /// `--fsync always` (with partitions, together: one sync of the round
    /// journal for all of them), and only then is what depends on them
    /// sent.
    async fn ready<T: Transport>(&mut self, transport: &mut T) -> Result<()> {
        self.outside_round(transport).await?;
        let pipelined = self.pipelined();
        if !pipelined {
            self.drain().await?;
        }
        // A follower without clients acknowledges first and applies after
        // (nobody waits on it for a reply; the leader waits on its
        // acknowledgement for a commit).
        let applying = match !pipelined && self.sync_in_place() {
            true => Applying::AfterSync,
            false => Applying::Now,
        };
        let mut written = Vec::new();
        for g in 0..self.groups.len() {
            if !self.groups[g].replica.has_ready() {
                // Nothing new: no message, entry, read state or snapshot
                // (with many partitions, most groups most of the time).
                continue;
            }
            let id = self.groups[g].id;
            // Replies to what was committed go out before this replica's
            // new entries are synced: they never wait for a later fsync.
            let links = &self.links;
            let (applied, rest) = self.groups[g]
                .replica
                .ready_apply(&mut |m| links.send(id, m), applying)?;
            self.sync_members()?;
            self.publish(transport, g, applied).await?;
            if let Some(rest) = rest {
                let w = self.groups[g].replica.ready_write(rest)?;
                if pipelined {
                    self.defer(w)?;
                } else {
                    written.push((g, w));
                }
            }
        }
        let mut wrote = vec![false; self.groups.len()];
        written.iter().for_each(|(g, w)| wrote[*g] = w.must_sync());
        // The syncs run on the blocking pool: the replica's thread serves
        // its clients and links meanwhile (what they bring waits for the
        // round). With nobody to serve, in place.
        let mut round = {
            let mut replicas = round_replicas(&mut self.groups, &wrote);
            super::round_to_sync(self.journal.as_mut(), &mut replicas)?
        };
        let started = Instant::now();
        if !round.files.iter().any(Option::is_some) {
            // Nothing to sync.
        } else if self.sync_in_place() {
            super::sync_files(&mut round.files).context("syncing the Raft log")?;
        } else {
            let files = std::mem::take(&mut round.files);
            round.files = tokio::task::spawn_blocking(move || {
                let mut files = files;
                super::sync_files(&mut files).map(|()| files)
            })
            .await
            .context("the thread that syncs the Raft log")?
            .context("syncing the Raft log")?;
        }
        let mut replicas = round_replicas(&mut self.groups, &wrote);
        super::round_synced(
            self.journal.as_mut(),
            &mut replicas,
            &round,
            started.elapsed(),
        )?;
        for (g, w) in written {
            let id = self.groups[g].id;
            let links = &self.links;
            let applied = self.groups[g]
                .replica
                .ready_finish(w, &mut |m| links.send(id, m))?;
            self.sync_members()?;
            self.publish(transport, g, applied).await?;
        }
        // The messages and replies are out: `raft-state` may say what the
        // round made durable (a journaled round has no such record).
        if self.journal.is_none() {
            for g in &mut self.groups {
                g.replica.witness()?;
            }
        }
        self.checkpoint()?;
        // Tenants group 0 agreed to add or remove: opened (closed) between
        // rounds.
        self.open_agreed()?;
        self.serve_opened(transport).await;
        // Groups group 0 agreed to move: followed between rounds.
        self.agreed_moves()?;
        Ok(())
    }

    /// Whether a round's syncs run on the replica's own thread rather than
    /// on the blocking pool: when it leads no group and has taken no
    /// request for two ticks (a follower acknowledging its leader's
    /// entries, its clients elsewhere). Nobody then waits on its thread
    /// during the sync, and the hand-off to the pool and back would be two
    /// wake-ups on every write's path (writes through the leader
    /// 1.05-1.16x, BENCHMARKS.md). A replica with clients keeps the pool:
    /// syncing in place stopped its broker for each sync (0.8-0.96x).
    fn sync_in_place(&self) -> bool {
        self.groups.iter().all(|g| !g.replica.is_leader())
            && self.rhythm.served.is_none_or(|t| self.rhythm.ticks > t + 1)
    }

    /// Publishes what is this replica's of group `g`'s `applied`, and the
    /// answers to reads whose index is now applied.
    async fn publish<T: Transport>(
        &mut self,
        transport: &mut T,
        g: usize,
        applied: Vec<super::Applied>,
    ) -> Result<()> {
        let now = self.now();
        self.routed(transport, g, |router, replica, fx| {
            router.applied(now, applied, replica, fx)
        })
        .await?
    }

    /// `call` on group `g`'s router, then its effects carried out: the
    /// call's own result (the effects are carried out either way; an error
    /// carrying them out comes first).
    async fn routed<T: Transport>(
        &mut self,
        transport: &mut T,
        g: usize,
        call: impl FnOnce(&mut Router, &mut Replica<WasmStore>, &mut Effects) -> Result<()>,
    ) -> Result<Result<()>> {
        let mut fx = Effects::default();
        let group = &mut self.groups[g];
        let r = call(&mut group.router, &mut group.replica, &mut fx);
        let id = group.id;
        self.carry_out(transport, id, fx).await?;
        Ok(r)
    }
}

/// Each of `groups`' replicas, with its number and whether it wrote what
/// must be synced this round (`wrote`).
/// Where each of the cluster's `count` groups is among `groups`.
fn slots_of(groups: &[Group], count: usize) -> Vec<Option<usize>> {
    let mut slots = vec![None; count];
    for (i, g) in groups.iter().enumerate() {
        slots[g.id as usize] = Some(i);
    }
    slots
}

fn round_replicas<'a>(
    groups: &'a mut [Group],
    wrote: &[bool],
) -> Vec<(u32, &'a mut Replica<WasmStore>, bool)> {
    let replicas = groups.iter_mut().map(|g| (g.id, &mut g.replica));
    replicas
        .zip(wrote)
        .map(|((id, r), &w)| (id, r, w))
        .collect()
}

/// The start of this replica's new life (its `via.started`): now, or just
/// after the last one if the clock went back since (a life must start
/// after the ones before it, or `replica-started` would not drop their
/// registrations). Kept in `raft-life` in its data directory.
fn new_life(disk: &dyn crate::store::storage::Storage, now: u64) -> Result<u64> {
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

    /// A life starts after the ones before it, even when the clock went
    /// back.
    #[test]
    fn a_new_life_starts_after_the_last_one() {
        let disk = crate::store::storage::MemStorage::new();
        assert_eq!(new_life(&disk, 1_000).expect("life"), 1_000);
        assert_eq!(new_life(&disk, 5_000).expect("life"), 5_000);
        assert_eq!(new_life(&disk, 4_000).expect("clock went back"), 5_001);
        assert_eq!(new_life(&disk, 5_001).expect("same ms"), 5_002);
    }
}
