//! The RESP3 request decoder and command parser on arbitrary bytes: never a
//! panic, and a complete frame re-encodes to exactly the bytes it used.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::command;
use statestore_guest::resp3::{Decoded, decode_request};

fuzz_target!(|data: &[u8]| {
    match decode_request(data) {
        Ok(Decoded::Complete(items, used)) => {
            assert!(used <= data.len());
            let mut again = format!("*{}\r\n", items.len()).into_bytes();
            for item in &items {
                again.extend_from_slice(format!("${}\r\n", item.len()).as_bytes());
                again.extend_from_slice(item);
                again.extend_from_slice(b"\r\n");
            }
            // Leading zeros in counts are legal on input but not re-emitted.
            if !data
                .windows(2)
                .any(|w| (w[0] == b'*' || w[0] == b'$') && w[1] == b'0')
            {
                assert_eq!(&again[..], &data[..used]);
            }
        }
        Ok(Decoded::Partial) | Err(_) => {}
    }
    let _ = command::parse(data);
});
