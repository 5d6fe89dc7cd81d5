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

/// A request the broker vouches for: from `client`, verified as `user` with
/// these attributes.
fn verified(n: u64, parts: &[&[u8]], client: &str, user: &str, team: &str) -> InboundMessage {
    InboundMessage {
        client_id: Some(client.into()),
        username: Some(user.into()),
        attributes: vec![("team".into(), team.into())],
        ..request(n, parts, client, &own(client))
    }
}

/// The clients a SET's outputs notify.
fn notified(out: &[Output]) -> Vec<String> {
    out.iter()
        .filter_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Notification => {
                p.target_client.as_ref().map(|c| c.to_string())
            }
            _ => None,
        })
        .collect()
}

/// Rules: the writer writes everything; the watcher reads its team's keys
/// (`{principal.attributes.team}/*`) unless `revoked`.
fn team_rules(revoked: bool) -> Vec<AuthRule> {
    let mut rules = vec![AuthRule {
        principals: Principals {
            usernames: vec!["writer".into()],
            ..Principals::default()
        },
        grants: vec![KeyGrant {
            method: KeyMethod::ReadWrite,
            keys: vec![KeySpec::Pattern("*".into())],
        }],
    }];
    if !revoked {
        rules.push(AuthRule {
            principals: Principals {
                usernames: vec!["watcher".into()],
                ..Principals::default()
            },
            grants: vec![KeyGrant {
                method: KeyMethod::Read,
                keys: vec![KeySpec::Pattern("{principal.attributes.team}/*".into())],
            }],
        });
    }
    rules
}

/// A registration gives nothing the rules in force do not: every
/// notification is checked as the principal that registered (its user name
/// and attributes, kept with the registration and in snapshots), so rules
/// that take the read right away (a reload) stop the notifications, and
/// rules that give it back resume them.
#[test]
fn a_notification_goes_only_where_the_rules_in_force_let_its_watcher_read() {
    let config = Config {
        authorization: Some(team_rules(false)),
        ..Config::default()
    };
    let mut m = StateMachine::new(config.clone()).expect("config");
    let r = reply(
        &mut m,
        verified(1, &[b"KEYNOTIFY", b"red/k"], "w1", "watcher", "red"),
    );
    assert_eq!(r, b"+OK\r\n");
    let set = |n: u64| verified(n, &[b"SET", b"red/k", b"v"], "writer", "writer", "none");
    assert_eq!(notified(&m.handle(&set(2), T0)), ["w1"]);
    // Who registered travels with the registration through a snapshot.
    let mut m = StateMachine::restore(config.clone(), &m.snapshot()).expect("restore");
    assert_eq!(notified(&m.handle(&set(3), T0)), ["w1"]);
    // The watcher's read right is taken away: no notification (the write
    // itself is answered), and its own GET is refused alike.
    m.set_authorization(Some(team_rules(true))).expect("rules");
    let out = m.handle(&set(4), T0);
    assert!(notified(&out).is_empty(), "{out:?}");
    assert!(out.iter().any(|o| matches!(o,
        Output::Publish(p) if p.kind == PublishKind::Response && &p.payload[..] == b"+OK\r\n")));
    let r = reply(
        &mut m,
        verified(5, &[b"GET", b"red/k"], "w1", "watcher", "red"),
    );
    assert_eq!(r, DENIED);
    // Given back: the registration, never dropped, notifies again.
    m.set_authorization(Some(team_rules(false))).expect("rules");
    assert_eq!(notified(&m.handle(&set(6), T0)), ["w1"]);
}
