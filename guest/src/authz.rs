//! Per-key authorization: the state store resources of the broker's
//! authorization policies, checked in the guest so that every host
//! enforces the same rules.
//!
//! A rule names principals (client ids, user names, attribute sets) and
//! grants them `Read` (GET, KEYNOTIFY, SCAN), `Write` (SET, DEL, VDEL) or
//! `ReadWrite` on keys: glob patterns, exact text, or exact binary keys.
//! Pattern and text keys may hold `{principal.clientId}`,
//! `{principal.username}` and `{principal.attributes.NAME}`, replaced by the
//! requester's own (a value put into a pattern is escaped, so it matches
//! itself only; a principal without that value gets nothing from the key).
//! Rules only allow: a request no rule allows is refused, and SCAN lists only
//! the keys its requester may read.
//!
//! A leaf module but for `pattern` and `types`: it knows nothing of the
//! wire or of commands.

use crate::pattern::Glob;
use crate::types::{AuthRule, KeyMethod, KeySpec, Principals};

/// A requester's attributes: as the batch encodes them (`props`, already
/// checked to be UTF-8), or owned pairs.
#[derive(Debug, Clone, Copy)]
pub enum Attributes<'a> {
    /// The `props` encoding: u32 count, then (str name, str value) pairs.
    Encoded(&'a [u8]),
    /// Pairs.
    Owned(&'a [(String, String)]),
}

impl Default for Attributes<'_> {
    fn default() -> Self {
        Attributes::Owned(&[])
    }
}

impl<'a> Attributes<'a> {
    /// The value of the first attribute called `name`.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Every (name, value), in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let (encoded, owned) = match *self {
            Attributes::Encoded(b) => (Some(EncodedPairs::new(b)), None),
            Attributes::Owned(v) => (None, Some(v.iter().map(|(n, v)| (n.as_str(), v.as_str())))),
        };
        encoded
            .into_iter()
            .flatten()
            .chain(owned.into_iter().flatten())
    }
}

/// The pairs of a `props` encoding the wire decoder has checked.
struct EncodedPairs<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> EncodedPairs<'a> {
    fn new(b: &'a [u8]) -> Self {
        let (left, rest) = match b.split_first_chunk::<4>() {
            Some((n, rest)) => (u32::from_le_bytes(*n), rest),
            None => (0, b),
        };
        EncodedPairs { rest, left }
    }

    fn text(&mut self) -> Option<&'a str> {
        let (n, rest) = self.rest.split_first_chunk::<4>()?;
        let n = u32::from_le_bytes(*n) as usize;
        if rest.len() < n {
            return None;
        }
        let (s, rest) = rest.split_at(n);
        self.rest = rest;
        core::str::from_utf8(s).ok()
    }
}

impl<'a> Iterator for EncodedPairs<'a> {
    type Item = (&'a str, &'a str);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some((self.text()?, self.text()?))
    }
}

/// Who asks: what the host vouches for (the client id, from the broker or
/// else the identity the request claims), its user name and attributes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Principal<'a> {
    /// The requester's client id.
    pub client_id: Option<&'a str>,
    /// Its authenticated user name.
    pub username: Option<&'a str>,
    /// Its attributes.
    pub attributes: Attributes<'a>,
}

/// A piece of a key with substitutions.
#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    ClientId,
    Username,
    Attribute(String),
}

/// A key with `{principal.*}` substitutions.
#[derive(Debug, Clone)]
struct Template(Vec<Part>);

impl Template {
    /// `None` when `s` substitutes nothing.
    fn parse(s: &str) -> Result<Option<Template>, String> {
        const OPEN: &str = "{principal.";
        if !s.contains(OPEN) {
            return Ok(None);
        }
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(at) = rest.find(OPEN) {
            if at > 0 {
                parts.push(Part::Literal(rest[..at].to_string()));
            }
            let after = &rest[at + OPEN.len()..];
            let end = after
                .find('}')
                .ok_or_else(|| format!("{s:?}: an unclosed {{principal."))?;
            let name = &after[..end];
            parts.push(match name {
                "clientId" => Part::ClientId,
                "username" => Part::Username,
                _ => match name.strip_prefix("attributes.") {
                    Some(a) if !a.is_empty() => Part::Attribute(a.to_string()),
                    _ => {
                        return Err(format!(
                            "{s:?}: {{principal.{name}}} is not one of {{principal.clientId}}, \
                             {{principal.username}}, {{principal.attributes.NAME}}"
                        ));
                    }
                },
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_string()));
        }
        Ok(Some(Template(parts)))
    }

    /// The key for `p`, its values escaped by `escape`; `None` if `p` lacks
    /// one of them.
    fn render(&self, p: &Principal<'_>, escape: fn(&str) -> String) -> Option<String> {
        let mut out = String::new();
        for part in &self.0 {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::ClientId => out.push_str(&escape(p.client_id?)),
                Part::Username => out.push_str(&escape(p.username?)),
                Part::Attribute(name) => out.push_str(&escape(p.attributes.get(name)?)),
            }
        }
        Some(out)
    }
}

/// A key spec, compiled.
#[derive(Debug, Clone)]
enum Spec {
    Glob(Glob),
    GlobTemplate(Template),
    Exact(Vec<u8>),
    TextTemplate(Template),
}

#[derive(Debug, Clone)]
struct Rule {
    principals: Principals,
    read: Vec<Spec>,
    write: Vec<Spec>,
}

/// Rules, compiled once (config load and reload).
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    rules: Vec<Rule>,
}

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// GET, KEYNOTIFY, SCAN.
    Read,
    /// SET, DEL, VDEL.
    Write,
}

impl Authorizer {
    /// Compiles `rules`, or says what is wrong with one.
    pub fn new(rules: &[AuthRule]) -> Result<Authorizer, String> {
        let mut out = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            let at = |e: String| format!("authorization rule {}: {e}", i + 1);
            let mut read = Vec::new();
            let mut write = Vec::new();
            for grant in &rule.grants {
                for key in &grant.keys {
                    let spec = compile(key).map_err(at)?;
                    if matches!(grant.method, KeyMethod::Read | KeyMethod::ReadWrite) {
                        read.push(spec.clone());
                    }
                    if matches!(grant.method, KeyMethod::Write | KeyMethod::ReadWrite) {
                        write.push(spec);
                    }
                }
            }
            out.push(Rule {
                principals: rule.principals.clone(),
                read,
                write,
            });
        }
        Ok(Authorizer { rules: out })
    }

    /// The keys `p` may use for `need`, resolved for it.
    pub fn grants<'r>(&'r self, p: &Principal<'_>, need: Need) -> Grants<'r> {
        let mut items = Vec::new();
        for rule in self.rules.iter().filter(|r| is_for(&r.principals, p)) {
            let specs = match need {
                Need::Read => &rule.read,
                Need::Write => &rule.write,
            };
            for spec in specs {
                items.push(match spec {
                    Spec::Glob(g) => Resolved::Glob(g),
                    Spec::Exact(k) => Resolved::Exact(k),
                    Spec::GlobTemplate(t) => {
                        match t.render(p, Glob::escape).map(|s| Glob::new(&s)) {
                            Some(Ok(g)) => Resolved::OwnedGlob(g),
                            _ => continue,
                        }
                    }
                    Spec::TextTemplate(t) => match t.render(p, str::to_string) {
                        Some(k) => Resolved::OwnedExact(k.into_bytes()),
                        None => continue,
                    },
                });
            }
        }
        Grants(items)
    }
}

fn compile(key: &KeySpec) -> Result<Spec, String> {
    Ok(match key {
        KeySpec::Binary(k) => Spec::Exact(k.clone()),
        KeySpec::Text(t) => match Template::parse(t)? {
            None => Spec::Exact(t.as_bytes().to_vec()),
            Some(template) => Spec::TextTemplate(template),
        },
        KeySpec::Pattern(p) => match Template::parse(p)? {
            None => Spec::Glob(Glob::new(p).map_err(|e| format!("pattern {p:?}: {e}"))?),
            Some(template) => {
                // Checked with a placeholder for each value.
                let sample: String = template
                    .0
                    .iter()
                    .map(|p| match p {
                        Part::Literal(s) => s.as_str(),
                        _ => "x",
                    })
                    .collect();
                Glob::new(&sample).map_err(|e| format!("pattern {p:?}: {e}"))?;
                Spec::GlobTemplate(template)
            }
        },
    })
}

/// Whether `p` is one of `principals`.
fn is_for(principals: &Principals, p: &Principal<'_>) -> bool {
    p.client_id
        .is_some_and(|c| principals.client_ids.iter().any(|x| x == c))
        || p.username
            .is_some_and(|u| principals.usernames.iter().any(|x| x == u))
        || principals.attributes.iter().any(|set| {
            !set.is_empty()
                && set
                    .iter()
                    .all(|(name, value)| p.attributes.get(name) == Some(value.as_str()))
        })
}

#[derive(Debug)]
enum Resolved<'r> {
    Glob(&'r Glob),
    OwnedGlob(Glob),
    Exact(&'r [u8]),
    OwnedExact(Vec<u8>),
}

/// The keys one principal may use for one need.
#[derive(Debug)]
pub struct Grants<'r>(Vec<Resolved<'r>>);

impl Grants<'_> {
    /// Whether `key` is one of them.
    pub fn allows(&self, key: &[u8]) -> bool {
        self.0.iter().any(|r| match r {
            Resolved::Glob(g) => g.matches(key),
            Resolved::OwnedGlob(g) => g.matches(key),
            Resolved::Exact(k) => *k == key,
            Resolved::OwnedExact(k) => k == key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::KeyGrant;

    fn rule(principals: Principals, grants: &[(KeyMethod, KeySpec)]) -> AuthRule {
        AuthRule {
            principals,
            grants: grants
                .iter()
                .map(|(method, key)| KeyGrant {
                    method: *method,
                    keys: vec![key.clone()],
                })
                .collect(),
        }
    }

    #[test]
    fn principals_grants_and_substitutions() {
        let sensors = Principals {
            client_ids: vec!["s1".into()],
            usernames: vec!["alice".into()],
            attributes: vec![vec![
                ("city".into(), "seattle".into()),
                ("org".into(), "contoso".into()),
            ]],
        };
        let a = Authorizer::new(&[rule(
            sensors,
            &[
                (KeyMethod::Read, KeySpec::Pattern("public/*".into())),
                (
                    KeyMethod::ReadWrite,
                    KeySpec::Pattern("own/{principal.clientId}/*".into()),
                ),
                (
                    KeyMethod::Write,
                    KeySpec::Text("org-{principal.attributes.org}".into()),
                ),
                (KeyMethod::ReadWrite, KeySpec::Binary(vec![0, 0xff])),
            ],
        )])
        .expect("valid");
        let attrs = [
            ("org".to_string(), "contoso".to_string()),
            ("city".to_string(), "seattle".to_string()),
        ];
        let by_attrs = Principal {
            client_id: Some("dev*"),
            username: None,
            attributes: Attributes::Owned(&attrs),
        };
        let read = a.grants(&by_attrs, Need::Read);
        let write = a.grants(&by_attrs, Need::Write);
        assert!(read.allows(b"public/x") && !write.allows(b"public/x"));
        // The client id's `*` is literal.
        assert!(read.allows(b"own/dev*/k") && write.allows(b"own/dev*/k"));
        assert!(!read.allows(b"own/device/k"));
        assert!(write.allows(b"org-contoso") && !read.allows(b"org-contoso"));
        assert!(read.allows(&[0, 0xff]) && write.allows(&[0, 0xff]));
        // One attribute of the set is not enough.
        let half = [("org".to_string(), "contoso".to_string())];
        let p = Principal {
            client_id: Some("other"),
            username: None,
            attributes: Attributes::Owned(&half),
        };
        assert!(!a.grants(&p, Need::Read).allows(b"public/x"));
        // By user name; without attributes the org key is nobody's.
        let alice = Principal {
            client_id: Some("c9"),
            username: Some("alice"),
            attributes: Attributes::default(),
        };
        assert!(a.grants(&alice, Need::Read).allows(b"public/x"));
        assert!(!a.grants(&alice, Need::Write).allows(b"org-"));
        assert!(
            !a.grants(&alice, Need::Write)
                .allows(b"org-{principal.attributes.org}")
        );
        // Nobody else gets anything.
        let stranger = Principal {
            client_id: Some("x"),
            ..Principal::default()
        };
        assert!(!a.grants(&stranger, Need::Read).allows(b"public/x"));
    }

    #[test]
    fn encoded_attributes_read_like_owned_ones() {
        let mut b = 2u32.to_le_bytes().to_vec();
        for s in ["a", "1", "b", "two"] {
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        let e = Attributes::Encoded(&b);
        assert_eq!(e.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "two")]);
        assert_eq!(e.get("b"), Some("two"));
        assert_eq!(e.get("c"), None);
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        let bad = |key: KeySpec| {
            Authorizer::new(&[rule(Principals::default(), &[(KeyMethod::Read, key)])])
                .expect_err("refused")
        };
        assert!(bad(KeySpec::Pattern("[".into())).contains("rule 1: pattern"));
        assert!(bad(KeySpec::Text("{principal.name}".into())).contains("is not one of"));
        assert!(bad(KeySpec::Pattern("{principal.clientId".into())).contains("unclosed"));
        assert!(bad(KeySpec::Pattern("{principal.clientId}[".into())).contains("pattern"));
    }
}
