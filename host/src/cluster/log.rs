//! A replica's Raft log and state on disk (through [`crate::storage`], so a
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
//! ```
//!
//! Records are appended as Raft hands them over; [`LogStore::sync`] makes
//! them durable, and a replica sends what depends on them (its votes, its
//! acknowledgements of entries) only after that under `--fsync always`.
//! Compaction (after a snapshot) and installing a leader's snapshot write a
//! new generation holding what is left, then switch `raft-log.current` to
//! it: a crash leaves the old generation or the new one.
//!
//! Recovery reads the snapshot, then the current generation's records in
//! order. A record cut short or failing its checksum at the end of the file
//! is a torn tail (written, never synced, so never acknowledged): it is cut
//! off. One followed by good records is damage, and the replica refuses to
//! start (replace it: README, "Replacing a replica").

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage as _};

use crate::storage::{LogFile, Storage};

const SNAPSHOT: &str = "raft-snapshot";
const CURRENT: &str = "raft-log.current";
const CONF: &str = "raft-conf";
const KIND_ENTRY: u8 = 1;
const KIND_HARD_STATE: u8 = 2;

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
    /// Where the good records end (a torn tail starts there).
    good: usize,
}

fn parse(data: &[u8], name: &str) -> Result<Parsed> {
    let mut records = Vec::new();
    let mut p = 0;
    while p < data.len() {
        let bad = |p: usize| -> Result<Parsed> {
            // A bad record with a good one after it is damage, not a tear.
            if next_good(data, p + 1) {
                bail!(
                    "the Raft log {name} is damaged at byte {p} (good records follow): refusing to start; replace this replica (README, \"Replacing a replica\")"
                );
            }
            Ok(Parsed {
                records: Vec::new(),
                good: p,
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
    Ok(Parsed { records, good: p })
}

/// Whether a good record starts anywhere at or after `from`.
fn next_good(data: &[u8], from: usize) -> bool {
    (from..data.len().saturating_sub(9)).any(|p| {
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(data[p + 4..p + 8].try_into().expect("4"));
        len > 1
            && data.len() - p - 8 >= len
            && matches!(data[p + 8], KIND_ENTRY | KIND_HARD_STATE)
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
        disk.lock()
            .with_context(|| format!("{} is in use by another process", disk.describe()))?;
        let names = disk.list().context("listing the Raft log")?;
        let mem;
        let mut snapshot = Snapshot::default();
        if names.iter().any(|n| n == SNAPSHOT) {
            let bytes = disk.read(SNAPSHOT).context("reading the Raft snapshot")?;
            snapshot = Snapshot::parse_from_bytes(&bytes).context("the Raft snapshot")?;
            mem = MemStorage::new();
            mem.wl()
                .apply_snapshot(snapshot.clone())
                .context("loading the Raft snapshot")?;
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
        let mut generation = 0;
        if names.iter().any(|n| n == CURRENT) {
            let bytes = disk.read(CURRENT).context("reading raft-log.current")?;
            generation = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .context("raft-log.current is not a generation number")?;
        }
        let name = log_name(generation);
        if names.contains(&name) {
            let data = disk
                .read(&name)
                .with_context(|| format!("reading {name}"))?;
            let parsed = parse(&data, &name)?;
            if parsed.good < data.len() {
                tracing::warn!(file = %name, at = parsed.good, cut = data.len() - parsed.good, "a torn tail of the Raft log (never synced, so never acknowledged): cut off");
            }
            let snap_index = snapshot.get_metadata().index;
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
        }
        // A commit index past the log (never the case when written in order)
        // would stop raft-rs: clamp it.
        {
            let last = mem.last_index()?;
            let mut core = mem.wl();
            if core.hard_state().commit > last {
                core.mut_hard_state().commit = last;
            }
        }
        // What was read becomes a new generation (the torn tail left out).
        let (file, bytes) = write_generation(&*disk, &mem, generation + 1)?;
        if names.contains(&name)
            && let Err(e) = disk.remove(&name)
        {
            tracing::warn!(file = %name, error = %e, "could not remove an old Raft log");
        }
        Ok(LogStore {
            mem,
            disk,
            generation: generation + 1,
            file,
            bytes,
            dirty: false,
            snapshot,
            metrics: None,
        })
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

    /// Records the hard state (term, vote, commit).
    pub fn set_hardstate(&mut self, hs: HardState) -> Result<()> {
        let mut buf = Vec::new();
        frame(KIND_HARD_STATE, &hs.write_to_bytes()?, &mut buf);
        self.mem.wl().set_hardstate(hs);
        self.write(&buf, 1)
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
        if let Some(m) = &self.metrics {
            m.records.inc_by(records as u64);
            m.bytes.inc_by(buf.len() as u64);
        }
        Ok(())
    }

    /// Makes everything written so far durable.
    pub fn sync(&mut self) -> Result<()> {
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

    /// Keeps `data`, the state after applying entry `index`, as the
    /// snapshot, and drops the entries before `index` from the log.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<()> {
        let term = self.mem.term(index).context("the term of a snapshot")?;
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.mem.initial_state()?.conf_state);
        let mut snap = Snapshot::default();
        snap.set_metadata(meta);
        snap.data = data.into();
        self.disk
            .write_atomic(SNAPSHOT, &snap.write_to_bytes()?)
            .context("writing the Raft snapshot")?;
        self.snapshot = snap;
        self.mem.wl().compact(index).context("compacting")?;
        self.rewrite()
    }

    /// Installs a leader's snapshot (the log before it is dropped).
    pub fn install(&mut self, snap: Snapshot) -> Result<()> {
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
        if let Err(e) = self.disk.remove(&old) {
            tracing::warn!(file = %old, error = %e, "could not remove an old Raft log");
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage as Disk;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: format!("entry {index}").into_bytes().into(),
            ..Default::default()
        }
    }

    fn open(disk: &Disk) -> Result<LogStore> {
        LogStore::open(Arc::new(disk.clone()), &[1, 2, 3])
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..Default::default()
        }
    }

    fn voters(log: &LogStore) -> Vec<u64> {
        log.initial_state().expect("state").conf_state.voters
    }

    /// The membership a log starts with is its own: a cluster file that
    /// lists other replicas later does not change it (the log's changes
    /// apply to it), and a replica that joins starts with none.
    #[test]
    fn the_membership_a_log_starts_with_is_kept() {
        let disk = Disk::new();
        let log = open(&disk).expect("open");
        assert_eq!(voters(&log), [1, 2, 3]);
        drop(log);
        let log = LogStore::open(Arc::new(disk.crash(None)), &[1, 2, 4]).expect("reopen");
        assert_eq!(voters(&log), [1, 2, 3]);
        let joining = Disk::new();
        let log = LogStore::open(Arc::new(joining.clone()), &[]).expect("open");
        assert!(voters(&log).is_empty());
        drop(log);
        let log = LogStore::open(Arc::new(joining.crash(None)), &[1, 2, 3]).expect("reopen");
        assert!(voters(&log).is_empty(), "still joining");
    }

    #[test]
    fn what_was_synced_survives_a_crash_and_a_torn_tail_is_cut() {
        let disk = Disk::new();
        let mut log = open(&disk).expect("open");
        log.append(&[entry(1, 1), entry(2, 1)]).expect("append");
        log.set_hardstate(hs(1, 2, 1)).expect("hs");
        log.sync().expect("sync");
        log.append(&[entry(3, 1)]).expect("append"); // never synced
        for torn in [0, 5, 9, 15] {
            let after = disk.crash(Some(torn));
            let back = open(&after).expect("reopen");
            assert_eq!(back.mem.last_index().expect("last"), 2, "torn {torn}");
            assert_eq!(back.hard_state(), hs(1, 2, 1));
            assert_eq!(
                back.mem
                    .entries(1, 3, None, GetEntriesContext::empty(false))
                    .expect("e"),
                vec![entry(1, 1), entry(2, 1)]
            );
        }
        // All of it written: all of it back.
        let whole = disk.crash(Some(usize::MAX));
        assert_eq!(
            open(&whole)
                .expect("reopen")
                .mem
                .last_index()
                .expect("last"),
            3
        );
    }

    #[test]
    fn a_conflicting_tail_is_replaced_on_replay() {
        let disk = Disk::new();
        let mut log = open(&disk).expect("open");
        log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
            .expect("append");
        log.append(&[entry(2, 2)]).expect("a new leader's entry 2");
        log.sync().expect("sync");
        let back = open(&disk.crash(None)).expect("reopen");
        assert_eq!(back.mem.last_index().expect("last"), 2);
        assert_eq!(back.mem.term(2).expect("term"), 2);
    }

    #[test]
    fn damage_before_the_end_is_refused() {
        let disk = Disk::new();
        let mut log = open(&disk).expect("open");
        log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
            .expect("append");
        log.sync().expect("sync");
        let name = log_name(log.generation);
        drop(log);
        let disk = disk.crash(None);
        disk.flip_bit(&name, 12);
        let e = open(&disk).expect_err("damage").to_string();
        assert!(e.contains("damaged"), "{e}");
    }

    #[test]
    fn any_bytes_in_the_log_open_or_are_refused_never_panic() {
        let disk = Disk::new();
        let mut log = open(&disk).expect("open");
        let entries: Vec<Entry> = (1..=20).map(|i| entry(i, 1 + i / 7)).collect();
        log.append(&entries).expect("append");
        log.set_hardstate(hs(3, 1, 15)).expect("hs");
        log.sync().expect("sync");
        let name = log_name(log.generation);
        drop(log);
        let good = disk.crash(None).read(&name).expect("read");
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..500 {
            let mut bytes = good.clone();
            match round % 4 {
                0 => bytes.truncate((next() as usize) % (good.len() + 1)),
                1 => {
                    let at = (next() as usize) % bytes.len();
                    bytes[at] ^= 1 << (next() % 8);
                }
                2 => bytes = (0..next() % 300).map(|_| next() as u8).collect(),
                _ => {
                    let at = (next() as usize) % bytes.len();
                    let extra: Vec<u8> = (0..next() % 40).map(|_| next() as u8).collect();
                    bytes.splice(at..at, extra);
                }
            }
            let d = Disk::new();
            d.write_atomic(CURRENT, b"7").expect("current");
            d.write_atomic("raft-log.7", &bytes).expect("log");
            if let Ok(back) = open(&d.crash(None)) {
                // What opened is a log raft-rs can start from.
                let last = back.mem.last_index().expect("last");
                assert!(back.hard_state().commit <= last, "round {round}");
            }
        }
    }

    #[test]
    fn a_snapshot_compacts_the_log_and_is_what_a_restart_starts_from() {
        let disk = Disk::new();
        let mut log = open(&disk).expect("open");
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
        log.append(&entries).expect("append");
        log.set_hardstate(hs(1, 1, 8)).expect("hs");
        log.sync().expect("sync");
        assert!(raft::Storage::snapshot(&log, 0, 0).is_err(), "none yet");
        log.compact(8, b"state at 8".to_vec()).expect("compact");
        let snap = raft::Storage::snapshot(&log, 0, 0).expect("snapshot");
        assert_eq!(snap.get_metadata().index, 8);
        assert_eq!(&snap.data[..], b"state at 8");
        assert_eq!(log.mem.first_index().expect("first"), 8);
        let disk = disk.crash(None);
        let back = open(&disk).expect("reopen");
        assert_eq!(back.snapshot_index(), 8);
        assert_eq!(raft::Storage::term(&back, 8).expect("term"), 1);
        assert_eq!(back.mem.last_index().expect("last"), 10);
        assert_eq!(back.hard_state().commit, 8);
        assert_eq!(
            back.mem
                .entries(9, 11, None, GetEntriesContext::empty(false))
                .expect("e"),
            vec![entry(9, 1), entry(10, 1)]
        );
        // A leader's snapshot past the log replaces it.
        let mut back = back;
        let mut leaders = snap.clone();
        leaders.mut_metadata().index = 20;
        leaders.mut_metadata().term = 3;
        leaders.data = b"state at 20".to_vec().into();
        back.install(leaders).expect("install");
        let again = open(&disk.crash(None)).expect("reopen");
        assert_eq!(again.snapshot_index(), 20);
        assert_eq!(again.mem.last_index().expect("last"), 20);
        assert_eq!(again.hard_state().commit, 20);
    }
}
