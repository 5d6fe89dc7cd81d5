//! Every call is bounded: it stops taking inputs once its outputs hold
//! `OUTPUT_BUDGET` bytes, and it expires at most `EXPIRY_BUDGET` keys,
//! in simulated time, with exact outputs.

use statestore_guest::wire::{self, InputRef};
use statestore_guest::{Config, InboundMessage, Input, Output, Persist, PublishKind, StateMachine};
use statestore_guest::{EXPIRY_BUDGET, LARGE_VALUE, OUTPUT_BUDGET, REQUEST_EXPIRY_BUDGET};

mod common;
use common::{T0, request};

fn durable() -> StateMachine {
    StateMachine::new(Config {
        persist: Persist::All,
        ..Config::default()
    })
    .expect("config")
}

fn replies(out: &[Output]) -> Vec<Vec<u8>> {
    out.iter()
        .filter_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Response => Some(p.payload.to_vec()),
            _ => None,
        })
        .collect()
}

/// Three GETs of 5 MiB values: the first call answers two (the outputs
/// then hold 10 MiB, past the 8 MiB budget) and says so; `step` carries on
/// with the third; nothing is lost or answered twice.
#[test]
fn a_call_stops_taking_inputs_past_the_output_budget() {
    let mut sm = durable();
    let value = vec![b'v'; 5 << 20];
    for (i, key) in [b"a", b"b", b"c"].iter().enumerate() {
        let out = sm.handle(&request(i as u64, &[b"SET", *key, &value], "w"), T0);
        assert_eq!(replies(&out), [b"+OK\r\n".to_vec()]);
    }
    let gets: Vec<InboundMessage> = [b"a", b"b", b"c"]
        .iter()
        .enumerate()
        .map(|(i, k)| request(10 + i as u64, &[b"GET", *k], "r"))
        .collect();
    let inputs: Vec<Input<'_>> = gets.iter().map(Input::Message).collect();
    let batch = wire::encode_batch(&inputs);
    let raw = sm.handle_wire(&batch, T0).expect("handled");
    assert!(raw.len() >= OUTPUT_BUDGET && raw.len() < OUTPUT_BUDGET + (5 << 20));
    let out = wire::decode_outputs(&raw, &batch).expect("decodes");
    assert_eq!(out.len(), 3);
    assert_eq!(out.last(), Some(&Output::More(2)));
    let mut expected = b"$5242880\r\n".to_vec();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    assert_eq!(replies(&out), [expected.clone(), expected.clone()]);
    // The rest, in a call of its own.
    let batch = wire::encode_batch(&inputs[2..]);
    let out = sm.handle_wire(&batch, T0).expect("handled");
    let out = wire::decode_outputs(&out, &batch).expect("decodes");
    assert_eq!(replies(&out), [expected.clone()]);
    assert!(!out.iter().any(|o| matches!(o, Output::More(_))));
    // `step` does the same loop: all three, once each, no `More`.
    let out = sm.step(&inputs, T0);
    assert_eq!(
        replies(&out),
        [expected.clone(), expected.clone(), expected]
    );
    assert!(!out.iter().any(|o| matches!(o, Output::More(_))));
}

/// One input is always handled, however large its outputs.
#[test]
fn the_first_input_is_always_handled() {
    let mut sm = durable();
    let value = vec![7u8; OUTPUT_BUDGET + 1];
    sm.handle(&request(1, &[b"SET", b"big", &value], "w"), T0);
    let get = request(2, &[b"GET", b"big"], "r");
    let batch = wire::encode_batch(&[Input::Message(&get)]);
    let raw = sm.handle_wire(&batch, T0).expect("handled");
    let out = wire::decode_outputs(&raw, &batch).expect("decodes");
    assert_eq!(out.len(), 1, "one reply, no `More`");
    assert_eq!(replies(&out)[0].len(), value.len() + 12);
}

/// 20,000 keys due at once expire over timer calls of at most
/// `EXPIRY_BUDGET` each (a call with requests does `REQUEST_EXPIRY_BUDGET`
/// first, an eighth); until then a key left due is dead to GET and a
/// SET over it sees its expiry (journal and notification) first.
#[test]
fn mass_expiry_runs_in_bounded_steps() {
    let mut sm = durable();
    let n = 20_000u64;
    for i in 0..n {
        let key = format!("k{i:05}");
        sm.handle(
            &request(i, &[b"SET", key.as_bytes(), b"v", b"PX", b"1000"], "w"),
            T0,
        );
    }
    // An observer of the last key to expire by order of insertion.
    let watch = request(n, &[b"KEYNOTIFY", b"k19999"], "o");
    assert_eq!(replies(&sm.handle(&watch, T0)), [b"+OK\r\n".to_vec()]);
    let due = T0 + 1000;
    assert_eq!(sm.next_deadline(), Some(due));
    let first = sm.timeout(due);
    let expiries = |out: &[Output]| {
        out.iter()
            .filter(|o| matches!(o, Output::Journal(r) if r[1] == 3))
            .count()
    };
    assert_eq!(expiries(&first), EXPIRY_BUDGET);
    assert_eq!(first.last(), Some(&Output::More(0)));
    assert_eq!(sm.next_deadline(), Some(due), "more is due");
    assert_eq!(sm.key_count(), (n as usize) - EXPIRY_BUDGET);
    // Dead to GET before its expiry is carried out.
    let get = request(n + 1, &[b"GET", b"k19999"], "r");
    let out = sm.step(&[Input::Message(&get)], due);
    assert_eq!(replies(&out), [b"$-1\r\n".to_vec()]);
    // A SET over it: the expiry's record and DELETE notification first.
    let set = request(n + 2, &[b"SET", b"k19999", b"new"], "w");
    // (Its step expires another REQUEST_EXPIRY_BUDGET keys first, in deadline and
    // key order: k19999 is still there, left for the SET to expire.)
    let out = sm.step(&[Input::Message(&set)], due);
    let kinds: Vec<&str> = out
        .iter()
        .filter_map(|o| match o {
            Output::Journal(r) if r[1] == 3 => None, // other keys' expiries
            Output::Journal(r) if r[1] == 1 => Some("put"),
            Output::Journal(r) if r[1] == 4 || r[1] == 5 => Some("cached reply"),
            Output::Journal(_) => Some("other record"),
            Output::Publish(p) if p.kind == PublishKind::Notification => Some(
                if *p.payload == *b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" {
                    "delete"
                } else {
                    "set"
                },
            ),
            Output::Publish(_) => Some("reply"),
            Output::Violation { .. } => Some("violation"),
            Output::More(_) => Some("more"),
        })
        .collect();
    assert_eq!(kinds, ["put", "cached reply", "delete", "set", "reply"]);
    // Its own budget's worth, and k19999 on top.
    assert_eq!(expiries(&out), REQUEST_EXPIRY_BUDGET + 1);
    // Timer calls finish the rest; the last one says nothing is left.
    let mut calls = 0;
    loop {
        let out = sm.timeout(due);
        calls += 1;
        assert!(expiries(&out) <= EXPIRY_BUDGET);
        if out.last() != Some(&Output::More(0)) {
            break;
        }
    }
    let left = n as usize - EXPIRY_BUDGET - 2 * REQUEST_EXPIRY_BUDGET - 1;
    assert_eq!(
        calls,
        left.div_ceil(EXPIRY_BUDGET),
        "timer calls for the rest"
    );
    assert_eq!(sm.key_count(), 1, "only the new k19999");
    assert!(
        sm.next_deadline().is_some_and(|d| d > due),
        "only dedup evictions left"
    );
}

/// A batch of inputs decodes in place (used above through `encode_batch`).
#[test]
fn batches_decode() {
    let m = request(1, &[b"GET", b"k"], "c");
    let batch = wire::encode_batch(&[Input::Message(&m), Input::Disconnected("c")]);
    let inputs = wire::decode_batch(&batch).expect("decodes");
    assert!(matches!(inputs[1], InputRef::Disconnected("c")));
}

/// A large value is not copied into a SET's output list: its journal record
/// names where the value lies in the batch, and the host splices it in (the
/// guest's memory keeps its high-water mark). A GET's list holds the value
/// once, with little room to spare.
#[test]
fn a_large_value_costs_no_copy_in_a_sets_output_list() {
    let mut sm = durable();
    let value = vec![b'x'; 16 << 20];
    let set = request(1, &[b"SET", b"big", &value], "w");
    let batch = wire::encode_batch(&[Input::Message(&set)]);
    let raw = sm.handle_wire(&batch, T0).expect("handled");
    assert!(raw.len() < 1024, "{}", raw.len());
    let out = wire::decode_outputs(&raw, &batch).expect("decodes");
    let Output::Journal(record) = &out[0] else {
        panic!("{:?}", out[0]);
    };
    assert!(record.len() > value.len());
    // The record is the one a store rebuilds from.
    let mut expected = format!("${}\r\n", value.len()).into_bytes();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    let mut replayed = durable();
    replayed.replay(record).expect("replays");
    let mut kept = durable();
    kept.replay_owned(record.clone()).expect("replays");
    for store in [&mut replayed, &mut kept] {
        let out = store.handle(&request(3, &[b"GET", b"big"], "r"), T0);
        assert_eq!(replies(&out), [expected.clone()]);
    }
    assert_eq!(kept.snapshot(), replayed.snapshot());
    // Without its batch the list does not decode.
    assert!(wire::decode_outputs(&raw, &batch[..batch.len() / 2]).is_err());
    let get = request(2, &[b"GET", b"big"], "r");
    let raw = sm
        .handle_wire(&wire::encode_batch(&[Input::Message(&get)]), T0)
        .expect("handled");
    assert!(
        raw.capacity() < value.len() + (1 << 20),
        "{}",
        raw.capacity()
    );
}

/// A store's quota bounds what its clients can make it hold besides keys:
/// KEYNOTIFY registrations and cached replies each get a quarter of
/// `max_bytes` (here 8 MiB: 2 MiB each).
#[test]
fn registrations_and_cached_replies_count_in_the_quota() {
    let mut sm = StateMachine::new(Config {
        persist: Persist::All,
        quota: statestore_guest::types::Quota {
            max_bytes: Some(8 << 20),
            ..Default::default()
        },
        ..Config::default()
    })
    .expect("config");
    let mut registered = 0;
    let mut n = 0;
    for client in 0..8 {
        for k in 0..60u32 {
            n += 1;
            let mut key = format!("{k:04}").into_bytes();
            key.resize(8 << 10, b'k');
            let r = request(n, &[b"KEYNOTIFY", &key], &format!("obs{client}"));
            if replies(&sm.handle(&r, T0)) == [b"+OK\r\n".to_vec()] {
                registered += 1;
            }
        }
    }
    // About 16 KiB counted each: 2 MiB holds about 120 of the 480.
    assert!((100..=130).contains(&registered), "{registered}");
    // 5,000 DELs with 1,000-byte response topics: a cached reply each.
    for i in 0..5_000u64 {
        let mut r = request(10_000 + i, &[b"DEL", b"nothing"], "flooder");
        r.response_topic = Some(format!("clients/flooder/{i}/{}", "t".repeat(1000)));
        assert_eq!(replies(&sm.handle(&r, T0)), [b":0\r\n".to_vec()]);
    }
    let snapshot = sm.snapshot_with(statestore_guest::SnapshotScope::Everything);
    // Registrations (1 MiB of keys) and a dedup cache of 2 MiB, which a
    // snapshot writes at most about twice as large; unbounded it was 10 MiB.
    assert!(snapshot.len() < 7 << 20, "{}", snapshot.len());
}

/// A snapshot's buffer is sized before it is written, not doubled as it
/// grows (a doubling left the guest's memory at up to twice the state on
/// top of it, and a store at a third of its memory cap could not take a
/// snapshot).
#[test]
fn a_snapshot_is_written_into_a_buffer_of_its_size() {
    let mut sm = durable();
    let value = vec![b'v'; 1000];
    for i in 0..3000u64 {
        let key = format!("key{i}");
        sm.handle(&request(i, &[b"SET", key.as_bytes(), &value], "w"), T0);
    }
    for scope in [
        statestore_guest::SnapshotScope::Everything,
        statestore_guest::SnapshotScope::Durable,
    ] {
        let snapshot = sm.snapshot_with(scope);
        assert!(snapshot.len() > 3000 * 1000);
        assert!(
            snapshot.capacity() < snapshot.len() + snapshot.len() / 5,
            "{} of {}",
            snapshot.capacity(),
            snapshot.len()
        );
    }
}

/// A snapshot in parts: the parts are the one-piece snapshot's bytes,
/// each about the size asked (a large value is spread over parts), for
/// both scopes and a filtered durable scope; a restore from pieces of any size rebuilds the same state, and
/// a damaged, truncated or overlong snapshot is refused.
#[test]
fn snapshots_go_across_in_parts_both_ways() {
    use statestore_guest::{Restoring, SnapshotCursor, SnapshotScope};
    for persist in [Persist::All, Persist::Flagged] {
        let config = Config {
            persist,
            ..Config::default()
        };
        let mut sm = StateMachine::new(config.clone()).expect("config");
        for i in 0..300u64 {
            let key = format!("key{i:03}");
            let mut value = vec![b'v'; 100 + (i as usize % 7) * 1000];
            if i % 100 == 99 {
                // Large: goes out over parts.
                value = (0..LARGE_VALUE + 17 + i as usize)
                    .map(|b| b as u8)
                    .collect();
            }
            let mut r = request(i, &[b"SET", key.as_bytes(), &value], "w");
            if i % 3 == 0 {
                r.user_properties
                    .push(("aio-persistence".into(), "true".into()));
            }
            sm.handle(&r, T0);
        }
        // Registrations of several clients, several keys each: a part
        // may end between any two.
        for (i, (client, key)) in ["obs", "obs2", "obs3"]
            .iter()
            .flat_map(|c| ["key001", "key002", "key150", "key299"].map(|k| (*c, k)))
            .enumerate()
        {
            sm.handle(
                &request(1000 + i as u64, &[b"KEYNOTIFY", key.as_bytes()], client),
                T0,
            );
        }
        for scope in [SnapshotScope::Everything, SnapshotScope::Durable] {
            let whole = sm.snapshot_with(scope);
            for part in [1, 100, 4096, 1 << 20] {
                let mut cursor = SnapshotCursor::new(scope);
                let mut joined = Vec::new();
                let mut count = 0;
                loop {
                    let p = sm.snapshot_part(&mut cursor, part);
                    if p.is_empty() {
                        break;
                    }
                    // Whole small items: at most one item beyond the size
                    // asked; a large value is cut.
                    assert!(p.len() < part + 8000, "{} for {part}", p.len());
                    assert!(part == 1 << 20 || p.len() < LARGE_VALUE, "{}", p.len());
                    joined.extend_from_slice(&p);
                    count += 1;
                }
                assert_eq!(joined, whole, "{persist:?} {scope:?} parts of {part}");
                assert!(count >= whole.len().div_ceil(part + 8000));
            }
            for feed in [1, 7, 5000, whole.len()] {
                let mut r = Restoring::new(config.clone()).expect("config");
                for piece in whole.chunks(feed) {
                    r.feed(piece).expect("piece");
                }
                let restored = r.finish().expect("restore");
                assert_eq!(restored.snapshot_with(scope), whole);
            }
            // Truncated anywhere: refused at the end.
            for cut in [0, 5, 40, whole.len() / 2, whole.len() - 1] {
                let mut r = Restoring::new(config.clone()).expect("config");
                r.feed(&whole[..cut]).expect("a prefix is not wrong yet");
                assert!(r.finish().is_err(), "cut at {cut}");
            }
            // A flipped byte: refused (by the checksum at the latest).
            for at in [9, 30, whole.len() / 2, whole.len() - 2] {
                let mut bad = whole.clone();
                bad[at] ^= 0x40;
                let mut r = Restoring::new(config.clone()).expect("config");
                let fed = bad.chunks(1000).try_for_each(|p| r.feed(p));
                assert!(fed.is_err() || r.finish().is_err(), "flip at {at}");
            }
            // Bytes after the checksum.
            let mut long = whole.clone();
            long.push(0);
            let mut r = Restoring::new(config.clone()).expect("config");
            assert!(r.feed(&long).is_err());
            assert!(r.feed(b"").is_err(), "refused once, refused after");
        }
    }
    let mut r = Restoring::new(Config::default()).expect("config");
    assert_eq!(
        r.feed(b"NOTASNAPSHOT").map_err(|e| e.to_string()),
        Err("bad snapshot: not a state store snapshot".into())
    );
}

/// A SET whose value is most of its batch keeps the value in the batch's
/// buffer (`handle_wire_owned`): the call ends after it, the rest of the
/// batch comes in the next call, and the store is exactly what a store
/// that copied every value holds, with the same outputs.
#[test]
fn a_large_value_lent_from_its_batch_is_the_same_store() {
    let value = vec![b'L'; 1 << 20];
    let set = request(1, &[b"SET", b"big", &value], "w");
    let get = request(2, &[b"GET", b"big"], "r");
    let small = request(3, &[b"SET", b"small", b"s"], "w");
    let again = request(4, &[b"SET", b"big", &value[..LARGE_VALUE]], "w");
    let get_again = request(5, &[b"GET", b"big"], "r");
    let inputs = [
        Input::Message(&set),
        Input::Message(&get),
        Input::Message(&small),
        Input::Message(&again),
        Input::Message(&get_again),
    ];
    let mut copied = durable();
    let want = copied.step(&inputs, T0);
    let mut lent = durable();
    let mut got = Vec::new();
    let mut rest = &inputs[..];
    let mut calls = 0;
    while !rest.is_empty() {
        let batch = wire::encode_batch(rest);
        let raw = lent.handle_wire_owned(batch.clone(), T0).expect("handled");
        let mut out = wire::decode_outputs(&raw, &batch).expect("decodes");
        let handled = wire::handled(&mut out, rest.len());
        got.extend(out);
        rest = &rest[handled..];
        calls += 1;
    }
    assert_eq!(got, want);
    assert_eq!(lent.snapshot(), copied.snapshot());
    // Each large SET was lent (its call ended after it): the first alone,
    // the second after the GET and the small SET.
    assert_eq!(calls, 3);
    let mut expected = format!("${}\r\n", value.len()).into_bytes();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    assert_eq!(replies(&got)[1], expected);
    assert_eq!(replies(&got)[4].len(), LARGE_VALUE + 10);
    assert_eq!(lent.stats().bytes, copied.stats().bytes);
}
