//! The read-only door (`reads`, `query-wire`; the read index): reads get
//! exactly the replies `handle-wire` gives them, and the store does not
//! change at all (same snapshot, same deadline, nothing cached, the clock
//! untouched), in simulated time with exact bytes.

use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::wire;
use statestore_guest::{
    Config, InboundMessage, Input, Output, Persist, PublishKind, SnapshotScope, StateMachine,
};

const T0: u64 = 1_700_000_000_000;

fn request(n: u64, parts: &[&[u8]], ts: u64) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some("clients/c/resp".into()),
        correlation_data: Some(n.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        user_properties: vec![("__ts".into(), format!("{ts}:0:c"))],
        client_id: Some("c".into()),
        ..Default::default()
    }
}

fn store() -> StateMachine {
    let mut sm = StateMachine::new(Config {
        persist: Persist::All,
        ..Config::default()
    })
    .expect("config");
    for (i, (k, v)) in [("a", "1"), ("b", "2"), ("c", "3")].iter().enumerate() {
        let out = sm.handle(
            &request(i as u64, &[b"SET", k.as_bytes(), v.as_bytes()], T0),
            T0,
        );
        assert!(replies(&out).iter().any(|r| r == b"+OK\r\n"));
    }
    // `t` expires at T0 + 100.
    sm.handle(&request(9, &[b"SET", b"t", b"x", b"PX", b"100"], T0), T0);
    sm
}

fn replies(out: &[Output]) -> Vec<Vec<u8>> {
    out.iter()
        .filter_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Response => Some(p.payload.to_vec()),
            _ => None,
        })
        .collect()
}

fn batch(messages: &[InboundMessage]) -> Vec<u8> {
    let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
    wire::encode_batch(&inputs)
}

/// GETs and a SCAN, mixed with writes, a KEYNOTIFY, a disconnect and a
/// message on another topic: `reads` names the GETs and the SCAN only.
#[test]
fn reads_names_gets_and_scans_only() {
    let mut other = request(5, &[b"GET", b"a"], T0);
    other.topic = "elsewhere".into();
    let mut qos0 = request(6, &[b"GET", b"a"], T0);
    qos0.qos = 0;
    let messages = [
        request(1, &[b"GET", b"a"], T0),
        request(2, &[b"SET", b"a", b"9"], T0),
        request(3, &[b"SCAN", b"*"], T0),
        request(4, &[b"KEYNOTIFY", b"a"], T0),
        other,
        qos0,
        request(7, &[b"DEL", b"a"], T0),
        request(8, &[b"GET"], T0), // not a command: its error goes through the log
        request(9, &[b"GET", b"z"], T0),
    ];
    let mut inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
    inputs.insert(1, Input::Disconnected("c"));
    let positions = StateMachine::reads(&wire::encode_batch(&inputs)).expect("decodes");
    assert_eq!(positions, [0, 3, 9]);
    assert!(StateMachine::reads(b"\x09nonsense").is_err());
}

/// Every read's reply is byte for byte the one `handle-wire` gives it,
/// and nothing of the store changes: not its snapshot (keys, dedup cache,
/// clock), not its deadline; writes in the batch are not applied.
#[test]
fn query_answers_like_handle_and_changes_nothing() {
    let reads = [
        request(20, &[b"GET", b"a"], T0 + 5),
        request(21, &[b"GET", b"missing"], T0 + 5),
        request(22, &[b"SCAN", b"*"], T0 + 5),
        request(23, &[b"GET", b"t"], T0 + 5),
    ];
    let now = T0 + 50;
    let mut sm = store();
    let before = sm.snapshot_with(SnapshotScope::Everything);
    let deadline = sm.next_deadline();
    let out = sm.query_wire(&batch(&reads), now).expect("answered");
    let queried = wire::decode_outputs(&out, &[]).expect("decodes");
    assert_eq!(sm.snapshot_with(SnapshotScope::Everything), before);
    assert_eq!(sm.next_deadline(), deadline);
    // The same requests through the normal door, on a copy.
    let mut copy = store();
    let handled = copy.step(&reads.iter().map(Input::Message).collect::<Vec<_>>(), now);
    assert_eq!(queried, handled);
    assert_eq!(
        replies(&queried),
        [
            b"$1\r\n1\r\n".to_vec(),
            b"$-1\r\n".to_vec(),
            b"*1\r\n*4\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nt\r\n".to_vec(),
            b"$1\r\nx\r\n".to_vec(),
        ]
    );
    // A write in the batch gets nothing and changes nothing.
    let mixed = [
        request(30, &[b"SET", b"a", b"changed"], T0 + 5),
        request(31, &[b"GET", b"a"], T0 + 5),
    ];
    let out = sm.query_wire(&batch(&mixed), now).expect("answered");
    let out = wire::decode_outputs(&out, &[]).expect("decodes");
    assert_eq!(replies(&out), [b"$1\r\n1\r\n".to_vec()]);
    assert_eq!(sm.snapshot_with(SnapshotScope::Everything), before);
}

/// A key due at `now` is dead to a query, which does not expire it (no
/// journal record, no notification: the log's next entry does that).
#[test]
fn a_due_key_reads_as_gone_and_stays_for_the_log_to_expire() {
    let mut sm = store();
    let before = sm.snapshot_with(SnapshotScope::Everything);
    let out = sm
        .query_wire(&batch(&[request(40, &[b"GET", b"t"], T0)]), T0 + 100)
        .expect("answered");
    let out = wire::decode_outputs(&out, &[]).expect("decodes");
    assert_eq!(replies(&out), [b"$-1\r\n".to_vec()]);
    assert!(!out.iter().any(|o| matches!(o, Output::Journal(_))));
    assert_eq!(sm.snapshot_with(SnapshotScope::Everything), before);
    assert_eq!(sm.next_deadline(), Some(T0 + 100));
}

/// A `__ts` far ahead of `now` (a replica answers at the time of its last
/// applied entry, which may be long past) is not refused and does not move
/// the clock; the next write's version shows the clock did not move.
#[test]
fn a_query_ignores_the_skew_of_its_timestamp_and_keeps_the_clock() {
    let mut sm = store();
    let late = T0 + 3_600_000;
    let out = sm
        .query_wire(&batch(&[request(50, &[b"GET", b"a"], late)]), T0 + 1)
        .expect("answered");
    let out = wire::decode_outputs(&out, &[]).expect("decodes");
    assert_eq!(replies(&out), [b"$1\r\n1\r\n".to_vec()]);
    // A write's version shows where the clock is: not at `late`.
    let set = request(51, &[b"SET", b"n", b"1"], T0 + 1);
    let out = sm.handle(&set, T0 + 1);
    let ts = out
        .iter()
        .find_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Response => {
                p.user_property("__ts").map(str::to_string)
            }
            _ => None,
        })
        .expect("a version");
    let wall: u64 = ts
        .split(':')
        .next()
        .and_then(|w| w.parse().ok())
        .expect("a wall time");
    assert!(wall < late, "the clock moved to the query's __ts: {ts}");
}

/// A read whose reply the dedup cache holds (its correlation data reused
/// after a write) gets the cached reply, as through `handle-wire`.
#[test]
fn a_cached_reply_is_answered_from_the_cache() {
    let mut sm = store();
    let write = request(60, &[b"SET", b"d", b"1"], T0);
    sm.handle(&write, T0);
    let again = request(60, &[b"GET", b"d"], T0);
    let out = sm.query_wire(&batch(&[again]), T0 + 1).expect("answered");
    let out = wire::decode_outputs(&out, &[]).expect("decodes");
    assert_eq!(replies(&out), [b"+OK\r\n".to_vec()]);
}
