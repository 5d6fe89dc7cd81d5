//! The two ways outputs leave the state machine agree: queued as values
//! (`handle` + `take_outputs`, what a native host uses) and written straight
//! into the flat encoding while a wire batch is handled (`handle_wire`, what
//! crosses the component boundary, with replies in the compact form). Two
//! machines take the same pseudo-random inputs, one each way; every output,
//! decoded, must be equal and in the same order, journal records first.

use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::{Config, InboundMessage, Output, Persist, StateMachine, wire};

const T0: u64 = 1_700_000_000_000;

/// xorshift64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn resp(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A request, mostly well formed, sometimes broken in one of the ways the
/// envelope checks catch.
fn request(rng: &mut Rng, n: u64, now: u64) -> InboundMessage {
    let keys: [&[u8]; 4] = [b"a", b"b", b"lock", b"\xff\0"];
    let values: [&[u8]; 3] = [b"", b"v1", b"a longer value \r\n with CRLF"];
    let key = rng.pick(&keys);
    let value = rng.pick(&values);
    let payload = match rng.below(12) {
        0..=3 => {
            let mut parts: Vec<&[u8]> = vec![b"SET", key, value];
            match rng.below(4) {
                0 => parts.push(b"NX"),
                1 => parts.push(b"NEX"),
                _ => {}
            }
            if rng.below(3) == 0 {
                parts.extend([&b"PX"[..], &b"1500"[..]]);
            }
            resp(&parts)
        }
        4..=5 => resp(&[b"GET", key]),
        6 => resp(&[b"DEL", key]),
        7 => resp(&[b"VDEL", key, value]),
        8 => resp(&[b"KEYNOTIFY", key]),
        9 => resp(&[b"KEYNOTIFY", key, b"STOP"]),
        10 => b"*1\r\n$3\r\nGE".to_vec(), // not RESP3 that decodes
        _ => resp(&[b"FLY", key]),
    };
    let client = *rng.pick(&["c1", "c2", "sdk-client-3"]);
    let mut m = InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload,
        qos: 1,
        response_topic: Some(format!("clients/{client}/statestore/response")),
        // Sometimes a correlation seen before: a retry, or a reuse.
        correlation_data: Some(rng.below(n.max(1) + 3).to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        content_type: Some("application/octet-stream".into()),
        payload_format_indicator: Some(0),
        user_properties: vec![
            ("__srcId".into(), client.into()),
            ("__protVer".into(), "1.0".into()),
            ("__ts".into(), format!("{now:015}:00000:{client}")),
        ],
        client_id: None,
        received_at: None,
    };
    if rng.below(4) == 0 {
        m.user_properties
            .push(("aio-persistence".into(), "true".into()));
    }
    if rng.below(5) == 0 {
        let ft = if rng.below(2) == 0 {
            format!("{:015}:00000:other", now - 1)
        } else {
            format!("{now:015}:00009:{client}")
        };
        m.user_properties.push(("__ft".into(), ft));
    }
    match rng.below(40) {
        0 => m.correlation_data = None,
        1 => m.message_expiry_interval = None,
        2 => m.user_properties[1].1 = "2.0".into(),
        3 => {
            m.response_topic =
                Some("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x".into())
        }
        4 => m.response_topic = None,
        5 => {
            m.user_properties.remove(2); // no __ts
        }
        6 => m.client_id = Some("broker-known".into()),
        7 => m.received_at = Some(now - 20_000), // expired in the queue
        _ => {}
    }
    m
}

fn run(persist: Persist, server_client_id: Option<&str>, seed: u64) {
    let config = Config {
        node_id: "node-1".into(),
        server_client_id: server_client_id.map(str::to_string),
        persist,
        hash_seed: seed,
        ..Config::default()
    };
    let mut queued = StateMachine::new(config.clone()).expect("store");
    let mut wired = StateMachine::new(config).expect("store");
    let mut rng = Rng(seed | 1);
    let mut now = T0;
    let mut n = 0u64;
    for step in 0..400 {
        let mut expected: Vec<Output> = Vec::new();
        let got = match rng.below(10) {
            // Time passes; expiries and dedup evictions come due.
            0 => {
                now += rng.below(4_000);
                queued.timeout(now);
                wired.timeout(now);
                expected.extend(queued.take_outputs());
                wired.poll_wire()
            }
            1 => {
                let client = *rng.pick(&["c1", "c2", "sdk-client-3"]);
                queued.client_disconnected(client, now);
                wired.client_disconnected(client, now);
                expected.extend(queued.take_outputs());
                wired.poll_wire()
            }
            // A batch, sometimes after a message handled the other way
            // (its outputs still pending when the batch comes).
            _ => {
                let pending = rng.below(4) == 0;
                if pending {
                    n += 1;
                    let m = request(&mut rng, n, now);
                    queued.handle(&m, now);
                    wired.handle(&m, now);
                }
                let batch: Vec<InboundMessage> = (0..1 + rng.below(20))
                    .map(|_| {
                        n += 1;
                        request(&mut rng, n, now)
                    })
                    .collect();
                for m in &batch {
                    queued.handle(m, now);
                }
                expected.extend(queued.take_outputs());
                wired
                    .handle_wire(&wire::encode_batch(&batch), now)
                    .expect("the batch decodes")
            }
        };
        let got = wire::decode_outputs(&got).expect("outputs decode");
        assert_eq!(
            got, expected,
            "step {step}, persist {persist:?}, seed {seed}"
        );
        assert_eq!(queued.next_deadline(), wired.next_deadline());
    }
    assert_eq!(queued.snapshot(), wired.snapshot(), "same state");
}

#[test]
fn wire_outputs_equal_queued_outputs() {
    for seed in 1..=6 {
        for persist in [Persist::None, Persist::All, Persist::Flagged] {
            for server in [None, Some("statestore-server")] {
                run(persist, server, seed * 7919);
            }
        }
    }
}

#[test]
fn a_batch_that_does_not_decode_changes_nothing() {
    let mut m = StateMachine::new(Config::default()).expect("store");
    let mut rng = Rng(42);
    let first = request(&mut rng, 1, T0);
    m.handle(&first, T0);
    let pending = m.take_outputs();
    m.handle(&first, T0); // the same again: its outputs stay pending
    let mut batch = wire::encode_batch(&[request(&mut rng, 2, T0)]);
    batch.truncate(batch.len() - 1);
    assert!(m.handle_wire(&batch, T0).is_err());
    // What was pending before is still there, in the wire encoding too.
    let again = wire::decode_outputs(&m.poll_wire()).expect("decodes");
    assert_eq!(again.len(), pending.len());
    assert!(m.take_outputs().is_empty());
}

#[test]
fn damaged_output_lists_are_errors_not_panics() {
    let mut m = StateMachine::new(Config {
        server_client_id: Some("server".into()),
        persist: Persist::All,
        ..Config::default()
    })
    .expect("store");
    let mut rng = Rng(7);
    let observe: Vec<InboundMessage> = ["c1", "c2"]
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let mut r = request(&mut rng, 1, T0);
            r.payload = resp(&[b"KEYNOTIFY", b"k"]);
            r.correlation_data = Some(vec![i as u8]);
            r.client_id = Some((*client).into());
            r.message_expiry_interval = Some(10);
            r
        })
        .collect();
    m.handle_wire(&wire::encode_batch(&observe), T0)
        .expect("decodes");
    let mut set = observe[0].clone();
    set.payload = resp(&[b"SET", b"k", b"value"]);
    set.correlation_data = Some(vec![9]);
    let mut get = set.clone();
    get.payload = resp(&[b"GET", b"k"]);
    get.correlation_data = Some(vec![10]);
    let list = m
        .handle_wire(&wire::encode_batch(&[set, get]), T0)
        .expect("decodes");
    let outputs = wire::decode_outputs(&list).expect("decodes");
    // Two journal records (the value, the SET's reply), two notifications,
    // the SET's reply, the GET's reply.
    assert_eq!(outputs.len(), 6, "{outputs:#?}");
    for cut in 0..list.len() {
        assert!(wire::decode_outputs(&list[..cut]).is_err(), "cut at {cut}");
    }
    for i in 0..list.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut damaged = list.clone();
            damaged[i] ^= flip;
            let _ = wire::decode_outputs(&damaged);
        }
    }
    let mut longer = list.clone();
    longer.push(0);
    assert!(wire::decode_outputs(&longer).is_err());
    let mut newer = list;
    newer[0] = 3;
    assert_eq!(
        wire::decode_outputs(&newer),
        Err(statestore_guest::Error::UnsupportedVersion(3))
    );
}
