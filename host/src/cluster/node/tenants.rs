//! A replica serving tenants (`serve --cluster --config`): each tenant's
//! store is its own Raft group (with `partitions = P`, P groups) on the
//! same replicas, with its own guest (component and limits), log and
//! snapshots; the links, the ticks and the round journal are shared by
//! every group. Tenant `t`'s partition `p` is group `t * P + p`, so the
//! tenants and their order are the data directory's for life (recorded in
//! `tenants`: those the cluster was founded with, then those it added while
//! running, see [`super::added`]), and replicas founded with other tenants
//! are not linked (their layout frame differs, see [`crate::cluster::net`]).
//!
//! ```text
//!   data_dir/tenants                   the tenants' names, one a line, in order;
//!                                      `+<name>`: added while running
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

/// The tenants a data directory records, in order: those the cluster was
/// founded with, then those it added; and those it removed (they keep
/// their numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    founding: Vec<String>,
    added: Vec<String>,
    removed: Vec<String>,
}

impl Recorded {
    fn all(&self) -> impl Iterator<Item = &String> {
        self.founding.iter().chain(&self.added)
    }

    /// Those not removed.
    fn serving(&self) -> impl Iterator<Item = &String> {
        self.all().filter(|n| !self.removed.contains(n))
    }

    fn text(&self) -> String {
        let founding = self.founding.iter().map(|n| format!("{n}\n"));
        let added = self.added.iter().map(|n| format!("+{n}\n"));
        let removed = self.removed.iter().map(|n| format!("-{n}\n"));
        founding.chain(added).chain(removed).collect()
    }

    fn write(&self, root: &dyn Storage) -> Result<()> {
        root.write_atomic(TENANTS, self.text().as_bytes())
            .context("writing `tenants` in the data directory")
    }
}

fn read_recorded(root: &dyn Storage) -> Result<Option<Recorded>> {
    let bytes = match root.read(TENANTS) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("reading `tenants` in the data directory"),
    };
    let text =
        std::str::from_utf8(&bytes).context("`tenants` in the data directory is not UTF-8")?;
    let mut r = Recorded {
        founding: Vec::new(),
        added: Vec::new(),
        removed: Vec::new(),
    };
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(name) = line.strip_prefix('+') {
            r.added.push(name.to_string());
        } else if let Some(name) = line.strip_prefix('-') {
            r.removed.push(name.to_string());
        } else if r.added.is_empty() && r.removed.is_empty() {
            r.founding.push(line.to_string());
        } else {
            bail!(
                "`tenants` in the data directory names a founding tenant ({line:?}) after an added or removed one"
            );
        }
    }
    Ok(Some(r))
}

/// The tenants a data directory records, in order, removed ones included
/// (`None`: a replica without tenants, or a new data directory).
pub(crate) fn recorded_tenants(root: &dyn Storage) -> Result<Option<Vec<String>>> {
    Ok(read_recorded(root)?.map(|r| r.all().cloned().collect()))
}

/// Records in the data directory that the cluster added tenant `name`.
pub(super) fn record_added(root: &dyn Storage, name: &str) -> Result<()> {
    let mut r = read_recorded(root)?.context("the data directory records no tenants")?;
    if r.all().any(|n| n == name) {
        return Ok(());
    }
    r.added.push(name.to_string());
    r.write(root)
}

/// Records in the data directory that the cluster removed tenant `name`.
pub(super) fn record_removed(root: &dyn Storage, name: &str) -> Result<()> {
    let mut r = read_recorded(root)?.context("the data directory records no tenants")?;
    if r.removed.iter().any(|n| n == name) {
        return Ok(());
    }
    r.removed.push(name.to_string());
    r.write(root)
}

/// The stores of a replica's groups: every tenant's name in number order
/// (removed ones included: their numbers stay taken), which are removed,
/// and how many the cluster was founded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Served {
    pub(super) names: Vec<String>,
    pub(super) removed: Vec<bool>,
    pub(super) founding: usize,
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

/// The stores a replica serves, in the order of its groups (`None`: a
/// tenant the cluster removed), and which: of `stores` (`named`: the
/// tenants of `--config`, in any order), those the data directory records
/// (see [`order`]).
pub(super) fn served(
    root: &dyn Storage,
    stores: Vec<NodeTenant>,
    named: bool,
) -> Result<(Vec<Option<NodeTenant>>, Served)> {
    let names: Vec<String> = stores.iter().map(|t| t.name.clone()).collect();
    let Some(served) = order(root, named.then_some(&names[..]))? else {
        let one = Served {
            names,
            removed: vec![false],
            founding: 1,
        };
        return Ok((stores.into_iter().map(Some).collect(), one));
    };
    let mut by_name: std::collections::HashMap<String, NodeTenant> =
        stores.into_iter().map(|t| (t.name.clone(), t)).collect();
    let out = served
        .names
        .iter()
        .zip(&served.removed)
        .map(|(n, &removed)| {
            if removed {
                return None;
            }
            let t = by_name
                .remove(n)
                .expect("every tenant served is in --config");
            Some(t)
        })
        .collect();
    Ok((out, served))
}

/// The tenants a replica serves (`names`: those of `--config`, in any
/// order; `None`: the one store), in the order the data directory records
/// them (a new one records `names` as the founding tenants). Every tenant
/// recorded and not removed must be in `--config`; one in `--config` and
/// not yet the cluster's waits for `statestore cluster tenant add`.
fn order(root: &dyn Storage, names: Option<&[String]>) -> Result<Option<Served>> {
    let exists = |name: &str| match root.read(name) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {name}")),
    };
    match (read_recorded(root)?, names) {
        (None, None) => Ok(None),
        (Some(had), None) => bail!(
            "the data directory holds the stores of the tenants {:?}: start the replica with the --config that names them",
            had.serving().collect::<Vec<_>>()
        ),
        (None, Some(names)) => {
            if exists("raft-state")? || exists("partitions")? {
                bail!(
                    "the data directory holds a store without tenants and --config names the tenants {names:?}: a cluster cannot take tenants later yet; start without --config, or start a new cluster with empty data directories"
                );
            }
            let founding = Recorded {
                founding: names.to_vec(),
                added: Vec::new(),
                removed: Vec::new(),
            };
            founding.write(root)?;
            Ok(Some(Served {
                names: names.to_vec(),
                removed: vec![false; names.len()],
                founding: names.len(),
            }))
        }
        (Some(had), Some(names)) => {
            if let Some(name) = had.serving().find(|n| !names.contains(n)) {
                bail!(
                    "the data directory holds the store of tenant {name:?} and --config does not name it: put it back in --config (the cluster's tenants are {:?})",
                    had.serving().collect::<Vec<_>>()
                );
            }
            for name in names.iter().filter(|n| !had.all().any(|h| h == *n)) {
                tracing::info!(tenant = %name, "a tenant of --config that is not the cluster's yet: `statestore cluster tenant add {name}` adds it");
            }
            for name in names.iter().filter(|n| had.removed.contains(n)) {
                tracing::info!(tenant = %name, "a tenant of --config that the cluster removed: not served (take it out of --config)");
            }
            let all: Vec<String> = had.all().cloned().collect();
            Ok(Some(Served {
                removed: all.iter().map(|n| had.removed.contains(n)).collect(),
                names: all,
                founding: had.founding.len(),
            }))
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

    fn served_names(disk: &MemStorage, list: &[&str]) -> Result<(Vec<String>, usize)> {
        let s = order(disk, Some(&names(list)))?.expect("tenants");
        Ok((s.names, s.founding))
    }

    #[test]
    fn a_data_directory_keeps_its_tenants_for_life() {
        let disk = MemStorage::new();
        let ab = names(&["a", "b"]);
        assert_eq!(
            served_names(&disk, &["a", "b"]).expect("recorded"),
            (ab.clone(), 2)
        );
        assert_eq!(
            served_names(&disk, &["a", "b"]).expect("the same"),
            (ab.clone(), 2)
        );
        // Served in the recorded order, whatever --config's.
        assert_eq!(
            served_names(&disk, &["b", "a"]).expect("reordered"),
            (ab.clone(), 2)
        );
        // One not yet the cluster's waits for `cluster tenant add`.
        assert_eq!(
            served_names(&disk, &["a", "c", "b"]).expect("more"),
            (ab.clone(), 2)
        );
        let e = served_names(&disk, &["a"]).expect_err("one missing");
        assert!(format!("{e:#}").contains("put it back"), "{e:#}");
        record_added(&disk, "c").expect("added");
        record_added(&disk, "c").expect("once");
        assert_eq!(
            recorded_tenants(&disk).expect("read"),
            Some(names(&["a", "b", "c"]))
        );
        assert_eq!(disk.read(TENANTS).expect("file"), b"a\nb\n+c\n");
        assert_eq!(
            served_names(&disk, &["c", "b", "a", "d"]).expect("added"),
            (names(&["a", "b", "c"]), 2)
        );
        let e = served_names(&disk, &["a", "b"]).expect_err("the added one missing");
        assert!(format!("{e:#}").contains("\"c\""), "{e:#}");
        // Removed, it keeps its number and need not be in --config.
        record_removed(&disk, "b").expect("removed");
        record_removed(&disk, "b").expect("once");
        assert_eq!(disk.read(TENANTS).expect("file"), b"a\nb\n+c\n-b\n");
        let s = order(&disk, Some(&names(&["a", "c"])))
            .expect("b gone")
            .expect("tenants");
        assert_eq!(
            (s.names, s.removed, s.founding),
            (names(&["a", "b", "c"]), vec![false, true, false], 2)
        );
        let e = order(&disk, None).expect_err("no --config");
        assert!(
            format!("{e:#}").contains("--config that names them"),
            "{e:#}"
        );
        // A store without tenants does not take them.
        let single = MemStorage::new();
        assert_eq!(order(&single, None).expect("one store"), None);
        single.write_atomic("raft-state", b"x").expect("write");
        let e = served_names(&single, &["a", "b"]).expect_err("tenants later");
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
