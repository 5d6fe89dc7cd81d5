//! A replica's ready between its steps ([`Replica::ready_apply`],
//! [`Replica::ready_write`], then `persist_round` and
//! [`Replica::ready_finish`] or [`Replica::ready_defer`]), and when what it
//! committed is applied.

use raft::prelude::Entry;

#[cfg(doc)]
use super::Replica;

/// A Raft `Ready` whose new entries are still to be written
/// ([`Replica::ready_write`]), and its committed entries if they wait for
/// [`Replica::ready_finish`] ([`Applying::AfterSync`]).
pub struct Unpersisted(pub(super) raft::Ready, pub(super) Vec<Entry>);

/// A ready whose entries are written and not yet synced
/// ([`Replica::ready_write`], then `persist_round`), and the committed
/// entries it still has to apply.
pub struct Unsynced(pub(super) raft::Ready, pub(super) Vec<Entry>);

/// When [`Replica::ready_apply`] applies what a ready committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applying {
    /// At once, before the ready's new entries are written and synced: the
    /// replies to this replica's clients never wait for a sync.
    Now,
    /// In [`Replica::ready_finish`], once the round's sync is done and its
    /// messages (a follower's acknowledgements) have gone: for a follower
    /// without clients, whose acknowledgement a commit waits for and whose
    /// applying nobody waits for. Not in a pipelined round.
    AfterSync,
}

impl Unsynced {
    /// Whether it must be durable before its messages go: it wrote
    /// entries, a snapshot, or a new term or vote. A ready that only moved
    /// the commit index need not be: Raft does not need its commit index
    /// back after a crash (the leader says it again), so such a record is
    /// synced with the next round that must be.
    pub fn must_sync(&self) -> bool {
        self.0.must_sync()
    }
}

impl std::fmt::Debug for Unsynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsynced").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Unpersisted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unpersisted")
            .field("entries", &self.0.entries().len())
            .field("to_apply", &self.1.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use raft::prelude::MessageType;

    use super::Applying;
    use crate::cluster::quiet::tests::Three;

    /// Replica 1 (leading) proposes an entry; once its commit is on its
    /// way to replica `to`, replica `to` steps what is on its way to it.
    /// The entry's index.
    fn committed_to(g: &mut Three, to: u64, clock: u64) -> u64 {
        let leader = g.replicas[0].as_mut().expect("up");
        leader.propose(1, &[], clock).expect("propose");
        let index = leader.status().last_index;
        for _ in 0..20 {
            if g.wire.iter().any(|m| m.to == to && m.commit >= index) {
                let (mine, others) = std::mem::take(&mut g.wire)
                    .into_iter()
                    .partition(|m| m.to == to);
                g.wire = others;
                let follower = g.replicas[to as usize - 1].as_mut().expect("up");
                for m in mine {
                    follower.step(m).expect("step");
                }
                return index;
            }
            g.tick();
        }
        panic!("the commit of {index} never went to replica {to}");
    }

    /// A follower that applies after its sync takes a ready that commits an
    /// entry without applying it; finishing the ready sends its
    /// acknowledgement and applies the entry. A pipelined round refuses
    /// such a ready (what it committed would never be applied).
    #[test]
    fn applying_after_the_sync_applies_what_the_ready_committed_when_it_finishes() {
        let mut g = Three::new();
        for _ in 0..50 {
            g.tick();
        }
        assert_eq!(g.leader(), Some(1));
        let index = committed_to(&mut g, 2, 1_000);
        let follower = g.replicas[1].as_mut().expect("up");
        assert!(follower.applied() < index);
        let mut sent = Vec::new();
        let (applied, rest) = follower
            .ready_apply(&mut |m| sent.push(m), Applying::AfterSync)
            .expect("ready");
        assert!(applied.is_empty(), "nothing applied before the sync");
        assert!(follower.applied() < index);
        let w = follower.ready_write(rest.expect("a ready")).expect("write");
        let applied = follower
            .ready_finish(w, &mut |m| sent.push(m))
            .expect("finish");
        assert!(applied.iter().any(|a| a.index == index), "{applied:?}");
        assert!(follower.applied() >= index);
        assert!(
            sent.iter()
                .any(|m| m.get_msg_type() == MessageType::MsgAppendResponse),
            "acknowledged"
        );

        // The same in a pipelined round: refused.
        committed_to(&mut g, 3, 2_000);
        let follower = g.replicas[2].as_mut().expect("up");
        let (_, rest) = follower
            .ready_apply(&mut |_| {}, Applying::AfterSync)
            .expect("ready");
        let w = follower.ready_write(rest.expect("a ready")).expect("write");
        let refused = follower.ready_defer(w).expect_err("refused");
        assert!(
            format!("{refused:#}").contains("left to apply"),
            "{refused:#}"
        );
    }
}
