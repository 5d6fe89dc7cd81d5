//! Journal records: every state change, in a versioned, checksummed binary
//! format, emitted (as [`Output::Journal`](crate::Output::Journal)) before
//! the replies they belong to, and replayed with [`crate::StateMachine::replay`].
//!
//! ```text
//! record = u8 format version | u8 kind | body | u32 CRC-32 of everything before it
//! kind 1 put     bytes key, bytes value, u64 wall, u32 counter,
//!                opt hlc fencing token, opt u64 expires-at, u8 persist
//! kind 2 delete  bytes key, u64 wall, u32 counter     (DEL / VDEL; the deletion's HLC)
//! kind 3 expire  bytes key, u64 wall, u32 counter     (expiry; the deletion's HLC)
//! kind 4 reply   str response topic, bytes correlation, u64 forget-at, message reply
//!                (a dedup-cache entry: a redelivered request gets the same reply)
//! kind 5 client reply (format version 2)
//!                str client, then kind 4's body
//!                (a dedup-cache entry charged to the client a broker or its
//!                response topic vouched for: a restart keeps each client's bound)
//! ```
//! A record is written in the oldest format version that has its kind
//! (kinds 1-4: 1; kind 5: 2), so a build that reads only version 1 refuses
//! exactly the records it cannot read.
//! Encodings of bytes, str, opt, hlc and message are those of
//! `codec.rs`. A record of a newer format version is refused with
//! [`Error::UnsupportedVersion`], never guessed at.
//!
//! A pure format: the state machine applies what `decode` returns
//! (`machine/recovery.rs`).

use crate::codec::{Reader, Writer};
use crate::rpc::Reply;
use crate::table::{EntryMeta, EntryRef, Version};
use crate::types::{Error, OutboundMessage};

/// The newest record format this build writes and reads.
pub const RECORD_VERSION: u8 = 2;

const PUT: u8 = 1;
const DELETE: u8 = 2;
const EXPIRE: u8 = 3;
const REPLY: u8 = 4;
const CLIENT_REPLY: u8 = 5;

/// The format version a record of `kind` is written in.
fn version_of(kind: u8) -> u8 {
    if kind == CLIENT_REPLY { 2 } else { 1 }
}

fn frame(kind: u8, body: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(version_of(kind));
    w.u8(kind);
    body(&mut w);
    w.finish_with_crc()
}

/// Appends a record of `kind` to `buf`.
fn frame_into(buf: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Writer)) {
    let mut w = Writer(core::mem::take(buf));
    let start = w.0.len();
    w.u8(version_of(kind));
    w.u8(kind);
    body(&mut w);
    let crc = crc32fast::hash(&w.0[start..]);
    w.u32(crc);
    *buf = w.0;
}

/// A put of `key` with this entry.
pub fn put(key: &[u8], e: EntryRef<'_>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(put_size(key, e));
    put_into(&mut buf, key, e);
    buf
}

/// Appends [`put`] to `buf`, in place (no copy of the value on its own).
pub fn put_into(buf: &mut Vec<u8>, key: &[u8], e: EntryRef<'_>) {
    frame_into(buf, PUT, |w| w.entry(key, e));
}

/// [`put`] in three parts: the bytes before the value, the value (not
/// copied: the caller has it), and the bytes after it, the checksum of
/// the whole record included. `head`, the value and `tail` in a row are
/// exactly [`put`].
pub fn put_around(key: &[u8], e: EntryRef<'_>) -> (Vec<u8>, Vec<u8>) {
    let mut head = Writer(Vec::with_capacity(2 + 4 + key.len() + 4));
    head.u8(version_of(PUT));
    head.u8(PUT);
    head.bytes(key);
    // Values come from MQTT messages (< 256 MiB).
    head.u32(u32::try_from(e.value.len()).unwrap_or(u32::MAX));
    let mut tail = Writer::new();
    tail.entry_tail(e);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head.0);
    crc.update(e.value);
    crc.update(&tail.0);
    tail.u32(crc.finalize());
    (head.0, tail.0)
}

/// The length of [`put`].
pub fn put_size(key: &[u8], e: EntryRef<'_>) -> usize {
    let fencing = e.fencing_token.map_or(0, |ft| 20 + ft.node.len());
    2 + 4 + key.len() + 4 + e.value.len() + 12 + 1 + fencing + 9 + 1 + 4
}

/// A decoded journal record.
#[derive(Debug)]
// One record is decoded at a time and applied at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Record<'a> {
    /// `key` now holds `value`, with `meta`.
    Put {
        /// The key.
        key: &'a [u8],
        /// Its value.
        value: &'a [u8],
        /// Its version, fencing token, expiry and persist flag.
        meta: EntryMeta,
    },
    /// `key` was deleted (DEL, VDEL) or expired at `version`.
    Remove {
        /// The key.
        key: &'a [u8],
        /// The deletion's version.
        version: Version,
    },
    /// A dedup-cache entry.
    Reply {
        /// The client it is charged to, if one was known (kind 5).
        client: Option<String>,
        /// The request's response topic.
        topic: String,
        /// The request's correlation data.
        correlation: &'a [u8],
        /// When the entry is forgotten (ms).
        forget_at: u64,
        /// The reply as sent, without its message expiry.
        reply: OutboundMessage,
    },
}

/// Checks a record (version, checksum) and decodes it.
pub(crate) fn decode(record: &[u8]) -> Result<Record<'_>, Error> {
    let bad = |m: &str| Error::BadRecord(m.to_string());
    let (&version, _) = record.split_first().ok_or_else(|| bad("empty record"))?;
    if version > RECORD_VERSION {
        return Err(Error::UnsupportedVersion(u32::from(version)));
    }
    if version == 0 || record.len() < 6 {
        return Err(bad("not a journal record"));
    }
    let (body, crc) = record.split_at(record.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err(bad("checksum mismatch"));
    }
    let mut r = Reader::new(&body[2..], Error::BadRecord);
    let decoded = match body[1] {
        PUT => {
            let (key, value, meta) = r.entry()?;
            Record::Put { key, value, meta }
        }
        DELETE | EXPIRE => {
            let key = r.bytes()?;
            let version = Version {
                wall: r.u64()?,
                counter: r.u32()?,
            };
            Record::Remove { key, version }
        }
        REPLY | CLIENT_REPLY => Record::Reply {
            client: if body[1] == CLIENT_REPLY {
                if version < 2 {
                    return Err(bad("a client reply in format version 1"));
                }
                Some(r.str()?)
            } else {
                None
            },
            topic: r.str()?,
            correlation: r.bytes()?,
            forget_at: r.u64()?,
            reply: r.message()?,
        },
        k => return Err(Error::BadRecord(format!("unknown record kind {k}"))),
    };
    r.end()?;
    Ok(decoded)
}

/// A DEL / VDEL of `key` at `version`.
pub fn delete(key: &[u8], version: Version) -> Vec<u8> {
    frame(DELETE, |w| {
        w.bytes(key);
        w.u64(version.wall);
        w.u32(version.counter);
    })
}

/// The expiry of `key` at `version`.
pub fn expire(key: &[u8], version: Version) -> Vec<u8> {
    frame(EXPIRE, |w| {
        w.bytes(key);
        w.u64(version.wall);
        w.u32(version.counter);
    })
}

/// A dedup-cache entry (charged to `client`, if known).
pub fn reply(
    client: Option<&str>,
    response_topic: &str,
    correlation: &[u8],
    forget_at: u64,
    reply: &OutboundMessage,
) -> Vec<u8> {
    let kind = if client.is_some() {
        CLIENT_REPLY
    } else {
        REPLY
    };
    frame(kind, |w| {
        if let Some(id) = client {
            w.str(id);
        }
        w.str(response_topic);
        w.bytes(correlation);
        w.u64(forget_at);
        w.message(reply);
    })
}

/// [`reply`] of the message [`Reply::message`] makes for `topic` and
/// `correlation` (no message expiry), appended to `buf` in place: the same
/// bytes, without building the message first (every cached reply of a
/// journaled store is written so).
#[allow(clippy::too_many_arguments)]
pub fn reply_into(
    buf: &mut Vec<u8>,
    client: Option<&str>,
    topic: &str,
    correlation: &[u8],
    forget_at: u64,
    r: &Reply,
    node: &str,
    source_id: Option<&str>,
) {
    let kind = if client.is_some() {
        CLIENT_REPLY
    } else {
        REPLY
    };
    frame_into(buf, kind, |w| {
        if let Some(id) = client {
            w.str(id);
        }
        w.str(topic);
        w.bytes(correlation);
        w.u64(forget_at);
        write_reply_message(w, topic, correlation, r, node, source_id);
    });
}

/// Writes the message [`Reply::message`] makes for `topic` and
/// `correlation` (no message expiry) as [`Writer::message`] writes it,
/// without building the message (its strings, its list of properties,
/// its timestamp's text): how journal records and snapshots keep a cached
/// reply.
pub(crate) fn write_reply_message(
    w: &mut Writer,
    topic: &str,
    correlation: &[u8],
    r: &Reply,
    node: &str,
    source_id: Option<&str>,
) {
    use crate::rpc::{CONTENT_TYPE, PROTOCOL_VERSION, prop};
    w.u8(0);
    w.str(topic);
    w.bytes(&r.payload);
    w.u8(1);
    w.u8(0);
    w.opt(Some(correlation), Writer::bytes);
    w.opt(None, Writer::u32);
    w.opt(Some(CONTENT_TYPE), Writer::str);
    w.opt(Some(0), Writer::u8);
    w.opt(None, Writer::str);
    let n = 3 + usize::from(r.version.is_some()) + r.extra.len() + usize::from(source_id.is_some());
    w.u32(u32::try_from(n).unwrap_or(u32::MAX));
    w.str(prop::STATUS);
    w.str(r.status.code());
    w.str(prop::PROTOCOL_VERSION);
    w.str(PROTOCOL_VERSION);
    if let Some(v) = r.version {
        w.str(prop::TIMESTAMP);
        // The text in place, its length written after it.
        let at = w.0.len();
        w.u32(0);
        v.encode_into(node, &mut w.0);
        let len = u32::try_from(w.0.len() - at - 4).unwrap_or(u32::MAX);
        w.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    for (name, value) in r.extra.iter() {
        w.str(name);
        w.str(value);
    }
    if let Some(id) = source_id {
        w.str(prop::SOURCE_ID);
        w.str(id);
    }
    w.str(prop::HIGH_PRIORITY);
    w.str("");
    w.opt(None, Writer::str);
}

/// About how long [`reply_into`] writes (at least).
pub fn reply_size(
    client: Option<&str>,
    topic: &str,
    correlation: &[u8],
    r: &Reply,
    node: &str,
) -> usize {
    let extra: usize = r.extra.iter().map(|(n, v)| 8 + n.len() + v.len()).sum();
    client.map_or(0, |c| 4 + c.len())
        + 2 * topic.len()
        + 2 * correlation.len()
        + r.payload.len()
        + extra
        + 2 * node.len()
        + 256
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{Reply, Status, prop};
    use crate::types::Str;

    /// `put_around`'s parts and the value are `put`'s bytes.
    #[test]
    fn a_put_in_three_parts_is_the_same_bytes() {
        let token = crate::hlc::Hlc {
            wall: 3,
            counter: 4,
            node: "lock".into(),
        };
        for (ft, expires_at) in [(None, None), (Some(&token), Some(77))] {
            let e = EntryRef {
                value: b"the value",
                version: Version {
                    wall: 10,
                    counter: 2,
                },
                fencing_token: ft,
                expires_at,
                persist: true,
            };
            let (head, tail) = put_around(b"key", e);
            assert_eq!([&head[..], e.value, &tail[..]].concat(), put(b"key", e));
        }
    }

    /// `reply_into` writes what `reply` of the built message writes.
    #[test]
    fn a_reply_record_in_place_is_the_same_bytes() {
        let version = Some(Version {
            wall: 1_700_000_000_000,
            counter: 3,
        });
        let replies = [
            Reply::ok(&b"+OK\r\n"[..], version),
            Reply::ok(&b":1\r\n"[..], None),
            Reply::status(
                Status::BadRequest,
                "no".into(),
                &[(prop::PROPERTY_NAME, "Correlation Data".into())],
            ),
        ];
        for r in &replies {
            for (source, client) in [(None, None), (Some("statestore"), Some("c"))] {
                let message = r.message(
                    Str::from("clients/c/resp"),
                    Some(crate::types::Bytes::copy_from_slice(&[1, 2, 3])),
                    None,
                    "node",
                    source.map(Str::from),
                );
                let built = reply(client, "clients/c/resp", &[1, 2, 3], 99, &message);
                let mut buf = vec![7u8];
                reply_into(
                    &mut buf,
                    client,
                    "clients/c/resp",
                    &[1, 2, 3],
                    99,
                    r,
                    "node",
                    source,
                );
                assert_eq!(&buf[1..], &built[..], "{r:?} {source:?}");
                assert!(reply_size(client, "clients/c/resp", &[1, 2, 3], r, "node") >= built.len());
                match decode(&built) {
                    Ok(Record::Reply {
                        client: c, topic, ..
                    }) => {
                        assert_eq!((c.as_deref(), topic.as_str()), (client, "clients/c/resp"));
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(
                    built[0],
                    if client.is_some() { 2 } else { 1 },
                    "its format version"
                );
            }
        }
    }
}
