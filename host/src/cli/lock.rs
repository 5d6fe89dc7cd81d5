//! `statestore lock`.

use std::time::Duration;

use anyhow::Result;
use statestore::client;

use super::client::{ClientArgs, session};
use super::units::parse_duration_ms;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The lease's key.
    name: String,
    /// How long the lease lasts unless renewed (renewed every half; at
    /// least 100ms; a bare number is ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    ttl: Duration,
    /// How long to wait for the lease (a bare number is ms).
    #[arg(long, alias = "wait-ms", value_name = "DURATION", default_value = "10s", value_parser = parse_duration_ms)]
    wait: Duration,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(a: Args) -> Result<u8> {
    if a.ttl < Duration::from_millis(100) {
        anyhow::bail!("--ttl must be at least 100ms");
    }
    let name = a.client.key(&a.name)?;
    session(&a.client, None, async |c, _out| {
        client::lock(c, &name, a.ttl, a.wait, &a.command).await
    })
}
