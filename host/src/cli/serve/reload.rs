//! SIGHUP: the TLS certificate, the users file, the authorization rules,
//! and every tenant's component and limits, read again while serving.

use std::path::PathBuf;

use anyhow::{Context, Result};
use statestore::config::TenantSpec;
use statestore::store::driver::Control;
use statestore::store::tenant::{Fleet, component_hash};
use tokio::sync::mpsc;

use super::ServeArgs;
use super::options::{load_policy, tenant_specs};

/// What SIGHUP reads again besides the tenants.
pub struct Reloads {
    pub policy: std::sync::Arc<statestore::auth::policy::PolicyCell>,
    pub tls: Option<statestore::transport::embedded::TlsReload>,
    pub users: Option<std::sync::Arc<statestore::auth::users::UsersCell>>,
}

/// What a running tenant was last set up with.
pub struct Running {
    pub spec: TenantSpec,
    pub component: u64,
    pub control: mpsc::UnboundedSender<Control>,
}

/// Reads `--users-file` again into `cell`, or keeps the users in force.
fn reload_users(cell: &statestore::auth::users::UsersCell, path: &std::path::Path) {
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
pub fn spawn_users_reloader(
    cell: std::sync::Arc<statestore::auth::users::UsersCell>,
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
pub fn spawn_reloader(
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
    policy: &statestore::auth::policy::PolicyCell,
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
