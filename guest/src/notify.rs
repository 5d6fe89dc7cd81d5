//! KEYNOTIFY registrations and notification topics (spec §11, §2.3).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use crate::authz::{Attributes, Principal};
pub use crate::rpc::MAX_TOPIC_LEN;
use crate::rpc::STORE_ID;
use crate::types::Via;

/// The most registrations one client may hold.
pub const MAX_PER_CLIENT: usize = 1_000;
/// The most bytes one client's registrations may take.
pub const MAX_CLIENT_BYTES: usize = 1 << 20;
/// The most registrations a store holds.
pub const MAX_TOTAL: usize = 100_000;
/// The most bytes a store's registrations take.
pub const MAX_TOTAL_BYTES: usize = 64 << 20;

/// What one registration is counted for: the key and the client id, each
/// held in both indexes, and the nodes that hold them.
pub fn registration_bytes(client: &str, key: &[u8]) -> usize {
    96 + 2 * (client.len() + key.len())
}

/// A registration refused: the client or the store holds as many (or as
/// many bytes of) registrations as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReached;

/// The set of (client, key) registrations, indexed both ways, and what they
/// hold (bounded per client and in all: see [`MAX_PER_CLIENT`] and the
/// other limits).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_key: BTreeMap<Box<[u8]>, BTreeSet<String>>,
    by_client: BTreeMap<String, Observer>,
    count: usize,
    bytes: usize,
    /// Fewer bytes than [`MAX_TOTAL_BYTES`], if the store's quota says so.
    limit: Option<usize>,
}

/// One client's registrations, each with the `via` of the request that
/// made it (the latest, if made again), and who the client was when it last
/// registered.
#[derive(Debug, Clone, Default)]
struct Observer {
    keys: BTreeMap<Box<[u8]>, Option<Via>>,
    /// The bytes of its registrations and of `watcher`.
    bytes: usize,
    watcher: Watcher,
}

/// Who a client was when it registered: its user name and attributes, as
/// its KEYNOTIFY request carried them. Every notification is checked
/// against the authorization rules in force as this principal, so a
/// registration gives nothing the rules no longer give (a reload that
/// takes a key's read right away stops its notifications).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watcher {
    /// Its authenticated user name.
    pub username: Option<String>,
    /// Its attributes.
    pub attributes: Vec<(String, String)>,
}

impl Watcher {
    /// The user name and attributes of `p`.
    pub fn of(p: &Principal<'_>) -> Watcher {
        Watcher {
            username: p.username.map(str::to_string),
            attributes: p
                .attributes
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The principal the rules see: `client`, as this.
    pub fn principal<'a>(&'a self, client: &'a str) -> Principal<'a> {
        Principal {
            client_id: Some(client),
            username: self.username.as_deref(),
            attributes: Attributes::Owned(&self.attributes),
        }
    }

    /// What it is counted for.
    fn bytes(&self) -> usize {
        self.username.as_ref().map_or(0, String::len)
            + self
                .attributes
                .iter()
                .map(|(n, v)| 48 + n.len() + v.len())
                .sum::<usize>()
    }
}

impl Registry {
    /// Registers `client` for `key` through `via` (idempotent: made again,
    /// it is through the new `via`), unless that would take the client or
    /// the store past its limits.
    /// The client is `watcher` from then on, for all its registrations.
    pub fn register(
        &mut self,
        client: &str,
        key: &[u8],
        via: Option<Via>,
        watcher: &Watcher,
    ) -> Result<(), LimitReached> {
        let (count, bytes, held, was) = match self.by_client.get(client) {
            Some(o) => (
                o.keys.len(),
                o.bytes,
                o.keys.contains_key(key),
                o.watcher.bytes(),
            ),
            None => (0, 0, false, 0),
        };
        let cost = if held {
            0
        } else {
            registration_bytes(client, key)
        };
        let grows = (cost + watcher.bytes()).saturating_sub(was);
        if (!held && count >= MAX_PER_CLIENT)
            || bytes + grows > MAX_CLIENT_BYTES
            || (!held && self.count >= MAX_TOTAL)
            || self.bytes + grows > self.limit.unwrap_or(MAX_TOTAL_BYTES)
        {
            return Err(LimitReached);
        }
        self.insert(client, key, via, watcher);
        Ok(())
    }

    /// Holds at most `bytes` of registrations (at most [`MAX_TOTAL_BYTES`])
    /// from the next registration on.
    pub fn set_limit(&mut self, bytes: usize) {
        self.limit = Some(bytes.min(MAX_TOTAL_BYTES));
    }

    /// Registers `client` for `key` whatever the limits (restoring a
    /// snapshot: what was held before is held again).
    pub fn restore(&mut self, client: &str, key: &[u8], via: Option<Via>, watcher: &Watcher) {
        self.insert(client, key, via, watcher);
    }

    fn insert(&mut self, client: &str, key: &[u8], via: Option<Via>, watcher: &Watcher) {
        let observer = self.by_client.entry(client.to_string()).or_default();
        if observer.watcher != *watcher {
            let (was, is) = (observer.watcher.bytes(), watcher.bytes());
            observer.bytes = observer.bytes - was + is;
            self.bytes = self.bytes - was + is;
            observer.watcher = watcher.clone();
        }
        if observer.keys.insert(key.into(), via).is_some() {
            return;
        }
        let cost = registration_bytes(client, key);
        observer.bytes += cost;
        self.count += 1;
        self.bytes += cost;
        self.by_key
            .entry(key.into())
            .or_default()
            .insert(client.to_string());
    }

    /// Removes a registration; whether it existed.
    pub fn unregister(&mut self, client: &str, key: &[u8]) -> bool {
        let Some(clients) = self.by_key.get_mut(key) else {
            return false;
        };
        if !clients.remove(client) {
            return false;
        }
        if clients.is_empty() {
            self.by_key.remove(key);
        }
        if let Some(observer) = self.by_client.get_mut(client)
            && observer.keys.remove(key).is_some()
        {
            let cost = registration_bytes(client, key);
            observer.bytes -= cost;
            self.count -= 1;
            self.bytes -= cost;
            if observer.keys.is_empty() {
                self.bytes -= observer.bytes;
                self.by_client.remove(client);
            }
        }
        true
    }

    /// Drops every registration of `client`; how many there were.
    pub fn drop_client(&mut self, client: &str) -> usize {
        let Some(Observer { keys, bytes, .. }) = self.by_client.remove(client) else {
            return 0;
        };
        self.count -= keys.len();
        self.bytes -= bytes;
        for key in keys.keys() {
            if let Some(clients) = self.by_key.get_mut(key) {
                clients.remove(client);
                if clients.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        keys.len()
    }

    /// `client` went away from the replica and life of `via`: drops its
    /// registrations made through that replica in that life or an earlier
    /// one, and those made with no `via`; how many there were. What it
    /// registered through another replica, or a later life of this one,
    /// stays (that connection is not the one that ended).
    pub fn drop_via(&mut self, client: &str, via: Via) -> usize {
        let gone = |held: &Option<Via>| {
            held.is_none_or(|h| h.replica == via.replica && h.started <= via.started)
        };
        self.drop_where(Some(client), gone)
    }

    /// The replica of `via` started the life of `via`: drops every
    /// registration made through it in an earlier life; how many there
    /// were. Visits every registration (a replica starts rarely).
    pub fn drop_replica(&mut self, via: Via) -> usize {
        let gone = |held: &Option<Via>| {
            held.is_some_and(|h| h.replica == via.replica && h.started < via.started)
        };
        self.drop_where(None, gone)
    }

    /// Drops the registrations (of `client`, or of everyone) whose `via`
    /// is `gone`.
    fn drop_where(&mut self, client: Option<&str>, gone: impl Fn(&Option<Via>) -> bool) -> usize {
        let observers: Box<dyn Iterator<Item = (&String, &Observer)>> = match client {
            Some(c) => Box::new(self.by_client.get_key_value(c).into_iter()),
            None => Box::new(self.by_client.iter()),
        };
        let doomed: Vec<(String, Box<[u8]>)> = observers
            .flat_map(|(c, o)| {
                o.keys
                    .iter()
                    .filter(|(_, v)| gone(v))
                    .map(move |(k, _)| (c.clone(), k.clone()))
            })
            .collect();
        for (c, k) in &doomed {
            self.unregister(c, k);
        }
        doomed.len()
    }

    /// The clients observing `key`, in a fixed (sorted) order.
    pub fn observers(&self, key: &[u8]) -> impl Iterator<Item = &str> {
        self.by_key
            .get(key)
            .into_iter()
            .flat_map(|clients| clients.iter().map(String::as_str))
    }

    /// The clients observing `key` with who each is, in the same order.
    pub fn watchers(&self, key: &[u8]) -> impl Iterator<Item = (&str, &Watcher)> {
        self.observers(key).filter_map(|c| {
            self.by_client
                .get_key_value(c)
                .map(|(c, o)| (c.as_str(), &o.watcher))
        })
    }

    /// Whether anyone observes `key`.
    pub fn is_observed(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// Every registration, ordered by client then key, with its `via`
    /// and its client's watcher.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8], Option<Via>, &Watcher)> {
        self.by_client.iter().flat_map(|(c, o)| {
            o.keys
                .iter()
                .map(move |(k, v)| (c.as_str(), &**k, *v, &o.watcher))
        })
    }

    /// [`Registry::iter`] from the registration after `after` (client,
    /// key) on: a snapshot in parts goes on where it stopped without
    /// walking what it wrote.
    pub fn iter_after<'a>(
        &'a self,
        after: Option<(&'a str, &'a [u8])>,
    ) -> impl Iterator<Item = (&'a str, &'a [u8], Option<Via>, &'a Watcher)> + 'a {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let from: Bound<&str> = after.map_or(Unbounded, |(c, _)| Included(c));
        self.by_client
            .range::<str, _>((from, Unbounded))
            .flat_map(move |(c, o)| {
                let keys: Bound<&[u8]> = match after {
                    Some((ac, ak)) if ac == c.as_str() => Excluded(ak),
                    _ => Unbounded,
                };
                o.keys
                    .range::<[u8], _>((keys, Unbounded))
                    .map(move |(k, v)| (c.as_str(), &**k, *v, &o.watcher))
            })
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Bytes counted for the registrations.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }
}

/// Length of the notification topic for this client and key.
pub fn topic_len(client: &str, key: &[u8]) -> usize {
    75 + 2 * client.len() + 2 * key.len()
}

/// `clients/statestore/v1/<store id>/<HEX(client)>/command/notify/<HEX(key)>`,
/// upper-case hex for both segments.
pub fn topic(client: &str, key: &[u8]) -> String {
    let mut t = String::with_capacity(topic_len(client, key));
    t.push_str("clients/statestore/v1/");
    t.push_str(STORE_ID);
    t.push('/');
    push_hex(&mut t, client.as_bytes());
    t.push_str("/command/notify/");
    push_hex(&mut t, key);
    t
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOBODY: Watcher = Watcher {
        username: None,
        attributes: Vec::new(),
    };

    #[test]
    fn article_topic() {
        let t = topic("client-id1", b"SOMEKEY");
        assert_eq!(
            t,
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
        );
        assert_eq!(t.len(), topic_len("client-id1", b"SOMEKEY"));
    }

    #[test]
    fn registry_both_ways() {
        let mut r = Registry::default();
        r.register("c2", b"k", None, &NOBODY).expect("room");
        r.register("c1", b"k", None, &NOBODY).expect("room");
        r.register("c1", b"k", None, &NOBODY).expect("room");
        r.register("c1", b"j", None, &NOBODY).expect("room");
        assert_eq!(r.observers(b"k").collect::<Vec<_>>(), ["c1", "c2"]);
        assert_eq!(r.len(), 3);
        assert!(r.unregister("c2", b"k"));
        assert!(!r.unregister("c2", b"k"));
        assert_eq!(r.drop_client("c1"), 2);
        assert!(r.is_empty());
        assert_eq!((r.len(), r.bytes()), (0, 0));
        assert!(!r.is_observed(b"k"));
        // Who registered is counted once per client, and freed with it.
        let who = Watcher {
            username: Some("alice".into()),
            attributes: vec![("team".into(), "red".into())],
        };
        r.register("c1", b"k", None, &who).expect("room");
        r.register("c1", b"j", None, &who).expect("room");
        assert_eq!(
            r.bytes(),
            registration_bytes("c1", b"k") + registration_bytes("c1", b"j") + who.bytes()
        );
        assert_eq!(r.watchers(b"k").collect::<Vec<_>>(), [("c1", &who)]);
        r.register("c1", b"k", None, &NOBODY).expect("room");
        assert_eq!(r.watchers(b"j").collect::<Vec<_>>(), [("c1", &NOBODY)]);
        assert!(r.unregister("c1", b"k"));
        assert!(r.unregister("c1", b"j"));
        assert_eq!((r.len(), r.bytes()), (0, 0));
        r.register("c1", b"k", None, &who).expect("room");
        assert_eq!(r.drop_client("c1"), 1);
        assert_eq!((r.len(), r.bytes()), (0, 0));
    }

    /// A disconnect reported by a replica drops what was registered through
    /// it (in that life or before, or with no via), not what the client has
    /// registered since through another replica; a replica's new life drops
    /// what its earlier lives' connections registered.
    #[test]
    fn disconnects_drop_what_was_registered_through_their_replica() {
        let a1 = Via {
            replica: 1,
            started: 100,
        };
        let a2 = Via {
            replica: 1,
            started: 200,
        };
        let b = Via {
            replica: 2,
            started: 50,
        };
        let mut r = Registry::default();
        r.register("c", b"via-a1", Some(a1), &NOBODY).expect("room");
        r.register("c", b"moved", Some(a1), &NOBODY).expect("room");
        r.register("c", b"via-b", Some(b), &NOBODY).expect("room");
        r.register("c", b"untagged", None, &NOBODY).expect("room");
        r.register("c", b"via-a2", Some(a2), &NOBODY).expect("room");
        // Made again through B: now B's.
        r.register("c", b"moved", Some(b), &NOBODY).expect("room");
        r.register("other", b"via-a1", Some(a1), &NOBODY)
            .expect("room");
        assert_eq!(r.drop_via("c", a1), 2, "via-a1 and untagged");
        let keys = |r: &Registry| -> Vec<(String, Vec<u8>)> {
            r.iter()
                .map(|(c, k, _, _)| (c.to_string(), k.to_vec()))
                .collect()
        };
        assert_eq!(
            keys(&r),
            [
                ("c".into(), b"moved".to_vec()),
                ("c".into(), b"via-a2".to_vec()),
                ("c".into(), b"via-b".to_vec()),
                ("other".into(), b"via-a1".to_vec()),
            ]
        );
        // A's second life starting drops what A's first life registered.
        r.register("d", b"k", Some(a1), &NOBODY).expect("room");
        r.register("d", b"j", Some(a2), &NOBODY).expect("room");
        assert_eq!(r.drop_replica(a2), 2, "other's and d's of a1");
        assert_eq!(
            keys(&r),
            [
                ("c".into(), b"moved".to_vec()),
                ("c".into(), b"via-a2".to_vec()),
                ("c".into(), b"via-b".to_vec()),
                ("d".into(), b"j".to_vec()),
            ]
        );
        assert!(!r.is_observed(b"k"));
        // A disconnect from a later life drops the earlier life's too.
        assert_eq!(r.drop_via("c", a2), 1);
        assert_eq!(r.drop_via("c", a2), 0);
        assert_eq!(r.observers(b"moved").collect::<Vec<_>>(), ["c"]);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r.bytes(),
            registration_bytes("c", b"moved")
                + registration_bytes("c", b"via-b")
                + registration_bytes("d", b"j")
        );
    }

    /// A client cannot hold more than its share, nor the store more than
    /// its bound; re-registering is free, and what was dropped frees room.
    #[test]
    fn registrations_are_bounded() {
        let mut r = Registry::default();
        for i in 0..MAX_PER_CLIENT {
            r.register("flood", format!("k{i}").as_bytes(), None, &NOBODY)
                .expect("room");
        }
        assert_eq!(
            r.register("flood", b"one-more", None, &NOBODY),
            Err(LimitReached)
        );
        assert_eq!(
            r.register("flood", b"k7", None, &NOBODY),
            Ok(()),
            "already held"
        );
        r.register("owner", b"k", None, &NOBODY)
            .expect("another client has its own share");
        assert!(r.unregister("flood", b"k0"));
        r.register("flood", b"one-more", None, &NOBODY)
            .expect("room again");
        // Bytes: big keys reach the byte bound before the count.
        let big = vec![b'x'; 64 << 10];
        let mut n = 0;
        while r
            .register("big", &[&big[..], &[n]].concat(), None, &NOBODY)
            .is_ok()
        {
            n += 1;
        }
        assert!(usize::from(n) < MAX_PER_CLIENT);
        assert!(usize::from(n) * registration_bytes("big", &big) <= MAX_CLIENT_BYTES);
        // The store's bound, across many clients.
        let mut total = Registry::default();
        let mut refused = false;
        'fill: for c in 0..=MAX_TOTAL / MAX_PER_CLIENT {
            for k in 0..MAX_PER_CLIENT {
                if total
                    .register(&format!("c{c}"), format!("{k}").as_bytes(), None, &NOBODY)
                    .is_err()
                {
                    refused = true;
                    break 'fill;
                }
            }
        }
        assert!(refused);
        assert_eq!(total.len(), MAX_TOTAL);
        assert!(total.bytes() <= MAX_TOTAL_BYTES);
    }
}
