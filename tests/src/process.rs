//! Child processes in tests: their stderr, collected in the background.

use std::io::Read;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Collects a child's stderr in the background.
pub fn capture_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("piped stderr");
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
