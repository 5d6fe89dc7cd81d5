//! A replica's rounds pipelined: the sync of its log runs on the blocking
//! pool while the replica goes on, instead of the replica waiting for it.
//!
//! A round's ready is written, handed back to raft-rs at once
//! ([`Replica::ready_defer`]) and its sync started; meanwhile the replica
//! takes its clients' next requests and, as leader, sends their entries to
//! the followers (which start their own writes and syncs sooner) and steps
//! their acknowledgements, or, as follower, forwards them to the leader.
//! raft-rs counts a leader's own entries toward a commit, and lets a
//! replica apply entries, only once the sync says they are durable
//! ([`Replica::persisted`], in ready order); a follower's acknowledgements
//! wait for that sync too (held with it): a reply still waits for the
//! leader's sync and a majority's, as before. What is written while a sync
//! is under way is synced by the next one, started as soon as it ends.
//! `raft-state` records what each sync made durable as of its start
//! ([`crate::cluster::log::SyncMark`]).
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

use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use raft::prelude::Message;

use super::Node;
use crate::cluster::Unsynced;
use crate::cluster::log::SyncMark;
use crate::store::storage::LogFile;

/// The replica's syncs under way and to come.
#[derive(Debug, Default)]
pub(super) struct Pipeline {
    inflight: Option<Inflight>,
    /// Readies written since the sync under way started: the last one's
    /// number, the messages that wait for their sync, and whether any of
    /// them must be synced (one that only moved the commit index need not:
    /// its record goes with the next sync).
    next: Option<(u64, Vec<Message>, bool)>,
}

#[derive(Debug)]
struct Inflight {
    sync: tokio::task::JoinHandle<std::io::Result<Box<dyn LogFile>>>,
    mark: SyncMark,
    /// The last ready it makes durable, and the messages held for it.
    number: u64,
    held: Vec<Message>,
    started: Instant,
}

impl Pipeline {
    /// Whether no sync is under way or to come.
    pub(super) fn is_idle(&self) -> bool {
        self.inflight.is_none() && self.next.is_none()
    }

    /// Whether a sync is under way.
    pub(super) fn is_syncing(&self) -> bool {
        self.inflight.is_some()
    }

    /// The end of the sync under way (never, if none is).
    pub(super) async fn done(&mut self) -> Result<()> {
        let Some(inflight) = self.inflight.as_mut() else {
            return std::future::pending().await;
        };
        match (&mut inflight.sync).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(anyhow!("the thread syncing the Raft log: {e}")),
        }
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
        let must_sync = w.must_sync();
        let (number, held) = self.groups[0].replica.ready_defer(w)?;
        let next = self
            .pipeline
            .next
            .get_or_insert_with(|| (number, Vec::new(), false));
        next.0 = number;
        next.1.extend(held);
        next.2 |= must_sync;
        if !self.pipeline.is_syncing() {
            self.start_sync()?;
        }
        Ok(())
    }

    /// Starts the sync of the readies written since the last one; with
    /// nothing written that must be synced, they are durable now.
    fn start_sync(&mut self) -> Result<()> {
        let Some((number, held, must_sync)) = self.pipeline.next.take() else {
            return Ok(());
        };
        let replica = &mut self.groups[0].replica;
        let started = match must_sync {
            true => replica.log_mut().start_sync()?,
            false => None,
        };
        match started {
            None => {
                replica.persisted(number);
                self.send_held(held);
            }
            Some((file, mark)) => {
                let sync = tokio::task::spawn_blocking(move || {
                    let mut file = file;
                    file.sync().map(|()| file)
                });
                self.pipeline.inflight = Some(Inflight {
                    sync,
                    mark,
                    number,
                    held,
                    started: Instant::now(),
                });
            }
        }
        Ok(())
    }

    /// The sync under way ended (`result`): what it made durable is
    /// recorded and told to raft-rs, its held messages go, and the next
    /// sync starts if more was written meanwhile. A failed sync stops the
    /// replica, as in a round that is not pipelined.
    pub(super) fn synced(&mut self, result: Result<()>) -> Result<()> {
        let Some(inflight) = self.pipeline.inflight.take() else {
            return Ok(());
        };
        result.context("syncing the Raft log")?;
        let replica = &mut self.groups[0].replica;
        replica
            .log_mut()
            .synced(inflight.mark, inflight.started.elapsed())?;
        replica.persisted(inflight.number);
        self.send_held(inflight.held);
        self.start_sync()
    }

    /// Makes everything written durable and told (before a round that is
    /// not pipelined, and before stopping).
    pub(super) async fn drain(&mut self) -> Result<()> {
        while !self.pipeline.is_idle() {
            if self.pipeline.is_syncing() {
                let result = self.pipeline.done().await;
                self.synced(result)?;
            } else {
                self.start_sync()?;
            }
        }
        Ok(())
    }

    fn send_held(&self, held: Vec<Message>) {
        let id = self.groups[0].id;
        for m in held {
            self.links.send(id, m);
        }
    }
}
