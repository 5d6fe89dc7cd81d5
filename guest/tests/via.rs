//! KEYNOTIFY registrations in a replicated store: each remembers the `via`
//! (replica and life) of the request that made it, a disconnect a replica
//! reports drops only what was registered through it, a replica's new life
//! drops what its earlier lives registered, and a snapshot keeps the
//! `via`s. Simulated time, the notifications' exact targets.

use statestore_guest::{
    Config, InboundMessage, Input, Output, PublishKind, SnapshotScope, StateMachine, Via,
};

mod common;
use common::T0;
const A1: Via = Via {
    replica: 1,
    started: 100,
};
const A2: Via = Via {
    replica: 1,
    started: 200,
};
const B: Via = Via {
    replica: 2,
    started: 50,
};

fn request(client: &str, n: u64, parts: &[&[u8]], via: Option<Via>) -> InboundMessage {
    InboundMessage {
        via,
        ..common::request(n, parts, client)
    }
}

/// The clients notified of a SET of `key`.
fn notified(sm: &mut StateMachine, n: u64, key: &[u8]) -> Vec<String> {
    let out = sm.handle(&request("writer", n, &[b"SET", key, b"v"], Some(B)), T0);
    out.iter()
        .filter_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Notification => {
                p.target_client.as_deref().map(str::to_string)
            }
            _ => None,
        })
        .collect()
}

fn register(sm: &mut StateMachine, client: &str, n: u64, key: &[u8], via: Option<Via>) {
    let out = sm.handle(&request(client, n, &[b"KEYNOTIFY", key], via), T0);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Publish(p) if &p.payload[..] == b"+OK\r\n")),
        "{out:?}"
    );
}

#[test]
fn a_disconnect_drops_only_what_was_registered_through_its_replica() {
    let mut sm = StateMachine::new(Config::default()).expect("config");
    register(&mut sm, "c", 1, b"k-a", Some(A1));
    register(&mut sm, "c", 2, b"k-b", Some(B));
    register(&mut sm, "c", 3, b"k-none", None);
    register(&mut sm, "d", 4, b"k-a", Some(A1));
    assert_eq!(notified(&mut sm, 9, b"k-a"), ["c", "d"]);
    // Through a snapshot: the vias are kept.
    let mut sm = StateMachine::restore(
        Config::default(),
        &sm.snapshot_with(SnapshotScope::Everything),
    )
    .expect("restores");
    // c left A (reported late, after it registered k-b through B).
    sm.step(&[Input::DisconnectedVia("c", A1)], T0);
    assert_eq!(notified(&mut sm, 10, b"k-a"), ["d"]);
    assert_eq!(notified(&mut sm, 11, b"k-b"), ["c"]);
    assert!(
        notified(&mut sm, 12, b"k-none").is_empty(),
        "no via: dropped"
    );
    // A restarts: d's registration through A's first life goes.
    sm.step(&[Input::ReplicaStarted(A2)], T0);
    assert!(notified(&mut sm, 13, b"k-a").is_empty());
    assert_eq!(notified(&mut sm, 14, b"k-b"), ["c"]);
    // A registration made again through A's new life survives its start
    // being applied again (a replica proposes it at each leader change).
    register(&mut sm, "d", 15, b"k-a", Some(A2));
    sm.step(&[Input::ReplicaStarted(A2)], T0);
    assert_eq!(notified(&mut sm, 16, b"k-a"), ["d"]);
    // The plain disconnect (one process) drops everything of the client.
    sm.step(&[Input::Disconnected("c")], T0);
    assert!(notified(&mut sm, 17, b"k-b").is_empty());
}
