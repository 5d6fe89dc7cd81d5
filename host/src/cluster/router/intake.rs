//! What reaches a router: its replica's clients' requests and departures,
//! another replica's clients' (as their agent, see `super::super::node`),
//! and requests a follower forwarded to this replica as leader.

use anyhow::Result;
use statestore_guest::wire;
use tracing::warn;

use super::hold::Held;
use super::{Effects, Now, Router, key_of};
use crate::cluster::Replica;
use crate::{Backend, InboundMessage};

impl Router {
    /// Requests a client sent through this replica.
    pub fn requests<B: Backend>(
        &mut self,
        now: Now,
        mut messages: Vec<InboundMessage>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        for m in &mut messages {
            m.via = self.via;
        }
        if !self.gone.is_empty() {
            // Back through this replica: its disconnect is not to be
            // reported again.
            for m in &messages {
                if let Some(c) = &m.client_id {
                    self.gone.remove(c);
                }
            }
        }
        self.take(now, messages, replica, fx)
    }

    /// Requests another replica's clients sent to this group, which that
    /// replica does not hold: served as this replica's own clients' (each
    /// keeps the `via` of the replica it came through; the caller sends
    /// their answers there).
    pub fn agent_requests<B: Backend>(
        &mut self,
        now: Now,
        messages: Vec<InboundMessage>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        self.take(now, messages, replica, fx)
    }

    /// Other inputs another replica's clients sent to this group (their
    /// disconnects, that replica's new life), in the guest's encoding:
    /// proposed, forwarded or held like a disconnect of this replica's own
    /// (not reported again to a new leader: the replica they came from
    /// sends its new life again when it starts).
    pub fn agent_inputs<B: Backend>(
        &mut self,
        now: Now,
        batch: Vec<u8>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) {
        replica.wake();
        self.submit_log(now, Held::Agent(now.at, batch), replica, fx);
    }

    fn take<B: Backend>(
        &mut self,
        now: Now,
        messages: Vec<InboundMessage>,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        // A quiet group wakes: its leader may be gone.
        replica.wake();
        for m in &messages {
            if let Some(k) = key_of(m) {
                // Asked again: the answer goes to it.
                self.timed_out.remove(&k);
                self.resent.remove(&k);
                self.answered.remove(&k);
            }
        }
        if let Some(metrics) = &self.store_metrics {
            metrics.requests(messages.iter().map(|m| m.payload.as_slice()));
        }
        self.submit(
            now,
            Held::Requests {
                at: now.at,
                messages,
                sent: false,
            },
            replica,
            fx,
        )
    }

    /// A client of this replica disconnected.
    pub fn client_gone<B: Backend>(
        &mut self,
        now: Now,
        client: String,
        replica: &mut Replica<B>,
        fx: &mut Effects,
    ) -> Result<()> {
        replica.wake();
        self.submit(now, Held::Gone(now.at, client), replica, fx)
    }

    /// Requests a follower (`origin`) forwarded: proposed if this replica
    /// leads (else dropped: their origin sends them again).
    pub fn forwarded<B: Backend>(
        &mut self,
        now: Now,
        origin: u64,
        batch: &[u8],
        replica: &mut Replica<B>,
    ) {
        replica.wake();
        if wire::decode_batch(batch).is_err() {
            warn!(origin, "forwarded requests that do not decode: dropped");
        } else if replica.is_leader() {
            if let Err(e) = replica.propose_wire(origin, batch, now.ms) {
                tracing::debug!(error = %format!("{e:#}"), "a forwarded proposal refused (its origin sends it again)");
            }
        } else {
            tracing::debug!(
                origin,
                "forwarded requests reached a replica that no longer leads (their origin sends them again)"
            );
        }
    }
}
