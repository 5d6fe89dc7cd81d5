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
    use super::Applying;
    use crate::cluster::quiet::tests::Three;

    /// A follower that applies after its sync takes a ready that commits an
    /// entry without applying it; finishing the ready applies it, after the
    /// ready's acknowledgement went. A pipelined round refuses such a
    /// ready (what it committed would never be applied).
    #[test]
    fn applying_after_the_sync_applies_what_the_ready_committed_when_it_finishes() {
        let mut g = Three::new();
        for _ in 0..50 {
            g.tick();
        }
        assert_eq!(g.leader(), Some(1));
        let leader = g.replicas[0].as_mut().expect("up");
        leader.propose(1, &[], 1_000).expect("propose");
        let index = leader.status().last_index;
        // Until the leader's commit (and a new append) is on its way to
        // replica 2, which has the entry but has not applied it.
        let mut ticks = 0;
        while !g.wire.iter().any(|m| m.to == 2 && m.commit >= index) {
            g.tick();
            ticks += 1;
            assert!(
                ticks < 20,
                "the commit reaches the wire: {:?}",
                g.wire
                    .iter()
                    .map(|m| (m.to, m.get_msg_type(), m.commit, m.index, m.entries.len()))
                    .collect::<Vec<_>>()
            );
        }
        let follower = g.replicas[1].as_mut().expect("up");
        assert!(follower.applied() < index);
        let (mine, others) = std::mem::take(&mut g.wire)
            .into_iter()
            .partition(|m| m.to == 2);
        g.wire = others;
        for m in mine {
            follower.step(m).expect("step");
        }
        let mut sent = Vec::new();
        let (applied, rest) = follower
            .ready_apply(&mut |m| sent.push(m), Applying::AfterSync)
            .expect("ready");
        assert!(applied.is_empty(), "nothing applied before the sync");
        assert!(follower.applied() < index);
        let rest = rest.expect("a ready");
        let w = follower.ready_write(rest).expect("write");
        let applied = follower
            .ready_finish(w, &mut |m| sent.push(m))
            .expect("finish");
        assert!(applied.iter().any(|a| a.index == index), "{applied:?}");
        assert!(follower.applied() >= index);

        // The same in a pipelined round: refused.
        let leader = g.replicas[0].as_mut().expect("up");
        leader.propose(1, &[], 2_000).expect("propose");
        let index = leader.status().last_index;
        let mut ticks = 0;
        while !g.wire.iter().any(|m| m.to == 3 && m.commit >= index) {
            g.tick();
            ticks += 1;
            assert!(
                ticks < 20,
                "the commit reaches the wire: {:?}",
                g.wire
                    .iter()
                    .map(|m| (m.to, m.get_msg_type(), m.commit, m.index, m.entries.len()))
                    .collect::<Vec<_>>()
            );
        }
        let follower = g.replicas[2].as_mut().expect("up");
        let (mine, others) = std::mem::take(&mut g.wire)
            .into_iter()
            .partition(|m| m.to == 3);
        g.wire = others;
        for m in mine {
            follower.step(m).expect("step");
        }
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
