//! Opening the store a server runs: volatile, or durable in a data directory.

pub mod clock;
pub mod driver;
pub mod journal;
pub mod storage;
pub mod tenant;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use tracing::info;

use crate::store::journal::{Fsync, Journal, OnDamage, SnapshotPolicy};
use crate::store::storage::MemStorage;
use crate::{Config, Persist, Runtime, WasmStore};
use clock::Clock;
use statestore_guest::types::Quota;
use statestore_guest::{KeyMatch, ScanPage};

/// Where and how the store keeps its state.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// HLC node id.
    pub node_id: String,
    /// The `__srcId` of replies and notifications.
    pub server_client_id: String,
    /// Which keys are made durable.
    pub persist: Persist,
    /// The data directory (required unless `persist` is `None`).
    pub data_dir: Option<PathBuf>,
    /// When records reach the disk.
    pub fsync: Fsync,
    /// When to snapshot and truncate the log.
    pub snapshots: SnapshotPolicy,
    /// What clients may store.
    pub quota: Quota,
    /// The wall clock the store is driven by.
    pub clock: Arc<dyn Clock>,
    /// What to do with a log damaged before its end.
    pub on_damage: OnDamage,
    /// A volatile store (`persist` `None`) keeps a journal in memory, so
    /// that a guest that fails restarts with everything it acknowledged
    /// rather than empty (it costs about twice the state's size again in
    /// memory; see BENCHMARKS.md). Nothing reaches the disk either way.
    pub memory_journal: bool,
    /// The keys that persist under [`Persist::Custom`].
    pub persist_keys: Vec<KeyMatch>,
    /// SCAN page size.
    pub scan_page: ScanPage,
    /// Answer only requests whose response topic is `clients/<requester>/...`.
    pub sdk_response_topics: bool,
    /// Per-key authorization rules (`--authorization`); none: every key is
    /// every client's.
    pub authorization: Option<Vec<statestore_guest::types::AuthRule>>,
}

impl StoreOptions {
    /// A volatile store.
    pub fn volatile(node_id: &str, server_client_id: &str) -> StoreOptions {
        StoreOptions {
            node_id: node_id.into(),
            server_client_id: server_client_id.into(),
            persist: Persist::None,
            data_dir: None,
            fsync: Fsync::Always,
            snapshots: SnapshotPolicy::default(),
            quota: Quota::default(),
            clock: clock::system(),
            on_damage: OnDamage::Refuse,
            memory_journal: true,
            persist_keys: Vec::new(),
            scan_page: ScanPage::default(),
            sdk_response_topics: false,
            authorization: None,
        }
    }
}

/// One `--persist-keys` entry (as the real broker's key types):
/// `pattern:<glob>` (also a bare `<glob>`), `string:<key>` or
/// `binary:<base64 key>`.
pub fn parse_key_match(entry: &str) -> Result<KeyMatch> {
    use base64::Engine as _;
    let m = if let Some(key) = entry.strip_prefix("string:") {
        KeyMatch::Exact(key.as_bytes().to_vec())
    } else if let Some(b64) = entry.strip_prefix("binary:") {
        KeyMatch::Exact(
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .with_context(|| format!("persist key {entry:?}: not base64"))?,
        )
    } else {
        let pattern = entry.strip_prefix("pattern:").unwrap_or(entry);
        statestore_guest::scan::Glob::new(pattern)
            .map_err(|e| anyhow::anyhow!("persist key pattern {pattern:?}: {e}"))?;
        KeyMatch::Pattern(pattern.to_string())
    };
    if matches!(&m, KeyMatch::Exact(k) if k.is_empty()) {
        bail!("persist key {entry:?}: a key is never empty");
    }
    Ok(m)
}

/// The most log a memory journal keeps before it takes a snapshot.
pub(crate) const MEMORY_JOURNAL_LOG: u64 = 16 << 20;

/// Instantiates the store, recovering it from its data directory if durable.
pub fn open(runtime: &Runtime, opts: &StoreOptions) -> Result<(WasmStore, Option<Journal>)> {
    open_with(runtime, opts, &guest_config(opts))
}

/// The guest config for `opts`, with a fresh random hash seed. A volatile
/// store with a memory journal journals every change (in memory).
pub fn guest_config(opts: &StoreOptions) -> Config {
    let persist = match opts.persist {
        Persist::None if opts.memory_journal => Persist::All,
        p => p,
    };
    Config {
        node_id: opts.node_id.clone(),
        server_client_id: Some(opts.server_client_id.clone()),
        persist,
        hash_seed: random_seed(),
        quota: opts.quota,
        persist_keys: opts.persist_keys.clone(),
        scan_page: opts.scan_page,
        sdk_response_topics: opts.sdk_response_topics,
        authorization: opts.authorization.clone(),
    }
}

/// [`open`] with a given guest config.
pub fn open_with(
    runtime: &Runtime,
    opts: &StoreOptions,
    config: &Config,
) -> Result<(WasmStore, Option<Journal>)> {
    match (opts.persist, &opts.data_dir) {
        (Persist::None, _) if opts.memory_journal => {
            info!(
                "volatile store: nothing is written to disk (--persist none); a journal in memory restarts a failed guest with what it acknowledged"
            );
            // A short log: it is memory, and a snapshot of it is cheap to
            // take compared with what a long log holds; but never shorter
            // than the last snapshot (up to the policy's own bound), so that
            // snapshots cost at most a byte per byte logged.
            let policy = SnapshotPolicy {
                max_log_bytes: opts.snapshots.max_log_bytes.min(MEMORY_JOURNAL_LOG),
                ..opts.snapshots
            };
            let (mut journal, store, _) = Journal::open_in(
                Arc::new(MemStorage::volatile()),
                runtime,
                config,
                Fsync::No,
                policy,
                &*opts.clock,
                OnDamage::Refuse,
            )?;
            journal.follow_snapshot_size(opts.snapshots.max_log_bytes);
            Ok((store, Some(journal)))
        }
        (Persist::None, _) => {
            info!(
                "volatile store: nothing is written to disk (--persist none), and a failed guest restarts empty (no memory journal)"
            );
            Ok((runtime.instantiate(config)?, None))
        }
        (_, None) => bail!("--persist {:?} needs --data-dir", opts.persist),
        (_, Some(dir)) => {
            let (journal, store, _) = Journal::open(
                runtime,
                config,
                dir,
                opts.fsync,
                opts.snapshots,
                &*opts.clock,
                opts.on_damage,
            )?;
            info!(dir = %dir.display(), persist = ?opts.persist, fsync = ?opts.fsync, "durable store");
            Ok((store, Some(journal)))
        }
    }
}

/// A random u64 from std's per-process random hasher keys (no extra
/// dependency): the guest's hash seed.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(clock::now_ms());
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn seeds_differ_between_stores() {
        assert_ne!(super::random_seed(), super::random_seed());
    }
}
