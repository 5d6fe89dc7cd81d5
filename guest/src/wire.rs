//! The flat encoding of a batch of inbound messages and of a list of outputs,
//! for the WIT functions `handle-wire` and `poll-wire`.
//!
//! Lowering a record of strings into a component costs one `realloc` call
//! into the guest per string and list, and lifting outputs one allocation per
//! string on the host side: for a small request that was most of the cost of
//! crossing. A batch in this encoding crosses as one `list<u8>` each way; the
//! guest reads the messages in place, without copying their fields.
//!
//! ```text
//! batch   = u8 WIRE_VERSION, u32 count, message*
//! message = str topic, bytes payload, u8 qos, opt<str> response-topic,
//!           opt<bytes> correlation, opt<u32> message-expiry, opt<str> content-type,
//!           opt<u8> payload-format, u32 n, (str name, str value)*n,
//!           opt<str> client-id, opt<u64> received-at
//! outputs = u8 OUTPUTS_VERSION, u32 count, output*
//! output  = u8 0, publish | u8 1, bytes record | u8 2, opt<str> client-id, str reason
//!         | u8 3, reply | u8 4, notify
//! publish = u8 kind (0 response, 1 notification), str topic, bytes payload, u8 qos,
//!           u8 retain, opt<bytes> correlation, opt<u32> message-expiry,
//!           opt<str> content-type, opt<u8> payload-format, opt<str> response-topic,
//!           u32 n, (str name, str value)*n, opt<str> target-client
//! reply   = str topic, opt<bytes> correlation, opt<u32> message-expiry, u16 status,
//!           bytes payload, opt<str> timestamp, opt<str> source-id
//! notify  = str target-client, (u8 0, bytes key, bytes payload, str timestamp,
//!           opt<str> source-id | u8 1: key, payload, timestamp and source-id
//!           of the list's previous notify)
//! str, bytes = u32 length, bytes    opt<T> = u8 0 | u8 1, T    integers little-endian
//! ```
//!
//! A `reply` (outputs version 2) is a response publish in the compact form:
//! the properties every reply carries in the same order are implied
//! ([`rpc::reply_message`] builds the message on both sides), so the guest
//! writes a reply straight into the buffer, without building a message
//! first, and a host decodes it without looking at property names. A
//! `notify` (outputs version 2) is a KEYNOTIFY notification
//! ([`rpc::notification_message`], its topic made by [`notify::topic`] from
//! the client and the key): the notifications of one change to many
//! observers carry the value once, and a host shares it between them.
//! Version 1 output lists (neither) still decode.

use crate::hlc::Version;
use crate::notify;
use crate::rpc::{self, REQUEST_TOPIC, RequestProps, Status};
use crate::types::{
    Bytes, Error, InboundMessage, OutboundMessage, Output, PublishKind, Str, interned_bytes,
};

/// Version byte that starts every batch.
pub const WIRE_VERSION: u8 = 1;

/// Version byte that starts every output list: 2 since the compact `reply`.
pub const OUTPUTS_VERSION: u8 = 2;

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

/// A reply before it is a message: what the compact `reply` output holds.
#[derive(Debug, Clone, Copy)]
pub struct ReplyParts<'a> {
    /// The request's response topic.
    pub topic: &'a str,
    /// The request's correlation data.
    pub correlation: Option<&'a [u8]>,
    /// Message expiry interval, seconds.
    pub expiry: Option<u32>,
    /// `__stat`.
    pub status: Status,
    /// RESP3 payload.
    pub payload: &'a [u8],
    /// `__ts`, as a version of `node`.
    pub version: Option<Version>,
    /// The store's HLC node id.
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
        }
    }
}

/// Appends the encoding of values to a buffer.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
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
    }

    /// Appends one output.
    pub fn output(&mut self, o: &Output) {
        match o {
            Output::Publish(m) => {
                self.u8(0);
                self.publish(m);
            }
            Output::Journal(record) => {
                self.u8(1);
                self.bytes(record);
            }
            Output::Violation { client_id, reason } => {
                self.u8(2);
                self.opt(client_id.as_deref(), Self::str);
                self.str(reason);
            }
        }
    }

    /// Appends a compact reply.
    fn reply(&mut self, r: &ReplyParts<'_>) {
        self.u8(3);
        self.str(r.topic);
        self.opt(r.correlation, Self::bytes);
        self.opt(r.expiry, Self::u32);
        self.buf.extend_from_slice(&(r.status as u16).to_le_bytes());
        self.bytes(r.payload);
        self.opt(r.version, |e, v| e.version(v, r.node));
        self.opt(r.source_id, Self::str);
    }

    /// Appends a version as the text of an HLC of `node`.
    fn version(&mut self, v: Version, node: &str) {
        let at = self.buf.len();
        self.u32(0);
        v.encode_into(node, &mut self.buf);
        let n = u32::try_from(self.buf.len() - at - 4).unwrap_or(u32::MAX);
        self.buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
    }

    fn publish(&mut self, m: &OutboundMessage) {
        self.u8(match m.kind {
            PublishKind::Response => 0,
            PublishKind::Notification => 1,
        });
        self.str(&m.topic);
        self.bytes(&m.payload);
        self.u8(m.qos);
        self.u8(u8::from(m.retain));
        self.opt(m.correlation_data.as_deref(), Self::bytes);
        self.opt(m.message_expiry_interval, Self::u32);
        self.opt(m.content_type.as_deref(), Self::str);
        self.opt(m.payload_format_indicator, Self::u8);
        self.opt(m.response_topic.as_deref(), Self::str);
        self.props(m.user_properties.iter().map(|(n, v)| (&**n, &**v)));
        self.opt(m.target_client.as_deref(), Self::str);
    }
}

/// Encodes a batch of inbound messages.
pub fn encode_batch(messages: &[InboundMessage]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_batch_into(&mut buf, messages);
    buf
}

/// [`encode_batch`] into a buffer that is cleared first (a host reuses one).
pub fn encode_batch_into(buf: &mut Vec<u8>, messages: &[InboundMessage]) {
    let size: usize = messages
        .iter()
        .map(|m| {
            64 + m.topic.len()
                + m.payload.len()
                + m.response_topic.as_ref().map_or(0, String::len)
                + m.correlation_data.as_ref().map_or(0, Vec::len)
                + m.content_type.as_ref().map_or(0, String::len)
                + m.client_id.as_ref().map_or(0, String::len)
                + m.user_properties
                    .iter()
                    .map(|(n, v)| 8 + n.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    buf.clear();
    buf.reserve(5 + size);
    buf.push(WIRE_VERSION);
    buf.extend_from_slice(&0u32.to_le_bytes());
    let mut e = Encoder {
        buf: std::mem::take(buf),
    };
    for m in messages {
        e.message(m);
    }
    *buf = e.finish(messages.len());
}

/// An upper bound of the encoded size of an output (so that the buffer is
/// allocated once).
fn output_size(o: &Output) -> usize {
    let props = |p: &[crate::types::Property]| -> usize {
        p.iter().map(|(n, v)| 8 + n.len() + v.len()).sum()
    };
    match o {
        Output::Publish(m) => {
            64 + m.topic.len()
                + m.payload.len()
                + m.correlation_data.as_ref().map_or(0, |c| c.len())
                + m.content_type.as_ref().map_or(0, |c| c.len())
                + m.response_topic.as_ref().map_or(0, |t| t.len())
                + m.target_client.as_ref().map_or(0, |t| t.len())
                + props(&m.user_properties)
        }
        Output::Journal(r) => 8 + r.len(),
        Output::Violation { client_id, reason } => {
            16 + client_id.as_ref().map_or(0, String::len) + reason.len()
        }
    }
}

/// Encodes a list of outputs.
pub fn encode_outputs(outputs: &[Output]) -> Vec<u8> {
    let mut w = OutputWriter::new(5 + outputs.iter().map(output_size).sum::<usize>());
    for o in outputs {
        w.append(o);
    }
    w.finish()
}

/// An output list being written, one input at a time: what the state
/// machine writes its outputs into while it handles a wire batch, so that
/// no output is built as a value first.
///
/// The journal records of an input go ahead of its other outputs (a host
/// makes them durable before it publishes anything of the same input):
/// [`OutputWriter::journal`] inserts a record after the input's earlier
/// records, before anything else the input wrote.
#[derive(Debug, Clone)]
pub struct OutputWriter {
    e: Encoder,
    count: usize,
    /// Where the current input's next journal record goes.
    records_at: usize,
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

    /// Appends an output of the current input (a journal record goes
    /// ahead of the input's other outputs).
    pub fn output(&mut self, o: &Output) {
        match o {
            Output::Journal(record) => self.journal(record),
            o => {
                self.e.output(o);
                self.count += 1;
            }
        }
    }

    /// Appends an output as an input of its own (outputs queued before the
    /// writer started).
    pub fn append(&mut self, o: &Output) {
        self.e.output(o);
        self.count += 1;
        self.begin_input();
    }

    /// Writes a journal record of the current input after its earlier
    /// records and before its other outputs.
    pub fn journal(&mut self, record: &[u8]) {
        let (at, end) = (self.records_at, self.e.buf.len());
        self.e.u8(1);
        self.e.bytes(record);
        let written = self.e.buf.len() - end;
        if at != end {
            // Move it from the end to its place.
            self.e.buf[at..].rotate_right(written);
        }
        self.records_at = at + written;
        self.count += 1;
    }

    /// Appends a compact reply of the current input.
    pub fn reply(&mut self, r: &ReplyParts<'_>) {
        self.e.reply(r);
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

    /// The encoded list.
    pub fn finish(self) -> Vec<u8> {
        self.e.finish(self.count)
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

    fn message_ref(&mut self) -> Result<MessageRef<'a>, Error> {
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

    fn output(&mut self, base: &Bytes, last: &mut Option<Notification>) -> Result<Output, Error> {
        Ok(match self.u8()? {
            0 => Output::Publish(self.publish(base)?),
            1 => Output::Journal(self.bytes()?.to_vec()),
            2 => Output::Violation {
                client_id: self.opt(Self::str)?.map(str::to_string),
                reason: self.str()?.to_string(),
            },
            3 => Output::Publish(self.reply(base)?),
            4 => Output::Publish(self.notification(base, last)?),
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
        Ok(rpc::reply_message(
            topic,
            correlation,
            expiry,
            status,
            payload,
            timestamp,
            core::iter::empty(),
            source_id,
        ))
    }

    fn publish(&mut self, base: &Bytes) -> Result<OutboundMessage, Error> {
        let kind = match self.u8()? {
            0 => PublishKind::Response,
            1 => PublishKind::Notification,
            _ => return Err(bad("unknown publish kind")),
        };
        let topic = self.shared_str(base)?;
        let payload = self.shared_bytes(base)?;
        let qos = self.u8()?;
        let retain = self.u8()? != 0;
        let correlation_data = self.opt(|d| d.shared_bytes(base))?;
        let message_expiry_interval = self.opt(Self::u32)?;
        let content_type = self.opt(|d| d.shared_str(base))?;
        let payload_format_indicator = self.opt(Self::u8)?;
        let response_topic = self.opt(|d| d.shared_str(base))?;
        let n = self.u32()?;
        // Each property takes at least 8 bytes: no huge allocation for a
        // count the buffer cannot hold.
        let mut user_properties = Vec::with_capacity((n as usize).min(self.rest.len() / 8));
        for _ in 0..n {
            let name = self.shared_str(base)?;
            let value = self.shared_str(base)?;
            user_properties.push((name, value));
        }
        let target_client = self.opt(|d| d.shared_str(base))?;
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

/// What a `notify` output with tag 1 repeats.
#[derive(Debug)]
struct Notification {
    key: Bytes,
    payload: Bytes,
    timestamp: Str,
    source_id: Option<Str>,
}

/// Decodes a batch of inbound messages in place, calling `each` in order.
/// Nothing is handed over unless the whole batch decodes.
pub fn decode_batch<'a>(buf: &'a [u8], mut each: impl FnMut(&MessageRef<'a>)) -> Result<(), Error> {
    for m in &decode_messages(buf)? {
        each(m);
    }
    Ok(())
}

/// Decodes a whole batch of inbound messages in place.
pub fn decode_messages(buf: &[u8]) -> Result<Vec<MessageRef<'_>>, Error> {
    let (mut d, n) = Decoder::start(buf, &[WIRE_VERSION])?;
    // At least 15 bytes per message: reject absurd counts before allocating.
    if n as usize > buf.len() / 15 + 1 {
        return Err(bad("count larger than the batch"));
    }
    let mut messages = Vec::with_capacity(n as usize);
    for _ in 0..n {
        messages.push(d.message_ref()?);
    }
    if !d.rest.is_empty() {
        return Err(bad("bytes after the last message"));
    }
    Ok(messages)
}

/// Decodes a list of outputs (copying `buf` once; see [`decode_outputs_shared`]).
pub fn decode_outputs(buf: &[u8]) -> Result<Vec<Output>, Error> {
    decode_outputs_shared(Bytes::copy_from_slice(buf))
}

/// Decodes a list of outputs whose strings and payloads share `buf`: a
/// publish costs no allocation but its list of user properties (what a
/// host does with the buffer the component returned).
pub fn decode_outputs_shared(buf: Bytes) -> Result<Vec<Output>, Error> {
    let base = &buf;
    let (mut d, n) = Decoder::start(base, &[1, OUTPUTS_VERSION])?;
    let mut out = Vec::with_capacity((n as usize).min(base.len() / 4));
    let mut last = None;
    for _ in 0..n {
        out.push(d.output(base, &mut last)?);
    }
    if !d.rest.is_empty() {
        return Err(bad("bytes after the last output"));
    }
    Ok(out)
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
mod tests {
    use super::*;

    #[test]
    fn utf8_agrees_with_core() {
        let base = b"clients/c1/services/statestore/v1/response".to_vec();
        let inserts: [&[u8]; 6] = [
            b"\xc3\xa9",
            b"\xe2\x82\xac",
            b"\xff",
            b"\xc3",
            b"\x80",
            b"\x7f",
        ];
        for len in 0..base.len() {
            let ascii = &base[..len];
            assert_eq!(utf8(ascii).ok(), core::str::from_utf8(ascii).ok());
            for pos in 0..=len {
                for insert in inserts {
                    let mut t = ascii.to_vec();
                    t.splice(pos..pos, insert.iter().copied());
                    assert_eq!(utf8(&t).ok(), core::str::from_utf8(&t).ok(), "{t:?}");
                }
            }
        }
    }

    fn message() -> InboundMessage {
        InboundMessage {
            topic: "t".into(),
            payload: b"*1\r\n$3\r\nGET\r\n".to_vec(),
            qos: 1,
            response_topic: Some("r".into()),
            correlation_data: Some(vec![1, 2]),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".into()),
            payload_format_indicator: Some(0),
            user_properties: vec![
                ("__ts".into(), "x".into()),
                ("__ts".into(), "second".into()),
                ("__srcId".into(), "me".into()),
            ],
            client_id: Some("c".into()),
            received_at: Some(7),
        }
    }

    #[test]
    fn batch_round_trips_into_refs() {
        let m = message();
        let wire = encode_batch(&[m.clone(), InboundMessage::default()]);
        let mut seen = Vec::new();
        decode_batch(&wire, |r| {
            seen.push((
                r.topic.to_string(),
                r.payload.to_vec(),
                r.response_topic.map(str::to_string),
                r.correlation_data.map(<[u8]>::to_vec),
                r.message_expiry_interval,
                r.props.timestamp.map(str::to_string),
                r.props.source_id.map(str::to_string),
                r.client_id.map(str::to_string),
                r.received_at,
            ));
        })
        .expect("decodes");
        assert_eq!(seen.len(), 2);
        let direct = MessageRef::of(&m);
        assert_eq!(seen[0].5.as_deref(), direct.props.timestamp);
        assert_eq!(seen[0].5.as_deref(), Some("x"), "the first __ts wins");
        assert_eq!(seen[0].0, m.topic);
        assert_eq!(seen[0].8, Some(7));
        assert_eq!(seen[1].0, "");
    }

    #[test]
    fn outputs_round_trip() {
        let outputs = vec![
            Output::Journal(vec![1, 2, 3]),
            Output::Violation {
                client_id: None,
                reason: "no".into(),
            },
            Output::Publish(OutboundMessage {
                kind: PublishKind::Notification,
                topic: "n".into(),
                payload: vec![9].into(),
                qos: 1,
                retain: true,
                correlation_data: None,
                message_expiry_interval: Some(3),
                content_type: None,
                payload_format_indicator: Some(0),
                response_topic: Some("rt".into()),
                user_properties: vec![("a".into(), "".into())],
                target_client: Some("c".into()),
            }),
        ];
        assert_eq!(
            decode_outputs(&encode_outputs(&outputs)).expect("decodes"),
            outputs
        );
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let wire = encode_batch(&[message(), message()]);
        for cut in 0..wire.len() {
            assert!(decode_batch(&wire[..cut], |_| {}).is_err(), "cut at {cut}");
        }
        for i in 0..wire.len() {
            let mut w = wire.clone();
            w[i] ^= 0xff;
            let _ = decode_batch(&w, |_| {});
        }
        let mut longer = wire.clone();
        longer.push(0);
        assert!(decode_batch(&longer, |_| {}).is_err());
        assert_eq!(
            decode_batch(&[2, 0, 0, 0, 0], |_| {}),
            Err(Error::UnsupportedVersion(2))
        );
        assert!(decode_batch(&[1, 255, 255, 255, 255], |_| {}).is_err());
    }
}
