//! Builds two test variants of the guest:
//! - with its `fault-injection` feature (`guest/src/fault.rs`), for the tenant
//!   isolation tests: a component that loops, grows memory or traps on
//!   request. Its path is `STATESTORE_FAULTY_WASM`.
//! - with its `next-formats` feature: a component that claims an output list
//!   version no host reads, which a host must refuse at load (an upgrade to
//!   it is skipped). Its path is `STATESTORE_NEXT_FORMATS_WASM`.

use std::env;
use std::path::PathBuf;

#[path = "../host/guest_build.rs"]
mod guest_build;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf();
    guest_build::rerun_if_guest_changes(&root);
    println!(
        "cargo:rerun-if-changed={}",
        root.join("host/guest_build.rs").display()
    );
    let wasm = guest_build::build_guest(&root, "guest-wasm-faulty", &["fault-injection"]);
    println!("cargo:rustc-env=STATESTORE_FAULTY_WASM={}", wasm.display());
    let wasm = guest_build::build_guest(&root, "guest-wasm-next-formats", &["next-formats"]);
    println!(
        "cargo:rustc-env=STATESTORE_NEXT_FORMATS_WASM={}",
        wasm.display()
    );
}
