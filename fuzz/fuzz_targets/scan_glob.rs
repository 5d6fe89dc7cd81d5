//! SCAN against the `glob` crate itself: random keys (some not UTF-8, some
//! expiring), a random pattern, a random page size. Paging through every
//! page must list exactly the live UTF-8 keys the crate's
//! `Pattern::matches` accepts, in key order, once each; a pattern the
//! crate refuses must get `-ERR the pattern is not valid: ...`.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::{Config, InboundMessage, Output, PublishKind, ScanPage, StateMachine};

/// Bytes keys and patterns are made of: glob syntax, `/`, `.`, letters, a
/// two-byte UTF-8 character and a byte that is never UTF-8.
const ALPHABET: &[&[u8]] = &[
    b"a", b"b", b"A", b"/", b".", b"*", b"?", b"[", b"]", b"!", b"^", b"-", b"\\", "é".as_bytes(),
    b"\xff",
];

#[derive(Debug, Arbitrary)]
struct Case {
    keys: Vec<(Vec<u8>, bool)>,
    pattern: Vec<u8>,
    page_keys: u8,
}

fn text(symbols: &[u8]) -> Vec<u8> {
    symbols
        .iter()
        .take(12)
        .flat_map(|&s| ALPHABET[usize::from(s) % ALPHABET.len()].iter().copied())
        .collect()
}

fn message(payload: Vec<u8>, corr: u64, now: u64) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload,
        qos: 1,
        response_topic: Some("clients/c/resp".into()),
        correlation_data: Some(corr.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        user_properties: vec![("__ts".into(), format!("{now}:0:c"))],
        client_id: Some("c".into()),
        ..Default::default()
    }
}

fn reply(outputs: Vec<Output>) -> Vec<u8> {
    outputs
        .into_iter()
        .find_map(|o| match o {
            Output::Publish(p) if p.kind == PublishKind::Response => Some(p.payload.to_vec()),
            _ => None,
        })
        .expect("a reply")
}

/// (keys, token) of a page, checking its framing byte for byte.
fn page(p: &[u8]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    fn line(p: &[u8], at: &mut usize, lead: u8) -> usize {
        assert_eq!(p[*at], lead, "{:?}", String::from_utf8_lossy(p));
        let end = *at + p[*at..].windows(2).position(|w| w == b"\r\n").expect("crlf");
        let n = std::str::from_utf8(&p[*at + 1..end]).unwrap().parse().unwrap();
        *at = end + 2;
        n
    }
    fn bulk(p: &[u8], at: &mut usize) -> Vec<u8> {
        let n = line(p, at, b'$');
        let v = p[*at..*at + n].to_vec();
        assert_eq!(&p[*at + n..*at + n + 2], b"\r\n");
        *at += n + 2;
        v
    }
    let mut at = 0;
    let parts = line(p, &mut at, b'*');
    let k = line(p, &mut at, b'*');
    let keys = (0..k).map(|_| bulk(p, &mut at)).collect();
    let token = match parts {
        1 => None,
        2 => Some(bulk(p, &mut at)),
        n => panic!("{n} parts"),
    };
    assert_eq!(at, p.len(), "trailing bytes");
    (keys, token)
}

fuzz_target!(|case: Case| {
    let now = 1_700_000_000_000u64;
    let config = Config {
        scan_page: ScanPage {
            max_keys: u32::from(case.page_keys % 5) + 1,
            max_bytes: 64,
        },
        ..Config::default()
    };
    let mut sm = StateMachine::new(config).expect("config");
    let mut corr = 0;
    let mut live = BTreeSet::new();
    for (symbols, expires) in case.keys.iter().take(40) {
        let key = text(symbols);
        if key.is_empty() {
            continue;
        }
        corr += 1;
        let mut parts: Vec<&[u8]> = vec![b"SET", &key, b"v"];
        if *expires {
            parts.extend([&b"PX"[..], b"5"]);
        }
        let r = reply(sm.handle(&message(statestore_guest::resp3::request(&parts), corr, now), now));
        assert_eq!(r, b"+OK\r\n");
        if *expires {
            live.remove(&key);
        } else {
            live.insert(key);
        }
    }
    let later = now + 5; // the expiring keys are due, not yet removed
    let pattern = text(&case.pattern);
    let want: Vec<Vec<u8>> = match std::str::from_utf8(&pattern).map(glob::Pattern::new) {
        Err(_) => Vec::new(), // not UTF-8: matches nothing
        Ok(Err(_)) => {
            corr += 1;
            let m = message(statestore_guest::resp3::request(&[b"SCAN", &pattern]), corr, later);
            let r = reply(sm.handle(&m, later));
            assert!(
                r.starts_with(b"-ERR the pattern is not valid: ") || pattern.is_empty(),
                "{:?}",
                String::from_utf8_lossy(&r)
            );
            return;
        }
        Ok(Ok(g)) => live
            .iter()
            .filter(|k| std::str::from_utf8(k).is_ok_and(|k| g.matches(k)))
            .cloned()
            .collect(),
    };
    let mut got = Vec::new();
    let mut token: Option<Vec<u8>> = None;
    for _ in 0..200 {
        corr += 1;
        let mut parts: Vec<&[u8]> = vec![b"SCAN", &pattern];
        if let Some(t) = &token {
            parts.push(t);
        }
        let m = message(statestore_guest::resp3::request(&parts), corr, later);
        let (keys, next) = page(&reply(sm.handle(&m, later)));
        got.extend(keys);
        match next {
            Some(t) => {
                assert!(!t.is_empty() && t.starts_with(b"0;1;"));
                token = Some(t);
            }
            None => {
                assert_eq!(got, want, "pattern {:?}", String::from_utf8_lossy(&pattern));
                return;
            }
        }
    }
    panic!("the scan did not end");
});
