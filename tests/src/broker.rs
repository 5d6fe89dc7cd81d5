//! Real brokers and real MQTT5 clients for end-to-end tests.
//!
//! [`Mosquitto`] starts Debian's `mosquitto` (installed by `scripts/setup`) on a
//! free loopback port with its own config; [`Host`] runs `statestore serve`
//! in-process against it; [`RawClient`] is a plain rumqttc v5 client.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use statestore::mqtt::BrokerUrl;
use statestore::store::StoreOptions;
use statestore::transport::embedded::{EmbeddedOptions, EmbeddedServer};
use statestore::transport::external::{ClientEvents, ServeOptions, Server};
use statestore_guest::rpc::REQUEST_TOPIC;
use tokio::sync::{mpsc, oneshot};

/// A free TCP port on 127.0.0.1, below Linux's ephemeral range (32768 and
/// up): a port the kernel handed out for `:0` could be taken, before the
/// test's server binds it, as the local port of some client's connection
/// (tests run in parallel, each with servers and clients); ports below the
/// range never are. Each call in this process takes the next one (from a
/// start that depends on the process id) that can be bound now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(LOW + (start + n) % SPAN).expect("below 32000");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A mosquitto process on a free loopback port; killed on drop.
pub struct Mosquitto {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Mosquitto {
    /// Starts mosquitto with `listener PORT 127.0.0.1`, anonymous access, no
    /// persistence, TCP_NODELAY, and its log published on `$SYS/broker/log/#`.
    pub fn start() -> Mosquitto {
        Mosquitto::start_logging(false)
    }

    /// [`Mosquitto::start`], logging every packet too (`log_type debug`:
    /// "Received PUBACK from `client` ..." and the like), to stderr only.
    pub fn start_verbose() -> Mosquitto {
        Mosquitto::start_logging(true)
    }

    /// [`Mosquitto::start`] on `port` (say, one a client was told to use
    /// before the broker was there).
    pub fn start_on(port: u16) -> Mosquitto {
        Mosquitto::start_logging_on(false, port)
    }

    fn start_logging(debug: bool) -> Mosquitto {
        Mosquitto::start_logging_on(debug, free_port())
    }

    fn start_logging_on(debug: bool, port: u16) -> Mosquitto {
        let dir = std::env::temp_dir().join(format!(
            "statestore-mosquitto-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n\
             max_queued_messages 100000\nlog_dest topic\nlog_dest stderr\n\
             log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
        );
        let conf = if debug {
            conf.replace("log_dest topic\n", "") + "log_type debug\n"
        } else {
            conf
        };
        Mosquitto::start_with(port, dir, &conf)
    }

    /// Starts mosquitto with `plugin` loaded, its `plugin_opt_<key> <value>`
    /// lines, anonymous access on `listener PORT 127.0.0.1`, as the user
    /// running the test (`user root` keeps root root: the plugin's files are
    /// the test's), and waits up to 120 s for it to listen (the plugin
    /// compiles the component at start unless its cache has it).
    pub fn start_with_plugin(plugin: &std::path::Path, options: &[(&str, &str)]) -> Mosquitto {
        Mosquitto::start_with_plugin_and(plugin, options, "")
    }

    /// [`Mosquitto::start_with_plugin`] with more lines of `mosquitto.conf`
    /// (e.g. `password_file`).
    pub fn start_with_plugin_and(
        plugin: &std::path::Path,
        options: &[(&str, &str)],
        more_conf: &str,
    ) -> Mosquitto {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "statestore-mosquitto-plugin-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n\
             user root\nmax_queued_messages 100000\nlog_dest stderr\nlog_dest topic\n\
             log_type error\nlog_type warning\nlog_type notice\nlog_type information\n\
             plugin {}\n",
            plugin.display()
        );
        for (key, value) in options {
            conf.push_str(&format!("plugin_opt_{key} {value}\n"));
        }
        conf.push_str(more_conf);
        Mosquitto::start_within(port, dir, &conf, Duration::from_secs(120))
    }

    /// Sends it SIGHUP (mosquitto reloads its config and its plugins
    /// reload what they read).
    pub fn hup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -HUP");
    }

    /// Waits up to `wait` for `text` to appear in its log.
    pub fn wait_log(&self, text: &str, wait: Duration) {
        let start = Instant::now();
        while !self.log().contains(text) {
            assert!(
                start.elapsed() < wait,
                "{text:?} not in mosquitto's log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_with(port: u16, dir: PathBuf, config: &str) -> Mosquitto {
        Mosquitto::start_within(port, dir, config, Duration::from_secs(10))
    }

    fn start_within(port: u16, dir: PathBuf, config: &str, wait: Duration) -> Mosquitto {
        let conf = dir.join("mosquitto.conf");
        std::fs::write(&conf, config).expect("write mosquitto.conf");
        let binary = ["mosquitto", "/usr/sbin/mosquitto"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("-h")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok()
            })
            .expect(
                "mosquitto is not installed: run scripts/setup (it installs Debian's mosquitto)",
            );
        let child = Command::new(binary)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mosquitto");
        let mut m = Mosquitto {
            child,
            port,
            dir,
            log: Arc::default(),
        };
        // mosquitto logs to stderr (a log file would be written by the
        // unprivileged user it switches to when started as root).
        if let Some(mut pipe) = m.child.stderr.take() {
            let sink = m.log.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut log) = sink.lock() {
                        log.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = m.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                panic!("mosquitto exited ({status}): {}", m.log());
            }
            assert!(
                start.elapsed() < wait,
                "mosquitto did not listen on {port}: {}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    /// Starts mosquitto with a TLS listener on a free port, using a fresh
    /// server certificate for `localhost` signed by a fresh CA (a
    /// [`TestPki`]), beside a plain listener on `port` for test clients.
    /// Returns it, the TLS port and the CA certificate (PEM) to trust.
    pub fn start_tls() -> (Mosquitto, u16, PathBuf) {
        let port = free_port();
        let tls_port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "statestore-mosquitto-tls-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pki = TestPki::new("mosquitto-tls");
        let (ca, cert, key) = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        for (from, to) in [
            (&pki.ca, &ca),
            (&pki.server_cert, &cert),
            (&pki.server_key, &key),
        ] {
            std::fs::copy(from, to).expect("copy certificate");
            // mosquitto drops root privileges: let its user read the key.
            let _ = Command::new("chmod").arg("644").arg(to).status();
        }
        let _ = Command::new("chmod").arg("755").arg(&dir).status();
        let conf = format!(
            "allow_anonymous true\npersistence false\nset_tcp_nodelay true\nlog_dest stderr\n\
             listener {tls_port} 127.0.0.1\ncertfile {}\nkeyfile {}\nlistener {port} 127.0.0.1\n",
            cert.display(),
            key.display()
        );
        (Mosquitto::start_with(port, dir, &conf), tls_port, ca)
    }

    /// Starts mosquitto with a TLS listener on a free port that requires a
    /// client certificate signed by `pki`'s CA (its server certificate is
    /// `pki`'s), beside a plain listener on `port` for test clients.
    /// Returns it and the TLS port.
    pub fn start_tls_requiring_certificates(pki: &TestPki) -> (Mosquitto, u16) {
        let port = free_port();
        let tls_port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "statestore-mosquitto-mtls-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // mosquitto drops root privileges: let its user read the files.
        let _ = Command::new("chmod").arg("755").arg(&pki.dir).status();
        for f in [&pki.ca, &pki.server_cert, &pki.server_key] {
            let _ = Command::new("chmod").arg("644").arg(f).status();
        }
        let conf = format!(
            "allow_anonymous true\npersistence false\nset_tcp_nodelay true\nlog_dest stderr\n\
             listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n\
             listener {port} 127.0.0.1\n",
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display()
        );
        (Mosquitto::start_with(port, dir, &conf), tls_port)
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> BrokerUrl {
        BrokerUrl {
            host: "127.0.0.1".into(),
            port: self.port,
            tls: false,
        }
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Options for a host serving through `broker`.
pub fn serve_options(broker: BrokerUrl, client_events: ClientEvents) -> ServeOptions {
    ServeOptions {
        client_cert: None,
        broker,
        client_id: "statestore-under-test".into(),
        username: None,
        password: None,
        ca_file: None,
        keep_alive: Duration::from_secs(30),
        session_expiry: Duration::from_secs(600),
        max_packet: statestore::transport::external::MAX_PACKET,
        connect_timeout: Duration::from_secs(10),
        client_events,
        store: StoreOptions::volatile("StateStore", "statestore-under-test"),
        shared_group: None,
    }
}

/// `statestore serve` running in this process.
pub struct Host {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Host {
    /// Connects a server (built-in wasm component) and serves until stopped.
    pub async fn start(opts: ServeOptions) -> Host {
        let server = Server::connect(crate::wasm_runtime(), opts)
            .await
            .expect("the host connects");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Host {
            stop: Some(stop),
            task,
        }
    }

    /// Shuts the server down cleanly (as SIGTERM does) and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
        r.expect("the host stops within 10 s")
            .expect("join")
            .expect("the host ran without error");
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The embedded broker with the store inside, on a free loopback port.
pub struct Embedded {
    /// Its port on 127.0.0.1.
    pub port: u16,
    host: Host,
}

impl Embedded {
    /// Starts it on 127.0.0.1 with an OS-chosen port.
    pub async fn start() -> Embedded {
        Embedded::start_with(statestore::transport::embedded::BrokerOptions::default()).await
    }

    /// [`Embedded::start`] with these broker options.
    pub async fn start_with(broker: statestore::transport::embedded::BrokerOptions) -> Embedded {
        let opts = EmbeddedOptions {
            listen: "127.0.0.1:0".parse().expect("address"),
            store: StoreOptions::volatile("StateStore", "statestore-under-test"),
        };
        let tenant = statestore::store::tenant::Tenant::open(
            "default",
            crate::wasm_runtime().clone(),
            &opts.store,
        )
        .expect("the store opens");
        let route = statestore::transport::embedded::Route {
            matcher: Default::default(),
            default: true,
        };
        let server = EmbeddedServer::start_tenants_with(
            opts.listen,
            &opts.store.server_client_id,
            vec![(tenant, route)],
            broker,
        )
        .await
        .expect("the embedded broker starts");
        let port = server.local_addr().port();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Embedded {
            port,
            host: Host {
                stop: Some(stop),
                task,
            },
        }
    }

    /// Stops it and waits.
    pub async fn stop(self) {
        self.host.stop().await;
    }
}

/// Where the store under test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `serve --broker` through mosquitto (with its disconnect events).
    External,
    /// `serve` with the embedded broker.
    Embedded,
}

/// A running store in either mode; clients connect to `port`.
pub enum Deployment {
    /// mosquitto and the host.
    External(Mosquitto, Host),
    /// The embedded broker.
    Embedded(Embedded),
}

impl Deployment {
    /// Starts the store in `mode`.
    pub async fn start(mode: Mode) -> Deployment {
        match mode {
            Mode::External => {
                let broker = Mosquitto::start();
                let host =
                    Host::start(serve_options(broker.url(), ClientEvents::MosquittoLog)).await;
                Deployment::External(broker, host)
            }
            Mode::Embedded => Deployment::Embedded(Embedded::start().await),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        match self {
            Deployment::External(b, _) => b.port,
            Deployment::Embedded(e) => e.port,
        }
    }

    /// Stops the store cleanly (an error in it fails the test).
    pub async fn stop(self) {
        match self {
            Deployment::External(_broker, host) => host.stop().await,
            Deployment::Embedded(e) => e.stop().await,
        }
    }
}

/// A plain MQTT5 client (rumqttc) with everything it receives in a channel.
pub struct RawClient {
    /// Its client id.
    pub id: String,
    /// The rumqttc client.
    pub client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    subacks: mpsc::UnboundedReceiver<bool>,
    pubacks: mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::PubAckReason>,
    task: tokio::task::JoinHandle<()>,
    next_correlation: u128,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl RawClient {
    /// Connects with a clean session and waits for the CONNACK.
    pub async fn connect(port: u16, id: &str) -> RawClient {
        match RawClient::try_connect(port, id, None).await {
            Ok(c) => c,
            Err(e) => panic!("the test client connects: {e}"),
        }
    }

    /// Connects with these credentials, if any; a refused or failed
    /// connection is an error.
    pub async fn try_connect(
        port: u16,
        id: &str,
        credentials: Option<(&str, &str)>,
    ) -> Result<RawClient, String> {
        RawClient::try_connect_with(port, id, credentials, None).await
    }

    /// [`RawClient::try_connect`] with a will message.
    pub async fn try_connect_with(
        port: u16,
        id: &str,
        credentials: Option<(&str, &str)>,
        will: Option<rumqttc::v5::mqttbytes::v5::LastWill>,
    ) -> Result<RawClient, String> {
        RawClient::connect_options(port, id, credentials, will, false).await
    }

    /// Connects with clean start 0 and a session expiry of 300 s: resumes
    /// its session if the broker holds one, and leaves it parked when the
    /// connection ends.
    pub async fn try_connect_persistent(
        port: u16,
        id: &str,
        credentials: Option<(&str, &str)>,
    ) -> Result<RawClient, String> {
        RawClient::connect_options(port, id, credentials, None, true).await
    }

    async fn connect_options(
        port: u16,
        id: &str,
        credentials: Option<(&str, &str)>,
        will: Option<rumqttc::v5::mqttbytes::v5::LastWill>,
        persistent: bool,
    ) -> Result<RawClient, String> {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = credentials {
            o.set_credentials(user, password);
        }
        if let Some(will) = will {
            o.set_last_will(will);
        }
        if persistent {
            o.set_session_expiry_interval(Some(300));
        }
        o.set_keep_alive(Duration::from_secs(30))
            .set_clean_start(!persistent)
            .set_max_packet_size(Some(statestore::transport::external::MAX_PACKET));
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        o.set_network_options(net);
        let (client, mut eventloop) = AsyncClient::new(o, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (stx, subacks) = mpsc::unbounded_channel();
        let (ptx, pubacks) = mpsc::unbounded_channel();
        let (ctx, connected) = oneshot::channel::<Result<(), String>>();
        let mut ctx = Some(ctx);
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lost_flag = lost.clone();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(c) = ctx.take() {
                            let _ = c.send(Ok(()));
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) => {
                        let granted = ack.return_codes.iter().all(|c| {
                            matches!(
                                c,
                                rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                            )
                        });
                        let _ = stx.send(granted);
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        let _ = ptx.send(ack.reason);
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(e) => {
                        if let Some(c) = ctx.take() {
                            let _ = c.send(Err(e.to_string()));
                            return;
                        }
                        lost_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                }
            }
        });
        match tokio::time::timeout(Duration::from_secs(10), connected).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => return Err("the connection task ended".into()),
            Err(_) => return Err("no CONNACK within 10 s".into()),
        }
        Ok(RawClient {
            id: id.into(),
            client,
            rx,
            subacks,
            pubacks,
            task,
            // Unique across connections, like the SDKs' random UUIDs: a reused
            // (response topic, correlation) pair is a redelivery to the store.
            // The connection's time in the high 64 bits, a count in the low:
            // two clients connecting a microsecond apart never meet (with
            // the time alone, the earlier one's thousandth request took the
            // later one's first correlation).
            next_correlation: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos())
                << 64,
            lost,
        })
    }

    /// Subscribes (QoS 1) and waits for the SUBACK.
    pub async fn subscribe(&mut self, filter: &str) {
        assert!(
            self.try_subscribe(filter).await,
            "subscription to {filter} refused"
        );
    }

    /// Subscribes (QoS 1); whether the SUBACK granted it.
    pub async fn try_subscribe(&mut self, filter: &str) -> bool {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        self.suback().await
    }

    /// Whether the next SUBACK (within 5 s) granted the subscription.
    async fn suback(&mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(5), self.subacks.recv())
            .await
            .expect("suback in time")
            .expect("suback")
    }

    /// Subscribes at `qos` with subscription identifier `id`, and waits for
    /// the SUBACK; whether it was granted.
    pub async fn subscribe_with_id(&mut self, filter: &str, qos: QoS, id: usize) -> bool {
        let props = rumqttc::v5::mqttbytes::v5::SubscribeProperties {
            id: Some(id),
            user_properties: Vec::new(),
        };
        self.client
            .subscribe_with_properties(filter, qos, props)
            .await
            .expect("subscribe");
        self.suback().await
    }

    /// This client's response topic.
    pub fn response_topic(&self) -> String {
        format!(
            "clients/{}/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response",
            self.id
        )
    }

    /// The properties an SDK sends with a request.
    pub fn request_properties(&mut self) -> PublishProperties {
        let corr = self.next_correlation.to_be_bytes().to_vec();
        self.next_correlation += 1;
        PublishProperties {
            response_topic: Some(self.response_topic()),
            correlation_data: Some(Bytes::from(corr)),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__srcId".into(), self.id.clone()),
                (
                    "__ts".into(),
                    format!(
                        "{:015}:00000:{}",
                        statestore::transport::external::now_ms(),
                        self.id
                    ),
                ),
                ("__protVer".into(), "1.0".into()),
            ],
            ..Default::default()
        }
    }

    /// Publishes `payload` to `topic` (QoS 1) with these properties.
    pub async fn publish_to(&self, topic: &str, payload: Vec<u8>, props: PublishProperties) {
        self.client
            .publish_with_properties(topic, QoS::AtLeastOnce, false, payload, props)
            .await
            .expect("publish");
    }

    /// Publishes a request with these properties (QoS 1).
    pub async fn publish_request(&self, payload: Vec<u8>, props: PublishProperties) {
        self.client
            .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, payload, props)
            .await
            .expect("publish");
    }

    /// Sends a request (subscribing to the response topic first) and waits for
    /// the reply with the same correlation data.
    pub async fn call(&mut self, parts: &[&[u8]]) -> Publish {
        let props = self.request_properties();
        self.call_with(crate::resp(parts), props)
            .await
            .expect("a reply within 20 s")
    }

    /// Sends a request with explicit properties and waits up to 20 s for its reply.
    pub async fn call_with(
        &mut self,
        payload: Vec<u8>,
        props: PublishProperties,
    ) -> Option<Publish> {
        self.call_within(payload, props, Duration::from_secs(10))
            .await
    }

    /// Sends a request and waits up to `wait` for its reply.
    pub async fn call_within(
        &mut self,
        payload: Vec<u8>,
        props: PublishProperties,
        wait: Duration,
    ) -> Option<Publish> {
        let corr = props.correlation_data.clone();
        self.publish_request(payload, props).await;
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let p = self.recv(left).await?;
            if p.properties
                .as_ref()
                .and_then(|x| x.correlation_data.clone())
                == corr
            {
                return Some(p);
            }
        }
    }

    /// The next message received, if one comes within `wait`.
    pub async fn recv(&mut self, wait: Duration) -> Option<Publish> {
        tokio::time::timeout(wait, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// Whether the connection was lost (closed by the broker) at some point.
    pub fn was_disconnected(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The reason code of the next PUBACK the broker sends this client that
    /// is not a success (the successes of earlier publishes are skipped),
    /// if one comes within `wait`.
    pub async fn refused_puback(
        &mut self,
        wait: Duration,
    ) -> Option<rumqttc::v5::mqttbytes::v5::PubAckReason> {
        use rumqttc::v5::mqttbytes::v5::PubAckReason;
        let until = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(until, self.pubacks.recv()).await {
                Ok(Some(PubAckReason::Success | PubAckReason::NoMatchingSubscribers)) => {}
                Ok(other) => return other,
                Err(_) => return None,
            }
        }
    }

    /// The reason code of the next PUBACK the broker sends this client, if
    /// one comes within `wait`.
    pub async fn puback(
        &mut self,
        wait: Duration,
    ) -> Option<rumqttc::v5::mqttbytes::v5::PubAckReason> {
        tokio::time::timeout(wait, self.pubacks.recv())
            .await
            .ok()
            .flatten()
    }

    /// Disconnects cleanly (DISCONNECT packet).
    pub async fn disconnect(self) {
        let _ = self.client.disconnect().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.task.abort();
    }

    /// Drops the TCP connection without a DISCONNECT.
    pub fn kill(self) {
        self.task.abort();
    }
}

/// A user property of a received message.
pub fn prop<'a>(p: &'a Publish, name: &str) -> Option<&'a str> {
    p.properties
        .as_ref()?
        .user_properties
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The payload of a received message as text (lossy), for assertions.
pub fn text(p: &Publish) -> String {
    String::from_utf8_lossy(&p.payload).into_owned()
}

/// A throwaway PKI for TLS tests, made with `openssl`: a CA, a server
/// certificate for `localhost` / 127.0.0.1 and a client certificate, both
/// signed by the CA. Removed with its directory when dropped.
pub struct TestPki {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// The CA certificate (PEM): what clients and the server trust.
    pub ca: PathBuf,
    /// The server's certificate and key (PEM).
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client's certificate and key (PEM), CN `cert-client`.
    pub client_cert: PathBuf,
    /// The client's key.
    pub client_key: PathBuf,
}

impl TestPki {
    /// Makes the PKI in a fresh temporary directory.
    pub fn new(name: &str) -> TestPki {
        let dir = std::env::temp_dir().join(format!(
            "statestore-pki-{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = |n: &str| dir.join(n);
        let openssl = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("openssl is installed");
            assert!(ok.success(), "openssl {args:?} failed");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=statestore-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        for (who, cn, ext) in [
            (
                "server",
                "localhost",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "cert-client", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(f(&format!("{who}.ext")), ext).expect("write ext");
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{who}.key"),
                "-out",
                &format!("{who}.csr"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                &format!("{who}.pem"),
                "-extfile",
                &format!("{who}.ext"),
            ]);
        }
        TestPki {
            ca: f("ca.pem"),
            server_cert: f("server.pem"),
            server_key: f("server.key"),
            client_cert: f("client.pem"),
            client_key: f("client.key"),
            dir,
        }
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
