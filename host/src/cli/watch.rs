//! `statestore watch`.

use anyhow::Result;
use statestore::client;

use super::client::{ClientArgs, session};
use super::shutdown_signal;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The keys.
    #[arg(required = true)]
    keys: Vec<String>,
    /// Stop after this many lines.
    #[arg(long)]
    count: Option<u64>,
}

pub fn run(a: Args) -> Result<u8> {
    let keys = a
        .keys
        .iter()
        .map(|k| a.client.key(k))
        .collect::<Result<Vec<_>>>()?;
    let (enc, output) = (a.client.encoding(), a.client.output());
    session(&a.client, None, async |c, out| {
        tokio::select! {
            code = client::watch(c, &keys, enc, output, a.count, out) => code,
            () = shutdown_signal() => Ok(client::OK),
        }
    })
}
