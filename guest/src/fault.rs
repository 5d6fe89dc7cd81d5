//! Deliberate faults, for the host's isolation tests only (cargo feature
//! `fault-injection`, never in a release build).
//!
//! With the feature, these requests misbehave the way a buggy or hostile
//! guest could, so that a host can prove that one tenant's fault does not
//! reach another:
//!
//! | request                | what the guest does                              |
//! |------------------------|--------------------------------------------------|
//! | `SET __fault/loop v`   | spins forever (the host's CPU deadline stops it) |
//! | `SET __fault/grow v`   | allocates without bound (the memory cap stops it)|
//! | `SET __fault/trap v`   | panics, which traps                              |
//! | `GET __fault/build`    | answers `fault-injection`: tells this build apart|

use crate::command::Command;

/// The reply payload for a request that names a fault, after misbehaving
/// (only `GET __fault/build` returns).
pub fn inject(command: &Command<'_>) -> Option<Vec<u8>> {
    match *command {
        Command::Set {
            key: b"__fault/loop",
            ..
        } => {
            let mut n = 0u64;
            loop {
                n = core::hint::black_box(n.wrapping_add(1));
            }
        }
        Command::Set {
            key: b"__fault/grow",
            ..
        } => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1; 1 << 20]);
                core::hint::black_box(&hoard);
            }
        }
        Command::Set {
            key: b"__fault/trap",
            ..
        } => panic!("deliberate fault: SET __fault/trap"),
        Command::Get {
            key: b"__fault/build",
        } => Some(crate::resp3::bulk(b"fault-injection")),
        _ => None,
    }
}
