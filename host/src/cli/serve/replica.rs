//! `serve --cluster`: one replica, on its embedded broker or through
//! --broker.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use statestore::cluster::node::{ClusterFile, Node, NodeTenant, Notify, Stores, TenantSource};
use statestore::config::TenantSpec;
use statestore::store::driver::Reach;
use statestore::store::tenant::Fleet;
use statestore::transport::embedded::Route;

use super::options::{
    broker_options, check_listeners, external_options, has_tenants, load_policy, password,
    server_runtime, start_metrics, tenant_specs, users,
};
use super::reload::spawn_users_reloader;
use super::{ServeArgs, shutdown_signal};

/// How long a replica's broker holds a request's PUBACK for its reply
/// (a round between replicas: about 1-4 ms under load), so that one write
/// carries both; a reply later than that finds the PUBACK sent.
const REPLICA_ACK_WAIT: Duration = Duration::from_millis(10);

pub fn run(args: ServeArgs, path: &Path) -> Result<()> {
    let file = ClusterFile::load(path)?;
    let secret = file.secret()?;
    let listen = file.me().mqtt.unwrap_or(args.listen);
    let raft = file.me().raft;
    if !raft.ip().is_loopback() && file.tls_dir.is_none() && !args.allow_insecure {
        anyhow::bail!(
            "refusing to listen for replicas on {raft} without TLS: the links between replicas would be plain TCP and their hello would carry the secret in clear, so anyone on the path could read every key and value, and replay a hello to change the membership; add `tls_dir` to the cluster files and run `statestore cluster certs` (or keep raft addresses on loopback, or add --allow-insecure on a network only the replicas can reach)"
        );
    }
    check_listeners(&args, listen)?;
    let named = has_tenants(&args);
    // The tenants of --config, or the one store the flags describe.
    let specs = tenant_specs(&args, password(&args)?)?;
    // One thread, as one process: the round's syncs run on the blocking
    // pool while this thread serves the links and the broker (two workers
    // measured 0.8-0.9x the writes a second, BENCHMARKS.md).
    let rt = server_runtime(&args, 1)?;
    let (stores, fleet) = replica_stores(&args, &file, &secret, &specs, named)?;
    rt.block_on(async move {
        let metrics = start_metrics(&args).await?;
        let notify = if args.broker.is_some() {
            Notify::Origin
        } else {
            Notify::Everywhere
        };
        let mut node = Node::open(
            &file,
            stores,
            args.fsync,
            statestore::store::clock::system(),
            notify,
        )
        .await?;
        if named {
            node.set_tenant_source(tenant_source(args.clone(), secret.clone(), file.id, fleet));
        }
        if let Some(m) = &metrics {
            node.set_metrics(m.replica()?, m.clone());
            m.set_ready();
        }
        if let Some(broker) = args.broker.clone() {
            // One connection per store (a tenant's on its own broker or
            // mount point), named for this replica.
            // Its stores, in the node's order (the data directory's; none
            // for a tenant the cluster removed).
            let opts = node
                .tenants()
                .iter()
                .enumerate()
                .map(|(t, name)| {
                    let spec = specs.iter().find(|s| !named || s.name == *name);
                    spec.filter(|_| !node.removed(t)).map(|spec| {
                        replica_broker_options(&args, &broker, spec.clone(), file.id, named)
                    })
                })
                .collect();
            return statestore::transport::external::serve_replica(node, opts, shutdown_signal())
                .await;
        }
        let users = users(&args)?;
        if let (Some(cell), Some(path)) = (&users, &args.users_file) {
            spawn_users_reloader(cell.clone(), path.clone())?;
        }
        let policy = statestore::auth::policy::PolicyCell::new(load_policy(&args)?);
        // A replica's broker keeps its retained messages in memory.
        let mut options = broker_options(&args, users, metrics.as_deref(), policy, None);
        // A reply takes a round between replicas: its request's PUBACK
        // waits for it (up to REPLICA_ACK_WAIT) to leave in the same write.
        options.ack_wait = Some(REPLICA_ACK_WAIT);
        // Each tenant's clients, in the node's order (the data directory's;
        // a tenant the cluster removed keeps its place, and takes none).
        let routes: Vec<(String, Route)> = node
            .tenants()
            .iter()
            .enumerate()
            .filter(|_| named)
            .map(|(t, name)| {
                let spec = specs.iter().find(|s| s.name == *name && !node.removed(t));
                let route = spec.map_or_else(Route::default, |s| Route {
                    matcher: s.matcher.clone(),
                    default: s.default,
                });
                (name.clone(), route)
            })
            .collect();
        let server = statestore::transport::embedded::EmbeddedServer::start_replica(
            listen,
            &args.client_id,
            node,
            routes,
            options,
        )
        .await?;
        if let Some(m) = &metrics {
            m.broker_counters(server.counters())?;
        }
        server.run(shutdown_signal()).await
    })
}

/// A replica's connection to the broker for the store of `spec` (`named`:
/// a tenant's), named for replica `id`.
fn replica_broker_options(
    args: &super::ServeArgs,
    broker: &statestore::mqtt::BrokerUrl,
    mut spec: TenantSpec,
    id: u64,
    named: bool,
) -> statestore::transport::external::ServeOptions {
    spec.broker.client_id = if named {
        format!("{}-{id}", spec.broker.client_id)
    } else {
        format!("{}-{id}", args.client_id)
    };
    let url = spec.broker.url.clone().unwrap_or_else(|| broker.clone());
    statestore::transport::external::ServeOptions {
        // No session outlives a replica's connection: the broker gives its
        // share of the requests to the replicas that are up (a kept
        // session would queue them for a dead one).
        session_expiry: Duration::ZERO,
        shared_group: Some("statestore".into()),
        ..external_options(args, url, &spec)
    }
}

/// Tenants a replica's fleet has room for beyond those it started with
/// (added while running), each in the cluster's partitions.
const ROOM_FOR_ADDED: usize = 16;

/// The stores a replica serves, each with its component compiled (calls
/// bounded by fuel: a request that fails the guest fails it on every
/// replica alike, a poison entry skipped by all) and its guest's config:
/// the tenants of `specs` if `named`, else the one store of the flags; and
/// the fleet that compiled them, with room for tenants added while running.
fn replica_stores(
    args: &super::ServeArgs,
    file: &ClusterFile,
    secret: &[u8],
    specs: &[TenantSpec],
    named: bool,
) -> Result<(Stores, Fleet)> {
    let cache_dir = statestore::runtime::cache::default_dir().filter(|_| !args.no_cache);
    let room = if named { ROOM_FOR_ADDED } else { 0 };
    let mut fleet = Fleet::for_replica(
        (specs.len() + room) * file.partitions as usize,
        super::max_memory(specs),
        cache_dir,
    )?;
    let mut stores = Vec::with_capacity(specs.len());
    for spec in specs {
        if named && spec.store.data_dir.is_some() {
            tracing::info!(
                tenant = %spec.name,
                "a tenant's data directory (data_root) is not used in a cluster: its log is in the cluster file's data_dir, under tenant-<name>"
            );
        }
        stores.push(node_tenant(&mut fleet, spec, secret)?);
    }
    let stores = if named {
        Stores::Tenants(stores)
    } else {
        Stores::One(Box::new(stores.pop().context("the store's settings")?))
    };
    Ok((stores, fleet))
}

/// The store of `spec`: its component compiled by `fleet`, its guest's
/// config as every replica has it.
fn node_tenant(fleet: &mut Fleet, spec: &TenantSpec, secret: &[u8]) -> Result<NodeTenant> {
    let mut config = statestore::store::guest_config(&spec.store);
    // The Raft log is the journal; every replica applies alike.
    config.persist = statestore::Persist::None;
    config.hash_seed = ClusterFile::hash_seed(secret);
    let wasm = spec.component.read()?;
    let runtime = fleet
        .runtime_from_bytes(&wasm, spec.limits)
        .with_context(|| format!("cannot load {}", spec.component))?;
    Ok(NodeTenant {
        name: spec.name.clone(),
        runtime,
        config,
    })
}

/// Where a replica finds a tenant the cluster adds while running: in its
/// `--config` as the file is then (read again each time), compiled by the
/// replica's fleet, reached through the embedded broker or `--broker`.
fn tenant_source(
    args: super::ServeArgs,
    secret: Vec<u8>,
    id: u64,
    mut fleet: Fleet,
) -> TenantSource {
    Box::new(move |name: &str| {
        let specs = tenant_specs(&args, password(&args)?)?;
        let config = args.config.as_deref().unwrap_or(Path::new("--config"));
        let spec = specs
            .into_iter()
            .find(|s| s.name == name)
            .with_context(|| format!("{} names no tenant {name:?}", config.display()))?;
        let store = node_tenant(&mut fleet, &spec, &secret)?;
        let reach: Reach = match &args.broker {
            Some(broker) => Box::new(replica_broker_options(&args, broker, spec, id, true)),
            None => Box::new(Route {
                matcher: spec.matcher.clone(),
                default: spec.default,
            }),
        };
        Ok((store, reach))
    })
}
