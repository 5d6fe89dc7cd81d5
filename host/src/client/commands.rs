//! The commands: `get`, `set`, `del` / `vdel`, `keys`, `lock`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::*;

/// What `set` does.
#[derive(Debug, Clone, Default)]
pub struct SetOptions {
    /// Only if the key does not exist.
    pub nx: bool,
    /// Only if the key does not exist or holds the same value.
    pub nex: bool,
    /// Expires after this many ms.
    pub px: Option<u64>,
    /// The fencing token (`__ft`).
    pub fencing_token: Option<String>,
    /// `aio-persistence: true`.
    pub persist: bool,
}

/// `keys`: every key that matches `pattern`, one per line (escaped), every
/// page; or one JSON array of them.
pub async fn keys(
    c: &mut Client,
    pattern: &[u8],
    enc: Encoding,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    let mut token: Option<Vec<u8>> = None;
    let mut listed = 0usize;
    let mut json = Vec::new();
    loop {
        let (keys, next) = scan_page(c, pattern, token.as_deref()).await?;
        for k in keys {
            listed += 1;
            if output == Output::Json {
                let mut o = serde_json::Map::new();
                json_field(&mut o, "key", &k, enc);
                json.push(o.remove("key").unwrap_or_default());
                continue;
            }
            out.write_all(&escape(&k, enc))?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    if output == Output::Json {
        writeln!(out, "{}", serde_json::Value::Array(json))?;
    }
    Ok(if listed == 0 { NOT_APPLIED } else { OK })
}

/// `get`: the value, alone, on `out` (or a JSON object with its version).
pub async fn get(
    c: &mut Client,
    key: &[u8],
    enc: Encoding,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    let reply = c.request(&[b"GET", key], &[]).await?;
    match check(&reply)? {
        Resp::Bulk(v) if output == Output::Json => {
            let mut o = serde_json::Map::new();
            json_field(&mut o, "key", key, enc);
            json_field(&mut o, "value", &v, enc);
            o.insert("version".into(), reply.version.unwrap_or_default().into());
            writeln!(out, "{}", serde_json::Value::Object(o))?;
            Ok(OK)
        }
        Resp::Bulk(v) => {
            out.write_all(&enc.encode(&v))?;
            if enc != Encoding::Raw {
                out.write_all(b"\n")?;
            }
            Ok(OK)
        }
        Resp::Nil => Ok(NOT_APPLIED),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// `set`: prints the new version.
pub async fn set(
    c: &mut Client,
    key: &[u8],
    value: &[u8],
    o: &SetOptions,
    out: &mut dyn Write,
) -> Result<u8> {
    let px = o.px.map(|p| p.to_string());
    let mut parts: Vec<&[u8]> = vec![b"SET", key, value];
    if o.nx {
        parts.push(b"NX");
    } else if o.nex {
        parts.push(b"NEX");
    }
    if let Some(px) = &px {
        parts.push(b"PX");
        parts.push(px.as_bytes());
    }
    let mut props: Vec<(&str, &str)> = Vec::new();
    if let Some(ft) = &o.fencing_token {
        props.push(("__ft", ft));
    }
    if o.persist {
        props.push(("aio-persistence", "true"));
    }
    let reply = c.request(&parts, &props).await?;
    match check(&reply)? {
        Resp::Ok => {
            writeln!(out, "{}", reply.version.unwrap_or_default())?;
            Ok(OK)
        }
        Resp::Int(-1) => Ok(NOT_APPLIED),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// `del` (and `vdel` with a value): exit 1 if there was nothing to delete
/// (or it held another value).
pub async fn del(
    c: &mut Client,
    key: &[u8],
    value: Option<&[u8]>,
    fencing_token: Option<&str>,
) -> Result<u8> {
    let parts: Vec<&[u8]> = match value {
        Some(v) => vec![b"VDEL", key, v],
        None => vec![b"DEL", key],
    };
    let props: Vec<(&str, &str)> = fencing_token.map(|ft| ("__ft", ft)).into_iter().collect();
    match check(&c.request(&parts, &props).await?)? {
        Resp::Int(1) => Ok(OK),
        Resp::Int(0 | -1) => Ok(NOT_APPLIED),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// `lock`: takes the lease `name` (waiting up to `wait` for it), runs
/// `command` with `STATESTORE_FENCING_TOKEN` (the lease's version) and
/// `STATESTORE_LOCK_HOLDER` in its environment, renews the lease while it
/// runs, and releases it. Returns the command's exit code (1 if the lease
/// was not had within `wait`).
pub async fn lock(
    c: &mut Client,
    name: &[u8],
    ttl: Duration,
    wait: Duration,
    command: &[String],
) -> Result<u8> {
    let Some((program, args)) = command.split_first() else {
        bail!("lock needs a command to run (after --)");
    };
    let holder = c.id.clone();
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
    let acquire = SetOptions {
        nex: true,
        px: Some(ttl_ms),
        ..SetOptions::default()
    };
    let deadline = Instant::now() + wait;
    let token = loop {
        let mut version = Vec::new();
        if set(c, name, holder.as_bytes(), &acquire, &mut version).await? == OK {
            break String::from_utf8_lossy(&version).trim().to_string();
        }
        if Instant::now() >= deadline {
            eprintln!(
                "statestore: the lock was not had within {} ms (another holds it); the command did not run",
                wait.as_millis()
            );
            return Ok(NOT_APPLIED);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("STATESTORE_FENCING_TOKEN", &token)
        .env("STATESTORE_LOCK_HOLDER", &holder)
        .spawn()
        .with_context(|| format!("cannot run {program:?}"))?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            () = tokio::time::sleep(ttl / 2) => {
                let mut ignored = Vec::new();
                if set(c, name, holder.as_bytes(), &acquire, &mut ignored).await? != OK {
                    tracing::warn!("the lease was lost while the command ran");
                }
            }
        }
    };
    let _ = del(c, name, Some(holder.as_bytes()), None).await;
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(ERROR))
}
