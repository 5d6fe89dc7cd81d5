//! The one `bindgen!` call: typed access to the guest component's exports.

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "guest",
    path: "../wit",
});

pub use exports::statestore::core::store as wit;
