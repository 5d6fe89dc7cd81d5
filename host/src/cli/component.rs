//! `statestore component`.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the component (.wasm).
    #[arg(long)]
    out: PathBuf,
    /// A directory to write store.wit and WIRE.md into (created if needed).
    #[arg(long)]
    wit: Option<PathBuf>,
}

/// The WIT and the byte-level contract of the embedded component.
pub const WIT: &str = include_str!("../../../wit/store.wit");
const WIRE: &str = include_str!("../../../wit/WIRE.md");

pub fn run(args: Args) -> Result<()> {
    std::fs::write(&args.out, statestore::GUEST_COMPONENT)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} bytes)",
        args.out.display(),
        statestore::GUEST_COMPONENT.len()
    );
    if let Some(dir) = &args.wit {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, text) in [("store.wit", WIT), ("WIRE.md", WIRE)] {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The version text: this build, the embedded component's sha256 and its
/// WIT package.
pub fn version_text() -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(statestore::GUEST_COMPONENT);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let package = WIT
        .lines()
        .find_map(|l| l.strip_prefix("package ")?.strip_suffix(';'))
        .unwrap_or("statestore:core");
    format!(
        "{} (component sha256 {hex}, {package})",
        env!("CARGO_PKG_VERSION")
    )
}
