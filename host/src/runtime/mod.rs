//! Running the component: wasmtime's engine and the compiled component
//! ([`wasm`]), the typed bindings of its WIT exports (`bindings`) and the
//! conversions to and from the guest's plain types (`convert`), and the
//! cache of precompiled components ([`cache`]).

pub(crate) mod bindings;
pub mod cache;
pub(crate) mod convert;
pub mod wasm;
