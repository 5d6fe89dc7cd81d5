//! The embedded broker's hooks: who may connect, subscribe and publish,
//! requests handed to the tenants' drivers, deliveries checked against the
//! rules in force, and what a departure ends.

use std::sync::atomic::Ordering;

use rmqtt::codec::v3::ConnectAckReason as ConnectAckReasonV3;
use rmqtt::codec::v5::ConnectAckReason as ConnectAckReasonV5;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType};
use rmqtt::session::Session;
use rmqtt::types::{
    AuthResult, ClientId, ConnectAckReason, ConnectInfo, From as MsgFrom, Id, Publish, Reason,
    Subscribe,
};
use statestore_guest::rpc::REQUEST_TOPIC;
use tracing::{debug, warn};

use super::{CONSUMED, Router, Verified, inbound};

/// The broker hooks: hand requests and disconnects to the tenants' drivers.
pub(super) struct Hooks {
    pub(super) router: std::sync::Arc<Router>,
}

pub(super) fn username(id: &Id) -> Option<&str> {
    id.username.as_ref().map(|u| u.as_ref() as &str)
}

impl Hooks {
    /// Who the client is: its password, its tenant's, or anonymous; with
    /// the user name it proved, if it proved one.
    fn authenticate(&self, info: &rmqtt::types::ConnectInfo) -> (AuthResult, Option<String>) {
        let addr = info.id().remote_addr;
        if let Some(users) = self.router.users.as_ref().map(|u| u.get()) {
            let client_id: &str = info.id().client_id.as_ref();
            let user = info.username().map(|u| u.to_string());
            let password = info.password().map(|p| p.to_vec()).unwrap_or_default();
            let ok = user.as_deref().is_some_and(|u| users.verify(u, &password));
            if !ok {
                warn!(client_id, user = user.as_deref().unwrap_or("(none)"), remote = ?addr, "authentication failed");
                return (AuthResult::BadUsernameOrPassword, None);
            }
            return (
                AuthResult::Allow(false, None),
                Some(user.unwrap_or_default()),
            );
        }
        // The listener refuses anonymous clients unless a hook allows
        // them (so that every client passes the check above): allow.
        let Some(user) = info.username() else {
            return (AuthResult::Allow(false, None), None);
        };
        let password = info.password().map(|p| p.as_ref());
        match self.router.authenticate(user.as_ref(), password) {
            Some(AuthResult::BadUsernameOrPassword) => {
                warn!(client_id = %info.id().client_id, user = %user, remote = ?addr, "authentication failed (a tenant's password)");
                (AuthResult::BadUsernameOrPassword, None)
            }
            // Its tenant's password: proved.
            Some(verdict) => (verdict, Some(user.to_string())),
            // A user name with no password to check: not a principal.
            None => (AuthResult::Allow(false, None), None),
        }
    }
}

/// Refuses a connection with a CONNACK reason code of MQTT's own (an
/// `AuthResult` only says 0x86 or 0x87).
fn refuse(
    info: &rmqtt::types::ConnectInfo,
    v5: ConnectAckReasonV5,
    v3: ConnectAckReasonV3,
) -> ReturnType {
    let reason = if info.proto_ver() == rmqtt::codec::types::MQTT_LEVEL_5 {
        ConnectAckReason::V5(v5)
    } else {
        ConnectAckReason::V3(v3)
    };
    (false, Some(HookResult::ConnectAckReason(reason)))
}

impl Hooks {
    /// A CONNECT: the bounds on addresses and guesses, the client id, the password, the rules.
    fn on_authenticate(&self, info: &ConnectInfo) -> ReturnType {
        let client_id: &str = info.id().client_id.as_ref();
        let addr = info.id().remote_addr;
        if !self.router.address_has_room(addr) {
            warn!(client_id, remote = ?addr, "connection refused: too many connections from this address (--max-connections-per-address)");
            self.router.refusals.count("connections_per_address");
            return refuse(
                info,
                ConnectAckReasonV5::QuotaExceeded,
                ConnectAckReasonV3::ServiceUnavailable,
            );
        }
        // An address out of guesses is not judged at all (its
        // right password too): one address judges a bounded number
        // of passwords a minute, however many connections it opens.
        if self.router.checks_passwords() && addr.is_some_and(|a| !self.router.logins.begin(a.ip()))
        {
            warn!(client_id, remote = ?addr, "connection refused unjudged: too many failed logins from this address (--max-failed-logins)");
            self.router.refusals.count("login_rate");
            return refuse(
                info,
                ConnectAckReasonV5::ConnectionRateExceeded,
                ConnectAckReasonV3::ServiceUnavailable,
            );
        }
        // A topic level of its own in clients/<id>/...: an id with
        // '/' would put another's space inside its own (a/b's
        // replies under clients/a/#).
        if client_id.contains(['/', '+', '#']) {
            warn!(
                client_id,
                "connection refused: a client id may not hold '/', '+' or '#' (it names the client's topics clients/<id>/...)"
            );
            return refuse(
                info,
                ConnectAckReasonV5::ClientIdentifierNotValid,
                ConnectAckReasonV3::IdentifierRejected,
            );
        }
        let (verdict, username) = self.authenticate(info);
        // Only a wrong password keeps the guess it took.
        if self.router.checks_passwords()
            && !matches!(verdict, AuthResult::BadUsernameOrPassword)
            && let Some(a) = addr
        {
            self.router.logins.succeeded(a.ip());
        }
        let certificate = info.cert().and_then(|c| c.common_name.clone());
        let verified = Verified {
            // A client certificate names its holder when nothing else does.
            username: username.or_else(|| certificate.clone()),
            certificate,
            subject: info.cert().map(|c| c.subject.clone()),
        };
        let will_topic = info.last_will().map(|w| match w {
            rmqtt::types::LastWill::V3(w) => w.topic.to_string(),
            rmqtt::types::LastWill::V5(w) => w.topic.to_string(),
        });
        let verdict = match verdict {
            // A client id held by a verified principal is theirs
            // until their session ends.
            AuthResult::Allow(..)
                if self
                    .router
                    .owner_of(client_id)
                    .is_some_and(|owner| verified.username.as_deref() != Some(owner.as_str())) =>
            {
                warn!(
                    client_id,
                    user = verified.username.as_deref().unwrap_or("(none)"),
                    "connection refused: the client id is held by another principal"
                );
                AuthResult::NotAuthorized
            }
            // A will is published without the publish checks: its
            // topic must be one the client could publish to itself.
            AuthResult::Allow(..)
                if will_topic.as_deref().is_some_and(|t| {
                    !crate::auth::isolation::may_publish(client_id, t, self.router.client_topics)
                        || !self
                            .router
                            .authorized_as(client_id, &verified, |p, who| p.may_publish(who, t))
                }) =>
            {
                warn!(
                    client_id,
                    will_topic = will_topic.as_deref().unwrap_or(""),
                    "connection refused: its will topic is one it may not publish to"
                );
                AuthResult::NotAuthorized
            }
            AuthResult::Allow(..)
                if !self
                    .router
                    .sessions
                    .has_room(client_id, addr.map(|a| a.ip())) =>
            {
                warn!(
                    client_id,
                    remote = ?addr,
                    "connection refused: the broker holds as many sessions as it may, from this address or in all (--max-sessions-per-address, --max-sessions)"
                );
                self.router.refusals.count("sessions");
                return refuse(
                    info,
                    ConnectAckReasonV5::QuotaExceeded,
                    ConnectAckReasonV3::ServiceUnavailable,
                );
            }
            AuthResult::Allow(..)
                if !self
                    .router
                    .authorized_as(client_id, &verified, |p, who| p.may_connect(who)) =>
            {
                warn!(
                    client_id,
                    user = verified.username.as_deref().unwrap_or("(none)"),
                    "connection refused: no authorization rule lets it connect (--authorization)"
                );
                AuthResult::NotAuthorized
            }
            AuthResult::Allow(..) => {
                let mut principals = self
                    .router
                    .principals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                principals.insert(client_id.to_string(), (verified, info.id().remote_addr));
                verdict
            }
            verdict => verdict,
        };
        match verdict {
            AuthResult::BadUsernameOrPassword => self.router.refusals.count("bad_credentials"),
            AuthResult::NotAuthorized => self.router.refusals.count("not_authorized"),
            _ => {}
        }
        (false, Some(HookResult::AuthResult(verdict)))
    }

    /// A SUBSCRIBE: isolation of the store's streams, and the rules.
    fn on_subscribe_check(
        &self,
        session: &Session,
        sub: &Subscribe,
        acc: Option<HookResult>,
    ) -> ReturnType {
        let client: &str = session.id.client_id.as_ref();
        let filter: &str = sub.topic_filter.as_ref();
        if crate::auth::isolation::may_subscribe(client, filter, self.router.client_topics)
            && self
                .router
                .authorized(client, |p, who| p.may_subscribe(who, filter))
        {
            (true, acc)
        } else {
            warn!(
                client_id = client,
                filter,
                "subscription refused: it would reach another client's replies or notifications, or no authorization rule allows it"
            );
            let refused = rmqtt::types::SubscribeAclResult::new_failure(
                rmqtt::codec::v5::SubscribeAckReason::NotAuthorized,
            );
            (false, Some(HookResult::SubscribeAclResult(refused)))
        }
    }

    /// A PUBLISH: the retained bound, isolation, and the rules.
    fn on_publish_check(
        &self,
        session: &Session,
        publish: &Publish,
        acc: Option<HookResult>,
    ) -> ReturnType {
        let client: &str = session.id.client_id.as_ref();
        let topic: &str = publish.topic.as_ref();
        if publish.retain && !self.router.retained.has_room(topic, publish) {
            warn!(
                client_id = client,
                topic,
                "retained publish refused: the broker holds its limit of retained messages (--max-retained, --max-retained-mib)"
            );
            self.router.refusals.count("retained");
            let refused = rmqtt::types::PublishAclResult(rmqtt::types::PublishResult::reason_code(
                rmqtt::codec::v5::PublishAckReason::QuotaExceeded,
                Some("the broker holds its limit of retained messages".into()),
                false,
            ));
            return (false, Some(HookResult::PublishAclResult(refused)));
        }
        if crate::auth::isolation::may_publish(client, topic, self.router.client_topics)
            && self
                .router
                .authorized(client, |p, who| p.may_publish(who, topic))
        {
            (true, acc)
        } else {
            warn!(
                client_id = client,
                topic,
                "publish refused: another client's or the store's topic, or no authorization rule allows it"
            );
            let refused = rmqtt::types::PublishAclResult::rejected(
                false,
                Some("the topic belongs to another client or the state store".into()),
            );
            (false, Some(HookResult::PublishAclResult(refused)))
        }
    }

    /// A connection established: counted, its session and owner noted.
    fn on_connected(&self, session: &Session, acc: Option<HookResult>) -> ReturnType {
        self.router.count_connection(session.id.remote_addr, true);
        let id: &str = session.id.client_id.as_ref();
        self.router
            .sessions
            .connected(id, session.id.remote_addr.map(|a| a.ip()));
        if let Some(user) = self.router.verified(id).username {
            let mut owners = self.router.owners.lock().unwrap_or_else(|e| e.into_inner());
            owners.insert(id.to_string(), (user, session.id.remote_addr));
        }
        (true, acc)
    }

    /// A request on the store's topic, checked: its tenant's queue and the
    /// request for it, or `None` when nothing more is to be done (refused by
    /// the broker, ignored, or handed to the refusal of strangers).
    fn check_request(
        &self,
        from: &MsgFrom,
        publish: &Publish,
    ) -> Option<(super::Inbound, statestore_guest::types::InboundMessage)> {
        let client_id: &str = from.id.client_id.as_ref();
        let mut message = inbound(client_id, publish);
        (message.username, message.attributes) = self.router.principal_of(client_id);
        let response_topic = message.response_topic.as_deref().unwrap_or("");
        // Its own clients/<id>/... space (the SDKs' replies) is
        // always its; another topic only if it could publish there
        // itself (isolation, and the authorization rules): the
        // store is nobody's deputy.
        let in_own_space = response_topic
            .strip_prefix("clients/")
            .and_then(|r| r.strip_prefix(client_id))
            .is_some_and(|r| r.starts_with('/'));
        let may_request = self
            .router
            .authorized(client_id, |p, who| p.may_publish(who, REQUEST_TOPIC));
        let own_topic = in_own_space
            || (crate::auth::isolation::may_publish(
                client_id,
                response_topic,
                self.router.client_topics,
            )
                && self
                    .router
                    .authorized(client_id, |p, who| p.may_publish(who, response_topic)))
            // The store's own space: the guest answers it as a violation.
            || response_topic.starts_with("clients/statestore/");
        match self.router.tenant_of(username(&from.id), client_id) {
            // rmqtt refuses the publish (0x87) after this hook.
            _ if !may_request => None,
            _ if !own_topic => {
                warn!(
                    client_id,
                    response_topic,
                    "request ignored: its response topic is another client's, or one the authorization rules do not let it publish to (a reply goes only where its requester could publish)"
                );
                None
            }
            Some(t) => self.router.inbound(t).map(|inbound| (inbound, message)),
            None => {
                // Bounded: past it, a request of nobody's client
                // gets no answer at all rather than memory.
                if self.router.strangers.try_send(message).is_err() {
                    debug!(
                        client_id,
                        "a request of a client of no tenant dropped: too many waiting"
                    );
                }
                None
            }
        }
    }

    /// A request on the store's topic: to its tenant's driver (or nobody's),
    /// and consumed; waits while its tenant has no room for it.
    async fn on_request(
        &self,
        from: &MsgFrom,
        publish: &Publish,
        acc: Option<HookResult>,
    ) -> ReturnType {
        if let Some((inbound, message)) = self.check_request(from, publish) {
            inbound.request(message).await;
        }
        consume(publish, acc)
    }

    /// [`Hooks::on_request`] without waiting: `Err` when the request's
    /// tenant has no room for it now (nothing done; `on_request` waits).
    fn on_request_now(
        &self,
        from: &MsgFrom,
        publish: &Publish,
        acc: Option<HookResult>,
    ) -> Result<ReturnType, Option<HookResult>> {
        if let Some((inbound, message)) = self.check_request(from, publish)
            && !inbound.try_request(message)
        {
            return Err(acc);
        }
        Ok(consume(publish, acc))
    }

    /// Called for each session a message is about to be delivered
    /// to: a message from another tenant's client is dropped for
    /// that session (tenants share no topics); so is a client's
    /// message on a topic the rules in force do not let that session
    /// subscribe to (a subscription restored with its session, or
    /// made before a reload, gives nothing the rules no longer give).
    fn on_delivery_check(
        &self,
        session: &Session,
        from: &MsgFrom,
        publish: &Publish,
        acc: Option<HookResult>,
    ) -> ReturnType {
        let same = if from.is_system() {
            self.router.store_may_deliver(&from.id, &session.id)
        } else {
            self.router.same_tenant(&from.id, &session.id)
        };
        if !same {
            debug!(
                from = %from.id.client_id,
                to = %session.id.client_id,
                "a message from another tenant's client is not delivered"
            );
            return (false, Some(HookResult::MessageExpiry));
        }
        if !from.is_system() && self.router.policy.is_some() {
            let to: &str = session.id.client_id.as_ref();
            let topic: &str = publish.topic.as_ref();
            if !self
                .router
                .authorized(to, |p, who| p.may_subscribe(who, topic))
            {
                debug!(
                    to,
                    topic,
                    "a message is not delivered: the authorization rules in force do not let its subscriber read the topic"
                );
                self.router.refusals.count("withheld");
                return (false, Some(HookResult::MessageExpiry));
            }
        }
        (true, acc)
    }

    /// Its owner keeps a client id while its session (and the
    /// replies queued in it) lasts; only the connection that holds
    /// it lets it go.
    fn on_session_ended(&self, session: &Session, acc: Option<HookResult>) -> ReturnType {
        let id: &str = session.id.client_id.as_ref();
        self.router
            .sessions
            .ended(id, session.id.remote_addr.map(|a| a.ip()));
        let mut owners = self.router.owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners
            .get(id)
            .is_some_and(|(_, at)| *at == session.id.remote_addr)
        {
            owners.remove(id);
        }
        (true, acc)
    }

    /// A connection closed: its principal forgotten, its registrations dropped.
    fn on_disconnected(
        &self,
        session: &Session,
        reason: &Reason,
        acc: Option<HookResult>,
    ) -> ReturnType {
        self.router.count_connection(session.id.remote_addr, false);
        {
            // Only the connection that holds the id lets it go.
            let id: &str = session.id.client_id.as_ref();
            let mut principals = self
                .router
                .principals
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if principals
                .get(id)
                .is_some_and(|(_, at)| *at == session.id.remote_addr)
            {
                principals.remove(id);
            }
        }
        // A takeover (same client id connecting again) is not a departure.
        if !reason.is_kicked(false) {
            let id = session.id.client_id.to_string();
            if let Some(inbound) = self
                .router
                .tenant_of(username(&session.id), &id)
                .and_then(|t| self.router.inbound(t))
            {
                inbound.gone(id);
            }
        }
        (true, acc)
    }
}

/// A request consumed: the broker acknowledges a message for the consumed
/// target after its ACL check and takes it no further.
fn consume(publish: &Publish, acc: Option<HookResult>) -> ReturnType {
    // What that check reads (topic, retain flag, payload) is all the copy
    // needs, unless it is to be weighed as a retained message.
    let mut copy = match acc {
        Some(HookResult::Publish(p)) => p,
        _ if publish.retain => Publish::clone(publish),
        _ => Publish {
            inner: Box::new(rmqtt::codec::types::Publish {
                dup: publish.dup,
                retain: false,
                qos: publish.qos,
                topic: publish.topic.clone(),
                packet_id: publish.packet_id,
                payload: publish.payload.clone(),
                properties: None,
            }),
            target_clientid: None,
            delay_interval: publish.delay_interval,
            create_time: publish.create_time,
        },
    };
    copy.target_clientid = Some(ClientId::from_static(CONSUMED));
    (true, Some(HookResult::Publish(copy)))
}

#[async_trait::async_trait]
impl Handler for Hooks {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        match param {
            Parameter::MessagePublish(_, from, publish) if from.is_custom() => {
                self.router
                    .counters
                    .received
                    .fetch_add(1, Ordering::Relaxed);
                if is_request(publish) {
                    self.on_request(from, publish, acc).await
                } else {
                    self.now(param, acc)
                }
            }
            _ => self.now(param, acc),
        }
    }

    /// Every event is answered at once, without a future to allocate
    /// (hooks run several times for every message), but a request to the
    /// store whose tenant has no room for it now: `hook` waits for that.
    fn hook_now(
        &self,
        param: &Parameter,
        acc: Option<HookResult>,
    ) -> Result<ReturnType, Option<HookResult>> {
        match param {
            Parameter::MessagePublish(_, from, publish) if from.is_custom() => {
                let answer = if is_request(publish) {
                    self.on_request_now(from, publish, acc)?
                } else {
                    self.now(param, acc)
                };
                self.router
                    .counters
                    .received
                    .fetch_add(1, Ordering::Relaxed);
                Ok(answer)
            }
            _ => Ok(self.now(param, acc)),
        }
    }
}

/// Whether a client's message is a request to the store.
fn is_request(publish: &Publish) -> bool {
    publish.topic.as_ref() as &str == REQUEST_TOPIC
}

impl Hooks {
    /// [`Handler::hook`] for every event but a request to the store.
    fn now(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        match param {
            Parameter::ClientAuthenticate(info) => self.on_authenticate(info),
            Parameter::ClientSubscribeCheckAcl(session, sub) => {
                self.on_subscribe_check(session, sub, acc)
            }
            Parameter::MessagePublishCheckAcl(session, publish) => {
                self.on_publish_check(session, publish, acc)
            }
            Parameter::ClientConnected(session) => self.on_connected(session, acc),
            Parameter::MessageExpiryCheck(session, from, publish) => {
                self.on_delivery_check(session, from, publish, acc)
            }
            Parameter::SessionTerminated(session, _) => self.on_session_ended(session, acc),
            Parameter::ClientDisconnected(session, reason) => {
                self.on_disconnected(session, reason, acc)
            }
            _ => (true, acc),
        }
    }
}
