//! `statestore`: the MQTT broker state store.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use statestore::cluster::admin;
use statestore::config::{self, Matcher, TenantBroker, TenantSpec};
use statestore::driver::Control;
use statestore::embedded::{BrokerLimits, EmbeddedServer, Route};
use statestore::journal::{Fsync, OnDamage, SnapshotPolicy};
use statestore::mqtt::BrokerUrl;
use statestore::serve::{ClientEvents, ServeOptions, Server};
use statestore::store::StoreOptions;
use statestore::tenant::{ComponentSource, Fleet, Tenant, WASM32_MAX_MEMORY, component_hash};
use statestore::{KeyMatch, Persist, ScanPage, StoreLimits, cache};
use statestore_guest::types::Quota;
use tokio::sync::mpsc;

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
    Serve(Box<ServeArgs>),
    /// Load a state store with N concurrent MQTT5 clients and print ops/s and
    /// p50 / p99 / p99.9 latency. Bounded by --duration and --max-requests.
    Bench(BenchArgs),
    /// A bare MQTT5 echo responder (the baseline for `bench`): replies to
    /// every request on --topic with its own payload.
    Echo(EchoArgs),
    /// Write the state store component this binary serves (its sha256 is in
    /// `statestore --version`), and with --wit its interface (store.wit) and
    /// byte-level contract (WIRE.md): a host in any language can load the
    /// very build this binary serves.
    Component(ComponentArgs),
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a key's value (alone, as stored). Exit 0, or 1 if there is none.
    Get(GetArgs),
    /// Set a key (VALUE, `@FILE`, or stdin if absent or `-`) and print its
    /// new version. Exit 0, or 1 if a condition (--nx, --nex) kept it.
    Set(SetArgs),
    /// Delete a key. Exit 0, or 1 if there was none.
    Del(DelArgs),
    /// Delete a key only if it holds VALUE. Exit 0, or 1 if not.
    Vdel(VdelArgs),
    /// List the keys that match a glob PATTERN (SCAN; `*`, `?`, `[a-z]`,
    /// `[!a]`), one per line, in key order. Exit 0, or 1 if none match.
    /// Keys that are not UTF-8 are never listed.
    Keys(KeysArgs),
    /// Print one line per change of the keys (`KEY SET VALUE VERSION` or
    /// `KEY DELETE VERSION`) until Ctrl-C (or --count lines).
    Watch(WatchArgs),
    /// Operate a cluster of replicas (`serve --cluster`).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Take the lease NAME, run COMMAND with its fencing token in
    /// $STATESTORE_FENCING_TOKEN (and $STATESTORE_LOCK_HOLDER), renewing the
    /// lease while it runs, then release it. Exits with the command's code
    /// (1 if the lease was not had within --wait-ms).
    Lock(LockArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a config file (its `[serve]` options, and its tenants if it
    /// declares any) and print the settings `serve --config FILE` would run
    /// with. Exit 0 if valid, 2 with the reason (and line) if not.
    Check {
        /// The config file.
        file: PathBuf,
    },
}

/// How the client commands reach the store.
#[derive(clap::Args, Debug, Clone)]
struct ClientArgs {
    /// The broker the store serves on: `mqtt://HOST:PORT` or `mqtts://HOST:PORT`.
    #[arg(long, value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883", env = "STATESTORE_BROKER")]
    broker: BrokerUrl,
    /// Our MQTT client id (also the lock holder). Default: statestore-cli-<pid>.
    #[arg(long, env = "STATESTORE_CLIENT_ID")]
    client_id: Option<String>,
    /// MQTT user name.
    #[arg(long, env = "STATESTORE_USERNAME")]
    username: Option<String>,
    /// A file whose first line is the MQTT password.
    #[arg(long, env = "STATESTORE_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
    /// CA certificate (PEM) for `mqtts://` (default: the system's roots).
    #[arg(long, env = "STATESTORE_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Our client certificate chain (PEM), for a broker that authenticates
    /// clients by certificate (`mqtts://` only; with --client-key).
    #[arg(
        long,
        value_name = "FILE",
        requires = "client_key",
        env = "STATESTORE_CLIENT_CERT"
    )]
    client_cert: Option<PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(
        long,
        value_name = "FILE",
        requires = "client_cert",
        env = "STATESTORE_CLIENT_KEY"
    )]
    client_key: Option<PathBuf>,
    /// How long to wait for the broker and for each reply, ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    /// Keys and values are hexadecimal on the command line and in the output.
    #[arg(long, conflicts_with = "base64")]
    hex: bool,
    /// Keys and values are base64 on the command line and in the output.
    #[arg(long)]
    base64: bool,
}

#[derive(clap::Args)]
struct KeysArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The glob pattern the whole key must match.
    #[arg(default_value = "*")]
    pattern: String,
}

#[derive(clap::Args)]
struct GetArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
}

#[derive(clap::Args)]
struct SetArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
    /// The value; `@FILE` reads a file; absent or `-` reads stdin.
    value: Option<String>,
    /// Only if the key does not exist.
    #[arg(long, conflicts_with = "nex")]
    nx: bool,
    /// Only if the key does not exist or holds this value.
    #[arg(long)]
    nex: bool,
    /// The key expires after this many ms.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    px: Option<u64>,
    /// A fencing token (a lease's version, `WALL:COUNTER:NODE`).
    #[arg(long)]
    fencing_token: Option<String>,
    /// Keep the key across a restart under `--persist flagged` or `custom`
    /// (`aio-persistence: true`).
    #[arg(long)]
    persist: bool,
}

#[derive(clap::Args)]
struct DelArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
    /// A fencing token (a lease's version).
    #[arg(long)]
    fencing_token: Option<String>,
}

#[derive(clap::Args)]
struct VdelArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The key.
    key: String,
    /// The value it must hold; `@FILE` reads a file.
    value: String,
}

#[derive(clap::Args)]
struct WatchArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The keys.
    #[arg(required = true)]
    keys: Vec<String>,
    /// Stop after this many lines.
    #[arg(long)]
    count: Option<u64>,
}

#[derive(clap::Args)]
struct LockArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The lease's key.
    name: String,
    /// How long the lease lasts unless renewed, ms (renewed every half).
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..))]
    ttl: u64,
    /// How long to wait for the lease, ms.
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct ComponentArgs {
    /// Where to write the component (.wasm).
    #[arg(long)]
    out: PathBuf,
    /// A directory to write store.wit and WIRE.md into (created if needed).
    #[arg(long)]
    wit: Option<PathBuf>,
}

/// The WIT and the byte-level contract of the embedded component.
const WIT: &str = include_str!("../../wit/store.wit");
const WIRE: &str = include_str!("../../wit/WIRE.md");

/// The version text: this build, the embedded component's sha256 and its WIT
/// package.
fn version_text() -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(statestore::GUEST_COMPONENT);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let package = WIT
        .lines()
        .find_map(|l| l.strip_prefix("package ")?.strip_suffix(';'))
        .unwrap_or("statestore:core");
    format!(
        "{} (component sha256 {hex}, {package})",
        env!("CARGO_PKG_VERSION")
    )
}

fn component(args: ComponentArgs) -> Result<()> {
    std::fs::write(&args.out, statestore::GUEST_COMPONENT)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} bytes)",
        args.out.display(),
        statestore::GUEST_COMPONENT.len()
    );
    if let Some(dir) = &args.wit {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, text) in [("store.wit", WIT), ("WIRE.md", WIRE)] {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

#[derive(clap::Args)]
struct BenchArgs {
    /// The broker the store (or echo responder) serves on.
    #[arg(long, value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883", env = "STATESTORE_BROKER")]
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
    /// CA certificate (PEM) for `mqtts://` (default: the system's roots).
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// MQTT user name of every client (e.g. for a server with --users-file).
    #[arg(long, requires = "password_file")]
    username: Option<String>,
    /// A file whose first line is that user's password.
    #[arg(long, requires = "username")]
    password_file: Option<PathBuf>,
}

#[derive(clap::Args)]
struct EchoArgs {
    /// The broker to serve on.
    #[arg(long, value_parser = parse_url, default_value = "mqtt://127.0.0.1:1883", env = "STATESTORE_BROKER")]
    broker: BrokerUrl,
    /// Topic to answer on.
    #[arg(long, default_value = "bench/echo")]
    topic: String,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Print each replica's role, term, commit and applied index, and its
    /// lag behind the leader. Exit 0 if a leader is known and a majority
    /// answered, else 1.
    Status(ClusterStatusArgs),
    /// Add a replica to a running cluster (through its leader). Start the
    /// new replica with `join = true` in its cluster file and an empty data
    /// directory (before or after this); it catches up from the leader's
    /// snapshot. One change at a time.
    Add(ClusterAddArgs),
    /// Remove a replica from a running cluster (through its leader; a
    /// leader hands the leadership over first). The removed replica stops.
    /// To replace a dead machine: remove it, then add its successor.
    Remove(ClusterRemoveArgs),
    /// Bring back a replica whose Raft log was lost or damaged (it refuses
    /// to start, saying so), while the others serve: with the replica
    /// stopped, its log and snapshot are moved aside (`discarded-*`), its
    /// term and vote kept, and the leader removes it and adds it back.
    /// Then start it as before: it catches up from the leader's snapshot.
    Rejoin(ClusterRejoinArgs),
    /// Make the cluster's certificates for mutual TLS between replicas:
    /// in the cluster file's `tls_dir`, a CA (`ca.pem`, `ca.key`), a
    /// certificate and key per replica (`replica-<id>.pem`, `.key`) and
    /// one for these tools (`operator.pem`, `.key`). Only what is missing
    /// is made; run it again with `--id` before adding a replica.
    Certs(ClusterCertsArgs),
}

#[derive(clap::Args)]
struct ClusterCertsArgs {
    /// A cluster file with `tls_dir` (its replicas get certificates).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// Also a certificate for this replica id (one about to be added);
    /// may be given more than once.
    #[arg(long)]
    id: Vec<u64>,
}

#[derive(clap::Args)]
struct ClusterRejoinArgs {
    /// The cluster file of the replica to bring back (its data directory
    /// is reset; the others are asked to remove it and add it back).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
}

#[derive(clap::Args)]
struct ClusterAddArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The new replica's id (not a member's, never 0).
    #[arg(long)]
    id: u64,
    /// Where the new replica listens for the others.
    #[arg(long, value_name = "ADDR")]
    raft: std::net::SocketAddr,
    /// Where its embedded broker listens for clients (for `cluster status`).
    #[arg(long, value_name = "ADDR")]
    mqtt: Option<std::net::SocketAddr>,
}

#[derive(clap::Args)]
struct ClusterRemoveArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The id of the replica to remove.
    #[arg(long)]
    id: u64,
}

#[derive(clap::Args)]
struct ClusterStatusArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
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
    /// (`STATESTORE_SERVE_BROKER`: the client commands' `STATESTORE_BROKER`
    /// never makes a server external.)
    #[arg(long, env = "STATESTORE_SERVE_BROKER", value_parser = parse_url)]
    broker: Option<BrokerUrl>,

    /// Our MQTT client id. Keep it stable: the broker keeps queued requests in
    /// this client's session while the server restarts.
    #[arg(long, env = "STATESTORE_SERVE_CLIENT_ID", default_value = "statestore")]
    client_id: String,

    /// MQTT user name.
    #[arg(long, env = "STATESTORE_SERVE_USERNAME")]
    username: Option<String>,

    /// File holding the MQTT password (safer than a command-line argument).
    #[arg(long, env = "STATESTORE_SERVE_PASSWORD_FILE")]
    password_file: Option<PathBuf>,

    /// CA certificate (PEM) to verify the broker with (mqtts:// only); the
    /// system roots when absent.
    #[arg(long)]
    ca_file: Option<PathBuf>,

    /// Our client certificate chain (PEM), for a --broker that
    /// authenticates clients by certificate (mqtts:// only; with
    /// --client-key). Not --client-ca, which is the embedded broker's.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,

    /// The private key (PEM) of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,

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

    /// Start even if the log is damaged before its end (a corrupt record
    /// with valid records after it): keep what precedes the damage. The
    /// damaged segment is copied aside first. Without it such a start is
    /// refused, and nothing is changed.
    #[arg(long)]
    recover_damaged_log: bool,

    /// Which keys survive a restart: `all`, `flagged` (only keys set with
    /// `aio-persistence: true`), `custom` (those, and keys that match
    /// --persist-keys) or `none` (volatile). Default: `all` with
    /// --data-dir, else `none`.
    #[arg(long, value_enum)]
    persist: Option<PersistArg>,

    /// With `--persist custom`: keys that persist, by glob pattern
    /// (`pattern:sensors/*`, or just `sensors/*`), exact string
    /// (`string:config`) or base64 binary key (`binary:AAEC`). Repeat the
    /// flag for more. A key matches when it is set; it stays persisted
    /// until set again.
    #[arg(long, value_name = "KEY", value_parser = parse_key_match_arg)]
    persist_keys: Vec<KeyMatch>,

    /// Serve Prometheus metrics on `http://ADDR/metrics`, with `/healthz`
    /// (200 while every tenant serves) and `/readyz` (200 once recovery is
    /// done and the broker listener is up, or the broker subscription is
    /// made). Off by default; e.g. `127.0.0.1:9464`.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,

    /// Which response topics are answered: `any` valid topic, or only
    /// `sdk` ones, `clients/<requester>/...` as the Azure IoT Operations
    /// SDKs make them (others get `-ERR not authorized`), so that the
    /// store never publishes where its requester could not claim to
    /// receive. Either way, a request whose response topic has that shape
    /// must name its own requester there (unless the embedded broker
    /// vouches for the client id).
    #[arg(long, value_enum, default_value_t = ResponseTopics::Any)]
    response_topics: ResponseTopics,

    /// Most keys in one SCAN page.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    scan_page_keys: u32,

    /// Most KiB of keys in one SCAN page (a page holds at least one key).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    scan_page_kib: u32,

    /// When writes reach the disk: `always` (before the reply; concurrent
    /// requests share one fsync), `everysec` (a crash loses at most ~1 s) or
    /// `no` (the OS decides).
    #[arg(long, value_enum, default_value_t = Fsync::Always)]
    fsync: Fsync,

    /// Volatile store (`--persist none`): do not keep a journal in memory.
    /// With it (the default) a guest that fails restarts with everything it
    /// acknowledged, for about twice the state's size again in memory (see
    /// BENCHMARKS.md); without it, it restarts empty.
    #[arg(long)]
    no_memory_journal: bool,

    /// Snapshot and truncate the log after this many MiB of log.
    #[arg(long, default_value_t = 64)]
    snapshot_log_mib: u64,

    /// ... or after this many seconds, if anything was written.
    #[arg(long, default_value_t = 300)]
    snapshot_interval: u64,

    /// Serve this component instead of the built-in one. SIGHUP reads it
    /// again and, if it changed, switches to it while serving (hot upgrade).
    #[arg(long)]
    component: Option<PathBuf>,

    /// Serve as one replica of a cluster: this TOML file names
    /// this replica (`id`), its `data_dir`, the shared `secret_file` and
    /// every `[[replica]]` (`id`, `raft` address for the other replicas,
    /// `mqtt` address of its embedded broker, where it listens). Writes are
    /// acknowledged once a majority has them (durable under --fsync).
    /// `scripts/cluster` starts three on loopback; see the book's
    /// cluster chapter (docs/src/cluster.md). With
    /// --broker, the replicas share the request topic through one MQTT5
    /// shared subscription (`$share/statestore/...`), each as client
    /// `<--client-id>-<id>`.
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER", conflicts_with_all = ["config", "data_dir"])]
    cluster: Option<PathBuf>,

    /// Serve the tenants declared in this TOML file: each an isolated store
    /// with its own guest instance, journal and limits (see docs/src/tenants.md).
    /// SIGHUP reads it again and applies new components and limits.
    #[arg(long, env = "STATESTORE_CONFIG")]
    config: Option<PathBuf>,

    /// Largest MQTT packet accepted, MiB: the embedded broker's limit for
    /// every client; with --broker, the most the broker may send us.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=255))]
    max_packet_mib: u32,

    /// Longest value a SET may write, MiB (without --config; tenants have
    /// `max_value_bytes`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_value_mib: u64,

    /// Longest key a SET may create, KiB (without --config; tenants have
    /// `max_key_bytes`). It bounds what matching one key against a SCAN
    /// pattern can cost.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_key_kib: u64,

    /// Linear memory cap of the store's guest, MiB (without --config;
    /// tenants have `memory_mib`). A guest that needs more fails and
    /// restarts from its journal.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=4096))]
    memory_mib: u64,

    /// Most bytes of keys and values the store holds, MiB (without --config);
    /// a SET that would create a key past it gets the quota error. Default
    /// and most: a third of --memory-mib (the state, a snapshot of it and
    /// the work of a call all live in the guest's memory).
    #[arg(long)]
    max_bytes_mib: Option<u64>,

    /// Longest session expiry a client of the embedded broker may ask for,
    /// seconds (a longer one is cut to it).
    #[arg(long, default_value_t = 86_400)]
    max_session_expiry: u64,

    /// Most messages queued for one session of the embedded broker (an
    /// offline or slow client); past it the oldest are dropped.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    max_queued: u64,

    /// Most bytes one session of the embedded broker holds (queued and
    /// unacknowledged messages, MiB); a message that would go past it is
    /// dropped for that session (logged at debug, counted). The default
    /// lets a client have 60 replies of 8 MiB in flight at once.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_queued_mib: u64,

    /// Most MiB all sessions of the embedded broker hold together (queued
    /// and unacknowledged messages, parked sessions' too); a message past it
    /// is dropped for the session it was for (counted as `queued_total` in
    /// `statestore_broker_refused_total`).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_queued_total_mib: u64,

    /// Most sessions the embedded broker holds, connected or parked (a
    /// persistent session whose client is away); a CONNECT that would start
    /// one more gets CONNACK 0x97 "quota exceeded" (0: no bound).
    #[arg(long, default_value_t = 20_000)]
    max_sessions: u64,

    /// Most sessions whose last connection came from one IP address,
    /// connected or parked; past it as --max-sessions (0: no bound).
    #[arg(long, default_value_t = 1_000)]
    max_sessions_per_address: u64,

    /// Most failed logins a minute from one IP address (a bucket refilled
    /// at this rate): past it, that address's CONNECTs get CONNACK 0x9F
    /// "connection rate exceeded" without their password being judged,
    /// until the bucket refills (0: no bound).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32))]
    max_failed_logins: u32,

    /// Most connections at once that have not yet sent their CONNECT (or
    /// finished their TLS handshake); one more is closed at accept (0: no
    /// bound).
    #[arg(long, default_value_t = 1_000)]
    max_pending_connections: u64,

    /// Most of those from one IP address (0: no bound).
    #[arg(long, default_value_t = 100)]
    max_pending_per_address: u64,

    /// Seconds a connection has from accept to finish its TLS handshake and
    /// send its whole CONNECT; then it is closed.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    connect_timeout_secs: u64,

    /// Most connections the embedded broker holds at once.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,

    /// Most connections at once from one IP address (0: no limit); one
    /// more is refused (CONNACK "not authorized") and logged.
    #[arg(long, default_value_t = 256)]
    max_connections_per_address: u64,

    /// Most MiB of requests waiting for a store: past it, publishers wait
    /// (their connections are not read) until the store catches up.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4095))]
    inbound_mib: u64,

    /// Embedded broker: most topics holding a retained message; a retained
    /// PUBLISH on one more topic gets PUBACK "quota exceeded" (0x97).
    /// With --data-dir they are kept across restarts (retained.json).
    #[arg(long, default_value_t = 10_000)]
    max_retained: u64,

    /// Embedded broker: most MiB of retained messages (topics, payloads and
    /// properties); past it, as --max-retained.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=4095))]
    max_retained_mib: u64,

    /// Embedded broker: every client must give the user name and password
    /// of a user in this file, in the format `mosquitto_passwd` writes
    /// (`$7$` PBKDF2-SHA512 or `$6$` SHA-512). A client id held by an
    /// authenticated user cannot be taken by another while it is connected.
    #[arg(long)]
    users_file: Option<PathBuf>,

    /// Authorization rules: the `BrokerAuthorization` policy rules of Azure
    /// IoT Operations (principals, brokerResources, stateStoreResources),
    /// in YAML (the resource as it is) or TOML (`.toml`); see docs/src/security.md.
    /// Only what a rule allows is allowed. The embedded broker checks
    /// Connect, Publish and Subscribe; the store checks keys in every mode.
    /// SIGHUP reads it again.
    #[arg(long, value_name = "FILE")]
    authorization: Option<PathBuf>,

    /// Embedded broker: also listen with TLS on this address (beside the
    /// plain --listen), with --tls-cert and --tls-key. E.g. `0.0.0.0:8883`.
    #[arg(long, value_name = "ADDR", requires_all = ["tls_cert", "tls_key"])]
    tls_listen: Option<SocketAddr>,

    /// The TLS listener's certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_cert: Option<PathBuf>,

    /// The TLS listener's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_key: Option<PathBuf>,

    /// Clients of the TLS listener must present a certificate signed by a
    /// CA in this file (PEM); the handshake refuses the others.
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    client_ca: Option<PathBuf>,

    /// Listen beyond loopback even though the listener lacks TLS or
    /// authentication for every client: anyone who can reach the port can
    /// read and write every key. Without it, a plain --listen beyond
    /// loopback, or a --tls-listen beyond loopback with neither
    /// --users-file nor --client-ca, is refused (Redis' protected mode),
    /// and so is a cluster replica's raft address beyond loopback (the
    /// links between replicas are not encrypted).
    #[arg(long)]
    allow_insecure: bool,

    /// Embedded broker: keep `clients/<id>/...` to client `<id>` alone (as
    /// is, or in upper-case hex): nobody else may publish there or subscribe
    /// to a filter that can reach it (`#`, `clients/+/...`). Without it only
    /// the store's own streams there are protected (its replies and
    /// notifications reach only their client, and nobody can forge them),
    /// and clients may answer each other on `clients/<id>/...` (RPC).
    #[arg(long)]
    strict_client_topics: bool,

    /// Longest time one call into the guest may run, in ms, before the
    /// call is stopped and the store restarted (without --config).
    #[arg(long, default_value_t = config::DEFAULT_CALL_MS, value_parser = clap::value_parser!(u64).range(1..))]
    call_ms: u64,

    /// Do not keep or use the precompiled component cache
    /// ($STATESTORE_CACHE_DIR, $XDG_CACHE_HOME/statestore or ~/.cache/statestore).
    #[arg(long)]
    no_cache: bool,
}

/// `--response-topics` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ResponseTopics {
    Any,
    Sdk,
}

/// `--persist` values.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PersistArg {
    All,
    Flagged,
    Custom,
    None,
}

fn parse_key_match_arg(s: &str) -> Result<KeyMatch, String> {
    statestore::store::parse_key_match(s).map_err(|e| format!("{e:#}"))
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
    // The version names the embedded component's hash, computed at start.
    let version: &'static str = Box::leak(version_text().into_boxed_str());
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match with_config_file(argv) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let matches = cli_command().version(version).get_matches_from(argv);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let client = |run: fn(Command) -> Result<u8>, command| match run(command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(statestore::client::ERROR)
        }
    };
    let result = match cli.command {
        c @ (Command::Get(_)
        | Command::Set(_)
        | Command::Del(_)
        | Command::Vdel(_)
        | Command::Keys(_)
        | Command::Watch(_)
        | Command::Lock(_)) => return client(run_client, c),
        Command::Config(ConfigCommand::Check { file }) => {
            return match config_check(&file) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Serve(args) => serve(*args),
        Command::Cluster(ClusterCommand::Status(args)) => {
            return match admin::status(&args.cluster) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Cluster(ClusterCommand::Add(args)) => {
            admin::add(&args.cluster, args.id, args.raft, args.mqtt)
        }
        Command::Cluster(ClusterCommand::Remove(args)) => admin::remove(&args.cluster, args.id),
        Command::Cluster(ClusterCommand::Rejoin(args)) => admin::rejoin(&args.cluster),
        Command::Cluster(ClusterCommand::Certs(args)) => admin::certs(&args.cluster, &args.id),
        Command::Bench(args) => bench(args),
        Command::Echo(args) => echo(args),
        Command::Component(args) => component(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line's parser; `serve` options may be given twice (the
/// config file's first, then the command line's, which win).
fn cli_command() -> clap::Command {
    Cli::command().mut_subcommand("serve", |c| c.args_override_self(true))
}

/// `argv` with the `[serve]` options of the file of `serve --config FILE`
/// put before the command line's own (which override them). Unknown keys
/// are an error with their line.
fn with_config_file(argv: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>> {
    let Ok(matches) = cli_command().try_get_matches_from(&argv) else {
        return Ok(argv); // the real parse reports it
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(argv);
    };
    let Some(path) = serve.get_one::<PathBuf>("config") else {
        return Ok(argv);
    };
    let file_args = config_file_args(path)?;
    let at = argv
        .iter()
        .position(|a| a == "serve")
        .map_or(argv.len(), |i| i + 1);
    let mut merged = argv[..at].to_vec();
    merged.extend(file_args);
    merged.extend_from_slice(&argv[at..]);
    Ok(merged)
}

/// The `serve` flags that the `[serve]` table of `path` sets.
fn config_file_args(path: &std::path::Path) -> Result<Vec<std::ffi::OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let settings = config::serve_settings(&text)
        .with_context(|| format!("in the config file {}", path.display()))?;
    let cmd = cli_command();
    let serve = cmd
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    let mut args = Vec::new();
    for s in settings {
        let known = serve
            .get_arguments()
            .find(|a| a.get_id() == s.key.as_str() && a.get_long().is_some());
        let Some(arg) = known.filter(|_| s.key != "config") else {
            let mut names: Vec<String> = serve
                .get_arguments()
                .filter(|a| a.get_long().is_some() && a.get_id() != "config")
                .map(|a| a.get_id().to_string())
                .collect();
            names.sort();
            anyhow::bail!(
                "in the config file {}, line {}: unknown key {:?} in [serve] (known: {})",
                path.display(),
                s.line,
                s.key,
                names.join(", ")
            );
        };
        let long = format!("--{}", arg.get_long().unwrap_or_default());
        let takes_value = arg.get_action().takes_values();
        match (&s.value, takes_value) {
            (toml::Value::Boolean(true), false) => args.push(long.into()),
            (toml::Value::Boolean(false), false) => {}
            (toml::Value::String(v), true) => {
                args.push(long.into());
                args.push(v.into());
            }
            (toml::Value::Integer(v), true) => {
                args.push(long.into());
                args.push(v.to_string().into());
            }
            (toml::Value::Boolean(v), true) => {
                args.push(long.into());
                args.push(v.to_string().into());
            }
            (other, _) => anyhow::bail!(
                "in the config file {}, line {}: {} = {other} is not a {}",
                path.display(),
                s.line,
                s.key,
                if takes_value {
                    "value"
                } else {
                    "flag (true or false)"
                }
            ),
        }
    }
    Ok(args)
}

/// `statestore config check FILE`.
fn config_check(file: &std::path::Path) -> Result<()> {
    let mut argv: Vec<std::ffi::OsString> = vec![
        "statestore".into(),
        "serve".into(),
        "--config".into(),
        file.into(),
    ];
    argv.extend(config_file_args(file)?);
    let matches = cli_command()
        .try_get_matches_from(&argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?;
    let Some(("serve", m)) = matches.subcommand() else {
        anyhow::bail!("not a serve command line");
    };
    let args = ServeArgs::from_arg_matches(m).map_err(|e| anyhow::anyhow!("{e}"))?;
    check_serve_args(&args)?;
    let password = match &args.password_file {
        Some(p) => Some(config::read_secret(p)?),
        None => None,
    };
    let specs = tenant_specs(&args, password)?;
    println!(
        "# the settings of `statestore serve --config {}`",
        file.display()
    );
    println!("[serve]");
    let cmd = cli_command();
    let serve = cmd
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    for arg in serve.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.get_long().is_none() || id == "config" {
            continue;
        }
        let source = match m.value_source(id) {
            Some(clap::parser::ValueSource::CommandLine) => "file",
            Some(clap::parser::ValueSource::EnvVariable) => "environment",
            _ => "default",
        };
        let value = m
            .get_raw(id)
            .map(|v| {
                v.map(|x| x.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if v.parse::<i64>().is_ok() || v == "true" || v == "false" => {
                println!("{id} = {v}   # {source}");
            }
            Some(v) => println!("{id} = {v:?}   # {source}"),
            None => println!("# {id}: not set"),
        }
    }
    for spec in &specs {
        println!();
        println!("[[tenant]]   # effective");
        println!("name = {:?}", spec.name);
        println!(
            "memory_mib = {}",
            spec.limits.memory_bytes.map_or(4096, |b| b >> 20)
        );
        if let Some(b) = spec.store.quota.max_bytes {
            println!("max_bytes = {b}");
        }
        if let Some(b) = spec.store.quota.max_value_bytes {
            println!("max_value_bytes = {b}");
        }
        if let Some(b) = spec.store.quota.max_key_bytes {
            println!("max_key_bytes = {b}");
        }
        println!(
            "persist = {:?}",
            format!("{:?}", spec.store.persist).to_lowercase()
        );
        if let Some(d) = &spec.store.data_dir {
            println!("data_dir = {:?}", d.display().to_string());
        }
    }
    Ok(())
}

/// The encoding of keys and values on the command line.
fn encoding(a: &ClientArgs) -> statestore::client::Encoding {
    use statestore::client::Encoding;
    if a.hex {
        Encoding::Hex
    } else if a.base64 {
        Encoding::Base64
    } else {
        Encoding::Raw
    }
}

/// A value argument: itself, `@FILE`, or stdin (absent or `-`), decoded.
fn value_arg(value: Option<&str>, enc: statestore::client::Encoding) -> Result<Vec<u8>> {
    use std::io::Read;
    let raw = match value {
        None | Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read stdin")?;
            buf
        }
        Some(v) => match v.strip_prefix('@') {
            Some(path) => std::fs::read(path).with_context(|| format!("cannot read {path}"))?,
            None => v.as_bytes().to_vec(),
        },
    };
    enc.decode(&raw)
}

/// Runs a client command; its exit code.
fn run_client(command: Command) -> Result<u8> {
    use statestore::client::{self, Client, ClientOptions, SetOptions};
    let args = match &command {
        Command::Get(a) => &a.client,
        Command::Set(a) => &a.client,
        Command::Del(a) => &a.client,
        Command::Vdel(a) => &a.client,
        Command::Keys(a) => &a.client,
        Command::Watch(a) => &a.client,
        Command::Lock(a) => &a.client,
        _ => anyhow::bail!("not a client command"),
    }
    .clone();
    let enc = encoding(&args);
    let credentials = match (&args.username, &args.password_file) {
        (Some(u), Some(p)) => Some((u.clone(), config::read_secret(p)?)),
        (Some(u), None) => Some((u.clone(), String::new())),
        (None, Some(_)) => anyhow::bail!("--password-file needs --username"),
        (None, None) => None,
    };
    let opts = ClientOptions {
        broker: args.broker.clone(),
        client_id: args
            .client_id
            .clone()
            .unwrap_or_else(|| format!("statestore-cli-{}", std::process::id())),
        credentials,
        ca_file: args.ca_file.clone(),
        client_cert: client_cert(&args.client_cert, &args.client_key),
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let key = |k: &str| enc.decode(k.as_bytes()).context("the key");
    // What exit code 1 means, said on stderr (stdout stays the data).
    let not_applied = match &command {
        Command::Get(_) => Some("no such key"),
        Command::Set(_) => Some("not set: the condition (--nx or --nex) did not hold"),
        Command::Del(_) => Some("nothing deleted: no such key"),
        Command::Vdel(_) => Some("nothing deleted: no such key, or it holds another value"),
        Command::Keys(_) => Some("no key matches"),
        _ => None,
    };
    let is_get = matches!(command, Command::Get(_));
    runtime()?.block_on(async move {
        let mut c = Client::connect(&opts).await?;
        let mut out = std::io::stdout().lock();
        let code = match command {
            Command::Get(a) => client::get(&mut c, &key(&a.key)?, enc, &mut out).await?,
            Command::Set(a) => {
                let value = value_arg(a.value.as_deref(), enc).context("the value")?;
                let o = SetOptions {
                    nx: a.nx,
                    nex: a.nex,
                    px: a.px,
                    fencing_token: a.fencing_token,
                    persist: a.persist,
                };
                client::set(&mut c, &key(&a.key)?, &value, &o, &mut out).await?
            }
            Command::Del(a) => {
                client::del(&mut c, &key(&a.key)?, None, a.fencing_token.as_deref()).await?
            }
            Command::Vdel(a) => {
                let value = value_arg(Some(&a.value), enc).context("the value")?;
                client::del(&mut c, &key(&a.key)?, Some(&value), None).await?
            }
            // The pattern is text: --hex / --base64 apply to the keys listed.
            Command::Keys(a) => client::keys(&mut c, a.pattern.as_bytes(), enc, &mut out).await?,
            Command::Watch(a) => {
                let keys = a.keys.iter().map(|k| key(k)).collect::<Result<Vec<_>>>()?;
                tokio::select! {
                    code = client::watch(&mut c, &keys, enc, a.count, &mut out) => code?,
                    () = shutdown_signal() => client::OK,
                }
            }
            Command::Lock(a) => {
                client::lock(
                    &mut c,
                    &key(&a.name)?,
                    Duration::from_millis(a.ttl),
                    Duration::from_millis(a.wait_ms),
                    &a.command,
                )
                .await?
            }
            _ => client::ERROR,
        };
        use std::io::{IsTerminal, Write};
        // A value ends its line on a terminal; piped, it is the bytes alone.
        if is_get && code == client::OK && out.is_terminal() {
            out.write_all(b"\n")?;
        }
        out.flush()?;
        c.close().await;
        if code == client::NOT_APPLIED
            && let Some(why) = not_applied
        {
            eprintln!("statestore: {why}");
        }
        Ok(code)
    })
}

/// The one tenant of a server started without --config.
fn cli_tenant(args: &ServeArgs, password: Option<String>) -> TenantSpec {
    let persist = match (args.persist, &args.data_dir) {
        (Some(PersistArg::All), _) | (None, Some(_)) => Persist::All,
        (Some(PersistArg::Flagged), _) => Persist::Flagged,
        (Some(PersistArg::Custom), _) => Persist::Custom,
        (Some(PersistArg::None), _) | (None, None) => Persist::None,
    };
    TenantSpec {
        name: "default".into(),
        default: true,
        matcher: Matcher::default(),
        store: StoreOptions {
            node_id: args.node_id.clone(),
            server_client_id: args.client_id.clone(),
            persist,
            data_dir: args.data_dir.clone(),
            fsync: args.fsync,
            snapshots: SnapshotPolicy {
                max_log_bytes: args.snapshot_log_mib.saturating_mul(1 << 20).max(1),
                max_interval: Duration::from_secs(args.snapshot_interval.max(1)),
                ..SnapshotPolicy::default()
            },
            quota: Quota {
                max_bytes: Some(max_bytes_mib(args).saturating_mul(1 << 20)),
                max_value_bytes: Some(u32::try_from(args.max_value_mib << 20).unwrap_or(u32::MAX)),
                max_key_bytes: Some(u32::try_from(args.max_key_kib << 10).unwrap_or(u32::MAX)),
                ..Quota::default()
            },
            clock: statestore::clock::system(),
            on_damage: if args.recover_damaged_log {
                OnDamage::KeepPrefix
            } else {
                OnDamage::Refuse
            },
            memory_journal: !args.no_memory_journal,
            persist_keys: args.persist_keys.clone(),
            sdk_response_topics: args.response_topics == ResponseTopics::Sdk,
            authorization: None,
            scan_page: ScanPage {
                max_keys: args.scan_page_keys,
                max_bytes: args.scan_page_kib.saturating_mul(1024),
            },
        },
        limits: StoreLimits {
            memory_bytes: Some(usize::try_from(args.memory_mib << 20).unwrap_or(usize::MAX)),
            call_ms: Some(args.call_ms),
        },
        component: match &args.component {
            Some(p) => ComponentSource::File(p.clone()),
            None => ComponentSource::BuiltIn,
        },
        broker: TenantBroker {
            url: args.broker.clone(),
            client_id: args.client_id.clone(),
            username: args.username.clone(),
            password,
        },
    }
}

/// `--max-bytes-mib`, or a third of `--memory-mib`.
fn max_bytes_mib(args: &ServeArgs) -> u64 {
    args.max_bytes_mib.unwrap_or(args.memory_mib / 3)
}

/// The TLS listener the flags ask for.
fn tls_listener(args: &ServeArgs) -> Option<statestore::embedded::TlsListener> {
    Some(statestore::embedded::TlsListener {
        listen: args.tls_listen?,
        cert: args.tls_cert.clone()?,
        key: args.tls_key.clone()?,
        client_ca: args.client_ca.clone(),
    })
}

/// The embedded broker's limits from the flags.
/// `--strict-client-topics`.
fn client_topics(args: &ServeArgs) -> statestore::isolation::ClientTopics {
    if args.strict_client_topics {
        statestore::isolation::ClientTopics::Strict
    } else {
        statestore::isolation::ClientTopics::Open
    }
}

fn broker_limits(args: &ServeArgs) -> BrokerLimits {
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    BrokerLimits {
        max_packet: args.max_packet_mib << 20,
        max_session_expiry: Duration::from_secs(args.max_session_expiry),
        max_queued: usize_of(args.max_queued),
        max_queued_bytes: usize_of(args.max_queued_mib << 20),
        max_connections: usize_of(args.max_connections),
        max_connections_per_address: usize_of(args.max_connections_per_address),
        inbound_bytes: usize_of(args.inbound_mib << 20),
        max_retained: usize_of(args.max_retained),
        max_retained_bytes: usize_of(args.max_retained_mib << 20),
        max_queued_total_bytes: usize_of(args.max_queued_total_mib << 20),
        max_sessions: usize_of(args.max_sessions),
        max_sessions_per_address: usize_of(args.max_sessions_per_address),
        max_failed_logins: args.max_failed_logins,
        max_pending_connections: usize_of(args.max_pending_connections),
        max_pending_per_address: usize_of(args.max_pending_per_address),
        connect_timeout: Duration::from_secs(args.connect_timeout_secs),
    }
}

/// The tenants to serve: from --config, or the one the flags describe.
/// Whether --config names a file that declares tenants (a file may also
/// only set `serve` options).
fn has_tenants(args: &ServeArgs) -> bool {
    args.config
        .as_ref()
        .is_some_and(|p| std::fs::read_to_string(p).is_ok_and(|t| config::has_tenants(&t)))
}

fn tenant_specs(args: &ServeArgs, password: Option<String>) -> Result<Vec<TenantSpec>> {
    let mut specs = tenant_specs_without_policy(args, password)?;
    if let Some(policy) = load_policy(args)? {
        for spec in &mut specs {
            spec.store.authorization = Some(policy.store_rules());
        }
    }
    Ok(specs)
}

/// The `--authorization` file, if any.
fn load_policy(args: &ServeArgs) -> Result<Option<statestore::policy::Policy>> {
    args.authorization
        .as_deref()
        .map(statestore::policy::Policy::load)
        .transpose()
}

fn tenant_specs_without_policy(
    args: &ServeArgs,
    password: Option<String>,
) -> Result<Vec<TenantSpec>> {
    let tenants = args.config.as_ref().filter(|_| has_tenants(args));
    match tenants {
        Some(path) => {
            let mut specs = config::load(path, &args.client_id)?;
            for spec in &mut specs {
                // Broker credentials default to the command line's.
                if spec.broker.username.is_none() {
                    spec.broker.username.clone_from(&args.username);
                    spec.broker.password.clone_from(&password);
                }
                if args.recover_damaged_log {
                    spec.store.on_damage = OnDamage::KeepPrefix;
                }
            }
            Ok(specs)
        }
        None => Ok(vec![cli_tenant(args, password)]),
    }
}

/// What a running tenant was last set up with.
struct Running {
    spec: TenantSpec,
    component: u64,
    control: mpsc::UnboundedSender<Control>,
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

/// What clap cannot check of the `serve` flags alone.
fn check_serve_args(args: &ServeArgs) -> Result<()> {
    if !has_tenants(args) && max_bytes_mib(args) > args.memory_mib / 3 {
        anyhow::bail!(
            "--max-bytes-mib {} is more than a third of --memory-mib {}: the keys and values, a snapshot of them and the work of a call all live in the guest's memory; raise --memory-mib (at most 4096) or lower --max-bytes-mib",
            max_bytes_mib(args),
            args.memory_mib
        );
    }
    if args.client_cert.is_some() && args.broker.is_none() {
        anyhow::bail!(
            "--client-cert is the certificate of our connection to --broker; the embedded broker asks its clients for certificates with --client-ca"
        );
    }
    if !args.persist_keys.is_empty() && !matches!(args.persist, Some(PersistArg::Custom)) {
        anyhow::bail!("--persist-keys needs --persist custom (it says which keys that mode keeps)");
    }
    if u64::from(args.scan_page_kib) * 1024 >= u64::from(args.max_packet_mib) << 20 {
        anyhow::bail!(
            "--scan-page-kib {} does not fit a packet of --max-packet-mib {}: a SCAN page must",
            args.scan_page_kib,
            args.max_packet_mib
        );
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let password = match &args.password_file {
        Some(p) => Some(config::read_secret(p)?),
        None => None,
    };
    check_serve_args(&args)?;
    if args.broker.is_none() && !args.listen.ip().is_loopback() && !args.allow_insecure {
        anyhow::bail!(
            "refusing to listen on {} without TLS: anyone who can reach this address could read \
             and write every key. Listen on loopback (the default, 127.0.0.1:1883) and serve \
             others with --tls-listen ADDR --tls-cert FILE --tls-key FILE and --users-file or \
             --client-ca, or serve through a broker with TLS and authentication \
             (--broker mqtts://...), or pass --allow-insecure to do it anyway",
            args.listen
        );
    }
    if let Some(at) = args.tls_listen
        && !at.ip().is_loopback()
        && args.users_file.is_none()
        && args.client_ca.is_none()
        && !args.allow_insecure
    {
        anyhow::bail!(
            "refusing to listen with TLS on {at} without authentication: anyone who can reach \
             it could read and write every key. Add --users-file (passwords) or --client-ca \
             (client certificates), or pass --allow-insecure to do it anyway"
        );
    }
    statestore::process::raise_open_files_limit();
    if let Some(path) = args.cluster.clone() {
        return serve_cluster(args, &path);
    }
    let specs = tenant_specs(&args, password.clone())?;
    let policy_cell = statestore::policy::PolicyCell::new(load_policy(&args)?);
    if args.authorization.is_some() && args.broker.is_some() {
        tracing::info!(
            "--authorization with --broker: the store checks keys; Connect, Publish and Subscribe are the broker's to check"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Metrics first, so that /readyz says "starting" during recovery.
    let metrics = match args.metrics {
        Some(addr) => {
            let metrics = statestore::metrics::Metrics::new()?;
            let at = rt.block_on(metrics.serve(addr))?;
            tracing::info!(metrics = %format!("http://{at}/metrics"), "metrics listening");
            Some(metrics)
        }
        None => None,
    };
    let max_memory = specs
        .iter()
        .map(|s| s.limits.memory_bytes.unwrap_or(WASM32_MAX_MEMORY))
        .max()
        .unwrap_or(WASM32_MAX_MEMORY);
    let cache_dir = cache::default_dir().filter(|_| !args.no_cache);
    let mut fleet = Fleet::new(specs.len(), max_memory, cache_dir)?;
    let started = std::time::Instant::now();
    let mut tenants = Vec::new();
    for spec in &specs {
        let wasm = spec.component.read()?;
        let runtime = fleet
            .runtime_from_bytes(&wasm, spec.limits)
            .with_context(|| format!("cannot load {}", spec.component))?;
        let mut tenant = Tenant::open(&spec.name, runtime, &spec.store)?;
        if let Some(m) = &metrics {
            tenant.set_metrics(m.tenant(&spec.name));
        }
        tenants.push((spec.clone(), component_hash(&wasm), tenant));
    }
    if specs.len() > 1 {
        tracing::info!(
            tenants = specs.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "tenants started"
        );
    }
    let Some(default_broker) = args.broker.clone() else {
        return rt.block_on(async move {
            let mut with_routes = Vec::new();
            let mut running = Vec::new();
            for (spec, hash, tenant) in tenants {
                let route = Route {
                    matcher: spec.matcher.clone(),
                    default: spec.default,
                };
                with_routes.push((tenant, route));
                running.push((spec, hash));
            }
            let users = match &args.users_file {
                Some(path) => Some(statestore::users::UsersCell::new(
                    statestore::users::Users::load(path)?,
                )),
                None => None,
            };
            let server = EmbeddedServer::start_tenants_with(
                args.listen,
                &args.client_id,
                with_routes,
                statestore::embedded::BrokerOptions {
                    limits: broker_limits(&args),
                    users: users.clone(),
                    connections: metrics.as_ref().map(|m| m.connections().clone()),
                    queue_dropped: metrics.as_ref().map(|m| m.queue_dropped().clone()),
                    refused: metrics.as_ref().map(|m| m.broker_refused().clone()),
                    policy: Some(policy_cell.clone()),
                    tls: tls_listener(&args),
                    client_topics: client_topics(&args),
                    data_dir: args.data_dir.clone(),
                },
            )
            .await?;
            if let Some(m) = &metrics {
                m.set_ready();
            }
            let running = running
                .into_iter()
                .zip(server.tenants())
                .map(|((spec, component), h)| Running {
                    spec,
                    component,
                    control: h.control.clone(),
                })
                .collect();
            let reloads = Reloads {
                policy: policy_cell,
                tls: server.tls(),
                users,
            };
            spawn_reloader(args, password, fleet, running, reloads)?;
            server.run(shutdown_signal()).await
        });
    };
    rt.block_on(async move {
        let mut servers = Vec::new();
        let mut running = Vec::new();
        for (spec, component, tenant) in tenants {
            let opts = ServeOptions {
                broker: spec
                    .broker
                    .url
                    .clone()
                    .unwrap_or_else(|| default_broker.clone()),
                client_id: spec.broker.client_id.clone(),
                username: spec.broker.username.clone(),
                password: spec.broker.password.clone(),
                ca_file: args.ca_file.clone(),
                client_cert: client_cert(&args.client_cert, &args.client_key),
                keep_alive: Duration::from_secs(args.keep_alive),
                session_expiry: Duration::from_secs(args.session_expiry),
                max_packet: args.max_packet_mib << 20,
                connect_timeout: Duration::from_secs(args.connect_timeout),
                client_events: args.client_events,
                store: spec.store.clone(),
                shared_group: None,
            };
            let server = Server::connect_tenant(tenant, opts)
                .await
                .with_context(|| format!("tenant {:?}", spec.name))?;
            running.push(Running {
                control: server.control(),
                spec,
                component,
            });
            servers.push(server);
        }
        if let Some(m) = &metrics {
            m.set_ready();
        }
        let reloads = Reloads {
            policy: policy_cell,
            tls: None,
            users: None,
        };
        spawn_reloader(args, password, fleet, running, reloads)?;
        let runs: Vec<_> = servers
            .into_iter()
            .map(|server| {
                let name = server.tenant_name().to_string();
                let run = move |stopped: Pin<Box<dyn Future<Output = ()> + Send>>| {
                    Box::pin(server.run(stopped))
                        as Pin<Box<dyn Future<Output = Result<()>> + Send>>
                };
                (name, run)
            })
            .collect();
        statestore::driver::supervise(runs, shutdown_signal()).await
    })
}

/// `serve --cluster`: one replica, on its embedded broker.
fn serve_cluster(args: ServeArgs, path: &std::path::Path) -> Result<()> {
    use statestore::cluster::node::{ClusterFile, Node, Notify};
    let file = ClusterFile::load(path)?;
    let secret = file.secret()?;
    let listen = file.me().mqtt.unwrap_or(args.listen);
    let raft = file.me().raft;
    if !raft.ip().is_loopback() && file.tls_dir.is_none() && !args.allow_insecure {
        anyhow::bail!(
            "refusing to listen for replicas on {raft} without TLS: the links between replicas would be plain TCP and their hello would carry the secret in clear, so anyone on the path could read every key and value, and replay a hello to change the membership; add `tls_dir` to the cluster files and run `statestore cluster certs` (or keep raft addresses on loopback, or add --allow-insecure on a network only the replicas can reach)"
        );
    }
    if args.broker.is_none()
        && !listen.ip().is_loopback()
        && !args.allow_insecure
        && args.users_file.is_none()
    {
        anyhow::bail!(
            "refusing to listen on {listen} without authentication: anyone who can reach it could read and write every key (add --users-file, or --allow-insecure)"
        );
    }
    let spec = cli_tenant(&args, None);
    let mut spec_store = spec.store.clone();
    if let Some(policy) = load_policy(&args)? {
        spec_store.authorization = Some(policy.store_rules());
    }
    let mut guest = statestore::store::guest_config(&spec_store);
    // The Raft log is the journal; every replica applies alike.
    guest.persist = statestore::Persist::None;
    guest.hash_seed = ClusterFile::hash_seed(&secret);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cache_dir = cache::default_dir().filter(|_| !args.no_cache);
    // Calls bounded by fuel: a request that fails the guest fails it on
    // every replica alike (a poison entry, skipped by all).
    let mut fleet = Fleet::for_replica(
        spec.limits.memory_bytes.unwrap_or(WASM32_MAX_MEMORY),
        cache_dir,
    )?;
    let wasm = spec.component.read()?;
    let runtime = fleet
        .runtime_from_bytes(&wasm, spec.limits)
        .with_context(|| format!("cannot load {}", spec.component))?;
    let password = match &args.password_file {
        Some(p) => Some(config::read_secret(p)?),
        None => None,
    };
    rt.block_on(async move {
        let metrics = match args.metrics {
            Some(addr) => {
                let metrics = statestore::metrics::Metrics::new()?;
                let at = metrics.serve(addr).await?;
                tracing::info!(metrics = %format!("http://{at}/metrics"), "metrics listening");
                Some(metrics)
            }
            None => None,
        };
        let notify = if args.broker.is_some() {
            Notify::Origin
        } else {
            Notify::Everywhere
        };
        let node = Node::open(
            &file,
            runtime,
            guest,
            args.fsync,
            statestore::clock::system(),
            notify,
        )
        .await?;
        let mut node = node;
        if let Some(m) = &metrics {
            node.set_metrics(m.replica()?, m.tenant("default"));
            m.set_ready();
        }
        if let Some(broker) = args.broker.clone() {
            let client_id = format!("{}-{}", args.client_id, file.id);
            let opts = ServeOptions {
                broker,
                client_id: client_id.clone(),
                username: args.username.clone(),
                password,
                ca_file: args.ca_file.clone(),
                client_cert: client_cert(&args.client_cert, &args.client_key),
                keep_alive: Duration::from_secs(args.keep_alive),
                // No session outlives a replica's connection: the broker
                // gives its share of the requests to the replicas that are
                // up (a kept session would queue them for a dead one).
                session_expiry: Duration::ZERO,
                max_packet: args.max_packet_mib << 20,
                connect_timeout: Duration::from_secs(args.connect_timeout),
                client_events: args.client_events,
                store: spec_store,
                shared_group: Some("statestore".into()),
            };
            return statestore::serve::serve_replica(node, opts, shutdown_signal()).await;
        }
        let users = match &args.users_file {
            Some(path) => Some(statestore::users::UsersCell::new(
                statestore::users::Users::load(path)?,
            )),
            None => None,
        };
        if let (Some(cell), Some(path)) = (&users, &args.users_file) {
            spawn_users_reloader(cell.clone(), path.clone())?;
        }
        let policy_cell = statestore::policy::PolicyCell::new(load_policy(&args)?);
        let server = EmbeddedServer::start_replica(
            listen,
            &args.client_id,
            node,
            statestore::embedded::BrokerOptions {
                limits: broker_limits(&args),
                users,
                connections: metrics.as_ref().map(|m| m.connections().clone()),
                queue_dropped: metrics.as_ref().map(|m| m.queue_dropped().clone()),
                refused: metrics.as_ref().map(|m| m.broker_refused().clone()),
                policy: Some(policy_cell),
                tls: tls_listener(&args),
                client_topics: client_topics(&args),
                // A replica's broker keeps its retained messages in memory.
                data_dir: None,
            },
        )
        .await?;
        server.run(shutdown_signal()).await
    })
}

/// What SIGHUP reads again besides the tenants.
struct Reloads {
    policy: std::sync::Arc<statestore::policy::PolicyCell>,
    tls: Option<statestore::embedded::TlsReload>,
    users: Option<std::sync::Arc<statestore::users::UsersCell>>,
}

/// Reads `--users-file` again into `cell`, or keeps the users in force.
fn reload_users(cell: &statestore::users::UsersCell, path: &std::path::Path) {
    match cell.reload(path) {
        Ok(n) => {
            tracing::info!(users = n, file = %path.display(), "users file reloaded: new connections are checked against it")
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "users file reload failed; the users in force stay")
        }
    }
}

/// A replica's SIGHUP: reads `--users-file` again.
fn spawn_users_reloader(
    cell: std::sync::Arc<statestore::users::UsersCell>,
    path: PathBuf,
) -> Result<()> {
    #[cfg(unix)]
    {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot listen for SIGHUP")?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reload_users(&cell, &path);
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (cell, path);
    Ok(())
}

/// On SIGHUP: load the TLS listener's certificate files and the users file
/// again, read the config (or --component) again and move every tenant
/// whose component or limits changed to the new ones while it serves (see
/// `Tenant::upgrade`). Compiling happens on this thread, not a server's.
fn spawn_reloader(
    args: ServeArgs,
    password: Option<String>,
    mut fleet: Fleet,
    mut running: Vec<Running>,
    reloads: Reloads,
) -> Result<()> {
    let Reloads { policy, tls, users } = reloads;
    #[cfg(unix)]
    {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot listen for SIGHUP")?;
        let runtime = tokio::runtime::Handle::current();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
        std::thread::Builder::new()
            .name("statestore-reload".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    tracing::info!("SIGHUP: reloading components and limits");
                    // The certificate first, whatever else fails.
                    if let Some(tls) = &tls {
                        match runtime.block_on(tls.reload()) {
                            Ok(()) => tracing::info!(listen = %tls.local_addr(), "TLS certificate reloaded: new connections get it; connected clients keep theirs"),
                            Err(e) => tracing::error!(error = %format!("{e:#}"), "TLS reload failed; the listener keeps its certificate"),
                        }
                    }
                    if let (Some(cell), Some(path)) = (&users, &args.users_file) {
                        reload_users(cell, path);
                    }
                    if let Err(e) = reload(&args, password.clone(), &mut fleet, &mut running, &policy) {
                        tracing::error!(error = %format!("{e:#}"), "reload failed; everything keeps running as it was");
                    }
                }
            })
            .context("cannot start the reload thread")?;
    }
    #[cfg(not(unix))]
    let _ = (args, password, fleet, running, policy, tls, users);
    Ok(())
}

fn reload(
    args: &ServeArgs,
    password: Option<String>,
    fleet: &mut Fleet,
    running: &mut [Running],
    policy: &statestore::policy::PolicyCell,
) -> Result<()> {
    // The authorization file first: a broken one changes nothing.
    let new_policy = load_policy(args)?;
    let specs = tenant_specs(args, password)?;
    if args.authorization.is_some() {
        policy.set(new_policy);
        tracing::info!(file = %args.authorization.as_deref().map(|p| p.display().to_string()).unwrap_or_default(), "authorization rules reloaded: the broker's apply to the next connect, publish and subscribe");
    }
    for r in running.iter_mut() {
        let Some(spec) = specs.iter().find(|s| s.name == r.spec.name) else {
            continue;
        };
        if spec.store.authorization == r.spec.store.authorization {
            continue;
        }
        let (done, outcome) = tokio::sync::oneshot::channel();
        let sent = r.control.send(Control::Authorize {
            rules: spec.store.authorization.clone(),
            done,
        });
        if sent.is_err() {
            continue;
        }
        match outcome.blocking_recv() {
            Ok(Ok(())) => {
                tracing::info!(tenant = %spec.name, "authorization rules of the keys reloaded");
                r.spec.store.authorization = spec.store.authorization.clone();
            }
            Ok(Err(e)) => {
                tracing::error!(tenant = %spec.name, error = %format!("{e:#}"), "the tenant refused the authorization rules; it keeps the old ones")
            }
            Err(_) => tracing::warn!(tenant = %spec.name, "the tenant stopped during the reload"),
        }
    }
    for spec in &specs {
        if !running.iter().any(|r| r.spec.name == spec.name) {
            tracing::warn!(tenant = %spec.name, "a new tenant takes a restart to start");
        }
    }
    for r in running.iter_mut() {
        let Some(spec) = specs.iter().find(|s| s.name == r.spec.name) else {
            tracing::warn!(tenant = %r.spec.name, "a removed tenant keeps running until a restart");
            continue;
        };
        let wasm = match spec.component.read() {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(tenant = %spec.name, error = %format!("{e:#}"), "upgrade skipped");
                continue;
            }
        };
        let hash = component_hash(&wasm);
        let same_limits = spec.limits == r.spec.limits && spec.store.quota == r.spec.store.quota;
        if hash == r.component && same_limits {
            continue;
        }
        let runtime = match fleet.runtime_from_bytes(&wasm, spec.limits) {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(tenant = %spec.name, component = %spec.component, error = %format!("{e:#}"), "upgrade skipped");
                continue;
            }
        };
        let (done, outcome) = tokio::sync::oneshot::channel();
        let sent = r.control.send(Control::Upgrade {
            runtime,
            quota: spec.store.quota,
            done,
        });
        if sent.is_err() {
            tracing::warn!(tenant = %spec.name, "the tenant is not running");
            continue;
        }
        match outcome.blocking_recv() {
            Ok(Ok(())) => {
                tracing::info!(tenant = %spec.name, component = %spec.component, hash = format!("{hash:016x}"), "upgraded");
                r.component = hash;
                r.spec.limits = spec.limits;
                r.spec.store.quota = spec.store.quota;
            }
            Ok(Err(_)) => {} // logged by the tenant
            Err(_) => tracing::warn!(tenant = %spec.name, "the tenant stopped during the upgrade"),
        }
    }
    Ok(())
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
        ca_file: args.ca_file,
        credentials: match (args.username, args.password_file) {
            (Some(u), Some(p)) => Some((u, config::read_secret(&p)?)),
            _ => None,
        },
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
