//! One store in key partitions: `partitions = P` in the cluster file makes
//! the store P Raft groups on the same replicas, each with its own guest,
//! log, snapshots, dedup cache and KEYNOTIFY registrations. A key lives in
//! exactly one of them, so every per-key guarantee of one group (versions
//! that only grow, fencing, notifications in order, a retried request
//! answered from the dedup cache) holds per key as it does without
//! partitions. This module is the pure part: which partition a request
//! goes to, and the SCAN tokens that walk the partitions in order.
//!
//! ```text
//! partition(key) = SipHash-1-3 (keys 0, 0) of the key's bytes, mod P
//! ```
//!
//! A fixed, unkeyed hash: it must not change while a cluster lives (a
//! changed hash would lose every key), so it depends on nothing but the key
//! and P (changing P takes moving keys: see the book's cluster chapter).
//!
//! SCAN: a guest writes tokens `0;<n>;<rest>` (the real store's
//! `<chain>;<topology>;<last key>` shape; `0` is its only chain). Through
//! partitions the client sees `<p>;<n>;<rest>`, the chain being the
//! partition, and the last page of partition `p < P - 1` is given the
//! token `<p + 1>;0;` ("partition p + 1 from its start") instead of ending
//! the scan. So a scan walks partition 0, then 1, and so on, each page from
//! one partition; every key present for the whole scan is listed exactly
//! once (each partition's own guarantee, partitions being disjoint).
//! Requests that name no key (malformed ones, unknown commands) go to
//! partition 0, whose guest answers them as it would without partitions.

use statestore_guest::command::{Command, parse};
use statestore_guest::resp3;

/// The most partitions a store may have.
pub const MAX_PARTITIONS: u32 = 256;

/// The partition of `key` among `count` (at least 1).
pub fn partition_of(key: &[u8], count: u32) -> u32 {
    use std::hash::Hasher as _;
    if count <= 1 {
        return 0;
    }
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0, 0);
    h.write(key);
    (h.finish() % u64::from(count)) as u32
}

/// Where a request goes: its partition, and its payload if it had to be
/// rewritten for that partition's guest (a SCAN's token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The partition.
    pub partition: u32,
    /// The payload its guest gets instead of the client's, if different.
    pub payload: Option<Vec<u8>>,
}

/// A token that no guest accepts (for a token naming no partition here).
const NOT_A_TOKEN: &[u8] = b"not a token";

/// Where `payload` (a client's request) goes among `count` partitions.
pub fn route(payload: &[u8], count: u32) -> Routed {
    let keep = |partition| Routed {
        partition,
        payload: None,
    };
    if count <= 1 {
        return keep(0);
    }
    match parse(payload) {
        Ok(Command::Scan { pattern, token }) => {
            let Some(token) = token else {
                return keep(0);
            };
            match split_token(token) {
                Some((p, rest)) if p < count && rest == b"0;" => Routed {
                    partition: p,
                    payload: Some(resp3::request(&[b"SCAN", pattern])),
                },
                Some((p, rest)) if p < count => {
                    let inner = [b"0;".as_slice(), rest].concat();
                    Routed {
                        partition: p,
                        payload: Some(resp3::request(&[b"SCAN", pattern, &inner])),
                    }
                }
                // Its guest answers "the scan token is not valid".
                _ => Routed {
                    partition: 0,
                    payload: Some(resp3::request(&[b"SCAN", pattern, NOT_A_TOKEN])),
                },
            }
        }
        Ok(c) => keep(partition_of(c.key(), count)),
        Err(_) => keep(0),
    }
}

/// `<p>;<rest>` of a token: its partition (decimal, no sign, at most 3
/// digits) and what follows the first `;`.
fn split_token(token: &[u8]) -> Option<(u32, &[u8])> {
    let at = token.iter().position(|&b| b == b';')?;
    let (digits, rest) = (&token[..at], &token[at + 1..]);
    if !(1..=3).contains(&digits.len()) || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let p = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((p, rest))
}

/// The reply the client gets for `reply` (a reply of partition `p`'s guest
/// among `count`), if it differs: a SCAN page's token names its partition,
/// and a partition's last page (but the last partition's) continues with
/// the next partition. Other replies are unchanged (`None`).
pub fn reply(reply: &[u8], p: u32, count: u32) -> Option<Vec<u8>> {
    if count <= 1 {
        return None;
    }
    let page = ScanPage::read(reply)?;
    let token: Vec<u8> = match page.token {
        Some(inner) => {
            let rest = inner.strip_prefix(b"0;")?;
            [p.to_string().as_bytes(), b";", rest].concat()
        }
        None if p + 1 < count => format!("{};0;", p + 1).into_bytes(),
        None => return None,
    };
    let mut out = Vec::with_capacity(reply.len() + 16);
    out.extend_from_slice(b"*2\r\n");
    out.extend_from_slice(page.keys_bytes);
    resp3::push_bulk(&mut out, &token);
    Some(out)
}

/// A SCAN reply page, read: `*1\r\n*<k>\r\n<keys>` (the last page) or
/// `*2\r\n*<k>\r\n<keys><token>`.
#[derive(Debug)]
pub struct ScanPage<'a> {
    /// Its keys.
    pub keys: Vec<&'a [u8]>,
    /// `*<k>\r\n<keys>` as it stands in the reply.
    keys_bytes: &'a [u8],
    /// Its token (`None`: the last page).
    pub token: Option<Vec<u8>>,
}

impl<'a> ScanPage<'a> {
    /// `reply` as a page, if it is one (nothing after it).
    pub fn read(reply: &'a [u8]) -> Option<ScanPage<'a>> {
        let (more, page) = match reply.strip_prefix(b"*2\r\n") {
            Some(page) => (true, page),
            None => (false, reply.strip_prefix(b"*1\r\n")?),
        };
        let (keys, used) = if page.starts_with(b"*0\r\n") {
            (Vec::new(), 4)
        } else {
            match resp3::decode_request(page).ok()? {
                resp3::Decoded::Complete(items, used) => (items, used),
                resp3::Decoded::Partial => return None,
            }
        };
        let (keys_bytes, rest) = page.split_at(used);
        let token = if more {
            // The token bulk string, read as a request of one element.
            match resp3::decode_request(&[b"*1\r\n".as_slice(), rest].concat()).ok()? {
                resp3::Decoded::Complete(items, n) if n == rest.len() + 4 => {
                    Some(items[0].to_vec())
                }
                _ => return None,
            }
        } else if rest.is_empty() {
            None
        } else {
            return None;
        };
        Some(ScanPage {
            keys,
            keys_bytes,
            token,
        })
    }
}

/// `messages` (a client's requests, as they arrived) by partition: the
/// requests for partition `p` at `[p]`, in arrival order, rewritten for
/// its guest where [`route`] says so.
pub fn split(messages: Vec<crate::InboundMessage>, count: u32) -> Vec<Vec<crate::InboundMessage>> {
    let mut by_partition = vec![Vec::new(); count.max(1) as usize];
    if count <= 1 {
        by_partition[0] = messages;
        return by_partition;
    }
    for mut m in messages {
        let routed = route(&m.payload, count);
        if let Some(payload) = routed.payload {
            m.payload = payload;
        }
        by_partition[routed.partition as usize].push(m);
    }
    by_partition
}

/// Rewrites, in place, the replies among `outputs` (partition `p`'s
/// outputs, to publish) that the client sees otherwise: see [`reply`].
pub fn replies(outputs: &mut [crate::Output], p: u32, count: u32) {
    if count <= 1 {
        return;
    }
    for out in outputs {
        if let crate::Output::Publish(m) = out
            && m.kind == crate::PublishKind::Response
            && let Some(page) = reply(&m.payload, p, count)
        {
            m.payload = page.into();
        }
    }
}

/// Where partition `p`'s leadership belongs among `voters`: the
/// `p mod n`-th of them by id, so that the partitions' leaders are spread
/// evenly over the replicas.
pub fn place(p: u32, voters: &[u64]) -> Option<u64> {
    let mut sorted = voters.to_vec();
    sorted.sort_unstable();
    sorted.get(p as usize % sorted.len().max(1)).copied()
}

/// Whether the leader `status` of partition `p` (of a store in several)
/// hands its leadership over now, and to whom: to the partition's
/// [`place`], once that replica is `up` and has every entry (a hand-over to
/// one that lags would stall the group's proposals until it caught up or
/// the hand-over timed out).
pub fn hand_over(
    p: u32,
    voters: &[u64],
    status: &super::Status,
    up: impl Fn(u64) -> bool,
) -> Option<u64> {
    hand_over_to(place(p, voters), status, up)
}

/// [`hand_over`] to `to`, the group's place.
pub fn hand_over_to(
    to: Option<u64>,
    status: &super::Status,
    up: impl Fn(u64) -> bool,
) -> Option<u64> {
    let to = to?;
    let caught_up = status
        .matched
        .iter()
        .any(|&(id, matched)| id == to && matched >= status.last_index);
    (status.role == "leader" && to != status.id && up(to) && caught_up).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&[u8]]) -> Vec<u8> {
        resp3::request(parts)
    }

    /// The hash is fixed: these values hold on every machine and version
    /// (a change would move keys between partitions of a running cluster).
    #[test]
    fn a_keys_partition_is_fixed() {
        let got: Vec<u32> = [b"a".as_slice(), b"b", b"key-1", b"key-2", b""]
            .iter()
            .map(|k| partition_of(k, 16))
            .collect();
        assert_eq!(got, vec![3, 14, 14, 4, 12]);
        assert_eq!(partition_of(b"anything", 1), 0);
    }

    #[test]
    fn keys_spread_over_the_partitions() {
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            counts[partition_of(format!("key-{i}").as_bytes(), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn requests_go_to_their_keys_partition() {
        for (request, key) in [
            (scan(&[b"GET", b"key-1"]), b"key-1".as_slice()),
            (scan(&[b"SET", b"key-2", b"v", b"PX", b"100"]), b"key-2"),
            (scan(&[b"DEL", b"a"]), b"a"),
            (scan(&[b"VDEL", b"b", b"v"]), b"b"),
            (scan(&[b"KEYNOTIFY", b"key-1", b"STOP"]), b"key-1"),
        ] {
            assert_eq!(
                route(&request, 16),
                Routed {
                    partition: partition_of(key, 16),
                    payload: None
                }
            );
        }
        // Nothing to route by: partition 0 answers, as one store would.
        for junk in [
            b"".as_slice(),
            b"*1\r\n$4\r\nPING\r\n",
            b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n",
        ] {
            assert_eq!(route(junk, 16).partition, 0);
            assert_eq!(route(junk, 16).payload, None);
        }
        // One partition: nothing is looked at.
        assert_eq!(route(&scan(&[b"GET", b"key-2"]), 1).partition, 0);
    }

    #[test]
    fn a_scan_walks_the_partitions_in_order() {
        let first = scan(&[b"SCAN", b"*"]);
        assert_eq!(
            route(&first, 4),
            Routed {
                partition: 0,
                payload: None
            }
        );
        // Within a partition: its guest's token, with the chain put back.
        assert_eq!(
            route(&scan(&[b"SCAN", b"*", b"2;1;k7"]), 4),
            Routed {
                partition: 2,
                payload: Some(scan(&[b"SCAN", b"*", b"0;1;k7"]))
            }
        );
        // A sealed token keeps its seal.
        assert_eq!(
            route(&scan(&[b"SCAN", b"*", b"3;2;00ff"]), 4).payload,
            Some(scan(&[b"SCAN", b"*", b"0;2;00ff"]))
        );
        // The start of the next partition: a first page there.
        assert_eq!(
            route(&scan(&[b"SCAN", b"k*", b"1;0;"]), 4),
            Routed {
                partition: 1,
                payload: Some(scan(&[b"SCAN", b"k*"]))
            }
        );
        // Tokens naming no partition here are refused by partition 0's guest.
        for bad in [b"4;1;k".as_slice(), b"x;1;k", b"1000;1;k", b"", b"12"] {
            assert_eq!(
                route(&scan(&[b"SCAN", b"*", bad]), 4),
                Routed {
                    partition: 0,
                    payload: Some(scan(&[b"SCAN", b"*", NOT_A_TOKEN]))
                },
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn scan_pages_name_their_partition_and_lead_to_the_next() {
        // A page with more to come in partition 2.
        let page = b"*2\r\n*2\r\n$2\r\nk1\r\n$2\r\nk2\r\n$6\r\n0;1;k2\r\n";
        assert_eq!(
            reply(page, 2, 4).as_deref(),
            Some(b"*2\r\n*2\r\n$2\r\nk1\r\n$2\r\nk2\r\n$6\r\n2;1;k2\r\n".as_slice())
        );
        // Its last page leads to partition 3 ...
        let last = b"*1\r\n*1\r\n$2\r\nk3\r\n";
        assert_eq!(
            reply(last, 2, 4).as_deref(),
            Some(b"*2\r\n*1\r\n$2\r\nk3\r\n$4\r\n3;0;\r\n".as_slice())
        );
        // ... even when empty ...
        assert_eq!(
            reply(b"*1\r\n*0\r\n", 0, 4).as_deref(),
            Some(b"*2\r\n*0\r\n$4\r\n1;0;\r\n".as_slice())
        );
        // ... and the last partition's last page ends the scan.
        assert_eq!(reply(last, 3, 4), None);
        // Other replies, and one partition, stay as they are.
        for other in [
            b"+OK\r\n".as_slice(),
            b"$1\r\nv\r\n",
            b":1\r\n",
            b"-ERR the scan token is not valid\r\n",
            b"*2\r\n",
            b"*2\r\n*1\r\n$2\r\nk1\r\n",
        ] {
            assert_eq!(
                reply(other, 1, 4),
                None,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        assert_eq!(reply(page, 0, 1), None);
    }

    /// A client's scan through the rewriting sees every key of every
    /// partition once, in partition order, with tokens it hands back
    /// byte for byte.
    #[test]
    fn a_whole_scan_through_four_partitions() {
        // Each partition's "guest": its keys, two per page.
        let keys: Vec<Vec<&[u8]>> = vec![
            vec![b"a0", b"b0", b"c0"],
            vec![],
            vec![b"a2"],
            vec![b"a3", b"b3"],
        ];
        let guest = |p: usize, request: &[u8]| -> Vec<u8> {
            let Ok(Command::Scan { token, .. }) = parse(request) else {
                panic!("not a scan");
            };
            let after = token.map(|t| t.strip_prefix(b"0;1;").expect("a guest token"));
            let rest: Vec<&[u8]> = keys[p]
                .iter()
                .copied()
                .filter(|k| after.is_none_or(|a| *k > a))
                .collect();
            let page = &rest[..rest.len().min(2)];
            let mut out = if rest.len() > 2 {
                b"*2\r\n".to_vec()
            } else {
                b"*1\r\n".to_vec()
            };
            out.extend_from_slice(format!("*{}\r\n", page.len()).as_bytes());
            for k in page {
                resp3::push_bulk(&mut out, k);
            }
            if rest.len() > 2 {
                resp3::push_bulk(&mut out, &[b"0;1;".as_slice(), page[1]].concat());
            }
            out
        };
        let mut request = scan(&[b"SCAN", b"*"]);
        let mut seen = Vec::new();
        for _ in 0..20 {
            let routed = route(&request, 4);
            let answer = guest(
                routed.partition as usize,
                routed.payload.as_deref().unwrap_or(&request),
            );
            let answer = reply(&answer, routed.partition, 4).unwrap_or(answer);
            let body = &answer[4..];
            let Ok(resp3::Decoded::Complete(items, used)) = resp3::decode_request(body) else {
                assert!(body.starts_with(b"*0\r\n"));
                let token = &body[4..];
                request = next(token);
                continue;
            };
            seen.extend(items.iter().map(|k| k.to_vec()));
            if answer.starts_with(b"*1\r\n") {
                break;
            }
            request = next(&body[used..]);
        }
        fn next(token_bulk: &[u8]) -> Vec<u8> {
            let at = token_bulk.iter().position(|&b| b == b'\n').expect("a bulk");
            let token = &token_bulk[at + 1..token_bulk.len() - 2];
            resp3::request(&[b"SCAN", b"*", token])
        }
        let want: Vec<Vec<u8>> = keys.iter().flatten().map(|k| k.to_vec()).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn leaderships_go_to_their_place_once_it_has_every_entry() {
        assert_eq!(place(0, &[3, 1, 2]), Some(1));
        assert_eq!(place(4, &[3, 1, 2]), Some(2));
        assert_eq!(place(2, &[]), None);
        let leader = |matched: Vec<(u64, u64)>| super::super::Status {
            id: 1,
            role: "leader".into(),
            last_index: 10,
            matched,
            ..super::super::Status::default()
        };
        let all_up = |_| true;
        // Partition 1's place is replica 2: up and caught up, it takes it.
        assert_eq!(
            hand_over(
                1,
                &[1, 2, 3],
                &leader(vec![(1, 10), (2, 10), (3, 9)]),
                all_up
            ),
            Some(2)
        );
        // Not while it lags, nor while it is down.
        assert_eq!(
            hand_over(1, &[1, 2, 3], &leader(vec![(1, 10), (2, 9)]), all_up),
            None
        );
        assert_eq!(
            hand_over(1, &[1, 2, 3], &leader(vec![(2, 10)]), |id| id != 2),
            None
        );
        // Already in place, or not the leader: nothing.
        assert_eq!(
            hand_over(0, &[1, 2, 3], &leader(vec![(1, 10)]), all_up),
            None
        );
        let follower = super::super::Status {
            role: "follower".into(),
            ..leader(vec![(2, 10)])
        };
        assert_eq!(hand_over(1, &[1, 2, 3], &follower, all_up), None);
    }
}
