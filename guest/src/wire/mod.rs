//! The flat encodings that cross the component boundary: a batch of inputs
//! (for `handle-wire`) and the list of outputs it returns. `wit/WIRE.md`
//! specifies both byte by byte, for hosts in any language; this module is
//! the guest's codec and the Rust hosts'.
//!
//! Lowering a record of strings into a component costs one `realloc` call
//! into the guest per string and list, and lifting outputs one allocation per
//! string on the host side: for a small request that was most of the cost of
//! crossing. A batch in this encoding crosses as one `list<u8>` each way; the
//! guest reads the messages in place, without copying their fields.
//!
//! ```text
//! batch   = u8 version (4), u32 count, input*         (version 1: message* only)
//! input   = u8 0, message | u8 1, str client-id (disconnected)
//!         | u8 2, str client-id, via (disconnected-via; version 4)
//!         | u8 3, via (replica-started; version 4)
//! message = str topic, bytes payload, u8 qos, opt<str> response-topic,
//!           opt<bytes> correlation, opt<u32> message-expiry, opt<str> content-type,
//!           opt<u8> payload-format, u32 n, (str name, str value)*n,
//!           opt<str> client-id, opt<u64> received-at,
//!           opt<str> username, u32 n, (str name, str value)*n attributes,
//!           opt<via>
//!           (version 4; version 3 ends at the attributes, version 2 at received-at)
//! via     = u64 replica, u64 started
//! outputs = u8 version (5), u32 count, output*
//! output  = u8 1, bytes record | u8 2, opt<str> client-id, str reason
//!         | u8 3, reply | u8 4, notify | u8 5, u32 handled (last only)
//!         | u8 6, bytes head, u32 offset, u32 length, bytes tail
//!           (a record: head, the call's batch bytes [offset, offset + length),
//!           then tail; version 5)
//! reply   = str topic, opt<bytes> correlation, opt<u32> message-expiry, u16 status,
//!           bytes payload, opt<str> timestamp, opt<str> source-id,
//!           u32 n, (str name, str value)*n
//! notify  = str target-client, (u8 0, bytes key, bytes payload, str timestamp,
//!           opt<str> source-id | u8 1: key, payload, timestamp and source-id
//!           of the list's previous notify)
//! str, bytes = u32 length, bytes    opt<T> = u8 0 | u8 1, T    integers little-endian
//! ```
//!
//! Every publish is in a compact form: the properties every reply (or
//! notification) carries in the same order are implied, and
//! [`rpc::reply_message`] ([`rpc::notification_message`]) builds the MQTT
//! message from the parts, on the host. The guest writes its outputs
//! straight into the list ([`OutputWriter`]) as it makes them: there is no
//! other output path.

use crate::authz::Attributes;
use crate::hlc::Version;
use crate::notify;
use crate::rpc::{self, REQUEST_TOPIC, Reply, RequestProps, Status};
use crate::types::{
    Bytes, Error, InboundMessage, Input, OutboundMessage, Output, Str, Via, interned_bytes,
};

/// Version byte of the batches this build writes.
pub const BATCH_VERSION: u8 = 4;

/// The batch versions this build reads: 1 (messages only), 2 (tagged
/// inputs), 3 (messages with their user name and attributes) and 4
/// (messages with their `via`, and the inputs `disconnected-via` and
/// `replica-started`).
pub const BATCH_VERSIONS: &[u8] = &[1, 2, 3, 4];

/// Version byte that starts every output list: 4 since a call may stop
/// early (the `more` output) to bound what crosses the boundary, 5 since a
/// journal record may name bytes of the call's batch (`journal-spliced`)
/// rather than carry a copy of a large value.
pub const OUTPUTS_VERSION: u8 = 5;

/// What the notifications of one change have in common: what the compact
/// `notify` output holds (once for all observers).
#[derive(Debug, Clone, Copy)]
pub struct NotificationParts<'a> {
    /// The key that changed.
    pub key: &'a [u8],
    /// RESP3 payload.
    pub payload: &'a [u8],
    /// `__ts`: the version of the change, of `node`.
    pub version: Version,
    /// The store's HLC node id.
    pub node: &'a str,
    /// `__srcId`: the store's own client id.
    pub source_id: Option<&'a str>,
}

/// Where a reply goes and how it is stamped: what the compact `reply`
/// output holds besides the [`Reply`] itself.
#[derive(Debug, Clone, Copy)]
pub struct ReplyTo<'a> {
    /// The request's response topic.
    pub topic: &'a str,
    /// The request's correlation data.
    pub correlation: Option<&'a [u8]>,
    /// Message expiry interval, seconds.
    pub expiry: Option<u32>,
    /// The store's HLC node id (the reply's version is of it).
    pub node: &'a str,
    /// `__srcId`: the store's own client id.
    pub source_id: Option<&'a str>,
}

/// An inbound message borrowed from its encoding (or from an
/// [`InboundMessage`]): what the state machine reads of a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageRef<'a> {
    /// Topic name.
    pub topic: &'a str,
    /// RESP3 payload.
    pub payload: &'a [u8],
    /// QoS.
    pub qos: u8,
    /// MQTT5 Response Topic.
    pub response_topic: Option<&'a str>,
    /// MQTT5 Correlation Data.
    pub correlation_data: Option<&'a [u8]>,
    /// MQTT5 Message Expiry Interval, seconds.
    pub message_expiry_interval: Option<u32>,
    /// The reserved user properties.
    pub props: RequestProps<'a>,
    /// The publisher's client id, when the host knows it.
    pub client_id: Option<&'a str>,
    /// When the host received it, if earlier than `now`.
    pub received_at: Option<u64>,
    /// The publisher's authenticated user name, when the host knows it.
    pub username: Option<&'a str>,
    /// The publisher's attributes.
    pub attributes: Attributes<'a>,
    /// Where the publisher is connected, in a replicated store.
    pub via: Option<Via>,
}

impl<'a> MessageRef<'a> {
    /// A view of an owned message.
    pub fn of(m: &'a InboundMessage) -> MessageRef<'a> {
        MessageRef {
            topic: &m.topic,
            payload: &m.payload,
            qos: m.qos,
            response_topic: m.response_topic.as_deref(),
            correlation_data: m.correlation_data.as_deref(),
            message_expiry_interval: m.message_expiry_interval,
            props: RequestProps::of(
                m.user_properties
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str())),
            ),
            client_id: m.client_id.as_deref(),
            received_at: m.received_at,
            username: m.username.as_deref(),
            attributes: Attributes::Owned(&m.attributes),
            via: m.via,
        }
    }
}

/// One input of a batch, borrowed from its encoding.
#[derive(Debug, Clone, Copy)]
// Nearly every input is a message: boxing it would allocate per request.
#[allow(clippy::large_enum_variant)]
pub enum InputRef<'a> {
    /// A message received on the request topic.
    Message(MessageRef<'a>),
    /// A client went away.
    Disconnected(&'a str),
    /// A client went away from a replica ([`Input::DisconnectedVia`]).
    DisconnectedVia(&'a str, Via),
    /// A replica started a new life ([`Input::ReplicaStarted`]).
    ReplicaStarted(Via),
}

/// Appends the encoding of values to a buffer.
#[derive(Debug, Default, Clone)]
struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// A buffer that starts with `version` and a count to patch.
    fn start(version: u8, capacity: usize) -> Encoder {
        let mut buf = Vec::with_capacity(capacity);
        buf.push(version);
        buf.extend_from_slice(&0u32.to_le_bytes());
        Encoder { buf }
    }

    fn finish(mut self, count: usize) -> Vec<u8> {
        let n = u32::try_from(count).unwrap_or(u32::MAX);
        self.buf[1..5].copy_from_slice(&n.to_le_bytes());
        self.buf
    }

    #[inline]
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    #[inline]
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    fn bytes(&mut self, v: &[u8]) {
        // Every field comes from an MQTT packet (< 256 MiB) or the guest.
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        reserve_for(&mut self.buf, v.len());
        self.buf.extend_from_slice(v);
    }

    #[inline]
    fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    #[inline]
    fn opt<T>(&mut self, v: Option<T>, put: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                put(self, v);
            }
        }
    }

    fn props<'p>(&mut self, props: impl ExactSizeIterator<Item = (&'p str, &'p str)>) {
        self.u32(u32::try_from(props.len()).unwrap_or(u32::MAX));
        for (name, value) in props {
            self.str(name);
            self.str(value);
        }
    }

    fn message(&mut self, m: &InboundMessage) {
        self.str(&m.topic);
        self.bytes(&m.payload);
        self.u8(m.qos);
        self.opt(m.response_topic.as_deref(), Self::str);
        self.opt(m.correlation_data.as_deref(), Self::bytes);
        self.opt(m.message_expiry_interval, Self::u32);
        self.opt(m.content_type.as_deref(), Self::str);
        self.opt(m.payload_format_indicator, Self::u8);
        self.props(
            m.user_properties
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        self.opt(m.client_id.as_deref(), Self::str);
        self.opt(m.received_at, Self::u64);
        self.opt(m.username.as_deref(), Self::str);
        self.props(m.attributes.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        self.opt(m.via, Self::via);
    }

    fn via(&mut self, v: Via) {
        self.u64(v.replica);
        self.u64(v.started);
    }

    /// Appends a version as the text of an HLC of `node`.
    fn version(&mut self, v: Version, node: &str) {
        let at = self.buf.len();
        self.u32(0);
        v.encode_into(node, &mut self.buf);
        let n = u32::try_from(self.buf.len() - at - 4).unwrap_or(u32::MAX);
        self.buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
    }
}

/// Encodes a batch of inputs.
pub fn encode_batch(inputs: &[Input<'_>]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_batch_into(&mut buf, inputs);
    buf
}

/// [`encode_batch`] into a buffer that is cleared first (a host reuses one).
pub fn encode_batch_into(buf: &mut Vec<u8>, inputs: &[Input<'_>]) {
    let size: usize = inputs
        .iter()
        .map(|i| match i {
            Input::Disconnected(id) | Input::DisconnectedVia(id, _) => 24 + id.len(),
            Input::ReplicaStarted(_) => 24,
            Input::Message(m) => {
                64 + m.topic.len()
                    + m.payload.len()
                    + m.response_topic.as_ref().map_or(0, String::len)
                    + m.correlation_data.as_ref().map_or(0, Vec::len)
                    + m.content_type.as_ref().map_or(0, String::len)
                    + m.client_id.as_ref().map_or(0, String::len)
                    + m.username.as_ref().map_or(0, String::len)
                    + m.attributes
                        .iter()
                        .map(|(n, v)| 8 + n.len() + v.len())
                        .sum::<usize>()
                    + m.user_properties
                        .iter()
                        .map(|(n, v)| 8 + n.len() + v.len())
                        .sum::<usize>()
            }
        })
        .sum();
    buf.clear();
    buf.reserve(5 + size);
    buf.push(BATCH_VERSION);
    buf.extend_from_slice(&0u32.to_le_bytes());
    let mut e = Encoder {
        buf: std::mem::take(buf),
    };
    for i in inputs {
        match i {
            Input::Message(m) => {
                e.u8(0);
                e.message(m);
            }
            Input::Disconnected(id) => {
                e.u8(1);
                e.str(id);
            }
            Input::DisconnectedVia(id, via) => {
                e.u8(2);
                e.str(id);
                e.via(*via);
            }
            Input::ReplicaStarted(via) => {
                e.u8(3);
                e.via(*via);
            }
        }
    }
    *buf = e.finish(inputs.len());
}

/// An output list being written, one input at a time: where the state
/// machine writes every output as it makes it (no output is built as a
/// value first).
///
/// The journal records of an input go ahead of its other outputs (a host
/// makes them durable before it publishes anything of the same input):
/// [`OutputWriter::journal`] inserts a record after the input's earlier
/// records, before anything else the input wrote. This is the only place
/// that rule is kept.
#[derive(Debug, Clone)]
pub struct OutputWriter {
    e: Encoder,
    count: usize,
    /// Where the current input's next journal record goes.
    records_at: usize,
}

impl Default for OutputWriter {
    fn default() -> Self {
        OutputWriter::new(0)
    }
}

impl OutputWriter {
    /// An empty list with room for `capacity` bytes.
    pub fn new(capacity: usize) -> OutputWriter {
        let e = Encoder::start(OUTPUTS_VERSION, capacity.max(5));
        let records_at = e.buf.len();
        OutputWriter {
            e,
            count: 0,
            records_at,
        }
    }

    /// The next outputs belong to a new input.
    pub fn begin_input(&mut self) {
        self.records_at = self.e.buf.len();
    }

    /// Writes a journal record of the current input after its earlier
    /// records and before its other outputs.
    pub fn journal(&mut self, record: &[u8]) {
        self.journal_with(record.len(), |buf| buf.extend_from_slice(record));
    }

    /// [`OutputWriter::journal`] of the record that `write` appends to the
    /// list in place (about `size` bytes): a record of a large value is
    /// not built on its own first, then copied.
    pub fn journal_with(&mut self, size: usize, write: impl FnOnce(&mut Vec<u8>)) {
        let (at, end) = (self.records_at, self.e.buf.len());
        reserve_for(&mut self.e.buf, size + 5);
        self.e.u8(1);
        self.e.u32(0);
        let body = self.e.buf.len();
        write(&mut self.e.buf);
        let len = u32::try_from(self.e.buf.len() - body).unwrap_or(u32::MAX);
        self.e.buf[body - 4..body].copy_from_slice(&len.to_le_bytes());
        let written = self.e.buf.len() - end;
        if at != end {
            // Move it from the end to its place.
            self.e.buf[at..].rotate_right(written);
        }
        self.records_at = at + written;
        self.count += 1;
    }

    /// [`OutputWriter::journal`] of the record made of `head`, the bytes
    /// `at` of the call's batch (which the host has: a large value is not
    /// copied into the list), and `tail`.
    pub fn journal_spliced(&mut self, head: &[u8], at: core::ops::Range<usize>, tail: &[u8]) {
        let end = self.e.buf.len();
        self.e.u8(6);
        self.e.bytes(head);
        // Batches are lists the host lowered into a 32-bit memory.
        self.e.u32(u32::try_from(at.start).unwrap_or(u32::MAX));
        self.e.u32(u32::try_from(at.len()).unwrap_or(u32::MAX));
        self.e.bytes(tail);
        let written = self.e.buf.len() - end;
        if self.records_at != end {
            self.e.buf[self.records_at..].rotate_right(written);
        }
        self.records_at += written;
        self.count += 1;
    }

    /// A client broke a protocol rule.
    pub fn violation(&mut self, client_id: Option<&str>, reason: &str) {
        self.e.u8(2);
        self.e.opt(client_id, Encoder::str);
        self.e.str(reason);
        self.count += 1;
    }

    /// Appends a reply of the current input: every reply the store sends
    /// is written here.
    pub fn reply(&mut self, to: &ReplyTo<'_>, r: &Reply) {
        let e = &mut self.e;
        e.u8(3);
        e.str(to.topic);
        e.opt(to.correlation, Encoder::bytes);
        e.opt(to.expiry, Encoder::u32);
        e.buf.extend_from_slice(&(r.status as u16).to_le_bytes());
        e.bytes(&r.payload);
        e.opt(r.version, |e, v| e.version(v, to.node));
        e.opt(to.source_id, Encoder::str);
        e.props(r.extra.iter().map(|(n, v)| (&**n, &**v)));
        self.count += 1;
    }

    /// Appends a compact notification of the current input to each of
    /// `observers`.
    pub fn notifications<'c>(
        &mut self,
        n: &NotificationParts<'_>,
        observers: impl Iterator<Item = &'c str>,
    ) {
        let mut first = true;
        for client in observers {
            self.e.u8(4);
            self.e.str(client);
            if first {
                self.e.u8(0);
                self.e.bytes(n.key);
                self.e.bytes(n.payload);
                self.e.version(n.version, n.node);
                self.e.opt(n.source_id, Encoder::str);
                first = false;
            } else {
                self.e.u8(1);
            }
            self.count += 1;
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.e.buf.len()
    }

    /// Whether nothing but the header is written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The call stops here, after `handled` inputs: the last output.
    pub fn more(&mut self, handled: u32) {
        self.e.u8(5);
        self.e.u32(handled);
        self.count += 1;
    }

    /// The encoded list.
    pub fn finish(self) -> Vec<u8> {
        self.e.finish(self.count)
    }
}

/// Room past a large field for what follows it in the same list.
const SLACK: usize = 64 << 10;

/// Makes room for `n` more bytes in `buf`. A large field gets exactly its
/// room and some slack, rather than a doubling: an output list holding a
/// 64 MiB value is 64 MiB, not 128 (the guest's memory never shrinks).
#[inline]
fn reserve_for(buf: &mut Vec<u8>, n: usize) {
    if n >= SLACK && buf.capacity() - buf.len() < n {
        buf.reserve_exact(n + SLACK);
    }
}

/// Reads values from an encoding; every read checks bounds.
#[derive(Debug)]
pub struct Decoder<'a> {
    rest: &'a [u8],
}

#[cold]
#[inline(never)]
fn bad(what: &str) -> Error {
    Error::Other(format!("malformed wire batch: {what}"))
}

impl<'a> Decoder<'a> {
    /// Checks the version byte (one of `versions`); returns the decoder and
    /// the item count.
    fn start(buf: &'a [u8], versions: &[u8]) -> Result<(Decoder<'a>, u32), Error> {
        let mut d = Decoder { rest: buf };
        match d.u8()? {
            v if versions.contains(&v) => {}
            v => return Err(Error::UnsupportedVersion(u32::from(v))),
        }
        let n = d.u32()?;
        Ok((d, n))
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.rest.len() < n {
            return Err(bad("truncated"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    fn u16(&mut self) -> Result<u16, Error> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u64(&mut self) -> Result<u64, Error> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    #[inline]
    fn bytes(&mut self) -> Result<&'a [u8], Error> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    #[inline]
    fn str(&mut self) -> Result<&'a str, Error> {
        utf8(self.bytes()?)
    }

    #[inline]
    fn opt<T>(
        &mut self,
        get: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        match self.u8()? {
            0 => Ok(None),
            1 => get(self).map(Some),
            _ => Err(bad("an option tag is not 0 or 1")),
        }
    }

    /// A message of a batch of `version`: from 3 on it carries its user
    /// name and attributes, from 4 on its `via`.
    fn message_ref(&mut self, version: u8) -> Result<MessageRef<'a>, Error> {
        // The request topic needs no UTF-8 check: equal bytes are the constant.
        let topic = match self.bytes()? {
            t if t == REQUEST_TOPIC.as_bytes() => REQUEST_TOPIC,
            t => utf8(t)?,
        };
        let payload = self.bytes()?;
        let qos = self.u8()?;
        let response_topic = self.opt(Self::str)?;
        let correlation_data = self.opt(Self::bytes)?;
        let message_expiry_interval = self.opt(Self::u32)?;
        // Read past, never used: no UTF-8 check.
        let _content_type = self.opt(Self::bytes)?;
        let _payload_format = self.opt(Self::u8)?;
        let mut props = RequestProps::default();
        let n = self.u32()?;
        for _ in 0..n {
            let name = self.bytes()?;
            let value = self.bytes()?;
            // Only the reserved properties are read, so only their values
            // need to be UTF-8 (the others are skipped unchecked).
            if let Some(slot) = props.slot(name) {
                let value = utf8(value)?;
                if slot.is_none() {
                    *slot = Some(value);
                }
            }
        }
        let client_id = self.opt(Self::str)?;
        let received_at = self.opt(Self::u64)?;
        let (username, attributes) = if version >= 3 {
            let username = self.opt(Self::str)?;
            let start = self.rest;
            let n = self.u32()?;
            for _ in 0..n {
                self.str()?;
                self.str()?;
            }
            let used = start.len() - self.rest.len();
            (username, Attributes::Encoded(&start[..used]))
        } else {
            (None, Attributes::default())
        };
        let via = if version >= 4 {
            self.opt(Self::via)?
        } else {
            None
        };
        Ok(MessageRef {
            topic,
            payload,
            qos,
            response_topic,
            correlation_data,
            message_expiry_interval,
            props,
            client_id,
            received_at,
            username,
            attributes,
            via,
        })
    }

    fn via(&mut self) -> Result<Via, Error> {
        Ok(Via {
            replica: self.u64()?,
            started: self.u64()?,
        })
    }

    /// A string of `base` (which this decoder reads): a static string if
    /// [`interned`] knows it, else a slice sharing `base`'s buffer.
    fn shared_str(&mut self, base: &Bytes) -> Result<Str, Error> {
        let raw = self.bytes()?;
        if let Some(s) = interned_bytes(raw) {
            return Ok(Str::from_static(s));
        }
        Str::try_from(base.slice_ref(raw)).map_err(|_| bad("a string is not UTF-8"))
    }

    /// A string of `base` that is not one of the interned ones (a topic, a
    /// timestamp), sharing its buffer.
    fn shared_text(&mut self, base: &Bytes) -> Result<Str, Error> {
        let raw = self.bytes()?;
        Str::try_from(base.slice_ref(raw)).map_err(|_| bad("a string is not UTF-8"))
    }

    /// Bytes of `base`, sharing its buffer.
    fn shared_bytes(&mut self, base: &Bytes) -> Result<Bytes, Error> {
        Ok(base.slice_ref(self.bytes()?))
    }

    fn output(
        &mut self,
        base: &Bytes,
        batch: &[u8],
        last: &mut Option<Notification>,
    ) -> Result<Output, Error> {
        Ok(match self.u8()? {
            1 => Output::Journal(self.bytes()?.to_vec()),
            6 => {
                let head = self.bytes()?;
                let (at, len) = (self.u32()? as usize, self.u32()? as usize);
                let tail = self.bytes()?;
                let middle = at
                    .checked_add(len)
                    .and_then(|end| batch.get(at..end))
                    .ok_or_else(|| bad("a spliced record names bytes past its batch"))?;
                Output::Journal([head, middle, tail].concat())
            }
            2 => Output::Violation {
                client_id: self.opt(Self::str)?.map(str::to_string),
                reason: self.str()?.to_string(),
            },
            3 => Output::Publish(self.reply(base)?),
            4 => Output::Publish(self.notification(base, last)?),
            5 => Output::More(self.u32()?),
            _ => return Err(bad("unknown output tag")),
        })
    }

    fn notification(
        &mut self,
        base: &Bytes,
        last: &mut Option<Notification>,
    ) -> Result<OutboundMessage, Error> {
        let target = self.shared_text(base)?;
        let n = match self.u8()? {
            0 => last.insert(Notification {
                key: self.shared_bytes(base)?,
                payload: self.shared_bytes(base)?,
                timestamp: self.shared_text(base)?,
                source_id: self.opt(|d| d.shared_text(base))?,
            }),
            1 => last
                .as_mut()
                .ok_or_else(|| bad("a notify refers to no earlier one"))?,
            _ => return Err(bad("a notify tag is not 0 or 1")),
        };
        Ok(rpc::notification_message(
            notify::topic(&target, &n.key).into(),
            target,
            n.payload.clone(),
            n.timestamp.clone(),
            n.source_id.clone(),
        ))
    }

    fn reply(&mut self, base: &Bytes) -> Result<OutboundMessage, Error> {
        let topic = self.shared_text(base)?;
        let correlation = self.opt(|d| d.shared_bytes(base))?;
        let expiry = self.opt(Self::u32)?;
        let status = Status::from_code(self.u16()?).ok_or_else(|| bad("unknown status"))?;
        let payload = self.shared_bytes(base)?;
        let timestamp = self.opt(|d| d.shared_text(base))?;
        let source_id = self.opt(|d| d.shared_text(base))?;
        let n = self.u32()?;
        // Each property takes at least 8 bytes: no huge allocation for a
        // count the buffer cannot hold.
        let mut extra = Vec::with_capacity((n as usize).min(self.rest.len() / 8));
        for _ in 0..n {
            extra.push((self.shared_str(base)?, self.shared_str(base)?));
        }
        Ok(rpc::reply_message(
            topic,
            correlation,
            expiry,
            status,
            payload,
            timestamp,
            extra.into_iter(),
            source_id,
        ))
    }

    /// One input of a batch of `version` (1: untagged messages).
    fn input(&mut self, version: u8) -> Result<InputRef<'a>, Error> {
        if version == 1 {
            return Ok(InputRef::Message(self.message_ref(version)?));
        }
        match self.u8()? {
            0 => Ok(InputRef::Message(self.message_ref(version)?)),
            1 => Ok(InputRef::Disconnected(self.str()?)),
            2 if version >= 4 => Ok(InputRef::DisconnectedVia(self.str()?, self.via()?)),
            3 if version >= 4 => Ok(InputRef::ReplicaStarted(self.via()?)),
            _ => Err(bad("unknown input tag")),
        }
    }
}
/// What a `notify` output with tag 1 repeats.
#[derive(Debug)]
struct Notification {
    key: Bytes,
    payload: Bytes,
    timestamp: Str,
    source_id: Option<Str>,
}

/// Decodes a whole batch of inputs in place. Nothing is handed over unless
/// the whole batch decodes.
pub fn decode_batch(buf: &[u8]) -> Result<Vec<InputRef<'_>>, Error> {
    let (mut d, n) = Decoder::start(buf, BATCH_VERSIONS)?;
    // At least 5 bytes per input: reject absurd counts before allocating.
    if n as usize > buf.len() / 5 + 1 {
        return Err(bad("count larger than the batch"));
    }
    let mut inputs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        inputs.push(d.input(buf[0])?);
    }
    if !d.rest.is_empty() {
        return Err(bad("bytes after the last input"));
    }
    Ok(inputs)
}

/// How many inputs a batch holds (0 if it is too short to say).
pub fn batch_count(buf: &[u8]) -> usize {
    buf.get(1..5).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
    })
}

/// The batch of the inputs of `buf` after its first `skip` (same format
/// version): what a host hands the guest again after a call that stopped
/// early ([`Output::More`]).
pub fn batch_after(buf: &[u8], skip: usize) -> Result<Vec<u8>, Error> {
    let (mut d, n) = Decoder::start(buf, BATCH_VERSIONS)?;
    let skip = skip.min(n as usize);
    for _ in 0..skip {
        d.input(buf[0])?;
    }
    let mut out = Vec::with_capacity(5 + d.rest.len());
    out.push(buf[0]);
    out.extend_from_slice(&(n - skip as u32).to_le_bytes());
    out.extend_from_slice(d.rest);
    Ok(out)
}

/// Each input of `buf` as a batch of its own (same format version): what
/// a host hands the guest one at a time to find which input of a batch
/// makes it fail.
pub fn batch_singles(buf: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    let (mut d, n) = Decoder::start(buf, BATCH_VERSIONS)?;
    if n as usize > buf.len() / 5 + 1 {
        return Err(bad("count larger than the batch"));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let before = d.rest;
        d.input(buf[0])?;
        let one = &before[..before.len() - d.rest.len()];
        let mut single = Vec::with_capacity(5 + one.len());
        single.push(buf[0]);
        single.extend_from_slice(&1u32.to_le_bytes());
        single.extend_from_slice(one);
        out.push(single);
    }
    if !d.rest.is_empty() {
        return Err(bad("bytes after the last input"));
    }
    Ok(out)
}

/// How many of a call's `inputs` its `outputs` say were handled: a last
/// [`Output::More`] of a call with inputs is taken off and names them (the
/// caller calls again with the rest); a timer call's keeps it (more due).
pub fn handled(outputs: &mut Vec<Output>, inputs: usize) -> usize {
    match outputs.last() {
        Some(&Output::More(n)) if inputs > 0 => {
            outputs.pop();
            (n as usize).clamp(1, inputs)
        }
        _ => inputs,
    }
}

/// Decodes the list of outputs of a call with `batch` (copying `buf` once;
/// see [`decode_outputs_shared`]).
pub fn decode_outputs(buf: &[u8], batch: &[u8]) -> Result<Vec<Output>, Error> {
    decode_outputs_shared(Bytes::copy_from_slice(buf), batch)
}

/// Decodes the list of outputs of a call with `batch` (a spliced journal
/// record takes bytes of it; an empty batch for a call with none), whose
/// strings and payloads share `buf`: a publish costs no allocation but its
/// list of user properties (what a host does with the buffer the component
/// returned).
pub fn decode_outputs_shared(buf: Bytes, batch: &[u8]) -> Result<Vec<Output>, Error> {
    let base = &buf;
    let (mut d, n) = Decoder::start(base, &[OUTPUTS_VERSION])?;
    let mut out = Vec::with_capacity((n as usize).min(base.len() / 4));
    let mut last = None;
    for _ in 0..n {
        let output = d.output(base, batch, &mut last)?;
        if matches!(out.last(), Some(Output::More(_))) {
            return Err(bad("an output after `more`"));
        }
        out.push(output);
    }
    if !d.rest.is_empty() {
        return Err(bad("bytes after the last output"));
    }
    Ok(out)
}

/// Appends `m` to `out` in the encoding snapshots keep notifications in
/// (for a host that hands a publish to another, as a cluster's replicas do).
pub fn encode_message(m: &OutboundMessage, out: &mut Vec<u8>) {
    let mut w = crate::codec::Writer(std::mem::take(out));
    w.message(m);
    *out = w.0;
}

/// The publish [`encode_message`] wrote at the start of `buf`, and how many
/// bytes it took; an error (never a panic) for anything else.
pub fn decode_message(buf: &[u8]) -> Result<(OutboundMessage, usize), Error> {
    let mut r = crate::codec::Reader::new(buf, |m| bad(&m));
    let m = r.message()?;
    Ok((m, buf.len() - r.remaining()))
}

/// `b` as a string if it is UTF-8. Topics and property values are nearly
/// always ASCII, which is checked eight bytes a step (`core::str::from_utf8`
/// goes four bytes a step on wasm32, and this runs on every request's
/// response topic and reserved properties); anything else is checked by
/// `core::str::from_utf8`.
pub fn utf8(b: &[u8]) -> Result<&str, Error> {
    let chunks = b.chunks_exact(8);
    let tail_ascii = chunks.remainder().is_ascii();
    let high = chunks.fold(0u64, |acc, c| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        acc | u64::from_le_bytes(w)
    });
    if tail_ascii && high & 0x8080_8080_8080_8080 == 0 {
        #[allow(unsafe_code)]
        // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
        return Ok(unsafe { core::str::from_utf8_unchecked(b) });
    }
    core::str::from_utf8(b).map_err(|_| bad("a string is not UTF-8"))
}

#[cfg(test)]
mod tests;
