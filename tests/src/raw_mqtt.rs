//! MQTT 5 connections written byte by byte, from a chosen loopback source
//! address (`127.0.0.2`, `127.0.0.3`, ...: every `127/8` address is the
//! loopback interface on Linux), so that tests can be several IP addresses
//! at once, send a CONNECT half way, or none at all.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A TCP connection to `127.0.0.1:port` from `source` (any port).
pub async fn tcp_from(source: IpAddr, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return;
        }
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

/// What a CONNECT says.
#[derive(Debug, Clone, Default)]
pub struct Connect<'a> {
    /// Its client id.
    pub client_id: &'a str,
    /// User name and password.
    pub credentials: Option<(&'a str, &'a str)>,
    /// Clean start 0: resume a session (with this session expiry, seconds).
    pub resume_for: Option<u32>,
}

impl Connect<'_> {
    /// The CONNECT packet.
    pub fn packet(&self) -> Vec<u8> {
        let mut body = Vec::new();
        string(b"MQTT", &mut body);
        body.push(5);
        let mut flags = if self.resume_for.is_some() { 0 } else { 0x02 };
        if self.credentials.is_some() {
            flags |= 0x80 | 0x40;
        }
        body.push(flags);
        body.extend_from_slice(&30u16.to_be_bytes());
        let mut props = Vec::new();
        if let Some(secs) = self.resume_for {
            props.push(0x11);
            props.extend_from_slice(&secs.to_be_bytes());
        }
        varint(props.len(), &mut body);
        body.extend_from_slice(&props);
        string(self.client_id.as_bytes(), &mut body);
        if let Some((user, password)) = self.credentials {
            string(user.as_bytes(), &mut body);
            string(password.as_bytes(), &mut body);
        }
        let mut packet = vec![0x10];
        varint(body.len(), &mut packet);
        packet.extend_from_slice(&body);
        packet
    }
}

/// Sends `connect` on `stream` and reads the CONNACK's reason code (0:
/// accepted); an error if the connection ends or no CONNACK comes within
/// `wait`.
pub async fn handshake(
    stream: &mut TcpStream,
    connect: &Connect<'_>,
    wait: Duration,
) -> Result<u8, String> {
    stream
        .write_all(&connect.packet())
        .await
        .map_err(|e| format!("writing the CONNECT: {e}"))?;
    let read = async {
        let kind = stream.read_u8().await?;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let b = stream.read_u8().await?;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 || shift > 21 {
                break;
            }
        }
        let mut rest = vec![0u8; len];
        stream.read_exact(&mut rest).await?;
        Ok::<_, std::io::Error>((kind, rest))
    };
    match tokio::time::timeout(wait, read).await {
        Err(_) => Err(format!("no CONNACK within {wait:?}")),
        Ok(Err(e)) => Err(format!("reading the CONNACK: {e}")),
        Ok(Ok((0x20, rest))) if rest.len() >= 2 => Ok(rest[1]),
        Ok(Ok((kind, _))) => Err(format!("a packet of type {kind:#x}, not a CONNACK")),
    }
}

/// Connects from `source` and returns the CONNACK's reason code with the
/// connection (kept open while the caller holds it).
pub async fn connect_from(
    source: IpAddr,
    port: u16,
    connect: &Connect<'_>,
) -> Result<(u8, TcpStream), String> {
    let mut stream = tcp_from(source, port)
        .await
        .map_err(|e| format!("connecting from {source}: {e}"))?;
    let code = handshake(&mut stream, connect, Duration::from_secs(10)).await?;
    Ok((code, stream))
}

/// Whether the server has closed `stream` (reads end), waiting at most
/// `wait`; bytes it sends first are skipped.
pub async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 256];
    let until = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}
