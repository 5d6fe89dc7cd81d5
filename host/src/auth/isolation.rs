//! The state store's own traffic is private in the embedded broker, while
//! the broker stays an ordinary MQTT 5 broker for everything else.
//!
//! Privacy comes from *delivery*, not from refusing subscriptions: a reply
//! the store publishes goes only to the client that sent the request, and a
//! notification only to its observer, whoever else holds a matching
//! subscription (`#`, `clients/+/...`, `$share/...`). That is enforced where
//! messages are routed (the embedded broker's `BoundedShared` and the
//! embedded transport). What is left to refuse is *forgery*: no client may
//! publish into the store's streams of another client.
//!
//! The store's streams:
//! - notifications: everything under `clients/statestore/...` (the store's
//!   own space; no client publishes there);
//! - replies: a topic `clients/<owner>/.../statestore/v1/<store id>/...`,
//!   the shape every SDK gives its response topic; `<owner>` is the
//!   client's id as is (Rust, .NET) or in upper-case hexadecimal (Go).
//!
//! Everything else, `clients/<other>/...` included, is ordinary MQTT: an
//! executor answers an invoker on the invoker's `clients/<invoker>/...`
//! topic (Azure IoT Operations RPC). `--strict-client-topics` keeps the
//! stricter rule for those who want it: `clients/<id>/...` belongs to client
//! `<id>` alone, for publishing and for subscribing.

use statestore_guest::rpc::STORE_ID;

/// The first level of the clients' spaces.
const CLIENTS: &str = "clients";
/// The second level of the store's notification space.
const STORE: &str = "statestore";

/// How private `clients/<id>/...` is beyond the store's own streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientTopics {
    /// Only the store's streams are protected; clients may publish into
    /// each other's `clients/<id>/...` (RPC between clients) and subscribe
    /// to anything.
    #[default]
    Open,
    /// `clients/<id>/...` is client `<id>`'s alone: nobody else publishes
    /// there or subscribes to a filter that can reach it.
    Strict,
}

/// The client's id in upper-case hexadecimal, as the Go SDK names it.
pub fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02X}")).collect()
}

/// Whether `level` names `client` (as is, or in hexadecimal).
fn names(client: &str, level: &str) -> bool {
    level == client || (level.len() == 2 * client.len() && level == hex(client))
}

/// Whose store stream `topic` is, if it is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream<'a> {
    /// The store's notification space, `clients/statestore/...`.
    Notifications,
    /// The replies to client `<owner>` (as the topic names it).
    Replies(&'a str),
}

/// Whether `topic` is one of the store's streams, and whose.
pub fn stream(topic: &str) -> Option<Stream<'_>> {
    let mut levels = topic.split('/');
    if levels.next() != Some(CLIENTS) {
        return None;
    }
    let owner = levels.next()?;
    if owner == STORE {
        return Some(Stream::Notifications);
    }
    let rest: Vec<&str> = levels.collect();
    rest.windows(3)
        .any(|w| w[0] == STORE && w[1] == "v1" && w[2] == STORE_ID)
        .then_some(Stream::Replies(owner))
}

/// Whether `client` may publish to `topic` (a will topic included).
pub fn may_publish(client: &str, topic: &str, mode: ClientTopics) -> bool {
    match stream(topic) {
        Some(Stream::Notifications) => return false,
        Some(Stream::Replies(owner)) => return names(client, owner),
        None => {}
    }
    if mode == ClientTopics::Open {
        return true;
    }
    let mut levels = topic.split('/');
    if levels.next() != Some(CLIENTS) {
        return true;
    }
    match levels.next() {
        None => true, // the topic "clients" itself belongs to nobody
        Some(owner) => names(client, owner),
    }
}

/// Whether `client` may subscribe to `filter` (a `$share/<group>/` prefix
/// is looked through). Always, unless the client topics are strict.
pub fn may_subscribe(client: &str, filter: &str, mode: ClientTopics) -> bool {
    if mode == ClientTopics::Open {
        return true;
    }
    let filter = match filter.strip_prefix("$share/") {
        Some(rest) => rest.split_once('/').map_or("", |(_, f)| f),
        None => filter,
    };
    let levels: Vec<&str> = filter.split('/').collect();
    // Can the first level be `clients`?
    match levels[0] {
        "#" => return false,
        "+" | CLIENTS => {}
        _ => return true,
    }
    // A one-level filter matches one-level topics only: nobody's.
    let Some(&second) = levels.get(1) else {
        return true;
    };
    match second {
        "#" | "+" => false,
        STORE => notification_filter_is_own(client, &levels[2..]),
        owner => names(client, owner),
    }
}

/// `rest` is what follows `clients/statestore/` in a filter: it may match
/// only `v1/<store id>/<client>/...` topics of `client` itself (in hex,
/// or raw: the .NET SDK subscribes with its raw id).
fn notification_filter_is_own(client: &str, rest: &[&str]) -> bool {
    let expected = ["v1", STORE_ID];
    for (i, level) in rest.iter().enumerate() {
        if *level == "#" {
            return false;
        }
        if i < expected.len() {
            if *level != "+" && *level != expected[i] {
                return true; // matches no notification topic
            }
            continue;
        }
        // The client's own segment.
        return names(client, level);
    }
    true // ends before the client's segment: matches no notification topic
}

/// The client a reply on `topic` is meant for when nothing else says so:
/// the owner a reply stream names, if that is a connected client's id
/// (`connected` says), as is or in hexadecimal.
pub(crate) fn reply_owner(topic: &str, connected: impl Fn(&str) -> bool) -> Option<String> {
    let Some(Stream::Replies(owner)) = stream(topic) else {
        return None;
    };
    if connected(owner) {
        return Some(owner.to_string());
    }
    let bytes = (0..owner.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(owner.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let id = String::from_utf8(bytes).ok()?;
    (owner.len() % 2 == 0 && hex(&id) == owner && connected(&id)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_topics(owner: &str) -> [String; 3] {
        [
            format!("clients/{owner}/services/statestore/v1/{STORE_ID}/command/invoke/response"),
            format!("clients/{owner}/statestore/v1/{STORE_ID}/command/invoke/response"),
            format!("clients/{owner}/statestore/v1/{STORE_ID}/command/invoke"),
        ]
    }

    #[test]
    fn the_store_streams_are_recognised() {
        for t in reply_topics("a") {
            assert_eq!(stream(&t), Some(Stream::Replies("a")), "{t}");
        }
        assert_eq!(
            stream("clients/statestore/v1/x/61/command/notify/6B"),
            Some(Stream::Notifications)
        );
        assert_eq!(stream("clients/a/rpc/response"), None);
        assert_eq!(stream("clients/a/statestore/v1/other/command/invoke"), None);
        assert_eq!(stream("sensors/statestore/v1"), None);
        assert_eq!(stream("clients"), None);
    }

    #[test]
    fn open_publishing_protects_only_the_store_streams() {
        let open = ClientTopics::Open;
        for t in reply_topics("a") {
            assert!(may_publish("a", &t, open), "{t}");
            assert!(!may_publish("b", &t, open), "{t}");
        }
        // The Go SDK's reply topics name the client in hexadecimal.
        for t in reply_topics("61") {
            assert!(may_publish("a", &t, open), "{t}");
            assert!(!may_publish("b", &t, open), "{t}");
        }
        assert!(!may_publish(
            "a",
            "clients/statestore/v1/x/61/command/notify/6B",
            open
        ));
        // RPC between clients: an executor answers on the invoker's topic.
        assert!(may_publish(
            "executor",
            "clients/invoker/rpc/response",
            open
        ));
        assert!(may_publish("a", "sensors/1", open));
        assert!(may_publish("a", "clients", open));
    }

    #[test]
    fn strict_publishing_keeps_clients_spaces_to_their_owners() {
        let strict = ClientTopics::Strict;
        assert!(may_publish("a", "clients/a/resp", strict));
        assert!(may_publish("a", "clients/61/resp", strict));
        assert!(may_publish("a", "sensors/1", strict));
        assert!(may_publish("a", "clients", strict));
        assert!(!may_publish("a", "clients/b/resp", strict));
        assert!(!may_publish(
            "a",
            "clients/statestore/v1/x/61/command/notify/6B",
            strict
        ));
    }

    #[test]
    fn open_subscribing_refuses_nothing() {
        for filter in ["#", "clients/+/#", "$share/g/#", "clients/statestore/#"] {
            assert!(may_subscribe("a", filter, ClientTopics::Open), "{filter}");
        }
    }

    #[test]
    fn strict_subscribing() {
        let own = format!("clients/statestore/v1/{STORE_ID}/61/command/notify/+");
        let raw = format!("clients/statestore/v1/{STORE_ID}/a/command/notify");
        let other = format!("clients/statestore/v1/{STORE_ID}/62/command/notify/+");
        let any = format!("clients/statestore/v1/{STORE_ID}/+/command/notify/+");
        for (filter, ok) in [
            (
                "clients/a/services/statestore/v1/x/command/invoke/response",
                true,
            ),
            ("clients/a/#", true),
            ("clients/61/#", true),
            ("sensors/#", true),
            ("statestore/v1/x/command/invoke", true),
            ("+", true),
            ("clients", true),
            ("clients/statestore/v1", true),
            ("#", false),
            ("+/a/#", true),
            ("+/b/#", false),
            ("+/#", false),
            ("clients/#", false),
            ("clients/+/resp", false),
            ("clients/b/#", false),
            ("clients/statestore/#", false),
            ("clients/statestore/v1/+/#", false),
            ("$share/g/#", false),
            ("$share/g/clients/a/#", true),
            (own.as_str(), true),
            (raw.as_str(), true),
            (other.as_str(), false),
            (any.as_str(), false),
        ] {
            assert_eq!(
                may_subscribe("a", filter, ClientTopics::Strict),
                ok,
                "{filter}"
            );
        }
    }

    #[test]
    fn a_reply_without_a_known_requester_goes_to_the_owner_its_topic_names() {
        let connected = |id: &str| id == "a";
        let [rust, go, _] = reply_topics("a");
        assert_eq!(reply_owner(&rust, connected).as_deref(), Some("a"));
        assert_eq!(reply_owner(&go, connected).as_deref(), Some("a"));
        let [hexed, ..] = reply_topics("61");
        assert_eq!(reply_owner(&hexed, connected).as_deref(), Some("a"));
        assert_eq!(reply_owner("clients/a/rpc", connected), None);
        let [other, ..] = reply_topics("b");
        assert_eq!(reply_owner(&other, connected), None);
    }
}
