//! The embedded broker's listeners: the plain one, and the TLS one whose
//! certificate SIGHUP reloads.

use super::*;

/// A listener of the embedded broker, within `limits`.
pub(super) fn listener_builder(name: &str, at: SocketAddr, limits: &BrokerLimits) -> Builder {
    Builder::new()
        .name(name)
        .laddr(at)
        .nodelay(true)
        .reuseaddr(Some(true))
        .max_packet_size(limits.max_packet)
        .max_inflight(NonZeroU16::new(256).unwrap_or(NonZeroU16::MIN))
        // Topic aliases both ways (mosquitto allows 10).
        .max_topic_aliases(64)
        .max_mqueue_len(limits.max_queued)
        .max_session_expiry_interval(limits.max_session_expiry)
        .max_connections(limits.max_connections)
        // Every client passes the authentication hook (the limit per
        // address is checked there); the hook allows anonymous ones.
        .allow_anonymous(false)
        // Do not give messages without an expiry one of 300 s.
        .message_expiry_interval(Duration::ZERO)
}

/// The TLS listener, whose certificate, key and client CA files SIGHUP can
/// read again.
///
/// rmqtt builds a listener's TLS acceptor once, from the files, and runs
/// its own accept loop, so a reload binds a second listener on the same
/// address (`SO_REUSEPORT`, which only a process of the same user can
/// share), with the files as they are now, starts its accept loop, and
/// only then stops the old one. Connections already made keep their
/// session and their TLS session; new handshakes get the new certificate.
/// Files that do not load change nothing.
#[derive(Clone)]
pub struct TlsReload {
    inner: Arc<tokio::sync::Mutex<TlsRunning>>,
    addr: SocketAddr,
}

struct TlsRunning {
    scx: ServerContext,
    spec: TlsListener,
    limits: BrokerLimits,
    /// The listener id of the running accept loop (2 or 3, in turn: rmqtt
    /// refuses an id already registered, and keeps each listener's
    /// settings by id).
    id: rmqtt::types::ListenerId,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TlsReload {
    /// Binds the TLS listener and starts its accept loop.
    pub(super) fn start(
        scx: &ServerContext,
        spec: &TlsListener,
        limits: BrokerLimits,
    ) -> Result<TlsReload> {
        let listener = tls_listener(spec.listen, spec, &limits)?;
        let addr = listener.local_addr()?;
        let id = 2;
        let server = MqttServer::new(scx.clone())
            .listener_by_id(listener, id)
            .build();
        let task = tokio::spawn(run_broker(server));
        Ok(TlsReload {
            inner: Arc::new(tokio::sync::Mutex::new(TlsRunning {
                scx: scx.clone(),
                spec: spec.clone(),
                limits,
                id,
                task: Some(task),
            })),
            addr,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reads the certificate, key and client CA files again and serves new
    /// connections with them; on an error nothing changes.
    pub async fn reload(&self) -> Result<()> {
        let mut running = self.inner.lock().await;
        let Some(old) = running.task.take() else {
            return Err(anyhow!("the TLS listener has stopped"));
        };
        let listener = match tls_listener(self.addr, &running.spec, &running.limits) {
            Ok(l) => l,
            Err(e) => {
                running.task = Some(old);
                return Err(e);
            }
        };
        let id = if running.id == 2 { 3 } else { 2 };
        running.scx.listen_cfgs.remove(&id);
        let server = MqttServer::new(running.scx.clone())
            .listener_by_id(listener, id)
            .build();
        running.task = Some(tokio::spawn(run_broker(server)));
        running.id = id;
        // The new loop accepts already; the old socket closes.
        old.abort();
        let _ = old.await;
        Ok(())
    }

    /// Stops accepting TLS connections.
    pub(super) async fn stop(&self) {
        if let Some(task) = self.inner.lock().await.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// A TLS listener on `at` with the files `spec` names, as they are now.
pub(super) fn tls_listener(
    at: SocketAddr,
    spec: &TlsListener,
    limits: &BrokerLimits,
) -> Result<rmqtt::net::Listener> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut b = listener_builder("statestore/tls", at, limits)
        // A reload binds beside the running listener.
        .reuseport(Some(true))
        .tls_cert(Some(path(&spec.cert)))
        .tls_key(Some(path(&spec.key)));
    if let Some(ca) = &spec.client_ca {
        b = b
            .tls_cross_certificate(true)
            .tls_client_ca_certs(Some(path(ca)))
            // The certificate's common name: a principal.
            .collect_cert_info(true);
    }
    b.bind()
        .with_context(|| format!("cannot listen on {at} (is the port in use?)"))?
        .tls()
        .with_context(|| {
            format!(
                "cannot set up TLS with --tls-cert {} and --tls-key {}{}",
                spec.cert.display(),
                spec.key.display(),
                spec.client_ca
                    .as_ref()
                    .map(|c| format!(" and --client-ca {}", c.display()))
                    .unwrap_or_default()
            )
        })
}
