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

use std::net::SocketAddr;
use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::PublishProperties;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::session::SessionState;
use rmqtt::types::{ClientId, CodecPublish, From as MsgFrom, Id, Publish};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::driver::{Input, Transport, now_ms};
use crate::journal::Journal;
use crate::store::StoreOptions;
use crate::{InboundMessage, OutboundMessage, Output, PublishKind, Runtime, WasmStore};

/// A client id no client can have (MQTT client ids are never this long and
/// `$` ids are refused): routing a request copy to it drops the copy.
const CONSUMED: &str = "$statestore/consumed";

/// Largest packet the listener accepts and sends (the MQTT maximum).
const MAX_PACKET: u32 = 268_435_455;

/// Everything the embedded mode needs to know.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Where the broker listens.
    pub listen: SocketAddr,
    /// The store: node id, persistence.
    pub store: StoreOptions,
}

enum BrokerEvent {
    Request(InboundMessage),
    Gone(String),
}

/// The broker hooks: hand requests and disconnects to the driver.
struct Hooks {
    tx: mpsc::UnboundedSender<BrokerEvent>,
}

#[async_trait::async_trait]
impl Handler for Hooks {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        match param {
            Parameter::MessagePublish(_, from, publish)
                if from.is_custom() && publish.topic.as_ref() as &str == REQUEST_TOPIC =>
            {
                let message = inbound(from.id.client_id.as_ref(), publish);
                let _ = self.tx.send(BrokerEvent::Request(message));
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
                    let _ = self.tx.send(BrokerEvent::Gone(id));
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

/// An rmqtt PUBLISH for an output.
fn outbound(m: OutboundMessage) -> Publish {
    let properties = PublishProperties {
        topic_alias: None,
        correlation_data: m.correlation_data.map(Bytes::from),
        message_expiry_interval: m.message_expiry_interval.and_then(NonZeroU32::new),
        content_type: m.content_type.map(|t| t.into_owned().into()),
        user_properties: m
            .user_properties
            .into_iter()
            .map(|(n, v)| (n.into_owned().into(), v.into_owned().into()))
            .collect(),
        is_utf8_payload: m.payload_format_indicator == Some(1),
        response_topic: m.response_topic.map(Into::into),
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
        topic: m.topic.into(),
        packet_id: None,
        payload: Bytes::from(m.payload),
        properties: Some(properties),
    };
    Publish::from(codec).create_time(rmqtt::utils::timestamp_millis())
}

/// The broker with the store as its extension.
pub struct EmbeddedServer {
    store: WasmStore,
    journal: Option<Journal>,
    transport: BrokerTransport,
    local_addr: SocketAddr,
}

struct BrokerTransport {
    scx: ServerContext,
    events: mpsc::UnboundedReceiver<BrokerEvent>,
    accept: tokio::task::JoinHandle<()>,
    pending: Option<BrokerEvent>,
}

impl EmbeddedServer {
    /// Instantiates the component and starts the broker listening. Fails
    /// with a clear message if the address cannot be bound (port in use).
    pub async fn start(runtime: &Runtime, opts: EmbeddedOptions) -> Result<EmbeddedServer> {
        let (store, journal) = crate::store::open(runtime, &opts.store)?;
        let scx = ServerContext::new().busy_check_enable(false).build().await;
        let (tx, events) = mpsc::unbounded_channel();
        let register = scx.extends.hook_mgr().register();
        for t in [Type::MessagePublish, Type::ClientDisconnected] {
            register.add(t, Box::new(Hooks { tx: tx.clone() })).await;
        }
        register.start().await;
        let listener = Builder::new()
            .name("statestore/tcp")
            .laddr(opts.listen)
            .nodelay(true)
            .reuseaddr(Some(true))
            .max_packet_size(MAX_PACKET)
            .max_inflight(NonZeroU16::new(256).unwrap_or(NonZeroU16::MIN))
            .max_mqueue_len(100_000)
            // Do not give messages without an expiry one of 300 s.
            .message_expiry_interval(Duration::ZERO)
            .bind()
            .with_context(|| format!("cannot listen on {} (is the port in use?)", opts.listen))?
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
        info!(listen = %local_addr, "embedded MQTT broker listening; serving the state store");
        Ok(EmbeddedServer {
            store,
            journal,
            transport: BrokerTransport {
                scx,
                events,
                accept,
                pending: None,
            },
            local_addr,
        })
    }

    /// The address the broker listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then stops the broker.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let journal = self.journal.as_mut();
        crate::driver::drive(&mut self.store, journal, &mut self.transport, shutdown).await
    }
}

impl BrokerTransport {
    fn from(&self) -> MsgFrom {
        MsgFrom::from_system(Id::new(
            self.scx.node.id(),
            0,
            None,
            None,
            ClientId::from("$statestore"),
            None,
        ))
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
        let mut entry = self
            .scx
            .extends
            .shared()
            .await
            .entry(Id::from(self.scx.node.id(), ClientId::from(client)));
        if entry.exist()
            && let Err(e) = entry.kick(true, true, true).await
        {
            warn!(client_id = client, error = %e, "could not disconnect a client");
        }
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
                while let Ok(e) = self.events.try_recv() {
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

    async fn close(&mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
        let ids: Vec<ClientId> = {
            let shared = self.scx.extends.shared().await;
            shared.iter().map(|e| e.id().client_id.clone()).collect()
        };
        for id in ids {
            self.kick(&id).await;
        }
    }
}
