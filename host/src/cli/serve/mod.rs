//! `statestore serve`: one process (the embedded broker, or through
//! --broker), or one replica of a cluster (`replica.rs`); SIGHUP reloads
//! (`reload.rs`).

pub mod args;
pub mod options;
mod reload;
mod replica;

use std::future::Future;
use std::pin::Pin;

use anyhow::{Context, Result};
use statestore::config::TenantSpec;
use statestore::mqtt::BrokerUrl;
use statestore::store::tenant::{Fleet, Tenant, WASM32_MAX_MEMORY, component_hash};
use statestore::transport::embedded::{EmbeddedServer, Route};
use statestore::transport::external::Server;

pub use args::ServeArgs;
use options::{
    broker_options, check_listeners, check_serve_args, external_options, load_policy, password,
    server_runtime, start_metrics, tenant_specs, users,
};
use reload::{Reloads, Running, spawn_reloader};

use super::shutdown_signal;

/// A tenant opened, before it serves: its spec and component hash.
type Opened = (TenantSpec, u64, Tenant);

pub fn run(args: ServeArgs) -> Result<()> {
    let password = password(&args)?;
    check_serve_args(&args)?;
    statestore::process::raise_open_files_limit();
    if let Some(path) = args.cluster.clone() {
        return replica::run(args, &path);
    }
    check_listeners(&args, args.listen)?;
    let specs = tenant_specs(&args, password.clone())?;
    let policy = statestore::auth::policy::PolicyCell::new(load_policy(&args)?);
    if args.authorization.is_some() && args.broker.is_some() {
        tracing::info!(
            "--authorization with --broker: the store checks keys; Connect, Publish and Subscribe are the broker's to check"
        );
    }
    // One thread: a request and its reply never cross threads.
    let rt = server_runtime(&args, 1)?;
    // Metrics first, so that /readyz says "starting" during recovery.
    let metrics = rt.block_on(start_metrics(&args))?;
    let cache_dir = statestore::runtime::cache::default_dir().filter(|_| !args.no_cache);
    let mut fleet = Fleet::new(specs.len(), max_memory(&specs), cache_dir)?;
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
    let server = Setup {
        args,
        password,
        fleet,
        metrics,
        policy,
    };
    match server.args.broker.clone() {
        None => rt.block_on(server.embedded(tenants)),
        Some(broker) => rt.block_on(server.external(tenants, broker)),
    }
}

/// The largest memory cap of the tenants `specs` (the pool reserves that
/// for every instance).
fn max_memory(specs: &[TenantSpec]) -> usize {
    specs
        .iter()
        .map(|s| s.limits.memory_bytes.unwrap_or(WASM32_MAX_MEMORY))
        .max()
        .unwrap_or(WASM32_MAX_MEMORY)
}

/// What a single process serves with, once its tenants are open.
struct Setup {
    args: ServeArgs,
    password: Option<String>,
    fleet: Fleet,
    metrics: Option<std::sync::Arc<statestore::metrics::Metrics>>,
    policy: std::sync::Arc<statestore::auth::policy::PolicyCell>,
}

impl Setup {
    /// Serves `tenants` on the embedded broker.
    async fn embedded(self, tenants: Vec<Opened>) -> Result<()> {
        let args = &self.args;
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
        let users = users(args)?;
        let options = broker_options(
            args,
            users.clone(),
            self.metrics.as_deref(),
            self.policy.clone(),
            args.data_dir.clone(),
        );
        let server =
            EmbeddedServer::start_tenants_with(args.listen, &args.client_id, with_routes, options)
                .await?;
        if let Some(m) = &self.metrics {
            m.broker_counters(server.counters())?;
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
            policy: self.policy,
            tls: server.tls(),
            users,
        };
        spawn_reloader(self.args, self.password, self.fleet, running, reloads)?;
        server.run(shutdown_signal()).await
    }

    /// Serves `tenants` through `broker`, each as its own MQTT client.
    async fn external(self, tenants: Vec<Opened>, broker: BrokerUrl) -> Result<()> {
        let mut servers = Vec::new();
        let mut running = Vec::new();
        for (spec, component, tenant) in tenants {
            let url = spec.broker.url.clone().unwrap_or_else(|| broker.clone());
            let opts = external_options(&self.args, url, &spec);
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
        if let Some(m) = &self.metrics {
            m.set_ready();
        }
        let reloads = Reloads {
            policy: self.policy,
            tls: None,
            users: None,
        };
        spawn_reloader(self.args, self.password, self.fleet, running, reloads)?;
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
        statestore::store::driver::supervise(runs, shutdown_signal()).await
    }
}
