//! `statestore get | set | del | vdel | keys | watch | lock`: a command-line client
//! that speaks the protocol as the Azure IoT Operations SDKs do (the same
//! request topic, response topic, properties, `__ts` and timeouts), for
//! people and scripts.
//!
//! ```text
//!   connect (MQTT5, clean start) ── subscribe to our response topic
//!   request: PUBLISH QoS 1 on the request topic, correlation data (16
//!            bytes), message expiry = the timeout, __ts, __srcId, __protVer
//!   reply:   matched by correlation data; __stat, RESP3 payload, __ts
//! ```
//!
//! Exit codes a script can use: 0 done, 1 not found or not applied, 2 error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use statestore_guest::rpc::{REQUEST_TOPIC, STORE_ID};
use tokio::sync::mpsc;

use crate::mqtt::BrokerUrl;

mod commands;
mod output;
mod watch;

pub use commands::{SetOptions, del, get, keys, lock, set};
pub use output::{Output, escape, json_field};
pub use watch::{Notification, WatchSpec, notification_line, watch};

/// Exit code: done.
pub const OK: u8 = 0;
/// Exit code: not found, or not applied (a condition, a lock held).
pub const NOT_APPLIED: u8 = 1;
/// Exit code: an error (the broker, the store, the arguments).
pub const ERROR: u8 = 2;

/// How keys and values are written on the command line and printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// As they are (bytes).
    #[default]
    Raw,
    /// Hexadecimal.
    Hex,
    /// Standard base64.
    Base64,
}

impl Encoding {
    /// The bytes that `text` stands for.
    pub fn decode(self, text: &[u8]) -> Result<Vec<u8>> {
        if self == Encoding::Raw {
            return Ok(text.to_vec());
        }
        // Hex and base64 may be wrapped over lines.
        let text: Vec<u8> = text
            .iter()
            .copied()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        match self {
            Encoding::Raw => Ok(text),
            Encoding::Hex => {
                if !text.len().is_multiple_of(2) {
                    bail!("odd number of hex digits");
                }
                text.chunks(2)
                    .map(|p| {
                        let s = std::str::from_utf8(p).map_err(|_| anyhow!("not hex"))?;
                        u8::from_str_radix(s, 16).map_err(|_| anyhow!("not hex: {s:?}"))
                    })
                    .collect()
            }
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text)
                .context("not base64"),
        }
    }

    /// `bytes` as this encoding writes them.
    pub fn encode(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            Encoding::Raw => bytes.to_vec(),
            Encoding::Hex => bytes
                .iter()
                .flat_map(|b| format!("{b:02x}").into_bytes())
                .collect(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into_bytes(),
        }
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The brokers (`mqtt://` or `mqtts://`), tried in order: the first that
    /// answers is used, the next ones when it fails (a cluster's replicas).
    pub brokers: Vec<BrokerUrl>,
    /// Our MQTT client id (also `__srcId`, and the lock holder).
    pub client_id: String,
    /// MQTT user name and password.
    pub credentials: Option<(String, String)>,
    /// CA certificate (PEM) for `mqtts://`; the system roots if absent.
    pub ca_file: Option<PathBuf>,
    /// Our client certificate, for a broker that asks for one (`mqtts://`).
    pub client_cert: Option<crate::mqtt::ClientCert>,
    /// How long to wait for the broker and for each reply.
    pub timeout: Duration,
}

/// A reply of the store.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `__stat`.
    pub status: String,
    /// The RESP3 payload.
    pub payload: Bytes,
    /// `__ts`: the version of the change, if any.
    pub version: Option<String>,
    /// `__stMsg`, on an error status.
    pub message: Option<String>,
}

/// A RESP3 reply payload, as far as the store uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`.
    Ok,
    /// `$-1`: no value.
    Nil,
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An integer.
    Int(i64),
    /// `-ERR ...`.
    Error(String),
}

/// Parses a reply payload.
pub fn parse(payload: &[u8]) -> Result<Resp> {
    let line_end = payload
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or_else(|| anyhow!("not a RESP3 reply: {:?}", String::from_utf8_lossy(payload)))?;
    let line = std::str::from_utf8(&payload[1..line_end]).unwrap_or("");
    Ok(match payload.first() {
        Some(b'+') => Resp::Ok,
        Some(b'-') => Resp::Error(line.to_string()),
        Some(b':') => Resp::Int(line.parse().context("a RESP3 integer")?),
        Some(b'$') if line == "-1" => Resp::Nil,
        Some(b'$') => {
            let n: usize = line.parse().context("a RESP3 length")?;
            let start = line_end + 2;
            let value = payload
                .get(start..start + n)
                .ok_or_else(|| anyhow!("a RESP3 bulk string cut short"))?;
            Resp::Bulk(value.to_vec())
        }
        _ => bail!("not a RESP3 reply: {:?}", String::from_utf8_lossy(payload)),
    })
}

/// A connection to the broker, ready to make requests.
pub struct Client {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    acks: mpsc::UnboundedReceiver<()>,
    id: String,
    timeout: Duration,
    response_topic: String,
    next: u64,
    opts: ClientOptions,
    /// Which of `opts.brokers` we are connected to.
    at: usize,
    /// Messages that are not replies (notifications) which arrived while a
    /// request waited for its reply: [`Client::next_notification`] returns
    /// them first, so a `watch` that sends a SCAN misses nothing meanwhile.
    pending: std::collections::VecDeque<Publish>,
}

/// One MQTT connection of a [`Client`].
struct Connection {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    acks: mpsc::UnboundedReceiver<()>,
}

impl Client {
    /// Connects to the first of `opts.brokers` that answers (trying them in
    /// order) and subscribes to our response topic.
    pub async fn connect(opts: &ClientOptions) -> Result<Client> {
        if opts.brokers.is_empty() {
            bail!("no broker to connect to");
        }
        let response_topic = format!(
            "clients/{}/services/statestore/v1/{STORE_ID}/command/invoke/response",
            opts.client_id
        );
        let (at, conn) = Self::connect_from(opts, 0, &response_topic).await?;
        Ok(Client {
            client: conn.client,
            rx: conn.rx,
            acks: conn.acks,
            id: opts.client_id.clone(),
            timeout: opts.timeout,
            response_topic,
            next: 0,
            opts: opts.clone(),
            at,
            pending: std::collections::VecDeque::new(),
        })
    }

    /// The broker we are connected to.
    pub fn broker(&self) -> &BrokerUrl {
        &self.opts.brokers[self.at]
    }

    /// Connects again, to the next broker of the list that answers (the
    /// same one if it is the only one), and subscribes to our response
    /// topic. Registrations (KEYNOTIFY) are the caller's to make again.
    pub async fn reconnect(&mut self) -> Result<()> {
        let _ = self.client.disconnect().await;
        let from = (self.at + 1) % self.opts.brokers.len();
        let (at, conn) = Self::connect_from(&self.opts, from, &self.response_topic).await?;
        self.client = conn.client;
        self.rx = conn.rx;
        self.acks = conn.acks;
        self.at = at;
        Ok(())
    }

    /// Tries every broker once, starting at `from`.
    async fn connect_from(
        opts: &ClientOptions,
        from: usize,
        response_topic: &str,
    ) -> Result<(usize, Connection)> {
        let n = opts.brokers.len();
        let mut failures = Vec::new();
        for i in (0..n).map(|k| (from + k) % n) {
            match Self::connect_one(opts, &opts.brokers[i], response_topic).await {
                Ok(conn) => return Ok((i, conn)),
                Err(e) if n == 1 => return Err(e),
                Err(e) => {
                    tracing::debug!(broker = %opts.brokers[i], error = %format!("{e:#}"), "trying the next broker");
                    failures.push(format!("{e:#}"));
                }
            }
        }
        bail!("no broker answered:\n  {}", failures.join("\n  "))
    }

    /// Connects to `broker` and subscribes to `response_topic`.
    async fn connect_one(
        opts: &ClientOptions,
        broker: &BrokerUrl,
        response_topic: &str,
    ) -> Result<Connection> {
        let mut o = MqttOptions::new(&opts.client_id, &broker.host, broker.port);
        o.set_keep_alive(Duration::from_secs(30))
            .set_clean_start(true)
            .set_max_packet_size(Some(crate::transport::external::MAX_PACKET));
        if let Some((user, password)) = &opts.credentials {
            if !broker.tls && !broker.is_loopback() {
                eprintln!(
                    "warning: the password goes out in clear text to {}:{} (mqtt://): use mqtts:// beyond loopback",
                    broker.host, broker.port
                );
            }
            o.set_credentials(user, password);
        }
        crate::mqtt::connection_options(
            &mut o,
            broker,
            opts.ca_file.as_deref(),
            opts.client_cert.as_ref(),
        )?;
        let (client, mut eventloop) = AsyncClient::new(o, 16);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ack_tx, mut acks) = mpsc::unbounded_channel();
        let (conn_tx, mut connected) = mpsc::unbounded_channel::<Result<(), String>>();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = conn_tx.send(Ok(()));
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ack_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(p).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return,
                    Ok(_) => {}
                    Err(e) => {
                        let _ = conn_tx.send(Err(connect_error(&e)));
                        return;
                    }
                }
            }
        });
        let at = format!("{}:{}", broker.host, broker.port);
        match tokio::time::timeout(opts.timeout, connected.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => bail!("cannot connect to {at}: {e}"),
            Ok(None) | Err(_) => bail!("no answer from {at} within {:?}", opts.timeout),
        }
        client.subscribe(response_topic, QoS::AtLeastOnce).await?;
        tokio::time::timeout(opts.timeout, acks.recv())
            .await
            .map_err(|_| anyhow!("no SUBACK from {at} within {:?}", opts.timeout))?;
        Ok(Connection { client, rx, acks })
    }

    /// Sends a request (`parts` of a RESP3 array, `props` beside the usual
    /// ones) and waits for its reply. A `503` (the store has no leader to
    /// take it: it was not applied) is tried again, on the next broker of
    /// the list if there are several, until the timeout.
    pub async fn request(&mut self, parts: &[&[u8]], props: &[(&str, &str)]) -> Result<Reply> {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(100);
        loop {
            let reply = self.request_once(parts, props).await?;
            if reply.status != "503" || Instant::now() + pause >= deadline {
                return Ok(reply);
            }
            tracing::debug!(broker = %self.broker(), "503: trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            if self.opts.brokers.len() > 1 {
                self.reconnect().await?;
            }
        }
    }

    /// One try of [`Client::request`].
    async fn request_once(&mut self, parts: &[&[u8]], props: &[(&str, &str)]) -> Result<Reply> {
        self.next += 1;
        let mut correlation = [0u8; 16];
        correlation[..8].copy_from_slice(&std::process::id().to_be_bytes().repeat(2));
        correlation[8..].copy_from_slice(&self.next.to_be_bytes());
        let mut user_properties = vec![
            ("__srcId".to_string(), self.id.clone()),
            ("__ts".to_string(), hlc_now(&self.id)),
            ("__protVer".to_string(), "1.0".to_string()),
        ];
        user_properties.extend(props.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        let properties = PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(Bytes::copy_from_slice(&correlation)),
            message_expiry_interval: Some(
                u32::try_from(self.timeout.as_secs().max(1)).unwrap_or(u32::MAX),
            ),
            content_type: Some("application/octet-stream".into()),
            payload_format_indicator: Some(0),
            user_properties,
            ..Default::default()
        };
        self.client
            .publish_with_properties(
                REQUEST_TOPIC,
                QoS::AtLeastOnce,
                false,
                statestore_guest::resp3::request(parts),
                properties,
            )
            .await?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let p = tokio::time::timeout(left, self.rx.recv())
                .await
                .map_err(|_| anyhow!("no reply from the state store within {:?}", self.timeout))?
                .ok_or_else(|| anyhow!("the connection to the broker was lost"))?;
            let props = p.properties.clone().unwrap_or_default();
            if props.correlation_data.as_deref() != Some(&correlation[..]) {
                if !is_reply(&p) {
                    self.pending.push_back(p); // a notification: kept for later
                }
                continue; // or a late reply
            }
            let prop = |name: &str| {
                props
                    .user_properties
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            return Ok(Reply {
                status: prop("__stat").unwrap_or_default(),
                payload: p.payload.clone(),
                version: prop("__ts"),
                message: prop("__stMsg"),
            });
        }
    }

    /// Subscribes to our notification topic (the embedded broker delivers
    /// notifications without it; another broker needs it).
    pub async fn subscribe_notifications(&mut self) -> Result<()> {
        let mut hex = String::new();
        for b in self.id.as_bytes() {
            hex.push_str(&format!("{b:02X}"));
        }
        let filter = format!("clients/statestore/v1/{STORE_ID}/{hex}/command/notify/+");
        self.client.subscribe(filter, QoS::AtLeastOnce).await?;
        tokio::time::timeout(self.timeout, self.acks.recv())
            .await
            .map_err(|_| anyhow!("no SUBACK within {:?}", self.timeout))?;
        Ok(())
    }

    /// The next message that is not a reply, if one comes within `wait`.
    pub async fn next_notification(&mut self, wait: Option<Duration>) -> Result<Option<Publish>> {
        if let Some(p) = self.pending.pop_front() {
            return Ok(Some(p));
        }
        loop {
            let p = match wait {
                Some(w) => match tokio::time::timeout(w, self.rx.recv()).await {
                    Ok(p) => p,
                    Err(_) => return Ok(None),
                },
                None => self.rx.recv().await,
            };
            let p = p.ok_or_else(|| anyhow!("the connection to the broker was lost"))?;
            if is_reply(&p) {
                continue;
            }
            return Ok(Some(p));
        }
    }

    /// Disconnects cleanly.
    pub async fn close(self) {
        let _ = self.client.disconnect().await;
    }
}

/// Whether `p` came on a response topic (a reply, not a notification).
fn is_reply(p: &Publish) -> bool {
    p.topic.ends_with(b"/response")
}

/// Now as an SDK's `__ts`: wall-clock ms, counter 0, our node id.
fn hlc_now(node: &str) -> String {
    format!("{:015}:00000:{node}", crate::store::clock::now_ms())
}

/// A reply that is not a store-level outcome: an error.
fn check(reply: &Reply) -> Result<Resp> {
    if reply.status != "200" {
        bail!(
            "the state store answered {}: {}",
            reply.status,
            reply.message.as_deref().unwrap_or("(no message)")
        );
    }
    match parse(&reply.payload)? {
        Resp::Error(e) => bail!("the state store refused it: {e}"),
        other => Ok(other),
    }
}

/// One page of a SCAN: its keys, and the token of the next page if any.
pub type ScanPage = (Vec<Vec<u8>>, Option<Vec<u8>>);

/// What a failed connection means, in words a user can act on (not the
/// MQTT library's).
pub(crate) fn connect_error(e: &rumqttc::v5::ConnectionError) -> String {
    use rumqttc::v5::ConnectionError as E;
    use rumqttc::v5::StateError;
    use rumqttc::v5::mqttbytes::v5::ConnectReturnCode as Code;
    match e {
        E::ConnectionRefused(Code::BadUserNamePassword) => "the broker refused the user name or password (--username and --password-file, or STATESTORE_USERNAME and STATESTORE_PASSWORD_FILE)".into(),
        E::ConnectionRefused(Code::NotAuthorized) => "the broker refused this client: not authorized (its user, certificate or client id; or another user holds this client id)".into(),
        E::ConnectionRefused(Code::ConnectionRateExceeded) => "the broker refused this address: too many failed logins from it; wait a minute and check the password".into(),
        E::ConnectionRefused(Code::QuotaExceeded) => "the broker refused this client: it holds as many connections or sessions as it may (from this address or in all)".into(),
        E::ConnectionRefused(Code::ClientIdentifierNotValid) => "the broker refused the client id (--client-id: no '/', '+' or '#')".into(),
        E::ConnectionRefused(code) => format!("the broker refused the connection ({code:?})"),
        E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => "nothing listens there (is the store running? --broker or STATESTORE_BROKER)".into(),
        E::MqttState(StateError::Deserialization(_)) | E::NotConnAck(_) => "what answers there does not speak MQTT 5 (the wrong port? a TLS port needs mqtts://)".into(),
        E::MqttState(StateError::Io(io)) if io.kind() == std::io::ErrorKind::UnexpectedEof => "the connection was closed before the broker answered (the wrong port? a TLS port needs mqtts://)".into(),
        other => other.to_string(),
    }
}

/// One page of `SCAN pattern [token]`: its keys and the next page's
/// token (an empty one, which the protocol never sends, is an error).
async fn scan_page(c: &mut Client, pattern: &[u8], token: Option<&[u8]>) -> Result<ScanPage> {
    let mut parts: Vec<&[u8]> = vec![b"SCAN", pattern];
    parts.extend(token);
    let reply = c.request(&parts, &[]).await?;
    if reply.status != "200" || reply.payload.first() == Some(&b'-') {
        check(&reply)?;
    }
    let (keys, next) = parse_scan_page(&reply.payload)?;
    if next.as_ref().is_some_and(Vec::is_empty) {
        bail!("the state store sent an empty SCAN token");
    }
    Ok((keys, next))
}

/// A SCAN reply: the page's keys, and the token of the next page if any
/// (spec §12: `*1\r\n*<k>\r\n<keys>` or `*2\r\n*<k>\r\n<keys><token>`),
/// refused as the SDK refuses it when it is anything else.
pub fn parse_scan_page(payload: &[u8]) -> Result<ScanPage> {
    fn line<'a>(p: &'a [u8], at: &mut usize, lead: u8) -> Result<&'a str> {
        let rest = p.get(*at..).unwrap_or_default();
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("a SCAN reply cut short"))?;
        if rest.first() != Some(&lead) {
            bail!(
                "a SCAN reply with {:?} where {:?} belongs",
                rest.first().map(|&b| b as char),
                lead as char
            );
        }
        *at += end + 2;
        std::str::from_utf8(&rest[1..end]).context("a SCAN reply's length")
    }
    fn bulk(p: &[u8], at: &mut usize) -> Result<Vec<u8>> {
        let n: usize = line(p, at, b'$')?.parse().context("a bulk string length")?;
        let v = p
            .get(*at..*at + n)
            .ok_or_else(|| anyhow!("a SCAN reply cut short"))?
            .to_vec();
        if p.get(*at + n..*at + n + 2) != Some(b"\r\n") {
            bail!("a bulk string of the wrong length");
        }
        *at += n + 2;
        Ok(v)
    }
    let mut at = 0;
    let parts = line(payload, &mut at, b'*')?;
    let count: usize = line(payload, &mut at, b'*')?
        .parse()
        .context("a key count")?;
    let keys = (0..count)
        .map(|_| bulk(payload, &mut at))
        .collect::<Result<Vec<_>>>()?;
    let token = match parts {
        "1" => None,
        "2" => Some(bulk(payload, &mut at)?),
        other => bail!("a SCAN reply of {other} elements"),
    };
    if at != payload.len() {
        bail!("bytes after a SCAN reply");
    }
    Ok((keys, token))
}
