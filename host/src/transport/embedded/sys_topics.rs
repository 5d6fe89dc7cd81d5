//! A minimal `$SYS` tree for the embedded broker, in the names mosquitto
//! uses, published retained every [`INTERVAL`]:
//!
//! ```text
//! $SYS/broker/version               statestore <version> (rmqtt)
//! $SYS/broker/uptime                <seconds> seconds
//! $SYS/broker/clients/connected     <connections now>
//! $SYS/broker/messages/received     <PUBLISH packets received from clients>
//! $SYS/broker/messages/sent         <PUBLISH packets delivered to clients>
//! ```
//!
//! Topics starting with `$` are not matched by a filter starting with a
//! wildcard (MQTT 5, 4.7.2): a client sees them only by subscribing to
//! `$SYS/...` itself.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmqtt::codec::types::QoS;
use rmqtt::context::ServerContext;
use rmqtt::session::SessionState;
use rmqtt::types::{ClientId, CodecPublish, From, Id, Publish};
use tracing::debug;

/// How often the tree is published.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

/// The counts behind the tree, kept by the broker's hooks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Clients connected now.
    pub connected: AtomicI64,
    /// PUBLISH packets received from clients.
    pub received: AtomicU64,
    /// PUBLISH packets delivered to clients.
    pub sent: AtomicU64,
}

/// The topics and their values now.
pub(crate) fn tree(counters: &Counters, started: Instant) -> Vec<(&'static str, String)> {
    vec![
        (
            "$SYS/broker/version",
            format!("statestore {} (rmqtt)", env!("CARGO_PKG_VERSION")),
        ),
        (
            "$SYS/broker/uptime",
            format!("{} seconds", started.elapsed().as_secs()),
        ),
        (
            "$SYS/broker/clients/connected",
            counters
                .connected
                .load(Ordering::Relaxed)
                .max(0)
                .to_string(),
        ),
        (
            "$SYS/broker/messages/received",
            counters.received.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/messages/sent",
            counters.sent.load(Ordering::Relaxed).to_string(),
        ),
    ]
}

/// Publishes the tree, retained, as the broker itself.
pub async fn publish(scx: &ServerContext, counters: &Counters, started: Instant) {
    let from = From::from_system(Id::new(
        scx.node.id(),
        0,
        None,
        None,
        ClientId::from("$SYS"),
        None,
    ));
    for (topic, value) in tree(counters, started) {
        let codec = CodecPublish {
            dup: false,
            retain: true,
            qos: QoS::AtMostOnce,
            topic: topic.into(),
            packet_id: None,
            payload: value.into_bytes().into(),
            properties: Some(Default::default()),
        };
        let p = Publish::from(codec).create_time(rmqtt::utils::timestamp_millis());
        if let Err(e) = SessionState::forwards(scx, from.clone(), p, false, None).await {
            debug!(topic, error = %e, "cannot publish a $SYS topic");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_names_what_mosquitto_names() {
        let c = Counters::default();
        c.connected.store(3, Ordering::Relaxed);
        c.received.store(7, Ordering::Relaxed);
        let tree = tree(&c, Instant::now());
        let get = |t: &str| {
            tree.iter()
                .find(|(n, _)| *n == t)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert!(get("$SYS/broker/version").starts_with("statestore "));
        assert_eq!(get("$SYS/broker/uptime"), "0 seconds");
        assert_eq!(get("$SYS/broker/clients/connected"), "3");
        assert_eq!(get("$SYS/broker/messages/received"), "7");
        assert_eq!(get("$SYS/broker/messages/sent"), "0");
    }
}
