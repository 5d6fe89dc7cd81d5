//! The plugin's options: `plugin_opt_<key> <value>` lines of
//! `mosquitto.conf`, each checked (an unknown key or a bad value stops
//! mosquitto at start, naming it).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use statestore::Persist;
use statestore::auth::isolation::ClientTopics;
use statestore::store::StoreOptions;
use statestore::store::journal::Fsync;
use statestore_guest::types::Quota;

/// Every `plugin_opt_*` key, with what it sets (for error messages).
pub const KEYS: &[(&str, &str)] = &[
    (
        "data_dir",
        "a directory: the store is durable there (volatile without)",
    ),
    (
        "fsync",
        "everysec (default) or no: when the journal reaches the disk",
    ),
    ("node_id", "the store's HLC node id (default mosquitto)"),
    (
        "memory_mib",
        "the guest's memory, MiB (16 to 4096; default 1024, as serve --memory)",
    ),
    (
        "max_bytes_mib",
        "bytes of keys and values, MiB (default a third of memory_mib)",
    ),
    ("max_value_mib", "the longest value, MiB (default 16)"),
    ("max_key_kib", "the longest key, KiB (default 64)"),
    (
        "call_ms",
        "the most work one guest call may do, in ms of fuel (default 1000)",
    ),
    ("cache_dir", "where the compiled component is cached"),
    (
        "metrics",
        "ADDR: serve Prometheus metrics (/metrics, /healthz, /readyz) there",
    ),
    (
        "component",
        "serve this build of the component instead of the built-in one (SIGHUP reads it again: an upgrade with the state carried over)",
    ),
    (
        "request_expiry_secs",
        "how long a request lives (mosquitto 2.0 does not show plugins a message's own expiry; default 60)",
    ),
    (
        "authorization",
        "a BrokerAuthorization rules file: its state store resources decide keys",
    ),
    (
        "trust_usernames",
        "true: mosquitto authenticates user names (password_file, a plugin), so the rules may name them",
    ),
    (
        "other_acl",
        "true: an acl_file or another plugin decides topics; this plugin only refuses the store's",
    ),
    (
        "strict_client_topics",
        "true: clients/<id>/... is client <id>'s alone",
    ),
];

/// What the options say.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    /// Durable in this directory; volatile without.
    pub data_dir: Option<PathBuf>,
    /// When the journal reaches the disk.
    pub fsync: Fsync,
    /// HLC node id.
    pub node_id: String,
    /// The guest's memory.
    pub memory_bytes: usize,
    /// Bytes of keys and values.
    pub max_bytes: u64,
    /// Longest value.
    pub max_value_bytes: u32,
    /// Longest key.
    pub max_key_bytes: u32,
    /// Work one call may do.
    pub call_ms: u64,
    /// Where the compiled component is cached.
    pub cache_dir: Option<PathBuf>,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<std::net::SocketAddr>,
    /// A component file instead of the built-in one.
    pub component: Option<PathBuf>,
    /// How long a request lives: its reply's expiry, and how long the dedup
    /// cache answers a retry.
    pub request_expiry_secs: u32,
    /// The authorization rules file.
    pub authorization: Option<PathBuf>,
    /// Whether mosquitto's user names are verified.
    pub trust_usernames: bool,
    /// Whether another ACL decides ordinary topics.
    pub other_acl: bool,
    /// How private `clients/<id>/...` is.
    pub client_topics: ClientTopics,
}

impl Default for PluginOptions {
    /// The limits of `statestore serve`'s defaults; the journal syncs once a
    /// second (mosquitto's thread must not wait for the disk) and the node
    /// id names mosquitto.
    fn default() -> Self {
        let serve = statestore::config::TenantDefaults::default();
        PluginOptions {
            data_dir: None,
            fsync: Fsync::Everysec,
            node_id: "mosquitto".into(),
            memory_bytes: usize::try_from(serve.memory_mib << 20).unwrap_or(usize::MAX),
            max_bytes: statestore::config::default_max_bytes(serve.memory_mib),
            max_value_bytes: serve.max_value_bytes,
            max_key_bytes: serve.max_key_bytes,
            call_ms: serve.call_ms,
            cache_dir: None,
            component: None,
            metrics: None,
            request_expiry_secs: 60,
            authorization: None,
            trust_usernames: false,
            other_acl: false,
            client_topics: ClientTopics::Open,
        }
    }
}

fn flag(key: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        other => bail!("plugin_opt_{key}: {other:?} is not true or false"),
    }
}

fn number(key: &str, value: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64> {
    let n: u64 = value
        .parse()
        .with_context(|| format!("plugin_opt_{key}: {value:?} is not a whole number"))?;
    if !range.contains(&n) {
        bail!(
            "plugin_opt_{key}: {n} is not within {} to {}",
            range.start(),
            range.end()
        );
    }
    Ok(n)
}

impl PluginOptions {
    /// The options of `pairs` (key without `plugin_opt_`, value).
    pub fn parse(pairs: &[(String, String)]) -> Result<PluginOptions> {
        let mut o = PluginOptions::default();
        let mut max_bytes = None;
        for (key, value) in pairs {
            let value = value.trim();
            match key.as_str() {
                "data_dir" => o.data_dir = Some(PathBuf::from(value)),
                "fsync" => {
                    o.fsync = match value {
                        "everysec" => Fsync::Everysec,
                        "no" => Fsync::No,
                        "always" => Fsync::Always,
                        other => bail!("plugin_opt_fsync: {other:?} is not always, everysec or no"),
                    }
                }
                "node_id" => o.node_id = value.to_string(),
                "memory_mib" => o.memory_bytes = (number(key, value, 16..=4096)? << 20) as usize,
                "max_bytes_mib" => max_bytes = Some(number(key, value, 1..=4096)? << 20),
                "max_value_mib" => {
                    o.max_value_bytes =
                        u32::try_from(number(key, value, 1..=256)? << 20).unwrap_or(u32::MAX)
                }
                "max_key_kib" => {
                    o.max_key_bytes =
                        u32::try_from(number(key, value, 1..=1024)? << 10).unwrap_or(u32::MAX)
                }
                "call_ms" => o.call_ms = number(key, value, 1..=60_000)?,
                "cache_dir" => o.cache_dir = Some(PathBuf::from(value)),
                "component" => o.component = Some(PathBuf::from(value)),
                "metrics" => {
                    o.metrics = Some(value.parse().with_context(|| {
                        format!(
                            "plugin_opt_metrics: {value:?} is not an address (e.g. 127.0.0.1:9464)"
                        )
                    })?)
                }
                "request_expiry_secs" => {
                    o.request_expiry_secs =
                        u32::try_from(number(key, value, 1..=3600)?).unwrap_or(60)
                }
                "authorization" => o.authorization = Some(PathBuf::from(value)),
                "trust_usernames" => o.trust_usernames = flag(key, value)?,
                "other_acl" => o.other_acl = flag(key, value)?,
                "strict_client_topics" => {
                    o.client_topics = if flag(key, value)? {
                        ClientTopics::Strict
                    } else {
                        ClientTopics::Open
                    }
                }
                other => {
                    let known: Vec<String> = KEYS
                        .iter()
                        .map(|(k, what)| format!("plugin_opt_{k} ({what})"))
                        .collect();
                    bail!(
                        "unknown option plugin_opt_{other}; the options are: {}",
                        known.join("; ")
                    )
                }
            }
        }
        o.max_bytes = max_bytes.unwrap_or(statestore::config::default_max_bytes(
            o.memory_bytes as u64 >> 20,
        ));
        if o.max_bytes > o.memory_bytes as u64 / 3 {
            bail!(
                "plugin_opt_max_bytes_mib: at most a third of plugin_opt_memory_mib ({} MiB)",
                (o.memory_bytes >> 20) / 3
            );
        }
        Ok(o)
    }

    /// The component to serve.
    pub fn component(&self) -> statestore::store::tenant::ComponentSource {
        match &self.component {
            Some(p) => statestore::store::tenant::ComponentSource::File(p.clone()),
            None => statestore::store::tenant::ComponentSource::BuiltIn,
        }
    }

    /// The limits of the guest's instances.
    pub fn limits(&self) -> statestore::StoreLimits {
        statestore::StoreLimits {
            memory_bytes: Some(self.memory_bytes),
            call_ms: Some(self.call_ms),
        }
    }

    /// The store these options describe.
    pub fn store_options(&self) -> Result<StoreOptions> {
        let mut s = StoreOptions::volatile(&self.node_id, "statestore-mosquitto");
        if let Some(dir) = &self.data_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("plugin_opt_data_dir: cannot create {}", dir.display()))?;
            s.data_dir = Some(dir.clone());
            s.persist = Persist::All;
            s.fsync = self.fsync;
            s.memory_journal = false;
        }
        s.quota = Quota {
            max_keys: None,
            max_bytes: Some(self.max_bytes),
            max_key_bytes: Some(self.max_key_bytes),
            max_value_bytes: Some(self.max_value_bytes),
        };
        if let Some(path) = &self.authorization {
            let policy = statestore::auth::policy::Policy::load(path)
                .with_context(|| format!("plugin_opt_authorization: {}", path.display()))?;
            s.authorization = Some(policy.store_rules());
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_are_read_and_bad_ones_named() {
        let o = PluginOptions::parse(&pairs(&[
            ("data_dir", "/tmp/x"),
            ("fsync", "no"),
            ("memory_mib", "96"),
            ("trust_usernames", "true"),
        ]))
        .expect("options");
        assert_eq!(o.fsync, Fsync::No);
        assert_eq!(o.memory_bytes, 96 << 20);
        assert_eq!(o.max_bytes, 32 << 20);
        assert!(o.trust_usernames);
        for (bad, says) in [
            (("fsync", "sometimes"), "plugin_opt_fsync"),
            (("memory_mib", "lots"), "plugin_opt_memory_mib"),
            (("colour", "red"), "unknown option plugin_opt_colour"),
            (("other_acl", "maybe"), "plugin_opt_other_acl"),
        ] {
            let e = PluginOptions::parse(&pairs(&[bad])).expect_err("refused");
            assert!(format!("{e:#}").contains(says), "{e:#}");
        }
    }
}
