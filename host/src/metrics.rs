//! Prometheus metrics and health endpoints (`serve --metrics ADDR`).
//!
//! ```text
//!   GET /metrics   Prometheus text exposition (every family below)
//!   GET /healthz   200 "ok" while every tenant serves; 503 naming a stopped one
//!   GET /readyz    200 once recovery is done and the listener is up, else 503
//! ```
//!
//! The families follow Prometheus's naming conventions (`_total` counters,
//! base units: seconds and bytes), each with a `tenant` label (`default`
//! without `--config`). Counters and histograms move as requests are
//! handled; the gauges of what a store holds (keys, bytes, registrations,
//! dedup cache, guest memory) and the guest's own counters (dedup hits,
//! expirations) are read from the guest (`stats`) at most every
//! [`REFRESH`], and after every input when that much time has passed.
//!
//! The exporter is the `prometheus` crate; the HTTP server is `axum`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::{OutboundMessage, Output, PublishKind, Stats};

/// How stale the gauges read from a guest may get while it is busy.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The verbs counted by name; anything else is `other`.
const VERBS: [&str; 7] = ["GET", "SET", "DEL", "VDEL", "KEYNOTIFY", "SCAN", "other"];

/// Request latency buckets, seconds: 50 µs to 2.5 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// Disk latency buckets, seconds: 100 µs to 10 s.
const DISK_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// Every metric family of a server, in one registry.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    replies: IntCounterVec,
    latency: HistogramVec,
    notifications: IntCounterVec,
    ignored: IntCounterVec,
    keys: IntGaugeVec,
    key_bytes: IntGaugeVec,
    registrations: IntGaugeVec,
    dedup_entries: IntGaugeVec,
    dedup_bytes: IntGaugeVec,
    dedup_hits: IntCounterVec,
    expirations: IntCounterVec,
    guest_calls: IntCounterVec,
    guest_restarts: IntCounterVec,
    guest_memory: IntGaugeVec,
    journal_records: IntCounterVec,
    journal_bytes: IntCounterVec,
    fsync: HistogramVec,
    snapshot: HistogramVec,
    tenant_up: IntGaugeVec,
    connections: IntGauge,
    queue_dropped: IntCounter,
    broker_refused: IntCounterVec,
    ready: AtomicBool,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> Result<HistogramVec> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )?;
    r.register(Box::new(h.clone()))?;
    Ok(h)
}

impl Metrics {
    /// Every family, registered and empty.
    pub fn new() -> Result<Arc<Metrics>> {
        let r = Registry::new();
        let t = &["tenant"];
        let (connections, queue_dropped, broker_refused) = broker_families(&r)?;
        process_families(&r)?;
        Ok(Arc::new(Metrics {
            requests: counter(
                &r,
                "statestore_requests_total",
                "State store requests received, by verb",
                &["tenant", "verb"],
            )?,
            ignored: counter(
                &r,
                "statestore_requests_ignored_total",
                "Requests not answered, each logged: a response topic reserved for the store, or (with no broker naming the requester) one that is not the requester's",
                t,
            )?,
            replies: counter(
                &r,
                "statestore_replies_total",
                "Replies sent, by __stat and outcome (ok, or error for a -ERR payload)",
                &["tenant", "status", "outcome"],
            )?,
            latency: histogram(
                &r,
                "statestore_request_duration_seconds",
                "From the store taking a request to its reply being handed to the broker (the guest call and the batch's journal write included)",
                LATENCY_BUCKETS,
                t,
            )?,
            notifications: counter(
                &r,
                "statestore_notifications_total",
                "KEYNOTIFY notifications sent",
                t,
            )?,
            keys: gauge(&r, "statestore_keys", "Keys held", t)?,
            key_bytes: gauge(
                &r,
                "statestore_key_value_bytes",
                "Bytes of the keys and values held",
                t,
            )?,
            registrations: gauge(
                &r,
                "statestore_keynotify_registrations",
                "KEYNOTIFY registrations",
                t,
            )?,
            dedup_entries: gauge(
                &r,
                "statestore_dedup_entries",
                "Replies kept for retried requests",
                t,
            )?,
            dedup_bytes: gauge(
                &r,
                "statestore_dedup_bytes",
                "Bytes of the replies kept for retried requests",
                t,
            )?,
            dedup_hits: counter(
                &r,
                "statestore_dedup_hits_total",
                "Retried requests answered from the dedup cache",
                t,
            )?,
            expirations: counter(
                &r,
                "statestore_expirations_total",
                "Keys removed because they expired",
                t,
            )?,
            guest_calls: counter(
                &r,
                "statestore_guest_calls_total",
                "Calls into the WebAssembly guest",
                t,
            )?,
            guest_restarts: counter(
                &r,
                "statestore_guest_restarts_total",
                "Guest instances replaced after a failure, by cause (trap, deadline, memory, other)",
                &["tenant", "cause"],
            )?,
            guest_memory: gauge(
                &r,
                "statestore_guest_memory_bytes",
                "Linear memory of the guest instance",
                t,
            )?,
            journal_records: counter(
                &r,
                "statestore_journal_records_total",
                "Records appended to the journal",
                t,
            )?,
            journal_bytes: counter(
                &r,
                "statestore_journal_bytes_total",
                "Bytes appended to the journal (framing included)",
                t,
            )?,
            fsync: histogram(
                &r,
                "statestore_journal_fsync_duration_seconds",
                "fsync of the journal (under --fsync always: one per batch)",
                DISK_BUCKETS,
                t,
            )?,
            snapshot: histogram(
                &r,
                "statestore_snapshot_duration_seconds",
                "A snapshot, from taking it in the guest to its file being written",
                DISK_BUCKETS,
                t,
            )?,
            tenant_up: gauge(
                &r,
                "statestore_tenant_up",
                "1 while the tenant serves, 0 once it has stopped (its clients get 503)",
                t,
            )?,
            connections,
            queue_dropped,
            broker_refused,
            ready: AtomicBool::new(false),
            registry: r,
        }))
    }

    /// The handles of one tenant's metrics.
    pub fn tenant(&self, name: &str) -> TenantMetrics {
        let one = |v: &IntCounterVec| v.with_label_values(&[name]);
        let g = |v: &IntGaugeVec| v.with_label_values(&[name]);
        let requests = VERBS.map(|verb| self.requests.with_label_values(&[name, verb]));
        self.tenant_up.with_label_values(&[name]).set(1);
        TenantMetrics {
            name: name.to_string(),
            requests,
            replies: self.replies.clone(),
            ok: self.replies.with_label_values(&[name, "200", "ok"]),
            error: self.replies.with_label_values(&[name, "200", "error"]),
            latency: self.latency.with_label_values(&[name]),
            notifications: one(&self.notifications),
            ignored: one(&self.ignored),
            keys: g(&self.keys),
            key_bytes: g(&self.key_bytes),
            registrations: g(&self.registrations),
            dedup_entries: g(&self.dedup_entries),
            dedup_bytes: g(&self.dedup_bytes),
            dedup_hits: one(&self.dedup_hits),
            expirations: one(&self.expirations),
            guest_calls: one(&self.guest_calls),
            guest_restarts: self.guest_restarts.clone(),
            guest_memory: g(&self.guest_memory),
            up: g(&self.tenant_up),
            journal: JournalMetrics {
                records: one(&self.journal_records),
                bytes: one(&self.journal_bytes),
                fsync: self.fsync.with_label_values(&[name]),
                snapshot: self.snapshot.with_label_values(&[name]),
            },
            seen: Seen::default(),
            refreshed: None,
        }
    }

    /// The metrics of a replica of a cluster (registered on first call).
    pub fn replica(&self) -> Result<ReplicaMetrics> {
        let r = &self.registry;
        let g = |name: &str, help: &str| -> Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            r.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let leader_changes = IntCounter::new(
            "statestore_raft_leader_changes_total",
            "Times this replica saw the leader change (to none or to another)",
        )?;
        r.register(Box::new(leader_changes.clone()))?;
        let commit = Histogram::with_opts(
            HistogramOpts::new(
                "statestore_raft_commit_duration_seconds",
                "From this replica proposing or forwarding a request to applying it (a majority had it durable)",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        r.register(Box::new(commit.clone()))?;
        let reads = IntCounterVec::new(
            Opts::new(
                "statestore_raft_reads_total",
                "Reads (GET, SCAN) this replica received, by how they were served: `index` (a read index, no log entry) or `log` (as a log entry: the read index was off, late, or the client had a write in flight)",
            ),
            &["path"],
        )?;
        r.register(Box::new(reads.clone()))?;
        let peer_heard = IntGaugeVec::new(
            Opts::new(
                "statestore_raft_peer_last_heard_timestamp_seconds",
                "When this replica last had a Raft message from each peer (Unix time, whole \
                 seconds): a leader hears from every member it reaches, a follower from the \
                 leader alone",
            ),
            &["replica"],
        )?;
        r.register(Box::new(peer_heard.clone()))?;
        let agents = IntCounterVec::new(
            Opts::new(
                "statestore_cluster_agent_total",
                "With groups placed on some replicas (`copies`): requests this replica's clients sent to groups it does not hold (`sent`), sent again to another holder (`resent`), and served for other replicas' clients (`served`); answers and notifications shipped to other replicas (`shipped`) and received for its clients (`received`)",
            ),
            &["what"],
        )?;
        r.register(Box::new(agents.clone()))?;
        Ok(ReplicaMetrics {
            reads,
            peer_heard,
            agents,
            has_leader: g(
                "statestore_raft_has_leader",
                "1 while this replica knows a leader (itself or another)",
            )?,
            leader: g(
                "statestore_raft_leader",
                "The id of the leader this replica knows, 0 for none",
            )?,
            term: g("statestore_raft_term", "This replica's Raft term")?,
            is_leader: g("statestore_raft_is_leader", "1 while this replica leads")?,
            commit_index: g(
                "statestore_raft_commit_index",
                "This replica's commit index",
            )?,
            applied_index: g(
                "statestore_raft_applied_index",
                "Index of the last entry this replica applied to its guest",
            )?,
            lag: gauge(
                r,
                "statestore_raft_replica_lag_entries",
                "As leader: entries each replica's log is behind this one's",
                &["replica"],
            )?,
            leader_changes,
            commit,
        })
    }

    /// The embedded broker's connection count.
    pub fn connections(&self) -> &IntGauge {
        &self.connections
    }

    /// Messages dropped for sessions at their byte limit.
    pub fn queue_dropped(&self) -> &IntCounter {
        &self.queue_dropped
    }

    /// What the embedded broker refused, by reason.
    pub fn broker_refused(&self) -> &IntCounterVec {
        &self.broker_refused
    }

    /// Exports the embedded broker's message counters: `read` gives the
    /// PUBLISH packets received and delivered so far, when scraped.
    pub fn broker_counters(
        &self,
        read: impl Fn() -> (u64, u64) + Send + Sync + 'static,
    ) -> Result<()> {
        self.registry
            .register(Box::new(BrokerCollector::new(Box::new(read))?))
            .context("registering the broker's counters")
    }

    /// Recovery is done and the listener is up.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Tenants that have stopped.
    fn stopped(&self) -> Vec<String> {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == "statestore_tenant_up")
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| m.get_gauge().value() == 0.0)
            .flat_map(|m| m.get_label().iter().map(|l| l.value().to_string()))
            .collect()
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the
    /// process ends; returns the address it listens on.
    pub async fn serve(self: &Arc<Self>, addr: SocketAddr) -> Result<SocketAddr> {
        use axum::http::StatusCode;
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        let local = listener.local_addr()?;
        let (m, h, r) = (self.clone(), self.clone(), self.clone());
        let app = axum::Router::new()
            .route(
                "/metrics",
                get(move || {
                    let m = m.clone();
                    async move {
                        (
                            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                            m.render(),
                        )
                    }
                }),
            )
            .route(
                "/healthz",
                get(move || {
                    let h = h.clone();
                    async move {
                        match h.stopped() {
                            s if s.is_empty() => (StatusCode::OK, "ok\n".to_string()),
                            s => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                format!("stopped tenants: {}\n", s.join(", ")),
                            ),
                        }
                    }
                }),
            )
            .route(
                "/readyz",
                get(move || {
                    let r = r.clone();
                    async move {
                        if r.ready.load(Ordering::Acquire) {
                            (StatusCode::OK, "ready\n")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                        }
                    }
                }),
            );
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the metrics server stopped");
            }
        });
        Ok(local)
    }
}

/// The guest's counters as last read, to add what they grew by (a
/// restarted guest counts from 0 again).
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    dedup_hits: u64,
    expired: u64,
    calls: u64,
}

/// One tenant's metrics, resolved once (a clone counts into the same
/// series).
#[derive(Clone)]
pub struct TenantMetrics {
    name: String,
    requests: [IntCounter; VERBS.len()],
    replies: IntCounterVec,
    ok: IntCounter,
    error: IntCounter,
    latency: Histogram,
    notifications: IntCounter,
    ignored: IntCounter,
    keys: IntGauge,
    key_bytes: IntGauge,
    registrations: IntGauge,
    dedup_entries: IntGauge,
    dedup_bytes: IntGauge,
    dedup_hits: IntCounter,
    expirations: IntCounter,
    guest_calls: IntCounter,
    guest_restarts: IntCounterVec,
    guest_memory: IntGauge,
    up: IntGauge,
    journal: JournalMetrics,
    seen: Seen,
    refreshed: Option<Instant>,
}

impl std::fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMetrics")
            .field("tenant", &self.name)
            .finish_non_exhaustive()
    }
}

/// The verb of a RESP3 request (`*<n>\r\n$<len>\r\n<verb>\r\n...`),
/// case-insensitively one of [`VERBS`], else `other`.
fn verb_index(payload: &[u8]) -> usize {
    let other = VERBS.len() - 1;
    let Some(rest) = payload.strip_prefix(b"*") else {
        return other;
    };
    let Some(at) = rest.iter().position(|&b| b == b'$') else {
        return other;
    };
    let rest = &rest[at..];
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        return other;
    };
    let verb = &rest[nl + 1..];
    let end = verb.iter().position(|&b| b == b'\r').unwrap_or(verb.len());
    let verb = &verb[..end.min(16)];
    VERBS[..other]
        .iter()
        .position(|v| verb.eq_ignore_ascii_case(v.as_bytes()))
        .unwrap_or(other)
}

impl TenantMetrics {
    /// Requests arrived (counted by verb).
    pub fn requests<'a>(&self, payloads: impl Iterator<Item = &'a [u8]>) {
        for p in payloads {
            self.requests[verb_index(p)].inc();
        }
    }

    /// `outputs` are about to be published: count replies and
    /// notifications.
    pub fn published(&self, outputs: &[Output]) {
        for o in outputs {
            match o {
                Output::Publish(p) => match p.kind {
                    PublishKind::Notification => self.notifications.inc(),
                    PublishKind::Response => self.reply(p),
                },
                Output::Violation { .. } => self.ignored.inc(),
                Output::Journal(_) | Output::More(_) => {}
            }
        }
    }

    /// `count` requests taken at `since` have had their replies published.
    pub fn answered(&self, since: Instant, count: usize) {
        let took = since.elapsed().as_secs_f64();
        for _ in 0..count {
            self.latency.observe(took);
        }
    }

    fn reply(&self, p: &OutboundMessage) {
        let error = p.payload.first() == Some(&b'-');
        match p.user_property("__stat") {
            Some("200") if error => self.error.inc(),
            Some("200") => self.ok.inc(),
            status => self
                .replies
                .with_label_values(&[
                    self.name.as_str(),
                    status.unwrap_or("none"),
                    if error { "error" } else { "ok" },
                ])
                .inc(),
        }
    }

    /// Whether the gauges are due for a refresh from the guest.
    pub fn refresh_due(&self) -> bool {
        self.refreshed.is_none_or(|at| at.elapsed() >= REFRESH)
    }

    /// The gauges and guest counters from a guest's `stats`, its call
    /// count and its memory.
    pub fn refresh(&mut self, stats: &Stats, calls: u64, memory: usize) {
        self.refreshed = Some(Instant::now());
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.keys.set(i(stats.keys));
        self.key_bytes.set(i(stats.bytes));
        self.registrations.set(i(stats.registrations));
        self.dedup_entries.set(i(stats.dedup_entries));
        self.dedup_bytes.set(i(stats.dedup_bytes));
        self.guest_memory
            .set(i64::try_from(memory).unwrap_or(i64::MAX));
        // A counter that went down belongs to a new instance: all of it is new.
        let grew = |now: u64, before: u64| if now >= before { now - before } else { now };
        self.dedup_hits
            .inc_by(grew(stats.dedup_hits, self.seen.dedup_hits));
        self.expirations
            .inc_by(grew(stats.expired, self.seen.expired));
        self.guest_calls.inc_by(grew(calls, self.seen.calls));
        self.seen = Seen {
            dedup_hits: stats.dedup_hits,
            expired: stats.expired,
            calls,
        };
    }

    /// The guest was replaced; `cause` is one of trap, deadline, memory,
    /// other. Its counters start again from 0.
    pub fn restarted(&mut self, cause: &str) {
        self.guest_restarts
            .with_label_values(&[self.name.as_str(), cause])
            .inc();
        self.seen = Seen::default();
        self.refreshed = None;
    }

    /// The guest was replaced by an upgrade (not a failure): its counters
    /// start again from 0.
    pub fn replaced(&mut self) {
        self.seen = Seen::default();
        self.refreshed = None;
    }

    /// The tenant stopped for good.
    pub fn stopped(&self) {
        self.up.set(0);
    }

    /// What its journal records.
    pub fn journal(&self) -> JournalMetrics {
        self.journal.clone()
    }
}

/// What a journal records: appends, bytes, fsync and snapshot durations.
#[derive(Clone)]
pub struct JournalMetrics {
    /// Records appended.
    pub records: IntCounter,
    /// Bytes appended.
    pub bytes: IntCounter,
    /// fsync durations.
    pub fsync: Histogram,
    /// Snapshot durations.
    pub snapshot: Histogram,
}

impl std::fmt::Debug for JournalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalMetrics").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_read_from_the_request() {
        let req = |parts: &[&[u8]]| statestore_guest::resp3::request(parts);
        assert_eq!(VERBS[verb_index(&req(&[b"get", b"k"]))], "GET");
        assert_eq!(VERBS[verb_index(&req(&[b"SCAN", b"*"]))], "SCAN");
        assert_eq!(VERBS[verb_index(&req(&[b"KEYNOTIFY", b"k"]))], "KEYNOTIFY");
        assert_eq!(VERBS[verb_index(&req(&[b"MGET", b"k"]))], "other");
        assert_eq!(VERBS[verb_index(b"garbage")], "other");
        assert_eq!(VERBS[verb_index(b"*1\r\n$3\r\nSET")], "SET");
        assert_eq!(VERBS[verb_index(b"")], "other");
    }

    #[test]
    fn families_follow_the_naming_conventions() {
        let m = Metrics::new().expect("metrics");
        let mut t = m.tenant("a");
        t.requests([&b"*1\r\n$3\r\nGET\r\n"[..]].into_iter());
        t.refresh(
            &Stats {
                keys: 3,
                expired: 2,
                ..Stats::default()
            },
            5,
            65536,
        );
        t.restarted("trap");
        t.refresh(
            &Stats {
                expired: 1,
                ..Stats::default()
            },
            1,
            65536,
        );
        let text = m.render();
        for line in [
            "statestore_requests_total{tenant=\"a\",verb=\"GET\"} 1",
            "statestore_keys{tenant=\"a\"} 0",
            "statestore_expirations_total{tenant=\"a\"} 3",
            "statestore_guest_calls_total{tenant=\"a\"} 6",
            "statestore_guest_restarts_total{cause=\"trap\",tenant=\"a\"} 1",
            "statestore_guest_memory_bytes{tenant=\"a\"} 65536",
            "statestore_tenant_up{tenant=\"a\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let mut f = family.split(' ');
            let (name, kind) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
            // Ours, and the process collector's standard `process_*`.
            assert!(
                name.starts_with("statestore_") || name.starts_with("process_"),
                "{name}"
            );
            assert_eq!(kind == "counter", name.ends_with("_total"), "{name}");
            if kind == "histogram" {
                assert!(name.ends_with("_seconds"), "{name}");
            }
        }
    }
}

/// The embedded broker's families: connections, messages dropped at a
/// session's bound, and what it refused by reason.
fn broker_families(r: &Registry) -> Result<(IntGauge, IntCounter, IntCounterVec)> {
    let connections = IntGauge::new(
        "statestore_connections",
        "MQTT client connections to the embedded broker",
    )?;
    r.register(Box::new(connections.clone()))?;
    let queue_dropped = IntCounter::new(
        "statestore_queue_dropped_total",
        "Messages the embedded broker dropped for a session that held --max-queued-size",
    )?;
    r.register(Box::new(queue_dropped.clone()))?;
    let broker_refused = counter(
        r,
        "statestore_broker_refused_total",
        "What the embedded broker refused at one of its limits or rules, by reason: \
         login_rate (a CONNECT from an address past --max-failed-logins, not judged), \
         sessions (a new session past --max-sessions or --max-sessions-per-address), \
         queued_total (a message past --max-queued-total, dropped for one session), \
         pre_connect (a connection closed at accept: past --max-pending-connections or \
         --max-pending-per-address), handshake_timeout (no CONNECT within \
         --handshake-timeout of accept), withheld (a message not delivered: the \
         rules in force do not let its subscriber read the topic), \
         connections_per_address (a CONNECT past --max-connections-per-address), \
         retained (a retained PUBLISH past --max-retained or --max-retained-size), \
         bad_credentials (a wrong user name or password, or none where one is needed), \
         not_authorized (a CONNECT no rule allows, a client id another user holds, or \
         a will topic it may not publish to)",
        &["reason"],
    )?;
    Ok((connections, queue_dropped, broker_refused))
}

/// What build serves, and the process's own (CPU, memory, files).
fn process_families(r: &Registry) -> Result<()> {
    let build = IntGaugeVec::new(
        Opts::new(
            "statestore_build_info",
            "1, labelled with this build's version and the sha256 of its built-in component",
        ),
        &["version", "component_sha256"],
    )?;
    r.register(Box::new(build.clone()))?;
    build
        .with_label_values(&[env!("CARGO_PKG_VERSION"), &builtin_component_sha256()])
        .set(1);
    #[cfg(target_os = "linux")]
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    Ok(())
}

/// The sha256 of the component built into this binary, in hex.
fn builtin_component_sha256() -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(crate::GUEST_COMPONENT)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The embedded broker's PUBLISH counters, kept as atomics by the broker
/// (for its `$SYS` tree) and read at each scrape.
struct BrokerCollector {
    read: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    received: IntCounter,
    delivered: IntCounter,
}

impl BrokerCollector {
    fn new(read: Box<dyn Fn() -> (u64, u64) + Send + Sync>) -> Result<BrokerCollector> {
        Ok(BrokerCollector {
            read,
            received: IntCounter::new(
                "statestore_broker_messages_received_total",
                "PUBLISH packets the embedded broker received from clients",
            )?,
            delivered: IntCounter::new(
                "statestore_broker_messages_delivered_total",
                "PUBLISH packets the embedded broker delivered to clients (requests' replies and notifications included)",
            )?,
        })
    }
}

impl prometheus::core::Collector for BrokerCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.received
            .desc()
            .into_iter()
            .chain(self.delivered.desc())
            .collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let catch_up = |c: &IntCounter, now: u64| {
            let was = c.get();
            if now > was {
                c.inc_by(now - was);
            }
        };
        let (received, delivered) = (self.read)();
        catch_up(&self.received, received);
        catch_up(&self.delivered, delivered);
        let mut families = self.received.collect();
        families.extend(self.delivered.collect());
        families
    }
}

/// A replica's metrics (`serve --cluster --metrics`).
#[derive(Debug, Clone)]
pub struct ReplicaMetrics {
    /// Its term.
    pub term: IntGauge,
    /// 1 while it leads.
    pub is_leader: IntGauge,
    /// Its commit index.
    pub commit_index: IntGauge,
    /// Its applied index.
    pub applied_index: IntGauge,
    /// As leader: each replica's lag, entries.
    pub lag: IntGaugeVec,
    /// Leader changes seen.
    pub leader_changes: IntCounter,
    /// From proposing or forwarding a request to applying it.
    pub commit: Histogram,
    /// Reads served by path (`index`, `log`).
    pub reads: IntCounterVec,
    /// 1 while a leader is known.
    pub has_leader: IntGauge,
    /// The leader's id (0: none).
    pub leader: IntGauge,
    /// When each peer was last heard from (Unix seconds).
    pub peer_heard: IntGaugeVec,
    /// What went through agents, by `what` (see its help).
    pub agents: IntCounterVec,
}
