//! What a server does behind its loop, in the simulation, ending when the
//! simulation chooses.
//!
//! Pipelined rounds: a replica of one group hands its ready back before
//! its log is synced, as a server's does while its own clients send it
//! requests ([`crate::cluster::pipeline`], the same core the server runs);
//! the sync ends one to three ticks later, or never (a crash in between
//! loses what it had not synced but for a torn tail). Replicas start and
//! stop pipelining at random, so that rounds that are not pipelined first
//! drain the syncs under way, as a server's do.
//!
//! `raft-state` behind: the records that witness a round's sync are held
//! ([`crate::cluster::LogStore::witness_held`]) until a tick syncs them, as
//! a server's thread does within 10 ms.
//!
//! Snapshots written behind: a compaction's file is held
//! ([`crate::cluster::LogStore::snapshots_held`]) until a tick writes it,
//! as a server's thread does; the log is compacted then or at a later poll.

use anyhow::Result;
use raft::prelude::Message;

use super::network::{Wire, send};
use super::poison::Poisonable;
use super::round::Round;
use super::{Options, Rng, Sim};
use crate::cluster::Replica;
use crate::cluster::pipeline::{Host, Pipeline};
use crate::store::storage::LogFile;

/// A sync under way: the file to sync and the tick it ends at.
#[derive(Debug)]
pub(super) struct Sync {
    file: Box<dyn LogFile>,
    due: u64,
}

/// A replica's syncs under way and to come.
pub(super) type Syncs = Pipeline<Sync>;

/// The simulation's side of a pipeline: a sync ends at a tick drawn now,
/// messages go on the network.
pub(super) struct OnNet<'a> {
    pub(super) tick: u64,
    pub(super) o: &'a Options,
    pub(super) faults: bool,
    pub(super) rng: &'a mut Rng,
    pub(super) net: &'a mut Vec<(u64, Wire)>,
}

impl Host<Sync> for OnNet<'_> {
    fn start(&mut self, file: Box<dyn LogFile>) -> Sync {
        Sync {
            file,
            due: self.tick + 1 + self.rng.below(3),
        }
    }

    fn send(&mut self, m: Message) {
        // One group: the pipeline is group 0's.
        send(
            self.tick,
            Wire::Raft(0, m),
            self.o,
            self.faults,
            self.rng,
            self.net,
        );
    }
}

impl Round<'_> {
    /// The pipeline's side of this round.
    pub(super) fn on_net(&mut self) -> OnNet<'_> {
        OnNet {
            tick: self.tick,
            o: self.o,
            faults: self.faults,
            rng: self.rng,
            net: self.net,
        }
    }
}

/// Ends the sync under way if it is due (`now`: whatever its tick), then
/// starts the next; whether one ended.
pub(super) fn end_due(
    syncs: &mut Syncs,
    r: &mut Replica<Poisonable>,
    now: bool,
    host: &mut OnNet,
) -> Result<bool> {
    let Some(sync) = syncs.sync_mut() else {
        return Ok(false);
    };
    if !now && sync.due > host.tick {
        return Ok(false);
    }
    let result = match sync.file.sync() {
        // The log was rewritten since (a compaction): a server's
        // descriptor of the old file still syncs; the new file was synced
        // whole when it was made.
        Err(e) if crate::store::storage::is_gone(&e) => Ok(()),
        r => r,
    };
    syncs.synced(r, result.map_err(Into::into), host)?;
    Ok(true)
}

/// Makes everything written durable and told, at once (before a round
/// that is not pipelined).
pub(super) fn drain(
    syncs: &mut Syncs,
    r: &mut Replica<Poisonable>,
    host: &mut OnNet,
) -> Result<()> {
    while !syncs.is_idle() {
        if !end_due(syncs, r, true, host)? {
            syncs.start_next(r, host)?;
        }
    }
    Ok(())
}

impl Sim<'_> {
    /// What a server does behind its loop, ending when the simulation
    /// chooses: replicas of one group start or stop pipelining at random,
    /// the syncs that are due end (what they held goes on the network),
    /// `raft-state`'s held records are synced, and snapshot files being
    /// written are written (their logs compacted
    /// now or at a later poll).
    pub(super) fn background(&mut self, tick: u64, faults: bool) -> Result<()> {
        for node in &mut self.nodes {
            let Some(groups) = node.up.as_mut() else {
                continue;
            };
            for g in groups.iter_mut() {
                if self.rng.chance(500) && g.replica.log_mut().sync_held_state()? {
                    self.report.state_syncs += 1;
                }
                if self.rng.chance(300) && g.replica.log_mut().write_held_snapshot() {
                    self.report.snapshots_behind += 1;
                    if self.rng.chance(500) {
                        g.replica.poll_compaction()?;
                    }
                }
            }
            if faults && groups.len() == 1 && self.rng.chance(self.o.pipeline) {
                node.pipelining = !node.pipelining;
            }
            let mut host = OnNet {
                tick,
                o: self.o,
                faults,
                rng: &mut self.rng,
                net: &mut self.net,
            };
            if groups.len() == 1
                && end_due(&mut node.syncs, &mut groups[0].replica, false, &mut host)?
            {
                self.report.pipelined_syncs += 1;
            }
        }
        Ok(())
    }
}
