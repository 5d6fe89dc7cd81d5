//! A poison entry: one whose requests make the guest fail (a trap, its
//! fuel, its memory cap) fails alike on every replica, since a replica's
//! guest counts its work in fuel, not time. Each replica makes its guest
//! again without the requests that fail, and goes on.

use anyhow::{Context as _, Result, bail};
use raft::prelude::EntryType;
use statestore_guest::wire;

use super::{FailedInputs, Replica, decode_entry, decode_host_entry, decode_snapshot, whole};
use crate::{Backend, Output};

impl<B: Backend> Replica<B> {
    /// The guest failed applying entry `index` (it trapped, ran out of
    /// fuel, or reached its memory cap): a poison entry, which fails alike
    /// on every replica, since a replica's guest counts its work in fuel,
    /// not time. The guest is made again as it was before the entry (from
    /// the last snapshot and the log), and the entry's inputs are applied
    /// one at a time; one that fails again is skipped (the guest made again
    /// without it) and answered 500. Every replica does the same, so all go
    /// on alike where one failure would otherwise stop them all.
    pub(super) fn recover(
        &mut self,
        index: u64,
        batch: &[u8],
        now: u64,
        cause: &crate::GuestError,
    ) -> Result<(Vec<Output>, FailedInputs)> {
        let why = format!("{cause:#}");
        tracing::error!(index, error = %why, "the guest failed applying a log entry: making it again from the last snapshot and the log, then applying the entry's requests one at a time");
        let singles = wire::batch_singles(batch).context("the entry's batch")?;
        let mut passed: Vec<&[u8]> = Vec::new();
        let mut outputs = Vec::new();
        let mut failed = Vec::new();
        let mut positions = Vec::new();
        self.store = self.remake(index, &passed, now)?;
        for (at, one) in singles.iter().enumerate() {
            match whole(&mut self.store, one, |s, b| s.handle_wire(b, now)) {
                Ok(out) => {
                    outputs.extend(out);
                    passed.push(one);
                }
                Err(err) => {
                    self.store = self.remake(index, &passed, now)?;
                    // Its own failure (the entry's may have been another's).
                    let why = format!("{err:#}");
                    tracing::error!(index, error = %why, "a request the guest fails on: skipped, answered 500");
                    failed.push((one.clone(), why));
                    positions.push(at);
                }
            }
        }
        self.poisoned.insert(index, positions);
        Ok((outputs, failed))
    }

    /// A guest as this replica's was after the entries before `index`,
    /// and then `more` (batches of entry `index`, at `now`): made from the
    /// last snapshot, with the committed entries after it applied again
    /// (their outputs went out when they were first applied).
    fn remake(&mut self, index: u64, more: &[&[u8]], now: u64) -> Result<B> {
        let log = self.node.store();
        let (mut guest, from, mut at) = match raft::Storage::snapshot(log, 0, 0) {
            Ok(s) if s.get_metadata().index > 0 => {
                let d = decode_snapshot(&s.data)?;
                (
                    (self.make)(Some(d.guest))?,
                    s.get_metadata().index,
                    d.applied_now,
                )
            }
            _ => ((self.make)(None)?, 0, 0),
        };
        if from >= index {
            bail!("the snapshot (index {from}) is past the entry that failed ({index})");
        }
        let entries = if from + 1 < index {
            raft::Storage::entries(
                log,
                from + 1,
                index,
                None,
                raft::GetEntriesContext::empty(false),
            )
            .context("reading the log to make the guest again")?
        } else {
            Vec::new()
        };
        for entry in entries {
            if entry.get_entry_type() != EntryType::EntryNormal
                || entry.data.is_empty()
                || decode_host_entry(&entry.data).is_some()
            {
                continue;
            }
            let e =
                decode_entry(&entry.data).with_context(|| format!("log entry {}", entry.index))?;
            at = e.now.max(at);
            // As it was applied: whole, or (a poison entry) one input at a
            // time without those that failed.
            let batches: Vec<Vec<u8>> = match self.poisoned.get(&entry.index) {
                None => vec![e.batch.to_vec()],
                Some(skip) => wire::batch_singles(e.batch)?
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !skip.contains(i))
                    .map(|(_, b)| b)
                    .collect(),
            };
            for b in &batches {
                match whole(&mut guest, b, |s, b| s.handle_wire(b, at)) {
                    Ok(_) | Err(crate::GuestError::Refused(_)) => {}
                    // It passed the first time: failing now is not
                    // deterministic, and going on could diverge.
                    Err(err) => {
                        return Err(anyhow::Error::from(err).context(format!(
                            "log entry {} failed when applied again (it had not)",
                            entry.index
                        )));
                    }
                }
            }
        }
        for b in more {
            whole(&mut guest, b, |s, b| s.handle_wire(b, now))
                .context("a request of the failed entry, applied again")?;
        }
        Ok(guest)
    }
}
