//! `statestore watch`.

use std::time::Duration;

use anyhow::Result;
use statestore::client::{self, WatchSpec};

use super::client::{ClientArgs, session};
use super::shutdown_signal;
use super::units::parse_duration_ms;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["keys", "pattern"])))]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// The keys (exactly; see --pattern for globs).
    keys: Vec<String>,
    /// Also watch the keys that match this glob pattern (SCAN's: `*`, `?`,
    /// `[a-z]`), found at the start and every --rescan; a key that appears
    /// between two scans is printed as a SET of its value when it is found.
    /// Repeat for more. At most 1,000 keys in all (the store's bound on one
    /// client's registrations).
    #[arg(long, value_name = "PATTERN")]
    pattern: Vec<String>,
    /// How often the patterns are scanned again for new keys (a bare number
    /// is ms).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration_ms)]
    rescan: Duration,
    /// Stop after this many lines.
    #[arg(long)]
    count: Option<u64>,
}

pub fn run(a: Args) -> Result<u8> {
    let spec = WatchSpec {
        keys: a
            .keys
            .iter()
            .map(|k| a.client.key(k))
            .collect::<Result<Vec<_>>>()?,
        // A pattern is text: --hex / --base64 apply to the keys printed.
        patterns: a.pattern.iter().map(|p| p.as_bytes().to_vec()).collect(),
        rescan: a.rescan,
    };
    let (enc, output) = (a.client.encoding(), a.client.output());
    session(&a.client, None, async |c, out| {
        tokio::select! {
            code = client::watch(c, &spec, enc, output, a.count, out) => code,
            () = shutdown_signal() => Ok(client::OK),
        }
    })
}
