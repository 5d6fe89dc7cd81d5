//! Bytes a replica's routers hold, counted together: a store in
//! partitions has a router per group, and the bounds on what requests and
//! memories of answers may take are the replica's, not each group's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The totals a replica's routers share ([`super::Router::share`]): bytes
/// of requests held while there is no leader, kept to be sent again, and
/// waiting for a read index, and of the memories of requests answered,
/// answered 408 and sent again.
#[derive(Debug, Clone, Default)]
pub struct SharedBytes {
    pub(super) held: Arc<AtomicUsize>,
    pub(super) unapplied: Arc<AtomicUsize>,
    pub(super) reads: Arc<AtomicUsize>,
    pub(super) answered: Arc<AtomicUsize>,
    pub(super) timed_out: Arc<AtomicUsize>,
    pub(super) resent: Arc<AtomicUsize>,
}

impl SharedBytes {
    /// Bytes of every kind the routers sharing these hold now.
    pub fn total(&self) -> usize {
        [
            &self.held,
            &self.unapplied,
            &self.reads,
            &self.answered,
            &self.timed_out,
            &self.resent,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
    }
}

/// One router's bytes of one kind, and the total of every router sharing
/// the count (what the bounds are checked against).
#[derive(Debug, Default)]
pub(super) struct Count {
    mine: usize,
    all: Arc<AtomicUsize>,
}

impl Count {
    /// The total of every router sharing it.
    pub(super) fn all(&self) -> usize {
        self.all.load(Ordering::Relaxed)
    }

    pub(super) fn add(&mut self, n: usize) {
        self.mine += n;
        self.all.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&mut self, n: usize) {
        let n = n.min(self.mine);
        self.mine -= n;
        self.all.fetch_sub(n, Ordering::Relaxed);
    }

    /// This router's bytes of the kind are now `n`.
    pub(super) fn set(&mut self, n: usize) {
        if n >= self.mine {
            self.add(n - self.mine);
        } else {
            self.sub(self.mine - n);
        }
    }

    /// The same bytes, counted in `all` from now on.
    pub(super) fn share(&mut self, all: &Arc<AtomicUsize>) {
        let mine = self.mine;
        self.set(0);
        self.all = all.clone();
        self.add(mine);
    }
}

impl Drop for Count {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routers_count_their_bytes_together_and_take_them_back_when_dropped() {
        let shared = SharedBytes::default();
        let mut a = Count::default();
        a.add(10);
        a.share(&shared.held);
        let mut b = Count::default();
        b.share(&shared.held);
        b.add(5);
        assert_eq!((a.all(), b.all(), shared.total()), (15, 15, 15));
        b.sub(100); // never below its own
        assert_eq!(a.all(), 10);
        a.set(3);
        b.set(4);
        assert_eq!(shared.total(), 7);
        drop(a);
        assert_eq!(b.all(), 4);
        drop(b);
        assert_eq!(shared.total(), 0);
    }
}
