//! Builds the guest component (`guest/`) for `wasm32-wasip2` with a nested
//! cargo and its own target dir, so that a plain `cargo build` / `cargo test`
//! at the workspace root always has an up-to-date `.wasm`.
//!
//! Its path is handed to the crate as `STATESTORE_GUEST_WASM`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "guest";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("host/ is inside the workspace")
        .to_path_buf();
    for path in [
        "guest/src",
        "guest/Cargo.toml",
        "wit",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=STATESTORE_GUEST_WASM_OVERRIDE");

    // Escape hatch for packagers: use a prebuilt component.
    if let Ok(path) = env::var("STATESTORE_GUEST_WASM_OVERRIDE") {
        println!("cargo:rustc-env=STATESTORE_GUEST_WASM={path}");
        return;
    }

    // Our own target dir: sharing the outer one deadlocks on its lock.
    let target_root = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target_dir = target_root.join("guest-wasm");

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--package", "statestore-guest", "--lib"])
        .args(["--target", TARGET, "--profile", PROFILE])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's flags and wrappers (clippy, coverage, sanitizers) are
    // for native code, not for the guest.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd
        .output()
        .expect("could not run cargo to build the guest component");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("target may not be installed")
            || stderr.contains("can't find crate for `core`")
            || stderr.contains("can't find crate for `std`")
        {
            panic!(
                "\n\nThe {TARGET} target is not installed, so the guest component cannot be built.\n\
                 Install it with:\n\n    rustup target add {TARGET}\n\n\
                 (rust-toolchain.toml lists it, so rustup normally adds it by itself.)\n\n{stderr}"
            );
        }
        panic!("building the guest component failed:\n{stderr}");
    }
    let wasm = target_dir
        .join(TARGET)
        .join(PROFILE)
        .join("statestore_guest.wasm");
    assert!(
        wasm.exists(),
        "the guest build did not produce {}",
        wasm.display()
    );
    println!("cargo:rustc-env=STATESTORE_GUEST_WASM={}", wasm.display());
}
