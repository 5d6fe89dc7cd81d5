//! The MQTT broker state store as a deterministic, sans-IO state machine.
//!
//! ```text
//!   inbound MQTT5 message + now ─┐
//!   client disconnected + now ───┼──> StateMachine ──> outputs: publishes (notifications
//!   timeout(now) ────────────────┘       │               before their reply), violations
//!                                        └──> next_deadline()
//!
//!   StateMachine
//!     rpc/       envelope: topics, properties, status codes, dedup cache, expiry
//!     resp3/     RESP3 request decoder and reply encoders
//!     command    RESP3 elements -> typed command (validation order of spec §5.4)
//!     hlc        hybrid logical clock: parse, format, order, receive, tick
//!     store/     keys, versions, conditional SET, fencing tokens, expiry index
//!     notify     KEYNOTIFY registry and notification topics
//!     snapshot   versioned, checksummed whole-state format
//!     journal    versioned, checksummed records of every state change; replay
//!     wire       flat encoding of message batches and outputs for the component boundary
//! ```
//!
//! The crate never reads a clock, socket, file or random source: every entry
//! point takes `now` (ms since the Unix epoch). It compiles natively (tests,
//! fuzzing, benches) and, with `component.rs`, to the `wasm32-wasip2`
//! component that exports `wit/store.wit`.

pub mod command;
pub mod errors;
pub mod expiry;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod hlc;
pub mod journal;
mod machine;
pub mod notify;
mod outputs;
pub mod resp3;
pub mod rpc;
pub mod snapshot;
pub mod store;
pub mod types;
pub mod wire;

#[cfg(target_arch = "wasm32")]
mod component;

pub use machine::{HostReply, StateMachine};
pub use snapshot::SnapshotScope;
pub use types::{Config, Error, InboundMessage, OutboundMessage, Output, Persist, PublishKind};
