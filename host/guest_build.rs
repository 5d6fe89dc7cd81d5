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

/// Whether the active toolchain's sysroot has the standard library for
/// [`TARGET`]. `None` when rustc cannot be asked.
fn target_installed() -> Option<bool> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Some(
        sysroot
            .join("lib/rustlib")
            .join(TARGET)
            .join("lib")
            .is_dir(),
    )
}

/// Installs [`TARGET`] through rustup when the active toolchain lacks it.
///
/// rustup adds the targets of `rust-toolchain.toml` only when it installs the
/// toolchain itself; a machine whose toolchain was already there (most CI
/// images) has no `wasm32-wasip2`. So the build adds it, and says so. Two
/// build scripts (host and tests) may race here: rustup serialises its own
/// installs, and a failed attempt is checked again before it counts.
pub fn ensure_target() {
    if target_installed() != Some(false) {
        return;
    }
    println!(
        "cargo:warning=the {TARGET} target is missing from the active toolchain; \
         installing it with `rustup target add {TARGET}` (once)"
    );
    for attempt in 0..3 {
        // RUSTUP_TOOLCHAIN is set by the rustup proxy that started cargo, so
        // the target goes to the toolchain that builds the guest.
        let status = Command::new("rustup")
            .args(["target", "add", TARGET])
            .status();
        if target_installed() == Some(true) {
            return;
        }
        match status {
            Err(e) => panic!(
                "\n\nThe {TARGET} target is not installed, and rustup could not be run ({e}).\n\
                 Install the target for this toolchain, or set \
                 STATESTORE_GUEST_WASM_OVERRIDE to a prebuilt component.\n"
            ),
            Ok(s) if attempt == 2 => panic!(
                "\n\n`rustup target add {TARGET}` failed ({s}); the guest component cannot \
                 be built without it.\n"
            ),
            Ok(_) => std::thread::sleep(std::time::Duration::from_secs(2)),
        }
    }
}

/// Builds the guest with `features` into `<target>/<dir_name>` (its own
/// target dir: sharing the outer one deadlocks on its lock) and returns the
/// path of the component. Installs the wasm target first if it is missing.
pub fn build_guest(root: &Path, dir_name: &str, features: &[&str]) -> PathBuf {
    ensure_target();
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
                 (the build tried to add it through rustup and could not.)\n\n{stderr}"
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
