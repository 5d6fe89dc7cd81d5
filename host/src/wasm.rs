//! The guest component in wasmtime.

use anyhow::{Context, Result};
use wasmtime::component::{Component, Linker, ResourceAny};
use wasmtime::{Engine, Store};

use crate::bindings::{Guest, GuestPre};
use crate::convert;
use crate::{Backend, Config, InboundMessage, Output};

/// A wasmtime engine with the guest component compiled and linked once;
/// instantiate it as often as needed.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    pre: GuestPre<Limits>,
}

impl Runtime {
    /// The component built with this crate ([`crate::GUEST_COMPONENT`]).
    pub fn new() -> Result<Runtime> {
        Runtime::from_bytes(crate::GUEST_COMPONENT)
    }

    /// A component from its binary (or WAT text) form.
    pub fn from_bytes(wasm: &[u8]) -> Result<Runtime> {
        let engine = Engine::new(&engine_config())?;
        let component = Component::new(&engine, wasm)
            .map_err(anyhow::Error::from)
            .context("the state store component is not valid")?;
        Runtime::from_component(engine, component)
    }

    /// A component read from a file.
    pub fn from_file(path: &std::path::Path) -> Result<Runtime> {
        let wasm = std::fs::read(path)
            .with_context(|| format!("cannot read component {}", path.display()))?;
        Runtime::from_bytes(&wasm).with_context(|| format!("in {}", path.display()))
    }

    /// Like [`Runtime::from_bytes`], but keeps the compiled code in
    /// `cache_dir` and loads it from there next time.
    pub fn from_bytes_cached(wasm: &[u8], cache_dir: &std::path::Path) -> Result<Runtime> {
        let engine = Engine::new(&engine_config())?;
        let component = crate::cache::load(&engine, wasm, cache_dir)?;
        Runtime::from_component(engine, component)
    }

    fn from_component(engine: Engine, component: Component) -> Result<Runtime> {
        let mut linker = Linker::new(&engine);
        // The guest imports only what Rust's std links for panics and stdio
        // (wasi:cli, wasi:io); it never calls them on a normal path. Calling
        // one traps, which a host treats like any other guest fault.
        linker.define_unknown_imports_as_traps(&component)?;
        let pre = GuestPre::new(linker.instantiate_pre(&component)?)?;
        Ok(Runtime { engine, pre })
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
        Ok(WasmStore {
            store,
            guest,
            handle,
            typed: false,
            scratch: Vec::new(),
        })
    }

    /// A new instance holding a store restored from `snapshot`.
    pub fn restore(&self, config: &Config, snapshot: &[u8]) -> Result<WasmStore> {
        let (mut store, guest) = self.new_instance()?;
        let api = guest.statestore_core_store().store();
        let handle = api
            .call_restore(&mut store, &convert::config(config), snapshot)?
            .map_err(convert::error)?;
        Ok(WasmStore {
            store,
            guest,
            handle,
            typed: false,
            scratch: Vec::new(),
        })
    }

    fn new_instance(&self) -> Result<(Store<Limits>, Guest)> {
        let mut store = Store::new(&self.engine, Limits::default());
        store.limiter(|limits| limits);
        let guest = self.pre.instantiate(&mut store)?;
        Ok((store, guest))
    }
}

/// The resources one guest instance holds, kept by wasmtime's
/// [`wasmtime::ResourceLimiter`] hooks.
#[derive(Debug, Default)]
pub struct Limits {
    /// Bytes of linear memory (all memories of the instance).
    memory_bytes: usize,
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.memory_bytes = self.memory_bytes - current.min(self.memory_bytes) + desired;
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
    /// The encoding buffer of `handle_batch`, reused.
    scratch: Vec<u8>,
}

impl WasmStore {
    /// Whether [`Backend::handle_batch`] and [`Backend::poll_outputs`] cross
    /// with the typed WIT functions (`handle-batch`, `poll-outputs`: a record
    /// per message and per output) instead of the flat `handle-wire` and
    /// `poll-wire` (the default). The outputs are the same; this is for tests
    /// of both paths and to measure what the flat encoding saves.
    pub fn use_typed_calls(&mut self, typed: bool) {
        self.typed = typed;
    }

    /// Bytes of linear memory the instance holds (it only ever grows: the
    /// high-water mark of the guest's heap, rounded up to 64 KiB pages).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().memory_bytes
    }
}

impl Backend for WasmStore {
    fn handle(&mut self, message: &InboundMessage, now: u64) -> Result<()> {
        let m = convert::message(message);
        let api = self.guest.statestore_core_store().store();
        Ok(api.call_handle(&mut self.store, self.handle, &m, now)?)
    }

    fn handle_batch(&mut self, messages: &[InboundMessage], now: u64) -> Result<Vec<Output>> {
        if self.typed {
            let ms: Vec<_> = messages.iter().map(convert::message).collect();
            let api = self.guest.statestore_core_store().store();
            let out = api.call_handle_batch(&mut self.store, self.handle, &ms, now)?;
            return Ok(out.into_iter().map(convert::output).collect());
        }
        // One flat list<u8> each way (the guest's `wire` encoding): far
        // cheaper to lower and lift than a record of strings per message.
        statestore_guest::wire::encode_batch_into(&mut self.scratch, messages);
        let api = self.guest.statestore_core_store().store();
        let out = api
            .call_handle_wire(&mut self.store, self.handle, &self.scratch, now)?
            .map_err(convert::error)?;
        Ok(statestore_guest::wire::decode_outputs(&out)?)
    }

    fn client_disconnected(&mut self, client_id: &str, now: u64) -> Result<()> {
        let api = self.guest.statestore_core_store().store();
        Ok(api.call_client_disconnected(&mut self.store, self.handle, client_id, now)?)
    }

    fn timeout(&mut self, now: u64) -> Result<()> {
        let api = self.guest.statestore_core_store().store();
        Ok(api.call_timeout(&mut self.store, self.handle, now)?)
    }

    fn poll_outputs(&mut self) -> Result<Vec<Output>> {
        let api = self.guest.statestore_core_store().store();
        if self.typed {
            let out = api.call_poll_outputs(&mut self.store, self.handle)?;
            return Ok(out.into_iter().map(convert::output).collect());
        }
        let out = api.call_poll_wire(&mut self.store, self.handle)?;
        Ok(statestore_guest::wire::decode_outputs(&out)?)
    }

    fn next_deadline(&mut self) -> Result<Option<u64>> {
        let api = self.guest.statestore_core_store().store();
        Ok(api.call_next_deadline(&mut self.store, self.handle)?)
    }

    fn snapshot_with(&mut self, scope: crate::SnapshotScope) -> Result<Vec<u8>> {
        let api = self.guest.statestore_core_store().store();
        Ok(api.call_snapshot(&mut self.store, self.handle, convert::scope(scope))?)
    }

    fn replay(&mut self, records: &[Vec<u8>]) -> Result<()> {
        let api = self.guest.statestore_core_store().store();
        api.call_replay(&mut self.store, self.handle, records)?
            .map_err(convert::error)?;
        Ok(())
    }
}

impl Drop for WasmStore {
    fn drop(&mut self) {
        // Runs the guest's destructor; a failure only means the instance is
        // already broken, and it is going away with the store anyway.
        let _ = self.handle.resource_drop(&mut self.store);
    }
}

impl std::fmt::Debug for WasmStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmStore").finish_non_exhaustive()
    }
}
