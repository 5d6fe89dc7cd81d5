//! Recovery: the newest valid snapshot, the log replayed after it, and what
//! a damaged log may be repaired to (or must refuse).

use super::*;

/// What to do to a damaged log so that appending after it is safe.
pub(super) enum Repair {
    /// Keep a copy of a damaged segment, as it was, under another name.
    CopyAside(String),
    /// Cut a segment back to its valid prefix.
    Truncate(String, u64),
    /// Keep a segment that follows a damaged one, under another name.
    MoveAside(String),
}

/// Loads the newest valid snapshot and replays the log after it.
pub(super) fn recover(
    runtime: &Runtime,
    config: &Config,
    storage: &dyn Storage,
    on_damage: OnDamage,
) -> Result<(WasmStore, Recovery, u64), JournalError> {
    let (store, recovery, last_seq, _) = recover_with_repairs(runtime, config, storage, on_damage)?;
    Ok((store, recovery, last_seq))
}

pub(super) fn recover_with_repairs(
    runtime: &Runtime,
    config: &Config,
    storage: &dyn Storage,
    on_damage: OnDamage,
) -> Result<(WasmStore, Recovery, u64, Vec<Repair>), JournalError> {
    let dir = storage.describe();
    let mut repairs = Vec::new();
    let mut recovery = Recovery::default();
    let snapshots = list(storage, "snapshot", "snap")?;
    let mut store = None;
    for (seq, path) in snapshots.iter().rev() {
        let bytes = storage
            .read(path)
            .doing(|| format!("cannot read {path} in {dir}"))?;
        match runtime.restore(config, &bytes) {
            Ok(s) => {
                store = Some(s);
                recovery.snapshot_seq = Some(*seq);
                break;
            }
            Err(e) => {
                if let Some(statestore_guest::Error::UnsupportedVersion(v)) = e.downcast_ref() {
                    return Err(JournalError::NewerSnapshot {
                        dir,
                        file: path.clone(),
                        source: GuestError::Refused(statestore_guest::Error::UnsupportedVersion(
                            *v,
                        )),
                    });
                }
                warn!(file = %path, %dir, error = %format!("{e:#}"), "skipping an unreadable snapshot");
            }
        }
    }
    if store.is_none() && !snapshots.is_empty() {
        return Err(JournalError::NoLoadableSnapshot {
            dir,
            count: snapshots.len(),
        });
    }
    let mut store = match store {
        Some(s) => s,
        None => runtime
            .instantiate(config)
            .map_err(JournalError::Instance)?,
    };
    let from = recovery.snapshot_seq.unwrap_or(0);
    let mut last_seq = from;
    let segments: Vec<_> = list(storage, "wal", "log")?
        .into_iter()
        .filter(|(s, _)| *s >= from)
        .collect();
    // The log must continue the snapshot without a gap.
    let mut expect = recovery.snapshot_seq;
    for (seq, path) in &segments {
        if let Some(e) = expect
            && *seq != e
        {
            return Err(JournalError::Gap {
                dir,
                file: path.clone(),
                missing: e,
            });
        }
        expect = Some(seq + 1);
    }
    let mut damaged = false;
    for (i, (seq, path)) in segments.iter().enumerate() {
        last_seq = last_seq.max(*seq);
        if damaged {
            // Everything after a damaged frame is dropped too.
            recovery.dropped_bytes += storage.read(path).map_or(0, |d| d.len() as u64);
            repairs.push(Repair::MoveAside(path.clone()));
            continue;
        }
        let Segment {
            records,
            good,
            dropped,
            damaged_inside,
        } = read_segment(storage, path)?;
        if dropped > 0 {
            // A torn tail is the end of the log; valid records after the
            // bad frame (here or in a later segment) mean lost data.
            let mut inside = damaged_inside;
            for (_, later) in &segments[i + 1..] {
                if inside {
                    break;
                }
                inside = !read_segment(storage, later)?.records.is_empty();
            }
            if inside {
                if on_damage == OnDamage::Refuse {
                    return Err(JournalError::Damaged {
                        dir,
                        file: path.clone(),
                        offset: good,
                    });
                }
                warn!(file = %path, %dir, offset = good, "the log is damaged before its end: keeping what precedes the damage (--recover-damaged-log); the damaged segment is copied aside");
                repairs.push(Repair::CopyAside(path.clone()));
            }
        }
        for chunk in replay_chunks(&records) {
            store.replay(chunk).map_err(|source| JournalError::Guest {
                what: format!("cannot replay {dir}/{path}"),
                source,
            })?;
        }
        recovery.records += records.len() as u64;
        if dropped > 0 {
            recovery.dropped_bytes += dropped;
            damaged = true;
            repairs.push(Repair::Truncate(path.clone(), good));
        }
    }
    if recovery.dropped_bytes > 0 {
        warn!(
            dropped_bytes = recovery.dropped_bytes,
            "dropped a torn or corrupt log tail"
        );
    }
    info!(
        %dir,
        snapshot = ?recovery.snapshot_seq,
        records = recovery.records,
        dropped_bytes = recovery.dropped_bytes,
        "recovered"
    );
    Ok((store, recovery, last_seq, repairs))
}

/// The most bytes of records handed to the guest in one `replay` call: the
/// records are copied into its memory, which may be capped (a record larger
/// than this goes alone).
pub(super) const REPLAY_CHUNK_BYTES: usize = 4 << 20;

/// `records` in runs of at most 1,024 records and [`REPLAY_CHUNK_BYTES`].
pub(super) fn replay_chunks(records: &[Vec<u8>]) -> impl Iterator<Item = &[Vec<u8>]> {
    let mut rest = records;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut n = 0;
        while n < rest.len() && n < 1024 && (n == 0 || bytes + rest[n].len() <= REPLAY_CHUNK_BYTES)
        {
            bytes += rest[n].len();
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}
