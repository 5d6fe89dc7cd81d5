//! Connections accepted whose CONNECT has not been handled yet, bounded.
//!
//! A TCP connection costs the server a file descriptor and a task from
//! `accept` on, but rmqtt starts its handshake timeout only once the MQTT
//! protocol version has been read: a client that connects and sends
//! nothing (or the first byte and nothing more) was held for ever, and
//! enough of them took every file descriptor. A [`PreConnect`] gate bounds
//! them in all and per IP address, and gives each a deadline measured from
//! accept for the TLS handshake, the version and the CONNECT together. A
//! connection past a bound is closed at once, before anything is read.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a gate counts when it refuses: `"pre_connect"` (a bound) or
/// `"handshake_timeout"` (no CONNECT in time).
pub type OnRefuse = Arc<dyn Fn(&'static str) + Send + Sync>;

/// The bounds on connections before their CONNECT; the default bounds
/// nothing (rmqtt's own behaviour).
pub struct PreConnect {
    /// Most connections at once before their CONNECT (0: no bound).
    pub max_total: usize,
    /// Most of them from one IP address (0: no bound).
    pub max_per_address: usize,
    /// How long a connection has from accept to send its whole CONNECT
    /// (`None`: the listener's handshake timeout, from the version on).
    pub timeout: Option<Duration>,
    /// Told of each refusal.
    pub on_refuse: Option<OnRefuse>,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

impl Default for PreConnect {
    fn default() -> Self {
        PreConnect::new(0, 0, None, None)
    }
}

impl std::fmt::Debug for PreConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreConnect")
            .field("max_total", &self.max_total)
            .field("max_per_address", &self.max_per_address)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl PreConnect {
    /// A gate with these bounds.
    pub fn new(
        max_total: usize,
        max_per_address: usize,
        timeout: Option<Duration>,
        on_refuse: Option<OnRefuse>,
    ) -> PreConnect {
        PreConnect { max_total, max_per_address, timeout, on_refuse, held: Mutex::new(Held::default()) }
    }

    /// Admits a connection from `ip` just accepted, if the bounds have room:
    /// it counts until the permit is dropped (once its CONNECT is handled).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let from_ip = held.per_address.get(&ip).copied().unwrap_or(0);
        if (self.max_total > 0 && held.total >= self.max_total)
            || (self.max_per_address > 0 && from_ip >= self.max_per_address)
        {
            drop(held);
            self.refused("pre_connect");
            return None;
        }
        held.total += 1;
        held.per_address.insert(ip, from_ip + 1);
        Some(Permit { gate: self.clone(), ip, deadline: self.timeout.map(|t| Instant::now() + t) })
    }

    /// Connections admitted and not yet through their CONNECT.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    pub(crate) fn refused(&self, reason: &'static str) {
        if let Some(f) = &self.on_refuse {
            f(reason);
        }
    }

    fn release(&self, ip: IpAddr) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.per_address.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.per_address.remove(&ip);
            }
        }
    }
}

/// A connection counted by a [`PreConnect`] gate, until dropped.
pub struct Permit {
    gate: Arc<PreConnect>,
    ip: IpAddr,
    deadline: Option<Instant>,
}

impl Permit {
    /// Time left until its deadline, if the gate gives one.
    pub fn left(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The CONNECT did not come in time.
    pub fn timed_out(&self) {
        self.gate.refused("handshake_timeout");
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.ip);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("ip", &self.ip).field("deadline", &self.deadline).finish()
    }
}
