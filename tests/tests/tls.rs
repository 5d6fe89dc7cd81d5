//! The embedded broker's TLS listener, beside its plain one, with real
//! clients: our client library (rumqttc), the unmodified Azure IoT
//! Operations SDK with a CA file (and a client certificate), and Debian's
//! `mosquitto_pub` / `mosquitto_sub`. With `client_ca`, a client without a
//! certificate signed by it is refused at the handshake.

use std::process::{Command, Stdio};
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_services::state_store::{self, SetOptions};
use statestore::store::StoreOptions;
use statestore::store::tenant::Tenant;
use statestore::transport::embedded::{BrokerOptions, EmbeddedServer, Route, TlsListener};
use statestore_tests::broker::{RawClient, TestPki, free_port, text};
use statestore_tests::sdk::Sdk;
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(5);

/// A running embedded server: its plain and TLS ports.
struct Running {
    plain: u16,
    tls: u16,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(pki: &TestPki, client_ca: bool) -> Running {
    start_with(pki, client_ca, None).await
}

async fn start_with(
    pki: &TestPki,
    client_ca: bool,
    policy: Option<statestore::auth::policy::Policy>,
) -> Running {
    let mut store = StoreOptions::volatile("StateStore", "statestore-under-test");
    store.authorization = policy
        .as_ref()
        .map(statestore::auth::policy::Policy::store_rules);
    let tenant =
        Tenant::open("default", statestore_tests::wasm_runtime().clone(), &store).expect("tenant");
    let tls = free_port();
    let server = EmbeddedServer::start_tenants_with(
        "127.0.0.1:0".parse().expect("address"),
        "statestore-under-test",
        vec![(
            tenant,
            Route {
                default: true,
                ..Route::default()
            },
        )],
        BrokerOptions {
            tls: Some(TlsListener {
                listen: format!("127.0.0.1:{tls}").parse().expect("address"),
                cert: pki.server_cert.clone(),
                key: pki.server_key.clone(),
                client_ca: client_ca.then(|| pki.ca.clone()),
            }),
            policy: policy.map(|p| statestore::auth::policy::PolicyCell::new(Some(p))),
            ..BrokerOptions::default()
        },
    )
    .await
    .expect("the embedded broker starts with TLS");
    let plain = server.local_addr().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Running {
        plain,
        tls,
        stop,
        task,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// The SDK's state store client over TLS, trusting `ca`, with a client
/// certificate if given.
async fn sdk(
    port: u16,
    id: &str,
    ca: &std::path::Path,
    cert: Option<(&std::path::Path, &std::path::Path)>,
) -> (
    std::sync::Arc<state_store::Client>,
    azure_iot_operations_mqtt::session::SessionExitHandle,
) {
    let b = MqttConnectionSettingsBuilder::default()
        .client_id(id)
        .hostname("localhost")
        .tcp_port(port)
        .use_tls(true)
        .ca_file(ca.display().to_string())
        .keep_alive(Duration::from_secs(10))
        .clean_start(true)
        .session_expiry(Duration::from_secs(60));
    let b = match cert {
        Some((c, k)) => b
            .cert_file(c.display().to_string())
            .key_file(k.display().to_string()),
        None => b,
    };
    let settings = b.build().expect("mqtt settings");
    let sdk = Sdk::start(settings, Some(5), Duration::from_secs(1)).await;
    (sdk.ss, sdk.exit)
}

/// Debian's `mosquitto_pub` or `mosquitto_sub` (`tool`) speaking MQTT5 over
/// TLS to `port`, trusting `pki`'s CA.
fn mosquitto_tls(tool: &str, port: u16, pki: &TestPki) -> Command {
    let mut c = Command::new(tool);
    c.args(["-h", "localhost", "-p", &port.to_string(), "-V", "mqttv5"])
        .arg("--cafile")
        .arg(&pki.ca);
    c
}

/// `mosquitto_pub` over TLS (with a client certificate if given): whether it succeeded.
fn mosquitto_pub(port: u16, pki: &TestPki, topic: &str, message: &str, cert: bool) -> bool {
    let mut c = mosquitto_tls("mosquitto_pub", port, pki);
    c.args(["-t", topic, "-m", message, "-q", "1"]);
    if cert {
        c.arg("--cert")
            .arg(&pki.client_cert)
            .arg("--key")
            .arg(&pki.client_key);
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("mosquitto_pub is installed")
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_every_kind_over_tls_beside_the_plain_listener() {
    let pki = TestPki::new("tls");
    let server = start(&pki, false).await;
    // Our client library (rumqttc) over mqtts:// with the CA.
    use statestore::client::{self, Client, ClientOptions, OK};
    let opts = |ca: Option<std::path::PathBuf>| ClientOptions {
        client_cert: None,
        brokers: vec![
            format!("mqtts://localhost:{}", server.tls)
                .parse()
                .expect("url"),
        ],
        client_id: "tls-cli".into(),
        credentials: None,
        ca_file: ca,
        timeout: T,
    };
    assert!(
        Client::connect(&opts(None)).await.is_err(),
        "the system roots do not trust the test CA"
    );
    let mut cli = Client::connect(&opts(Some(pki.ca.clone())))
        .await
        .expect("connects over TLS");
    let mut out = Vec::new();
    let code = client::set(
        &mut cli,
        b"k",
        b"over tls",
        &client::SetOptions::default(),
        &mut out,
    )
    .await
    .expect("set");
    assert_eq!(code, OK);
    cli.close().await;
    // The plain listener serves the same store.
    let mut plain = RawClient::connect(server.plain, "plain").await;
    let rt = plain.response_topic();
    plain.subscribe(&rt).await;
    assert_eq!(
        text(&plain.call(&[b"GET", b"k"]).await),
        "$8\r\nover tls\r\n"
    );
    // The unmodified SDK with a CA file.
    let (ss, exit) = sdk(server.tls, "tls-sdk", &pki.ca, None).await;
    let got = ss.get(b"k".to_vec(), T).await.expect("sdk get");
    assert_eq!(got.response.as_deref(), Some(&b"over tls"[..]));
    let r = ss
        .set(
            b"k2".to_vec(),
            b"from sdk".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("sdk set");
    assert!(r.response);
    let _ = ss.shutdown().await;
    let _ = exit.try_exit();
    // mosquitto_sub / mosquitto_pub: ordinary MQTT over the TLS listener.
    let sub = mosquitto_tls("mosquitto_sub", server.tls, &pki)
        .args(["-t", "plain/topic", "-C", "1", "-W", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub is installed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(mosquitto_pub(
        server.tls,
        &pki,
        "plain/topic",
        "hello",
        false
    ));
    let out = sub.wait_with_output().expect("mosquitto_sub ends");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello");
    assert_eq!(
        text(&plain.call(&[b"GET", b"k2"]).await),
        "$8\r\nfrom sdk\r\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_requires_client_certificates() {
    let pki = TestPki::new("mtls");
    let server = start(&pki, true).await;
    assert!(
        !mosquitto_pub(server.tls, &pki, "t", "x", false),
        "no client certificate: refused"
    );
    assert!(
        mosquitto_pub(server.tls, &pki, "t", "x", true),
        "a certificate the CA signed: served"
    );
    // A certificate another CA signed, for the same name: refused.
    let stranger = TestPki::new("mtls-stranger");
    let ok = mosquitto_tls("mosquitto_pub", server.tls, &pki)
        .arg("--cert")
        .arg(&stranger.client_cert)
        .arg("--key")
        .arg(&stranger.client_key)
        .args(["-t", "t", "-m", "x", "-q", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("mosquitto_pub is installed")
        .success();
    assert!(!ok, "a certificate of an unknown CA: refused");
    let (ss, exit) = sdk(
        server.tls,
        "mtls-sdk",
        &pki.ca,
        Some((&pki.client_cert, &pki.client_key)),
    )
    .await;
    let r = ss
        .set(b"m".to_vec(), b"v".to_vec(), T, None, SetOptions::default())
        .await
        .expect("sdk set with a client certificate");
    assert!(r.response);
    let _ = ss.shutdown().await;
    let _ = exit.try_exit();
    server.stop().await;
}

/// A client certificate is a principal: its common name is the user name
/// rules name, and `certificateAttributes` gives it attributes; the
/// unmodified SDK with that certificate gets exactly what the rules give it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_a_principal() {
    let pki = TestPki::new("cert-principal");
    let policy = statestore::auth::policy::Policy::parse(
        r#"
rules:
  - principals:
      usernames: ["cert-client"]
    brokerResources:
      - method: Connect
      - method: Publish
        topics: ["statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"]
      - method: Subscribe
        topics: ["clients/{principal.clientId}/#"]
    stateStoreResources:
      - method: ReadWrite
        keyType: Pattern
        keys: ["{principal.attributes.building}/*", "{principal.username}/*", "{principal.attributes.floor}/*"]
certificateAttributes:
  cert-client: { building: b17 }
  "CN = cert-client": { floor: f3 }
"#,
        false,
    )
    .expect("policy");
    let server = start_with(&pki, true, Some(policy)).await;
    let (ss, exit) = sdk(
        server.tls,
        "fan-1",
        &pki.ca,
        Some((&pki.client_cert, &pki.client_key)),
    )
    .await;
    for key in [&b"b17/speed"[..], b"cert-client/x", b"f3/x"] {
        let r = ss
            .set(key.to_vec(), b"3".to_vec(), T, None, SetOptions::default())
            .await
            .expect("a key the certificate's rules give");
        assert!(r.response);
    }
    let e = ss
        .set(
            b"b18/speed".to_vec(),
            b"3".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect_err("another building's key");
    assert!(format!("{e:?}").contains("NotAuthorized"), "{e:?}");
    let _ = ss.shutdown().await;
    let _ = exit.try_exit();
    server.stop().await;
}

/// A spy over TLS (Debian's `mosquitto_sub`) on `#` and on the victim's
/// `clients/<victim>/#` receives nothing of a victim that is the unmodified
/// SDK over TLS (isolation holds on the TLS listener too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spy_over_tls_receives_nothing_of_the_victim() {
    let pki = TestPki::new("tls-spy");
    let server = start(&pki, false).await;
    let spy = mosquitto_tls("mosquitto_sub", server.tls, &pki)
        .args(["-i", "spy", "-t", "#", "-t", "clients/tls-victim/#"])
        // An ordinary topic it may read: proof that it listens.
        .args(["-t", "sensors/#", "-v"])
        // Exit after 4 s (the victim's work takes less).
        .args(["-W", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub is installed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ss, exit) = sdk(server.tls, "tls-victim", &pki.ca, None).await;
    let r = ss
        .set(
            b"secret".to_vec(),
            b"the victim's".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("victim set");
    assert!(r.response);
    let got = ss.get(b"secret".to_vec(), T).await.expect("victim get");
    assert_eq!(got.response.as_deref(), Some(&b"the victim's"[..]));
    assert!(mosquitto_pub(server.tls, &pki, "sensors/t", "21", false));
    let out = tokio::task::spawn_blocking(move || spy.wait_with_output())
        .await
        .expect("spy task")
        .expect("spy output");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "sensors/t 21\n",
        "the spy received only the ordinary message"
    );
    let _ = ss.shutdown().await;
    let _ = exit.try_exit();
    server.stop().await;
}
