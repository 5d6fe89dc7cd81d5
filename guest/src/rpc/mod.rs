//! The MQTT5 RPC envelope (spec §2, §3, §4, §13): topics, properties, status
//! codes, and the dedup cache.

pub mod dedup;

use crate::errors::ServiceError;
use crate::hlc::{Hlc, Version};
use crate::types::{Bytes, OutboundMessage, Property, PublishKind, Str};

/// The state store's GUID.
pub const STORE_ID: &str = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";
/// Where requests arrive (spec §2.1).
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// Response topics under this prefix are forbidden (spec §2.2).
pub const RESERVED_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";
/// Content type of replies and notifications.
pub const CONTENT_TYPE: &str = "application/octet-stream";
/// The RPC protocol version we speak.
pub const PROTOCOL_VERSION: &str = "1.0";
/// Longest MQTT topic name.
pub const MAX_TOPIC_LEN: usize = 65_535;
/// How long a reply stays in the dedup cache after its request's deadline.
pub const DEDUP_BUFFER_MS: u64 = 60_000;
/// The longest a request's deadline is honoured for its dedup entry: a
/// client may ask for a message expiry of 136 years, the cache keeps its
/// reply for at most this (plus [`DEDUP_BUFFER_MS`]). The SDKs time out in
/// seconds.
pub const MAX_DEDUP_MS: u64 = 5 * 60_000;
/// Longest correlation data accepted (the SDKs send 16 bytes).
pub const MAX_CORRELATION_LEN: usize = 256;
/// Longest response topic accepted (the SDKs' are about 100 bytes plus the
/// client id).
pub const MAX_RESPONSE_TOPIC_LEN: usize = 4096;

/// User property names (spec §3.1, §4.1).
pub mod prop {
    /// Status code of a reply.
    pub const STATUS: &str = "__stat";
    /// Status message of an error reply.
    pub const STATUS_MESSAGE: &str = "__stMsg";
    /// RPC protocol version.
    pub const PROTOCOL_VERSION: &str = "__protVer";
    /// Hybrid logical clock timestamp.
    pub const TIMESTAMP: &str = "__ts";
    /// Sender's client id.
    pub const SOURCE_ID: &str = "__srcId";
    /// Fencing token.
    pub const FENCING_TOKEN: &str = "__ft";
    /// Per-key persistence request.
    pub const PERSIST: &str = "aio-persistence";
    /// Broker partition hint (the client id).
    pub const PARTITION: &str = "$partition";
    /// Legacy .NET invoker id.
    pub const INVOKER_ID: &str = "__invId";
    /// Name of the property a 400 / 503 is about (of the timeout, on a 408).
    pub const PROPERTY_NAME: &str = "__propName";
    /// Its value (the timeout as an ISO 8601 duration, on a 408).
    pub const PROPERTY_VALUE: &str = "__propVal";
    /// Supported protocol major versions, on a 505.
    pub const SUPPORTED_MAJOR: &str = "__supProtMajVer";
    /// The version the request asked for, on a 505.
    pub const REQUEST_VERSION: &str = "__requestProtVer";
    /// Priority hint, empty value.
    pub const HIGH_PRIORITY: &str = "$high_priority";
}

/// RPC status codes we send (spec §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every store-level outcome, including `-ERR` payloads.
    Ok = 200,
    /// A required MQTT property is missing.
    BadRequest = 400,
    /// The request was not applied in time and may still be (a cluster
    /// replica's reply; never in a guest's output list). The SDKs report a
    /// timeout.
    RequestTimeout = 408,
    /// Internal failure (HLC counter overflow).
    InternalError = 500,
    /// The store cannot serve (a host's reply for a stopped tenant; never
    /// in a guest's output list).
    Unavailable = 503,
    /// Unsupported `__protVer`.
    VersionNotSupported = 505,
}

impl Status {
    /// The `__stat` text.
    pub fn code(self) -> &'static str {
        match self {
            Status::Ok => "200",
            Status::BadRequest => "400",
            Status::RequestTimeout => "408",
            Status::InternalError => "500",
            Status::Unavailable => "503",
            Status::VersionNotSupported => "505",
        }
    }

    /// The status whose code is `code`, if a guest's output list may hold
    /// it (503 is a host's own reply).
    pub fn from_code(code: u16) -> Option<Status> {
        Some(match code {
            200 => Status::Ok,
            400 => Status::BadRequest,
            500 => Status::InternalError,
            505 => Status::VersionNotSupported,
            _ => return None,
        })
    }
}

/// A reply before it is an MQTT message: what the state machine writes into
/// its output list (the compact `reply` of [`crate::wire`]) and what the
/// dedup cache keeps for a retry. [`Reply::message`] makes the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `__stat`.
    pub status: Status,
    /// RESP3 payload.
    pub payload: Bytes,
    /// `__ts`: a version of this store's node.
    pub version: Option<Version>,
    /// The user properties between `__ts` and `__srcId` (`__stMsg`,
    /// `__propName`, ...), in order.
    pub extra: Vec<Property>,
}

impl Reply {
    /// 200 with this payload.
    pub fn ok(payload: impl Into<Bytes>, version: Option<Version>) -> Reply {
        Reply {
            status: Status::Ok,
            payload: payload.into(),
            version,
            extra: Vec::new(),
        }
    }

    /// 200 with the `-ERR` payload of `e`.
    pub fn error(e: ServiceError) -> Reply {
        Reply::ok(e.reply(), None)
    }

    /// `status` with `__stMsg: message` and then `extra`, no payload.
    pub fn status(status: Status, message: String, extra: &[(&'static str, String)]) -> Reply {
        let mut all = Vec::with_capacity(1 + extra.len());
        all.push((Str::from_static(prop::STATUS_MESSAGE), Str::from(message)));
        all.extend(
            extra
                .iter()
                .map(|(n, v)| (Str::from_static(n), Str::from(v.as_str()))),
        );
        Reply {
            status,
            payload: Bytes::new(),
            version: None,
            extra: all,
        }
    }

    /// 500: the HLC counter would pass its limit.
    pub fn counter_overflow() -> Reply {
        Reply::status(
            Status::InternalError,
            "hybrid logical clock counter overflow".into(),
            &[(prop::PROPERTY_NAME, "Counter".into())],
        )
    }

    /// The reply as an MQTT message to `topic` ([`reply_message`]), its
    /// version written as an HLC of `node`.
    pub fn message(
        &self,
        topic: Str,
        correlation: Option<Bytes>,
        expiry: Option<u32>,
        node: &str,
        source_id: Option<Str>,
    ) -> OutboundMessage {
        reply_message(
            topic,
            correlation,
            expiry,
            self.status,
            self.payload.clone(),
            self.version.map(|v| v.encode(node).into()),
            self.extra.iter().cloned(),
            source_id,
        )
    }

    /// The reply that [`Reply::message`] made `m` from (the journal and
    /// snapshot formats store messages); `None` if `m` is not a reply.
    pub fn of_message(m: &OutboundMessage) -> Option<Reply> {
        let status = Status::from_code(m.user_property(prop::STATUS)?.parse().ok()?)?;
        let version = match m.user_property(prop::TIMESTAMP) {
            None => None,
            Some(ts) => {
                let h = Hlc::parse(ts).ok()?;
                Some(Version::of(&h))
            }
        };
        let implied = [
            prop::STATUS,
            prop::PROTOCOL_VERSION,
            prop::TIMESTAMP,
            prop::SOURCE_ID,
            prop::HIGH_PRIORITY,
        ];
        let extra = m
            .user_properties
            .iter()
            .filter(|(n, _)| !implied.contains(&&**n))
            .cloned()
            .collect();
        Some(Reply {
            status,
            payload: m.payload.clone(),
            version,
            extra,
        })
    }

    /// `reply` (a message [`Reply::message`] made) turned into `status`
    /// with `__stMsg: message`, to the same requester: what a host sends
    /// when it could not carry a reply out (the journal write failed).
    pub fn replace(reply: &OutboundMessage, status: Status, message: String) -> OutboundMessage {
        Reply::status(status, message, &[]).message(
            reply.topic.clone(),
            reply.correlation_data.clone(),
            reply.message_expiry_interval,
            "",
            reply.user_property(prop::SOURCE_ID).map(Str::from),
        )
    }
}

/// A KEYNOTIFY notification as an MQTT message (spec §11.2) to `target`
/// on `topic`: QoS 1, our content type, and the user properties `__ts`,
/// `__protVer` and `__srcId` (if we have one), in that order. Built with
/// this by the state machine and by a host decoding the compact
/// notification of the [`crate::wire`] encoding.
pub fn notification_message(
    topic: Str,
    target: Str,
    payload: Bytes,
    timestamp: Str,
    source_id: Option<Str>,
) -> OutboundMessage {
    let name = Str::from_static;
    let mut user_properties: Vec<Property> = Vec::with_capacity(3);
    user_properties.push((name(prop::TIMESTAMP), timestamp));
    user_properties.push((name(prop::PROTOCOL_VERSION), name(PROTOCOL_VERSION)));
    if let Some(id) = source_id {
        user_properties.push((name(prop::SOURCE_ID), id));
    }
    OutboundMessage {
        kind: PublishKind::Notification,
        topic,
        payload,
        qos: 1,
        retain: false,
        correlation_data: None,
        message_expiry_interval: None,
        content_type: Some(Str::from_static(CONTENT_TYPE)),
        payload_format_indicator: Some(0),
        response_topic: None,
        user_properties,
        target_client: Some(target),
    }
}

/// A reply as an MQTT message (spec §4.1): QoS 1, our content type, and the
/// user properties `__stat`, `__protVer`, `__ts` (if any), the `extra` ones,
/// `__srcId` (if we have one) and `$high_priority`, in that order. The state
/// machine builds its replies with this, and a host decoding the compact
/// reply of the [`crate::wire`] encoding builds the same message with it.
#[allow(clippy::too_many_arguments)] // the fields of a reply, each once
pub fn reply_message(
    topic: Str,
    correlation: Option<Bytes>,
    expiry: Option<u32>,
    status: Status,
    payload: Bytes,
    timestamp: Option<Str>,
    extra: impl ExactSizeIterator<Item = Property>,
    source_id: Option<Str>,
) -> OutboundMessage {
    let name = Str::from_static;
    let mut user_properties: Vec<Property> = Vec::with_capacity(5 + extra.len());
    user_properties.push((name(prop::STATUS), name(status.code())));
    user_properties.push((name(prop::PROTOCOL_VERSION), name(PROTOCOL_VERSION)));
    if let Some(ts) = timestamp {
        user_properties.push((name(prop::TIMESTAMP), ts));
    }
    user_properties.extend(extra);
    if let Some(id) = source_id {
        user_properties.push((name(prop::SOURCE_ID), id));
    }
    user_properties.push((name(prop::HIGH_PRIORITY), name("")));
    OutboundMessage {
        kind: PublishKind::Response,
        topic,
        payload,
        qos: 1,
        retain: false,
        correlation_data: correlation,
        message_expiry_interval: expiry,
        content_type: Some(Str::from_static(CONTENT_TYPE)),
        payload_format_indicator: Some(0),
        response_topic: None,
        user_properties,
        target_client: None,
    }
}

/// Verdict on a request's response topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicCheck {
    /// Fine.
    Valid,
    /// Not a usable topic name: answer nothing.
    Invalid,
    /// In the state store's own space: answer nothing; the client broke a rule.
    Forbidden,
}

/// Whose response topic `topic` is, by the SDKs' pattern
/// `clients/<id>/...` (Go writes the id in upper-case hex): whether
/// `identity` may have asked for it, that is whether the topic is
/// `clients/<identity>` or under `clients/<identity>/` (an id may itself
/// hold `/`), as is or in hex. `None`: not an SDK topic, no claim.
pub fn topic_claims(topic: &str, identity: &str) -> Option<bool> {
    let rest = topic.strip_prefix("clients/")?;
    let under = |name: &[u8]| {
        rest.as_bytes()
            .strip_prefix(name)
            .is_some_and(|r| r.is_empty() || r[0] == b'/')
    };
    if !identity.is_empty() && under(identity.as_bytes()) {
        return Some(true);
    }
    let hex: Vec<u8> = identity
        .bytes()
        .flat_map(|b| {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]
        })
        .collect();
    let upper = rest.get(..hex.len()).map(str::to_ascii_uppercase);
    let hex_named = !hex.is_empty()
        && upper.is_some_and(|u| u.as_bytes() == hex.as_slice())
        && rest.as_bytes().get(hex.len()).is_none_or(|&b| b == b'/');
    Some(hex_named)
}

/// Checks a response topic (spec §2.2).
pub fn check_response_topic(topic: &str) -> TopicCheck {
    if topic == REQUEST_TOPIC || topic.starts_with(RESERVED_PREFIX) {
        return TopicCheck::Forbidden;
    }
    let b = topic.as_bytes();
    let invalid = b.is_empty()
        || b.len() > MAX_TOPIC_LEN
        || b[0] == b'/'
        || b[b.len() - 1] == b'/'
        || has_wildcard_nul_or_empty_level(b);
    if invalid {
        TopicCheck::Invalid
    } else {
        TopicCheck::Valid
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;

/// Whether any byte of `x` is zero.
fn zero_byte(x: u64) -> bool {
    x.wrapping_sub(ONES) & !x & (ONES << 7) != 0
}

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// Whether `b` has `+`, `#`, NUL or `//`, eight bytes at a time (this runs
/// for every request, on topics of about 100 bytes).
fn has_wildcard_nul_or_empty_level(b: &[u8]) -> bool {
    let slash = ONES * u64::from(b'/');
    let mut i = 0;
    while i + 9 <= b.len() {
        let (w, next) = (word(&b[i..]), word(&b[i + 1..]));
        if zero_byte(w)
            || zero_byte(w ^ (ONES * u64::from(b'+')))
            || zero_byte(w ^ (ONES * u64::from(b'#')))
            // A byte and the next both '/'.
            || zero_byte((w ^ slash) | (next ^ slash))
        {
            return true;
        }
        i += 8;
    }
    b[i..].iter().any(|&c| matches!(c, b'+' | b'#' | 0))
        || b[i..].windows(2).any(|p| p[0] == b'/' && p[1] == b'/')
}

/// Whether a `__protVer` value is one we serve: major version 1.
pub fn version_supported(text: &str) -> bool {
    if text == PROTOCOL_VERSION {
        return true; // What every client sends.
    }
    let (major, minor) = text.split_once('.').unwrap_or((text, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(major) && digits(minor) && major.parse::<u64>() == Ok(1)
}

/// Seconds left until `deadline`, rounded up, at least 1 (spec §4.1).
pub fn remaining_secs(deadline: u64, now: u64) -> u32 {
    let ms = deadline.saturating_sub(now);
    u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX).max(1)
}

/// The reserved user properties of a request; the first occurrence wins.
#[derive(Debug, Default, Clone, Copy)]
pub struct RequestProps<'a> {
    /// `__ts`.
    pub timestamp: Option<&'a str>,
    /// `__ft`.
    pub fencing_token: Option<&'a str>,
    /// `__protVer`.
    pub protocol_version: Option<&'a str>,
    /// `__srcId`.
    pub source_id: Option<&'a str>,
    /// `$partition`.
    pub partition: Option<&'a str>,
    /// `__invId`.
    pub invoker_id: Option<&'a str>,
    /// `aio-persistence`.
    pub persist: Option<&'a str>,
}

impl<'a> RequestProps<'a> {
    /// Picks the reserved properties out of a request's user properties.
    pub fn of(user_properties: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut p = RequestProps::default();
        for (name, value) in user_properties {
            p.add(name, value);
        }
        p
    }

    /// `name` as the reserved property name it is, if it is one.
    pub fn reserved(name: &[u8]) -> Option<&'static str> {
        Some(match name {
            b"__ts" => prop::TIMESTAMP,
            b"__ft" => prop::FENCING_TOKEN,
            b"__protVer" => prop::PROTOCOL_VERSION,
            b"__srcId" => prop::SOURCE_ID,
            b"$partition" => prop::PARTITION,
            b"__invId" => prop::INVOKER_ID,
            b"aio-persistence" => prop::PERSIST,
            _ => return None,
        })
    }

    /// Takes one user property into account (the first occurrence wins).
    pub fn add(&mut self, name: &str, value: &'a str) {
        if let Some(slot) = self.slot(name.as_bytes())
            && slot.is_none()
        {
            *slot = Some(value);
        }
    }

    /// Where the value of the property `name` goes, if it is a reserved
    /// one (one comparison of the name, for a decoder that checks the value
    /// only then).
    #[inline]
    pub fn slot(&mut self, name: &[u8]) -> Option<&mut Option<&'a str>> {
        Some(match name {
            b"__ts" => &mut self.timestamp,
            b"__ft" => &mut self.fencing_token,
            b"__protVer" => &mut self.protocol_version,
            b"__srcId" => &mut self.source_id,
            b"$partition" => &mut self.partition,
            b"__invId" => &mut self.invoker_id,
            b"aio-persistence" => &mut self.persist,
            _ => return None,
        })
    }

    /// The requester's identity when the host does not know it (spec §3.2):
    /// `__srcId`, then `$partition`, then `__invId`; empty values do not count.
    pub fn identity(&self) -> Option<&'a str> {
        [self.source_id, self.partition, self.invoker_id]
            .into_iter()
            .flatten()
            .find(|id| !id.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_topics_name_their_requester() {
        let rs = "clients/c1/services/statestore/v1/x/command/invoke/response";
        assert_eq!(topic_claims(rs, "c1"), Some(true));
        assert_eq!(topic_claims(rs, "c"), Some(false));
        assert_eq!(topic_claims(rs, "c1x"), Some(false));
        assert_eq!(topic_claims("clients/6331/statestore/v1", "c1"), Some(true));
        assert_eq!(
            topic_claims("clients/6331/statestore/v1", "c2"),
            Some(false)
        );
        assert_eq!(topic_claims("clients/a/b/services/x", "a/b"), Some(true));
        assert_eq!(topic_claims("clients/a/bc/services/x", "a/b"), Some(false));
        assert_eq!(topic_claims("clients/c1", "c1"), Some(true));
        assert_eq!(topic_claims("clients//x", ""), Some(false));
        assert_eq!(topic_claims("inbox/c1", "c1"), None);
        assert_eq!(topic_claims("clients/é1/x", "é1"), Some(true));
        assert_eq!(topic_claims("clients/C3A931/x", "é1"), Some(true));
    }

    /// A host's 500 in place of a reply it could not carry out is built as
    /// every reply is: same requester, same envelope, every implied
    /// property in its place.
    #[test]
    fn a_replaced_reply_keeps_the_envelope() {
        let ok = Reply::ok(
            &b"+OK\r\n"[..],
            Some(Version {
                wall: 7,
                counter: 2,
            }),
        );
        let sent = ok.message(
            "r/t".into(),
            Some(Bytes::from_static(b"c")),
            Some(9),
            "node",
            Some("store".into()),
        );
        let failed = Reply::replace(&sent, Status::InternalError, "disk full".into());
        let names: Vec<&str> = failed.user_properties.iter().map(|(n, _)| &**n).collect();
        assert_eq!(
            names,
            [
                "__stat",
                "__protVer",
                "__stMsg",
                "__srcId",
                "$high_priority"
            ]
        );
        assert_eq!(failed.user_property("__stat"), Some("500"));
        assert_eq!(failed.user_property("__srcId"), Some("store"));
        assert_eq!(
            (
                &*failed.topic,
                failed.correlation_data.as_deref(),
                failed.message_expiry_interval
            ),
            ("r/t", Some(&b"c"[..]), Some(9))
        );
        assert!(failed.payload.is_empty());
        assert_eq!(Reply::of_message(&sent), Some(ok));
    }

    #[test]
    fn response_topics() {
        assert_eq!(
            check_response_topic(
                "clients/c1/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
            ),
            TopicCheck::Valid
        );
        assert_eq!(check_response_topic(REQUEST_TOPIC), TopicCheck::Forbidden);
        assert_eq!(
            check_response_topic("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x"),
            TopicCheck::Forbidden
        );
        for bad in ["", "a/+/b", "a/#", "/a", "a/", "a//b", "a\0b"] {
            assert_eq!(check_response_topic(bad), TopicCheck::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn topic_scan_matches_a_byte_loop() {
        let naive = |b: &[u8]| {
            b.iter().any(|&c| matches!(c, b'+' | b'#' | 0)) || b.windows(2).any(|p| p == b"//")
        };
        let base = b"clients/c1/services/statestore/v1/x/command/invoke/response".to_vec();
        for len in 0..base.len() {
            for pos in 0..len {
                for insert in [&b"+"[..], b"#", b"\0", b"//", b"/"] {
                    let mut t = base[..len].to_vec();
                    t.splice(pos..pos, insert.iter().copied());
                    assert_eq!(
                        has_wildcard_nul_or_empty_level(&t),
                        naive(&t),
                        "{:?}",
                        String::from_utf8_lossy(&t)
                    );
                }
            }
            assert_eq!(
                has_wildcard_nul_or_empty_level(&base[..len]),
                naive(&base[..len])
            );
        }
    }

    #[test]
    fn reserved_names_are_the_ones_add_reads() {
        for name in [
            prop::TIMESTAMP,
            prop::FENCING_TOKEN,
            prop::PROTOCOL_VERSION,
            prop::SOURCE_ID,
            prop::PARTITION,
            prop::INVOKER_ID,
            prop::PERSIST,
        ] {
            assert_eq!(RequestProps::reserved(name.as_bytes()), Some(name));
            let mut p = RequestProps::default();
            p.add(name, "x");
            let set = [
                p.timestamp,
                p.fencing_token,
                p.protocol_version,
                p.source_id,
                p.partition,
                p.invoker_id,
                p.persist,
            ];
            assert_eq!(set.iter().flatten().count(), 1, "{name}");
        }
        assert_eq!(RequestProps::reserved(b"__stat"), None);
    }

    #[test]
    fn versions() {
        for ok in ["1.0", "1", "1.5", "01.0"] {
            assert!(version_supported(ok), "{ok}");
        }
        for bad in ["2.0", "x", "", "1.", ".1", "0.9", "1.0.0", "-1.0"] {
            assert!(!version_supported(bad), "{bad}");
        }
    }

    #[test]
    fn remaining() {
        assert_eq!(remaining_secs(10_000, 0), 10);
        assert_eq!(remaining_secs(10_000, 1), 10);
        assert_eq!(remaining_secs(10_000, 9_999), 1);
        assert_eq!(remaining_secs(10_000, 10_000), 1);
    }
}
