//! `statestore keys`.

use anyhow::Result;
use statestore::client;

use super::client::{ClientArgs, session};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The glob pattern the whole key must match.
    #[arg(default_value = "*")]
    pattern: String,
}

pub fn run(a: Args) -> Result<u8> {
    let (enc, output) = (a.client.encoding(), a.client.output());
    // The pattern is text: --hex / --base64 apply to the keys listed.
    let pattern = a.pattern.into_bytes();
    session(&a.client, Some("no key matches"), async |c, out| {
        client::keys(c, &pattern, enc, output, out).await
    })
}
