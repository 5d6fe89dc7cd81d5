//! Compaction: a snapshot of the guest kept as `raft-snapshot`, and the log
//! before it dropped. On a disk, once [`LogStore::snapshots_behind`], the
//! snapshot file is written and synced on a thread of its own: it is as big
//! as the guest's state (tens of MiB), and every replica reaches the
//! threshold at about the same index, so a write on the loop stopped every
//! write of the cluster for as long (about 300 ms for 46 MB,
//! `BENCHMARKS.md`). The loop goes on appending to the current generation
//! meanwhile; once the file is written ([`LogStore::poll_compaction`]) the
//! log is compacted and a new generation written, as before.
//!
//! A crash while the file is written leaves the old snapshot (the new one is
//! written beside it and renamed over it); one after it was renamed and
//! before the new generation leaves a snapshot newer than the log's first
//! entries, which recovery skips (the same as a crash between the two steps
//! on the loop). One snapshot is written at a time; installing a leader's
//! snapshot, or closing the log, waits for the one under way.
//!
//! The seeded simulation holds the file instead ([`LogStore::snapshots_held`])
//! and writes it at a tick of its choosing
//! ([`LogStore::write_held_snapshot`]), crashing replicas before, between
//! and after.
//!
//! The file is a Raft `Snapshot` message: its data, then its metadata. The
//! caller writes the data into a [`SnapshotBuf`], after room for the
//! field's tag and length, and the file is made around it: the data is not
//! copied again (each copy of tens of MiB cost the loop 20 to 40 ms), and
//! the snapshot kept for lagging replicas shares the file's bytes.

use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use bytes::Bytes;
use protobuf::Message as _;
use raft::Storage as _;
use raft::prelude::{Snapshot, SnapshotMetadata};

use super::{LogStore, SNAPSHOT};

/// Room ahead of a snapshot's data for its field's tag and length (one
/// byte and a varint of at most ten).
const HEAD: usize = 11;
/// The tags of `Snapshot`'s fields, both length-delimited: `data` (1) and
/// `metadata` (2).
const TAG_DATA: u8 = (1 << 3) | 2;
const TAG_METADATA: u8 = (2 << 3) | 2;

/// The data of a snapshot being made ([`LogStore::compact`]), appended to
/// [`SnapshotBuf::buf`] after room for what goes ahead of it in the file.
#[derive(Debug)]
pub struct SnapshotBuf(Vec<u8>);

impl SnapshotBuf {
    /// No data yet, room for `capacity` bytes of it.
    pub fn with_capacity(capacity: usize) -> SnapshotBuf {
        let mut buf = Vec::with_capacity(HEAD + capacity + 64);
        buf.resize(HEAD, 0);
        SnapshotBuf(buf)
    }

    /// The data so far, to append to.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }

    /// The bytes of a Raft snapshot file holding this data and `meta` (as
    /// `Snapshot::write_to_bytes` would write them), and the snapshot,
    /// whose data shares them.
    fn into_file(self, meta: SnapshotMetadata) -> Result<(Bytes, Snapshot)> {
        let SnapshotBuf(mut buf) = self;
        let len = buf.len() - HEAD;
        let mut head = Vec::with_capacity(HEAD);
        if len > 0 {
            // An empty field is not written.
            head.push(TAG_DATA);
            varint(len as u64, &mut head);
        }
        let start = HEAD - head.len();
        buf[start..HEAD].copy_from_slice(&head);
        let meta_bytes = meta.write_to_bytes()?;
        buf.push(TAG_METADATA);
        varint(meta_bytes.len() as u64, &mut buf);
        buf.extend_from_slice(&meta_bytes);
        let all = Bytes::from(buf);
        let mut snap = Snapshot::default();
        snap.set_metadata(meta);
        snap.data = all.slice(HEAD..HEAD + len);
        Ok((all.slice(start..), snap))
    }
}

/// Protobuf's base-128 varint of `n`, appended to `out`.
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A snapshot being written on its own thread.
#[derive(Debug)]
pub(super) struct Compacting {
    snap: Snapshot,
    /// When the snapshot was asked for (its duration in the metrics).
    started: Instant,
    /// How long the loop spent on it (taking it, encoding it).
    on_loop: std::time::Duration,
    writer: Writer,
}

/// Who writes a snapshot's file behind the loop.
#[derive(Debug)]
enum Writer {
    /// A thread of its own (a server).
    Thread(std::thread::JoinHandle<std::io::Result<()>>),
    /// Nobody until [`LogStore::write_held_snapshot`] (the simulation):
    /// the file, then how its write went.
    Held {
        file: Bytes,
        written: Option<std::io::Result<()>>,
    },
}

impl Compacting {
    /// Whether its file is written (or its write failed).
    pub(super) fn written(&self) -> bool {
        match &self.writer {
            Writer::Thread(t) => t.is_finished(),
            Writer::Held { written, .. } => written.is_some(),
        }
    }
}

impl LogStore {
    /// How many bytes of data the last snapshot holds (what the next one
    /// is likely to need).
    pub fn snapshot_bytes(&self) -> usize {
        self.snapshot.data.len()
    }

    /// From now on [`LogStore::compact`] writes the snapshot on a thread of
    /// its own when the disk is slow enough to ([`crate::store::storage::Storage::writes_in_background`]).
    pub fn snapshots_behind(&mut self) {
        self.snapshots_behind = true;
    }

    /// From now on [`LogStore::compact`] holds the snapshot's file until
    /// [`LogStore::write_held_snapshot`] writes it, on any disk (the
    /// simulation: the write comes when it chooses, and a crash may come
    /// first).
    pub fn snapshots_held(&mut self) {
        self.snapshots_held = true;
    }

    /// Writes the file of the snapshot held, if one is held and not yet
    /// written (its compaction finishes at the next
    /// [`LogStore::poll_compaction`]): whether one was written.
    pub fn write_held_snapshot(&mut self) -> bool {
        let Some(Compacting {
            writer: Writer::Held { file, written },
            ..
        }) = &mut self.compacting
        else {
            return false;
        };
        if written.is_some() {
            return false;
        }
        *written = Some(self.disk.write_atomic(SNAPSHOT, file));
        true
    }

    /// Keeps `data`, the state after applying entry `index`, as the
    /// snapshot, and drops the entries before `index` from the log: at
    /// once, or (behind) once its file is written, a
    /// [`LogStore::poll_compaction`] later. `started`: when the caller
    /// began to take it. A snapshot still being written is finished first.
    pub fn compact(&mut self, index: u64, data: SnapshotBuf, started: Instant) -> Result<()> {
        self.finish_compaction()?;
        let term = self.mem.term(index).context("the term of a snapshot")?;
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.mem.initial_state()?.conf_state);
        let (file, snap) = data.into_file(meta)?;
        if !(self.snapshots_held || self.snapshots_behind && self.disk.writes_in_background()) {
            self.disk
                .write_atomic(SNAPSHOT, &file)
                .context("writing the Raft snapshot")?;
            return self.compacted(snap, started, None);
        }
        let on_loop = started.elapsed();
        let writer = if self.snapshots_held {
            Writer::Held {
                file,
                written: None,
            }
        } else {
            let disk = self.disk.clone();
            let thread = std::thread::Builder::new()
                .name("raft-snapshot".into())
                .spawn(move || disk.write_atomic(SNAPSHOT, &file))
                .context("starting the thread that writes the Raft snapshot")?;
            Writer::Thread(thread)
        };
        self.compacting = Some(Compacting {
            snap,
            started,
            on_loop,
            writer,
        });
        Ok(())
    }

    /// Whether a snapshot is being written ([`LogStore::poll_compaction`]
    /// has not seen it written yet).
    pub fn is_compacting(&self) -> bool {
        self.compacting.is_some()
    }

    /// Finishes the compaction whose snapshot is written, if one is:
    /// whether one is still being written. Its write failing is an error.
    pub fn poll_compaction(&mut self) -> Result<bool> {
        match &self.compacting {
            None => Ok(false),
            Some(c) if !c.written() => Ok(true),
            Some(_) => self.finish_compaction().map(|()| false),
        }
    }

    /// Waits for the snapshot being written, if one is, then drops the log
    /// before it.
    pub fn finish_compaction(&mut self) -> Result<()> {
        let Some(c) = self.compacting.take() else {
            return Ok(());
        };
        let written = match c.writer {
            Writer::Thread(thread) => thread
                .join()
                .map_err(|_| anyhow!("the thread writing the Raft snapshot panicked"))?,
            Writer::Held {
                written: Some(w), ..
            } => w,
            Writer::Held {
                file,
                written: None,
            } => self.disk.write_atomic(SNAPSHOT, &file),
        };
        written
            .with_context(|| format!("writing the Raft snapshot in {}", self.disk.describe()))?;
        self.compacted(c.snap, c.started, Some(c.on_loop))
    }

    /// `snap` is written: it is the snapshot, and the log before it goes.
    /// `on_loop`: how long the loop spent on it, when it was written behind.
    fn compacted(
        &mut self,
        snap: Snapshot,
        started: Instant,
        on_loop: Option<std::time::Duration>,
    ) -> Result<()> {
        let index = snap.get_metadata().index;
        let bytes = snap.data.len();
        self.snapshot = snap;
        self.mem.wl().compact(index).context("compacting")?;
        let rewriting = Instant::now();
        self.rewrite()?;
        let took = started.elapsed();
        // Behind: taking and encoding it, then the new generation.
        let on_loop = on_loop.map_or(took, |t| t + rewriting.elapsed());
        if let Some(m) = &self.metrics {
            m.snapshot.observe(took.as_secs_f64());
        }
        tracing::info!(
            index,
            bytes,
            ms = took.as_millis() as u64,
            loop_ms = on_loop.as_millis() as u64,
            "the Raft log compacted into a snapshot"
        );
        Ok(())
    }
}

impl Drop for LogStore {
    /// A snapshot being written is waited for (the files are not left to a
    /// thread once the log is closed); the log is not compacted: the next
    /// open skips what the snapshot holds.
    fn drop(&mut self) {
        if let Some(Compacting {
            writer: Writer::Thread(thread),
            ..
        }) = self.compacting.take()
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::prelude::ConfState;

    /// The file made around the data is what protobuf writes for the same
    /// snapshot, for data of every length of varint (none included), and
    /// reads back as it.
    #[test]
    fn the_file_is_the_snapshot_protobuf_writes() {
        for len in [0, 1, 127, 128, 300, 16_383, 16_384, 70_000, 2_100_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut meta = SnapshotMetadata {
                index: 1 << 40,
                term: 9,
                ..Default::default()
            };
            meta.set_conf_state(ConfState::from((vec![1, 2, 3], vec![4])));
            let mut data = SnapshotBuf::with_capacity(len / 2);
            data.buf().extend_from_slice(&bytes);
            let (file, snap) = data.into_file(meta.clone()).expect("made");
            let mut expected = Snapshot::default();
            expected.set_metadata(meta);
            expected.data = bytes.into();
            assert_eq!(snap, expected, "{len} bytes");
            assert_eq!(
                &file[..],
                &expected.write_to_bytes().expect("protobuf")[..],
                "{len} bytes"
            );
            assert_eq!(Snapshot::parse_from_bytes(&file).expect("read"), expected);
        }
    }
}
