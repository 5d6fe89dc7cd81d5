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

use std::net::SocketAddr;
use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::PublishProperties;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::session::SessionState;
use rmqtt::types::{AuthResult, ClientId, CodecPublish, From as MsgFrom, Id, Publish};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::config::Matcher;
use crate::driver::{Control, Input, MAX_BATCH, Transport, now_ms};
use crate::store::StoreOptions;
use crate::tenant::Tenant;
use crate::{Config, InboundMessage, OutboundMessage, Output, PublishKind, Runtime};
use statestore_guest::{HostReply, StateMachine};

/// A client id no client can have (MQTT client ids are never this long and
/// `$` ids are refused): routing a request copy to it drops the copy.
const CONSUMED: &str = "$statestore/consumed";

/// Largest packet the listener accepts and sends (the MQTT maximum).
const MAX_PACKET: u32 = 268_435_455;

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

enum BrokerEvent {
    Request(InboundMessage),
    Gone(String),
}

/// Which tenant's channel a client's events go to.
struct Router {
    routes: Vec<Route>,
    default: Option<usize>,
    tenants: Vec<mpsc::UnboundedSender<BrokerEvent>>,
    /// Requests of clients that belong to no tenant.
    strangers: mpsc::UnboundedSender<InboundMessage>,
}

impl Router {
    fn tenant_of(&self, username: Option<&str>, client_id: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.matcher.matches(username, client_id))
            .or(self.default)
    }

    /// The verdict on a client's credentials: `None` if no tenant claims
    /// its user name with a password.
    fn authenticate(&self, username: &str, password: Option<&[u8]>) -> Option<AuthResult> {
        let route = self
            .routes
            .iter()
            .find(|r| r.matcher.usernames.iter().any(|u| u == username))?;
        let expected = route.matcher.password.as_deref()?;
        Some(if password == Some(expected.as_bytes()) {
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

#[async_trait::async_trait]
impl Handler for Hooks {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        match param {
            Parameter::ClientAuthenticate(info) => {
                let Some(user) = info.username() else {
                    return (true, acc);
                };
                let password = info.password().map(|p| p.as_ref());
                match self.router.authenticate(user.as_ref(), password) {
                    Some(verdict) => (false, Some(HookResult::AuthResult(verdict))),
                    None => (true, acc),
                }
            }
            Parameter::MessagePublish(_, from, publish)
                if from.is_custom() && publish.topic.as_ref() as &str == REQUEST_TOPIC =>
            {
                let client_id: &str = from.id.client_id.as_ref();
                let message = inbound(client_id, publish);
                match self.router.tenant_of(username(&from.id), client_id) {
                    Some(t) => {
                        let _ = self.router.tenants[t].send(BrokerEvent::Request(message));
                    }
                    None => {
                        let _ = self.router.strangers.send(message);
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
            Parameter::ClientDisconnected(session, reason) => {
                // A takeover (same client id connecting again) is not a departure.
                if !reason.is_kicked(false) {
                    let id = session.id.client_id.to_string();
                    if let Some(t) = self.router.tenant_of(username(&session.id), &id) {
                        let _ = self.router.tenants[t].send(BrokerEvent::Gone(id));
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
    tenants: Vec<(Tenant, BrokerTransport, mpsc::UnboundedReceiver<Control>)>,
    handles: Vec<TenantHandle>,
    strangers: mpsc::UnboundedReceiver<InboundMessage>,
    /// For the replies to clients of no tenant.
    reply_config: Config,
    local_addr: SocketAddr,
}

/// One tenant's side of the broker.
struct BrokerTransport {
    scx: ServerContext,
    events: mpsc::UnboundedReceiver<BrokerEvent>,
    pending: Option<BrokerEvent>,
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

    /// Starts the broker on `listen` serving `tenants`, each with the route
    /// that says which clients are its. `server_client_id` is the `__srcId`
    /// of replies to clients of no tenant.
    pub async fn start_tenants(
        listen: SocketAddr,
        server_client_id: &str,
        tenants: Vec<(Tenant, Route)>,
    ) -> Result<EmbeddedServer> {
        let scx = ServerContext::new().busy_check_enable(false).build().await;
        let (strangers_tx, strangers) = mpsc::unbounded_channel();
        let mut senders = Vec::new();
        let mut routes = Vec::new();
        let mut running = Vec::new();
        let mut handles = Vec::new();
        for (tenant, route) in tenants {
            let (tx, events) = mpsc::unbounded_channel();
            let (control, control_rx) = mpsc::unbounded_channel();
            senders.push(tx);
            routes.push(route);
            handles.push(TenantHandle {
                name: tenant.name().to_string(),
                control,
            });
            let transport = BrokerTransport {
                scx: scx.clone(),
                events,
                pending: None,
            };
            running.push((tenant, transport, control_rx));
        }
        let router = std::sync::Arc::new(Router {
            default: routes.iter().position(|r| r.default),
            routes,
            tenants: senders,
            strangers: strangers_tx,
        });
        let register = scx.extends.hook_mgr().register();
        for t in [
            Type::ClientAuthenticate,
            Type::MessagePublish,
            Type::ClientDisconnected,
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
        let listener = Builder::new()
            .name("statestore/tcp")
            .laddr(listen)
            .nodelay(true)
            .reuseaddr(Some(true))
            .max_packet_size(MAX_PACKET)
            .max_inflight(NonZeroU16::new(256).unwrap_or(NonZeroU16::MIN))
            .max_mqueue_len(100_000)
            // Do not give messages without an expiry one of 300 s.
            .message_expiry_interval(Duration::ZERO)
            .bind()
            .with_context(|| format!("cannot listen on {listen} (is the port in use?)"))?
            .tcp()?;
        let local_addr = listener.local_addr()?;
        let server = MqttServer::new(scx.clone())
            .listener_by_id(listener, 1)
            .build();
        let accept = tokio::spawn(async move {
            if let Err(e) = server.run().await {
                warn!(error = %e, "the embedded broker stopped");
            }
        });
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
        })
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
            ..
        } = self;
        let runs: Vec<_> = tenants
            .into_iter()
            .map(|(mut tenant, mut transport, mut control)| {
                let name = tenant.name().to_string();
                let run = move |stopped: std::pin::Pin<
                    Box<dyn std::future::Future<Output = ()> + Send>,
                >| {
                    Box::pin(async move {
                        crate::driver::drive(&mut tenant, &mut transport, &mut control, stopped)
                            .await
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
                if let Some(reply) = reply
                    && let Err(e) = SessionState::forwards(
                        &scx_strangers,
                        system_from(&scx_strangers),
                        outbound(reply),
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
        refuse.abort();
        accept.abort();
        let _ = (&mut accept).await;
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

/// The sender of what the store publishes.
fn system_from(scx: &ServerContext) -> MsgFrom {
    MsgFrom::from_system(Id::new(
        scx.node.id(),
        0,
        None,
        None,
        ClientId::from("$statestore"),
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
        system_from(&self.scx)
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
            BrokerEvent::Request(first) => {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH
                    && let Ok(e) = self.events.try_recv()
                {
                    match e {
                        BrokerEvent::Request(m) => batch.push(m),
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
                    SessionState::forwards(&self.scx, self.from(), outbound(m), false, None)
                        .await
                        .map_err(|e| anyhow!("publish a reply: {e}"))?;
                }
                Output::Violation { client_id, reason } => {
                    warn!(client_id = client_id.as_deref().unwrap_or("?"), %reason, "protocol violation: disconnecting the client");
                    if let Some(id) = client_id {
                        self.kick(&id).await;
                    }
                }
                Output::Journal(_) => {}
            }
        }
        Ok(())
    }

    /// The broker acknowledged each request when it was handed over.
    async fn settle(&mut self) -> Result<()> {
        Ok(())
    }

    /// The server closes the broker once every tenant has stopped.
    async fn close(&mut self) {}
}
