//! Retained messages of the embedded broker: rmqtt's in-memory retain tree,
//! bounded in count and bytes, and kept across restarts in a file of the
//! data directory when there is one.
//!
//! rmqtt routes retained messages (delivery on subscribe, retain handling,
//! retain-as-published) but ships no storage that is enabled: its default
//! one drops them and points at a plugin. [`Retained`] is that storage.
//!
//! Bounds: a new retained topic past `max_count` or `max_bytes` (the
//! clients' retained messages: the broker's own `$SYS` ones do not count)
//! is refused before it is accepted, with PUBACK "quota exceeded" (0x97),
//! in the publish check ([`Retained::has_room`]); replacing or clearing a retained
//! message is always allowed.
//!
//! The file (`retained.json`, written at most once a second when something
//! changed, to a new file renamed into place) holds each message's topic,
//! payload, QoS, properties and the wall-clock time it expires; a file that
//! does not parse is set aside (`retained.json.bad`) with a warning, never a
//! reason not to start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use async_trait::async_trait;
use base64::Engine;
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::PublishProperties;
use rmqtt::retain::{DefaultRetainStorage, RetainStorage};
use rmqtt::types::{CodecPublish, From, Publish, Retain, TopicFilter, TopicName};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// The retained messages and their bounds.
pub struct Retained {
    inner: DefaultRetainStorage,
    max_count: usize,
    max_bytes: usize,
    /// The bytes of each retained topic.
    sizes: Mutex<HashMap<TopicName, usize>>,
    /// Where they are kept, if anywhere.
    file: Option<PathBuf>,
    dirty: AtomicBool,
}

/// What a retained message weighs: its topic, payload and properties.
fn weight(topic: &str, p: &Publish) -> usize {
    topic.len() + crate::transport::embedded::queue_bytes::weight(p)
}

impl Retained {
    /// Empty, or as `dir`'s file left them.
    pub fn open(dir: Option<&Path>, max_count: usize, max_bytes: usize) -> Retained {
        Retained {
            inner: DefaultRetainStorage::new(),
            max_count,
            max_bytes,
            sizes: Mutex::new(HashMap::new()),
            file: dir.map(|d| d.join("retained.json")),
            dirty: AtomicBool::new(false),
        }
    }

    /// Whether a retained publish on `topic` fits: a new topic must fit
    /// the bounds; a replacement or a clear always does.
    pub fn has_room(&self, topic: &str, p: &Publish) -> bool {
        let sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
        let old = sizes.get(topic).copied();
        if p.payload.is_empty() {
            return true;
        }
        let total: usize = sizes.values().sum();
        let after = total - old.unwrap_or(0) + weight(topic, p);
        (old.is_some() || sizes.len() < self.max_count) && after <= self.max_bytes
    }

    /// Loads the file, if there is one (the messages of a previous run).
    pub async fn load(&self, from: From) -> Result<usize> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        let text = match std::fs::read(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
        };
        let saved: Vec<Saved> = match serde_json::from_slice(&text) {
            Ok(s) => s,
            Err(e) => {
                let bad = file.with_extension("json.bad");
                warn!(file = %file.display(), error = %e, set_aside = %bad.display(), "the retained messages file does not parse: starting without them");
                std::fs::rename(file, &bad)
                    .with_context(|| format!("cannot rename {}", file.display()))?;
                return Ok(0);
            }
        };
        let now = unix_ms();
        let mut n = 0;
        for s in saved {
            let left = match s.expires_at {
                Some(at) if at <= now => continue,
                Some(at) => Some(Duration::from_millis(at - now)),
                None => None,
            };
            let Some(publish) = s.publish() else { continue };
            let topic = TopicName::from(s.topic.as_str());
            let retain = Retain {
                msg_id: None,
                from: from.clone(),
                publish,
            };
            self.store(&topic, retain, left).await?;
            n += 1;
        }
        self.dirty.store(false, Ordering::Relaxed);
        Ok(n)
    }

    /// How many topics hold a retained message.
    pub fn count(&self) -> usize {
        self.sizes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keeps `retain` on `topic` (an empty payload clears it) for `left`
    /// (none or zero: until replaced; the broker gives a message without an
    /// expiry interval zero).
    async fn store(&self, topic: &TopicName, retain: Retain, left: Option<Duration>) -> Result<()> {
        let left = left.filter(|d| !d.is_zero());
        // The broker's own (`$SYS`) are few and not the clients' to count.
        if !topic.starts_with('$') {
            let mut sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
            if retain.publish.payload.is_empty() {
                sizes.remove(topic);
            } else {
                sizes.insert(topic.clone(), weight(topic, &retain.publish));
            }
        }
        self.inner.set_with_timeout(topic, retain, left).await?;
        self.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets expired messages, and writes the file if anything changed.
    pub async fn tick(&self) {
        let removed = self.inner.remove_expired_messages().await;
        if removed > 0 {
            let live = self.inner.get_all_paginated(0, usize::MAX).await;
            if let Ok((items, _)) = live {
                let mut sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
                sizes.retain(|t, _| items.iter().any(|(topic, _, _)| topic == t));
            }
            self.dirty.store(true, Ordering::Relaxed);
        }
        if self.file.is_some()
            && self.dirty.swap(false, Ordering::Relaxed)
            && let Err(e) = self.save().await
        {
            warn!(error = %e, "cannot save the retained messages (will try again)");
            self.dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Writes every live message to the file (a new file, renamed).
    async fn save(&self) -> Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let (items, _) = self.inner.get_all_paginated(0, usize::MAX).await?;
        let file = file.clone();
        // Encoded, written and synced on a blocking thread: up to
        // --max-retained-size of them would hold up the broker's thread.
        tokio::task::spawn_blocking(move || {
            let now = unix_ms();
            let saved: Vec<Saved> = items
                .into_iter()
                // `$SYS` is published anew by each run.
                .filter(|(topic, _, _)| !topic.starts_with('$'))
                .map(|(topic, r, left)| {
                    Saved::of(&topic, &r.publish, left.map(|l| now + l.as_millis() as u64))
                })
                .collect();
            let tmp = file.with_extension("json.tmp");
            let write = || -> Result<()> {
                use std::io::Write;
                let text = serde_json::to_vec(&saved)?;
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&text)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &file)?;
                Ok(())
            };
            write().with_context(|| format!("cannot write {}", file.display()))
        })
        .await
        .context("the retained messages' writer stopped")?
    }
}

/// [`Retained`] as rmqtt's retain storage.
pub struct Storage(pub Arc<Retained>);

#[async_trait]
impl RetainStorage for Storage {
    fn enable(&self) -> bool {
        true
    }

    async fn set(
        &self,
        topic: &TopicName,
        retain: Retain,
        expiry_interval: Option<Duration>,
    ) -> rmqtt::Result<()> {
        self.0.store(topic, retain, expiry_interval).await
    }

    async fn get(&self, topic_filter: &TopicFilter) -> rmqtt::Result<Vec<(TopicName, Retain)>> {
        self.0.inner.get_message(topic_filter).await
    }

    async fn count(&self) -> isize {
        self.0.count() as isize
    }

    async fn max(&self) -> isize {
        self.0.max_count as isize
    }
}

/// One retained message in the file.
#[derive(Serialize, Deserialize)]
struct Saved {
    topic: String,
    /// Base64.
    payload: String,
    qos: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    response_topic: Option<String>,
    /// Base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    correlation_data: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    user_properties: Vec<(String, String)>,
    #[serde(default)]
    utf8: bool,
    /// Unix time in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<u64>,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl Saved {
    fn of(topic: &str, p: &Publish, expires_at: Option<u64>) -> Saved {
        let props = p.properties.clone().unwrap_or_default();
        Saved {
            topic: topic.to_string(),
            payload: b64().encode(&p.payload),
            qos: p.qos as u8,
            content_type: props.content_type.map(|c| c.to_string()),
            response_topic: props.response_topic.map(|t| t.to_string()),
            correlation_data: props.correlation_data.map(|c| b64().encode(c)),
            user_properties: props
                .user_properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            utf8: props.is_utf8_payload,
            expires_at,
        }
    }

    fn publish(&self) -> Option<Publish> {
        let qos = match self.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            2 => QoS::ExactlyOnce,
            _ => return None,
        };
        let correlation_data = match &self.correlation_data {
            Some(c) => Some(b64().decode(c).ok()?.into()),
            None => None,
        };
        let properties = PublishProperties {
            topic_alias: None,
            correlation_data,
            message_expiry_interval: None,
            content_type: self.content_type.as_deref().map(Into::into),
            user_properties: self
                .user_properties
                .iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
            is_utf8_payload: self.utf8,
            response_topic: self.response_topic.as_deref().map(Into::into),
            subscription_ids: Vec::new(),
        };
        let codec = CodecPublish {
            dup: false,
            retain: true,
            qos,
            topic: self.topic.as_str().into(),
            packet_id: None,
            payload: b64().decode(&self.payload).ok()?.into(),
            properties: Some(properties),
        };
        Some(Publish::from(codec).create_time(rmqtt::utils::timestamp_millis()))
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(topic: &str, payload: &[u8]) -> Publish {
        Saved {
            topic: topic.into(),
            payload: b64().encode(payload),
            qos: 1,
            content_type: Some("text/plain".into()),
            response_topic: None,
            correlation_data: Some(b64().encode(b"c")),
            user_properties: vec![("k".into(), "v".into())],
            utf8: true,
            expires_at: None,
        }
        .publish()
        .expect("a valid message")
    }

    fn from() -> From {
        From::from_system(rmqtt::types::Id::new(
            0,
            0,
            None,
            None,
            "$test".into(),
            None,
        ))
    }

    async fn set(r: &Retained, topic: &str, payload: &[u8]) {
        let retain = Retain {
            msg_id: None,
            from: from(),
            publish: publish(topic, payload),
        };
        r.store(&TopicName::from(topic), retain, None)
            .await
            .expect("set");
    }

    #[tokio::test]
    async fn bounds_refuse_new_topics_but_never_a_replacement_or_a_clear() {
        let r = Retained::open(None, 2, 1 << 20);
        set(&r, "a", b"1").await;
        set(&r, "b", b"2").await;
        assert!(!r.has_room("c", &publish("c", b"3")), "a third topic");
        assert!(r.has_room("a", &publish("a", b"again")), "a replacement");
        assert!(r.has_room("c", &publish("c", b"")), "a clear");
        set(&r, "a", b"").await;
        assert_eq!(r.count(), 1);
        assert!(r.has_room("c", &publish("c", b"3")), "room again");

        let small = Retained::open(None, 100, 600);
        assert!(small.has_room("x", &publish("x", &[0; 100])));
        assert!(
            !small.has_room("x", &publish("x", &[0; 1000])),
            "too many bytes"
        );
    }

    #[tokio::test]
    async fn messages_survive_a_restart_in_the_data_directory() {
        let dir = std::env::temp_dir().join(format!("retained-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let r = Retained::open(Some(&dir), 10, 1 << 20);
        set(&r, "sensors/1", b"21.5").await;
        set(&r, "sensors/2", b"19").await;
        set(&r, "sensors/2", b"").await;
        r.tick().await;

        let again = Retained::open(Some(&dir), 10, 1 << 20);
        assert_eq!(again.load(from()).await.expect("load"), 1);
        let got = again
            .inner
            .get_message(&TopicFilter::from("sensors/#"))
            .await
            .expect("get");
        assert_eq!(got.len(), 1);
        let (topic, retain) = &got[0];
        assert_eq!(topic.as_ref() as &str, "sensors/1");
        assert_eq!(&retain.publish.payload[..], b"21.5");
        let props = retain.publish.properties.clone().expect("properties");
        assert_eq!(props.content_type.as_deref(), Some("text/plain"));
        assert_eq!(props.correlation_data.as_deref(), Some(&b"c"[..]));
        assert_eq!(props.user_properties.len(), 1);

        // A file that does not parse is set aside, not fatal.
        std::fs::write(dir.join("retained.json"), b"{not json").expect("write");
        let third = Retained::open(Some(&dir), 10, 1 << 20);
        assert_eq!(third.load(from()).await.expect("load"), 0);
        assert!(dir.join("retained.json.bad").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
