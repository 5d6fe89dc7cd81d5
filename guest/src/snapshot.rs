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
//! body v2: as v1, but each dedup item starts with opt str client (the
//!   client it is charged to, when one was known)
//! body v3: as v2, but each observer ends with opt via (u64 replica,
//!   u64 started: where the registration was made, in a cluster)
//! body v4: as v3, but each observer ends with its client's watcher: opt str
//!   user name, u32 n, n x { str attribute name, str value } (who it was when
//!   it registered: every notification is checked as it)
//! bytes, str, opt, hlc, message: see codec.rs
//! ```
//!
//! Every integer is little-endian. A reader accepts every version up to
//! [`FORMAT_VERSION`] and refuses newer ones with
//! [`Error::UnsupportedVersion`]. The node id is not stored: it comes from the
//! config.
//!
//! A pure format: the state machine (`machine/recovery.rs`) writes it
//! (in parts, if it asks), and `Restorer` reads it, in parts of any size,
//! handing what it finds to a `Visitor`.

use crate::LARGE_VALUE;
use crate::codec::{Reader, Writer};
use crate::notify::Watcher;
use crate::table::{EntryMeta, blob_start};
use crate::types::{Error, OutboundMessage, Via};

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
pub const FORMAT_VERSION: u32 = 4;

/// The first bytes of a snapshot: magic, version and clock; the key count
/// follows.
pub(crate) fn write_header(w: &mut Writer, clock: (u64, u64)) {
    w.0.extend_from_slice(MAGIC);
    w.u32(FORMAT_VERSION);
    w.u64(clock.0);
    w.u64(clock.1);
}

/// What [`Restorer`] finds in a snapshot, in this order.
pub(crate) trait Visitor {
    /// The clock, first.
    fn clock(&mut self, wall: u64, counter: u64);
    /// A key and its entry.
    fn key(&mut self, key: &[u8], value: &[u8], meta: EntryMeta);
    /// A key and its entry whose large value was read straight into a
    /// slot's blob ([`crate::table::Table::put_blob`]) over several parts.
    fn key_blob(&mut self, blob: Vec<u8>, meta: EntryMeta);
    /// A KEYNOTIFY registration, where it was made, and who made it.
    fn registration(&mut self, client: &str, key: &[u8], via: Option<Via>, watcher: &Watcher);
    /// A dedup-cache entry (charged to `client`, if known).
    fn reply(
        &mut self,
        client: Option<&str>,
        topic: &str,
        correlation: &[u8],
        expires_at: u64,
        reply: OutboundMessage,
    ) -> Result<(), Error>;
}

/// Where a [`Restorer`] is in the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Stage {
    /// Magic, version and clock.
    #[default]
    Header,
    /// The count of the next section.
    Count(Section),
    /// Items of a section, with how many are left.
    Items(Section, u64),
    /// The fields after the value of a key whose large value is in
    /// `Restorer::filling` (whole), with how many keys are left, it too.
    LargeTail(u64),
    /// The CRC.
    Crc,
    /// Everything was read.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Keys,
    Registrations,
    Dedup,
}

/// Reads a snapshot handed over in parts of any size (a part may end
/// inside an item): each item goes to the visitor as soon as it is whole,
/// so what a reader holds at once is one part and one item, not the whole
/// snapshot. The checksum covers everything and is checked at the end:
/// until [`Restorer::finish`] succeeds, what the visitor was given is not
/// to be used.
#[derive(Debug, Default)]
pub(crate) struct Restorer {
    /// Bytes of an item not yet whole.
    pending: Vec<u8>,
    /// CRC of every byte consumed (the CRC's own bytes aside).
    crc: crc32fast::Hasher,
    stage: Stage,
    /// Bytes consumed, for error messages.
    offset: u64,
    /// The format version, once the header was read.
    version: u32,
    /// A large value being read straight into its key's slot.
    filling: Option<Filling>,
}

/// A key's slot blob taking its large value in as parts come: a value
/// that spans parts is never held twice (pending bytes, then a copy).
#[derive(Debug)]
struct Filling {
    blob: Vec<u8>,
    /// The blob's length once the value is whole (its capacity).
    whole: usize,
}

/// The most room a [`Filling`] takes before the value's bytes come.
const FILLING_ROOM: usize = 64 << 20;

impl Filling {
    /// Appends `bytes` (never past `whole`), growing the blob by doubling
    /// but never past `whole`: its last growth gives it exactly its room.
    fn push(&mut self, bytes: &[u8]) {
        let need = self.blob.len() + bytes.len();
        if self.blob.capacity() < need {
            let want = (self.blob.capacity() * 2).min(self.whole).max(need);
            self.blob.reserve_exact(want - self.blob.len());
        }
        self.blob.extend_from_slice(bytes);
    }
}

impl Restorer {
    /// Reads `part`, the bytes after those already fed.
    pub(crate) fn feed(&mut self, mut part: &[u8], visit: &mut impl Visitor) -> Result<(), Error> {
        if let Some(f) = self.filling.as_mut().filter(|f| f.blob.len() < f.whole) {
            let n = (f.whole - f.blob.len()).min(part.len());
            f.push(&part[..n]);
            self.crc.update(&part[..n]);
            self.offset += n as u64;
            part = &part[n..];
            if part.is_empty() {
                return Ok(());
            }
        }
        if self.pending.is_empty() {
            // The usual case (whole items in a part, or one part): read in
            // place, keep only an unfinished tail.
            let used = self.parse(part, visit)?;
            self.pending.extend_from_slice(&part[used..]);
        } else {
            let mut buf = core::mem::take(&mut self.pending);
            buf.extend_from_slice(part);
            let used = self.parse(&buf, visit)?;
            buf.drain(..used);
            self.pending = buf;
        }
        Ok(())
    }

    /// The snapshot is whole: fails unless it ended exactly after its
    /// checksum.
    pub(crate) fn finish(self) -> Result<(), Error> {
        match self.stage {
            Stage::Done => Ok(()),
            Stage::Header => Err(Error::BadSnapshot("not a state store snapshot".into())),
            _ => Err(Error::BadSnapshot(format!(
                "truncated after {} bytes",
                self.offset + self.pending.len() as u64
            ))),
        }
    }

    /// Reads the whole items of `buf`; returns the bytes consumed.
    fn parse(&mut self, buf: &[u8], visit: &mut impl Visitor) -> Result<usize, Error> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            if self.stage == Stage::Done {
                return if rest.is_empty() {
                    Ok(at)
                } else {
                    Err(self.bad("trailing bytes after the checksum"))
                };
            }
            let mut r = Reader::new(rest, Error::BadSnapshot);
            match self.step(&mut r, visit) {
                Ok(()) => {}
                Err(_) if r.short() => {
                    if let Some(used) = self.start_filling(rest) {
                        self.crc.update(&rest[..used]);
                        self.offset += used as u64;
                        at += used;
                        if self
                            .filling
                            .as_ref()
                            .is_some_and(|f| f.blob.len() < f.whole)
                        {
                            return Ok(at);
                        }
                        continue;
                    }
                    if self.stage == Stage::Header
                        && !MAGIC.starts_with(&rest[..rest.len().min(MAGIC.len())])
                    {
                        return Err(Error::BadSnapshot("not a state store snapshot".into()));
                    }
                    return Ok(at);
                }
                Err(Error::BadSnapshot(m)) => return Err(self.bad(&m)),
                Err(e) => return Err(e),
            }
            let used = rest.len() - r.remaining();
            if self.stage != Stage::Done {
                self.crc.update(&rest[..used]);
            }
            self.offset += used as u64;
            at += used;
        }
    }

    /// At a key whose item is not whole in `rest`: if its value is large,
    /// starts its slot's blob with the key and what `rest` has of the
    /// value, and returns the bytes that took (all of `rest`, or up to
    /// the end of the value).
    fn start_filling(&mut self, rest: &[u8]) -> Option<usize> {
        let Stage::Items(Section::Keys, left) = self.stage else {
            return None;
        };
        let mut r = Reader::new(rest, Error::BadSnapshot);
        let key = r.bytes().ok()?;
        let len = r.u32().ok()? as usize;
        if len < LARGE_VALUE {
            return None;
        }
        let head = rest.len() - r.remaining();
        // Room for the value as it says, up to a bound: a damaged or
        // hostile length (up to 4 GiB) gets room only as its bytes come.
        let blob = blob_start(key, len.min(FILLING_ROOM));
        let whole = blob.len() + len;
        let take = len.min(r.remaining());
        let mut filling = Filling { blob, whole };
        filling.push(&rest[head..head + take]);
        self.filling = Some(filling);
        self.stage = Stage::LargeTail(left);
        Some(head + take)
    }

    fn bad(&self, m: &str) -> Error {
        match self.offset {
            0 => Error::BadSnapshot(m.to_string()),
            at => Error::BadSnapshot(format!("{m} (at byte {at})")),
        }
    }

    /// Reads one item and moves on; on an error nothing moved.
    fn step(&mut self, r: &mut Reader<'_>, visit: &mut impl Visitor) -> Result<(), Error> {
        let bad = |m: &str| Error::BadSnapshot(m.to_string());
        self.stage = match self.stage {
            Stage::Header => {
                if r.take_bytes(MAGIC.len())? != MAGIC {
                    return Err(Error::BadSnapshot("not a state store snapshot".into()));
                }
                let version = r.u32()?;
                if version > FORMAT_VERSION {
                    return Err(Error::UnsupportedVersion(version));
                }
                if version == 0 {
                    return Err(bad("format version 0 does not exist"));
                }
                let (wall, counter) = (r.u64()?, r.u64()?);
                self.version = version;
                visit.clock(wall, counter);
                Stage::Count(Section::Keys)
            }
            Stage::Count(section) => match r.u64()? {
                0 => next_section(section),
                n => Stage::Items(section, n),
            },
            Stage::Items(section, left) => {
                match section {
                    Section::Keys => {
                        let (key, value, meta) = r.entry()?;
                        visit.key(key, value, meta);
                    }
                    Section::Registrations => {
                        let client = r.str()?;
                        let key = r.bytes()?;
                        let via = if self.version >= 3 {
                            r.opt(|r| {
                                Ok(Via {
                                    replica: r.u64()?,
                                    started: r.u64()?,
                                })
                            })?
                        } else {
                            None
                        };
                        let mut watcher = Watcher::default();
                        if self.version >= 4 {
                            watcher.username = r.opt(Reader::str)?;
                            let n = r.u32()?;
                            for _ in 0..n {
                                watcher.attributes.push((r.str()?, r.str()?));
                            }
                        }
                        visit.registration(&client, key, via, &watcher);
                    }
                    Section::Dedup => {
                        let client = if self.version >= 2 {
                            r.opt(Reader::str)?
                        } else {
                            None
                        };
                        let topic = r.str()?;
                        let corr = r.bytes()?;
                        let expires_at = r.u64()?;
                        let reply = r.message()?;
                        visit.reply(client.as_deref(), &topic, corr, expires_at, reply)?;
                    }
                }
                match left - 1 {
                    0 => next_section(section),
                    n => Stage::Items(section, n),
                }
            }
            Stage::LargeTail(left) => {
                let meta = r.entry_tail()?;
                match self.filling.take() {
                    Some(f) if f.blob.len() == f.whole => visit.key_blob(f.blob, meta),
                    _ => return Err(bad("a large value ended early")),
                }
                match left - 1 {
                    0 => next_section(Section::Keys),
                    n => Stage::Items(Section::Keys, n),
                }
            }
            Stage::Crc => {
                let stored = r.u32()?;
                if self.crc.clone().finalize() != stored {
                    return Err(bad("checksum mismatch"));
                }
                Stage::Done
            }
            Stage::Done => Stage::Done,
        };
        Ok(())
    }
}

/// The stage after the last item of `section`.
fn next_section(section: Section) -> Stage {
    match section {
        Section::Keys => Stage::Count(Section::Registrations),
        Section::Registrations => Stage::Count(Section::Dedup),
        Section::Dedup => Stage::Crc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Version;

    /// Records what a restore hands over.
    #[derive(Default)]
    struct Seen {
        keys: Vec<(Vec<u8>, Vec<u8>)>,
        blobs: Vec<Vec<u8>>,
    }

    impl Visitor for Seen {
        fn clock(&mut self, _: u64, _: u64) {}
        fn key(&mut self, key: &[u8], value: &[u8], _: EntryMeta) {
            self.keys.push((key.to_vec(), value.to_vec()));
        }
        fn key_blob(&mut self, blob: Vec<u8>, _: EntryMeta) {
            assert_eq!(blob.len(), blob.capacity(), "room for exactly the value");
            self.blobs.push(blob);
        }
        fn registration(&mut self, _: &str, _: &[u8], _: Option<Via>, _: &Watcher) {}
        fn reply(
            &mut self,
            _: Option<&str>,
            _: &str,
            _: &[u8],
            _: u64,
            _: OutboundMessage,
        ) -> Result<(), Error> {
            Ok(())
        }
    }

    /// A value that says it is 4 GiB long, with a few bytes: room only
    /// for what may come, and the snapshot is refused as cut short.
    #[test]
    fn a_hostile_length_gets_no_room_ahead_of_its_bytes() {
        let mut w = Writer::new();
        write_header(&mut w, (1, 0));
        w.u64(1);
        w.bytes(b"k");
        w.u32(u32::MAX);
        w.0.extend_from_slice(&[7; 100]);
        let mut r = Restorer::default();
        let mut seen = Seen::default();
        r.feed(&w.0, &mut seen).expect("not wrong yet");
        let room = r.filling.as_ref().map(|f| f.blob.capacity());
        assert!(room.is_some_and(|n| n <= FILLING_ROOM + 8), "{room:?}");
        r.feed(&[7; 1000], &mut seen).expect("not wrong yet");
        assert!(r.finish().is_err());
    }

    /// A snapshot of a small key and a large one, cut into parts of
    /// `part` bytes: the large value goes straight into its blob (nothing
    /// of it waits as pending bytes), the small one as usual.
    #[test]
    fn a_large_value_over_parts_is_read_into_its_blob() {
        let big: Vec<u8> = (0..LARGE_VALUE * 3).map(|i| (i % 251) as u8).collect();
        let meta = EntryMeta {
            version: Version {
                wall: 1,
                counter: 2,
            },
            fencing_token: None,
            expires_at: None,
            persist: false,
        };
        let mut w = Writer::new();
        write_header(&mut w, (1, 0));
        w.u64(2);
        w.entry(b"a", meta.with(b"small"));
        w.entry(b"big", meta.with(&big));
        w.u64(0);
        w.u64(0);
        let snapshot = w.finish_with_crc();
        for part in [1, 1000, 4096, LARGE_VALUE, snapshot.len()] {
            let mut r = Restorer::default();
            let mut seen = Seen::default();
            let mut most_pending = 0;
            for piece in snapshot.chunks(part) {
                r.feed(piece, &mut seen).expect("feeds");
                most_pending = most_pending.max(r.pending.len());
            }
            r.finish().expect("whole");
            assert_eq!(seen.keys[0], (b"a".to_vec(), b"small".to_vec()));
            if part == snapshot.len() {
                // One part: read in place.
                assert_eq!(seen.keys[1], (b"big".to_vec(), big.clone()));
                continue;
            }
            assert!(
                most_pending < 1000 + 64,
                "{most_pending} pending for parts of {part}"
            );
            let mut want = vec![3u8];
            want.extend_from_slice(b"big");
            want.extend_from_slice(&big);
            assert_eq!(seen.blobs, [want], "parts of {part}");
        }
    }
}
