//! `statestore bench`: a bounded load generator for a state store (or a
//! bare echo responder) on an MQTT5 broker. Each client sends one request at
//! a time and waits for its reply; latency is request publish to reply.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::mpsc;

use crate::mqtt::BrokerUrl;
use crate::transport::external::MAX_PACKET;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The broker.
    pub broker: BrokerUrl,
    /// Concurrent clients.
    pub clients: usize,
    /// How long to run.
    pub duration: Duration,
    /// Stop after this many requests in all.
    pub max_requests: u64,
    /// Value size for SET.
    pub value_size: usize,
    /// Distinct keys per client.
    pub keys: usize,
    /// Fraction of GETs (0.0 - 1.0).
    pub get_ratio: f64,
    /// Request topic (the store's, or an echo responder's).
    pub topic: String,
    /// CA certificate (PEM) to trust for `mqtts://`.
    pub ca_file: Option<std::path::PathBuf>,
    /// MQTT user name and password of every client.
    pub credentials: Option<(String, String)>,
    /// What every key written starts with (then `<client>-<n>`).
    pub prefix: String,
    /// Delete the keys written when done (the store's topic only).
    pub cleanup: bool,
    /// Client ids `<prefix><n>-<pid>` instead of `bench-<pid>-<n>`.
    pub client_id_prefix: Option<String>,
}

/// Results.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Requests answered.
    pub requests: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Sorted latencies in microseconds.
    pub latencies_us: Vec<u32>,
    /// Requests that got no reply within 10 s.
    pub timeouts: u64,
    /// Requests answered with an error (a RESP3 error: refused, over a
    /// quota...), counted in `requests` too.
    pub errors: u64,
    /// The first of those errors, as the store said it.
    pub first_error: Option<String>,
}

impl BenchReport {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile latency in microseconds.
    pub fn quantile_us(&self, q: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * q).round() as usize;
        self.latencies_us[i.min(self.latencies_us.len() - 1)]
    }

    /// One line: `ops/s p50 p99 p99.9`.
    pub fn line(&self) -> String {
        format!(
            "requests={} seconds={:.2} ops_per_s={:.0} p50_us={} p99_us={} p999_us={} timeouts={} errors={}",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.quantile_us(0.5),
            self.quantile_us(0.99),
            self.quantile_us(0.999),
            self.timeouts,
            self.errors
        )
    }
}

async fn connect(
    broker: &BrokerUrl,
    ca_file: Option<&std::path::Path>,
    credentials: Option<&(String, String)>,
    id: &str,
) -> Result<(
    AsyncClient,
    mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Publish>,
)> {
    let mut o = MqttOptions::new(id, &broker.host, broker.port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_start(true)
        .set_max_packet_size(Some(MAX_PACKET));
    if let Some((user, password)) = credentials {
        o.set_credentials(user, password);
    }
    crate::mqtt::connection_options(&mut o, broker, ca_file, None)?;
    let (client, mut eventloop) = AsyncClient::new(o, 64);
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready) = mpsc::channel::<Result<(), String>>(1);
    tokio::spawn(async move {
        let mut connected = false;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => connected = true,
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready_tx.try_send(Ok(()));
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return,
                Ok(_) => {}
                // Before the first CONNACK a failure is the answer (a
                // closed port, a refused login); after it, try again.
                Err(e) if !connected => {
                    let _ = ready_tx.try_send(Err(crate::client::connect_error(&e)));
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let response_topic = format!("bench/{id}/response");
    // Queued for the event loop; when that loop has already ended (a
    // refused connection), `ready` holds the reason, which says more.
    let queued = client.subscribe(&response_topic, QoS::AtLeastOnce).await;
    let at = format!("{}:{}", broker.host, broker.port);
    match tokio::time::timeout(Duration::from_secs(10), ready.recv()).await {
        Ok(Some(Ok(()))) => {
            queued?;
            Ok((client, rx))
        }
        Ok(Some(Err(e))) => bail!("cannot connect to {at}: {e}"),
        Ok(None) => bail!("cannot connect to {at}"),
        Err(_) => bail!("no answer from {at} within 10 s"),
    }
}

/// Runs the load and returns the merged report.
pub async fn run(opts: BenchOptions) -> Result<BenchReport> {
    if opts.clients == 0 || opts.keys == 0 {
        bail!("--clients and --keys must be at least 1");
    }
    let per_client = opts.max_requests.div_ceil(opts.clients as u64);
    let mut tasks = Vec::new();
    for c in 0..opts.clients {
        let opts = opts.clone();
        let id = match &opts.client_id_prefix {
            Some(prefix) => format!("{prefix}{c}-{}", std::process::id()),
            None => format!("bench-{}-{c}", std::process::id()),
        };
        let (client, rx) = connect(
            &opts.broker,
            opts.ca_file.as_deref(),
            opts.credentials.as_ref(),
            &id,
        )
        .await?;
        tasks.push(tokio::spawn(async move {
            one_client(opts, c, id, client, rx, per_client).await
        }));
    }
    let mut report = BenchReport {
        requests: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
        timeouts: 0,
        errors: 0,
        first_error: None,
    };
    for t in tasks {
        let r = t.await??;
        report.requests += r.requests;
        report.timeouts += r.timeouts;
        report.errors += r.errors;
        report.first_error = report.first_error.or(r.first_error);
        report.latencies_us.extend(r.latencies_us);
        // The load's time is its longest client's: connecting, and
        // deleting what it wrote afterwards, are not part of it.
        report.elapsed = report.elapsed.max(r.elapsed);
    }
    report.latencies_us.sort_unstable();
    Ok(report)
}

/// One client's connection and where its replies come.
struct Link {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Publish>,
    id: String,
    topic: String,
    response_topic: String,
    sent: u64,
}

impl Link {
    /// Sends one request and waits for its reply: `Some((latency, reply))`, or
    /// `None` if none came within 10 s.
    async fn round_trip(&mut self, payload: Vec<u8>) -> Result<Option<(Duration, Bytes)>> {
        self.sent += 1;
        let corr = Bytes::from(self.sent.to_be_bytes().repeat(2));
        let props = PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(corr.clone()),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__srcId".into(), self.id.clone()),
                (
                    "__ts".into(),
                    format!("{:015}:00000:{}", crate::store::driver::now_ms(), self.id),
                ),
                ("__protVer".into(), "1.0".into()),
            ],
            ..Default::default()
        };
        let sent = Instant::now();
        self.client
            .publish_with_properties(self.topic.clone(), QoS::AtLeastOnce, false, payload, props)
            .await?;
        let rx = &mut self.rx;
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(p) = rx.recv().await {
                if p.properties
                    .as_ref()
                    .and_then(|x| x.correlation_data.as_ref())
                    == Some(&corr)
                {
                    return Some(p.payload);
                }
            }
            None
        })
        .await;
        match got {
            Ok(Some(reply)) => Ok(Some((sent.elapsed(), reply))),
            Ok(None) => bail!("the connection closed"),
            Err(_) => Ok(None),
        }
    }
}

async fn one_client(
    opts: BenchOptions,
    c: usize,
    id: String,
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Publish>,
    max: u64,
) -> Result<BenchReport> {
    let mut link = Link {
        client,
        rx,
        response_topic: format!("bench/{id}/response"),
        id,
        topic: opts.topic.clone(),
        sent: 0,
    };
    let value = vec![b'v'; opts.value_size];
    let mut lat = Vec::new();
    let mut timeouts = 0;
    let mut errors = 0;
    let mut first_error = None;
    let start = Instant::now();
    let mut rng: u64 =
        0x2545_F491_4F6C_DD1D ^ (link.id.len() as u64 * 7919) ^ u64::from(std::process::id());
    // The keys SET, for the cleanup: as many as requests at most, whatever
    // `--keys` says (it may be 2^64 - 1, so that no key repeats).
    let mut written = std::collections::BTreeSet::new();
    let key = |k: usize| format!("{}{c}-{k}", opts.prefix);
    let mut n: u64 = 0;
    while n < max && start.elapsed() < opts.duration {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = (rng % opts.keys as u64) as usize;
        let get = (rng % 10_000) as f64 / 10_000.0 < opts.get_ratio;
        let payload = if get {
            statestore_guest::resp3::request(&[b"GET", key(k).as_bytes()])
        } else {
            if opts.cleanup {
                written.insert(k);
            }
            statestore_guest::resp3::request(&[b"SET", key(k).as_bytes(), &value])
        };
        match link.round_trip(payload).await? {
            Some((d, reply)) => {
                lat.push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
                if reply.first() == Some(&b'-') {
                    errors += 1;
                    first_error.get_or_insert_with(|| {
                        String::from_utf8_lossy(&reply).trim_end().to_string()
                    });
                }
            }
            None => timeouts += 1,
        }
        n += 1;
    }
    let elapsed = start.elapsed();
    if opts.cleanup && opts.topic == REQUEST_TOPIC {
        for &k in &written {
            let del = statestore_guest::resp3::request(&[b"DEL", key(k).as_bytes()]);
            if link.round_trip(del).await?.is_none() {
                bail!("no reply to a DEL of the cleanup within 10 s");
            }
        }
    }
    let _ = link.client.disconnect().await;
    Ok(BenchReport {
        requests: lat.len() as u64,
        elapsed,
        latencies_us: lat,
        timeouts,
        errors,
        first_error,
    })
}

/// A bare echo responder: replies to every request on `topic` with the
/// same payload, correlation data and `__stat: 200`, from one MQTT client.
/// The baseline a store round trip is compared with.
pub async fn echo(
    broker: BrokerUrl,
    topic: String,
    ca_file: Option<&std::path::Path>,
    credentials: Option<&(String, String)>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (client, mut rx) = connect(
        &broker,
        ca_file,
        credentials,
        &format!("echo-{}", std::process::id()),
    )
    .await?;
    client.subscribe(&topic, QoS::AtLeastOnce).await?;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            p = rx.recv() => {
                let Some(p) = p else { bail!("the connection closed") };
                let Some(props) = p.properties else { continue };
                let Some(rt) = props.response_topic else { continue };
                let reply = PublishProperties {
                    correlation_data: props.correlation_data,
                    message_expiry_interval: Some(10),
                    content_type: Some("application/octet-stream".into()),
                    user_properties: vec![("__stat".into(), "200".into())],
                    ..Default::default()
                };
                client.publish_with_properties(rt, QoS::AtLeastOnce, false, p.payload, reply).await?;
            }
        }
    }
    Ok(())
}

/// The store's request topic (the default for `bench`).
pub fn store_topic() -> String {
    REQUEST_TOPIC.to_string()
}
