//! The flat encodings that cross the component boundary (`handle-wire`):
//! arbitrary bytes never panic, either as an input batch or as an output
//! list; a batch that decodes is handled by the state machine without
//! panicking, its output list decodes, and a batch that does not decode is
//! an error that changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::{Config, StateMachine, wire};

const NOW: u64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode_outputs(data);
    let mut sm = StateMachine::new(Config::default()).expect("default config");
    let before = sm.snapshot();
    let decodes = wire::decode_batch(data).is_ok();
    match sm.handle_wire(data, NOW) {
        Ok(outputs) => {
            assert!(decodes, "handled a batch that does not decode");
            wire::decode_outputs(&outputs).expect("the guest's own output list decodes");
        }
        Err(_) => {
            assert!(!decodes, "refused a batch that decodes");
            assert_eq!(sm.snapshot(), before, "a refused batch changed the state");
        }
    }
});
