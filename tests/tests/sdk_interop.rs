//! Interop: the unmodified Azure IoT Operations Rust SDK (crates.io
//! `azure_iot_operations_services` with its state store and leased lock
//! clients) against the store in both modes: `statestore serve --broker` on
//! a real mosquitto, and `statestore serve` with its embedded broker. Every
//! scenario (`statestore_tests::scenarios`) runs in both, each on a store of
//! its own; `host/tests/cluster.rs` runs them against cluster replicas.

use azure_iot_operations_services::state_store::{Operation, SetOptions};
use statestore_tests::broker::{Deployment, Mode};
use statestore_tests::scenarios::{T, next};
use statestore_tests::sdk::Sdk;

/// Runs each scenario against both modes, as `external::name` and `embedded::name`.
macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod external {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::run(super::Mode::External, statestore_tests::scenarios::$name).await
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::run(super::Mode::Embedded, statestore_tests::scenarios::$name).await
                }
            )*
        }
    };
}

statestore_tests::sdk_scenarios!(in_both_modes);

/// Runs `scenario` on a store of its own in `mode`, then stops it (an
/// error in the store fails the test).
async fn run<F: std::future::Future<Output = ()>>(mode: Mode, scenario: impl FnOnce(u16) -> F) {
    let store = Deployment::start(mode).await;
    scenario(store.port()).await;
    store.stop().await;
}

/// An operator's `BrokerAuthorization` policy (`examples/authorization.yaml`)
/// in the embedded broker, with `--users-file` users: the unmodified SDK
/// connects as a user, sets, gets, observes and lists the keys the policy
/// gives it, and is refused the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_under_an_authorization_policy() {
    use statestore::auth::policy::{Policy, PolicyCell};
    use statestore::transport::embedded::{BrokerOptions, EmbeddedServer, Route};
    let dir = std::env::temp_dir().join(format!("statestore-sdk-authz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // mosquitto_passwd 2.0 hashes: sensor-1 and operator, password "secret".
    let hash = "$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==";
    let users = dir.join("users");
    std::fs::write(&users, format!("sensor-1:{hash}\noperator:{hash}\n")).expect("users");
    let policy = Policy::parse(include_str!("../../examples/authorization.yaml"), false)
        .expect("the example policy");
    let mut store =
        statestore::store::StoreOptions::volatile("StateStore", "statestore-under-test");
    store.authorization = Some(policy.store_rules());
    let tenant = statestore::store::tenant::Tenant::open(
        "default",
        statestore_tests::wasm_runtime().clone(),
        &store,
    )
    .expect("tenant");
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
            users: Some(statestore::auth::users::UsersCell::new(
                statestore::auth::users::Users::load(&users).expect("users"),
            )),
            policy: Some(PolicyCell::new(Some(policy))),
            ..BrokerOptions::default()
        },
    )
    .await
    .expect("the embedded broker starts");
    let port = server.local_addr().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let sensor = Sdk::connect_as(port, "s1", Some(("sensor-1", "secret"))).await;
    let operator = Sdk::connect_as(port, "op", Some(("operator", "secret"))).await;
    let own = b"sensors/s1/temp".to_vec();
    let mut obs = sensor
        .ss
        .observe(own.clone(), T)
        .await
        .expect("observe its own key")
        .response;
    sensor
        .ss
        .set(own.clone(), b"21".to_vec(), T, None, SetOptions::default())
        .await
        .expect("set its own key");
    assert_eq!(
        next(&mut obs).await.operation,
        Operation::Set(b"21".to_vec())
    );
    assert_eq!(
        sensor.ss.get(own.clone(), T).await.expect("get").response,
        Some(b"21".to_vec())
    );
    // The operator may write anything; the sensor reads its organisation's.
    operator
        .ss
        .set(
            b"contoso/limit".to_vec(),
            b"30".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("operator set");
    assert_eq!(
        sensor
            .ss
            .get(b"contoso/limit".to_vec(), T)
            .await
            .expect("get")
            .response,
        Some(b"30".to_vec())
    );
    // Refused: writing its organisation's key, another sensor's, anything else.
    for key in [&b"contoso/limit"[..], b"sensors/s2/temp", b"elsewhere"] {
        let e = sensor
            .ss
            .set(key.to_vec(), b"x".to_vec(), T, None, SetOptions::default())
            .await
            .expect_err("refused");
        assert!(
            format!("{e:?}").to_lowercase().contains("not authorized")
                || format!("{e:?}").contains("NotAuthorized"),
            "{e:?}"
        );
    }
    // SCAN (list_keys) lists only what the sensor may read.
    let mut keys = Vec::new();
    let mut pager = sensor.ss.list_keys(b"*".to_vec(), T).expect("a pager");
    while let Some(page) = pager.next().await.expect("a page") {
        keys.extend(page);
    }
    drop(pager);
    keys.sort();
    assert_eq!(keys, [b"contoso/limit".to_vec(), own.clone()]);
    sensor.close().await;
    operator.close().await;
    let _ = stop.send(());
    let _ = task.await;
    let _ = std::fs::remove_dir_all(&dir);
}
