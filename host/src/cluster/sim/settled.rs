//! The end of a run: the replicas settled, their states compared, every
//! acknowledged write read back, and the store scanned through its
//! partitions.

use anyhow::{Result, bail};

use super::poison::Poisonable;
use super::{LINEAR_BUDGET, Sim, T0, TICK_MS, key, reply_to, request};
use crate::cluster::linear;
use crate::{Backend, InboundMessage};

impl Sim<'_> {
    /// Settled: every replica up, the same index applied, the same state,
    /// and every acknowledged key in it with its value.
    pub(super) fn check_settled(&mut self, total: u64) -> Result<()> {
        let seed = self.seed;
        let (removing, joining) = (self.removing, self.joining);
        let partitions = self.o.partitions;
        let nodes = &mut self.nodes;
        nodes.retain(|n| !n.removed);
        for g in 0..partitions as usize {
            let applied: Vec<u64> = nodes
                .iter()
                .map(|n| n.up.as_ref().map_or(0, |up| up[g].replica.applied()))
                .collect();
            if applied.iter().any(|a| *a != applied[0]) {
                let states: Vec<String> = nodes
                    .iter()
                    .map(|n| match &n.up {
                        Some(up) => {
                            let r = &up[g].replica;
                            format!("{:?} voters {:?}", r.status(), r.voters())
                        }
                        None => format!(
                            "down (removed {}, damaged {}, rejoining {}, until {})",
                            n.removed, n.damaged, n.rejoining, n.down_until
                        ),
                    })
                    .collect();
                bail!(
                    "seed {seed}: after settling, the replicas applied {applied:?} of partition {g}; removing {removing:?}, joining {joining:?}:\n{}",
                    states.join("\n")
                );
            }
            let mut snapshots = Vec::new();
            for n in nodes.iter_mut() {
                let up = n.up.as_mut().expect("up after settling");
                snapshots.push(up[g].replica.store_mut().snapshot()?);
            }
            if snapshots.iter().any(|s| *s != snapshots[0]) {
                bail!(
                    "seed {seed}: replicas at index {} of partition {g} hold different states",
                    applied[0]
                );
            }
        }
        let up = nodes[0].up.as_mut().expect("up");
        let mut guests: Vec<Poisonable> = up
            .iter_mut()
            .map(|g| g.replica.store_mut().clone())
            .collect();
        let at = T0 + total * TICK_MS;
        for &n in &self.clients.acknowledged {
            let got = ask(&mut guests, &[b"GET", key(n).as_bytes()], u64::MAX - n, at)?;
            let v = format!("value-{n}");
            let want = format!("${}\r\n{v}\r\n", v.len());
            if got != want.as_bytes() {
                bail!(
                    "seed {seed}: acknowledged {} is not in the final state",
                    key(n)
                );
            }
        }
        // A SCAN of every key walks the partitions and lists each key of
        // the settled state exactly once: what each partition lists alone.
        let listed =
            scan(&mut guests, at, u64::MAX / 2).map_err(|e| e.context(format!("seed {seed}")))?;
        let mut want = Vec::new();
        for g in 0..guests.len() {
            let mut keys = scan(
                &mut guests[g..=g],
                at,
                u64::MAX / 2 + ((g as u64 + 1) << 32),
            )?;
            if keys
                .iter()
                .any(|k| crate::cluster::partition::partition_of(k, partitions) != g as u32)
            {
                bail!("seed {seed}: partition {g} holds a key of another partition");
            }
            want.append(&mut keys);
        }
        let mut sorted = listed.clone();
        sorted.sort();
        want.sort();
        if sorted != want || sorted.windows(2).any(|w| w[0] == w[1]) {
            bail!(
                "seed {seed}: a SCAN through {partitions} partition(s) listed {} keys, the partitions hold {}",
                listed.len(),
                want.len()
            );
        }
        self.report.scanned += listed.len();
        Ok(())
    }
}

/// The reply of a store of `guests.len()` partitions (guest `p` holding
/// partition `p`) to the request `parts`, routed and rewritten as a
/// server does.
fn ask(guests: &mut [Poisonable], parts: &[&[u8]], corr: u64, at: u64) -> Result<Vec<u8>> {
    let partitions = guests.len() as u32;
    let m = request(parts, corr, at);
    let routed = crate::cluster::partition::route(&m.payload, partitions);
    let g = routed.partition;
    let m = InboundMessage {
        payload: routed.payload.unwrap_or(m.payload),
        ..m
    };
    let mut out = guests[g as usize].handle_messages(&[m], at)?;
    crate::cluster::partition::replies(&mut out, g, partitions);
    Ok(reply_to(&out, corr).unwrap_or_default().to_vec())
}

/// Every key a SCAN of `*` lists, page after page, through the partitions
/// (the pages' correlation data counted from `corr`).
fn scan(guests: &mut [Poisonable], at: u64, corr: u64) -> Result<Vec<Vec<u8>>> {
    let mut listed = Vec::new();
    let mut token: Option<Vec<u8>> = None;
    for page in 0..100_000u64 {
        let corr = corr + page;
        let reply = match &token {
            None => ask(guests, &[b"SCAN", b"*"], corr, at)?,
            Some(t) => ask(guests, &[b"SCAN", b"*", t], corr, at)?,
        };
        let page = crate::cluster::partition::ScanPage::read(&reply)
            .ok_or_else(|| anyhow::anyhow!("a SCAN page {:?}", String::from_utf8_lossy(&reply)))?;
        listed.extend(page.keys.iter().map(|k| k.to_vec()));
        match page.token {
            Some(t) => token = Some(t),
            None => return Ok(listed),
        }
    }
    bail!("a SCAN that does not end")
}

impl Sim<'_> {
    /// Every hot key's history is linearizable.
    pub(super) fn check_histories(&mut self) -> Result<()> {
        let seed = self.seed;
        let clients = &mut self.clients;
        for (k, history) in clients.hot.iter_mut().enumerate() {
            let mut i = 0;
            history.retain(|e| {
                let keep = !clients.void.contains(&(k, i))
                    // A GET never answered changed nothing and said nothing.
                    && (e.ret.is_some() || !matches!(e.op, linear::Op::Get(_)));
                i += 1;
                keep
            });
        }
        for (k, history) in clients.hot.iter().enumerate() {
            self.report.hot_ops += history.len();
            match linear::check(history, LINEAR_BUDGET) {
                linear::Verdict::Linearizable => {}
                linear::Verdict::Unknown => self.report.unknown += 1,
                linear::Verdict::Not => bail!(
                    "seed {seed}: the history of hot-{k} is not linearizable ({} operations):\n{history:?}",
                    history.len()
                ),
            }
        }
        Ok(())
    }
}
