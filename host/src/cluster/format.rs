//! The cluster's own formats: a log entry (a batch of requests with its
//! origin and time, or a change the hosts apply themselves) and the data
//! of a Raft snapshot (the guest's, with the members and the tenants added
//! while running).

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

/// The first byte of an entry the hosts apply themselves (a
/// [`HostEntry`]), never the guest: `0x80, u8 kind, body`. A batch's
/// entry starts with [`ENTRY_VERSION`].
pub(crate) const HOST_ENTRY: u8 = 0x80;

/// A change to the cluster the hosts apply, in the log of the group that
/// keeps it (group 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// Tenant `name` joins the cluster's tenants (kind 1, body its name).
    AddTenant(String),
    /// Tenant `name` leaves them (kind 2, body its name): its number stays
    /// taken, and its name is not used again.
    RemoveTenant(String),
    /// A group's copy starts moving (kind 3, body `u64 version, u32 group,
    /// u64 from, u64 to, u8 count, u64 host...`): its replicas are now
    /// `hosts`, if the placement is still at `version`
    /// ([`crate::cluster::placement::Moves::start`]).
    Move {
        /// The placement's version it was proposed from.
        version: u64,
        /// The move.
        to: crate::cluster::placement::Move,
        /// The group's replicas after it, its place first.
        hosts: Vec<u64>,
    },
    /// The move of `group` is done (kind 4, body `u64 version, u32
    /// group`): its old replica drops its copy.
    Settle {
        /// The placement's version it was proposed from.
        version: u64,
        /// The group.
        group: u32,
    },
    /// Replica `id` joins a placed cluster's members, holding no group yet
    /// (kind 5, body `u64 version, u64 id, record`).
    Join {
        /// The placement's version it was proposed from.
        version: u64,
        /// The replica.
        id: u64,
        /// Its address record (`raft=<addr> [mqtt=<addr>]`).
        record: Vec<u8>,
    },
    /// Member `id` of a placed cluster is to leave: its groups move away
    /// first (kind 6, body `u64 version, u64 id`).
    Drain {
        /// The placement's version it was proposed from.
        version: u64,
        /// The replica.
        id: u64,
    },
    /// Member `id`, drained, leaves (kind 7, body `u64 version, u64 id`).
    Leave {
        /// The placement's version it was proposed from.
        version: u64,
        /// The replica.
        id: u64,
    },
}

/// Encodes a [`HostEntry`].
pub(crate) fn encode_host_entry(entry: &HostEntry) -> Vec<u8> {
    match entry {
        HostEntry::AddTenant(name) => {
            let mut out = vec![HOST_ENTRY, 1];
            out.extend_from_slice(name.as_bytes());
            out
        }
        HostEntry::RemoveTenant(name) => {
            let mut out = vec![HOST_ENTRY, 2];
            out.extend_from_slice(name.as_bytes());
            out
        }
        HostEntry::Move { version, to, hosts } => {
            let mut out = vec![HOST_ENTRY, 3];
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&to.group.to_le_bytes());
            out.extend_from_slice(&to.from.to_le_bytes());
            out.extend_from_slice(&to.to.to_le_bytes());
            out.push(hosts.len() as u8);
            hosts
                .iter()
                .for_each(|h| out.extend_from_slice(&h.to_le_bytes()));
            out
        }
        HostEntry::Settle { version, group } => {
            let mut out = vec![HOST_ENTRY, 4];
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&group.to_le_bytes());
            out
        }
        HostEntry::Join {
            version,
            id,
            record,
        } => {
            let mut out = vec![HOST_ENTRY, 5];
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(record);
            out
        }
        HostEntry::Drain { version, id } | HostEntry::Leave { version, id } => {
            let kind = if matches!(entry, HostEntry::Drain { .. }) {
                6
            } else {
                7
            };
            let mut out = vec![HOST_ENTRY, kind];
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out
        }
    }
}

/// The body of a [`HostEntry::Join`], `Drain` or `Leave` (`kind`).
fn decode_member(kind: u8, body: &[u8]) -> Result<HostEntry> {
    if body.len() < 16 || (kind != 5 && body.len() != 16) {
        bail!("a member's entry of {} bytes", body.len());
    }
    let version = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
    let id = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    Ok(match kind {
        5 => HostEntry::Join {
            version,
            id,
            record: body[16..].to_vec(),
        },
        6 => HostEntry::Drain { version, id },
        _ => HostEntry::Leave { version, id },
    })
}

/// The body of a [`HostEntry::Move`].
fn decode_move(body: &[u8]) -> Result<HostEntry> {
    let bad = || anyhow::anyhow!("a move's entry of {} bytes", body.len());
    if body.len() < 29 {
        return Err(bad());
    }
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
    let group = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    let count = body[28] as usize;
    if body.len() != 29 + 8 * count {
        return Err(bad());
    }
    Ok(HostEntry::Move {
        version: u64_at(0),
        to: crate::cluster::placement::Move {
            group,
            from: u64_at(12),
            to: u64_at(20),
        },
        hosts: (0..count).map(|i| u64_at(29 + 8 * i)).collect(),
    })
}

/// The [`HostEntry`] `data` holds, if it is one (`None`: a batch's entry).
pub(crate) fn decode_host_entry(data: &[u8]) -> Option<Result<HostEntry>> {
    let (&first, rest) = data.split_first()?;
    if first != HOST_ENTRY {
        return None;
    }
    let name = |body: &[u8]| match std::str::from_utf8(body) {
        Ok(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err(anyhow::anyhow!("a tenant's entry without a valid name")),
    };
    Some(match rest.split_first() {
        Some((1, body)) => name(body).map(HostEntry::AddTenant),
        Some((2, body)) => name(body).map(HostEntry::RemoveTenant),
        Some((3, body)) => decode_move(body),
        Some((4, body)) if body.len() == 12 => Ok(HostEntry::Settle {
            version: u64::from_le_bytes(body[..8].try_into().expect("8 bytes")),
            group: u32::from_le_bytes(body[8..].try_into().expect("4 bytes")),
        }),
        Some((4, body)) => Err(anyhow::anyhow!(
            "a settled move's entry of {} bytes",
            body.len()
        )),
        Some((&kind @ 5..=7, body)) => decode_member(kind, body),
        Some((kind, _)) => Err(anyhow::anyhow!(
            "a host entry of kind {kind} (this build knows 1 to 7)"
        )),
        None => Err(anyhow::anyhow!("a host entry without its kind")),
    })
}

/// A tenant the cluster agreed to add while running: its name, and the
/// voters its groups started with (group 0's when the entry was applied,
/// so that every replica, opening them then or later from a snapshot,
/// starts them alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgreedTenant {
    /// Its name.
    pub name: String,
    /// The voters its groups start with.
    pub voters: Vec<u64>,
}

/// The tenants the cluster changed while running: those it added (in
/// order) and the names of those it removed (founding or added).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenancy {
    /// Added, in the order agreed.
    pub added: Vec<AgreedTenant>,
    /// Removed, in the order agreed.
    pub removed: Vec<String>,
}

/// Format of the data of a Raft snapshot: `u8 version, u64 applied now,
/// members, tenants, guest snapshot (everything: keys, dedup cache,
/// registrations)`; members (version 2) are `u32 count`, then per replica
/// added while running `u64 id, u32 length, address record`; tenants
/// (version 3) are `u32 count`, then per tenant added while running
/// `u32 length, name, u32 count, u64 voter...`, and (version 4) `u32
/// count`, then per tenant removed `u32 length, name`, and (version 5) `u32
/// length, moves` (the placement's moves,
/// [`crate::cluster::placement::Moves::encode`]). Versions 1 (no members),
/// 2 (no tenants), 3 (none removed) and 4 (no moves) are still read.
const SNAPSHOT_VERSION: u8 = 5;

/// What a Raft snapshot holds besides the guest's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct SnapshotData<'a> {
    pub(super) applied_now: u64,
    pub(super) members: Members,
    pub(super) tenants: Tenancy,
    pub(super) moves: crate::cluster::placement::Moves,
    pub(super) guest: &'a [u8],
}

/// The address records of the replicas added while running (the
/// context of their conf change), by id: what the other replicas reach
/// them at. The founding replicas' are in the cluster files.
pub(crate) type Members = std::collections::BTreeMap<u64, Vec<u8>>;

/// The cluster's part of a snapshot (format [`SNAPSHOT_VERSION`]), appended
/// to `out`: the guest's snapshot follows it, to the end.
pub(super) fn snapshot_header(
    applied_now: u64,
    members: &Members,
    (tenants, moves): (&Tenancy, &crate::cluster::placement::Moves),
    out: &mut Vec<u8>,
) {
    out.push(SNAPSHOT_VERSION);
    out.extend_from_slice(&applied_now.to_le_bytes());
    out.extend_from_slice(&(members.len() as u32).to_le_bytes());
    for (id, record) in members {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
    }
    encode_tenancy(tenants, out);
    let moves = moves.encode();
    out.extend_from_slice(&(moves.len() as u32).to_le_bytes());
    out.extend_from_slice(&moves);
}

/// The tenants added (`u32 count`, per tenant `u32 length, name, u32
/// count, u64 voter...`), then removed (`u32 count`, per name `u32 length,
/// name`), appended to `out`.
pub(crate) fn encode_tenancy(tenants: &Tenancy, out: &mut Vec<u8>) {
    out.extend_from_slice(&(tenants.added.len() as u32).to_le_bytes());
    for t in &tenants.added {
        out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&(t.voters.len() as u32).to_le_bytes());
        for v in &t.voters {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out.extend_from_slice(&(tenants.removed.len() as u32).to_le_bytes());
    for name in &tenants.removed {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
}

/// Reads what [`encode_tenancy`] wrote from the front of `rest`.
pub(crate) fn decode_tenancy(rest: &mut &[u8]) -> Result<Tenancy> {
    decode_tenants(rest, true)
}

/// The tenants added, and (`removed`) the names removed, from the front of
/// `rest`.
fn decode_tenants(rest: &mut &[u8], removed: bool) -> Result<Tenancy> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
        if rest.len() < n {
            bail!("a list of tenants cut short");
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head)
    }
    fn u32_of(rest: &mut &[u8]) -> Result<u32> {
        Ok(u32::from_le_bytes(
            take(rest, 4)?.try_into().expect("4 bytes"),
        ))
    }
    fn text(rest: &mut &[u8]) -> Result<String> {
        let len = u32_of(rest)? as usize;
        std::str::from_utf8(take(rest, len)?)
            .map(str::to_string)
            .map_err(|_| anyhow::anyhow!("a tenant's name is not UTF-8"))
    }
    let mut tenants = Tenancy::default();
    for _ in 0..u32_of(rest)? {
        let name = text(rest)?;
        let n = u32_of(rest)?;
        let mut voters = Vec::new();
        for _ in 0..n {
            voters.push(u64::from_le_bytes(
                take(rest, 8)?.try_into().expect("8 bytes"),
            ));
        }
        tenants.added.push(AgreedTenant { name, voters });
    }
    if removed {
        for _ in 0..u32_of(rest)? {
            tenants.removed.push(text(rest)?);
        }
    }
    Ok(tenants)
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
    let tenants = match version {
        4.. => decode_tenancy(&mut rest)?,
        3 => decode_tenants(&mut rest, false)?,
        _ => Tenancy::default(),
    };
    let mut moves = crate::cluster::placement::Moves::default();
    if version >= 5 {
        let len = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
        moves = crate::cluster::placement::Moves::decode(take(&mut rest, len as usize)?)?;
    }
    Ok(SnapshotData {
        applied_now,
        members,
        tenants,
        moves,
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
        let tenants = Tenancy {
            added: vec![AgreedTenant {
                name: "c".into(),
                voters: vec![1, 2, 4],
            }],
            removed: vec!["a".into()],
        };
        let mut moves = crate::cluster::placement::Moves::default();
        let m = crate::cluster::placement::Move {
            group: 1,
            from: 2,
            to: 4,
        };
        assert!(moves.start(0, m, vec![4, 3, 1]));
        let mut data = Vec::new();
        snapshot_header(42, &members, (&tenants, &moves), &mut data);
        data.extend_from_slice(b"guest");
        let d = decode_snapshot(&data).expect("decode");
        assert_eq!(
            (d.applied_now, &d.members, &d.tenants, &d.moves, d.guest),
            (42, &members, &tenants, &moves, &b"guest"[..])
        );
        // Format 4: no moves.
        let mut v4 = vec![4];
        v4.extend_from_slice(&42u64.to_le_bytes());
        v4.extend_from_slice(&[0; 12]);
        v4.extend_from_slice(b"guest");
        let d = decode_snapshot(&v4).expect("format 4");
        assert_eq!((d.moves.version, d.guest), (0, &b"guest"[..]));
        // Format 2: members, no tenants.
        let mut v2 = vec![2];
        v2.extend_from_slice(&42u64.to_le_bytes());
        v2.extend_from_slice(&0u32.to_le_bytes());
        v2.extend_from_slice(b"guest");
        let d = decode_snapshot(&v2).expect("format 2");
        assert_eq!((&d.tenants, d.guest), (&Tenancy::default(), &b"guest"[..]));
        // Format 3: tenants added, none removed.
        let mut v3 = vec![3];
        v3.extend_from_slice(&42u64.to_le_bytes());
        v3.extend_from_slice(&0u32.to_le_bytes());
        v3.extend_from_slice(&1u32.to_le_bytes());
        v3.extend_from_slice(&1u32.to_le_bytes());
        v3.push(b'c');
        v3.extend_from_slice(&0u32.to_le_bytes());
        v3.extend_from_slice(b"guest");
        let d = decode_snapshot(&v3).expect("format 3");
        assert_eq!(
            (
                d.tenants.added[0].name.as_str(),
                d.tenants.removed.len(),
                d.guest
            ),
            ("c", 0, &b"guest"[..])
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

    /// A host entry is told from a batch's by its first byte, and one that
    /// is wrong is an error, never a panic.
    #[test]
    fn host_entries_are_told_from_batches() {
        let add = HostEntry::AddTenant("c".into());
        let data = encode_host_entry(&add);
        assert_eq!(data, [0x80, 1, b'c']);
        assert_eq!(decode_host_entry(&data).expect("host").expect("ok"), add);
        let remove = HostEntry::RemoveTenant("c".into());
        assert_eq!(encode_host_entry(&remove), [0x80, 2, b'c']);
        assert_eq!(
            decode_host_entry(&encode_host_entry(&remove))
                .expect("host")
                .expect("ok"),
            remove
        );
        let start = HostEntry::Move {
            version: 7,
            to: crate::cluster::placement::Move {
                group: 3,
                from: 2,
                to: 5,
            },
            hosts: vec![5, 4, 1],
        };
        let settle = HostEntry::Settle {
            version: 8,
            group: 3,
        };
        let join = HostEntry::Join {
            version: 9,
            id: 5,
            record: b"raft=127.0.0.1:7105".to_vec(),
        };
        let drain = HostEntry::Drain { version: 10, id: 2 };
        let leave = HostEntry::Leave { version: 11, id: 2 };
        for entry in [&start, &settle, &join, &drain, &leave] {
            let data = encode_host_entry(entry);
            assert_eq!(&decode_host_entry(&data).expect("host").expect("ok"), entry);
            // A join's record is the rest of the entry: cut, it is shorter.
            let fixed = match entry {
                HostEntry::Join { .. } => 18,
                _ => data.len(),
            };
            for n in 2..fixed {
                assert!(decode_host_entry(&data[..n]).expect("host").is_err());
            }
        }
        assert!(decode_host_entry(&encode_entry(1, 2, b"batch")).is_none());
        assert!(decode_host_entry(&[]).is_none());
        for bad in [&[0x80][..], &[0x80, 1], &[0x80, 9, b'c'], &[0x80, 1, 0xff]] {
            assert!(decode_host_entry(bad).expect("host").is_err(), "{bad:?}");
        }
        assert!(decode_entry(&data).is_err(), "never taken for a batch");
    }
}
