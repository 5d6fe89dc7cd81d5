//! The MQTT broker state store as a deterministic, sans-IO state machine.
//!
//! ```text
//!   inputs (messages, disconnects) + now ──> StateMachine ──> one output list: journal
//!   (no inputs at next_deadline: expiry)          │           records, notifications,
//!                                                 │           replies, violations
//!                                                 └──> next_deadline()
//!
//!   StateMachine
//!     authz      per-key authorization rules (principals, grants, substitutions)
//!     rpc/       envelope: topics, properties, status codes, dedup cache, expiry
//!     resp3/     RESP3 request decoder and reply encoders
//!     command    RESP3 elements -> typed command (validation order of spec §5.4)
//!     hlc        hybrid logical clock: parse, format, order, receive, tick
//!     table/     keys, versions, conditional SET, fencing tokens, expiry index
//!     notify     KEYNOTIFY registry and notification topics
//!     snapshot   versioned, checksummed whole-state format (pure format)
//!     journal    versioned, checksummed records of every state change (pure format)
//!     codec      the little-endian encoding both formats share
//!     wire       flat encoding of input batches and output lists (wit/WIRE.md)
//! ```
//!
//! The crate never reads a clock, socket, file or random source: every entry
//! point takes `now` (ms since the Unix epoch). It compiles natively (tests,
//! fuzzing, benches) and, with `component.rs`, to the `wasm32-wasip2`
//! component that exports `wit/store.wit`.

pub mod authz;
pub(crate) mod codec;
pub mod command;
pub(crate) mod errors;
pub(crate) mod expiry;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod hlc;
pub mod journal;
mod machine;
pub mod notify;
pub mod pattern;
pub mod resp3;
pub mod rpc;
pub(crate) mod rt;
pub mod scan;
pub mod snapshot;
pub mod table;
pub mod types;
pub mod wire;

#[cfg(target_arch = "wasm32")]
mod component;

/// The versions of the encodings this build reads and writes (WIT
/// `formats`): a host checks them when it loads a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formats {
    /// Input batch versions [`StateMachine::handle_wire`] accepts.
    pub batch_versions: &'static [u8],
    /// The output list version it returns.
    pub outputs_version: u8,
    /// The snapshot version written.
    pub snapshot_version: u32,
    /// The journal record version written.
    pub record_version: u32,
}

/// The encodings of this build. With the `next-formats` feature (a test
/// build only) it claims an output version no host reads, so that a host's
/// refusal can be tested.
pub fn formats() -> Formats {
    Formats {
        batch_versions: wire::BATCH_VERSIONS,
        outputs_version: if cfg!(feature = "next-formats") {
            wire::OUTPUTS_VERSION + 1
        } else {
            wire::OUTPUTS_VERSION
        },
        snapshot_version: snapshot::FORMAT_VERSION,
        record_version: u32::from(journal::RECORD_VERSION),
    }
}

pub use machine::{
    EXPIRY_BUDGET, HostReply, LARGE_VALUE, OUTPUT_BUDGET, REQUEST_EXPIRY_BUDGET, Restoring,
    SnapshotCursor, StateMachine,
};
pub use snapshot::SnapshotScope;
pub use types::{
    Config, Error, InboundMessage, Input, KeyMatch, OutboundMessage, Output, Persist, PublishKind,
    ScanPage, Stats, Via,
};
