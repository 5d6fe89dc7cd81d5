//! The little-endian codec of the snapshot and journal formats: length-prefixed
//! bytes and strings, options, and the compound values both formats store
//! (a key's entry, an HLC, a reply message).
//!
//! ```text
//! bytes / str = u32 length (LE) + data; opt x = u8 0 | u8 1 + x;
//! entry   = bytes key, bytes value, u64 wall, u32 counter, opt hlc fencing token,
//!           opt u64 expires-at, u8 persist
//! hlc     = u64 wall, u64 counter, str node;
//! message = u8 kind, str topic, bytes payload, u8 qos, u8 retain, opt bytes corr,
//!           opt u32 expiry, opt str content type, opt u8 format indicator,
//!           opt str response topic, u32 n + n x (str, str) user properties,
//!           opt str target client
//! ```

use crate::hlc::Hlc;
use crate::table::{EntryMeta, EntryRef, Version};
use crate::types::{Bytes, Error, OutboundMessage, PublishKind, Str, str_of};

/// Little-endian encoder shared by snapshots and journal records.
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer(Vec::with_capacity(64))
    }
    /// The bytes written, followed by their CRC-32.
    pub(crate) fn finish_with_crc(mut self) -> Vec<u8> {
        let crc = crc32fast::hash(&self.0);
        self.u32(crc);
        self.0
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        // Keys, values and topics come from MQTT messages (< 256 MiB).
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(v);
    }
    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    pub(crate) fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                f(self, v);
            }
        }
    }
    /// A key and its entry (snapshots and put records share it).
    pub(crate) fn entry(&mut self, key: &[u8], e: EntryRef<'_>) {
        self.bytes(key);
        self.bytes(e.value);
        self.entry_tail(e);
    }
    /// What [`Writer::entry`] writes after the value.
    pub(crate) fn entry_tail(&mut self, e: EntryRef<'_>) {
        self.u64(e.version.wall);
        self.u32(e.version.counter);
        self.opt(e.fencing_token, |w, ft| w.hlc(ft));
        self.opt(e.expires_at, Writer::u64);
        self.u8(u8::from(e.persist));
    }
    pub(crate) fn hlc(&mut self, h: &Hlc) {
        self.u64(h.wall);
        self.u64(h.counter);
        self.str(&h.node);
    }
    pub(crate) fn message(&mut self, m: &OutboundMessage) {
        self.u8(match m.kind {
            PublishKind::Response => 0,
            PublishKind::Notification => 1,
        });
        self.str(&m.topic);
        self.bytes(&m.payload);
        self.u8(m.qos);
        self.u8(u8::from(m.retain));
        self.opt(m.correlation_data.as_deref(), Writer::bytes);
        self.opt(m.message_expiry_interval, Writer::u32);
        self.opt(m.content_type.as_deref(), Writer::str);
        self.opt(m.payload_format_indicator, Writer::u8);
        self.opt(m.response_topic.as_deref(), Writer::str);
        self.u32(u32::try_from(m.user_properties.len()).unwrap_or(u32::MAX));
        for (n, v) in &m.user_properties {
            self.str(n);
            self.str(v);
        }
        self.opt(m.target_client.as_deref(), Writer::str);
    }
}

/// Decoder for [`Writer`]'s encodings; errors are made with `bad`.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    bad: fn(String) -> Error,
    /// Whether a read failed for want of bytes (rather than on bad ones).
    short: bool,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8], bad: fn(String) -> Error) -> Reader<'a> {
        Reader {
            data,
            bad,
            short: false,
        }
    }
    /// Whether a read failed because the data ended (a streaming reader
    /// waits for more then).
    pub(crate) fn short(&self) -> bool {
        self.short
    }
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len()
    }
    /// The next `n` bytes.
    pub(crate) fn take_bytes(&mut self, n: usize) -> Result<&'a [u8], Error> {
        self.take(n)
    }
    fn err(&self, m: &str) -> Error {
        (self.bad)(m.to_string())
    }
    /// Fails unless everything was read.
    pub(crate) fn end(&self) -> Result<(), Error> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(self.err("trailing bytes"))
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.data.len() < n {
            self.short = true;
            return Err(self.err("truncated"));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Error> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], Error> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Result<String, Error> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("a string is not UTF-8"))
    }
    pub(crate) fn opt<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(self.err("bad option tag")),
        }
    }
    /// What [`Writer::entry`] wrote: the key, the value and the rest.
    pub(crate) fn entry(&mut self) -> Result<(&'a [u8], &'a [u8], EntryMeta), Error> {
        let key = self.bytes()?;
        let value = self.bytes()?;
        Ok((key, value, self.entry_tail()?))
    }
    /// What [`Writer::entry_tail`] wrote.
    pub(crate) fn entry_tail(&mut self) -> Result<EntryMeta, Error> {
        Ok(EntryMeta {
            version: Version {
                wall: self.u64()?,
                counter: self.u32()?,
            },
            fencing_token: self.opt(Reader::hlc)?,
            expires_at: self.opt(Reader::u64)?,
            persist: self.u8()? != 0,
        })
    }
    pub(crate) fn hlc(&mut self) -> Result<Hlc, Error> {
        Ok(Hlc {
            wall: self.u64()?,
            counter: self.u64()?,
            node: self.str()?,
        })
    }
    pub(crate) fn message(&mut self) -> Result<OutboundMessage, Error> {
        let kind = match self.u8()? {
            0 => PublishKind::Response,
            1 => PublishKind::Notification,
            _ => return Err(self.err("bad message kind")),
        };
        let topic = Str::from(self.str()?);
        let payload = Bytes::copy_from_slice(self.bytes()?);
        let qos = self.u8()?;
        let retain = self.u8()? != 0;
        let correlation_data = self.opt(|r| r.bytes().map(Bytes::copy_from_slice))?;
        let message_expiry_interval = self.opt(Reader::u32)?;
        let content_type = self.opt(Reader::str)?.map(|s| str_of(&s));
        let payload_format_indicator = self.opt(Reader::u8)?;
        let response_topic = self.opt(Reader::str)?.map(Str::from);
        let n = self.u32()?;
        let mut user_properties = Vec::new();
        for _ in 0..n {
            user_properties.push((str_of(&self.str()?), str_of(&self.str()?)));
        }
        let target_client = self.opt(Reader::str)?.map(Str::from);
        Ok(OutboundMessage {
            kind,
            topic,
            payload,
            qos,
            retain,
            correlation_data,
            message_expiry_interval,
            content_type,
            payload_format_indicator,
            response_topic,
            user_properties,
            target_client,
        })
    }
}
