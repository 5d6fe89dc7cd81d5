//! `--cluster FILE`: the cluster file each replica is started with, and
//! the checks it must pass before anything listens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use tracing::warn;

use super::net::{Credentials, MAX_SECRET};
use super::pki::Tls;

/// How a replica serves reads (GET, SCAN).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// With a read index: the leader confirms with a heartbeat round that
    /// it still leads and names its commit index; the replica that got the
    /// read answers it once it has applied that index. No log entry.
    #[default]
    Index,
    /// As a log entry, like a write (for comparison, or to rule it out).
    Log,
}

/// When a replica of one group under `--fsync always` records in
/// `raft-state` what a round's sync of its log made durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaftState {
    /// Appended once the round's messages and replies have gone, synced
    /// by a thread of its own at most every 10 ms: a write's path has one
    /// sync per replica; a replica that dies leaves `raft-state` at most a
    /// round behind, a machine that loses power up to 10 ms of rounds (a
    /// log that then loses exactly those synced rounds would not be
    /// noticed).
    #[default]
    Behind,
    /// Before the round's messages: two syncs in a row on a write's path;
    /// a log that loses any synced round is noticed, whenever the crash.
    First,
}

/// `--cluster FILE`: this replica and its peers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// This replica's id (one of `replica`).
    pub id: u64,
    /// Where this replica keeps its Raft log and snapshots.
    pub data_dir: PathBuf,
    /// A file holding the secret every replica shares (at least 16 bytes):
    /// a peer link without it is refused.
    pub secret_file: PathBuf,
    /// The directory of the cluster's certificates (`statestore cluster
    /// certs` makes them): with it every link between replicas is mutual
    /// TLS, and raft addresses may be beyond loopback. This replica needs
    /// `ca.pem` and `replica-<id>.pem` / `.key` there.
    #[serde(default)]
    pub tls_dir: Option<PathBuf>,
    /// How reads are served: `index` (the default) or `log`.
    #[serde(default)]
    pub reads: ReadPath,
    /// When `raft-state` records a round's log sync (one group, `--fsync
    /// always`): `behind` (the default) or `first`.
    #[serde(default)]
    pub raft_state: RaftState,
    /// This replica joins a running cluster (`statestore cluster add`):
    /// it starts with no membership and waits for the leader's snapshot.
    /// Only read when its data directory is new.
    #[serde(default)]
    pub join: bool,
    /// The store in this many key partitions, each its own Raft group on
    /// every replica (1 to 256; default 1). The same on every replica, and
    /// fixed for the life of the store (see `super::partition`).
    #[serde(default = "one")]
    pub partitions: u32,
    /// Each group (a partition, a tenant's store) on this many of the
    /// replicas, spread over them (see `super::placement`); default: every
    /// group on every replica. With fewer than the replicas, a cluster may
    /// have up to 64 replicas; members are added (`added = true` in the new
    /// one's entry) and removed while it runs, groups moving one at a time.
    #[serde(default)]
    pub copies: Option<usize>,
    /// Every replica of the cluster, this one included.
    #[serde(rename = "replica")]
    pub replicas: Vec<ReplicaEntry>,
}

fn one() -> u32 {
    1
}

/// One replica in a [`ClusterFile`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaEntry {
    /// Its id (1, 2, ...; never 0).
    pub id: u64,
    /// Where it listens for the other replicas.
    pub raft: SocketAddr,
    /// Where its clients connect (its embedded broker), for `cluster
    /// status` and clients' lists.
    pub mqtt: Option<SocketAddr>,
    /// With `copies`: a replica added while running (`statestore cluster
    /// add`), not one of those the cluster was made with, whose list
    /// places the groups (see `super::placement`). Default false.
    #[serde(default)]
    pub added: bool,
}

impl ClusterFile {
    /// Reads and checks `path` (relative paths in it are relative to it).
    pub fn load(path: &Path) -> Result<ClusterFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the cluster file {}", path.display()))?;
        let mut f: ClusterFile = toml::from_str(&text)
            .with_context(|| format!("the cluster file {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        if f.data_dir.is_relative() {
            f.data_dir = base.join(&f.data_dir);
        }
        if f.secret_file.is_relative() {
            f.secret_file = base.join(&f.secret_file);
        }
        if let Some(d) = &mut f.tls_dir
            && d.is_relative()
        {
            *d = base.join(&*d);
        }
        f.check()
            .with_context(|| format!("the cluster file {}", path.display()))?;
        Ok(f)
    }

    fn check(&self) -> Result<()> {
        let max = super::partition::MAX_PARTITIONS;
        if !(1..=max).contains(&self.partitions) {
            bail!(
                "partitions = {}: a store has 1 to {max} partitions",
                self.partitions
            );
        }
        // The replicas the cluster was made with (those added while
        // running aside) place the groups.
        let n = self.replicas.iter().filter(|r| !r.added).count();
        let placed = self.copies.is_some_and(|c| c < n);
        if !placed && self.replicas.iter().any(|r| r.added) {
            bail!(
                "`added = true` marks a replica added to a cluster whose groups are placed (`copies` below its replicas); without `copies`, list every replica as usual"
            );
        }
        if let Some(c) = self.copies {
            if !(1..=7).contains(&c) || c > n {
                bail!(
                    "copies = {c}: each group is on 1 to 7 replicas (3 or 5 to survive failures), and at most all {n} of them"
                );
            }
            if c.is_multiple_of(2) {
                warn!(
                    copies = c,
                    "an even number of copies survives no more failures than one fewer"
                );
            }
            if placed && self.join && !self.replicas.iter().any(|r| r.id == self.id && r.added) {
                bail!(
                    "join = true with copies = {c} of {n} replicas: this replica's own entry must say `added = true` (it joins holding no group; the cluster moves some to it)"
                );
            }
        }
        if placed {
            if n > 64 {
                bail!("{n} replicas: a cluster with `copies` has at most 64");
            }
        } else if !(1..=7).contains(&n) {
            bail!(
                "{n} replicas: a cluster has 1 to 7 (3 or 5 to survive failures); more with `copies`, each group on some of them"
            );
        }
        if !placed && n.is_multiple_of(2) {
            warn!(
                replicas = n,
                "an even number of replicas survives no more failures than one fewer"
            );
        }
        let mut ids: Vec<u64> = self.replicas.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        if ids.contains(&0) {
            bail!("replica id 0 is reserved");
        }
        if ids.windows(2).any(|w| w[0] == w[1]) {
            bail!("replica ids must differ: {ids:?}");
        }
        if !ids.contains(&self.id) {
            bail!("id {} is not among the replicas {ids:?}", self.id);
        }
        // Two replicas at one address: one of them could never be reached
        // (and a message for it would reach the other).
        let addresses = self.replicas.iter().map(|r| ("raft", r.id, r.raft)).chain(
            self.replicas
                .iter()
                .filter_map(|r| r.mqtt.map(|m| ("mqtt", r.id, m))),
        );
        let mut seen: HashMap<SocketAddr, (&str, u64)> = HashMap::new();
        for (what, id, addr) in addresses {
            if let Some((first, other)) = seen.insert(addr, (what, id)) {
                bail!(
                    "replica {id}'s {what} address {addr} is also replica {other}'s {first} address: each replica needs addresses of its own"
                );
            }
        }
        Ok(())
    }

    /// Where its groups are (see [`super::placement`]).
    pub fn placement(&self) -> super::placement::Placement {
        let ids: Vec<u64> = self
            .replicas
            .iter()
            .filter(|r| !r.added)
            .map(|r| r.id)
            .collect();
        super::placement::Placement::new(&ids, self.copies)
    }

    /// This replica's entry.
    pub fn me(&self) -> &ReplicaEntry {
        self.replicas
            .iter()
            .find(|r| r.id == self.id)
            .expect("checked at load")
    }

    /// The shared secret.
    pub fn secret(&self) -> Result<Vec<u8>> {
        let s = std::fs::read_to_string(&self.secret_file)
            .with_context(|| {
                format!(
                    "cannot read the cluster's shared secret {} (`secret_file` of the cluster file; every replica and the operator's tools need the same one)",
                    self.secret_file.display()
                )
            })?
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        if s.len() < 16 {
            bail!(
                "the cluster secret in {} is {} bytes: use at least 16 (e.g. `head -c 32 /dev/urandom | base64`)",
                self.secret_file.display(),
                s.len()
            );
        }
        if s.len() > MAX_SECRET {
            bail!(
                "the cluster secret in {} is {} bytes: a replica link carries at most {MAX_SECRET} (32 random bytes, e.g. `head -c 32 /dev/urandom | base64`, are plenty)",
                self.secret_file.display(),
                s.len()
            );
        }
        Ok(s.into_bytes())
    }

    /// This replica's credentials on the links.
    pub fn credentials(&self) -> Result<Credentials> {
        let tls = match &self.tls_dir {
            Some(dir) => Some(Tls::load(dir, self.id)?),
            None => None,
        };
        Ok(Credentials::new(self.id, &self.secret()?, tls)
            .with_partitions(self.partitions)
            .with_placement(self.placement().fingerprint()))
    }

    /// The operator's tools' credentials: with TLS, the operator's
    /// certificate if it is in the directory, else this replica's.
    pub fn operator_credentials(&self) -> Result<Credentials> {
        let tls = match &self.tls_dir {
            Some(dir) if super::pki::files(dir, 0).0.exists() => Some(Tls::load(dir, 0)?),
            Some(dir) => Some(Tls::load(dir, self.id)?),
            None => None,
        };
        Ok(Credentials::new(0, &self.secret()?, tls).with_partitions(self.partitions))
    }

    /// The guest's hash seed: the same on every replica (they must apply
    /// alike), and secret (derived from the shared secret).
    pub fn hash_seed(secret: &[u8]) -> u64 {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest([b"statestore hash seed ".as_slice(), secret].concat());
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(replicas: &str) -> Result<ClusterFile> {
        let text = format!("id = 1\ndata_dir = \"d\"\nsecret_file = \"s\"\n{replicas}");
        let f: ClusterFile = toml::from_str(&text)?;
        f.check()?;
        Ok(f)
    }

    #[test]
    fn replicas_need_addresses_of_their_own() {
        let ok = "[[replica]]\nid = 1\nraft = \"127.0.0.1:7001\"\nmqtt = \"127.0.0.1:1883\"\n\
                  [[replica]]\nid = 2\nraft = \"127.0.0.1:7002\"\nmqtt = \"127.0.0.1:1884\"\n\
                  [[replica]]\nid = 3\nraft = \"127.0.0.1:7003\"\n";
        file(ok).expect("distinct addresses");
        let same_raft = ok.replace("7002", "7001");
        let e = format!(
            "{:#}",
            file(&same_raft).expect_err("two replicas on one raft address")
        );
        assert!(
            e.contains("replica 2's raft address 127.0.0.1:7001 is also replica 1's raft address"),
            "{e}"
        );
        let same_mqtt = ok.replace("1884", "1883");
        let e = format!(
            "{:#}",
            file(&same_mqtt).expect_err("two replicas on one mqtt address")
        );
        assert!(e.contains("mqtt address 127.0.0.1:1883"), "{e}");
        let crossed = ok.replace("127.0.0.1:1884", "127.0.0.1:7003");
        assert!(
            file(&crossed).is_err(),
            "one replica's mqtt on another's raft address"
        );
    }

    /// `copies`: 1 to 7 and at most the replicas; below them, up to 64
    /// replicas, and no `join`; without it (or equal), 1 to 7 replicas.
    #[test]
    fn copies_place_groups_on_some_of_up_to_64_replicas() {
        let replicas = |n: u64| {
            (1..=n)
                .map(|i| format!("[[replica]]\nid = {i}\nraft = \"127.0.0.1:{}\"\n", 7000 + i))
                .collect::<String>()
        };
        let f = file(&format!("copies = 3\n{}", replicas(4))).expect("3 of 4");
        assert!(!f.placement().everywhere());
        assert_eq!(f.placement().hosts(1), vec![2, 3, 4]);
        assert!(
            file(&format!("copies = 3\n{}", replicas(3)))
                .expect("3 of 3")
                .placement()
                .everywhere()
        );
        file(&format!("copies = 3\n{}", replicas(40))).expect("3 of 40");
        for (text, says) in [
            (format!("copies = 4\n{}", replicas(3)), "at most all 3"),
            (format!("copies = 0\n{}", replicas(3)), "1 to 7 replicas"),
            (format!("copies = 9\n{}", replicas(20)), "1 to 7 replicas"),
            (format!("copies = 3\n{}", replicas(65)), "at most 64"),
            (replicas(8), "more with `copies`"),
            (
                format!("copies = 3\njoin = true\n{}", replicas(4)),
                "join = true",
            ),
        ] {
            let e = format!("{:#}", file(&text).expect_err(says));
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    /// 1 to 256 partitions; none said is one.
    #[test]
    fn raft_state_is_behind_unless_first() {
        let one = "[[replica]]\nid = 1\nraft = \"127.0.0.1:7101\"\n";
        assert_eq!(file(one).expect("default").raft_state, RaftState::Behind);
        let first = file(&format!("raft_state = \"first\"\n{one}")).expect("first");
        assert_eq!(first.raft_state, RaftState::First);
        assert!(file(&format!("raft_state = \"later\"\n{one}")).is_err());
    }

    #[test]
    fn a_store_has_1_to_256_partitions() {
        let one = "[[replica]]\nid = 1\nraft = \"127.0.0.1:7101\"\n";
        assert_eq!(file(one).expect("default").partitions, 1);
        for (p, ok) in [(0, false), (1, true), (256, true), (257, false)] {
            let got = file(&format!("partitions = {p}\n{one}"));
            assert_eq!(got.is_ok(), ok, "partitions = {p}: {got:?}");
            if let Err(e) = got {
                assert!(format!("{e:#}").contains("1 to 256 partitions"), "{e:#}");
            }
        }
    }

    #[test]
    fn the_secret_fits_a_link() {
        let dir = std::env::temp_dir().join(format!("statestore-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut f = file("[[replica]]\nid = 1\nraft = \"127.0.0.1:7001\"\n").expect("file");
        f.secret_file = dir.join("secret");
        for (len, ok) in [
            (15, false),
            (16, true),
            (MAX_SECRET, true),
            (MAX_SECRET + 1, false),
        ] {
            std::fs::write(&f.secret_file, "s".repeat(len)).expect("write");
            assert_eq!(f.secret().is_ok(), ok, "a secret of {len} bytes");
        }
        let e = format!("{:#}", f.secret().expect_err("too long"));
        assert!(e.contains(&format!("at most {MAX_SECRET}")), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
