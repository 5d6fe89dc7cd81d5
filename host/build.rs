//! Builds the guest component (`guest/`) for `wasm32-wasip2` with a nested
//! cargo and its own target dir, so that a plain `cargo build` / `cargo test`
//! at the workspace root always has an up-to-date `.wasm`.
//!
//! Its path is handed to the crate as `STATESTORE_GUEST_WASM`.

use std::env;
use std::path::PathBuf;

#[path = "guest_build.rs"]
mod guest_build;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("host/ is inside the workspace")
        .to_path_buf();
    guest_build::rerun_if_guest_changes(&root);
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("guest_build.rs").display()
    );
    println!("cargo:rerun-if-env-changed=STATESTORE_GUEST_WASM_OVERRIDE");

    // Escape hatch for packagers: use a prebuilt component.
    if let Ok(path) = env::var("STATESTORE_GUEST_WASM_OVERRIDE") {
        println!("cargo:rustc-env=STATESTORE_GUEST_WASM={path}");
        return;
    }
    let wasm = guest_build::build_guest(&root, "guest-wasm", &[]);
    println!("cargo:rustc-env=STATESTORE_GUEST_WASM={}", wasm.display());
}
