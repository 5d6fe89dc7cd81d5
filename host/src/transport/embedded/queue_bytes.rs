//! Bytes queued per MQTT session in the embedded broker.
//!
//! rmqtt bounds a session's queue by message count only (`--max-queued`):
//! with 32 MiB packets, 1,000 queued messages could pin 32 GiB for one
//! stalled subscriber. Here every message routed to a session is weighed on
//! its way in (a wrapper around rmqtt's [`Shared`], which does the routing)
//! and weighed out when it leaves: written to the client (QoS 0),
//! acknowledged by it (QoS 1 and 2), dropped, or its session ends. A message
//! that would take a session past `--max-queued-mib`, or all sessions
//! together past `--max-queued-total-mib` (parked sessions hold their
//! queues too), is dropped for that session alone, as a full queue drops,
//! and counted; other subscribers of the same message still get it.
//!
//! The weight is the message's payload, topic and properties (the bytes a
//! session holds for it), plus a fixed overhead. An error in the count can
//! only loosen the bound for a while (a session whose id went away is
//! forgotten), never refuse a session that holds nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType};
use rmqtt::router::Router;
use rmqtt::session::Session;
use rmqtt::shared::{Entry, Shared};
use rmqtt::types::{
    ClientId, ForwardedCount, ForwardedRecipients, From, HealthInfo, Id, MsgID, NodeHealthStatus,
    NodeId, Publish, QoS, Reason, SessionStatus, SubRelation, SubRelations, SubsSearchParams,
    SubsSearchResult, SubscriptionOptions, To,
};

/// The reason given for a message dropped here (the `message_dropped` hook
/// sees it, and must not weigh that message out).
const OVER_BUDGET: &str = "the session's queue holds its limit of bytes (--max-queued-mib)";

/// Bytes a message takes beyond its payload, topic and properties.
const OVERHEAD: usize = 128;

/// What one message weighs in a session's queue.
pub(crate) fn weight(p: &Publish) -> usize {
    let props = p.properties.as_ref().map_or(0, |props| {
        props.correlation_data.as_ref().map_or(0, |c| c.len())
            + props.content_type.as_ref().map_or(0, |c| c.len())
            + props.response_topic.as_ref().map_or(0, |t| t.len())
            + props
                .user_properties
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
    });
    p.payload.len() + p.topic.len() + props + OVERHEAD
}

/// The bytes each session holds, and the limits: per session and in all.
#[derive(Debug)]
pub(crate) struct QueueBytes {
    max: usize,
    max_total: usize,
    held: Mutex<Held>,
    dropped: AtomicU64,
    /// The same count, for `--metrics`.
    counter: Option<prometheus::IntCounter>,
    /// Drops at the total bound, for `--metrics`.
    refusals: crate::transport::embedded::admission::Refusals,
}

#[derive(Debug, Default)]
struct Held {
    by_client: HashMap<ClientId, usize>,
    total: usize,
}

impl QueueBytes {
    /// At most `max` bytes a session and `max_total` in all; drops at a
    /// session's bound are counted in `counter` too, at the total bound in
    /// `refusals` (`queued_total`).
    pub fn new(
        max: usize,
        max_total: usize,
        counter: Option<prometheus::IntCounter>,
        refusals: crate::transport::embedded::admission::Refusals,
    ) -> Arc<QueueBytes> {
        Arc::new(QueueBytes {
            max,
            max_total,
            held: Mutex::new(Held::default()),
            dropped: AtomicU64::new(0),
            counter,
            refusals,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `w` bytes for `client` if it has room (a session holding
    /// nothing always has room for one message, unless all sessions
    /// together hold their bound).
    fn admit(&self, client: &ClientId, w: usize) -> bool {
        let mut held = self.held();
        let now = held.by_client.get(client).copied().unwrap_or(0);
        let over_session = now > 0 && now.saturating_add(w) > self.max;
        let over_total = held.total > 0 && held.total.saturating_add(w) > self.max_total;
        if over_session || over_total {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if over_session {
                if let Some(c) = &self.counter {
                    c.inc();
                }
            } else {
                self.refusals.count("queued_total");
            }
            return false;
        }
        held.by_client.insert(client.clone(), now.saturating_add(w));
        held.total = held.total.saturating_add(w);
        true
    }

    /// `client` no longer holds `w` bytes.
    fn release(&self, client: &ClientId, w: usize) {
        let mut held = self.held();
        if let Some(now) = held.by_client.get_mut(client) {
            let freed = w.min(*now);
            *now -= freed;
            if *now == 0 {
                held.by_client.remove(client);
            }
            held.total = held.total.saturating_sub(freed);
        }
    }

    /// `client`'s session ended.
    fn forget(&self, client: &ClientId) {
        let mut held = self.held();
        if let Some(freed) = held.by_client.remove(client) {
            held.total = held.total.saturating_sub(freed);
        }
    }

    /// Bytes `client`'s session holds now.
    #[cfg(test)]
    pub fn of(&self, client: &str) -> usize {
        self.held().by_client.get(client).copied().unwrap_or(0)
    }

    /// Bytes all sessions hold now.
    #[cfg(test)]
    pub fn total(&self) -> usize {
        self.held().total
    }

    /// Messages dropped because a session, or all of them, held the limit.
    #[cfg(test)]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// rmqtt's routing with [`QueueBytes`] admission before each session.
pub(crate) struct BoundedShared {
    inner: Box<dyn Shared>,
    scx: ServerContext,
    bytes: Arc<QueueBytes>,
}

impl BoundedShared {
    /// Wraps the server's routing (call once, before it serves).
    pub async fn install(scx: &ServerContext, bytes: Arc<QueueBytes>) {
        let mut shared = scx.extends.shared_mut().await;
        let placeholder: Box<dyn Shared> = Box::new(rmqtt::shared::DefaultShared::new(None));
        let inner = std::mem::replace(&mut *shared, placeholder);
        *shared = Box::new(BoundedShared {
            inner,
            scx: scx.clone(),
            bytes,
        });
    }
}

type Dropped = Vec<(To, From, Publish, Reason)>;

/// A relation that puts `publish` straight into `target`'s session, at the
/// message's own QoS.
fn direct(target: &ClientId, publish: &Publish) -> SubRelation {
    let mut opts = SubscriptionOptions::default();
    opts.set_qos(publish.qos);
    (publish.topic.clone(), target.clone(), opts, None, None)
}

impl BoundedShared {
    /// The relation by which a message for `target` alone (a reply)
    /// reaches it through its own subscriptions, read from its session
    /// rather than by walking the topic tree and every subscriber of the
    /// topic: the same as [`matches`] keeping `target`'s relation. One
    /// relation for all its matching (non-shared) subscriptions, at the
    /// highest of their QoS, with all their subscription identifiers;
    /// empty if none matches. A shared subscription of `target` is not
    /// used (a group's member is chosen by the group, and the message is
    /// for `target` whichever it would be). `None` when its session is
    /// not here or has an MQTT 3 subscription: then [`matches`] decides.
    async fn own_relations(&self, target: &ClientId, publish: &Publish) -> Option<SubRelations> {
        let session = self
            .inner
            .entry(Id::from(self.scx.node.id(), target.clone()))
            .session()?;
        let subs = session.subscriptions().await.ok()?;
        let subs = subs.read().await;
        let mut mine: Option<SubRelation> = None;
        for (filter, opts) in subs.iter() {
            if opts.is_v3() {
                return None;
            }
            if opts.has_shared_group() || !crate::auth::policy::matches(filter, &publish.topic) {
                continue;
            }
            match &mut mine {
                None => {
                    let ids = opts.subscription_identifier().map(|id| vec![id]);
                    mine = Some((filter.clone(), target.clone(), opts.clone(), ids, None));
                }
                Some((_, _, first, ids, _)) => {
                    if let Some(id) = opts.subscription_identifier() {
                        ids.get_or_insert_with(Vec::new).push(id);
                    }
                    if opts.qos() > first.qos() {
                        first.set_qos(opts.qos());
                    }
                }
            }
        }
        Some(mine.into_iter().collect())
    }
}

impl BoundedShared {
    /// Splits `relations` into those whose sessions can hold `publish` (its
    /// bytes now charged to them) and the dropped ones of sessions at their
    /// queue limit.
    fn admit(
        &self,
        from: &From,
        publish: &Publish,
        mut relations: SubRelations,
    ) -> (SubRelations, Dropped) {
        let w = weight(publish);
        let mut over = Vec::new();
        // In place: nothing moves unless a relation is dropped.
        relations.retain(|r| {
            // Only a session that exists can hold anything (a request's
            // copy goes to a client that cannot exist: nothing to weigh).
            if !self.inner.exist(&r.1) || self.bytes.admit(&r.1, w) {
                return true;
            }
            tracing::debug!(client_id = %r.1, topic = %publish.topic, bytes = w, "message dropped for a session at its queue limit");
            over.push((
                To::from(self.scx.node.id(), r.1.clone()),
                from.clone(),
                publish.clone(),
                Reason::from_static(OVER_BUDGET),
            ));
            false
        });
        (relations, over)
    }
}

/// The subscriptions on this node that `publish` reaches, one relation per
/// client; each at the highest QoS of that client's matching (non-shared)
/// subscriptions, as MQTT 5 asks (MQTT-3.3.4-2): rmqtt keeps the first
/// match's.
async fn matches(
    router: &dyn Router,
    scx: &ServerContext,
    from: &From,
    publish: &Publish,
) -> SubRelations {
    let mut relations = match router.matches(from.id.clone(), &publish.topic).await {
        Ok(mut map) => map.remove(&scx.node.id()).unwrap_or_default(),
        Err(e) => {
            tracing::warn!(topic = %publish.topic, error = %e, "cannot route a message");
            return SubRelations::default();
        }
    };
    // Only a relation below the message's QoS can gain from another
    // subscription, and only where more than one filter matches.
    if !relations
        .iter()
        .any(|(_, _, opts, _, group)| group.is_none() && opts.qos() < publish.qos)
    {
        return relations;
    }
    let filters = router.get(&publish.topic).await.unwrap_or_default();
    if filters.len() < 2 {
        return relations;
    }
    let all = router.relations();
    for (_, client, opts, _, group) in relations.iter_mut() {
        if group.is_some() || opts.is_v3() || opts.qos() >= publish.qos {
            continue;
        }
        let mut qos = opts.qos();
        for route in &filters {
            if let Some(subscribers) = all.get(&route.topic)
                && let Some((id, other)) = subscribers.get(client)
                && other.shared_group().is_none()
                && !(other.no_local() == Some(true) && *id == from.id)
                && other.qos() > qos
            {
                qos = other.qos();
            }
        }
        opts.set_qos(qos);
    }
    relations
}

#[async_trait::async_trait]
impl Shared for BoundedShared {
    fn entry(&self, id: Id) -> Box<dyn Entry> {
        self.inner.entry(id)
    }

    fn exist(&self, client_id: &str) -> bool {
        self.inner.exist(client_id)
    }

    /// rmqtt's own `forwards` (one node, no message store), routed through
    /// [`BoundedShared::forwards_to`].
    async fn forwards(
        &self,
        msg_id: Option<MsgID>,
        from: From,
        publish: Publish,
    ) -> Result<ForwardedCount, (ForwardedCount, Dropped)> {
        let router = self.scx.extends.router().await;
        let relations: SubRelations = match &publish.target_clientid {
            // What the store publishes for one client (a reply): routed as
            // any message, by that client's subscriptions alone, whoever
            // else's match (privacy by delivery); put straight into its
            // session if none of them matches (its reply is never lost).
            Some(target) if from.is_system() => {
                let mut mine = match self.own_relations(target, &publish).await {
                    Some(mine) => mine,
                    None => matches(&**router, &self.scx, &from, &publish)
                        .await
                        .into_iter()
                        .filter(|r| r.1 == *target)
                        .collect(),
                };
                if mine.is_empty() {
                    mine.push(direct(target, &publish));
                }
                mine
            }
            Some(target) => vec![direct(target, &publish)],
            None => matches(&**router, &self.scx, &from, &publish).await,
        };
        drop(router);
        if relations.is_empty() {
            return Ok(0);
        }
        match self
            .forwards_to_owned(from, publish, relations, msg_id)
            .await
        {
            Ok(recipients) => Ok(recipients.len()),
            Err((recipients, dropped)) => Err((recipients.len(), dropped)),
        }
    }

    async fn forwards_and_get_shareds(
        &self,
        from: From,
        publish: Publish,
    ) -> Result<(rmqtt::types::SubRelationsMap, ForwardedRecipients), (ForwardedRecipients, Dropped)>
    {
        self.inner.forwards_and_get_shareds(from, publish).await
    }

    async fn forwards_to(
        &self,
        from: From,
        publish: &Publish,
        relations: SubRelations,
        msg_id: Option<MsgID>,
    ) -> Result<ForwardedRecipients, (ForwardedRecipients, Dropped)> {
        // As many copies as the inner routing would make from a borrowed one.
        self.forwards_to_owned(from, publish.clone(), relations, msg_id)
            .await
    }

    async fn forwards_to_owned(
        &self,
        from: From,
        publish: Publish,
        relations: SubRelations,
        msg_id: Option<MsgID>,
    ) -> Result<ForwardedRecipients, (ForwardedRecipients, Dropped)> {
        let (admitted, over) = self.admit(&from, &publish, relations);
        let result = if admitted.is_empty() {
            Ok(Vec::new())
        } else {
            self.inner
                .forwards_to_owned(from, publish, admitted, msg_id)
                .await
        };
        // The messages dropped at a queue limit join what the inner
        // routing dropped.
        match (result, over.is_empty()) {
            (Ok(recipients), true) => Ok(recipients),
            (Ok(recipients), false) => Err((recipients, over)),
            (Err((recipients, mut dropped)), _) => {
                dropped.extend(over);
                Err((recipients, dropped))
            }
        }
    }

    async fn retain_load_with(
        &self,
        topic_filter: &rmqtt::types::TopicFilter,
        cb: Arc<dyn rmqtt::shared::RetainLoadCallback>,
    ) -> rmqtt::Result<Vec<(NodeId, MsgID)>> {
        self.inner.retain_load_with(topic_filter, cb).await
    }

    fn iter(&self) -> Box<dyn Iterator<Item = Box<dyn Entry>> + Sync + Send + '_> {
        self.inner.iter()
    }

    fn random_session(&self) -> Option<Session> {
        self.inner.random_session()
    }

    async fn session_status(&self, client_id: &str) -> Option<SessionStatus> {
        self.inner.session_status(client_id).await
    }

    async fn client_states_count(&self) -> usize {
        self.inner.client_states_count().await
    }

    fn sessions_count(&self) -> usize {
        self.inner.sessions_count()
    }

    async fn query_subscriptions(&self, q: &SubsSearchParams) -> Vec<SubsSearchResult> {
        self.inner.query_subscriptions(q).await
    }

    async fn subscriptions_count(&self) -> usize {
        self.inner.subscriptions_count().await
    }

    fn grpc_enable(&self) -> bool {
        self.inner.grpc_enable()
    }

    fn node_name(&self, id: NodeId) -> String {
        self.inner.node_name(id)
    }

    async fn check_health(&self) -> rmqtt::Result<HealthInfo> {
        self.inner.check_health().await
    }

    async fn health_status(&self) -> rmqtt::Result<NodeHealthStatus> {
        self.inner.health_status().await
    }

    fn operation_is_busy(&self) -> bool {
        self.inner.operation_is_busy()
    }
}

/// Weighs messages out of their sessions: the hooks for
/// `MessageDelivered`, `MessageAcked`, `MessageDropped` and
/// `SessionTerminated`.
/// Also counts the messages delivered, for `$SYS` (one hook per delivery,
/// not two).
pub(crate) struct QueueHooks(
    pub Arc<QueueBytes>,
    pub Arc<crate::transport::embedded::sys_topics::Counters>,
);

#[async_trait::async_trait]
impl Handler for QueueHooks {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        self.now(param, acc)
    }

    /// Every event is answered at once (no future to allocate).
    fn hook_now(
        &self,
        param: &Parameter,
        acc: Option<HookResult>,
    ) -> Result<ReturnType, Option<HookResult>> {
        Ok(self.now(param, acc))
    }
}

impl QueueHooks {
    fn now(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        if let Parameter::MessageDelivered(..) = param {
            self.1.sent.fetch_add(1, Ordering::Relaxed);
        }
        match param {
            // Written to the client: a QoS 0 message is gone; a QoS 1 or 2
            // one stays in flight until it is acknowledged.
            Parameter::MessageDelivered(session, _, p) if p.qos == QoS::AtMostOnce => {
                self.0.release(&session.id.client_id, weight(p));
            }
            Parameter::MessageAcked(session, _, p) => {
                self.0.release(&session.id.client_id, weight(p));
            }
            Parameter::MessageDropped(Some(to), _, p, reason) if !matches!(reason, Reason::Error(r) if r == OVER_BUDGET) =>
            {
                self.0.release(&to.client_id, weight(p));
            }
            Parameter::SessionTerminated(session, _) => self.0.forget(&session.id.client_id),
            _ => {}
        }
        (true, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_keeps_each_session_under_its_limit() {
        let q = QueueBytes::new(1000, usize::MAX, None, Default::default());
        let a = ClientId::from("a");
        let b = ClientId::from("b");
        // A session holding nothing takes one message of any size.
        assert!(q.admit(&a, 5000));
        assert!(!q.admit(&a, 1));
        assert!(q.admit(&b, 600));
        assert!(!q.admit(&b, 401));
        assert!(q.admit(&b, 400));
        assert_eq!(q.dropped(), 2);
        q.release(&a, 5000);
        assert_eq!(q.of("a"), 0);
        assert!(q.admit(&a, 10));
        q.forget(&b);
        assert_eq!(q.of("b"), 0);
        // More released than held (a message weighed in before a restart
        // of the count): never below zero.
        q.release(&a, 1_000_000);
        assert_eq!(q.of("a"), 0);
        assert_eq!(q.total(), 0);
    }

    #[test]
    fn all_sessions_together_stay_under_the_total() {
        let q = QueueBytes::new(1000, 2500, None, Default::default());
        let ids: Vec<ClientId> = ["a", "b", "c", "d"].map(ClientId::from).into();
        assert!(q.admit(&ids[0], 1000));
        assert!(q.admit(&ids[1], 1000));
        // The third session holds nothing, but all together are full.
        assert!(!q.admit(&ids[2], 600));
        assert!(q.admit(&ids[2], 500));
        assert_eq!(q.total(), 2500);
        q.forget(&ids[0]);
        assert!(q.admit(&ids[3], 1000));
        q.release(&ids[1], 1000);
        q.release(&ids[2], 500);
        q.release(&ids[3], 1000);
        assert_eq!(q.total(), 0);
        assert_eq!(q.dropped(), 1);
    }
}
