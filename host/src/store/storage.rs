//! Where a journal keeps its files: the one door to the disk.
//!
//! ```text
//!   Journal (journal.rs: frames, segments, snapshots, recovery, fsync policy)
//!      └── dyn Storage: a flat directory of named files
//!            ├── DirStorage    a real directory (flock'ed LOCK, fsync, atomic rename)
//!            └── MemStorage    in memory; keeps apart what was synced, so a test can
//!                              crash it (`crash`), tear unsynced tails, or make
//!                              writes fail from some byte on (a full disk)
//! ```
//!
//! Every backend passes the same conformance suite ([`conformance`]), so the
//! journal's reasoning about what survives a crash holds for each: bytes are
//! durable once `sync` (of the file) returned, a file's existence and name
//! once `sync_dir` returned, and `write_atomic` leaves the old content or the
//! new one, never a mix.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// A flat directory of named files.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Takes exclusive use of the storage for this process (a second
    /// journal on the same storage is refused).
    fn lock(&self) -> io::Result<()>;
    /// Gives up [`Storage::lock`] (the journal closes).
    fn unlock(&self);
    /// The names of the files, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// The whole content of `name`.
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;
    /// Creates `name` empty (replacing any file of that name) and opens it
    /// for appending. Neither its existence nor its bytes are durable before
    /// [`Storage::sync_dir`] and [`LogFile::sync`].
    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>>;
    /// Replaces `name` with `bytes` durably and atomically: after a crash it
    /// holds the old content (or does not exist) or all of `bytes`.
    fn write_atomic(&self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// [`Storage::write_atomic`] of bytes the caller gives up: memory keeps
    /// them as they are rather than a copy.
    fn write_atomic_owned(&self, name: &str, bytes: Vec<u8>) -> io::Result<()> {
        self.write_atomic(name, &bytes)
    }
    /// Cuts `name` to `len` bytes, durably.
    fn truncate(&self, name: &str, len: u64) -> io::Result<()>;
    /// Renames `from` to `to` (replacing `to`), durably.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the names of the files durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// Where the files are, for messages.
    fn describe(&self) -> String;
    /// Whether a write is slow enough to do in the background (a disk);
    /// memory is written at once, and what it replaces freed at once.
    fn writes_in_background(&self) -> bool {
        true
    }
}

/// A file being appended to.
pub trait LogFile: Send + std::fmt::Debug {
    /// Appends `bytes`. On error, part of them may have been written.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything appended so far durable.
    fn sync(&mut self) -> io::Result<()>;
    /// Cuts the file back to `len` bytes; the next append goes there.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Another handle to the same file, to sync it from another thread.
    fn try_clone(&self) -> io::Result<Box<dyn LogFile>>;
    /// From now on the file grows in zero-filled steps of `step` bytes
    /// ahead of what is appended: an append then writes over zeros, and
    /// syncing it does not change the file's length, which makes the sync
    /// cheaper (no inode update; on this project's test machines an
    /// overwrite and `fdatasync` took 0.55-0.65x an append and
    /// `fdatasync`). Whoever reads the file must take an all-zero tail for
    /// its end ([`zero_tail`]). The zeros are durable with the next sync.
    /// Best effort: zeros that do not fit (a full disk) are not written,
    /// and an append fails only when its own bytes do not fit.
    fn zero_fill_ahead(&mut self, step: u64);
}

/// Whether `data` is all zeros: the unused tail of a file written with
/// [`LogFile::zero_fill_ahead`] (a record of the formats that use it is
/// never all zeros: its length is never 0).
pub fn zero_tail(data: &[u8]) -> bool {
    data.iter().all(|&b| b == 0)
}

/// A real directory, private to its owner: the directory is 0700 and every
/// file 0600 (the data is the clients'), including files an older build left
/// readable.
#[derive(Debug)]
pub(crate) struct DirStorage {
    dir: PathBuf,
    lock: Mutex<Option<File>>,
}

impl DirStorage {
    /// The directory `dir`, created if needed.
    pub fn open(dir: &Path) -> io::Result<DirStorage> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(DirStorage {
            dir: dir.to_path_buf(),
            lock: Mutex::new(None),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

#[derive(Debug)]
struct DirFile {
    file: File,
    /// Where the next append goes.
    end: u64,
    /// The file's length: past `end` when zero-filled ahead.
    len: u64,
    /// [`LogFile::zero_fill_ahead`]'s step (0: none).
    step: u64,
}

impl DirFile {
    fn new(file: File) -> DirFile {
        DirFile {
            file,
            end: 0,
            len: 0,
            step: 0,
        }
    }

    /// Writes zeros from the file's length up to `to`.
    fn fill_zeros(&mut self, to: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while self.len < to {
            let n = (to - self.len).min(ZEROS.len() as u64);
            self.file.write_all_at(&ZEROS[..n as usize], self.len)?;
            self.len += n;
        }
        Ok(())
    }
}

impl LogFile for DirFile {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let end = self.end + bytes.len() as u64;
        self.file.write_all_at(bytes, self.end)?;
        self.end = end;
        if end > self.len {
            self.len = end;
            if self.step > 0
                && self
                    .fill_zeros(end.div_ceil(self.step) * self.step)
                    .is_err()
            {
                // No room for them: the file ends with the bytes, as if
                // appended (cutting back needs no space).
                self.file.set_len(end)?;
                self.len = end;
            }
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.end = len;
        self.len = len;
        Ok(())
    }
    fn try_clone(&self) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(DirFile {
            file: self.file.try_clone()?,
            ..*self
        }))
    }
    fn zero_fill_ahead(&mut self, step: u64) {
        self.step = step;
    }
}

impl Storage for DirStorage {
    fn lock(&self) -> io::Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.path("LOCK"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another statestore process",
                        self.dir.display()
                    ),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
        *lock(&self.lock) = Some(file);
        // Ours now: make it private (an older build left it readable).
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))?;
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_file() && e.metadata()?.permissions().mode() & 0o077 != 0 {
                fs::set_permissions(e.path(), fs::Permissions::from_mode(0o600))?;
            }
        }
        Ok(())
    }

    fn unlock(&self) {
        // Closing the file releases the flock.
        *lock(&self.lock) = None;
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_file()
                && let Some(name) = e.file_name().to_str()
                && name != "LOCK"
            {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let mut data = Vec::new();
        File::open(self.path(name))?.read_to_end(&mut data)?;
        Ok(data)
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(self.path(name))?;
        Ok(Box::new(DirFile::new(file)))
    }

    fn write_atomic(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.path(&format!("{name}.tmp"));
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, self.path(name))?;
        self.sync_dir()
    }

    fn truncate(&self, name: &str, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(self.path(name))?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.path(from), self.path(to))?;
        self.sync_dir()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.path(name))
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// One file of a [`MemStorage`].
#[derive(Debug, Clone, Default)]
struct MemFile {
    /// Everything written.
    data: Vec<u8>,
    /// How much of `data` a crash keeps.
    synced: usize,
    /// Zeros at the end of `data` past what was appended (written by
    /// [`LogFile::zero_fill_ahead`]).
    unused: usize,
}

#[derive(Debug, Default)]
struct MemState {
    /// The files as a reader sees them now.
    files: BTreeMap<String, MemFile>,
    /// The names a crash keeps (the directory as last synced), each with
    /// the identity of the file it names.
    durable_names: BTreeMap<String, u64>,
    /// The identity of each current file (a rename keeps it).
    ids: BTreeMap<String, u64>,
    next_id: u64,
    /// Contents kept by a crash, by file identity.
    durable: BTreeMap<u64, MemFile>,
    locked: bool,
    /// Bytes that may still be written before writes fail (a full disk).
    space: Option<u64>,
    /// Whether to keep what a crash would keep ([`MemStorage::crash`]);
    /// not for a memory journal, where it would only double the memory.
    crashes: bool,
    /// How many times each name's file was synced.
    syncs: BTreeMap<String, u64>,
}

/// Storage in memory that knows what a crash would keep: the names as of
/// the last `sync_dir` and, of each file, what was synced. For the
/// conformance and crash tests (and volatile stores that must survive a
/// restart of their guest). Clones share the files.
#[derive(Debug, Clone)]
pub struct MemStorage(Arc<Mutex<MemState>>);

impl Default for MemStorage {
    fn default() -> Self {
        MemStorage::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding it cannot leave it half-updated in a way that
    // matters more than the panic itself.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name:?}"))
}

fn disk_full() -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, "no space left (injected)")
}

impl MemState {
    fn take_space(&mut self, n: usize) -> io::Result<usize> {
        match &mut self.space {
            None => Ok(n),
            Some(left) => {
                let granted = n.min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= granted as u64;
                Ok(granted)
            }
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A crash keeps `file` as the contents of file `id`.
    fn keep(&mut self, id: u64, file: impl FnOnce() -> MemFile) {
        if self.crashes {
            self.durable.insert(id, file());
        }
    }

    /// Forgets the crash contents of files no name leads to any more.
    fn prune(&mut self) {
        let Self {
            durable,
            durable_names,
            ids,
            ..
        } = self;
        durable.retain(|id, _| {
            durable_names.values().any(|d| d == id) || ids.values().any(|i| i == id)
        });
    }
}

impl MemStorage {
    /// Empty storage that knows what a crash would keep (for tests).
    pub fn new() -> MemStorage {
        let st = MemState {
            crashes: true,
            ..MemState::default()
        };
        MemStorage(Arc::new(Mutex::new(st)))
    }

    /// Empty storage that keeps each file once and nothing for a crash
    /// ([`MemStorage::crash`] then keeps nothing): a volatile store's
    /// journal in memory.
    pub fn volatile() -> MemStorage {
        MemStorage(Arc::new(Mutex::new(MemState::default())))
    }

    /// How many times the file named `name` was synced (for tests that
    /// count syncs).
    pub fn syncs(&self, name: &str) -> u64 {
        lock(&self.0).syncs.get(name).copied().unwrap_or(0)
    }

    /// From now on only `bytes` more bytes can be written: a write past
    /// them writes what fits and fails (a full disk). `None`: no limit.
    pub fn set_space(&self, bytes: Option<u64>) {
        lock(&self.0).space = bytes;
    }

    /// What is left after the machine crashed now: the files the last
    /// `sync_dir` named, each with its synced bytes, plus, when `torn` is
    /// given, up to that many of its unsynced bytes (a torn tail). The
    /// lock is released.
    pub fn crash(&self, torn: Option<usize>) -> MemStorage {
        let st = lock(&self.0);
        let mut after = MemState {
            crashes: st.crashes,
            ..MemState::default()
        };
        for (name, id) in &st.durable_names {
            let Some(durable) = st.durable.get(id) else {
                continue;
            };
            let mut kept = durable.data[..durable.synced].to_vec();
            // A torn tail: the unsynced bytes appended after what was
            // synced (over zeros filled ahead, or past the end), if it is
            // still the same file.
            let synced_end = durable.synced.saturating_sub(durable.unused);
            if let (Some(n), Some(cur_id)) = (torn, st.ids.get(name))
                && cur_id == id
                && let Some(cur) = st.files.get(name)
                && cur.data.len() - cur.unused > synced_end
                && cur.data[..synced_end] == kept[..synced_end]
            {
                let to = synced_end + (cur.data.len() - cur.unused - synced_end).min(n);
                if kept.len() < to {
                    kept.resize(to, 0);
                }
                kept[synced_end..to].copy_from_slice(&cur.data[synced_end..to]);
            }
            let id = after.new_id();
            let synced = kept.len();
            let file = MemFile {
                data: kept,
                synced,
                unused: 0,
            };
            after.files.insert(name.clone(), file.clone());
            after.ids.insert(name.clone(), id);
            after.durable_names.insert(name.clone(), id);
            after.durable.insert(id, file);
        }
        MemStorage(Arc::new(Mutex::new(after)))
    }

    /// Flips one bit of `name` at `offset`, durably (a bad disk).
    pub fn flip_bit(&self, name: &str, offset: usize) {
        let mut st = lock(&self.0);
        let id = st.ids.get(name).copied();
        if let Some(f) = st.files.get_mut(name)
            && offset < f.data.len()
        {
            f.data[offset] ^= 1;
            let copy = f.clone();
            if let Some(id) = id {
                st.keep(id, || copy);
            }
        }
    }
}

/// What a [`MemStorage`] handle's file operations fail with once its file
/// was replaced or removed (a real file's descriptor would still reach
/// it; the in-memory disk keeps no such orphan).
#[derive(Debug, thiserror::Error)]
#[error("the file was replaced or removed")]
pub(crate) struct Gone;

/// Whether `e` is [`Gone`] (the simulation's question).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn is_gone(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Gone>())
}

#[derive(Debug)]
struct MemLogFile {
    storage: MemStorage,
    name: String,
    id: u64,
    /// [`LogFile::zero_fill_ahead`]'s step (0: none).
    step: usize,
}

impl MemLogFile {
    /// Runs `f` on the file this handle opened, under the name it has now
    /// (a rename keeps the file, as on a real file system).
    fn with<T>(&mut self, f: impl FnOnce(&mut MemState, &str) -> io::Result<T>) -> io::Result<T> {
        let mut st = lock(&self.storage.0);
        if st.ids.get(&self.name) != Some(&self.id) {
            let Some(name) = st
                .ids
                .iter()
                .find(|(_, id)| **id == self.id)
                .map(|(n, _)| n.clone())
            else {
                return Err(io::Error::other(Gone));
            };
            self.name = name;
        }
        f(&mut st, &self.name)
    }
}

impl LogFile for MemLogFile {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let step = self.step;
        self.with(|st, name| {
            let f = st.files.get(name).ok_or_else(|| not_found(name))?;
            let (len, end) = (f.data.len(), f.data.len() - f.unused);
            let want = end + bytes.len();
            // The bytes first: a full disk takes what fits of them.
            let granted = st.take_space(want.saturating_sub(len))?;
            let f = st.files.get_mut(name).ok_or_else(|| not_found(name))?;
            if want > len {
                f.data.resize(len + granted, 0);
            }
            let fits = (f.data.len() - end).min(bytes.len());
            f.data[end..end + fits].copy_from_slice(&bytes[..fits]);
            f.unused = f.data.len() - end - fits;
            if fits < bytes.len() {
                return Err(disk_full());
            }
            // Then zeros ahead, if they all fit.
            if step > 0 && want > len {
                let zeros = want.div_ceil(step) * step - want;
                if st.space.is_none_or(|left| left >= zeros as u64) {
                    st.take_space(zeros)?;
                    let f = st.files.get_mut(name).ok_or_else(|| not_found(name))?;
                    f.data.resize(want + zeros, 0);
                    f.unused = zeros;
                }
            }
            Ok(())
        })
    }

    fn sync(&mut self) -> io::Result<()> {
        let id = self.id;
        self.with(|st, name| {
            let f = st.files.get_mut(name).ok_or_else(|| not_found(name))?;
            f.synced = f.data.len();
            *st.syncs.entry(name.to_string()).or_default() += 1;
            if st.crashes {
                let copy = f.clone();
                st.durable.insert(id, copy);
            }
            Ok(())
        })
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.with(|st, name| {
            let f = st.files.get_mut(name).ok_or_else(|| not_found(name))?;
            let len = usize::try_from(len).map_err(io::Error::other)?;
            f.data.resize(len, 0);
            f.synced = f.synced.min(len);
            f.unused = 0;
            Ok(())
        })
    }

    fn try_clone(&self) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(MemLogFile {
            storage: self.storage.clone(),
            name: self.name.clone(),
            id: self.id,
            step: self.step,
        }))
    }

    fn zero_fill_ahead(&mut self, step: u64) {
        self.step = usize::try_from(step).unwrap_or(usize::MAX);
    }
}

impl Storage for MemStorage {
    fn lock(&self) -> io::Result<()> {
        let mut st = lock(&self.0);
        if st.locked {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the storage is in use by another journal",
            ));
        }
        st.locked = true;
        Ok(())
    }

    fn unlock(&self) {
        lock(&self.0).locked = false;
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(lock(&self.0).files.keys().cloned().collect())
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        lock(&self.0)
            .files
            .get(name)
            .map(|f| f.data.clone())
            .ok_or_else(|| not_found(name))
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let mut st = lock(&self.0);
        let id = st.new_id();
        st.files.insert(name.to_string(), MemFile::default());
        st.ids.insert(name.to_string(), id);
        Ok(Box::new(MemLogFile {
            storage: self.clone(),
            name: name.to_string(),
            id,
            step: 0,
        }))
    }

    fn write_atomic(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.write_atomic_owned(name, bytes.to_vec())
    }

    fn write_atomic_owned(&self, name: &str, bytes: Vec<u8>) -> io::Result<()> {
        let mut st = lock(&self.0);
        if st.take_space(bytes.len())? < bytes.len() {
            return Err(disk_full());
        }
        let id = st.new_id();
        let file = MemFile {
            synced: bytes.len(),
            data: bytes,
            unused: 0,
        };
        if st.crashes {
            st.durable.insert(id, file.clone());
            st.durable_names.insert(name.to_string(), id);
        }
        let old = st.ids.insert(name.to_string(), id);
        st.files.insert(name.to_string(), file);
        if old.is_some() {
            st.prune();
        }
        Ok(())
    }

    fn truncate(&self, name: &str, len: u64) -> io::Result<()> {
        let mut st = lock(&self.0);
        let id = *st.ids.get(name).ok_or_else(|| not_found(name))?;
        let f = st.files.get_mut(name).ok_or_else(|| not_found(name))?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        f.unused = f.unused.saturating_sub(f.data.len().saturating_sub(len));
        f.data.truncate(len);
        f.synced = f.data.len();
        let copy = f.clone();
        st.keep(id, || copy);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut st = lock(&self.0);
        let f = st.files.remove(from).ok_or_else(|| not_found(from))?;
        let id = st.ids.remove(from).ok_or_else(|| not_found(from))?;
        st.files.insert(to.to_string(), f);
        st.ids.insert(to.to_string(), id);
        // Durable at once, as `DirStorage::rename` syncs the directory.
        if st.crashes {
            st.durable_names.remove(from);
            st.durable_names.insert(to.to_string(), id);
        }
        st.prune();
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut st = lock(&self.0);
        st.files.remove(name).ok_or_else(|| not_found(name))?;
        st.ids.remove(name);
        st.prune();
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut st = lock(&self.0);
        if !st.crashes {
            return Ok(());
        }
        st.durable_names = st.ids.clone();
        let ids: Vec<u64> = st.ids.values().copied().collect();
        for id in ids {
            // A file that was never synced is named but empty after a crash.
            st.durable.entry(id).or_default();
        }
        st.prune();
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }

    /// A memory journal's storage writes at once; one that simulates a
    /// disk for the crash tests writes as a disk does.
    fn writes_in_background(&self) -> bool {
        lock(&self.0).crashes
    }
}

/// The conformance suite every [`Storage`] passes: call each check with a
/// fresh, empty storage (see the tests below and `tests/tests/durability.rs`).
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::Storage;
    use std::io;

    fn sorted(s: &dyn Storage) -> io::Result<Vec<String>> {
        let mut v = s.list()?;
        v.sort();
        Ok(v)
    }

    /// Appends read back in order; `create` empties; `set_len` cuts and the
    /// next append goes to the cut.
    pub fn append_read_truncate(s: &dyn Storage) -> io::Result<()> {
        let mut f = s.create("a.log")?;
        f.append(b"hello ")?;
        f.append(b"world")?;
        f.sync()?;
        s.sync_dir()?;
        assert_eq!(s.read("a.log")?, b"hello world");
        f.set_len(5)?;
        f.append(b"!")?;
        assert_eq!(s.read("a.log")?, b"hello!");
        s.truncate("a.log", 2)?;
        assert_eq!(s.read("a.log")?, b"he");
        let _again = s.create("a.log")?;
        assert_eq!(s.read("a.log")?, b"", "create replaces");
        Ok(())
    }

    /// `write_atomic` replaces the whole content; `list`, `rename` and
    /// `remove` see and change names; reading a missing file is NotFound.
    pub fn names_and_atomic_writes(s: &dyn Storage) -> io::Result<()> {
        assert!(sorted(s)?.is_empty());
        s.write_atomic("x.snap", b"one")?;
        s.write_atomic("x.snap", b"two!")?;
        assert_eq!(s.read("x.snap")?, b"two!");
        let mut f = s.create("y.log")?;
        f.append(b"y")?;
        s.rename("y.log", "y.log.dropped")?;
        assert_eq!(sorted(s)?, ["x.snap", "y.log.dropped"]);
        assert_eq!(s.read("y.log.dropped")?, b"y");
        s.remove("x.snap")?;
        assert_eq!(sorted(s)?, ["y.log.dropped"]);
        assert_eq!(
            s.read("x.snap").map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
        Ok(())
    }

    /// A second `lock` of the same storage is refused until the first is
    /// given up.
    pub fn exclusive_lock(first: &dyn Storage, second: &dyn Storage) -> io::Result<()> {
        first.lock()?;
        assert!(second.lock().is_err(), "a second lock must be refused");
        first.unlock();
        second.lock()?;
        Ok(())
    }

    /// A clone of a file handle syncs the same file.
    pub fn cloned_handles(s: &dyn Storage) -> io::Result<()> {
        let mut f = s.create("c.log")?;
        let mut g = f.try_clone()?;
        f.append(b"abc")?;
        g.sync()?;
        assert_eq!(s.read("c.log")?, b"abc");
        Ok(())
    }

    /// A file zero-filled ahead reads as what was appended, then zeros up
    /// to a multiple of the step; appends write over the zeros; `set_len`
    /// cuts it and the next append goes to the cut.
    pub fn zero_filled_ahead(s: &dyn Storage) -> io::Result<()> {
        let mut f = s.create("z.log")?;
        f.zero_fill_ahead(8);
        f.append(b"abc")?;
        assert_eq!(s.read("z.log")?, b"abc\0\0\0\0\0");
        f.append(b"defgh")?;
        assert_eq!(s.read("z.log")?, b"abcdefgh");
        f.append(b"ijklmnopqr")?;
        f.sync()?;
        assert_eq!(s.read("z.log")?, b"abcdefghijklmnopqr\0\0\0\0\0\0");
        f.set_len(4)?;
        f.append(b"X")?;
        assert_eq!(s.read("z.log")?, b"abcdX\0\0\0");
        assert!(super::zero_tail(&s.read("z.log")?[5..]));
        Ok(())
    }

    /// Every check, on storages made by `fresh` (two may share their files,
    /// for the lock check).
    pub fn all(fresh: &mut dyn FnMut() -> (Box<dyn Storage>, Box<dyn Storage>)) -> io::Result<()> {
        append_read_truncate(&*fresh().0)?;
        names_and_atomic_writes(&*fresh().0)?;
        let (a, b) = fresh();
        exclusive_lock(&*a, &*b)?;
        cloned_handles(&*fresh().0)?;
        zero_filled_ahead(&*fresh().0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_storage_conforms() -> io::Result<()> {
        conformance::all(&mut || {
            let s = MemStorage::new();
            (Box::new(s.clone()), Box::new(s))
        })
    }

    /// A handle follows its file through a rename; once another file is
    /// renamed over it, the handle fails with [`Gone`], which is told
    /// apart from other errors by its type.
    #[test]
    fn a_handle_to_a_replaced_file_fails_as_gone() -> io::Result<()> {
        let s = MemStorage::new();
        let mut f = s.create("a.log")?;
        f.append(b"one")?;
        s.rename("a.log", "b.log")?;
        f.append(b"two")?;
        assert_eq!(s.read("b.log")?, b"onetwo");
        s.create("c.log")?.append(b"new")?;
        s.rename("c.log", "b.log")?;
        let err = f.sync().expect_err("the file it opened is gone");
        assert!(is_gone(&err), "{err}");
        assert!(!is_gone(&not_found("x")));
        Ok(())
    }

    /// A crash keeps the zeros synced ahead, and of what was written over
    /// them since, only a torn tail.
    #[test]
    fn a_crash_keeps_synced_zeros_and_tears_what_was_written_over_them() -> io::Result<()> {
        let s = MemStorage::new();
        let mut f = s.create("z.log")?;
        f.zero_fill_ahead(16);
        f.append(b"one")?;
        f.sync()?;
        s.sync_dir()?;
        f.append(b"two")?;
        assert_eq!(&s.read("z.log")?[..6], b"onetwo");
        let mut want = b"one".to_vec();
        want.resize(16, 0);
        assert_eq!(s.crash(None).read("z.log")?, want);
        // A torn tail: part of what was written over the zeros.
        want[3..5].copy_from_slice(b"tw");
        assert_eq!(s.crash(Some(2)).read("z.log")?, want);
        Ok(())
    }

    /// Zeros that do not fit are not written: an append fails only when
    /// its own bytes do not fit, as without zeros.
    #[test]
    fn zeros_ahead_give_way_to_a_full_disk() -> io::Result<()> {
        let s = MemStorage::new();
        let mut f = s.create("z.log")?;
        f.zero_fill_ahead(16);
        s.set_space(Some(6));
        f.append(b"abc")?;
        assert_eq!(s.read("z.log")?, b"abc");
        f.append(b"def")?;
        assert!(f.append(b"g").is_err());
        assert_eq!(s.read("z.log")?, b"abcdef");
        Ok(())
    }

    #[test]
    fn dir_storage_conforms() -> io::Result<()> {
        let root = std::env::temp_dir().join(format!("statestore-storage-{}", std::process::id()));
        let mut n = 0;
        let result = conformance::all(&mut || {
            n += 1;
            let dir = root.join(n.to_string());
            let _ = fs::remove_dir_all(&dir);
            let open = || DirStorage::open(&dir).expect("dir");
            (Box::new(open()), Box::new(open()))
        });
        let _ = fs::remove_dir_all(&root);
        result
    }

    /// The data directory is its owner's alone, whatever made it.
    #[test]
    fn a_data_directory_is_private() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("statestore-private-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // As an older build left it: readable by everyone.
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        fs::write(dir.join("wal-00000000000000000001.log"), b"old")?;
        fs::set_permissions(
            dir.join("wal-00000000000000000001.log"),
            fs::Permissions::from_mode(0o644),
        )?;
        let s = DirStorage::open(&dir)?;
        s.lock()?;
        let mut f = s.create("wal-2.log")?;
        f.append(b"x")?;
        s.write_atomic("snap", b"s")?;
        let mode = |p: PathBuf| fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(dir.clone())?, 0o700);
        for name in ["wal-00000000000000000001.log", "wal-2.log", "snap", "LOCK"] {
            assert_eq!(mode(dir.join(name))?, 0o600, "{name}");
        }
        let _ = fs::remove_dir_all(&dir);
        Ok(())
    }

    /// What a crash keeps of a [`MemStorage`]: synced bytes of files the
    /// directory named when last synced; torn tails only on request.
    #[test]
    fn a_crash_keeps_only_what_was_synced() -> io::Result<()> {
        let s = MemStorage::new();
        let mut f = s.create("wal-1.log")?;
        f.append(b"synced")?;
        f.sync()?;
        s.sync_dir()?;
        f.append(b"+lost")?;
        let _unnamed = s.create("wal-2.log")?; // never in a synced directory
        s.write_atomic("snap", b"S")?;
        let after = s.crash(None);
        let mut names = after.list()?;
        names.sort();
        assert_eq!(names, ["snap", "wal-1.log"]);
        assert_eq!(after.read("wal-1.log")?, b"synced");
        assert_eq!(s.crash(Some(3)).read("wal-1.log")?, b"synced+lo");
        assert!(after.lock().is_ok(), "a crash releases the lock");
        Ok(())
    }

    #[test]
    fn a_full_disk_writes_what_fits_then_fails() -> io::Result<()> {
        let s = MemStorage::new();
        let mut f = s.create("a")?;
        s.set_space(Some(4));
        assert_eq!(
            f.append(b"abcdef").map_err(|e| e.kind()),
            Err(io::ErrorKind::StorageFull)
        );
        assert_eq!(s.read("a")?, b"abcd");
        assert!(s.write_atomic("b", b"x").is_err());
        s.set_space(None);
        f.set_len(0)?;
        f.append(b"ok")?;
        assert_eq!(s.read("a")?, b"ok");
        Ok(())
    }
}
