//! What the client commands share: how they reach the store, and how they
//! print.

use std::io::{StdoutLock, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use statestore::client::{self, Client, ClientOptions, Encoding, Output};
use statestore::config;
use statestore::mqtt::BrokerUrl;

use super::units::parse_duration_ms;
use super::{client_cert, parse_url, runtime};

/// How the client commands reach the store.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// The broker the store serves on: `mqtt://HOST:PORT` or
    /// `mqtts://HOST:PORT`. Several, comma-separated (a cluster's
    /// replicas): the first that answers is used, and the next when it
    /// fails or answers 503 (no leader).
    #[arg(short, long, help_heading = "Connection", value_parser = parse_url, value_delimiter = ',', default_value = "mqtt://127.0.0.1:1883", env = "STATESTORE_BROKER")]
    pub broker: Vec<BrokerUrl>,
    /// Our MQTT client id (also the lock holder). Default: statestore-cli-<pid>.
    #[arg(long, env = "STATESTORE_CLIENT_ID", help_heading = "Connection")]
    pub client_id: Option<String>,
    /// MQTT user name.
    #[arg(short, long, env = "STATESTORE_USERNAME", help_heading = "Connection")]
    pub username: Option<String>,
    /// A file whose first line is the MQTT password.
    #[arg(long, env = "STATESTORE_PASSWORD_FILE", help_heading = "Connection")]
    pub password_file: Option<PathBuf>,
    /// CA certificate (PEM) for `mqtts://` (default: the system's roots).
    #[arg(long, env = "STATESTORE_CA_FILE", help_heading = "Connection")]
    pub ca_file: Option<PathBuf>,
    /// Our client certificate chain (PEM), for a broker that authenticates
    /// clients by certificate (`mqtts://` only; with --client-key).
    #[arg(
        long,
        value_name = "FILE",
        requires = "client_key",
        env = "STATESTORE_CLIENT_CERT",
        help_heading = "Connection"
    )]
    pub client_cert: Option<PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(
        long,
        value_name = "FILE",
        requires = "client_cert",
        env = "STATESTORE_CLIENT_KEY",
        help_heading = "Connection"
    )]
    pub client_key: Option<PathBuf>,
    /// How long to wait for the broker and for each reply (`10s`, `500ms`;
    /// a bare number is ms).
    #[arg(long, alias = "timeout-ms", help_heading = "Connection", value_name = "DURATION", default_value = "10s", value_parser = parse_duration_ms)]
    pub timeout: Duration,
    /// Keys and values are hexadecimal on the command line and in the output.
    #[arg(long, conflicts_with = "base64", help_heading = "Output")]
    pub hex: bool,
    /// Keys and values are base64 on the command line and in the output.
    #[arg(long, help_heading = "Output")]
    pub base64: bool,
    /// `text`, or `json` (get, keys, watch): keys and values as strings,
    /// `key_base64` / `value_base64` for bytes that are not UTF-8.
    #[arg(short, long, value_enum, default_value_t = OutputArg::Text, help_heading = "Output")]
    pub output: OutputArg,
}

/// `--output` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputArg {
    Text,
    Json,
}

impl ClientArgs {
    /// The encoding of keys and values on the command line.
    pub fn encoding(&self) -> Encoding {
        if self.hex {
            Encoding::Hex
        } else if self.base64 {
            Encoding::Base64
        } else {
            Encoding::Raw
        }
    }

    /// `--output`.
    pub fn output(&self) -> Output {
        match self.output {
            OutputArg::Text => Output::Text,
            OutputArg::Json => Output::Json,
        }
    }

    /// A key from the command line, decoded.
    pub fn key(&self, k: &str) -> Result<Vec<u8>> {
        self.encoding().decode(k.as_bytes()).context("the key")
    }

    /// Where and how to connect.
    pub fn options(&self) -> Result<ClientOptions> {
        let credentials = match (&self.username, &self.password_file) {
            (Some(u), Some(p)) => Some((u.clone(), config::read_secret(p)?)),
            (Some(u), None) => Some((u.clone(), String::new())),
            (None, Some(_)) => {
                anyhow::bail!("--password-file needs --username (or STATESTORE_USERNAME)")
            }
            (None, None) => None,
        };
        Ok(ClientOptions {
            brokers: self.broker.clone(),
            client_id: self
                .client_id
                .clone()
                .unwrap_or_else(|| format!("statestore-cli-{}", std::process::id())),
            credentials,
            ca_file: self.ca_file.clone(),
            client_cert: client_cert(&self.client_cert, &self.client_key),
            timeout: self.timeout,
        })
    }
}

/// Connects, runs `command` with the connection and stdout, and closes.
/// `not_applied` is what exit code 1 means, said on stderr (stdout stays
/// the data).
pub fn session(
    args: &ClientArgs,
    not_applied: Option<&str>,
    command: impl AsyncFnOnce(&mut Client, &mut StdoutLock<'static>) -> Result<u8>,
) -> Result<u8> {
    let opts = args.options()?;
    runtime()?.block_on(async move {
        let mut c = Client::connect(&opts).await?;
        let mut out = std::io::stdout().lock();
        let code = command(&mut c, &mut out).await?;
        out.flush()?;
        c.close().await;
        if code == client::NOT_APPLIED
            && let Some(why) = not_applied
        {
            eprintln!("statestore: {why}");
        }
        Ok(code)
    })
}

/// A value argument: itself, `@FILE`, or stdin (absent or `-`), decoded.
pub fn value_arg(value: Option<&str>, enc: Encoding) -> Result<Vec<u8>> {
    use std::io::Read;
    let raw = match value {
        None | Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read stdin")?;
            buf
        }
        Some(v) => match v.strip_prefix('@') {
            Some(path) => std::fs::read(path).with_context(|| format!("cannot read {path}"))?,
            None => v.as_bytes().to_vec(),
        },
    };
    enc.decode(&raw)
}
