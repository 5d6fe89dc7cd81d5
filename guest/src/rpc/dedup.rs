//! The request dedup cache (spec §13.1): a redelivered request gets the
//! identical reply and is not applied twice.
//!
//! Keyed by (response topic, correlation data). An entry lives until its
//! request's deadline plus [`super::DEDUP_BUFFER_MS`].

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::types::OutboundMessage;

/// A cached reply and when it is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    /// Forget at this time (ms).
    pub expires_at: u64,
    /// The reply as first sent, without its message expiry.
    pub reply: OutboundMessage,
}

/// One topic's replies by correlation data, with their insertion numbers.
type ByCorrelation = BTreeMap<Box<[u8]>, (Cached, u64)>;

/// (response topic, correlation data).
type Key = (Arc<str>, Box<[u8]>);

/// Replies by response topic, then correlation data.
///
/// The deadline index is ordered by (deadline, insertion number), so that
/// keeping it in step compares integers, never the topics and correlation
/// data (which are long and often share a prefix).
#[derive(Debug, Clone, Default)]
pub struct DedupCache {
    entries: BTreeMap<Arc<str>, ByCorrelation>,
    /// (deadline, insertion number) -> (topic, correlation).
    deadlines: BTreeMap<(u64, u64), Key>,
    seq: u64,
    len: usize,
}

impl DedupCache {
    /// The cached reply for this request, if still remembered at `now`.
    pub fn get(&self, response_topic: &str, correlation: &[u8], now: u64) -> Option<&Cached> {
        self.entries
            .get(response_topic)?
            .get(correlation)
            .map(|(c, _)| c)
            .filter(|c| now < c.expires_at)
    }

    /// Remembers a reply.
    pub fn insert(&mut self, response_topic: &str, correlation: &[u8], cached: Cached) {
        let at = cached.expires_at;
        let topic = match self.entries.get_key_value(response_topic) {
            Some((topic, _)) => topic.clone(),
            None => Arc::from(response_topic),
        };
        self.seq += 1;
        let seq = self.seq;
        let old = self
            .entries
            .entry(topic.clone())
            .or_default()
            .insert(correlation.into(), (cached, seq));
        match old {
            Some((old, old_seq)) => {
                self.deadlines.remove(&(old.expires_at, old_seq));
            }
            None => self.len += 1,
        }
        self.deadlines
            .insert((at, seq), (topic, correlation.into()));
    }

    /// Forgets everything that expired at `now`.
    pub fn evict(&mut self, now: u64) {
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (topic, corr) = entry.remove();
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
        self.deadlines.first_key_value().map(|((at, _), _)| *at)
    }

    /// Every entry, ordered by response topic then correlation data.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8], &Cached)> {
        self.entries.iter().flat_map(|(topic, by_corr)| {
            by_corr
                .iter()
                .map(move |(corr, (cached, _))| (&**topic, &**corr, cached))
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
