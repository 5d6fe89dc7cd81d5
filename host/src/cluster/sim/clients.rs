//! The simulation's clients: what each request waits for, and every answer
//! given, checked (at most one answer per request, none answered 503 ever
//! applied, `+OK` and read values as the model says).

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Result, bail};

use super::{HOT_KEYS, Op, Report, Rng, key, linear, parse_bulk, poison, request};
use crate::cluster::Applied;
use crate::{InboundMessage, Output};

/// What a request's client knows: the requests waiting for their answer,
/// and every answer given, checked.
#[derive(Default)]
pub(super) struct Clients {
    /// correlation -> (op, the replica it was sent through).
    pub(super) pending: BTreeMap<u64, (Op, u64)>,
    /// correlation -> (the replica, `__stat` and payload of its first answer).
    pub(super) answered: HashMap<u64, (u64, String, Vec<u8>)>,
    /// Answered 503 ("not applied"): must never be applied.
    pub(super) refused: HashSet<u64>,
    /// Applied from the log on some replica.
    pub(super) applied: HashSet<u64>,
    pub(super) acknowledged: Vec<u64>,
    pub(super) hot: Vec<Vec<linear::Event>>,
    /// Hot operations answered 503: never happened.
    pub(super) void: HashSet<(usize, usize)>,
    /// The version of the last notification of each key an observer got:
    /// by (the replica whose broker published it, 0 for an external
    /// broker's, key).
    pub(super) notified: HashMap<(u64, String), (u64, u64)>,
}

impl Clients {
    /// Replica `id` crashed: its clients' connections went with it, and
    /// what they waited for is lost to them (they would retry).
    pub(super) fn crashed(&mut self, id: u64) {
        self.pending.retain(|_, (_, origin)| *origin != id);
        self.answered.retain(|_, (origin, _, _)| *origin != id);
        // Its broker's sessions are gone: observers start over.
        self.notified.retain(|(by, _), _| *by != id);
    }

    /// A notification replica `origin` published: its observer (on that
    /// replica's broker with `everywhere`, else on an external broker
    /// every replica publishes to) gets a key's notifications in the order
    /// of its versions, checked where the design promises it.
    fn notification(
        &mut self,
        seed: u64,
        origin: u64,
        everywhere: bool,
        p: &crate::OutboundMessage,
        report: &mut Report,
    ) -> Result<()> {
        report.notifications += 1;
        let key = p.topic.rsplit('/').next().unwrap_or_default().to_string();
        let version = p
            .user_property("__ts")
            .and_then(|ts| {
                let mut f = ts.split(':');
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .ok_or_else(|| anyhow::anyhow!("seed {seed}: a notification without a version"))?;
        let by = if everywhere { origin } else { 0 };
        let last = self.notified.entry((by, key.clone())).or_default();
        if version <= *last {
            if everywhere {
                bail!(
                    "seed {seed}: replica {origin} notified key {key} of version {version:?} after {:?}",
                    *last
                );
            }
            report.notify_reordered += 1;
        }
        *last = version.max(*last);
        Ok(())
    }

    /// An answer (or a notification) replica `origin` published.
    pub(super) fn answer(
        &mut self,
        seed: u64,
        tick: u64,
        (origin, everywhere): (u64, bool),
        out: &Output,
        report: &mut Report,
    ) -> Result<()> {
        let Output::Publish(p) = out else {
            return Ok(());
        };
        if p.kind == crate::PublishKind::Notification {
            return self.notification(seed, origin, everywhere, p, report);
        }
        let Some(corr) = p
            .correlation_data
            .as_deref()
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
            .map(u64::from_be_bytes)
        else {
            return Ok(()); // a notification
        };
        let status = p.user_property("__stat").unwrap_or("").to_string();
        if let Some((_, first, payload)) = self.answered.get(&corr) {
            if *first != status || payload[..] != p.payload[..] {
                bail!(
                    "seed {seed}: request {corr} answered {first} {:?}, then {status} {:?}",
                    String::from_utf8_lossy(payload),
                    String::from_utf8_lossy(&p.payload)
                );
            }
            return Ok(());
        }
        let Some((op, _)) = self.pending.remove(&corr) else {
            return Ok(()); // its client is gone
        };
        self.answered
            .insert(corr, (origin, status.clone(), p.payload.to_vec()));
        match status.as_str() {
            "200" => self.settle(seed, tick, op, &p.payload, report),
            "503" => {
                if self.applied.contains(&corr) {
                    bail!(
                        "seed {seed}: request {corr} was applied, then answered 503 (not applied)"
                    );
                }
                self.refused.insert(corr);
                report.refused += 1;
                if let Op::Hot(k, i) = op {
                    self.void.insert((k, i));
                }
                Ok(())
            }
            "408" => {
                report.outcome_unknown += 1;
                Ok(())
            }
            "500" if matches!(op, Op::Poison) => {
                report.poisoned += 1;
                Ok(())
            }
            other => bail!("seed {seed}: request {corr} answered {other}"),
        }
    }

    /// Request replies of an entry replica `id` applied.
    pub(super) fn applied(&mut self, seed: u64, id: u64, a: &Applied) -> Result<()> {
        for o in &a.outputs {
            if let Output::Publish(p) = o
                && p.kind != crate::PublishKind::Notification
                && let Some(corr) = p
                    .correlation_data
                    .as_deref()
                    .and_then(|c| <[u8; 8]>::try_from(c).ok())
                    .map(u64::from_be_bytes)
            {
                if self.refused.contains(&corr) {
                    bail!(
                        "seed {seed}: request {corr} was answered 503 (not applied), then applied at index {} on replica {id}",
                        a.index
                    );
                }
                self.applied.insert(corr);
            }
        }
        Ok(())
    }

    /// A 200 answer to `op`.
    fn settle(
        &mut self,
        seed: u64,
        tick: u64,
        op: Op,
        payload: &[u8],
        report: &mut Report,
    ) -> Result<()> {
        match op {
            Op::Set(n) => {
                if payload != b"+OK\r\n" {
                    bail!(
                        "seed {seed}: SET of {} got {:?}",
                        key(n),
                        String::from_utf8_lossy(payload)
                    );
                }
                self.acknowledged.push(n);
            }
            Op::Get(n) => {
                let v = format!("value-{n}");
                let want = format!("${}\r\n{v}\r\n", v.len());
                if payload != want.as_bytes() {
                    bail!(
                        "seed {seed}: an acknowledged write was lost: GET {} got {:?}",
                        key(n),
                        String::from_utf8_lossy(payload)
                    );
                }
                report.reads += 1;
            }
            Op::Ttl => {}
            Op::Watch => {
                if payload != b"+OK\r\n" {
                    bail!(
                        "seed {seed}: KEYNOTIFY got {:?}",
                        String::from_utf8_lossy(payload)
                    );
                }
                report.watches += 1;
            }
            Op::Poison => bail!(
                "seed {seed}: a poison request answered {:?}",
                String::from_utf8_lossy(payload)
            ),
            Op::Hot(k, i) => {
                let e = &mut self.hot[k][i];
                e.ret = Some(tick);
                match &mut e.op {
                    linear::Op::Set(_) => {
                        if payload != b"+OK\r\n" {
                            bail!(
                                "seed {seed}: SET hot-{k} got {:?}",
                                String::from_utf8_lossy(payload)
                            );
                        }
                    }
                    linear::Op::Get(seen) => *seen = parse_bulk(payload),
                    linear::Op::Del(said) => {
                        *said = Some(match payload {
                            b":1\r\n" => true,
                            b":0\r\n" => false,
                            other => bail!(
                                "seed {seed}: DEL hot-{k} got {:?}",
                                String::from_utf8_lossy(other)
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// A client's next request (correlation `corr`), and what the client
/// expects of it.
pub(super) fn client_request(
    rng: &mut Rng,
    corr: u64,
    now_ms: u64,
    tick: u64,
    next_key: &mut u64,
    clients: &mut Clients,
) -> (Op, InboundMessage) {
    match rng.below(20) {
        12.. => {
            let k = rng.below(HOT_KEYS as u64) as usize;
            let name = format!("hot-{k}");
            let (op, parts): (linear::Op, Vec<Vec<u8>>) = match rng.below(5) {
                0 | 1 => {
                    *next_key += 1;
                    let v = format!("v{next_key}").into_bytes();
                    (
                        linear::Op::Set(v.clone()),
                        vec![b"SET".to_vec(), name.clone().into_bytes(), v],
                    )
                }
                2 | 3 => (
                    linear::Op::Get(None),
                    vec![b"GET".to_vec(), name.clone().into_bytes()],
                ),
                _ => (
                    linear::Op::Del(None),
                    vec![b"DEL".to_vec(), name.clone().into_bytes()],
                ),
            };
            clients.hot[k].push(linear::Event {
                op,
                call: tick,
                ret: None,
            });
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            (
                Op::Hot(k, clients.hot[k].len() - 1),
                request(&refs, corr, now_ms),
            )
        }
        0..=5 => {
            *next_key += 1;
            let n = *next_key;
            let (k, v) = (key(n), format!("value-{n}"));
            (
                Op::Set(n),
                request(&[b"SET", k.as_bytes(), v.as_bytes()], corr, now_ms),
            )
        }
        6..=10 if !clients.acknowledged.is_empty() => {
            let n = clients.acknowledged[rng.below(clients.acknowledged.len() as u64) as usize];
            (
                Op::Get(n),
                request(&[b"GET", key(n).as_bytes()], corr, now_ms),
            )
        }
        _ if rng.chance(150) => {
            let k = format!("hot-{}", rng.below(HOT_KEYS as u64));
            (
                Op::Watch,
                request(&[b"KEYNOTIFY", k.as_bytes()], corr, now_ms),
            )
        }
        _ if rng.chance(100) => (
            Op::Poison,
            request(&[b"SET", poison::POISON, b"v"], corr, now_ms),
        ),
        _ => (
            Op::Ttl,
            request(&[b"SET", b"ttl", b"v", b"PX", b"300"], corr, now_ms),
        ),
    }
}
