//! The router's memory of requests answered lately: a request gets at
//! most one answer from its replica.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::bytes::Count;
use crate::InboundMessage;

/// A request's identity: its response topic and correlation data.
pub(super) type Key = (String, Vec<u8>);

pub(super) fn key_of(m: &InboundMessage) -> Option<Key> {
    Some((m.response_topic.clone()?, m.correlation_data.clone()?))
}

/// Requests answered lately, whose later replies are not published: for
/// `within`, at most `max_bytes` of them (the oldest go first).
pub(super) struct Answered {
    keys: HashSet<Key>,
    order: VecDeque<(Instant, Key)>,
    /// Its keys' bytes, counted with the other routers' of the replica.
    pub(super) bytes: Count,
    within: Duration,
    max_bytes: usize,
}

impl Answered {
    pub(super) fn new(within: Duration, max_bytes: usize) -> Answered {
        Answered {
            keys: HashSet::new(),
            order: VecDeque::new(),
            bytes: Count::default(),
            within,
            max_bytes,
        }
    }

    pub(super) fn insert(&mut self, at: Instant, key: Key) {
        let bytes = key.0.len() + key.1.len();
        if self.keys.insert(key.clone()) {
            self.bytes.add(bytes);
            self.order.push_back((at, key));
        }
        self.age(at);
    }

    pub(super) fn age(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.within
                && self.bytes.all() <= self.max_bytes
            {
                break;
            }
            if let Some((_, k)) = self.order.pop_front() {
                self.bytes.sub(k.0.len() + k.1.len());
                self.keys.remove(&k);
            }
        }
    }

    pub(super) fn remove(&mut self, key: &Key) {
        if self.keys.remove(key) {
            self.order.retain(|(_, k)| k != key);
            self.bytes.sub(key.0.len() + key.1.len());
        }
    }

    pub(super) fn contains(&self, key: &Key) -> bool {
        self.keys.contains(key)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::router::{TIMED_OUT_BYTES, TIMED_OUT_WITHIN};

    #[test]
    fn answered_requests_are_forgotten_in_time_and_bytes() {
        let t0 = Instant::now();
        let mut t = Answered::new(TIMED_OUT_WITHIN, TIMED_OUT_BYTES);
        t.insert(t0, ("a".into(), vec![1]));
        t.insert(t0, ("a".into(), vec![1]));
        assert_eq!(t.bytes.all(), 2);
        assert!(t.contains(&("a".into(), vec![1])));
        t.remove(&("a".into(), vec![1]));
        assert!(!t.contains(&("a".into(), vec![1])));
        assert_eq!(t.bytes.all(), 0);
        t.insert(t0, ("b".into(), vec![2]));
        t.age(t0 + TIMED_OUT_WITHIN);
        assert!(!t.contains(&("b".into(), vec![2])));
        let big = "x".repeat(1 << 20);
        for i in 0..20u8 {
            t.insert(t0, (big.clone(), vec![i]));
        }
        assert!(t.bytes.all() <= TIMED_OUT_BYTES);
        assert!(!t.contains(&(big.clone(), vec![0])));
        assert!(t.contains(&(big, vec![19])));
    }
}
