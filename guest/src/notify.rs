//! KEYNOTIFY registrations and notification topics (spec §11, §2.3).

use std::collections::{BTreeMap, BTreeSet};

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
/// made it (the latest, if made again).
#[derive(Debug, Clone, Default)]
struct Observer {
    keys: BTreeMap<Box<[u8]>, Option<Via>>,
    bytes: usize,
}

impl Registry {
    /// Registers `client` for `key` through `via` (idempotent: made again,
    /// it is through the new `via`), unless that would take the client or
    /// the store past its limits.
    pub fn register(
        &mut self,
        client: &str,
        key: &[u8],
        via: Option<Via>,
    ) -> Result<(), LimitReached> {
        let cost = registration_bytes(client, key);
        let (count, bytes) = match self.by_client.get_mut(client) {
            Some(o) => match o.keys.get_mut(key) {
                Some(held) => {
                    *held = via;
                    return Ok(());
                }
                None => (o.keys.len(), o.bytes),
            },
            None => (0, 0),
        };
        if count >= MAX_PER_CLIENT
            || bytes + cost > MAX_CLIENT_BYTES
            || self.count >= MAX_TOTAL
            || self.bytes + cost > self.limit.unwrap_or(MAX_TOTAL_BYTES)
        {
            return Err(LimitReached);
        }
        self.insert(client, key, via);
        Ok(())
    }

    /// Holds at most `bytes` of registrations (at most [`MAX_TOTAL_BYTES`])
    /// from the next registration on.
    pub fn set_limit(&mut self, bytes: usize) {
        self.limit = Some(bytes.min(MAX_TOTAL_BYTES));
    }

    /// Registers `client` for `key` whatever the limits (restoring a
    /// snapshot: what was held before is held again).
    pub fn restore(&mut self, client: &str, key: &[u8], via: Option<Via>) {
        self.insert(client, key, via);
    }

    fn insert(&mut self, client: &str, key: &[u8], via: Option<Via>) {
        let observer = self.by_client.entry(client.to_string()).or_default();
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
                self.by_client.remove(client);
            }
        }
        true
    }

    /// Drops every registration of `client`; how many there were.
    pub fn drop_client(&mut self, client: &str) -> usize {
        let Some(Observer { keys, bytes }) = self.by_client.remove(client) else {
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

    /// Whether anyone observes `key`.
    pub fn is_observed(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// Every registration, ordered by client then key, with its `via`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8], Option<Via>)> {
        self.by_client
            .iter()
            .flat_map(|(c, o)| o.keys.iter().map(move |(k, v)| (c.as_str(), &**k, *v)))
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
        r.register("c2", b"k", None).expect("room");
        r.register("c1", b"k", None).expect("room");
        r.register("c1", b"k", None).expect("room");
        r.register("c1", b"j", None).expect("room");
        assert_eq!(r.observers(b"k").collect::<Vec<_>>(), ["c1", "c2"]);
        assert_eq!(r.len(), 3);
        assert!(r.unregister("c2", b"k"));
        assert!(!r.unregister("c2", b"k"));
        assert_eq!(r.drop_client("c1"), 2);
        assert!(r.is_empty());
        assert_eq!((r.len(), r.bytes()), (0, 0));
        assert!(!r.is_observed(b"k"));
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
        r.register("c", b"via-a1", Some(a1)).expect("room");
        r.register("c", b"moved", Some(a1)).expect("room");
        r.register("c", b"via-b", Some(b)).expect("room");
        r.register("c", b"untagged", None).expect("room");
        r.register("c", b"via-a2", Some(a2)).expect("room");
        // Made again through B: now B's.
        r.register("c", b"moved", Some(b)).expect("room");
        r.register("other", b"via-a1", Some(a1)).expect("room");
        assert_eq!(r.drop_via("c", a1), 2, "via-a1 and untagged");
        let keys = |r: &Registry| -> Vec<(String, Vec<u8>)> {
            r.iter()
                .map(|(c, k, _)| (c.to_string(), k.to_vec()))
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
        r.register("d", b"k", Some(a1)).expect("room");
        r.register("d", b"j", Some(a2)).expect("room");
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
            r.register("flood", format!("k{i}").as_bytes(), None)
                .expect("room");
        }
        assert_eq!(r.register("flood", b"one-more", None), Err(LimitReached));
        assert_eq!(r.register("flood", b"k7", None), Ok(()), "already held");
        r.register("owner", b"k", None)
            .expect("another client has its own share");
        assert!(r.unregister("flood", b"k0"));
        r.register("flood", b"one-more", None).expect("room again");
        // Bytes: big keys reach the byte bound before the count.
        let big = vec![b'x'; 64 << 10];
        let mut n = 0;
        while r.register("big", &[&big[..], &[n]].concat(), None).is_ok() {
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
                    .register(&format!("c{c}"), format!("{k}").as_bytes(), None)
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
