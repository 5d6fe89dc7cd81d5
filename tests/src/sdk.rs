//! The unmodified Azure IoT Operations Rust SDK (crates.io
//! `azure_iot_operations_services`) as a test client: one session and its
//! state store client.

use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::{
    MqttConnectionSettings, MqttConnectionSettingsBuilder,
};
use azure_iot_operations_mqtt::session::reconnect_policy::ExponentialBackoffWithJitter;
use azure_iot_operations_mqtt::session::{
    Session, SessionError, SessionExitHandle, SessionOptionsBuilder,
};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store;
use tokio::task::JoinHandle;

/// An SDK session and its state store client.
pub struct Sdk {
    /// The state store client.
    pub ss: Arc<state_store::Client>,
    /// Ends the session.
    pub exit: SessionExitHandle,
    run: JoinHandle<Result<(), SessionError>>,
    /// Its MQTT client id.
    pub id: String,
}

/// Plain MQTT to 127.0.0.1:`port` as client `id`.
pub fn plain(port: u16, id: &str) -> MqttConnectionSettingsBuilder {
    MqttConnectionSettingsBuilder::default()
        .client_id(id)
        .hostname("127.0.0.1")
        .tcp_port(port)
        .use_tls(false)
        .keep_alive(Duration::from_secs(10))
        .clean_start(true)
        .session_expiry(Duration::from_secs(60))
}

/// Waits up to `limit` for `monitor`'s session to connect. The SDK's own
/// `SessionMonitor::connected` can miss the connection it waits for: it
/// reads the state, then waits for the next change, and a CONNACK that
/// lands between the two (the waiting thread preempted on a busy machine)
/// leaves it waiting for a change that already happened. Its state is
/// read again every 100 ms, so a missed wake-up costs that much, not the
/// whole limit.
async fn connected(
    monitor: &azure_iot_operations_mqtt::session::SessionMonitor,
    limit: Duration,
) -> Result<(), tokio::time::error::Elapsed> {
    tokio::time::timeout(limit, async {
        while !monitor.is_connected() {
            let _ = tokio::time::timeout(Duration::from_millis(100), monitor.connected()).await;
        }
    })
    .await
}

impl Sdk {
    /// A client of the store on 127.0.0.1:`port`.
    pub async fn connect(port: u16, id: &str) -> Sdk {
        Sdk::connect_as(port, id, None).await
    }

    /// [`Sdk::connect`] with a user name and password, if given.
    pub async fn connect_as(port: u16, id: &str, user: Option<(&str, &str)>) -> Sdk {
        let mut b = plain(port, id);
        if let Some((name, password)) = user {
            b = b.username(name.to_string()).password(password.to_string());
        }
        Sdk::start(
            b.build().expect("mqtt settings"),
            Some(10),
            Duration::from_secs(1),
        )
        .await
    }

    /// Connects with `settings`, reconnecting up to `attempts` times (none:
    /// for ever) waiting at most `max_wait` between them.
    pub async fn start(
        settings: MqttConnectionSettings,
        attempts: Option<u32>,
        max_wait: Duration,
    ) -> Sdk {
        let id = settings.client_id().to_string();
        let options = SessionOptionsBuilder::default()
            .connection_settings(settings)
            .reconnect_policy(Box::new(ExponentialBackoffWithJitter {
                max_wait,
                max_reconnect_attempts: attempts,
            }))
            .aio_broker_features(None)
            .build()
            .expect("session options");
        let session = Session::new(options).expect("session");
        let monitor = session.create_session_monitor();
        let ss = state_store::Client::new(
            ApplicationContextBuilder::default()
                .build()
                .expect("application context"),
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default()
                .build()
                .expect("client options"),
        )
        .expect("state store client");
        let exit = session.create_exit_handle();
        let run = tokio::spawn(session.run());
        if connected(&monitor, Duration::from_secs(10)).await.is_err() {
            panic!("the SDK client {id} did not connect in 10 s");
        }
        Sdk {
            ss: Arc::new(ss),
            exit,
            run,
            id,
        }
    }

    /// Shuts the client and its session down.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.ss.shutdown()).await;
        if self.exit.try_exit().is_err() {
            self.exit.force_exit();
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.run).await;
    }
}
