//! Moving a state machine's state in and out: snapshots ([`crate::snapshot`]
//! format) and journal replay ([`crate::journal`] records). The formats are
//! pure encodings; what their contents mean for the state is decided here.

use super::StateMachine;
use crate::LARGE_VALUE;
use crate::codec::Writer;
use crate::hlc::{Clock, Hlc};
use crate::journal::{self, Record};
use crate::notify::{Registry, Watcher};
use crate::rpc::Reply;
use crate::rpc::dedup::{Cached, DedupCache};
use crate::snapshot::{self, SnapshotScope, Visitor};
use crate::table::{EntryMeta, EntryRef, Table};
use crate::types::{Config, Error, OutboundMessage, Persist, Via};

/// A snapshot being taken in parts ([`StateMachine::snapshot_part`]): where
/// it has got to. Only valid while the state does not change.
#[derive(Debug)]
pub struct SnapshotCursor {
    scope: SnapshotScope,
    at: At,
    /// CRC of the parts returned so far.
    crc: crc32fast::Hasher,
}

#[derive(Debug)]
enum At {
    /// Nothing written yet.
    Start,
    /// Keys after `after` (from the first when `None`), `left` of them.
    Keys { after: Option<Box<[u8]>>, left: u64 },
    /// Inside the large value of `key`, `done` bytes of it written; then
    /// its entry's last fields, and `left` keys after it.
    Value {
        key: Box<[u8]>,
        done: usize,
        left: u64,
    },
    /// The count of registrations.
    RegistrationCount,
    /// Registrations after `after` (client, key; from the first when
    /// `None`), `left` of them.
    Registrations {
        after: Option<(String, Box<[u8]>)>,
        left: usize,
    },
    /// The count of dedup entries.
    DedupCount,
    /// Dedup entries in the order they are forgotten in, after `after`
    /// (a deadline key; from the first when `None`), `left` of them.
    Dedup {
        after: Option<(u64, u64)>,
        left: usize,
    },
    /// The checksum.
    End,
    /// Complete.
    Done,
}

impl SnapshotCursor {
    /// A snapshot of `scope`, not started.
    pub fn new(scope: SnapshotScope) -> SnapshotCursor {
        SnapshotCursor {
            scope,
            at: At::Start,
            crc: crc32fast::Hasher::new(),
        }
    }

    /// Whether every part was returned.
    pub fn is_done(&self) -> bool {
        matches!(self.at, At::Done)
    }
}

impl StateMachine {
    /// The whole state in the snapshot format.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_with(SnapshotScope::Everything)
    }

    /// A snapshot of `scope`, in one piece.
    pub fn snapshot_with(&self, scope: SnapshotScope) -> Vec<u8> {
        self.snapshot_part(&mut SnapshotCursor::new(scope), usize::MAX)
    }

    /// The next part of the snapshot `cursor` is taking: items until the
    /// part holds `max_bytes` or more (at least one, so a large value can
    /// make a part larger); empty once the snapshot is complete. The parts
    /// in order are exactly [`StateMachine::snapshot_with`]'s bytes. The
    /// state must not change between the parts of one snapshot.
    pub fn snapshot_part(&self, cursor: &mut SnapshotCursor, max_bytes: usize) -> Vec<u8> {
        let durable = cursor.scope == SnapshotScope::Durable;
        let filtered = durable && matches!(self.config.persist, Persist::Flagged | Persist::Custom);
        let keep = |e: &EntryRef<'_>| !filtered || e.persist;
        let capacity = match (&cursor.at, max_bytes) {
            (At::Done, _) => 0,
            // One piece: made its final size at once rather than doubled as
            // it grows (the guest's memory keeps its high-water mark).
            (At::Start, usize::MAX) => self.snapshot_len(cursor.scope, &keep),
            (_, max) => max.saturating_add(64 << 10),
        };
        let mut w = Writer(Vec::with_capacity(capacity));
        let registrations = if durable { 0 } else { self.registry.len() };
        loop {
            if w.0.len() >= max_bytes {
                break;
            }
            match &mut cursor.at {
                At::Start => {
                    snapshot::write_header(&mut w, self.clock.parts());
                    let n = if filtered {
                        self.table.iter().filter(|(_, e)| keep(e)).count()
                    } else {
                        self.table.len()
                    };
                    let n = n as u64;
                    w.u64(n);
                    cursor.at = At::Keys {
                        after: None,
                        left: n,
                    };
                }
                At::Keys { after, left } => {
                    let next =
                        self.snapshot_keys(&mut w, after.as_deref(), *left, max_bytes, &keep);
                    cursor.at = next;
                }
                At::Value { key, done, left } => {
                    let next =
                        self.snapshot_value(&mut w, core::mem::take(key), *done, *left, max_bytes);
                    cursor.at = next;
                }
                At::RegistrationCount => {
                    w.u64(registrations as u64);
                    cursor.at = At::Registrations {
                        after: None,
                        left: registrations,
                    };
                }
                At::Registrations { after, left } => {
                    let next = self.snapshot_registrations(&mut w, after.take(), *left, max_bytes);
                    cursor.at = next;
                }
                At::DedupCount => {
                    w.u64(self.dedup.len() as u64);
                    cursor.at = At::Dedup {
                        after: None,
                        left: self.dedup.len(),
                    };
                }
                At::Dedup { after, left } => {
                    cursor.at = self.snapshot_dedup(&mut w, *after, *left, max_bytes);
                }
                At::End => {
                    cursor.crc.update(&w.0);
                    let crc = cursor.crc.clone().finalize();
                    w.u32(crc);
                    cursor.at = At::Done;
                    return w.0;
                }
                At::Done => return w.0,
            }
        }
        cursor.crc.update(&w.0);
        w.0
    }

    /// Writes entries after `after` (`left` of them to go) until the part
    /// holds `max_bytes`; returns where the snapshot goes on.
    fn snapshot_keys(
        &self,
        w: &mut Writer,
        after: Option<&[u8]>,
        mut left: u64,
        max_bytes: usize,
        keep: &impl Fn(&EntryRef<'_>) -> bool,
    ) -> At {
        let mut last = None;
        for (key, e) in self.table.after(after) {
            if left == 0 || w.0.len() >= max_bytes {
                break;
            }
            last = Some(key);
            if !keep(&e) {
                continue;
            }
            left -= 1;
            if e.value.len() < LARGE_VALUE || max_bytes == usize::MAX {
                w.entry(key, e);
                continue;
            }
            // A large value goes out over as many parts as it takes: no
            // part (guest memory that stays taken) is much larger than
            // `max_bytes`.
            w.bytes(key);
            w.u32(u32::try_from(e.value.len()).unwrap_or(u32::MAX));
            return At::Value {
                key: key.into(),
                done: 0,
                left,
            };
        }
        match last {
            _ if left == 0 => At::RegistrationCount,
            Some(key) => At::Keys {
                after: Some(key.into()),
                left,
            },
            None => {
                // The table changed under the cursor (not allowed): stop
                // short rather than loop; the checksum fails.
                debug_assert!(false, "the state changed during a snapshot");
                At::RegistrationCount
            }
        }
    }

    /// Writes the large value of `key` from byte `done` until the part
    /// holds `max_bytes` (at least one byte), then, once it is all out,
    /// its entry's last fields; returns where the snapshot goes on.
    fn snapshot_value(
        &self,
        w: &mut Writer,
        key: Box<[u8]>,
        done: usize,
        left: u64,
        max_bytes: usize,
    ) -> At {
        let Some(e) = self.table.entry(&key) else {
            debug_assert!(false, "the state changed during a snapshot");
            return At::RegistrationCount;
        };
        let room = max_bytes.saturating_sub(w.0.len()).max(1);
        let end = e.value.len().min(done.saturating_add(room));
        w.0.extend_from_slice(&e.value[done..end]);
        if end < e.value.len() {
            return At::Value {
                key,
                done: end,
                left,
            };
        }
        w.entry_tail(e);
        match left {
            0 => At::RegistrationCount,
            left => At::Keys {
                after: Some(key),
                left,
            },
        }
    }

    /// Writes registrations after `after` (`left` of them to go) until
    /// the part holds `max_bytes`; returns where the snapshot goes on.
    fn snapshot_registrations(
        &self,
        w: &mut Writer,
        after: Option<(String, Box<[u8]>)>,
        mut left: usize,
        max_bytes: usize,
    ) -> At {
        let mut last = None;
        let from = after.as_ref().map(|(c, k)| (c.as_str(), &**k));
        for (client, key, via, watcher) in self.registry.iter_after(from).take(left) {
            if w.0.len() >= max_bytes {
                break;
            }
            w.str(client);
            w.bytes(key);
            w.opt(via, |w, v| {
                w.u64(v.replica);
                w.u64(v.started);
            });
            w.opt(watcher.username.as_deref(), Writer::str);
            w.u32(watcher.attributes.len() as u32);
            for (name, value) in &watcher.attributes {
                w.str(name);
                w.str(value);
            }
            left -= 1;
            last = Some((client, key));
        }
        match last {
            _ if left == 0 => At::DedupCount,
            Some((c, k)) => At::Registrations {
                after: Some((c.to_string(), k.into())),
                left,
            },
            None => {
                // Nothing after `after` though `left` says more (the
                // state changed under the cursor, which is not allowed):
                // stop short rather than loop; the checksum fails.
                debug_assert!(false, "the state changed during a snapshot");
                At::DedupCount
            }
        }
    }

    /// Writes dedup entries after `after` (`left` of them to go) until the
    /// part holds `max_bytes`; returns where the snapshot goes on. The
    /// order is the one entries are forgotten in (deadline, then arrival):
    /// it does not depend on the hash seed, a restore keeps it, and walking
    /// it sorts and copies nothing.
    fn snapshot_dedup(
        &self,
        w: &mut Writer,
        after: Option<(u64, u64)>,
        mut left: usize,
        max_bytes: usize,
    ) -> At {
        let mut last = None;
        for (key, item) in self.dedup.by_deadline_after(after).take(left) {
            if w.0.len() >= max_bytes {
                break;
            }
            w.opt(item.client, Writer::str);
            w.str(item.topic);
            w.bytes(item.correlation);
            w.u64(item.cached.expires_at);
            journal::write_reply_message(
                w,
                item.topic,
                item.correlation,
                &item.cached.reply,
                &self.config.node_id,
                self.server_id.as_deref(),
            );
            left -= 1;
            last = Some(key);
        }
        match last {
            _ if left == 0 => At::End,
            Some(key) => At::Dedup {
                after: Some(key),
                left,
            },
            None => {
                // As for registrations: the state changed under the cursor.
                debug_assert!(false, "the state changed during a snapshot");
                At::End
            }
        }
    }

    /// About how long a one-piece snapshot of `scope` is (at least; an
    /// upper bound for the dedup cache).
    fn snapshot_len(&self, scope: SnapshotScope, keep: &impl Fn(&EntryRef<'_>) -> bool) -> usize {
        let node = self.config.node_id.len();
        let keys_len: usize = self
            .table
            .iter()
            .filter(|(_, e)| keep(e))
            .map(|(k, e)| {
                let ft = e.fencing_token.map_or(1, |ft| 21 + ft.node.len());
                4 + k.len() + 4 + e.value.len() + 12 + ft + 9 + 1
            })
            .sum();
        let registrations_len: usize = match scope {
            SnapshotScope::Durable => 0,
            SnapshotScope::Everything => self
                .registry
                .iter()
                .map(|(c, k, _, w)| {
                    30 + c.len()
                        + k.len()
                        + w.username.as_ref().map_or(0, String::len)
                        + w.attributes
                            .iter()
                            .map(|(n, v)| 8 + n.len() + v.len())
                            .sum::<usize>()
                })
                .sum(),
        };
        let dedup_len: usize = self
            .dedup
            .iter()
            .map(|item| {
                let extra: usize = item
                    .cached
                    .reply
                    .extra
                    .iter()
                    .map(|(n, v)| 8 + n.len() + v.len())
                    .sum();
                5 + item.client.map_or(0, str::len)
                    + 2 * (4 + item.topic.len())
                    + 2 * (5 + item.correlation.len())
                    + 8
                    + 4
                    + item.cached.reply.payload.len()
                    + extra
                    + 160
                    + 2 * node
            })
            .sum();
        64 + keys_len + registrations_len + dedup_len
    }

    /// A store with the state of `snapshot`.
    pub fn restore(config: Config, snapshot: &[u8]) -> Result<StateMachine, Error> {
        let mut r = Restoring::new(config)?;
        r.feed(snapshot)?;
        r.finish()
    }

    fn observe_own(&mut self, hlc: &Hlc) {
        if hlc.node == self.config.node_id {
            self.clock.observe(hlc.wall, hlc.counter);
        }
    }

    /// [`StateMachine::replay`] of a record the store may keep: a put of a
    /// large value keeps the value where it is, the record's buffer
    /// becoming its key's (no second copy of the value while it is put).
    pub fn replay_owned(&mut self, record: Vec<u8>) -> Result<(), Error> {
        let large = match journal::decode(&record)? {
            Record::Put { key, value, meta } if value.len() >= LARGE_VALUE => {
                // `value` is a slice of `record`.
                let at = value.as_ptr() as usize - record.as_ptr() as usize;
                Some((Box::<[u8]>::from(key), at..at + value.len(), meta))
            }
            _ => None,
        };
        match large {
            Some((key, at, meta)) => {
                self.observe_put(&meta);
                self.table.put_in(record, &key, at, &meta);
                Ok(())
            }
            None => self.replay(&record),
        }
    }

    /// What a put's version and fencing token tell the clock.
    fn observe_put(&mut self, meta: &EntryMeta) {
        if let Some(ft) = &meta.fencing_token {
            self.observe_own(ft);
        }
        self.clock
            .observe(meta.version.wall, u64::from(meta.version.counter));
    }

    /// Applies one journal record to the state (no outputs). Used to rebuild
    /// a store from a snapshot plus the records written after it.
    pub fn replay(&mut self, record: &[u8]) -> Result<(), Error> {
        match journal::decode(record)? {
            Record::Put { key, value, meta } => {
                self.observe_put(&meta);
                self.table.put(key, meta.with(value));
            }
            Record::Remove { key, version } => {
                self.clock.observe(version.wall, u64::from(version.counter));
                self.table.remove(key);
            }
            Record::Reply {
                client,
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
                    client.as_deref(),
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

/// A store being restored from a snapshot handed over in parts of any size
/// (`snapshot::Restorer`): its memory holds one part and one item beyond
/// the state, never the whole snapshot.
pub struct Restoring {
    config: Config,
    state: Restored,
    reader: snapshot::Restorer,
    /// A part failed: the snapshot cannot be restored.
    failed: bool,
}

impl core::fmt::Debug for Restoring {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Restoring")
            .field("keys", &self.state.table.len())
            .field("reader", &self.reader)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Restoring {
    /// Starts restoring a store with `config`.
    pub fn new(config: Config) -> Result<Restoring, Error> {
        StateMachine::validate_config(&config)?;
        Ok(Restoring {
            state: Restored {
                clock: (0, 0),
                table: Table::with_seed(config.hash_seed),
                registry: Registry::default(),
                dedup: DedupCache::with_seed(config.hash_seed),
            },
            config,
            reader: snapshot::Restorer::default(),
            failed: false,
        })
    }

    /// The next bytes of the snapshot.
    pub fn feed(&mut self, part: &[u8]) -> Result<(), Error> {
        if self.failed {
            return Err(Error::BadSnapshot(
                "an earlier part of this snapshot was refused".into(),
            ));
        }
        let r = self.reader.feed(part, &mut self.state);
        self.failed = r.is_err();
        r
    }

    /// The store, once every part was fed.
    pub fn finish(self) -> Result<StateMachine, Error> {
        if self.failed {
            return Err(Error::BadSnapshot(
                "an earlier part of this snapshot was refused".into(),
            ));
        }
        self.reader.finish()?;
        let state = self.state;
        let (wall, counter) = state.clock;
        let clock = Clock::restored(self.config.node_id.clone(), wall, counter);
        Ok(StateMachine::from_parts(
            clock,
            self.config,
            state.table,
            state.registry,
            state.dedup,
        ))
    }
}

/// The parts of a state as [`snapshot::Restorer`] finds them.
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
    fn key(&mut self, key: &[u8], value: &[u8], meta: EntryMeta) {
        self.table.put(key, meta.with(value));
    }
    fn key_blob(&mut self, blob: Vec<u8>, meta: EntryMeta) {
        self.table.put_blob(blob.into_boxed_slice(), &meta);
    }
    fn registration(&mut self, client: &str, key: &[u8], via: Option<Via>, watcher: &Watcher) {
        self.registry.restore(client, key, via, watcher);
    }
    fn reply(
        &mut self,
        client: Option<&str>,
        topic: &str,
        correlation: &[u8],
        expires_at: u64,
        reply: OutboundMessage,
    ) -> Result<(), Error> {
        let reply = reply_of(&reply, Error::BadSnapshot)?;
        self.dedup
            .insert(client, topic, correlation, Cached { expires_at, reply });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cached reply as the message journal records and snapshots keep.
    fn cached_message(
        sm: &StateMachine,
        topic: &str,
        correlation: &[u8],
        reply: &Reply,
    ) -> OutboundMessage {
        reply.message(
            crate::types::Str::from(topic),
            Some(crate::types::Bytes::copy_from_slice(correlation)),
            None,
            &sm.config.node_id,
            sm.server_id.clone(),
        )
    }
    use crate::rpc::dedup::MAX_CLIENT_BYTES;

    fn cached(at: u64) -> Cached {
        Cached {
            expires_at: at,
            reply: Reply::ok(vec![1u8; 16 << 10], None),
        }
    }

    /// The dedup section is written in the order entries are forgotten in
    /// (deadline, then arrival): the same bytes whatever the hash seed, in
    /// one piece or in parts of any size, and again after a restore (whose
    /// entries keep that order, ties included).
    #[test]
    fn dedup_snapshots_do_not_depend_on_the_seed_or_the_parts() {
        let fill = |seed: u64| {
            let mut sm = StateMachine::new(Config {
                hash_seed: seed,
                ..Config::default()
            })
            .expect("config");
            for i in 0..40u32 {
                // Four deadlines only: many ties, broken by arrival.
                let at = 1_000 + u64::from(i % 4);
                let client = (i % 3 == 0).then_some("c");
                let small = Cached {
                    expires_at: at,
                    reply: Reply::ok(vec![i as u8; 10], None),
                };
                sm.dedup
                    .insert(client, &format!("t/{}", i % 5), &i.to_be_bytes(), small);
            }
            sm
        };
        let a = fill(1);
        let whole = a.snapshot();
        assert_eq!(fill(0xdead_beef).snapshot(), whole, "another seed");
        for part in [1, 64, 500] {
            let mut cursor = SnapshotCursor::new(SnapshotScope::Everything);
            let mut parts = Vec::new();
            loop {
                let p = a.snapshot_part(&mut cursor, part);
                if p.is_empty() {
                    break;
                }
                parts.extend_from_slice(&p);
            }
            assert_eq!(parts, whole, "parts of {part} bytes");
        }
        let restored = StateMachine::restore(Config::default(), &whole).expect("restore");
        assert_eq!(restored.dedup.len(), 40);
        assert_eq!(restored.snapshot(), whole, "restored");
    }

    /// Each cached reply keeps the client it is charged to through a
    /// snapshot and through journal replay (format v2 / kind 5), so a
    /// restarted store bounds each client as before; a version 1 snapshot
    /// (no clients) still restores, its replies charged to their topics.
    #[test]
    fn clients_of_cached_replies_survive_a_restart() {
        let mut sm = StateMachine::new(Config::default()).expect("config");
        for i in 0..300u32 {
            sm.dedup.insert(
                Some("flooder"),
                &format!("t/{i}"),
                b"c",
                cached(1_000 + u64::from(i)),
            );
        }
        sm.dedup.insert(None, "anon", b"c", cached(5_000));
        let held = sm.dedup.client_bytes(Some("flooder"), "");
        assert!(
            held <= MAX_CLIENT_BYTES && held > MAX_CLIENT_BYTES / 2,
            "{held}"
        );
        let restored = StateMachine::restore(Config::default(), &sm.snapshot()).expect("restore");
        assert_eq!(restored.dedup.client_bytes(Some("flooder"), ""), held);
        assert_eq!(restored.dedup.len(), sm.dedup.len());
        assert!(restored.dedup.client_bytes(None, "anon") > 0);

        // Replay of kind 5 records charges the client too.
        let mut replayed = StateMachine::new(Config::default()).expect("config");
        for item in sm.dedup.iter() {
            let m = cached_message(&sm, item.topic, item.correlation, &item.cached.reply);
            let record = journal::reply(
                item.client,
                item.topic,
                item.correlation,
                item.cached.expires_at,
                &m,
            );
            replayed.replay(&record).expect("replay");
        }
        assert_eq!(replayed.dedup.client_bytes(Some("flooder"), ""), held);

        // Format version 1: the same items without their client.
        let mut w = Writer::new();
        w.0.extend_from_slice(crate::snapshot::MAGIC);
        w.u32(1);
        w.u64(0);
        w.u64(0);
        w.u64(0); // keys
        w.u64(0); // registrations
        w.u64(1);
        w.str("t/old");
        w.bytes(b"c");
        w.u64(9_000);
        w.message(&cached_message(&sm, "t/old", b"c", &cached(0).reply));
        let old = w.finish_with_crc();
        let mut restored = StateMachine::restore(Config::default(), &old).expect("a v1 snapshot");
        assert!(restored.dedup.get("t/old", b"c", 0).is_some());
        assert!(restored.dedup.client_bytes(None, "t/old") > 16 << 10);
    }
}
