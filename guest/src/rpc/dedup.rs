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
//! data and reply, each topic's name, and a fixed overhead per entry, per
//! topic and per client). Every entry is charged to the client that made
//! it: the one a broker vouches for or its response topic names (the
//! `client` of [`DedupCache::insert`]), else its response topic alone (as
//! far as the store can tell, one client). Past [`MAX_CLIENT_BYTES`] for one
//! client, whatever response topics it spreads its requests over, that
//! client's entries nearest their deadline go; past [`MAX_BYTES`] in all,
//! the cache's entries nearest their deadline go. A forgotten entry only
//! means that a retry of its request is executed again; a client that
//! floods forgets its own replies, not the others'.

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

/// One cached reply under its topic, with its insertion number and the
/// key of the owner it is charged to.
#[derive(Debug, Clone)]
struct Entry {
    correlation: Box<[u8]>,
    cached: Cached,
    seq: u64,
    owner: Str,
    /// The hash of `owner`.
    owner_hash: u64,
}

/// One response topic and its replies by correlation data.
#[derive(Debug, Clone)]
struct Topic {
    name: Str,
    replies: HashTable<Entry>,
}

/// What one client (or one unattributed response topic) holds.
#[derive(Debug, Clone)]
struct Owner {
    /// [`owner_key`].
    key: Str,
    /// Bytes charged to it: its entries, each with its topic's name, and
    /// its own overhead.
    bytes: usize,
    /// Its entries' keys in the deadline index, nearest first: what goes
    /// when it is past its bound (an order that replay and restore
    /// rebuild, unlike insertion order).
    by_deadline: BTreeSet<(u64, u64)>,
}

/// Where the deadline index finds a cached reply: under its response topic
/// (the topic's own name, and its hash), the reply under the correlation
/// data's hash whose insertion number is the deadline key's.
#[derive(Debug, Clone)]
struct Due {
    topic: Str,
    topic_hash: u64,
    corr_hash: u64,
}

/// A topic the cache holds, as [`Probe::topic`] found it: handed back to
/// [`DedupCache::insert_hinted`] so that the topic is not looked up again.
#[derive(Debug, Clone)]
pub struct TopicHint {
    name: Str,
    hash: u64,
}

impl TopicHint {
    /// The topic's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether two names the cache holds are the same: the same buffer (a
/// name and its clones) is the common case and costs no comparison.
fn same(a: &Str, b: &Str) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

/// The most bytes the whole cache holds.
pub const MAX_BYTES: usize = 32 << 20;
/// The most bytes the cache holds for one client, over all its response
/// topics.
pub const MAX_CLIENT_BYTES: usize = 4 << 20;
/// What an entry costs beyond its correlation data and reply payload: its
/// slots in two tables and two ordered indexes, the reply's fields. The
/// correlation data is counted twice (earlier builds held a copy
/// in the deadline index): every build of a cluster must forget the same
/// entries, so the count stays as it was.
const ENTRY_OVERHEAD: usize = 192;
/// What a topic costs beyond its name.
const TOPIC_OVERHEAD: usize = 64;
/// What an owner costs beyond its key.
const OWNER_OVERHEAD: usize = 64;

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

/// The key an entry's owner is found by: `c` and the client's identity, or
/// `t` and the response topic when no client is known (the two never meet).
fn owner_key(client: Option<&str>, response_topic: &str) -> String {
    let mut key = String::new();
    owner_key_into(&mut key, client, response_topic);
    key
}

/// [`owner_key`], written over `key` (a buffer kept between inserts).
fn owner_key_into(key: &mut String, client: Option<&str>, response_topic: &str) {
    key.clear();
    match client {
        Some(id) => {
            key.push('c');
            key.push_str(id);
        }
        None => {
            key.push('t');
            key.push_str(response_topic);
        }
    }
}

/// The client of an owner key, if it names one.
fn client_of(key: &str) -> Option<&str> {
    key.strip_prefix('c')
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
    owners: HashTable<Owner>,
    /// (deadline, insertion number) -> where the reply is.
    deadlines: BTreeMap<(u64, u64), Due>,
    hasher: FixedState,
    seq: u64,
    len: usize,
    /// Bytes counted for every topic, owner and entry.
    bytes: usize,
    /// The topic the last probe found, and its hash: a client's requests
    /// come in runs, and comparing with it costs less than hashing the
    /// topic again (the clone keeps its buffer, so its address stays its).
    last: Option<(Str, u64)>,
    /// The most bytes it holds ([`MAX_BYTES`] unless the store's quota
    /// gives it less: [`DedupCache::set_limit`]).
    max_bytes: usize,
    /// The last insert's owner key, its buffer kept for the next.
    owner_buf: String,
}

impl Default for DedupCache {
    fn default() -> Self {
        DedupCache::with_seed(0)
    }
}

/// What [`DedupCache::probe`] found for a request: one topic lookup.
#[derive(Debug, Clone, Default)]
pub struct Probe<'c> {
    /// The response topic, if the cache holds a reply to it: for
    /// [`DedupCache::insert_hinted`].
    pub topic: Option<TopicHint>,
    /// The cached reply to this very request, if still remembered.
    pub cached: Option<&'c Cached>,
}

/// One cached reply as [`DedupCache::iter`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Item<'c> {
    /// The request's response topic.
    pub topic: &'c str,
    /// Its correlation data.
    pub correlation: &'c [u8],
    /// The client it is charged to, if one was known.
    pub client: Option<&'c str>,
    /// The reply and when it is forgotten.
    pub cached: &'c Cached,
}

impl DedupCache {
    /// An empty cache whose hashes are keyed by `seed` (the host's
    /// `hash-seed`, so that peers cannot aim for collisions).
    pub fn with_seed(seed: u64) -> DedupCache {
        DedupCache {
            topics: HashTable::new(),
            owners: HashTable::new(),
            deadlines: BTreeMap::new(),
            hasher: FixedState::with_seed(seed ^ HASH_SEED),
            seq: 0,
            len: 0,
            bytes: 0,
            last: None,
            max_bytes: MAX_BYTES,
            owner_buf: String::new(),
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
        let remembered = last.and_then(|(at, hash)| {
            self.topics
                .find(hash, |t| t.name.as_ptr() == at)
                .map(|t| (t, hash))
        });
        let (topic, hash) = match remembered {
            Some(found) => found,
            None => {
                let hash = self.hash(response_topic.as_bytes());
                let Some(topic) = self.topics.find(hash, |t| *t.name == *response_topic) else {
                    return Probe::default();
                };
                self.last = Some((topic.name.clone(), hash));
                (topic, hash)
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
            topic: Some(TopicHint {
                name: topic.name.clone(),
                hash,
            }),
            cached,
        }
    }

    /// The cached reply for this request, if still remembered at `now`.
    pub fn get(&mut self, response_topic: &str, correlation: &[u8], now: u64) -> Option<&Cached> {
        self.probe(response_topic, Some(correlation), now).cached
    }

    /// Remembers a reply made for `client` (the identity a broker or the
    /// response topic vouches for; `None` when nobody does), then forgets
    /// the oldest entries while that client (or the cache) holds more than
    /// its bound.
    pub fn insert(
        &mut self,
        client: Option<&str>,
        response_topic: &str,
        correlation: &[u8],
        cached: Cached,
    ) {
        self.insert_hinted(client, response_topic, correlation, cached, None);
    }

    /// [`DedupCache::insert`], with `hint` what a probe for
    /// `response_topic` found, if it found the topic.
    pub fn insert_hinted(
        &mut self,
        client: Option<&str>,
        response_topic: &str,
        correlation: &[u8],
        cached: Cached,
        hint: Option<&TopicHint>,
    ) {
        debug_assert!(hint.is_none_or(|h| *h.name == *response_topic));
        let (owner, hash, over) = self.put(client, response_topic, correlation, cached, hint);
        while over
            && let Some(o) = self.owners.find(hash, |o| same(&o.key, &owner))
            && o.bytes > MAX_CLIENT_BYTES
        {
            // The owner's entry nearest its deadline.
            let Some(&key) = o.by_deadline.first() else {
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

    /// Remembers a reply, unbounded; returns its owner's key, the key's
    /// hash, and whether the owner holds more than its bound.
    fn put(
        &mut self,
        client: Option<&str>,
        response_topic: &str,
        correlation: &[u8],
        cached: Cached,
        hint: Option<&TopicHint>,
    ) -> (Str, u64, bool) {
        let at = cached.expires_at;
        // Its owner is charged for its topic's name too: a client cannot
        // spread long topics for free.
        let size = entry_bytes(correlation, &cached);
        let charge = size + response_topic.len();
        self.seq += 1;
        let seq = self.seq;
        let hasher = self.hasher.clone();
        let hash = |b: &[u8]| hasher.hash_one(b);
        let mut key = std::mem::take(&mut self.owner_buf);
        owner_key_into(&mut key, client, response_topic);
        let owner_hash = hash(key.as_bytes());
        let owner = match self.owners.find_mut(owner_hash, |o| *o.key == *key) {
            Some(owner) => owner,
            None => {
                let owner = Owner {
                    bytes: OWNER_OVERHEAD + key.len(),
                    key: Str::from(key.as_str()),
                    by_deadline: BTreeSet::new(),
                };
                self.bytes += owner.bytes;
                self.owners
                    .insert_unique(owner_hash, owner, |o| hash(o.key.as_bytes()))
                    .into_mut()
            }
        };
        owner.bytes += charge;
        let over = owner.bytes > MAX_CLIENT_BYTES;
        owner.by_deadline.insert((at, seq));
        let owner_name = owner.key.clone();
        self.owner_buf = key;
        let topic_hash = hint.map_or_else(|| hash(response_topic.as_bytes()), |h| h.hash);
        let found = match hint {
            Some(h) => self.topics.find_mut(topic_hash, |t| same(&t.name, &h.name)),
            None => self
                .topics
                .find_mut(topic_hash, |t| *t.name == *response_topic),
        };
        let topic = match found {
            Some(topic) => topic,
            None => {
                let topic = Topic {
                    name: Str::from(response_topic),
                    replies: HashTable::new(),
                };
                self.bytes += TOPIC_OVERHEAD + response_topic.len();
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
            owner: owner_name.clone(),
            owner_hash,
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
        self.bytes += size;
        match old {
            Some(old) => {
                let freed = entry_bytes(&old.correlation, &old.cached);
                self.bytes -= freed;
                let old_key = (old.cached.expires_at, old.seq);
                self.deadlines.remove(&old_key);
                self.discharge(
                    &old.owner,
                    old.owner_hash,
                    old_key,
                    freed + response_topic.len(),
                );
            }
            None => self.len += 1,
        }
        let due = Due {
            topic: name,
            topic_hash,
            corr_hash,
        };
        self.deadlines.insert((at, seq), due);
        (owner_name, owner_hash, over)
    }

    /// Takes an entry's charge off its owner, which goes once it holds none.
    fn discharge(&mut self, owner: &Str, hash: u64, key: (u64, u64), charge: usize) {
        if let Ok(mut o) = self.owners.find_entry(hash, |o| same(&o.key, owner)) {
            let o_mut = o.get_mut();
            o_mut.bytes -= charge;
            o_mut.by_deadline.remove(&key);
            if o_mut.by_deadline.is_empty() {
                let (gone, _) = o.remove();
                self.bytes -= gone.bytes;
            }
        }
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
        let Some(due) = self.deadlines.remove(&key) else {
            return;
        };
        let (name, corr_hash) = (due.topic, due.corr_hash);
        let Ok(mut topic) = self
            .topics
            .find_entry(due.topic_hash, |t| same(&t.name, &name))
        else {
            return;
        };
        let mut gone_entry = None;
        if let Ok(reply) = topic
            .get_mut()
            .replies
            .find_entry(corr_hash, |r| r.seq == key.1)
        {
            let (entry, _) = reply.remove();
            let freed = entry_bytes(&entry.correlation, &entry.cached);
            self.bytes -= freed;
            self.len -= 1;
            gone_entry = Some((entry.owner, entry.owner_hash, freed));
        }
        if topic.get().replies.is_empty() {
            let (gone, _) = topic.remove();
            self.bytes -= TOPIC_OVERHEAD + gone.name.len();
            if self.last.as_ref().is_some_and(|(n, _)| *n == gone.name) {
                self.last = None;
            }
        }
        if let Some((owner, owner_hash, freed)) = gone_entry {
            self.discharge(&owner, owner_hash, key, freed + name.len());
        }
    }

    /// Bytes counted for every entry and topic held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes charged to `client` (its entries, whatever their topics).
    pub fn client_bytes(&self, client: Option<&str>, response_topic: &str) -> usize {
        let key = owner_key(client, response_topic);
        self.owners
            .find(self.hash(key.as_bytes()), |o| *o.key == *key)
            .map_or(0, |o| o.bytes)
    }

    /// When the next entry is forgotten.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first_key_value().map(|((at, _), _)| *at)
    }

    /// Every entry, ordered by response topic then correlation data (an
    /// order that does not depend on the hash seed), for inspection and
    /// tests; snapshots walk [`DedupCache::by_deadline_after`], which sorts
    /// nothing.
    pub fn iter(&self) -> impl Iterator<Item = Item<'_>> {
        let mut all: Vec<Item<'_>> = self
            .topics
            .iter()
            .flat_map(|t| {
                t.replies.iter().map(move |r| Item {
                    topic: &t.name,
                    correlation: &r.correlation,
                    client: client_of(&r.owner),
                    cached: &r.cached,
                })
            })
            .collect();
        all.sort_unstable_by(|a, b| (a.topic, a.correlation).cmp(&(b.topic, b.correlation)));
        all.into_iter()
    }

    /// Every entry after the deadline key `after` (from the first when
    /// `None`), in the order they are forgotten in (deadline, then
    /// arrival), each with its key: what a snapshot in parts walks.
    pub fn by_deadline_after(
        &self,
        after: Option<(u64, u64)>,
    ) -> impl Iterator<Item = ((u64, u64), Item<'_>)> {
        use core::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, Excluded);
        self.deadlines
            .range((from, Unbounded))
            .filter_map(|(&key, due)| self.item_at(due, key.1).map(|item| (key, item)))
    }

    /// The entry `due` names whose insertion number is `seq`.
    fn item_at(&self, due: &Due, seq: u64) -> Option<Item<'_>> {
        let t = self
            .topics
            .find(due.topic_hash, |t| same(&t.name, &due.topic))?;
        let r = t.replies.find(due.corr_hash, |r| r.seq == seq)?;
        Some(Item {
            topic: &t.name,
            correlation: &r.correlation,
            client: client_of(&r.owner),
            cached: &r.cached,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(_topic: &str, n: u8, expires_at: u64) -> Cached {
        Cached {
            expires_at,
            reply: Reply::ok(vec![n], None),
        }
    }

    /// The walk a snapshot takes lists every entry once, in the order they
    /// are forgotten, with its current reply: a replaced entry under its
    /// new deadline only, and nothing once forgotten.
    #[test]
    fn the_deadline_walk_lists_each_entry_once_as_it_is_now() {
        let mut c = DedupCache::with_seed(3);
        c.insert(Some("x"), "t", b"1", cached("t", 1, 100));
        c.insert(Some("x"), "t", b"2", cached("t", 2, 200));
        c.insert(None, "u", b"1", cached("u", 3, 150));
        c.insert(Some("x"), "t", b"1", cached("t", 4, 300));
        let walk = |c: &DedupCache, after| {
            c.by_deadline_after(after)
                .map(|(k, i)| {
                    (
                        k,
                        i.topic.to_string(),
                        i.correlation.to_vec(),
                        i.cached.reply.payload[0],
                    )
                })
                .collect::<Vec<_>>()
        };
        let all = walk(&c, None);
        let got: Vec<_> = all
            .iter()
            .map(|(k, t, corr, n)| (k.0, t.as_str(), corr.as_slice(), *n))
            .collect();
        assert_eq!(
            got,
            [
                (150, "u", &b"1"[..], 3),
                (200, "t", b"2", 2),
                (300, "t", b"1", 4)
            ]
        );
        // Resumed after the first key, as a snapshot's next part is.
        assert_eq!(walk(&c, Some(all[0].0)), all[1..]);
        c.evict(200, usize::MAX);
        let left: Vec<_> = walk(&c, None)
            .into_iter()
            .map(|(_, t, _, n)| (t, n))
            .collect();
        assert_eq!(left, [("t".to_string(), 4)]);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn insert_get_replace_evict() {
        let mut c = DedupCache::with_seed(7);
        c.insert(None, "a/b", b"1", cached("a/b", 1, 100));
        c.insert(None, "a/b", b"2", cached("a/b", 2, 200));
        c.insert(None, "c", b"1", cached("c", 3, 150));
        assert_eq!(c.len(), 3);
        assert_eq!(c.get("a/b", b"1", 99).map(|c| c.reply.payload[0]), Some(1));
        assert_eq!(c.get("a/b", b"1", 100), None, "expired at its deadline");
        assert_eq!(c.get("a/b", b"3", 0), None);
        assert_eq!(c.get("a/bx", b"1", 0), None);
        let known =
            |c: &mut DedupCache, t: &str| c.probe(t, None, 0).topic.map(|s| s.name().to_string());
        assert_eq!(known(&mut c, "a/b").as_deref(), Some("a/b"));
        assert_eq!(known(&mut c, "a/b").as_deref(), Some("a/b"), "remembered");
        assert_eq!(known(&mut c, "a/bc"), None);
        // Replacing keeps one entry and moves its deadline.
        c.insert(None, "a/b", b"1", cached("a/b", 4, 300));
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
        c.insert(None, "a/b", b"9", cached("a/b", 9, 400));
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
        c.insert(None, "quiet", b"q", cached("quiet", 1, 10_000));
        for i in 0..200u32 {
            c.insert(
                None,
                "flood",
                &i.to_be_bytes(),
                big(i, 20_000 + u64::from(i)),
            );
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
            1 + MAX_CLIENT_BYTES.saturating_sub(OWNER_OVERHEAD + 6) / (per_entry + 5)
        );
        // Many clients: the whole cache is bounded.
        for t in 0..20u32 {
            let topic = format!("client-{t}");
            for i in 0..60u32 {
                c.insert(
                    None,
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
        c.insert(None, "t", b"long", entry(1_000_000));
        for i in 0..100u32 {
            c.insert(None, "t", &i.to_be_bytes(), entry(1_000 + u64::from(i)));
        }
        assert!(
            c.get("t", b"long", 0).is_some(),
            "the long-lived entry stays"
        );
        assert!(c.get("t", &0u32.to_be_bytes(), 0).is_none());
        assert!(c.get("t", &99u32.to_be_bytes(), 0).is_some());
    }

    /// An insert handed what its request's probe found of the topic leaves
    /// the cache as one looked up by name does, through replacements,
    /// bounds and evictions, and with a stale hint (its topic gone since).
    #[test]
    fn an_insert_with_the_probes_hint_is_an_insert() {
        let (mut hinted, mut plain) = (DedupCache::with_seed(3), DedupCache::with_seed(3));
        hinted.set_limit(4_000);
        plain.set_limit(4_000);
        let topics = ["clients/a/response", "clients/b/response", "t"];
        let mut first: std::collections::HashMap<&str, TopicHint> = Default::default();
        for i in 0..200u64 {
            let topic = topics[(i % 3) as usize];
            let corr = (i % 7).to_be_bytes();
            let client = (i % 2 == 0).then_some("a");
            let at = 1_000 + i * 10;
            let hint = hinted.probe(topic, Some(&corr), at).topic;
            if let Some(h) = &hint {
                first.entry(topic).or_insert_with(|| h.clone());
            }
            // Now and then the topic's first hint, its topic maybe gone since.
            let hint = match i % 10 == 9 {
                true => first.get(topic).cloned().or(hint),
                false => hint,
            };
            hinted.insert_hinted(
                client,
                topic,
                &corr,
                cached(topic, i as u8, at + 60),
                hint.as_ref(),
            );
            plain.insert(client, topic, &corr, cached(topic, i as u8, at + 60));
            if i % 20 == 19 {
                assert_eq!(hinted.evict(at, 5), plain.evict(at, 5));
            }
            let items = |c: &DedupCache| {
                c.iter()
                    .map(|it| {
                        (
                            it.topic.to_string(),
                            it.correlation.to_vec(),
                            it.client.map(str::to_string),
                            it.cached.clone(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(items(&hinted), items(&plain), "after insert {i}");
            assert_eq!(hinted.bytes(), plain.bytes());
            assert_eq!(
                hinted.client_bytes(client, topic),
                plain.client_bytes(client, topic)
            );
        }
        assert!(hinted.len() > 10, "the cache held entries throughout");
        // A hint whose topic went (every entry forgotten) since the probe.
        let hint = hinted.probe("t", None, 0).topic;
        assert!(hint.is_some());
        for c in [&mut hinted, &mut plain] {
            c.evict(u64::MAX, usize::MAX);
            assert!(c.is_empty());
            assert_eq!(c.bytes(), 0);
        }
        hinted.insert_hinted(None, "t", b"x", cached("t", 1, 10), hint.as_ref());
        plain.insert(None, "t", b"x", cached("t", 1, 10));
        assert_eq!(hinted.bytes(), plain.bytes());
        assert_eq!(hinted.get("t", b"x", 0), plain.get("t", b"x", 0));
        assert!(hinted.get("t", b"x", 0).is_some());
    }

    /// A client is bounded over all its response topics: spreading its
    /// requests over new topics forgets its own oldest entries, never
    /// another client's, and the topics and owners it leaves are counted
    /// off again.
    #[test]
    fn a_client_is_bounded_whatever_topics_it_uses() {
        let entry = |at: u64| Cached {
            expires_at: at,
            reply: Reply::ok(vec![0u8; 16 << 10], None),
        };
        let mut c = DedupCache::with_seed(9);
        c.insert(Some("quiet"), "clients/quiet/r", b"q", entry(1_000));
        for i in 0..2_000u32 {
            let topic = format!("flood/{i}");
            c.insert(Some("flooder"), &topic, b"x", entry(2_000 + u64::from(i)));
            assert!(c.client_bytes(Some("flooder"), "") <= MAX_CLIENT_BYTES);
        }
        assert!(
            c.get("clients/quiet/r", b"q", 0).is_some(),
            "the quiet client keeps its entry"
        );
        assert!(c.get("flood/1999", b"x", 0).is_some(), "the newest stays");
        assert!(c.get("flood/0", b"x", 0).is_none(), "the oldest went");
        assert!(c.bytes() < MAX_CLIENT_BYTES + (64 << 10), "{}", c.bytes());
        // Unattributed requests are bounded per topic, apart from clients.
        c.insert(None, "flood/1999", b"y", entry(5_000));
        assert!(c.get("flood/1999", b"x", 0).is_some());
        assert_eq!(c.iter().filter(|i| i.client.is_none()).count(), 1);
        assert!(c.iter().filter(|i| i.client == Some("flooder")).count() > 200);
        // Another client replacing an entry takes its charge over.
        c.insert(Some("quiet"), "flood/1999", b"x", entry(6_000));
        assert_eq!(
            c.iter()
                .find(|i| i.topic == "flood/1999" && i.correlation == b"x")
                .and_then(|i| i.client),
            Some("quiet")
        );
        c.evict(u64::MAX, usize::MAX);
        assert_eq!((c.len(), c.bytes()), (0, 0));
        assert_eq!(c.client_bytes(Some("flooder"), ""), 0);
    }

    #[test]
    fn iteration_is_ordered_whatever_the_seed() {
        let fill = |seed| {
            let mut c = DedupCache::with_seed(seed);
            for i in (0..50u8).rev() {
                let topic = format!("t/{}", i % 7);
                c.insert(
                    None,
                    &topic,
                    &[i, 1],
                    cached(&topic, i, 1000 + u64::from(i)),
                );
            }
            c.iter()
                .map(|i| {
                    (
                        i.topic.to_string(),
                        i.correlation.to_vec(),
                        i.cached.reply.payload[0],
                    )
                })
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
