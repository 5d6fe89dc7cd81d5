//! `serve --cluster`: one replica, on its embedded broker or through
//! --broker.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use statestore::cluster::node::{ClusterFile, Node, NodeTenant, Notify, Stores};
use statestore::config::TenantSpec;
use statestore::store::tenant::Fleet;
use statestore::transport::embedded::Route;

use super::options::{
    broker_options, check_listeners, external_options, has_tenants, load_policy, password,
    server_runtime, start_metrics, tenant_specs, users,
};
use super::reload::spawn_users_reloader;
use super::{ServeArgs, shutdown_signal};

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
    let routes: Vec<(String, Route)> = specs
        .iter()
        .filter(|_| named)
        .map(|s| {
            let route = Route {
                matcher: s.matcher.clone(),
                default: s.default,
            };
            (s.name.clone(), route)
        })
        .collect();
    // One thread, as one process: the round's syncs run on the blocking
    // pool while this thread serves the links and the broker (two workers
    // measured 0.8-0.9x the writes a second, BENCHMARKS.md).
    let rt = server_runtime(&args, 1)?;
    let stores = replica_stores(&args, &file, &secret, &specs, named)?;
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
        if let Some(m) = &metrics {
            let stores = node.tenants().iter().map(|t| m.tenant(t)).collect();
            node.set_metrics(m.replica()?, stores);
            m.set_ready();
        }
        if let Some(broker) = args.broker.clone() {
            // One connection per store (a tenant's on its own broker or
            // mount point), named for this replica.
            let opts = specs
                .into_iter()
                .map(|mut spec| {
                    spec.broker.client_id = if named {
                        format!("{}-{}", spec.broker.client_id, file.id)
                    } else {
                        format!("{}-{}", args.client_id, file.id)
                    };
                    let url = spec.broker.url.clone().unwrap_or_else(|| broker.clone());
                    statestore::transport::external::ServeOptions {
                        // No session outlives a replica's connection: the
                        // broker gives its share of the requests to the
                        // replicas that are up (a kept session would queue
                        // them for a dead one).
                        session_expiry: Duration::ZERO,
                        shared_group: Some("statestore".into()),
                        ..external_options(&args, url, &spec)
                    }
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
        let options = broker_options(&args, users, metrics.as_deref(), policy, None);
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

/// The stores a replica serves, each with its component compiled (calls
/// bounded by fuel: a request that fails the guest fails it on every
/// replica alike, a poison entry skipped by all) and its guest's config:
/// the tenants of `specs` if `named`, else the one store of the flags.
fn replica_stores(
    args: &super::ServeArgs,
    file: &ClusterFile,
    secret: &[u8],
    specs: &[TenantSpec],
    named: bool,
) -> Result<Stores> {
    let cache_dir = statestore::runtime::cache::default_dir().filter(|_| !args.no_cache);
    let mut fleet = Fleet::for_replica(
        specs.len() * file.partitions as usize,
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
        let mut config = statestore::store::guest_config(&spec.store);
        // The Raft log is the journal; every replica applies alike.
        config.persist = statestore::Persist::None;
        config.hash_seed = ClusterFile::hash_seed(secret);
        let wasm = spec.component.read()?;
        let runtime = fleet
            .runtime_from_bytes(&wasm, spec.limits)
            .with_context(|| format!("cannot load {}", spec.component))?;
        stores.push(NodeTenant {
            name: spec.name.clone(),
            runtime,
            config,
        });
    }
    Ok(if named {
        Stores::Tenants(stores)
    } else {
        Stores::One(Box::new(stores.pop().context("the store's settings")?))
    })
}
