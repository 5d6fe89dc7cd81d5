//! The host's driver loop, shared by every transport: feed the guest, emit
//! its outputs, keep one timer on its next deadline.
//!
//! ```text
//!          transport.recv() ──> transport.on_event() ──> Input
//!                                                        │
//!   timer (next_deadline) ──> store.timeout(now)         v
//!                              │           store.handle(messages | disconnect)
//!                              v                         │
//!                     transport.emit(outputs) <──────────┘ then transport.settle()
//! ```
//!
//! `recv` must be cancel-safe (it races the timer, control commands and
//! shutdown); `on_event`, `emit` and `settle` always run to completion.

use std::future::Future;
use std::time::Duration;

use anyhow::Result;
use statestore_guest::types::Quota;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::store::tenant::Tenant;
use crate::{InboundMessage, Output, Runtime};

/// The most requests a transport hands the guest in one call: bounds the
/// time of one call (and so what a CPU deadline must allow) and the latency
/// of the requests behind it.
pub const MAX_BATCH: usize = 256;

/// The most bytes of requests a transport hands the guest in one call
/// (a first request of any size is taken alone).
pub(crate) const MAX_BATCH_BYTES: usize = 8 << 20;

/// What a request weighs in a batch: its payload and the fields the guest
/// reads.
pub(crate) fn message_bytes(m: &InboundMessage) -> usize {
    m.payload.len()
        + m.topic.len()
        + m.response_topic.as_ref().map_or(0, String::len)
        + m.correlation_data.as_ref().map_or(0, Vec::len)
        + m.user_properties
            .iter()
            .map(|(n, v)| n.len() + v.len() + 8)
            .sum::<usize>()
        + 64
}

/// What a transport received for the state machine.
#[derive(Debug)]
pub enum Received {
    /// Requests received together (one call into the guest).
    Messages(Vec<InboundMessage>),
    /// A client went away.
    ClientGone(String),
}

/// A way of exchanging MQTT messages with clients.
pub trait Transport {
    /// A raw event of the transport.
    type Event;
    /// The next raw event; `None` once the transport is gone for good.
    /// Must be cancel-safe.
    fn recv(&mut self) -> impl Future<Output = Option<Self::Event>>;
    /// The next raw event if one is waiting already (a transport serving
    /// several tenants: what else a replica takes before its next round);
    /// `None` by default.
    fn try_recv(&mut self) -> Option<Self::Event> {
        None
    }
    /// Deals with a raw event; returns the input for the guest, if any.
    fn on_event(&mut self, event: Self::Event) -> impl Future<Output = Result<Option<Received>>>;
    /// Carries out the guest's outputs, in order.
    fn emit(&mut self, outputs: Vec<Output>) -> impl Future<Output = Result<()>>;
    /// The tenant whose input [`Transport::on_event`] returned last: a
    /// transport may serve several tenants' clients (a cluster replica's
    /// embedded broker with `--config`); one of a single store says 0.
    fn tenant(&self) -> usize {
        0
    }
    /// Carries out the outputs of tenant `tenant`'s store, in order (see
    /// [`Transport::tenant`]).
    fn emit_to(&mut self, tenant: usize, outputs: Vec<Output>) -> impl Future<Output = Result<()>> {
        debug_assert_eq!(tenant, 0, "a transport of one tenant");
        self.emit(outputs)
    }
    /// The outputs of the last input were emitted (acknowledge its requests).
    fn settle(&mut self) -> impl Future<Output = Result<()>>;
    /// Called at each tick of a replica: acknowledge what waited too long
    /// for its reply (a transport that acknowledges at `settle` has nothing
    /// to do).
    fn tick(&mut self) -> impl Future<Output = Result<()>> {
        std::future::ready(Ok(()))
    }
    /// Starts serving the clients of tenant number `tenant`, which a
    /// cluster added while running, reached as `reach` says; a transport
    /// that cannot says why.
    fn add_tenant(&mut self, tenant: usize, reach: Reach) -> impl Future<Output = Result<()>> {
        let _ = reach;
        std::future::ready(Err(anyhow::anyhow!(
            "this transport serves a fixed set of stores (tenant {tenant} cannot be added)"
        )))
    }
    /// Stops serving the clients of tenant number `tenant`, which a
    /// cluster removed; a transport that cannot says why.
    fn remove_tenant(&mut self, tenant: usize) -> impl Future<Output = Result<()>> {
        std::future::ready(Err(anyhow::anyhow!(
            "this transport serves a fixed set of stores (tenant {tenant} cannot be removed)"
        )))
    }
    /// Shut down cleanly.
    fn close(&mut self) -> impl Future<Output = ()>;
}

pub use crate::store::clock::now_ms;

/// How the clients of a tenant a cluster added while running reach it, in
/// its transport's own terms: the embedded broker's
/// `transport::embedded::Route` (the clients it takes), or, through a
/// broker, the `transport::external::ServeOptions` of the tenant's own
/// connection; `()` for a tenant removed before it was served, whose
/// number a transport keeps with a place that takes no client. Opaque
/// here, so that neither the store nor the cluster depends on the
/// transports.
pub type Reach = Box<dyn std::any::Any + Send>;

/// Something to do to a running tenant between two inputs.
#[allow(clippy::large_enum_variant)] // rare, and sent once each
pub enum Control {
    /// Switch to another build of the component (or other limits): see
    /// [`Tenant::upgrade`]. Requests that arrive meanwhile wait.
    Upgrade {
        /// The new component, with the tenant's limits.
        runtime: Runtime,
        /// The quota from now on.
        quota: Quota,
        /// Told the outcome.
        done: oneshot::Sender<Result<()>>,
    },
    /// Replace the authorization rules of the keys: see
    /// [`Tenant::set_authorization`].
    Authorize {
        /// The rules from now on (none: every key is every client's).
        rules: Option<Vec<statestore_guest::types::AuthRule>>,
        /// Told the outcome.
        done: oneshot::Sender<Result<()>>,
    },
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Upgrade { quota, .. } => f
                .debug_struct("Upgrade")
                .field("quota", quota)
                .finish_non_exhaustive(),
            Control::Authorize { rules, .. } => f
                .debug_struct("Authorize")
                .field("rules", &rules.as_ref().map(Vec::len))
                .finish_non_exhaustive(),
        }
    }
}

/// Serves `tenant` over `transport` until `shutdown` completes (or the
/// transport ends), then closes the transport. The journal records of every
/// input are durable before its outputs are published; a failing guest is
/// restarted by the tenant (see [`Tenant::handle`]); `control` commands run
/// between inputs. A tenant that cannot go on (its journal or its restart
/// failed) stops, but its transport stays: every later request gets a 503
/// reply until shutdown, never silence, and the tenant's error is returned
/// then.
pub async fn drive<T: Transport>(
    tenant: &mut Tenant,
    transport: &mut T,
    control: &mut mpsc::UnboundedReceiver<Control>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let result = match serve(tenant, transport, control, &mut shutdown).await {
        Ended::Shutdown => Ok(()),
        Ended::Transport(e) => Err(e),
        Ended::Tenant(e) => {
            tenant.stopped();
            tracing::error!(tenant = tenant.name(), error = %format!("{e:#}"), "the tenant stopped: its clients get 503 replies until the server restarts");
            match unavailable(tenant, transport, &mut shutdown).await {
                Ok(()) => Err(e),
                Err(t) => Err(e.context(format!("then its transport failed: {t:#}"))),
            }
        }
    };
    if result.is_ok() {
        info!(tenant = tenant.name(), "shutting down");
    }
    transport.close().await;
    tenant.shutdown();
    result
}

/// How [`serve`] ended.
enum Ended {
    Shutdown,
    /// The transport failed or ended.
    Transport(anyhow::Error),
    /// The tenant cannot go on.
    Tenant(anyhow::Error),
}

async fn serve<T: Transport>(
    tenant: &mut Tenant,
    transport: &mut T,
    control: &mut mpsc::UnboundedReceiver<Control>,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Ended {
    macro_rules! tenant_op {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Ended::Tenant(e),
            }
        };
    }
    macro_rules! transport_op {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Ended::Transport(e),
            }
        };
    }
    // One timer for the guest's next deadline, reset only when the deadline
    // changes; when it fires the wall clock decides (a sleep can end early).
    let timer = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(timer);
    let mut armed: Option<u64> = None;
    let mut deadline = tenant_op!(tenant.next_deadline());
    let mut control_open = true;
    // The metrics' gauges are read from the guest now and then, traffic or not.
    let mut refresh = tokio::time::interval(crate::metrics::REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let keeps_metrics = tenant.metrics().is_some();
    loop {
        if deadline != armed {
            armed = deadline;
            if let Some(at) = armed {
                let wait = Duration::from_millis(at.saturating_sub(tenant.now_ms()));
                timer.as_mut().reset(Instant::now() + wait);
            }
        }
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return Ended::Shutdown,
            command = control.recv(), if control_open => {
                match command {
                    None => control_open = false,
                    Some(Control::Upgrade { runtime, quota, done }) => {
                        let outcome = tenant.upgrade(runtime, quota);
                        if let Err(e) = &outcome {
                            tracing::error!(tenant = tenant.name(), error = %format!("{e:#}"), "upgrade refused; the running component keeps serving");
                        }
                        let _ = done.send(outcome);
                        deadline = tenant_op!(tenant.next_deadline());
                    }
                    Some(Control::Authorize { rules, done }) => {
                        let _ = done.send(tenant.set_authorization(rules));
                    }
                }
            }
            event = transport.recv() => {
                let Some(event) = event else {
                    return Ended::Transport(anyhow::anyhow!("the transport stopped"));
                };
                let Some(input) = transport_op!(transport.on_event(event).await) else { continue };
                let now = tenant.now_ms();
                let mut taken = None;
                let outputs = match input {
                    Received::Messages(messages) => {
                        taken = Some((std::time::Instant::now(), messages.len()));
                        if let Some(m) = tenant.metrics() {
                            m.requests(messages.iter().map(|m| m.payload.as_slice()));
                        }
                        // A call into the guest at a time: each call's
                        // outputs are bounded (its output budget), and are
                        // published before the next call, so a batch of
                        // large replies is never held whole.
                        let mut rest = &messages[..];
                        let outputs = loop {
                            let (outputs, handled) = match tenant.handle_some(rest, now) {
                                Ok(done) => done,
                                Err(e) => {
                                    // The requests not yet answered get their 503 too.
                                    let replies = unavailable_replies(tenant, rest, now);
                                    if let Some(m) = tenant.metrics() {
                                        m.published(&replies);
                                    }
                                    transport_op!(transport.emit(replies).await);
                                    transport_op!(transport.settle().await);
                                    return Ended::Tenant(e);
                                }
                            };
                            rest = &rest[handled..];
                            if rest.is_empty() {
                                break outputs;
                            }
                            if let Some(m) = tenant.metrics() {
                                m.published(&outputs);
                            }
                            transport_op!(transport.emit(outputs).await);
                        };
                        debug!(tenant = tenant.name(), requests = messages.len(), "handled");
                        outputs
                    }
                    Received::ClientGone(id) => {
                        debug!(tenant = tenant.name(), client_id = %id, "client gone: dropping its KEYNOTIFY registrations");
                        tenant_op!(tenant.client_gone(&id, now))
                    }
                };
                if let Some(m) = tenant.metrics() {
                    m.published(&outputs);
                }
                transport_op!(transport.emit(outputs).await);
                transport_op!(transport.settle().await);
                if let (Some(m), Some((since, count))) = (tenant.metrics(), taken) {
                    m.answered(since, count);
                }
                tenant.refresh_metrics(false);
                deadline = tenant_op!(tenant.next_deadline());
            }
            // Requests come first (the select is biased): a mass expiry in
            // bounded calls (more due now) leaves room for them between.
            () = &mut timer, if armed.is_some() => {
                let now = tenant.now_ms();
                if deadline.is_some_and(|at| now < at) {
                    armed = None; // woke early: arm again for the same deadline
                    continue;
                }
                let outputs = tenant_op!(tenant.timeout(now));
                if let Some(m) = tenant.metrics() {
                    m.published(&outputs);
                }
                transport_op!(transport.emit(outputs).await);
                deadline = tenant_op!(tenant.next_deadline());
                if deadline.is_some_and(|at| at <= now) && !tenant.more_due() {
                    // The expiry could not be journaled (a full disk) or the
                    // guest failed on it, and the restarted store has it due
                    // again: retry in a second, not in a hot loop.
                    deadline = Some(now + 1000);
                }
            }
            _ = refresh.tick(), if keeps_metrics => tenant.refresh_metrics(false),
        }
    }
}

/// 503 replies (spec §4.3, "server not ready") to requests a stopped
/// tenant cannot handle.
fn unavailable_replies(tenant: &Tenant, messages: &[InboundMessage], now: u64) -> Vec<Output> {
    messages
        .iter()
        .filter_map(|m| {
            statestore_guest::StateMachine::host_reply(
                tenant.config(),
                m,
                now,
                statestore_guest::HostReply::Unavailable(format!(
                    "the state store tenant {:?} has stopped; see the server log",
                    tenant.name()
                )),
            )
        })
        .map(Output::Publish)
        .collect()
}

/// A stopped tenant's transport until shutdown: 503 to every request.
async fn unavailable<T: Transport>(
    tenant: &mut Tenant,
    transport: &mut T,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<()> {
    loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return Ok(()),
            event = transport.recv() => {
                let Some(event) = event else { return Ok(()) };
                if let Some(Received::Messages(messages)) = transport.on_event(event).await? {
                    let replies = unavailable_replies(tenant, &messages, tenant.now_ms());
                    if let Some(m) = tenant.metrics() {
                        m.requests(messages.iter().map(|m| m.payload.as_slice()));
                        m.published(&replies);
                    }
                    transport.emit(replies).await?;
                }
                transport.settle().await?;
            }
        }
    }
}

/// Spawns one task per tenant, each handed a future that completes at
/// shutdown, and waits: until `shutdown` completes, or every task has
/// ended. A task that ends with an error (its journal failed, its broker
/// connection broke for good) is logged and the others go on; the first
/// such error is returned once every task has stopped.
pub async fn supervise<F>(
    tenants: Vec<(String, F)>,
    shutdown: impl Future<Output = ()>,
) -> Result<()>
where
    F: FnOnce(
        std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>>,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for (name, run) in tenants {
        let mut stop = stop_rx.clone();
        let stopped = Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        let task = run(stopped);
        tasks.spawn(async move { (name, task.await) });
    }
    let mut first_error: Option<anyhow::Error> = None;
    let mut note = |name: String, e: anyhow::Error| {
        tracing::error!(tenant = %name, error = %format!("{e:#}"), "the tenant stopped; the others go on");
        if first_error.is_none() {
            first_error = Some(e.context(format!("tenant {name:?}")));
        }
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            done = tasks.join_next() => match done {
                None => break,
                Some(Ok((name, Err(e)))) => note(name, e),
                Some(Ok((_, Ok(())))) => {}
                Some(Err(e)) => tracing::error!(error = %e, "a tenant task failed"),
            },
        }
    }
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        if let Ok((name, Err(e))) = done {
            note(name, e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
