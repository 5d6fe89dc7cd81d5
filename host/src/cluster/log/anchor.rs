//! `raft-state`'s records: what the log must hold ([`Anchor`]), and how
//! the file is read back.

use anyhow::{Context as _, Result, bail};

use super::{KIND_STATE, STATE};
use crate::store::storage::{Storage, zero_tail};

/// What the log must hold, kept apart from it (`raft-state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Anchor {
    /// The term and vote (Raft's hard state).
    pub term: u64,
    /// See `term`.
    pub vote: u64,
    /// The commit index.
    pub commit: u64,
    /// The last index the log held when it was last synced.
    pub last: u64,
    /// The snapshot's index (0: none).
    pub snapshot: u64,
    /// The current generation of the log.
    pub generation: u64,
    /// With a round journal ([`journal`]): how many bytes of the current
    /// generation are synced; the rest is read from the journal, never from
    /// the file (unsynced bytes may hold holes after a power loss). `None`:
    /// the whole file counts (no journal).
    pub synced: Option<u64>,
}

impl Anchor {
    const VERSION: u8 = 1;
    /// The version with [`Anchor::synced`].
    const VERSION_SYNCED: u8 = 2;

    pub(super) fn encode(&self) -> Vec<u8> {
        let version = match self.synced {
            None => Self::VERSION,
            Some(_) => Self::VERSION_SYNCED,
        };
        let mut b = vec![version];
        for v in [
            self.term,
            self.vote,
            self.commit,
            self.last,
            self.snapshot,
            self.generation,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(synced) = self.synced {
            b.extend_from_slice(&synced.to_le_bytes());
        }
        b
    }

    pub(super) fn decode(body: &[u8]) -> Result<Anchor> {
        let synced = body.first() == Some(&Self::VERSION_SYNCED);
        if !(body.len() == 49 && body[0] == Self::VERSION || body.len() == 57 && synced) {
            bail!(
                "a raft-state record of {} bytes, version {:?}",
                body.len(),
                body.first()
            );
        }
        let v = |i: usize| u64::from_le_bytes(body[1 + 8 * i..9 + 8 * i].try_into().expect("8"));
        Ok(Anchor {
            term: v(0),
            vote: v(1),
            commit: v(2),
            last: v(3),
            snapshot: v(4),
            generation: v(5),
            synced: synced.then(|| v(6)),
        })
    }
}

/// Reads `raft-state`: its last good record, if any. A torn tail was never
/// synced, so nothing depended on it; nor did records appended after the
/// last sync (the records that witness rounds, `witness`), which a machine
/// that lost power may have kept in any order: a bad record with good ones
/// after it is skipped (every record is whole on its own: the last good one
/// is the newest the file holds).
pub(super) fn read_anchor(disk: &dyn Storage, names: &[String]) -> Result<Option<Anchor>> {
    if !names.iter().any(|n| n == STATE) {
        return Ok(None);
    }
    let data = disk.read(STATE).context("reading raft-state")?;
    let mut anchor = None;
    let mut p = 0;
    while p < data.len() && !zero_tail(&data[p..]) {
        let Some(len) = good_record(&data, p) else {
            match (p + 1..data.len()).find(|&q| good_record(&data, q).is_some()) {
                Some(q) => {
                    tracing::warn!(
                        at = p,
                        next = q,
                        "raft-state: a bad record before good ones; skipped"
                    );
                    p = q;
                    continue;
                }
                None => break,
            }
        };
        let (kind, body) = (data[p + 8], &data[p + 9..p + 8 + len]);
        if kind != KIND_STATE {
            bail!("raft-state: a record of kind {kind}");
        }
        anchor = Some(Anchor::decode(body).context("raft-state")?);
        p += 8 + len;
    }
    Ok(anchor)
}

/// The length (of kind and body) of the good record at `p` of `data`, if
/// one starts there.
fn good_record(data: &[u8], p: usize) -> Option<usize> {
    if data.len().saturating_sub(p) < 9 {
        return None;
    }
    let len = u32::from_le_bytes(data[p..p + 4].try_into().expect("4")) as usize;
    let crc = u32::from_le_bytes(data[p + 4..p + 8].try_into().expect("4"));
    (len > 1 && data.len() - p - 8 >= len && crc32fast::hash(&data[p + 8..p + 8 + len]) == crc)
        .then_some(len)
}
