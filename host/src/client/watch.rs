//! `watch`: notifications of exact keys and of the keys glob patterns
//! match, through reconnections.

use std::io::Write;
use std::time::Duration;

use anyhow::{Result, bail};
use rumqttc::v5::mqttbytes::v5::Publish;

use super::*;

/// What `watch` watches: exact keys, and the keys that match glob
/// patterns (found with SCAN at the start and every `rescan`).
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Keys registered as they are.
    pub keys: Vec<Vec<u8>>,
    /// Glob patterns (SCAN's); the keys they match are registered.
    pub patterns: Vec<Vec<u8>>,
    /// How often the patterns are scanned again for new keys.
    pub rescan: Duration,
}

/// `watch`: registers for `spec`'s keys, then prints one line per
/// notification (`<key> SET <value> <version>` or `<key> DELETE <version>`,
/// escaped; or one JSON object per line) until `count` lines if given. A key
/// that a pattern matches for the first time at a rescan is registered and
/// printed as a SET of its value then. Once registered it says so on stderr
/// (`watching N keys through <broker>`). When the connection drops it says
/// so on stderr and connects again (to the next broker of the list),
/// registering again, until it is stopped.
pub async fn watch(
    c: &mut Client,
    spec: &WatchSpec,
    enc: Encoding,
    output: Output,
    count: Option<u64>,
    out: &mut dyn Write,
) -> Result<u8> {
    let mut watched: std::collections::BTreeSet<Vec<u8>> = spec.keys.iter().cloned().collect();
    c.subscribe_notifications().await?;
    register(c, watched.iter()).await?;
    for key in scan_patterns(c, &spec.patterns).await? {
        if watched.insert(key.clone()) {
            register(c, std::iter::once(&key)).await?;
        }
    }
    out.flush()?;
    eprintln!(
        "statestore: watching {} keys through {}",
        watched.len(),
        c.broker()
    );
    let mut rescan = tokio::time::interval(spec.rescan.max(Duration::from_millis(100)));
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rescan.tick().await;
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let next = tokio::select! {
            n = c.next_notification(None) => n,
            _ = rescan.tick(), if !spec.patterns.is_empty() => {
                match appeared(c, &spec.patterns, &mut watched).await {
                    Ok(new) => {
                        for n in new {
                            out.write_all(&n.line(enc, output))?;
                            seen += 1;
                        }
                        out.flush()?;
                        continue;
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match next {
            Ok(Some(p)) => {
                let Some(n) = Notification::parse(&p) else {
                    continue;
                };
                out.write_all(&n.line(enc, output))?;
                out.flush()?;
                seen += 1;
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("statestore: {e:#}; connecting again (changes until then are not seen)");
                let mut pause = Duration::from_millis(500);
                loop {
                    tokio::time::sleep(pause).await;
                    match reregister(c, &watched).await {
                        Ok(()) => {
                            eprintln!("statestore: watching again through {}", c.broker());
                            break;
                        }
                        Err(e) => {
                            eprintln!("statestore: {e:#}; trying again in {pause:?}");
                            pause = (pause * 2).min(Duration::from_secs(10));
                        }
                    }
                }
            }
        }
    }
    Ok(OK)
}

/// Every key that matches one of `patterns` (every page of each SCAN).
async fn scan_patterns(c: &mut Client, patterns: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    let mut found = Vec::new();
    for pattern in patterns {
        let mut token: Option<Vec<u8>> = None;
        loop {
            let (keys, next) = scan_page(c, pattern, token.as_deref()).await?;
            found.extend(keys);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
    }
    Ok(found)
}

/// The keys `patterns` match now that are not `watched` yet: registered,
/// and returned as SETs of their values (a key deleted meanwhile is
/// registered and not returned).
async fn appeared(
    c: &mut Client,
    patterns: &[Vec<u8>],
    watched: &mut std::collections::BTreeSet<Vec<u8>>,
) -> Result<Vec<Notification>> {
    let mut new = Vec::new();
    for key in scan_patterns(c, patterns).await? {
        if watched.contains(&key) {
            continue;
        }
        register(c, std::iter::once(&key)).await?;
        watched.insert(key.clone());
        let reply = c.request(&[b"GET", &key], &[]).await?;
        if let Resp::Bulk(value) = check(&reply)? {
            new.push(Notification {
                key,
                value: Some(value),
                version: reply.version.unwrap_or_default(),
            });
        }
    }
    Ok(new)
}

/// Connects again and registers for `keys`.
async fn reregister(c: &mut Client, keys: &std::collections::BTreeSet<Vec<u8>>) -> Result<()> {
    c.reconnect().await?;
    c.subscribe_notifications().await?;
    register(c, keys.iter()).await
}

/// Registers for `keys` (KEYNOTIFY); a refusal (the store's bound on one
/// client's registrations, 1,000) is an error naming it.
async fn register<'a>(c: &mut Client, keys: impl Iterator<Item = &'a Vec<u8>>) -> Result<()> {
    for key in keys {
        let reply = c.request(&[b"KEYNOTIFY", key], &[]).await?;
        match check(&reply) {
            Ok(Resp::Ok) => {}
            Ok(other) => bail!("KEYNOTIFY was not accepted: {other:?}"),
            Err(e) => {
                return Err(e.context(format!(
                    "cannot watch {:?} (a client may watch at most 1,000 keys)",
                    String::from_utf8_lossy(key)
                )));
            }
        }
    }
    Ok(())
}

/// A KEYNOTIFY notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The key that changed.
    pub key: Vec<u8>,
    /// Its new value, or `None` when it was deleted (or expired).
    pub value: Option<Vec<u8>>,
    /// The version of the change (`__ts`).
    pub version: String,
}

impl Notification {
    /// The notification a PUBLISH carries, if it is one.
    pub fn parse(p: &Publish) -> Option<Notification> {
        let topic = std::str::from_utf8(&p.topic).ok()?;
        let hex = topic.rsplit('/').next()?;
        let key = Encoding::Hex.decode(hex.as_bytes()).ok()?;
        let version = p
            .properties
            .as_ref()?
            .user_properties
            .iter()
            .find(|(n, _)| n == "__ts")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let statestore_guest::resp3::Decoded::Complete(parts, _) =
            statestore_guest::resp3::decode_request(&p.payload).ok()?
        else {
            return None;
        };
        let value = match parts.get(1).copied() {
            Some(b"SET") => Some(parts.get(3)?.to_vec()),
            Some(b"DELETE") => None,
            _ => return None,
        };
        Some(Notification {
            key,
            value,
            version,
        })
    }

    /// Its line: `<key> SET <value> <version>` or `<key> DELETE <version>`
    /// (escaped), or a JSON object, with the newline.
    pub fn line(&self, enc: Encoding, output: Output) -> Vec<u8> {
        if output == Output::Json {
            let mut o = serde_json::Map::new();
            json_field(&mut o, "key", &self.key, enc);
            let op = if self.value.is_some() {
                "SET"
            } else {
                "DELETE"
            };
            o.insert("op".into(), op.into());
            if let Some(v) = &self.value {
                json_field(&mut o, "value", v, enc);
            }
            o.insert("version".into(), self.version.clone().into());
            let mut line = serde_json::Value::Object(o).to_string().into_bytes();
            line.push(b'\n');
            return line;
        }
        let mut line = escape(&self.key, enc);
        match &self.value {
            Some(v) => {
                line.extend_from_slice(b" SET ");
                line.extend_from_slice(&escape(v, enc));
            }
            None => line.extend_from_slice(b" DELETE"),
        }
        line.push(b' ');
        line.extend_from_slice(self.version.as_bytes());
        line.push(b'\n');
        line
    }
}

/// One line for a notification (text, escaped), if `p` is one.
pub fn notification_line(p: &Publish, enc: Encoding) -> Option<Vec<u8>> {
    Notification::parse(p).map(|n| n.line(enc, Output::Text))
}
