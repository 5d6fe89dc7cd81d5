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
//!
//! The parts, each a folder or a file of `src/`:
//!
//! - [`runtime`]: wasmtime, the bindings and the precompiled component cache;
//!   [`Runtime`] and [`WasmStore`] are re-exported here.
//! - [`store`]: one store and what keeps it: opening it ([`store::StoreOptions`]),
//!   its [`store::tenant::Tenant`] (restarts, upgrades), the driver loop every
//!   transport shares ([`store::driver`]), the journal, storage and clock.
//! - [`transport`]: the embedded broker ([`transport::embedded::EmbeddedServer`])
//!   and an external one ([`transport::external::Server`]), and the MQTT they share.
//! - [`auth`]: users, authorization rules, the isolation of the store's streams.
//! - [`cluster`]: replication on raft-rs, its sans-IO router and its simulation.
//! - [`mqtt`]: MQTT 5 properties to and from the guest's types, broker URLs,
//!   TLS options (shared by the transports, the config and the client).
//! - [`config`], [`metrics`], [`process`]: what a server is set up with.
//! - [`client`], [`mod@bench`]: the libraries of the client commands and of `bench`.
//!
//! A host embedding the component needs [`Runtime`], [`WasmStore`] (or
//! [`NativeStore`]) through [`Backend`], the message types re-exported below,
//! and, for a complete server, [`store::driver`] with one of the transports.

pub mod auth;
pub mod bench;
pub mod client;
pub mod cluster;
pub mod config;
pub mod metrics;
pub mod mqtt;
pub mod process;
pub mod runtime;
pub mod store;
pub mod transport;

pub use runtime::wasm::{
    EngineOptions, IncompatibleComponent, OwnedFormats, PoolOptions, Runtime, StoreLimits,
    WasmStore,
};
pub use statestore_guest::SnapshotScope;
pub use statestore_guest::types::{
    Config, InboundMessage, Input, KeyMatch, OutboundMessage, Output, Persist, PublishKind,
    ScanPage, Stats,
};

/// The guest component built by this crate's build script (`wasm32-wasip2`).
pub const GUEST_COMPONENT: &[u8] = include_bytes!(env!("STATESTORE_GUEST_WASM"));

/// What can go wrong in a call into a state machine.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The guest refused what it was given (a snapshot, record or batch it
    /// cannot read, a format newer than it knows): its own error, typed.
    #[error(transparent)]
    Refused(#[from] statestore_guest::Error),
    /// The guest failed: it trapped (a panic), ran past its CPU deadline or
    /// its memory cap. The instance is unusable; a tenant restarts it.
    #[error("the guest failed: {0:#}")]
    Failed(anyhow::Error),
    /// The guest returned an output list this host cannot read.
    #[error("the guest returned an output list this host cannot read: {0}")]
    BadOutputs(statestore_guest::Error),
}

/// Something that runs the state store state machine: the wasm component or
/// the native build of the same crate.
pub trait Backend {
    /// Handles `inputs` at `now`, in order, and returns every output they
    /// caused. Keys due at `now` expire first, so no inputs is the timer
    /// call.
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> Result<Vec<Output>, GuestError>;
    /// [`Backend::handle`] of messages only.
    fn handle_messages(
        &mut self,
        messages: &[InboundMessage],
        now: u64,
    ) -> Result<Vec<Output>, GuestError> {
        let inputs: Vec<Input<'_>> = messages.iter().map(Input::Message).collect();
        self.handle(&inputs, now)
    }
    /// A client went away: its KEYNOTIFY registrations are dropped.
    fn client_disconnected(
        &mut self,
        client_id: &str,
        now: u64,
    ) -> Result<Vec<Output>, GuestError> {
        self.handle(&[Input::Disconnected(client_id)], now)
    }
    /// The deadline passed: [`Backend::handle`] with no inputs.
    fn timeout(&mut self, now: u64) -> Result<Vec<Output>, GuestError> {
        self.handle(&[], now)
    }
    /// One call with a batch already in the guest's encoding
    /// (`wit/WIRE.md`, what a replicated log carries): its outputs as the
    /// guest made them (a trailing [`Output::More`] is left to the caller).
    fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError>;
    /// The positions of the inputs of `batch` (the guest's encoding) that
    /// are reads [`Backend::query_wire`] answers (WIT `reads`).
    fn reads(&mut self, batch: &[u8]) -> Result<Vec<u32>, GuestError>;
    /// Answers the reads of `batch` at `now` without changing the store
    /// (WIT `query-wire`; a trailing [`Output::More`] is left to the caller).
    fn query_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError>;
    /// When [`Backend::timeout`] is next due.
    fn next_deadline(&mut self) -> Result<Option<u64>, GuestError>;
    /// The whole state.
    fn snapshot(&mut self) -> Result<Vec<u8>, GuestError> {
        self.snapshot_with(SnapshotScope::Everything)
    }
    /// The state of `scope`.
    fn snapshot_with(&mut self, scope: SnapshotScope) -> Result<Vec<u8>, GuestError>;
    /// [`Backend::snapshot_with`], appended to `out` (a store that takes it
    /// in parts appends each as it comes: the whole is not copied again).
    fn snapshot_into(&mut self, scope: SnapshotScope, out: &mut Vec<u8>) -> Result<(), GuestError> {
        out.extend_from_slice(&self.snapshot_with(scope)?);
        Ok(())
    }
    /// Applies journal records in order.
    fn replay(&mut self, records: &[Vec<u8>]) -> Result<(), GuestError>;
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
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> Result<Vec<Output>, GuestError> {
        Ok(self.0.step(inputs, now))
    }
    fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        let out = self.0.handle_wire(batch, now)?;
        statestore_guest::wire::decode_outputs(&out, batch).map_err(GuestError::BadOutputs)
    }
    fn reads(&mut self, batch: &[u8]) -> Result<Vec<u32>, GuestError> {
        Ok(statestore_guest::StateMachine::reads(batch)?)
    }
    fn query_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        let out = self.0.query_wire(batch, now)?;
        statestore_guest::wire::decode_outputs(&out, batch).map_err(GuestError::BadOutputs)
    }
    fn next_deadline(&mut self) -> Result<Option<u64>, GuestError> {
        Ok(self.0.next_deadline())
    }
    fn snapshot_with(&mut self, scope: SnapshotScope) -> Result<Vec<u8>, GuestError> {
        Ok(self.0.snapshot_with(scope))
    }
    fn replay(&mut self, records: &[Vec<u8>]) -> Result<(), GuestError> {
        for r in records {
            self.0.replay(r)?;
        }
        Ok(())
    }
}
