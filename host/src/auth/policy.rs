//! The authorization file (`serve --authorization FILE`): the Azure IoT
//! Operations broker's `BrokerAuthorization` policy rules, in YAML (the
//! resource as it is, or just its rules) or TOML.
//!
//! ```yaml
//! authorizationPolicies:
//!   rules:
//!     - principals:
//!         clientIds: ["sensor-1"]
//!         usernames: ["alice"]
//!         attributes: [{ city: seattle, organization: contoso }]
//!       brokerResources:
//!         - method: Connect
//!         - method: Publish
//!           topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"]
//!         - method: Subscribe
//!           topics: ["clients/{principal.clientId}/#"]
//!       stateStoreResources:
//!         - method: ReadWrite          # Read, Write or ReadWrite
//!           keyType: Pattern           # Pattern, String or Binary (base64)
//!           keys: ["{principal.attributes.organization}/*"]
//! userAttributes:                      # attributes of password-file users
//!   alice: { city: seattle, organization: contoso }
//! certificateAttributes:               # of client certificates, by common name or subject
//!   smart-fan: { building: "17" }
//! ```
//!
//! Allow only: a client no rule allows cannot connect, publish or
//! subscribe, nor use any key. A rule applies to a client whose id is one of
//! its `clientIds`, whose user name is one of its `usernames`, or that has
//! every attribute of one of its `attributes` sets. Topics may use `+` and
//! `#`; a subscription is allowed only if every topic its filter can match
//! is allowed. `{principal.clientId}`, `{principal.username}` and
//! `{principal.attributes.NAME}` stand for the client's own; a value with
//! `+` or `#` grants nothing (it would widen the topic). The broker
//! resources are checked here, by the embedded broker; the state store
//! resources go to the guest (`statestore_guest::authz`), so every host
//! enforces them alike.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde::Deserialize;
use statestore_guest::types::{AuthRule, KeyGrant, KeyMethod, KeySpec, Principals};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileRule {
    principals: FilePrincipals,
    #[serde(default)]
    broker_resources: Vec<FileBrokerResource>,
    #[serde(default)]
    state_store_resources: Vec<FileStoreResource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePrincipals {
    #[serde(default)]
    client_ids: Vec<String>,
    #[serde(default)]
    usernames: Vec<String>,
    #[serde(default)]
    attributes: Vec<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum BrokerMethod {
    Connect,
    Publish,
    Subscribe,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileBrokerResource {
    method: BrokerMethod,
    #[serde(default)]
    topics: Vec<String>,
    /// With `Connect`: the client ids it may connect with (any if absent).
    #[serde(default)]
    client_ids: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
enum FileKeyMethod {
    Read,
    Write,
    ReadWrite,
}

#[derive(Debug, Clone, Copy, Deserialize)]
enum FileKeyType {
    Pattern,
    String,
    Binary,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileStoreResource {
    method: FileKeyMethod,
    key_type: FileKeyType,
    keys: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilePolicies {
    #[serde(default)]
    rules: Vec<FileRule>,
}

/// What the file may hold at its top: the resource (`spec:`), its spec
/// (`authorizationPolicies:`), or the rules alone (`rules:`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileTop {
    spec: Option<Box<FileTop>>,
    authorization_policies: Option<FilePolicies>,
    rules: Option<Vec<FileRule>>,
    #[serde(default)]
    user_attributes: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(default)]
    certificate_attributes: BTreeMap<String, BTreeMap<String, String>>,
}

/// A certificate subject (or common name) as `certificateAttributes` keys
/// it: without the spaces around `=` and `,` that writers differ on.
fn subject_key(name: &str) -> String {
    name.split(',')
        .map(|rdn| rdn.split('=').map(str::trim).collect::<Vec<_>>().join("="))
        .collect::<Vec<_>>()
        .join(",")
}

/// One rule's broker resources.
#[derive(Debug, Clone)]
struct BrokerRule {
    principals: Principals,
    /// `None`: no Connect; `Some(empty)`: any client id.
    connect: Option<Vec<String>>,
    publish: Vec<String>,
    subscribe: Vec<String>,
}

/// A client as the broker knows it.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// Its client id.
    pub client_id: &'a str,
    /// Its authenticated user name.
    pub username: Option<&'a str>,
    /// Its attributes.
    pub attributes: &'a [(String, String)],
}

/// A loaded authorization file.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    broker: Vec<BrokerRule>,
    store: Vec<AuthRule>,
    user_attributes: HashMap<String, Vec<(String, String)>>,
    certificate_attributes: HashMap<String, Vec<(String, String)>>,
}

impl Policy {
    /// Reads `path` (YAML unless it ends in `.toml`).
    pub fn load(path: &Path) -> Result<Policy> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the authorization file {}", path.display()))?;
        let toml = path.extension().is_some_and(|e| e == "toml");
        Policy::parse(&text, toml)
            .with_context(|| format!("in the authorization file {}", path.display()))
    }

    /// Parses a policy from YAML or TOML text.
    pub fn parse(text: &str, toml: bool) -> Result<Policy> {
        let mut top: FileTop = if toml {
            toml::from_str(text)?
        } else {
            serde_norway::from_str(text)?
        };
        let user_attributes = std::mem::take(&mut top.user_attributes);
        let certificate_attributes = std::mem::take(&mut top.certificate_attributes);
        while let Some(spec) = top.spec.take() {
            top = *spec;
        }
        let rules = match (top.authorization_policies, top.rules) {
            (Some(p), None) => p.rules,
            (None, Some(r)) => r,
            (None, None) => bail!("no rules: expected authorizationPolicies.rules or rules"),
            (Some(_), Some(_)) => bail!("both authorizationPolicies and rules: give one"),
        };
        let mut policy = Policy {
            user_attributes: user_attributes
                .into_iter()
                .map(|(u, a)| (u, a.into_iter().collect()))
                .collect(),
            certificate_attributes: certificate_attributes
                .into_iter()
                .map(|(name, a)| (subject_key(&name), a.into_iter().collect()))
                .collect(),
            ..Policy::default()
        };
        for (i, rule) in rules.into_iter().enumerate() {
            let at = || format!("rule {}", i + 1);
            let p = rule.principals;
            if p.client_ids.is_empty() && p.usernames.is_empty() && p.attributes.is_empty() {
                bail!("{}: its principals name no one", at());
            }
            let principals = Principals {
                client_ids: p.client_ids,
                usernames: p.usernames,
                attributes: p
                    .attributes
                    .into_iter()
                    .map(|a| a.into_iter().collect())
                    .collect(),
            };
            let mut broker = BrokerRule {
                principals: principals.clone(),
                connect: None,
                publish: Vec::new(),
                subscribe: Vec::new(),
            };
            for r in rule.broker_resources {
                for t in &r.topics {
                    check_filter(t).with_context(|| format!("{}: topic {t:?}", at()))?;
                }
                match r.method {
                    BrokerMethod::Connect => {
                        if !r.topics.is_empty() {
                            bail!("{}: Connect takes no topics", at());
                        }
                        let ids = r.client_ids.unwrap_or_default();
                        broker.connect.get_or_insert_with(Vec::new).extend(ids);
                    }
                    BrokerMethod::Publish | BrokerMethod::Subscribe if r.client_ids.is_some() => {
                        bail!("{}: clientIds belongs to Connect", at());
                    }
                    BrokerMethod::Publish => broker.publish.extend(r.topics),
                    BrokerMethod::Subscribe => broker.subscribe.extend(r.topics),
                }
            }
            let mut grants = Vec::new();
            for r in rule.state_store_resources {
                let keys = r
                    .keys
                    .into_iter()
                    .map(|k| match r.key_type {
                        FileKeyType::Pattern => Ok(KeySpec::Pattern(k)),
                        FileKeyType::String => Ok(KeySpec::Text(k)),
                        FileKeyType::Binary => base64::engine::general_purpose::STANDARD
                            .decode(k.trim())
                            .map(KeySpec::Binary)
                            .with_context(|| format!("{}: binary key {k:?} is not base64", at())),
                    })
                    .collect::<Result<Vec<_>>>()?;
                grants.push(KeyGrant {
                    method: match r.method {
                        FileKeyMethod::Read => KeyMethod::Read,
                        FileKeyMethod::Write => KeyMethod::Write,
                        FileKeyMethod::ReadWrite => KeyMethod::ReadWrite,
                    },
                    keys,
                });
            }
            policy.broker.push(broker);
            policy.store.push(AuthRule { principals, grants });
        }
        // The guest's own check of the keys (patterns, substitutions).
        statestore_guest::authz::Authorizer::new(&policy.store).map_err(anyhow::Error::msg)?;
        Ok(policy)
    }

    /// The state store resources, for the guest's config.
    pub fn store_rules(&self) -> Vec<AuthRule> {
        self.store.clone()
    }

    /// The attributes of a password-file user (`userAttributes`).
    pub fn attributes_of(&self, username: Option<&str>) -> Vec<(String, String)> {
        username
            .and_then(|u| self.user_attributes.get(u))
            .cloned()
            .unwrap_or_default()
    }

    /// The attributes of a client verified as `username`, holding a
    /// certificate with the common name `cn` and the subject `subject`:
    /// `userAttributes`, and the `certificateAttributes` entries named by
    /// its common name or its whole subject (`CN = smart-fan, O = Contoso`;
    /// spaces around `=` and `,` do not matter).
    pub fn attributes_for(
        &self,
        username: Option<&str>,
        cn: Option<&str>,
        subject: Option<&str>,
    ) -> Vec<(String, String)> {
        let mut out = self.attributes_of(username);
        for name in [cn, subject].into_iter().flatten() {
            if let Some(more) = self.certificate_attributes.get(&subject_key(name)) {
                out.extend(more.iter().cloned());
            }
        }
        out
    }

    fn rules_for<'p>(&'p self, who: &'p Who<'_>) -> impl Iterator<Item = &'p BrokerRule> + 'p {
        self.broker
            .iter()
            .filter(move |r| is_for(&r.principals, who))
    }

    /// Whether `who` may connect.
    pub fn may_connect(&self, who: &Who<'_>) -> bool {
        self.rules_for(who).any(|r| match &r.connect {
            None => false,
            Some(ids) if ids.is_empty() => true,
            Some(ids) => ids
                .iter()
                .any(|id| substitute(id, who).is_some_and(|id| id == who.client_id)),
        })
    }

    /// Whether `who` may publish to `topic`.
    pub fn may_publish(&self, who: &Who<'_>, topic: &str) -> bool {
        self.rules_for(who).any(|r| {
            r.publish
                .iter()
                .filter_map(|f| substitute(f, who))
                .any(|f| matches(&f, topic))
        })
    }

    /// Whether `who` may subscribe to `filter`: every topic it can match
    /// must be allowed (a `$share/<group>/` prefix is looked through).
    pub fn may_subscribe(&self, who: &Who<'_>, filter: &str) -> bool {
        let filter = match filter.strip_prefix("$share/") {
            Some(rest) => rest.split_once('/').map_or("", |(_, f)| f),
            None => filter,
        };
        self.rules_for(who).any(|r| {
            r.subscribe
                .iter()
                .filter_map(|f| substitute(f, who))
                .any(|allowed| covers(&allowed, filter))
        })
    }
}

/// The policy in force, replaced whole on a reload.
#[derive(Debug, Default)]
pub struct PolicyCell(std::sync::RwLock<Option<std::sync::Arc<Policy>>>);

impl PolicyCell {
    /// A cell holding `policy`.
    pub fn new(policy: Option<Policy>) -> std::sync::Arc<PolicyCell> {
        std::sync::Arc::new(PolicyCell(std::sync::RwLock::new(
            policy.map(std::sync::Arc::new),
        )))
    }

    /// The policy now.
    pub fn get(&self) -> Option<std::sync::Arc<Policy>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces it.
    pub fn set(&self, policy: Option<Policy>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = policy.map(std::sync::Arc::new);
    }
}

/// Whether `who` is one of `principals` (as the guest decides it).
fn is_for(principals: &Principals, who: &Who<'_>) -> bool {
    principals.client_ids.iter().any(|c| c == who.client_id)
        || who
            .username
            .is_some_and(|u| principals.usernames.iter().any(|x| x == u))
        || principals.attributes.iter().any(|set| {
            !set.is_empty()
                && set
                    .iter()
                    .all(|(n, v)| who.attributes.iter().any(|(an, av)| an == n && av == v))
        })
}

/// `template` with `who`'s values; `None` if one is missing or holds a
/// topic wildcard.
fn substitute(template: &str, who: &Who<'_>) -> Option<String> {
    const OPEN: &str = "{principal.";
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let end = after.find('}')?;
        let value = match &after[..end] {
            "clientId" => Some(who.client_id),
            "username" => who.username,
            name => name.strip_prefix("attributes.").and_then(|a| {
                who.attributes
                    .iter()
                    .find(|(n, _)| n == a)
                    .map(|(_, v)| v.as_str())
            }),
        }?;
        if value.contains(['+', '#']) {
            return None;
        }
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// A topic filter must be well formed: `#` only last and alone in its
/// level, `+` alone in its level; substitutions well formed.
fn check_filter(f: &str) -> Result<()> {
    if f.is_empty() {
        bail!("an empty topic");
    }
    let levels: Vec<&str> = f.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            bail!("`#` must be a whole level, and the last");
        }
        if l.contains('+') && *l != "+" {
            bail!("`+` must be a whole level");
        }
    }
    if levels.iter().any(|l| {
        l.contains("{principal.")
            && !(l.starts_with('{') && l.ends_with('}') && l.matches('{').count() == 1)
    }) {
        bail!(
            "a {{principal.*}} substitution must be a whole level (clients/{{principal.clientId}}/#, not client-{{principal.clientId}})"
        );
    }
    let mut rest = f;
    while let Some(at) = rest.find("{principal.") {
        let after = &rest[at + "{principal.".len()..];
        let end = after.find('}').context("an unclosed {principal.")?;
        let name = &after[..end];
        if !(name == "clientId"
            || name == "username"
            || name
                .strip_prefix("attributes.")
                .is_some_and(|a| !a.is_empty()))
        {
            bail!(
                "{{principal.{name}}} is not one of {{principal.clientId}}, {{principal.username}}, {{principal.attributes.NAME}}"
            );
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

/// Whether the topic name `topic` matches the filter `filter`.
pub(crate) fn matches(filter: &str, topic: &str) -> bool {
    // Wildcards at the first level do not match `$` topics.
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether every topic `requested` can match is matched by `allowed`.
fn covers(allowed: &str, requested: &str) -> bool {
    if requested.is_empty() {
        return false;
    }
    let mut a = allowed.split('/');
    let mut r = requested.split('/');
    loop {
        match (a.next(), r.next()) {
            (Some("#"), _) => {
                // `#` also matches its parent level, which `r` may or may not
                // name: either way covered.
                return true;
            }
            (Some("+"), Some(x)) if x != "#" => {}
            (Some(x), Some(y)) if x == y && x != "+" && x != "#" => {}
            (None, None) => return true,
            // `a/#` covers `a`: handled above only when `#` comes next.
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata:
  name: my-authz-policies
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      - principals:
          clientIds: ["temperature-sensor"]
          attributes:
            - city: seattle
              organization: contoso
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["/telemetry/{principal.clientId}", "/telemetry/{principal.attributes.organization}"]
          - method: Subscribe
            topics: ["/commands/{principal.attributes.organization}", "clients/{principal.clientId}/#"]
        stateStoreResources:
          - method: Read
            keyType: Pattern
            keys: ["myreadkey", "mynumerickeysuffix[0-9]", "{principal.clientId}"]
          - method: ReadWrite
            keyType: Binary
            keys: ["AAE="]
userAttributes:
  alice: { city: seattle, organization: contoso }
"#;

    #[test]
    fn the_resource_as_it_is() {
        let p = Policy::parse(YAML, false).expect("parses");
        let sensor = Who {
            client_id: "temperature-sensor",
            username: None,
            attributes: &[],
        };
        assert!(p.may_connect(&sensor));
        assert!(p.may_publish(&sensor, "/telemetry/temperature-sensor"));
        assert!(!p.may_publish(&sensor, "/telemetry/other"));
        assert!(
            !p.may_publish(&sensor, "/telemetry/contoso"),
            "no attribute"
        );
        assert!(p.may_subscribe(&sensor, "clients/temperature-sensor/#"));
        assert!(p.may_subscribe(&sensor, "clients/temperature-sensor/+/x"));
        assert!(!p.may_subscribe(&sensor, "clients/+/#"));
        assert!(!p.may_subscribe(&sensor, "#"));
        let attrs = p.attributes_of(Some("alice"));
        let alice = Who {
            client_id: "dev1",
            username: Some("alice"),
            attributes: &attrs,
        };
        assert!(p.may_connect(&alice));
        assert!(p.may_publish(&alice, "/telemetry/contoso"));
        assert!(p.may_subscribe(&alice, "/commands/contoso"));
        let stranger = Who {
            client_id: "x",
            username: Some("bob"),
            attributes: &[],
        };
        assert!(!p.may_connect(&stranger));
        assert!(!p.may_publish(&stranger, "/telemetry/x"));
        let rules = p.store_rules();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].grants[1].keys, [KeySpec::Binary(vec![0, 1])]);
    }

    /// The example file the book shows parses, and says what it says.
    #[test]
    fn the_example_file() {
        let p = Policy::parse(include_str!("../../../examples/authorization.yaml"), false)
            .expect("examples/authorization.yaml parses");
        let attrs = p.attributes_of(Some("sensor-1"));
        let sensor = Who {
            client_id: "s1",
            username: Some("sensor-1"),
            attributes: &attrs,
        };
        assert!(p.may_connect(&sensor));
        assert!(p.may_publish(
            &sensor,
            "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"
        ));
        assert!(p.may_subscribe(&sensor, "clients/s1/#"));
        let store = statestore_guest::authz::Authorizer::new(&p.store_rules()).expect("rules");
        let principal = statestore_guest::authz::Principal {
            client_id: Some("s1"),
            username: Some("sensor-1"),
            attributes: statestore_guest::authz::Attributes::Owned(&attrs),
        };
        let read = store.grants(&principal, statestore_guest::authz::Need::Read);
        assert!(
            read.allows(b"sensors/s1/t") && read.allows(b"contoso/x") && read.allows(b"config")
        );
        assert!(!read.allows(b"sensors/s2/t"));
    }

    #[test]
    fn toml_and_rules_alone() {
        let p = Policy::parse(
            r#"
[[rules]]
principals = { usernames = ["u"] }
brokerResources = [{ method = "Connect", clientIds = ["{principal.username}-1"] }]
"#,
            true,
        )
        .expect("parses");
        let who = |id| Who {
            client_id: id,
            username: Some("u"),
            attributes: &[],
        };
        assert!(p.may_connect(&who("u-1")));
        assert!(!p.may_connect(&who("u-2")));
    }

    #[test]
    fn wildcards_in_values_grant_nothing() {
        let p = Policy::parse(
            "rules:\n- principals: {clientIds: ['+', 'a']}\n  brokerResources:\n  - method: Subscribe\n    topics: ['clients/{principal.clientId}/#']\n",
            false,
        )
        .expect("parses");
        let plus = Who {
            client_id: "+",
            username: None,
            attributes: &[],
        };
        assert!(!p.may_subscribe(&plus, "clients/+/#"));
        assert!(!p.may_subscribe(&plus, "clients/b/#"));
    }

    #[test]
    fn filters() {
        assert!(matches("a/+/c", "a/b/c") && !matches("a/+/c", "a/b/d"));
        assert!(matches("a/#", "a") && matches("a/#", "a/b/c"));
        assert!(!matches("#", "$SYS/x") && !matches("+/x", "$SYS/x"));
        assert!(covers("a/#", "a/+/c") && covers("a/+", "a/b") && !covers("a/+", "a/#"));
        assert!(covers("#", "#") && !covers("a/b", "a/+") && !covers("a", "a/b"));
        assert!(check_filter("a/#/b").is_err() && check_filter("a+/b").is_err());
        assert!(check_filter("{principal.nobody}").is_err());
        assert!(check_filter("client-{principal.clientId}/#").is_err());
        assert!(check_filter("clients/{principal.clientId}/#").is_ok());
    }

    #[test]
    fn errors_say_where() {
        let e = |text: &str| format!("{:#}", Policy::parse(text, false).expect_err("refused"));
        assert!(e("rules:\n- principals: {}\n").contains("rule 1: its principals name no one"));
        assert!(e("rules:\n- principals: {clientIds: [a]}\n  stateStoreResources:\n  - {method: Read, keyType: Binary, keys: ['***']}\n").contains("not base64"));
        assert!(e("rules:\n- principals: {clientIds: [a]}\n  stateStoreResources:\n  - {method: Read, keyType: Pattern, keys: ['[']}\n").contains("pattern"));
        assert!(
            e("rules:\n- principals: {clientIds: [a]}\n  brokerResources:\n  - {method: Delete}\n")
                .contains("Delete")
        );
        assert!(e("nothing: 1\n").contains("no rules"));
    }

    #[test]
    fn certificate_attributes_by_common_name_or_subject() {
        let p = Policy::parse(
            "rules: []\ncertificateAttributes:\n  smart-fan: { building: \"17\" }\n  \"CN = smart-fan, O = Contoso\": { organization: contoso }\n",
            false,
        )
        .expect("parse");
        let mut got = p.attributes_for(None, Some("smart-fan"), Some("CN=smart-fan, O=Contoso"));
        got.sort();
        assert_eq!(
            got,
            vec![
                ("building".to_string(), "17".to_string()),
                ("organization".to_string(), "contoso".to_string())
            ]
        );
        assert!(
            p.attributes_for(None, Some("other"), Some("CN=other"))
                .is_empty()
        );
        assert_eq!(subject_key(" CN = a ,O= b"), "CN=a,O=b");
    }
}
