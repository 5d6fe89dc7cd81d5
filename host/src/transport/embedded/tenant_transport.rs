//! One tenant's side of the broker: its requests in (bounded in bytes),
//! its replies and notifications out, each reply to its requester alone.
//! A single process runs one [`BrokerTransport`] per tenant; a cluster
//! replica serves every tenant's clients from one loop, through one
//! [`ReplicaTransport`].

use super::*;

/// One tenant's side of the broker: where its store's outputs go.
pub(super) struct Side {
    pub(super) scx: ServerContext,
    /// Its tenant's index (the store's publishes say whose they are).
    pub(super) tenant: usize,
    /// The inbound budget of the requests being handled.
    pub(super) permits: Vec<OwnedSemaphorePermit>,
    /// Who sent the requests not answered yet: their replies go to them
    /// alone.
    pub(super) requesters: Requesters,
    /// Who the store's publishes of this tenant are from (made once: it
    /// is the same for every reply).
    sender: MsgFrom,
}

/// What the broker's hooks hand over, each event with its tenant: one
/// tenant's in a single process, every tenant's for a replica.
pub(super) struct Receiving {
    pub(super) events: mpsc::UnboundedReceiver<(usize, BrokerEvent)>,
    pub(super) pending: Option<(usize, BrokerEvent)>,
}

impl Receiving {
    pub(super) fn new(events: mpsc::UnboundedReceiver<(usize, BrokerEvent)>) -> Receiving {
        Receiving {
            events,
            pending: None,
        }
    }

    async fn recv(&mut self) -> Option<(usize, BrokerEvent)> {
        match self.pending.take() {
            Some(e) => Some(e),
            None => self.events.recv().await,
        }
    }

    /// `event` (of `side`'s tenant) as the store's input: a request with
    /// the requests of the same tenant already waiting behind it, as one
    /// batch.
    fn input(&mut self, event: BrokerEvent, side: &mut Side) -> Received {
        match event {
            BrokerEvent::Request(first, permit) => {
                let mut bytes = message_bytes(&first);
                // One reading of the clock for the batch.
                let now = Instant::now();
                side.requesters.sweep(now);
                side.requesters.add(&first, now);
                let mut batch = vec![first];
                // Their budget is given back once the batch is handled.
                side.permits.extend(permit);
                while batch.len() < MAX_BATCH
                    && bytes < MAX_BATCH_BYTES
                    && let Ok(e) = self.events.try_recv()
                {
                    match e {
                        (t, BrokerEvent::Request(m, permit)) if t == side.tenant => {
                            bytes += message_bytes(&m);
                            side.requesters.add(&m, now);
                            batch.push(m);
                            side.permits.extend(permit);
                        }
                        other => {
                            self.pending = Some(other);
                            break;
                        }
                    }
                }
                Received::Messages(batch)
            }
            BrokerEvent::Gone(id) => Received::ClientGone(id),
        }
    }
}

/// One tenant's side of the broker and its events: a single process's
/// tenant.
pub(super) struct BrokerTransport {
    pub(super) side: Side,
    pub(super) rx: Receiving,
}

/// Every tenant's side of the broker, for the one loop of a cluster
/// replica: the input it hands over is of [`Transport::tenant`], and
/// outputs go back to the tenant whose store made them.
pub(super) struct ReplicaTransport {
    pub(super) sides: Vec<Side>,
    pub(super) rx: Receiving,
    /// The tenant of the last input.
    pub(super) current: usize,
    /// The broker's routes (a tenant added while running joins them).
    pub(super) table: Arc<std::sync::RwLock<super::router::Table>>,
    /// The one channel every tenant's events come through.
    pub(super) tx: mpsc::UnboundedSender<(usize, BrokerEvent)>,
    /// A tenant's inbound budget, bytes.
    pub(super) total: usize,
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
pub(super) struct Requesters {
    pub(super) waiting: HashMap<Vec<u8>, Vec<Requester>>,
    pub(super) topics: std::hash::RandomState,
    pub(super) count: usize,
    pub(super) swept: Option<Instant>,
}

/// One request waiting for its reply.
pub(super) struct Requester {
    pub(super) topic: u64,
    pub(super) client: ClientId,
    pub(super) at: Instant,
}

impl Requesters {
    /// Most requests remembered at once.
    const MAX: usize = 100_000;
    /// How long an unanswered request is remembered.
    const MAX_AGE: Duration = Duration::from_secs(120);

    /// Remembers the requester of `m`, which came at `now` (call
    /// [`Requesters::sweep`] first).
    pub(super) fn add(&mut self, m: &InboundMessage, now: Instant) {
        use std::hash::BuildHasher;
        let (Some(topic), Some(client)) = (&m.response_topic, &m.client_id) else {
            return;
        };
        if self.count >= Self::MAX {
            return;
        }
        self.count += 1;
        let key = m.correlation_data.clone().unwrap_or_default();
        self.waiting.entry(key).or_default().push(Requester {
            topic: self.topics.hash_one(topic.as_str()),
            client: ClientId::from(client.as_str()),
            at: now,
        });
    }

    /// The requester of the reply `m` (the earliest, if several requests
    /// share its correlation data and topic), forgotten.
    pub(super) fn take(&mut self, m: &OutboundMessage) -> Option<ClientId> {
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
    pub(super) fn sweep(&mut self, now: Instant) {
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

impl Side {
    pub(super) fn new(scx: ServerContext, tenant: usize) -> Side {
        Side {
            sender: system_from(&scx, Some(tenant)),
            scx,
            tenant,
            permits: Vec::new(),
            requesters: Requesters::default(),
        }
    }

    pub(super) fn from(&self) -> MsgFrom {
        self.sender.clone()
    }

    /// Puts a notification straight into `client`'s session, whatever its
    /// subscriptions (the .NET SDK's filter never matches, spec §2.3).
    async fn deliver_to(&self, client: &str, m: OutboundMessage, created: i64) {
        let entry = {
            let shared = self.scx.extends.shared().await;
            if !shared.exist(client) {
                debug!(client_id = client, "no session to notify");
                return;
            }
            shared.entry(Id::from(self.scx.node.id(), ClientId::from(client)))
        };
        if let Err((_, _, reason)) = entry.publish(self.from(), outbound(m, created)).await {
            debug!(client_id = client, %reason, "notification not delivered");
        }
    }

    async fn kick(&self, client: &str) {
        kick(&self.scx, client).await;
    }

    /// Carries out the tenant's store's outputs, in order.
    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        // The outputs of one call were made together.
        let created = rmqtt::utils::timestamp_millis();
        for o in outputs {
            match o {
                Output::Publish(m) if m.kind == PublishKind::Notification => {
                    match m.target_client.clone() {
                        Some(client) => self.deliver_to(&client, m, created).await,
                        None => warn!(topic = %m.topic, "notification without a target client"),
                    }
                }
                Output::Publish(m) => {
                    let requester = match self.requesters.take(&m) {
                        Some(r) => Some(r),
                        None => {
                            let shared = self.scx.extends.shared().await;
                            crate::auth::isolation::reply_owner(&m.topic, |id| shared.exist(id))
                                .map(|id| ClientId::from(id.as_str()))
                        }
                    };
                    let Some(requester) = requester else {
                        debug!(topic = %m.topic, "a reply whose requester is not known is not delivered");
                        continue;
                    };
                    let mut publish = outbound(m, created);
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
}

impl Transport for BrokerTransport {
    type Event = (usize, BrokerEvent);

    async fn recv(&mut self) -> Option<(usize, BrokerEvent)> {
        self.rx.recv().await
    }

    async fn on_event(&mut self, (_, event): (usize, BrokerEvent)) -> Result<Option<Received>> {
        Ok(Some(self.rx.input(event, &mut self.side)))
    }

    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        self.side.emit(outputs).await
    }

    /// The broker acknowledged each request when it was handed over; its
    /// bytes leave the tenant's inbound budget now.
    async fn settle(&mut self) -> Result<()> {
        self.side.permits.clear();
        Ok(())
    }

    /// The server closes the broker once every tenant has stopped.
    async fn close(&mut self) {}
}

impl Transport for ReplicaTransport {
    type Event = (usize, BrokerEvent);

    async fn recv(&mut self) -> Option<(usize, BrokerEvent)> {
        self.rx.recv().await
    }

    fn try_recv(&mut self) -> Option<(usize, BrokerEvent)> {
        self.rx
            .pending
            .take()
            .or_else(|| self.rx.events.try_recv().ok())
    }

    async fn on_event(&mut self, (t, event): (usize, BrokerEvent)) -> Result<Option<Received>> {
        let Some(side) = self.sides.get_mut(t) else {
            return Ok(None);
        };
        self.current = t;
        Ok(Some(self.rx.input(event, side)))
    }

    fn tenant(&self) -> usize {
        self.current
    }

    async fn emit(&mut self, outputs: Vec<Output>) -> Result<()> {
        self.emit_to(self.current, outputs).await
    }

    async fn emit_to(&mut self, tenant: usize, outputs: Vec<Output>) -> Result<()> {
        match self.sides.get_mut(tenant) {
            Some(side) => side.emit(outputs).await,
            None => Err(anyhow!(
                "outputs of tenant {tenant}, which this broker does not serve"
            )),
        }
    }

    /// The last input's bytes leave its tenant's inbound budget.
    async fn settle(&mut self) -> Result<()> {
        if let Some(side) = self.sides.get_mut(self.current) {
            side.permits.clear();
        }
        Ok(())
    }

    /// The tenant's side, then its route: from then on its clients'
    /// requests reach it (a client connected before, of another tenant or
    /// none, is taken as the new tenant's once the route matches it).
    async fn add_tenant(
        &mut self,
        tenant: usize,
        reach: crate::store::driver::Reach,
    ) -> Result<()> {
        // `()`: a place kept for a tenant removed before it was served.
        let route = match reach.downcast::<super::Route>() {
            Ok(route) => *route,
            Err(reach) if reach.is::<()>() => super::Route::default(),
            Err(_) => return Err(anyhow!("the embedded broker serves a tenant by its route")),
        };
        if tenant != self.sides.len() {
            return Err(anyhow!(
                "tenant {tenant} added after {} tenants",
                self.sides.len()
            ));
        }
        let scx = self.sides[0].scx.clone();
        self.sides.push(Side::new(scx, tenant));
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if route.default && table.default.is_none() {
            table.default = Some(tenant);
        }
        table.routes.push(route);
        table.tenants.push(super::Inbound {
            tenant,
            tx: self.tx.clone(),
            budget: Arc::new(tokio::sync::Semaphore::new(self.total)),
            total: self.total,
        });
        Ok(())
    }

    /// Its route takes no client from then on (the route keeps its place:
    /// a tenant's number is its place); its clients are of no tenant.
    async fn remove_tenant(&mut self, tenant: usize) -> Result<()> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let Some(route) = table.routes.get_mut(tenant) else {
            return Err(anyhow!("no tenant {tenant} to remove"));
        };
        *route = super::Route::default();
        if table.default == Some(tenant) {
            table.default = None;
        }
        Ok(())
    }

    async fn close(&mut self) {}
}
