//! Native host for the state store component.
//!
//! The state store logic lives in one WebAssembly component (`guest/`,
//! `wit/store.wit`). This crate loads it with wasmtime and drives it:
//!
//! ```text
//!   Runtime (engine + compiled component, shared; its formats checked at load)
//!      └── instantiate(config) -> WasmStore: one guest instance, one `store` resource
//!              handle(inputs, now) -> outputs   (messages, disconnects; none: expiry)
//!              next_deadline / snapshot / restore / replay
//! ```
//!
//! [`Backend`] is implemented by [`WasmStore`] and by [`NativeStore`] (the same
//! state machine compiled natively), so tests and benchmarks can run the same
//! inputs through both.

pub mod bench;
mod bindings;
pub mod cache;
pub mod clock;
pub mod config;
mod convert;
pub mod driver;
pub mod embedded;
pub mod journal;
pub mod mqtt;
pub mod serve;
pub mod store;
pub mod tenant;
pub mod wasm;

pub use statestore_guest::SnapshotScope;
pub use statestore_guest::types::{
    Config, InboundMessage, Input, OutboundMessage, Output, Persist, PublishKind,
};
pub use wasm::{
    EngineOptions, IncompatibleComponent, OwnedFormats, PoolOptions, Runtime, StoreLimits,
    WasmStore,
};

/// The guest component built by this crate's build script (`wasm32-wasip2`).
pub const GUEST_COMPONENT: &[u8] = include_bytes!(env!("STATESTORE_GUEST_WASM"));

/// Something that runs the state store state machine: the wasm component or
/// the native build of the same crate.
pub trait Backend {
    /// Handles `inputs` at `now`, in order, and returns every output they
    /// caused. Keys due at `now` expire first, so no inputs is the timer
    /// call.
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> anyhow::Result<Vec<Output>>;
    /// [`Backend::handle`] of messages only.
    fn handle_messages(
        &mut self,
        messages: &[InboundMessage],
        now: u64,
    ) -> anyhow::Result<Vec<Output>> {
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        self.handle(&inputs, now)
    }
    /// A client went away: its KEYNOTIFY registrations are dropped.
    fn client_disconnected(&mut self, client_id: &str, now: u64) -> anyhow::Result<Vec<Output>> {
        self.handle(&[Input::Disconnected(client_id)], now)
    }
    /// The deadline passed: [`Backend::handle`] with no inputs.
    fn timeout(&mut self, now: u64) -> anyhow::Result<Vec<Output>> {
        self.handle(&[], now)
    }
    /// When [`Backend::timeout`] is next due.
    fn next_deadline(&mut self) -> anyhow::Result<Option<u64>>;
    /// The whole state.
    fn snapshot(&mut self) -> anyhow::Result<Vec<u8>> {
        self.snapshot_with(SnapshotScope::Everything)
    }
    /// The state of `scope`.
    fn snapshot_with(&mut self, scope: SnapshotScope) -> anyhow::Result<Vec<u8>>;
    /// Applies journal records in order.
    fn replay(&mut self, records: &[Vec<u8>]) -> anyhow::Result<()>;
}

/// The state machine compiled natively, behind [`Backend`].
#[derive(Debug, Clone)]
pub struct NativeStore(pub statestore_guest::StateMachine);

impl NativeStore {
    /// An empty store.
    pub fn new(config: Config) -> anyhow::Result<NativeStore> {
        Ok(NativeStore(statestore_guest::StateMachine::new(config)?))
    }

    /// A store restored from a snapshot.
    pub fn restore(config: Config, snapshot: &[u8]) -> anyhow::Result<NativeStore> {
        Ok(NativeStore(statestore_guest::StateMachine::restore(
            config, snapshot,
        )?))
    }
}

impl Backend for NativeStore {
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> anyhow::Result<Vec<Output>> {
        Ok(self.0.step(inputs, now))
    }
    fn next_deadline(&mut self) -> anyhow::Result<Option<u64>> {
        Ok(self.0.next_deadline())
    }
    fn snapshot_with(&mut self, scope: SnapshotScope) -> anyhow::Result<Vec<u8>> {
        Ok(self.0.snapshot_with(scope))
    }
    fn replay(&mut self, records: &[Vec<u8>]) -> anyhow::Result<()> {
        for r in records {
            self.0.replay(r)?;
        }
        Ok(())
    }
}
