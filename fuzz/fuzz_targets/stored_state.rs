//! The on-disk formats as untrusted input: a snapshot and journal records
//! from a damaged or hostile disk. Never a panic; anything accepted can be
//! snapshotted and restored again, and a snapshot fed in pieces is read as
//! in one. Half of the inputs get valid checksums, so
//! the field decoders behind the checksum are exercised too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_guest::snapshot::MAGIC;
use statestore_guest::{Config, Persist, Restoring, SnapshotScope, StateMachine};

fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let fix = mode & 1 == 1;
    let config = Config {
        persist: Persist::All,
        ..Config::default()
    };
    // First part: a snapshot; the rest: records separated by 0xFF.
    let split = data.iter().position(|&b| b == 0xFE).unwrap_or(data.len());
    let (snap, rest) = data.split_at(split);
    let snap = if fix {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(snap);
        with_crc(b)
    } else {
        snap.to_vec()
    };
    let whole = StateMachine::restore(config.clone(), &snap);
    // Fed in pieces that cut items anywhere: the same outcome.
    let piece = usize::from(mode >> 1) + 1;
    let mut r = Restoring::new(config.clone()).expect("default config");
    let in_pieces = snap
        .chunks(piece)
        .try_for_each(|p| r.feed(p))
        .and_then(|()| r.finish());
    assert_eq!(
        in_pieces.as_ref().map(StateMachine::snapshot).ok(),
        whole.as_ref().map(StateMachine::snapshot).ok(),
        "pieces of {piece}"
    );
    let mut sm =
        whole.unwrap_or_else(|_| StateMachine::new(config.clone()).expect("default config"));
    for record in rest.split(|&b| b == 0xFF) {
        let record = if fix {
            let mut r = vec![1];
            r.extend_from_slice(record);
            with_crc(r)
        } else {
            record.to_vec()
        };
        let _ = sm.replay(&record);
    }
    let again = sm.snapshot_with(SnapshotScope::Everything);
    let restored = StateMachine::restore(config, &again).expect("own snapshot restores");
    assert_eq!(restored.snapshot(), again);
});
