//! Plain Rust mirrors of the WIT types in `wit/store.wit`.
//!
//! The state machine speaks these natively; `component.rs` converts them to
//! and from the wit-bindgen types when the crate is built as a component.

pub use bytes::Bytes;
/// An immutable UTF-8 string that clones without copying: a
/// reference-counted [`Bytes`] (the same type rmqtt carries topics and user
/// properties in). Static strings (property names, status codes) cost
/// nothing, and a host slices every string of a reply out of the one buffer
/// that crossed the component boundary instead of allocating each.
pub use bytestring::ByteString as Str;

/// A user property of an outbound message, (name, value).
pub type Property = (Str, Str);

/// `s` as a static string if it is one the guest sends often (property
/// names, status codes, the protocol version, the content type).
/// Kept in step with `rpc::prop` by the test `interned_covers_the_reply_strings`.
pub fn interned(s: &str) -> Option<&'static str> {
    interned_bytes(s.as_bytes())
}

/// [`interned`] of bytes that may not be UTF-8 (a host decoding what the
/// guest returned checks the others once, when it keeps them).
pub fn interned_bytes(s: &[u8]) -> Option<&'static str> {
    // A `match` on byte strings switches on the length first: cheaper than
    // comparing with each in turn (a host runs this for every property).
    Some(match s {
        b"__stat" => "__stat",
        b"__stMsg" => "__stMsg",
        b"__protVer" => "__protVer",
        b"__ts" => "__ts",
        b"__srcId" => "__srcId",
        b"__propName" => "__propName",
        b"__supProtMajVer" => "__supProtMajVer",
        b"__requestProtVer" => "__requestProtVer",
        b"$high_priority" => "$high_priority",
        b"application/octet-stream" => "application/octet-stream",
        b"1.0" => "1.0",
        b"200" => "200",
        b"400" => "400",
        b"500" => "500",
        b"505" => "505",
        b"1" => "1",
        b"" => "",
        _ => return None,
    })
}

/// `s` as a [`Str`]: static when [`interned`] knows it, else a copy.
pub fn str_of(s: &str) -> Str {
    match interned(s) {
        Some(s) => Str::from_static(s),
        None => Str::from(s),
    }
}

/// An inbound MQTT5 PUBLISH (WIT `inbound-message`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InboundMessage {
    /// Topic name the message was published to.
    pub topic: String,
    /// Raw payload (a RESP3 request).
    pub payload: Vec<u8>,
    /// QoS the message arrived with.
    pub qos: u8,
    /// MQTT5 Response Topic.
    pub response_topic: Option<String>,
    /// MQTT5 Correlation Data.
    pub correlation_data: Option<Vec<u8>>,
    /// MQTT5 Message Expiry Interval, seconds.
    pub message_expiry_interval: Option<u32>,
    /// MQTT5 Content Type.
    pub content_type: Option<String>,
    /// MQTT5 Payload Format Indicator.
    pub payload_format_indicator: Option<u8>,
    /// MQTT5 user properties, in order.
    pub user_properties: Vec<(String, String)>,
    /// The publisher's client id, when the host knows it.
    pub client_id: Option<String>,
    /// When the host received it, if earlier than `now`.
    pub received_at: Option<u64>,
    /// The publisher's authenticated user name, when the host knows it.
    pub username: Option<String>,
    /// The publisher's attributes (from its authentication), for
    /// authorization rules.
    pub attributes: Vec<(String, String)>,
    /// Where the publisher is connected, in a replicated store (a
    /// KEYNOTIFY registration remembers it: see [`Via`]).
    pub via: Option<Via>,
}

/// Where a client is connected in a replicated store: the replica, and the
/// start of that replica's current life (its wall-clock start time, ms). A
/// KEYNOTIFY registration remembers the `via` of its request, so that a
/// disconnect reported by one replica drops only what was registered
/// through it ([`Input::DisconnectedVia`]), and a replica that restarts
/// drops what its earlier lives' connections registered
/// ([`Input::ReplicaStarted`]) (WIT `via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Via {
    /// The replica's id.
    pub replica: u64,
    /// When the replica's current life started (ms since the epoch).
    pub started: u64,
}

/// Whether an outbound publish is a reply or a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishKind {
    /// The reply to a request.
    Response,
    /// A KEYNOTIFY notification.
    Notification,
}

/// An MQTT5 PUBLISH the host must send (WIT `outbound-message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundMessage {
    /// Reply or notification.
    pub kind: PublishKind,
    /// Topic to publish to.
    pub topic: Str,
    /// Payload bytes.
    pub payload: Bytes,
    /// QoS to publish with.
    pub qos: u8,
    /// Retain flag.
    pub retain: bool,
    /// MQTT5 Correlation Data.
    pub correlation_data: Option<Bytes>,
    /// MQTT5 Message Expiry Interval, seconds.
    pub message_expiry_interval: Option<u32>,
    /// MQTT5 Content Type.
    pub content_type: Option<Str>,
    /// MQTT5 Payload Format Indicator.
    pub payload_format_indicator: Option<u8>,
    /// MQTT5 Response Topic.
    pub response_topic: Option<Str>,
    /// MQTT5 user properties, in order.
    pub user_properties: Vec<Property>,
    /// For a notification, the client it is addressed to.
    pub target_client: Option<Str>,
}

impl OutboundMessage {
    /// The value of the first user property called `name`.
    pub fn user_property(&self, name: &str) -> Option<&str> {
        self.user_properties
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| &**v)
    }
}

/// One input of a call (WIT `input`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input<'a> {
    /// A message received on the request topic.
    Message(&'a InboundMessage),
    /// The client with this id went away: its KEYNOTIFY registrations go.
    Disconnected(&'a str),
    /// The client with this id went away from the replica and life of
    /// `Via`: its registrations made through that replica, in that life or
    /// an earlier one (or with no `via`), go; those it made since through
    /// another replica (or a later life) stay.
    DisconnectedVia(&'a str, Via),
    /// The replica of `Via` started the life of `Via`: the registrations
    /// made through it in earlier lives go (their connections are gone).
    ReplicaStarted(Via),
}

/// Everything the guest asks of its host (WIT `output`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Publish this message.
    Publish(OutboundMessage),
    /// Append this record to the journal.
    Journal(Vec<u8>),
    /// A request was not answered: a client broke a protocol rule (a host
    /// inside the broker disconnects it), or, with no client named, its
    /// response topic was not its requester's (the host logs it).
    Violation {
        /// The offending client, when known.
        client_id: Option<String>,
        /// What it did.
        reason: String,
    },
    /// The call stopped early to keep what crosses the boundary bounded
    /// (only ever the last output of a list): it handled the first `n`
    /// inputs, and the host calls again with the rest. After a call with
    /// no inputs (`n` = 0): more keys or dedup entries are due, call again.
    More(u32),
}

/// Which state changes become journal records (WIT `persist-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persist {
    /// None: the store is volatile.
    #[default]
    None,
    /// Every key.
    All,
    /// Only keys set with `aio-persistence: true`; a SET without it journals
    /// the key's removal, so an older persisted value cannot come back.
    Flagged,
    /// As `Flagged`, and also keys that match one of
    /// [`Config::persist_keys`] when they are set.
    Custom,
}

/// What a store holds and has done (WIT `store-stats`): sizes now, counts
/// since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Keys held (expired ones not yet removed included).
    pub keys: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// KEYNOTIFY registrations.
    pub registrations: u64,
    /// Replies the dedup cache holds.
    pub dedup_entries: u64,
    /// Their bytes.
    pub dedup_bytes: u64,
    /// Requests answered from the dedup cache.
    pub dedup_hits: u64,
    /// Keys removed because they expired.
    pub expired: u64,
}

/// Which keys persist under [`Persist::Custom`] (WIT `key-match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMatch {
    /// A glob pattern, with SCAN's rules (`crate::scan`).
    Pattern(String),
    /// This key exactly (from a string or a base64 binary key).
    Exact(Vec<u8>),
}

/// How much one SCAN page holds at most (WIT `scan-page`): a page ends
/// before a key that would pass either limit, but always holds at least one
/// key when one matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanPage {
    /// Most keys in a page (at least 1).
    pub max_keys: u32,
    /// Most bytes of encoded keys in a page (at least 1).
    pub max_bytes: u32,
}

impl Default for ScanPage {
    fn default() -> Self {
        ScanPage {
            max_keys: 1000,
            max_bytes: 256 * 1024,
        }
    }
}

/// How a store is set up (WIT `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// HLC node id: stable, non-empty, no `:`.
    pub node_id: String,
    /// Our MQTT client id, sent as `__srcId`.
    pub server_client_id: Option<String>,
    /// Which changes are journaled.
    pub persist: Persist,
    /// Seed of the key table's hash (WIT `hash-seed`): random in a host, so
    /// that clients cannot make keys collide. Nothing observable depends on it.
    pub hash_seed: u64,
    /// Limits on what clients may store (WIT `quota`).
    pub quota: Quota,
    /// The keys that persist under [`Persist::Custom`] (ignored otherwise).
    pub persist_keys: Vec<KeyMatch>,
    /// SCAN page size.
    pub scan_page: ScanPage,
    /// Answer only requests whose response topic follows the SDKs'
    /// pattern `clients/<requester>/...` (WIT `sdk-response-topics`): the
    /// store then never publishes where its requester could not claim to
    /// receive. Off: any valid response topic is answered.
    pub sdk_response_topics: bool,
    /// Per-key authorization (WIT `authorization`): `None` lets every
    /// requester read and write every key; rules allow, nothing else is.
    pub authorization: Option<Vec<AuthRule>>,
}

/// Which clients a rule is for (the broker's `principals`): a client
/// matches if its id is one of `client_ids`, its user name one of
/// `usernames`, or it has every attribute of one of the `attributes` sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principals {
    /// Client ids.
    pub client_ids: Vec<String>,
    /// User names.
    pub usernames: Vec<String>,
    /// Sets of (name, value) attributes.
    pub attributes: Vec<Vec<(String, String)>>,
}

/// What a grant allows (the broker's state store `method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMethod {
    /// GET, KEYNOTIFY and SCAN.
    Read,
    /// SET, DEL and VDEL.
    Write,
    /// Both.
    ReadWrite,
}

/// Keys a grant names (the broker's `keyType` and `keys`). In `Pattern`
/// and `Text`, `{principal.clientId}`, `{principal.username}` and
/// `{principal.attributes.NAME}` stand for the requester's (a value put in
/// a pattern matches itself literally; a missing one matches nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// A glob pattern (SCAN's rules).
    Pattern(String),
    /// This key exactly, as UTF-8 text.
    Text(String),
    /// This key exactly (from base64).
    Binary(Vec<u8>),
}

/// One grant of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGrant {
    /// What it allows.
    pub method: KeyMethod,
    /// On which keys.
    pub keys: Vec<KeySpec>,
}

/// One authorization rule: its principals may do what its grants say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthRule {
    /// Who.
    pub principals: Principals,
    /// What, on which keys.
    pub grants: Vec<KeyGrant>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: "StateStore".to_string(),
            server_client_id: None,
            persist: Persist::None,
            hash_seed: 0,
            quota: Quota::default(),
            persist_keys: Vec::new(),
            scan_page: ScanPage::default(),
            sdk_response_topics: false,
            authorization: None,
        }
    }
}

/// Limits on what clients may store (WIT `quota`); `None` is no limit.
///
/// A SET that would create a key beyond `max_keys` or `max_bytes` is answered
/// `-ERR the quota has been exceeded` (spec §15, §5.4 step 8); updates of
/// existing keys are allowed whatever their size, except that no value may
/// be longer than `max_value_bytes` and no new key longer than
/// `max_key_bytes`, answered the same way. Snapshots and journal replay are
/// never refused: a store whose limits were lowered keeps what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    /// Most keys the store holds.
    pub max_keys: Option<u64>,
    /// Most bytes of keys and values together.
    pub max_bytes: Option<u64>,
    /// Longest key a SET may create.
    pub max_key_bytes: Option<u32>,
    /// Longest value a SET may write.
    pub max_value_bytes: Option<u32>,
}

impl Config {
    /// Checks the config: the node id must be non-empty printable ASCII without `:`.
    pub fn validate(&self) -> Result<(), Error> {
        let id = &self.node_id;
        if id.is_empty() || id.len() > 256 {
            return Err(Error::InvalidConfig(
                "node-id must be 1 to 256 characters".into(),
            ));
        }
        if !id.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(Error::InvalidConfig(
                "node-id must be printable ASCII without ':' or spaces".into(),
            ));
        }
        if self.scan_page.max_keys == 0 || self.scan_page.max_bytes == 0 {
            return Err(Error::InvalidConfig(
                "scan-page limits must be at least 1".into(),
            ));
        }
        for m in &self.persist_keys {
            if let KeyMatch::Pattern(p) = m {
                crate::pattern::Glob::new(p).map_err(|e| {
                    Error::InvalidConfig(format!("persist-keys pattern {p:?}: {e}"))
                })?;
            }
        }
        Ok(())
    }
}

/// Errors of the store interface (WIT `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The configuration is not valid.
    InvalidConfig(String),
    /// A snapshot is damaged or not a snapshot.
    BadSnapshot(String),
    /// A snapshot or journal record written by a newer format version.
    UnsupportedVersion(u32),
    /// A journal record is damaged or is not a record.
    BadRecord(String),
    /// Anything else.
    Other(String),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::InvalidConfig(m) => write!(f, "invalid config: {m}"),
            Error::BadSnapshot(m) => write!(f, "bad snapshot: {m}"),
            Error::UnsupportedVersion(v) => {
                write!(f, "format version {v} is newer than this build understands")
            }
            Error::BadRecord(m) => write!(f, "bad journal record: {m}"),
            Error::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{self, prop};

    #[test]
    fn interned_covers_the_reply_strings() {
        for s in [
            prop::STATUS,
            prop::STATUS_MESSAGE,
            prop::PROTOCOL_VERSION,
            prop::TIMESTAMP,
            prop::SOURCE_ID,
            prop::PROPERTY_NAME,
            prop::SUPPORTED_MAJOR,
            prop::REQUEST_VERSION,
            prop::HIGH_PRIORITY,
            rpc::CONTENT_TYPE,
            rpc::PROTOCOL_VERSION,
            "200",
            "",
        ] {
            assert_eq!(interned(s), Some(s));
        }
        assert_eq!(interned("other"), None);
        assert_eq!(str_of("other"), "other");
    }
}
