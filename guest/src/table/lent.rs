//! A large value kept in the buffer it arrived in.
//!
//! (Also how a restore or a journal replay puts a large value: straight
//! into its slot, [`Table::put_blob`] and [`Table::put_in`].)
//!
//! A value crosses into the guest inside its request's batch, one buffer
//! the guest owns for the call. Copying a 64 MiB value out of it into the
//! table needs a second 64 MiB region while the batch is alive, and the
//! guest's linear memory never shrinks: every large SET would leave a
//! request's worth of free memory behind. So a SET whose value is most of
//! its batch is *lent*: [`Table::execute`] holds it as a [`Lent`] (the
//! entry without its value, and where the value lies in the batch), the
//! state machine ends the call after that input, and once the batch is no
//! longer borrowed [`Table::put_lent`] turns the batch buffer itself into
//! the key's slot: the value moved to the front in place, the rest of the
//! buffer given back to the allocator.

use core::ops::Range;

use super::{EntryRef, Slot, Table, key_prefix};
use crate::hlc::{Hlc, Version};

/// An entry without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryMeta {
    /// Its version (the HLC of the SET that wrote it).
    pub version: Version,
    /// The fencing token protecting it.
    pub fencing_token: Option<Hlc>,
    /// When it expires (ms), if ever.
    pub expires_at: Option<u64>,
    /// Set with `aio-persistence: true`.
    pub persist: bool,
}

impl EntryMeta {
    /// `e` without its value.
    pub fn of(e: EntryRef<'_>) -> EntryMeta {
        EntryMeta {
            version: e.version,
            fencing_token: e.fencing_token.cloned(),
            expires_at: e.expires_at,
            persist: e.persist,
        }
    }

    /// The entry with `value`.
    pub fn with<'a>(&'a self, value: &'a [u8]) -> EntryRef<'a> {
        EntryRef {
            value,
            version: self.version,
            fencing_token: self.fencing_token.as_ref(),
            expires_at: self.expires_at,
            persist: self.persist,
        }
    }
}

/// A SET applied whose value is still in its caller's buffer.
#[derive(Debug, Clone)]
pub struct Lent {
    key: Box<[u8]>,
    meta: EntryMeta,
    /// Where the value lies in the buffer.
    at: Range<usize>,
}

impl Lent {
    pub(super) fn new(key: &[u8], e: EntryRef<'_>, at: Range<usize>) -> Lent {
        Lent {
            key: key.into(),
            meta: EntryMeta::of(e),
            at,
        }
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The entry, with `value` (the bytes the lent value spans in the buffer).
    pub fn entry<'a>(&'a self, value: &'a [u8]) -> EntryRef<'a> {
        self.meta.with(value)
    }
}

impl Table {
    /// The SET held since [`Table::execute`] lent its value, if any.
    pub fn lent(&self) -> Option<&Lent> {
        self.lent.as_ref()
    }

    /// Forgets a lent SET (a call that stopped before handing its buffer
    /// over).
    pub fn drop_lent(&mut self) {
        self.lent = None;
    }

    /// Puts the lent SET, its value taken from `buf` (the buffer its
    /// value lies in) without copying it elsewhere: `buf` becomes
    /// the key's slot. Nothing happens if no SET is lent.
    pub fn put_lent(&mut self, buf: Vec<u8>) {
        if let Some(lent) = self.lent.take() {
            self.put_in(buf, &lent.key, lent.at, &lent.meta);
        }
    }

    /// Puts `key` with `meta` and the value at `at` of `buf`, which
    /// becomes the key's slot: the value is not copied elsewhere.
    pub fn put_in(&mut self, buf: Vec<u8>, key: &[u8], at: Range<usize>, meta: &EntryMeta) {
        self.put_blob(blob_in(buf, key, at), meta);
    }

    /// Puts the key and value of `blob` (made by [`blob_start`] and the
    /// value appended) with `meta`.
    pub fn put_blob(&mut self, blob: Box<[u8]>, meta: &EntryMeta) {
        let slot = Slot::with_blob(blob, meta.with(&[]));
        let key: Box<[u8]> = slot.key().into();
        let at = self.position(&key);
        self.put_slot(&key, slot, meta.expires_at, at);
    }
}

/// The start of a slot's blob for `key` and a value of `value_len` bytes,
/// with room for exactly the value: append it, then [`Table::put_blob`].
pub fn blob_start(key: &[u8], value_len: usize) -> Vec<u8> {
    let (prefix, n) = key_prefix(key);
    let mut blob = Vec::with_capacity(n + key.len() + value_len);
    blob.extend_from_slice(&prefix[..n]);
    blob.extend_from_slice(key);
    blob
}

/// A slot's blob (length prefix, key, value) made in `buf`, whose bytes at
/// `at` are the value: the value moves to just after the key, and `buf`
/// is cut to size (a shrink in place: the allocator takes the tail back).
fn blob_in(mut buf: Vec<u8>, key: &[u8], at: Range<usize>) -> Box<[u8]> {
    let (prefix, n) = key_prefix(key);
    let start = n + key.len();
    let len = at.len();
    if buf.len() < start + len {
        // Not the case for a value inside a request (its key and more come
        // first), but the layout must hold whatever `at` is.
        buf.resize(start + len, 0);
    }
    buf.copy_within(at, start);
    buf[..n].copy_from_slice(&prefix[..n]);
    buf[n..start].copy_from_slice(key);
    buf.truncate(start + len);
    buf.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_value_becomes_its_slot_in_the_same_buffer() {
        let mut t = Table::default();
        let key = b"big".as_slice();
        let mut buf = b"header bytes, the key big, then: ".to_vec();
        let at = buf.len()..buf.len() + 100_000;
        buf.extend((0..100_000u32).map(|i| i as u8));
        buf.extend_from_slice(b"\r\ntrailer");
        let value = buf[at.clone()].to_vec();
        let e = EntryRef {
            value: &value,
            version: Version {
                wall: 5,
                counter: 1,
            },
            fencing_token: None,
            expires_at: Some(99),
            persist: true,
        };
        t.put(key, EntryRef { value: b"old", ..e });
        t.lent = Some(Lent::new(key, e, at));
        assert_eq!(t.lent().map(Lent::key), Some(key));
        let before = buf.as_ptr();
        t.put_lent(buf);
        assert!(t.lent().is_none());
        let got = t.entry(key).expect("put");
        assert_eq!(got.value, &value[..]);
        assert_eq!(got.version, e.version);
        assert_eq!((got.expires_at, got.persist), (Some(99), true));
        assert_eq!(t.bytes(), 3 + 100_000);
        assert_eq!(t.next_deadline(), Some(99));
        // The key's blob is the buffer the value arrived in.
        let slot = &t.slots[t.position(key).expect("there")];
        assert_eq!(slot.blob.as_ptr(), before);
        // A key longer than a one-byte prefix, and a value at the start of
        // a buffer too short to hold the key ahead of it.
        let long = vec![b'k'; 300];
        let e2 = EntryRef { value: b"abc", ..e };
        t.lent = Some(Lent::new(&long, e2, 0..3));
        t.put_lent(b"abc".to_vec());
        assert_eq!(t.entry(&long).map(|e| e.value), Some(&b"abc"[..]));
        t.put_lent(Vec::new());
        assert_eq!(t.len(), 2, "nothing lent, nothing put");
    }
}
