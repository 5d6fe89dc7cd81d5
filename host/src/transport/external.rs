//! `statestore serve --broker URL`: the component served over a standard
//! MQTT5 broker, as one MQTT client.
//!
//! ```text
//!  rumqttc event loop task ──(requests, connacks, errors)──> driver (this task)
//!        ^                                                    │ handle(now)     
//!        └── publishes (notifications, then replies), then ───┘ timeout(now) at next_deadline
//!            the manual PUBACK of each request, in arrival order
//! ```
//!
//! Delivery: the session is persistent (clean start false, session expiry),
//! so requests that arrive while we are down wait in the broker, and a
//! request is PUBACKed only after its reply and notifications were handed to
//! the same connection: the broker sees them before the PUBACK. A request
//! redelivered after a crash or reconnect is answered from the dedup cache.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::mqtt::{self, BrokerUrl};
use crate::store::StoreOptions;
use crate::store::driver::{Control, MAX_BATCH, MAX_BATCH_BYTES, Received, message_bytes};
use crate::store::tenant::Tenant;
use crate::{Output, Runtime};

/// Largest MQTT packet (the protocol maximum): 64 KiB keys and MiB values must pass.
pub const MAX_PACKET: u32 = 268_435_455;

/// How the server learns that clients disconnected (to drop their KEYNOTIFY
/// registrations). A plain MQTT client cannot see other clients come and go;
/// some brokers publish it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientEvents {
    /// Registrations stay until KEYNOTIFY STOP (spec §18 Q7).
    None,
    /// mosquitto with `log_dest topic`: parse `$SYS/broker/log/N` lines.
    MosquittoLog,
    /// EMQX system topics `$SYS/brokers/+/clients/+/disconnected`.
    Emqx,
}

impl ClientEvents {
    fn filter(self) -> Option<&'static str> {
        match self {
            ClientEvents::None => None,
            ClientEvents::MosquittoLog => Some("$SYS/broker/log/N"),
            ClientEvents::Emqx => Some("$SYS/brokers/+/clients/+/disconnected"),
        }
    }

    /// The client id a system message reports as gone, if it reports one.
    pub fn disconnected_client(self, topic: &str, payload: &[u8]) -> Option<String> {
        match self {
            ClientEvents::None => None,
            ClientEvents::Emqx => {
                let parts: Vec<&str> = topic.split('/').collect();
                match parts.as_slice() {
                    ["$SYS", "brokers", _, "clients", id, "disconnected"] => {
                        Some((*id).to_string())
                    }
                    _ => None,
                }
            }
            ClientEvents::MosquittoLog => {
                // "<time>: Client <id> disconnected." and its kin, matched
                // as whole templates: a client id may hold spaces and words
                // of the templates ("victim was-here" is one client), and
                // only the whole line decides whose it is.
                let line = std::str::from_utf8(payload).ok()?;
                // The time mosquitto puts first (`log_timestamp true`, its
                // default: seconds since the epoch), if any.
                let message = match line.split_once(": ") {
                    Some((time, rest))
                        if !time.is_empty() && time.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        rest
                    }
                    _ => line,
                };
                MOSQUITTO_GONE
                    .iter()
                    .find_map(|(before, after)| {
                        let id = message.strip_prefix(before)?.strip_suffix(after)?;
                        (!id.is_empty()).then(|| id.to_string())
                    })
                    .or_else(|| {
                        MOSQUITTO_GONE_WITH_REASON.iter().find_map(|(before, sep)| {
                            // The reason (an OS error text) never holds the
                            // separator; an id might: cut at its last one.
                            let rest = message.strip_prefix(before)?;
                            let (id, reason) = rest.rsplit_once(sep)?;
                            (!id.is_empty() && !reason.is_empty()).then(|| id.to_string())
                        })
                    })
            }
        }
    }
}

/// The lines mosquitto 2 logs when a client goes away, as (before, after)
/// the client id.
const MOSQUITTO_GONE: &[(&str, &str)] = &[
    ("Client ", " disconnected."),
    ("Client ", " closed its connection."),
    ("Client ", " has exceeded timeout, disconnecting."),
    ("Client ", " already connected, closing old connection."),
    ("Client ", " disconnected due to protocol error."),
    ("Client ", " disconnected due to malformed packet."),
    ("Client ", " disconnected due to oversize packet."),
    ("Client ", " disconnected due to oversize payload."),
    ("Client ", " disconnected due to out of memory."),
    (
        "Client ",
        " disconnected due to QoS too high or retain not supported.",
    ),
    ("Client ", " been disconnected by administrative action."),
    ("Client ", " disconnected, not authorised."),
    ("Socket error on client ", ", disconnecting."),
];

/// The lines that end with a reason after the client id, as (before the id,
/// between the id and the reason): `Client <id> disconnected: <error>.`.
const MOSQUITTO_GONE_WITH_REASON: &[(&str, &str)] = &[
    ("Client ", " disconnected: "),
    ("Bad socket read/write on client ", ": "),
];

/// Everything `serve` needs to know.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The broker to connect to.
    pub broker: BrokerUrl,
    /// Our MQTT client id (also the `__srcId` of replies).
    pub client_id: String,
    /// MQTT user name.
    pub username: Option<String>,
    /// MQTT password.
    pub password: Option<String>,
    /// CA certificate (PEM) for TLS; the system roots if absent.
    pub ca_file: Option<PathBuf>,
    /// Our client certificate, for a broker that asks for one (`mqtts://`).
    pub client_cert: Option<crate::mqtt::ClientCert>,
    /// MQTT keep-alive.
    pub keep_alive: Duration,
    /// How long the broker keeps our session (and queued requests) while we are away.
    pub session_expiry: Duration,
    /// How long to wait for the first connection.
    pub connect_timeout: Duration,
    /// Where disconnect events come from.
    pub client_events: ClientEvents,
    /// The largest packet we accept (the broker must not send more, MQTT5
    /// Maximum Packet Size); with the receive maximum of 256 unacknowledged
    /// requests it bounds what the broker can make us hold.
    pub max_packet: u32,
    /// The store: node id, persistence.
    pub store: StoreOptions,
    /// A replica of a cluster subscribes to the request topic through
    /// this MQTT5 shared subscription group (`$share/<group>/...`).
    pub shared_group: Option<String>,
}

// Raw events of the rumqttc connection.
enum NetEvent {
    Connected { session_present: bool },
    SubAck(Vec<SubscribeReasonCode>),
    Publish(Publish),
    Lost(String),
    DisconnectSent,
}

pub use crate::store::driver::now_ms;

/// A connected, subscribed server of one tenant; [`Server::run`] serves
/// until shutdown.
pub struct Server {
    tenant: Tenant,
    transport: ClientTransport,
    control: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
}

/// The rumqttc connection as a [`Transport`].
struct ClientTransport {
    opts: ServeOptions,
    client: AsyncClient,
    events: mpsc::Receiver<NetEvent>,
    pending: VecDeque<NetEvent>,
    net: tokio::task::JoinHandle<()>,
    /// Requests handed to the guest and not yet acknowledged, in arrival order.
    to_ack: Vec<Publish>,
    /// A replica's requests are acknowledged once answered (see
    /// [`Unanswered`]); one process's once handled.
    ack_when_answered: bool,
    unanswered: Vec<Unanswered>,
}

/// A request a replica took from the broker and has not answered yet: it
/// is acknowledged (PUBACK) once its reply is handed to the broker, so a
/// replica that dies before its request is committed leaves it
/// unacknowledged, and the broker delivers it again (to the replica's
/// session when it comes back, or to another member of the shared
/// subscription). One that is never answered (expired, lost with a
/// leader) is acknowledged when its client has stopped waiting:
/// at its message expiry, at most [`ANSWER_WITHIN`] after it came.
struct Unanswered {
    topic: String,
    correlation: Vec<u8>,
    until: Instant,
    publish: Publish,
}

/// The longest a replica leaves a request unacknowledged.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What to wait for before acknowledging `p`, if it is a request that gets
/// a reply (QoS 1 on the request topic, a valid response topic, correlation
/// data); `None`: acknowledge it now.
fn awaiting(p: &Publish, now: Instant) -> Option<Unanswered> {
    if p.qos != QoS::AtLeastOnce || p.topic.as_ref() != REQUEST_TOPIC.as_bytes() {
        return None;
    }
    let props = p.properties.as_ref()?;
    let topic = props.response_topic.as_ref()?;
    let correlation = props.correlation_data.as_ref()?;
    if statestore_guest::rpc::check_response_topic(topic)
        != statestore_guest::rpc::TopicCheck::Valid
    {
        return None;
    }
    let wait = props.message_expiry_interval.map_or(ANSWER_WITHIN, |s| {
        Duration::from_secs(u64::from(s)).min(ANSWER_WITHIN)
    });
    Some(Unanswered {
        topic: topic.clone(),
        correlation: correlation.to_vec(),
        until: now + wait,
        publish: p.clone(),
    })
}

impl Server {
    /// Instantiates the component, connects to the broker and subscribes.
    /// Fails with a clear message if the broker cannot be reached in time.
    pub async fn connect(runtime: &Runtime, opts: ServeOptions) -> Result<Server> {
        let tenant = Tenant::open("default", runtime.clone(), &opts.store)?;
        Server::connect_tenant(tenant, opts).await
    }

    /// Connects `tenant`'s own connection (`opts.store` is not used: the
    /// tenant is open already).
    pub async fn connect_tenant(tenant: Tenant, opts: ServeOptions) -> Result<Server> {
        let transport = ClientTransport::connect(opts).await?;
        let (control, control_rx) = mpsc::unbounded_channel();
        Ok(Server {
            tenant,
            transport,
            control,
            control_rx,
        })
    }

    /// Serves requests until `shutdown` completes, then finishes what is in
    /// hand, disconnects cleanly and returns.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        crate::store::driver::drive(
            &mut self.tenant,
            &mut self.transport,
            &mut self.control_rx,
            shutdown,
        )
        .await
    }

    /// Where to send commands (upgrades) to the running tenant.
    pub fn control(&self) -> mpsc::UnboundedSender<Control> {
        self.control.clone()
    }

    /// The tenant's name.
    pub fn tenant_name(&self) -> &str {
        self.tenant.name()
    }
}

/// Serves a replica of a cluster (`serve --cluster` with `--broker`)
/// through the broker: its requests come through the shared subscription
/// of `opts.shared_group`, so the broker spreads them over the replicas
/// and gives a dead replica's unacknowledged ones to another.
///
/// With tenants (`--config`), `opts` has one connection per tenant, in the
/// order of the node's tenants (the broker keeps them apart: a listener and
/// mount point each, say): a tenant's requests are those its connection
/// receives, and its replies and notifications go out on it (`None`: a
/// tenant the cluster removed, whose number stays taken).
pub async fn serve_replica(
    node: crate::cluster::node::Node,
    opts: Vec<Option<ServeOptions>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let mut sides = Vec::with_capacity(opts.len());
    for o in opts {
        let Some(o) = o else {
            sides.push(None);
            continue;
        };
        let id = o.client_id.clone();
        let mut t = ClientTransport::connect(o)
            .await
            .with_context(|| format!("the broker connection {id:?}"))?;
        t.ack_when_answered = true;
        sides.push(Some(t));
    }
    // A replica of tenants may be given more (the cluster adds them).
    if sides.len() == 1 && !node.serves_tenants() {
        let mut transport = sides.pop().flatten().context("the store's connection")?;
        return node.drive(&mut transport, shutdown).await;
    }
    let mut transport = Connections {
        sides,
        connecting: Vec::new(),
        current: 0,
        start: 0,
        warned: None,
    };
    let result = node.drive(&mut transport, shutdown).await;
    for (_, task) in &transport.connecting {
        task.abort();
    }
    result
}

/// How long a connection for a tenant added while running waits before
/// trying the broker again.
const RECONNECT: Duration = Duration::from_secs(5);

/// A replica's connections to the broker, one per tenant, as one
/// [`crate::store::driver::Transport`]: an event is its connection's
/// tenant's, and so is what is emitted for it. A tenant added while
/// running has none until its connection is up (made on a task of its
/// own, tried again every [`RECONNECT`]: the replica's loop never waits
/// for a broker).
struct Connections {
    /// Each tenant's, by number (`None`: being connected).
    sides: Vec<Option<ClientTransport>>,
    /// Connections being made, for those tenants.
    connecting: Vec<(usize, tokio::task::JoinHandle<ClientTransport>)>,
    /// The tenant of the last event.
    current: usize,
    /// Where the next wait starts looking (each connection in turn).
    start: usize,
    /// When outputs for a tenant without its connection were last reported.
    warned: Option<std::time::Instant>,
}

impl Connections {
    /// Takes the connections made since the last look.
    fn poll_connecting(&mut self, cx: &mut std::task::Context<'_>) {
        let mut i = 0;
        while i < self.connecting.len() {
            let (t, task) = &mut self.connecting[i];
            match std::future::Future::poll(std::pin::Pin::new(task), cx) {
                std::task::Poll::Ready(Ok(side)) => {
                    info!(
                        tenant = *t,
                        "the tenant's broker connection is up: its clients are served"
                    );
                    self.sides[*t] = Some(side);
                    self.connecting.swap_remove(i);
                }
                std::task::Poll::Ready(Err(e)) => {
                    warn!(tenant = *t, error = %e, "the task connecting a tenant to the broker stopped");
                    self.connecting.swap_remove(i);
                }
                std::task::Poll::Pending => i += 1,
            }
        }
    }
}

impl crate::store::driver::Transport for Connections {
    type Event = (usize, NetEvent);

    async fn recv(&mut self) -> Option<(usize, NetEvent)> {
        std::future::poll_fn(|cx| {
            self.poll_connecting(cx);
            let n = self.sides.len();
            for k in 0..n {
                let i = (self.start + k) % n;
                let Some(side) = &mut self.sides[i] else {
                    continue;
                };
                let event = match side.pending.pop_front() {
                    Some(e) => std::task::Poll::Ready(Some(e)),
                    None => side.events.poll_recv(cx),
                };
                match event {
                    std::task::Poll::Ready(Some(e)) => {
                        self.start = (i + 1) % n;
                        return std::task::Poll::Ready(Some((i, e)));
                    }
                    // A connection's task is gone: so is the transport.
                    std::task::Poll::Ready(None) => return std::task::Poll::Ready(None),
                    std::task::Poll::Pending => {}
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    fn try_recv(&mut self) -> Option<(usize, NetEvent)> {
        for (i, side) in self.sides.iter_mut().enumerate() {
            let Some(side) = side else { continue };
            if let Some(e) = side.pending.pop_front() {
                return Some((i, e));
            }
            if let Ok(e) = side.events.try_recv() {
                return Some((i, e));
            }
        }
        None
    }

    async fn on_event(&mut self, (i, event): (usize, NetEvent)) -> Result<Option<Received>> {
        self.current = i;
        match &mut self.sides[i] {
            Some(side) => side.on_event(event).await,
            None => Ok(None),
        }
    }

    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        self.emit_to(self.current, outputs).await
    }

    fn tenant(&self) -> usize {
        self.current
    }

    async fn emit_to(&mut self, tenant: usize, outputs: Vec<Output>) -> Result<()> {
        match self.sides.get_mut(tenant) {
            Some(Some(side)) => side.emit(outputs).await,
            Some(None) => {
                // Said at most every 10 s.
                if self
                    .warned
                    .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
                {
                    self.warned = Some(std::time::Instant::now());
                    warn!(
                        tenant,
                        "outputs of a tenant whose broker connection is not up yet: dropped"
                    );
                }
                Ok(())
            }
            None => anyhow::bail!("outputs of tenant {tenant}, which has no connection"),
        }
    }

    async fn settle(&mut self) -> Result<()> {
        match &mut self.sides[self.current] {
            Some(side) => side.settle().await,
            None => Ok(()),
        }
    }

    async fn tick(&mut self) -> Result<()> {
        for side in self.sides.iter_mut().flatten() {
            side.tick().await?;
        }
        Ok(())
    }

    /// Starts making the tenant's connection, on a task of its own that
    /// tries again every [`RECONNECT`] until the broker takes it.
    async fn add_tenant(
        &mut self,
        tenant: usize,
        reach: crate::store::driver::Reach,
    ) -> Result<()> {
        if tenant != self.sides.len() {
            anyhow::bail!("tenant {tenant} added after {} tenants", self.sides.len());
        }
        if reach.is::<()>() {
            // A place kept for a tenant removed before it was served.
            self.sides.push(None);
            return Ok(());
        }
        let Ok(opts) = reach.downcast::<ServeOptions>() else {
            anyhow::bail!("a replica on a broker serves a tenant through a connection of its own");
        };
        self.sides.push(None);
        let task = tokio::spawn(async move {
            loop {
                match ClientTransport::connect((*opts).clone()).await {
                    Ok(mut side) => {
                        side.ack_when_answered = true;
                        return side;
                    }
                    Err(e) => {
                        warn!(tenant, client_id = %opts.client_id, error = %format!("{e:#}"), "cannot connect the tenant to the broker yet: trying again in 5 s");
                        tokio::time::sleep(RECONNECT).await;
                    }
                }
            }
        });
        self.connecting.push((tenant, task));
        Ok(())
    }

    /// Its connection closed (or no longer made).
    async fn remove_tenant(&mut self, tenant: usize) -> Result<()> {
        self.connecting.retain(|(t, task)| {
            if *t == tenant {
                task.abort();
            }
            *t != tenant
        });
        if let Some(Some(mut side)) = self.sides.get_mut(tenant).map(Option::take) {
            side.close().await;
        }
        Ok(())
    }

    async fn close(&mut self) {
        for (_, task) in self.connecting.drain(..) {
            task.abort();
        }
        for side in self.sides.iter_mut().flatten() {
            side.close().await;
        }
    }
}

impl ClientTransport {
    /// Connects to the broker and subscribes.
    async fn connect(opts: ServeOptions) -> Result<ClientTransport> {
        let mut mqtt = MqttOptions::new(&opts.client_id, &opts.broker.host, opts.broker.port);
        mqtt.set_keep_alive(opts.keep_alive)
            .set_clean_start(false)
            .set_session_expiry_interval(Some(
                u32::try_from(opts.session_expiry.as_secs()).unwrap_or(u32::MAX),
            ))
            .set_manual_acks(true)
            .set_max_packet_size(Some(opts.max_packet))
            .set_receive_maximum(Some(256))
            .set_connection_timeout(opts.connect_timeout.as_secs().max(1));
        if let Some(user) = &opts.username {
            if !opts.broker.tls && !opts.broker.is_loopback() {
                tracing::warn!(broker = %format!("{}:{}", opts.broker.host, opts.broker.port), user = %user, "the broker password goes out in clear text (mqtt://): use mqtts:// beyond loopback");
            }
            mqtt.set_credentials(user, opts.password.clone().unwrap_or_default());
        }
        crate::mqtt::connection_options(
            &mut mqtt,
            &opts.broker,
            opts.ca_file.as_deref(),
            opts.client_cert.as_ref(),
        )?;
        let (client, eventloop) = AsyncClient::new(mqtt, 256);
        let (tx, events) = mpsc::channel(NET_EVENTS_WAITING);
        let net = tokio::spawn(pump(eventloop, tx));
        let mut transport = ClientTransport {
            opts,
            client,
            events,
            pending: VecDeque::new(),
            net,
            to_ack: Vec::new(),
            ack_when_answered: false,
            unanswered: Vec::new(),
        };
        let wait =
            tokio::time::timeout(transport.opts.connect_timeout, transport.first_connection());
        match wait.await {
            Ok(Ok(())) => Ok(transport),
            Ok(Err(e)) => {
                transport.net.abort();
                Err(e)
            }
            Err(_) => {
                transport.net.abort();
                bail!(
                    "no answer from the broker at {} within {:?}",
                    transport.opts.broker,
                    transport.opts.connect_timeout
                )
            }
        }
    }

    async fn first_connection(&mut self) -> Result<()> {
        loop {
            match self.events.recv().await {
                Some(NetEvent::Connected { session_present }) => {
                    info!(broker = %self.opts.broker, client_id = %self.opts.client_id, session_present, "connected");
                    self.subscribe().await?;
                    return self.await_suback().await;
                }
                Some(NetEvent::Lost(e)) => {
                    bail!("cannot connect to the broker at {}: {e}", self.opts.broker)
                }
                Some(other) => self.pending.push_back(other),
                None => bail!("the MQTT connection task stopped"),
            }
        }
    }

    /// The request topic's filter: shared by the replicas of a cluster.
    fn request_filter(&self) -> String {
        match &self.opts.shared_group {
            Some(group) => format!("$share/{group}/{REQUEST_TOPIC}"),
            None => REQUEST_TOPIC.to_string(),
        }
    }

    async fn subscribe(&self) -> Result<()> {
        self.client
            .subscribe(self.request_filter(), QoS::AtLeastOnce)
            .await
            .context("subscribe")?;
        if let Some(filter) = self.opts.client_events.filter() {
            self.client
                .subscribe(filter, QoS::AtMostOnce)
                .await
                .context("subscribe")?;
        }
        Ok(())
    }

    async fn await_suback(&mut self) -> Result<()> {
        loop {
            match self.events.recv().await {
                Some(NetEvent::SubAck(codes)) => {
                    if let Some(bad) = codes
                        .iter()
                        .find(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                    {
                        bail!("the broker refused our subscription to {REQUEST_TOPIC}: {bad:?}");
                    }
                    info!(topic = %self.request_filter(), "subscribed; serving");
                    return Ok(());
                }
                Some(NetEvent::Lost(e)) => bail!("connection lost while subscribing: {e}"),
                Some(other) => self.pending.push_back(other),
                None => bail!("the MQTT connection task stopped"),
            }
        }
    }

    /// The request (if it is one) or the client event of a received PUBLISH.
    fn classify(&self, p: &Publish) -> Option<Received> {
        if p.topic.as_ref() == REQUEST_TOPIC.as_bytes() {
            return Some(Received::Messages(vec![mqtt::inbound(p)]));
        }
        let topic = String::from_utf8_lossy(&p.topic);
        self.opts
            .client_events
            .disconnected_client(&topic, &p.payload)
            .map(Received::ClientGone)
    }
}

impl crate::store::driver::Transport for ClientTransport {
    type Event = NetEvent;

    async fn recv(&mut self) -> Option<NetEvent> {
        match self.pending.pop_front() {
            Some(e) => Some(e),
            None => self.events.recv().await,
        }
    }

    async fn on_event(&mut self, event: NetEvent) -> Result<Option<Received>> {
        match event {
            NetEvent::Publish(first) => {
                let input = self.classify(&first);
                self.to_ack.push(first);
                let Some(Received::Messages(mut batch)) = input else {
                    return Ok(input);
                };
                // Take every request already waiting: one call into the guest.
                let mut bytes: usize = batch.iter().map(message_bytes).sum();
                while batch.len() < MAX_BATCH
                    && bytes < MAX_BATCH_BYTES
                    && let Ok(e) = self.events.try_recv()
                {
                    match e {
                        NetEvent::Publish(p) if p.topic.as_ref() == REQUEST_TOPIC.as_bytes() => {
                            let m = mqtt::inbound(&p);
                            bytes += message_bytes(&m);
                            batch.push(m);
                            self.to_ack.push(p);
                        }
                        other => {
                            self.pending.push_back(other);
                            break;
                        }
                    }
                }
                Ok(Some(Received::Messages(batch)))
            }
            NetEvent::Connected { session_present } => {
                info!(session_present, "reconnected");
                // Requests not yet acknowledged will be redelivered (the dedup
                // cache answers them); acking them on this new connection
                // could hit other messages' packet ids.
                self.to_ack.clear();
                self.unanswered.clear();
                // Subscriptions are renewed in case the broker lost the session.
                self.subscribe().await?;
                Ok(None)
            }
            NetEvent::SubAck(codes) => {
                if codes
                    .iter()
                    .any(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                {
                    warn!(?codes, "the broker refused a subscription");
                }
                Ok(None)
            }
            NetEvent::Lost(e) => {
                warn!(error = %e, "connection to the broker lost; reconnecting");
                Ok(None)
            }
            NetEvent::DisconnectSent => Ok(None),
        }
    }

    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        for o in outputs {
            match o {
                Output::Publish(m) => {
                    // A replica's request is acknowledged after its reply.
                    let answered = if m.kind == crate::PublishKind::Response
                        && !self.unanswered.is_empty()
                        && let Some(corr) = &m.correlation_data
                    {
                        self.unanswered
                            .iter()
                            .position(|u| u.topic == *m.topic && u.correlation == **corr)
                            .map(|i| self.unanswered.remove(i))
                    } else {
                        None
                    };
                    let props = mqtt::properties(&m);
                    self.client
                        .publish_with_properties(
                            m.topic,
                            mqtt::qos(m.qos),
                            m.retain,
                            m.payload,
                            props,
                        )
                        .await
                        .map_err(|e| anyhow!("publish: {e}"))?;
                    if let Some(u) = answered {
                        self.client
                            .ack(&u.publish)
                            .await
                            .context("acknowledge a request")?;
                    }
                }
                Output::Violation { client_id, reason } => {
                    // A plain client cannot disconnect another client.
                    warn!(client_id = client_id.as_deref().unwrap_or("?"), %reason, "protocol violation; request ignored");
                }
                Output::Journal(_) | Output::More(_) => {}
            }
        }
        Ok(())
    }

    /// Every reply is queued on the connection ahead of these acks (a
    /// replica's requests wait for their replies: [`Unanswered`]).
    async fn settle(&mut self) -> Result<()> {
        let now = Instant::now();
        for p in std::mem::take(&mut self.to_ack) {
            if p.qos == QoS::AtMostOnce {
                continue;
            }
            if self.ack_when_answered
                && let Some(u) = awaiting(&p, now)
            {
                self.unanswered.push(u);
                continue;
            }
            self.client.ack(&p).await.context("acknowledge a request")?;
        }
        self.tick().await
    }

    /// Acknowledges the requests whose clients no longer wait for them.
    async fn tick(&mut self) -> Result<()> {
        if self.unanswered.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let (overdue, waiting): (Vec<Unanswered>, Vec<Unanswered>) =
            std::mem::take(&mut self.unanswered)
                .into_iter()
                .partition(|u| u.until <= now);
        self.unanswered = waiting;
        for u in overdue {
            self.client
                .ack(&u.publish)
                .await
                .context("acknowledge a request")?;
        }
        Ok(())
    }

    async fn close(&mut self) {
        self.client.disconnect().await.ok();
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(e) = self.events.recv().await {
                if matches!(e, NetEvent::DisconnectSent | NetEvent::Lost(_)) {
                    break;
                }
            }
        });
        if drained.await.is_err() {
            warn!("the broker connection did not close within 5 s");
        }
        self.net.abort();
    }
}

/// Drives the rumqttc event loop and forwards what the driver needs.
/// Reconnects with a backoff (rumqttc itself would retry at once).
/// Events from the broker waiting for the store, at most. QoS 1 and 2
/// requests stop at our receive maximum (256 unacknowledged) well below
/// it; QoS 0 ones, which MQTT does not flow-control, are dropped past it
/// (at most once is their contract) rather than held. The pump never waits
/// for room for them: it also sends our replies, and a driver waiting to
/// publish while the pump waits for it would stop both.
const NET_EVENTS_WAITING: usize = 1024;

async fn pump(mut eventloop: EventLoop, tx: mpsc::Sender<NetEvent>) {
    let mut backoff = Duration::from_millis(100);
    let mut dropped: u64 = 0;
    loop {
        let forward = match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                backoff = Duration::from_millis(100);
                Some(NetEvent::Connected {
                    session_present: ack.session_present,
                })
            }
            Ok(Event::Incoming(Packet::Publish(p))) => Some(NetEvent::Publish(p)),
            Ok(Event::Incoming(Packet::SubAck(ack))) => Some(NetEvent::SubAck(ack.return_codes)),
            Ok(Event::Incoming(Packet::Disconnect(d))) => Some(NetEvent::Lost(format!(
                "the broker disconnected us: {:?}",
                d.reason_code
            ))),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => Some(NetEvent::DisconnectSent),
            Ok(_) => None,
            Err(e) => {
                let lost = NetEvent::Lost(e.to_string());
                if tx.send(lost).await.is_err() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let Some(event) = forward else { continue };
        match tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return,
            Err(mpsc::error::TrySendError::Full(NetEvent::Publish(p)))
                if p.qos == rumqttc::v5::mqttbytes::QoS::AtMostOnce =>
            {
                dropped += 1;
                if dropped.is_power_of_two() {
                    warn!(dropped, topic = %String::from_utf8_lossy(&p.topic), "QoS 0 messages dropped: the store is behind (more than {NET_EVENTS_WAITING} waiting)");
                }
            }
            Err(mpsc::error::TrySendError::Full(event)) => {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mosquitto_log_lines() {
        let e = ClientEvents::MosquittoLog;
        let t = "$SYS/broker/log/N";
        assert_eq!(
            e.disconnected_client(t, b"1700000000: Client c1 disconnected."),
            Some("c1".into())
        );
        assert_eq!(
            e.disconnected_client(t, b"1700000000: Client c-2 closed its connection."),
            Some("c-2".into())
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: Client x has exceeded timeout, disconnecting."
            ),
            Some("x".into())
        );
        assert_eq!(
            e.disconnected_client(t, b"1700000000: Socket error on client y, disconnecting."),
            Some("y".into())
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: New client connected from 127.0.0.1:5 as c1 (p5, c0, k60)."
            ),
            None
        );
        assert_eq!(
            e.disconnected_client(t, b"1700000000: mosquitto version 2.0.11 running"),
            None
        );
        // Whole templates: an id with spaces is one client, and a line
        // naming a client inside another's id is that other's.
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: Client c3 disconnected: Connection reset by peer."
            ),
            Some("c3".into())
        );
        assert_eq!(
            e.disconnected_client(t, b"Client no-time disconnected."),
            Some("no-time".into()),
            "log_timestamp false"
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: Bad socket read/write on client a: b: Broken pipe"
            ),
            Some("a: b".into())
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: Client admin-kicked been disconnected by administrative action."
            ),
            Some("admin-kicked".into())
        );
        assert_eq!(
            e.disconnected_client(t, b"1700000000: Client victim was-here disconnected."),
            Some("victim was-here".into())
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: New client connected from 127.0.0.1:5 as victim disconnected. (p5, c0, k60)."
            ),
            None
        );
        assert_eq!(
            e.disconnected_client(
                t,
                b"1700000000: Client victim closed its connection. x disconnected."
            ),
            Some("victim closed its connection. x".into())
        );
    }

    #[test]
    fn emqx_topics() {
        let e = ClientEvents::Emqx;
        assert_eq!(
            e.disconnected_client("$SYS/brokers/emqx@127.0.0.1/clients/c1/disconnected", b"{}"),
            Some("c1".into())
        );
        assert_eq!(
            e.disconnected_client("$SYS/brokers/n/clients/c1/connected", b"{}"),
            None
        );
    }
}
