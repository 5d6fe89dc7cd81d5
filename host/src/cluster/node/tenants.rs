//! A replica serving tenants (`serve --cluster --config`): each tenant's
//! store is its own Raft group (with `partitions = P`, P groups) on the
//! same replicas, with its own guest (component and limits), log and
//! snapshots; the links, the ticks and the round journal are shared by
//! every group. Tenant `t`'s partition `p` is group `t * P + p`, so the
//! tenants and their order are the data directory's for life (recorded in
//! `tenants`), and replicas serving other tenants are not linked (their
//! layout frame differs, see [`crate::cluster::net`]).
//!
//! ```text
//!   data_dir/tenants                   the tenants' names, one a line, in order
//!   data_dir/raft-journal              the round journal of every group
//!   data_dir/tenant-<name>/            tenant <name>'s log (one partition)
//!   data_dir/tenant-<name>/partition-<p>/   ... or its partition p's
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::store::storage::Storage;
use crate::{Config, Runtime};

/// One store a replica serves: its name, its component (with its limits)
/// and its guest's configuration (the same on every replica).
pub struct NodeTenant {
    /// Its name (`default` for the one store of a replica without tenants).
    pub name: String,
    /// Its component, with its memory and fuel limits.
    pub runtime: Runtime,
    /// Its guest's configuration.
    pub config: Config,
}

impl NodeTenant {
    /// The Raft replica (`id`) of its store's partition `p` (of
    /// `partitions`; `named`: the replica serves tenants) over `log`, its
    /// guest made from the log's snapshot.
    pub(super) fn replica(
        &self,
        id: u64,
        log: crate::cluster::LogStore,
        durability: crate::cluster::Durability,
        (p, partitions, named): (u32, u32, bool),
    ) -> Result<crate::cluster::Replica<crate::WasmStore>> {
        let make_config = self.config.clone();
        let runtime = self.runtime.clone();
        let make = Box::new(move |snapshot: Option<&[u8]>| match snapshot {
            None => runtime.instantiate(&make_config),
            Some(s) => runtime.restore(&make_config, s),
        });
        crate::cluster::Replica::new(
            id,
            log,
            make,
            super::TIMING,
            durability,
            crate::cluster::Compaction::default(),
        )
        .with_context(|| match (named, partitions) {
            (false, 1) => String::from("opening the replica"),
            (false, _) => format!("opening partition {p}"),
            (true, 1) => format!("opening tenant {:?}", self.name),
            (true, _) => format!("opening partition {p} of tenant {:?}", self.name),
        })
    }
}

/// What a replica serves.
pub enum Stores {
    /// One store, in the data directory itself (no `--config`).
    One(Box<NodeTenant>),
    /// The tenants of `--config`, in its order (at least one).
    Tenants(Vec<NodeTenant>),
}

impl Stores {
    /// The stores, and whether they are tenants.
    pub(super) fn into_list(self) -> (Vec<NodeTenant>, bool) {
        match self {
            Stores::One(t) => (vec![*t], false),
            Stores::Tenants(list) => (list, true),
        }
    }
}

/// The fingerprint of tenants named `names`, in that order (never 0,
/// which says "no tenants"): FNV-1a over the names, each ended by a
/// newline (names hold no newline).
pub fn fingerprint(names: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in names.iter().flat_map(|n| n.bytes().chain([b'\n'])) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// The file of a data directory that records its tenants.
const TENANTS: &str = "tenants";

/// The tenants a data directory records (`None`: a replica without
/// tenants, or a new data directory).
pub(crate) fn recorded_tenants(root: &dyn Storage) -> Result<Option<Vec<String>>> {
    match root.read(TENANTS) {
        Ok(bytes) => Ok(Some(
            std::str::from_utf8(&bytes)
                .context("`tenants` in the data directory is not UTF-8")?
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).context("reading `tenants` in the data directory"),
    }
}

/// Where each group of a replica keeps its log (group `g` at `[g]`; see
/// [`group_dir`]): `tenants` the replica's (`None`: the one store), each
/// store in `partitions` partitions.
pub(crate) fn group_dirs(
    data_dir: &Path,
    tenants: Option<&[String]>,
    partitions: u32,
) -> Vec<Option<PathBuf>> {
    let stores: Vec<Option<&str>> = match tenants {
        Some(names) => names.iter().map(|n| Some(n.as_str())).collect(),
        None => vec![None],
    };
    stores
        .into_iter()
        .flat_map(|tenant| (0..partitions).map(move |p| group_dir(data_dir, tenant, partitions, p)))
        .collect()
}

/// Checks that the data directory holds the stores of tenants `names`
/// (`None`: the one store of a replica without tenants), or none yet (it
/// then records them).
pub(super) fn check_tenants(root: &dyn Storage, names: Option<&[String]>) -> Result<()> {
    let recorded = recorded_tenants(root)?;
    let exists = |name: &str| match root.read(name) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {name}")),
    };
    match (recorded, names) {
        (None, None) => Ok(()),
        (Some(had), Some(now)) if had == now => Ok(()),
        (Some(had), Some(now)) => bail!(
            "the data directory holds the stores of the tenants {had:?} and --config names {now:?}: a cluster's tenants (and their order: a tenant's groups are numbered by it) cannot change while it lives yet; put the config back, or start a new cluster with empty data directories"
        ),
        (Some(had), None) => bail!(
            "the data directory holds the stores of the tenants {had:?}: start the replica with the --config that names them"
        ),
        (None, Some(now)) => {
            if exists("raft-state")? || exists("partitions")? {
                bail!(
                    "the data directory holds a store without tenants and --config names the tenants {now:?}: a cluster cannot take tenants later yet; start without --config, or start a new cluster with empty data directories"
                );
            }
            let mut text = now.join("\n");
            text.push('\n');
            root.write_atomic(TENANTS, text.as_bytes())
                .context("writing `tenants` in the data directory")
        }
    }
}

/// Where group `p` of a store (`tenant`, if the replica serves tenants) in
/// `partitions` partitions keeps its log; `None`: the data directory
/// itself (the one store, in one partition).
pub(super) fn group_dir(
    data_dir: &Path,
    tenant: Option<&str>,
    partitions: u32,
    p: u32,
) -> Option<PathBuf> {
    let base = match tenant {
        Some(name) => data_dir.join(format!("tenant-{name}")),
        None if partitions == 1 => return None,
        None => data_dir.to_path_buf(),
    };
    Some(if partitions == 1 {
        base
    } else {
        base.join(format!("partition-{p}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::storage::MemStorage;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn a_data_directory_keeps_its_tenants_for_life() {
        let disk = MemStorage::new();
        let ab = names(&["a", "b"]);
        check_tenants(&disk, Some(&ab)).expect("recorded");
        check_tenants(&disk, Some(&ab)).expect("the same");
        let e = check_tenants(&disk, Some(&names(&["b", "a"]))).expect_err("reordered");
        assert!(format!("{e:#}").contains("cannot change"), "{e:#}");
        let e = check_tenants(&disk, Some(&names(&["a", "b", "c"]))).expect_err("added");
        assert!(format!("{e:#}").contains("cannot change"), "{e:#}");
        let e = check_tenants(&disk, None).expect_err("no --config");
        assert!(
            format!("{e:#}").contains("--config that names them"),
            "{e:#}"
        );
        // A store without tenants does not take them.
        let single = MemStorage::new();
        check_tenants(&single, None).expect("one store");
        single.write_atomic("raft-state", b"x").expect("write");
        let e = check_tenants(&single, Some(&ab)).expect_err("tenants later");
        assert!(format!("{e:#}").contains("without tenants"), "{e:#}");
    }

    #[test]
    fn a_fingerprint_tells_names_and_their_order_apart() {
        let ab = fingerprint(&names(&["a", "b"]));
        assert_eq!(ab, fingerprint(&names(&["a", "b"])));
        assert_ne!(ab, fingerprint(&names(&["b", "a"])));
        assert_ne!(ab, fingerprint(&names(&["ab"])));
        assert_ne!(ab, fingerprint(&names(&["a", "b", "c"])));
        assert_ne!(fingerprint(&[]), 0);
    }

    #[test]
    fn each_group_has_its_own_directory() {
        let d = Path::new("/d");
        assert_eq!(group_dir(d, None, 1, 0), None);
        assert_eq!(group_dir(d, None, 4, 3), Some(d.join("partition-3")));
        assert_eq!(group_dir(d, Some("a"), 1, 0), Some(d.join("tenant-a")));
        assert_eq!(
            group_dir(d, Some("a"), 2, 1),
            Some(d.join("tenant-a").join("partition-1"))
        );
    }
}
