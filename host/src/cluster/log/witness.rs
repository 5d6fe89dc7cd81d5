//! `raft-state`'s file, and who syncs it: the replica's loop itself, or,
//! for the records that only witness what a round made durable, a thread
//! of its own ([`Witness::behind`]), so that the loop goes on with the
//! next round instead of waiting for a second sync.
//!
//! The loop appends every record itself, in order. A record that must be
//! durable before anything else happens (a new term or vote, a log about
//! to shrink, a snapshot, a shutdown) is synced at once, with everything
//! appended before it. A record that witnesses a round's log sync
//! ([`Witness::hand_over`]) is appended after that sync and left to the
//! thread, which syncs `raft-state` at most once every [`EVERY`]: under load
//! a replica syncs its log a thousand times a second or more, and a sync of
//! `raft-state` for each cost about as much CPU as the log's own (a fifth of
//! a follower's, `BENCHMARKS.md`).
//!
//! The seeded simulation holds those records instead ([`Witness::held`])
//! and syncs them at ticks of its choosing ([`Witness::sync_held`]), crashing
//! replicas in between.
//!
//! What this gives up is bounded. A process that dies leaves its appended
//! records in the kernel's page cache, so `raft-state` is at most the round
//! it was in behind the log. A machine that loses power may lose the records
//! of the last [`EVERY`] (and the sync under way), leaving `raft-state`
//! behind the log by those rounds, which is allowed (a log holding more than
//! recorded is read whole); only a loss of those rounds' synced log bytes on
//! top of that would go unnoticed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use super::{Anchor, KIND_STATE, STATE_MAX_BYTES, frame, new_state_file};
use crate::store::storage::{LogFile, Storage};

/// The longest a record handed over waits for the thread's sync.
pub(super) const EVERY: Duration = Duration::from_millis(10);

/// `raft-state`, open, and how many bytes it holds.
#[derive(Debug)]
pub(super) struct StateFile {
    pub(super) file: Box<dyn LogFile>,
    pub(super) bytes: u64,
    /// How many times it was rewritten whole since it was opened.
    pub(super) rewrites: u64,
}

impl StateFile {
    /// Appends `anchor`; whether that left it synced (once the file has
    /// grown past [`STATE_MAX_BYTES`] it is rewritten whole, synced).
    fn append(&mut self, disk: &dyn Storage, anchor: &Anchor) -> Result<bool> {
        if self.bytes > STATE_MAX_BYTES {
            let (file, bytes) = new_state_file(disk, anchor)?;
            self.file = file;
            self.bytes = bytes;
            self.rewrites += 1;
            return Ok(true);
        }
        let mut buf = Vec::new();
        frame(KIND_STATE, &anchor.encode(), &mut buf);
        self.file
            .append(&buf)
            .with_context(|| format!("writing raft-state in {}", disk.describe()))?;
        self.bytes += buf.len() as u64;
        Ok(false)
    }
}

/// What the loop and the thread share.
#[derive(Debug)]
struct Slot {
    file: StateFile,
    /// Since when records appended are not synced.
    dirty: Option<Instant>,
    /// The thread syncs what was appended before it started (`dirty` was
    /// cleared then).
    syncing: bool,
    /// The thread's sync that failed (the replica stops on it).
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
    /// No thread: [`Witness::sync_held`] syncs what is handed over.
    held: bool,
}

impl Witness {
    /// Syncs every record at once until [`Witness::behind`].
    pub(super) fn new(disk: Arc<dyn Storage>, file: StateFile) -> Witness {
        Witness {
            disk,
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot {
                    file,
                    dirty: None,
                    syncing: false,
                    failed: None,
                    stop: false,
                }),
                changed: Condvar::new(),
            }),
            thread: None,
            held: false,
        }
    }

    /// From now on what [`Witness::hand_over`] appends waits for
    /// [`Witness::sync_held`] (the simulation, which chooses when).
    pub(super) fn held(&mut self) {
        self.held = true;
    }

    /// Syncs the records handed over and not yet synced, if held: whether
    /// there were any.
    pub(super) fn sync_held(&self) -> Result<bool> {
        let mut slot = self.shared.lock();
        if !self.held || slot.dirty.is_none() {
            return Ok(false);
        }
        sync(&mut slot, &*self.disk)?;
        Ok(true)
    }

    /// Starts the thread that syncs what [`Witness::hand_over`] appends.
    pub(super) fn behind(&mut self) -> Result<()> {
        if self.thread.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let disk = self.disk.clone();
        let thread = std::thread::Builder::new()
            .name("raft-state".into())
            .spawn(move || run(&shared, &*disk))
            .context("starting the thread that syncs raft-state")?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Whether a thread syncs the records handed over (or the simulation).
    pub(super) fn is_behind(&self) -> bool {
        self.thread.is_some() || self.held
    }

    /// Appends `anchor`, for the thread to sync within [`EVERY`]; an
    /// earlier sync of the thread that failed, if one did.
    pub(super) fn hand_over(&self, anchor: &Anchor) -> Result<()> {
        let mut slot = self.shared.lock();
        if let Some(e) = &slot.failed {
            return Err(anyhow!("{e}"));
        }
        let synced = slot.file.append(&*self.disk, anchor)?;
        if synced {
            slot.dirty = None;
        } else if slot.dirty.is_none() {
            slot.dirty = Some(Instant::now());
            self.shared.changed.notify_all();
        }
        Ok(())
    }

    /// Makes every record appended durable (syncs now what the thread has
    /// not, or is syncing); the thread's failure, if it failed.
    pub(super) fn settle(&self) -> Result<()> {
        let mut slot = self.shared.lock();
        if let Some(e) = &slot.failed {
            return Err(anyhow!("{e}"));
        }
        if slot.dirty.is_some() || slot.syncing {
            sync(&mut slot, &*self.disk)?;
        }
        Ok(())
    }

    /// Appends `anchor` and syncs it, with everything appended before it.
    pub(super) fn write(&self, anchor: &Anchor) -> Result<()> {
        let mut slot = self.shared.lock();
        if let Some(e) = &slot.failed {
            return Err(anyhow!("{e}"));
        }
        if !slot.file.append(&*self.disk, anchor)? {
            sync(&mut slot, &*self.disk)?;
        }
        slot.dirty = None;
        Ok(())
    }
}

/// Syncs `raft-state` on the caller's thread, holding the slot.
fn sync(slot: &mut Slot, disk: &dyn Storage) -> Result<()> {
    slot.file
        .file
        .sync()
        .with_context(|| format!("syncing raft-state in {}", disk.describe()))?;
    slot.dirty = None;
    Ok(())
}

/// The thread: syncs what was appended, [`EVERY`] after the first record
/// not synced, until told to stop (what was appended by then is synced
/// first).
fn run(shared: &Shared, disk: &dyn Storage) {
    loop {
        let file = {
            let mut slot = shared.lock();
            loop {
                match slot.dirty {
                    Some(since) if slot.stop || since.elapsed() >= EVERY => break,
                    Some(since) => {
                        let left = EVERY.saturating_sub(since.elapsed());
                        slot = shared
                            .changed
                            .wait_timeout(slot, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    None if slot.stop => return,
                    None => slot = shared.changed.wait(slot).unwrap_or_else(|e| e.into_inner()),
                }
            }
            // Its own handle: the loop appends meanwhile (the file may be
            // replaced by a rewrite, which is synced: a sync of the old
            // one then does no harm).
            match slot.file.file.try_clone() {
                Ok(file) => {
                    slot.dirty = None;
                    slot.syncing = true;
                    (file, slot.file.rewrites)
                }
                Err(e) => {
                    fail(&mut slot, &format!("syncing raft-state: {e}"));
                    return;
                }
            }
        };
        let (mut file, rewrites) = file;
        let synced = file.sync();
        let mut slot = shared.lock();
        slot.syncing = false;
        // A handle to a file rewritten meanwhile may not sync (in memory);
        // the rewrite synced what it held.
        if let Err(e) = synced
            && slot.file.rewrites == rewrites
        {
            fail(
                &mut slot,
                &format!("syncing raft-state in {}: {e}", disk.describe()),
            );
            return;
        }
    }
}

/// Records the thread's failure: the replica stops at its next record.
fn fail(slot: &mut Slot, error: &str) {
    tracing::error!(error, "raft-state");
    if slot.failed.is_none() {
        slot.failed = Some(error.to_string());
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
