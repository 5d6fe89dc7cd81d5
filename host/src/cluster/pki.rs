//! The cluster's own certificate authority, for mutual TLS between
//! replicas.
//!
//! `statestore cluster certs` makes, in the cluster file's `tls_dir`, a CA
//! (`ca.pem`, `ca.key`), a certificate for each replica (`replica-<id>.pem`
//! and `.key`, naming `replica-<id>.statestore`) and one for the operator's
//! tools (`operator.pem`, `.key`, naming `operator.statestore`). A replica
//! needs `ca.pem` and its own pair; `ca.key` is needed only to issue more
//! (keep it off the replicas).
//!
//! On a link, both ends show a certificate the cluster CA signed: the side
//! that connects checks that the other is the replica it meant to reach
//! (the name of the id it dials), the side that accepts checks that the id
//! a peer claims in its hello is the one its certificate names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};
use tokio::net::TcpStream;

/// The name a certificate gives replica `id` (0: the operator's tools).
pub fn name(id: u64) -> String {
    if id == 0 {
        "operator.statestore".to_string()
    } else {
        format!("replica-{id}.statestore")
    }
}

/// The file stem of `id`'s certificate and key in the TLS directory.
fn stem(id: u64) -> String {
    if id == 0 {
        "operator".to_string()
    } else {
        format!("replica-{id}")
    }
}

/// Where `id`'s certificate and key are in `dir`.
pub fn files(dir: &Path, id: u64) -> (PathBuf, PathBuf) {
    let stem = stem(id);
    (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    )
}

/// One end's TLS: who it is, and its client and server configurations.
#[derive(Debug)]
pub struct Tls {
    id: u64,
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| {
        format!(
            "cannot read {} (`statestore cluster certs --cluster FILE` makes the cluster's certificates)",
            path.display()
        )
    })
}

impl Tls {
    /// Loads `id`'s certificate and key and the cluster CA from `dir`.
    pub fn load(dir: &Path, id: u64) -> Result<Tls> {
        let ca = read(&dir.join("ca.pem"))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            roots
                .add(c.context("ca.pem")?)
                .context("the cluster CA in ca.pem")?;
        }
        if roots.is_empty() {
            bail!("{} holds no certificate", dir.join("ca.pem").display());
        }
        let roots = Arc::new(roots);
        let (cert_path, key_path) = files(dir, id);
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read(&cert_path)?)
                .collect::<Result<_, _>>()
                .with_context(|| format!("the certificate {}", cert_path.display()))?;
        let Some(own) = chain.first() else {
            bail!("{} holds no certificate", cert_path.display());
        };
        if !holds(own, id) {
            bail!(
                "{} does not name {} (made for another replica?)",
                cert_path.display(),
                name(id)
            );
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&key_path)?)
            .with_context(|| format!("the key {}", key_path.display()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .with_context(|| {
                format!("the key {} for {}", key_path.display(), cert_path.display())
            })?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .context("the cluster CA")?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .with_context(|| {
                format!("the key {} for {}", key_path.display(), cert_path.display())
            })?;
        // Links are long-lived and never resumed: no session tickets.
        server.send_tls13_tickets = 0;
        Ok(Tls {
            id,
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// Whom this end's certificate names.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A TLS session on `tcp` with replica `peer`: its certificate must be
    /// the cluster CA's and name `peer`.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        peer: u64,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let server = ServerName::try_from(name(peer)).context("a replica's name")?;
        tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(server, tcp)
            .await
            .with_context(|| format!("TLS with what should be replica {peer}"))
    }

    /// A TLS session on `tcp` with whoever connected, and its certificate
    /// (the cluster CA's; whom it names is checked against the hello).
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> Result<(
        tokio_rustls::server::TlsStream<TcpStream>,
        CertificateDer<'static>,
    )> {
        let stream = tokio_rustls::TlsAcceptor::from(self.server.clone())
            .accept(tcp)
            .await
            .context("TLS handshake")?;
        let cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .cloned()
            .context("no client certificate")?;
        Ok((stream, cert))
    }
}

/// Whether `cert` names `id` (its signature is checked by the handshake).
pub fn holds(cert: &CertificateDer<'_>, id: u64) -> bool {
    let Ok(parsed) = rustls::server::ParsedCertificate::try_from(cert) else {
        return false;
    };
    let Ok(server) = ServerName::try_from(name(id)) else {
        return false;
    };
    rustls::client::verify_server_name(&parsed, &server).is_ok()
}

/// Makes in `dir` what is missing of: the cluster CA, and a certificate
/// and key for each of `ids` and for the operator's tools. Returns the
/// files it wrote. A CA already there issues the new ones.
pub fn make(dir: &Path, ids: &[u64]) -> Result<Vec<PathBuf>> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let issuer = match (ca_pem.exists(), ca_key.exists()) {
        (true, true) => {
            let key = KeyPair::from_pem(&std::fs::read_to_string(&ca_key)?)
                .with_context(|| format!("the CA key {}", ca_key.display()))?;
            Issuer::from_ca_cert_pem(&std::fs::read_to_string(&ca_pem)?, key)
                .with_context(|| format!("the CA certificate {}", ca_pem.display()))?
        }
        (false, false) => {
            let mut params = CertificateParams::new(Vec::new())?;
            params
                .distinguished_name
                .push(DnType::CommonName, "statestore cluster CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let key = KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            write(&ca_key, &key.serialize_pem(), true)?;
            write(&ca_pem, &cert.pem(), false)?;
            written.extend([ca_pem.clone(), ca_key.clone()]);
            Issuer::new(params, key)
        }
        (true, false) => bail!(
            "{} is there but not {}: new certificates need the CA's key (or remove both for a new CA, and make every certificate again)",
            ca_pem.display(),
            ca_key.display()
        ),
        (false, true) => bail!("{} is there but not {}", ca_key.display(), ca_pem.display()),
    };
    for &id in [0].iter().chain(ids) {
        let (cert_path, key_path) = files(dir, id);
        if cert_path.exists() && key_path.exists() {
            continue;
        }
        let mut params = CertificateParams::new(vec![name(id)])?;
        params.distinguished_name.push(DnType::CommonName, name(id));
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // A replica is both: it connects to its peers, and they to it.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        write(&key_path, &key.serialize_pem(), true)?;
        write(&cert_path, &cert.pem(), false)?;
        written.extend([cert_path, key_path]);
    }
    Ok(written)
}

/// Writes `text` to a new file `path` (only its owner may read it when
/// `private`).
fn write(path: &Path, text: &str, private: bool) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("statestore-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn certificates_name_their_replica_and_a_second_run_adds_only_what_is_missing() {
        let dir = temp("make");
        let first = make(&dir, &[1, 2]).expect("make");
        assert_eq!(first.len(), 2 + 3 * 2, "{first:?}");
        let tls = Tls::load(&dir, 2).expect("load replica 2");
        assert_eq!(tls.id(), 2);
        Tls::load(&dir, 0).expect("the operator's");
        let cert = CertificateDer::from_pem_file(dir.join("replica-2.pem")).expect("pem");
        assert!(holds(&cert, 2));
        assert!(!holds(&cert, 1) && !holds(&cert, 0) && !holds(&cert, 22));
        // A new replica: only its pair is written, by the same CA.
        let second = make(&dir, &[1, 2, 3]).expect("again");
        assert_eq!(
            second,
            [dir.join("replica-3.pem"), dir.join("replica-3.key")]
        );
        Tls::load(&dir, 3).expect("load replica 3");
        // Keys are the owner's only.
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join("replica-3.key"))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A certificate copied under another replica's name is refused.
        std::fs::copy(dir.join("replica-1.pem"), dir.join("replica-2.pem")).expect("copy");
        let e = format!(
            "{:#}",
            Tls::load(&dir, 2).expect_err("replica 1's certificate")
        );
        assert!(e.contains("does not name replica-2.statestore"), "{e}");
        let e = format!("{:#}", Tls::load(&dir, 9).expect_err("never made"));
        assert!(e.contains("statestore cluster certs"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
