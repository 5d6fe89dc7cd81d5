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
//! `recv` must be cancel-safe (it races the timer and shutdown); `on_event`,
//! `emit` and `settle` always run to completion.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::{Backend, InboundMessage, Output};

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

/// Serves `store` over `transport` until `shutdown` completes (or the
/// transport ends), then closes the transport.
pub async fn drive<B: Backend, T: Transport>(
    store: &mut B,
    transport: &mut T,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    // One timer for the guest's next deadline, reset only when the deadline
    // changes; when it fires the wall clock decides (a sleep can end early).
    let timer = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(timer);
    let mut armed: Option<u64> = None;
    let mut deadline = store.next_deadline()?;
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
            event = transport.recv() => {
                let Some(event) = event else {
                    break Err(anyhow::anyhow!("the transport stopped"));
                };
                let Some(input) = transport.on_event(event).await? else { continue };
                let now = now_ms();
                let outputs = match input {
                    Input::Messages(messages) => {
                        let outputs = store.handle_batch(&messages, now)?;
                        debug!(requests = messages.len(), outputs = outputs.len(), "handled");
                        outputs
                    }
                    Input::ClientGone(id) => {
                        debug!(client_id = %id, "client gone: dropping its KEYNOTIFY registrations");
                        store.client_disconnected(&id, now)?;
                        store.poll_outputs()?
                    }
                };
                transport.emit(outputs).await?;
                transport.settle().await?;
                deadline = store.next_deadline()?;
            }
            () = &mut timer, if armed.is_some() => {
                let now = now_ms();
                if deadline.is_some_and(|at| now < at) {
                    armed = None; // woke early: arm again for the same deadline
                    continue;
                }
                store.timeout(now)?;
                let outputs = store.poll_outputs()?;
                transport.emit(outputs).await?;
                deadline = store.next_deadline()?;
            }
        }
    };
    if result.is_ok() {
        info!("shutting down");
    }
    transport.close().await;
    result
}
