//! A replica's rounds pipelined on the server: the sync of its log runs on
//! the blocking pool while the replica goes on, instead of the replica
//! waiting for it ([`crate::cluster::pipeline`] decides what waits for
//! which sync; the simulation drives the same core).
//!
//! Only one group without a round journal, under `--fsync always`
//! (`raft_state = "behind"`), while the replica's own clients send it
//! requests: any other round first waits for the syncs under way
//! ([`Node::drain`]), as does stopping.
//!
//! Measured before building it: a leader that did not sync at all (unsafe,
//! measuring only) did 1.09-1.31x the writes through it (BENCHMARKS.md).
//! Pipelined: writes through the leader 1.10-1.14x, through a follower
//! about 1.07x.

use anyhow::{Result, anyhow};
use raft::prelude::Message;

use super::{Links, Node};
use crate::cluster::Unsynced;
use crate::cluster::pipeline::{self, Pipeline};
use crate::store::storage::LogFile;

/// A sync under way on the blocking pool.
pub(super) type Sync = tokio::task::JoinHandle<std::io::Result<Box<dyn LogFile>>>;

/// The replica's syncs under way and to come.
pub(super) type Syncs = Pipeline<Sync>;

/// The server's side of a pipeline: syncs on the blocking pool, messages
/// to the links.
struct OnPool<'a> {
    links: &'a Links,
    group: u32,
}

impl pipeline::Host<Sync> for OnPool<'_> {
    fn start(&mut self, file: Box<dyn LogFile>) -> Sync {
        tokio::task::spawn_blocking(move || {
            let mut file = file;
            file.sync().map(|()| file)
        })
    }

    fn send(&mut self, m: Message) {
        self.links.send(self.group, m);
    }
}

/// The end of the sync under way (never, if none is).
pub(super) async fn done(syncs: &mut Syncs) -> Result<()> {
    let Some(sync) = syncs.sync_mut() else {
        return std::future::pending().await;
    };
    match sync.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(anyhow!("the thread syncing the Raft log: {e}")),
    }
}

impl Node {
    /// Whether this round may be pipelined (see the module's doc): only
    /// while the replica's own clients send it requests (in the last two
    /// ticks). A leader serving only what followers forward waits for its
    /// syncs: the forwards gather meanwhile, and the followers sync fewer,
    /// larger rounds (pipelined, clients on a follower did 0.96-0.99x); a
    /// follower without clients syncs in place (`Node::sync_in_place`).
    pub(super) fn pipelined(&self) -> bool {
        self.groups.len() == 1
            && self.journal.is_none()
            && self.groups[0].replica.pipelines()
            && self
                .rhythm
                .clients
                .is_some_and(|t| self.rhythm.ticks <= t + 1)
    }

    /// The single group's ready, written (`w`): handed back to raft-rs;
    /// its sync starts now, or once the one under way ends.
    pub(super) fn defer(&mut self, w: Unsynced) -> Result<()> {
        let group = &mut self.groups[0];
        let mut host = OnPool {
            links: &self.links,
            group: group.id,
        };
        self.pipeline.defer(&mut group.replica, w, &mut host)
    }

    /// The sync under way ended (`result`): see [`Pipeline::synced`].
    pub(super) fn synced(&mut self, result: Result<()>) -> Result<()> {
        let group = &mut self.groups[0];
        let mut host = OnPool {
            links: &self.links,
            group: group.id,
        };
        self.pipeline.synced(&mut group.replica, result, &mut host)
    }

    /// Makes everything written durable and told (before a round that is
    /// not pipelined, and before stopping).
    pub(super) async fn drain(&mut self) -> Result<()> {
        while !self.pipeline.is_idle() {
            if self.pipeline.is_syncing() {
                let result = done(&mut self.pipeline).await;
                self.synced(result)?;
            } else {
                let group = &mut self.groups[0];
                let mut host = OnPool {
                    links: &self.links,
                    group: group.id,
                };
                self.pipeline.start_next(&mut group.replica, &mut host)?;
            }
        }
        Ok(())
    }
}
