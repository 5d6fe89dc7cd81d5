//! The snapshot format: the whole state, versioned and checksummed.
//!
//! ```text
//! "STSTSNAP"  u32 format version (LE)  body  u32 CRC-32 of everything before it
//! body v1:
//!   clock      u64 wall, u64 counter
//!   keys       u64 n, n x { bytes key, bytes value, u64 wall, u32 counter,
//!                           opt hlc fencing token, opt u64 expires-at, u8 persist }
//!   observers  u64 n, n x { str client, bytes key }
//!   dedup      u64 n, n x { str response topic, bytes correlation, u64 expires-at,
//!                           message reply }
//! bytes, str, opt, hlc, message: see codec.rs
//! ```
//!
//! Every integer is little-endian. A reader accepts every version up to
//! [`FORMAT_VERSION`] and refuses newer ones with
//! [`Error::UnsupportedVersion`]. The node id is not stored: it comes from the
//! config.
//!
//! A pure format: `write` takes the parts of a state, `read` hands them
//! to a `Visitor`; the state machine (`machine/recovery.rs`) does the rest.

use crate::codec::{Reader, Writer};
use crate::table::{Entry, EntryRef};
use crate::types::{Error, OutboundMessage};

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotScope {
    /// The whole state (for moving a store to a new instance).
    Everything,
    /// What the journal makes durable under the config's persist mode: no
    /// KEYNOTIFY registrations, and with `Persist::Flagged` only the keys set
    /// with `aio-persistence: true`.
    Durable,
}

/// Leading bytes of every snapshot.
pub const MAGIC: &[u8; 8] = b"STSTSNAP";
/// The newest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The parts of a state, for [`write`].
pub(crate) struct Parts<'a, K, R, D> {
    /// The clock: (wall, counter).
    pub clock: (u64, u64),
    /// Every key kept, with its entry.
    pub keys: K,
    /// (client, key) of every KEYNOTIFY registration kept.
    pub registrations: R,
    /// (response topic, correlation, expires-at, reply) of every dedup entry.
    pub dedup: D,
    /// About how long the snapshot is (at least): its buffer is made this
    /// size at once, rather than doubled as it grows (the guest's memory
    /// keeps its high-water mark).
    pub capacity: usize,
    _at: core::marker::PhantomData<&'a ()>,
}

impl<'a, K, R, D> Parts<'a, K, R, D>
where
    K: ExactSizeIterator<Item = (&'a [u8], EntryRef<'a>)>,
    R: ExactSizeIterator<Item = (&'a str, &'a [u8])>,
    D: ExactSizeIterator<Item = (&'a str, &'a [u8], u64, OutboundMessage)>,
{
    /// Parts of a state.
    pub(crate) fn new(clock: (u64, u64), keys: K, registrations: R, dedup: D) -> Self {
        Parts {
            clock,
            keys,
            registrations,
            dedup,
            capacity: 0,
            _at: core::marker::PhantomData,
        }
    }

    /// The same, written into a buffer of `capacity` bytes.
    pub(crate) fn with_capacity(self, capacity: usize) -> Self {
        Parts { capacity, ..self }
    }
}

/// A snapshot of `parts`.
pub(crate) fn write<'a, K, R, D>(parts: Parts<'a, K, R, D>) -> Vec<u8>
where
    K: ExactSizeIterator<Item = (&'a [u8], EntryRef<'a>)>,
    R: ExactSizeIterator<Item = (&'a str, &'a [u8])>,
    D: ExactSizeIterator<Item = (&'a str, &'a [u8], u64, OutboundMessage)>,
{
    let mut w = Writer(Vec::with_capacity(parts.capacity.max(64)));
    w.0.extend_from_slice(MAGIC);
    w.u32(FORMAT_VERSION);
    let (wall, counter) = parts.clock;
    w.u64(wall);
    w.u64(counter);
    w.u64(parts.keys.len() as u64);
    for (key, e) in parts.keys {
        w.entry(key, e);
    }
    w.u64(parts.registrations.len() as u64);
    for (client, key) in parts.registrations {
        w.str(client);
        w.bytes(key);
    }
    w.u64(parts.dedup.len() as u64);
    for (topic, corr, expires_at, reply) in parts.dedup {
        w.str(topic);
        w.bytes(corr);
        w.u64(expires_at);
        w.message(&reply);
    }
    w.finish_with_crc()
}

/// What [`read`] finds in a snapshot, in this order.
pub(crate) trait Visitor {
    /// The clock, first.
    fn clock(&mut self, wall: u64, counter: u64);
    /// A key and its entry.
    fn key(&mut self, key: &[u8], entry: Entry);
    /// A KEYNOTIFY registration.
    fn registration(&mut self, client: &str, key: &[u8]);
    /// A dedup-cache entry.
    fn reply(
        &mut self,
        topic: &str,
        correlation: &[u8],
        expires_at: u64,
        reply: OutboundMessage,
    ) -> Result<(), Error>;
}

/// Checks a snapshot (magic, version, checksum) and hands its parts to
/// `visit`. Nothing is handed over from a snapshot whose checksum fails.
pub(crate) fn read(snapshot: &[u8], visit: &mut impl Visitor) -> Result<(), Error> {
    let bad = |m: &str| Error::BadSnapshot(m.to_string());
    if snapshot.len() < MAGIC.len() + 8 || &snapshot[..MAGIC.len()] != MAGIC {
        return Err(bad("not a state store snapshot"));
    }
    let mut r = Reader::new(
        &snapshot[MAGIC.len()..snapshot.len() - 4],
        Error::BadSnapshot,
    );
    let version = r.u32()?;
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion(version));
    }
    if version == 0 {
        return Err(bad("format version 0 does not exist"));
    }
    let (body, tail) = snapshot.split_at(snapshot.len() - 4);
    let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if crc32fast::hash(body) != stored {
        return Err(bad("checksum mismatch"));
    }
    visit.clock(r.u64()?, r.u64()?);
    for _ in 0..r.u64()? {
        let (key, entry) = r.entry()?;
        visit.key(key, entry);
    }
    for _ in 0..r.u64()? {
        let client = r.str()?;
        visit.registration(&client, r.bytes()?);
    }
    for _ in 0..r.u64()? {
        let topic = r.str()?;
        let corr = r.bytes()?;
        let expires_at = r.u64()?;
        let reply = r.message()?;
        visit.reply(&topic, corr, expires_at, reply)?;
    }
    r.end()
}
