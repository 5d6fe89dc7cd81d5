//! What the `serve` options mean: the tenants, the broker's limits, the
//! listeners, and the checks clap cannot make alone. One place for a single
//! process and a cluster replica.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use statestore::config::{self, Matcher, TenantBroker, TenantSpec};
use statestore::store::StoreOptions;
use statestore::store::journal::{OnDamage, SnapshotPolicy};
use statestore::store::tenant::ComponentSource;
use statestore::transport::embedded::BrokerLimits;
use statestore::{Persist, ScanPage, StoreLimits};
use statestore_guest::types::Quota;

use super::args::{PersistArg, ResponseTopics, ServeArgs};

pub fn cli_tenant(args: &ServeArgs, password: Option<String>) -> TenantSpec {
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
                max_log_bytes: args.snapshot_log.max(1),
                max_interval: args.snapshot_interval.max(Duration::from_secs(1)),
                ..SnapshotPolicy::default()
            },
            quota: Quota {
                max_bytes: Some(max_bytes(args)),
                max_value_bytes: Some(u32::try_from(args.max_value).unwrap_or(u32::MAX)),
                max_key_bytes: Some(u32::try_from(args.max_key).unwrap_or(u32::MAX)),
                ..Quota::default()
            },
            clock: statestore::store::clock::system(),
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
                max_bytes: u32::try_from(args.scan_page_size).unwrap_or(u32::MAX),
            },
        },
        limits: StoreLimits {
            memory_bytes: Some(usize::try_from(args.memory).unwrap_or(usize::MAX)),
            call_ms: Some(u64::try_from(args.call_timeout.as_millis()).unwrap_or(u64::MAX)),
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

/// What a tenant of a config file inherits from the flags: the limits and
/// storage settings the one store of a process without a config file has.
pub fn tenant_defaults(args: &ServeArgs) -> config::TenantDefaults {
    let spec = cli_tenant(args, None);
    config::TenantDefaults {
        memory_mib: args.memory >> 20,
        call_ms: spec.limits.call_ms.unwrap_or(u64::MAX),
        max_bytes: args.max_bytes,
        max_key_bytes: spec.store.quota.max_key_bytes.unwrap_or(u32::MAX),
        max_value_bytes: spec.store.quota.max_value_bytes.unwrap_or(u32::MAX),
        fsync: spec.store.fsync,
        snapshot_log_bytes: spec.store.snapshots.max_log_bytes,
        snapshot_interval: spec.store.snapshots.max_interval,
        memory_journal: spec.store.memory_journal,
        scan_page: spec.store.scan_page,
        sdk_response_topics: spec.store.sdk_response_topics,
        node_id: spec.store.node_id,
    }
}

/// `--max-bytes`, or a third of `--memory` (in whole MiB).
pub fn max_bytes(args: &ServeArgs) -> u64 {
    args.max_bytes
        .unwrap_or(config::default_max_bytes(args.memory >> 20))
}

/// The TLS listener the flags ask for.
pub fn tls_listener(args: &ServeArgs) -> Option<statestore::transport::embedded::TlsListener> {
    Some(statestore::transport::embedded::TlsListener {
        listen: args.tls_listen?,
        cert: args.tls_cert.clone()?,
        key: args.tls_key.clone()?,
        client_ca: args.client_ca.clone(),
    })
}

/// The embedded broker's limits from the flags.
/// `--strict-client-topics`.
pub fn client_topics(args: &ServeArgs) -> statestore::auth::isolation::ClientTopics {
    if args.strict_client_topics {
        statestore::auth::isolation::ClientTopics::Strict
    } else {
        statestore::auth::isolation::ClientTopics::Open
    }
}

pub fn broker_limits(args: &ServeArgs) -> BrokerLimits {
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    BrokerLimits {
        max_packet: u32::try_from(args.max_packet).unwrap_or(u32::MAX),
        max_session_expiry: args.max_session_expiry,
        max_queued: usize_of(args.max_queued),
        max_queued_bytes: usize_of(args.max_queued_size),
        max_connections: usize_of(args.max_connections),
        max_connections_per_address: usize_of(args.max_connections_per_address),
        inbound_bytes: usize_of(args.max_inbound),
        max_retained: usize_of(args.max_retained),
        max_retained_bytes: usize_of(args.max_retained_size),
        max_queued_total_bytes: usize_of(args.max_queued_total),
        max_sessions: usize_of(args.max_sessions),
        max_sessions_per_address: usize_of(args.max_sessions_per_address),
        max_failed_logins: args.max_failed_logins,
        max_pending_connections: usize_of(args.max_pending_connections),
        max_pending_per_address: usize_of(args.max_pending_per_address),
        connect_timeout: args.handshake_timeout,
    }
}

/// The tenants to serve: from --config, or the one the flags describe.
/// Whether --config names a file that declares tenants (a file may also
/// only set `serve` options).
pub fn has_tenants(args: &ServeArgs) -> bool {
    args.config
        .as_ref()
        .is_some_and(|p| std::fs::read_to_string(p).is_ok_and(|t| config::has_tenants(&t)))
}

pub fn tenant_specs(args: &ServeArgs, password: Option<String>) -> Result<Vec<TenantSpec>> {
    let mut specs = tenant_specs_without_policy(args, password)?;
    if let Some(policy) = load_policy(args)? {
        for spec in &mut specs {
            spec.store.authorization = Some(policy.store_rules());
        }
    }
    Ok(specs)
}

/// The `--authorization` file, if any.
pub fn load_policy(args: &ServeArgs) -> Result<Option<statestore::auth::policy::Policy>> {
    args.authorization
        .as_deref()
        .map(statestore::auth::policy::Policy::load)
        .transpose()
}

pub fn tenant_specs_without_policy(
    args: &ServeArgs,
    password: Option<String>,
) -> Result<Vec<TenantSpec>> {
    let tenants = args.config.as_ref().filter(|_| has_tenants(args));
    match tenants {
        Some(path) => {
            let mut specs = config::load(path, &args.client_id, &tenant_defaults(args))?;
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

/// Whether `value` of `flag` is within `min..=max` (sizes in bytes).
fn check_size(flag: &str, value: u64, min: u64, max: u64) -> Result<()> {
    use crate::cli::units::show_size;
    if value < min || value > max {
        anyhow::bail!(
            "{flag} {} is out of range: it must be from {} to {}",
            show_size(value),
            show_size(min),
            show_size(max)
        );
    }
    Ok(())
}

/// Whether `value` of `flag` is within `min..=max`.
fn check_duration(flag: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    use crate::cli::units::show_duration;
    if value < min || value > max {
        anyhow::bail!(
            "{flag} {} is out of range: it must be from {} to {}",
            show_duration(value),
            show_duration(min),
            show_duration(max)
        );
    }
    Ok(())
}

/// What clap cannot check of the `serve` flags alone.
pub fn check_serve_args(args: &ServeArgs) -> Result<()> {
    use crate::cli::units::show_size;
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let secs = Duration::from_secs;
    check_size("--memory", args.memory, 16 * MIB, 4 * GIB)?;
    check_size("--max-value", args.max_value, 1, GIB)?;
    check_size("--max-key", args.max_key, 1, 64 * MIB)?;
    check_size("--max-packet", args.max_packet, KIB, 255 * MIB)?;
    check_size("--scan-page-size", args.scan_page_size, 1, GIB)?;
    check_size("--max-queued-size", args.max_queued_size, 1, 64 * GIB)?;
    check_size("--max-queued-total", args.max_queued_total, 1, 1024 * GIB)?;
    check_size("--max-inbound", args.max_inbound, 1, 4095 * MIB)?;
    check_size("--max-retained-size", args.max_retained_size, 0, 4095 * MIB)?;
    check_size("--snapshot-log", args.snapshot_log, 1, u64::MAX)?;
    check_duration("--keep-alive", args.keep_alive, secs(5), secs(65_535))?;
    check_duration(
        "--handshake-timeout",
        args.handshake_timeout,
        secs(1),
        secs(3600),
    )?;
    check_duration(
        "--call-timeout",
        args.call_timeout,
        Duration::from_millis(1),
        secs(3600),
    )?;
    check_duration(
        "--snapshot-interval",
        args.snapshot_interval,
        secs(1),
        secs(u32::MAX.into()),
    )?;
    if !has_tenants(args) && max_bytes(args) > args.memory / 3 {
        anyhow::bail!(
            "--max-bytes {} is more than a third of --memory {}: the keys and values, a snapshot of them and the work of a call all live in the guest's memory; raise --memory (at most 4GiB) or lower --max-bytes",
            show_size(max_bytes(args)),
            show_size(args.memory)
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
    if args.scan_page_size >= args.max_packet {
        anyhow::bail!(
            "--scan-page-size {} does not fit a packet of --max-packet {}: a SCAN page must",
            show_size(args.scan_page_size),
            show_size(args.max_packet)
        );
    }
    Ok(())
}

/// Refuses a listener anyone on the network could use without TLS or
/// authentication, unless --allow-insecure: the same rule for a single
/// process and a cluster replica (whose embedded broker listens on
/// `listen`).
pub fn check_listeners(args: &ServeArgs, listen: SocketAddr) -> Result<()> {
    if args.broker.is_none() && !listen.ip().is_loopback() && !args.allow_insecure {
        anyhow::bail!(
            "refusing to listen on {listen} without TLS: anyone who can reach this address could \
             read and write every key (and passwords would cross the network in clear). Listen on \
             loopback (the default, 127.0.0.1:1883) and serve others with --tls-listen ADDR \
             --tls-cert FILE --tls-key FILE and --users-file or --client-ca, or serve through a \
             broker with TLS and authentication (--broker mqtts://...), or pass --allow-insecure \
             to do it anyway"
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
    Ok(())
}

/// The password of --password-file, if any.
pub fn password(args: &ServeArgs) -> Result<Option<String>> {
    args.password_file
        .as_deref()
        .map(config::read_secret)
        .transpose()
}

/// The users of --users-file, if any.
pub fn users(
    args: &ServeArgs,
) -> Result<Option<std::sync::Arc<statestore::auth::users::UsersCell>>> {
    Ok(match &args.users_file {
        Some(path) => Some(statestore::auth::users::UsersCell::new(
            statestore::auth::users::Users::load(path)?,
        )),
        None => None,
    })
}

/// The tokio runtime of a server (--threads, else `default_threads`): one
/// thread runs everything on the thread that calls `block_on`; more, a pool
/// of that many workers.
pub fn server_runtime(args: &ServeArgs, default_threads: u16) -> Result<tokio::runtime::Runtime> {
    let mut builder = match args.threads.unwrap_or(default_threads) {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.into());
            b
        }
    };
    Ok(builder.enable_all().build()?)
}

/// Starts the metrics endpoint of --metrics, if any.
pub async fn start_metrics(
    args: &ServeArgs,
) -> Result<Option<std::sync::Arc<statestore::metrics::Metrics>>> {
    let Some(addr) = args.metrics else {
        return Ok(None);
    };
    let metrics = statestore::metrics::Metrics::new()?;
    let at = metrics.serve(addr).await?;
    tracing::info!(metrics = %format!("http://{at}/metrics"), "metrics listening");
    Ok(Some(metrics))
}

/// The embedded broker's options (`data_dir`: where it keeps retained
/// messages, if anywhere).
pub fn broker_options(
    args: &ServeArgs,
    users: Option<std::sync::Arc<statestore::auth::users::UsersCell>>,
    metrics: Option<&statestore::metrics::Metrics>,
    policy: std::sync::Arc<statestore::auth::policy::PolicyCell>,
    data_dir: Option<PathBuf>,
) -> statestore::transport::embedded::BrokerOptions {
    statestore::transport::embedded::BrokerOptions {
        limits: broker_limits(args),
        users,
        connections: metrics.map(|m| m.connections().clone()),
        queue_dropped: metrics.map(|m| m.queue_dropped().clone()),
        refused: metrics.map(|m| m.broker_refused().clone()),
        policy: Some(policy),
        tls: tls_listener(args),
        client_topics: client_topics(args),
        data_dir,
        ack_wait: None,
    }
}

/// The options of our connection to --broker (`store`: the tenant's).
pub fn external_options(
    args: &ServeArgs,
    broker: statestore::mqtt::BrokerUrl,
    tenant: &TenantSpec,
) -> statestore::transport::external::ServeOptions {
    statestore::transport::external::ServeOptions {
        broker,
        client_id: tenant.broker.client_id.clone(),
        username: tenant.broker.username.clone(),
        password: tenant.broker.password.clone(),
        ca_file: args.ca_file.clone(),
        client_cert: crate::cli::client_cert(&args.client_cert, &args.client_key),
        keep_alive: args.keep_alive,
        session_expiry: args.session_expiry,
        max_packet: u32::try_from(args.max_packet).unwrap_or(u32::MAX),
        connect_timeout: args.connect_timeout,
        client_events: args.client_events,
        store: tenant.store.clone(),
        shared_group: None,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::ServeArgs,
    }

    /// A config file's tenant and the one store of a process without a
    /// config file start from the same limits: the flags' defaults.
    #[test]
    fn tenants_inherit_the_defaults_of_the_flags() {
        let args = Serve::parse_from(["serve"]).args;
        assert_eq!(
            super::tenant_defaults(&args),
            statestore::config::TenantDefaults::default()
        );
        let args = Serve::parse_from(["serve", "--memory", "64MiB", "--max-value", "1KiB"]).args;
        let inherited = super::tenant_defaults(&args);
        let specs = statestore::config::parse(
            "[[tenant]]\nname = \"a\"\ndefault = true\n[[tenant]]\nname = \"b\"\nusernames = [\"b\"]\nmemory_mib = 30\n",
            std::path::Path::new("."),
            "statestore",
            &inherited,
        )
        .expect("parse");
        assert_eq!(specs[0].limits.memory_bytes, Some(64 << 20));
        assert_eq!(specs[0].store.quota.max_bytes, Some(21 << 20));
        assert_eq!(specs[0].store.quota.max_value_bytes, Some(1024));
        assert_eq!(specs[1].limits.memory_bytes, Some(30 << 20));
        assert_eq!(specs[1].store.quota.max_bytes, Some(10 << 20));
    }
}
