//! Which of a replica's clients registered KEYNOTIFY, and in which
//! partitions: a client's disconnect is an entry (`disconnected-via`) only
//! in the groups where it may have registered something through this
//! replica, not in every group for every client.

use std::collections::{BTreeSet, HashMap};

use statestore_guest::command::{Command, parse};

/// The most clients tracked (each client id that ever registered through
/// this replica in its life); past it, a client not tracked is taken to
/// have registered everywhere (its disconnect goes to every group, as it
/// would without tracking).
pub(super) const MAX_TRACKED: usize = 100_000;

/// Clients that sent KEYNOTIFY through this replica, with the partitions
/// of the keys they sent it for.
#[derive(Debug, Default)]
pub(super) struct Observers {
    by_client: HashMap<String, BTreeSet<u32>>,
    /// Some client was not tracked (past [`MAX_TRACKED`]).
    overflowed: bool,
}

/// Where a client's disconnect goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Gone {
    /// Nowhere: it registered nothing through this replica.
    Nowhere,
    /// To these partitions' groups.
    To(Vec<u32>),
    /// To every group.
    Everywhere,
}

/// The name a request's registrations are kept under, as the guest takes
/// it: the client id the broker vouches for, else `__srcId`, `$partition`,
/// `__invId` (an external broker's requests); empty ones do not count.
fn identity(m: &crate::InboundMessage) -> Option<&str> {
    let property = |name: &str| {
        m.user_properties
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    };
    m.client_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .or_else(|| property("__srcId"))
        .or_else(|| property("$partition"))
        .or_else(|| property("__invId"))
}

impl Observers {
    /// Notes the KEYNOTIFY requests (registrations; a STOP may leave
    /// others of the client's) among `messages`, in a store of `count`
    /// partitions.
    pub(super) fn note(&mut self, messages: &[crate::InboundMessage], count: u32) {
        for m in messages {
            let Ok(Command::KeyNotify { key, .. }) = parse(&m.payload) else {
                continue;
            };
            let Some(client) = identity(m) else {
                // Registered under no name we can tell: unknown clients'
                // disconnects go everywhere from now on.
                self.overflowed = true;
                continue;
            };
            let p = crate::cluster::partition::partition_of(key, count);
            if let Some(set) = self.by_client.get_mut(client) {
                set.insert(p);
            } else if self.by_client.len() < MAX_TRACKED {
                self.by_client
                    .insert(client.to_string(), BTreeSet::from([p]));
            } else {
                self.overflowed = true;
            }
        }
    }

    /// Client `client` went away: where its disconnect goes. It stays
    /// tracked: a client that reconnects under the same id may register
    /// again before its old session's disconnect is reported (which then
    /// drops those too, as the guest cannot tell sessions apart), and its
    /// next disconnect must still reach them.
    pub(super) fn gone(&self, client: &str) -> Gone {
        match self.by_client.get(client) {
            Some(set) => Gone::To(set.iter().copied().collect()),
            None if self.overflowed => Gone::Everywhere,
            None => Gone::Nowhere,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(client: &str, parts: &[&[u8]]) -> crate::InboundMessage {
        crate::InboundMessage {
            payload: statestore_guest::resp3::request(parts),
            client_id: Some(client.into()),
            ..crate::InboundMessage::default()
        }
    }

    #[test]
    fn a_disconnect_goes_only_where_the_client_registered() {
        let mut o = Observers::default();
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("key-{i}").into_bytes()).collect();
        let mut batch = vec![request("reader", &[b"GET", &keys[0]])];
        for k in &keys[..3] {
            batch.push(request("watcher", &[b"KEYNOTIFY", k]));
        }
        batch.push(request("stopper", &[b"KEYNOTIFY", &keys[4], b"STOP"]));
        o.note(&batch, 16);
        let mut want: Vec<u32> = keys[..3]
            .iter()
            .map(|k| crate::cluster::partition::partition_of(k, 16))
            .collect();
        want.sort_unstable();
        want.dedup();
        assert_eq!(o.gone("watcher"), Gone::To(want));
        assert!(matches!(o.gone("watcher"), Gone::To(_)), "still tracked");
        assert_eq!(o.gone("reader"), Gone::Nowhere);
        assert!(matches!(o.gone("stopper"), Gone::To(p) if p.len() == 1));
        assert_eq!(o.gone("never-seen"), Gone::Nowhere);
        // Through an external broker: the name is `__srcId`.
        let mut external = request("ignored", &[b"KEYNOTIFY", &keys[5]]);
        external.client_id = None;
        external.user_properties = vec![("__srcId".into(), "sdk-client".into())];
        o.note(std::slice::from_ref(&external), 16);
        assert!(matches!(o.gone("sdk-client"), Gone::To(_)));
        // No name at all: unknown clients' disconnects go everywhere.
        external.user_properties.clear();
        o.note(&[external], 16);
        assert_eq!(o.gone("anyone"), Gone::Everywhere);
    }

    #[test]
    fn past_its_bound_an_unknown_client_is_taken_to_have_registered_everywhere() {
        let mut o = Observers::default();
        let many: Vec<crate::InboundMessage> = (0..=MAX_TRACKED)
            .map(|i| request(&format!("c{i}"), &[b"KEYNOTIFY", b"k"]))
            .collect();
        o.note(&many, 1);
        assert_eq!(o.by_client.len(), MAX_TRACKED);
        assert_eq!(o.gone("c0"), Gone::To(vec![0]));
        assert_eq!(o.gone(&format!("c{MAX_TRACKED}")), Gone::Everywhere);
        assert_eq!(o.gone("someone-else"), Gone::Everywhere);
    }
}
