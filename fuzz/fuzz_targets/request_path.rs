//! The whole request path: arbitrary messages, disconnects and timer events
//! with moving time. Never a panic; every reply carries `__stat`; a snapshot
//! restores to an identical state.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::{Config, InboundMessage, Input, Output, PublishKind, StateMachine, Via};

#[derive(Debug, Arbitrary)]
enum Payload {
    /// Raw bytes.
    Raw(Vec<u8>),
    /// A well-formed array of chosen words and arbitrary bytes.
    Words(Vec<Word>),
}

#[derive(Debug, Arbitrary)]
enum Word {
    Verb(u8),
    Bytes(Vec<u8>),
    Number(u64),
}

const WORDS: &[&[u8]] = &[
    b"SET",
    b"GET",
    b"DEL",
    b"VDEL",
    b"KEYNOTIFY",
    b"NX",
    b"NEX",
    b"PX",
    b"STOP",
    b"set",
    b"k",
    b"v",
    b"",
    b"MGET",
];

#[derive(Debug, Arbitrary)]
enum Event {
    Message {
        payload: Payload,
        qos: u8,
        response_topic: Option<String>,
        correlation: Option<Vec<u8>>,
        expiry: Option<u32>,
        ts: Option<TsChoice>,
        ft: Option<TsChoice>,
        props: Vec<(String, String)>,
        client_id: Option<String>,
        received_back: Option<u16>,
        /// Where it came in (a replica and its life), as in a cluster.
        via: Option<(u8, u8)>,
    },
    Disconnect(String),
    /// A replica reports a client gone (a cluster's `disconnected-via`).
    DisconnectVia(String, u8, u8),
    /// A replica starts a new life (`replica-started`).
    ReplicaStarted(u8, u8),
    Timeout,
    Advance(u16),
    Restore,
}

#[derive(Debug, Arbitrary)]
enum TsChoice {
    Now { ahead_ms: i32, counter: u32 },
    Text(String),
}

fn ts(choice: &TsChoice, now: u64) -> String {
    match choice {
        TsChoice::Now { ahead_ms, counter } => {
            format!(
                "{}:{}:fz",
                now.saturating_add_signed(i64::from(*ahead_ms)),
                counter
            )
        }
        TsChoice::Text(t) => t.clone(),
    }
}

fn payload(p: &Payload) -> Vec<u8> {
    match p {
        Payload::Raw(b) => b.clone(),
        Payload::Words(words) => {
            let mut out = format!("*{}\r\n", words.len()).into_bytes();
            for w in words {
                let item: Vec<u8> = match w {
                    Word::Verb(i) => WORDS[usize::from(*i) % WORDS.len()].to_vec(),
                    Word::Bytes(b) => b.clone(),
                    Word::Number(n) => n.to_string().into_bytes(),
                };
                out.extend_from_slice(format!("${}\r\n", item.len()).as_bytes());
                out.extend_from_slice(&item);
                out.extend_from_slice(b"\r\n");
            }
            out
        }
    }
}

/// A few replicas, a few lives each: vias that meet.
fn to_via(replica: u8, started: u8) -> Via {
    Via {
        replica: u64::from(replica % 3),
        started: u64::from(started % 4),
    }
}

fuzz_target!(|events: Vec<Event>| {
    let config = Config::default();
    let mut sm = StateMachine::new(config.clone()).expect("default config is valid");
    let mut now: u64 = 1_700_000_000_000;
    for event in &events {
        let outputs = match event {
            Event::Message {
                payload: p,
                qos,
                response_topic,
                correlation,
                expiry,
                ts: t,
                ft,
                props,
                client_id,
                received_back,
                via,
            } => {
                let mut user_properties = props.clone();
                if let Some(t) = t {
                    user_properties.insert(0, ("__ts".into(), ts(t, now)));
                }
                if let Some(f) = ft {
                    user_properties.insert(0, ("__ft".into(), ts(f, now)));
                }
                let m = InboundMessage {
                    topic: REQUEST_TOPIC.into(),
                    payload: payload(p),
                    qos: qos % 3,
                    response_topic: response_topic.clone().or_else(|| Some("r/t".into())),
                    correlation_data: correlation.clone(),
                    message_expiry_interval: *expiry,
                    content_type: None,
                    payload_format_indicator: None,
                    user_properties,
                    client_id: client_id.clone(),
                    received_at: received_back.map(|b| now - u64::from(b)),
                    username: None,
                    attributes: Vec::new(),
                    via: via.map(|(r, s)| to_via(r, s)),
                };
                sm.handle(&m, now)
            }
            Event::Disconnect(c) => sm.client_disconnected(c, now),
            Event::DisconnectVia(c, r, s) => sm.step(&[Input::DisconnectedVia(c, to_via(*r, *s))], now),
            Event::ReplicaStarted(r, s) => sm.step(&[Input::ReplicaStarted(to_via(*r, *s))], now),
            Event::Timeout => sm.timeout(now),
            Event::Advance(ms) => {
                now += u64::from(*ms) * 16;
                Vec::new()
            }
            Event::Restore => {
                let snap = sm.snapshot();
                sm = StateMachine::restore(config.clone(), &snap).expect("own snapshot restores");
                assert_eq!(sm.snapshot(), snap);
                Vec::new()
            }
        };
        let mut seen_reply = false;
        for o in outputs {
            if let Output::Publish(p) = o {
                match p.kind {
                    PublishKind::Response => {
                        assert!(!seen_reply, "at most one reply per input");
                        seen_reply = true;
                        assert!(p.user_property("__stat").is_some());
                        assert_eq!(p.qos, 1);
                    }
                    PublishKind::Notification => {
                        assert!(!seen_reply, "notifications come before the reply");
                        assert!(p.user_property("__ts").is_some());
                    }
                }
            }
        }
        if !matches!(event, Event::Advance(_) | Event::Restore) {
            // Every input first expires what is due, so the next deadline is in
            // the future; one in the past would make a host's timer spin.
            assert!(sm.next_deadline().is_none_or(|d| d > now));
        }
    }
});
