//! SIGHUP reloads the TLS listener's certificate, end to end:
//! `statestore serve --tls-listen` with files that are replaced, a real
//! `kill -HUP`, and real clients: `mosquitto_pub` handshakes that trust
//! the old or the new CA, and our client library, connected before the
//! reload, which keeps its connection. Files that do not load change
//! nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use statestore::client::{self, Client, ClientOptions, OK};
use statestore_tests::broker::{TestPki, free_port};
use statestore_tests::process::Server;

const T: Duration = Duration::from_secs(10);

/// Whether `mosquitto_pub` trusting `ca` publishes over TLS to `port`.
async fn publishes(port: u16, ca: &Path) -> bool {
    let ca = ca.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Command::new("mosquitto_pub")
            .args(["-h", "localhost", "-p", &port.to_string(), "-V", "mqttv5"])
            .arg("--cafile")
            .arg(&ca)
            .args(["-t", "reload/probe", "-m", "x", "-q", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("mosquitto_pub is installed")
            .success()
    })
    .await
    .expect("mosquitto_pub task")
}

async fn set(c: &mut Client, value: &[u8]) -> u8 {
    let mut out = Vec::new();
    client::set(c, b"k", value, &client::SetOptions::default(), &mut out)
        .await
        .expect("set")
}

fn install(pki: &TestPki, cert: &Path, key: &Path) {
    std::fs::copy(&pki.server_cert, cert).expect("copy cert");
    std::fs::copy(&pki.server_key, key).expect("copy key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_tls_certificate_and_keeps_connected_clients() {
    let old = TestPki::new("reload-old");
    let new = TestPki::new("reload-new");
    let dir: PathBuf = old.dir.join("live");
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    install(&old, &cert, &key);
    let tls = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_statestore"));
    cmd.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-tls-reload-cache"),
    )
    .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
    .args(["--tls-listen", &format!("127.0.0.1:{tls}")])
    .arg("--tls-cert")
    .arg(&cert)
    .arg("--tls-key")
    .arg(&key);
    let server = Server::spawn(cmd);

    // A client of the old certificate, connected before the reload.
    let mut before = Client::connect(&ClientOptions {
        brokers: vec![format!("mqtts://localhost:{tls}").parse().expect("url")],
        client_id: "before-reload".into(),
        credentials: None,
        ca_file: Some(old.ca.clone()),
        client_cert: None,
        timeout: T,
    })
    .await
    .expect("connects over TLS");
    assert_eq!(set(&mut before, b"1").await, OK);
    assert!(publishes(tls, &old.ca).await, "the old CA is trusted");
    assert!(!publishes(tls, &new.ca).await, "the new CA is not yet");

    // New files, SIGHUP: new handshakes get the new certificate.
    install(&new, &cert, &key);
    server.hup();
    server.wait_log("TLS certificate reloaded", T).await;
    assert!(publishes(tls, &new.ca).await, "{}", server.log());
    assert!(
        !publishes(tls, &old.ca).await,
        "the old certificate is gone"
    );
    // The connected client kept its connection (a reconnect would fail:
    // it trusts only the old CA).
    assert_eq!(set(&mut before, b"2").await, OK);

    // A file that does not load changes nothing.
    std::fs::write(&cert, "not a certificate").expect("write");
    server.hup();
    server.wait_log("TLS reload failed", T).await;
    assert!(publishes(tls, &new.ca).await, "{}", server.log());
    assert_eq!(set(&mut before, b"3").await, OK);
    before.close().await;
}

/// SIGHUP reads `--users-file` again: a user taken out of it is refused
/// from then on, one added is let in; a file with a bad line changes
/// nothing (the log says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_users_file() {
    use statestore_tests::broker::RawClient;
    // Written by mosquitto_passwd 2.0: alice/secret, bob/hunter2.
    const ALICE: &str = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==";
    const BOB: &str = "bob:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==";
    let dir = std::env::temp_dir().join(format!("statestore-users-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    std::fs::write(&users, format!("{ALICE}\n")).expect("users");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_statestore"));
    cmd.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-tls-reload-cache"),
    )
    .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
    .arg("--users-file")
    .arg(&users);
    let server = Server::spawn(cmd);
    let login = |id: &'static str, user: &'static str, password: &'static str| async move {
        RawClient::try_connect(port, id, Some((user, password)))
            .await
            .map(|c| c.kill())
            .is_ok()
    };
    assert!(login("a-1", "alice", "secret").await);
    assert!(!login("b-1", "bob", "hunter2").await, "not yet a user");
    // bob in, alice out.
    std::fs::write(&users, format!("{BOB}\n")).expect("users");
    server.hup();
    server.wait_log("users file reloaded", T).await;
    assert!(login("b-2", "bob", "hunter2").await, "{}", server.log());
    assert!(
        !login("a-2", "alice", "secret").await,
        "alice was taken out"
    );
    // A cut line: nothing changes.
    std::fs::write(&users, format!("{ALICE}\nbob:$6$+WrkT2PZ5wWtbE+1$\n")).expect("users");
    server.hup();
    server.wait_log("users file reload failed", T).await;
    assert!(server.log().contains("line 2"), "{}", server.log());
    assert!(login("b-3", "bob", "hunter2").await);
    assert!(!login("a-3", "alice", "secret").await);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
