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
use statestore_guest::wire;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use super::file::ClusterFile;
pub use super::file::{ReadPath, ReplicaEntry};
use crate::cluster::log::journal::Journal;
use crate::cluster::net::{Links, PeerEvent};
use crate::cluster::operator::{ChangeAnswer, ChangeRequest, ReplicaStatus};
use crate::cluster::router::{Effects, Limits, Now, Router};
use crate::cluster::{Compaction, Durability, Replica, Timing};
use crate::store::clock::Clock;
use crate::store::driver::{Received, Transport};
use crate::store::journal::Fsync;
use crate::{Config, Input, Output, Runtime, WasmStore};

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

mod observers;
mod partitions;
use observers::{Gone, Observers};
use partitions::{SPREAD_EVERY, SYNC_THREADS, check_partitions, open_logs};

/// One Raft group of a replica: the whole store, or one partition of it
/// (`partitions` in the cluster file; see [`super::partition`]).
struct Group {
    replica: Replica<WasmStore>,
    /// What to do with the clients' traffic for it.
    router: Router,
}

/// One replica, ready to serve.
pub struct Node {
    /// Its groups: one per partition, partition `i` at `groups[i]`. The
    /// membership is group 0's (the same in every group: they start from
    /// the same cluster file, and membership changes are refused while
    /// there is more than one).
    groups: Vec<Group>,
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
    /// Store metrics (the guests' sizes summed over the groups).
    store_metrics: Option<crate::metrics::TenantMetrics>,
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
    /// Its clients that registered KEYNOTIFY, and in which partitions.
    observers: Observers,
    /// When a frame for a partition this replica does not have was last
    /// reported.
    warned_partition: Option<Instant>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("replica", &self.groups[0].replica)
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens replica `file.id`: its log (recovered from its data
    /// directory), its guest (from the last snapshot, then the log), its
    /// listener for peers. `config` is the guest's, the same on every
    /// replica (its hash seed from [`ClusterFile::hash_seed`]).
    pub async fn open(
        file: &ClusterFile,
        runtime: Runtime,
        config: Config,
        fsync: Fsync,
        clock: Arc<dyn Clock>,
        notify: Notify,
    ) -> Result<Node> {
        let who = file.credentials()?;
        let root = crate::store::storage::DirStorage::open(&file.data_dir).with_context(|| {
            format!("cannot open the data directory {}", file.data_dir.display())
        })?;
        let root: Arc<dyn crate::store::storage::Storage> = Arc::new(root);
        let partitions = file.partitions;
        check_partitions(&*root, partitions)?;
        if file.join && partitions > 1 {
            bail!(
                "`join = true` with `partitions = {partitions}`: adding a replica to a store in partitions is not supported yet (every partition's group would have to add it)"
            );
        }
        let voters: Vec<u64> = if file.join {
            Vec::new()
        } else {
            file.replicas.iter().map(|r| r.id).collect()
        };
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
        // One partition keeps syncing its log and `raft-state` itself
        // (a log that loses any synced byte is noticed); several make
        // their rounds durable through the round journal.
        let journaled = durability == Durability::Always && partitions > 1;
        let (logs, journal) = open_logs(file, &root, &voters, journaled)?;
        let mut groups = Vec::with_capacity(partitions as usize);
        // The groups' routers hold requests against the replica's bounds.
        let bytes = crate::cluster::router::SharedBytes::default();
        for (p, log) in (0..partitions).zip(logs) {
            let make_config = config.clone();
            let runtime = runtime.clone();
            let make = Box::new(move |snapshot: Option<&[u8]>| match snapshot {
                None => runtime.instantiate(&make_config),
                Some(s) => runtime.restore(&make_config, s),
            });
            let replica = Replica::new(
                file.id,
                log,
                make,
                TIMING,
                durability,
                Compaction::default(),
            )
            .with_context(|| {
                if partitions == 1 {
                    String::from("opening the replica")
                } else {
                    format!("opening partition {p}")
                }
            })?;
            let mut router = Router::new(
                file.id,
                config.clone(),
                via,
                file.reads,
                notify,
                Limits::default(),
                random_u64(),
                Instant::now(),
            );
            router.share(&bytes);
            groups.push(Group { replica, router });
        }
        let syncs = if partitions > 1 && durability == Durability::Always {
            let threads = (partitions as usize).min(SYNC_THREADS);
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("log-sync-{i}"))
                    .build()
                    .context("starting the threads that sync the partitions' logs")?,
            )
        } else {
            None
        };
        let me = file.me();
        let listener = TcpListener::bind(me.raft)
            .await
            .with_context(|| format!("cannot listen for replicas on {} (in use?)", me.raft))?;
        let (tx, events) = mpsc::channel(4096);
        let accept = tokio::spawn(super::net::accept(listener, who.clone(), tx.clone()));
        let peers: Vec<(u64, SocketAddr)> = file.replicas.iter().map(|r| (r.id, r.raft)).collect();
        let links = Links::start(who.clone(), &peers, tx);
        let status = groups[0].replica.status();
        info!(
            replica = file.id,
            replicas = file.replicas.len(),
            partitions,
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
            store_metrics: None,
            alive: std::collections::HashMap::new(),
            spread_in: SPREAD_EVERY,
            syncs,
            journal,
            observers: Observers::default(),
            warned_partition: None,
        })
    }

    /// Keeps `metrics` (the replica's) and `store` (the store's, as one
    /// process has them for its tenant) up to date from now on.
    pub fn set_metrics(
        &mut self,
        metrics: crate::metrics::ReplicaMetrics,
        store: crate::metrics::TenantMetrics,
    ) {
        if let Some(j) = &mut self.journal {
            j.set_metrics(store.journal());
        }
        for g in &mut self.groups {
            g.replica.set_log_metrics(store.journal());
            g.router.metrics = Some(metrics.clone());
            g.router.store_metrics = Some(store.clone());
        }
        self.metrics = Some(metrics);
        self.store_metrics = Some(store);
        self.refresh_store_metrics(true);
    }

    /// The guests' sizes and counters (summed over the groups), if `force`
    /// or they are due.
    fn refresh_store_metrics(&mut self, force: bool) {
        let Some(m) = &mut self.store_metrics else {
            return;
        };
        if !force && !m.refresh_due() {
            return;
        }
        let mut sum = statestore_guest::Stats::default();
        let (mut calls, mut memory) = (0, 0);
        for g in &mut self.groups {
            let store = g.replica.store_mut();
            let Ok(s) = store.stats() else { return };
            sum.keys += s.keys;
            sum.bytes += s.bytes;
            sum.registrations += s.registrations;
            sum.dedup_entries += s.dedup_entries;
            sum.dedup_bytes += s.dedup_bytes;
            sum.dedup_hits += s.dedup_hits;
            sum.expired += s.expired;
            calls += store.calls();
            memory += store.memory_bytes();
        }
        m.refresh(&sum, calls, memory);
    }

    /// Counts the replies and notifications of `outputs`, about to be
    /// published.
    fn published(&self, outputs: &[Output]) {
        if let Some(m) = &self.store_metrics {
            m.published(outputs);
        }
    }

    /// Notes, for `--metrics`, that `peer` was heard from now (the gauge
    /// moves once a second at most).
    fn heard_from(&mut self, peer: u64) {
        let Some(m) = &self.metrics else { return };
        let now = crate::store::clock::now_ms() / 1000;
        if self.heard.get(&peer) != Some(&now) {
            self.heard.insert(peer, now);
            m.peer_heard
                .with_label_values(&[&peer.to_string()])
                .set(i64::try_from(now).unwrap_or(i64::MAX));
        }
    }

    fn refresh_metrics(&mut self) {
        self.refresh_store_metrics(false);
        let Some(m) = &self.metrics else { return };
        let s = self.groups[0].replica.status();
        m.term.set(i64::try_from(s.term).unwrap_or(i64::MAX));
        m.is_leader.set(i64::from(s.role == "leader"));
        m.has_leader.set(i64::from(s.leader != 0));
        m.leader.set(i64::try_from(s.leader).unwrap_or(0));
        m.commit_index
            .set(i64::try_from(s.commit).unwrap_or(i64::MAX));
        m.applied_index
            .set(i64::try_from(s.applied).unwrap_or(i64::MAX));
        for r in &self.replicas {
            let lag = s
                .matched
                .iter()
                .find(|(id, _)| *id == r.id)
                .map_or(0, |(_, matched)| s.last_index.saturating_sub(*matched));
            m.lag
                .with_label_values(&[&r.id.to_string()])
                .set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
    }

    fn now(&self) -> Now {
        Now {
            at: Instant::now(),
            ms: self.clock.now_ms(),
        }
    }

    /// This replica's id.
    fn id(&self) -> u64 {
        self.groups[0].replica.id()
    }

    /// The number of groups (partitions).
    fn partitions(&self) -> u32 {
        self.groups.len() as u32
    }

    /// Forwards and publishes what group `g`'s router asks for (a SCAN
    /// page of a partition names it, see [`super::partition::reply`]).
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
        if !fx.replies.is_empty() {
            super::partition::replies(&mut fx.replies, g, self.partitions());
            self.published(&fx.replies);
            transport.emit(fx.replies).await?;
        }
        Ok(())
    }

    /// Requests a client sent: each to its key's partition.
    async fn requests<T: Transport>(
        &mut self,
        transport: &mut T,
        messages: Vec<crate::InboundMessage>,
    ) -> Result<()> {
        let now = self.now();
        self.observers.note(&messages, self.partitions());
        let by_group = super::partition::split(messages, self.partitions());
        let mut result = Ok(());
        for (g, messages) in by_group.into_iter().enumerate() {
            if messages.is_empty() {
                continue;
            }
            let r = self
                .routed(transport, g, |router, replica, fx| {
                    router.requests(now, messages, replica, fx)
                })
                .await?;
            result = result.and(r);
        }
        result
    }

    /// A client went away: the groups where it registered KEYNOTIFY
    /// through this replica forget its registrations (the others have
    /// none of it to forget: no entry).
    async fn client_gone<T: Transport>(&mut self, transport: &mut T, client: String) -> Result<()> {
        let now = self.now();
        let groups: Vec<usize> = match self.observers.gone(&client) {
            Gone::Nowhere => return Ok(()),
            Gone::To(partitions) => partitions.into_iter().map(|p| p as usize).collect(),
            Gone::Everywhere => (0..self.groups.len()).collect(),
        };
        let mut result = Ok(());
        for g in groups {
            let client = client.clone();
            let r = self
                .routed(transport, g, |router, replica, fx| {
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
                    let mut r = match transport.on_event(event).await? {
                        Some(Received::Messages(m)) => self.requests(transport, m).await,
                        Some(Received::ClientGone(id)) => self.client_gone(transport, id).await,
                        None => Ok(()),
                    };
                    transport.settle().await?;
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
                    match super::probe::removed(self.id(), self.groups[0].replica.applied(), &answers) {
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
        for g in &mut self.groups {
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

    /// The group of a peer's frame, if this replica has it.
    fn group(&mut self, g: u32, from: u64) -> Option<&mut Group> {
        if g >= self.partitions() {
            // Said at most every 10 s: such a peer sends it many times a second.
            if self
                .warned_partition
                .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
            {
                self.warned_partition = Some(Instant::now());
                warn!(
                    peer = from,
                    partition = g,
                    partitions = self.partitions(),
                    "a peer sent traffic for a partition this replica does not have (dropped): every replica's cluster file must name the same `partitions`"
                );
            }
            return None;
        }
        Some(&mut self.groups[g as usize])
    }

    fn on_peer(&mut self, event: PeerEvent) -> Result<()> {
        match event {
            PeerEvent::Raft(g, m) => {
                self.heard_from(m.from);
                if self.groups.len() > 1 {
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
                for g in &mut self.groups {
                    g.replica.unreachable(peer);
                }
            }
            PeerEvent::Status(reply) => {
                let _ = reply.send(self.status_text());
            }
            PeerEvent::Change(request, reply) => {
                let answer = match ChangeRequest::decode(&request) {
                    Ok(_) if self.groups.len() > 1 => ChangeAnswer::Refused(format!(
                        "this store is in {} partitions: membership changes are not supported yet with partitions",
                        self.groups.len()
                    )),
                    Ok(change) => self.change(change),
                    Err(e) => ChangeAnswer::Refused(format!("{e:#}")),
                };
                let _ = reply.send(answer.encode());
            }
        }
        Ok(())
    }

    /// An operator's membership change: `add <id> raft=<addr> [mqtt=<addr>]`
    /// or `remove <id>`, proposed if this replica leads.
    fn change(&mut self, request: ChangeRequest) -> ChangeAnswer {
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
                super::Change::Add {
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
            ChangeRequest::Remove { id } => super::Change::Remove(*id),
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
    fn sync_members(&mut self) -> Result<()> {
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
        // with it: a life of it later than any (proposed by the leader that
        // applied the removal; `replica-started` drops every registration
        // of an earlier life).
        let removed: Vec<u64> = self
            .replicas
            .iter()
            .map(|r| r.id)
            .filter(|id| !voters.contains(id))
            .collect();
        let now = self.clock.now_ms();
        for group in &mut self.groups {
            if !group.replica.is_leader() || group.router.via().is_none() {
                continue;
            }
            for &id in &removed {
                let batch = wire::encode_batch(&[Input::ReplicaStarted(statestore_guest::Via {
                    replica: id,
                    started: u64::MAX,
                })]);
                match group.replica.propose_wire(me, &batch, now) {
                    Ok(_) => info!(
                        replica = me,
                        removed = id,
                        "the registrations made through a removed replica go"
                    ),
                    Err(e) => {
                        warn!(removed = id, error = %format!("{e:#}"), "the registrations made through a removed replica stay (proposal refused)")
                    }
                }
            }
        }
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

    /// `key=value` lines, for `cluster status` (group 0's state, and with
    /// partitions the ones this replica leads).
    pub fn status_text(&self) -> String {
        let replica = &self.groups[0].replica;
        let s = replica.status();
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
            voters: replica.voters(),
            peers: self.replicas.iter().map(|r| (r.id, r.raft)).collect(),
            settled: replica.membership_settled(),
            partitions: self.partitions(),
            leads: (0..self.partitions())
                .filter(|&p| self.groups[p as usize].replica.is_leader())
                .collect(),
        }
        .encode()
    }

    async fn on_tick<T: Transport>(&mut self, transport: &mut T) -> Result<()> {
        for g in &mut self.groups {
            g.replica.tick();
        }
        let me = self.id();
        let peers = self
            .replicas
            .iter()
            .filter(|r| r.id != me)
            .map(|r| (r.id, r.raft))
            .collect();
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
        self.refresh_metrics();
        self.spread_leaders();
        let now = self.now();
        let mut result = Ok(());
        for g in 0..self.groups.len() {
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
        let mut written = Vec::new();
        for g in 0..self.groups.len() {
            if !self.groups[g].replica.has_ready() {
                // Nothing new: no message, entry, read state or snapshot
                // (with many partitions, most groups most of the time).
                continue;
            }
            let id = g as u32;
            // Replies to what was committed go out before this replica's
            // new entries are synced: they never wait for a later fsync.
            let links = &self.links;
            let (applied, rest) = self.groups[g]
                .replica
                .ready_apply(&mut |m| links.send(id, m))?;
            self.sync_members()?;
            self.publish(transport, g, applied).await?;
            if let Some(rest) = rest {
                written.push((g, self.groups[g].replica.ready_write(rest)?));
            }
        }
        let mut wrote = vec![false; self.groups.len()];
        written.iter().for_each(|(g, _)| wrote[*g] = true);
        let replicas = self.groups.iter_mut().map(|group| &mut group.replica);
        super::persist_round(self.journal.as_mut(), replicas.zip(wrote))?;
        for (g, w) in written {
            let id = g as u32;
            let links = &self.links;
            let applied = self.groups[g]
                .replica
                .ready_finish(w, &mut |m| links.send(id, m))?;
            self.sync_members()?;
            self.publish(transport, g, applied).await?;
        }
        self.checkpoint()
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
        self.carry_out(transport, g as u32, fx).await?;
        Ok(r)
    }
}

/// The voter (not this replica) most up to date, to take over the
/// leadership of `replica`'s group.
fn successor(replica: &Replica<WasmStore>) -> Option<u64> {
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

/// A replica's address record: `raft=<addr> [mqtt=<addr>]`.
fn parse_record(id: u64, record: &[u8]) -> Result<ReplicaEntry> {
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
    })
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
