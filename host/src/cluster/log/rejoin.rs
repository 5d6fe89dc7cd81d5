//! `statestore cluster rejoin`'s part in the data directory.

use anyhow::{Context as _, Result, bail};
use protobuf::Message as _;
use raft::prelude::{ConfState, HardState};

use super::{
    Anchor, CONF, CURRENT, KIND_HARD_STATE, SNAPSHOT, STATE, STATE_NEW, journal, new_state_file,
    read_anchor,
};
use crate::store::storage::Storage;

/// The data directory's part of `statestore cluster rejoin`: the replica
/// whose data directory is `disk` starts again as one joining the cluster
/// (no membership until the leader's snapshot brings it), with an empty
/// log, keeping its term and vote: it must never vote twice in one term.
/// Its log, snapshot and membership are moved aside (renamed
/// `discarded-<now_ms>.<name>`), never deleted. The cluster's part is to
/// remove the replica and add it back (the leader keeps what each replica
/// acknowledged; only a new member starts from nothing). `journal`: what
/// the replica's round journal holds of this log (a replica of several
/// groups), whose term and vote may be newer than the log's own files'.
/// Returns what it did, for the operator.
pub fn rejoin(disk: &dyn Storage, now_ms: u64, journal: &[&journal::Part]) -> Result<String> {
    disk.lock().with_context(|| {
        format!(
            "{} is in use by another process (stop the replica first)",
            disk.describe()
        )
    })?;
    let names = disk.list().context("listing the data directory")?;
    let ours = |n: &String| {
        n == SNAPSHOT
            || n == journal::JOURNAL
            || n == CURRENT
            || n == CONF
            || n == STATE
            || n == STATE_NEW
            || n.starts_with("raft-log.")
    };
    if !names.iter().any(ours) && journal.is_empty() {
        bail!(
            "{}: no Raft log here: nothing to rejoin (a new replica starts with `join = true` and an empty data directory)",
            disk.describe()
        );
    }
    // Term and vote: the newest that raft-state, any log file or the round
    // journal's parts of this log (`journal`) still have.
    let mut newest: Option<HardState> = None;
    let mut consider = |h: HardState| {
        let newer = match &newest {
            None => true,
            Some(n) => h.term > n.term || (h.term == n.term && n.vote == 0),
        };
        if newer {
            newest = Some(h);
        }
    };
    if let Ok(Some(a)) = read_anchor(disk, &names) {
        consider(HardState {
            term: a.term,
            vote: a.vote,
            ..HardState::default()
        });
    }
    for n in names
        .iter()
        .filter(|n| n.starts_with("raft-log.") && *n != CURRENT)
    {
        if let Ok(data) = disk.read(n) {
            hard_states(&data).into_iter().for_each(&mut consider);
        }
    }
    for part in journal {
        hard_states(&part.bytes).into_iter().for_each(&mut consider);
    }
    let Some(hs) = newest else {
        bail!(
            "{}: neither raft-state nor any Raft log file says which term this replica reached and whom it voted for: it cannot rejoin under its id safely (it could vote twice in one term); replace it instead: `statestore cluster remove --id <its id>`, then add a new replica under a new id (docs/src/cluster.md, \"Recovery runbook\")",
            disk.describe()
        );
    };
    let mut moved = Vec::new();
    for n in names.iter().filter(|n| ours(n)) {
        let to = format!("discarded-{now_ms}.{n}");
        disk.rename(n, &to)
            .with_context(|| format!("moving {n} aside"))?;
        moved.push(to);
    }
    disk.write_atomic(CONF, &ConfState::default().write_to_bytes()?)
        .context("writing raft-conf")?;
    let anchor = Anchor {
        term: hs.term,
        vote: hs.vote,
        ..Anchor::default()
    };
    new_state_file(disk, &anchor)?;
    disk.sync_dir().context("syncing the data directory")?;
    disk.unlock();
    Ok(format!(
        "{}: the replica will join again (term {}, vote {} kept); moved aside: {}",
        disk.describe(),
        hs.term,
        hs.vote,
        moved.join(", ")
    ))
}

/// The hard states among the good records at the start of `data` (a log
/// file's bytes, or a journal's part of one), in order.
fn hard_states(data: &[u8]) -> Vec<HardState> {
    let mut found = Vec::new();
    let mut p = 0;
    while p + 9 <= data.len() {
        let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(data[p + 4..p + 8].try_into().expect("4"));
        if len == 0 || data.len() - p - 8 < len || crc32fast::hash(&data[p + 8..p + 8 + len]) != crc
        {
            break;
        }
        if data[p + 8] == KIND_HARD_STATE
            && let Ok(h) = HardState::parse_from_bytes(&data[p + 9..p + 8 + len])
        {
            found.push(h);
        }
        p += 8 + len;
    }
    found
}
