//! Tenants: independent state stores in one process, each in its own guest
//! instance with its own journal and limits.
//!
//! ```text
//!   Fleet: one wasmtime Engine (pooling allocator, epoch interruption) and
//!          each distinct component compiled once
//!     └── Tenant "a": WasmStore (memory cap, CPU deadline per call, quota)
//!     │               + Journal (its own data directory)
//!     └── Tenant "b": ...
//!
//!   a guest call fails (trap, CPU deadline, memory cap, panic)
//!     -> the instance is dropped and the tenant restarts from its journal
//!     -> the failed batch is retried one request at a time on the fresh
//!        instance, so only the request that faults gets a 500 reply
//!     -> no other tenant is touched: they have their own instances and tasks
//! ```
//!
//! A tenant without a data directory is volatile: after a fault it restarts
//! empty (there is no journal to restart from), and says so in the log.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;

use anyhow::{Context, Result};
use statestore_guest::types::Quota;
use statestore_guest::{HostReply, StateMachine};
use tracing::{error, info};

use crate::metrics::TenantMetrics;
use wasmtime::Engine;

use crate::runtime::wasm::{EngineOptions, PoolOptions};
use crate::store::StoreOptions;
use crate::store::journal::Journal;
use crate::{Backend, Config, GuestError, InboundMessage, Output, Runtime, StoreLimits, WasmStore};

pub use crate::runtime::wasm::WASM32_MAX_MEMORY;

/// Which component a tenant runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ComponentSource {
    /// The component built into this binary.
    BuiltIn,
    /// A component file, read again on every reload.
    File(PathBuf),
}

impl ComponentSource {
    /// The component's bytes.
    pub fn read(&self) -> Result<Vec<u8>> {
        match self {
            ComponentSource::BuiltIn => Ok(crate::GUEST_COMPONENT.to_vec()),
            ComponentSource::File(path) => std::fs::read(path)
                .with_context(|| format!("cannot read the component {}", path.display())),
        }
    }
}

impl std::fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComponentSource::BuiltIn => f.write_str("the built-in component"),
            ComponentSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// One wasmtime engine for every tenant, and each distinct component
/// compiled once for it.
pub struct Fleet {
    engine: Engine,
    cache_dir: Option<PathBuf>,
    compiled: HashMap<u64, Runtime>,
    max_memory: usize,
}

impl Fleet {
    /// An engine with a pooling allocator for `tenants` tenants (two
    /// instance slots each: a restart or an upgrade holds the old and the
    /// new one for a moment) of at most `max_memory` bytes each, and epoch
    /// interruption for the CPU deadlines.
    pub fn new(tenants: usize, max_memory: usize, cache_dir: Option<PathBuf>) -> Result<Fleet> {
        Fleet::with(tenants, max_memory, cache_dir, false)
    }

    /// A fleet for a replica of a cluster: one guest per partition, whose
    /// calls are bounded by fuel, not time, so that a call that fails on
    /// one replica fails alike on every other
    /// ([`crate::EngineOptions::fuel`]).
    pub fn for_replica(
        partitions: usize,
        max_memory: usize,
        cache_dir: Option<PathBuf>,
    ) -> Result<Fleet> {
        Fleet::with(partitions, max_memory, cache_dir, true)
    }

    fn with(
        tenants: usize,
        max_memory: usize,
        cache_dir: Option<PathBuf>,
        fuel: bool,
    ) -> Result<Fleet> {
        let instances = u32::try_from(tenants.saturating_mul(2).saturating_add(4))
            .context("too many tenants")?;
        let max_memory = max_memory.min(WASM32_MAX_MEMORY);
        let engine = crate::runtime::wasm::engine(&EngineOptions {
            pool: Some(PoolOptions {
                instances,
                max_memory,
            }),
            epoch_interruption: !fuel,
            fuel,
        })
        .context("cannot set up the wasm engine")?;
        Ok(Fleet {
            engine,
            cache_dir,
            compiled: HashMap::new(),
            max_memory,
        })
    }

    /// `wasm` compiled for this fleet (once per distinct content), making
    /// instances with `limits`.
    pub fn runtime_from_bytes(&mut self, wasm: &[u8], limits: StoreLimits) -> Result<Runtime> {
        if limits.memory_bytes.is_some_and(|m| m > self.max_memory) {
            anyhow::bail!(
                "a memory cap of {} MiB is more than this server was started with ({} MiB); restart it to raise it",
                limits.memory_bytes.unwrap_or(0) >> 20,
                self.max_memory >> 20
            );
        }
        let key = component_hash(wasm);
        let runtime = match self.compiled.get(&key) {
            Some(r) => r.clone(),
            None => {
                let r = Runtime::load(&self.engine, wasm, self.cache_dir.as_deref())?;
                self.compiled.insert(key, r.clone());
                r
            }
        };
        Ok(runtime.with_limits(limits))
    }
}

/// The content hash of a component, to tell builds apart in logs and reloads.
pub fn component_hash(wasm: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    wasm.hash(&mut h);
    h.finish()
}

/// One tenant's store: its guest instance and journal, restarted from the
/// journal when the guest fails.
pub struct Tenant {
    name: String,
    runtime: Runtime,
    config: Config,
    store: WasmStore,
    journal: Option<Journal>,
    faults: u64,
    clock: std::sync::Arc<dyn crate::store::clock::Clock>,
    more_due: bool,
    /// Requests of the current batch still to be handled one at a time,
    /// after the guest failed on the batch.
    singles: usize,
    metrics: Option<TenantMetrics>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl Tenant {
    /// Instantiates the tenant's store with `runtime` (which carries its
    /// limits), recovering it from its data directory if it has one.
    pub fn open(name: &str, runtime: Runtime, opts: &StoreOptions) -> Result<Tenant> {
        let config = crate::store::guest_config(opts);
        let (store, journal) = crate::store::open_with(&runtime, opts, &config)
            .with_context(|| format!("tenant {name:?}"))?;
        Ok(Tenant {
            name: name.to_string(),
            runtime,
            config,
            store,
            journal,
            faults: 0,
            clock: opts.clock.clone(),
            more_due: false,
            singles: 0,
            metrics: None,
        })
    }

    /// Keeps the tenant's metrics in `metrics` from now on (and its
    /// journal's).
    pub fn set_metrics(&mut self, metrics: TenantMetrics) {
        if let Some(journal) = &mut self.journal {
            journal.set_metrics(metrics.journal());
        }
        self.metrics = Some(metrics);
        self.refresh_metrics(true);
    }

    /// Its metrics, if it keeps any.
    pub fn metrics(&self) -> Option<&TenantMetrics> {
        self.metrics.as_ref()
    }

    /// Reads the guest's sizes and counters into the metrics, if `force`
    /// or they are [`crate::metrics::REFRESH`] old (a failure to read them
    /// is left for the next request to find).
    pub fn refresh_metrics(&mut self, force: bool) {
        let Some(m) = &mut self.metrics else { return };
        if !force && !m.refresh_due() {
            return;
        }
        if let Ok(stats) = self.store.stats() {
            m.refresh(&stats, self.store.calls(), self.store.memory_bytes());
        }
    }

    /// The tenant stopped for good (its clients get 503).
    pub fn stopped(&self) {
        if let Some(m) = &self.metrics {
            m.stopped();
        }
    }

    /// Now, by the clock the tenant is driven by (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The guest config it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How often its guest failed and was restarted.
    pub fn faults(&self) -> u64 {
        self.faults
    }

    /// The guest instance (for tests and tools).
    pub fn store_mut(&mut self) -> &mut WasmStore {
        &mut self.store
    }

    /// Handles requests received together and returns the outputs to
    /// publish, in order; the journal records among them are already
    /// durable (per the fsync policy). If the guest fails, it is restarted
    /// and the requests are handled again one at a time: the one that fails
    /// again gets a 500 reply, the others their normal replies. (A server
    /// uses [`Tenant::handle_some`], which hands the outputs over a bounded
    /// call at a time.)
    pub fn handle(&mut self, messages: &[InboundMessage], now: u64) -> Result<Vec<Output>> {
        let mut all = Vec::new();
        let mut rest = messages;
        while !rest.is_empty() {
            let (outputs, handled) = self.handle_some(rest, now)?;
            all.extend(outputs);
            rest = &rest[handled..];
        }
        Ok(all)
    }

    /// [`Tenant::handle`] one call into the guest at a time: handles the
    /// first of `messages` (as many as one call takes: its outputs stop at
    /// the guest's budget, [`statestore_guest::OUTPUT_BUDGET`]) and returns
    /// their committed outputs and how many it handled (at least one); the
    /// caller publishes them and calls again with the rest, so a batch of
    /// large replies is never held whole.
    pub fn handle_some(
        &mut self,
        messages: &[InboundMessage],
        now: u64,
    ) -> Result<(Vec<Output>, usize)> {
        let Some(first) = messages.first() else {
            return Ok((Vec::new(), 0));
        };
        if self.singles > 0 {
            // After a failure: one at a time, so that only the request that
            // fails again gets a 500.
            self.singles -= 1;
            let one = std::slice::from_ref(first);
            return match self.store.handle_messages(one, now) {
                Ok(outputs) => Ok((self.commit(outputs)?, 1)),
                Err(e) => {
                    let why = self.restart(&e)?;
                    Ok((self.failure_replies(one, now, &why), 1))
                }
            };
        }
        match self.store.handle_messages_once(messages, now) {
            Ok((outputs, handled)) => Ok((self.commit(outputs)?, handled)),
            Err(e) => {
                let why = self.restart(&e)?;
                if messages.len() == 1 {
                    return Ok((self.failure_replies(messages, now, &why), 1));
                }
                self.singles = messages.len();
                self.handle_some(messages, now)
            }
        }
    }

    /// A client went away: its KEYNOTIFY registrations are dropped.
    pub fn client_gone(&mut self, client_id: &str, now: u64) -> Result<Vec<Output>> {
        let outputs = self.store.client_disconnected(client_id, now);
        self.commit_or_restart(outputs)
    }

    /// The deadline passed: expire keys, evict dedup entries (a bounded
    /// number per call: [`Tenant::more_due`] says whether more are due).
    pub fn timeout(&mut self, now: u64) -> Result<Vec<Output>> {
        let mut outputs = self.store.timeout(now);
        self.more_due = false;
        if let Ok(list) = &mut outputs
            && let Some(Output::More(_)) = list.last()
        {
            list.pop();
            self.more_due = true;
        }
        let failed = outputs.is_err();
        let outputs = self.commit_or_restart(outputs)?;
        if failed
            || self
                .journal
                .as_ref()
                .is_some_and(Journal::last_append_failed)
        {
            // The guest failed, or the journal: trying again at once would
            // fail again. The driver waits.
            self.more_due = false;
        }
        Ok(outputs)
    }

    /// Whether the last [`Tenant::timeout`] stopped at its budget with more
    /// due (call it again soon), rather than finishing.
    pub fn more_due(&self) -> bool {
        self.more_due
    }

    /// The outputs of a call that answers no request: committed, or, if the
    /// guest failed, none (the tenant restarts; what the call would have
    /// done happens again on the next one, as after a crash).
    fn commit_or_restart(
        &mut self,
        outputs: Result<Vec<Output>, GuestError>,
    ) -> Result<Vec<Output>> {
        match outputs {
            Ok(outputs) => self.commit(outputs),
            Err(e) => {
                self.restart(&e)?;
                Ok(Vec::new())
            }
        }
    }

    /// When [`Tenant::timeout`] is next due.
    pub fn next_deadline(&mut self) -> Result<Option<u64>> {
        match self.store.next_deadline() {
            Ok(d) => Ok(d),
            Err(e) => {
                self.restart(&e)?;
                Ok(self.store.next_deadline()?)
            }
        }
    }

    /// A graceful shutdown: makes the journal durable and logs what was
    /// flushed (or that the store is volatile).
    pub fn shutdown(&mut self) {
        match self.journal.as_mut().map(Journal::flush) {
            None => info!(tenant = %self.name, "shut down; volatile store: nothing to flush"),
            Some(Ok(r)) if r.dir == "memory" => {
                info!(tenant = %self.name, "shut down; volatile store (journal in memory): nothing to flush");
            }
            Some(Ok(r)) => info!(
                tenant = %self.name,
                dir = %r.dir,
                log_bytes = r.log_bytes,
                since_snapshot_bytes = r.since_snapshot,
                waited_for_snapshot = r.snapshot_finished,
                "shut down; journal flushed: every acknowledged write is on disk"
            ),
            Some(Err(e)) => {
                error!(tenant = %self.name, error = %e, "shut down; the journal could not be flushed")
            }
        }
    }

    /// Moves the tenant to `runtime` (a newer build of the component, or
    /// new limits) with `quota`: a snapshot of the whole state from the old
    /// instance is restored into a new one, and only then does the new one
    /// take over. On any failure the old instance keeps serving.
    pub fn upgrade(&mut self, runtime: Runtime, quota: Quota) -> Result<()> {
        let started = std::time::Instant::now();
        let config = Config {
            quota,
            ..self.config.clone()
        };
        // The snapshot goes across part by part: neither instance ever
        // holds all of it beside the state.
        let old = &mut self.store;
        let mut snapshot_bytes = 0;
        let mut start = true;
        let parts = std::iter::from_fn(|| {
            match old.snapshot_part(crate::SnapshotScope::Everything, start) {
                Ok(part) if part.is_empty() => None,
                Ok(part) => {
                    start = false;
                    snapshot_bytes += part.len();
                    Some(Ok(part))
                }
                Err(e) => Some(Err(anyhow::Error::new(e)
                    .context("cannot take a snapshot from the running instance"))),
            }
        });
        let store = runtime
            .restore_parts(&config, parts)
            .context("the new component cannot restore the running state")?;
        if let Some(journal) = &mut self.journal {
            journal.set_runtime(runtime.clone(), config.clone());
        }
        self.refresh_metrics(true);
        if let Some(m) = &mut self.metrics {
            m.replaced();
        }
        self.store = store;
        self.runtime = runtime;
        self.config = config;
        info!(tenant = %self.name, snapshot_bytes, elapsed_ms = started.elapsed().as_millis() as u64, "switched to the new component");
        Ok(())
    }

    /// Replaces the authorization rules of the keys (a policy reload): the
    /// guest's now, and the config a restart or upgrade uses.
    pub fn set_authorization(
        &mut self,
        rules: Option<Vec<statestore_guest::types::AuthRule>>,
    ) -> Result<()> {
        self.store
            .set_authorization(rules.as_deref())
            .context("the guest refused the authorization rules")?;
        self.config.authorization = rules;
        if let Some(journal) = &mut self.journal {
            journal.set_runtime(self.runtime.clone(), self.config.clone());
        }
        info!(tenant = %self.name, rules = self.config.authorization.as_ref().map_or(0, Vec::len), "authorization rules in force");
        Ok(())
    }

    /// Makes the journal records among `outputs` durable and returns the
    /// rest (see [`crate::store::journal::commit`]).
    fn commit(&mut self, outputs: Vec<Output>) -> Result<Vec<Output>> {
        crate::store::journal::commit(&mut self.store, self.journal.as_mut(), outputs)
    }

    /// Replaces a failed instance: from the journal, or empty if volatile.
    /// Returns what went wrong, in a few words.
    fn restart(&mut self, cause: &GuestError) -> Result<String> {
        self.faults += 1;
        if let Some(m) = &mut self.metrics {
            m.restarted(cause_kind(self.store.memory_refused().is_some(), cause));
        }
        let cause = match self.store.memory_refused() {
            Some(cap) => format!("it reached its memory cap of {} MiB", cap >> 20),
            None => describe(cause),
        };
        match &self.journal {
            Some(journal) => {
                error!(tenant = %self.name, faults = self.faults, %cause, "the tenant's guest failed; restarting it from its journal");
                self.store = journal.reload().with_context(|| {
                    format!("tenant {:?}: cannot restart from its journal", self.name)
                })?;
            }
            None => {
                error!(tenant = %self.name, faults = self.faults, %cause, "the tenant's guest failed; restarting it EMPTY (volatile: no data directory)");
                self.store = self.runtime.instantiate(&self.config).with_context(|| {
                    format!("tenant {:?}: cannot start a new instance", self.name)
                })?;
            }
        }
        Ok(cause)
    }

    /// 500 replies for requests the guest failed on.
    fn failure_replies(&self, messages: &[InboundMessage], now: u64, why: &str) -> Vec<Output> {
        let text = format!("the state store failed while handling this request: {why}");
        messages
            .iter()
            .filter_map(|m| {
                StateMachine::host_reply(
                    &self.config,
                    m,
                    now,
                    HostReply::InternalError(text.clone()),
                )
            })
            .map(Output::Publish)
            .collect()
    }
}

/// The cause label of a guest restart: memory (it reached its cap),
/// deadline (its CPU deadline), trap (a panic or another trap), other.
pub(crate) fn cause_kind(memory_refused: bool, e: &GuestError) -> &'static str {
    if memory_refused {
        return "memory";
    }
    let GuestError::Failed(e) = e else {
        return "other";
    };
    match e.chain().find_map(|c| c.downcast_ref::<wasmtime::Trap>()) {
        Some(wasmtime::Trap::Interrupt) => "deadline",
        Some(_) => "trap",
        None if e.root_cause().to_string().starts_with("unknown import") => "trap",
        None => "other",
    }
}

/// A short account of a guest failure: the trap's reason rather than the
/// whole backtrace.
pub fn describe(e: &GuestError) -> String {
    let e = match e {
        GuestError::Failed(e) => e,
        other => return other.to_string(),
    };
    if let Some(trap) = e.chain().find_map(|c| c.downcast_ref::<wasmtime::Trap>()) {
        return match trap {
            wasmtime::Trap::Interrupt => "it ran past its CPU deadline".to_string(),
            wasmtime::Trap::UnreachableCodeReached => "it trapped (a panic)".to_string(),
            other => format!("it trapped ({other})"),
        };
    }
    let root = e.root_cause().to_string();
    if root.starts_with("unknown import") {
        // Its std writing a panic message: the host gives it no stderr.
        return "it trapped (a panic: it tried to write to stderr)".to_string();
    }
    root.lines().next().unwrap_or("unknown failure").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_traps_briefly() {
        let failed = |e: anyhow::Error| GuestError::Failed(e);
        let e = failed(anyhow::Error::from(wasmtime::Trap::Interrupt));
        assert_eq!(describe(&e), "it ran past its CPU deadline");
        let e = failed(
            anyhow::Error::from(wasmtime::Trap::UnreachableCodeReached).context("while executing"),
        );
        assert_eq!(describe(&e), "it trapped (a panic)");
        let e = failed(anyhow::anyhow!("first line\nsecond").context("outer"));
        assert_eq!(describe(&e), "first line");
        let e = GuestError::Refused(statestore_guest::Error::UnsupportedVersion(9));
        assert!(describe(&e).contains("version 9"));
    }

    #[test]
    fn component_hash_tells_builds_apart() {
        assert_ne!(component_hash(b"a"), component_hash(b"b"));
        assert_eq!(component_hash(b"a"), component_hash(b"a"));
    }
}
