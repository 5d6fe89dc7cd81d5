//! The state machine: one input at a time, outputs pulled afterwards.
//!
//! ```text
//!  handle(msg, now) ──┐
//!  client_disconnected│   1. expire keys due at `now` (DELETE notifications)
//!  timeout(now) ──────┤   2. the input itself
//!                     v
//!        outputs: notifications, then the reply  ──> poll_output()
//!        next_deadline(): earliest key expiry or dedup eviction
//! ```
//!
//! Request path (spec §5.4 order): topic and QoS -> response topic ->
//! expiry -> correlation data -> message expiry -> dedup cache -> `__protVer`
//! -> RESP3 command -> `__ts` -> `__ft` -> identity (KEYNOTIFY) -> clock
//! receive -> fencing -> condition -> apply -> notify -> reply.

use crate::command::{self, Command};
use crate::errors::ServiceError;
use crate::hlc::{self, Clock, Hlc, Version};
use crate::journal;
use crate::notify::{self, Registry};
use crate::outputs::Outputs;
use crate::resp3;
use crate::rpc::dedup::{Cached, DedupCache};
use crate::rpc::{self, RequestProps, Status, TopicCheck, prop};
use crate::store::{Change, Request, Table};
use crate::types::{Bytes, Config, Error, InboundMessage, OutboundMessage, Output, Persist, Str};
use crate::wire::{self, MessageRef, NotificationParts, ReplyParts};

/// The whole state store.
#[derive(Debug, Clone)]
pub struct StateMachine {
    pub(crate) config: Config,
    pub(crate) clock: Clock,
    pub(crate) table: Table,
    pub(crate) registry: Registry,
    pub(crate) dedup: DedupCache,
    outputs: Outputs,
    /// `config.server_client_id`, shared by every reply and notification.
    server_id: Option<Str>,
}

/// A reply before it is wrapped in an MQTT message.
struct Reply {
    status: Status,
    payload: Bytes,
    /// `__ts`: a version of this store's node.
    version: Option<Version>,
    extra: Vec<(&'static str, String)>,
    /// Whether to keep it in the dedup cache (not GET: re-reading is harmless
    /// and values can be large).
    cache: bool,
}

impl Reply {
    fn ok(payload: impl Into<Bytes>, version: Option<Version>) -> Reply {
        Reply {
            status: Status::Ok,
            payload: payload.into(),
            version,
            extra: Vec::new(),
            cache: true,
        }
    }

    fn error(e: ServiceError) -> Reply {
        Reply::ok(e.reply(), None)
    }

    fn status(status: Status, message: String, extra: Vec<(&'static str, String)>) -> Reply {
        let mut all = vec![(prop::STATUS_MESSAGE, message)];
        all.extend(extra);
        Reply {
            status,
            payload: Bytes::new(),
            version: None,
            extra: all,
            cache: true,
        }
    }

    fn counter_overflow() -> Reply {
        Reply::status(
            Status::InternalError,
            "hybrid logical clock counter overflow".into(),
            vec![(prop::PROPERTY_NAME, "Counter".into())],
        )
    }
}

impl StateMachine {
    /// An empty store.
    pub fn new(config: Config) -> Result<StateMachine, Error> {
        config.validate()?;
        let mut table = Table::with_seed(config.hash_seed);
        table.set_quota(config.quota);
        let dedup = DedupCache::with_seed(config.hash_seed);
        Ok(StateMachine {
            clock: Clock::new(config.node_id.clone()),
            server_id: config.server_client_id.as_deref().map(Str::from),
            config,
            table,
            registry: Registry::default(),
            dedup,
            outputs: Outputs::default(),
        })
    }

    pub(crate) fn from_parts(
        config: Config,
        clock: Clock,
        mut table: Table,
        registry: Registry,
        dedup: DedupCache,
    ) -> StateMachine {
        table.set_quota(config.quota);
        StateMachine {
            server_id: config.server_client_id.as_deref().map(Str::from),
            config,
            clock,
            table,
            registry,
            dedup,
            outputs: Outputs::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles one inbound message at `now`. Poll outputs afterwards.
    pub fn handle(&mut self, msg: &InboundMessage, now: u64) {
        self.handle_ref(&MessageRef::of(msg), now);
    }

    /// [`StateMachine::handle`] for a borrowed message (as decoded from a
    /// [`crate::wire`] batch).
    pub fn handle_ref(&mut self, msg: &MessageRef<'_>, now: u64) {
        self.outputs.begin_input();
        self.expire_due(now);
        self.request(msg, now);
    }

    /// Handles a batch of messages in the [`crate::wire`] encoding at
    /// `now`, in order, and returns every pending output (those of earlier
    /// inputs first) in that encoding, written as they were made. A batch
    /// that does not decode is an error and nothing of it is handled.
    pub fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<u8>, Error> {
        let messages = wire::decode_messages(batch)?;
        // A reply is about as long as its request; the list grows if not.
        self.outputs.start_wire(batch.len() + batch.len() / 2 + 64);
        for m in &messages {
            self.handle_ref(m, now);
        }
        Ok(self.outputs.finish_wire())
    }

    /// Every pending output in the [`crate::wire`] encoding.
    pub fn poll_wire(&mut self) -> Vec<u8> {
        self.outputs.start_wire(0);
        self.outputs.finish_wire()
    }

    /// A client went away: drop its KEYNOTIFY registrations.
    pub fn client_disconnected(&mut self, client_id: &str, now: u64) {
        self.outputs.begin_input();
        self.expire_due(now);
        self.registry.drop_client(client_id);
    }

    /// The deadline has passed: expire keys and forget old dedup entries.
    pub fn timeout(&mut self, now: u64) {
        self.outputs.begin_input();
        self.expire_due(now);
    }

    /// The oldest output not yet taken. Poll after every input until `None`.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop()
    }

    /// Takes every pending output, oldest first.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        self.outputs.take()
    }

    /// When [`StateMachine::timeout`] must next be called. Changes only
    /// after an input.
    pub fn next_deadline(&self) -> Option<u64> {
        match (self.table.next_deadline(), self.dedup.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Number of stored keys (including expired ones not yet removed).
    pub fn key_count(&self) -> usize {
        self.table.len()
    }

    /// The live value of `key` at `now`, for tests and tools.
    pub fn peek(&self, key: &[u8], now: u64) -> Option<(&[u8], Hlc)> {
        self.table
            .get(key, now)
            .map(|e| (e.value, e.version.to_hlc(&self.config.node_id)))
    }

    fn expire_due(&mut self, now: u64) {
        while let Some((key, persist)) = self.table.pop_expired(now) {
            // An expiry is a deletion: it gets its own HLC. On counter
            // overflow reuse L rather than fail a timer.
            let version = self
                .clock
                .tick_version(now)
                .unwrap_or_else(|_| self.clock.version());
            if self.journals(persist) {
                let record = journal::expire(&key, version);
                self.outputs.journal(record);
            }
            self.notify(&key, Change::Delete, version);
        }
        self.dedup.evict(now);
    }

    /// Whether a change to a key with this persist flag is journaled (a
    /// removal of a key that was never journaled needs no record either).
    fn journals(&self, persist: bool) -> bool {
        match self.config.persist {
            Persist::None => false,
            Persist::All => true,
            Persist::Flagged => persist,
        }
    }

    fn request(&mut self, msg: &MessageRef<'_>, now: u64) {
        if msg.topic != rpc::REQUEST_TOPIC || msg.qos != 1 {
            return;
        }
        let props = msg.props;
        let identity = msg.client_id.or_else(|| props.identity());
        let Some(response_topic) = msg.response_topic else {
            return;
        };
        // One dedup lookup per request. A topic the cache holds replies to
        // passed this check when they were made (the check depends on the
        // topic alone); it is shared by the reply instead of copied again.
        // A cached reply is only sent after the checks below.
        let probe = self.dedup.probe(response_topic, msg.correlation_data, now);
        let known = probe.topic.cloned();
        let cached = probe.cached.map(|c| c.reply.clone());
        let check = match known {
            Some(_) => TopicCheck::Valid,
            None => rpc::check_response_topic(response_topic),
        };
        match check {
            TopicCheck::Valid => {}
            TopicCheck::Invalid => return,
            TopicCheck::Forbidden => {
                self.outputs.push(Output::Violation {
                    client_id: identity.map(str::to_string),
                    reason: format!(
                        "response topic {response_topic:?} is reserved for the state store"
                    ),
                });
                return;
            }
        }
        let received = msg.received_at.map_or(now, |at| at.min(now));
        let deadline = msg
            .message_expiry_interval
            .map(|secs| received.saturating_add(u64::from(secs) * 1000));
        if deadline.is_some_and(|d| now >= d) {
            return; // Expired before we got to it: nobody waits for the answer.
        }
        let expiry = deadline.map(|d| rpc::remaining_secs(d, now));
        let Some(correlation) = msg.correlation_data else {
            let reply = Reply::status(
                Status::BadRequest,
                "the request has no correlation data".into(),
                vec![(prop::PROPERTY_NAME, "Correlation Data".into())],
            );
            let out = self.response(response_topic.into(), None, expiry, reply);
            self.outputs.push(Output::Publish(out));
            return;
        };
        let Some(deadline) = deadline else {
            let reply = Reply::status(
                Status::BadRequest,
                "the request has no message expiry interval".into(),
                vec![(prop::PROPERTY_NAME, "Message Expiry".into())],
            );
            let out = self.response(response_topic.into(), Some(correlation), None, reply);
            self.outputs.push(Output::Publish(out));
            return;
        };
        let expiry = rpc::remaining_secs(deadline, now);
        if let Some(mut reply) = cached {
            reply.message_expiry_interval = Some(expiry);
            self.outputs.push(Output::Publish(reply));
            return;
        }
        let reply = self.execute(msg, &props, identity, now);
        let topic = || known.unwrap_or_else(|| response_topic.into());
        // Handling a wire batch: the reply goes straight into the output
        // list. The dedup cache still keeps a message.
        if reply.extra.is_empty()
            && let Some(w) = self.outputs.writer()
        {
            w.reply(&ReplyParts {
                topic: response_topic,
                correlation: Some(correlation),
                expiry: Some(expiry),
                status: reply.status,
                payload: &reply.payload,
                version: reply.version,
                node: &self.config.node_id,
                source_id: self.server_id.as_deref(),
            });
            if reply.cache {
                let out = self.response(topic(), Some(correlation), None, reply);
                self.cache_reply(response_topic, correlation, deadline, out);
            }
            return;
        }
        let cache = reply.cache;
        let mut out = self.response(topic(), Some(correlation), None, reply);
        if cache {
            self.cache_reply(response_topic, correlation, deadline, out.clone());
        }
        out.message_expiry_interval = Some(expiry);
        self.outputs.push(Output::Publish(out));
    }

    /// Keeps a reply (without its message expiry interval) for retries of
    /// its request until `deadline` and the dedup buffer have passed, and
    /// journals it when the store is durable.
    fn cache_reply(
        &mut self,
        response_topic: &str,
        correlation: &[u8],
        deadline: u64,
        reply: OutboundMessage,
    ) {
        let cached = Cached {
            expires_at: deadline.saturating_add(rpc::DEDUP_BUFFER_MS),
            reply,
        };
        if self.config.persist != Persist::None {
            let record = journal::reply(
                response_topic,
                correlation,
                cached.expires_at,
                &cached.reply,
            );
            self.outputs.journal(record);
        }
        self.dedup.insert(response_topic, correlation, cached);
    }

    /// Everything after the envelope checks; notifications are queued here,
    /// the reply is returned.
    fn execute(
        &mut self,
        msg: &MessageRef<'_>,
        props: &RequestProps<'_>,
        identity: Option<&str>,
        now: u64,
    ) -> Reply {
        if let Some(version) = props.protocol_version
            && !rpc::version_supported(version)
        {
            return Reply::status(
                Status::VersionNotSupported,
                format!("protocol version {version:?} is not supported"),
                vec![
                    (prop::SUPPORTED_MAJOR, "1".into()),
                    (prop::REQUEST_VERSION, version.to_string()),
                ],
            );
        }
        let command = match command::parse(msg.payload) {
            Ok(c) => c,
            Err(e) => return Reply::error(e),
        };
        #[cfg(feature = "fault-injection")]
        if let Some(payload) = crate::fault::inject(&command) {
            return Reply::ok(payload, None);
        }
        // (wall, counter): the node id of a `__ts` plays no part.
        let timestamp = match props.timestamp.map(Hlc::parse_parts) {
            None if matches!(command, Command::Set { .. }) => {
                return Reply::error(ServiceError::TimestampMissing);
            }
            None => None,
            Some(Err(_)) => return Reply::error(ServiceError::TimestampMalformed),
            Some(Ok((wall, _, _))) if hlc::too_far_ahead(wall, now) => {
                return Reply::error(ServiceError::TimestampSkew);
            }
            Some(Ok((wall, counter, _))) => Some((wall, counter)),
        };
        let fencing_token = match props.fencing_token.filter(|_| command.is_fenced_write()) {
            None => None,
            Some(text) => match Hlc::parse(text) {
                Err(_) => return Reply::error(ServiceError::TimestampMalformed),
                Ok(ft) if ft.too_far_ahead_of(now) => {
                    return Reply::error(ServiceError::FencingTokenSkew);
                }
                Ok(ft) => Some(ft),
            },
        };
        let observer = match command {
            Command::KeyNotify { key, .. } => match identity {
                None => {
                    return Reply::status(
                        Status::BadRequest,
                        "KEYNOTIFY needs the client's identity (__srcId)".into(),
                        vec![(prop::PROPERTY_NAME, prop::SOURCE_ID.into())],
                    );
                }
                Some(client) if notify::topic_len(client, key) > notify::MAX_TOPIC_LEN => {
                    return Reply::error(ServiceError::SyntaxError);
                }
                Some(client) => Some(client),
            },
            _ => None,
        };
        // The request's `__ts` is absorbed into L (spec §8.4).
        let received = match timestamp.map(|(w, c)| self.clock.receive_parts(w, c, now)) {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(_)) => return Reply::counter_overflow(),
        };
        if let (Command::KeyNotify { key, stop }, Some(client)) = (&command, observer) {
            let payload = if !*stop {
                self.registry.register(client, key);
                resp3::REPLY_OK
            } else if self.registry.unregister(client, key) {
                resp3::REPLY_OK
            } else {
                resp3::REPLY_NOT_FOUND
            };
            return Reply::ok(Bytes::from_static(payload), None);
        }
        let request = Request {
            now,
            received,
            fencing_token: fencing_token.as_ref(),
            persist: props
                .persist
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        };
        // Whether the key's current value was journaled (only Persist::Flagged
        // asks; a GET changes nothing).
        let before = self.config.persist == Persist::Flagged
            && !matches!(command, Command::Get { .. })
            && self
                .table
                .get(command.key(), now)
                .is_some_and(|e| e.persist);
        let outcome = match self.table.execute(&command, request, &mut self.clock) {
            Ok(outcome) => outcome,
            Err(_) => return Reply::counter_overflow(),
        };
        if let Some(version) = outcome.version {
            self.journal_change(command.key(), outcome.change, version, before);
            self.notify(command.key(), outcome.change, version);
        }
        let mut reply = Reply::ok(outcome.reply, outcome.version);
        reply.cache = !matches!(command, Command::Get { .. });
        reply
    }

    /// Queues the journal record of a change (before its notifications and reply).
    fn journal_change(
        &mut self,
        key: &[u8],
        change: Change,
        version: Version,
        was_persisted: bool,
    ) {
        let record = match change {
            Change::None => return,
            Change::Set => match self.table.entry(key) {
                Some(e) if self.journals(e.persist) => journal::put(key, e),
                // Flagged mode, an unflagged SET over a persisted value: the
                // old value must not come back after a restart.
                Some(_) if self.journals(was_persisted) => journal::delete(key, version),
                _ => return,
            },
            Change::Delete if self.journals(was_persisted) => journal::delete(key, version),
            Change::Delete => return,
        };
        self.outputs.journal(record);
    }

    /// Queues a notification of `change` to every observer of `key`.
    fn notify(&mut self, key: &[u8], change: Change, version: Version) {
        if !self.registry.is_observed(key) {
            return;
        }
        let payload = match change {
            Change::None => return,
            Change::Delete => resp3::notify_delete(),
            Change::Set => match self.table.entry(key) {
                Some(e) => resp3::notify_set(e.value),
                None => return,
            },
        };
        if let Some(w) = self.outputs.writer() {
            w.notifications(
                &NotificationParts {
                    key,
                    payload: &payload,
                    version,
                    node: &self.config.node_id,
                    source_id: self.server_id.as_deref(),
                },
                self.registry.observers(key),
            );
            return;
        }
        let payload = Bytes::from(payload);
        let timestamp = Str::from(version.encode(&self.config.node_id));
        for client in self.registry.observers(key) {
            let message = rpc::notification_message(
                notify::topic(client, key).into(),
                Str::from(client),
                payload.clone(),
                timestamp.clone(),
                self.server_id.clone(),
            );
            self.outputs.push(Output::Publish(message));
        }
    }

    fn response(
        &self,
        topic: Str,
        correlation: Option<&[u8]>,
        expiry: Option<u32>,
        reply: Reply,
    ) -> OutboundMessage {
        let node = &self.config.node_id;
        envelope(
            self.server_id.as_ref(),
            node,
            topic,
            correlation,
            expiry,
            reply,
        )
    }

    /// The reply a host sends for a request that no state machine could
    /// handle (the tenant's guest failed, or the client belongs to no
    /// tenant), with the same envelope rules as a handled request: `None`
    /// where a handled request would get no reply either (not a QoS 1
    /// request, no or a forbidden response topic, already expired). Uses
    /// no state: the host calls it on the native build.
    pub fn host_reply(
        config: &Config,
        msg: &InboundMessage,
        now: u64,
        reply: HostReply,
    ) -> Option<OutboundMessage> {
        if msg.topic != rpc::REQUEST_TOPIC || msg.qos != 1 {
            return None;
        }
        let topic = msg.response_topic.as_deref()?;
        if rpc::check_response_topic(topic) != TopicCheck::Valid {
            return None;
        }
        let received = msg.received_at.map_or(now, |at| at.min(now));
        let deadline = msg
            .message_expiry_interval
            .map(|secs| received.saturating_add(u64::from(secs) * 1000));
        if deadline.is_some_and(|d| now >= d) {
            return None;
        }
        let reply = match reply {
            HostReply::InternalError(message) => {
                Reply::status(Status::InternalError, message, Vec::new())
            }
            HostReply::NotAuthorized => Reply::error(ServiceError::NotAuthorized),
        };
        Some(envelope(
            config.server_client_id.as_deref().map(Str::from).as_ref(),
            &config.node_id,
            topic.into(),
            msg.correlation_data.as_deref(),
            deadline.map(|d| rpc::remaining_secs(d, now)),
            reply,
        ))
    }
}

/// What [`StateMachine::host_reply`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostReply {
    /// 500 with this `__stMsg`.
    InternalError(String),
    /// 200 with `-ERR not authorized`.
    NotAuthorized,
}

/// A reply as an MQTT message (spec §4.1).
fn envelope(
    server_id: Option<&Str>,
    node: &str,
    topic: Str,
    correlation: Option<&[u8]>,
    expiry: Option<u32>,
    reply: Reply,
) -> OutboundMessage {
    let extra = reply.extra.into_iter();
    rpc::reply_message(
        topic,
        correlation.map(Bytes::copy_from_slice),
        expiry,
        reply.status,
        reply.payload,
        reply.version.map(|v| v.encode(node).into()),
        extra.map(|(n, v)| (Str::from_static(n), v.into())),
        server_id.cloned(),
    )
}
