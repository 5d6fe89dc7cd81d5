//! `statestore`: the MQTT broker state store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use statestore::embedded::{EmbeddedOptions, EmbeddedServer};
use statestore::journal::{Fsync, SnapshotPolicy};
use statestore::mqtt::BrokerUrl;
use statestore::serve::{ClientEvents, ServeOptions, Server};
use statestore::store::StoreOptions;
use statestore::{Persist, Runtime, cache};

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
    Serve(ServeArgs),
    /// Load a state store with N concurrent MQTT5 clients and print ops/s and
    /// p50 / p99 / p99.9 latency. Bounded by --duration and --max-requests.
    Bench(BenchArgs),
    /// A bare MQTT5 echo responder (the baseline for `bench`): replies to
    /// every request on --topic with its own payload.
    Echo(EchoArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// The broker the store (or echo responder) serves on.
    #[arg(long, value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883")]
    broker: BrokerUrl,
    /// Concurrent clients, each with one request in flight.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds to run (at most 600).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    duration: u64,
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
    /// Request topic: the state store's by default; an echo responder's for a baseline.
    #[arg(long)]
    topic: Option<String>,
}

#[derive(clap::Args)]
struct EchoArgs {
    /// The broker to serve on.
    #[arg(long, value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883")]
    broker: BrokerUrl,
    /// Topic to answer on.
    #[arg(long, default_value = "bench/echo")]
    topic: String,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address of the embedded broker (when no --broker is given).
    #[arg(
        long,
        env = "STATESTORE_LISTEN",
        default_value = "127.0.0.1:1883",
        conflicts_with = "broker"
    )]
    listen: SocketAddr,

    /// Serve through this broker instead of the embedded one:
    /// mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS.
    #[arg(long, env = "STATESTORE_BROKER", value_parser = parse_url)]
    broker: Option<BrokerUrl>,

    /// Our MQTT client id. Keep it stable: the broker keeps queued requests in
    /// this client's session while the server restarts.
    #[arg(long, env = "STATESTORE_CLIENT_ID", default_value = "statestore")]
    client_id: String,

    /// MQTT user name.
    #[arg(long, env = "STATESTORE_USERNAME")]
    username: Option<String>,

    /// File holding the MQTT password (safer than a command-line argument).
    #[arg(long, env = "STATESTORE_PASSWORD_FILE")]
    password_file: Option<PathBuf>,

    /// CA certificate (PEM) to verify the broker with (mqtts:// only); the
    /// system roots when absent.
    #[arg(long)]
    ca_file: Option<PathBuf>,

    /// Node id of the hybrid logical clock in every version this store
    /// issues. Keep it stable across restarts.
    #[arg(long, env = "STATESTORE_NODE_ID", default_value = "StateStore")]
    node_id: String,

    /// MQTT keep-alive, in seconds (at least 5).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=65535))]
    keep_alive: u64,

    /// How long the broker keeps our session and queued requests while we are
    /// away, in seconds.
    #[arg(long, default_value_t = 3600)]
    session_expiry: u64,

    /// Give up if the broker does not answer within this many seconds at start.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,

    /// How to learn that clients disconnected, so that their KEYNOTIFY
    /// registrations are dropped: `mosquitto-log` needs `log_dest topic` in
    /// mosquitto.conf; `emqx` uses EMQX's system topics.
    #[arg(long, value_enum, default_value_t = ClientEvents::None)]
    client_events: ClientEvents,

    /// Keep the store on disk in this directory (a write-ahead log and
    /// snapshots); it is recovered from there at start.
    #[arg(long, env = "STATESTORE_DATA_DIR")]
    data_dir: Option<PathBuf>,

    /// Which keys survive a restart: `all`, `flagged` (only keys set with
    /// `aio-persistence: true`) or `none` (volatile). Default: `all` with
    /// --data-dir, else `none`.
    #[arg(long, value_enum)]
    persist: Option<PersistArg>,

    /// When writes reach the disk: `always` (before the reply; concurrent
    /// requests share one fsync), `everysec` (a crash loses at most ~1 s) or
    /// `no` (the OS decides).
    #[arg(long, value_enum, default_value_t = Fsync::Always)]
    fsync: Fsync,

    /// Snapshot and truncate the log after this many MiB of log.
    #[arg(long, default_value_t = 64)]
    snapshot_log_mib: u64,

    /// ... or after this many seconds, if anything was written.
    #[arg(long, default_value_t = 300)]
    snapshot_interval: u64,

    /// Serve this component instead of the built-in one.
    #[arg(long)]
    component: Option<PathBuf>,

    /// Do not keep or use the precompiled component cache
    /// ($STATESTORE_CACHE_DIR, $XDG_CACHE_HOME/statestore or ~/.cache/statestore).
    #[arg(long)]
    no_cache: bool,
}

/// `--persist` values.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PersistArg {
    All,
    Flagged,
    None,
}

fn parse_url(s: &str) -> Result<BrokerUrl, String> {
    s.parse()
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // rmqtt logs every connection at info.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,rmqtt=warn,rmqtt_net=warn")
                }),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: not in log files or journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench(args),
        Command::Echo(args) => echo(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_runtime(args: &ServeArgs) -> Result<Runtime> {
    let wasm = match &args.component {
        Some(path) => std::fs::read(path)
            .with_context(|| format!("cannot read the component {}", path.display()))?,
        None => statestore::GUEST_COMPONENT.to_vec(),
    };
    let what = args
        .component
        .as_ref()
        .map_or("the built-in component".to_string(), |p| {
            p.display().to_string()
        });
    let runtime = match cache::default_dir().filter(|_| !args.no_cache) {
        Some(dir) => Runtime::from_bytes_cached(&wasm, &dir),
        None => Runtime::from_bytes(&wasm),
    };
    runtime.with_context(|| format!("cannot load {what}"))
}

fn serve(args: ServeArgs) -> Result<()> {
    let password = match &args.password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the password file {}", p.display()))?
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        ),
        None => None,
    };
    let runtime = load_runtime(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let persist = match (args.persist, &args.data_dir) {
        (Some(PersistArg::All), _) | (None, Some(_)) => Persist::All,
        (Some(PersistArg::Flagged), _) => Persist::Flagged,
        (Some(PersistArg::None), _) | (None, None) => Persist::None,
    };
    let store = StoreOptions {
        node_id: args.node_id.clone(),
        server_client_id: args.client_id.clone(),
        persist,
        data_dir: args.data_dir.clone(),
        fsync: args.fsync,
        snapshots: SnapshotPolicy {
            max_log_bytes: args.snapshot_log_mib.saturating_mul(1 << 20).max(1),
            max_interval: Duration::from_secs(args.snapshot_interval.max(1)),
        },
    };
    let Some(broker) = args.broker.clone() else {
        let opts = EmbeddedOptions {
            listen: args.listen,
            store,
        };
        return rt.block_on(async move {
            let server = EmbeddedServer::start(&runtime, opts).await?;
            server.run(shutdown_signal()).await
        });
    };
    let opts = ServeOptions {
        broker,
        client_id: args.client_id,
        username: args.username,
        password,
        ca_file: args.ca_file,
        keep_alive: Duration::from_secs(args.keep_alive),
        session_expiry: Duration::from_secs(args.session_expiry),
        connect_timeout: Duration::from_secs(args.connect_timeout),
        client_events: args.client_events,
        store,
    };
    rt.block_on(async move {
        let server = Server::connect(&runtime, opts).await?;
        server.run(shutdown_signal()).await
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn bench(args: BenchArgs) -> Result<()> {
    let opts = statestore::bench::BenchOptions {
        broker: args.broker,
        clients: args.clients,
        duration: Duration::from_secs(args.duration),
        max_requests: args.max_requests,
        value_size: args.value_size,
        keys: args.keys,
        get_ratio: args.get_ratio.clamp(0.0, 1.0),
        topic: args.topic.unwrap_or_else(statestore::bench::store_topic),
    };
    let report = runtime()?.block_on(statestore::bench::run(opts))?;
    println!("{}", report.line());
    Ok(())
}

fn echo(args: EchoArgs) -> Result<()> {
    runtime()?.block_on(statestore::bench::echo(
        args.broker,
        args.topic,
        shutdown_signal(),
    ))
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
