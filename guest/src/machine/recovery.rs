//! Moving a state machine's state in and out: snapshots ([`crate::snapshot`]
//! format) and journal replay ([`crate::journal`] records). The formats are
//! pure encodings; what their contents mean for the state is decided here.

use super::StateMachine;
use crate::hlc::{Clock, Hlc};
use crate::journal::{self, Record};
use crate::notify::Registry;
use crate::rpc::Reply;
use crate::rpc::dedup::{Cached, DedupCache};
use crate::snapshot::{self, Parts, SnapshotScope, Visitor};
use crate::table::{Entry, EntryRef, Table};
use crate::types::{Config, Error, OutboundMessage, Persist};

impl StateMachine {
    /// The whole state in the snapshot format.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_with(SnapshotScope::Everything)
    }

    /// A snapshot of `scope`.
    pub fn snapshot_with(&self, scope: SnapshotScope) -> Vec<u8> {
        let durable = scope == SnapshotScope::Durable;
        let keep = |e: &EntryRef<'_>| {
            !durable
                || !matches!(self.config.persist, Persist::Flagged | Persist::Custom)
                || e.persist
        };
        let keys: Vec<_> = self.table.iter().filter(|(_, e)| keep(e)).collect();
        let registrations = if durable { 0 } else { self.registry.len() };
        let dedup = self.dedup.iter().map(|(topic, corr, cached)| {
            let message = self.cached_message(topic, corr, &cached.reply);
            (topic, corr, cached.expires_at, message)
        });
        let dedup = ExactLen(dedup, self.dedup.len());
        // The length it will have (an upper bound for the dedup cache).
        let node = self.config.node_id.len();
        let keys_len: usize = keys
            .iter()
            .map(|(k, e)| {
                let ft = e.fencing_token.map_or(1, |ft| 21 + ft.node.len());
                4 + k.len() + 4 + e.value.len() + 12 + ft + 9 + 1
            })
            .sum();
        let registrations_len: usize = self
            .registry
            .iter()
            .take(registrations)
            .map(|(c, k)| 8 + c.len() + k.len())
            .sum();
        let dedup_len: usize = self
            .dedup
            .iter()
            .map(|(topic, corr, cached)| {
                let extra: usize = cached
                    .reply
                    .extra
                    .iter()
                    .map(|(n, v)| 8 + n.len() + v.len())
                    .sum();
                2 * (4 + topic.len())
                    + 2 * (5 + corr.len())
                    + 8
                    + 4
                    + cached.reply.payload.len()
                    + extra
                    + 160
                    + 2 * node
            })
            .sum();
        snapshot::write(
            Parts::new(
                self.clock.parts(),
                keys.into_iter(),
                ExactLen(self.registry.iter().take(registrations), registrations),
                dedup,
            )
            .with_capacity(64 + keys_len + registrations_len + dedup_len),
        )
    }

    /// A store with the state of `snapshot`.
    pub fn restore(config: Config, snapshot: &[u8]) -> Result<StateMachine, Error> {
        config.validate()?;
        let mut state = Restored {
            clock: (0, 0),
            table: Table::with_seed(config.hash_seed),
            registry: Registry::default(),
            dedup: DedupCache::with_seed(config.hash_seed),
        };
        snapshot::read(snapshot, &mut state)?;
        let (wall, counter) = state.clock;
        let clock = Clock::restored(config.node_id.clone(), wall, counter);
        Ok(StateMachine::from_parts(
            clock,
            config,
            state.table,
            state.registry,
            state.dedup,
        ))
    }

    fn observe_own(&mut self, hlc: &Hlc) {
        if hlc.node == self.config.node_id {
            self.clock.observe(hlc.wall, hlc.counter);
        }
    }

    /// Applies one journal record to the state (no outputs). Used to rebuild
    /// a store from a snapshot plus the records written after it.
    pub fn replay(&mut self, record: &[u8]) -> Result<(), Error> {
        match journal::decode(record)? {
            Record::Put { key, entry } => {
                if let Some(ft) = entry.fencing_token.as_deref() {
                    self.observe_own(ft);
                }
                self.clock
                    .observe(entry.version.wall, u64::from(entry.version.counter));
                self.table.put(key, entry.as_ref());
            }
            Record::Remove { key, version } => {
                self.clock.observe(version.wall, u64::from(version.counter));
                self.table.remove(key);
            }
            Record::Reply {
                topic,
                correlation,
                forget_at,
                reply,
            } => {
                // A published version (also of keys not journaled) must stay
                // older than every version issued after a restart.
                if let Some(ts) = reply.user_property("__ts").and_then(|t| Hlc::parse(t).ok()) {
                    self.observe_own(&ts);
                }
                let reply = reply_of(&reply, Error::BadRecord)?;
                self.dedup.insert(
                    &topic,
                    correlation,
                    Cached {
                        expires_at: forget_at,
                        reply,
                    },
                );
            }
        }
        Ok(())
    }
}

/// The reply a stored message was made from.
fn reply_of(m: &OutboundMessage, bad: fn(String) -> Error) -> Result<Reply, Error> {
    Reply::of_message(m).ok_or_else(|| bad("a cached reply is not a reply".into()))
}

/// An iterator whose length is known (the dedup cache's).
struct ExactLen<I>(I, usize);

impl<I: Iterator> Iterator for ExactLen<I> {
    type Item = I::Item;
    fn next(&mut self) -> Option<I::Item> {
        let item = self.0.next()?;
        self.1 = self.1.saturating_sub(1);
        Some(item)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator> ExactSizeIterator for ExactLen<I> {}

/// The parts of a state as [`snapshot::read`] finds them.
struct Restored {
    clock: (u64, u64),
    table: Table,
    registry: Registry,
    dedup: DedupCache,
}

impl Visitor for Restored {
    fn clock(&mut self, wall: u64, counter: u64) {
        self.clock = (wall, counter);
    }
    fn key(&mut self, key: &[u8], entry: Entry) {
        self.table.put(key, entry.as_ref());
    }
    fn registration(&mut self, client: &str, key: &[u8]) {
        self.registry.restore(client, key);
    }
    fn reply(
        &mut self,
        topic: &str,
        correlation: &[u8],
        expires_at: u64,
        reply: OutboundMessage,
    ) -> Result<(), Error> {
        let reply = reply_of(&reply, Error::BadSnapshot)?;
        self.dedup
            .insert(topic, correlation, Cached { expires_at, reply });
        Ok(())
    }
}
