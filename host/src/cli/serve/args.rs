//! The options of `statestore serve`, from flags, environment and the
//! config file's `[serve]` table (see `super::super::config`), with one set
//! of defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use statestore::KeyMatch;
use statestore::mqtt::BrokerUrl;
use statestore::store::journal::Fsync;
use statestore::transport::external::ClientEvents;

use crate::cli::parse_url;
use crate::cli::units::{parse_duration_ms, parse_duration_secs, parse_size_kib, parse_size_mib};

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// Address of the embedded broker (when no --broker is given).
    #[arg(
        help_heading = "Network",
        long,
        env = "STATESTORE_LISTEN",
        default_value = "127.0.0.1:1883",
        conflicts_with = "broker"
    )]
    pub listen: SocketAddr,

    /// Threads that serve connections and run the stores [default: 1]. One
    /// thread runs everything: no hand-offs between threads, the least CPU
    /// per request and the most requests a second on a small machine
    /// (BENCHMARKS.md; a cluster replica syncs its log on a thread of the
    /// blocking pool, serving its clients and links meanwhile, or in place
    /// while it leads nothing and serves no client). More let TLS
    /// connections, many clients and several tenants use more cores. Each
    /// tenant's store is one guest either way.
    #[arg(help_heading = "Network", long, env = "STATESTORE_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,

    /// Serve through this broker instead of the embedded one:
    /// mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS.
    /// (`STATESTORE_SERVE_BROKER`: the client commands' `STATESTORE_BROKER`
    /// never makes a server external.)
    #[arg(help_heading = "Network", long, env = "STATESTORE_SERVE_BROKER", value_parser = parse_url)]
    pub broker: Option<BrokerUrl>,

    /// Our MQTT client id. Keep it stable: the broker keeps queued requests in
    /// this client's session while the server restarts.
    #[arg(
        help_heading = "Network",
        long,
        env = "STATESTORE_SERVE_CLIENT_ID",
        default_value = "statestore"
    )]
    pub client_id: String,

    /// MQTT user name.
    #[arg(help_heading = "Network", long, env = "STATESTORE_SERVE_USERNAME")]
    pub username: Option<String>,

    /// File holding the MQTT password (safer than a command-line argument).
    #[arg(help_heading = "Network", long, env = "STATESTORE_SERVE_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,

    /// CA certificate (PEM) to verify the broker with (mqtts:// only); the
    /// system roots when absent.
    #[arg(help_heading = "Network", long)]
    pub ca_file: Option<PathBuf>,

    /// Our client certificate chain (PEM), for a --broker that
    /// authenticates clients by certificate (mqtts:// only; with
    /// --client-key). Not --client-ca, which is the embedded broker's.
    #[arg(
        help_heading = "Network",
        long,
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,

    /// The private key (PEM) of --client-cert.
    #[arg(
        help_heading = "Network",
        long,
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,

    /// MQTT keep-alive (5s to 18h; a bare number is seconds).
    #[arg(help_heading = "Network", long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_secs)]
    pub keep_alive: Duration,

    /// How long the broker keeps our session and queued requests while we are
    /// away (a bare number is seconds).
    #[arg(help_heading = "Network", long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration_secs)]
    pub session_expiry: Duration,

    /// Give up if the broker does not answer within this long at start (a
    /// bare number is seconds).
    #[arg(help_heading = "Network", long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration_secs)]
    pub connect_timeout: Duration,

    /// How to learn that clients disconnected, so that their KEYNOTIFY
    /// registrations are dropped: `mosquitto-log` needs `log_dest topic` in
    /// mosquitto.conf; `emqx` uses EMQX's system topics.
    #[arg(help_heading = "Network", long, value_enum, default_value_t = ClientEvents::None)]
    pub client_events: ClientEvents,

    /// Embedded broker: also listen with TLS on this address (beside the
    /// plain --listen), with --tls-cert and --tls-key. E.g. `0.0.0.0:8883`.
    #[arg(help_heading = "TLS and authentication", long, value_name = "ADDR", requires_all = ["tls_cert", "tls_key"])]
    pub tls_listen: Option<SocketAddr>,

    /// The TLS listener's certificate chain (PEM).
    #[arg(
        help_heading = "TLS and authentication",
        long,
        value_name = "FILE",
        requires = "tls_listen"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The TLS listener's private key (PEM).
    #[arg(
        help_heading = "TLS and authentication",
        long,
        value_name = "FILE",
        requires = "tls_listen"
    )]
    pub tls_key: Option<PathBuf>,

    /// Clients of the TLS listener must present a certificate signed by a
    /// CA in this file (PEM); the handshake refuses the others.
    #[arg(
        help_heading = "TLS and authentication",
        long,
        value_name = "FILE",
        requires = "tls_listen"
    )]
    pub client_ca: Option<PathBuf>,

    /// Embedded broker: every client must give the user name and password
    /// of a user in this file, in the format `mosquitto_passwd` writes
    /// (`$7$` PBKDF2-SHA512 or `$6$` SHA-512). A client id held by an
    /// authenticated user cannot be taken by another while it is connected.
    #[arg(help_heading = "TLS and authentication", long)]
    pub users_file: Option<PathBuf>,

    /// Authorization rules: the `BrokerAuthorization` policy rules of Azure
    /// IoT Operations (principals, brokerResources, stateStoreResources),
    /// in YAML (the resource as it is) or TOML (`.toml`); see docs/src/security.md.
    /// Only what a rule allows is allowed. The embedded broker checks
    /// Connect, Publish and Subscribe; the store checks keys in every mode.
    /// SIGHUP reads it again.
    #[arg(help_heading = "TLS and authentication", long, value_name = "FILE")]
    pub authorization: Option<PathBuf>,

    /// Listen beyond loopback even though the listener lacks TLS or
    /// authentication for every client: anyone who can reach the port can
    /// read and write every key. Without it, a plain --listen beyond
    /// loopback, or a --tls-listen beyond loopback with neither
    /// --users-file nor --client-ca, is refused (Redis' protected mode),
    /// and so is a cluster replica's raft address beyond loopback (the
    /// links between replicas are not encrypted).
    #[arg(help_heading = "TLS and authentication", long)]
    pub allow_insecure: bool,

    /// Embedded broker: keep `clients/<id>/...` to client `<id>` alone (as
    /// is, or in upper-case hex): nobody else may publish there or subscribe
    /// to a filter that can reach it (`#`, `clients/+/...`). Without it only
    /// the store's own streams there are protected (its replies and
    /// notifications reach only their client, and nobody can forge them),
    /// and clients may answer each other on `clients/<id>/...` (RPC).
    #[arg(help_heading = "TLS and authentication", long)]
    pub strict_client_topics: bool,

    /// Which response topics are answered: `any` valid topic, or only
    /// `sdk` ones, `clients/<requester>/...` as the Azure IoT Operations
    /// SDKs make them (others get `-ERR not authorized`), so that the
    /// store never publishes where its requester could not claim to
    /// receive. Either way, a request whose response topic has that shape
    /// must name its own requester there (unless the embedded broker
    /// vouches for the client id).
    #[arg(help_heading = "TLS and authentication", long, value_enum, default_value_t = ResponseTopics::Any)]
    pub response_topics: ResponseTopics,

    /// Keep the store on disk in this directory (a write-ahead log and
    /// snapshots); it is recovered from there at start.
    #[arg(help_heading = "Storage", long, env = "STATESTORE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Which keys survive a restart: `all`, `flagged` (only keys set with
    /// `aio-persistence: true`), `custom` (those, and keys that match
    /// --persist-keys) or `none` (volatile). Default: `all` with
    /// --data-dir, else `none`.
    #[arg(help_heading = "Storage", long, value_enum)]
    pub persist: Option<PersistArg>,

    /// With `--persist custom`: keys that persist, by glob pattern
    /// (`pattern:sensors/*`, or just `sensors/*`), exact string
    /// (`string:config`) or base64 binary key (`binary:AAEC`). Repeat the
    /// flag for more. A key matches when it is set; it stays persisted
    /// until set again.
    #[arg(help_heading = "Storage", long, value_name = "KEY", value_parser = parse_key_match_arg)]
    pub persist_keys: Vec<KeyMatch>,

    /// When writes reach the disk: `always` (before the reply; concurrent
    /// requests share one fsync), `everysec` (a crash loses at most ~1 s) or
    /// `no` (the OS decides).
    #[arg(help_heading = "Storage", long, value_enum, default_value_t = Fsync::Always)]
    pub fsync: Fsync,

    /// Volatile store (`--persist none`): do not keep a journal in memory.
    /// With it (the default) a guest that fails restarts with everything it
    /// acknowledged, for about twice the state's size again in memory (see
    /// BENCHMARKS.md); without it, it restarts empty.
    #[arg(help_heading = "Storage", long)]
    pub no_memory_journal: bool,

    /// Snapshot and truncate the log after this much log (a bare number is
    /// MiB).
    #[arg(help_heading = "Storage", long, alias = "snapshot-log-mib", value_name = "SIZE", default_value = "64MiB", value_parser = parse_size_mib)]
    pub snapshot_log: u64,

    /// ... or after this long, if anything was written (a bare number is
    /// seconds).
    #[arg(help_heading = "Storage", long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration_secs)]
    pub snapshot_interval: Duration,

    /// Start even if the log is damaged before its end (a corrupt record
    /// with valid records after it): keep what precedes the damage. The
    /// damaged segment is copied aside first. Without it such a start is
    /// refused, and nothing is changed.
    #[arg(help_heading = "Storage", long)]
    pub recover_damaged_log: bool,

    /// Node id of the hybrid logical clock in every version this store
    /// issues. Keep it stable across restarts.
    #[arg(
        help_heading = "Storage",
        long,
        env = "STATESTORE_NODE_ID",
        default_value = "StateStore"
    )]
    pub node_id: String,

    /// Linear memory cap of the store's guest (16MiB to 4GiB; a bare number
    /// is MiB; with --config: what a tenant has unless it sets `memory_mib`).
    /// A guest that
    /// needs more fails and restarts from its journal.
    #[arg(help_heading = "Limits", long, alias = "memory-mib", value_name = "SIZE", default_value = "1GiB", value_parser = parse_size_mib)]
    pub memory: u64,

    /// Most bytes of keys and values the store holds (a bare number is MiB;
    /// with --config: each tenant's unless it sets `max_bytes`); a SET that would create a key past it gets the
    /// quota error. Default and most: a third of --memory (the state, a
    /// snapshot of it and the work of a call all live in the guest's
    /// memory).
    #[arg(help_heading = "Limits", long, alias = "max-bytes-mib", value_name = "SIZE", value_parser = parse_size_mib)]
    pub max_bytes: Option<u64>,

    /// Longest value a SET may write (at most 1GiB; a bare number is MiB;
    /// with --config: each tenant's unless it sets `max_value_bytes`).
    #[arg(help_heading = "Limits", long, alias = "max-value-mib", value_name = "SIZE", default_value = "16MiB", value_parser = parse_size_mib)]
    pub max_value: u64,

    /// Longest key a SET may create (at most 64MiB; a bare number is KiB;
    /// with --config: each tenant's unless it sets `max_key_bytes`). It bounds what
    /// matching one key against a SCAN pattern can cost.
    #[arg(help_heading = "Limits", long, alias = "max-key-kib", value_name = "SIZE", default_value = "64KiB", value_parser = parse_size_kib)]
    pub max_key: u64,

    /// Longest time one call into the guest may run before the call is
    /// stopped and the store restarted (a bare number is ms; with
    /// --config: each tenant's unless it sets `call_ms`).
    #[arg(help_heading = "Limits", long, alias = "call-ms", value_name = "DURATION", default_value = "1s", value_parser = parse_duration_ms)]
    pub call_timeout: Duration,

    /// Most keys in one SCAN page.
    #[arg(help_heading = "Limits", long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub scan_page_keys: u32,

    /// Most bytes of keys in one SCAN page (a page holds at least one key;
    /// at most 1GiB; a bare number is KiB).
    #[arg(help_heading = "Limits", long, alias = "scan-page-kib", value_name = "SIZE", default_value = "256KiB", value_parser = parse_size_kib)]
    pub scan_page_size: u64,

    /// Largest MQTT packet accepted (1KiB to 255MiB; a bare number is MiB):
    /// the embedded broker's limit for every client; with --broker, the most
    /// the broker may send us.
    #[arg(help_heading = "Limits", long, alias = "max-packet-mib", value_name = "SIZE", default_value = "32MiB", value_parser = parse_size_mib)]
    pub max_packet: u64,

    /// Most connections the embedded broker holds at once.
    #[arg(help_heading = "Limits", long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// Most connections at once from one IP address (0: no limit); one
    /// more is refused (CONNACK "not authorized") and logged.
    #[arg(help_heading = "Limits", long, default_value_t = 256)]
    pub max_connections_per_address: u64,

    /// Most connections at once that have not yet sent their CONNECT (or
    /// finished their TLS handshake); one more is closed at accept (0: no
    /// bound).
    #[arg(help_heading = "Limits", long, default_value_t = 1_000)]
    pub max_pending_connections: u64,

    /// Most of those from one IP address (0: no bound).
    #[arg(help_heading = "Limits", long, default_value_t = 100)]
    pub max_pending_per_address: u64,

    /// How long a connection to the embedded broker has from accept to
    /// finish its TLS handshake and send its whole CONNECT (1s to 1h; a bare
    /// number is seconds); then it is closed.
    #[arg(help_heading = "Limits", long, alias = "connect-timeout-secs", value_name = "DURATION", default_value = "10s", value_parser = parse_duration_secs)]
    pub handshake_timeout: Duration,

    /// Most failed logins a minute from one IP address (a bucket refilled
    /// at this rate): past it, that address's CONNECTs get CONNACK 0x9F
    /// "connection rate exceeded" without their password being judged,
    /// until the bucket refills (0: no bound).
    #[arg(help_heading = "Limits", long, default_value_t = 20, value_parser = clap::value_parser!(u32))]
    pub max_failed_logins: u32,

    /// Most sessions the embedded broker holds, connected or parked (a
    /// persistent session whose client is away); a CONNECT that would start
    /// one more gets CONNACK 0x97 "quota exceeded" (0: no bound).
    #[arg(help_heading = "Limits", long, default_value_t = 20_000)]
    pub max_sessions: u64,

    /// Most sessions whose last connection came from one IP address,
    /// connected or parked; past it as --max-sessions (0: no bound).
    #[arg(help_heading = "Limits", long, default_value_t = 1_000)]
    pub max_sessions_per_address: u64,

    /// Longest session expiry a client of the embedded broker may ask for (a
    /// longer one is cut to it; a bare number is seconds).
    #[arg(help_heading = "Limits", long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration_secs)]
    pub max_session_expiry: Duration,

    /// Most messages queued for one session of the embedded broker (an
    /// offline or slow client); past it the oldest are dropped.
    #[arg(help_heading = "Limits", long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queued: u64,

    /// Most bytes one session of the embedded broker holds (queued and
    /// unacknowledged messages; a bare number is MiB); a message that would
    /// go past it is dropped for that session (logged at debug, counted).
    /// The default lets a client have 60 replies of 8 MiB in flight at once.
    #[arg(help_heading = "Limits", long, alias = "max-queued-mib", value_name = "SIZE", default_value = "512MiB", value_parser = parse_size_mib)]
    pub max_queued_size: u64,

    /// Most bytes all sessions of the embedded broker hold together (queued
    /// and unacknowledged messages, parked sessions' too; a bare number is
    /// MiB); a message past it is dropped for the session it was for
    /// (counted as `queued_total` in `statestore_broker_refused_total`).
    #[arg(help_heading = "Limits", long, alias = "max-queued-total-mib", value_name = "SIZE", default_value = "2GiB", value_parser = parse_size_mib)]
    pub max_queued_total: u64,

    /// Most bytes of requests waiting for a store (a bare number is MiB):
    /// past it, publishers wait (their connections are not read) until the
    /// store catches up.
    #[arg(help_heading = "Limits", long, alias = "inbound-mib", value_name = "SIZE", default_value = "64MiB", value_parser = parse_size_mib)]
    pub max_inbound: u64,

    /// Embedded broker: most topics holding a retained message; a retained
    /// PUBLISH on one more topic gets PUBACK "quota exceeded" (0x97).
    /// With --data-dir they are kept across restarts (retained.json).
    #[arg(help_heading = "Limits", long, default_value_t = 10_000)]
    pub max_retained: u64,

    /// Embedded broker: most bytes of retained messages (topics, payloads
    /// and properties; a bare number is MiB); past it, as --max-retained.
    #[arg(help_heading = "Limits", long, alias = "max-retained-mib", value_name = "SIZE", default_value = "64MiB", value_parser = parse_size_mib)]
    pub max_retained_size: u64,

    /// Serve as one replica of a cluster: this TOML file names
    /// this replica (`id`), its `data_dir`, the shared `secret_file` and
    /// every `[[replica]]` (`id`, `raft` address for the other replicas,
    /// `mqtt` address of its embedded broker, where it listens). Writes are
    /// acknowledged once a majority has them (durable under --fsync).
    /// `scripts/cluster` starts three on loopback; see the book's
    /// cluster chapter (docs/src/cluster.md). With
    /// --broker, the replicas share the request topic through one MQTT5
    /// shared subscription (`$share/statestore/...`), each as client
    /// `<--client-id>-<id>`. With --config, every tenant is its own Raft
    /// group on the replicas (docs/src/cluster.md, "Tenants").
    #[arg(
        help_heading = "Cluster",
        long,
        value_name = "FILE",
        env = "STATESTORE_CLUSTER",
        conflicts_with = "data_dir"
    )]
    pub cluster: Option<PathBuf>,

    /// Serve Prometheus metrics on `http://ADDR/metrics`, with `/healthz`
    /// (200 while every tenant serves) and `/readyz` (200 once recovery is
    /// done and the broker listener is up, or the broker subscription is
    /// made). Off by default; e.g. `127.0.0.1:9464`.
    #[arg(help_heading = "Observability", long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,

    /// Serve the tenants declared in this TOML file: each an isolated store
    /// with its own guest instance, journal and limits (see docs/src/tenants.md).
    /// SIGHUP reads it again and applies new components and limits.
    #[arg(
        help_heading = "Component and config file",
        long,
        env = "STATESTORE_CONFIG"
    )]
    pub config: Option<PathBuf>,

    /// Serve this component instead of the built-in one. SIGHUP reads it
    /// again and, if it changed, switches to it while serving (hot upgrade).
    #[arg(help_heading = "Component and config file", long)]
    pub component: Option<PathBuf>,

    /// Do not keep or use the precompiled component cache
    /// ($STATESTORE_CACHE_DIR, $XDG_CACHE_HOME/statestore or ~/.cache/statestore).
    #[arg(help_heading = "Component and config file", long)]
    pub no_cache: bool,
}

/// `--response-topics` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponseTopics {
    Any,
    Sdk,
}

/// `--persist` values.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PersistArg {
    All,
    Flagged,
    Custom,
    None,
}

fn parse_key_match_arg(s: &str) -> Result<KeyMatch, String> {
    statestore::store::parse_key_match(s).map_err(|e| format!("{e:#}"))
}
