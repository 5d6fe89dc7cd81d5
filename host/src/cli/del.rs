//! `statestore del`.

use anyhow::Result;
use statestore::client;

use super::client::{ClientArgs, session};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The keys.
    #[arg(required = true)]
    keys: Vec<String>,
    /// A fencing token (a lease's version).
    #[arg(long)]
    fencing_token: Option<String>,
}

pub fn run(a: Args) -> Result<u8> {
    let keys = a
        .keys
        .iter()
        .map(|k| a.client.key(k))
        .collect::<Result<Vec<_>>>()?;
    let names = a.keys;
    let ft = a.fencing_token;
    session(&a.client, None, async |c, _out| {
        let mut code = client::OK;
        for (key, name) in keys.iter().zip(&names) {
            if client::del(c, key, None, ft.as_deref()).await? == client::NOT_APPLIED {
                eprintln!("statestore: {name}: nothing deleted: no such key");
                code = client::NOT_APPLIED;
            }
        }
        Ok(code)
    })
}
