//! Ordered deadlines: which things expire next, and popping those that are due.

use std::collections::BTreeSet;

/// A set of `(deadline, item)` ordered by deadline, then item.
#[derive(Debug, Clone, Default)]
pub struct Deadlines<K: Ord> {
    queue: BTreeSet<(u64, K)>,
}

impl<K: Ord + Clone> Deadlines<K> {
    /// No deadlines.
    pub fn new() -> Self {
        Deadlines {
            queue: BTreeSet::new(),
        }
    }

    /// Adds `item` due at `at`.
    pub fn insert(&mut self, at: u64, item: K) {
        self.queue.insert((at, item));
    }

    /// Removes `item` due at `at`, if present.
    pub fn remove(&mut self, at: u64, item: &K) {
        // BTreeSet has no borrowed lookup for tuples; the clone is of a key that
        // is being removed anyway.
        self.queue.remove(&(at, item.clone()));
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<u64> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Takes the earliest item if it is due at `now` (deadline <= now).
    pub fn pop_due(&mut self, now: u64) -> Option<(u64, K)> {
        if self.next()? <= now {
            self.queue.pop_first()
        } else {
            None
        }
    }

    /// How many deadlines are pending.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_order_only_when_due() {
        let mut d = Deadlines::new();
        d.insert(30, "c");
        d.insert(10, "a");
        d.insert(20, "b");
        d.remove(20, &"b");
        assert_eq!(d.next(), Some(10));
        assert_eq!(d.pop_due(9), None);
        assert_eq!(d.pop_due(10), Some((10, "a")));
        assert_eq!(d.pop_due(100), Some((30, "c")));
        assert_eq!(d.pop_due(100), None);
        assert_eq!(d.len(), 0);
    }
}
