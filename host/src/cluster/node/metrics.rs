//! A replica's metrics (`--metrics`): its Raft state, its peers, and each
//! store's, as one process has them for its tenant.

use std::sync::Arc;

use super::Node;
use crate::Output;

impl Node {
    /// Keeps `metrics` (the replica's) and each store's (of `all`, as one
    /// process has them for its tenant; a tenant added while running
    /// too) up to date from now on.
    pub fn set_metrics(
        &mut self,
        metrics: crate::metrics::ReplicaMetrics,
        all: Arc<crate::metrics::Metrics>,
    ) {
        let stores: Vec<_> = self.tenants.iter().map(|t| all.tenant(t)).collect();
        for (t, m) in stores.iter().enumerate() {
            if self.removed(t) {
                m.stopped();
            }
        }
        self.added.metrics = Some(all);
        if let Some(j) = &mut self.journal {
            j.set_metrics(stores[0].journal());
        }
        for group in &mut self.groups {
            let store = &stores[(group.id / self.per) as usize];
            group.replica.set_log_metrics(store.journal());
            group.router.metrics = Some(metrics.clone());
            group.router.store_metrics = Some(store.clone());
        }
        self.outside.metrics = Some(metrics.agents.clone());
        self.metrics = Some(metrics);
        self.store_metrics = stores;
        self.refresh_store_metrics(true);
    }

    /// Each store's guests' sizes and counters (summed over its groups),
    /// if `force` or they are due.
    fn refresh_store_metrics(&mut self, force: bool) {
        let per = self.per as usize;
        for (t, m) in self.store_metrics.iter_mut().enumerate() {
            if !force && !m.refresh_due() {
                continue;
            }
            let mut sum = statestore_guest::Stats::default();
            let (mut calls, mut memory) = (0, 0);
            let range = (t * per) as u32..((t + 1) * per) as u32;
            for g in self.groups.iter_mut().filter(|g| range.contains(&g.id)) {
                let store = g.replica.store_mut();
                let Ok(s) = store.stats() else { return };
                sum.keys += s.keys;
                sum.bytes += s.bytes;
                sum.registrations += s.registrations;
                sum.dedup_entries += s.dedup_entries;
                sum.dedup_bytes += s.dedup_bytes;
                sum.dedup_hits += s.dedup_hits;
                sum.expired += s.expired;
                calls += store.calls();
                memory += store.memory_bytes();
            }
            m.refresh(&sum, calls, memory);
        }
    }

    /// Counts the replies and notifications of tenant `t`'s `outputs`,
    /// about to be published.
    pub(super) fn published(&self, t: usize, outputs: &[Output]) {
        if let Some(m) = self.store_metrics.get(t) {
            m.published(outputs);
        }
    }

    /// Notes, for `--metrics`, that `peer` was heard from now (the gauge
    /// moves once a second at most).
    pub(super) fn heard_from(&mut self, peer: u64) {
        let Some(m) = &self.metrics else { return };
        let now = crate::store::clock::now_ms() / 1000;
        if self.heard.get(&peer) != Some(&now) {
            self.heard.insert(peer, now);
            m.peer_heard
                .with_label_values(&[&peer.to_string()])
                .set(i64::try_from(now).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn refresh_metrics(&mut self) {
        self.refresh_store_metrics(false);
        let Some(m) = &self.metrics else { return };
        let Some(first) = self.groups.first() else {
            return;
        };
        let s = first.replica.status();
        m.term.set(i64::try_from(s.term).unwrap_or(i64::MAX));
        m.is_leader.set(i64::from(s.role == "leader"));
        m.has_leader.set(i64::from(s.leader != 0));
        m.leader.set(i64::try_from(s.leader).unwrap_or(0));
        m.commit_index
            .set(i64::try_from(s.commit).unwrap_or(i64::MAX));
        m.applied_index
            .set(i64::try_from(s.applied).unwrap_or(i64::MAX));
        for r in &self.replicas {
            let lag = s
                .matched
                .iter()
                .find(|(id, _)| *id == r.id)
                .map_or(0, |(_, matched)| s.last_index.saturating_sub(*matched));
            m.lag
                .with_label_values(&[&r.id.to_string()])
                .set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
    }
}
