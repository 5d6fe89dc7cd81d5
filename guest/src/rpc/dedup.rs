//! The request dedup cache (spec §13.1): a redelivered request gets the
//! identical reply and is not applied twice.
//!
//! Keyed by (response topic, correlation data). An entry lives until its
//! request's deadline plus [`super::DEDUP_BUFFER_MS`].
//!
//! Every request is looked up here, so the lookup is two hash probes (the
//! topic, then the correlation data under it), never a walk over ordered
//! maps of long, shared-prefix topics.
//!
//! Bounded: the cache counts the bytes it holds (each entry's correlation
//! data and reply, each topic's name, and a fixed overhead per entry and per
//! topic). Past [`MAX_TOPIC_BYTES`] under one response topic (one client)
//! that topic's entries nearest their deadline go; past [`MAX_BYTES`] in
//! all, the cache's entries nearest their deadline go. A forgotten entry only means that a retry of
//! its request is executed again; its client is the one that flooded.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;

use foldhash::fast::FixedState;
use hashbrown::HashTable;

use super::Reply;
use crate::types::Str;

/// A cached reply and when it is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    /// Forget at this time (ms).
    pub expires_at: u64,
    /// The reply as first sent (its message is rebuilt on a retry, with
    /// the expiry left to the retried request).
    pub reply: Reply,
}

/// One cached reply under its topic, with its insertion number.
#[derive(Debug, Clone)]
struct Entry {
    correlation: Box<[u8]>,
    cached: Cached,
    seq: u64,
}

/// One response topic and its replies by correlation data.
#[derive(Debug, Clone)]
struct Topic {
    name: Str,
    replies: HashTable<Entry>,
    /// Bytes counted for the topic and its entries.
    bytes: usize,
    /// Its entries' keys in the deadline index, nearest first: what goes
    /// when the topic is past its bound (an order that replay and restore
    /// rebuild, unlike insertion order).
    by_deadline: BTreeSet<(u64, u64)>,
}

/// (response topic, correlation data) of a cached reply.
type Key = (Str, Box<[u8]>);

/// The most bytes the whole cache holds.
pub const MAX_BYTES: usize = 32 << 20;
/// The most bytes the cache holds under one response topic.
pub const MAX_TOPIC_BYTES: usize = 4 << 20;
/// What an entry costs beyond its correlation data (held twice: in its
/// topic and in the deadline index) and reply payload: its slots in two
/// tables and two ordered indexes, the reply's fields.
const ENTRY_OVERHEAD: usize = 192;
/// What a topic costs beyond its name.
const TOPIC_OVERHEAD: usize = 64;

/// The bytes an entry is counted for.
fn entry_bytes(correlation: &[u8], cached: &Cached) -> usize {
    let extra: usize = cached
        .reply
        .extra
        .iter()
        .map(|(n, v)| n.len() + v.len())
        .sum();
    ENTRY_OVERHEAD + 2 * correlation.len() + cached.reply.payload.len() + extra
}

/// Mixed into the host's seed.
const HASH_SEED: u64 = 0x6465_6475_7063_6163;

/// Replies by response topic, then correlation data.
///
/// The deadline index is ordered by (deadline, insertion number), so that
/// keeping it in step compares integers, never the topics and correlation
/// data (which are long and often share a prefix).
#[derive(Debug, Clone)]
pub struct DedupCache {
    topics: HashTable<Topic>,
    /// (deadline, insertion number) -> (topic, correlation).
    deadlines: BTreeMap<(u64, u64), Key>,
    hasher: FixedState,
    seq: u64,
    len: usize,
    /// Bytes counted for every topic and entry.
    bytes: usize,
    /// The topic the last probe found, and its hash: a client's requests
    /// come in runs, and comparing with it costs less than hashing the
    /// topic again (the clone keeps its buffer, so its address stays its).
    last: Option<(Str, u64)>,
    /// The most bytes it holds ([`MAX_BYTES`] unless the store's quota
    /// gives it less: [`DedupCache::set_limit`]).
    max_bytes: usize,
}

impl Default for DedupCache {
    fn default() -> Self {
        DedupCache::with_seed(0)
    }
}

/// What [`DedupCache::probe`] found for a request: one topic lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct Probe<'c> {
    /// The response topic as a shared string, if the cache holds a reply to it.
    pub topic: Option<&'c Str>,
    /// The cached reply to this very request, if still remembered.
    pub cached: Option<&'c Cached>,
}

impl DedupCache {
    /// An empty cache whose hashes are keyed by `seed` (the host's
    /// `hash-seed`, so that peers cannot aim for collisions).
    pub fn with_seed(seed: u64) -> DedupCache {
        DedupCache {
            topics: HashTable::new(),
            deadlines: BTreeMap::new(),
            hasher: FixedState::with_seed(seed ^ HASH_SEED),
            seq: 0,
            len: 0,
            bytes: 0,
            last: None,
            max_bytes: MAX_BYTES,
        }
    }

    /// Holds at most `bytes` (at most [`MAX_BYTES`]) from the next insert on.
    pub fn set_limit(&mut self, bytes: usize) {
        self.max_bytes = bytes.min(MAX_BYTES);
    }

    fn hash(&self, bytes: &[u8]) -> u64 {
        self.hasher.hash_one(bytes)
    }

    /// The topic of a request, and its cached reply if `correlation` is
    /// remembered under it at `now`.
    pub fn probe(
        &mut self,
        response_topic: &str,
        correlation: Option<&[u8]>,
        now: u64,
    ) -> Probe<'_> {
        let last = match &self.last {
            Some((name, hash)) if **name == *response_topic => Some((name.as_ptr(), *hash)),
            _ => None,
        };
        // The last topic is found by its address; if it has left the
        // table since (evicted, maybe back under a new buffer), by name.
        let remembered =
            last.and_then(|(at, hash)| self.topics.find(hash, |t| t.name.as_ptr() == at));
        let topic = match remembered {
            Some(topic) => topic,
            None => {
                let hash = self.hash(response_topic.as_bytes());
                let Some(topic) = self.topics.find(hash, |t| *t.name == *response_topic) else {
                    return Probe::default();
                };
                self.last = Some((topic.name.clone(), hash));
                topic
            }
        };
        let cached = correlation.and_then(|corr| {
            topic
                .replies
                .find(self.hash(corr), |r| *r.correlation == *corr)
                .map(|r| &r.cached)
                .filter(|c| now < c.expires_at)
        });
        Probe {
            topic: Some(&topic.name),
            cached,
        }
    }

    /// The cached reply for this request, if still remembered at `now`.
    pub fn get(&mut self, response_topic: &str, correlation: &[u8], now: u64) -> Option<&Cached> {
        self.probe(response_topic, Some(correlation), now).cached
    }

    /// Remembers a reply, then forgets the oldest entries while the cache
    /// (or this topic) holds more than its bound.
    pub fn insert(&mut self, response_topic: &str, correlation: &[u8], cached: Cached) {
        self.put(response_topic, correlation, cached);
        let hash = self.hash(response_topic.as_bytes());
        while let Some(topic) = self.topics.find(hash, |t| *t.name == *response_topic)
            && topic.bytes > MAX_TOPIC_BYTES
        {
            // The topic's entry nearest its deadline.
            let Some(&key) = topic.by_deadline.first() else {
                break;
            };
            self.forget(key);
        }
        while self.bytes > self.max_bytes {
            let Some((&key, _)) = self.deadlines.first_key_value() else {
                break;
            };
            self.forget(key);
        }
    }

    /// Remembers a reply, unbounded.
    fn put(&mut self, response_topic: &str, correlation: &[u8], cached: Cached) {
        let at = cached.expires_at;
        let size = entry_bytes(correlation, &cached);
        self.seq += 1;
        let seq = self.seq;
        let hasher = self.hasher.clone();
        let hash = |b: &[u8]| hasher.hash_one(b);
        let topic_hash = hash(response_topic.as_bytes());
        let topic = match self
            .topics
            .find_mut(topic_hash, |t| *t.name == *response_topic)
        {
            Some(topic) => topic,
            None => {
                let topic = Topic {
                    name: Str::from(response_topic),
                    replies: HashTable::new(),
                    bytes: TOPIC_OVERHEAD + response_topic.len(),
                    by_deadline: BTreeSet::new(),
                };
                self.bytes += topic.bytes;
                self.topics
                    .insert_unique(topic_hash, topic, |t| hash(t.name.as_bytes()))
                    .into_mut()
            }
        };
        let name = topic.name.clone();
        let corr_hash = hash(correlation);
        let reply = Entry {
            correlation: correlation.into(),
            cached,
            seq,
        };
        let old = match topic
            .replies
            .find_mut(corr_hash, |r| *r.correlation == *correlation)
        {
            Some(slot) => Some(std::mem::replace(slot, reply)),
            None => {
                topic
                    .replies
                    .insert_unique(corr_hash, reply, |r| hash(&r.correlation));
                None
            }
        };
        topic.bytes += size;
        self.bytes += size;
        topic.by_deadline.insert((at, seq));
        match old {
            Some(old) => {
                let freed = entry_bytes(&old.correlation, &old.cached);
                topic.bytes -= freed;
                self.bytes -= freed;
                topic.by_deadline.remove(&(old.cached.expires_at, old.seq));
                self.deadlines.remove(&(old.cached.expires_at, old.seq));
            }
            None => self.len += 1,
        }
        self.deadlines.insert((at, seq), (name, correlation.into()));
    }

    /// Forgets what expired at `now`, at most `max` entries; returns how
    /// many it forgot.
    pub fn evict(&mut self, now: u64, max: usize) -> usize {
        let mut evicted = 0;
        while evicted < max
            && let Some((&key, _)) = self.deadlines.first_key_value()
        {
            if key.0 > now {
                break;
            }
            self.forget(key);
            evicted += 1;
        }
        evicted
    }

    /// Forgets the entry with this deadline key.
    fn forget(&mut self, key: (u64, u64)) {
        let Some((name, corr)) = self.deadlines.remove(&key) else {
            return;
        };
        let topic_hash = self.hash(name.as_bytes());
        let corr_hash = self.hash(&corr);
        let Ok(mut topic) = self.topics.find_entry(topic_hash, |t| t.name == name) else {
            return;
        };
        if let Ok(reply) = topic
            .get_mut()
            .replies
            .find_entry(corr_hash, |r| r.correlation == corr)
        {
            let (entry, _) = reply.remove();
            let freed = entry_bytes(&entry.correlation, &entry.cached);
            topic.get_mut().bytes -= freed;
            topic.get_mut().by_deadline.remove(&key);
            self.bytes -= freed;
            self.len -= 1;
        }
        if topic.get().replies.is_empty() {
            let (gone, _) = topic.remove();
            self.bytes -= gone.bytes;
            if self.last.as_ref().is_some_and(|(n, _)| *n == gone.name) {
                self.last = None;
            }
        }
    }

    /// Bytes counted for every entry and topic held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// When the next entry is forgotten.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first_key_value().map(|((at, _), _)| *at)
    }

    /// Every entry, ordered by response topic then correlation data (so
    /// that a snapshot's bytes do not depend on the hash seed).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8], &Cached)> {
        let mut all: Vec<(&str, &[u8], &Cached)> = self
            .topics
            .iter()
            .flat_map(|t| {
                t.replies
                    .iter()
                    .map(move |r| (&*t.name, &*r.correlation, &r.cached))
            })
            .collect();
        all.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        all.into_iter()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(_topic: &str, n: u8, expires_at: u64) -> Cached {
        Cached {
            expires_at,
            reply: Reply::ok(vec![n], None),
        }
    }

    #[test]
    fn insert_get_replace_evict() {
        let mut c = DedupCache::with_seed(7);
        c.insert("a/b", b"1", cached("a/b", 1, 100));
        c.insert("a/b", b"2", cached("a/b", 2, 200));
        c.insert("c", b"1", cached("c", 3, 150));
        assert_eq!(c.len(), 3);
        assert_eq!(c.get("a/b", b"1", 99).map(|c| c.reply.payload[0]), Some(1));
        assert_eq!(c.get("a/b", b"1", 100), None, "expired at its deadline");
        assert_eq!(c.get("a/b", b"3", 0), None);
        assert_eq!(c.get("a/bx", b"1", 0), None);
        let known = |c: &mut DedupCache, t: &str| c.probe(t, None, 0).topic.map(|s| s.to_string());
        assert_eq!(known(&mut c, "a/b").as_deref(), Some("a/b"));
        assert_eq!(known(&mut c, "a/b").as_deref(), Some("a/b"), "remembered");
        assert_eq!(known(&mut c, "a/bc"), None);
        // Replacing keeps one entry and moves its deadline.
        c.insert("a/b", b"1", cached("a/b", 4, 300));
        assert_eq!(c.len(), 3);
        assert_eq!(c.next_deadline(), Some(150));
        c.evict(150, usize::MAX);
        assert_eq!(c.len(), 2);
        assert_eq!(known(&mut c, "c"), None, "empty topics go");
        c.evict(250, usize::MAX);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get("a/b", b"1", 299).map(|c| c.reply.payload[0]), Some(4));
        c.evict(300, usize::MAX);
        assert!(c.is_empty());
        assert_eq!(c.next_deadline(), None);
        assert_eq!(known(&mut c, "a/b"), None, "the remembered topic went too");
        // Back under a new buffer: found by name again.
        c.insert("a/b", b"9", cached("a/b", 9, 400));
        assert_eq!(c.get("a/b", b"9", 0).map(|c| c.reply.payload[0]), Some(9));
        assert_eq!(c.get("a/b", b"9", 0).map(|c| c.reply.payload[0]), Some(9));
    }

    /// One client past its bound loses its own oldest entries, nobody
    /// else's; the whole cache past its bound loses the entries nearest
    /// their deadline; the count of bytes goes back to zero.
    #[test]
    fn the_cache_stays_within_its_bounds() {
        let big = |_: u32, at: u64| Cached {
            expires_at: at,
            reply: Reply::ok(vec![0u8; 64 << 10], None),
        };
        let mut c = DedupCache::with_seed(3);
        c.insert("quiet", b"q", cached("quiet", 1, 10_000));
        for i in 0..200u32 {
            c.insert("flood", &i.to_be_bytes(), big(i, 20_000 + u64::from(i)));
            assert!(c.bytes() <= MAX_BYTES);
        }
        assert!(
            c.get("quiet", b"q", 0).is_some(),
            "the quiet client keeps its entry"
        );
        assert!(
            c.get("flood", &199u32.to_be_bytes(), 0).is_some(),
            "the newest stays"
        );
        assert!(
            c.get("flood", &0u32.to_be_bytes(), 0).is_none(),
            "the oldest went"
        );
        let per_entry = (64 << 10) + ENTRY_OVERHEAD + 8;
        assert_eq!(
            c.len(),
            1 + MAX_TOPIC_BYTES.saturating_sub(TOPIC_OVERHEAD + 5) / per_entry
        );
        // Many clients: the whole cache is bounded.
        for t in 0..20u32 {
            let topic = format!("client-{t}");
            for i in 0..60u32 {
                c.insert(
                    &topic,
                    &i.to_be_bytes(),
                    big(i, 30_000 + u64::from(t * 100 + i)),
                );
            }
        }
        assert!(c.bytes() <= MAX_BYTES);
        assert!(c.bytes() > MAX_BYTES - per_entry - 1024);
        assert!(
            c.get("quiet", b"q", 0).is_none(),
            "the entry nearest its deadline went"
        );
        c.evict(u64::MAX, usize::MAX);
        assert_eq!((c.len(), c.bytes()), (0, 0));
    }

    /// Past its bound a topic loses the entry nearest its deadline, not the
    /// one inserted first: an order a restart rebuilds (replay and restore
    /// insert in another order).
    #[test]
    fn a_topic_past_its_bound_loses_its_nearest_deadline() {
        let entry = |at: u64| Cached {
            expires_at: at,
            reply: Reply::ok(vec![0u8; 64 << 10], None),
        };
        let mut c = DedupCache::with_seed(5);
        // A long-lived entry first, then short-lived ones past the bound.
        c.insert("t", b"long", entry(1_000_000));
        for i in 0..100u32 {
            c.insert("t", &i.to_be_bytes(), entry(1_000 + u64::from(i)));
        }
        assert!(
            c.get("t", b"long", 0).is_some(),
            "the long-lived entry stays"
        );
        assert!(c.get("t", &0u32.to_be_bytes(), 0).is_none());
        assert!(c.get("t", &99u32.to_be_bytes(), 0).is_some());
    }

    #[test]
    fn iteration_is_ordered_whatever_the_seed() {
        let fill = |seed| {
            let mut c = DedupCache::with_seed(seed);
            for i in (0..50u8).rev() {
                let topic = format!("t/{}", i % 7);
                c.insert(&topic, &[i, 1], cached(&topic, i, 1000 + u64::from(i)));
            }
            c.iter()
                .map(|(t, corr, c)| (t.to_string(), corr.to_vec(), c.reply.payload[0]))
                .collect::<Vec<_>>()
        };
        let a = fill(1);
        assert_eq!(a, fill(2));
        assert_eq!(a.len(), 50);
        assert!(
            a.windows(2)
                .all(|w| (&w[0].0, &w[0].1) < (&w[1].0, &w[1].1))
        );
    }
}
