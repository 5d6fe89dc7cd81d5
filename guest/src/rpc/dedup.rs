//! The request dedup cache (spec §13.1): a redelivered request gets the
//! identical reply and is not applied twice.
//!
//! Keyed by (response topic, correlation data). An entry lives until its
//! request's deadline plus [`super::DEDUP_BUFFER_MS`].

use std::collections::BTreeMap;

use crate::expiry::Deadlines;
use crate::types::OutboundMessage;

/// A cached reply and when it is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    /// Forget at this time (ms).
    pub expires_at: u64,
    /// The reply as first sent, without its message expiry.
    pub reply: OutboundMessage,
}

/// Replies by response topic, then correlation data.
#[derive(Debug, Clone, Default)]
pub struct DedupCache {
    entries: BTreeMap<String, BTreeMap<Box<[u8]>, Cached>>,
    deadlines: Deadlines<(String, Box<[u8]>)>,
    len: usize,
}

impl DedupCache {
    /// The cached reply for this request, if still remembered at `now`.
    pub fn get(&self, response_topic: &str, correlation: &[u8], now: u64) -> Option<&Cached> {
        self.entries
            .get(response_topic)?
            .get(correlation)
            .filter(|c| now < c.expires_at)
    }

    /// Remembers a reply.
    pub fn insert(&mut self, response_topic: &str, correlation: &[u8], cached: Cached) {
        let at = cached.expires_at;
        let old = self
            .entries
            .entry(response_topic.to_string())
            .or_default()
            .insert(correlation.into(), cached);
        let key = (response_topic.to_string(), Box::<[u8]>::from(correlation));
        match old {
            Some(old) => self.deadlines.remove(old.expires_at, &key),
            None => self.len += 1,
        }
        self.deadlines.insert(at, key);
    }

    /// Forgets everything that expired at `now`.
    pub fn evict(&mut self, now: u64) {
        while let Some((_, (topic, corr))) = self.deadlines.pop_due(now) {
            if let Some(by_corr) = self.entries.get_mut(&topic) {
                if by_corr.remove(&corr).is_some() {
                    self.len -= 1;
                }
                if by_corr.is_empty() {
                    self.entries.remove(&topic);
                }
            }
        }
    }

    /// When the next entry is forgotten.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.next()
    }

    /// Every entry, ordered by response topic then correlation data.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8], &Cached)> {
        self.entries.iter().flat_map(|(topic, by_corr)| {
            by_corr
                .iter()
                .map(move |(corr, cached)| (topic.as_str(), &**corr, cached))
        })
    }

    /// Number of cached replies.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
