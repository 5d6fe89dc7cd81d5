//! `raft-state`'s file, and who writes it: the replica's loop itself, or,
//! for the records that only witness what a round made durable, a thread
//! of its own ([`Witness::behind`]), so that the loop goes on with the
//! next round instead of waiting for that second sync.
//!
//! A record handed to the thread is written after the log sync it
//! describes (it is handed over only then), and records are written in the
//! order they are handed over; a newer one waiting supersedes an older
//! one. Any other record (a new term or vote, a log about to shrink, a
//! snapshot, a shutdown) waits for the thread to finish what it was given,
//! then is written at once. A crash that leaves the last record unwritten
//! leaves `raft-state` a round behind the log, which is allowed (a log
//! holding more than recorded is read whole); only a later loss of that
//! round's synced bytes would go unnoticed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use anyhow::{Context as _, Result, anyhow};

use super::{Anchor, KIND_STATE, STATE_MAX_BYTES, frame, new_state_file};
use crate::store::storage::{LogFile, Storage};

/// `raft-state`, open, and how many bytes it holds.
#[derive(Debug)]
pub(super) struct StateFile {
    pub(super) file: Box<dyn LogFile>,
    pub(super) bytes: u64,
}

impl StateFile {
    /// Appends `anchor` and syncs it (the file rewritten whole once it has
    /// grown past [`STATE_MAX_BYTES`]).
    fn write(&mut self, disk: &dyn Storage, anchor: &Anchor) -> Result<()> {
        if self.bytes > STATE_MAX_BYTES {
            let (file, bytes) = new_state_file(disk, anchor)?;
            self.file = file;
            self.bytes = bytes;
            return Ok(());
        }
        let mut buf = Vec::new();
        frame(KIND_STATE, &anchor.encode(), &mut buf);
        self.file
            .append(&buf)
            .and_then(|()| self.file.sync())
            .with_context(|| format!("writing raft-state in {}", disk.describe()))?;
        self.bytes += buf.len() as u64;
        Ok(())
    }
}

/// What the loop and the thread share.
#[derive(Debug)]
struct Slot {
    /// The file, unless the thread is writing it.
    file: Option<StateFile>,
    /// The record to write next.
    next: Option<Anchor>,
    /// The thread's write that failed (the replica stops on it).
    failed: Option<String>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    slot: Mutex<Slot>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `raft-state`'s writer (see the module's doc).
#[derive(Debug)]
pub(super) struct Witness {
    disk: Arc<dyn Storage>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Witness {
    /// Writes to `file` on the caller's thread until [`Witness::behind`].
    pub(super) fn new(disk: Arc<dyn Storage>, file: StateFile) -> Witness {
        Witness {
            disk,
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot {
                    file: Some(file),
                    next: None,
                    failed: None,
                    stop: false,
                }),
                changed: Condvar::new(),
            }),
            thread: None,
        }
    }

    /// Starts the thread that writes what [`Witness::hand_over`] gives it.
    pub(super) fn behind(&mut self) -> Result<()> {
        if self.thread.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let disk = self.disk.clone();
        let thread = std::thread::Builder::new()
            .name("raft-state".into())
            .spawn(move || run(&shared, &*disk))
            .context("starting the thread that writes raft-state")?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Whether a thread writes the records handed over.
    pub(super) fn is_behind(&self) -> bool {
        self.thread.is_some()
    }

    /// Gives the thread `anchor` to write (a record waiting is superseded);
    /// an earlier write of the thread that failed, if one did.
    pub(super) fn hand_over(&self, anchor: Anchor) -> Result<()> {
        let mut slot = self.shared.lock();
        if let Some(e) = &slot.failed {
            return Err(anyhow!("{e}"));
        }
        slot.next = Some(anchor);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Waits until the thread has written what it was given; its failure,
    /// if it failed.
    pub(super) fn settle(&self) -> Result<()> {
        self.idle().map(drop)
    }

    fn idle(&self) -> Result<MutexGuard<'_, Slot>> {
        let mut slot = self.shared.lock();
        while slot.next.is_some() || slot.file.is_none() {
            slot = self
                .shared
                .changed
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
        if let Some(e) = &slot.failed {
            return Err(anyhow!("{e}"));
        }
        Ok(slot)
    }

    /// Writes `anchor` now, once the thread has written what it was given.
    pub(super) fn write(&self, anchor: &Anchor) -> Result<()> {
        let mut slot = self.idle()?;
        slot.file
            .as_mut()
            .expect("the thread is not writing")
            .write(&*self.disk, anchor)
    }
}

/// The thread: writes each record handed over, until told to stop (what
/// it was given by then is written first).
fn run(shared: &Shared, disk: &dyn Storage) {
    loop {
        let (anchor, mut file) = {
            let mut slot = shared.lock();
            while slot.next.is_none() && !slot.stop {
                slot = shared.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
            }
            let Some(anchor) = slot.next.take() else {
                return;
            };
            let Some(file) = slot.file.take() else {
                return;
            };
            (anchor, file)
        };
        let written = file.write(disk, &anchor);
        let mut slot = shared.lock();
        slot.file = Some(file);
        if let Err(e) = written
            && slot.failed.is_none()
        {
            tracing::error!(error = %format!("{e:#}"), "writing raft-state");
            slot.failed = Some(format!("{e:#}"));
        }
        shared.changed.notify_all();
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        let _ = thread.join();
    }
}
