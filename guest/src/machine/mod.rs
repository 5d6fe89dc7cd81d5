//! The state machine: a call hands in inputs at `now`, and every output
//! they cause comes back from that call, written into one output list.
//!
//! ```text
//!  handle_wire(batch, now) ─┐  for each input (an empty batch: once):
//!  step(inputs, now) ───────┘   1. expire keys due at `now` (DELETE notifications;
//!                                  at most EXPIRY_BUDGET a call)
//!                               2. the input itself (a request, a disconnect)
//!                               until the outputs hold OUTPUT_BUDGET bytes:
//!                               then `more(n)`, and the host calls again
//!                     v
//!   OutputWriter: journal records of an input first, then its notifications,
//!                 then its reply  ──> the encoded output list (crate::wire)
//!   next_deadline(): earliest key expiry or dedup eviction
//! ```
//!
//! Request path (spec §5.4 order): topic and QoS -> response topic ->
//! expiry -> correlation data -> message expiry -> dedup cache -> `__protVer`
//! -> RESP3 command -> `__ts` -> `__ft` -> identity (KEYNOTIFY) -> clock
//! receive -> fencing -> condition -> apply -> notify -> reply.
//!
//! Snapshots, restore and journal replay are in `recovery.rs`.

mod calls;
mod recovery;
use calls::Batch;
pub use calls::LARGE_VALUE;
pub use recovery::{Restoring, SnapshotCursor};

use crate::authz::{Authorizer, Need, Principal};
use crate::command::{self, Command};
use crate::errors::ServiceError;
use crate::hlc::{self, Clock, Hlc, Version};
use crate::journal;
use crate::notify::{self, Registry};
use crate::resp3;
use crate::rpc::dedup::{Cached, DedupCache, TopicHint};
use crate::rpc::{self, Reply, RequestProps, Status, TopicCheck, prop};
use crate::scan::{self, KeySet};
use crate::table::{Change, Outcome, Request, Table};
use crate::types::{
    AuthRule, Bytes, Config, Error, InboundMessage, Input, OutboundMessage, Output, Persist, Stats,
    Str,
};
use crate::wire::{self, InputRef, MessageRef, NotificationParts, OutputWriter, ReplyTo};

/// A call takes no further input once its output list holds this many
/// bytes: what crosses the boundary in one call stays bounded (wasmtime
/// also refuses to move more than its hostcall fuel at once). One input's
/// outputs can go past it (a GET of a large value).
pub const OUTPUT_BUDGET: usize = 8 << 20;

/// Most keys one call expires, and most dedup entries it forgets: a million
/// keys due together expire over many calls, with requests served between.
pub const EXPIRY_BUDGET: usize = 4096;

/// Most keys a call with inputs expires first (and dedup entries it
/// forgets): an eighth of a timer call's, so that a request arriving while
/// a million keys expire waits for little of it (a key left due is dead to
/// reads and expired before a write touches it, so nothing depends on it).
pub const REQUEST_EXPIRY_BUDGET: usize = EXPIRY_BUDGET / 8;

/// The whole state store.
#[derive(Debug, Clone)]
pub struct StateMachine {
    pub(crate) config: Config,
    pub(crate) clock: Clock,
    pub(crate) table: Table,
    pub(crate) registry: Registry,
    pub(crate) dedup: DedupCache,
    /// The outputs of the call in progress.
    out: OutputWriter,
    /// Keys the call in progress may still expire (and dedup entries it
    /// may still forget).
    expiry_budget: usize,
    /// `config.server_client_id`, shared by every reply and notification.
    server_id: Option<Str>,
    /// `config.persist_keys`, compiled.
    persist_keys: KeySet,
    /// Seals SCAN tokens that would name a key their client may not read.
    scan_seal: scan::Seal,
    /// `config.authorization`, compiled.
    authz: Option<Authorizer>,
    /// Requests answered from the dedup cache, keys expired.
    dedup_hits: u64,
    expired: u64,
    /// The call in progress only reads ([`StateMachine::query_wire`]): no
    /// reply is cached and no `__ts` moves the clock.
    read_only: bool,
    /// The batch of the `handle_wire` call in progress: a large value of
    /// it is journaled by reference (`OutputWriter::journal_spliced`), and
    /// maybe lent to the table.
    batch: Option<Batch>,
}

/// A `__ts` without its node id: (wall clock ms, counter).
type WallCounter = (u64, u64);

impl StateMachine {
    /// Whether `config` is one a store can be made with (its authorization
    /// rules included).
    pub fn validate_config(config: &Config) -> Result<(), Error> {
        config.validate()?;
        if let Some(rules) = &config.authorization {
            Authorizer::new(rules).map_err(Error::InvalidConfig)?;
        }
        Ok(())
    }

    /// Replaces the authorization rules (a policy reload): from the next
    /// request on, these decide. Refused, nothing changes.
    pub fn set_authorization(&mut self, rules: Option<Vec<AuthRule>>) -> Result<(), Error> {
        self.authz = match &rules {
            None => None,
            Some(r) => Some(Authorizer::new(r).map_err(Error::InvalidConfig)?),
        };
        self.config.authorization = rules;
        Ok(())
    }

    /// An empty store.
    pub fn new(config: Config) -> Result<StateMachine, Error> {
        StateMachine::validate_config(&config)?;
        let table = Table::with_seed(config.hash_seed);
        let dedup = DedupCache::with_seed(config.hash_seed);
        Ok(StateMachine::from_parts(
            Clock::new(config.node_id.clone()),
            config,
            table,
            Registry::default(),
            dedup,
        ))
    }

    pub(crate) fn from_parts(
        clock: Clock,
        config: Config,
        mut table: Table,
        mut registry: Registry,
        mut dedup: DedupCache,
    ) -> StateMachine {
        table.set_quota(config.quota);
        // What a store's quota allows it to hold bounds what its clients can
        // make it hold besides keys: a quarter of it each for KEYNOTIFY
        // registrations and cached replies (at least 1 MiB).
        if let Some(bytes) = config.quota.max_bytes {
            let share = usize::try_from(bytes / 4)
                .unwrap_or(usize::MAX)
                .max(1 << 20);
            registry.set_limit(share);
            dedup.set_limit(share);
        }
        StateMachine {
            server_id: config.server_client_id.as_deref().map(Str::from),
            persist_keys: KeySet::new(&config.persist_keys),
            scan_seal: scan::Seal::new(config.hash_seed),
            // Checked by `validate_config`; rules that would not compile
            // allow nothing.
            authz: config
                .authorization
                .as_deref()
                .map(|r| Authorizer::new(r).unwrap_or_default()),
            dedup_hits: 0,
            expired: 0,
            read_only: false,
            batch: None,
            config,
            clock,
            table,
            registry,
            dedup,
            out: OutputWriter::default(),
            expiry_budget: EXPIRY_BUDGET,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// When the host must next call (with no inputs): the earliest key
    /// expiry or dedup eviction. Changes only after a call.
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

    /// Sizes and counts, for metrics.
    pub fn stats(&self) -> Stats {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        Stats {
            keys: n(self.table.len()),
            bytes: self.table.bytes(),
            registrations: n(self.registry.len()),
            dedup_entries: n(self.dedup.len()),
            dedup_bytes: n(self.dedup.bytes()),
            dedup_hits: self.dedup_hits,
            expired: self.expired,
        }
    }

    /// The next outputs belong to a new input, handled at `now`: keys due
    /// by then expire first, as many as the call's budget allows (a key
    /// left due is dead to every command, and one a command touches is
    /// expired first: [`StateMachine::expire_if_due`]).
    fn begin_input(&mut self, now: u64) {
        self.out.begin_input();
        while self.expiry_budget > 0 {
            let Some((key, persist)) = self.table.pop_expired(now) else {
                break;
            };
            self.expiry_budget -= 1;
            self.expired(&key, persist, now);
        }
        self.expiry_budget -= self.dedup.evict(now, self.expiry_budget);
    }

    /// A key whose deadline passed is gone: its journal record and DELETE
    /// notifications.
    fn expired(&mut self, key: &[u8], persist: bool, now: u64) {
        self.expired += 1;
        // An expiry is a deletion: it gets its own HLC. On counter
        // overflow reuse L rather than fail a timer.
        let version = self
            .clock
            .tick_version(now)
            .unwrap_or_else(|_| self.clock.version());
        if self.journals(persist) {
            self.out.journal(&journal::expire(key, version));
        }
        self.notify(key, Change::Delete, version, &[]);
    }

    /// Expires `key` now if it is due and still there (the call's expiry
    /// budget ran out before it): a command that changes a key sees its
    /// expiry happen first, as it would have.
    fn expire_if_due(&mut self, key: &[u8], now: u64) {
        if let Some(persist) = self.table.take_due(key, now) {
            self.expired(key, persist, now);
        }
    }

    /// Whether a change to a key with this persist flag is journaled (a
    /// removal of a key that was never journaled needs no record either).
    fn journals(&self, persist: bool) -> bool {
        match self.config.persist {
            Persist::None => false,
            Persist::All => true,
            Persist::Flagged | Persist::Custom => persist,
        }
    }

    /// Writes `reply` to `topic` into the outputs.
    fn reply(
        &mut self,
        topic: &str,
        correlation: Option<&[u8]>,
        expiry: Option<u32>,
        reply: &Reply,
    ) {
        let to = ReplyTo {
            topic,
            correlation,
            expiry,
            node: &self.config.node_id,
            source_id: self.server_id.as_deref(),
        };
        self.out.reply(&to, reply);
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
        // topic alone). A cached reply is only sent after the checks below.
        let probe = self.dedup.probe(response_topic, msg.correlation_data, now);
        let cached = probe.cached.map(|c| c.reply.clone());
        // Where the cache keeps this topic's replies, for the insert below.
        let hint = probe.topic;
        let check = if hint.is_some() {
            TopicCheck::Valid
        } else {
            rpc::check_response_topic(response_topic)
        };
        match check {
            TopicCheck::Valid => {}
            TopicCheck::Invalid => return,
            TopicCheck::Forbidden => {
                let reason =
                    format!("response topic {response_topic:?} is reserved for the state store");
                self.out.violation(identity, &reason);
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
        let Some(correlation) = msg.correlation_data else {
            let reply = Reply::status(
                Status::BadRequest,
                "the request has no correlation data".into(),
                &[(prop::PROPERTY_NAME, "Correlation Data".into())],
            );
            let expiry = deadline.map(|d| rpc::remaining_secs(d, now));
            self.reply(response_topic, None, expiry, &reply);
            return;
        };
        // What the dedup cache would keep for this request is bounded.
        let too_long = if correlation.len() > rpc::MAX_CORRELATION_LEN {
            Some((
                "correlation data",
                rpc::MAX_CORRELATION_LEN,
                "Correlation Data",
            ))
        } else if response_topic.len() > rpc::MAX_RESPONSE_TOPIC_LEN {
            Some((
                "response topic",
                rpc::MAX_RESPONSE_TOPIC_LEN,
                "Response Topic",
            ))
        } else {
            None
        };
        if let Some((what, max, name)) = too_long {
            let reply = Reply::status(
                Status::BadRequest,
                format!("the {what} is longer than {max} bytes"),
                &[(prop::PROPERTY_NAME, name.into())],
            );
            let expiry = deadline.map(|d| rpc::remaining_secs(d, now));
            self.reply(response_topic, Some(correlation), expiry, &reply);
            return;
        }
        let Some(deadline) = deadline else {
            let reply = Reply::status(
                Status::BadRequest,
                "the request has no message expiry interval".into(),
                &[(prop::PROPERTY_NAME, "Message Expiry".into())],
            );
            self.reply(response_topic, Some(correlation), None, &reply);
            return;
        };
        let expiry = Some(rpc::remaining_secs(deadline, now));
        // Without a broker to vouch for the requester (`client_id`), the
        // identity it claims must be the one its response topic names when
        // that topic has the SDKs' shape: one client cannot act as another
        // (cancel its KEYNOTIFY, hold its locks) while receiving the replies
        // elsewhere. With `sdk_response_topics` the topic must have it.
        // An identity is verified when a broker vouches for it or the
        // response topic names it; an unverified one names nobody to the
        // authorization rules and cannot hold KEYNOTIFY registrations.
        let mut verified = msg.client_id.is_some();
        if msg.client_id.is_none() {
            let claim = identity.map(|id| rpc::topic_claims(response_topic, id));
            verified = claim == Some(Some(true));
            let refused = match claim {
                Some(Some(agrees)) => !agrees,
                Some(None) | None => self.config.sdk_response_topics,
            };
            if refused {
                // Not answered where it asks: the topic is not the
                // requester's, so a refusal published there would land on
                // someone else's topic (the store a deputy of whoever
                // chose it). The host logs and counts it.
                let reason = match identity {
                    Some(id) => format!(
                        "request from {id:?} with response topic {response_topic:?}, which is not its own: not answered"
                    ),
                    None => format!(
                        "request with no requester identity and response topic {response_topic:?}: not answered"
                    ),
                };
                self.out.violation(None, &reason);
                return;
            }
        } else if self.config.sdk_response_topics
            && identity.and_then(|id| rpc::topic_claims(response_topic, id)) != Some(true)
        {
            let reply = Reply::error(ServiceError::NotAuthorized);
            self.reply(response_topic, Some(correlation), expiry, &reply);
            return;
        }
        if let Some(reply) = cached {
            self.dedup_hits += 1;
            self.reply(response_topic, Some(correlation), expiry, &reply);
            return;
        }
        let (reply, cache) = self.execute(msg, &props, identity, verified, now);
        self.reply(response_topic, Some(correlation), expiry, &reply);
        if cache && !self.read_only {
            // Charged to its client when someone vouches for it; else to
            // its response topic alone.
            let client = identity.filter(|_| verified);
            let to = (response_topic, hint.as_ref());
            self.cache_reply(client, to, correlation, deadline, now, reply);
        }
    }

    /// Keeps a reply for retries of its request until `deadline` (at most
    /// [`rpc::MAX_DEDUP_MS`] from `now`) and the dedup buffer have passed,
    /// and journals it when the store is durable. The reply goes to the
    /// response topic, with what the request's probe found of it
    /// ([`DedupCache::insert_hinted`]).
    fn cache_reply(
        &mut self,
        client: Option<&str>,
        (response_topic, hint): (&str, Option<&TopicHint>),
        correlation: &[u8],
        deadline: u64,
        now: u64,
        reply: Reply,
    ) {
        let until = deadline.min(now.saturating_add(rpc::MAX_DEDUP_MS));
        let cached = Cached {
            expires_at: until.saturating_add(rpc::DEDUP_BUFFER_MS),
            reply,
        };
        if self.config.persist != Persist::None {
            let (node, source) = (&self.config.node_id, self.server_id.as_deref());
            let size =
                journal::reply_size(client, response_topic, correlation, &cached.reply, node);
            self.out.journal_with(size, |buf| {
                journal::reply_into(
                    buf,
                    client,
                    response_topic,
                    correlation,
                    cached.expires_at,
                    &cached.reply,
                    node,
                    source,
                );
            });
        }
        self.dedup
            .insert_hinted(client, response_topic, correlation, cached, hint);
    }

    /// Everything after the envelope checks; notifications are written
    /// here, the reply is returned with whether the dedup cache keeps it:
    /// every reply, errors included (spec §13.1), except a GET's (re-reading
    /// is harmless and values can be large) and the refusal of a payload
    /// that is not a command at all (its retry is refused again, and a flood
    /// of garbage must not fill the cache).
    fn execute(
        &mut self,
        msg: &MessageRef<'_>,
        props: &RequestProps<'_>,
        identity: Option<&str>,
        verified: bool,
        now: u64,
    ) -> (Reply, bool) {
        match self.execute_command(msg, props, identity, verified, now) {
            Ok(done) => done,
            Err(refused) => (refused, true),
        }
    }

    /// [`StateMachine::execute`]: `Err` is a reply the cache keeps, returned
    /// early.
    fn execute_command(
        &mut self,
        msg: &MessageRef<'_>,
        props: &RequestProps<'_>,
        identity: Option<&str>,
        verified: bool,
        now: u64,
    ) -> Result<(Reply, bool), Reply> {
        if let Some(version) = props.protocol_version
            && !rpc::version_supported(version)
        {
            return Err(Reply::status(
                Status::VersionNotSupported,
                format!("protocol version {version:?} is not supported"),
                &[
                    (prop::SUPPORTED_MAJOR, "1".into()),
                    (prop::REQUEST_VERSION, version.to_string()),
                ],
            ));
        }
        let command = match command::parse(msg.payload) {
            Ok(c) => c,
            Err(e) => return Ok((Reply::error(e), false)),
        };
        #[cfg(feature = "fault-injection")]
        if let Some(payload) = crate::fault::inject(&command) {
            return Err(Reply::ok(payload, None));
        }
        // Per-key authorization: refused before anything else is looked at
        // (not kept by the dedup cache: a policy reload may change it).
        let principal = Principal {
            client_id: identity.filter(|_| verified),
            username: msg.username,
            attributes: msg.attributes,
        };
        let read_grants = match (&self.authz, &command) {
            (None, _) => None,
            (Some(a), Command::Scan { .. }) => Some(a.grants(&principal, Need::Read)),
            (Some(a), c) => {
                let need = match c {
                    Command::Get { .. } | Command::KeyNotify { .. } => Need::Read,
                    _ => Need::Write,
                };
                if !a.grants(&principal, need).allows(c.key()) {
                    return Ok((Reply::error(ServiceError::NotAuthorized), false));
                }
                None
            }
        };
        let (timestamp, fencing_token) = self.check_times(&command, props, now)?;
        let observer = match command {
            Command::KeyNotify { key, .. } => match identity {
                None => {
                    return Err(Reply::status(
                        Status::BadRequest,
                        "KEYNOTIFY needs the client's identity (__srcId)".into(),
                        &[(prop::PROPERTY_NAME, prop::SOURCE_ID.into())],
                    ));
                }
                Some(client) if notify::topic_len(client, key) > notify::MAX_TOPIC_LEN => {
                    return Err(Reply::error(ServiceError::SyntaxError));
                }
                // A registration is an identity's (a disconnect drops it,
                // a STOP ends it): only one proven by the broker or by the
                // response topic (`clients/<id>/...`) may hold one.
                Some(_) if !verified => {
                    return Ok((Reply::error(ServiceError::NotAuthorized), false));
                }
                Some(client) => Some(client),
            },
            _ => None,
        };
        // The request's `__ts` is absorbed into L (spec §8.4).
        let timestamp = timestamp.filter(|_| !self.read_only);
        let received = match timestamp.map(|(w, c)| self.clock.receive_parts(w, c, now)) {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(_)) => return Err(Reply::counter_overflow()),
        };
        if let (Command::KeyNotify { key, stop }, Some(client)) = (&command, observer) {
            return Err(self.keynotify(client, key, *stop, msg, &principal));
        }
        if let Command::Scan { pattern, token } = command {
            // A read, like GET: not kept by the dedup cache.
            let readable = |key: &[u8]| read_grants.as_ref().is_none_or(|g| g.allows(key));
            let payload = scan::page(
                &self.table,
                pattern,
                token,
                now,
                self.config.scan_page,
                readable,
                &self.scan_seal,
            )
            .unwrap_or_else(|e| resp3::error(&e));
            return Ok((Reply::ok(payload, None), false));
        }
        let flagged = props
            .persist
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let request = Request {
            now,
            received,
            fencing_token: fencing_token.as_ref(),
            persist: flagged
                || (self.config.persist == Persist::Custom
                    && matches!(command, Command::Set { .. })
                    && self.persist_keys.contains(command.key())),
            lend: match (&command, self.batch) {
                (Command::Set { value, .. }, Some(batch)) => batch.lend(value),
                _ => None,
            },
        };
        if !matches!(command, Command::Get { .. }) {
            self.expire_if_due(command.key(), now);
        }
        // Whether the key's current value was journaled (only Persist::Flagged
        // asks; a GET changes nothing).
        let before = matches!(self.config.persist, Persist::Flagged | Persist::Custom)
            && !matches!(command, Command::Get { .. })
            && self
                .table
                .get(command.key(), now)
                .is_some_and(|e| e.persist);
        let outcome = match self.table.execute(&command, request, &mut self.clock) {
            Ok(outcome) => outcome,
            Err(_) => return Err(Reply::counter_overflow()),
        };
        if let Some(version) = outcome.version {
            let value = match command {
                Command::Set { value, .. } => value,
                _ => &[],
            };
            self.journal_change(command.key(), &outcome, version, before, value);
            self.notify(command.key(), outcome.change, version, value);
        }
        let cache = !matches!(command, Command::Get { .. });
        Ok((Reply::ok(outcome.reply, outcome.version), cache))
    }

    /// A request's `__ts` as (wall, counter), and its fencing token if the
    /// command is a fenced write: checked for form and skew.
    fn check_times(
        &self,
        command: &Command<'_>,
        props: &RequestProps<'_>,
        now: u64,
    ) -> Result<(Option<WallCounter>, Option<Hlc>), Reply> {
        // (wall, counter): the node id of a `__ts` plays no part.
        let timestamp = match props.timestamp.map(Hlc::parse_parts) {
            None if matches!(command, Command::Set { .. }) => {
                return Err(Reply::error(ServiceError::TimestampMissing));
            }
            None => None,
            Some(Err(_)) => return Err(Reply::error(ServiceError::TimestampMalformed)),
            Some(Ok((wall, _, _))) if !self.read_only && hlc::too_far_ahead(wall, now) => {
                return Err(Reply::error(ServiceError::TimestampSkew));
            }
            Some(Ok((wall, counter, _))) => Some((wall, counter)),
        };
        let fencing_token = match props.fencing_token.filter(|_| command.is_fenced_write()) {
            None => None,
            Some(text) => match Hlc::parse(text) {
                Err(_) => return Err(Reply::error(ServiceError::TimestampMalformed)),
                Ok(ft) if ft.too_far_ahead_of(now) => {
                    return Err(Reply::error(ServiceError::FencingTokenSkew));
                }
                Ok(ft) => Some(ft),
            },
        };
        Ok((timestamp, fencing_token))
    }

    /// KEYNOTIFY (or its STOP) of `key` by `client`, as `principal`.
    fn keynotify(
        &mut self,
        client: &str,
        key: &[u8],
        stop: bool,
        msg: &MessageRef<'_>,
        principal: &Principal<'_>,
    ) -> Reply {
        let payload = if !stop {
            let watcher = notify::Watcher::of(principal);
            if self
                .registry
                .register(client, key, msg.via, &watcher)
                .is_err()
            {
                return Reply::error(ServiceError::QuotaExceeded);
            }
            resp3::REPLY_OK
        } else if self.registry.unregister(client, key) {
            resp3::REPLY_OK
        } else {
            resp3::REPLY_NOT_FOUND
        };
        Reply::ok(Bytes::from_static(payload), None)
    }

    /// Writes the journal record of a change (ahead of its notifications
    /// and reply); `value` is a SET's, as its request holds it.
    fn journal_change(
        &mut self,
        key: &[u8],
        outcome: &Outcome,
        version: Version,
        was_persisted: bool,
        value: &[u8],
    ) {
        let record = match outcome.change {
            Change::None => return,
            Change::Set => {
                let lent = self.table.lent().filter(|l| l.key() == key);
                let entry = match (lent, outcome.slot) {
                    (Some(l), _) => Some(l.entry(value)),
                    (None, Some(at)) => self.table.entry_at(at),
                    (None, None) => self.table.entry(key),
                };
                match entry {
                    Some(e) if self.journals(e.persist) => {
                        match self.batch.and_then(|b| b.find(value)) {
                            // The host has the value: the record names
                            // where it lies rather than carry a copy.
                            Some(at) => {
                                let (head, tail) = journal::put_around(key, e);
                                self.out.journal_spliced(&head, at, &tail);
                            }
                            // Written in place: a large value is copied once.
                            None => {
                                let size = journal::put_size(key, e);
                                self.out
                                    .journal_with(size, |buf| journal::put_into(buf, key, e));
                            }
                        }
                        return;
                    }
                    // Flagged mode, an unflagged SET over a persisted value:
                    // the old value must not come back after a restart.
                    Some(_) if self.journals(was_persisted) => journal::delete(key, version),
                    _ => return,
                }
            }
            Change::Delete if self.journals(was_persisted) => journal::delete(key, version),
            Change::Delete => return,
        };
        self.out.journal(&record);
    }

    /// Writes a notification of `change` to every observer of `key`;
    /// `value` is a SET's.
    fn notify(&mut self, key: &[u8], change: Change, version: Version, value: &[u8]) {
        if !self.registry.is_observed(key) {
            return;
        }
        let payload = match change {
            Change::None => return,
            Change::Delete => resp3::notify_delete(),
            Change::Set => resp3::notify_set(value),
        };
        // Each observer as the rules in force see it now: a registration
        // outlives no read right.
        let authz = self.authz.as_ref();
        let allowed = self.registry.watchers(key).filter_map(|(client, w)| {
            authz
                .is_none_or(|a| a.grants(&w.principal(client), Need::Read).allows(key))
                .then_some(client)
        });
        self.out.notifications(
            &NotificationParts {
                key,
                payload: &payload,
                version,
                node: &self.config.node_id,
                source_id: self.server_id.as_deref(),
            },
            allowed,
        );
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
            HostReply::InternalError(message) => Reply::status(Status::InternalError, message, &[]),
            HostReply::NotAuthorized => Reply::error(ServiceError::NotAuthorized),
            HostReply::Unavailable(message) => Reply::status(Status::Unavailable, message, &[]),
            HostReply::OutcomeUnknown {
                message,
                waited_secs,
            } => Reply::status(
                Status::RequestTimeout,
                message,
                &[
                    (rpc::prop::PROPERTY_NAME, "ExecutionTimeout".into()),
                    (rpc::prop::PROPERTY_VALUE, format!("PT{waited_secs}S")),
                ],
            ),
        };
        Some(reply.message(
            topic.into(),
            msg.correlation_data.as_deref().map(Bytes::copy_from_slice),
            deadline.map(|d| rpc::remaining_secs(d, now)),
            &config.node_id,
            config.server_client_id.as_deref().map(Str::from),
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
    /// 503 ("server not ready", spec §4.3) with this `__stMsg`: the
    /// tenant has stopped, or no cluster replica leads: the request was
    /// not applied and will not be.
    Unavailable(String),
    /// 408 (`__propName: ExecutionTimeout`, `__propVal: PT<waited_secs>S`)
    /// with this `__stMsg`: the request was not applied within
    /// `waited_secs` and may still be (a cluster replica sent it to a
    /// leader it then lost). The SDKs report a timeout.
    OutcomeUnknown {
        /// `__stMsg`.
        message: String,
        /// How long it waited.
        waited_secs: u64,
    },
}
