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

pub(crate) mod admission;
mod hooks;
pub(crate) mod keep_alive;
mod listeners;
pub(crate) mod queue_bytes;
pub(crate) mod retained;
mod router;
pub(crate) mod shared_groups;
pub(crate) mod sys_topics;
mod tenant_transport;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::PublishProperties;
use rmqtt::context::ServerContext;
use rmqtt::hook::Type;
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::session::SessionState;
use rmqtt::types::{AuthResult, ClientId, CodecPublish, From as MsgFrom, Id, Publish};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{debug, info, warn};

use crate::config::Matcher;
use crate::store::StoreOptions;
use crate::store::driver::{
    Control, MAX_BATCH, MAX_BATCH_BYTES, Received, Transport, message_bytes, now_ms,
};
use crate::store::tenant::Tenant;
use crate::{Config, InboundMessage, OutboundMessage, Output, PublishKind, Runtime};
use hooks::{Hooks, username};
pub use listeners::TlsReload;
use listeners::listener_builder;
use router::{Router, STRANGERS_WAITING, Verified};
use statestore_guest::{HostReply, StateMachine};
use tenant_transport::{BrokerTransport, Receiving, ReplicaTransport, Side};

/// A client id no client can have (MQTT client ids are never this long and
/// `$` ids are refused): the store's hook sends a request it took to it,
/// and the broker (`consumed_target`) then takes it no further.
const CONSUMED: &str = "$statestore/consumed";

/// How many times a store request's session lets the runtime's other tasks
/// run while its PUBACK waits for the reply (they then leave in one write):
/// the store's driver, woken by the request, usually answers within the
/// first; a request that takes longer (an fsync) is acked without its
/// reply.
const ACK_HOLD_YIELDS: u32 = 4;

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
    /// (`transport::embedded::queue_bytes`); a message past it is dropped for that
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
            connect_timeout: crate::transport::embedded::admission::CONNECT_TIMEOUT,
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
    pub users: Option<std::sync::Arc<crate::auth::users::UsersCell>>,
    /// The connection count for `--metrics`.
    pub connections: Option<prometheus::IntGauge>,
    /// Messages dropped at a session's byte limit, for `--metrics`.
    pub queue_dropped: Option<prometheus::IntCounter>,
    /// What was refused at the other bounds and rules, for `--metrics`.
    pub refused: Option<prometheus::IntCounterVec>,
    /// The authorization file's rules (`--authorization`), replaceable
    /// while serving.
    pub policy: Option<std::sync::Arc<crate::auth::policy::PolicyCell>>,
    /// A TLS listener too.
    pub tls: Option<TlsListener>,
    /// Whether `clients/<id>/...` is its client's alone
    /// (`--strict-client-topics`), or only the store's streams in it.
    pub client_topics: crate::auth::isolation::ClientTopics,
    /// Where retained messages are kept across restarts; none: in memory.
    pub data_dir: Option<std::path::PathBuf>,
    /// How long a request's PUBACK may wait for its reply after the
    /// session's yields, so that both leave in one write (a replica's
    /// replies take a round between replicas); none: only the yields.
    pub ack_wait: Option<Duration>,
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
#[derive(Clone)]
struct Inbound {
    /// Its tenant's index, which each event carries.
    tenant: usize,
    tx: mpsc::UnboundedSender<(usize, BrokerEvent)>,
    budget: Arc<Semaphore>,
    total: usize,
}

impl Inbound {
    /// Hands a request over, waiting while the tenant already holds its
    /// budget of waiting requests (the publisher waits with it).
    async fn request(&self, message: InboundMessage) {
        let want = self.want(&message);
        let permit = self.budget.clone().acquire_many_owned(want).await.ok();
        let _ = self
            .tx
            .send((self.tenant, BrokerEvent::Request(message, permit)));
    }

    /// Hands a request over if its tenant has room for it now (no future,
    /// no waiter): `false` when it has not (the request is dropped, for the
    /// caller to make again and wait with [`Inbound::request`]).
    fn try_request(&self, message: InboundMessage) -> bool {
        let permit = match self
            .budget
            .clone()
            .try_acquire_many_owned(self.want(&message))
        {
            Ok(permit) => Some(permit),
            Err(tokio::sync::TryAcquireError::NoPermits) => return false,
            Err(tokio::sync::TryAcquireError::Closed) => None,
        };
        let _ = self
            .tx
            .send((self.tenant, BrokerEvent::Request(message, permit)));
        true
    }

    /// The permits (bytes) a request takes from the budget.
    fn want(&self, message: &InboundMessage) -> u32 {
        u32::try_from(message_bytes(message).min(self.total)).unwrap_or(u32::MAX)
    }

    /// Says that `client` went away.
    fn gone(&self, client: String) {
        let _ = self.tx.send((self.tenant, BrokerEvent::Gone(client)));
    }
}

/// A request as the guest sees it, with the publisher's real client id.
/// An owned copy of a string (`to_string` on a `ByteString` goes through
/// the formatting machinery; this is one allocation and one copy).
fn own(s: &str) -> String {
    String::from(s)
}

fn inbound(client_id: &str, p: &Publish) -> InboundMessage {
    // Read in place: a copy of the properties would clone each of them
    // once more before they are copied out.
    let props = p.properties.as_ref();
    InboundMessage {
        topic: own(&p.topic),
        payload: p.payload.to_vec(),
        qos: p.qos as u8,
        response_topic: props.and_then(|p| p.response_topic.as_deref().map(own)),
        correlation_data: props.and_then(|p| p.correlation_data.as_ref().map(|b| b.to_vec())),
        message_expiry_interval: props
            .and_then(|p| p.message_expiry_interval)
            .map(NonZeroU32::get),
        content_type: props.and_then(|p| p.content_type.as_deref().map(own)),
        payload_format_indicator: Some(u8::from(props.is_some_and(|p| p.is_utf8_payload))),
        user_properties: props.map_or_else(Vec::new, |p| {
            p.user_properties
                .iter()
                .map(|(n, v)| (own(n), own(v)))
                .collect()
        }),
        client_id: Some(own(client_id)),
        received_at: Some(now_ms()),
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// An rmqtt PUBLISH for an output. rmqtt carries strings and payloads in
/// the same shared buffers (`Bytes`, `ByteString`) as [`OutboundMessage`],
/// so nothing is copied: the fields of a reply still point into the buffer
/// the component returned. `created`: when it was made (ms since the
/// epoch; its expiry counts from then), read once for a batch of outputs.
fn outbound(m: OutboundMessage, created: i64) -> Publish {
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
    Publish::from(codec).create_time(created)
}

/// The broker with the tenants' stores as its extension.
pub struct EmbeddedServer {
    scx: ServerContext,
    accept: tokio::task::JoinHandle<()>,
    running: Vec<Running>,
    handles: Vec<TenantHandle>,
    strangers: mpsc::Receiver<InboundMessage>,
    /// For the replies to clients of no tenant.
    reply_config: Config,
    local_addr: SocketAddr,
    tls: Option<TlsReload>,
    retained: Arc<crate::transport::embedded::retained::Retained>,
    counters: Arc<crate::transport::embedded::sys_topics::Counters>,
}

/// What serves the clients: each tenant's store in this process, or a
/// replica of a cluster (`serve --cluster`) for every tenant.
enum Serving {
    Tenants(Vec<(Tenant, Route)>),
    /// The replica, and its tenants' names and routes (in its order).
    Replica(Box<crate::cluster::node::Node>, Vec<(String, Route)>),
}

/// A loop to run: a tenant's store with its side of the broker, or the
/// replica with every tenant's (each moved once: its size does not
/// matter).
#[allow(clippy::large_enum_variant)]
enum Running {
    Tenant(Tenant, BrokerTransport, mpsc::UnboundedReceiver<Control>),
    Replica(Box<crate::cluster::node::Node>, ReplicaTransport),
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
        let serving = Serving::Tenants(tenants);
        EmbeddedServer::start_served(listen, server_client_id, serving, opts).await
    }

    /// Starts the broker on `listen` with a replica of a cluster as the
    /// store of `tenants` (`serve --cluster`; their names and routes, in
    /// the replica's order of tenants; none: every client is the one
    /// store's).
    pub async fn start_replica(
        listen: SocketAddr,
        server_client_id: &str,
        node: crate::cluster::node::Node,
        mut tenants: Vec<(String, Route)>,
        opts: BrokerOptions,
    ) -> Result<EmbeddedServer> {
        if tenants.is_empty() {
            let route = Route {
                matcher: Matcher::default(),
                default: true,
            };
            tenants.push(("default".into(), route));
        }
        let serving = Serving::Replica(Box::new(node), tenants);
        EmbeddedServer::start_served(listen, server_client_id, serving, opts).await
    }

    async fn start_served(
        listen: SocketAddr,
        server_client_id: &str,
        serving: Serving,
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
            ack_wait,
        } = opts;
        let limits = &limits;
        let refusals = crate::transport::embedded::admission::Refusals::new(refused);
        let on_refuse = {
            let refusals = refusals.clone();
            Arc::new(move |reason: &'static str| refusals.count(reason))
        };
        let (scx, retained) =
            broker_context(limits, data_dir.as_deref(), ack_wait, on_refuse).await?;
        let counters = Arc::new(crate::transport::embedded::sys_topics::Counters::default());
        let (strangers_tx, strangers) = mpsc::channel(STRANGERS_WAITING);
        let mut senders = Vec::new();
        let mut routes = Vec::new();
        let table = Arc::new(std::sync::RwLock::new(router::Table::default()));
        let mut running = Vec::new();
        let mut handles = Vec::new();
        let total = limits.inbound_bytes.clamp(1, u32::MAX as usize);
        let side = |tenant: usize| Side::new(scx.clone(), tenant);
        match serving {
            Serving::Tenants(tenants) => {
                for (t, (tenant, route)) in tenants.into_iter().enumerate() {
                    let (tx, events) = mpsc::unbounded_channel();
                    let (control, control_rx) = mpsc::unbounded_channel();
                    senders.push(Inbound {
                        tenant: t,
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
                        side: side(t),
                        rx: Receiving::new(events),
                    };
                    running.push(Running::Tenant(tenant, transport, control_rx));
                }
            }
            Serving::Replica(node, tenants) => {
                // One channel: the replica's one loop serves them all.
                let (tx, events) = mpsc::unbounded_channel();
                let mut sides = Vec::new();
                for (t, (_, route)) in tenants.into_iter().enumerate() {
                    senders.push(Inbound {
                        tenant: t,
                        tx: tx.clone(),
                        budget: Arc::new(Semaphore::new(total)),
                        total,
                    });
                    routes.push(route);
                    sides.push(side(t));
                }
                let transport = ReplicaTransport {
                    sides,
                    rx: Receiving::new(events),
                    current: 0,
                    table: table.clone(),
                    tx,
                    total,
                };
                running.push(Running::Replica(node, transport));
            }
        }
        let routes_len = routes.len();
        {
            let mut t = table.write().unwrap_or_else(|e| e.into_inner());
            t.default = routes.iter().position(|r| r.default);
            t.routes = routes;
            t.tenants = senders;
        }
        let router = std::sync::Arc::new(Router {
            table,
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
            logins: crate::transport::embedded::admission::LoginThrottle::new(
                limits.max_failed_logins,
            ),
            sessions: crate::transport::embedded::admission::Sessions::new(
                limits.max_sessions,
                limits.max_sessions_per_address,
            ),
            refusals: refusals.clone(),
        });
        let queue_bytes = crate::transport::embedded::queue_bytes::QueueBytes::new(
            limits.max_queued_bytes,
            limits.max_queued_total_bytes,
            queue_dropped,
            refusals,
        );
        crate::transport::embedded::queue_bytes::BoundedShared::install(&scx, queue_bytes.clone())
            .await;
        register_hooks(&scx, router, queue_bytes, counters.clone()).await;
        let (accept, local_addr, tls_reload) = start_listeners(&scx, listen, tls.as_ref(), limits)?;
        let tls_addr = tls_reload.as_ref().map(TlsReload::local_addr);
        if let Some(at) = tls_addr {
            info!(listen = %at, client_certificates = tls.as_ref().is_some_and(|t| t.client_ca.is_some()), "embedded MQTT broker listening with TLS");
        }
        info!(listen = %local_addr, tenants = routes_len, "embedded MQTT broker listening; serving the state store");
        Ok(EmbeddedServer {
            scx,
            accept,
            running,
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

    /// Reads the broker's PUBLISH counters, received and delivered (for
    /// `--metrics`).
    pub fn counters(&self) -> impl Fn() -> (u64, u64) + Send + Sync + 'static {
        let counters = self.counters.clone();
        move || {
            (
                counters.received.load(Ordering::Relaxed),
                counters.sent.load(Ordering::Relaxed),
            )
        }
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
            running,
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
                if last_sys
                    .is_none_or(|t| t.elapsed() >= crate::transport::embedded::sys_topics::INTERVAL)
                {
                    crate::transport::embedded::sys_topics::publish(&scx_house, &counters, started)
                        .await;
                    last_sys = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let runs: Vec<_> = running
            .into_iter()
            .map(|running| {
                let name = match &running {
                    Running::Tenant(tenant, ..) => tenant.name().to_string(),
                    Running::Replica(..) => "the replica".to_string(),
                };
                let run = move |stopped: std::pin::Pin<
                    Box<dyn std::future::Future<Output = ()> + Send>,
                >| {
                    Box::pin(async move {
                        match running {
                            Running::Tenant(mut tenant, mut transport, mut control) => {
                                crate::store::driver::drive(
                                    &mut tenant,
                                    &mut transport,
                                    &mut control,
                                    stopped,
                                )
                                .await
                            }
                            Running::Replica(node, mut transport) => {
                                node.drive(&mut transport, stopped).await
                            }
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
                let mut publish = outbound(reply, rmqtt::utils::timestamp_millis());
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
        let result = crate::store::driver::supervise(runs, shutdown).await;
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

/// The broker's context: its pre-CONNECT gate, retained messages (from
/// `data_dir`, if any), keep-alive fitter and shared subscriptions.
async fn broker_context(
    limits: &BrokerLimits,
    data_dir: Option<&std::path::Path>,
    ack_wait: Option<Duration>,
    on_refuse: Arc<dyn Fn(&'static str) + Send + Sync>,
) -> Result<(
    ServerContext,
    Arc<crate::transport::embedded::retained::Retained>,
)> {
    let scx = ServerContext::new()
        .busy_check_enable(false)
        .pre_connect(rmqtt::pre_connect::PreConnect::new(
            limits.max_pending_connections,
            limits.max_pending_per_address,
            Some(limits.connect_timeout),
            Some(on_refuse),
        ))
        // A request's PUBACK waits (while its session yields at most
        // ACK_HOLD_YIELDS times) for its reply, so that both reach the
        // client in one write.
        .ack_hold(rmqtt::context::AckHold {
            topic: statestore_guest::rpc::REQUEST_TOPIC.to_string(),
            yields: ACK_HOLD_YIELDS,
            wait: ack_wait,
        })
        // A request the store's hook took goes no further: not routed
        // (nobody else gets it), not retained.
        .consumed_target(ClientId::from(CONSUMED))
        .build()
        .await;
    let retained = Arc::new(crate::transport::embedded::retained::Retained::open(
        data_dir,
        limits.max_retained,
        limits.max_retained_bytes,
    ));
    let loaded = retained.load(system_from(&scx, None)).await?;
    if loaded > 0 {
        info!(messages = loaded, "retained messages restored");
    }
    *scx.extends.retain_mut().await = Box::new(crate::transport::embedded::retained::Storage(
        retained.clone(),
    ));
    *scx.extends.fitter_mgr_mut().await = Box::new(crate::transport::embedded::keep_alive::Manager);
    *scx.extends.shared_subscription_mut().await =
        Box::new(crate::transport::embedded::shared_groups::RoundRobin::default());
    Ok((scx, retained))
}

/// Registers the hooks: the queue bounds' and the store's.
async fn register_hooks(
    scx: &ServerContext,
    router: Arc<Router>,
    queue_bytes: Arc<crate::transport::embedded::queue_bytes::QueueBytes>,
    counters: Arc<crate::transport::embedded::sys_topics::Counters>,
) {
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
                Box::new(crate::transport::embedded::queue_bytes::QueueHooks(
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
}

/// Binds the plain listener and, if asked, the TLS one, and starts their
/// accept loops: the accept task, the plain listener's address and the TLS
/// listener's reload handle.
fn start_listeners(
    scx: &ServerContext,
    listen: SocketAddr,
    tls: Option<&TlsListener>,
    limits: &BrokerLimits,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr, Option<TlsReload>)> {
    let listener = listener_builder("statestore/tcp", listen, limits)
        .bind()
        .with_context(|| format!("cannot listen on {listen} (is the port in use?)"))?
        .tcp()?;
    let local_addr = listener.local_addr()?;
    let server = MqttServer::new(scx.clone())
        .listener_by_id(listener, 1)
        .build();
    let accept = tokio::spawn(run_broker(server));
    let mut tls_reload = None;
    if let Some(t) = tls {
        let reload = match TlsReload::start(scx, t, *limits) {
            Ok(r) => r,
            Err(e) => {
                accept.abort();
                return Err(e);
            }
        };
        tls_reload = Some(reload);
    }
    Ok((accept, local_addr, tls_reload))
}

/// Runs the accept loops of `server` until aborted.
async fn run_broker(server: MqttServer) {
    if let Err(e) = server.run().await {
        warn!(error = %e, "the embedded broker stopped");
    }
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

#[cfg(test)]
mod tests {
    use super::tenant_transport::Requesters;
    use super::*;
    use statestore_guest::rpc::REQUEST_TOPIC;

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
        let now = std::time::Instant::now();
        r.add(&request("a", "clients/a/x", b"1"), now);
        r.add(&request("b", "clients/b/x", b"1"), now);
        r.add(&request("c", "shared/replies", b"2"), now);
        r.add(&request("d", "shared/replies", b"2"), now);
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
