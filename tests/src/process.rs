//! Child processes in tests: their stderr, collected in the background.

use std::io::Read;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Collects a child's stderr in the background.
pub fn capture_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    collect(child.stderr.take().expect("piped stderr"))
}

/// Collects a child's stdout in the background.
pub fn capture_stdout(child: &mut Child) -> Arc<Mutex<String>> {
    collect(child.stdout.take().expect("piped stdout"))
}

/// Reads `pipe` to its end into a shared string, on a thread.
fn collect(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("log lock")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    log
}

/// Waits until `log` contains `text`.
pub fn wait_for(log: &Mutex<String>, text: &str, limit: Duration) {
    let start = Instant::now();
    while !log.lock().expect("log lock").contains(text) {
        assert!(
            start.elapsed() < limit,
            "no {text:?} in:\n{}",
            log.lock().expect("log lock")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit and collects its output; kills it and panics
/// if it has not exited within `limit`.
pub fn output_within(child: Child, limit: Duration) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the child"),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            let out = rx.recv().map(|o| o.ok());
            panic!("the child did not exit within {limit:?}: {out:?}");
        }
    }
}

/// A `statestore serve` child process, killed (SIGKILL) when dropped.
pub struct Server {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `cmd` (stdout ignored, stderr collected) and waits until its
    /// embedded broker listens; panics with its log if it exits first.
    pub fn spawn(cmd: std::process::Command) -> Server {
        Server::spawn_until(cmd, "embedded MQTT broker listening")
    }

    /// Starts `cmd` and waits until its log says `ready`.
    pub fn spawn_until(mut cmd: std::process::Command, ready: &str) -> Server {
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start statestore");
        let log = capture_stderr(&mut child);
        let mut s = Server { child, log };
        let start = Instant::now();
        while !s.log().contains(ready) {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("statestore exited ({status}):\n{}", s.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "not ready:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it SIGHUP (reload).
    pub fn hup(&self) {
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -HUP");
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }

    /// Waits until its log contains `text` (without blocking the runtime):
    /// for lines caused by another connection's traffic, which the log
    /// may show only after this connection's reply.
    pub async fn wait_log(&self, text: &str, limit: Duration) {
        let start = Instant::now();
        while !self.log().contains(text) {
            assert!(start.elapsed() < limit, "no {text:?} in:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its resident memory (VmRSS), KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The most resident memory it has had so far (VmHWM), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/<pid>/status"))
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Kills it with SIGKILL (what dropping it does).
    pub fn kill9(self) {}
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}
