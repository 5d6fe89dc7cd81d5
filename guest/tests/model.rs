//! Model-based property test: random operation sequences with time jumps are
//! run against the state machine and against a plain `BTreeMap` + deadlines
//! model; every reply, version order and notification must agree.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_guest::{
    Config, InboundMessage, Output, Persist, PublishKind, Restoring, ScanPage, SnapshotCursor,
    SnapshotScope, StateMachine,
};

const T0: u64 = 1_700_000_000_000;
const KEYS: &[&[u8]] = &[b"a", b"b", b"c\0\r\n", b"\xff"];
const VALUES: &[&[u8]] = &[b"", b"x", b"y\r\n", b"\0\xfe"];

#[derive(Debug, Clone, Copy)]
enum Op {
    Set {
        key: usize,
        value: usize,
        cond: u8,
        px: Option<u64>,
    },
    Get {
        key: usize,
    },
    Del {
        key: usize,
    },
    VDel {
        key: usize,
        value: usize,
    },
    Observe {
        key: usize,
        stop: bool,
    },
    Advance {
        ms: u64,
    },
    /// Snapshot in parts of about `part` bytes, restore from pieces of
    /// `feed` bytes (both small: items are split across them).
    Restore {
        part: usize,
        feed: usize,
    },
    Redeliver,
    /// One SCAN page: the first of a new scan, or the next of the scan
    /// in progress.
    Scan {
        pattern: usize,
    },
}

const PATTERNS: &[&[u8]] = &[b"*", b"?", b"[ab]", b"c*", b"[!a]*", b"b", b"\xff*"];

/// A scan in progress, and what the model knows of it.
struct Cursor {
    pattern: &'static [u8],
    token: Vec<u8>,
    /// Keys returned so far, in order.
    returned: Vec<Vec<u8>>,
    /// Matching keys live when the scan began and not deleted or expired
    /// since: each must be returned, once.
    stable: BTreeSet<Vec<u8>>,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS.len();
    let v = 0..VALUES.len();
    prop_oneof![
        4 => (k.clone(), v.clone(), 0..3u8, prop::option::of(1..3000u64))
            .prop_map(|(key, value, cond, px)| Op::Set { key, value, cond, px }),
        2 => k.clone().prop_map(|key| Op::Get { key }),
        1 => k.clone().prop_map(|key| Op::Del { key }),
        1 => (k.clone(), v).prop_map(|(key, value)| Op::VDel { key, value }),
        1 => (k, any::<bool>()).prop_map(|(key, stop)| Op::Observe { key, stop }),
        2 => prop_oneof![0..5u64, 0..4000u64].prop_map(|ms| Op::Advance { ms }),
        1 => (1usize..300, 1usize..400).prop_map(|(part, feed)| Op::Restore { part, feed }),
        1 => Just(Op::Redeliver),
        3 => (0..PATTERNS.len()).prop_map(|pattern| Op::Scan { pattern }),
    ]
}

fn resp(parts: &[&[u8]]) -> Vec<u8> {
    statestore_guest::resp3::request(parts)
}

struct Harness {
    sm: StateMachine,
    now: u64,
    corr: u64,
    last: Option<(InboundMessage, Vec<u8>)>,
    // Model.
    keys: BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>,
    observed: BTreeSet<Vec<u8>>,
    last_version: String,
    /// Every journal record so far.
    journal: Vec<Vec<u8>>,
    cursor: Option<Cursor>,
}

fn config() -> Config {
    Config {
        persist: Persist::All,
        // Pages of at most two keys: a scan of four keys takes several.
        scan_page: ScanPage {
            max_keys: 2,
            max_bytes: 1000,
        },
        ..Config::default()
    }
}

/// The keys of a SCAN reply, and its token if more pages follow.
fn parse_page(payload: &[u8]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    fn line(buf: &[u8], at: &mut usize) -> String {
        let end = *at
            + buf[*at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("crlf");
        let s = String::from_utf8(buf[*at..end].to_vec()).expect("ok");
        *at = end + 2;
        s
    }
    fn bulk(buf: &[u8], at: &mut usize) -> Vec<u8> {
        let head = line(buf, at);
        let n: usize = head.strip_prefix('$').expect("bulk").parse().expect("ok");
        let v = buf[*at..*at + n].to_vec();
        assert_eq!(&buf[*at + n..*at + n + 2], b"\r\n");
        *at += n + 2;
        v
    }
    let mut at = 0;
    let parts = line(payload, &mut at);
    let k: usize = line(payload, &mut at)
        .strip_prefix('*')
        .expect("ok")
        .parse()
        .expect("ok");
    let keys = (0..k).map(|_| bulk(payload, &mut at)).collect();
    let token = match parts.as_str() {
        "*1" => None,
        "*2" => Some(bulk(payload, &mut at)),
        other => panic!("{other}"),
    };
    assert_eq!(at, payload.len(), "trailing bytes");
    (keys, token)
}

impl Harness {
    fn new() -> Harness {
        Harness {
            sm: StateMachine::new(config()).expect("config"),
            now: T0,
            corr: 0,
            last: None,
            keys: BTreeMap::new(),
            observed: BTreeSet::new(),
            last_version: String::new(),
            journal: Vec::new(),
            cursor: None,
        }
    }

    /// `key` stops existing (deleted or expired): a scan in progress no
    /// longer owes it.
    fn gone(&mut self, key: &[u8]) {
        if let Some(c) = &mut self.cursor {
            c.stable.remove(key);
        }
    }

    /// Whether the glob `pattern` (of [`PATTERNS`]) matches `key`.
    fn matches(pattern: &[u8], key: &[u8]) -> bool {
        let Ok(key) = std::str::from_utf8(key) else {
            return false;
        };
        let first = key.chars().next();
        match pattern {
            b"*" => true,
            b"?" => key.chars().count() == 1,
            b"[ab]" => key == "a" || key == "b",
            b"c*" => first == Some('c'),
            b"[!a]*" => first.is_some_and(|c| c != 'a'),
            b"b" => key == "b",
            _ => false, // not UTF-8
        }
    }

    fn scan(&mut self, pattern: usize) {
        let cursor = match self.cursor.take() {
            Some(c) => c,
            None => {
                let pattern = PATTERNS[pattern];
                let stable = self
                    .keys
                    .keys()
                    .filter(|k| self.live(k).is_some() && Self::matches(pattern, k))
                    .cloned()
                    .collect();
                Cursor {
                    pattern,
                    token: Vec::new(),
                    returned: Vec::new(),
                    stable,
                }
            }
        };
        let mut parts: Vec<&[u8]> = vec![b"SCAN", cursor.pattern];
        if !cursor.token.is_empty() {
            parts.push(&cursor.token);
        }
        let (payload, ts, notes) = self.send(&parts);
        assert!(notes.is_empty());
        assert_eq!(ts, None);
        let (keys, token) = parse_page(&payload);
        let mut cursor = cursor;
        for k in keys {
            assert!(self.live(&k).is_some(), "{k:?} is not live");
            assert!(Self::matches(cursor.pattern, &k), "{k:?}");
            assert!(cursor.returned.last().is_none_or(|l| *l < k), "order");
            cursor.returned.push(k);
        }
        match token {
            Some(t) => {
                assert!(t.starts_with(b"0;1;"));
                cursor.token = t;
                self.cursor = Some(cursor);
            }
            None => {
                let returned: BTreeSet<Vec<u8>> = cursor.returned.iter().cloned().collect();
                assert!(
                    cursor.stable.is_subset(&returned),
                    "missed {:?}",
                    cursor.stable.difference(&returned).collect::<Vec<_>>()
                );
            }
        }
    }

    fn live(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.keys
            .get(key)
            .filter(|(_, d)| d.is_none_or(|d| self.now < d))
            .map(|(v, _)| v)
    }

    fn send(&mut self, parts: &[&[u8]]) -> (Vec<u8>, Option<String>, Vec<Vec<u8>>) {
        self.corr += 1;
        let m = InboundMessage {
            topic: REQUEST_TOPIC.into(),
            payload: resp(parts),
            qos: 1,
            response_topic: Some("clients/c1/resp".into()),
            correlation_data: Some(self.corr.to_be_bytes().to_vec()),
            message_expiry_interval: Some(10),
            user_properties: vec![
                ("__ts".into(), format!("{}:0:c1", self.now)),
                ("__srcId".into(), "c1".into()),
            ],
            ..Default::default()
        };
        let out = self.sm.handle(&m, self.now);
        let mut notes = Vec::new();
        let mut reply = None;
        for (i, o) in out.iter().enumerate() {
            match o {
                Output::Publish(p) if p.kind == PublishKind::Notification => {
                    assert!(reply.is_none(), "notification after the reply");
                    notes.push(p.payload.to_vec());
                }
                Output::Publish(p) => {
                    assert_eq!(i, out.len() - 1, "reply must be last");
                    reply = Some(p.clone());
                }
                Output::Journal(r) => {
                    assert!(reply.is_none() && notes.is_empty(), "records come first");
                    self.journal.push(r.clone());
                }
                other => panic!("unexpected output {other:?}"),
            }
        }
        let reply = reply.expect("a reply");
        assert_eq!(reply.user_property("__stat"), Some("200"));
        let ts = reply.user_property("__ts").map(str::to_string);
        self.last = Some((m, reply.payload.to_vec()));
        (reply.payload.to_vec(), ts, notes)
    }

    /// A mutation's version must be newer than every version before it.
    fn newer(&mut self, ts: Option<String>) {
        let ts = ts.expect("a mutation has a version");
        assert!(
            ts > self.last_version,
            "{ts} not after {}",
            self.last_version
        );
        self.last_version = ts;
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Set {
                key,
                value,
                cond,
                px,
            } => {
                let (k, v) = (KEYS[key], VALUES[value]);
                let px_text = px.map(|p| p.to_string());
                let mut parts: Vec<&[u8]> = vec![b"SET", k, v];
                match cond {
                    1 => parts.push(b"NX"),
                    2 => parts.push(b"NEX"),
                    _ => {}
                }
                if let Some(p) = &px_text {
                    parts.push(b"PX");
                    parts.push(p.as_bytes());
                }
                let current = self.live(k).cloned();
                let applies = match (cond, &current) {
                    (_, None) | (0, _) => true,
                    (1, Some(_)) => false,
                    (_, Some(cur)) => cur.as_slice() == v,
                };
                let (payload, ts, notes) = self.send(&parts);
                if applies {
                    assert_eq!(payload, b"+OK\r\n");
                    self.newer(ts);
                    self.keys
                        .insert(k.to_vec(), (v.to_vec(), px.map(|p| self.now + p)));
                    let want = usize::from(self.observed.contains(k));
                    assert_eq!(notes.len(), want);
                    if want == 1 {
                        assert!(notes[0].starts_with(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n"));
                        assert!(notes[0].ends_with(&[v, b"\r\n"].concat()));
                    }
                } else {
                    assert_eq!(payload, b":-1\r\n");
                    assert!(ts.is_some_and(|t| t <= self.last_version));
                    assert!(notes.is_empty());
                }
            }
            Op::Get { key } => {
                let k = KEYS[key];
                let (payload, ts, notes) = self.send(&[b"GET", k]);
                assert!(notes.is_empty());
                match self.live(k) {
                    Some(v) => {
                        let mut want = format!("${}\r\n", v.len()).into_bytes();
                        want.extend_from_slice(v);
                        want.extend_from_slice(b"\r\n");
                        assert_eq!(payload, want);
                        assert!(ts.is_some());
                    }
                    None => {
                        assert_eq!(payload, b"$-1\r\n");
                        assert_eq!(ts, None);
                    }
                }
            }
            Op::Del { key } | Op::VDel { key, .. } => {
                let k = KEYS[key];
                let (payload, ts, notes) = match *op {
                    Op::VDel { value, .. } => self.send(&[b"VDEL", k, VALUES[value]]),
                    _ => self.send(&[b"DEL", k]),
                };
                let matches = match (*op, self.live(k)) {
                    (Op::VDel { value, .. }, Some(cur)) => cur.as_slice() == VALUES[value],
                    (_, cur) => cur.is_some(),
                };
                if self.live(k).is_none() {
                    assert_eq!(payload, b":0\r\n");
                    assert!(notes.is_empty());
                } else if matches {
                    assert_eq!(payload, b":1\r\n");
                    self.newer(ts);
                    self.keys.remove(k);
                    self.gone(k);
                    assert_eq!(notes.len(), usize::from(self.observed.contains(k)));
                } else {
                    assert_eq!(payload, b":-1\r\n");
                    assert!(notes.is_empty());
                }
            }
            Op::Observe { key, stop } => {
                let k = KEYS[key];
                let parts: Vec<&[u8]> = if stop {
                    vec![b"KEYNOTIFY", k, b"STOP"]
                } else {
                    vec![b"KEYNOTIFY", k]
                };
                let (payload, ts, _) = self.send(&parts);
                assert_eq!(ts, None);
                if stop {
                    let was = self.observed.remove(k);
                    assert_eq!(payload, if was { &b"+OK\r\n"[..] } else { b":0\r\n" });
                } else {
                    self.observed.insert(k.to_vec());
                    assert_eq!(payload, b"+OK\r\n");
                }
            }
            Op::Advance { ms } => {
                let target = self.now + ms;
                let mut deletes = 0;
                while let Some(at) = self.sm.next_deadline() {
                    if at > target {
                        break;
                    }
                    self.now = self.now.max(at);
                    for o in self.sm.timeout(self.now) {
                        match o {
                            Output::Journal(r) => self.journal.push(r),
                            Output::Publish(p) => {
                                assert_eq!(
                                    p.payload,
                                    &b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"[..]
                                );
                                let v = p.user_property("__ts").expect("ts").to_string();
                                assert!(v > self.last_version);
                                self.last_version = v;
                                deletes += 1;
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                }
                self.now = target;
                // Model: keys whose deadline passed are gone; observed ones notified.
                let gone: Vec<Vec<u8>> = self
                    .keys
                    .iter()
                    .filter(|(_, (_, d))| d.is_some_and(|d| d <= target))
                    .map(|(k, _)| k.clone())
                    .collect();
                let want = gone.iter().filter(|k| self.observed.contains(*k)).count();
                for k in gone {
                    self.keys.remove(&k);
                    self.gone(&k);
                }
                assert_eq!(deletes, want);
                assert_eq!(self.sm.key_count(), self.keys.len());
            }
            Op::Restore { part, feed } => {
                let snap = self.sm.snapshot();
                // In parts: the same bytes.
                let mut cursor = SnapshotCursor::new(SnapshotScope::Everything);
                let mut parts = Vec::new();
                loop {
                    let p = self.sm.snapshot_part(&mut cursor, part);
                    if p.is_empty() {
                        break;
                    }
                    parts.extend_from_slice(&p);
                }
                assert!(cursor.is_done());
                assert_eq!(parts, snap, "parts of {part} bytes");
                // Restored from pieces that cut items anywhere.
                let mut r = Restoring::new(config()).expect("config");
                for piece in snap.chunks(feed) {
                    r.feed(piece).expect("a piece");
                }
                self.sm = r.finish().expect("restore");
                assert_eq!(
                    self.sm.snapshot(),
                    snap,
                    "snapshot is stable across restore"
                );
            }
            Op::Scan { pattern } => self.scan(pattern),
            Op::Redeliver => {
                // The same request again: identical reply, no effect, no notification.
                let Some((m, payload)) = self.last.clone() else {
                    return;
                };
                let before = self.sm.snapshot();
                let out: Vec<Output> = self
                    .sm
                    .handle(&m, self.now)
                    .into_iter()
                    .filter(|o| match o {
                        // Expiry due at this time still happens first.
                        Output::Journal(r) => {
                            self.journal.push(r.clone());
                            false
                        }
                        _ => true,
                    })
                    .collect();
                let is_read = m.payload.starts_with(b"*2\r\n$3\r\nGET")
                    || m.payload.windows(4).take(16).any(|w| w == b"SCAN");
                if is_read {
                    return; // GET and SCAN are re-read, not cached: checked by Op::Get/Scan.
                }
                assert_eq!(out.len(), 1, "{out:?}");
                let Output::Publish(r) = &out[0] else {
                    panic!()
                };
                assert_eq!(r.payload, payload);
                assert_eq!(self.sm.snapshot(), before);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op);
        }
    }
}
