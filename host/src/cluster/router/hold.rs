//! Requests waiting for a leader: held, sent to the next one, or answered
//! when none comes in time (503 if never sent to a leader, 408 if sent).

use std::time::Instant;

use tracing::{info, warn};

use super::{Effects, HOLD_BYTES, Now, Router, key_of};
use crate::{InboundMessage, Output};

/// Requests waiting for a leader.
pub(super) enum Held {
    Requests {
        at: Instant,
        messages: Vec<InboundMessage>,
        /// Sent to a leader before: their outcome is unknown.
        sent: bool,
    },
    Gone(Instant, String),
    /// This replica's new life: the registrations its earlier lives'
    /// connections made go (the guest's `replica-started`).
    Started(Instant),
    /// Inputs other than requests that another replica's clients sent to a
    /// group it does not hold (their disconnects, its new life: each with
    /// that replica's `via`), in the guest's encoding, served as an agent.
    Agent(Instant, Vec<u8>),
}

impl Held {
    pub(super) fn since(&self) -> Instant {
        match self {
            Held::Requests { at, .. }
            | Held::Gone(at, _)
            | Held::Started(at)
            | Held::Agent(at, _) => *at,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Held::Requests { messages, .. } => messages
                .iter()
                .map(crate::store::driver::message_bytes)
                .sum(),
            Held::Gone(_, id) => id.len(),
            Held::Started(_) => 16,
            Held::Agent(_, batch) => batch.len(),
        }
    }
}

impl Router {
    /// No leader any more: what was sent to the old one and not applied
    /// waits for the next like a request just received (sent to it when
    /// there is one; a 408 if none comes within [`Limits::hold`]: it may
    /// still be applied), and so do reads waiting for an index (a 503: they
    /// were never in the log).
    pub(super) fn hold_unapplied(&mut self, now: Now) {
        let mut sent: Vec<(Instant, InboundMessage)> = self
            .unapplied
            .drain()
            .map(|(k, t)| {
                // A copy in some log may be applied before it is sent again.
                self.resent.insert(now.at, k);
                (t.at, t.message)
            })
            .collect();
        self.unapplied_bytes.set(0);
        self.unapplied_topics.clear();
        self.reads_bytes.set(0);
        let mut reads: Vec<(Instant, InboundMessage)> = Vec::new();
        for (_, r) in self.reads.drain() {
            reads.extend(r.messages.into_iter().map(|m| (r.at, m)));
        }
        if sent.is_empty() && reads.is_empty() {
            return;
        }
        info!(
            requests = sent.len() + reads.len(),
            "no leader: requests not yet applied wait for the next one"
        );
        for (all, was_sent) in [(&mut sent, true), (&mut reads, false)] {
            all.sort_by_key(|(at, _)| *at);
            let messages: Vec<InboundMessage> = all.drain(..).map(|(_, m)| m).collect();
            for chunk in messages.chunks(crate::store::driver::MAX_BATCH) {
                self.hold(Held::Requests {
                    at: now.at,
                    messages: chunk.to_vec(),
                    sent: was_sent,
                });
            }
        }
    }

    pub(super) fn hold(&mut self, held: Held) {
        let bytes = held.bytes();
        if let Held::Requests { messages, .. } = &held {
            self.counts.held += messages.len() as u64;
        }
        if self.held_bytes.all() + bytes > HOLD_BYTES {
            // Past the bound: these get their answer at the next tick.
            warn!("requests waiting for a leader past {HOLD_BYTES} bytes: refused");
        }
        self.held_bytes.add(bytes);
        self.held.push_back(held);
    }

    /// Answers what waited [`Limits::hold`] for a leader (or is past the
    /// bytes held): 503 if it was never sent, 408 if it was.
    pub(super) fn answer_held(&mut self, now: Now, fx: &mut Effects) {
        let mut never = Vec::new();
        let mut unknown = Vec::new();
        while let Some(h) = self.held.front() {
            if now.at.saturating_duration_since(h.since()) < self.limits.hold
                && self.held_bytes.all() <= HOLD_BYTES
            {
                break;
            }
            let Some(h) = self.held.pop_front() else {
                break;
            };
            self.held_bytes.sub(h.bytes());
            if let Held::Requests { messages, sent, .. } = h {
                for m in messages {
                    let key = key_of(&m);
                    if key.as_ref().is_some_and(|k| self.answered.contains(k)) {
                        continue; // answered meanwhile
                    }
                    let tracked = key.as_ref().is_some_and(|k| self.untrack(k).is_some());
                    if sent || tracked {
                        if let Some(k) = key {
                            self.timed_out.insert(now.at, k);
                        }
                        unknown.push(m);
                    } else {
                        never.push(m);
                    }
                }
            }
        }
        let hold = self.limits.hold.as_secs().max(1);
        self.counts.unavailable += never.len() as u64;
        self.counts.unknown += unknown.len() as u64;
        for (messages, reply) in [
            (
                never,
                statestore_guest::HostReply::Unavailable(
                    "no leader among the state store replicas; not applied, retry".into(),
                ),
            ),
            (
                unknown,
                statestore_guest::HostReply::OutcomeUnknown {
                    message: "no leader among the state store replicas: sent, not applied yet; it may still be"
                        .into(),
                    waited_secs: hold,
                },
            ),
        ] {
            if messages.is_empty() {
                continue;
            }
            fx.replies.extend(
                messages
                    .iter()
                    .filter_map(|m| {
                        statestore_guest::StateMachine::host_reply(&self.config, m, now.ms, reply.clone())
                    })
                    .map(Output::Publish),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::{Effects, Limits, Notify, Now, Router, SharedBytes};
    use super::{HOLD_BYTES, Held};
    use crate::cluster::file::ReadPath;
    use crate::{Config, InboundMessage, Output};

    fn request(n: u64, bytes: usize) -> InboundMessage {
        InboundMessage {
            topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
            payload: vec![b'x'; bytes],
            qos: 1,
            response_topic: Some("clients/held/response".into()),
            correlation_data: Some(n.to_be_bytes().to_vec()),
            message_expiry_interval: Some(60),
            user_properties: vec![
                ("__ts".into(), "000000000000001:00000:held".into()),
                ("__protVer".into(), "1.0".into()),
            ],
            client_id: Some("held".into()),
            ..InboundMessage::default()
        }
    }

    fn router(id: u64, at: Instant) -> Router {
        let config = Config::default();
        let limits = Limits::default();
        Router::new(
            id,
            config,
            None,
            ReadPath::Index,
            Notify::Origin,
            limits,
            0,
            at,
        )
    }

    /// Two groups' routers of one replica (a store in partitions) hold
    /// requests against one bound: past it in all, the next to look
    /// answers its own at once (503: never sent), as one router would.
    #[test]
    fn the_requests_a_replicas_routers_hold_are_bounded_together() {
        let at = Instant::now();
        let now = Now { at, ms: 1_000 };
        let shared = SharedBytes::default();
        let (mut a, mut b) = (router(1, at), router(1, at));
        a.share(&shared);
        b.share(&shared);
        let big = HOLD_BYTES * 2 / 3;
        for (n, r) in [(1, &mut a), (2, &mut b)] {
            r.hold(Held::Requests {
                at,
                messages: vec![request(n, big)],
                sent: false,
            });
        }
        assert!(shared.total() > HOLD_BYTES, "{}", shared.total());
        let mut fx = Effects::default();
        b.answer_held(now, &mut fx);
        let statuses: Vec<&str> = fx
            .replies
            .iter()
            .filter_map(|o| match o {
                Output::Publish(p) => p.user_property("__stat"),
                _ => None,
            })
            .collect();
        assert_eq!(statuses, ["503"]);
        assert!(shared.total() <= HOLD_BYTES);
        // Alone, either would have been within its bound.
        let mut fx = Effects::default();
        a.answer_held(now, &mut fx);
        assert!(fx.replies.is_empty());
        drop(a);
        assert_eq!(shared.total(), 0);
    }
}
