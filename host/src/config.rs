//! The tenant config file (`statestore serve --config FILE`, TOML).
//!
//! ```toml
//! [defaults]                    # every tenant starts from these (unset: the serve flags')
//! memory_mib = 64               # linear memory cap of its guest
//! call_ms = 1000                # longest one call into its guest may run
//! max_keys = 100000             # quota: keys ...
//! max_bytes = 16777216          #   ... and bytes of keys and values (default and most: a third of memory_mib)
//! max_key_bytes = 65536         # longest key a SET may create
//! max_value_bytes = 4194304     # longest value a SET may write
//! data_root = "/var/lib/statestore"   # each tenant in data_root/<name>
//! persist = "all"               # all | flagged | custom | none
//! persist_keys = ["sensors/*", "string:config", "binary:AAEC"]  # with "custom"
//! fsync = "always"              # always | everysec | no
//! scan_page_keys = 1000         # most keys in one SCAN page ...
//! scan_page_kib = 256           #   ... and KiB of keys
//! response_topics = "any"       # any | sdk: answer only clients/<requester>/... topics
//!
//! [[tenant]]
//! name = "factory-a"
//! usernames = ["factory-a"]     # embedded broker: clients with these MQTT user names
//! password_file = "/etc/statestore/factory-a.password"
//! client_id_prefixes = ["fa-"]  # ... or whose client id starts with one of these
//! memory_mib = 256              # any default can be overridden
//!
//! [[tenant]]
//! name = "everyone-else"
//! default = true                # clients that match no other tenant
//! ```
//!
//! With an external broker (`--broker`) each tenant is one connection:
//! `broker` (default: `--broker`), `client_id` (default `statestore-<name>`),
//! `broker_username` and `broker_password_file`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use statestore_guest::types::Quota;

use crate::mqtt::BrokerUrl;
use crate::store::StoreOptions;
use crate::store::journal::{Fsync, SnapshotPolicy};
use crate::store::tenant::{ComponentSource, WASM32_MAX_MEMORY};
use crate::{Persist, StoreLimits};

/// What every tenant starts from before `[defaults]` and its own table
/// change it: the `serve` flags (and the file's `[serve]` table). Its
/// `Default` is the flags' defaults, so a tenant of a config file and the
/// one store of a process without one get the same limits unless told
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDefaults {
    /// Linear memory cap of a guest, MiB (`--memory`).
    pub memory_mib: u64,
    /// Longest one call into a guest may run, ms (`--call-timeout`).
    pub call_ms: u64,
    /// Byte quota (`--max-bytes`); unset: a third of the tenant's memory.
    pub max_bytes: Option<u64>,
    /// Longest key a SET may create (`--max-key`).
    pub max_key_bytes: u32,
    /// Longest value a SET may write (`--max-value`).
    pub max_value_bytes: u32,
    /// When appended records reach the disk (`--fsync`).
    pub fsync: Fsync,
    /// Journal bytes that trigger a snapshot (`--snapshot-log`).
    pub snapshot_log_bytes: u64,
    /// Longest time between snapshots (`--snapshot-interval`).
    pub snapshot_interval: Duration,
    /// Whether a volatile store keeps a journal in memory
    /// (not `--no-memory-journal`).
    pub memory_journal: bool,
    /// The most one SCAN page holds (`--scan-page-keys`, `--scan-page-size`).
    pub scan_page: crate::ScanPage,
    /// Answer only `clients/<requester>/...` topics (`--response-topics sdk`).
    pub sdk_response_topics: bool,
    /// The HLC node id of versions (`--node-id`).
    pub node_id: String,
}

/// The byte quota of a store whose memory cap is `memory_mib` and which
/// sets none: a third of the cap, in whole MiB (the keys and values, a
/// snapshot of them and the work of a call all live in the guest's memory).
pub fn default_max_bytes(memory_mib: u64) -> u64 {
    ((memory_mib / 3) << 20).max(1)
}

impl Default for TenantDefaults {
    fn default() -> TenantDefaults {
        TenantDefaults {
            memory_mib: 1024,
            call_ms: 1000,
            max_bytes: None,
            max_key_bytes: 64 << 10,
            max_value_bytes: 16 << 20,
            fsync: Fsync::Always,
            snapshot_log_bytes: 64 << 20,
            snapshot_interval: Duration::from_secs(300),
            memory_journal: true,
            scan_page: crate::ScanPage {
                max_keys: 1000,
                max_bytes: 256 << 10,
            },
            sdk_response_topics: false,
            node_id: "StateStore".into(),
        }
    }
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// `serve` options (see [`serve_settings`]); checked there.
    #[serde(default)]
    #[allow(dead_code)]
    serve: Option<toml::Table>,
    #[serde(default)]
    defaults: Settings,
    #[serde(default, rename = "tenant")]
    tenants: Vec<TenantEntry>,
}

/// Settings a tenant inherits from `[defaults]` and may override.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    memory_mib: Option<u64>,
    call_ms: Option<u64>,
    max_keys: Option<u64>,
    max_bytes: Option<u64>,
    max_key_bytes: Option<u32>,
    max_value_bytes: Option<u32>,
    data_root: Option<PathBuf>,
    persist: Option<String>,
    fsync: Option<String>,
    snapshot_log_mib: Option<u64>,
    snapshot_interval: Option<u64>,
    memory_journal: Option<bool>,
    persist_keys: Option<Vec<String>>,
    scan_page_keys: Option<u32>,
    scan_page_kib: Option<u32>,
    response_topics: Option<String>,
    component: Option<PathBuf>,
    broker: Option<String>,
    node_id: Option<String>,
}

// serde cannot deny unknown fields next to `flatten`: `check_keys` does.
#[derive(Debug, Deserialize)]
struct TenantEntry {
    name: String,
    #[serde(default)]
    default: bool,
    #[serde(default)]
    usernames: Vec<String>,
    password_file: Option<PathBuf>,
    #[serde(default)]
    client_id_prefixes: Vec<String>,
    data_dir: Option<PathBuf>,
    client_id: Option<String>,
    broker_username: Option<String>,
    broker_password_file: Option<PathBuf>,
    #[serde(flatten)]
    settings: Settings,
}

/// How the embedded broker recognises a tenant's clients.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// MQTT user names.
    pub usernames: Vec<String>,
    /// The password those user names must give, if any.
    pub password: Option<String>,
    /// Client id prefixes.
    pub client_id_prefixes: Vec<String>,
}

impl Matcher {
    /// Whether a client with this user name and client id is the tenant's.
    pub fn matches(&self, username: Option<&str>, client_id: &str) -> bool {
        username.is_some_and(|u| self.usernames.iter().any(|n| n == u))
            || self
                .client_id_prefixes
                .iter()
                .any(|p| client_id.starts_with(p.as_str()))
    }
}

/// A tenant's own connection to an external broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantBroker {
    /// The broker (default: `--broker`).
    pub url: Option<BrokerUrl>,
    /// Our client id on that connection.
    pub client_id: String,
    /// MQTT user name.
    pub username: Option<String>,
    /// MQTT password.
    pub password: Option<String>,
}

/// Everything about one tenant, resolved.
#[derive(Debug, Clone)]
pub struct TenantSpec {
    /// Its name (logs, data directory).
    pub name: String,
    /// Whether clients that match no tenant are its.
    pub default: bool,
    /// How its clients are recognised (embedded broker).
    pub matcher: Matcher,
    /// Its store: node id, persistence, data directory, quota.
    pub store: StoreOptions,
    /// Memory and CPU limits of its guest.
    pub limits: StoreLimits,
    /// The component it runs.
    pub component: ComponentSource,
    /// Its connection to an external broker.
    pub broker: TenantBroker,
}

/// Reads and checks a config file. `server_client_id` is the `__srcId` of
/// replies in the embedded mode.
pub fn load(
    path: &Path,
    server_client_id: &str,
    defaults: &TenantDefaults,
) -> Result<Vec<TenantSpec>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    parse(
        &text,
        path.parent().unwrap_or(Path::new(".")),
        server_client_id,
        defaults,
    )
    .with_context(|| format!("in the config file {}", path.display()))
}

/// Whether the file declares tenants (else it only sets `serve` options).
pub fn has_tenants(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("tenant"))
}

/// One `serve` option from a config file's `[serve]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSetting {
    /// The option's name, as in the table (`max_packet_mib`).
    pub key: String,
    /// Its value.
    pub value: toml::Value,
    /// The line it is on (1-based), for messages.
    pub line: usize,
}

/// The `[serve]` table of a config file: every `serve` flag may be given
/// there by its name with `_` for `-` (`max_packet_mib = 16`); flags on the
/// command line override it. Keys of the other tables are checked by
/// [`parse`]. A table other than `serve`, `defaults` and `tenant` is an
/// error, with its line.
pub fn serve_settings(text: &str) -> Result<Vec<ServeSetting>> {
    let raw: toml::Table = toml::from_str(text)?;
    for key in raw.keys() {
        if !["serve", "defaults", "tenant"].contains(&key.as_str()) {
            bail!(
                "line {}: unknown key {key:?} (known: serve, defaults, tenant)",
                line_of(text, None, key)
            );
        }
    }
    let Some(table) = raw.get("serve") else {
        return Ok(Vec::new());
    };
    let Some(table) = table.as_table() else {
        bail!(
            "line {}: `serve` must be a table ([serve])",
            line_of(text, None, "serve")
        );
    };
    Ok(table
        .iter()
        .map(|(key, value)| ServeSetting {
            key: key.clone(),
            value: value.clone(),
            line: line_of(text, Some("serve"), key),
        })
        .collect())
}

/// The line (1-based) where `key` is set, in `table` (`None`: before any
/// table header); 0 if it cannot be found.
fn line_of(text: &str, table: Option<&str>, key: &str) -> usize {
    let mut current: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(header) = t.strip_prefix('[') {
            let name = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            if table.is_none() && name == key {
                return i + 1;
            }
            current = Some(name.to_string());
            continue;
        }
        let name = t.split('=').next().unwrap_or("").trim().trim_matches('"');
        if t.contains('=') && name == key && current.as_deref() == table {
            return i + 1;
        }
    }
    0
}

/// Parses config text; relative paths are taken from `base`, and what
/// neither `[defaults]` nor a tenant says from `inherited`.
pub fn parse(
    text: &str,
    base: &Path,
    server_client_id: &str,
    inherited: &TenantDefaults,
) -> Result<Vec<TenantSpec>> {
    let raw: toml::Table = toml::from_str(text)?;
    check_keys(&raw, text)?;
    let file: File = toml::from_str(text)?;
    if file.tenants.is_empty() {
        bail!("no [[tenant]] is declared");
    }
    let mut seen = Seen::default();
    let mut specs = Vec::new();
    for t in file.tenants {
        specs.push(tenant_spec(
            t,
            &file.defaults,
            inherited,
            base,
            server_client_id,
            &mut seen,
        )?);
    }
    if specs.iter().filter(|t| t.default).count() > 1 {
        bail!("more than one tenant has default = true");
    }
    Ok(specs)
}

/// What the tenants before the one being read took: no two may share a
/// name, a data directory, a client id or a user name.
#[derive(Default)]
struct Seen {
    names: HashSet<String>,
    dirs: HashSet<PathBuf>,
    client_ids: HashSet<String>,
    usernames: HashSet<String>,
}

/// One `[[tenant]]`, over `defaults`.
fn tenant_spec(
    t: TenantEntry,
    defaults: &Settings,
    inherited: &TenantDefaults,
    base: &Path,
    server_client_id: &str,
    seen: &mut Seen,
) -> Result<TenantSpec> {
    let s = merge(defaults, &t.settings);
    let name = t.name.clone();
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!("tenant name {name:?}: use 1 to 64 letters, digits, '-' or '_'");
    }
    if !seen.names.insert(name.clone()) {
        bail!("two tenants are called {name:?}");
    }
    let ctx = || format!("tenant {name:?}");
    let (persist, fsync, data_dir, persist_keys) =
        storage_of(&t, &s, inherited.fsync, &name, base, seen)?;
    let scan_page = crate::ScanPage {
        max_keys: s.scan_page_keys.unwrap_or(inherited.scan_page.max_keys),
        max_bytes: s
            .scan_page_kib
            .map_or(inherited.scan_page.max_bytes, |k| k.saturating_mul(1024)),
    };
    if scan_page.max_keys == 0 || scan_page.max_bytes == 0 {
        bail!(
            "{}: scan_page_keys and scan_page_kib must be at least 1",
            ctx()
        );
    }
    let sdk_response_topics = match s.response_topics.as_deref() {
        None => inherited.sdk_response_topics,
        Some("any") => false,
        Some("sdk") => true,
        Some(other) => bail!(
            "{}: response_topics must be any or sdk, not {other:?}",
            ctx()
        ),
    };
    let (memory_mib, call_ms) = limits_of(&s, inherited, &name)?;
    let password = match &t.password_file {
        Some(p) => Some(read_secret(&base.join(p)).with_context(ctx)?),
        None => None,
    };
    for u in &t.usernames {
        if !seen.usernames.insert(u.clone()) {
            bail!("{}: user name {u:?} is another tenant's too", ctx());
        }
    }
    if !t.default && t.usernames.is_empty() && t.client_id_prefixes.is_empty() {
        bail!(
            "{}: say how its clients are recognised (usernames, client_id_prefixes) or make it the default tenant",
            ctx()
        );
    }
    let client_id = t
        .client_id
        .clone()
        .unwrap_or_else(|| format!("statestore-{name}"));
    if !seen.client_ids.insert(client_id.clone()) {
        bail!("{}: client_id {client_id:?} is another tenant's too", ctx());
    }
    let url = match &s.broker {
        Some(u) => Some(u.parse().map_err(anyhow::Error::msg).with_context(ctx)?),
        None => None,
    };
    let broker_password = match &t.broker_password_file {
        Some(p) => Some(read_secret(&base.join(p)).with_context(ctx)?),
        None => None,
    };
    Ok(TenantSpec {
        default: t.default,
        matcher: Matcher {
            usernames: t.usernames,
            password,
            client_id_prefixes: t.client_id_prefixes,
        },
        store: StoreOptions {
            node_id: s
                .node_id
                .clone()
                .unwrap_or_else(|| inherited.node_id.clone()),
            server_client_id: server_client_id.to_string(),
            persist,
            data_dir,
            fsync,
            snapshots: SnapshotPolicy {
                max_log_bytes: s
                    .snapshot_log_mib
                    .map_or(inherited.snapshot_log_bytes, |m| m.saturating_mul(1 << 20))
                    .max(1),
                max_interval: s
                    .snapshot_interval
                    .map_or(inherited.snapshot_interval, Duration::from_secs)
                    .max(Duration::from_secs(1)),
                ..SnapshotPolicy::default()
            },
            quota: Quota {
                max_keys: s.max_keys,
                // Unset: a third of the memory cap (in whole MiB, as
                // for the flags), so that every tenant's keys,
                // registrations and cached replies fit it.
                max_bytes: Some(
                    s.max_bytes
                        .or(inherited.max_bytes)
                        .unwrap_or(default_max_bytes(memory_mib)),
                ),
                max_key_bytes: Some(s.max_key_bytes.unwrap_or(inherited.max_key_bytes)),
                max_value_bytes: Some(s.max_value_bytes.unwrap_or(inherited.max_value_bytes)),
            },
            clock: crate::store::clock::system(),
            on_damage: Default::default(),
            memory_journal: s.memory_journal.unwrap_or(inherited.memory_journal),
            persist_keys,
            scan_page,
            sdk_response_topics,
            authorization: None,
        },
        limits: StoreLimits {
            memory_bytes: Some(usize::try_from(memory_mib << 20).unwrap_or(WASM32_MAX_MEMORY)),
            call_ms: Some(call_ms),
        },
        component: match &s.component {
            Some(p) => ComponentSource::File(base.join(p)),
            None => ComponentSource::BuiltIn,
        },
        broker: TenantBroker {
            url,
            client_id,
            username: t.broker_username,
            password: broker_password,
        },
        name,
    })
}

/// Where and how a tenant keeps its keys: `persist`, `fsync`, its data
/// directory (its own, or `data_root`'s `<name>`) and `persist_keys`.
fn storage_of(
    t: &TenantEntry,
    s: &Settings,
    inherited_fsync: Fsync,
    name: &str,
    base: &Path,
    seen: &mut Seen,
) -> Result<(Persist, Fsync, Option<PathBuf>, Vec<crate::KeyMatch>)> {
    let ctx = || format!("tenant {name:?}");
    let persist = match s.persist.as_deref() {
        Some("all") => Some(Persist::All),
        Some("flagged") => Some(Persist::Flagged),
        Some("custom") => Some(Persist::Custom),
        Some("none") => Some(Persist::None),
        None => None,
        Some(other) => bail!(
            "{}: persist must be all, flagged, custom or none, not {other:?}",
            ctx()
        ),
    };
    let fsync = match s.fsync.as_deref() {
        None => inherited_fsync,
        Some("always") => Fsync::Always,
        Some("everysec") => Fsync::Everysec,
        Some("no") => Fsync::No,
        Some(other) => bail!(
            "{}: fsync must be always, everysec or no, not {other:?}",
            ctx()
        ),
    };
    let data_dir = t
        .data_dir
        .clone()
        .or_else(|| s.data_root.as_ref().map(|r| r.join(name)))
        .map(|d| base.join(d));
    let persist = match (persist, &data_dir) {
        (Some(p), _) => p,
        (None, Some(_)) => Persist::All,
        (None, None) => Persist::None,
    };
    if persist != Persist::None && data_dir.is_none() {
        bail!(
            "{}: persist = {persist:?} needs data_dir or data_root",
            ctx()
        );
    }
    if let Some(d) = &data_dir
        && !seen.dirs.insert(d.clone())
    {
        bail!(
            "{}: data directory {} is another tenant's",
            ctx(),
            d.display()
        );
    }
    let persist_keys = s
        .persist_keys
        .iter()
        .flatten()
        .map(|k| crate::store::parse_key_match(k))
        .collect::<Result<Vec<_>>>()
        .with_context(ctx)?;
    if !persist_keys.is_empty() && persist != Persist::Custom {
        bail!("{}: persist_keys needs persist = \"custom\"", ctx());
    }
    Ok((persist, fsync, data_dir, persist_keys))
}

/// A tenant's memory cap (MiB) and longest call (ms), checked against its
/// byte quota.
fn limits_of(s: &Settings, inherited: &TenantDefaults, name: &str) -> Result<(u64, u64)> {
    let ctx = || format!("tenant {name:?}");
    let memory_mib = s.memory_mib.unwrap_or(inherited.memory_mib);
    if memory_mib == 0 || memory_mib > (WASM32_MAX_MEMORY >> 20) as u64 {
        bail!("{}: memory_mib must be 1 to 4096", ctx());
    }
    // The keys and values live in the guest's memory, and a snapshot
    // (taken to truncate the log and to upgrade) is built there too:
    // a byte quota must leave room for both and for the work of a call.
    if let Some(max) = s.max_bytes.or(inherited.max_bytes)
        && max.saturating_mul(3) > memory_mib << 20
    {
        bail!(
            "{}: max_bytes = {max} cannot fit memory_mib = {memory_mib}: the keys and values, \
             a snapshot of them and the work of a call all live in the guest's memory; \
             keep max_bytes at most a third of the cap ({} bytes) or raise memory_mib",
            ctx(),
            (memory_mib << 20) / 3
        );
    }
    let call_ms = s.call_ms.unwrap_or(inherited.call_ms);
    if call_ms == 0 {
        bail!("{}: call_ms must be at least 1", ctx());
    }
    Ok((memory_mib, call_ms))
}

/// Keys a `[[tenant]]` may have besides those of `[defaults]`.
const TENANT_KEYS: &[&str] = &[
    "name",
    "default",
    "usernames",
    "password_file",
    "client_id_prefixes",
    "data_dir",
    "client_id",
    "broker_username",
    "broker_password_file",
];

/// Keys of `[defaults]`, which a tenant may override.
const SETTINGS_KEYS: &[&str] = &[
    "memory_mib",
    "call_ms",
    "max_keys",
    "max_bytes",
    "max_key_bytes",
    "max_value_bytes",
    "data_root",
    "persist",
    "fsync",
    "snapshot_log_mib",
    "snapshot_interval",
    "memory_journal",
    "persist_keys",
    "scan_page_keys",
    "scan_page_kib",
    "response_topics",
    "component",
    "broker",
    "node_id",
];

/// Refuses a misspelt key in a `[[tenant]]` rather than ignore it.
fn check_keys(raw: &toml::Table, text: &str) -> Result<()> {
    let Some(toml::Value::Array(tenants)) = raw.get("tenant") else {
        return Ok(());
    };
    for t in tenants {
        let Some(t) = t.as_table() else { continue };
        for key in t.keys() {
            if !TENANT_KEYS.contains(&key.as_str()) && !SETTINGS_KEYS.contains(&key.as_str()) {
                let name = t.get("name").and_then(toml::Value::as_str).unwrap_or("?");
                bail!(
                    "line {}: tenant {name:?}: unknown key {key:?} (known: {}, {})",
                    line_of(text, Some("tenant"), key),
                    TENANT_KEYS.join(", "),
                    SETTINGS_KEYS.join(", ")
                );
            }
        }
    }
    Ok(())
}

fn merge(defaults: &Settings, own: &Settings) -> Settings {
    let d = defaults.clone();
    let o = own.clone();
    Settings {
        memory_mib: o.memory_mib.or(d.memory_mib),
        call_ms: o.call_ms.or(d.call_ms),
        max_keys: o.max_keys.or(d.max_keys),
        max_bytes: o.max_bytes.or(d.max_bytes),
        max_key_bytes: o.max_key_bytes.or(d.max_key_bytes),
        max_value_bytes: o.max_value_bytes.or(d.max_value_bytes),
        data_root: o.data_root.or(d.data_root),
        persist: o.persist.or(d.persist),
        fsync: o.fsync.or(d.fsync),
        snapshot_log_mib: o.snapshot_log_mib.or(d.snapshot_log_mib),
        snapshot_interval: o.snapshot_interval.or(d.snapshot_interval),
        memory_journal: o.memory_journal.or(d.memory_journal),
        persist_keys: o.persist_keys.or(d.persist_keys),
        scan_page_keys: o.scan_page_keys.or(d.scan_page_keys),
        scan_page_kib: o.scan_page_kib.or(d.scan_page_kib),
        response_topics: o.response_topics.or(d.response_topics),
        component: o.component.or(d.component),
        broker: o.broker.or(d.broker),
        node_id: o.node_id.or(d.node_id),
    }
}

/// A password file's first line.
pub fn read_secret(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the password file {}", path.display()))?
        .lines()
        .next()
        .unwrap_or("")
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Vec<TenantSpec> {
        match parse(
            text,
            Path::new("/base"),
            "statestore",
            &TenantDefaults::default(),
        ) {
            Ok(s) => s,
            Err(e) => panic!("{e:#}"),
        }
    }

    fn parse_err(text: &str) -> String {
        match parse(
            text,
            Path::new("/base"),
            "statestore",
            &TenantDefaults::default(),
        ) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn defaults_are_inherited_and_overridden() {
        let specs = parse_ok(
            r#"
            [defaults]
            memory_mib = 32
            max_keys = 10
            data_root = "data"
            fsync = "everysec"

            [[tenant]]
            name = "a"
            usernames = ["ua"]
            memory_mib = 8

            [[tenant]]
            name = "b"
            default = true
            persist = "none"
            call_ms = 50
            "#,
        );
        let a = &specs[0];
        assert_eq!(a.limits.memory_bytes, Some(8 << 20));
        assert_eq!(a.limits.call_ms, Some(1000));
        assert_eq!(a.store.quota.max_keys, Some(10));
        assert_eq!(a.store.data_dir.as_deref(), Some(Path::new("/base/data/a")));
        assert_eq!(a.store.persist, Persist::All);
        assert_eq!(a.store.fsync, Fsync::Everysec);
        assert_eq!(a.broker.client_id, "statestore-a");
        assert!(a.matcher.matches(Some("ua"), "x"));
        assert!(!a.matcher.matches(Some("ub"), "x"));
        let b = &specs[1];
        assert!(b.default);
        assert_eq!(b.limits.memory_bytes, Some(32 << 20));
        assert_eq!(b.limits.call_ms, Some(50));
        assert_eq!(b.store.persist, Persist::None);
        assert_eq!(b.component, ComponentSource::BuiltIn);
    }

    #[test]
    fn mistakes_are_named() {
        assert!(parse_err("").contains("no [[tenant]]"));
        assert!(parse_err("[[tenant]]\nname = \"a\"\n").contains("recognised"));
        assert!(parse_err("[[tenant]]\nname = \"a b\"\ndefault = true\n").contains("tenant name"));
        assert!(
            parse_err("[[tenant]]\nname = \"a\"\ndefault = true\n[[tenant]]\nname = \"a\"\ndefault = true\n")
                .contains("two tenants")
        );
        assert!(
            parse_err("[[tenant]]\nname = \"a\"\ndefault = true\nmemroy_mib = 3\n")
                .contains("memroy_mib")
        );
        assert!(
            parse_err("[[tenant]]\nname = \"a\"\ndefault = true\npersist = \"all\"\n")
                .contains("needs data_dir")
        );
        assert!(
            parse_err("[[tenant]]\nname = \"a\"\ndefault = true\nmemory_mib = 5000\n")
                .contains("memory_mib")
        );
        assert!(
            parse_err(
                "[[tenant]]\nname = \"a\"\ndefault = true\nmemory_mib = 16\nmax_bytes = 16777216\n"
            )
            .contains("cannot fit memory_mib = 16")
        );
        assert!(
            parse_err(
                "[[tenant]]\nname = \"a\"\nusernames = [\"u\"]\n[[tenant]]\nname = \"b\"\nusernames = [\"u\"]\n"
            )
            .contains("another tenant's")
        );
    }

    #[test]
    fn the_example_config_is_valid() {
        let specs = parse_ok(include_str!("../../examples/tenants.toml"));
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[0].limits.memory_bytes, Some(128 << 20));
        assert_eq!(specs[1].store.quota.max_keys, Some(1000));
        assert!(specs[2].default);
        assert_eq!(specs[2].store.persist, Persist::None);
    }

    #[test]
    fn persist_custom_and_scan_pages() {
        let specs = parse_ok(
            "[defaults]\ndata_root = \"d\"\nscan_page_keys = 50\n\n\
             [[tenant]]\nname = \"a\"\ndefault = true\npersist = \"custom\"\n\
             persist_keys = [\"sensors/*\", \"string:config\", \"binary:AP8=\"]\nscan_page_kib = 4\n",
        );
        let store = &specs[0].store;
        assert_eq!(store.persist, Persist::Custom);
        assert_eq!(
            store.persist_keys,
            vec![
                crate::KeyMatch::Pattern("sensors/*".into()),
                crate::KeyMatch::Exact(b"config".to_vec()),
                crate::KeyMatch::Exact(vec![0, 0xff]),
            ]
        );
        assert_eq!(
            store.scan_page,
            crate::ScanPage {
                max_keys: 50,
                max_bytes: 4096
            }
        );
        let e = parse_err(
            "[[tenant]]\nname = \"a\"\ndefault = true\ndata_dir = \"d\"\npersist_keys = [\"x*\"]\n",
        );
        assert!(e.contains("persist_keys needs persist = \"custom\""), "{e}");
        let e = parse_err(
            "[[tenant]]\nname = \"a\"\ndefault = true\ndata_dir = \"d\"\npersist = \"custom\"\npersist_keys = [\"[x\"]\n",
        );
        assert!(e.contains("persist key pattern \"[x\""), "{e}");
        let e = parse_err("[[tenant]]\nname = \"a\"\ndefault = true\nscan_page_keys = 0\n");
        assert!(e.contains("at least 1"), "{e}");
    }

    #[test]
    fn client_id_prefixes_match() {
        let m = Matcher {
            client_id_prefixes: vec!["fa-".into()],
            ..Matcher::default()
        };
        assert!(m.matches(None, "fa-1"));
        assert!(!m.matches(None, "fb-1"));
    }
}
