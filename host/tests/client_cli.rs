//! The client commands (`get`, `set`, `del`, `vdel`, `keys`, `watch`, `lock`)
//! through the real binary, against both modes: the embedded broker, and
//! `serve --broker` on a real mosquitto. Output, exit codes (0 done, 1 not
//! found or not applied, 2 error), binary keys and values, stdin and @file.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use statestore_tests::broker::{Mosquitto, free_port};
use statestore_tests::process::Server;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statestore"));
    c.env(
        "STATESTORE_CACHE_DIR",
        std::env::temp_dir().join("statestore-client-cli-test-cache"),
    );
    c
}

/// A store to talk to, in one mode or the other.
struct Store {
    _server: Server,
    _mosquitto: Option<Mosquitto>,
    url: String,
}

fn embedded() -> Store {
    let port = free_port();
    let mut c = bin();
    c.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    Store {
        _server: Server::spawn(c),
        _mosquitto: None,
        url: format!("mqtt://127.0.0.1:{port}"),
    }
}

fn external() -> Store {
    let m = Mosquitto::start();
    let url = format!("mqtt://127.0.0.1:{}", m.port);
    let mut c = bin();
    c.args([
        "serve",
        "--broker",
        &url,
        "--client-id",
        "statestore-cli-test",
    ]);
    Store {
        _server: Server::spawn_until(c, "subscribed; serving"),
        _mosquitto: Some(m),
        url,
    }
}

impl Store {
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, None)
    }

    fn run_with(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut c = bin();
        c.arg(args[0])
            .args(["--broker", &self.url])
            .args(&args[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run statestore");
        let mut input = child.stdin.take().expect("stdin");
        if let Some(bytes) = stdin {
            input.write_all(bytes).expect("write stdin");
        }
        drop(input);
        child.wait_with_output().expect("statestore ran")
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Starts a `watch` and returns once it has registered (its stderr says
/// so), with its stderr collected.
fn watching(mut w: std::process::Command) -> std::process::Child {
    w.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = w.spawn().expect("watch");
    let log = statestore_tests::process::capture_stderr(&mut child);
    statestore_tests::process::wait_for(&log, "statestore: watching ", Duration::from_secs(30));
    child
}

/// A watcher's output once it has ended (within a minute).
fn ended(watcher: std::process::Child) -> Output {
    statestore_tests::process::output_within(watcher, Duration::from_secs(60))
}

fn scenario(store: &Store) {
    // set prints the version; get prints the value alone.
    let o = store.run(&["set", "greeting", "hello world"]);
    assert_eq!(code(&o), 0, "{o:?}");
    let version = String::from_utf8(o.stdout).expect("utf-8");
    assert_eq!(version.trim().split(':').count(), 3, "{version}");
    let o = store.run(&["get", "greeting"]);
    assert_eq!((code(&o), &o.stdout[..]), (0, &b"hello world"[..]));
    // Not found, and a condition that keeps the value: 1.
    assert_eq!(code(&store.run(&["get", "absent"])), 1);
    assert_eq!(code(&store.run(&["set", "greeting", "x", "--nx"])), 1);
    assert_eq!(store.run(&["get", "greeting"]).stdout, b"hello world");
    // Binary keys and values: hex and base64 both ways; stdin and @file.
    let o = store.run(&["set", "--hex", "00ff0d0a", "000102ff"]);
    assert_eq!(code(&o), 0, "{o:?}");
    let o = store.run(&["get", "--base64", "AP8NCg=="]);
    assert_eq!((code(&o), &o.stdout[..]), (0, &b"AAEC/w==\n"[..]));
    let binary: Vec<u8> = (0..=255).collect();
    let o = store.run_with(&["set", "from-stdin"], Some(&binary));
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(store.run(&["get", "from-stdin"]).stdout, binary);
    let file = std::env::temp_dir().join(format!(
        "statestore-cli-{}-{}",
        std::process::id(),
        store.url.rsplit(':').next().unwrap_or("0")
    ));
    std::fs::write(&file, b"from a file").expect("write");
    let at = format!("@{}", file.display());
    assert_eq!(code(&store.run(&["set", "from-file", &at])), 0);
    assert_eq!(store.run(&["get", "from-file"]).stdout, b"from a file");
    let _ = std::fs::remove_file(&file);
    // vdel: only with the right value; del: 1 when there is nothing.
    assert_eq!(code(&store.run(&["vdel", "greeting", "wrong"])), 1);
    assert_eq!(code(&store.run(&["vdel", "greeting", "hello world"])), 0);
    assert_eq!(code(&store.run(&["del", "greeting"])), 1);
    assert_eq!(code(&store.run(&["del", "from-file"])), 0);
    // Errors: 2, with a message.
    let o = store.run(&["get", "--hex", "not-hex"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("hex"), "{o:?}");
    let o = store.run(&["set", "k", "v", "--fencing-token", "garbage"]);
    assert_eq!(code(&o), 2, "{o:?}");
}

fn watch_and_lock(store: &Store) {
    // watch: one line per change, until --count.
    let mut w = bin();
    w.args(["watch", "--broker", &store.url, "--count", "3", "w1", "w2"]);
    let watcher = watching(w);
    let v1 = store.run(&["set", "w1", "one"]);
    store.run(&["set", "other", "ignored"]);
    let v2 = store.run(&["set", "w2", "two"]);
    assert_eq!(code(&store.run(&["del", "w1"])), 0);
    let out = ended(watcher);
    assert_eq!(code(&out), 0, "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    let v = |o: &Output| String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("w1 SET one {}", v(&v1)));
    assert_eq!(lines[1], format!("w2 SET two {}", v(&v2)));
    assert!(lines[2].starts_with("w1 DELETE "), "{text}");
    // lock: the command runs with the fencing token, its exit code is ours,
    // and the lease is released after it.
    let o = store.run(&[
        "lock",
        "the-lock",
        "--ttl",
        "2000",
        "--",
        "sh",
        "-c",
        "echo $STATESTORE_FENCING_TOKEN; exit 3",
    ]);
    assert_eq!(code(&o), 3, "{o:?}");
    let token = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(token.split(':').count(), 3, "{token}");
    assert_eq!(code(&store.run(&["get", "the-lock"])), 1, "released");
    // Held by another: not had within --wait-ms.
    assert_eq!(
        code(&store.run(&["set", "held", "someone-else", "--px", "5000"])),
        0
    );
    let o = store.run(&[
        "lock",
        "held",
        "--ttl",
        "1000",
        "--wait-ms",
        "300",
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 1, "{o:?}");
}

/// `keys`: SCAN, every page, one key per line; 1 when nothing matches.
fn keys(store: &Store) {
    for k in ["ls/b", "ls/a", "ls/c/d", "other"] {
        assert_eq!(code(&store.run(&["set", k, "v"])), 0);
    }
    assert_eq!(code(&store.run(&["set", "--hex", "6c732fff", "00"])), 0);
    let o = store.run(&["keys", "ls/*"]);
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(
        o.stdout, b"ls/a\nls/b\nls/c/d\n",
        "key order; not UTF-8 is not listed"
    );
    let o = store.run(&["keys", "--hex", "ls/?"]);
    assert_eq!(o.stdout, b"6c732f61\n6c732f62\n");
    assert_eq!(code(&store.run(&["keys", "nothing*"])), 1);
    let o = store.run(&["keys", "ls/[a"]);
    assert_eq!(code(&o), 2, "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("the pattern is not valid"),
        "{o:?}"
    );
}

#[test]
fn client_commands_against_the_embedded_broker() {
    let store = embedded();
    scenario(&store);
    watch_and_lock(&store);
    keys(&store);
}

#[test]
fn client_commands_through_mosquitto() {
    let store = external();
    scenario(&store);
    watch_and_lock(&store);
    keys(&store);
}

/// `--persist custom`: keys that match `--persist-keys` (a pattern, a
/// string, a base64 binary key) or are set with `--persist` survive a
/// restart; the others do not. And `keys` pages through more keys than a
/// page holds.
#[test]
fn persist_custom_keeps_the_matching_keys_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("statestore-custom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = || {
        let port = free_port();
        let mut c = bin();
        c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&dir)
            .args([
                "--persist",
                "custom",
                "--persist-keys",
                "keep/*",
                "--persist-keys",
                "string:config",
                "--persist-keys",
                "binary:AP8=",
                "--scan-page-keys",
                "7",
            ]);
        Store {
            _server: Server::spawn(c),
            _mosquitto: None,
            url: format!("mqtt://127.0.0.1:{port}"),
        }
    };
    let store = start();
    for k in ["keep/1", "keep/2", "config", "configx", "drop/1"] {
        assert_eq!(code(&store.run(&["set", k, "v"])), 0);
    }
    assert_eq!(code(&store.run(&["set", "--hex", "00ff", "00"])), 0);
    assert_eq!(code(&store.run(&["set", "flagged", "v", "--persist"])), 0);
    for i in 0..30 {
        assert_eq!(
            code(&store.run(&["set", &format!("keep/many/{i:02}"), "v"])),
            0
        );
    }
    drop(store); // SIGKILL: only what the journal holds comes back
    let store = start();
    for (k, want) in [
        ("keep/1", 0),
        ("keep/2", 0),
        ("config", 0),
        ("flagged", 0),
        ("configx", 1),
        ("drop/1", 1),
    ] {
        assert_eq!(code(&store.run(&["get", k])), want, "{k}");
    }
    assert_eq!(code(&store.run(&["get", "--hex", "00ff"])), 0);
    let o = store.run(&["keys", "keep/many/*"]);
    let listed = String::from_utf8(o.stdout).expect("utf-8");
    let want: String = (0..30).map(|i| format!("keep/many/{i:02}\n")).collect();
    assert_eq!(listed, want, "30 keys over pages of 7");
    let o = bin()
        .args(["serve", "--persist-keys", "x*"])
        .output()
        .expect("runs");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--persist custom"),
        "{o:?}"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_broker_is_exit_code_2() {
    let port = free_port();
    let o = bin()
        .args(["get", "--broker", &format!("mqtt://127.0.0.1:{port}"), "k"])
        .output()
        .expect("runs");
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect"));
}

/// The client commands' environment is theirs alone: with
/// `STATESTORE_BROKER` and `STATESTORE_USERNAME` exported for them, `serve`
/// still serves its own embedded broker (it reads `STATESTORE_SERVE_*`);
/// and a client command takes its broker and credentials from the
/// environment (`STATESTORE_USERNAME`, `STATESTORE_PASSWORD_FILE`), as
/// etcdctl does.
#[test]
fn the_client_commands_environment_is_theirs_alone() {
    let dir = std::env::temp_dir().join(format!("statestore-cli-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    std::fs::write(&users, statestore_tests::ALICE_SECRET).expect("users");
    let password = dir.join("password");
    std::fs::write(&password, "secret\n").expect("password");
    let port = free_port();
    let url = format!("mqtt://127.0.0.1:{port}");
    let mut serve = bin();
    serve
        .env("STATESTORE_BROKER", "mqtt://127.0.0.1:1")
        .env("STATESTORE_USERNAME", "alice")
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--users-file",
        ])
        .arg(&users);
    let _server = Server::spawn(serve);
    let client = |args: &[&str], credentials: bool| {
        let mut c = bin();
        c.env("STATESTORE_BROKER", &url).args(args);
        if credentials {
            c.env("STATESTORE_USERNAME", "alice")
                .env("STATESTORE_PASSWORD_FILE", &password);
        }
        c.output().expect("run statestore")
    };
    let o = client(&["set", "k", "v"], true);
    assert_eq!(code(&o), 0, "{o:?}");
    let o = client(&["get", "k"], true);
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(o.stdout, b"v");
    // Without them the server refuses the client.
    let o = client(&["get", "k"], false);
    assert_eq!(code(&o), 2, "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A failed connection is said in words a user can act on, not the MQTT
/// library's: a wrong password, nothing listening, something that does
/// not speak MQTT.
#[test]
fn connection_errors_say_what_to_do() {
    let stderr = |url: &str, extra: &[&str]| {
        let o = bin()
            .args(["get", "k", "--broker", url, "--timeout-ms", "5000"])
            .args(extra)
            .output()
            .expect("run statestore");
        assert_eq!(code(&o), 2, "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // Nothing listens.
    let closed = free_port();
    let said = stderr(&format!("mqtt://127.0.0.1:{closed}"), &[]);
    assert!(said.contains("nothing listens there"), "{said}");
    // Something that answers HTTP.
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = http.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        if let Ok((mut s, _)) = http.accept() {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let said = stderr(&format!("mqtt://127.0.0.1:{port}"), &[]);
    assert!(said.contains("wrong port"), "{said}");
    // A wrong password.
    let dir = std::env::temp_dir().join(format!("statestore-cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    std::fs::write(&users, statestore_tests::ALICE_SECRET).expect("users");
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not-it\n").expect("password");
    let port = free_port();
    let mut serve = bin();
    serve
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--users-file",
        ])
        .arg(&users);
    let _server = Server::spawn(serve);
    let wrong = wrong.to_string_lossy().into_owned();
    let said = stderr(
        &format!("mqtt://127.0.0.1:{port}"),
        &["--username", "alice", "--password-file", &wrong],
    );
    assert!(said.contains("refused the user name or password"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Exit code 1 is said on stderr (stdout stays the data alone): no such
/// key, a condition that did not hold, nothing deleted, a lock not had
/// within the wait (told apart from the command's own exit 1); and on a
/// terminal a value ends its line (piped, it is the bytes alone).
#[test]
fn exit_code_one_is_said_on_stderr_and_a_value_ends_its_line_on_a_terminal() {
    let store = embedded();
    let said = |args: &[&str]| {
        let o = store.run(args);
        assert_eq!(code(&o), 1, "{o:?}");
        assert!(o.stdout.is_empty(), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(said(&["get", "absent"]).contains("no such key"));
    assert!(said(&["del", "absent"]).contains("nothing deleted"));
    assert_eq!(code(&store.run(&["set", "k", "v"])), 0);
    assert!(said(&["set", "k", "w", "--nx"]).contains("condition"));
    assert!(said(&["vdel", "k", "other"]).contains("another value"));
    assert_eq!(code(&store.run(&["set", "held", "someone-else"])), 0);
    let o = store.run(&[
        "lock",
        "held",
        "--ttl",
        "1000",
        "--wait-ms",
        "300",
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 1, "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("was not had within 300 ms"),
        "{o:?}"
    );
    // On a terminal (util-linux `script` gives the command a pty).
    let get = format!(
        "{} get k --broker {}",
        env!("CARGO_BIN_EXE_statestore"),
        store.url
    );
    let o = Command::new("script")
        .args(["-qec", &get, "/dev/null"])
        .env(
            "STATESTORE_CACHE_DIR",
            std::env::temp_dir().join("statestore-client-cli-test-cache"),
        )
        .output()
        .expect("script");
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(o.stdout.ends_with(b"v\r\n"), "{o:?}");
    // Piped: the value's bytes alone.
    assert_eq!(store.run(&["get", "k"]).stdout, b"v");
}

/// `del` of several keys (1 if any was missing, each named; the others
/// deleted), `-o json` for get, keys and watch, and `keys` / `watch` lines
/// that stay one line whatever the bytes (a newline in a value, bytes that
/// are not UTF-8, a backslash).
#[test]
fn several_keys_json_and_escaped_lines() {
    let store = embedded();
    for k in ["d/a", "d/b", "d/c"] {
        assert_eq!(code(&store.run(&["set", k, "v"])), 0);
    }
    let o = store.run(&["del", "d/a", "d/missing", "d/b"]);
    assert_eq!(code(&o), 1, "{o:?}");
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("d/missing: nothing deleted"), "{said}");
    assert!(!said.contains("d/a") && !said.contains("d/b"), "{said}");
    assert_eq!(store.run(&["keys", "d/*"]).stdout, b"d/c\n");
    assert_eq!(code(&store.run(&["del", "d/c"])), 0);
    // JSON: get with its version, keys as one array; bytes that are not
    // UTF-8 in a `_base64` field.
    let set = store.run(&["set", "j/text", "héllo"]);
    let version = String::from_utf8_lossy(&set.stdout).trim().to_string();
    let o = store.run(&["get", "j/text", "-o", "json"]);
    assert_eq!(code(&o), 0, "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"key": "j/text", "value": "héllo", "version": version})
    );
    assert_eq!(code(&store.run(&["set", "--hex", "6a2f62696e", "00ff"])), 0);
    let o = store.run(&["get", "j/bin", "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["value_base64"], "AP8=", "{v}");
    let o = store.run(&["keys", "j/*", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v, serde_json::json!(["j/bin", "j/text"]));
    // A key with a newline and a backslash is one escaped line of `keys`.
    assert_eq!(
        code(&store.run(&["set", "--hex", "6a2f0a5c", "76"])), // "j/\n\\"
        0
    );
    let o = store.run(&["keys", "j/?*"]);
    assert_eq!(o.stdout, b"j/\\n\\\\\nj/bin\nj/text\n", "{o:?}");
    // watch: text lines escaped, and JSON lines.
    let spawn = |extra: &[&str]| {
        let mut w = bin();
        w.args(["watch", "--broker", &store.url, "--count", "2", "w/k"])
            .args(extra);
        watching(w)
    };
    let text = spawn(&[]);
    let json = spawn(&["-o", "json"]);
    let v1 = store.run_with(&["set", "w/k"], Some(b"two\nlines \xff\\"));
    assert_eq!(code(&v1), 0, "{v1:?}");
    assert_eq!(code(&store.run(&["del", "w/k"])), 0);
    let v1 = String::from_utf8_lossy(&v1.stdout).trim().to_string();
    let out = ended(text);
    let lines = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], format!("w/k SET two\\nlines \\xff\\\\ {v1}"));
    assert!(lines[1].starts_with("w/k DELETE "), "{lines:?}");
    let out = ended(json);
    let objects: Vec<serde_json::Value> = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("one object per line"))
        .collect();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert_eq!(objects[0]["key"], "w/k");
    assert_eq!(objects[0]["op"], "SET");
    assert!(objects[0]["value_base64"].is_string(), "{:?}", objects[0]);
    assert_eq!(objects[0]["version"], v1.as_str());
    assert_eq!(objects[1]["op"], "DELETE");
}

/// `--broker a,b`: the first that answers is used (a dead replica first in
/// the list costs nothing but a refused connection); and `watch` outlives
/// its store's restart: it says so, connects again, registers again and
/// prints the changes after it.
#[test]
fn several_brokers_and_a_watch_that_reconnects() {
    let closed = free_port();
    let port = free_port();
    let serve = || {
        let mut c = bin();
        c.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
        Server::spawn(c)
    };
    let server = serve();
    let url = format!("mqtt://127.0.0.1:{port}");
    let both = format!("mqtt://127.0.0.1:{closed},{url}");
    let run = |args: &[&str]| {
        bin()
            .args(args)
            .args(["--broker", &both])
            .output()
            .expect("run")
    };
    assert_eq!(code(&run(&["set", "k", "v"])), 0);
    assert_eq!(run(&["get", "k"]).stdout, b"v");
    // All of them down: every one's reason.
    let o = bin()
        .args(["get", "k", "--broker"])
        .arg(format!(
            "mqtt://127.0.0.1:{closed},mqtt://127.0.0.1:{closed}"
        ))
        .output()
        .expect("run");
    assert_eq!(code(&o), 2, "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no broker answered"),
        "{o:?}"
    );
    // watch through a restart of the store.
    let mut w = bin();
    w.args(["watch", "--broker", &both, "--count", "1", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut watcher = w.spawn().expect("watch");
    let log = statestore_tests::process::capture_stderr(&mut watcher);
    statestore_tests::process::wait_for(&log, "watching 1 keys", Duration::from_secs(30));
    server.kill9();
    statestore_tests::process::wait_for(&log, "connecting again", Duration::from_secs(10));
    let _server = serve();
    statestore_tests::process::wait_for(&log, "watching again", Duration::from_secs(30));
    let set = run(&["set", "r", "after"]);
    assert_eq!(code(&set), 0, "{set:?}");
    let out = ended(watcher);
    assert_eq!(code(&out), 0, "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(line.starts_with("r SET after "), "{line}");
}

/// `bench` deletes what it wrote (unless --keep), under --prefix; `bench`
/// and `echo` take credentials from flags or the environment, and a
/// refused login is said at once.
#[test]
fn bench_cleans_up_and_bench_and_echo_log_in() {
    let dir = std::env::temp_dir().join(format!("statestore-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    std::fs::write(&users, statestore_tests::ALICE_SECRET).expect("users");
    let password = dir.join("password");
    std::fs::write(&password, "secret\n").expect("password");
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not-it\n").expect("password");
    let port = free_port();
    let url = format!("mqtt://127.0.0.1:{port}");
    let mut serve = bin();
    serve
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--users-file")
        .arg(&users);
    let _server = Server::spawn(serve);
    let with = |password: &std::path::Path, args: &[&str]| {
        bin()
            .args(args)
            .env("STATESTORE_BROKER", &url)
            .env("STATESTORE_USERNAME", "alice")
            .env("STATESTORE_PASSWORD_FILE", password)
            .output()
            .expect("run")
    };
    let bench = [
        "bench",
        "--duration",
        "1s",
        "--clients",
        "2",
        "--keys",
        "20",
    ];
    let o = with(&password, &[&bench[..], &["--prefix", "b1/"]].concat());
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("ops_per_s="));
    assert_eq!(code(&with(&password, &["keys", "b1/*"])), 1, "cleaned up");
    let o = with(
        &password,
        &[&bench[..], &["--prefix", "b2/", "--keep"]].concat(),
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let kept = with(&password, &["keys", "b2/*"]);
    assert_eq!(code(&kept), 0, "{kept:?}");
    assert!(String::from_utf8_lossy(&kept.stdout).lines().count() > 1);
    // Keys that never repeat (--keys 2^64 - 1): the cleanup still finds them.
    let o = with(
        &password,
        &[
            &bench[..5],
            &["--keys", "18446744073709551615", "--max-requests", "50"],
            &["--prefix", "b3/"],
        ]
        .concat(),
    );
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("requests=50 "),
        "{o:?}"
    );
    assert_eq!(code(&with(&password, &["keys", "b3/*"])), 1, "cleaned up");
    // A wrong password: said at once, by bench and by echo.
    for args in [&bench[..], &["echo"][..]] {
        let started = std::time::Instant::now();
        let o = with(&wrong, args);
        assert_ne!(code(&o), 0, "{args:?}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("refused the user name or password"),
            "{args:?}: {o:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(8), "{args:?}");
    }
    // Nothing listening: said at once too.
    let started = std::time::Instant::now();
    let o = bin()
        .args(["bench", "--duration", "1s", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{}", free_port()))
        .output()
        .expect("run");
    assert_ne!(code(&o), 0, "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nothing listens there"),
        "{o:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `watch --pattern`: the keys that match, registered at the start and
/// at every rescan; a key that appears is printed as a SET of its value
/// when it is found, then notified like the others.
#[test]
fn watch_takes_patterns() {
    let store = embedded();
    assert_eq!(code(&store.run(&["set", "p/a", "1"])), 0);
    assert_eq!(code(&store.run(&["set", "q/a", "1"])), 0);
    let mut w = bin();
    w.args(["watch", "--broker", &store.url, "--count", "3"])
        .args(["--pattern", "p/*", "--rescan", "200ms"]);
    let mut watcher = watching(w);
    // Its lines as they come, so the DEL waits until a rescan found p/new.
    let lines = statestore_tests::process::capture_stdout(&mut watcher);
    let v = |o: Output| String::from_utf8_lossy(&o.stdout).trim().to_string();
    let v1 = v(store.run(&["set", "p/a", "2"]));
    store.run(&["set", "q/a", "2"]);
    let v2 = v(store.run(&["set", "p/new", "3"]));
    statestore_tests::process::wait_for(&lines, "p/new SET", Duration::from_secs(30));
    assert_eq!(code(&store.run(&["del", "p/new"])), 0);
    let out = ended(watcher);
    assert_eq!(code(&out), 0, "{out:?}");
    statestore_tests::process::wait_for(&lines, "p/new DELETE", Duration::from_secs(5));
    let text = lines.lock().expect("lines").clone();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("p/a SET 2 {v1}"));
    assert_eq!(lines[1], format!("p/new SET 3 {v2}"));
    assert!(lines[2].starts_with("p/new DELETE "), "{text}");
    // Neither keys nor a pattern: refused.
    let o = store.run(&["watch"]);
    assert_eq!(code(&o), 2, "{o:?}");
}

/// A notification that arrives while the client waits for a reply of its
/// own (a `watch` rescanning) is kept for `next_notification`, not taken
/// for a stray reply and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_during_a_request_is_kept() {
    use statestore::client::{Client, ClientOptions};
    let store = embedded();
    let opts = |id: &str| ClientOptions {
        brokers: vec![store.url.parse().expect("url")],
        client_id: id.into(),
        credentials: None,
        ca_file: None,
        client_cert: None,
        timeout: Duration::from_secs(10),
    };
    let mut watcher = Client::connect(&opts("kept-watcher"))
        .await
        .expect("connect");
    watcher.subscribe_notifications().await.expect("subscribe");
    let r = watcher.request(&[b"KEYNOTIFY", b"kept"], &[]).await;
    assert_eq!(r.expect("KEYNOTIFY").status, "200");
    let mut writer = Client::connect(&opts("kept-writer"))
        .await
        .expect("connect");
    let r = writer.request(&[b"SET", b"kept", b"v"], &[]).await;
    assert_eq!(r.expect("SET").status, "200");
    // The notification was sent before the writer's reply, so it reaches
    // the watcher's connection before the reply to this GET does.
    let r = watcher.request(&[b"GET", b"kept"], &[]).await;
    assert_eq!(r.expect("GET").status, "200");
    let n = watcher
        .next_notification(Some(Duration::from_secs(5)))
        .await;
    let n = n
        .expect("connected")
        .expect("the notification is still there");
    let n = statestore::client::Notification::parse(&n).expect("a notification");
    assert_eq!(
        (&n.key[..], n.value.as_deref()),
        (&b"kept"[..], Some(&b"v"[..]))
    );
}
