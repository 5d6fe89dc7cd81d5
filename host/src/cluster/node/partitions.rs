//! What a replica does for a store in partitions: where each partition's
//! log lives and the count the data directory records, the logs synced
//! together, and the leaderships spread over the replicas.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tracing::info;

use super::Node;
use crate::cluster::LogStore;
use crate::cluster::log::journal::{self, Journal};
use crate::store::storage::{DirStorage, Storage};

/// The most threads syncing partitions' logs at once.
const SYNC_THREADS: usize = 16;

/// How often (in ticks) a replica looks at the partitions it leads.
pub(super) const SPREAD_EVERY: u32 = 20;

/// A peer heard from within this long is taken to be up.
pub(super) const ALIVE_WITHIN: Duration = Duration::from_millis(500);

impl Node {
    /// With partitions, spreads their leaderships over the replicas, so
    /// that writes to different partitions use different machines:
    /// partition `p`'s place is the `p mod n`-th voter (by id), and a
    /// replica leading a partition whose place is another replica hands it
    /// over once that replica is up and has every entry
    /// ([`crate::cluster::partition::hand_over`]; one hand-over a
    /// second per replica, so a returning replica takes its share back
    /// gradually and a down one is never waited for: while a hand-over is
    /// under way the group takes no proposals).
    pub(super) fn spread_leaders(&mut self) {
        if self.count() < 2 {
            return;
        }
        self.spread_in = self.spread_in.saturating_sub(1);
        if self.spread_in > 0 {
            return;
        }
        self.spread_in = SPREAD_EVERY;
        let me = self.id();
        let alive = &self.alive;
        let up = |id: u64| alive.get(&id).is_some_and(|t| t.elapsed() < ALIVE_WITHIN);
        for g in &mut self.groups {
            if !g.replica.is_leader() || !g.replica.membership_settled() {
                continue;
            }
            let (p, voters) = (g.id, g.replica.voters());
            let place = self
                .placement
                .place(p, &voters)
                .or_else(|| crate::cluster::partition::place(p, &voters));
            if place != Some(me) {
                // Not in its place: awake until handed over (its
                // heartbeats tell which replicas are up).
                g.replica.wake();
            }
            let hand_over = crate::cluster::partition::hand_over_to(place, &g.replica.status(), up);
            if let Some(to) = hand_over {
                info!(
                    replica = me,
                    partition = p,
                    to,
                    "handing the partition's leadership to its place"
                );
                g.replica.transfer_leader(to);
                return;
            }
        }
    }
}

impl Node {
    /// Once the round journal is full: every group's log synced (its
    /// `raft-state` then says how much of it is), and the journal starts
    /// over.
    pub(super) fn checkpoint(&mut self) -> Result<()> {
        let Some(journal) = &mut self.journal else {
            return Ok(());
        };
        let logs = self.groups.iter_mut().map(|g| g.replica.log_mut());
        journal.checkpoint(self.syncs.as_ref(), logs.collect())
    }
}

/// The threads that sync the logs of `count` groups at the round
/// journal's checkpoints.
pub(super) fn sync_pool(count: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(count.min(SYNC_THREADS))
        .thread_name(|i| format!("log-sync-{i}"))
        .build()
        .context("starting the threads that sync the groups' logs")
}

/// The groups replica `file.id` holds (of `count`), and the voters each
/// starts with when its log is new (none for a replica that joins).
pub(super) fn held_groups(
    file: &crate::cluster::node::ClusterFile,
    placement: &crate::cluster::placement::Placement,
    count: usize,
) -> Result<(Vec<u32>, Vec<Vec<u64>>)> {
    let held = placement.held_by(file.id, count as u32);
    // One added while running holds what the cluster moves to it.
    let added = file.me().added || placement.moves().joined.contains_key(&file.id);
    if held.is_empty() && !added {
        bail!(
            "with copies = {} of {} replicas, replica {} holds none of the {count} groups (partitions x tenants): give the store at least as many partitions as there are replicas",
            file.copies.unwrap_or(file.replicas.len()),
            file.replicas.len(),
            file.id
        );
    }
    let voters = held
        .iter()
        .map(|&g| match (file.join, placement.everywhere()) {
            (true, _) => Vec::new(),
            (false, true) => file.replicas.iter().map(|r| r.id).collect(),
            // A group moved here joins (its leader sends it a snapshot).
            (false, false) if placement.moves().hosts.contains_key(&g) => Vec::new(),
            (false, false) => placement.hosts(g),
        })
        .collect();
    Ok((held, voters))
}

/// Opens the log of every group replica `file.id` holds (`held.0`, of the
/// cluster's `held.1`, `held.2` those of removed tenants; the `i`-th in `dirs[i]`, or the data directory
/// `root` itself; a new one with the membership `voters[i]`), each with
/// what the round journal holds of it; then the journal starts afresh
/// (`journaled`: the logs' records go through it from now on) or is
/// removed.
pub(super) fn open_logs(
    file: &crate::cluster::node::ClusterFile,
    root: &Arc<dyn Storage>,
    held: (&[u32], u32, &[u32]),
    dirs: &[Option<std::path::PathBuf>],
    voters: &[Vec<u64>],
    journaled: bool,
) -> Result<(Vec<LogStore>, Option<Journal>)> {
    let (ids, groups, gone) = held;
    // What the journal holds of removed tenants' groups is not needed.
    let found = journal::read(&**root)?.map(|parts| {
        parts
            .into_iter()
            .filter(|(g, _)| !gone.contains(g))
            .collect::<Vec<_>>()
    });
    let stray = found.iter().flatten().find(|(g, _)| *g >= groups);
    if let Some((g, _)) = stray {
        bail!(
            "the round journal in {} holds a part of group {g}, and the replica has {groups}: refusing to start",
            file.data_dir.display()
        );
    }
    if let Some((g, _)) = found.iter().flatten().find(|(g, _)| !ids.contains(g)) {
        bail!(
            "the round journal in {} holds a part of group {g}, which this replica does not hold: refusing to start (was the cluster file's `copies` or list of replicas changed?)",
            file.data_dir.display()
        );
    }
    if dirs.len() > 1 {
        check_every_log_there(file, dirs)?;
    }
    let mut logs = Vec::with_capacity(dirs.len());
    for ((&g, dir), voters) in ids.iter().zip(dirs).zip(voters) {
        let disk = match dir {
            None => root.clone(),
            Some(dir) => {
                let disk = DirStorage::open(dir).with_context(|| {
                    format!("cannot open the group's directory {}", dir.display())
                })?;
                Arc::new(disk) as Arc<dyn Storage>
            }
        };
        let parts = journal::parts_of(found.as_deref(), g);
        let log = LogStore::open_with(disk, voters, parts.as_deref(), journaled).map_err(|e| {
            if groups > 1 {
                e.context(format!(
                    "the log in {} (`statestore cluster rejoin` sets every group's log aside)",
                    dir.as_deref().unwrap_or(&file.data_dir).display()
                ))
            } else {
                e
            }
        })?;
        if file.join && logs.is_empty() {
            let members = raft::Storage::initial_state(&log)
                .map(|s| s.conf_state.voters)
                .unwrap_or_default();
            if !members.is_empty() {
                tracing::warn!(
                    replica = file.id,
                    ?members,
                    "`join = true` is ignored: this data directory already holds the log of a cluster member; remove it from the cluster file (it is read only while the data directory is new; `statestore cluster rejoin` starts a replica over)"
                );
            }
        }
        logs.push(log);
    }
    // Every log was written anew and synced: what the journal held is in
    // them.
    let journal = if journaled {
        Some(Journal::create(root.clone(), journal::CHECKPOINT_BYTES)?)
    } else {
        journal::remove(&**root)?;
        None
    };
    Ok((logs, journal))
}

/// Refuses a replica of several groups some of whose directories hold a
/// Raft log and others none: a group's directory lost whole (its log, its
/// term and vote) would otherwise start again as a new member's, having
/// forgotten what it acknowledged.
fn check_every_log_there(
    file: &crate::cluster::node::ClusterFile,
    dirs: &[Option<std::path::PathBuf>],
) -> Result<()> {
    let holds_log = |dir: &std::path::Path| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("raft-"))
            })
        })
    };
    let dirs: Vec<&std::path::Path> = dirs
        .iter()
        .map(|d| d.as_deref().unwrap_or(&file.data_dir))
        .collect();
    let missing: Vec<String> = dirs
        .iter()
        .filter(|d| !holds_log(d))
        .map(|d| d.display().to_string())
        .collect();
    if !missing.is_empty() && missing.len() < dirs.len() {
        bail!(
            "{} hold(s) no Raft log, and the replica's other groups do: a group's log was lost whole (its entries, its term and vote): refusing to start; `statestore cluster rejoin` can set the others aside only if the round journal still has that group's term and vote; otherwise replace the replica: `statestore cluster remove --id {}`, then a new replica under a new id, started with an empty data directory and `join = true`, and `statestore cluster add` (docs/src/cluster.md, \"Recovery runbook\")",
            missing.join(", "),
            file.id
        );
    }
    Ok(())
}

/// The file of a data directory that records how many partitions its store
/// has (absent: one, the layout before partitions).
const PARTITIONS: &str = "partitions";

/// Checks that the data directory holds a store of `partitions` partitions
/// (or none yet, which it then records): the count cannot change while the
/// store lives, since a key's partition depends on it.
pub(super) fn check_partitions(
    root: &dyn crate::store::storage::Storage,
    partitions: u32,
) -> Result<()> {
    let recorded = match root.read(PARTITIONS) {
        Ok(bytes) => Some(
            std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .with_context(|| format!("{PARTITIONS} in the data directory is not a number"))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {PARTITIONS}")),
    };
    let single = match root.read("raft-state") {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).context("reading raft-state"),
    };
    let had = recorded.unwrap_or(if single { 1 } else { partitions });
    if had != partitions {
        bail!(
            "the data directory holds a store in {had} partition(s) and the cluster file says `partitions = {partitions}`: the number of partitions cannot change while a store lives (a key's partition depends on it); put it back, or start a new cluster with empty data directories"
        );
    }
    if partitions > 1 && recorded.is_none() {
        root.write_atomic(PARTITIONS, partitions.to_string().as_bytes())
            .with_context(|| format!("writing {PARTITIONS}"))?;
    }
    Ok(())
}
