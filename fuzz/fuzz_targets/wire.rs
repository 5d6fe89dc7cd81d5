//! The flat encodings that cross the component boundary (`handle-wire`):
//! arbitrary bytes never panic, either as an input batch or as an output
//! list; a batch that decodes is handled by the state machine without
//! panicking, its output list decodes, and a batch that does not decode is
//! an error that changes nothing, whether the batch is lent to the store
//! (`handle_wire_owned`) or not. The read-only door (`reads`,
//! `query_wire`) takes the same bytes and never changes the store.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::{Config, StateMachine, wire};

const NOW: u64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode_outputs(data, data);
    let mut sm = StateMachine::new(Config::default()).expect("default config");
    let before = sm.snapshot();
    let decodes = wire::decode_batch(data).is_ok();
    match sm.handle_wire(data, NOW) {
        Ok(outputs) => {
            assert!(decodes, "handled a batch that does not decode");
            wire::decode_outputs(&outputs, data).expect("the guest's own output list decodes");
        }
        Err(_) => {
            assert!(!decodes, "refused a batch that decodes");
            assert_eq!(sm.snapshot(), before, "a refused batch changed the state");
        }
    }
    // The same batch handed over (a large value may stay in it).
    let mut owned = StateMachine::new(Config::default()).expect("default config");
    match owned.handle_wire_owned(data.to_vec(), NOW) {
        Ok(outputs) => {
            assert!(decodes, "handled a batch that does not decode");
            wire::decode_outputs(&outputs, data).expect("the guest's own output list decodes");
        }
        Err(_) => assert!(!decodes, "refused a batch that decodes"),
    }
    // The read-only door, on a store with keys (one of them due).
    let mut q = StateMachine::new(Config::default()).expect("default config");
    let setup = [
        statestore_guest::resp3::request(&[b"SET", b"a", b"1"]),
        statestore_guest::resp3::request(&[b"SET", b"t", b"2", b"PX", b"10"]),
    ];
    for (i, payload) in setup.iter().enumerate() {
        let m = statestore_guest::InboundMessage {
            topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
            payload: payload.clone(),
            qos: 1,
            response_topic: Some("clients/f/r".into()),
            correlation_data: Some(vec![i as u8]),
            message_expiry_interval: Some(10),
            user_properties: vec![("__ts".into(), format!("{NOW}:0:f"))],
            client_id: Some("f".into()),
            ..Default::default()
        };
        q.handle(&m, NOW);
    }
    let before = q.snapshot();
    assert_eq!(StateMachine::reads(data).is_ok(), decodes);
    match q.query_wire(data, NOW + 50) {
        Ok(outputs) => {
            assert!(decodes, "queried a batch that does not decode");
            wire::decode_outputs(&outputs, data).expect("the guest's own output list decodes");
        }
        Err(_) => assert!(!decodes, "refused a batch that decodes"),
    }
    assert_eq!(q.snapshot(), before, "a query changed the state");
});
