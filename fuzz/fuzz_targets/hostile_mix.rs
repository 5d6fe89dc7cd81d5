//! Hostile and oversized requests mixed with a well-behaved client's:
//! a poisoned clock, huge correlation data and response topics, values
//! past the quota, KEYNOTIFY floods, garbage, expired and retried
//! requests, spoofed disconnects, time jumps, and crashes (recovery from a
//! snapshot and the journal written since). Whatever the hostile clients
//! do, every write the good client got `+OK` for is read back by it, and
//! every request of the good client gets a reply.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::types::Quota;
use statestore_guest::{
    Config, InboundMessage, Output, Persist, PublishKind, SnapshotScope, StateMachine,
};

const GOOD: &str = "good";

#[derive(Debug, Arbitrary)]
enum Event {
    /// The good client writes one of its 8 keys (`del`: deletes it).
    GoodWrite {
        key: u8,
        value: Vec<u8>,
        del: bool,
    },
    /// The good client reads one of its keys and checks it.
    GoodRead {
        key: u8,
    },
    /// A hostile client's request.
    Hostile {
        client: u8,
        attack: Attack,
    },
    /// Somebody says the good client went away.
    SpoofedDisconnect,
    Timeout,
    Advance(u16),
    /// The process dies: recover from the last snapshot and the journal.
    Crash,
    /// The host takes a snapshot and cuts the journal.
    Compact,
}

#[derive(Debug, Arbitrary)]
enum Attack {
    /// `__ts` far ahead with a counter near its limit.
    PoisonClock { ahead_ms: u16, counter: u32 },
    /// Correlation data this long.
    LongCorrelation(u16),
    /// A response topic this long.
    LongTopic(u16),
    /// A value this many KiB (the quota allows 4).
    BigValue(u8),
    /// KEYNOTIFY on many keys.
    NotifyFlood(u8),
    /// Arbitrary payload bytes.
    Garbage(Vec<u8>),
    /// A request that expired long ago (queued).
    Expired,
    /// A write to its own keys, with a message expiry of up to 2^32-1 s.
    Write { key: u8, expiry: u32 },
}

struct World {
    config: Config,
    sm: StateMachine,
    now: u64,
    corr: u64,
    /// The last durable snapshot and the journal records since.
    snapshot: Vec<u8>,
    records: Vec<Vec<u8>>,
    /// The good client's acknowledged state.
    model: BTreeMap<u8, Option<Vec<u8>>>,
}

fn request(parts: &[&[u8]]) -> Vec<u8> {
    statestore_guest::resp3::request(parts)
}

impl World {
    fn message(&mut self, client: &str, payload: Vec<u8>) -> InboundMessage {
        self.corr += 1;
        InboundMessage {
            topic: REQUEST_TOPIC.into(),
            payload,
            qos: 1,
            response_topic: Some(format!("clients/{client}/resp")),
            correlation_data: Some(self.corr.to_be_bytes().to_vec()),
            message_expiry_interval: Some(10),
            user_properties: vec![("__ts".into(), format!("{}:0:{client}", self.now))],
            client_id: Some(client.into()),
            ..Default::default()
        }
    }

    /// Handles `m`; keeps the journal; returns the reply payload, if any.
    fn send(&mut self, m: &InboundMessage) -> Option<Vec<u8>> {
        let outputs = self.sm.handle(m, self.now);
        self.take(outputs, m.response_topic.as_deref())
    }

    fn take(&mut self, outputs: Vec<Output>, topic: Option<&str>) -> Option<Vec<u8>> {
        let mut reply = None;
        for o in outputs {
            match o {
                Output::Journal(r) => self.records.push(r),
                Output::Publish(p) if p.kind == PublishKind::Response => {
                    assert_eq!(Some(&*p.topic), topic, "a reply goes to its requester");
                    assert!(reply.is_none(), "one reply");
                    reply = Some(p.payload.to_vec());
                }
                _ => {}
            }
        }
        reply
    }

    fn good_key(key: u8) -> Vec<u8> {
        format!("g/{}", key % 8).into_bytes()
    }

    fn check(&mut self, key: u8) {
        let k = World::good_key(key);
        let m = self.message(GOOD, request(&[b"GET", &k]));
        let got = self.send(&m).expect("the good client's GET is answered");
        let expected = match self.model.get(&(key % 8)) {
            Some(Some(v)) => {
                let mut e = format!("${}\r\n", v.len()).into_bytes();
                e.extend_from_slice(v);
                e.extend_from_slice(b"\r\n");
                e
            }
            _ => b"$-1\r\n".to_vec(),
        };
        assert_eq!(got, expected, "key {key}: an acknowledged write was lost");
    }
}

fuzz_target!(|events: Vec<Event>| {
    let config = Config {
        persist: Persist::All,
        quota: Quota {
            max_keys: Some(64),
            max_bytes: Some(64 << 10),
            max_key_bytes: Some(256),
            max_value_bytes: Some(4 << 10),
        },
        ..Config::default()
    };
    let sm = StateMachine::new(config.clone()).expect("valid config");
    let snapshot = sm.snapshot_with(SnapshotScope::Durable);
    let mut w = World {
        config,
        sm,
        now: 1_700_000_000_000,
        corr: 0,
        snapshot,
        records: Vec::new(),
        model: BTreeMap::new(),
    };
    for event in events.iter().take(400) {
        match event {
            Event::GoodWrite { key, value, del } => {
                let k = World::good_key(*key);
                let value: Vec<u8> = value.iter().copied().take(512).collect();
                let payload = if *del {
                    request(&[b"DEL", &k])
                } else {
                    request(&[b"SET", &k, &value])
                };
                let m = w.message(GOOD, payload);
                let reply = w.send(&m).expect("the good client's write is answered");
                match (&reply[..], del) {
                    (b"+OK\r\n", false) => {
                        w.model.insert(key % 8, Some(value));
                    }
                    (b":1\r\n" | b":0\r\n", true) => {
                        w.model.insert(key % 8, None);
                    }
                    // Refused because others filled the quota: nothing
                    // changed. Nothing else may refuse it (a poisoned clock
                    // once made every write `500 Counter`).
                    (b"-ERR the quota has been exceeded\r\n", false) => {}
                    (other, _) => panic!(
                        "the good client's {} was refused: {:?}",
                        if *del { "DEL" } else { "SET" },
                        String::from_utf8_lossy(other)
                    ),
                }
            }
            Event::GoodRead { key } => w.check(*key),
            Event::Hostile { client, attack } => {
                let client = format!("h{}", client % 4);
                let own_key = |k: u8| format!("h/{client}/{k}").into_bytes();
                let mut m = w.message(&client, Vec::new());
                match attack {
                    Attack::PoisonClock { ahead_ms, counter } => {
                        m.payload = request(&[b"SET", &own_key(0), b"x"]);
                        let wall = w.now + u64::from(*ahead_ms) * 4;
                        let counter = u64::from(*counter).max(2_147_483_000);
                        m.user_properties =
                            vec![("__ts".into(), format!("{wall}:{counter}:{client}"))];
                    }
                    Attack::LongCorrelation(n) => {
                        m.payload = request(&[b"SET", &own_key(1), b"x"]);
                        m.correlation_data = Some(vec![7; usize::from(*n) * 4]);
                    }
                    Attack::LongTopic(n) => {
                        m.payload = request(&[b"SET", &own_key(2), b"x"]);
                        m.response_topic =
                            Some(format!("clients/{client}/{}", "t".repeat(usize::from(*n))));
                    }
                    Attack::BigValue(kib) => {
                        m.payload =
                            request(&[b"SET", &own_key(3), &vec![1; usize::from(*kib) << 10]]);
                    }
                    Attack::NotifyFlood(n) => {
                        for i in 0..*n {
                            let mut r = w.message(&client, request(&[b"KEYNOTIFY", &own_key(i)]));
                            r.client_id = Some(client.clone());
                            w.send(&r);
                        }
                        m.payload = request(&[b"KEYNOTIFY", &World::good_key(0)]);
                    }
                    Attack::Garbage(bytes) => m.payload = bytes.clone(),
                    Attack::Expired => {
                        m.payload = request(&[b"SET", &own_key(4), b"x"]);
                        m.received_at = Some(w.now.saturating_sub(60_000));
                    }
                    Attack::Write { key, expiry } => {
                        m.payload = request(&[b"SET", &own_key(*key), b"y"]);
                        m.message_expiry_interval = Some(*expiry);
                    }
                }
                let topic = m.response_topic.clone();
                let outputs = w.sm.handle(&m, w.now);
                w.take(outputs, topic.as_deref());
            }
            Event::SpoofedDisconnect => {
                let outputs = w.sm.client_disconnected(GOOD, w.now);
                w.take(outputs, None);
            }
            Event::Timeout => {
                let outputs = w.sm.timeout(w.now);
                w.take(outputs, None);
            }
            Event::Advance(ms) => w.now += u64::from(*ms) * 64,
            Event::Crash => {
                let mut sm = StateMachine::restore(w.config.clone(), &w.snapshot)
                    .expect("a durable snapshot restores");
                for r in &w.records {
                    sm.replay(r).expect("a journal record replays");
                }
                w.sm = sm;
            }
            Event::Compact => {
                w.snapshot = w.sm.snapshot_with(SnapshotScope::Durable);
                w.records.clear();
            }
        }
    }
    for key in 0..8 {
        w.check(key);
    }
});
