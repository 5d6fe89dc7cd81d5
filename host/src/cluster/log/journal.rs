//! A replica's round journal: one file, one write and one sync per round
//! for all of its groups' logs.
//!
//! Under `--fsync always`, every round of a replica (the entries and hard
//! states its Raft groups have ready) must be durable before it sends what
//! depends on it. Syncing each group's log and its `raft-state` costs two
//! syncs per group per round; with partitions, the journal makes it one
//! for them all (a store of one partition keeps its two: `raft-state`
//! synced every round notices a log that lost its last round): each
//! log still appends its records to its own file, unsynced, and hands the
//! same bytes over ([`LogStore::take_part`]); the round's parts go to
//! `raft-journal` in one append and one sync ([`Journal::commit`]).
//!
//! ```text
//!   raft-journal   records (the logs' framing), kind 4: a part:
//!                    u32 group | u64 generation | u64 at | the log's bytes
//!                  (written at byte `at` of that group's generation)
//! ```
//!
//! Once the journal has grown past its checkpoint size, every log is
//! synced ([`LogStore::sync`]: its `raft-state` then records how many
//! bytes of its file are synced) and the journal starts over
//! ([`Journal::restart`]). Recovery ([`LogStore::open_with`]) reads a log's
//! file only up to what `raft-state` says was synced (past it, unsynced
//! pages may have been lost in any order), then the journal's parts of the
//! same generation, in order ([`joined`]). Parts of older generations are
//! held by the newer one (written whole and synced when it was made).
//! A journal's torn tail (a round never synced, so never acknowledged) is
//! cut off; a bad record followed by good ones is damage, and the replica
//! refuses to start. Once every log is open (each written anew and synced),
//! the journal starts over.

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};

use super::{LOG_STEP, LogStore, RECOVER, frame, parse};
use crate::store::storage::{LogFile, Storage};

/// The journal's file, in the data directory.
pub const JOURNAL: &str = "raft-journal";
/// A part of a log, in the journal.
pub(super) const KIND_PART: u8 = 4;
/// The journal is checkpointed once it holds this many bytes.
pub const CHECKPOINT_BYTES: u64 = 16 << 20;

/// Bytes a log wrote to its file, as the journal holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The log's generation (its file) they were written to.
    pub generation: u64,
    /// Where in that file they start.
    pub at: u64,
    /// Whole records of the log.
    pub bytes: Vec<u8>,
}

/// The header of a part: group, generation, at.
const HEADER: usize = 4 + 8 + 8;

/// What `disk`'s journal holds: each part with its group, in the order
/// written (`None`: there is no journal). A torn tail is left out.
pub fn read(disk: &dyn Storage) -> Result<Option<Vec<(u32, Part)>>> {
    let data = match disk.read(JOURNAL) {
        Ok(data) => data,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {JOURNAL}")),
    };
    let parsed = parse(&data, JOURNAL).with_context(|| disk.describe())?;
    if parsed.torn {
        tracing::warn!(
            file = JOURNAL,
            at = parsed.good,
            cut = data.len() - parsed.good,
            "a torn tail of the round journal (never synced, so never acknowledged): cut off"
        );
    }
    let mut parts = Vec::with_capacity(parsed.records.len());
    for (kind, body) in parsed.records {
        if kind != KIND_PART || body.len() < HEADER {
            bail!(
                "{}: {JOURNAL} holds a record of kind {kind} and {} bytes, not a part of a log: refusing to start; {RECOVER}",
                disk.describe(),
                body.len()
            );
        }
        let group = u32::from_le_bytes(body[..4].try_into().expect("4"));
        let generation = u64::from_le_bytes(body[4..12].try_into().expect("8"));
        let at = u64::from_le_bytes(body[12..20].try_into().expect("8"));
        parts.push((
            group,
            Part {
                generation,
                at,
                bytes: body[HEADER..].to_vec(),
            },
        ));
    }
    Ok(Some(parts))
}

/// Group `group`'s parts of what [`read`] found (`None`: no journal).
pub fn parts_of(found: Option<&[(u32, Part)]>, group: u32) -> Option<Vec<&Part>> {
    found.map(|all| {
        all.iter()
            .filter(|(g, _)| *g == group)
            .map(|(_, part)| part)
            .collect()
    })
}

/// Removes `disk`'s journal (a replica that syncs its logs by themselves,
/// once every log was opened: each was written anew, whole, and synced).
pub fn remove(disk: &dyn Storage) -> Result<()> {
    match disk.remove(JOURNAL) {
        Ok(()) => disk.sync_dir().context("syncing the data directory"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {JOURNAL}")),
    }
}

/// A log file's bytes as recovery reads them: up to `synced` (all of them
/// when `None`: no journal was recorded for this generation, so they were
/// synced as a whole or are cut at their first bad record), then `parts`
/// (this generation's, in order): those before the end are there already,
/// one past it would leave a hole.
pub(super) fn joined(
    mut data: Vec<u8>,
    synced: Option<u64>,
    parts: &[&Part],
    name: &str,
    where_: &str,
) -> Result<Vec<u8>> {
    let mut end = match synced {
        Some(synced) => {
            let synced = usize::try_from(synced).context("a synced length")?;
            if data.len() < synced {
                bail!(
                    "{where_}: {name} holds {} bytes, but {synced} of them had been synced (raft-state): it was cut short; committed entries may be lost: refusing to start; {RECOVER}",
                    data.len()
                );
            }
            data.truncate(synced);
            synced
        }
        None if parts.is_empty() => return Ok(data),
        None => {
            let good = parse(&data, name)?.good;
            data.truncate(good);
            good
        }
    };
    for part in parts {
        let at = usize::try_from(part.at).context("a part's place")?;
        let to = at + part.bytes.len();
        if to <= end {
            continue;
        }
        if at > end {
            bail!(
                "{where_}: the round journal continues {name} at byte {at}, but it ends at byte {end}: refusing to start; {RECOVER}"
            );
        }
        data.extend_from_slice(&part.bytes[end - at..]);
        end = to;
    }
    Ok(data)
}

/// A replica's round journal, open for appending.
pub struct Journal {
    disk: Arc<dyn Storage>,
    file: Box<dyn LogFile>,
    bytes: u64,
    checkpoint_bytes: u64,
    metrics: Option<crate::metrics::JournalMetrics>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("disk", &self.disk.describe())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Starts an empty journal in `disk` (replacing one that was read:
    /// call this once every log was opened with its parts). It is
    /// checkpointed past `checkpoint_bytes` ([`CHECKPOINT_BYTES`] in a
    /// server).
    pub fn create(disk: Arc<dyn Storage>, checkpoint_bytes: u64) -> Result<Journal> {
        let file = new_file(&*disk)?;
        Ok(Journal {
            disk,
            file,
            bytes: 0,
            checkpoint_bytes,
            metrics: None,
        })
    }

    /// Records its fsync durations in `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: crate::metrics::JournalMetrics) {
        self.metrics = Some(metrics);
    }

    /// Makes what each of `logs` (with its group) wrote since the last
    /// commit durable: one append and one sync for all of them. Whether
    /// there was anything. (Its two steps, [`Journal::write_round`] and
    /// [`Journal::round_synced`], are what a replica uses.)
    #[cfg(test)]
    pub fn commit<'a>(
        &mut self,
        logs: impl IntoIterator<Item = (u32, &'a mut LogStore)>,
    ) -> Result<bool> {
        let started = std::time::Instant::now();
        let Some(mut file) = self.write_round(logs)? else {
            return Ok(false);
        };
        file.sync()
            .with_context(|| format!("syncing {JOURNAL} in {}", self.disk.describe()))?;
        self.round_synced(started.elapsed());
        Ok(true)
    }

    /// [`Journal::commit`] with the sync left to the caller, on a thread of
    /// its choice: appends what each of `logs` wrote since the last round
    /// and returns a handle to the journal to sync (`None`: nothing was
    /// written). Then [`Journal::round_synced`].
    pub fn write_round<'a>(
        &mut self,
        logs: impl IntoIterator<Item = (u32, &'a mut LogStore)>,
    ) -> Result<Option<Box<dyn LogFile>>> {
        let mut buf = Vec::new();
        let mut body = Vec::new();
        for (group, log) in logs {
            let Some(part) = log.take_part() else {
                continue;
            };
            body.clear();
            body.extend_from_slice(&group.to_le_bytes());
            body.extend_from_slice(&part.generation.to_le_bytes());
            body.extend_from_slice(&part.at.to_le_bytes());
            body.extend_from_slice(&part.bytes);
            frame(KIND_PART, &body, &mut buf);
        }
        if buf.is_empty() {
            return Ok(None);
        }
        self.file
            .append(&buf)
            .with_context(|| format!("writing {JOURNAL} in {}", self.disk.describe()))?;
        self.bytes += buf.len() as u64;
        self.file
            .try_clone()
            .with_context(|| format!("{JOURNAL} in {}", self.disk.describe()))
            .map(Some)
    }

    /// The handle of [`Journal::write_round`] synced, in `took`.
    pub fn round_synced(&self, took: std::time::Duration) {
        if let Some(m) = &self.metrics {
            m.fsync.observe(took.as_secs_f64());
        }
    }

    /// Whether it has grown past its checkpoint size: the caller syncs
    /// every log ([`LogStore::sync`]), then calls [`Journal::restart`].
    pub fn full(&self) -> bool {
        self.bytes >= self.checkpoint_bytes
    }

    /// Once it is full ([`Journal::full`]): every one of the replica's
    /// `logs` synced (its `raft-state` then says how much of it is; on
    /// `pool` when several have something to sync), and the journal starts
    /// over.
    pub fn checkpoint(
        &mut self,
        pool: Option<&rayon::ThreadPool>,
        logs: Vec<&mut LogStore>,
    ) -> Result<()> {
        if !self.full() {
            return Ok(());
        }
        sync_together(pool, logs)?;
        self.restart()
    }

    /// Starts over, empty: every log was synced since the last commit.
    pub fn restart(&mut self) -> Result<()> {
        self.file = new_file(&*self.disk)?;
        self.bytes = 0;
        Ok(())
    }
}

/// Syncs `logs` (each its own file), in parallel on `pool` when several
/// have something to sync: the disk sees their flushes at once, not one
/// after another.
fn sync_together(pool: Option<&rayon::ThreadPool>, logs: Vec<&mut LogStore>) -> Result<()> {
    use rayon::prelude::*;
    let (mut dirty, clean): (Vec<_>, Vec<_>) = logs.into_iter().partition(|l| l.is_dirty());
    for log in clean {
        log.sync()?; // at most a `raft-state` record
    }
    match (dirty.len(), pool) {
        (0, _) => Ok(()),
        (1, _) | (_, None) => dirty.iter_mut().try_for_each(|l| l.sync()),
        (_, Some(pool)) => pool.install(|| dirty.into_par_iter().try_for_each(|l| l.sync())),
    }
}

/// An empty journal file, durably named (zero-filled ahead, so that a
/// round's sync does not change its length).
fn new_file(disk: &dyn Storage) -> Result<Box<dyn LogFile>> {
    let mut file = disk
        .create(JOURNAL)
        .with_context(|| format!("creating {JOURNAL} in {}", disk.describe()))?;
    file.zero_fill_ahead(LOG_STEP);
    file.sync()
        .with_context(|| format!("syncing {JOURNAL} in {}", disk.describe()))?;
    disk.sync_dir().context("syncing the data directory")?;
    Ok(file)
}

#[cfg(test)]
mod tests;
