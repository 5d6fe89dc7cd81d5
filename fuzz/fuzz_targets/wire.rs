//! The flat encoding that crosses the component boundary (`handle-wire`,
//! `poll-wire`): arbitrary bytes never panic, and a batch that decodes is
//! handled by the state machine without panicking; the outputs it writes
//! straight into the encoding (compact replies included) decode to what the
//! same batch gives as queued values, and those round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::{Config, StateMachine, wire};

const NOW: u64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode_outputs(data);
    let mut queued = StateMachine::new(Config::default()).expect("default config");
    let mut wired = StateMachine::new(Config::default()).expect("default config");
    let handled = wired.handle_wire(data, NOW);
    if wire::decode_batch(data, |msg| queued.handle_ref(msg, NOW)).is_ok() {
        let outputs = queued.take_outputs();
        let written = handled.expect("decode_batch accepted it");
        assert_eq!(wire::decode_outputs(&written).expect("own encoding"), outputs);
        let encoded = wire::encode_outputs(&outputs);
        assert_eq!(wire::decode_outputs(&encoded).expect("own encoding"), outputs);
    } else {
        assert!(handled.is_err());
        assert!(wire::decode_outputs(&wired.poll_wire()).expect("own encoding").is_empty());
    }
});
