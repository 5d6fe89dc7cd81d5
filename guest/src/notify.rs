//! KEYNOTIFY registrations and notification topics (spec §11, §2.3).

use std::collections::{BTreeMap, BTreeSet};

pub use crate::rpc::MAX_TOPIC_LEN;
use crate::rpc::STORE_ID;

/// The set of (client, key) registrations, indexed both ways.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_key: BTreeMap<Box<[u8]>, BTreeSet<String>>,
    by_client: BTreeMap<String, BTreeSet<Box<[u8]>>>,
}

impl Registry {
    /// Registers `client` for `key` (idempotent).
    pub fn register(&mut self, client: &str, key: &[u8]) {
        self.by_key
            .entry(key.into())
            .or_default()
            .insert(client.to_string());
        self.by_client
            .entry(client.to_string())
            .or_default()
            .insert(key.into());
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
        if let Some(keys) = self.by_client.get_mut(client) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_client.remove(client);
            }
        }
        true
    }

    /// Drops every registration of `client`; how many there were.
    pub fn drop_client(&mut self, client: &str) -> usize {
        let Some(keys) = self.by_client.remove(client) else {
            return 0;
        };
        for key in &keys {
            if let Some(clients) = self.by_key.get_mut(key) {
                clients.remove(client);
                if clients.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        keys.len()
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

    /// Every registration, ordered by client then key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.by_client
            .iter()
            .flat_map(|(c, keys)| keys.iter().map(move |k| (c.as_str(), &**k)))
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.by_client.values().map(BTreeSet::len).sum()
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
        r.register("c2", b"k");
        r.register("c1", b"k");
        r.register("c1", b"k");
        r.register("c1", b"j");
        assert_eq!(r.observers(b"k").collect::<Vec<_>>(), ["c1", "c2"]);
        assert_eq!(r.len(), 3);
        assert!(r.unregister("c2", b"k"));
        assert!(!r.unregister("c2", b"k"));
        assert_eq!(r.drop_client("c1"), 2);
        assert!(r.is_empty());
        assert!(!r.is_observed(b"k"));
    }
}
