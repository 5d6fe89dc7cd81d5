//! The cluster's own formats: a log entry (a batch of requests with its
//! origin and time) and the data of a Raft snapshot (the guest's, with the
//! members added while running).

use anyhow::{Result, bail};

/// The format version of an entry this build writes and reads.
pub(crate) const ENTRY_VERSION: u8 = 1;

/// An entry of the log, as proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The replica that received the inputs (it publishes the replies).
    pub origin: u64,
    /// The leader's time, ms.
    pub now: u64,
    /// The inputs, in the guest's batch encoding.
    pub batch: &'a [u8],
}

/// Encodes an entry of `batch`, inputs in the guest's batch encoding.
pub(crate) fn encode_entry(origin: u64, now: u64, batch: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(17 + batch.len());
    out.push(ENTRY_VERSION);
    out.extend_from_slice(&origin.to_le_bytes());
    out.extend_from_slice(&now.to_le_bytes());
    out.extend_from_slice(batch);
    out
}

/// Decodes an entry (its batch is left to the guest).
pub(crate) fn decode_entry(data: &[u8]) -> Result<EntryRef<'_>> {
    let Some((&version, rest)) = data.split_first() else {
        bail!("an empty log entry");
    };
    if version != ENTRY_VERSION {
        bail!("log entry format {version} (this build reads {ENTRY_VERSION})");
    }
    if rest.len() < 16 {
        bail!("a log entry of {} bytes", data.len());
    }
    let (origin, rest) = rest.split_at(8);
    let (now, batch) = rest.split_at(8);
    Ok(EntryRef {
        origin: u64::from_le_bytes(origin.try_into().expect("8 bytes")),
        now: u64::from_le_bytes(now.try_into().expect("8 bytes")),
        batch,
    })
}

/// Format of the data of a Raft snapshot: `u8 version, u64 applied now,
/// members, guest snapshot (everything: keys, dedup cache,
/// registrations)`; members (version 2) are `u32 count`, then per replica
/// added while running `u64 id, u32 length, address record`. Version 1
/// (no members) is still read.
const SNAPSHOT_VERSION: u8 = 2;

/// What a Raft snapshot holds besides the guest's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct SnapshotData<'a> {
    pub(super) applied_now: u64,
    pub(super) members: Members,
    pub(super) guest: &'a [u8],
}

/// The address records of the replicas added while running (the
/// context of their conf change), by id: what the other replicas reach
/// them at. The founding replicas' are in the cluster files.
pub(crate) type Members = std::collections::BTreeMap<u64, Vec<u8>>;

pub(super) fn encode_snapshot(applied_now: u64, members: &Members, guest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + guest.len());
    out.push(SNAPSHOT_VERSION);
    out.extend_from_slice(&applied_now.to_le_bytes());
    out.extend_from_slice(&(members.len() as u32).to_le_bytes());
    for (id, record) in members {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
    }
    out.extend_from_slice(guest);
    out
}

pub(super) fn decode_snapshot(data: &[u8]) -> Result<SnapshotData<'_>> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
        if rest.len() < n {
            bail!("a Raft snapshot cut short");
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head)
    }
    let Some((&version, mut rest)) = data.split_first() else {
        bail!("an empty Raft snapshot");
    };
    if !(1..=SNAPSHOT_VERSION).contains(&version) {
        bail!("Raft snapshot format {version} (this build reads 1 to {SNAPSHOT_VERSION})");
    }
    let applied_now = u64::from_le_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
    let mut members = Members::new();
    if version >= 2 {
        let count = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
        for _ in 0..count {
            let id = u64::from_le_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
            members.insert(id, take(&mut rest, len as usize)?.to_vec());
        }
    }
    Ok(SnapshotData {
        applied_now,
        members,
        guest: rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot keeps the address records of the replicas added while
    /// running; one of format 1 (none) is still read.
    #[test]
    fn snapshots_carry_the_members_added_while_running() {
        let members = Members::from([(4, b"raft=127.0.0.1:7104".to_vec()), (5, Vec::new())]);
        let data = encode_snapshot(42, &members, b"guest");
        let d = decode_snapshot(&data).expect("decode");
        assert_eq!(
            (d.applied_now, &d.members, d.guest),
            (42, &members, &b"guest"[..])
        );
        let mut v1 = vec![1];
        v1.extend_from_slice(&42u64.to_le_bytes());
        v1.extend_from_slice(b"guest");
        let d = decode_snapshot(&v1).expect("format 1");
        assert_eq!(
            (d.applied_now, d.members.is_empty(), d.guest),
            (42, true, &b"guest"[..])
        );
        // Cut short anywhere, or of an unknown format: an error, never a panic.
        for n in 0..data.len() {
            let _ = decode_snapshot(&data[..n]);
        }
        assert!(decode_snapshot(&data[..20]).is_err());
        assert!(decode_snapshot(&[9, 0, 0]).is_err());
    }
}
