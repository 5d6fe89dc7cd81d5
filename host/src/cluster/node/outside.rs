//! What a replica does for the groups it does not hold (the cluster file's
//! `copies` below its replicas: see [`crate::cluster::placement`]), and for
//! the replicas that do not hold its groups.
//!
//! A client may connect to any replica and use any key. What it sends to
//! a group its replica does not hold goes to one of the group's holders,
//! its *agent* (the first of them, in order from the group's place, that
//! has not been reported unreachable lately; link frame kind 12), which
//! serves it as its own clients' (its router holds, proposes or forwards
//! it, answers 503 or 408 when no leader comes, reads with a read index)
//! and sends its answer back (kind 13), which the client's replica
//! publishes. The group's leader sends the replicas that do not hold it
//! every notification it applies (kind 13), each of which hands them to its
//! broker, which delivers those whose observer is connected there. The
//! client's disconnects and the replica's new life go to the agent too
//! (`disconnected-via`, `replica-started`, with the `via` of the client's
//! replica), so its registrations go with its connection as anywhere.
//!
//! A request sent to an agent is kept until its answer comes back (for
//! [`RESEND_WITHIN`], within a byte bound): if the agent is reported
//! unreachable meanwhile, it goes to the next one (a write applied twice is
//! answered alike from the dedup cache, and the first answer to come back
//! is the one published).
//!
//! What this costs against a group held everywhere: a request and its
//! answer take one more trip between replicas; a request whose answer does
//! not come back within [`RESEND_WITHIN`] gets none from this replica (its
//! client times out); notifications around a change of the group's leader
//! may be lost or come twice (as with `--broker`, where the leader
//! publishes them).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use statestore_guest::{Via, wire};
use tracing::warn;

use crate::cluster::net::Links;
use crate::cluster::net::shipped;
pub(super) use crate::cluster::net::shipped::Served;
use crate::cluster::placement::Placement;
use crate::cluster::router::Effects;
use crate::store::driver::Transport;
use crate::{InboundMessage, Input, Output, PublishKind};

use super::Node;

/// A peer reported unreachable within this long is not chosen as agent.
const DOWN_FOR: Duration = Duration::from_secs(2);

/// How long an agent remembers whose request it serves (longer than a
/// request waits for a leader, and is sent again to a new one).
const SERVED_FOR: Duration = Duration::from_secs(60);

/// The most requests (and clients) an agent remembers at once; past it,
/// one more is not served (its client gets no answer and sends it again).
const SERVED_MAX: usize = 100_000;

/// The most outputs waiting to be published for this replica's clients.
const INBOX_MAX: usize = 100_000;

/// How long a request sent to an agent is kept to be sent to another if
/// that one is reported unreachable before it answers.
pub(super) const RESEND_WITHIN: Duration = Duration::from_secs(10);

/// A request its agent has not answered within this long goes to the next
/// of the group's holders too (an agent answers within moments, or, with no
/// leader, within the 5 s its router holds a request: a dead one whose link
/// has carried nothing since is not yet reported unreachable).
const SILENT: Duration = Duration::from_secs(3);

/// The most bytes of requests kept so.
const PENDING_BYTES: usize = 64 << 20;

/// A request sent to an agent, until its answer comes back.
#[derive(Debug)]
struct Pending {
    group: u32,
    /// The agent it was sent to last.
    agent: u64,
    /// When it was first sent.
    at: Instant,
    /// When it was sent last.
    sent: Instant,
    /// Sent to more than one agent: both may answer.
    resent: bool,
    message: InboundMessage,
}

/// A request's identity: its response topic and correlation data.
type Key = (String, Vec<u8>);

/// See the module's doc.
#[derive(Debug)]
pub(super) struct Outside {
    /// This replica's id.
    me: u64,
    /// This replica's `via` (embedded broker), carried by its clients'
    /// requests.
    via: Option<Via>,
    /// Peers reported unreachable, and when last.
    down: HashMap<u64, Instant>,
    /// As an agent: the requests of other replicas' clients it serves, by
    /// group, and the replica each came from (and when).
    served: HashMap<(u32, Key), (u64, Instant)>,
    /// As an agent: the clients of other replicas it serves, by group (a
    /// violation of theirs goes back to their replica, and is not carried
    /// out on a client of the same name here).
    clients: HashMap<(u32, String), (u64, Instant)>,
    /// The agent each group it does not hold was last told of this
    /// replica's life.
    told: HashMap<u32, u64>,
    /// Answers and notifications for this replica's clients, by group, to
    /// publish.
    inbox: Vec<(u32, Vec<Output>)>,
    inbox_len: usize,
    /// Requests sent to agents and not yet answered, by key.
    pending: HashMap<Key, Pending>,
    pending_bytes: usize,
    /// Requests sent to more than one agent and answered lately: a later
    /// answer is not published.
    answered: HashMap<Key, Instant>,
    /// A peer was reported unreachable since the last tick: the requests
    /// sent to it go to the next agent.
    recheck: bool,
    /// Ticks until the agents are looked at again.
    look_in: u32,
    warned: Option<Instant>,
    /// `statestore_cluster_agent_total`, with `--metrics`.
    pub(super) metrics: Option<prometheus::IntCounterVec>,
}

impl Outside {
    pub(super) fn new(me: u64, via: Option<Via>) -> Outside {
        Outside {
            me,
            via,
            down: HashMap::new(),
            served: HashMap::new(),
            clients: HashMap::new(),
            told: HashMap::new(),
            inbox: Vec::new(),
            inbox_len: 0,
            pending: HashMap::new(),
            pending_bytes: 0,
            answered: HashMap::new(),
            recheck: false,
            look_in: 0,
            warned: None,
            metrics: None,
        }
    }

    fn count(&self, what: &str, n: usize) {
        if let Some(m) = &self.metrics {
            m.with_label_values(&[what]).inc_by(n as u64);
        }
    }

    /// A link to `peer` failed.
    pub(super) fn unreachable(&mut self, peer: u64) {
        self.down.insert(peer, Instant::now());
        self.recheck |= self.pending.values().any(|p| p.agent == peer);
    }

    fn agent(&self, g: u32, placement: &Placement) -> Option<u64> {
        let down = &self.down;
        placement.agent(g, |h| down.get(&h).is_none_or(|t| t.elapsed() > DOWN_FOR))
    }

    /// Sends this replica's new life to `g`'s agent, unless it was the one
    /// told last; the agent, if there is one.
    fn tell(&mut self, g: u32, placement: &Placement, links: &Links) -> Option<u64> {
        let agent = self.agent(g, placement)?;
        if let Some(via) = self.via
            && self.told.get(&g) != Some(&agent)
        {
            let batch = wire::encode_batch(&[Input::ReplicaStarted(via)]);
            links.agent(g, agent, shipped::encode_inputs(&batch));
            self.told.insert(g, agent);
        }
        Some(agent)
    }

    /// This replica's clients' `messages` for group `g`, which it does not
    /// hold: to its agent.
    pub(super) fn send_requests(
        &mut self,
        g: u32,
        mut messages: Vec<InboundMessage>,
        placement: &Placement,
        links: &Links,
    ) {
        let Some(agent) = self.tell(g, placement, links) else {
            return;
        };
        let now = Instant::now();
        for m in &mut messages {
            m.via = self.via;
            if !crate::cluster::router::answered_at_all(m) {
                continue; // never answered: nothing to wait for
            }
            let (Some(topic), Some(corr)) = (&m.response_topic, &m.correlation_data) else {
                continue;
            };
            let bytes = crate::store::driver::message_bytes(m);
            let key = (topic.clone(), corr.clone());
            if self.pending_bytes + bytes > PENDING_BYTES || self.pending.contains_key(&key) {
                continue;
            }
            self.pending_bytes += bytes;
            self.pending.insert(
                key,
                Pending {
                    group: g,
                    agent,
                    at: now,
                    sent: now,
                    resent: false,
                    message: m.clone(),
                },
            );
        }
        self.count("sent", messages.len());
        links.agent(g, agent, shipped::encode_requests(&messages));
    }

    /// The requests sent to an agent that was reported unreachable since:
    /// to the next one; those kept too long, forgotten.
    fn resend(&mut self, placement: &Placement, links: &Links) {
        self.pending.retain(|_, p| p.at.elapsed() < RESEND_WITHIN);
        self.answered.retain(|_, t| t.elapsed() < RESEND_WITHIN);
        self.pending_bytes = self
            .pending
            .values()
            .map(|p| crate::store::driver::message_bytes(&p.message))
            .sum();
        let mut again: HashMap<(u32, u64), Vec<InboundMessage>> = HashMap::new();
        let down = &self.down;
        let is_down = |h: u64| down.get(&h).is_some_and(|t| t.elapsed() <= DOWN_FOR);
        for p in self.pending.values_mut() {
            let next = if is_down(p.agent) {
                placement.agent(p.group, |h| !is_down(h))
            } else if p.sent.elapsed() > SILENT {
                // The holder after the silent one, from the group's place.
                let hosts = placement.hosts(p.group);
                let at = hosts.iter().position(|&h| h == p.agent).unwrap_or(0);
                (1..hosts.len())
                    .map(|k| hosts[(at + k) % hosts.len()])
                    .find(|&h| !is_down(h))
            } else {
                None
            };
            if let Some(next) = next.filter(|&n| n != p.agent) {
                p.agent = next;
                p.sent = Instant::now();
                p.resent = true;
                again
                    .entry((p.group, next))
                    .or_default()
                    .push(p.message.clone());
            }
        }
        let resent: usize = again.values().map(Vec::len).sum();
        self.count("resent", resent);
        for ((g, agent), messages) in again {
            tracing::info!(
                group = g,
                agent,
                requests = messages.len(),
                "requests an agent did not answer (reported unreachable, or silent) go to the next"
            );
            links.agent(g, agent, shipped::encode_requests(&messages));
        }
    }

    /// A client of this replica that may have registered in group `g`
    /// (not held here) went away: to its agent.
    pub(super) fn send_gone(&mut self, g: u32, client: &str, placement: &Placement, links: &Links) {
        let Some(agent) = self.tell(g, placement, links) else {
            return;
        };
        let batch = match self.via {
            Some(via) => wire::encode_batch(&[Input::DisconnectedVia(client, via)]),
            None => wire::encode_batch(&[Input::Disconnected(client)]),
        };
        links.agent(g, agent, shipped::encode_inputs(&batch));
    }

    /// Once a second: every group not held here whose agent changed hears
    /// of this replica's life from the new one; what the agent remembers
    /// ages.
    pub(super) fn tick(&mut self, placement: &Placement, count: u32, links: &Links) {
        if placement.everywhere() {
            return;
        }
        if std::mem::take(&mut self.recheck) {
            self.resend(placement, links);
        }
        self.look_in = self.look_in.saturating_sub(1);
        if self.look_in > 0 {
            return;
        }
        self.look_in = 20;
        let me = self.me;
        for g in (0..count).filter(|&g| !placement.holds(me, g)) {
            self.tell(g, placement, links);
        }
        self.resend(placement, links);
        self.down.retain(|_, t| t.elapsed() <= DOWN_FOR);
        self.served.retain(|_, (_, t)| t.elapsed() < SERVED_FOR);
        self.clients.retain(|_, (_, t)| t.elapsed() < SERVED_FOR);
    }

    fn refuse(&mut self, from: u64, g: u32, why: &str) {
        if self
            .warned
            .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            self.warned = Some(Instant::now());
            warn!(
                peer = from,
                group = g,
                why,
                "what a replica's clients sent through it to a group it does not hold: dropped"
            );
        }
    }

    /// What replica `from` sent this one (holding group `g`) to serve as
    /// its agent: the requests or inputs to serve, if they are `from`'s to
    /// send (every `via` its own, and `g` not one it holds).
    pub(super) fn serve(
        &mut self,
        g: u32,
        from: u64,
        body: &[u8],
        placement: &Placement,
    ) -> Option<Served> {
        if placement.holds(from, g) {
            self.refuse(from, g, "the sender holds the group");
            return None;
        }
        let served = match shipped::decode_served(body) {
            Ok(s) => s,
            Err(e) => {
                self.refuse(from, g, &format!("{e:#}"));
                return None;
            }
        };
        let ours = |via: Option<Via>| via.is_none_or(|v| v.replica == from);
        match &served {
            Served::Requests(messages) => {
                if !messages.iter().all(|m| ours(m.via)) {
                    self.refuse(from, g, "a request through another replica");
                    return None;
                }
                if self.served.len() + messages.len() > SERVED_MAX
                    || self.clients.len() + messages.len() > SERVED_MAX
                {
                    self.served.retain(|_, (_, t)| t.elapsed() < SERVED_FOR);
                    self.clients.retain(|_, (_, t)| t.elapsed() < SERVED_FOR);
                    if self.served.len() + messages.len() > SERVED_MAX {
                        self.refuse(from, g, "too many requests served at once");
                        return None;
                    }
                }
                self.count("served", messages.len());
                let now = Instant::now();
                for m in messages {
                    if let (Some(topic), Some(corr)) = (&m.response_topic, &m.correlation_data) {
                        self.served
                            .insert((g, (topic.clone(), corr.clone())), (from, now));
                    }
                    if let Some(c) = &m.client_id {
                        self.clients.insert((g, c.clone()), (from, now));
                    }
                }
            }
            Served::Inputs(batch) => {
                let fine = wire::decode_batch(batch).is_ok_and(|inputs| {
                    inputs.iter().all(|i| match i {
                        wire::InputRef::DisconnectedVia(_, via)
                        | wire::InputRef::ReplicaStarted(via) => via.replica == from,
                        wire::InputRef::Disconnected(_) => self.via.is_none(),
                        wire::InputRef::Message(_) => false,
                    })
                });
                if !fine {
                    self.refuse(
                        from,
                        g,
                        "inputs that are not its clients' disconnects or its life",
                    );
                    return None;
                }
            }
        }
        Some(served)
    }

    /// Of group `g`'s `replies` (about to be published here), those for
    /// the requests and clients of other replicas this one serves go back
    /// to them.
    pub(super) fn served_replies(&mut self, g: u32, replies: &mut Vec<Output>, links: &Links) {
        if self.served.is_empty() && self.clients.is_empty() {
            return;
        }
        let mut back: HashMap<u64, Vec<Output>> = HashMap::new();
        let mut kept = Vec::with_capacity(replies.len());
        for o in replies.drain(..) {
            let to = match &o {
                Output::Publish(m) if m.kind == PublishKind::Response => {
                    let corr = m.correlation_data.as_deref().unwrap_or_default();
                    self.served
                        .remove(&(g, (m.topic.to_string(), corr.to_vec())))
                        .map(|(to, _)| to)
                }
                Output::Violation {
                    client_id: Some(c), ..
                } => self.clients.get(&(g, c.clone())).map(|(to, _)| *to),
                _ => None,
            };
            match to {
                Some(to) => back.entry(to).or_default().push(o),
                None => kept.push(o),
            }
        }
        *replies = kept;
        self.count("shipped", back.values().map(Vec::len).sum());
        for (to, outputs) in back {
            links.ship(g, to, shipped::encode(&outputs));
        }
    }

    /// Replies and notifications of group `g` that replica `from` sent for
    /// this replica's clients: kept to be published, if `from` holds `g`
    /// and this replica does not.
    pub(super) fn shipped(
        &mut self,
        g: u32,
        from: u64,
        outputs: Vec<Output>,
        placement: &Placement,
    ) {
        if !placement.holds(from, g) || placement.holds(self.me, g) {
            self.refuse(
                from,
                g,
                "answers of a group it does not hold, or this one does",
            );
            return;
        }
        if self.inbox_len + outputs.len() > INBOX_MAX {
            self.refuse(from, g, "too many answers waiting to be published");
            return;
        }
        // Answered: not to be sent again, and answered once (a copy sent
        // to another agent may answer too).
        let outputs: Vec<Output> = outputs
            .into_iter()
            .filter(|o| match o {
                Output::Publish(m) if m.kind == PublishKind::Response => {
                    let corr = m.correlation_data.as_deref().unwrap_or_default();
                    let key = (m.topic.to_string(), corr.to_vec());
                    match self.pending.remove(&key) {
                        Some(p) => {
                            self.pending_bytes = self
                                .pending_bytes
                                .saturating_sub(crate::store::driver::message_bytes(&p.message));
                            if p.resent {
                                self.answered.insert(key, Instant::now());
                            }
                            true
                        }
                        // Not kept (past the bound, or too long), or a
                        // second answer.
                        None => !self.answered.contains_key(&key),
                    }
                }
                _ => true,
            })
            .collect();
        self.inbox_len += outputs.len();
        self.count("received", outputs.len());
        self.inbox.push((g, outputs));
    }

    /// What came back for this replica's clients, to publish now.
    pub(super) fn take_inbox(&mut self) -> Vec<(u32, Vec<Output>)> {
        self.inbox_len = 0;
        std::mem::take(&mut self.inbox)
    }
}

impl Node {
    /// Carries out what waited for a transport: the effects of serving
    /// other replicas' clients, and what came back for this one's.
    pub(super) async fn outside_round<T: Transport>(
        &mut self,
        transport: &mut T,
    ) -> anyhow::Result<()> {
        for (g, fx) in std::mem::take(&mut self.waiting) {
            self.carry_out(transport, g, fx).await?;
        }
        for (g, outputs) in self.outside.take_inbox() {
            let t = (g / self.per) as usize;
            self.published(t, &outputs);
            transport.emit_to(t, outputs).await?;
        }
        Ok(())
    }

    /// What replica `from`'s clients sent to group `g` (not held there,
    /// held here): served as this replica's own clients' (see
    /// the module's doc).
    pub(super) fn agent_for(&mut self, g: u32, from: u64, body: &[u8]) {
        let Some(served) = self.outside.serve(g, from, body, &self.placement) else {
            return;
        };
        let now = self.now();
        let Some(group) = self.group(g, from) else {
            return;
        };
        let mut fx = Effects::default();
        let result = match served {
            Served::Requests(messages) => {
                group
                    .router
                    .agent_requests(now, messages, &mut group.replica, &mut fx)
            }
            Served::Inputs(batch) => {
                group
                    .router
                    .agent_inputs(now, batch, &mut group.replica, &mut fx);
                Ok(())
            }
        };
        if let Err(e) = result {
            warn!(peer = from, group = g, error = %format!("{e:#}"), "serving another replica's clients");
        }
        self.waiting.push((g, fx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(n: usize, via: u64) -> InboundMessage {
        InboundMessage {
            topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
            qos: 1,
            response_topic: Some(format!("clients/c{n}/reply")),
            correlation_data: Some(n.to_le_bytes().to_vec()),
            client_id: Some(format!("c{n}")),
            via: Some(Via {
                replica: via,
                started: 1,
            }),
            ..InboundMessage::default()
        }
    }

    /// An agent serves only what a replica not holding the group sends for
    /// its own clients, and remembers at most `SERVED_MAX` requests; a
    /// replica keeps at most `INBOX_MAX` outputs shipped to it, and only
    /// from a holder of a group it does not hold.
    #[test]
    fn agents_serve_only_their_senders_clients_within_bounds() {
        // 4 replicas, 3 copies: group 1 on 2, 3, 4; replica 1 does not hold it.
        let placement = Placement::new(&[1, 2, 3, 4], Some(3));
        let mut agent = Outside::new(2, None);
        let mine = shipped::encode_requests(&[request(0, 1)]);
        assert!(agent.serve(1, 1, &mine, &placement).is_some());
        let forged = shipped::encode_requests(&[request(1, 3)]);
        assert!(
            agent.serve(1, 1, &forged, &placement).is_none(),
            "another replica's"
        );
        assert!(
            agent.serve(1, 3, &forged, &placement).is_none(),
            "a holder's"
        );
        assert!(agent.serve(1, 1, b"\x07", &placement).is_none(), "garbage");
        let batch: Vec<InboundMessage> = (1..SERVED_MAX).map(|n| request(n, 1)).collect();
        assert!(
            agent
                .serve(1, 1, &shipped::encode_requests(&batch), &placement)
                .is_some()
        );
        assert_eq!(agent.served.len(), SERVED_MAX);
        let one_more = shipped::encode_requests(&[request(SERVED_MAX, 1)]);
        assert!(
            agent.serve(1, 1, &one_more, &placement).is_none(),
            "past the bound"
        );
        assert_eq!(agent.served.len(), SERVED_MAX);

        let mut outsider = Outside::new(1, None);
        let reply = || Output::Violation {
            client_id: Some("c".into()),
            reason: "r".into(),
        };
        outsider.shipped(1, 3, vec![reply()], &placement);
        outsider.shipped(1, 1, vec![reply()], &placement); // not a holder
        outsider.shipped(0, 2, vec![reply()], &placement); // held here
        assert_eq!(outsider.take_inbox().len(), 1);
        outsider.shipped(1, 2, vec![reply(); INBOX_MAX], &placement);
        outsider.shipped(1, 2, vec![reply()], &placement);
        let kept: usize = outsider.take_inbox().iter().map(|(_, o)| o.len()).sum();
        assert_eq!(kept, INBOX_MAX, "past the bound: dropped");
    }
}
