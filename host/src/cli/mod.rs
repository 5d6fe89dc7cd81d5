//! The `statestore` command line: one module per subcommand, each with its
//! `Args` and `run`.

mod bench;
mod client;
mod cluster;
mod component;
mod config;
mod del;
mod get;
mod keys;
mod lock;
#[cfg(test)]
mod reference;
mod serve;
mod set;
mod units;
mod vdel;
mod watch;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use statestore::mqtt::BrokerUrl;

/// The MQTT broker state store: the key-value service of Azure IoT Operations,
/// as one WebAssembly component served by a native host.
#[derive(Parser)]
#[command(name = "statestore", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the state store to MQTT5 clients.
    ///
    /// By default starts a complete MQTT5 broker in this process on --listen
    /// (127.0.0.1:1883) with the state store inside it, as Azure IoT
    /// Operations does: point the SDK clients at it. With --broker, serves
    /// through an existing broker instead, as one MQTT client. Logs go to
    /// stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
    Serve(Box<serve::ServeArgs>),
    /// Print a key's value. Exit 0, or 1 if there is none.
    ///
    /// The value is printed alone, as stored (on a terminal, followed by a
    /// newline).
    Get(get::Args),
    /// Set a key and print its new version. Exit 0, or 1 if a condition
    /// (--nx, --nex) kept it.
    ///
    /// The value is VALUE, the content of `@FILE`, or stdin if absent or `-`.
    Set(set::Args),
    /// Delete keys. Exit 0, or 1 if any did not exist.
    ///
    /// Each key that did not exist is named on stderr; the others are
    /// deleted all the same.
    Del(del::Args),
    /// Delete a key only if it holds VALUE. Exit 0, or 1 if not.
    Vdel(vdel::Args),
    /// List the keys that match a glob PATTERN. Exit 0, or 1 if none match.
    ///
    /// The pattern is SCAN's glob (`*`, `?`, `[a-z]`, `[!a]`). Keys are
    /// printed one per line in key order, with a backslash, control
    /// characters and bytes that are not UTF-8 escaped (`\\`, `\n`, `\xHH`),
    /// or as one JSON array with `-o json`. Keys that are not UTF-8 are never
    /// listed.
    Keys(keys::Args),
    /// Print one line per change of the keys, until Ctrl-C.
    ///
    /// Lines are `KEY SET VALUE VERSION` or `KEY DELETE VERSION`, keys and
    /// values escaped as `keys` does (one JSON object per line with `-o
    /// json`), until Ctrl-C or --count lines. Keys are given exactly, or
    /// as glob patterns with --pattern. When
    /// the connection drops, connects again (to the next --broker) and
    /// registers again, saying so on stderr.
    Watch(watch::Args),
    /// Run a command while holding a lease, with its fencing token.
    ///
    /// Take the lease NAME, run COMMAND with its fencing token in
    /// $STATESTORE_FENCING_TOKEN (and $STATESTORE_LOCK_HOLDER), renewing the
    /// lease while it runs, then release it. Exits with the command's code (1
    /// if the lease was not had within --wait, said on stderr).
    Lock(lock::Args),
    /// Operate a cluster of replicas (`serve --cluster`).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Work with config files.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Load a state store and print its throughput and latency.
    ///
    /// Load a state store with N concurrent MQTT5 clients and print ops/s and
    /// p50 / p99 / p99.9 latency. Bounded by --duration and --max-requests.
    /// The keys it writes (`<prefix><client>-<n>`) are deleted when it is done
    /// unless --keep.
    Bench(bench::BenchArgs),
    /// A bare MQTT5 echo responder (the baseline for `bench`).
    ///
    /// A bare MQTT5 echo responder (the baseline for `bench`): replies to
    /// every request on --topic with its own payload.
    Echo(bench::EchoArgs),
    /// Write the component this binary serves (and its WIT).
    ///
    /// Write the state store component this binary serves (its sha256 is in
    /// `statestore --version`), and with --wit its interface (store.wit) and
    /// byte-level contract (WIRE.md): a host in any language can load the very
    /// build this binary serves.
    Component(component::Args),
}

/// Runs the command line `argv`; the process's exit code.
pub fn run(argv: Vec<OsString>) -> ExitCode {
    // The version names the embedded component's hash, computed at start.
    let version: &'static str = Box::leak(component::version_text().into_boxed_str());
    let argv = match config::with_config_file(argv) {
        Ok(argv) => argv,
        Err(e) => return fail(&e, 2),
    };
    let matches = cli_command().version(version).get_matches_from(argv);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Client commands: 0 done, 1 not found / not applied, 2 an error.
    let client = |r: Result<u8>| match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&e, statestore::client::ERROR),
    };
    let done = |r: Result<()>| match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, 1),
    };
    match cli.command {
        Command::Serve(args) => done(serve::run(*args)),
        Command::Get(a) => client(get::run(a)),
        Command::Set(a) => client(set::run(a)),
        Command::Del(a) => client(del::run(a)),
        Command::Vdel(a) => client(vdel::run(a)),
        Command::Keys(a) => client(keys::run(a)),
        Command::Watch(a) => client(watch::run(a)),
        Command::Lock(a) => client(lock::run(a)),
        Command::Cluster(c) => cluster::run(c),
        Command::Config(config::ConfigCommand::Check { file }) => match config::config_check(&file)
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, 2),
        },
        Command::Bench(a) => done(bench::bench(a)),
        Command::Echo(a) => done(bench::echo(a)),
        Command::Component(a) => done(component::run(a)),
    }
}

/// Says `e` on stderr; exit code `code`.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::from(code)
}

/// The command line's parser; `serve` options may be given twice (the
/// config file's first, then the command line's, which win).
fn cli_command() -> clap::Command {
    Cli::command().mut_subcommand("serve", |c| c.args_override_self(true))
}

fn parse_url(s: &str) -> Result<BrokerUrl, String> {
    s.parse()
}

/// `--client-cert` and `--client-key` (clap requires both or neither).
fn client_cert(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Option<statestore::mqtt::ClientCert> {
    Some(statestore::mqtt::ClientCert {
        cert: cert.clone()?,
        key: key.clone()?,
    })
}

/// The runtime of the client commands.
fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
