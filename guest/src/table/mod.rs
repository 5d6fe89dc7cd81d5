//! The key table: values, versions, fencing tokens, expiry (spec §5.3, §8.5, §9, §10).
//!
//! [`Table::execute`] applies one parsed GET / SET / DEL / VDEL (KEYNOTIFY is
//! the registry's) after the envelope has validated `__ts` and `__ft`, and
//! says what changed so that the caller can notify observers.

pub mod fencing;
mod lent;
pub mod ordered;

pub use lent::{EntryMeta, Lent, blob_start};

use foldhash::fast::FixedState;
use hashbrown::HashTable;
use std::hash::BuildHasher;

use crate::command::{Command, Condition};
use crate::errors::ServiceError;
use crate::expiry::Deadlines;
pub use crate::hlc::Version;
use crate::hlc::{Clock, CounterOverflow, Hlc};
use crate::resp3;
use crate::types::Quota;
use ordered::Ordered;

/// One stored key, owned (as read from a snapshot or a journal record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Box<[u8]>,
    /// Its version (the HLC of the SET that wrote it).
    pub version: Version,
    /// The fencing token protecting it.
    pub fencing_token: Option<Box<Hlc>>,
    /// When it expires (ms), if ever.
    pub expires_at: Option<u64>,
    /// Set with `aio-persistence: true`.
    pub persist: bool,
}

impl Entry {
    /// A borrowed view, as [`Table::put`] takes it.
    pub fn as_ref(&self) -> EntryRef<'_> {
        EntryRef {
            value: &self.value,
            version: self.version,
            fencing_token: self.fencing_token.as_deref(),
            expires_at: self.expires_at,
            persist: self.persist,
        }
    }
}

/// One stored key, borrowed from the table (or from an [`Entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The value.
    pub value: &'a [u8],
    /// Its version (the HLC of the SET that wrote it).
    pub version: Version,
    /// The fencing token protecting it.
    pub fencing_token: Option<&'a Hlc>,
    /// When it expires (ms), if ever.
    pub expires_at: Option<u64>,
    /// Set with `aio-persistence: true`.
    pub persist: bool,
}

impl EntryRef<'_> {
    /// Whether the entry is visible at `now` (expired keys are invisible at once).
    pub fn live_at(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Entry {
        Entry {
            value: self.value.into(),
            version: self.version,
            fencing_token: self.fencing_token.cloned().map(Box::new),
            expires_at: self.expires_at,
            persist: self.persist,
        }
    }
}

/// What a command did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing changed.
    None,
    /// The key was written: notify SET with its new value.
    Set,
    /// The key was deleted: notify DELETE.
    Delete,
}

/// The result of executing a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Reply payload.
    pub reply: Vec<u8>,
    /// `__ts` of the reply (spec §8.5), if any: always an HLC of this
    /// store's node.
    pub version: Option<Version>,
    /// What changed.
    pub change: Change,
    /// Where a SET put its entry ([`Table::entry_at`], until the table
    /// next changes): the journal record is built from it without looking
    /// the key up again.
    pub slot: Option<usize>,
}

impl Outcome {
    fn error(e: ServiceError) -> Outcome {
        Outcome {
            reply: e.reply(),
            version: None,
            change: Change::None,
            slot: None,
        }
    }
}

/// Per-request facts the envelope has already validated.
#[derive(Debug, Clone)]
pub struct Request<'r> {
    /// Time of handling.
    pub now: u64,
    /// L after absorbing the request's `__ts`, if it carried one.
    pub received: Option<Version>,
    /// The request's `__ft`, parsed and skew-checked.
    pub fencing_token: Option<&'r Hlc>,
    /// `aio-persistence: true` was set.
    pub persist: bool,
    /// Where a SET's value lies in the buffer its caller handles, when the
    /// caller will hand that buffer over: the SET is then held as
    /// [`Table::lent`] until [`Table::put_lent`] makes the buffer the key's
    /// slot, and its value is never copied.
    pub lend: Option<core::ops::Range<usize>>,
}

/// Mixed into the host's seed (and the whole seed when a host passes 0).
const HASH_SEED: u64 = 0x5157_4154_4553_5453;

/// Bit of [`Slot::counter`] that holds the persist flag (HLC counters stay
/// below 2^31).
const PERSIST_BIT: u32 = 1 << 31;

/// One key in the table, laid out for memory: the key and value share one
/// allocation, the version is inline, and what few keys have (an expiry, a
/// fencing token) hangs off an optional box. 24 bytes on wasm32.
#[derive(Debug, Clone)]
struct Slot {
    /// LEB128 key length, the key, then the value.
    blob: Box<[u8]>,
    /// HLC wall time of the version.
    wall: u64,
    /// HLC counter of the version, and [`PERSIST_BIT`].
    counter: u32,
    extra: Option<Box<Extra>>,
}

#[derive(Debug, Clone)]
struct Extra {
    expires_at: Option<u64>,
    fencing_token: Option<Box<Hlc>>,
}

/// The LEB128 length prefix of a key in a [`Slot`]'s blob, and its length.
fn key_prefix(key: &[u8]) -> ([u8; 5], usize) {
    let mut prefix = [0u8; 5];
    let mut n = key.len();
    let mut i = 0;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 || i == 4 {
            prefix[i] = byte;
            return (prefix, i + 1);
        }
        prefix[i] = byte | 0x80;
        i += 1;
    }
}

impl Slot {
    fn new(key: &[u8], e: EntryRef<'_>) -> Slot {
        let (prefix, n) = key_prefix(key);
        let mut blob = Vec::with_capacity(n + key.len() + e.value.len());
        blob.extend_from_slice(&prefix[..n]);
        blob.extend_from_slice(key);
        blob.extend_from_slice(e.value);
        Slot::with_blob(blob.into_boxed_slice(), e)
    }

    /// A slot of `blob` (the length prefix, the key, the value) with the
    /// rest of `e` (whose value is not read).
    fn with_blob(blob: Box<[u8]>, e: EntryRef<'_>) -> Slot {
        let extra = (e.expires_at.is_some() || e.fencing_token.is_some()).then(|| {
            Box::new(Extra {
                expires_at: e.expires_at,
                fencing_token: e.fencing_token.cloned().map(Box::new),
            })
        });
        Slot {
            blob,
            wall: e.version.wall,
            counter: (e.version.counter & !PERSIST_BIT) | if e.persist { PERSIST_BIT } else { 0 },
            extra,
        }
    }

    /// (key, value), split at the length prefix.
    fn parts(&self) -> (&[u8], &[u8]) {
        let mut len = 0usize;
        let mut i = 0;
        while let Some(&b) = self.blob.get(i) {
            len |= usize::from(b & 0x7f) << (7 * i);
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        self.blob[i..].split_at(len)
    }

    fn key(&self) -> &[u8] {
        self.parts().0
    }

    /// Bytes of key and value (what [`Quota::max_bytes`] counts).
    fn data_len(&self) -> u64 {
        let (k, v) = self.parts();
        u64::try_from(k.len() + v.len()).unwrap_or(u64::MAX)
    }

    fn view(&self) -> EntryRef<'_> {
        let extra = self.extra.as_deref();
        EntryRef {
            value: self.parts().1,
            version: Version {
                wall: self.wall,
                counter: self.counter & !PERSIST_BIT,
            },
            fencing_token: extra.and_then(|x| x.fencing_token.as_deref()),
            expires_at: extra.and_then(|x| x.expires_at),
            persist: self.counter & PERSIST_BIT != 0,
        }
    }
}

/// All keys, with an index of their deadlines.
///
/// The slots are one dense `Vec` (24 bytes a key on wasm32) and a hash table
/// of their positions (4 bytes and a control byte a bucket), as `indexmap`
/// does: about a third of the memory of an ordered map of boxed keys and
/// entries, a growth step copies only the small index, and a lookup compares
/// one key. The hash seed comes from the host (`Config::hash_seed`, random in
/// `statestore serve`): the guest has no random source, and with a known seed
/// a client that chooses keys could make them collide. Nothing observable
/// depends on the seed: snapshots sort, expiry has its own ordered index.
#[derive(Clone)]
pub struct Table {
    slots: Vec<Slot>,
    index: HashTable<u32>,
    /// The positions again, in key order (SCAN, snapshots).
    order: Ordered,
    hasher: FixedState,
    deadlines: Deadlines<Box<[u8]>>,
    /// Bytes of every key and value, for [`Quota::max_bytes`].
    bytes: u64,
    quota: Quota,
    /// A SET applied but not yet put: its value is still in its caller's
    /// buffer ([`Request::lend`]).
    lent: Option<Lent>,
}

impl Default for Table {
    fn default() -> Self {
        Table::with_seed(0)
    }
}

impl core::fmt::Debug for Table {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Table")
            .field("keys", &self.slots.len())
            .field("deadlines", &self.deadlines.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Table {
    /// An empty table whose hash is seeded with `seed`.
    pub fn with_seed(seed: u64) -> Table {
        Table {
            slots: Vec::new(),
            index: HashTable::new(),
            order: Ordered::new(),
            hasher: FixedState::with_seed(seed ^ HASH_SEED),
            deadlines: Deadlines::new(),
            bytes: 0,
            quota: Quota::default(),
            lent: None,
        }
    }

    /// The limits enforced by [`Table::execute`] from now on.
    pub fn set_quota(&mut self, quota: Quota) {
        self.quota = quota;
    }

    /// Bytes of every key and value held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a SET of `key` to `value` may proceed (spec §5.4 step 8):
    /// `new` says the key does not exist yet.
    fn admits(&self, key: &[u8], value: &[u8], new: bool) -> bool {
        let q = &self.quota;
        let len = |b: &[u8]| u64::try_from(b.len()).unwrap_or(u64::MAX);
        let over = |n: u64, max: Option<u32>| max.is_some_and(|m| n > u64::from(m));
        if over(len(value), q.max_value_bytes) {
            return false;
        }
        if !new {
            return true;
        }
        let keys = u64::try_from(self.slots.len()).unwrap_or(u64::MAX);
        let bytes = self
            .bytes
            .saturating_add(len(key))
            .saturating_add(len(value));
        !(over(len(key), q.max_key_bytes)
            || q.max_keys.is_some_and(|m| keys >= m)
            || q.max_bytes.is_some_and(|m| bytes > m))
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn position(&self, key: &[u8]) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(self.hash(key), |&i| slots[i as usize].key() == key)
            .map(|&i| i as usize)
    }

    /// The entry for `key` if it is live at `now`.
    pub fn get(&self, key: &[u8], now: u64) -> Option<EntryRef<'_>> {
        self.entry(key).filter(|e| e.live_at(now))
    }

    /// The entry for `key`, live or not.
    pub fn entry(&self, key: &[u8]) -> Option<EntryRef<'_>> {
        self.position(key).map(|i| self.slots[i].view())
    }

    /// The entry at position `at` ([`Outcome::slot`]), if there is one.
    pub fn entry_at(&self, at: usize) -> Option<EntryRef<'_>> {
        self.slots.get(at).map(Slot::view)
    }

    /// Inserts or replaces an entry, keeping the deadline index in step.
    pub fn put(&mut self, key: &[u8], entry: EntryRef<'_>) {
        let at = self.position(key);
        self.put_slot(key, Slot::new(key, entry), entry.expires_at, at);
    }

    /// Puts `slot` for `key` at `at`, the key's position ([`Table::position`]
    /// found it, or `None`: a new key); returns the slot's position.
    fn put_slot(&mut self, key: &[u8], slot: Slot, due: Option<u64>, at: Option<usize>) -> usize {
        self.bytes = self.bytes.saturating_add(slot.data_len());
        let (old, at) = match at {
            Some(i) => (Some(core::mem::replace(&mut self.slots[i], slot)), i),
            None => {
                // Positions are u32: four billion keys is far past any memory
                // a guest gets.
                let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(slot);
                let (slots, hasher) = (&self.slots, &self.hasher);
                self.index.insert_unique(hasher.hash_one(key), i, |&j| {
                    hasher.hash_one(slots[j as usize].key())
                });
                self.order.insert(key, i, |j| slots[j as usize].key());
                (None, self.slots.len() - 1)
            }
        };
        if let Some(old) = &old {
            self.bytes = self.bytes.saturating_sub(old.data_len());
        }
        if let Some(at) = old.and_then(|old| old.view().expires_at) {
            self.deadlines.remove(at, &Box::from(key));
        }
        if let Some(at) = due {
            self.deadlines.insert(at, key.into());
        }
        at
    }

    /// Takes the slot of `key` out: the last slot moves into its place.
    fn take(&mut self, key: &[u8]) -> Option<Slot> {
        let hash = self.hash(key);
        let slots = &self.slots;
        let (i, _) = self
            .index
            .find_entry(hash, |&i| slots[i as usize].key() == key)
            .ok()?
            .remove();
        let last = self.slots.len() - 1;
        let slots = &self.slots;
        self.order.remove(key, |j| slots[j as usize].key());
        if i as usize != last {
            let moved = slots[last].key();
            self.order.repoint(moved, i, |j| slots[j as usize].key());
            let moved = self.hash(moved);
            if let Some(at) = self.index.find_mut(moved, |&j| j as usize == last) {
                *at = i;
            }
        }
        let slot = self.slots.swap_remove(i as usize);
        self.bytes = self.bytes.saturating_sub(slot.data_len());
        Some(slot)
    }

    /// Removes an entry; returns whether it was persisted.
    pub fn remove(&mut self, key: &[u8]) -> Option<bool> {
        let old = self.take(key)?;
        let view = old.view();
        if let Some(at) = view.expires_at {
            self.deadlines.remove(at, &Box::from(key));
        }
        Some(view.persist)
    }

    /// The earliest expiry deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.next()
    }

    /// Removes `key` if its deadline is `<= now`; returns whether it was
    /// persisted.
    pub fn take_due(&mut self, key: &[u8], now: u64) -> Option<bool> {
        if self.entry(key)?.live_at(now) {
            return None;
        }
        self.remove(key)
    }

    /// Removes one key whose deadline is `<= now`; returns it and whether
    /// it was persisted.
    pub fn pop_expired(&mut self, now: u64) -> Option<(Box<[u8]>, bool)> {
        let (_, key) = self.deadlines.pop_due(now)?;
        // The index only holds deadlines of present entries (put/remove keep it
        // in step), so the entry exists.
        let old = self.take(&key)?;
        Some((key, old.view().persist))
    }

    /// Number of keys, including expired ones not yet removed.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every entry in key order, live or not (for snapshots).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], EntryRef<'_>)> {
        self.after(None)
    }

    /// Entries in key order from the first key above `key` (from the first
    /// key when `None`), live or not (for SCAN).
    pub fn after(&self, key: Option<&[u8]>) -> impl Iterator<Item = (&[u8], EntryRef<'_>)> {
        let slots = &self.slots;
        self.order
            .after(key, |j| slots[j as usize].key())
            .map(move |j| {
                let slot = &slots[j as usize];
                (slot.key(), slot.view())
            })
    }

    /// Applies GET / SET / DEL / VDEL (spec §5.4 steps 8 to 11).
    pub fn execute(
        &mut self,
        command: &Command<'_>,
        req: Request<'_>,
        clock: &mut Clock,
    ) -> Result<Outcome, CounterOverflow> {
        let now = req.now;
        // A mutation's version: L after receiving `__ts`, or a local tick.
        let stamp = |clock: &mut Clock| match req.received {
            Some(version) => Ok(version),
            None => clock.tick_version(now),
        };
        Ok(match *command {
            Command::Get { key } => match self.get(key, now) {
                Some(e) => Outcome {
                    reply: resp3::bulk(e.value),
                    version: Some(e.version),
                    change: Change::None,
                    slot: None,
                },
                None => Outcome {
                    reply: resp3::REPLY_NIL.to_vec(),
                    version: None,
                    change: Change::None,
                    slot: None,
                },
            },
            Command::Set {
                key,
                value,
                condition,
                px,
            } => {
                // One lookup: the entry's position serves the put too.
                let at = self.position(key);
                let current = at.map(|i| self.slots[i].view()).filter(|e| e.live_at(now));
                if !self.admits(key, value, current.is_none()) {
                    return Ok(Outcome::error(ServiceError::QuotaExceeded));
                }
                let token = current.and_then(|e| e.fencing_token);
                if let Err(e) = fencing::check(token, req.fencing_token) {
                    return Ok(Outcome::error(e));
                }
                let applies = match (condition, current) {
                    (Condition::Always, _) | (_, None) => true,
                    (Condition::Nx, Some(_)) => false,
                    (Condition::Nex, Some(e)) => e.value == value,
                };
                if !applies {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_APPLIED.to_vec(),
                        version: current.map(|e| e.version),
                        change: Change::None,
                        slot: None,
                    });
                }
                let version = stamp(clock)?;
                let token = fencing::after_set(token.cloned(), req.fencing_token);
                let entry = EntryRef {
                    value,
                    version,
                    fencing_token: token.as_ref(),
                    expires_at: px.map(|ms| now.saturating_add(ms)),
                    persist: req.persist,
                };
                let slot = match req.lend.clone() {
                    Some(lent) => {
                        self.lent = Some(Lent::new(key, entry, lent));
                        None
                    }
                    None => Some(self.put_slot(key, Slot::new(key, entry), entry.expires_at, at)),
                };
                Outcome {
                    reply: resp3::REPLY_OK.to_vec(),
                    version: Some(version),
                    change: Change::Set,
                    slot,
                }
            }
            Command::Del { key } | Command::VDel { key, .. } => {
                let Some(current) = self.get(key, now) else {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_FOUND.to_vec(),
                        version: None,
                        change: Change::None,
                        slot: None,
                    });
                };
                let token = current.fencing_token;
                if let Err(e) = fencing::check(token, req.fencing_token) {
                    return Ok(Outcome::error(e));
                }
                if let Command::VDel { value, .. } = *command
                    && current.value != value
                {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_APPLIED.to_vec(),
                        version: Some(current.version),
                        change: Change::None,
                        slot: None,
                    });
                }
                let version = stamp(clock)?;
                self.remove(key);
                Outcome {
                    reply: resp3::REPLY_DELETED.to_vec(),
                    version: Some(version),
                    change: Change::Delete,
                    slot: None,
                }
            }
            // The registry handles KEYNOTIFY, `crate::scan` SCAN.
            Command::KeyNotify { .. } | Command::Scan { .. } => {
                Outcome::error(ServiceError::UnknownCommand)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &[u8], counter: u32, persist: bool) -> Entry {
        Entry {
            value: value.into(),
            version: Version { wall: 42, counter },
            fencing_token: None,
            expires_at: None,
            persist,
        }
    }

    #[test]
    fn slots_keep_every_field_for_any_key_length() {
        let mut t = Table::default();
        let token = Hlc {
            wall: 7,
            counter: 1,
            node: "lock".into(),
        };
        let long_key = vec![b'k'; 300]; // a two-byte length prefix
        let huge_key = vec![b'h'; 20_000]; // three bytes
        let mut fenced = entry(b"v3", (1 << 31) - 1, true);
        fenced.fencing_token = Some(Box::new(token.clone()));
        fenced.expires_at = Some(99);
        let cases: Vec<(&[u8], Entry)> = vec![
            (b"", entry(b"", 0, false)),
            (b"a", entry(b"value", 5, true)),
            (&long_key, entry(&[0u8; 1000], 6, false)),
            (&huge_key, fenced),
        ];
        for (k, e) in &cases {
            t.put(k, e.as_ref());
        }
        assert_eq!(t.len(), cases.len());
        for (k, e) in &cases {
            assert_eq!(t.entry(k).map(|v| v.to_owned()).as_ref(), Some(e));
        }
        assert_eq!(t.get(&huge_key, 99), None, "expired at its deadline");
        assert_eq!(t.next_deadline(), Some(99));
        // Replacing drops the old deadline; removing reports the persist flag.
        t.put(&huge_key, entry(b"x", 1, false).as_ref());
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.remove(b"a"), Some(true));
        assert_eq!(t.remove(b"a"), None);
        let keys: Vec<&[u8]> = t.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec![&b""[..], &huge_key[..], &long_key[..]],
            "key order"
        );
    }

    #[test]
    fn removing_moves_the_last_slot_and_keeps_every_key_findable() {
        let mut t = Table::default();
        let key = |i: u32| format!("k{i}").into_bytes();
        for i in 0..1000 {
            t.put(&key(i), entry(&i.to_le_bytes(), i, false).as_ref());
        }
        for i in (0..1000).filter(|i| i % 3 == 0) {
            assert_eq!(t.remove(&key(i)), Some(false));
        }
        for i in 0..1000 {
            let got = t.entry(&key(i)).map(|e| e.value.to_vec());
            let want = (i % 3 != 0).then(|| i.to_le_bytes().to_vec());
            assert_eq!(got, want, "key {i}");
        }
        assert_eq!(t.len(), 666);
        // Put back and overwrite after the moves.
        for i in 0..1000 {
            t.put(&key(i), entry(b"again", i, true).as_ref());
        }
        assert_eq!(t.len(), 1000);
        assert!((0..1000).all(|i| t.entry(&key(i)).is_some_and(|e| e.value == b"again")));
    }
}
