//! A replica's rounds pipelined, without I/O: which readies wait for which
//! sync of the log, and what is told and sent when a sync ends. The server
//! runs each sync on the blocking pool (`node::pipelined`); the simulation
//! ends them at ticks of its choosing, and crashes replicas in between.
//!
//! A round's ready is written, handed back to raft-rs at once
//! ([`Replica::ready_defer`]) and its sync started; meanwhile the replica
//! takes its clients' next requests and, as leader, sends their entries to
//! the followers and steps their acknowledgements, or, as follower,
//! forwards them to the leader. raft-rs counts a leader's own entries
//! toward a commit, and lets a replica apply entries, only once the sync
//! says they are durable ([`Replica::persisted`], in ready order); a
//! follower's acknowledgements wait for that sync too (held with it). What
//! is written while a sync is under way is synced by the next one, started
//! as soon as it ends. `raft-state` records what each sync made durable as
//! of its start ([`SyncMark`]).

use std::time::Instant;

use anyhow::{Context as _, Result};
use raft::prelude::Message;

use super::log::SyncMark;
use super::{Replica, Unsynced};
use crate::Backend;
use crate::store::storage::LogFile;

/// The syncs under way and to come of one replica's log; `S` is how the
/// host holds a sync under way (a task, a file and a tick).
#[derive(Debug)]
pub struct Pipeline<S> {
    inflight: Option<Inflight<S>>,
    /// Readies written since the sync under way started: the last one's
    /// number, the messages that wait for their sync, and whether any of
    /// them must be synced (one that only moved the commit index need not:
    /// its record goes with the next sync).
    next: Option<(u64, Vec<Message>, bool)>,
}

impl<S> Default for Pipeline<S> {
    fn default() -> Self {
        Pipeline {
            inflight: None,
            next: None,
        }
    }
}

#[derive(Debug)]
struct Inflight<S> {
    sync: S,
    mark: SyncMark,
    /// The last ready it makes durable, and the messages held for it.
    number: u64,
    held: Vec<Message>,
    started: Instant,
}

/// What a pipeline asks of its host: start syncing a handle to the log's
/// file, and send a message.
pub trait Host<S> {
    /// Starts syncing `file` (everything written to it so far).
    fn start(&mut self, file: Box<dyn LogFile>) -> S;
    /// Sends a message whose ready is durable now.
    fn send(&mut self, m: Message);
}

impl<S> Pipeline<S> {
    /// Whether no sync is under way or to come.
    pub fn is_idle(&self) -> bool {
        self.inflight.is_none() && self.next.is_none()
    }

    /// Whether a sync is under way.
    pub fn is_syncing(&self) -> bool {
        self.inflight.is_some()
    }

    /// The sync under way, if any.
    pub fn sync_mut(&mut self) -> Option<&mut S> {
        self.inflight.as_mut().map(|i| &mut i.sync)
    }

    /// `r`'s ready, written (`w`): handed back to raft-rs; its sync starts
    /// now, or once the one under way ends.
    pub fn defer<B: Backend>(
        &mut self,
        r: &mut Replica<B>,
        w: Unsynced,
        host: &mut dyn Host<S>,
    ) -> Result<()> {
        let must_sync = w.must_sync();
        let (number, held) = r.ready_defer(w)?;
        let next = self.next.get_or_insert_with(|| (number, Vec::new(), false));
        next.0 = number;
        next.1.extend(held);
        next.2 |= must_sync;
        if !self.is_syncing() {
            self.start_next(r, host)?;
        }
        Ok(())
    }

    /// Starts the sync of the readies written since the last one (if no
    /// sync is under way); with nothing written that must be synced, they
    /// are durable now.
    pub fn start_next<B: Backend>(
        &mut self,
        r: &mut Replica<B>,
        host: &mut dyn Host<S>,
    ) -> Result<()> {
        if self.is_syncing() {
            return Ok(());
        }
        let Some((number, held, must_sync)) = self.next.take() else {
            return Ok(());
        };
        let started = match must_sync {
            true => r.log_mut().start_sync()?,
            false => None,
        };
        match started {
            None => {
                r.persisted(number);
                held.into_iter().for_each(|m| host.send(m));
            }
            Some((file, mark)) => {
                self.inflight = Some(Inflight {
                    sync: host.start(file),
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
    /// sync starts if more was written meanwhile. A failed sync is an
    /// error (the replica stops, as in a round that is not pipelined).
    pub fn synced<B: Backend>(
        &mut self,
        r: &mut Replica<B>,
        result: Result<()>,
        host: &mut dyn Host<S>,
    ) -> Result<()> {
        let Some(inflight) = self.inflight.take() else {
            return Ok(());
        };
        result.context("syncing the Raft log")?;
        r.log_mut()
            .synced(inflight.mark, inflight.started.elapsed())?;
        r.persisted(inflight.number);
        inflight.held.into_iter().for_each(|m| host.send(m));
        self.start_next(r, host)
    }
}
