//! A replica's Raft log and state on disk (through [`crate::store::storage`], so a
//! test can crash it and tear its tail), read back through raft-rs's
//! in-memory storage.
//!
//! ```text
//!   raft-snapshot      the last guest snapshot, as a Raft snapshot (written atomically)
//!   raft-conf          the membership the log started with (a ConfState, written once)
//!   raft-life          when the replica's current life started (`node`: its `via`)
//!   raft-log.current   which generation of the log is current (written atomically)
//!   raft-log.<gen>     records: u32 len | u32 crc32 | u8 kind | protobuf
//!                        kind 1: an Entry   kind 2: the HardState
//!   raft-state         records (same framing), kind 3: what the log must hold
//!   raft-journal       a replica's round journal, in its data directory
//!                        (the partitions' logs in folders below it;
//!                        [`journal`]; with partitions, under `--fsync always`)
//! ```
//!
//! Records are appended as Raft hands them over; [`LogStore::sync`] makes
//! them durable, and a replica sends what depends on them (its votes, its
//! acknowledgements of entries) only after that under `--fsync always` (a
//! new term or vote is synced under every policy). With a round journal
//! (partitions, `--fsync always`) the log hands the same records to the journal
//! instead ([`LogStore::take_part`]), which makes a whole round of every
//! group durable with one sync; the log itself is synced at checkpoints.
//! Compaction (after a snapshot) and installing a leader's snapshot write a
//! new generation holding what is left, then switch `raft-log.current` to
//! it: a crash leaves the old generation or the new one. A replica's
//! snapshot file is written on a thread of its own ([`compacting`]).
//!
//! `raft-state` is the log's anchor, kept apart so that losing the log does
//! not lose it: each record (the last good one counts) holds the term and
//! vote, the commit index, the last index the log held when it was last
//! synced, the snapshot's index and the current generation, and with a
//! journal how many bytes of that generation are synced (version 2; a log
//! without a journal still writes version 1). It is appended
//! and synced after every sync of the log that changed them, and before
//! anything shrinks the log (a new leader's entries replacing a tail, a
//! leader's snapshot), so the log never legitimately ends before what it
//! records. Term and vote are taken from it when the log's are older: a
//! replica never votes twice in one term.
//!
//! Both files are zero-filled ahead of their records
//! ([`LogFile::zero_fill_ahead`]: `raft-state` once, 260 KiB, the log in
//! steps of 256 KiB), so a record is written over zeros and syncing it
//! does not change the file's length: syncs are cheaper. An all-zero tail
//! is the end of a file, not a tear.
//!
//! Recovery reads the snapshot, then the current generation's records in
//! order. A record cut short or failing its checksum at the end of the file
//! is a torn tail (written, never synced, so never acknowledged): it is cut
//! off. One followed by good records is damage, and the replica refuses to
//! start. So it does when the log holds less than `raft-state` records (a
//! deleted, emptied or truncated log file, a missing generation or
//! snapshot): the message says what is missing; `statestore cluster
//! rejoin` discards the log, keeps the term and vote, and the replica
//! catches up from the others ([`rejoin`]).

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage as _};

use crate::store::storage::{LogFile, Storage, zero_tail};

mod anchor;
mod compacting;
pub mod journal;
mod rejoin;
mod witness;
pub use anchor::Anchor;
use anchor::read_anchor;
pub use compacting::SnapshotBuf;
pub use journal::Part;
pub use rejoin::rejoin;

const SNAPSHOT: &str = "raft-snapshot";
const CURRENT: &str = "raft-log.current";
const CONF: &str = "raft-conf";
const STATE: &str = "raft-state";
const STATE_NEW: &str = "raft-state.new";
const KIND_ENTRY: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_STATE: u8 = 3;

/// `raft-state` is rewritten with one record once it grows past this.
const STATE_MAX_BYTES: u64 = 256 << 10;
/// `raft-state`'s length, zero-filled when it is written: room for
/// [`STATE_MAX_BYTES`] and the record that passes it.
const STATE_FILE_BYTES: u64 = STATE_MAX_BYTES + (4 << 10);
/// A log file grows in zero-filled steps of this.
const LOG_STEP: u64 = 256 << 10;

/// How to recover a replica whose log lost what it had: words for the
/// messages that refuse to start.
const RECOVER: &str = "to recover while the others serve, run `statestore cluster rejoin --cluster <this replica's file>` (it keeps the term and vote, moves the damaged log aside, has the leader remove this replica and add it back), then start it again: it catches up from the leader's snapshot; a cluster of one cannot rejoin (restore its data directory from a backup)";

/// A replica's log: raft-rs's [`MemStorage`] in front, the disk behind.
pub struct LogStore {
    mem: MemStorage,
    disk: Arc<dyn Storage>,
    generation: u64,
    file: Box<dyn LogFile>,
    /// Bytes in the current generation.
    bytes: u64,
    /// Appended and not yet synced.
    dirty: bool,
    /// The last snapshot (with its data), what a lagging replica is sent.
    snapshot: Snapshot,
    /// Appends, bytes, fsync and snapshot durations (`--metrics`).
    metrics: Option<crate::metrics::JournalMetrics>,
    /// `raft-state`, and what it says now.
    state: witness::Witness,
    anchor: Anchor,
    /// What `raft-state` is to say once the round's messages have gone
    /// ([`LogStore::sync_entries`], then [`LogStore::witness`]).
    unwitnessed: Option<Anchor>,
    /// [`LogStore::sync_entries`] records `raft-state` at once, before it
    /// returns ([`LogStore::anchor_first`]).
    anchor_first: bool,
    /// Its records go through a round journal too ([`journal`]): it never
    /// syncs by itself but at a checkpoint ([`LogStore::sync`]), a new
    /// generation, or before the log shrinks.
    journaled: bool,
    /// With a journal: what was written since the last
    /// [`LogStore::take_part`], and where in the file it starts.
    pending: Vec<u8>,
    pending_at: u64,
    /// Snapshots are written on a thread of their own
    /// ([`LogStore::snapshots_behind`]), and the one being written.
    snapshots_behind: bool,
    /// Or held for the simulation to write ([`LogStore::snapshots_held`]).
    snapshots_held: bool,
    compacting: Option<compacting::Compacting>,
    /// Appends so far, and records written to `raft-state` so far (what a
    /// [`SyncMark`] compares with).
    writes: u64,
    records: u64,
}

/// What a sync started by [`LogStore::start_sync`] makes durable: the
/// appends before it, and what `raft-state` may then say.
#[derive(Debug)]
pub struct SyncMark {
    anchor: Anchor,
    writes: u64,
    records: u64,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("disk", &self.disk.describe())
            .field("generation", &self.generation)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

fn frame(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(body.len() + 1).expect("a record under 4 GiB");
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(body);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// What recovery found in a log file.
struct Parsed {
    records: Vec<(u8, Vec<u8>)>,
    /// Where the good records end.
    good: usize,
    /// Whether a torn tail starts at `good` (what follows is not all
    /// zeros: not the zero-filled room ahead of the records).
    torn: bool,
}

fn parse(data: &[u8], name: &str) -> Result<Parsed> {
    let mut records = Vec::new();
    let mut p = 0;
    while p < data.len() {
        let bad = |p: usize| -> Result<Parsed> {
            if zero_tail(&data[p..]) {
                return Ok(Parsed {
                    records: Vec::new(),
                    good: p,
                    torn: false,
                });
            }
            // A bad record with a good one after it is damage, not a tear.
            if next_good(data, p + 1) {
                bail!(
                    "the Raft log {name} is damaged at byte {p} (good records follow): refusing to start; {RECOVER}"
                );
            }
            Ok(Parsed {
                records: Vec::new(),
                good: p,
                torn: true,
            })
        };
        if data.len() - p < 9 {
            return bad(p).map(|b| Parsed { records, ..b });
        }
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(data[p + 4..p + 8].try_into().expect("4"));
        if len == 0 || data.len() - p - 8 < len || crc32fast::hash(&data[p + 8..p + 8 + len]) != crc
        {
            return bad(p).map(|b| Parsed { records, ..b });
        }
        records.push((data[p + 8], data[p + 9..p + 8 + len].to_vec()));
        p += 8 + len;
    }
    Ok(Parsed {
        records,
        good: p,
        torn: false,
    })
}

/// Whether a good record starts anywhere at or after `from`.
fn next_good(data: &[u8], from: usize) -> bool {
    (from..data.len().saturating_sub(9)).any(|p| {
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(data[p + 4..p + 8].try_into().expect("4"));
        len > 1
            && data.len() - p - 8 >= len
            && matches!(
                data[p + 8],
                KIND_ENTRY | KIND_HARD_STATE | KIND_STATE | journal::KIND_PART
            )
            && crc32fast::hash(&data[p + 8..p + 8 + len]) == crc
    })
}

fn log_name(generation: u64) -> String {
    format!("raft-log.{generation}")
}

impl LogStore {
    /// Opens (or creates, for a cluster of `voters`) the log kept in `disk`.
    /// The membership a log starts with is kept beside it (`raft-conf`):
    /// the changes in the log apply to it, whatever `voters` says later.
    /// No `voters` (a replica joining a running cluster): no membership
    /// until the leader's snapshot brings one.
    pub fn open(disk: Arc<dyn Storage>, voters: &[u64]) -> Result<LogStore> {
        LogStore::open_with(disk, voters, None, false)
    }

    /// [`LogStore::open`], with what the replica's round journal holds of
    /// this log (`parts`, in the order written; `journal::read`; `None`:
    /// there is no journal) read after what its file holds; `journaled`:
    /// its records go through a journal from now on (the caller commits
    /// them with `journal::Journal::commit` before it sends anything that
    /// depends on them).
    pub fn open_with(
        disk: Arc<dyn Storage>,
        voters: &[u64],
        parts: Option<&[&Part]>,
        journaled: bool,
    ) -> Result<LogStore> {
        disk.lock()
            .with_context(|| format!("{} is in use by another process", disk.describe()))?;
        let opened = LogStore::open_locked(disk.clone(), voters, parts, journaled);
        if opened.is_err() {
            disk.unlock();
        }
        opened
    }

    fn open_locked(
        disk: Arc<dyn Storage>,
        voters: &[u64],
        parts: Option<&[&Part]>,
        journaled: bool,
    ) -> Result<LogStore> {
        let names = disk.list().context("listing the Raft log")?;
        let where_ = disk.describe();
        let anchor = read_anchor(&*disk, &names)?;
        let (mem, snapshot) = load_base(&*disk, &names, anchor, voters)?;
        let snap_index = snapshot.get_metadata().index;
        if let Some(a) = anchor
            && snap_index < a.snapshot
        {
            bail!(
                "{where_}: raft-snapshot is at index {snap_index}, older than the one at index {} that raft-state records (an old copy?): refusing to start; {RECOVER}",
                a.snapshot
            );
        }
        let (generation, name, torn) =
            replay_generation(&*disk, &names, anchor, &mem, snap_index, parts)?;
        let last = mem.last_index()?;
        if let Some(a) = anchor
            && last < a.last
        {
            let what = match torn {
                Some((at, len)) => format!(
                    "{name} is cut inside a record at byte {at} of {len} (not a write the crash tore: the log had been synced past it)"
                ),
                None if last <= snap_index => format!("{name} holds no entries"),
                None => format!("{name} was cut short"),
            };
            bail!(
                "{where_}: the Raft log ends at index {last}, but it held index {} when it was last synced (raft-state): {what}; committed entries may be lost: refusing to start; {RECOVER}",
                a.last
            );
        }
        if let Some((at, len)) = torn {
            tracing::warn!(file = %name, at, cut = len - at, "a torn tail of the Raft log (never synced, so never acknowledged): cut off");
        }
        {
            let mut core = mem.wl();
            let hs = core.mut_hard_state();
            if let Some(a) = anchor {
                // A vote the log lost is still a vote.
                if a.term > hs.term || (a.term == hs.term && hs.vote == 0) {
                    hs.term = a.term;
                    hs.vote = a.vote;
                }
                hs.commit = hs.commit.max(a.commit.min(last));
            }
            // A commit index past the log (never the case when written in
            // order) would stop raft-rs: clamp it.
            if hs.commit > last {
                hs.commit = last;
            }
        }
        // What was read becomes a new generation (the torn tail left out).
        let (file, bytes) = write_generation(&*disk, &mem, generation + 1)?;
        if names.contains(&name)
            && let Err(e) = disk.remove(&name)
        {
            tracing::warn!(file = %name, error = %e, "could not remove an old Raft log");
        }
        if names.iter().any(|n| n == STATE_NEW) {
            let _ = disk.remove(STATE_NEW); // an interrupted rewrite
        }
        let hs = mem.rl().hard_state().clone();
        let anchor = Anchor {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
            last,
            snapshot: snap_index,
            generation: generation + 1,
            synced: journaled.then_some(bytes),
        };
        let (state, state_bytes) = new_state_file(&*disk, &anchor)?;
        let state = witness::Witness::new(
            disk.clone(),
            witness::StateFile {
                file: state,
                bytes: state_bytes,
                rewrites: 0,
            },
        );
        Ok(LogStore {
            mem,
            disk,
            generation: generation + 1,
            file,
            bytes,
            dirty: false,
            snapshot,
            metrics: None,
            state,
            anchor,
            unwitnessed: None,
            anchor_first: false,
            journaled,
            pending: Vec::new(),
            pending_at: bytes,
            snapshots_behind: false,
            snapshots_held: false,
            compacting: None,
            writes: 0,
            records: 0,
        })
    }

    /// What `raft-state` should say now (of what is synced).
    fn current_anchor(&self) -> Result<Anchor> {
        let hs = self.mem.rl().hard_state().clone();
        Ok(Anchor {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
            last: self.mem.last_index()?,
            snapshot: self.snapshot.get_metadata().index,
            generation: self.generation,
            synced: self.journaled.then_some(self.bytes),
        })
    }

    /// Appends `anchor` to `raft-state` and syncs it (rewritten whole once
    /// it has grown).
    fn record(&mut self, anchor: Anchor) -> Result<()> {
        // What waited to be witnessed is older than what is recorded now.
        self.unwitnessed = None;
        if anchor == self.anchor {
            // Appended already, perhaps not synced yet.
            return self.state.settle();
        }
        // Synced with every record appended before it.
        self.state.write(&anchor)?;
        self.anchor = anchor;
        self.records += 1;
        Ok(())
    }

    /// Before the log shrinks to `last` (a conflicting tail replaced, a
    /// leader's snapshot installed): `raft-state` says so first, so that a
    /// crash in between does not look like a lost log.
    fn shrinking_to(&mut self, last: u64) -> Result<()> {
        if last < self.anchor.last {
            let anchor = Anchor {
                last,
                commit: self.anchor.commit.min(last),
                ..self.anchor
            };
            self.record(anchor)?;
        }
        Ok(())
    }

    /// The membership is now `conf` (a change was applied): the next
    /// snapshot records it.
    pub fn set_conf_state(&mut self, conf: ConfState) {
        self.mem.wl().set_conf_state(conf);
    }

    /// Records its appends, bytes, fsync and snapshot durations in
    /// `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: crate::metrics::JournalMetrics) {
        self.metrics = Some(metrics);
    }

    /// Its metrics, if it keeps any.
    pub fn metrics(&self) -> Option<&crate::metrics::JournalMetrics> {
        self.metrics.as_ref()
    }

    /// Appends `entries` (replacing any conflicting tail).
    pub fn append(&mut self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.shrinking_to(entries[0].index.saturating_sub(1))?;
        self.mem
            .wl()
            .append(entries)
            .context("appending to the log")?;
        let mut buf = Vec::new();
        for e in entries {
            frame(KIND_ENTRY, &e.write_to_bytes()?, &mut buf);
        }
        self.write(&buf, entries.len())
    }

    /// Records the hard state (term, vote, commit). A new term or vote is
    /// synced at once, whatever the policy: a replica must not forget it
    /// voted (with a journal, by the round's commit, before any message).
    pub fn set_hardstate(&mut self, hs: HardState) -> Result<()> {
        let mut buf = Vec::new();
        frame(KIND_HARD_STATE, &hs.write_to_bytes()?, &mut buf);
        let voted = hs.term != self.anchor.term || hs.vote != self.anchor.vote;
        self.mem.wl().set_hardstate(hs);
        self.write(&buf, 1)?;
        if voted && !self.journaled {
            self.sync()?;
        }
        Ok(())
    }

    /// Records a new commit index.
    pub fn set_commit(&mut self, commit: u64) -> Result<()> {
        let mut hs = self.mem.rl().hard_state().clone();
        hs.commit = commit;
        self.set_hardstate(hs)
    }

    /// Appends `buf`, `records` framed records.
    fn write(&mut self, buf: &[u8], records: usize) -> Result<()> {
        self.file
            .append(buf)
            .with_context(|| format!("writing the Raft log in {}", self.disk.describe()))?;
        self.bytes += buf.len() as u64;
        self.dirty = true;
        self.writes += 1;
        if self.journaled {
            self.pending.extend_from_slice(buf);
        }
        if let Some(m) = &self.metrics {
            m.records.inc_by(records as u64);
            m.bytes.inc_by(buf.len() as u64);
        }
        Ok(())
    }

    /// Whether something written is not yet synced.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Makes everything written so far durable, then records in
    /// `raft-state` what the log now holds (with a journal: a checkpoint,
    /// after which the journal need not hold what this log has).
    pub fn sync(&mut self) -> Result<()> {
        self.sync_file()?;
        let anchor = self.current_anchor()?;
        self.record(anchor)?;
        self.pending.clear();
        self.pending_at = self.bytes;
        Ok(())
    }

    /// A round's sync under `--fsync always` without a journal, in two
    /// steps: this one makes what was written durable (all its messages
    /// wait for), [`LogStore::witness`] records it in `raft-state` once
    /// they have gone (what only notices a later loss need not delay
    /// them: a follower's acknowledgement goes a sync earlier).
    pub fn sync_entries(&mut self) -> Result<()> {
        if self.anchor_first {
            return self.sync();
        }
        self.witness()?;
        self.sync_file()?;
        self.entries_synced(None)
    }

    /// [`LogStore::sync_entries`] with the sync left to the caller, on a
    /// thread of its choice while its own goes on: a handle to the log file
    /// to sync, if anything was written (`None`: nothing to sync, or
    /// `raft_state = "first"`, synced already). Nothing may be written to
    /// the log until [`LogStore::entries_synced`].
    pub fn entries_to_sync(&mut self) -> Result<Option<Box<dyn LogFile>>> {
        if self.anchor_first {
            self.sync()?;
            return Ok(None);
        }
        self.witness()?;
        if !self.dirty {
            return Ok(None);
        }
        self.file
            .try_clone()
            .with_context(|| format!("the Raft log in {}", self.disk.describe()))
            .map(Some)
    }

    /// The handle of [`LogStore::entries_to_sync`] synced (in `took`), or
    /// there was none (`None`).
    pub fn entries_synced(&mut self, took: Option<std::time::Duration>) -> Result<()> {
        if let Some(took) = took {
            self.dirty = false;
            if let Some(m) = &self.metrics {
                m.fsync.observe(took.as_secs_f64());
            }
        }
        if self.anchor_first {
            return Ok(());
        }
        let anchor = self.current_anchor()?;
        if anchor != self.anchor {
            self.unwitnessed = Some(anchor);
        }
        Ok(())
    }

    /// A sync of what was written so far that may run while the log is
    /// written on (a leader's pipelined round): a handle to the log file
    /// and what it makes durable, for [`LogStore::synced`]; `None` if
    /// nothing was written since the last.
    pub fn start_sync(&mut self) -> Result<Option<(Box<dyn LogFile>, SyncMark)>> {
        self.witness()?;
        if !self.dirty {
            return Ok(None);
        }
        let file = self
            .file
            .try_clone()
            .with_context(|| format!("the Raft log in {}", self.disk.describe()))?;
        let mark = SyncMark {
            anchor: self.current_anchor()?,
            writes: self.writes,
            records: self.records,
        };
        Ok(Some((file, mark)))
    }

    /// The sync of `mark` is done (in `took`): `raft-state` says what it
    /// made durable, unless it says more already (a record made since,
    /// after a sync of everything) or the log was rewritten since (its new
    /// generation is synced whole). The log is clean if nothing was written
    /// since it started.
    pub fn synced(&mut self, mark: SyncMark, took: std::time::Duration) -> Result<()> {
        if let Some(m) = &self.metrics {
            m.fsync.observe(took.as_secs_f64());
        }
        if mark.anchor.generation != self.generation || mark.records != self.records {
            return Ok(());
        }
        if mark.writes == self.writes {
            self.dirty = false;
        }
        if mark.anchor != self.anchor {
            self.unwitnessed = Some(mark.anchor);
        }
        self.witness()
    }

    /// Records in `raft-state` what the last [`LogStore::sync_entries`]
    /// made durable (nothing if that changed nothing it records).
    pub fn witness(&mut self) -> Result<()> {
        match self.unwitnessed.take() {
            Some(anchor) if self.state.is_behind() => {
                self.state.hand_over(&anchor)?;
                self.anchor = anchor;
                self.records += 1;
                Ok(())
            }
            Some(anchor) => self.record(anchor),
            None => Ok(()),
        }
    }

    /// From now on [`LogStore::sync_entries`] records `raft-state` itself,
    /// before it returns: a round's messages wait for both syncs.
    pub fn anchor_first(&mut self) {
        self.anchor_first = true;
    }

    /// Whether [`LogStore::anchor_first`] was asked for.
    pub fn is_anchor_first(&self) -> bool {
        self.anchor_first
    }

    /// From now on [`LogStore::witness`] hands its records to a thread of
    /// their own (see the `witness` module): the replica's loop does not wait for
    /// that sync.
    pub fn witness_behind(&mut self) -> Result<()> {
        self.state.behind()
    }

    /// As [`LogStore::witness_behind`], but the records wait for
    /// [`LogStore::sync_held_state`] instead of a thread (the simulation:
    /// it syncs them at a tick of its choosing, and may crash first).
    pub fn witness_held(&mut self) {
        self.state.held();
    }

    /// Syncs the `raft-state` records [`LogStore::witness_held`] holds:
    /// whether there were any.
    pub fn sync_held_state(&mut self) -> Result<bool> {
        self.state.sync_held()
    }

    /// Syncs the log file if something was written since it was last.
    fn sync_file(&mut self) -> Result<()> {
        if self.dirty {
            let started = std::time::Instant::now();
            self.file
                .sync()
                .with_context(|| format!("syncing the Raft log in {}", self.disk.describe()))?;
            self.dirty = false;
            if let Some(m) = &self.metrics {
                m.fsync.observe(started.elapsed().as_secs_f64());
            }
        }
        Ok(())
    }

    /// With a journal: what was written since the last call, for the
    /// journal (none: nothing new).
    pub fn take_part(&mut self) -> Option<Part> {
        if self.pending.is_empty() {
            return None;
        }
        let bytes = std::mem::take(&mut self.pending);
        let at = self.pending_at;
        self.pending_at += bytes.len() as u64;
        Some(Part {
            generation: self.generation,
            at,
            bytes,
        })
    }

    /// What `raft-state` says.
    pub fn anchor(&self) -> Anchor {
        self.anchor
    }

    /// Bytes in the current generation of the log.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The last snapshot's index (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// The current hard state.
    pub fn hard_state(&self) -> HardState {
        self.mem.rl().hard_state().clone()
    }

    /// Installs a leader's snapshot (the log before it is dropped).
    pub fn install(&mut self, snap: Snapshot) -> Result<()> {
        self.finish_compaction()?;
        self.shrinking_to(snap.get_metadata().index)?;
        self.disk
            .write_atomic(SNAPSHOT, &snap.write_to_bytes()?)
            .context("writing the Raft snapshot")?;
        self.mem
            .wl()
            .apply_snapshot(snap.clone())
            .context("installing a snapshot")?;
        self.snapshot = snap;
        self.rewrite()
    }

    /// Writes what the log holds now as a new generation, then makes it
    /// current and removes the old one.
    fn rewrite(&mut self) -> Result<()> {
        let (file, bytes) = write_generation(&*self.disk, &self.mem, self.generation + 1)?;
        let old = log_name(self.generation);
        self.generation += 1;
        self.file = file;
        self.bytes = bytes;
        self.dirty = false;
        // The new generation holds all of it, synced.
        self.pending.clear();
        self.pending_at = bytes;
        if let Err(e) = self.disk.remove(&old) {
            tracing::warn!(file = %old, error = %e, "could not remove an old Raft log");
        }
        let anchor = self.current_anchor()?;
        self.record(anchor)
    }
}

/// Writes `raft-state` anew with one record, `anchor` (through
/// `raft-state.new`, renamed over it: a crash leaves the old or the new).
fn new_state_file(disk: &dyn Storage, anchor: &Anchor) -> Result<(Box<dyn LogFile>, u64)> {
    let mut buf = Vec::new();
    frame(KIND_STATE, &anchor.encode(), &mut buf);
    let mut file = disk.create(STATE_NEW).context("a new raft-state")?;
    file.zero_fill_ahead(STATE_FILE_BYTES);
    file.append(&buf).context("writing raft-state")?;
    file.sync().context("syncing raft-state")?;
    disk.rename(STATE_NEW, STATE)
        .context("switching to the new raft-state")?;
    disk.sync_dir().context("syncing the data directory")?;
    Ok((file, buf.len() as u64))
}

/// Writes the entries and hard state of `mem` as generation `generation`,
/// durably, and makes it current.
fn write_generation(
    disk: &dyn Storage,
    mem: &MemStorage,
    generation: u64,
) -> Result<(Box<dyn LogFile>, u64)> {
    let mut buf = Vec::new();
    let (first, last) = (mem.first_index()?, mem.last_index()?);
    if last >= first {
        let entries = mem.entries(first, last + 1, None, GetEntriesContext::empty(false))?;
        for e in &entries {
            frame(KIND_ENTRY, &e.write_to_bytes()?, &mut buf);
        }
    }
    let hs = mem.rl().hard_state().clone();
    frame(KIND_HARD_STATE, &hs.write_to_bytes()?, &mut buf);
    let name = log_name(generation);
    let mut file = disk.create(&name).context("a new Raft log")?;
    file.zero_fill_ahead(LOG_STEP);
    file.append(&buf).context("writing a new Raft log")?;
    file.sync().context("syncing a new Raft log")?;
    disk.sync_dir().context("syncing the data directory")?;
    disk.write_atomic(CURRENT, generation.to_string().as_bytes())
        .context("switching to the new Raft log")?;
    Ok((file, buf.len() as u64))
}

impl raft::Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot.get_metadata().index && idx > 0 {
            return Ok(self.snapshot.get_metadata().term);
        }
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The last guest snapshot; a newer one is taken when Raft asks for
    /// one past it (the replica compacts at its applied index).
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index == 0
            || self.snapshot.get_metadata().index < request_index
        {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

/// The base of the log: its snapshot if there is one (refusing a missing
/// one that `raft-state` says was there), else its membership (written
/// from `voters` on a first start).
fn load_base(
    disk: &dyn Storage,
    names: &[String],
    anchor: Option<Anchor>,
    voters: &[u64],
) -> Result<(MemStorage, Snapshot)> {
    let where_ = disk.describe();
    let mem;
    let mut snapshot = Snapshot::default();
    if names.iter().any(|n| n == SNAPSHOT) {
        let bytes = disk.read(SNAPSHOT).context("reading the Raft snapshot")?;
        snapshot = Snapshot::parse_from_bytes(&bytes).context("the Raft snapshot")?;
        mem = MemStorage::new();
        mem.wl()
            .apply_snapshot(snapshot.clone())
            .context("loading the Raft snapshot")?;
    } else if let Some(a) = anchor
        && a.snapshot > 0
    {
        bail!(
            "{where_}: raft-snapshot is missing, and raft-state says the log starts from a snapshot at index {}: refusing to start with an empty state; {RECOVER}",
            a.snapshot
        );
    } else if names.iter().any(|n| n == CONF) {
        let bytes = disk.read(CONF).context("reading raft-conf")?;
        let conf = ConfState::parse_from_bytes(&bytes).context("raft-conf")?;
        mem = MemStorage::new_with_conf_state(conf);
    } else {
        let conf = ConfState::from((voters.to_vec(), vec![]));
        disk.write_atomic(CONF, &conf.write_to_bytes()?)
            .context("writing raft-conf")?;
        mem = MemStorage::new_with_conf_state(conf);
    }
    Ok((mem, snapshot))
}

/// Where a torn tail of a log file starts, and the file's length.
type Torn = (usize, usize);

/// Replays the current generation of the log into `mem` (entries after
/// the snapshot, hard states), refusing a generation older than the one
/// `raft-state` records or one that is missing: the generation, its file
/// name, and where a torn tail starts (and the file's length), if any.
fn replay_generation(
    disk: &dyn Storage,
    names: &[String],
    anchor: Option<Anchor>,
    mem: &MemStorage,
    snap_index: u64,
    parts: Option<&[&Part]>,
) -> Result<(u64, String, Option<Torn>)> {
    let where_ = disk.describe();
    let mut generation = 0;
    let has_current = names.iter().any(|n| n == CURRENT);
    if has_current {
        let bytes = disk.read(CURRENT).context("reading raft-log.current")?;
        generation = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .context("raft-log.current is not a generation number")?;
    }
    if let Some(a) = anchor
        && a.generation > generation
    {
        bail!(
            "{where_}: {}, and raft-state records generation {} of the Raft log: refusing to start; {RECOVER}",
            if has_current {
                format!("raft-log.current names generation {generation}")
            } else {
                "raft-log.current is missing".to_string()
            },
            a.generation
        );
    }
    let name = log_name(generation);
    let mut torn = None;
    if names.contains(&name) {
        let data = disk
            .read(&name)
            .with_context(|| format!("reading {name}"))?;
        // With a journal, what it says was synced, then the journal's parts.
        let synced = anchor
            .filter(|a| a.generation == generation)
            .and_then(|a| a.synced);
        if let (Some(synced), None) = (synced, parts) {
            bail!(
                "{where_}: {} is missing, and raft-state says only {synced} bytes of {name} were synced: the rest (acknowledged writes) was in it: refusing to start; {RECOVER}",
                journal::JOURNAL
            );
        }
        let parts: Vec<&Part> = parts
            .unwrap_or_default()
            .iter()
            .copied()
            .filter(|p| p.generation == generation)
            .collect();
        let data = journal::joined(data, synced, &parts, &name, &where_)?;
        let parsed = parse(&data, &name)?;
        if parsed.torn {
            torn = Some((parsed.good, data.len()));
        }
        let mut last = mem.last_index()?;
        let mut core = mem.wl();
        for (kind, body) in parsed.records {
            match kind {
                KIND_ENTRY => {
                    let e = Entry::parse_from_bytes(&body).context("a Raft log entry")?;
                    if e.index <= snap_index {
                        continue;
                    }
                    if e.index > last + 1 {
                        tracing::warn!(
                            index = e.index,
                            expected = last + 1,
                            "entries after a gap in the Raft log (left by an interrupted snapshot install) are dropped"
                        );
                        break;
                    }
                    last = e.index;
                    core.append(&[e]).context("replaying the Raft log")?;
                }
                KIND_HARD_STATE => {
                    let mut hs = HardState::parse_from_bytes(&body).context("a HardState")?;
                    hs.commit = hs.commit.max(snap_index);
                    core.set_hardstate(hs);
                }
                k => bail!("{name}: a record of unknown kind {k}"),
            }
        }
    } else if has_current {
        bail!(
            "{where_}: {name} is missing (raft-log.current names it): refusing to start with an empty log; {RECOVER}"
        );
    }
    Ok((generation, name, torn))
}

#[cfg(test)]
mod tests;
