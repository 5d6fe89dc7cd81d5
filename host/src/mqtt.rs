//! MQTT5 <-> guest types, for rumqttc (v5). Every property the spec names is
//! carried both ways, unchanged.

use std::fmt;
use std::str::FromStr;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};

use crate::{InboundMessage, OutboundMessage};

/// A client certificate for our connections to a broker that
/// authenticates clients by certificate (`--client-cert`, `--client-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain (PEM), ours first.
    pub cert: std::path::PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// Sets up one of our MQTT client connections to `broker`: TLS for
/// `mqtts://` (trusting `ca_file`, else the system's roots, and proving
/// who we are with `client_cert` if given), and no Nagle delay (without it
/// every round trip waits ~40 ms for delayed ACKs).
pub(crate) fn connection_options(
    o: &mut rumqttc::v5::MqttOptions,
    broker: &BrokerUrl,
    ca_file: Option<&std::path::Path>,
    client_cert: Option<&ClientCert>,
) -> anyhow::Result<()> {
    if broker.tls {
        let config = tls_config(ca_file, client_cert)?;
        o.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
            std::sync::Arc::new(config),
        )));
    } else if client_cert.is_some() {
        anyhow::bail!(
            "a client certificate needs a TLS connection (mqtts://{}:{})",
            broker.host,
            broker.port
        );
    }
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    o.set_network_options(net);
    Ok(())
}

/// The rustls client configuration of [`connection_options`].
fn tls_config(
    ca_file: Option<&std::path::Path>,
    client_cert: Option<&ClientCert>,
) -> anyhow::Result<rustls::ClientConfig> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("cannot read CA file {}", path.display()))?;
            for c in certs {
                roots.add(c).with_context(|| {
                    format!("a certificate of CA file {} is not usable", path.display())
                })?;
            }
            anyhow::ensure!(
                !roots.is_empty(),
                "CA file {} holds no certificate",
                path.display()
            );
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            anyhow::ensure!(
                !roots.is_empty(),
                "no trusted root certificates on this system: give the broker's CA with --ca-file"
            );
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    Ok(match client_cert {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let chain = CertificateDer::pem_file_iter(&c.cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("cannot read client certificate {}", c.cert.display()))?;
            anyhow::ensure!(
                !chain.is_empty(),
                "{} holds no certificate",
                c.cert.display()
            );
            let key = PrivateKeyDer::from_pem_file(&c.key)
                .with_context(|| format!("cannot read client key {}", c.key.display()))?;
            builder.with_client_auth_cert(chain, key).with_context(|| {
                format!(
                    "client certificate {} and key {} do not go together",
                    c.cert.display(),
                    c.key.display()
                )
            })?
        }
    })
}

/// The inbound message for a request received from the broker as a client
/// (the external mode): the
/// publisher's client id is unknown (its `__srcId` says who it is) and it is
/// handled as it arrives.
pub fn inbound(p: &Publish) -> InboundMessage {
    let props = p.properties.clone().unwrap_or_default();
    InboundMessage {
        topic: String::from_utf8_lossy(&p.topic).into_owned(),
        payload: p.payload.to_vec(),
        qos: p.qos as u8,
        response_topic: props.response_topic,
        correlation_data: props.correlation_data.map(|b| b.to_vec()),
        message_expiry_interval: props.message_expiry_interval,
        content_type: props.content_type,
        payload_format_indicator: props.payload_format_indicator,
        user_properties: props.user_properties,
        client_id: None,
        received_at: None,
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// The PUBLISH properties for an outbound message.
pub fn properties(m: &OutboundMessage) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: m.payload_format_indicator,
        message_expiry_interval: m.message_expiry_interval,
        topic_alias: None,
        response_topic: m.response_topic.as_deref().map(str::to_string),
        correlation_data: m.correlation_data.clone(),
        user_properties: m
            .user_properties
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        subscription_identifiers: Vec::new(),
        content_type: m.content_type.as_deref().map(str::to_string),
    }
}

/// QoS from its number (the guest only asks for 0 or 1).
pub fn qos(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// A broker address: `mqtt://HOST:PORT` or `mqtts://HOST:PORT` (TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    /// Host name or IP address.
    pub host: String,
    /// TCP port (default 1883, or 8883 with TLS).
    pub port: u16,
    /// Connect with TLS.
    pub tls: bool,
}

impl BrokerUrl {
    /// Whether the host is this machine (`localhost` or a loopback address).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl FromStr for BrokerUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("mqtt://") {
            (false, r)
        } else if let Some(r) = s.strip_prefix("mqtts://") {
            (true, r)
        } else if s.contains("://") {
            return Err(format!("{s:?}: the scheme must be mqtt:// or mqtts://"));
        } else {
            (false, s)
        };
        let rest = rest.trim_end_matches('/');
        let default_port = if tls { 8883 } else { 1883 };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| format!("{s:?}: {p:?} is not a port number"))?;
                (h, port)
            }
            _ => (rest, default_port),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{s:?}: no host name"));
        }
        Ok(BrokerUrl {
            host: host.to_string(),
            port,
            tls,
        })
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u: BrokerUrl = "mqtt://127.0.0.1:1884"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((u.host.as_str(), u.port, u.tls), ("127.0.0.1", 1884, false));
        let u: BrokerUrl = "mqtts://broker.local"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (u.host.as_str(), u.port, u.tls),
            ("broker.local", 8883, true)
        );
        let u: BrokerUrl = "localhost".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((u.host.as_str(), u.port), ("localhost", 1883));
        let u: BrokerUrl = "mqtt://[::1]:1883"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.host, "::1");
        assert_eq!(u.to_string(), "mqtt://[::1]:1883");
        assert!(u.is_loopback());
        let loopback = |s: &str| s.parse::<BrokerUrl>().is_ok_and(|u| u.is_loopback());
        assert!(loopback("mqtt://localhost") && loopback("mqtt://127.0.0.2:1"));
        assert!(!loopback("mqtt://broker.local") && !loopback("mqtt://10.0.0.1"));
        assert!("http://x".parse::<BrokerUrl>().is_err());
        assert!("mqtt://x:99999".parse::<BrokerUrl>().is_err());
        assert!("mqtt://:1883".parse::<BrokerUrl>().is_err());
    }
}
