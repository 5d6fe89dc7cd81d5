//! The simulated network between replicas: what travels on it, cuts, loss
//! and delay, and how a router's effects are put on it.

use anyhow::Result;
use raft::prelude::Message;

use super::clients::Clients;
use super::{Options, Report, Rng};
use crate::cluster::router::Effects;

/// What travels between replicas.
#[derive(Debug, Clone)]
pub(super) enum Wire {
    /// A Raft message of a group (partition).
    Raft(u32, Message),
    /// Requests `from` forwards to the leader `to` of a group.
    Forward {
        group: u32,
        from: u64,
        to: u64,
        batch: Vec<u8>,
    },
}

impl Wire {
    pub(super) fn from(&self) -> u64 {
        match self {
            Wire::Raft(_, m) => m.from,
            Wire::Forward { from, .. } => *from,
        }
    }
    pub(super) fn to(&self) -> u64 {
        match self {
            Wire::Raft(_, m) => m.to,
            Wire::Forward { to, .. } => *to,
        }
    }
}

/// A replica cut off: from everyone, or only from what is sent to it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cut {
    pub(super) replica: u64,
    /// Only what is sent to it is lost (it still sends): a leader that
    /// cannot hear its followers steps down, but its entries reach them.
    pub(super) inbound_only: bool,
    pub(super) until: u64,
}

impl Cut {
    pub(super) fn blocks(&self, w: &Wire) -> bool {
        w.to() == self.replica || (!self.inbound_only && w.from() == self.replica)
    }
}

/// Carries out what replica `origin`'s router of `group` asked for:
/// forwards go on the network, replies (as a partition's are rewritten,
/// [`crate::cluster::partition::replies`]) to their clients.
#[allow(clippy::too_many_arguments)]
pub(super) fn carry_out(
    seed: u64,
    tick: u64,
    origin: u64,
    (group, partitions): (u32, u32),
    mut fx: Effects,
    o: &Options,
    faults: bool,
    rng: &mut Rng,
    net: &mut Vec<(u64, Wire)>,
    clients: &mut Clients,
    report: &mut Report,
) -> Result<()> {
    for (to, batch) in fx.forwards {
        send(
            tick,
            Wire::Forward {
                group,
                from: origin,
                to,
                batch,
            },
            o,
            faults,
            rng,
            net,
        );
    }
    crate::cluster::partition::replies(&mut fx.replies, group, partitions);
    let everywhere = o.notify == crate::cluster::router::Notify::Everywhere;
    for out in &fx.replies {
        clients.answer(seed, tick, (origin, everywhere), out, report)?;
    }
    Ok(())
}

/// Puts `w` on the network: lost, or delayed (which reorders).
pub(super) fn send(
    tick: u64,
    w: Wire,
    o: &Options,
    faults: bool,
    rng: &mut Rng,
    net: &mut Vec<(u64, Wire)>,
) {
    if faults && rng.chance(o.loss) {
        return;
    }
    let delay = 1 + if faults { rng.below(o.max_delay) } else { 0 };
    net.push((tick + delay, w));
}
