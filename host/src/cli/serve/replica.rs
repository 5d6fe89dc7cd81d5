//! `serve --cluster`: one replica, on its embedded broker or through
//! --broker.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use statestore::cluster::node::{ClusterFile, Node, Notify};
use statestore::store::tenant::{Fleet, WASM32_MAX_MEMORY};

use super::options::{
    broker_options, check_listeners, cli_tenant, external_options, load_policy, password,
    server_runtime, start_metrics, users,
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
    let mut spec = cli_tenant(&args, password(&args)?);
    if let Some(policy) = load_policy(&args)? {
        spec.store.authorization = Some(policy.store_rules());
    }
    let mut guest = statestore::store::guest_config(&spec.store);
    // The Raft log is the journal; every replica applies alike.
    guest.persist = statestore::Persist::None;
    guest.hash_seed = ClusterFile::hash_seed(&secret);
    // Two threads: the links and the broker keep being served while the
    // loop syncs the log (one thread measured 0.7x the throughput).
    let rt = server_runtime(&args, 2)?;
    let cache_dir = statestore::runtime::cache::default_dir().filter(|_| !args.no_cache);
    // Calls bounded by fuel: a request that fails the guest fails it on
    // every replica alike (a poison entry, skipped by all).
    let mut fleet = Fleet::for_replica(
        file.partitions as usize,
        spec.limits.memory_bytes.unwrap_or(WASM32_MAX_MEMORY),
        cache_dir,
    )?;
    let wasm = spec.component.read()?;
    let runtime = fleet
        .runtime_from_bytes(&wasm, spec.limits)
        .with_context(|| format!("cannot load {}", spec.component))?;
    rt.block_on(async move {
        let metrics = start_metrics(&args).await?;
        let notify = if args.broker.is_some() {
            Notify::Origin
        } else {
            Notify::Everywhere
        };
        let mut node = Node::open(
            &file,
            runtime,
            guest,
            args.fsync,
            statestore::store::clock::system(),
            notify,
        )
        .await?;
        if let Some(m) = &metrics {
            node.set_metrics(m.replica()?, m.tenant("default"));
            m.set_ready();
        }
        if let Some(broker) = args.broker.clone() {
            spec.broker.client_id = format!("{}-{}", args.client_id, file.id);
            let opts = statestore::transport::external::ServeOptions {
                // No session outlives a replica's connection: the broker
                // gives its share of the requests to the replicas that are
                // up (a kept session would queue them for a dead one).
                session_expiry: Duration::ZERO,
                shared_group: Some("statestore".into()),
                ..external_options(&args, broker, &spec)
            };
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
            options,
        )
        .await?;
        if let Some(m) = &metrics {
            m.broker_counters(server.counters())?;
        }
        server.run(shutdown_signal()).await
    })
}
