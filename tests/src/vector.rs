//! The golden vector format: a runtime-neutral record of inputs (with their
//! `now`) and the exact outputs they must produce. See `tests/vectors/README.md`.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};
use statestore::{
    Config, InboundMessage, KeyMatch, OutboundMessage, Output, Persist, PublishKind, ScanPage,
};
use statestore_guest::types::{AuthRule, KeyGrant, KeyMethod, KeySpec, Principals, Quota, Via};

/// One input.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // test data
pub enum Input {
    /// An inbound MQTT message.
    Publish(InboundMessage),
    /// A client disconnected.
    Disconnect(String),
    /// A client disconnected from a replica (in a life): WIT
    /// `disconnected-via`.
    DisconnectVia(String, Via),
    /// A replica started a new life: WIT `replica-started`.
    ReplicaStarted(Via),
    /// The timer fired.
    Timeout,
    /// Snapshot the store and carry on with a new instance restored from it.
    Restore,
}

/// One input, when it happened, and what must come out.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Wall-clock ms passed with the input.
    pub now: u64,
    /// The input.
    pub input: Input,
    /// Every output, in order.
    pub outputs: Vec<Output>,
    /// `next-deadline` after the step.
    pub next_deadline: Option<u64>,
}

/// A whole vector file.
#[derive(Debug, Clone, PartialEq)]
pub struct Vector {
    /// File stem.
    pub name: String,
    /// What it shows (spec section).
    pub description: String,
    /// Store config.
    pub config: Config,
    /// The steps.
    pub steps: Vec<Step>,
}

/// Bytes: a JSON string when they are UTF-8, else `{"hex": "..."}`.
pub fn bytes_to_json(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({ "hex": hex(b) }),
    }
}

/// Bytes that are binary by nature (correlation data): always `{"hex": "..."}`.
pub fn hex_to_json(b: &[u8]) -> Value {
    json!({ "hex": hex(b) })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads bytes written by [`bytes_to_json`].
pub fn bytes_from_json(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Object(o) => {
            let h = o
                .get("hex")
                .and_then(Value::as_str)
                .context("bytes object needs \"hex\"")?;
            if h.len() % 2 != 0 {
                bail!("odd hex length");
            }
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).context("bad hex"))
                .collect()
        }
        _ => bail!("bytes must be a string or {{\"hex\": ...}}"),
    }
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> Value) -> Value {
    v.map_or(Value::Null, f)
}

fn props_to_json<N: AsRef<str>, V: AsRef<str>>(p: &[(N, V)]) -> Value {
    Value::Array(
        p.iter()
            .map(|(n, v)| json!([n.as_ref(), v.as_ref()]))
            .collect(),
    )
}

fn message_to_json(m: &InboundMessage) -> Value {
    let mut v = json!({
        "topic": m.topic,
        "payload": bytes_to_json(&m.payload),
        "qos": m.qos,
        "response_topic": m.response_topic,
        "correlation_data": opt(m.correlation_data.as_deref(), hex_to_json),
        "message_expiry_interval": m.message_expiry_interval,
        "content_type": m.content_type,
        "payload_format_indicator": m.payload_format_indicator,
        "user_properties": props_to_json(&m.user_properties),
        "client_id": m.client_id,
        "received_at": m.received_at,
    });
    // Only when set: older vectors stay as they were.
    if let Some(u) = &m.username {
        v["username"] = json!(u);
    }
    if !m.attributes.is_empty() {
        v["attributes"] = props_to_json(&m.attributes);
    }
    if let Some(via) = m.via {
        v["via"] = via_to_json(via);
    }
    v
}

fn via_to_json(v: Via) -> Value {
    json!({ "replica": v.replica, "started": v.started })
}

fn via_from_json(v: &Value) -> Result<Via> {
    let o = obj(v)?;
    Ok(Via {
        replica: field(o, "replica")?
            .as_u64()
            .context("via.replica must be a u64")?,
        started: field(o, "started")?
            .as_u64()
            .context("via.started must be a u64")?,
    })
}

fn rules_to_json(rules: &[AuthRule]) -> Value {
    rules
        .iter()
        .map(|r| {
            json!({
                "principals": {
                    "client_ids": r.principals.client_ids,
                    "usernames": r.principals.usernames,
                    "attributes": r.principals.attributes.iter().map(|a| props_to_json(a)).collect::<Vec<_>>(),
                },
                "grants": r.grants.iter().map(|g| json!({
                    "method": match g.method {
                        KeyMethod::Read => "read",
                        KeyMethod::Write => "write",
                        KeyMethod::ReadWrite => "read_write",
                    },
                    "keys": g.keys.iter().map(|k| match k {
                        KeySpec::Pattern(p) => json!({ "pattern": p }),
                        KeySpec::Text(t) => json!({ "text": t }),
                        KeySpec::Binary(b) => json!({ "binary": hex_to_json(b) }),
                    }).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

fn pairs_from_json(v: &Value, what: &str) -> Result<Vec<(String, String)>> {
    v.as_array()
        .with_context(|| format!("{what} must be an array"))?
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([Value::String(n), Value::String(v)]) => Ok((n.clone(), v.clone())),
            _ => bail!("{what}: each is [name, value]"),
        })
        .collect()
}

fn strings(v: Option<&Value>, what: &str) -> Result<Vec<String>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => v
            .as_array()
            .with_context(|| format!("{what} must be an array"))?
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .with_context(|| format!("{what}: strings"))
            })
            .collect(),
    }
}

fn rules_from_json(v: &Value) -> Result<Vec<AuthRule>> {
    v.as_array()
        .context("authorization must be an array of rules")?
        .iter()
        .map(|r| {
            let r = obj(r)?;
            let p = obj(field(r, "principals")?)?;
            let principals = Principals {
                client_ids: strings(p.get("client_ids"), "client_ids")?,
                usernames: strings(p.get("usernames"), "usernames")?,
                attributes: match p.get("attributes") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(a) => a
                        .as_array()
                        .context("attributes must be an array of sets")?
                        .iter()
                        .map(|set| pairs_from_json(set, "attributes"))
                        .collect::<Result<_>>()?,
                },
            };
            let grants = field(r, "grants")?
                .as_array()
                .context("grants must be an array")?
                .iter()
                .map(|g| {
                    let g = obj(g)?;
                    let method = match str_field(g, "method")?.as_str() {
                        "read" => KeyMethod::Read,
                        "write" => KeyMethod::Write,
                        "read_write" => KeyMethod::ReadWrite,
                        other => bail!("unknown method {other:?}"),
                    };
                    let keys = field(g, "keys")?
                        .as_array()
                        .context("keys must be an array")?
                        .iter()
                        .map(|k| {
                            let k = obj(k)?;
                            match (k.get("pattern"), k.get("text"), k.get("binary")) {
                                (Some(Value::String(p)), None, None) => {
                                    Ok(KeySpec::Pattern(p.clone()))
                                }
                                (None, Some(Value::String(t)), None) => {
                                    Ok(KeySpec::Text(t.clone()))
                                }
                                (None, None, Some(b)) => Ok(KeySpec::Binary(bytes_from_json(b)?)),
                                _ => bail!(
                                    "a key is {{\"pattern\"}}, {{\"text\"}} or {{\"binary\"}}"
                                ),
                            }
                        })
                        .collect::<Result<_>>()?;
                    Ok(KeyGrant { method, keys })
                })
                .collect::<Result<_>>()?;
            Ok(AuthRule { principals, grants })
        })
        .collect()
}

fn outbound_to_json(m: &OutboundMessage) -> Value {
    json!({
        "kind": match m.kind { PublishKind::Response => "response", PublishKind::Notification => "notification" },
        "topic": m.topic,
        "payload": bytes_to_json(&m.payload),
        "qos": m.qos,
        "retain": m.retain,
        "correlation_data": opt(m.correlation_data.as_deref(), hex_to_json),
        "message_expiry_interval": m.message_expiry_interval,
        "content_type": m.content_type,
        "payload_format_indicator": m.payload_format_indicator,
        "response_topic": m.response_topic,
        "user_properties": props_to_json(&m.user_properties),
        "target_client": m.target_client,
    })
}

/// An output as JSON.
pub fn output_to_json(o: &Output) -> Value {
    match o {
        Output::Publish(m) => json!({ "publish": outbound_to_json(m) }),
        Output::Journal(r) => json!({ "journal": { "hex": hex(r) } }),
        Output::Violation { client_id, reason } => {
            json!({ "violation": { "client_id": client_id, "reason": reason } })
        }
        Output::More(n) => json!({ "more": n }),
    }
}

impl Vector {
    /// The JSON form.
    pub fn to_json(&self) -> Value {
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| {
                let input = match &s.input {
                    Input::Publish(m) => json!({ "publish": message_to_json(m) }),
                    Input::Disconnect(c) => json!({ "disconnect": c }),
                    Input::DisconnectVia(c, via) => json!({
                        "disconnect_via": { "client_id": c, "via": via_to_json(*via) }
                    }),
                    Input::ReplicaStarted(via) => json!({ "replica_started": via_to_json(*via) }),
                    Input::Timeout => json!("timeout"),
                    Input::Restore => json!("restore"),
                };
                json!({
                    "now": s.now,
                    "input": input,
                    "outputs": s.outputs.iter().map(output_to_json).collect::<Vec<_>>(),
                    "next_deadline": s.next_deadline,
                })
            })
            .collect();
        let mut config = json!({
            "node_id": self.config.node_id,
            "server_client_id": self.config.server_client_id,
            "persist": match self.config.persist {
                Persist::None => "none",
                Persist::All => "all",
                Persist::Flagged => "flagged",
                Persist::Custom => "custom",
            },
        });
        if !self.config.persist_keys.is_empty() {
            config["persist_keys"] = self
                .config
                .persist_keys
                .iter()
                .map(|m| match m {
                    KeyMatch::Pattern(p) => json!({ "pattern": p }),
                    KeyMatch::Exact(k) => json!({ "exact": bytes_to_json(k) }),
                })
                .collect();
        }
        if self.config.sdk_response_topics {
            config["sdk_response_topics"] = json!(true);
        }
        if let Some(rules) = &self.config.authorization {
            config["authorization"] = rules_to_json(rules);
        }
        if self.config.scan_page != ScanPage::default() {
            config["scan_page"] = json!({
                "max_keys": self.config.scan_page.max_keys,
                "max_bytes": self.config.scan_page.max_bytes,
            });
        }
        let q = self.config.quota;
        if q != Quota::default() {
            config["quota"] = json!({
                "max_keys": q.max_keys,
                "max_bytes": q.max_bytes,
                "max_key_bytes": q.max_key_bytes,
                "max_value_bytes": q.max_value_bytes,
            });
        }
        json!({
            "format": 1,
            "name": self.name,
            "description": self.description,
            "config": config,
            "steps": steps,
        })
    }

    /// Pretty JSON text, one trailing newline.
    pub fn to_text(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.to_json()).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Reads the JSON form.
    pub fn from_json(v: &Value) -> Result<Vector> {
        let o = obj(v)?;
        if o.get("format").and_then(Value::as_u64) != Some(1) {
            bail!("unknown vector format (expected \"format\": 1)");
        }
        let config = obj(field(o, "config")?)?;
        let steps = field(o, "steps")?
            .as_array()
            .context("steps must be an array")?
            .iter()
            .enumerate()
            .map(|(i, s)| step_from_json(s).with_context(|| format!("step {i}")))
            .collect::<Result<_>>()?;
        Ok(Vector {
            name: str_field(o, "name")?,
            description: str_field(o, "description")?,
            config: Config {
                node_id: str_field(config, "node_id")?,
                server_client_id: opt_str(config, "server_client_id")?,
                persist: match config.get("persist").and_then(Value::as_str) {
                    None | Some("none") => Persist::None,
                    Some("all") => Persist::All,
                    Some("flagged") => Persist::Flagged,
                    Some("custom") => Persist::Custom,
                    Some(other) => bail!("unknown persist mode {other:?}"),
                },
                // Not part of the format: no output depends on the seed
                // (`Kind::WasmTyped` replays every vector with another one).
                hash_seed: 0,
                quota: match config.get("quota") {
                    None | Some(Value::Null) => Quota::default(),
                    Some(q) => quota_from_json(q).context("quota")?,
                },
                persist_keys: match config.get("persist_keys") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(v) => v
                        .as_array()
                        .context("persist_keys must be an array")?
                        .iter()
                        .map(key_match_from_json)
                        .collect::<Result<_>>()
                        .context("persist_keys")?,
                },
                authorization: match config.get("authorization") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(rules_from_json(v).context("authorization")?),
                },
                sdk_response_topics: match config.get("sdk_response_topics") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => bail!("sdk_response_topics must be a boolean, not {other}"),
                },
                scan_page: match config.get("scan_page") {
                    None | Some(Value::Null) => ScanPage::default(),
                    Some(v) => {
                        let o = obj(v).context("scan_page")?;
                        ScanPage {
                            max_keys: small(o, "max_keys")?.context("scan_page.max_keys")?,
                            max_bytes: small(o, "max_bytes")?.context("scan_page.max_bytes")?,
                        }
                    }
                },
            },
            steps,
        })
    }
}

fn obj(v: &Value) -> Result<&Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| anyhow!("expected an object, got {v}"))
}

fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Result<&'a Value> {
    o.get(name).ok_or_else(|| anyhow!("missing field {name:?}"))
}

fn str_field(o: &Map<String, Value>, name: &str) -> Result<String> {
    field(o, name)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{name} must be a string"))
}

fn opt_str(o: &Map<String, Value>, name: &str) -> Result<Option<String>> {
    match field(o, name)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => bail!("{name} must be a string or null"),
    }
}

fn opt_u64(o: &Map<String, Value>, name: &str) -> Result<Option<u64>> {
    match field(o, name)? {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| anyhow!("{name} must be an integer or null")),
    }
}

/// `{"pattern": "<glob>"}` or `{"exact": <bytes>}`.
fn key_match_from_json(v: &Value) -> Result<KeyMatch> {
    let o = obj(v)?;
    match (o.get("pattern"), o.get("exact")) {
        (Some(Value::String(p)), None) => Ok(KeyMatch::Pattern(p.clone())),
        (None, Some(k)) => Ok(KeyMatch::Exact(bytes_from_json(k)?)),
        _ => bail!("a key match is {{\"pattern\": \"...\"}} or {{\"exact\": bytes}}, not {v}"),
    }
}

/// A `quota` object: each limit an integer, or null / absent for none.
fn quota_from_json(v: &Value) -> Result<Quota> {
    let o = obj(v)?;
    let limit = |name: &str| -> Result<Option<u64>> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| anyhow!("{name} must be an integer or null")),
        }
    };
    let small = |name: &str| -> Result<Option<u32>> {
        limit(name)?
            .map(|v| u32::try_from(v).map_err(|_| anyhow!("{name} out of range")))
            .transpose()
    };
    Ok(Quota {
        max_keys: limit("max_keys")?,
        max_bytes: limit("max_bytes")?,
        max_key_bytes: small("max_key_bytes")?,
        max_value_bytes: small("max_value_bytes")?,
    })
}

fn small<T: TryFrom<u64>>(o: &Map<String, Value>, name: &str) -> Result<Option<T>> {
    opt_u64(o, name)?
        .map(|v| T::try_from(v).map_err(|_| anyhow!("{name} out of range")))
        .transpose()
}

fn opt_bytes(o: &Map<String, Value>, name: &str) -> Result<Option<Vec<u8>>> {
    match field(o, name)? {
        Value::Null => Ok(None),
        v => bytes_from_json(v).map(Some),
    }
}

fn props(o: &Map<String, Value>) -> Result<Vec<(String, String)>> {
    field(o, "user_properties")?
        .as_array()
        .context("user_properties must be an array")?
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([Value::String(n), Value::String(v)]) => Ok((n.clone(), v.clone())),
            _ => bail!("a user property is [name, value]"),
        })
        .collect()
}

fn message_from_json(v: &Value) -> Result<InboundMessage> {
    let o = obj(v)?;
    Ok(InboundMessage {
        topic: str_field(o, "topic")?,
        payload: bytes_from_json(field(o, "payload")?)?,
        qos: small(o, "qos")?.context("qos is required")?,
        response_topic: opt_str(o, "response_topic")?,
        correlation_data: opt_bytes(o, "correlation_data")?,
        message_expiry_interval: small(o, "message_expiry_interval")?,
        content_type: opt_str(o, "content_type")?,
        payload_format_indicator: small(o, "payload_format_indicator")?,
        user_properties: props(o)?,
        client_id: opt_str(o, "client_id")?,
        received_at: opt_u64(o, "received_at")?,
        username: match o.get("username") {
            None | Some(Value::Null) => None,
            Some(Value::String(u)) => Some(u.clone()),
            Some(other) => bail!("username must be a string, not {other}"),
        },
        attributes: match o.get("attributes") {
            None | Some(Value::Null) => Vec::new(),
            Some(a) => pairs_from_json(a, "attributes")?,
        },
        via: match o.get("via") {
            None | Some(Value::Null) => None,
            Some(v) => Some(via_from_json(v)?),
        },
    })
}

fn outbound_from_json(v: &Value) -> Result<OutboundMessage> {
    let o = obj(v)?;
    Ok(OutboundMessage {
        kind: match str_field(o, "kind")?.as_str() {
            "response" => PublishKind::Response,
            "notification" => PublishKind::Notification,
            k => bail!("unknown kind {k:?}"),
        },
        topic: str_field(o, "topic")?.into(),
        payload: bytes_from_json(field(o, "payload")?)?.into(),
        qos: small(o, "qos")?.context("qos is required")?,
        retain: field(o, "retain")?
            .as_bool()
            .context("retain must be a boolean")?,
        correlation_data: opt_bytes(o, "correlation_data")?.map(Into::into),
        message_expiry_interval: small(o, "message_expiry_interval")?,
        content_type: opt_str(o, "content_type")?.map(Into::into),
        payload_format_indicator: small(o, "payload_format_indicator")?,
        response_topic: opt_str(o, "response_topic")?.map(Into::into),
        user_properties: props(o)?
            .into_iter()
            .map(|(n, v)| (n.into(), v.into()))
            .collect(),
        target_client: opt_str(o, "target_client")?.map(Into::into),
    })
}

fn output_from_json(v: &Value) -> Result<Output> {
    let o = obj(v)?;
    if let Some(p) = o.get("publish") {
        return Ok(Output::Publish(outbound_from_json(p)?));
    }
    if let Some(j) = o.get("journal") {
        return Ok(Output::Journal(bytes_from_json(j)?));
    }
    if let Some(viol) = o.get("violation") {
        let viol = obj(viol)?;
        return Ok(Output::Violation {
            client_id: opt_str(viol, "client_id")?,
            reason: str_field(viol, "reason")?,
        });
    }
    if let Some(n) = o.get("more") {
        let n = n.as_u64().and_then(|n| u32::try_from(n).ok());
        return Ok(Output::More(n.context("`more` is not a u32")?));
    }
    bail!("unknown output {v}")
}

fn step_from_json(v: &Value) -> Result<Step> {
    let o = obj(v)?;
    let input = match field(o, "input")? {
        Value::String(s) if s == "timeout" => Input::Timeout,
        Value::String(s) if s == "restore" => Input::Restore,
        Value::Object(i) if i.contains_key("publish") => {
            Input::Publish(message_from_json(field(i, "publish")?)?)
        }
        Value::Object(i) if i.contains_key("disconnect") => {
            Input::Disconnect(str_field(i, "disconnect")?)
        }
        Value::Object(i) if i.contains_key("disconnect_via") => {
            let d = obj(field(i, "disconnect_via")?)?;
            Input::DisconnectVia(str_field(d, "client_id")?, via_from_json(field(d, "via")?)?)
        }
        Value::Object(i) if i.contains_key("replica_started") => {
            Input::ReplicaStarted(via_from_json(field(i, "replica_started")?)?)
        }
        other => bail!("unknown input {other}"),
    };
    Ok(Step {
        now: field(o, "now")?
            .as_u64()
            .context("now must be an integer")?,
        input,
        outputs: field(o, "outputs")?
            .as_array()
            .context("outputs must be an array")?
            .iter()
            .map(output_from_json)
            .collect::<Result<_>>()?,
        next_deadline: opt_u64(o, "next_deadline")?,
    })
}
