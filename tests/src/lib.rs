//! Test support: golden conformance vectors ([`vector`]), a simulated-time
//! harness ([`Sim`]) that records them, and a replayer that runs them against
//! the native state machine and the wasm component.
//!
//! Conformance tests (`tests/conformance.rs`) drive a [`Sim`], assert exact
//! outputs by hand, and then check that their recorded trace equals the
//! checked-in vector in `vectors/` (or rewrite it with `STATESTORE_BLESS=1`).
//! `tests/vectors.rs` replays every vector file against both runtimes.

pub mod broker;
pub mod links;
pub mod process;
pub mod raw_mqtt;
pub mod scenarios;
pub mod sdk;
pub mod vector;

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use statestore::{
    Backend, Config, InboundMessage, NativeStore, OutboundMessage, Output, PublishKind,
};
use statestore_guest::rpc::{CONTENT_TYPE, REQUEST_TOPIC};
pub use statestore_guest::types::Via;
pub use vector::{Input, Step, Vector};

/// Simulated wall clock at the start of every scenario (2023-11-14T22:13:20Z).
pub const T0: u64 = 1_700_000_000_000;
/// The server's own client id in test configs.
pub const SERVER_ID: &str = "statestore";

/// The Rust SDK's response topic for client `c`.
pub fn response_topic(c: &str) -> String {
    format!(
        "clients/{c}/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
    )
}

/// The config every scenario uses.
pub fn test_config() -> Config {
    Config {
        node_id: "StateStore".into(),
        server_client_id: Some(SERVER_ID.into()),
        persist: statestore::Persist::None,
        hash_seed: 0,
        ..Config::default()
    }
}

/// The config of the journal tests: every key persisted, no server client id.
pub fn durable_config() -> Config {
    Config {
        node_id: "StateStore".into(),
        server_client_id: None,
        persist: statestore::Persist::All,
        hash_seed: 0,
        ..Config::default()
    }
}

/// A build of the guest that claims an output list version no host reads
/// (its `next-formats` feature): hosts must refuse to load it.
pub fn next_formats_wasm() -> Vec<u8> {
    std::fs::read(env!("STATESTORE_NEXT_FORMATS_WASM"))
        .expect("the next-formats component was built")
}

/// Which build of the state machine to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The guest crate compiled natively.
    Native,
    /// The `.wasm` component in wasmtime, through the flat `handle-wire`
    /// (what the hosts use).
    Wasm,
    /// The `.wasm` component through the typed `handle`.
    WasmTyped,
}

/// `config` with another hash seed: the typed wasm runs use it, so that the
/// vectors also prove that no output depends on the seed.
fn other_seed(config: &Config) -> Config {
    Config {
        hash_seed: 0x9e37_79b9_7f4a_7c15,
        ..config.clone()
    }
}

/// The wasm runtime, compiled once per test process.
pub fn wasm_runtime() -> &'static statestore::Runtime {
    static RT: OnceLock<statestore::Runtime> = OnceLock::new();
    RT.get_or_init(|| statestore::Runtime::new().expect("the built component loads"))
}

/// A new, empty store of this kind.
pub fn new_backend(kind: Kind, config: &Config) -> Result<Box<dyn Backend>> {
    Ok(match kind {
        Kind::Native => Box::new(NativeStore::new(config.clone())?),
        Kind::Wasm => Box::new(wasm_runtime().instantiate(config)?),
        Kind::WasmTyped => {
            let mut store = wasm_runtime().instantiate(&other_seed(config))?;
            store.use_typed_calls(true);
            Box::new(store)
        }
    })
}

/// A store of this kind restored from a snapshot.
pub fn restore_backend(kind: Kind, config: &Config, snapshot: &[u8]) -> Result<Box<dyn Backend>> {
    Ok(match kind {
        Kind::Native => Box::new(NativeStore::restore(config.clone(), snapshot)?),
        Kind::Wasm => Box::new(wasm_runtime().restore(config, snapshot)?),
        Kind::WasmTyped => {
            let mut store = wasm_runtime().restore(&other_seed(config), snapshot)?;
            store.use_typed_calls(true);
            Box::new(store)
        }
    })
}

/// Applies one input and returns its outputs and the next deadline.
fn apply(
    backend: &mut Box<dyn Backend>,
    kind: Kind,
    config: &Config,
    now: u64,
    input: &Input,
) -> Result<(Vec<Output>, Option<u64>)> {
    // The wire door for `Wasm`, the typed one for `WasmTyped`.
    let outputs = match input {
        Input::Publish(m) => backend.handle_messages(std::slice::from_ref(m), now)?,
        Input::Disconnect(c) => backend.client_disconnected(c, now)?,
        Input::DisconnectVia(c, via) => {
            backend.handle(&[statestore::Input::DisconnectedVia(c, *via)], now)?
        }
        Input::ReplicaStarted(via) => {
            backend.handle(&[statestore::Input::ReplicaStarted(*via)], now)?
        }
        Input::Timeout => backend.timeout(now)?,
        Input::Restore => {
            let snapshot = backend.snapshot()?;
            *backend = restore_backend(kind, config, &snapshot)?;
            Vec::new()
        }
    };
    Ok((outputs, backend.next_deadline()?))
}

/// Runs a vector against a runtime; an error describes the first difference.
pub fn replay(v: &Vector, kind: Kind) -> Result<()> {
    let mut backend = new_backend(kind, &v.config)?;
    for (i, step) in v.steps.iter().enumerate() {
        let (outputs, deadline) = apply(&mut backend, kind, &v.config, step.now, &step.input)?;
        if outputs != step.outputs {
            bail!(
                "{} step {i} ({kind:?}): outputs differ\n want: {}\n  got: {}",
                v.name,
                serde_json::Value::Array(step.outputs.iter().map(vector::output_to_json).collect()),
                serde_json::Value::Array(outputs.iter().map(vector::output_to_json).collect()),
            );
        }
        if deadline != step.next_deadline {
            bail!(
                "{} step {i} ({kind:?}): next deadline {deadline:?}, want {:?}",
                v.name,
                step.next_deadline
            );
        }
    }
    Ok(())
}

/// Where vector files live.
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

/// Every vector file, sorted by name.
pub fn load_vectors() -> Result<Vec<Vector>> {
    let mut paths: Vec<_> = std::fs::read_dir(vectors_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)?;
            let json: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
            Vector::from_json(&json).with_context(|| format!("{}", p.display()))
        })
        .collect()
}

/// A scenario in simulated time that records itself as a vector.
pub struct Sim {
    name: String,
    description: String,
    kind: Kind,
    config: Config,
    backend: Box<dyn Backend>,
    /// The current simulated time.
    pub now: u64,
    steps: Vec<Step>,
    next_correlation: u128,
}

impl Sim {
    /// A native scenario named after its vector file, starting at [`T0`].
    pub fn new(name: &str, description: &str) -> Sim {
        Sim::with(Kind::Native, name, description)
    }

    /// A scenario on a chosen runtime.
    pub fn with(kind: Kind, name: &str, description: &str) -> Sim {
        Sim::with_config(kind, name, description, test_config())
    }

    /// A scenario with its own config.
    pub fn with_config(kind: Kind, name: &str, description: &str, config: Config) -> Sim {
        Sim {
            name: name.into(),
            description: description.into(),
            kind,
            backend: new_backend(kind, &config).expect("store starts"),
            config,
            now: T0,
            steps: Vec::new(),
            next_correlation: 1,
        }
    }

    fn run(&mut self, input: Input) -> Vec<Output> {
        let (outputs, next_deadline) =
            apply(&mut self.backend, self.kind, &self.config, self.now, &input)
                .expect("backend call succeeds");
        self.steps.push(Step {
            now: self.now,
            input,
            outputs: outputs.clone(),
            next_deadline,
        });
        outputs
    }

    /// A request from client `c1` with every property an SDK sends: a fresh
    /// 16-byte correlation id, expiry 10 s, `__srcId`, `__protVer`, `__ts` = now.
    pub fn request(&mut self, parts: &[&[u8]]) -> InboundMessage {
        self.request_from("c1", parts)
    }

    /// Like [`Sim::request`], from client `client`.
    pub fn request_from(&mut self, client: &str, parts: &[&[u8]]) -> InboundMessage {
        let corr = self.next_correlation.to_be_bytes().to_vec();
        self.next_correlation += 1;
        InboundMessage {
            topic: REQUEST_TOPIC.into(),
            payload: resp(parts),
            qos: 1,
            response_topic: Some(response_topic(client)),
            correlation_data: Some(corr),
            message_expiry_interval: Some(10),
            content_type: Some(CONTENT_TYPE.into()),
            payload_format_indicator: Some(0),
            user_properties: vec![
                ("__ts".into(), format!("{:015}:00000:{client}", self.now)),
                ("__protVer".into(), "1.0".into()),
                ("__srcId".into(), client.into()),
            ],
            client_id: None,
            received_at: None,
            username: None,
            attributes: Vec::new(),
            via: None,
        }
    }

    /// Sends a message now and returns its outputs.
    pub fn send(&mut self, message: &InboundMessage) -> Vec<Output> {
        self.run(Input::Publish(message.clone()))
    }

    /// Sends a request from `c1` and returns its outputs.
    pub fn call(&mut self, parts: &[&[u8]]) -> (InboundMessage, Vec<Output>) {
        let m = self.request(parts);
        let out = self.send(&m);
        (m, out)
    }

    /// Moves time forward by `ms`, firing the timer at every deadline on the
    /// way (as a host's timer would); returns the outputs of those timeouts.
    pub fn advance(&mut self, ms: u64) -> Vec<Output> {
        let target = self.now + ms;
        let mut outputs = Vec::new();
        while let Some(at) = self.backend.next_deadline().expect("deadline") {
            if at > target {
                break;
            }
            self.now = self.now.max(at);
            outputs.extend(self.run(Input::Timeout));
        }
        self.now = target;
        outputs
    }

    /// When the store asks to be called next.
    pub fn next_deadline(&mut self) -> Option<u64> {
        self.backend.next_deadline().expect("deadline")
    }

    /// Client `c` disconnected.
    pub fn disconnect(&mut self, c: &str) -> Vec<Output> {
        self.run(Input::Disconnect(c.into()))
    }

    /// Client `c` disconnected from the replica (and life) `via` names.
    pub fn disconnect_via(&mut self, c: &str, via: Via) -> Vec<Output> {
        self.run(Input::DisconnectVia(c.into(), via))
    }

    /// The replica `via` names started this life.
    pub fn replica_started(&mut self, via: Via) -> Vec<Output> {
        self.run(Input::ReplicaStarted(via))
    }

    /// Snapshot, then continue on a new instance restored from it.
    pub fn restore(&mut self) {
        let out = self.run(Input::Restore);
        assert!(out.is_empty());
    }

    /// Checks the recorded trace against `vectors/<name>.json`, or writes it
    /// when `STATESTORE_BLESS=1`.
    pub fn finish(self) {
        let v = Vector {
            name: self.name.clone(),
            description: self.description,
            config: self.config,
            steps: self.steps,
        };
        let path = vectors_dir().join(format!("{}.json", self.name));
        if std::env::var_os("STATESTORE_BLESS").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(vectors_dir()).expect("mkdir vectors");
            std::fs::write(&path, v.to_text()).expect("write vector");
            return;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!(
                "{} is missing: run the tests once with STATESTORE_BLESS=1",
                path.display()
            )
        });
        let json = serde_json::from_str(&text).expect("vector is JSON");
        let stored = Vector::from_json(&json).expect("vector parses");
        assert!(
            stored == v,
            "{} no longer matches this scenario; if the change is intended, re-record with STATESTORE_BLESS=1 and review the diff",
            path.display()
        );
    }
}

/// A RESP3 array of bulk strings (a request).
pub fn resp(parts: &[&[u8]]) -> Vec<u8> {
    statestore_guest::resp3::request(parts)
}

/// Sets (or with `None` removes) a user property.
pub fn set_prop(m: &mut InboundMessage, name: &str, value: Option<&str>) {
    m.user_properties.retain(|(n, _)| n != name);
    if let Some(v) = value {
        m.user_properties.push((name.into(), v.into()));
    }
}

/// The journal records among outputs.
pub fn records(outputs: &[Output]) -> Vec<Vec<u8>> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Journal(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The publishes among outputs.
pub fn publishes(outputs: &[Output]) -> Vec<&OutboundMessage> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Publish(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// The notifications among outputs.
pub fn notifications(outputs: &[Output]) -> Vec<&OutboundMessage> {
    publishes(outputs)
        .into_iter()
        .filter(|m| m.kind == PublishKind::Notification)
        .collect()
}

/// The one reply among outputs, which must come last.
pub fn reply(outputs: &[Output]) -> &OutboundMessage {
    let replies: Vec<_> = publishes(outputs)
        .into_iter()
        .filter(|m| m.kind == PublishKind::Response)
        .collect();
    assert_eq!(
        replies.len(),
        1,
        "exactly one reply expected in {outputs:#?}"
    );
    match outputs.last() {
        Some(Output::Publish(m)) if m.kind == PublishKind::Response => m,
        _ => panic!("the reply must be the last output: {outputs:#?}"),
    }
}

/// Asserts a 200 reply to `req` with exactly this payload and `__ts`, and
/// every property of spec §4.1 / §17 #36.
pub fn assert_reply(outputs: &[Output], req: &InboundMessage, payload: &[u8], ts: Option<&str>) {
    let r = reply(outputs);
    assert_eq!(
        String::from_utf8_lossy(&r.payload),
        String::from_utf8_lossy(payload),
        "reply payload"
    );
    assert_eq!(r.payload, payload);
    assert_eq!(Some(&*r.topic), req.response_topic.as_deref());
    assert_eq!(r.qos, 1);
    assert!(!r.retain);
    assert_eq!(
        r.correlation_data.as_deref(),
        req.correlation_data.as_deref()
    );
    assert_eq!(r.content_type.as_deref(), Some(CONTENT_TYPE));
    assert_eq!(r.payload_format_indicator, Some(0));
    assert_eq!(r.response_topic, None);
    assert_eq!(r.target_client, None);
    let expiry = r
        .message_expiry_interval
        .expect("reply has a message expiry");
    assert!((1..=req.message_expiry_interval.unwrap_or(u32::MAX)).contains(&expiry));
    let mut want: Vec<statestore_guest::types::Property> = vec![
        ("__stat".into(), "200".into()),
        ("__protVer".into(), "1.0".into()),
    ];
    if let Some(ts) = ts {
        want.push(("__ts".into(), ts.to_string().into()));
    }
    want.push(("__srcId".into(), SERVER_ID.into()));
    want.push(("$high_priority".into(), "".into()));
    assert_eq!(r.user_properties, want, "reply user properties");
}

/// Asserts a notification's topic, payload and properties (spec §11.3, §11.4).
pub fn assert_notification(
    m: &OutboundMessage,
    client: &str,
    key: &[u8],
    payload: &[u8],
    ts: &str,
) {
    assert_eq!(m.kind, PublishKind::Notification);
    assert_eq!(m.topic, statestore_guest::notify::topic(client, key));
    assert_eq!(
        String::from_utf8_lossy(&m.payload),
        String::from_utf8_lossy(payload)
    );
    assert_eq!(m.payload, payload);
    assert_eq!(m.qos, 1);
    assert!(!m.retain);
    assert_eq!(m.correlation_data, None);
    assert_eq!(m.message_expiry_interval, None);
    assert_eq!(m.response_topic, None);
    assert_eq!(m.content_type.as_deref(), Some(CONTENT_TYPE));
    assert_eq!(m.payload_format_indicator, Some(0));
    assert_eq!(m.target_client.as_deref(), Some(client));
    assert_eq!(
        m.user_properties,
        vec![
            ("__ts".into(), ts.to_string().into()),
            ("__protVer".into(), "1.0".into()),
            ("__srcId".into(), SERVER_ID.into()),
        ] as Vec<statestore_guest::types::Property>
    );
}

/// `__ts` of an output message.
pub fn ts_of(m: &OutboundMessage) -> Option<&str> {
    m.user_property("__ts")
}

/// The server version text `T:c:StateStore`.
pub fn version(wall: u64, counter: u64) -> String {
    format!("{wall:015}:{counter:05}:StateStore")
}

/// The guest built with its `fault-injection` feature (`guest/src/fault.rs`):
/// `SET __fault/loop`, `__fault/grow` and `__fault/trap` make it fail.
pub const FAULTY_WASM: &str = env!("STATESTORE_FAULTY_WASM");

/// `GET path` from an HTTP server on loopback `port` (the metrics
/// endpoint): its status and body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status");
    (status, body.to_string())
}

/// A users file (`--users-file`, mosquitto's `password_file`) of one user,
/// alice, password `secret`, as `mosquitto_passwd` 2.0 writes it (`$7$`).
pub const ALICE_SECRET: &str = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==\n";
