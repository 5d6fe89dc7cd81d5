//! The flat encoding that crosses the component boundary (`handle-wire`,
//! `poll-wire`): arbitrary bytes never panic, and a batch that decodes is
//! handled by the state machine without panicking; outputs round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::{Config, StateMachine, wire};

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode_outputs(data);
    let mut m = StateMachine::new(Config::default()).expect("default config");
    if wire::decode_batch(data, |msg| m.handle_ref(msg, 1_700_000_000_000)).is_ok() {
        let outputs = m.take_outputs();
        let encoded = wire::encode_outputs(&outputs);
        assert_eq!(wire::decode_outputs(&encoded).expect("own encoding"), outputs);
    }
});
