//! Builds the guest crate as a `wasm32-wasip2` component with a nested cargo:
//! shared by the build scripts of `host/` (the component it embeds) and
//! `tests/` (a variant with deliberate faults for the isolation tests).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest's target.
pub const TARGET: &str = "wasm32-wasip2";
/// The cargo profile the guest is built with (in the workspace Cargo.toml).
pub const PROFILE: &str = "guest";

/// Tells cargo to run the build script again when the guest's sources change.
pub fn rerun_if_guest_changes(root: &Path) {
    for path in [
        "guest/src",
        "guest/Cargo.toml",
        "wit",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
}

/// Builds the guest with `features` into `<target>/<dir_name>` (its own
/// target dir: sharing the outer one deadlocks on its lock) and returns the
/// path of the component.
pub fn build_guest(root: &Path, dir_name: &str, features: &[&str]) -> PathBuf {
    let target_root = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target_dir = target_root.join(dir_name);

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--package", "statestore-guest", "--lib"])
        .args(["--target", TARGET, "--profile", PROFILE])
        .arg("--target-dir")
        .arg(&target_dir);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
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
    wasm
}
