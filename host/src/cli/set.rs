//! `statestore set`.

use anyhow::{Context, Result};
use statestore::client::{self, SetOptions};

use super::client::{ClientArgs, session, value_arg};
use super::units::parse_duration_ms;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
    /// The value; `@FILE` reads a file; absent or `-` reads stdin.
    value: Option<String>,
    /// Only if the key does not exist.
    #[arg(long, conflicts_with = "nex")]
    nx: bool,
    /// Only if the key does not exist or holds this value.
    #[arg(long)]
    nex: bool,
    /// The key expires after this long (`30s`, `1500ms`; a bare number is ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    px: Option<std::time::Duration>,
    /// A fencing token (a lease's version, `WALL:COUNTER:NODE`).
    #[arg(long)]
    fencing_token: Option<String>,
    /// Keep the key across a restart under `--persist flagged` or `custom`
    /// (`aio-persistence: true`).
    #[arg(long)]
    persist: bool,
}

pub fn run(a: Args) -> Result<u8> {
    let enc = a.client.encoding();
    let key = a.client.key(&a.key)?;
    let value = value_arg(a.value.as_deref(), enc).context("the value")?;
    let px = match a.px {
        Some(d) if d.is_zero() => anyhow::bail!("--px must be at least 1ms"),
        Some(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => None,
    };
    let o = SetOptions {
        nx: a.nx,
        nex: a.nex,
        px,
        fencing_token: a.fencing_token,
        persist: a.persist,
    };
    session(
        &a.client,
        Some("not set: the condition (--nx or --nex) did not hold"),
        async |c, out| client::set(c, &key, &value, &o, out).await,
    )
}
