//! `statestore get`.

use std::io::{IsTerminal, Write};

use anyhow::Result;
use statestore::client::{self, Output};

use super::client::{ClientArgs, session};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
}

pub fn run(a: Args) -> Result<u8> {
    let key = a.client.key(&a.key)?;
    let (enc, output) = (a.client.encoding(), a.client.output());
    session(&a.client, Some("no such key"), async |c, out| {
        let code = client::get(c, &key, enc, output, out).await?;
        // A value ends its line on a terminal; piped, it is the bytes alone.
        if code == client::OK && output == Output::Text && out.is_terminal() {
            out.write_all(b"\n")?;
        }
        Ok(code)
    })
}
