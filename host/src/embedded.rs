//! `statestore serve` with no `--broker`: a full MQTT5 broker (rmqtt) inside
//! our process, with the guest as its extension, as the Azure IoT Operations
//! broker hosts its state store.
//!
//! ```text
//!  MQTT5 clients ──TCP──> rmqtt broker ── publish hook (request topic only,
//!                           ^  ^            with the publisher's client id) ──┐
//!                           │  └─ disconnect hook ──────────── ClientGone ────┤
//!                           │                                                 v
//!   replies: routed to the response topic's subscribers         driver ──> guest
//!   notifications: put straight into the target client's session <──── outputs
//!   violations: the client is disconnected
//! ```
//!
//! Requests are consumed by the store: other subscribers of the request topic
//! do not see them. The requester's identity is its connection's client id,
//! never the spoofable `__srcId`.
//!
//! Tenants: each client belongs to the first tenant whose [`Matcher`] takes
//! its MQTT user name or client id, else to the default tenant; a client of
//! no tenant gets `-ERR not authorized`. Each tenant runs its own driver
//! task, so a tenant whose guest is slow or failing delays only its own
//! clients. A tenant with a password makes the broker refuse its user names
//! without it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rmqtt::codec::types::QoS;
use rmqtt::codec::v3::ConnectAckReason as ConnectAckReasonV3;
use rmqtt::codec::v5::{ConnectAckReason as ConnectAckReasonV5, PublishProperties};
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::session::SessionState;
use rmqtt::types::{
    AuthResult, ClientId, CodecPublish, ConnectAckReason, From as MsgFrom, Id, Publish,
};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{debug, info, warn};

use crate::config::Matcher;
use crate::driver::{Control, Input, MAX_BATCH, MAX_BATCH_BYTES, Transport, message_bytes, now_ms};
use crate::store::StoreOptions;
use crate::tenant::Tenant;
use crate::{Config, InboundMessage, OutboundMessage, Output, PublishKind, Runtime};
use statestore_guest::{HostReply, StateMachine};

/// A client id no client can have (MQTT client ids are never this long and
/// `$` ids are refused): routing a request copy to it drops the copy.
const CONSUMED: &str = "$statestore/consumed";

/// What the embedded broker lets clients make it hold:
/// every default is a bound, and every one is a `serve` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerLimits {
    /// Largest packet accepted or sent, bytes.
    pub max_packet: u32,
    /// Longest session expiry a client may ask for (a longer one is cut).
    pub max_session_expiry: Duration,
    /// Most messages queued for one session (offline or slow); the oldest
    /// is dropped past it.
    pub max_queued: usize,
    /// Most bytes one session holds, queued or unacknowledged
    /// ([`crate::queue_bytes`]); a message past it is dropped for that
    /// session.
    pub max_queued_bytes: usize,
    /// Most connections at once.
    pub max_connections: usize,
    /// Most connections at once from one IP address (0: no limit).
    pub max_connections_per_address: usize,
    /// Most bytes of requests waiting for one tenant's store; a client whose
    /// request would go past it waits (its connection stops being read)
    /// until the store catches up.
    pub inbound_bytes: usize,
    /// Most topics holding a retained message.
    pub max_retained: usize,
    /// Most bytes of retained messages (topics, payloads, properties).
    pub max_retained_bytes: usize,
    /// Most bytes all sessions hold together (queued or unacknowledged); a
    /// message past it is dropped for the session it was for.
    pub max_queued_total_bytes: usize,
    /// Most sessions, connected or parked (0: no bound).
    pub max_sessions: usize,
    /// Most sessions whose last connection came from one IP address (0: no
    /// bound).
    pub max_sessions_per_address: usize,
    /// Most failed logins a minute from one IP address before its CONNECTs
    /// are refused unjudged (0: no bound).
    pub max_failed_logins: u32,
    /// Most connections at once that have not finished their CONNECT (0: no
    /// bound).
    pub max_pending_connections: usize,
    /// Most of those from one IP address (0: no bound).
    pub max_pending_per_address: usize,
    /// How long a connection has from accept to send its whole CONNECT
    /// (and finish its TLS handshake).
    pub connect_timeout: Duration,
}

impl Default for BrokerLimits {
    fn default() -> Self {
        BrokerLimits {
            max_packet: 32 << 20,
            max_session_expiry: Duration::from_secs(24 * 3600),
            max_queued: 1000,
            max_queued_bytes: 512 << 20,
            max_connections: 10_000,
            max_connections_per_address: 256,
            inbound_bytes: 64 << 20,
            max_retained: 10_000,
            max_retained_bytes: 64 << 20,
            max_queued_total_bytes: 2 << 30,
            max_sessions: 20_000,
            max_sessions_per_address: 1_000,
            max_failed_logins: 20,
            max_pending_connections: 1_000,
            max_pending_per_address: 100,
            connect_timeout: crate::admission::CONNECT_TIMEOUT,
        }
    }
}

/// A TLS listener of the embedded broker, beside the plain one.
#[derive(Debug, Clone)]
pub struct TlsListener {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The server's certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
    /// Clients must present a certificate signed by one of these (PEM);
    /// without it, no client certificate is asked for.
    pub client_ca: Option<std::path::PathBuf>,
}

/// What the embedded broker is set up with beside its tenants.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// Its limits.
    pub limits: BrokerLimits,
    /// The users every client must be (`--users-file`, read again on
    /// SIGHUP); none: anonymous clients are welcome.
    pub users: Option<std::sync::Arc<crate::users::UsersCell>>,
    /// The connection count for `--metrics`.
    pub connections: Option<prometheus::IntGauge>,
    /// Messages dropped at a session's byte limit, for `--metrics`.
    pub queue_dropped: Option<prometheus::IntCounter>,
    /// What was refused at the other bounds and rules, for `--metrics`.
    pub refused: Option<prometheus::IntCounterVec>,
    /// The authorization file's rules (`--authorization`), replaceable
    /// while serving.
    pub policy: Option<std::sync::Arc<crate::policy::PolicyCell>>,
    /// A TLS listener too.
    pub tls: Option<TlsListener>,
    /// Whether `clients/<id>/...` is its client's alone
    /// (`--strict-client-topics`), or only the store's streams in it.
    pub client_topics: crate::isolation::ClientTopics,
    /// Where retained messages are kept across restarts; none: in memory.
    pub data_dir: Option<std::path::PathBuf>,
}

/// Everything the embedded mode needs to know (one tenant).
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Where the broker listens.
    pub listen: SocketAddr,
    /// The store: node id, persistence.
    pub store: StoreOptions,
}

/// Which clients are a tenant's.
#[derive(Debug, Clone, Default)]
pub struct Route {
    /// Recognises its clients.
    pub matcher: Matcher,
    /// Takes the clients no other tenant takes.
    pub default: bool,
}

/// A way to reach a running tenant.
#[derive(Debug, Clone)]
pub struct TenantHandle {
    /// The tenant's name.
    pub name: String,
    /// Commands run between its inputs (upgrades).
    pub control: mpsc::UnboundedSender<Control>,
}

// Nearly every event is a request: boxing it would allocate per request.
#[allow(clippy::large_enum_variant)]
enum BrokerEvent {
    /// A request, with its share of the tenant's inbound byte budget
    /// (returned when the request has been handled).
    Request(InboundMessage, Option<OwnedSemaphorePermit>),
    Gone(String),
}

/// One tenant's inbound queue: unbounded in count, bounded in bytes by a
/// semaphore whose permits are bytes.
struct Inbound {
    tx: mpsc::UnboundedSender<BrokerEvent>,
    budget: Arc<Semaphore>,
    total: usize,
}

impl Inbound {
    /// Hands a request over, waiting while the tenant already holds its
    /// budget of waiting requests (the publisher waits with it).
    async fn request(&self, message: InboundMessage) {
        let want = u32::try_from(message_bytes(&message).min(self.total)).unwrap_or(u32::MAX);
        let permit = self.budget.clone().acquire_many_owned(want).await.ok();
        let _ = self.tx.send(BrokerEvent::Request(message, permit));
    }
}

/// Which tenant's channel a client's events go to.
struct Router {
    routes: Vec<Route>,
    default: Option<usize>,
    tenants: Vec<Inbound>,
    /// Requests of clients that belong to no tenant.
    strangers: mpsc::Sender<InboundMessage>,
    /// Connections per IP address, and the most allowed (0: no limit).
    per_address: std::sync::Mutex<HashMap<IpAddr, usize>>,
    max_per_address: usize,
    /// The users every client must be (`--users-file`); none: anonymous
    /// clients are welcome.
    users: Option<std::sync::Arc<crate::users::UsersCell>>,
    /// Client ids held by an authenticated user, and the connection
    /// holding each: nobody else may take them.
    owners: std::sync::Mutex<HashMap<String, (String, Option<SocketAddr>)>>,
    /// The connection count for `--metrics`.
    connections: Option<prometheus::IntGauge>,
    /// The authorization file's rules (`--authorization`), if any.
    policy: Option<std::sync::Arc<crate::policy::PolicyCell>>,
    /// What each connected client was verified to be (its user name, from
    /// a password or its certificate), and its connection: the principal
    /// authorization rules see. A user name given without proof is not one.
    principals: std::sync::Mutex<HashMap<String, (Verified, Option<SocketAddr>)>>,
    /// How private `clients/<id>/...` is.
    client_topics: crate::isolation::ClientTopics,
    /// The retained messages.
    retained: Arc<crate::retained::Retained>,
    /// The counts `$SYS` publishes.
    counters: Arc<crate::sys_topics::Counters>,
    /// Failed logins per address.
    logins: crate::admission::LoginThrottle,
    /// Sessions per address and in all.
    sessions: crate::admission::Sessions,
    /// What was refused, by reason.
    refusals: crate::admission::Refusals,
}

/// A client's verified identity.
#[derive(Debug, Clone, Default)]
struct Verified {
    /// From `--users-file`, a tenant's password, or the common name of its
    /// client certificate.
    username: Option<String>,
    /// The common name of its client certificate, if any.
    certificate: Option<String>,
    /// Its client certificate's subject, if any.
    subject: Option<String>,
}

/// Requests of clients of no tenant waiting for their refusal, at most.
const STRANGERS_WAITING: usize = 1024;

impl Router {
    /// What `client_id` was verified to be when it connected.
    fn verified(&self, client_id: &str) -> Verified {
        let principals = self.principals.lock().unwrap_or_else(|e| e.into_inner());
        principals
            .get(client_id)
            .map(|(v, _)| v.clone())
            .unwrap_or_default()
    }

    /// Whether the broker resources of `--authorization` let `client_id`
    /// (verified as `v`) do what `check` asks; allowed when there is no
    /// file.
    fn authorized_as(
        &self,
        client_id: &str,
        v: &Verified,
        check: impl FnOnce(&crate::policy::Policy, &crate::policy::Who<'_>) -> bool,
    ) -> bool {
        let Some(policy) = self.policy.as_ref().and_then(|c| c.get()) else {
            return true;
        };
        let attributes = policy.attributes_for(
            v.username.as_deref(),
            v.certificate.as_deref(),
            v.subject.as_deref(),
        );
        let who = crate::policy::Who {
            client_id,
            username: v.username.as_deref(),
            attributes: &attributes,
        };
        check(&policy, &who)
    }

    /// [`Router::authorized_as`] for a connected client.
    fn authorized(
        &self,
        client_id: &str,
        check: impl FnOnce(&crate::policy::Policy, &crate::policy::Who<'_>) -> bool,
    ) -> bool {
        if self.policy.is_none() {
            return true;
        }
        self.authorized_as(client_id, &self.verified(client_id), check)
    }

    /// A connected client's verified user name and attributes.
    fn principal_of(&self, client_id: &str) -> (Option<String>, Vec<(String, String)>) {
        let v = self.verified(client_id);
        let attributes = self
            .policy
            .as_ref()
            .and_then(|c| c.get())
            .map(|p| {
                p.attributes_for(
                    v.username.as_deref(),
                    v.certificate.as_deref(),
                    v.subject.as_deref(),
                )
            })
            .unwrap_or_default();
        (v.username, attributes)
    }

    fn tenant_of(&self, username: Option<&str>, client_id: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.matcher.matches(username, client_id))
            .or(self.default)
    }

    /// Whether two clients belong to the same tenant (or both to none).
    fn same_tenant(&self, a: &Id, b: &Id) -> bool {
        // One tenant that takes every client: nothing to compare.
        if self.routes.len() == 1 && self.default.is_some() {
            return true;
        }
        self.tenant_of(username(a), a.client_id.as_ref())
            == self.tenant_of(username(b), b.client_id.as_ref())
    }

    /// Whether a message the store published (a reply, a notification)
    /// may reach `to`: a tenant's store publishes as `$statestore/<n>` and
    /// reaches its own clients only (a reply's topic is the requester's
    /// choice); the refusals to clients of no tenant come from
    /// `$statestore` and reach clients of none.
    fn store_may_deliver(&self, store: &Id, to: &Id) -> bool {
        if self.routes.len() == 1 && self.default.is_some() {
            return true;
        }
        let sender: &str = store.client_id.as_ref();
        let tenant = match sender.strip_prefix(STORE_SENDER) {
            Some("") => None,
            Some(rest) => match rest.strip_prefix('/').and_then(|n| n.parse().ok()) {
                Some(n) => Some(n),
                None => return true,
            },
            // Not the store's (the broker's own): not ours to judge.
            None => return true,
        };
        tenant == self.tenant_of(username(to), to.client_id.as_ref())
    }

    /// Whether `addr` may open one more connection.
    fn address_has_room(&self, addr: Option<SocketAddr>) -> bool {
        let Some(addr) = addr else { return true };
        if self.max_per_address == 0 {
            return true;
        }
        let counts = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(&addr.ip()).copied().unwrap_or(0) < self.max_per_address
    }

    /// The user holding `client_id`, if an authenticated one does.
    fn owner_of(&self, client_id: &str) -> Option<String> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(client_id).map(|(user, _)| user.clone())
    }

    /// A connection from `addr` opened (+1) or closed (-1).
    fn count_connection(&self, addr: Option<SocketAddr>, opened: bool) {
        let Some(addr) = addr else { return };
        if let Some(g) = &self.connections {
            if opened { g.inc() } else { g.dec() }
        }
        let change = if opened { 1 } else { -1 };
        self.counters.connected.fetch_add(change, Ordering::Relaxed);
        let mut counts = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(addr.ip()).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&addr.ip());
            }
        }
    }

    /// Whether any password is judged (`--users-file`, or a tenant's).
    fn checks_passwords(&self) -> bool {
        self.users.is_some() || self.routes.iter().any(|r| r.matcher.password.is_some())
    }

    /// The verdict on a client's credentials: `None` if no tenant claims
    /// its user name with a password.
    fn authenticate(&self, username: &str, password: Option<&[u8]>) -> Option<AuthResult> {
        let route = self
            .routes
            .iter()
            .find(|r| r.matcher.usernames.iter().any(|u| u == username))?;
        let expected = route.matcher.password.as_deref()?;
        let given = password.unwrap_or_default();
        use subtle::ConstantTimeEq;
        Some(if bool::from(given.ct_eq(expected.as_bytes())) {
            AuthResult::Allow(false, None)
        } else {
            AuthResult::BadUsernameOrPassword
        })
    }
}

/// The broker hooks: hand requests and disconnects to the tenants' drivers.
struct Hooks {
    router: std::sync::Arc<Router>,
}

fn username(id: &Id) -> Option<&str> {
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

#[async_trait::async_trait]
impl Handler for Hooks {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        if let Parameter::MessagePublish(_, from, _) = param
            && from.is_custom()
        {
            self.router
                .counters
                .received
                .fetch_add(1, Ordering::Relaxed);
        }
        match param {
            Parameter::ClientAuthenticate(info) => {
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
                if self.router.checks_passwords()
                    && addr.is_some_and(|a| !self.router.logins.begin(a.ip()))
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
                        if self.router.owner_of(client_id).is_some_and(|owner| {
                            verified.username.as_deref() != Some(owner.as_str())
                        }) =>
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
                            !crate::isolation::may_publish(client_id, t, self.router.client_topics)
                                || !self.router.authorized_as(client_id, &verified, |p, who| {
                                    p.may_publish(who, t)
                                })
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
                    AuthResult::BadUsernameOrPassword => {
                        self.router.refusals.count("bad_credentials")
                    }
                    AuthResult::NotAuthorized => self.router.refusals.count("not_authorized"),
                    _ => {}
                }
                (false, Some(HookResult::AuthResult(verdict)))
            }
            Parameter::ClientSubscribeCheckAcl(session, sub) => {
                let client: &str = session.id.client_id.as_ref();
                let filter: &str = sub.topic_filter.as_ref();
                if crate::isolation::may_subscribe(client, filter, self.router.client_topics)
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
            Parameter::MessagePublishCheckAcl(session, publish) => {
                let client: &str = session.id.client_id.as_ref();
                let topic: &str = publish.topic.as_ref();
                if publish.retain && !self.router.retained.has_room(topic, publish) {
                    warn!(
                        client_id = client,
                        topic,
                        "retained publish refused: the broker holds its limit of retained messages (--max-retained, --max-retained-mib)"
                    );
                    self.router.refusals.count("retained");
                    let refused =
                        rmqtt::types::PublishAclResult(rmqtt::types::PublishResult::reason_code(
                            rmqtt::codec::v5::PublishAckReason::QuotaExceeded,
                            Some("the broker holds its limit of retained messages".into()),
                            false,
                        ));
                    return (false, Some(HookResult::PublishAclResult(refused)));
                }
                if crate::isolation::may_publish(client, topic, self.router.client_topics)
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
            Parameter::ClientConnected(session) => {
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
            Parameter::MessagePublish(_, from, publish)
                if from.is_custom() && publish.topic.as_ref() as &str == REQUEST_TOPIC =>
            {
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
                    || (crate::isolation::may_publish(
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
                    _ if !may_request => {}
                    _ if !own_topic => {
                        warn!(
                            client_id,
                            response_topic,
                            "request ignored: its response topic is another client's, or one the authorization rules do not let it publish to (a reply goes only where its requester could publish)"
                        );
                    }
                    Some(t) => self.router.tenants[t].request(message).await,
                    None => {
                        // Bounded: past it, a request of nobody's client
                        // gets no answer at all rather than memory.
                        if self.router.strangers.try_send(message).is_err() {
                            debug!(
                                client_id,
                                "a request of a client of no tenant dropped: too many waiting"
                            );
                        }
                    }
                }
                // Consume it: route the copy only to a client that cannot exist.
                let mut copy = match acc {
                    Some(HookResult::Publish(p)) => p,
                    _ => Publish::clone(publish),
                };
                copy.target_clientid = Some(ClientId::from(CONSUMED));
                (true, Some(HookResult::Publish(copy)))
            }
            // Called for each session a message is about to be delivered
            // to: a message from another tenant's client is dropped for
            // that session (tenants share no topics); so is a client's
            // message on a topic the rules in force do not let that session
            // subscribe to (a subscription restored with its session, or
            // made before a reload, gives nothing the rules no longer give).
            Parameter::MessageExpiryCheck(session, from, publish) => {
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
            // Its owner keeps a client id while its session (and the
            // replies queued in it) lasts; only the connection that holds
            // it lets it go.
            Parameter::SessionTerminated(session, _) => {
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
            Parameter::ClientDisconnected(session, reason) => {
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
                    if let Some(t) = self.router.tenant_of(username(&session.id), &id) {
                        let _ = self.router.tenants[t].tx.send(BrokerEvent::Gone(id));
                    }
                }
                (true, acc)
            }
            _ => (true, acc),
        }
    }
}

/// A request as the guest sees it, with the publisher's real client id.
fn inbound(client_id: &str, p: &Publish) -> InboundMessage {
    let props = p.properties.clone().unwrap_or_default();
    InboundMessage {
        topic: p.topic.to_string(),
        payload: p.payload.to_vec(),
        qos: p.qos as u8,
        response_topic: props.response_topic.map(|t| t.to_string()),
        correlation_data: props.correlation_data.map(|b| b.to_vec()),
        message_expiry_interval: props.message_expiry_interval.map(NonZeroU32::get),
        content_type: props.content_type.map(|t| t.to_string()),
        payload_format_indicator: Some(u8::from(props.is_utf8_payload)),
        user_properties: props
            .user_properties
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        client_id: Some(client_id.to_string()),
        received_at: Some(now_ms()),
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// An rmqtt PUBLISH for an output. rmqtt carries strings and payloads in
/// the same shared buffers (`Bytes`, `ByteString`) as [`OutboundMessage`],
/// so nothing is copied: the fields of a reply still point into the buffer
/// the component returned.
fn outbound(m: OutboundMessage) -> Publish {
    let properties = PublishProperties {
        topic_alias: None,
        correlation_data: m.correlation_data,
        message_expiry_interval: m.message_expiry_interval.and_then(NonZeroU32::new),
        content_type: m.content_type,
        user_properties: m.user_properties,
        is_utf8_payload: m.payload_format_indicator == Some(1),
        response_topic: m.response_topic,
        subscription_ids: Vec::new(),
    };
    let codec = CodecPublish {
        dup: false,
        retain: m.retain,
        qos: if m.qos == 0 {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        },
        topic: m.topic,
        packet_id: None,
        payload: m.payload,
        properties: Some(properties),
    };
    Publish::from(codec).create_time(rmqtt::utils::timestamp_millis())
}

/// The broker with the tenants' stores as its extension.
pub struct EmbeddedServer {
    scx: ServerContext,
    accept: tokio::task::JoinHandle<()>,
    tenants: Vec<(Served, BrokerTransport, mpsc::UnboundedReceiver<Control>)>,
    handles: Vec<TenantHandle>,
    strangers: mpsc::Receiver<InboundMessage>,
    /// For the replies to clients of no tenant.
    reply_config: Config,
    local_addr: SocketAddr,
    tls: Option<TlsReload>,
    retained: Arc<crate::retained::Retained>,
    counters: Arc<crate::sys_topics::Counters>,
}

/// What serves a tenant's clients (one per tenant, moved once: its size
/// does not matter).
#[allow(clippy::large_enum_variant)]
enum Served {
    /// A store in this process.
    Tenant(Tenant),
    /// A replica of a cluster (`serve --cluster`).
    Replica(Box<crate::cluster::node::Node>),
}

impl Served {
    fn name(&self) -> &str {
        match self {
            Served::Tenant(t) => t.name(),
            Served::Replica(_) => "default",
        }
    }
}

/// One tenant's side of the broker.
struct BrokerTransport {
    scx: ServerContext,
    /// Its tenant's index (the store's publishes say whose they are).
    tenant: usize,
    events: mpsc::UnboundedReceiver<BrokerEvent>,
    pending: Option<BrokerEvent>,
    /// The inbound budget of the requests being handled.
    permits: Vec<OwnedSemaphorePermit>,
    /// Who sent the requests not answered yet: their replies go to them
    /// alone.
    requesters: Requesters,
}

/// The client each request came from, until its reply goes out: a reply is
/// delivered to its requester alone, whoever else subscribes to its topic.
/// Found by the reply's correlation data, then its response topic (kept as
/// a keyed hash: no copy of it per request). Bounded in count and age (a
/// request that is never answered, say an expired one, is forgotten after
/// [`Requesters::MAX_AGE`]); a reply whose requester is not known goes to
/// the client its topic names, if it is an SDK's reply topic, and otherwise
/// to nobody.
#[derive(Default)]
struct Requesters {
    waiting: HashMap<Vec<u8>, Vec<Requester>>,
    topics: std::hash::RandomState,
    count: usize,
    swept: Option<Instant>,
}

/// One request waiting for its reply.
struct Requester {
    topic: u64,
    client: ClientId,
    at: Instant,
}

impl Requesters {
    /// Most requests remembered at once.
    const MAX: usize = 100_000;
    /// How long an unanswered request is remembered.
    const MAX_AGE: Duration = Duration::from_secs(120);

    fn add(&mut self, m: &InboundMessage) {
        use std::hash::BuildHasher;
        let (Some(topic), Some(client)) = (&m.response_topic, &m.client_id) else {
            return;
        };
        self.sweep();
        if self.count >= Self::MAX {
            return;
        }
        self.count += 1;
        let key = m.correlation_data.clone().unwrap_or_default();
        self.waiting.entry(key).or_default().push(Requester {
            topic: self.topics.hash_one(topic.as_str()),
            client: ClientId::from(client.as_str()),
            at: Instant::now(),
        });
    }

    /// The requester of the reply `m` (the earliest, if several requests
    /// share its correlation data and topic), forgotten.
    fn take(&mut self, m: &OutboundMessage) -> Option<ClientId> {
        use std::hash::BuildHasher;
        let key: &[u8] = m.correlation_data.as_deref().unwrap_or_default();
        let topic = self.topics.hash_one(&*m.topic);
        let waiting = self.waiting.get_mut(key)?;
        let at = waiting.iter().position(|r| r.topic == topic)?;
        let client = waiting.remove(at).client;
        self.count -= 1;
        if waiting.is_empty() {
            self.waiting.remove(key);
        }
        Some(client)
    }

    /// Forgets requests older than [`Requesters::MAX_AGE`] (every few
    /// seconds at most).
    fn sweep(&mut self) {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(5))
        {
            return;
        }
        self.swept = Some(now);
        let mut count = 0;
        self.waiting.retain(|_, waiting| {
            waiting.retain(|r| now.duration_since(r.at) < Self::MAX_AGE);
            count += waiting.len();
            !waiting.is_empty()
        });
        self.count = count;
    }
}

impl EmbeddedServer {
    /// Instantiates the component as the only tenant and starts the broker
    /// listening. Fails with a clear message if the address cannot be bound
    /// (port in use).
    pub async fn start(runtime: &Runtime, opts: EmbeddedOptions) -> Result<EmbeddedServer> {
        let tenant = Tenant::open("default", runtime.clone(), &opts.store)?;
        let route = Route {
            matcher: Matcher::default(),
            default: true,
        };
        let server_id = opts.store.server_client_id.clone();
        EmbeddedServer::start_tenants(opts.listen, &server_id, vec![(tenant, route)]).await
    }

    /// [`EmbeddedServer::start_tenants_with`] the default [`BrokerLimits`].
    pub async fn start_tenants(
        listen: SocketAddr,
        server_client_id: &str,
        tenants: Vec<(Tenant, Route)>,
    ) -> Result<EmbeddedServer> {
        let limits = BrokerLimits::default();
        let opts = BrokerOptions {
            limits,
            ..BrokerOptions::default()
        };
        EmbeddedServer::start_tenants_with(listen, server_client_id, tenants, opts).await
    }

    /// Starts the broker on `listen` serving `tenants`, each with the route
    /// that says which clients are its, within `limits`.
    /// `server_client_id` is the `__srcId` of replies to clients of no
    /// tenant.
    pub async fn start_tenants_with(
        listen: SocketAddr,
        server_client_id: &str,
        tenants: Vec<(Tenant, Route)>,
        opts: BrokerOptions,
    ) -> Result<EmbeddedServer> {
        let served = tenants
            .into_iter()
            .map(|(t, r)| (Served::Tenant(t), r))
            .collect();
        EmbeddedServer::start_served(listen, server_client_id, served, opts).await
    }

    /// Starts the broker on `listen` with a replica of a cluster as its
    /// store (`serve --cluster`): every client is its.
    pub async fn start_replica(
        listen: SocketAddr,
        server_client_id: &str,
        node: crate::cluster::node::Node,
        opts: BrokerOptions,
    ) -> Result<EmbeddedServer> {
        let route = Route {
            matcher: Matcher::default(),
            default: true,
        };
        let served = vec![(Served::Replica(Box::new(node)), route)];
        EmbeddedServer::start_served(listen, server_client_id, served, opts).await
    }

    async fn start_served(
        listen: SocketAddr,
        server_client_id: &str,
        tenants: Vec<(Served, Route)>,
        opts: BrokerOptions,
    ) -> Result<EmbeddedServer> {
        let BrokerOptions {
            limits,
            users,
            connections,
            queue_dropped,
            refused,
            policy,
            tls,
            client_topics,
            data_dir,
        } = opts;
        let limits = &limits;
        let refusals = crate::admission::Refusals::new(refused);
        let on_refuse = {
            let refusals = refusals.clone();
            Arc::new(move |reason: &'static str| refusals.count(reason))
        };
        let scx = ServerContext::new()
            .busy_check_enable(false)
            .pre_connect(rmqtt::pre_connect::PreConnect::new(
                limits.max_pending_connections,
                limits.max_pending_per_address,
                Some(limits.connect_timeout),
                Some(on_refuse),
            ))
            .build()
            .await;
        let retained = Arc::new(crate::retained::Retained::open(
            data_dir.as_deref(),
            limits.max_retained,
            limits.max_retained_bytes,
        ));
        let loaded = retained.load(system_from(&scx, None)).await?;
        if loaded > 0 {
            info!(messages = loaded, "retained messages restored");
        }
        *scx.extends.retain_mut().await = Box::new(crate::retained::Storage(retained.clone()));
        let counters = Arc::new(crate::sys_topics::Counters::default());
        *scx.extends.fitter_mgr_mut().await = Box::new(crate::keep_alive::Manager);
        *scx.extends.shared_subscription_mut().await =
            Box::new(crate::shared_groups::RoundRobin::default());
        let (strangers_tx, strangers) = mpsc::channel(STRANGERS_WAITING);
        let mut senders = Vec::new();
        let mut routes = Vec::new();
        let mut running = Vec::new();
        let mut handles = Vec::new();
        for (tenant, route) in tenants {
            let (tx, events) = mpsc::unbounded_channel();
            let (control, control_rx) = mpsc::unbounded_channel();
            let total = limits.inbound_bytes.clamp(1, u32::MAX as usize);
            senders.push(Inbound {
                tx,
                budget: Arc::new(Semaphore::new(total)),
                total,
            });
            routes.push(route);
            handles.push(TenantHandle {
                name: tenant.name().to_string(),
                control,
            });
            let transport = BrokerTransport {
                scx: scx.clone(),
                tenant: running.len(),
                events,
                pending: None,
                permits: Vec::new(),
                requesters: Requesters::default(),
            };
            running.push((tenant, transport, control_rx));
        }
        let router = std::sync::Arc::new(Router {
            default: routes.iter().position(|r| r.default),
            routes,
            tenants: senders,
            strangers: strangers_tx,
            per_address: std::sync::Mutex::new(HashMap::new()),
            max_per_address: limits.max_connections_per_address,
            users,
            owners: std::sync::Mutex::new(HashMap::new()),
            connections,
            policy,
            principals: std::sync::Mutex::new(HashMap::new()),
            client_topics,
            retained: retained.clone(),
            counters: counters.clone(),
            logins: crate::admission::LoginThrottle::new(limits.max_failed_logins),
            sessions: crate::admission::Sessions::new(
                limits.max_sessions,
                limits.max_sessions_per_address,
            ),
            refusals: refusals.clone(),
        });
        let queue_bytes = crate::queue_bytes::QueueBytes::new(
            limits.max_queued_bytes,
            limits.max_queued_total_bytes,
            queue_dropped,
            refusals,
        );
        crate::queue_bytes::BoundedShared::install(&scx, queue_bytes.clone()).await;
        let register = scx.extends.hook_mgr().register();
        for t in [
            Type::MessageDelivered,
            Type::MessageAcked,
            Type::MessageDropped,
            Type::SessionTerminated,
        ] {
            register
                .add(
                    t,
                    Box::new(crate::queue_bytes::QueueHooks(
                        queue_bytes.clone(),
                        counters.clone(),
                    )),
                )
                .await;
        }
        for t in [
            Type::ClientAuthenticate,
            Type::ClientConnected,
            Type::ClientSubscribeCheckAcl,
            Type::MessagePublishCheckAcl,
            Type::MessagePublish,
            Type::MessageExpiryCheck,
            Type::ClientDisconnected,
            Type::SessionTerminated,
        ] {
            register
                .add(
                    t,
                    Box::new(Hooks {
                        router: router.clone(),
                    }),
                )
                .await;
        }
        register.start().await;
        let listener = listener_builder("statestore/tcp", listen, limits)
            .bind()
            .with_context(|| format!("cannot listen on {listen} (is the port in use?)"))?
            .tcp()?;
        let local_addr = listener.local_addr()?;
        let server = MqttServer::new(scx.clone())
            .listener_by_id(listener, 1)
            .build();
        let accept = tokio::spawn(run_broker(server));
        let mut tls_addr = None;
        let mut tls_reload = None;
        if let Some(t) = &tls {
            let reload = match TlsReload::start(&scx, t, *limits) {
                Ok(r) => r,
                Err(e) => {
                    accept.abort();
                    return Err(e);
                }
            };
            tls_addr = Some(reload.local_addr());
            tls_reload = Some(reload);
        }
        if let Some(at) = tls_addr {
            info!(listen = %at, client_certificates = tls.as_ref().is_some_and(|t| t.client_ca.is_some()), "embedded MQTT broker listening with TLS");
        }
        info!(listen = %local_addr, tenants = handles.len(), "embedded MQTT broker listening; serving the state store");
        Ok(EmbeddedServer {
            scx,
            accept,
            tenants: running,
            handles,
            strangers,
            reply_config: Config {
                server_client_id: Some(server_client_id.to_string()),
                ..Config::default()
            },
            local_addr,
            tls: tls_reload,
            retained,
            counters,
        })
    }

    /// The broker's PUBLISH counters (for `--metrics`).
    pub fn counters(&self) -> Arc<crate::sys_topics::Counters> {
        self.counters.clone()
    }

    /// The TLS listener, to reload its certificate (SIGHUP), if there is one.
    pub fn tls(&self) -> Option<TlsReload> {
        self.tls.clone()
    }

    /// The address the broker listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The running tenants, to send them commands (upgrades).
    pub fn tenants(&self) -> &[TenantHandle] {
        &self.handles
    }

    /// Serves until `shutdown` completes, then stops the tenants and the
    /// broker. Each tenant runs in its own task; one that stops with an
    /// error (its journal failed) is logged and the others go on; the first
    /// such error is returned at the end.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let EmbeddedServer {
            scx,
            mut accept,
            tenants,
            handles: _,
            mut strangers,
            reply_config,
            tls,
            retained,
            counters,
            ..
        } = self;
        // Housekeeping: expired retained messages go, the retained file is
        // written, and $SYS is published.
        let scx_house = scx.clone();
        let retained_house = retained.clone();
        let house = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut last_sys: Option<std::time::Instant> = None;
            loop {
                retained_house.tick().await;
                if last_sys.is_none_or(|t| t.elapsed() >= crate::sys_topics::INTERVAL) {
                    crate::sys_topics::publish(&scx_house, &counters, started).await;
                    last_sys = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let runs: Vec<_> = tenants
            .into_iter()
            .map(|(served, mut transport, mut control)| {
                let name = served.name().to_string();
                let run = move |stopped: std::pin::Pin<
                    Box<dyn std::future::Future<Output = ()> + Send>,
                >| {
                    Box::pin(async move {
                        match served {
                            Served::Tenant(mut tenant) => {
                                crate::driver::drive(
                                    &mut tenant,
                                    &mut transport,
                                    &mut control,
                                    stopped,
                                )
                                .await
                            }
                            Served::Replica(node) => node.drive(&mut transport, stopped).await,
                        }
                    })
                        as std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>
                };
                (name, run)
            })
            .collect();
        let scx_strangers = scx.clone();
        let refuse = tokio::spawn(async move {
            while let Some(m) = strangers.recv().await {
                warn!(
                    client_id = m.client_id.as_deref().unwrap_or("?"),
                    "a client of no tenant sent a request: not authorized"
                );
                let reply =
                    StateMachine::host_reply(&reply_config, &m, now_ms(), HostReply::NotAuthorized);
                let Some(reply) = reply else { continue };
                let mut publish = outbound(reply);
                // To its requester alone.
                publish.target_clientid = m.client_id.as_deref().map(ClientId::from);
                if publish.target_clientid.is_some()
                    && let Err(e) = SessionState::forwards(
                        &scx_strangers,
                        system_from(&scx_strangers, None),
                        publish,
                        false,
                        None,
                    )
                    .await
                {
                    debug!(error = %e, "could not publish a reply");
                }
            }
        });
        let result = crate::driver::supervise(runs, shutdown).await;
        house.abort();
        let _ = house.await;
        retained.tick().await;
        refuse.abort();
        accept.abort();
        let _ = (&mut accept).await;
        if let Some(tls) = tls {
            tls.stop().await;
        }
        let ids: Vec<ClientId> = {
            let shared = scx.extends.shared().await;
            shared.iter().map(|e| e.id().client_id.clone()).collect()
        };
        for id in ids {
            kick(&scx, &id).await;
        }
        result
    }
}

/// Runs the accept loops of `server` until aborted.
async fn run_broker(server: MqttServer) {
    if let Err(e) = server.run().await {
        warn!(error = %e, "the embedded broker stopped");
    }
}

/// A listener of the embedded broker, within `limits`.
fn listener_builder(name: &str, at: SocketAddr, limits: &BrokerLimits) -> Builder {
    Builder::new()
        .name(name)
        .laddr(at)
        .nodelay(true)
        .reuseaddr(Some(true))
        .max_packet_size(limits.max_packet)
        .max_inflight(NonZeroU16::new(256).unwrap_or(NonZeroU16::MIN))
        // Topic aliases both ways (mosquitto allows 10).
        .max_topic_aliases(64)
        .max_mqueue_len(limits.max_queued)
        .max_session_expiry_interval(limits.max_session_expiry)
        .max_connections(limits.max_connections)
        // Every client passes the authentication hook (the limit per
        // address is checked there); the hook allows anonymous ones.
        .allow_anonymous(false)
        // Do not give messages without an expiry one of 300 s.
        .message_expiry_interval(Duration::ZERO)
}

/// The TLS listener, whose certificate, key and client CA files SIGHUP can
/// read again.
///
/// rmqtt builds a listener's TLS acceptor once, from the files, and runs
/// its own accept loop, so a reload binds a second listener on the same
/// address (`SO_REUSEPORT`, which only a process of the same user can
/// share), with the files as they are now, starts its accept loop, and
/// only then stops the old one. Connections already made keep their
/// session and their TLS session; new handshakes get the new certificate.
/// Files that do not load change nothing.
#[derive(Clone)]
pub struct TlsReload {
    inner: Arc<tokio::sync::Mutex<TlsRunning>>,
    addr: SocketAddr,
}

struct TlsRunning {
    scx: ServerContext,
    spec: TlsListener,
    limits: BrokerLimits,
    /// The listener id of the running accept loop (2 or 3, in turn: rmqtt
    /// refuses an id already registered, and keeps each listener's
    /// settings by id).
    id: rmqtt::types::ListenerId,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TlsReload {
    /// Binds the TLS listener and starts its accept loop.
    fn start(scx: &ServerContext, spec: &TlsListener, limits: BrokerLimits) -> Result<TlsReload> {
        let listener = tls_listener(spec.listen, spec, &limits)?;
        let addr = listener.local_addr()?;
        let id = 2;
        let server = MqttServer::new(scx.clone())
            .listener_by_id(listener, id)
            .build();
        let task = tokio::spawn(run_broker(server));
        Ok(TlsReload {
            inner: Arc::new(tokio::sync::Mutex::new(TlsRunning {
                scx: scx.clone(),
                spec: spec.clone(),
                limits,
                id,
                task: Some(task),
            })),
            addr,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reads the certificate, key and client CA files again and serves new
    /// connections with them; on an error nothing changes.
    pub async fn reload(&self) -> Result<()> {
        let mut running = self.inner.lock().await;
        let Some(old) = running.task.take() else {
            return Err(anyhow!("the TLS listener has stopped"));
        };
        let listener = match tls_listener(self.addr, &running.spec, &running.limits) {
            Ok(l) => l,
            Err(e) => {
                running.task = Some(old);
                return Err(e);
            }
        };
        let id = if running.id == 2 { 3 } else { 2 };
        running.scx.listen_cfgs.remove(&id);
        let server = MqttServer::new(running.scx.clone())
            .listener_by_id(listener, id)
            .build();
        running.task = Some(tokio::spawn(run_broker(server)));
        running.id = id;
        // The new loop accepts already; the old socket closes.
        old.abort();
        let _ = old.await;
        Ok(())
    }

    /// Stops accepting TLS connections.
    async fn stop(&self) {
        if let Some(task) = self.inner.lock().await.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// A TLS listener on `at` with the files `spec` names, as they are now.
fn tls_listener(
    at: SocketAddr,
    spec: &TlsListener,
    limits: &BrokerLimits,
) -> Result<rmqtt::net::Listener> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut b = listener_builder("statestore/tls", at, limits)
        // A reload binds beside the running listener.
        .reuseport(Some(true))
        .tls_cert(Some(path(&spec.cert)))
        .tls_key(Some(path(&spec.key)));
    if let Some(ca) = &spec.client_ca {
        b = b
            .tls_cross_certificate(true)
            .tls_client_ca_certs(Some(path(ca)))
            // The certificate's common name: a principal.
            .collect_cert_info(true);
    }
    b.bind()
        .with_context(|| format!("cannot listen on {at} (is the port in use?)"))?
        .tls()
        .with_context(|| {
            format!(
                "cannot set up TLS with --tls-cert {} and --tls-key {}{}",
                spec.cert.display(),
                spec.key.display(),
                spec.client_ca
                    .as_ref()
                    .map(|c| format!(" and --client-ca {}", c.display()))
                    .unwrap_or_default()
            )
        })
}

/// The client id of the store's publishes: `$statestore` for the refusals
/// to clients of no tenant, `$statestore/<n>` for tenant `n`'s.
const STORE_SENDER: &str = "$statestore";

/// The sender of what the store publishes (of `tenant`, if any).
fn system_from(scx: &ServerContext, tenant: Option<usize>) -> MsgFrom {
    let id = match tenant {
        Some(n) => format!("{STORE_SENDER}/{n}"),
        None => STORE_SENDER.to_string(),
    };
    MsgFrom::from_system(Id::new(
        scx.node.id(),
        0,
        None,
        None,
        ClientId::from(id),
        None,
    ))
}

/// Disconnects a client.
async fn kick(scx: &ServerContext, client: &str) {
    let mut entry = scx
        .extends
        .shared()
        .await
        .entry(Id::from(scx.node.id(), ClientId::from(client)));
    if entry.exist()
        && let Err(e) = entry.kick(true, true, true).await
    {
        warn!(client_id = client, error = %e, "could not disconnect a client");
    }
}

impl BrokerTransport {
    fn from(&self) -> MsgFrom {
        system_from(&self.scx, Some(self.tenant))
    }

    /// Puts a notification straight into `client`'s session, whatever its
    /// subscriptions (the .NET SDK's filter never matches, spec §2.3).
    async fn deliver_to(&self, client: &str, m: OutboundMessage) {
        let entry = {
            let shared = self.scx.extends.shared().await;
            if !shared.exist(client) {
                debug!(client_id = client, "no session to notify");
                return;
            }
            shared.entry(Id::from(self.scx.node.id(), ClientId::from(client)))
        };
        if let Err((_, _, reason)) = entry.publish(self.from(), outbound(m)).await {
            debug!(client_id = client, %reason, "notification not delivered");
        }
    }

    async fn kick(&self, client: &str) {
        kick(&self.scx, client).await;
    }
}

impl Transport for BrokerTransport {
    type Event = BrokerEvent;

    async fn recv(&mut self) -> Option<BrokerEvent> {
        match self.pending.take() {
            Some(e) => Some(e),
            None => self.events.recv().await,
        }
    }

    async fn on_event(&mut self, event: BrokerEvent) -> Result<Option<Input>> {
        Ok(Some(match event {
            BrokerEvent::Request(first, permit) => {
                let mut bytes = message_bytes(&first);
                self.requesters.add(&first);
                let mut batch = vec![first];
                // Their budget is given back once the batch is handled.
                self.permits.extend(permit);
                while batch.len() < MAX_BATCH
                    && bytes < MAX_BATCH_BYTES
                    && let Ok(e) = self.events.try_recv()
                {
                    match e {
                        BrokerEvent::Request(m, permit) => {
                            bytes += message_bytes(&m);
                            self.requesters.add(&m);
                            batch.push(m);
                            self.permits.extend(permit);
                        }
                        other => {
                            self.pending = Some(other);
                            break;
                        }
                    }
                }
                Input::Messages(batch)
            }
            BrokerEvent::Gone(id) => Input::ClientGone(id),
        }))
    }

    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        for o in outputs {
            match o {
                Output::Publish(m) if m.kind == PublishKind::Notification => {
                    match m.target_client.clone() {
                        Some(client) => self.deliver_to(&client, m).await,
                        None => warn!(topic = %m.topic, "notification without a target client"),
                    }
                }
                Output::Publish(m) => {
                    let requester = match self.requesters.take(&m) {
                        Some(r) => Some(r),
                        None => {
                            let shared = self.scx.extends.shared().await;
                            crate::isolation::reply_owner(&m.topic, |id| shared.exist(id))
                                .map(|id| ClientId::from(id.as_str()))
                        }
                    };
                    let Some(requester) = requester else {
                        debug!(topic = %m.topic, "a reply whose requester is not known is not delivered");
                        continue;
                    };
                    let mut publish = outbound(m);
                    publish.target_clientid = Some(requester);
                    SessionState::forwards(&self.scx, self.from(), publish, false, None)
                        .await
                        .map_err(|e| anyhow!("publish a reply: {e}"))?;
                }
                Output::Violation { client_id, reason } => {
                    warn!(client_id = client_id.as_deref().unwrap_or("?"), %reason, "protocol violation: disconnecting the client");
                    if let Some(id) = client_id {
                        self.kick(&id).await;
                    }
                }
                Output::Journal(_) | Output::More(_) => {}
            }
        }
        Ok(())
    }

    /// The broker acknowledged each request when it was handed over; its
    /// bytes leave the tenant's inbound budget now.
    async fn settle(&mut self) -> Result<()> {
        self.permits.clear();
        Ok(())
    }

    /// The server closes the broker once every tenant has stopped.
    async fn close(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(client: &str, topic: &str, corr: &[u8]) -> InboundMessage {
        let mut m = inbound(
            client,
            &Publish::from(CodecPublish {
                dup: false,
                retain: false,
                qos: QoS::AtLeastOnce,
                topic: REQUEST_TOPIC.into(),
                packet_id: None,
                payload: bytes::Bytes::new(),
                properties: Some(PublishProperties {
                    response_topic: Some(topic.into()),
                    correlation_data: Some(bytes::Bytes::copy_from_slice(corr)),
                    ..Default::default()
                }),
            }),
        );
        m.client_id = Some(client.to_string());
        m
    }

    fn reply(topic: &str, corr: &[u8]) -> OutboundMessage {
        statestore_guest::rpc::reply_message(
            topic.into(),
            Some(bytes::Bytes::copy_from_slice(corr)),
            None,
            statestore_guest::rpc::Status::Ok,
            bytes::Bytes::from_static(b"+OK\r\n"),
            None,
            std::iter::empty(),
            None,
        )
    }

    #[test]
    fn a_reply_finds_its_requester_by_correlation_data_and_topic() {
        let mut r = Requesters::default();
        r.add(&request("a", "clients/a/x", b"1"));
        r.add(&request("b", "clients/b/x", b"1"));
        r.add(&request("c", "shared/replies", b"2"));
        r.add(&request("d", "shared/replies", b"2"));
        assert_eq!(r.take(&reply("clients/b/x", b"1")).as_deref(), Some("b"));
        assert_eq!(r.take(&reply("clients/a/x", b"1")).as_deref(), Some("a"));
        assert_eq!(r.take(&reply("clients/a/x", b"1")), None, "answered once");
        // The same topic and correlation data: in the order asked.
        assert_eq!(r.take(&reply("shared/replies", b"2")).as_deref(), Some("c"));
        assert_eq!(r.take(&reply("shared/replies", b"2")).as_deref(), Some("d"));
        assert_eq!(r.take(&reply("elsewhere", b"3")), None);
        assert_eq!(r.count, 0);
        assert!(r.waiting.is_empty());
    }
}
