//! Links between real processes that a test can cut and heal: a TCP proxy
//! on loopback in front of one address. A replica's peer links are one
//! connection per direction (each replica sends on its own outbound
//! connection), so one proxy per ordered pair of replicas cuts one
//! direction: cut every proxy *into* the leader and it still sends (its
//! entries reach the followers) but hears nothing back.
//!
//! A cut closes the connections the proxy carries and every new one at
//! once (the sender sees its link break and reconnects, and fails, until
//! the heal); nothing is delivered half.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// A proxy to one address, cut or healed at will.
#[derive(Debug)]
pub struct Proxy {
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    carried: Arc<Mutex<Vec<AbortHandle>>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free loopback port to `to`, carrying traffic.
    pub async fn start(to: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let addr = listener.local_addr().expect("its address");
        let cut = Arc::new(AtomicBool::new(false));
        let carried: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let task = tokio::spawn({
            let cut = cut.clone();
            let carried = carried.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: closed at once
                    }
                    let carry = tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(to).await else {
                            return;
                        };
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    });
                    let mut carried = carried.lock().expect("not poisoned");
                    carried.retain(|h| !h.is_finished());
                    carried.push(carry.abort_handle());
                }
            }
        });
        Proxy {
            addr,
            cut,
            carried,
            task,
        }
    }

    /// Cuts the link: what it carries is closed, and so is every new
    /// connection until [`Proxy::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for h in self.carried.lock().expect("not poisoned").drain(..) {
            h.abort();
        }
    }

    /// Carries traffic again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        for h in self.carried.lock().expect("not poisoned").drain(..) {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(std::time::Duration::from_secs(2), s.read_exact(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(buf.to_vec())
    }

    #[tokio::test]
    async fn a_cut_link_carries_nothing_until_it_heals() {
        let p = Proxy::start(echo().await).await;
        assert_eq!(round_trip(p.addr).await.as_deref(), Some(&b"ping"[..]));
        // A connection open at the cut is closed.
        let mut open = TcpStream::connect(p.addr).await.expect("connect");
        open.write_all(b"x").await.expect("write");
        let mut one = [0u8; 1];
        open.read_exact(&mut one).await.expect("echoed");
        p.cut();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            open.read_to_end(&mut rest),
        )
        .await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        assert_eq!(round_trip(p.addr).await, None);
        p.heal();
        assert_eq!(round_trip(p.addr).await.as_deref(), Some(&b"ping"[..]));
    }
}
