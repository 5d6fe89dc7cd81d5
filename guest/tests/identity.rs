//! Who a request is from when no broker vouches for it (external mode), in
//! simulated time with exact replies: its `__srcId` counts only when its
//! response topic names it (`clients/<id>/...`). An unverified `__srcId`
//! names nobody to the authorization rules and may not register for
//! KEYNOTIFY, so a spoofed one can neither read another client's keys nor
//! cancel its notifications.

use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::types::{AuthRule, KeyGrant, KeyMethod, KeySpec, Principals};
use statestore_guest::{Config, InboundMessage, Output, PublishKind, StateMachine};

const T0: u64 = 1_700_000_000_000;
const DENIED: &[u8] = b"-ERR not authorized\r\n";

/// A request claiming `src` as its `__srcId`, answered on `response_topic`,
/// that no broker vouches for.
fn request(n: u64, parts: &[&[u8]], src: &str, response_topic: &str) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some(response_topic.into()),
        correlation_data: Some(n.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        user_properties: vec![
            ("__ts".into(), format!("{T0}:0:{src}")),
            ("__srcId".into(), src.into()),
        ],
        client_id: None,
        ..Default::default()
    }
}

fn reply(m: &mut StateMachine, msg: InboundMessage) -> Vec<u8> {
    let out = m.handle(&msg, T0);
    out.iter()
        .find_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Response => Some(p.payload.to_vec()),
            _ => None,
        })
        .expect("a reply")
}

fn own(id: &str) -> String {
    format!("clients/{id}/services/statestore/response")
}

#[test]
fn an_unverified_source_id_cannot_register_or_stop_keynotify() {
    let mut m = StateMachine::new(Config::default()).expect("config");
    // The victim registers, its response topic naming it.
    let r = reply(
        &mut m,
        request(1, &[b"KEYNOTIFY", b"k"], "victim", &own("victim")),
    );
    assert_eq!(r, b"+OK\r\n");
    // A spoofer names the victim but reads replies elsewhere: refused, both
    // to register and to stop the victim's registration.
    for (n, parts) in [
        (2, &[&b"KEYNOTIFY"[..], b"k", b"STOP"][..]),
        (3, &[&b"KEYNOTIFY"[..], b"k"][..]),
    ] {
        let r = reply(&mut m, request(n, parts, "victim", "mine/replies"));
        assert_eq!(r, DENIED);
    }
    // The victim's registration stands: its own STOP finds it (+OK, not :0).
    let r = reply(
        &mut m,
        request(4, &[b"KEYNOTIFY", b"k", b"STOP"], "victim", &own("victim")),
    );
    assert_eq!(r, b"+OK\r\n");
    // Other commands with an unverified identity are still served.
    let r = reply(
        &mut m,
        request(5, &[b"SET", b"k", b"v"], "anyone", "mine/replies"),
    );
    assert_eq!(r, b"+OK\r\n");
}

#[test]
fn an_unverified_source_id_names_nobody_to_the_rules() {
    let rules = vec![AuthRule {
        principals: Principals {
            client_ids: vec!["victim".into(), "other".into()],
            ..Principals::default()
        },
        grants: vec![KeyGrant {
            method: KeyMethod::ReadWrite,
            keys: vec![KeySpec::Pattern("{principal.clientId}/*".into())],
        }],
    }];
    let mut m = StateMachine::new(Config {
        authorization: Some(rules),
        ..Config::default()
    })
    .expect("config");
    let r = reply(
        &mut m,
        request(
            1,
            &[b"SET", b"victim/k", b"secret"],
            "victim",
            &own("victim"),
        ),
    );
    assert_eq!(r, b"+OK\r\n");
    // The same __srcId, unproven: the rules see nobody.
    let r = reply(
        &mut m,
        request(2, &[b"GET", b"victim/k"], "victim", "mine/replies"),
    );
    assert_eq!(r, DENIED);
    // Nor may one client act as another through a topic naming a third:
    // nothing is published there (not even a refusal, which would land on
    // the third's topic), and the host is told.
    let out = m.handle(
        &request(3, &[b"GET", b"victim/k"], "victim", &own("other")),
        T0,
    );
    assert!(
        matches!(&out[..], [Output::Violation { client_id: None, reason }]
            if reason.contains("\"victim\"") && reason.contains("not its own")),
        "{out:?}"
    );
    let r = reply(
        &mut m,
        request(4, &[b"GET", b"victim/k"], "victim", &own("victim")),
    );
    assert_eq!(r, b"$6\r\nsecret\r\n");
}
