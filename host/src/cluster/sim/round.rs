//! One replica's round of ready in the simulation (what its groups'
//! applied entries make, checked), a tick's faults, and the damage a crash
//! may do to a disk.

use std::collections::HashMap;

use anyhow::{Result, bail};

use super::clients::Clients;
use super::network::{Cut, Wire, carry_out, send};
use super::poison::Poisonable;
use super::{Options, Report, Rng, Sim};
use crate::Output;
use crate::cluster::router::{Effects, Now, Router};
use crate::cluster::{Applied, Replica};
use crate::store::storage::MemStorage;

/// What a replica's round of ready needs of the simulation.
pub(super) struct Round<'a> {
    pub(super) seed: u64,
    pub(super) tick: u64,
    pub(super) o: &'a Options,
    pub(super) faults: bool,
    pub(super) rng: &'a mut Rng,
    pub(super) net: &'a mut Vec<(u64, Wire)>,
    pub(super) clients: &'a mut Clients,
    pub(super) report: &'a mut Report,
    pub(super) outputs_at: &'a mut HashMap<(u32, u64), (Vec<Output>, crate::cluster::FailedInputs)>,
}

impl Round<'_> {
    /// Sends group `group`'s messages and carries out what its applied
    /// entries (and `fx`, its router's) make of them; checks them.
    pub(super) fn publish(
        &mut self,
        group: u32,
        now: Now,
        (messages, applied): (Vec<raft::prelude::Message>, Vec<Applied>),
        r: &mut Replica<Poisonable>,
        router: &mut Router,
        mut fx: Effects,
    ) -> Result<()> {
        let id = r.id();
        for m in messages {
            let wire = Wire::Raft(group, m);
            send(self.tick, wire, self.o, self.faults, self.rng, self.net);
        }
        for a in &applied {
            // Applied again after a restart too: checked for determinism.
            check_deterministic(self.outputs_at, group, id, a)?;
            self.clients.applied(self.seed, id, a)?;
            if a.replayed {
                continue;
            }
            self.report.applied = self.report.applied.max(a.index);
            if a.origin == id && is_timer(a) {
                self.report.timeouts += 1;
            }
        }
        router.applied(now, applied, r, &mut fx)?;
        let c = router.take_counts();
        self.report.index_reads += c.index_reads as usize;
        self.report.forwarded += c.forwarded as usize;
        self.report.held += c.held as usize;
        self.report.resent += c.resent as usize;
        self.report.retried += c.retried as usize;
        self.report.reads_to_log += c.reads_to_log as usize;
        carry_out(
            self.seed,
            self.tick,
            id,
            (group, self.o.partitions),
            fx,
            self.o,
            self.faults,
            self.rng,
            self.net,
            self.clients,
            self.report,
        )
    }
}

/// Damages a crashed replica's disk as an operator or a failing disk
/// might: its current log file deleted, emptied or cut at any byte,
/// `raft-log.current` naming a generation that is not there, or its
/// snapshot deleted. What it did, if anything.
pub(super) fn damage(disk: &MemStorage, rng: &mut Rng) -> Option<&'static str> {
    use crate::store::storage::Storage as _;
    let current = disk.read("raft-log.current").ok()?;
    let generation: u64 = std::str::from_utf8(&current).ok()?.trim().parse().ok()?;
    let name = format!("raft-log.{generation}");
    let len = disk.read(&name).ok()?.len() as u64;
    match rng.below(5) {
        0 => disk.remove(&name).ok().map(|()| "log deleted"),
        1 => disk.truncate(&name, 0).ok().map(|()| "log emptied"),
        2 => disk
            .truncate(&name, rng.below(len + 1))
            .ok()
            .map(|()| "log cut"),
        3 => disk
            .write_atomic(
                "raft-log.current",
                (generation + 1 + rng.below(3)).to_string().as_bytes(),
            )
            .ok()
            .map(|()| "a missing generation"),
        _ => disk
            .remove("raft-snapshot")
            .ok()
            .map(|()| "snapshot deleted"),
    }
}

/// Whether an applied entry is a timer entry (no request in it).
pub(super) fn is_timer(a: &Applied) -> bool {
    !a.outputs
        .iter()
        .any(|o| matches!(o, Output::Publish(p) if p.correlation_data.is_some()))
}

/// Every replica makes the same outputs of the same entry of a group.
fn check_deterministic(
    seen: &mut HashMap<(u32, u64), (Vec<Output>, crate::cluster::FailedInputs)>,
    group: u32,
    replica: u64,
    a: &Applied,
) -> Result<()> {
    let made = (a.outputs.clone(), a.failed.clone());
    match seen.get(&(group, a.index)) {
        None => {
            seen.insert((group, a.index), made);
        }
        Some(first) if *first == made => {}
        Some(first) => bail!(
            "replica {replica} made other outputs of entry {} of partition {group} than another replica:\n{:?}\nvs\n{:?}",
            a.index,
            made,
            first
        ),
    }
    Ok(())
}

impl Sim<'_> {
    /// Crashes (with damage to a disk), partitions and clock jumps.
    pub(super) fn faults(&mut self, tick: u64) -> Result<()> {
        let o = self.o;
        let rng = &mut self.rng;
        let nodes = &mut self.nodes;
        let down = nodes
            .iter()
            .filter(|n| n.up.is_none() && !n.removed)
            .count();
        let i = rng.below(nodes.len() as u64) as usize;
        if down == 0 && rng.chance(o.crash) && !nodes[i].removed {
            // Not while the membership changes: a cluster of two
            // waiting for a replica that waits to be removed is stuck
            // (as it would be for an operator).
            let damaging = self.removing.is_none()
                && self.joining.is_none()
                && o.partitions == 1
                && rng.chance(o.damage);
            if damaging {
                // A crash that damages the log keeps `raft-state`'s
                // records (a process that died: the page cache has them);
                // one that lost both them and synced log bytes could not
                // be told from a log that holds more than recorded
                // (`cluster::log::witness`).
                for g in nodes[i].up.iter_mut().flatten() {
                    g.replica.log_mut().sync_held_state()?;
                }
            }
            nodes[i].up = None;
            nodes[i].journal = None;
            // Its syncs under way never end.
            nodes[i].syncs = Default::default();
            // What it had not synced is gone, but for a torn tail.
            for disk in &mut nodes[i].disks {
                let torn = rng.below(64) as usize;
                *disk = disk.crash(Some(torn));
            }
            if damaging && damage(&nodes[i].disks[0], rng).is_some() {
                self.report.damaged += 1;
                nodes[i].damaged = true;
            }
            nodes[i].down_until = tick + 20 + rng.below(200);
            self.report.crashes += 1;
            self.clients.crashed(i as u64 + 1);
        }
        if self.cut.is_none() && rng.chance(o.partition) {
            self.cut = Some(Cut {
                replica: rng.below(nodes.len() as u64) + 1,
                inbound_only: rng.chance(500),
                until: tick + 50 + rng.below(300),
            });
        }
        if rng.chance(2) {
            // A clock jump on one replica.
            let i = rng.below(nodes.len() as u64) as usize;
            nodes[i].skew += rng.below(20_000) as i64 - 10_000;
        }
        Ok(())
    }
}
