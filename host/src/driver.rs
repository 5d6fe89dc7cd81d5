//! The host's driver loop, shared by every transport: feed the guest, emit
//! its outputs, keep one timer on its next deadline.
//!
//! ```text
//!          transport.recv() ──> transport.on_event() ──> Input
//!                                                        │
//!   timer (next_deadline) ──> store.timeout(now)         v
//!                              │           store.handle_batch / client_disconnected
//!                              v                         │
//!                     transport.emit(outputs) <──────────┘ then transport.settle()
//! ```
//!
//! `recv` must be cancel-safe (it races the timer, control commands and
//! shutdown); `on_event`, `emit` and `settle` always run to completion.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use statestore_guest::types::{Bytes, Quota, Str};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::journal::Journal;
use crate::tenant::Tenant;
use crate::{InboundMessage, OutboundMessage, Output, PublishKind, Runtime, WasmStore};

/// The most requests a transport hands the guest in one call: bounds the
/// time of one call (and so what a CPU deadline must allow) and the latency
/// of the requests behind it.
pub const MAX_BATCH: usize = 256;

/// What a transport hands the state machine.
#[derive(Debug)]
pub enum Input {
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
    /// Deals with a raw event; returns the input for the guest, if any.
    fn on_event(&mut self, event: Self::Event) -> impl Future<Output = Result<Option<Input>>>;
    /// Carries out the guest's outputs, in order.
    fn emit(&mut self, outputs: Vec<Output>) -> impl Future<Output = Result<()>>;
    /// The outputs of the last input were emitted (acknowledge its requests).
    fn settle(&mut self) -> impl Future<Output = Result<()>>;
    /// Shut down cleanly.
    fn close(&mut self) -> impl Future<Output = ()>;
}

/// Milliseconds since the Unix epoch: the `now` handed to the guest.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Makes the journal records among `outputs` durable (per the fsync
/// policy) and returns the rest, to publish. If the records cannot be
/// written (a full disk), nothing of the batch stays applied: the store is
/// reloaded from disk and every reply of the batch becomes a 500.
pub fn commit(
    store: &mut WasmStore,
    journal: Option<&mut Journal>,
    outputs: Vec<Output>,
) -> Result<Vec<Output>> {
    let (records, publishes): (Vec<Output>, Vec<Output>) = outputs
        .into_iter()
        .partition(|o| matches!(o, Output::Journal(_)));
    let Some(journal) = journal else {
        return Ok(publishes);
    };
    let records: Vec<Vec<u8>> = records
        .into_iter()
        .filter_map(|o| match o {
            Output::Journal(r) => Some(r),
            _ => None,
        })
        .collect();
    match journal.append(&records) {
        Ok(()) => {
            if journal.snapshot_due()
                && let Err(e) = journal.snapshot(store)
            {
                // The log keeps everything; the next due check tries again.
                tracing::warn!(error = %format!("{e:#}"), "cannot take a snapshot");
            }
            Ok(publishes)
        }
        Err(e) => {
            tracing::error!(error = %e, dir = %journal.dir().display(), "cannot write the journal: answering the batch with errors");
            *store = journal.reload()?;
            Ok(publishes
                .into_iter()
                .filter_map(|o| match o {
                    Output::Publish(m) if m.kind == PublishKind::Response => {
                        Some(Output::Publish(failed(m, &e)))
                    }
                    _ => None, // notifications of changes that did not happen
                })
                .collect())
        }
    }
}

/// A 500 reply in place of `reply` (spec §4.3).
fn failed(reply: OutboundMessage, e: &std::io::Error) -> OutboundMessage {
    let s = Str::from_static;
    let mut props: Vec<statestore_guest::types::Property> = vec![
        (s("__stat"), s("500")),
        (s("__protVer"), s("1.0")),
        (
            s("__stMsg"),
            format!("the state store could not make the change durable: {e}").into(),
        ),
    ];
    props.extend(
        reply
            .user_properties
            .iter()
            .filter(|(n, _)| n == "__srcId")
            .cloned(),
    );
    OutboundMessage {
        payload: Bytes::new(),
        user_properties: props,
        ..reply
    }
}

/// Something to do to a running tenant between two inputs.
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
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Upgrade { quota, .. } => f
                .debug_struct("Upgrade")
                .field("quota", quota)
                .finish_non_exhaustive(),
        }
    }
}

/// Serves `tenant` over `transport` until `shutdown` completes (or the
/// transport ends), then closes the transport. The journal records of every
/// input are durable before its outputs are published; a failing guest is
/// restarted by the tenant (see [`Tenant::handle`]); `control` commands run
/// between inputs.
pub async fn drive<T: Transport>(
    tenant: &mut Tenant,
    transport: &mut T,
    control: &mut mpsc::UnboundedReceiver<Control>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    // One timer for the guest's next deadline, reset only when the deadline
    // changes; when it fires the wall clock decides (a sleep can end early).
    let timer = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(timer);
    let mut armed: Option<u64> = None;
    let mut deadline = tenant.next_deadline()?;
    let mut control_open = true;
    let result = loop {
        if deadline != armed {
            armed = deadline;
            if let Some(at) = armed {
                let wait = Duration::from_millis(at.saturating_sub(now_ms()));
                timer.as_mut().reset(Instant::now() + wait);
            }
        }
        tokio::select! {
            biased;
            () = &mut shutdown => break Ok(()),
            command = control.recv(), if control_open => {
                match command {
                    None => control_open = false,
                    Some(Control::Upgrade { runtime, quota, done }) => {
                        let outcome = tenant.upgrade(runtime, quota);
                        if let Err(e) = &outcome {
                            tracing::error!(tenant = tenant.name(), error = %format!("{e:#}"), "upgrade refused; the running component keeps serving");
                        }
                        let _ = done.send(outcome);
                        deadline = tenant.next_deadline()?;
                    }
                }
            }
            event = transport.recv() => {
                let Some(event) = event else {
                    break Err(anyhow::anyhow!("the transport stopped"));
                };
                let Some(input) = transport.on_event(event).await? else { continue };
                let now = now_ms();
                let outputs = match input {
                    Input::Messages(messages) => {
                        let outputs = tenant.handle(&messages, now)?;
                        debug!(tenant = tenant.name(), requests = messages.len(), outputs = outputs.len(), "handled");
                        outputs
                    }
                    Input::ClientGone(id) => {
                        debug!(tenant = tenant.name(), client_id = %id, "client gone: dropping its KEYNOTIFY registrations");
                        tenant.client_gone(&id, now)?
                    }
                };
                transport.emit(outputs).await?;
                transport.settle().await?;
                deadline = tenant.next_deadline()?;
            }
            () = &mut timer, if armed.is_some() => {
                let now = now_ms();
                if deadline.is_some_and(|at| now < at) {
                    armed = None; // woke early: arm again for the same deadline
                    continue;
                }
                let outputs = tenant.timeout(now)?;
                transport.emit(outputs).await?;
                deadline = tenant.next_deadline()?;
                if deadline.is_some_and(|at| at <= now) {
                    // The expiry could not be journaled (a full disk) or the
                    // guest failed on it, and the restarted store has it due
                    // again: retry in a second, not in a hot loop.
                    deadline = Some(now + 1000);
                }
            }
        }
    };
    if result.is_ok() {
        info!(tenant = tenant.name(), "shutting down");
    }
    transport.close().await;
    result
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
