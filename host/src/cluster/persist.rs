//! A round's syncs: what a round of readies wrote is made durable before
//! anything that depends on it is sent, in three steps so that a server can
//! run the syncs on another thread ([`round_to_sync`], [`sync_files`],
//! [`round_synced`]); [`persist_round`] does all three in place.

use anyhow::Result;

use super::Replica;
use crate::Backend;
use crate::cluster::log::journal::Journal;

/// The middle step of a round of readies of a replica's groups: makes what
/// [`Replica::ready_write`] wrote durable before anything that depends on it
/// is sent. With a round journal (partitions, `--fsync always`), every
/// group's records in one write and one sync; else, under `--fsync always`,
/// each log that was written (`replicas`: each group's, in order, and
/// whether it wrote this round what must be synced, [`Unsynced::must_sync`]).
/// A round that moved only commit indexes syncs nothing: its records go
/// with the next round that syncs. The syncs run on the caller's thread
/// here; a server runs them elsewhere between [`round_to_sync`] and
/// [`round_synced`] (the simulation here).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn persist_round<B: Backend>(
    mut journal: Option<&mut Journal>,
    replicas: &mut [(u32, &mut Replica<B>, bool)],
) -> Result<()> {
    let mut round = round_to_sync(journal.as_deref_mut(), replicas)?;
    let started = std::time::Instant::now();
    anyhow::Context::context(sync_files(&mut round.files), "syncing the Raft log")?;
    round_synced(journal, replicas, &round, started.elapsed())
}

/// What a round must sync ([`round_to_sync`]).
pub(crate) struct RoundFiles {
    /// The handles to sync: the round journal's (one, if the round wrote to
    /// it), or each group's log's, in order (`None`: nothing to sync).
    pub(crate) files: Vec<Option<Box<dyn crate::store::storage::LogFile>>>,
    /// Without a journal, per group: whether its log is told of the sync.
    syncing: Vec<bool>,
}

/// [`persist_round`]'s first step: what the round wrote is appended (to the
/// round journal) and the files to sync are named; nothing is written to
/// the logs until [`round_synced`].
pub(crate) fn round_to_sync<B: Backend>(
    journal: Option<&mut Journal>,
    replicas: &mut [(u32, &mut Replica<B>, bool)],
) -> Result<RoundFiles> {
    let mut round = RoundFiles {
        files: Vec::new(),
        syncing: Vec::new(),
    };
    match journal {
        Some(journal) => {
            if replicas.iter().any(|(_, _, written)| *written) {
                let logs = replicas.iter_mut().map(|(g, r, _)| (*g, r.log_mut()));
                round.files.push(journal.write_round(logs)?);
            }
        }
        None => {
            for (_, r, written) in replicas.iter_mut() {
                let syncing = *written && r.syncs_each_write();
                round.syncing.push(syncing);
                round.files.push(match syncing {
                    true => r.log_mut().entries_to_sync()?,
                    false => None,
                });
            }
        }
    }
    Ok(round)
}

/// Syncs each of `files`.
pub(crate) fn sync_files(
    files: &mut [Option<Box<dyn crate::store::storage::LogFile>>],
) -> std::io::Result<()> {
    files.iter_mut().flatten().try_for_each(|f| f.sync())
}

/// [`persist_round`]'s last step, once `round`'s files are synced (in
/// `took`).
pub(crate) fn round_synced<B: Backend>(
    journal: Option<&mut Journal>,
    replicas: &mut [(u32, &mut Replica<B>, bool)],
    round: &RoundFiles,
    took: std::time::Duration,
) -> Result<()> {
    if let Some(journal) = journal {
        if round.files.iter().any(Option::is_some) {
            journal.round_synced(took);
        }
        return Ok(());
    }
    let each = round.syncing.iter().zip(&round.files);
    for ((_, r, _), (&syncing, file)) in replicas.iter_mut().zip(each) {
        if syncing {
            r.log_mut().entries_synced(file.is_some().then_some(took))?;
        }
    }
    Ok(())
}
