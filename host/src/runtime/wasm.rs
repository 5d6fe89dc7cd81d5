//! The guest component in wasmtime.
//!
//! ```text
//!   Engine (EngineOptions: pooling allocator, epoch interruption)
//!     └── Runtime: the compiled component + StoreLimits, cheap to clone
//!           └── instantiate / restore -> WasmStore: one instance, one `store`,
//!                 memory capped by its ResourceLimiter, every call bounded by
//!                 an epoch deadline (a guest that loops traps)
//! ```

use std::time::Duration;

use anyhow::{Context, Result};
use wasmtime::component::{Component, Linker, ResourceAny};
use wasmtime::{Engine, Store};

use crate::runtime::bindings::{Guest, GuestPre};
use crate::runtime::convert;
use crate::{Backend, Config, GuestError, InboundMessage, Input, Output};

/// A failed call: the guest trapped or hit a limit.
fn failed(e: wasmtime::Error) -> GuestError {
    GuestError::Failed(e.into())
}

/// The guest's own error variant, as the guest crate's error.
fn refused(e: crate::runtime::bindings::wit::Error) -> GuestError {
    GuestError::Refused(convert::error(e))
}

/// A wasmtime engine with the guest component compiled and linked once;
/// instantiate it as often as needed.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    pre: GuestPre<Limits>,
    limits: StoreLimits,
    epoch: bool,
    fuel: bool,
}

/// How an [`Engine`] is set up for many instances.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineOptions {
    /// Use wasmtime's pooling allocator, sized for this many instances,
    /// each with at most this much linear memory.
    pub pool: Option<PoolOptions>,
    /// Bound every call by an epoch deadline ([`StoreLimits::call_ms`]):
    /// a ticker thread advances the engine's epoch every [`EPOCH_TICK`].
    pub epoch_interruption: bool,
    /// Bound every call by fuel instead ([`FUEL_PER_MS`] for each ms of
    /// [`StoreLimits::call_ms`]): work counted, not time, so that a call
    /// fails alike wherever it runs (the replicas of a cluster).
    pub fuel: bool,
}

/// Sizes of the pooling allocator.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Instances that can live at once (one per tenant, plus one per
    /// upgrade or restart in progress).
    pub instances: u32,
    /// Largest linear memory of one instance, bytes: also the address space
    /// reserved per instance.
    pub max_memory: usize,
}

/// Limits of each instance a [`Runtime`] creates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most bytes of linear memory; a guest that needs more fails to
    /// allocate, which traps.
    pub memory_bytes: Option<usize>,
    /// Most wall-clock milliseconds one call may run (handle, timeout,
    /// disconnect); needs an engine with epoch interruption. Snapshots,
    /// restores and replays get [`BULK_CALL`] instead.
    pub call_ms: Option<u64>,
}

/// The largest linear memory a wasm32 instance can have.
pub const WASM32_MAX_MEMORY: usize = 4 << 30;

/// Fuel a call gets for each ms of its time budget with
/// [`EngineOptions::fuel`]: about a ms of work (a unit is about one wasm
/// instruction).
pub const FUEL_PER_MS: u64 = 2_000_000;

/// The fuel of a call allowed `d`.
fn fuel(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_mul(FUEL_PER_MS)
}

/// How often the epoch advances.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The time a snapshot, restore or replay may take (they are proportional to
/// the state, not to one request).
pub const BULK_CALL: Duration = Duration::from_secs(120);

/// What a snapshot or restore moves across the boundary in one call: the
/// guest's memory holds one part at a time beside the state, never a
/// whole snapshot (and keeps the room a part took: its memory never
/// shrinks). A call costs microseconds, a MiB copied about a hundred.
pub const SNAPSHOT_PART: usize = 1 << 20;

/// An engine for `opts`. With epoch interruption a thread advances its
/// epoch every [`EPOCH_TICK`] for as long as the engine lives.
pub fn engine(opts: &EngineOptions) -> Result<Engine> {
    let mut config = engine_config();
    if let Some(pool) = opts.pool {
        let mut p = wasmtime::PoolingAllocationConfig::new();
        let n = pool.instances.max(1);
        // A component instance of the guest holds a few core instances (the
        // module and wit-component's shims), one memory and a few tables.
        p.total_component_instances(n)
            .total_core_instances(n.saturating_mul(4))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(4))
            .max_memory_size(pool.max_memory)
            // Return memory to the OS when an instance goes: idle tenants
            // should not keep a dead tenant's pages.
            .max_unused_warm_slots(16);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(p));
        config.memory_reservation_for_growth(0);
        match pool_reservation(n) {
            // 4 GiB a slot: every 32-bit address lands in the slot or its
            // guard, so compiled code checks no bounds (what a plain engine
            // does; explicit checks cost about a third of a request's time
            // in the guest).
            Reservation::Full => {
                config.memory_reservation(FULL_RESERVATION);
                config.memory_guard_size(FULL_GUARD);
            }
            // Too many slots for that much address space: reserve what an
            // instance may use, and compiled code checks bounds explicitly.
            Reservation::Capped => {
                let reservation = u64::try_from(pool.max_memory).unwrap_or(u64::MAX);
                config.memory_reservation(reservation);
                config.memory_guard_size(64 << 10);
            }
        }
    }
    if opts.epoch_interruption {
        config.epoch_interruption(true);
    }
    if opts.fuel {
        config.consume_fuel(true);
    }
    let engine = Engine::new(&config)?;
    if opts.epoch_interruption {
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("statestore-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .context("cannot start the epoch thread")?;
    }
    Ok(engine)
}

/// Address space a pooled memory slot reserves so that bounds checks are
/// elided: a 32-bit memory's whole range.
const FULL_RESERVATION: u64 = 4 << 30;
/// Guard after such a slot (offsets of loads and stores land in it).
const FULL_GUARD: u64 = 32 << 20;
/// The most address space a pool may reserve with [`FULL_RESERVATION`]
/// slots: a quarter of x86-64's 128 TiB of user space.
const FULL_POOL_BUDGET: u64 = 32 << 40;

/// How the pool reserves its memory slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// 4 GiB each: no bounds checks in compiled code (a [`crate::store::tenant::Fleet`]
    /// of up to about 2,000 tenants fits `FULL_POOL_BUDGET`).
    Full,
    /// The memory cap each: explicit bounds checks, but room for a million
    /// tenants.
    Capped,
}

/// The reservation of a pool of `instances` instances (two memory slots
/// each).
pub(crate) fn pool_reservation(instances: u32) -> Reservation {
    let slots = u64::from(instances) * 2;
    if slots.saturating_mul(FULL_RESERVATION + FULL_GUARD) <= FULL_POOL_BUDGET {
        Reservation::Full
    } else {
        Reservation::Capped
    }
}

impl Runtime {
    /// The component built with this crate ([`crate::GUEST_COMPONENT`]).
    pub fn new() -> Result<Runtime> {
        Runtime::from_bytes(crate::GUEST_COMPONENT)
    }

    /// A component from its binary (or WAT text) form.
    pub fn from_bytes(wasm: &[u8]) -> Result<Runtime> {
        let engine = Engine::new(&engine_config())?;
        Runtime::load(&engine, wasm, None)
    }

    /// Compiles `wasm` for `engine` (an [`engine`] shared by many
    /// components), or loads it from the precompiled cache in `cache_dir`.
    pub fn load(
        engine: &Engine,
        wasm: &[u8],
        cache_dir: Option<&std::path::Path>,
    ) -> Result<Runtime> {
        let component = match cache_dir {
            Some(dir) => crate::runtime::cache::load(engine, wasm, dir)?,
            None => Component::new(engine, wasm)
                .map_err(anyhow::Error::from)
                .context("the state store component is not valid")?,
        };
        Runtime::from_component(engine.clone(), component)
    }

    /// The same component, creating instances with `limits`.
    pub fn with_limits(&self, limits: StoreLimits) -> Runtime {
        Runtime {
            limits,
            ..self.clone()
        }
    }

    fn from_component(engine: Engine, component: Component) -> Result<Runtime> {
        let mut linker = Linker::new(&engine);
        // The guest imports only what Rust's std links for panics and stdio
        // (wasi:cli, wasi:io); it never calls them on a normal path. Calling
        // one traps, which a host treats like any other guest fault.
        linker.define_unknown_imports_as_traps(&component)?;
        let pre = GuestPre::new(linker.instantiate_pre(&component)?)?;
        let epoch = engine.get_epoch_interruption();
        let fuel = engine.get_consume_fuel();
        let runtime = Runtime {
            engine,
            pre,
            limits: StoreLimits::default(),
            epoch,
            fuel,
        };
        runtime.check_formats()?;
        Ok(runtime)
    }

    /// The encodings of the component (WIT `formats`).
    pub fn formats(&self) -> Result<OwnedFormats> {
        let (mut store, guest) = self.new_instance()?;
        let f = guest.statestore_core_store().call_formats(&mut store)?;
        Ok(OwnedFormats {
            batch_versions: f.batch_versions,
            outputs_version: f.outputs_version,
            snapshot_version: f.snapshot_version,
            record_version: f.record_version,
        })
    }

    /// Refuses a component whose batches this host cannot write or whose
    /// output lists it cannot read: before any store is made, so a refused
    /// upgrade leaves the running component serving.
    fn check_formats(&self) -> Result<()> {
        let f = self.formats()?;
        let writes = statestore_guest::wire::BATCH_VERSION;
        let reads = statestore_guest::wire::OUTPUTS_VERSION;
        if !f.batch_versions.contains(&writes) || f.outputs_version != reads {
            return Err(IncompatibleComponent {
                batch_versions: f.batch_versions,
                outputs_version: f.outputs_version,
                writes,
                reads,
            }
            .into());
        }
        Ok(())
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A new instance holding an empty store.
    pub fn instantiate(&self, config: &Config) -> Result<WasmStore> {
        let (mut store, guest) = self.new_instance()?;
        let api = guest.statestore_core_store().store();
        let wit_config = convert::config(config);
        api.call_validate_config(&mut store, &wit_config)?
            .map_err(convert::error)?;
        let handle = api.call_constructor(&mut store, &wit_config)?;
        Ok(self.wrap(store, guest, handle))
    }

    fn wrap(&self, store: Store<Limits>, guest: Guest, handle: ResourceAny) -> WasmStore {
        let ticks = |d: Duration| {
            u64::try_from(d.as_millis().div_ceil(EPOCH_TICK.as_millis())).unwrap_or(u64::MAX) + 1
        };
        let call = self.limits.call_ms.map_or(BULK_CALL, Duration::from_millis);
        WasmStore {
            store,
            guest,
            handle,
            typed: false,
            scratch: Vec::new(),
            epoch: self.epoch,
            call_ticks: ticks(call),
            bulk_ticks: ticks(BULK_CALL),
            fuel: self.fuel.then(|| (fuel(call), fuel(BULK_CALL))),
            calls: 0,
        }
    }

    /// A new instance holding a store restored from `snapshot`, handed
    /// over in parts of [`SNAPSHOT_PART`] bytes.
    pub fn restore(&self, config: &Config, snapshot: &[u8]) -> Result<WasmStore> {
        self.restore_parts(config, snapshot.chunks(SNAPSHOT_PART).map(Ok))
    }

    /// A new instance holding a store restored from a snapshot handed over
    /// in `parts` (of any size, in order): the guest's memory holds the
    /// state, one part and one item at a time, never the whole snapshot.
    /// An error from `parts` stops the restore.
    pub fn restore_parts<P: AsRef<[u8]>>(
        &self,
        config: &Config,
        parts: impl IntoIterator<Item = Result<P>>,
    ) -> Result<WasmStore> {
        let (mut store, guest) = self.new_instance()?;
        let api = guest.statestore_core_store().restoring();
        let restoring = api
            .call_begin(&mut store, &convert::config(config))?
            .map_err(convert::error)?;
        for part in parts {
            let part = part?;
            self.arm_bulk(&mut store);
            api.call_feed(&mut store, restoring, part.as_ref())?
                .map_err(convert::error)?;
        }
        self.arm_bulk(&mut store);
        let handle = api
            .call_finish(&mut store, restoring)?
            .map_err(convert::error)?;
        Ok(self.wrap(store, guest, handle))
    }

    /// Gives the next call on `store` the budget of a bulk call.
    fn arm_bulk(&self, store: &mut Store<Limits>) {
        if self.epoch {
            let bulk = BULK_CALL.as_millis().div_ceil(EPOCH_TICK.as_millis());
            store.set_epoch_deadline(u64::try_from(bulk).unwrap_or(u64::MAX) + 1);
        }
        if self.fuel {
            let _ = store.set_fuel(fuel(BULK_CALL));
        }
    }

    fn new_instance(&self) -> Result<(Store<Limits>, Guest)> {
        let mut store = Store::new(
            &self.engine,
            Limits {
                memory_bytes: 0,
                max_memory: self.limits.memory_bytes,
                refused: false,
            },
        );
        store.limiter(|limits| limits);
        // What one call may move out of the guest: anything its memory can
        // hold (wasmtime's default, 128 MiB, made a large reply or snapshot
        // fail the call). Calls are bounded by the guest's output budget and
        // its memory cap, not by this.
        store.set_hostcall_fuel(self.limits.memory_bytes.unwrap_or(WASM32_MAX_MEMORY));
        // The constructor or restore runs with the bulk budget.
        self.arm_bulk(&mut store);
        let guest = self.pre.instantiate(&mut store)?;
        Ok((store, guest))
    }
}

/// The encodings a component reads and writes (WIT `formats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedFormats {
    /// Input batch versions it accepts.
    pub batch_versions: Vec<u8>,
    /// The output list version it returns.
    pub outputs_version: u8,
    /// The snapshot version it writes.
    pub snapshot_version: u32,
    /// The journal record version it writes.
    pub record_version: u32,
}

/// A component speaks encodings this host does not (`wit/WIRE.md`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the component's encodings are not this host's: it accepts input batch versions \
     {batch_versions:?} and writes output list version {outputs_version}; this host writes \
     batch version {writes} and reads output list version {reads}"
)]
pub struct IncompatibleComponent {
    /// Batch versions the component accepts.
    pub batch_versions: Vec<u8>,
    /// The output version the component writes.
    pub outputs_version: u8,
    /// The batch version this host writes.
    pub writes: u8,
    /// The output version this host reads.
    pub reads: u8,
}

/// The resources one guest instance holds, kept by wasmtime's
/// [`wasmtime::ResourceLimiter`] hooks.
#[derive(Debug, Default)]
pub struct Limits {
    /// Bytes of linear memory (all memories of the instance).
    memory_bytes: usize,
    /// The cap on `memory_bytes`, if any.
    max_memory: Option<usize>,
    /// Whether a growth past the cap was refused.
    refused: bool,
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.memory_bytes - current.min(self.memory_bytes) + desired;
        if self.max_memory.is_some_and(|max| total > max) {
            // memory.grow answers -1: the guest's allocator fails, and the
            // guest aborts (a trap) unless it copes.
            self.refused = true;
            return Ok(false);
        }
        self.memory_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// The largest batch buffer a [`WasmStore`] keeps between calls.
const SCRATCH_KEPT: usize = 1 << 20;

/// The wasmtime settings every runtime uses. `STATESTORE_PERF_MAP=1` writes
/// `/tmp/perf-<pid>.map` so that `perf report` names the guest's functions.
fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    if std::env::var_os("STATESTORE_PERF_MAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

/// One guest instance holding one `store` resource.
pub struct WasmStore {
    store: Store<Limits>,
    guest: Guest,
    handle: ResourceAny,
    typed: bool,
    /// The encoding buffer of `handle`, reused.
    scratch: Vec<u8>,
    /// Whether the engine interrupts calls at an epoch deadline.
    epoch: bool,
    /// Epoch ticks a request call may take.
    call_ticks: u64,
    /// Epoch ticks a snapshot, restore or replay may take.
    bulk_ticks: u64,
    /// With an engine that counts fuel: a request call's, and a bulk
    /// call's.
    fuel: Option<(u64, u64)>,
    /// Calls made into the instance.
    calls: u64,
}

impl WasmStore {
    /// Whether [`Backend::handle`] crosses with the typed WIT function
    /// (`handle`: a record per input and per output) instead of the flat
    /// `handle-wire` (the default, what the hosts use). The outputs are the
    /// same; this is for tests of both doors and to measure what the flat
    /// encoding saves.
    pub fn use_typed_calls(&mut self, typed: bool) {
        self.typed = typed;
    }

    /// Bytes of linear memory the instance holds (it only ever grows: the
    /// high-water mark of the guest's heap, rounded up to 64 KiB pages).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().memory_bytes
    }

    /// Calls made into this instance so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The store's sizes and counts (for metrics).
    pub fn stats(&mut self) -> Result<crate::Stats, GuestError> {
        self.arm(false);
        // Reading the counters is not a call the metrics should count.
        self.calls -= 1;
        let api = self.guest.statestore_core_store().store();
        let s = api
            .call_stats(&mut self.store, self.handle)
            .map_err(failed)?;
        Ok(crate::Stats {
            keys: s.keys,
            bytes: s.bytes,
            registrations: s.registrations,
            dedup_entries: s.dedup_entries,
            dedup_bytes: s.dedup_bytes,
            dedup_hits: s.dedup_hits,
            expired: s.expired,
        })
    }

    /// The memory cap, if the instance ever asked for more than it: what
    /// made it fail, when it failed.
    pub fn memory_refused(&self) -> Option<usize> {
        let limits = self.store.data();
        limits.max_memory.filter(|_| limits.refused)
    }

    /// Replaces the store's authorization rules (a policy reload).
    pub fn set_authorization(
        &mut self,
        rules: Option<&[statestore_guest::types::AuthRule]>,
    ) -> Result<(), GuestError> {
        self.arm(false);
        let api = self.guest.statestore_core_store().store();
        api.call_set_authorization(
            &mut self.store,
            self.handle,
            rules.map(convert::rules).as_deref(),
        )
        .map_err(failed)?
        .map_err(refused)
    }

    /// The next part of a snapshot of `scope` ([`SNAPSHOT_PART`] bytes or a
    /// little more); `start` begins one. Empty once it is complete; the
    /// parts in order are [`Backend::snapshot_with`]'s bytes. A call that
    /// changes the store in between ends the snapshot.
    pub fn snapshot_part(
        &mut self,
        scope: crate::SnapshotScope,
        start: bool,
    ) -> Result<Vec<u8>, GuestError> {
        self.arm(true);
        let api = self.guest.statestore_core_store().store();
        api.call_snapshot_part(
            &mut self.store,
            self.handle,
            convert::scope(scope),
            start,
            u32::try_from(SNAPSHOT_PART).unwrap_or(u32::MAX),
        )
        .map_err(failed)?
        .map_err(refused)
    }

    /// [`Backend::timeout`] with the budget of a snapshot rather than of a
    /// request: for the expiry of everything that expired while the server
    /// was down, which is proportional to the state.
    pub fn timeout_bulk(&mut self, now: u64) -> Result<Vec<Output>, GuestError> {
        self.call(&[], now, true)
    }

    /// Handles every input: the guest may stop a call early (its outputs
    /// reached its budget, [`statestore_guest::OUTPUT_BUDGET`]), and is
    /// then called again with the rest, so what crosses in one call stays
    /// bounded. After a call with no inputs a last [`Output::More`] is
    /// kept: more keys are due now.
    fn call(
        &mut self,
        inputs: &[Input<'_>],
        now: u64,
        bulk: bool,
    ) -> Result<Vec<Output>, GuestError> {
        let mut all: Vec<Output> = Vec::new();
        let mut rest = inputs;
        loop {
            let mut outputs = self.call_once(rest, now, bulk)?;
            let handled = statestore_guest::wire::handled(&mut outputs, rest.len());
            if all.is_empty() {
                all = outputs;
            } else {
                all.extend(outputs);
            }
            rest = &rest[handled..];
            if rest.is_empty() {
                return Ok(all);
            }
        }
    }

    /// One call into the guest with `messages`: its outputs, and how many
    /// of the messages it handled (at least one; the guest stops taking
    /// inputs once its outputs reach its budget).
    pub fn handle_messages_once(
        &mut self,
        messages: &[InboundMessage],
        now: u64,
    ) -> Result<(Vec<Output>, usize), GuestError> {
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        let mut outputs = self.call_once(&inputs, now, false)?;
        let handled = statestore_guest::wire::handled(&mut outputs, inputs.len());
        Ok((outputs, handled))
    }

    fn call_once(
        &mut self,
        inputs: &[Input<'_>],
        now: u64,
        bulk: bool,
    ) -> Result<Vec<Output>, GuestError> {
        self.arm(bulk);
        let api = self.guest.statestore_core_store().store();
        if self.typed {
            let inputs: Vec<_> = inputs.iter().map(convert::input).collect();
            let out = api
                .call_handle(&mut self.store, self.handle, &inputs, now)
                .map_err(failed)?;
            return Ok(out.into_iter().map(convert::output).collect());
        }
        // One flat list<u8> each way (the guest's `wire` encoding): far
        // cheaper to lower and lift than a record of strings per message.
        statestore_guest::wire::encode_batch_into(&mut self.scratch, inputs);
        let out = api
            .call_handle_wire(&mut self.store, self.handle, &self.scratch, now)
            .map_err(failed)?
            .map_err(refused)?;
        // The replies' strings and payloads become slices of this one
        // buffer: no allocation per field.
        let outputs = statestore_guest::wire::decode_outputs_shared(out.into(), &self.scratch)
            .map_err(GuestError::BadOutputs);
        // The scratch buffer keeps the capacity of the largest batch: give
        // back what a large one took.
        if self.scratch.capacity() > SCRATCH_KEPT {
            self.scratch = Vec::new();
        }
        outputs
    }

    /// One `handle-wire` call (or, `query`, `query-wire`) with a batch
    /// already encoded: its outputs as the guest made them.
    fn call_wire(
        &mut self,
        batch: &[u8],
        now: u64,
        query: bool,
    ) -> Result<Vec<Output>, GuestError> {
        self.arm(false);
        let api = self.guest.statestore_core_store().store();
        let out = if query {
            api.call_query_wire(&mut self.store, self.handle, batch, now)
        } else {
            api.call_handle_wire(&mut self.store, self.handle, batch, now)
        }
        .map_err(failed)?
        .map_err(refused)?;
        statestore_guest::wire::decode_outputs_shared(out.into(), batch)
            .map_err(GuestError::BadOutputs)
    }

    /// Arms the deadline of the next call: a request's, or a bulk one's.
    fn arm(&mut self, bulk: bool) {
        self.calls += 1;
        if self.epoch {
            let ticks = if bulk {
                self.bulk_ticks
            } else {
                self.call_ticks
            };
            self.store.set_epoch_deadline(ticks);
        }
        if let Some((call, bulk_fuel)) = self.fuel {
            let _ = self.store.set_fuel(if bulk { bulk_fuel } else { call });
        }
    }
}

impl Backend for WasmStore {
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> Result<Vec<Output>, GuestError> {
        self.call(inputs, now, false)
    }

    fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        self.call_wire(batch, now, false)
    }

    fn reads(&mut self, batch: &[u8]) -> Result<Vec<u32>, GuestError> {
        self.arm(false);
        self.guest
            .statestore_core_store()
            .call_reads(&mut self.store, batch)
            .map_err(failed)?
            .map_err(refused)
    }

    fn query_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        self.call_wire(batch, now, true)
    }

    fn next_deadline(&mut self) -> Result<Option<u64>, GuestError> {
        self.arm(false);
        let api = self.guest.statestore_core_store().store();
        api.call_next_deadline(&mut self.store, self.handle)
            .map_err(failed)
    }

    fn snapshot_with(&mut self, scope: crate::SnapshotScope) -> Result<Vec<u8>, GuestError> {
        let mut all = Vec::new();
        self.snapshot_into(scope, &mut all)?;
        Ok(all)
    }

    fn snapshot_into(
        &mut self,
        scope: crate::SnapshotScope,
        out: &mut Vec<u8>,
    ) -> Result<(), GuestError> {
        let mut start = true;
        loop {
            let part = self.snapshot_part(scope, start)?;
            if part.is_empty() && !start {
                return Ok(());
            }
            if out.is_empty() {
                *out = part; // the first part of a snapshot of its own
            } else {
                out.extend_from_slice(&part);
            }
            start = false;
        }
    }

    fn replay(&mut self, records: &[Vec<u8>]) -> Result<(), GuestError> {
        self.arm(true);
        let api = self.guest.statestore_core_store().store();
        api.call_replay(&mut self.store, self.handle, records)
            .map_err(failed)?
            .map_err(refused)
    }
}

impl Drop for WasmStore {
    fn drop(&mut self) {
        // Runs the guest's destructor; a failure only means the instance is
        // already broken, and it is going away with the store anyway.
        self.arm(false);
        let _ = self.handle.resource_drop(&mut self.store);
    }
}

impl std::fmt::Debug for WasmStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmStore").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, InboundMessage};

    #[test]
    fn pool_reservations_by_size() {
        assert_eq!(pool_reservation(6), Reservation::Full);
        assert_eq!(pool_reservation(4_000), Reservation::Full);
        assert_eq!(pool_reservation(5_000), Reservation::Capped);
    }

    /// Both reservations serve requests and keep the memory cap.
    #[test]
    fn pooled_engines_of_both_reservations_serve() -> Result<()> {
        for instances in [6, 5_000] {
            let engine = engine(&EngineOptions {
                pool: Some(PoolOptions {
                    instances,
                    max_memory: 16 << 20,
                }),
                epoch_interruption: true,
                fuel: false,
            })?;
            let rt =
                Runtime::load(&engine, crate::GUEST_COMPONENT, None)?.with_limits(StoreLimits {
                    memory_bytes: Some(16 << 20),
                    call_ms: Some(1000),
                });
            let mut store = rt.instantiate(&Config::default())?;
            let set = InboundMessage {
                topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
                payload: statestore_guest::resp3::request(&[b"SET", b"k", b"v"]),
                qos: 1,
                response_topic: Some("r/t".into()),
                correlation_data: Some(vec![1]),
                message_expiry_interval: Some(10),
                user_properties: vec![("__ts".into(), "000000000000001:00000:c".into())],
                ..InboundMessage::default()
            };
            let get = InboundMessage {
                payload: statestore_guest::resp3::request(&[b"GET", b"k"]),
                correlation_data: Some(vec![2]),
                ..set.clone()
            };
            let out = store.handle_messages(&[set, get], 1)?;
            let payloads: Vec<&[u8]> = out
                .iter()
                .filter_map(|o| match o {
                    Output::Publish(m) => Some(&*m.payload),
                    _ => None,
                })
                .collect();
            assert_eq!(payloads, [&b"+OK\r\n"[..], b"$1\r\nv\r\n"], "{instances}");
            assert!(store.memory_bytes() <= 16 << 20);
        }
        Ok(())
    }

    /// A state of more than half the memory cap: its snapshot and its
    /// restore go across in parts, so that neither instance needs room for
    /// the state twice (in one piece both failed).
    #[test]
    fn a_state_over_half_the_memory_cap_snapshots_restores_and_moves() -> Result<()> {
        let cap = 64 << 20;
        let rt = Runtime::new()?.with_limits(StoreLimits {
            memory_bytes: Some(cap),
            call_ms: None,
        });
        let mut store = rt.instantiate(&Config::default())?;
        let value = vec![b'v'; 1 << 20];
        for i in 0..38u8 {
            let key = format!("key{i}");
            let set = InboundMessage {
                topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
                payload: statestore_guest::resp3::request(&[b"SET", key.as_bytes(), &value]),
                qos: 1,
                response_topic: Some("r/t".into()),
                correlation_data: Some(vec![i]),
                message_expiry_interval: Some(10),
                user_properties: vec![("__ts".into(), "000000000000001:00000:c".into())],
                ..InboundMessage::default()
            };
            let out = store.handle_messages(&[set], 1)?;
            assert!(
                matches!(&out[..], [Output::Publish(m)] if &*m.payload == b"+OK\r\n"),
                "{i}"
            );
        }
        let snapshot = store.snapshot_with(crate::SnapshotScope::Everything)?;
        assert!(snapshot.len() > 38 << 20);
        assert!(store.memory_refused().is_none());
        let mut restored = rt.restore(&Config::default(), &snapshot)?;
        assert!(restored.memory_bytes() <= cap);
        assert_eq!(
            restored.snapshot_with(crate::SnapshotScope::Everything)?,
            snapshot
        );
        // Parts straight from one instance into another (a hot upgrade).
        let mut start = true;
        let parts = std::iter::from_fn(|| {
            let part = store
                .snapshot_part(crate::SnapshotScope::Everything, start)
                .map_err(anyhow::Error::new);
            start = false;
            match part {
                Ok(p) if p.is_empty() => None,
                other => Some(other),
            }
        });
        let mut moved = rt.restore_parts(&Config::default(), parts)?;
        assert_eq!(
            moved.snapshot_with(crate::SnapshotScope::Everything)?,
            snapshot
        );
        Ok(())
    }
}
