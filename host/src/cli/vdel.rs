//! `statestore vdel`.

use anyhow::{Context, Result};
use statestore::client;

use super::client::{ClientArgs, session, value_arg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
    /// The value it must hold; `@FILE` reads a file.
    value: String,
}

pub fn run(a: Args) -> Result<u8> {
    let key = a.client.key(&a.key)?;
    let value = value_arg(Some(&a.value), a.client.encoding()).context("the value")?;
    session(
        &a.client,
        Some("nothing deleted: no such key, or it holds another value"),
        async |c, _out| client::del(c, &key, Some(&value), None).await,
    )
}
