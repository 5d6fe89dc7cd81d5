//! The key table: values, versions, fencing tokens, expiry (spec §5.3, §8.5, §9, §10).
//!
//! [`Table::execute`] applies one parsed GET / SET / DEL / VDEL (KEYNOTIFY is
//! the registry's) after the envelope has validated `__ts` and `__ft`, and
//! says what changed so that the caller can notify observers.

pub mod fencing;

use std::collections::BTreeMap;

use crate::command::{Command, Condition};
use crate::errors::ServiceError;
use crate::expiry::Deadlines;
use crate::hlc::{Clock, CounterOverflow, Hlc};
use crate::resp3;

/// A server-issued version: the node id is always the store's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// HLC wall time, ms.
    pub wall: u64,
    /// HLC counter (< 2^31).
    pub counter: u32,
}

impl Version {
    /// The version part of a server-issued HLC.
    pub fn of(hlc: &Hlc) -> Version {
        // The clock never issues a counter above hlc::MAX_COUNTER < u32::MAX.
        Version {
            wall: hlc.wall,
            counter: u32::try_from(hlc.counter).unwrap_or(u32::MAX),
        }
    }

    /// This version as an HLC of `node`.
    pub fn to_hlc(self, node: &str) -> Hlc {
        Hlc {
            wall: self.wall,
            counter: u64::from(self.counter),
            node: node.to_string(),
        }
    }
}

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Box<[u8]>,
    /// Its version (the HLC of the SET that wrote it).
    pub version: Version,
    /// The fencing token protecting it.
    pub fencing_token: Option<Box<Hlc>>,
    /// When it expires (ms), if ever.
    pub expires_at: Option<u64>,
    /// Set with `aio-persistence: true`.
    pub persist: bool,
}

impl Entry {
    /// Whether the entry is visible at `now` (expired keys are invisible at once).
    pub fn live_at(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }
}

/// What a command did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing changed.
    None,
    /// The key was written: notify SET with its new value.
    Set,
    /// The key was deleted: notify DELETE.
    Delete,
}

/// The result of executing a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Reply payload.
    pub reply: Vec<u8>,
    /// `__ts` of the reply (spec §8.5), if any.
    pub version: Option<Hlc>,
    /// What changed.
    pub change: Change,
}

impl Outcome {
    fn error(e: ServiceError) -> Outcome {
        Outcome {
            reply: e.reply(),
            version: None,
            change: Change::None,
        }
    }
}

/// Per-request facts the envelope has already validated.
#[derive(Debug, Clone, Copy)]
pub struct Request<'r> {
    /// Time of handling.
    pub now: u64,
    /// L after absorbing the request's `__ts`, if it carried one.
    pub received: Option<&'r Hlc>,
    /// The request's `__ft`, parsed and skew-checked.
    pub fencing_token: Option<&'r Hlc>,
    /// `aio-persistence: true` was set.
    pub persist: bool,
}

/// All keys, with an index of their deadlines.
#[derive(Debug, Clone, Default)]
pub struct Table {
    entries: BTreeMap<Box<[u8]>, Entry>,
    deadlines: Deadlines<Box<[u8]>>,
}

impl Table {
    /// The entry for `key` if it is live at `now`.
    pub fn get(&self, key: &[u8], now: u64) -> Option<&Entry> {
        self.entries.get(key).filter(|e| e.live_at(now))
    }

    /// The entry for `key`, live or not.
    pub fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Inserts or replaces an entry, keeping the deadline index in step.
    pub fn put(&mut self, key: &[u8], entry: Entry) {
        let due = entry.expires_at;
        if let Some(at) = self
            .entries
            .insert(key.into(), entry)
            .and_then(|old| old.expires_at)
        {
            self.deadlines.remove(at, &Box::from(key));
        }
        if let Some(at) = due {
            self.deadlines.insert(at, key.into());
        }
    }

    /// Removes an entry.
    pub fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let old = self.entries.remove(key)?;
        if let Some(at) = old.expires_at {
            self.deadlines.remove(at, &Box::from(key));
        }
        Some(old)
    }

    /// The earliest expiry deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.next()
    }

    /// Removes and returns one key whose deadline is `<= now`.
    pub fn pop_expired(&mut self, now: u64) -> Option<(Box<[u8]>, Entry)> {
        let (_, key) = self.deadlines.pop_due(now)?;
        // The index only holds deadlines of present entries (put/remove keep it
        // in step), so the entry exists.
        let entry = self.entries.remove(&key)?;
        Some((key, entry))
    }

    /// Number of keys, including expired ones not yet removed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.entries.iter().map(|(k, e)| (&**k, e))
    }

    /// Applies GET / SET / DEL / VDEL (spec §5.4 steps 9 to 11).
    ///
    /// `node` is the clock's node id, for versions in replies.
    pub fn execute(
        &mut self,
        command: &Command<'_>,
        req: Request<'_>,
        clock: &mut Clock,
        node: &str,
    ) -> Result<Outcome, CounterOverflow> {
        let now = req.now;
        // A mutation's version: L after receiving `__ts`, or a local tick.
        let stamp = |clock: &mut Clock| match req.received {
            Some(hlc) => Ok(hlc.clone()),
            None => clock.tick(now),
        };
        Ok(match *command {
            Command::Get { key } => match self.get(key, now) {
                Some(e) => Outcome {
                    reply: resp3::bulk(&e.value),
                    version: Some(e.version.to_hlc(node)),
                    change: Change::None,
                },
                None => Outcome {
                    reply: resp3::REPLY_NIL.to_vec(),
                    version: None,
                    change: Change::None,
                },
            },
            Command::Set {
                key,
                value,
                condition,
                px,
            } => {
                let current = self.get(key, now);
                let token = current.and_then(|e| e.fencing_token.as_deref());
                if let Err(e) = fencing::check(token, req.fencing_token) {
                    return Ok(Outcome::error(e));
                }
                let applies = match (condition, current) {
                    (Condition::Always, _) | (_, None) => true,
                    (Condition::Nx, Some(_)) => false,
                    (Condition::Nex, Some(e)) => *e.value == *value,
                };
                if !applies {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_APPLIED.to_vec(),
                        version: current.map(|e| e.version.to_hlc(node)),
                        change: Change::None,
                    });
                }
                let version = stamp(clock)?;
                let token = fencing::after_set(token.cloned(), req.fencing_token);
                self.put(
                    key,
                    Entry {
                        value: value.into(),
                        version: Version::of(&version),
                        fencing_token: token.map(Box::new),
                        expires_at: px.map(|ms| now.saturating_add(ms)),
                        persist: req.persist,
                    },
                );
                Outcome {
                    reply: resp3::REPLY_OK.to_vec(),
                    version: Some(version),
                    change: Change::Set,
                }
            }
            Command::Del { key } | Command::VDel { key, .. } => {
                let Some(current) = self.get(key, now) else {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_FOUND.to_vec(),
                        version: None,
                        change: Change::None,
                    });
                };
                let token = current.fencing_token.as_deref();
                if let Err(e) = fencing::check(token, req.fencing_token) {
                    return Ok(Outcome::error(e));
                }
                if let Command::VDel { value, .. } = *command
                    && *current.value != *value
                {
                    return Ok(Outcome {
                        reply: resp3::REPLY_NOT_APPLIED.to_vec(),
                        version: Some(current.version.to_hlc(node)),
                        change: Change::None,
                    });
                }
                let version = stamp(clock)?;
                self.remove(key);
                Outcome {
                    reply: resp3::REPLY_DELETED.to_vec(),
                    version: Some(version),
                    change: Change::Delete,
                }
            }
            // The registry, not the table, handles KEYNOTIFY.
            Command::KeyNotify { .. } => Outcome::error(ServiceError::UnknownCommand),
        })
    }
}
