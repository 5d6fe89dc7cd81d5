//! The state store's own traffic is private in the embedded broker, with
//! no rules file (issue 16, item 5): the `clients/<id>/...` space belongs to
//! client `<id>` (its replies), and `clients/statestore/...` to the store
//! (notifications, addressed to a client by its id in hexadecimal).
//!
//! - A client may subscribe to a filter only if no topic the filter can
//!   match belongs to another client: `#`, `+/...`, `clients/+/...` and
//!   `clients/<other>/...` are refused; its own reply space and its own
//!   notification topics are allowed; everything outside `clients/` is
//!   ordinary MQTT and allowed.
//! - A client may publish into its own `clients/<id>/...` space and
//!   outside `clients/`, never into another client's or the store's.
//! - The store replies only where its requester could publish itself.

use statestore_guest::rpc::STORE_ID;

/// The first level of the private space.
const CLIENTS: &str = "clients";
/// The second level of the store's notification space.
const STORE: &str = "statestore";

fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02X}")).collect()
}

/// Whether `client` may publish to `topic`.
pub fn may_publish(client: &str, topic: &str) -> bool {
    let mut levels = topic.split('/');
    if levels.next() != Some(CLIENTS) {
        return true;
    }
    match levels.next() {
        None => true, // the topic "clients" itself belongs to nobody
        Some(STORE) => false,
        Some(owner) => owner == client,
    }
}

/// Whether `client` may subscribe to `filter` (a `$share/<group>/` prefix
/// is looked through).
pub fn may_subscribe(client: &str, filter: &str) -> bool {
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
        owner => owner == client,
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
        return *level == hex(client) || *level == client;
    }
    true // ends before the client's segment: matches no notification topic
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing() {
        assert!(may_publish("a", "clients/a/resp"));
        assert!(may_publish("a", "sensors/1"));
        assert!(may_publish("a", "clients"));
        assert!(!may_publish("a", "clients/b/resp"));
        assert!(!may_publish(
            "a",
            "clients/statestore/v1/x/61/command/notify/6B"
        ));
    }

    #[test]
    fn subscribing() {
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
            assert_eq!(may_subscribe("a", filter), ok, "{filter}");
        }
    }
}
