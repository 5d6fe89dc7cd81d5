//! Who the embedded broker lets in, and how much it holds for them in all:
//! password guesses per address, sessions (connected or parked) per address
//! and in all, and the count of what was refused at each bound.
//!
//! Connections before their CONNECT are bounded inside rmqtt
//! (`rmqtt::pre_connect`); connections at once per address in the
//! authentication hook; a session's queued bytes, and all sessions' bytes
//! together, in [`crate::transport::embedded::queue_bytes`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the broker refused at a bound or a rule, by reason, for
/// `--metrics` (`statestore_broker_refused_total{reason}`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Refusals(Option<prometheus::IntCounterVec>);

impl Refusals {
    /// Counting into `metric`, if there is one.
    pub fn new(metric: Option<prometheus::IntCounterVec>) -> Refusals {
        Refusals(metric)
    }

    /// One more refusal for `reason`.
    pub fn count(&self, reason: &str) {
        if let Some(m) = &self.0 {
            m.with_label_values(&[reason]).inc();
        }
    }
}

/// Most addresses whose failed logins are remembered; past it, an address
/// that has not failed recently is not tracked (its first failures are
/// judged as usual) rather than the map growing.
const MAX_TRACKED: usize = 65_536;

/// Failed logins per IP address, as a bucket of `max` tokens refilled at
/// `max` a minute: each failure takes one; an address with none left has
/// its CONNECTs refused without their password being judged (CONNACK 0x9F
/// "connection rate exceeded") until a token is back. So one address
/// judges at most `max` guesses a minute however many connections it
/// opens, and a refusal holds no handshake slot (no sleeping).
#[derive(Debug)]
pub(crate) struct LoginThrottle {
    max: u32,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl LoginThrottle {
    /// At most `max` failed logins a minute per address (0: no bound).
    pub fn new(max: u32) -> LoginThrottle {
        LoginThrottle {
            max,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let per_sec = f64::from(self.max) / 60.0;
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec).min(f64::from(self.max));
        b.at = now;
    }

    /// Takes a guess for a login from `ip`, if the address has one left:
    /// taken before the password is judged, so that logins judged at once
    /// cannot each pass the check before any failure counts; a login that
    /// succeeds gives it back ([`LoginThrottle::succeeded`]).
    pub fn begin(&self, ip: IpAddr) -> bool {
        self.begin_at(ip, Instant::now())
    }

    fn begin_at(&self, ip: IpAddr, now: Instant) -> bool {
        if self.max == 0 {
            return true;
        }
        let max = f64::from(self.max);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_TRACKED && !buckets.contains_key(&ip) {
            // Forget the addresses whose buckets are full again.
            let per_sec = max / 60.0;
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_sec < max
            });
            if buckets.len() >= MAX_TRACKED {
                // Too many addresses failing at once to track: judged.
                return true;
            }
        }
        let b = buckets.entry(ip).or_insert(Bucket {
            tokens: max,
            at: now,
        });
        self.refill(b, now);
        if b.tokens < 1.0 {
            return false;
        }
        b.tokens -= 1.0;
        true
    }

    /// A login from `ip` that [`LoginThrottle::begin`] let through was
    /// right: its guess is given back.
    pub fn succeeded(&self, ip: IpAddr) {
        if self.max == 0 {
            return;
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = buckets.get_mut(&ip) {
            b.tokens = (b.tokens + 1.0).min(f64::from(self.max));
            if b.tokens >= f64::from(self.max) {
                buckets.remove(&ip);
            }
        }
    }
}

/// The broker's sessions, connected or parked (a persistent session whose
/// client is away still holds its subscriptions and queue), by client id,
/// with the IP address of the connection that last held each: bounded per
/// address and in all, so that parked sessions cannot pile up where the
/// connection limits do not look.
#[derive(Debug)]
pub struct Sessions {
    max: usize,
    max_per_address: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    by_client: HashMap<String, Option<IpAddr>>,
    per_address: HashMap<IpAddr, usize>,
}

impl Held {
    fn remove(&mut self, client: &str) {
        if let Some(Some(ip)) = self.by_client.remove(client)
            && let Some(n) = self.per_address.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&ip);
            }
        }
    }
}

impl Sessions {
    /// At most `max` sessions, and `max_per_address` from one address (0:
    /// no bound).
    pub fn new(max: usize, max_per_address: usize) -> Sessions {
        Sessions {
            max,
            max_per_address,
            held: Mutex::new(Held::default()),
        }
    }

    /// Whether `client` connecting from `ip` may have a session: it has
    /// one already (it resumes or takes it over), or one more fits.
    pub fn has_room(&self, client: &str, ip: Option<IpAddr>) -> bool {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.by_client.contains_key(client) {
            return true;
        }
        let from_ip = ip.map_or(0, |ip| held.per_address.get(&ip).copied().unwrap_or(0));
        (self.max == 0 || held.by_client.len() < self.max)
            && (self.max_per_address == 0 || ip.is_none() || from_ip < self.max_per_address)
    }

    /// `client`'s session is held by a connection from `ip` now.
    pub fn connected(&self, client: &str, ip: Option<IpAddr>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.remove(client);
        held.by_client.insert(client.to_string(), ip);
        if let Some(ip) = ip {
            *held.per_address.entry(ip).or_insert(0) += 1;
        }
    }

    /// `client`'s session ended (its connection from `ip`, if the session
    /// is still the one that connection held).
    pub fn ended(&self, client: &str, ip: Option<IpAddr>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.by_client.get(client).is_some_and(|at| *at == ip) {
            held.remove(client);
        }
    }

    /// Sessions held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_client
            .len()
    }

    /// Whether none are held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a connection has from accept to send its whole CONNECT, by
/// default.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_guesses_a_minute_and_others_are_not_touched() {
        let t = LoginThrottle::new(3);
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let t0 = Instant::now();
        // A right password gives its guess back.
        assert!(t.begin_at(a, t0));
        t.succeeded(a);
        for _ in 0..3 {
            assert!(t.begin_at(a, t0));
        }
        assert!(!t.begin_at(a, t0), "a fourth guess at once");
        assert!(t.begin_at(b, t0), "another address");
        // One guess comes back every 20 s (3 a minute).
        assert!(!t.begin_at(a, t0 + Duration::from_secs(19)));
        assert!(t.begin_at(a, t0 + Duration::from_secs(21)));
        assert!(!t.begin_at(a, t0 + Duration::from_secs(22)));
        // No bound.
        let none = LoginThrottle::new(0);
        for _ in 0..100 {
            assert!(none.begin_at(a, t0));
        }
    }

    #[test]
    fn sessions_are_bounded_per_address_and_in_all() {
        let s = Sessions::new(3, 2);
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        s.connected("a1", Some(a));
        s.connected("a2", Some(a));
        assert!(!s.has_room("a3", Some(a)), "a third session of a");
        assert!(s.has_room("a1", Some(a)), "a1 resumes its own");
        assert!(s.has_room("b1", Some(b)));
        s.connected("b1", Some(b));
        assert!(!s.has_room("b2", Some(b)), "three in all");
        // A takeover from another address moves the session there.
        s.connected("a1", Some(b));
        assert!(!s.has_room("a3", Some(a)), "three in all still");
        s.ended("a2", Some(a));
        assert!(s.has_room("a3", Some(a)));
        // The old connection's end does not end the session taken over.
        s.ended("a1", Some(a));
        assert_eq!(s.len(), 2);
        s.ended("a1", Some(b));
        s.ended("b1", Some(b));
        assert!(s.is_empty());
    }
}
