//! The write-ahead log and snapshots of a durable store (`--data-dir`).
//!
//! ```text
//! DIR/LOCK                         held (flock) while a server uses DIR
//! DIR/snapshot-<seq>.snap          a durable-scope guest snapshot (own magic,
//!                                  version and CRC-32)
//! DIR/wal-<seq>.log                "STSTWAL" 0x00, u32 format version (1), then frames:
//!                                  u32 length, u32 CRC-32 of the record, record
//! ```
//!
//! The state is: the newest valid snapshot `S`, then every frame of
//! `wal-<seq>.log` for `seq >= S` in order. A snapshot is taken between two
//! inputs, a new segment is started at once, and the snapshot file is written
//! in the background; older files are deleted only once it is durable, so a
//! crash at any point leaves a readable state.
//!
//! A segment is zero-filled ahead of its frames, 64 KiB at a time, so that
//! syncing a frame does not change the file's length (a cheaper
//! `fdatasync`); an all-zero tail is the segment's end.
//!
//! Recovery stops at the first torn or corrupt frame and reports how many
//! bytes it dropped; it then writes a fresh snapshot so the damaged tail is
//! never appended to. A file in a format newer than this build refuses to
//! load with a clear error.
//!
//! Every file operation goes through a [`Storage`] (`storage.rs`): a real
//! directory, or memory that tests can crash.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use tracing::{info, warn};

use crate::store::clock::Clock;
use crate::store::storage::{DirStorage, LogFile, Storage, zero_tail};
use crate::{Backend, Config, GuestError, Runtime, SnapshotScope, WasmStore};

mod commit;
mod recover;
#[cfg(test)]
use recover::replay_chunks;
use recover::{Repair, recover, recover_with_repairs};

pub use commit::commit;
use commit::split_records;

const WAL_MAGIC: &[u8; 8] = b"STSTWAL\0";
/// The WAL format this build writes and reads.
pub(crate) const WAL_VERSION: u32 = 1;
const HEADER_LEN: u64 = 12;

/// When appended records reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fsync {
    /// fsync before any reply of the batch is published (group commit: all
    /// requests handled together share one fsync).
    Always,
    /// fsync once a second in the background: a crash loses at most ~1 s.
    Everysec,
    /// Leave it to the OS: a crash of the machine can lose recent writes.
    No,
}

/// When to take a snapshot and truncate the log.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotPolicy {
    /// After this many bytes of log.
    pub max_log_bytes: u64,
    /// After this long, if anything was logged.
    pub max_interval: Duration,
    /// After a failed snapshot, the wait before the next attempt; it
    /// doubles with every failure in a row, up to [`SNAPSHOT_BACKOFF_MAX`].
    pub retry_after: Duration,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            max_log_bytes: 64 << 20,
            max_interval: Duration::from_secs(300),
            retry_after: SNAPSHOT_BACKOFF_MIN,
        }
    }
}

/// Why a journal cannot be opened, recovered or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another journal (process) holds the storage.
    #[error("{0} is in use by another statestore process")]
    InUse(String),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and to which file.
        what: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A log segment is in a format newer than this build.
    #[error(
        "{file} in {dir} is in WAL format {version}, newer than this build reads ({WAL_VERSION}): \
         run a newer statestore"
    )]
    NewerLog {
        /// The storage.
        dir: String,
        /// The segment.
        file: String,
        /// Its format version.
        version: u32,
    },
    /// A snapshot is in a format newer than this build's component reads.
    #[error("cannot load {dir}/{file}: its snapshot format is newer than this build")]
    NewerSnapshot {
        /// The storage.
        dir: String,
        /// The snapshot.
        file: String,
        /// The component's refusal.
        #[source]
        source: GuestError,
    },
    /// The log is damaged before its end (a bad frame with valid frames after
    /// it): starting would silently drop acknowledged writes.
    #[error(
        "{dir}/{file} is damaged at byte {offset}, and valid records follow the damage: \
         starting would lose them. The files are untouched. Restore the directory from a \
         backup, or start once with --recover-damaged-log to keep what precedes the damage \
         (the damaged segment is copied aside first)"
    )]
    Damaged {
        /// The storage.
        dir: String,
        /// The damaged segment.
        file: String,
        /// Where its valid prefix ends.
        offset: u64,
    },
    /// Snapshots exist but none loads: starting without them would lose data.
    #[error(
        "none of the {count} snapshots in {dir} can be loaded (see the warnings above); refusing \
         to start without them. Move the directory aside to start empty."
    )]
    NoLoadableSnapshot {
        /// The storage.
        dir: String,
        /// How many there are.
        count: usize,
    },
    /// The log does not continue the snapshot.
    #[error(
        "{dir}/{file} does not follow on from the snapshot (log {missing} is missing); refusing to start"
    )]
    Gap {
        /// The storage.
        dir: String,
        /// The first segment after the gap.
        file: String,
        /// The missing segment.
        missing: u64,
    },
    /// The component refused or failed on what the journal handed it.
    #[error("{what}: {source}")]
    Guest {
        /// What was being done.
        what: String,
        /// What the guest said.
        #[source]
        source: GuestError,
    },
    /// No instance of the component could be made.
    #[error("cannot start an instance of the component: {0:#}")]
    Instance(anyhow::Error),
}

/// `Err(e)` of an io call as a [`JournalError::Io`] saying `what`.
trait IoContext<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, JournalError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, JournalError> {
        self.map_err(|source| JournalError::Io {
            what: what(),
            source,
        })
    }
}

/// What recovery does with a log damaged before its end: a frame that fails
/// its checks with valid frames after it (in the same segment or a later
/// one) is not a torn tail but lost or corrupted data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDamage {
    /// Refuse to start and say where (the default): an operator decides.
    #[default]
    Refuse,
    /// Keep the valid prefix and start (`--recover-damaged-log`); the
    /// damaged segment is first copied aside as `<name>.damaged`, and
    /// the segments after it are kept aside as `<name>.dropped`.
    KeepPrefix,
}

/// What recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The snapshot loaded, if any.
    pub snapshot_seq: Option<u64>,
    /// Records replayed after it.
    pub records: u64,
    /// Bytes of torn or corrupt log dropped.
    pub dropped_bytes: u64,
}

/// An open data directory.
pub struct Journal {
    storage: Arc<dyn Storage>,
    fsync: Fsync,
    policy: SnapshotPolicy,
    seq: u64,
    /// The active segment; `None` while the disk had no room to start one
    /// (reads are served, and every append tries again).
    file: Option<Box<dyn LogFile>>,
    len: u64,
    logged_since_snapshot: u64,
    last_snapshot: Instant,
    /// The length of the last snapshot taken.
    last_snapshot_len: u64,
    /// If set, the log may grow as long as the last snapshot, up to this
    /// many bytes, before the next ([`Journal::follow_snapshot_size`]).
    follow_snapshot: Option<u64>,
    dirty: Arc<AtomicBool>,
    /// The active segment, for the `everysec` syncer thread.
    sync_target: Arc<Mutex<Option<Box<dyn LogFile>>>>,
    /// Whether the `everysec` syncer runs.
    syncing: bool,
    runtime: Runtime,
    config: Config,
    pending_snapshot: Option<(u64, std::thread::JoinHandle<io::Result<()>>)>,
    /// Set when a failed write could not be cleanly taken back: every later
    /// append fails rather than write after damaged bytes.
    broken: bool,
    on_damage: OnDamage,
    /// After a failed snapshot: not before this instant, and the wait
    /// after the next failure (doubling, at most [`SNAPSHOT_BACKOFF_MAX`]).
    snapshot_backoff: Option<(Instant, Duration)>,
    /// Snapshots that failed (in the guest or on the disk).
    snapshots_failed: u64,
    /// Whether the last append failed.
    append_failed: bool,
    /// Where appends, fsyncs and snapshots are counted (`--metrics`).
    metrics: Option<crate::metrics::JournalMetrics>,
}

/// The first wait after a failed snapshot, by default.
pub(crate) const SNAPSHOT_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between snapshot attempts after failures.
pub const SNAPSHOT_BACKOFF_MAX: Duration = Duration::from_secs(300);

fn snapshot_name(seq: u64) -> String {
    format!("snapshot-{seq:020}.snap")
}

fn wal_name(seq: u64) -> String {
    format!("wal-{seq:020}.log")
}

/// `(seq, name)` of the files called `<prefix>-<seq>.<ext>`, oldest first.
fn list(
    storage: &dyn Storage,
    prefix: &str,
    ext: &str,
) -> Result<Vec<(u64, String)>, JournalError> {
    let mut out = Vec::new();
    let names = storage
        .list()
        .doing(|| format!("cannot read {}", storage.describe()))?;
    for name in names {
        let Some(seq) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|r| r.strip_suffix(ext))
            .and_then(|r| r.strip_suffix('.'))
            .and_then(|r| r.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((seq, name));
    }
    out.sort();
    Ok(out)
}

/// Whether a valid frame starts anywhere in `data` after `from`: damage
/// followed by valid records, rather than a torn tail. A candidate must have
/// a plausible length, a record version byte of 1 to 9 (`wit/WIRE.md`), and
/// its CRC-32; the version filter keeps the scan linear in practice.
fn valid_frame_after(data: &[u8], from: usize) -> bool {
    let mut p = from + 1;
    while p + 8 + 6 <= data.len() {
        let len = u32::from_le_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]) as usize;
        if len >= 6 && len <= data.len() - p - 8 && (1..=9).contains(&data[p + 8]) {
            let crc = u32::from_le_bytes([data[p + 4], data[p + 5], data[p + 6], data[p + 7]]);
            if crc32fast::hash(&data[p + 8..p + 8 + len]) == crc {
                return true;
            }
        }
        p += 1;
    }
    false
}

/// What [`read_segment`] found in one WAL segment.
struct Segment {
    /// Its valid records.
    records: Vec<Vec<u8>>,
    /// The length of its valid prefix.
    good: u64,
    /// Bytes after that prefix.
    dropped: u64,
    /// Whether a valid frame follows the damage (not a torn tail).
    damaged_inside: bool,
}

/// The frames of one WAL segment.
fn read_segment(storage: &dyn Storage, name: &str) -> Result<Segment, JournalError> {
    let data = storage
        .read(name)
        .doing(|| format!("cannot read {name} in {}", storage.describe()))?;
    if data.len() < HEADER_LEN as usize || &data[..8] != WAL_MAGIC {
        // A segment created but not yet given its header by a crash, or a
        // damaged header.
        return Ok(Segment {
            records: Vec::new(),
            good: 0,
            dropped: data.len() as u64,
            damaged_inside: valid_frame_after(&data, 0),
        });
    }
    let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    if version > WAL_VERSION {
        return Err(JournalError::NewerLog {
            dir: storage.describe(),
            file: name.to_string(),
            version,
        });
    }
    let mut pos = HEADER_LEN as usize;
    let mut records = Vec::new();
    while data.len() - pos >= 8 {
        let len =
            u32::from_le_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let crc = u32::from_le_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
        // The smallest record is 6 bytes: a shorter frame (a zero-filled
        // tail after a machine crash) is torn, not an empty record.
        if len < 6 {
            break;
        }
        let Some(record) = data.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crc32fast::hash(record) != crc {
            break;
        }
        records.push(record.to_vec());
        pos += 8 + len;
    }
    // The zeros a segment is filled with ahead of its records are its end.
    let end = if zero_tail(&data[pos..]) {
        pos
    } else {
        data.len()
    };
    Ok(Segment {
        records,
        good: pos as u64,
        dropped: (end - pos) as u64,
        damaged_inside: pos < end && valid_frame_after(&data, pos),
    })
}

impl Journal {
    /// Opens (creating if needed) `dir`, recovers the store it holds and
    /// returns both. Keys expired by `clock` are expired at once (their
    /// records are logged before this returns).
    pub fn open(
        runtime: &Runtime,
        config: &Config,
        dir: &Path,
        fsync: Fsync,
        policy: SnapshotPolicy,
        clock: &dyn Clock,
        on_damage: OnDamage,
    ) -> Result<(Journal, WasmStore, Recovery), JournalError> {
        let storage = DirStorage::open(dir).doing(|| format!("cannot create {}", dir.display()))?;
        Journal::open_in(
            Arc::new(storage),
            runtime,
            config,
            fsync,
            policy,
            clock,
            on_damage,
        )
    }

    /// [`Journal::open`] on any [`Storage`].
    pub fn open_in(
        storage: Arc<dyn Storage>,
        runtime: &Runtime,
        config: &Config,
        fsync: Fsync,
        policy: SnapshotPolicy,
        clock: &dyn Clock,
        on_damage: OnDamage,
    ) -> Result<(Journal, WasmStore, Recovery), JournalError> {
        match storage.lock() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(JournalError::InUse(storage.describe()));
            }
            Err(e) => return Err(e).doing(|| format!("cannot lock {}", storage.describe())),
        }
        // Left by a snapshot write that did not finish.
        for name in storage
            .list()
            .doing(|| format!("cannot read {}", storage.describe()))?
        {
            if name.ends_with(".tmp") {
                let _ = storage.remove(&name);
            }
        }
        let (mut store, recovery, last_seq, repairs) =
            recover_with_repairs(runtime, config, &*storage, on_damage)?;
        // Make the damaged tail clean (shrinking needs no free space), and
        // keep what followed it aside rather than delete it. The copies and
        // the moves come first: a crash between two repairs must never
        // leave a cut segment with the segments after it still in the log.
        let mut repairs = repairs;
        repairs.sort_by_key(|r| match r {
            Repair::CopyAside(_) => 0,
            Repair::MoveAside(_) => 1,
            Repair::Truncate(..) => 2,
        });
        for repair in repairs {
            match repair {
                Repair::CopyAside(name) => {
                    let aside = format!("{name}.damaged");
                    storage
                        .read(&name)
                        .and_then(|bytes| storage.write_atomic(&aside, &bytes))
                        .doing(|| format!("cannot copy {name} aside in {}", storage.describe()))?;
                    warn!(file = %aside, dir = %storage.describe(), "kept the damaged segment as it was");
                }
                Repair::Truncate(name, len) => {
                    storage.truncate(&name, len).doing(|| {
                        format!(
                            "cannot cut the damaged tail of {name} in {}",
                            storage.describe()
                        )
                    })?;
                    warn!(file = %name, dir = %storage.describe(), "cut the damaged tail");
                }
                Repair::MoveAside(name) => {
                    let aside = format!("{name}.dropped");
                    storage
                        .rename(&name, &aside)
                        .doing(|| format!("cannot move {name} aside in {}", storage.describe()))?;
                    warn!(file = %aside, dir = %storage.describe(), "kept a log segment that followed damage aside");
                }
            }
        }
        let seq = last_seq + 1;
        // On a full disk the store still starts and serves reads; writes
        // fail (500) until there is room for the segment.
        let (file, len) = match new_segment(&*storage, seq) {
            Ok((file, len)) => (Some(file), len),
            Err(e) if no_space(&e) => {
                warn!(dir = %storage.describe(), error = %e, "no room to start a log segment: serving reads; every write fails until there is space");
                (None, HEADER_LEN)
            }
            Err(e) => return Err(e),
        };
        let mut journal = Journal {
            storage,
            fsync,
            policy,
            seq,
            file,
            len,
            logged_since_snapshot: 0,
            last_snapshot: Instant::now(),
            last_snapshot_len: 0,
            follow_snapshot: None,
            snapshot_backoff: None,
            snapshots_failed: 0,
            append_failed: false,
            dirty: Arc::new(AtomicBool::new(false)),
            sync_target: Arc::new(Mutex::new(None)),
            syncing: false,
            runtime: runtime.clone(),
            config: config.clone(),
            pending_snapshot: None,
            broken: false,
            on_damage,
            metrics: None,
        };
        // Start from a fresh snapshot when there is room for one, so that
        // old files can go; on a full disk carry on with the old ones.
        if let Err(e) = journal.write_snapshot_now(&mut store) {
            warn!(error = %format!("{e:#}"), "cannot write a snapshot at start; keeping the existing snapshot and log");
        }
        let outputs = store
            .timeout_bulk(clock.now_ms())
            .map_err(|source| JournalError::Guest {
                what: "cannot expire the keys that expired while the store was down".into(),
                source,
            })?;
        // Expiry answers nobody: only its records matter.
        let (records, _) = split_records(outputs);
        let describe = journal.storage.describe();
        match journal.append(&records) {
            Ok(()) => {}
            // They expire again at the next start: their deadlines passed.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                ) =>
            {
                warn!(dir = %describe, error = %e, "no room to log the expiry of keys that expired while down");
            }
            Err(e) => return Err(e).doing(|| format!("cannot write the log in {describe}")),
        }
        if fsync == Fsync::Everysec {
            journal
                .start_syncer()
                .doing(|| format!("cannot start the background fsync of {describe}"))?;
        }
        Ok((journal, store, recovery))
    }

    /// Appends records; under `Fsync::Always` they are on disk when this
    /// returns. On error nothing of this call stays in the log.
    pub fn append(&mut self, records: &[Vec<u8>]) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let written = self.append_records(records);
        self.append_failed = written.is_err();
        written
    }

    /// Counts appends, fsyncs and snapshots in `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: crate::metrics::JournalMetrics) {
        self.metrics = Some(metrics);
    }

    /// Whether the last [`Journal::append`] failed (the disk is full or
    /// failing): work that would only fail again should wait.
    pub fn last_append_failed(&self) -> bool {
        self.append_failed
    }

    /// Snapshots that failed since the journal opened.
    pub fn snapshots_failed(&self) -> u64 {
        self.snapshots_failed
    }

    /// A snapshot failed: the next attempt waits, twice as long each time.
    pub fn snapshot_failed(&mut self) {
        self.snapshots_failed += 1;
        let wait = match self.snapshot_backoff {
            None => self.policy.retry_after,
            Some((_, last)) => (last * 2).min(SNAPSHOT_BACKOFF_MAX),
        };
        warn!(
            retry_in_s = wait.as_secs(),
            "snapshot failed; the log keeps everything, next attempt after a pause"
        );
        self.snapshot_backoff = Some((Instant::now() + wait, wait));
    }

    fn append_records(&mut self, records: &[Vec<u8>]) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "the journal is unusable after an earlier write error; restart the server",
            ));
        }
        let mut buf = Vec::with_capacity(records.iter().map(|r| r.len() + 8).sum());
        for r in records {
            let len = u32::try_from(r.len()).map_err(|_| io::Error::other("record too large"))?;
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&crc32fast::hash(r).to_le_bytes());
            buf.extend_from_slice(r);
        }
        if self.file.is_none() {
            // The disk had no room for a segment: try again now.
            let (file, len) = new_segment(&*self.storage, self.seq).map_err(|e| match e {
                JournalError::Io { source, .. } => source,
                other => io::Error::other(other.to_string()),
            })?;
            self.set_file(file, len);
        }
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::other("no log segment"));
        };
        let fsync_time = self.metrics.as_ref().map(|m| m.fsync.clone());
        let written = file.append(&buf).and_then(|()| match self.fsync {
            Fsync::Always => {
                let start = Instant::now();
                let synced = file.sync();
                if let Some(h) = &fsync_time {
                    h.observe(start.elapsed().as_secs_f64());
                }
                synced
            }
            Fsync::Everysec => {
                self.dirty.store(true, Ordering::Release);
                Ok(())
            }
            Fsync::No => Ok(()),
        });
        if let Err(e) = written {
            // Take back whatever part of it reached the file, and write the
            // next batch exactly where this one started.
            let undone = file.set_len(self.len).and_then(|()| match self.fsync {
                Fsync::No => Ok(()),
                _ => file.sync(),
            });
            if let Err(t) = undone {
                warn!(error = %t, "cannot take back a failed log write: refusing further writes");
                self.broken = true;
            }
            return Err(e);
        }
        self.len += buf.len() as u64;
        self.logged_since_snapshot += buf.len() as u64;
        if let Some(m) = &self.metrics {
            m.records.inc_by(records.len() as u64);
            m.bytes.inc_by(buf.len() as u64);
        }
        Ok(())
    }

    /// Lets the log grow as long as the last snapshot (up to `cap` bytes)
    /// before the next snapshot, when that is longer than the policy's
    /// `max_log_bytes`: a snapshot costs its length to take, so a log at
    /// least as long costs at most one byte of snapshot per byte logged. For
    /// a memory journal, whose short log would otherwise take a snapshot
    /// holding the whole dedup cache (up to 32 MiB) every 16 MiB of log.
    pub fn follow_snapshot_size(&mut self, cap: u64) {
        self.follow_snapshot = Some(cap);
    }

    /// The log's length at which a snapshot is due.
    fn log_limit(&self) -> u64 {
        let base = self.policy.max_log_bytes;
        self.follow_snapshot
            .map_or(base, |cap| base.max(self.last_snapshot_len.min(cap)))
    }

    /// Whether a snapshot is due by size or time.
    pub fn snapshot_due(&mut self) -> bool {
        self.finish_snapshot();
        if self
            .snapshot_backoff
            .is_some_and(|(not_before, _)| Instant::now() < not_before)
        {
            return false;
        }
        self.pending_snapshot.is_none()
            && (self.logged_since_snapshot >= self.log_limit()
                || (self.logged_since_snapshot > 0
                    && self.last_snapshot.elapsed() >= self.policy.max_interval))
    }

    /// Takes a snapshot of `store` now, starts a new log segment, and writes
    /// the snapshot file in the background.
    pub fn snapshot(&mut self, store: &mut WasmStore) -> Result<(), JournalError> {
        let start = Instant::now();
        let timer = self.metrics.as_ref().map(|m| m.snapshot.clone());
        let observe = move |ok: bool| {
            if let (true, Some(h)) = (ok, &timer) {
                h.observe(start.elapsed().as_secs_f64());
            }
        };
        let bytes = self.take_snapshot(store)?;
        self.last_snapshot_len = bytes.len() as u64;
        let seq = self.switch_segment()?;
        let storage = self.storage.clone();
        if !storage.writes_in_background() {
            // In memory: now, and the older snapshot and log go now too.
            match storage.write_atomic_owned(&snapshot_name(seq), bytes) {
                Ok(()) => {
                    observe(true);
                    self.snapshot_backoff = None;
                    self.cleanup(seq);
                }
                Err(e) => {
                    warn!(error = %e, "cannot write the snapshot");
                    self.snapshot_failed();
                }
            }
            return Ok(());
        }
        let handle = std::thread::spawn(move || {
            let written = storage.write_atomic(&snapshot_name(seq), &bytes);
            observe(written.is_ok());
            written
        });
        self.pending_snapshot = Some((seq, handle));
        Ok(())
    }

    fn take_snapshot(&self, store: &mut WasmStore) -> Result<Vec<u8>, JournalError> {
        store
            .snapshot_with(SnapshotScope::Durable)
            .map_err(|source| JournalError::Guest {
                what: "cannot take a snapshot".into(),
                source,
            })
    }

    fn write_snapshot_now(&mut self, store: &mut WasmStore) -> Result<(), JournalError> {
        let bytes = self.take_snapshot(store)?;
        self.last_snapshot_len = bytes.len() as u64;
        self.storage
            .write_atomic(&snapshot_name(self.seq), &bytes)
            .doing(|| format!("cannot write a snapshot in {}", self.storage.describe()))?;
        self.cleanup(self.seq);
        self.logged_since_snapshot = 0;
        self.last_snapshot = Instant::now();
        Ok(())
    }

    fn switch_segment(&mut self) -> Result<u64, JournalError> {
        if self.fsync != Fsync::No
            && let Some(file) = self.file.as_mut()
        {
            file.sync()
                .doing(|| format!("cannot sync the log in {}", self.storage.describe()))?;
        }
        let seq = self.seq + 1;
        let (file, len) = new_segment(&*self.storage, seq)?;
        self.set_file(file, len);
        self.seq = seq;
        self.logged_since_snapshot = 0;
        self.last_snapshot = Instant::now();
        Ok(seq)
    }

    /// Makes `file` the active segment (and the syncer's).
    fn set_file(&mut self, file: Box<dyn LogFile>, len: u64) {
        if self.syncing
            && let Ok(mut target) = self.sync_target.lock()
        {
            *target = file.try_clone().ok();
        }
        self.file = Some(file);
        self.len = len;
    }

    /// Collects a finished background snapshot and deletes what it replaces.
    fn finish_snapshot(&mut self) {
        let done = self
            .pending_snapshot
            .as_ref()
            .is_some_and(|(_, h)| h.is_finished());
        if !done {
            return;
        }
        if let Some((seq, handle)) = self.pending_snapshot.take() {
            match handle.join() {
                Ok(Ok(())) => {
                    self.snapshot_backoff = None;
                    self.cleanup(seq);
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot write the snapshot file");
                    self.snapshot_failed();
                }
                Err(_) => {
                    warn!("the snapshot writer panicked");
                    self.snapshot_failed();
                }
            }
        }
    }

    /// Deletes snapshots and segments older than `seq`.
    fn cleanup(&self, seq: u64) {
        for (prefix, ext) in [("snapshot", "snap"), ("wal", "log")] {
            if let Ok(files) = list(&*self.storage, prefix, ext) {
                for (s, name) in files {
                    if s < seq {
                        let _ = self.storage.remove(&name);
                    }
                }
            }
        }
    }

    fn start_syncer(&mut self) -> io::Result<()> {
        self.syncing = true;
        *self
            .sync_target
            .lock()
            .map_err(|_| io::Error::other("the syncer's lock is poisoned"))? = match &self.file {
            Some(f) => Some(f.try_clone()?),
            None => None,
        };
        let target = Arc::downgrade(&self.sync_target);
        let dirty = self.dirty.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(target) = target.upgrade() else {
                    return;
                }; // the journal is gone
                if dirty.swap(false, Ordering::AcqRel)
                    && let Ok(mut guard) = target.lock()
                    && let Some(file) = guard.as_mut()
                    && let Err(e) = file.sync()
                {
                    warn!(error = %e, "background fsync failed");
                }
            }
        });
        Ok(())
    }

    /// The store as the disk has it (after a failed write: nothing of the
    /// failed batch).
    pub fn reload(&self) -> Result<WasmStore, JournalError> {
        let (store, _, _) = recover(&self.runtime, &self.config, &*self.storage, self.on_damage)?;
        Ok(store)
    }

    /// Makes [`Journal::reload`] and snapshots use `runtime` (a new build
    /// of the component, or new limits) and `config` from now on.
    pub fn set_runtime(&mut self, runtime: Runtime, config: Config) {
        self.runtime = runtime;
        self.config = config;
    }

    /// Where the journal's files are, for messages.
    pub fn describe(&self) -> String {
        self.storage.describe()
    }
}

/// What a journal made durable when it closed: [`Journal::flush`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushReport {
    /// Where its files are.
    pub dir: String,
    /// Bytes of the active log segment, all synced now.
    pub log_bytes: u64,
    /// Bytes logged since the last snapshot (what a restart replays).
    pub since_snapshot: u64,
    /// Whether a snapshot still being written was waited for.
    pub snapshot_finished: bool,
}

impl Journal {
    /// Waits for a snapshot being written, syncs the log (whatever the
    /// fsync policy: a clean shutdown leaves nothing in the page cache
    /// only) and says what is on disk: a graceful shutdown's report.
    pub fn flush(&mut self) -> io::Result<FlushReport> {
        let snapshot_finished = match self.pending_snapshot.take() {
            Some((seq, handle)) => {
                if let Ok(Ok(())) = handle.join() {
                    self.cleanup(seq);
                }
                true
            }
            None => false,
        };
        if let Some(file) = self.file.as_mut() {
            file.sync()?;
        }
        self.storage.sync_dir()?;
        Ok(FlushReport {
            dir: self.storage.describe(),
            log_bytes: self.len,
            since_snapshot: self.logged_since_snapshot,
            snapshot_finished,
        })
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        if let Some((_, handle)) = self.pending_snapshot.take() {
            let _ = handle.join();
        }
        if self.fsync != Fsync::No
            && let Some(file) = self.file.as_mut()
        {
            let _ = file.sync();
        }
        self.storage.unlock();
    }
}

/// Whether an error is the disk (or the user's quota) being full.
fn no_space(e: &JournalError) -> bool {
    matches!(e, JournalError::Io { source, .. }
        if matches!(source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
}

/// A segment grows in zero-filled steps of this ([`LogFile::zero_fill_ahead`]):
/// an `fdatasync` of records written over zeros does not change the file's
/// length.
const SEGMENT_STEP: u64 = 64 << 10;

fn new_segment(storage: &dyn Storage, seq: u64) -> Result<(Box<dyn LogFile>, u64), JournalError> {
    let name = wal_name(seq);
    let context = || format!("cannot create {name} in {}", storage.describe());
    let mut file = storage.create(&name).doing(context)?;
    file.zero_fill_ahead(SEGMENT_STEP);
    let mut header = WAL_MAGIC.to_vec();
    header.extend_from_slice(&WAL_VERSION.to_le_bytes());
    file.append(&header)
        .and_then(|()| file.sync())
        .and_then(|()| storage.sync_dir())
        .doing(context)?;
    Ok((file, HEADER_LEN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_chunks_are_bounded_in_count_and_bytes() {
        let small: Vec<Vec<u8>> = (0..3000).map(|_| vec![0; 10]).collect();
        let sizes: Vec<usize> = replay_chunks(&small).map(<[_]>::len).collect();
        assert_eq!(sizes, [1024, 1024, 952]);
        let big: Vec<Vec<u8>> = (0..5).map(|_| vec![0; 3 << 20]).collect();
        let sizes: Vec<usize> = replay_chunks(&big).map(<[_]>::len).collect();
        assert_eq!(sizes, [1, 1, 1, 1, 1], "two would pass 4 MiB");
        let huge = vec![vec![0; 9 << 20], vec![0; 1]];
        let sizes: Vec<usize> = replay_chunks(&huge).map(<[_]>::len).collect();
        assert_eq!(sizes, [1, 1], "a record larger than a chunk goes alone");
        assert_eq!(replay_chunks(&[]).count(), 0);
    }
}
