//! `statestore bench` and `statestore echo`.

use std::path::PathBuf;

use anyhow::Result;
use statestore::config;
use statestore::mqtt::BrokerUrl;

use super::units::parse_duration_secs;
use super::{parse_url, runtime, shutdown_signal};

/// Where `bench` and `echo` connect, and as whom.
#[derive(clap::Args)]
pub struct Connection {
    /// The broker the store (or echo responder) serves on.
    #[arg(short, long, help_heading = "Connection", value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883", env = "STATESTORE_BROKER")]
    broker: BrokerUrl,
    /// CA certificate (PEM) for `mqtts://` (default: the system's roots).
    #[arg(long, env = "STATESTORE_CA_FILE", help_heading = "Connection")]
    ca_file: Option<PathBuf>,
    /// MQTT user name of every client (e.g. for a server with --users-file).
    #[arg(
        short,
        long,
        requires = "password_file",
        env = "STATESTORE_USERNAME",
        help_heading = "Connection"
    )]
    username: Option<String>,
    /// A file whose first line is that user's password.
    #[arg(
        long,
        requires = "username",
        env = "STATESTORE_PASSWORD_FILE",
        help_heading = "Connection"
    )]
    password_file: Option<PathBuf>,
}

impl Connection {
    fn credentials(&self) -> Result<Option<(String, String)>> {
        Ok(match (&self.username, &self.password_file) {
            (Some(u), Some(p)) => Some((u.clone(), config::read_secret(p)?)),
            _ => None,
        })
    }
}

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    connection: Connection,
    /// Concurrent clients, each with one request in flight.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// How long to run (at most 10m; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_secs)]
    duration: std::time::Duration,
    /// Stop after this many requests in all.
    #[arg(long, default_value_t = 1_000_000)]
    max_requests: u64,
    /// Bytes per SET value.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Distinct keys per client.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Fraction of requests that are GETs (the rest are SETs).
    #[arg(long, default_value_t = 0.0)]
    get_ratio: f64,
    /// What every key written starts with. Default: `bench/<pid>/`.
    #[arg(long)]
    prefix: Option<String>,
    /// Leave the keys written in the store.
    #[arg(long)]
    keep: bool,
    /// Client ids `<PREFIX><n>-<pid>` (client n; default
    /// `bench-<pid>-<n>`): with `client_id_prefixes` of `<PREFIX><n>-`,
    /// each client is a tenant's.
    #[arg(long, value_name = "PREFIX")]
    client_id_prefix: Option<String>,
    /// Request topic: the state store's by default; an echo responder's for a baseline.
    #[arg(long)]
    topic: Option<String>,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.duration > std::time::Duration::from_secs(600) || args.duration.is_zero() {
        anyhow::bail!("--duration must be from 1s to 10m");
    }
    let opts = statestore::bench::BenchOptions {
        credentials: args.connection.credentials()?,
        broker: args.connection.broker,
        clients: args.clients,
        duration: args.duration,
        max_requests: args.max_requests,
        value_size: args.value_size,
        keys: args.keys,
        get_ratio: args.get_ratio.clamp(0.0, 1.0),
        topic: args.topic.unwrap_or_else(statestore::bench::store_topic),
        ca_file: args.connection.ca_file,
        prefix: args
            .prefix
            .unwrap_or_else(|| format!("bench/{}/", std::process::id())),
        cleanup: !args.keep,
        client_id_prefix: args.client_id_prefix,
    };
    let report = runtime()?.block_on(statestore::bench::run(opts))?;
    println!("{}", report.line());
    if let Some(first) = &report.first_error {
        anyhow::bail!(
            "{} of {} requests were answered with an error (counted in the figures above); the first: {first}",
            report.errors,
            report.requests
        );
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct EchoArgs {
    #[command(flatten)]
    connection: Connection,
    /// Topic to answer on.
    #[arg(long, default_value = "bench/echo")]
    topic: String,
}

pub fn echo(args: EchoArgs) -> Result<()> {
    let credentials = args.connection.credentials()?;
    runtime()?.block_on(statestore::bench::echo(
        args.connection.broker,
        args.topic,
        args.connection.ca_file.as_deref(),
        credentials.as_ref(),
        shutdown_signal(),
    ))
}
