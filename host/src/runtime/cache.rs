//! A cache of precompiled components, so that a restart does not compile the
//! component again (13-38 ms compile vs well under 1 ms to load).
//!
//! Entries are named after a hash of the component bytes and of the engine's
//! compatibility hash (wasmtime version, target, settings): an entry is only
//! ever loaded by an engine that can run it, and wasmtime checks its header
//! again on load.
//!
//! A precompiled entry is native code that runs in this process, so the
//! cache is trusted only when nobody else can write it: the directory (made
//! 0700 when this creates it) and the entry must be owned by this user and
//! writable by no one else, and not be symbolic links; otherwise the cache
//! is ignored with a warning and the component compiled. Entries are written
//! to a new file (created exclusively, 0600) and renamed into place.

use std::fs::{self, OpenOptions};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The default cache directory: `$STATESTORE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/statestore`, else `~/.cache/statestore`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("STATESTORE_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("statestore"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("statestore"))
}

/// Compiles `wasm`, or loads its precompiled form from `dir`. A cache that
/// cannot be read or written is only logged: the component is compiled.
pub fn load(engine: &Engine, wasm: &[u8], dir: &Path) -> Result<Component> {
    let mut h = DefaultHasher::new();
    wasm.hash(&mut h);
    engine.precompile_compatibility_hash().hash(&mut h);
    let path = dir.join(format!("component-{:016x}.cwasm", h.finish()));
    let compile = || {
        Component::new(engine, wasm)
            .map_err(anyhow::Error::from)
            .context("the state store component is not valid")
    };
    if let Err(why) = prepare(dir) {
        tracing::warn!(dir = %dir.display(), %why, "not using the precompiled component cache");
        return compile();
    }
    if let Err(why) = trusted(&path) {
        tracing::warn!(path = %path.display(), %why, "ignoring a precompiled component");
    } else if path.exists() {
        // SAFETY: wasmtime requires that a deserialized artifact was produced
        // by `Component::serialize` of a compatible engine and not tampered
        // with. This file is written only by `store` below, into a cache
        // directory the operator owns, under a name derived from the engine's
        // compatibility hash; wasmtime validates its header as well.
        #[allow(unsafe_code)]
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => {
                tracing::debug!(path = %path.display(), "loaded precompiled component");
                return Ok(c);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unusable precompiled component")
            }
        }
    }
    let component = compile()?;
    if let Err(e) = store(&component, dir, &path) {
        tracing::warn!(dir = %dir.display(), error = %format!("{e:#}"), "cannot cache the precompiled component");
    }
    Ok(component)
}

/// Why a path may not be trusted: it is a symbolic link, is owned by
/// another user, or others can write it. A path that does not exist is fine.
fn trusted(path: &Path) -> std::result::Result<(), String> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    if meta.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "it is owned by uid {}, not by this user ({me})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "others can write it (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Creates the cache directory (0700) if needed and checks that it can be
/// trusted.
fn prepare(dir: &Path) -> std::result::Result<(), String> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create it: {e}"))?;
    }
    trusted(dir)?;
    // No directory above it may let another user swap it: each belongs to
    // this user or root, and is writable by no one else unless it is sticky
    // (as /tmp is: there others cannot rename what is ours).
    let absolute = fs::canonicalize(dir).map_err(|e| e.to_string())?;
    let me = rustix::process::geteuid().as_raw();
    for ancestor in absolute.ancestors().skip(1) {
        let meta = fs::metadata(ancestor).map_err(|e| e.to_string())?;
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "{} above it is owned by uid {}",
                ancestor.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return Err(format!(
                "others can write {} above it (mode {:o})",
                ancestor.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

fn store(component: &Component, dir: &Path, path: &Path) -> Result<()> {
    let bytes = component.serialize().map_err(anyhow::Error::from)?;
    // A name nobody can predict and a file nobody else made: created
    // exclusively (never through a link someone planted), readable by us only.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.{}-{nanos:08x}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("component"),
        std::process::id()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(&bytes).and_then(|()| f.sync_all());
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e.into());
    }
    tracing::debug!(path = %path.display(), "cached the precompiled component");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("statestore-cache-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_cache_dir_is_private_and_its_entries_too() -> Result<()> {
        let dir = temp("new").join("nested");
        let engine = Engine::default();
        load(&engine, crate::GUEST_COMPONENT, &dir)?;
        assert_eq!(fs::metadata(&dir)?.mode() & 0o777, 0o700);
        let entries: Vec<_> = fs::read_dir(&dir)?.collect::<std::io::Result<_>>()?;
        assert_eq!(entries.len(), 1, "one entry, no temporary left");
        assert_eq!(entries[0].metadata()?.mode() & 0o777, 0o600);
        // Loaded from the cache the second time.
        load(&engine, crate::GUEST_COMPONENT, &dir)?;
        let _ = fs::remove_dir_all(dir.parent().expect("parent"));
        Ok(())
    }

    #[test]
    fn a_cache_others_can_write_or_that_is_a_link_is_not_trusted() -> Result<()> {
        let dir = temp("open");
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))?;
        assert!(trusted(&dir).is_err());
        // Ignored, not read and not written: the component still loads.
        load(&Engine::default(), crate::GUEST_COMPONENT, &dir)?;
        assert_eq!(fs::read_dir(&dir)?.count(), 0);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        assert!(trusted(&dir).is_ok(), "writable by its owner only");
        // A private directory under one others can write (not sticky).
        let open = temp("open-parent");
        fs::create_dir_all(open.join("cache"))?;
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777))?;
        fs::set_permissions(open.join("cache"), fs::Permissions::from_mode(0o700))?;
        let why = prepare(&open.join("cache")).expect_err("a swappable parent");
        assert!(why.contains("above it"), "{why}");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777))?;
        assert!(prepare(&open.join("cache")).is_ok(), "sticky, as /tmp");
        let _ = fs::remove_dir_all(&open);
        let link = dir.with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link)?;
        assert!(trusted(&link).is_err());
        let _ = fs::remove_file(&link);
        let _ = fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn a_cache_owned_by_another_user_is_not_trusted() -> Result<()> {
        if rustix::process::geteuid().as_raw() != 0 {
            return Ok(()); // only root can give a directory away
        }
        let dir = temp("theirs");
        fs::create_dir_all(&dir)?;
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534))?;
        let why = trusted(&dir).expect_err("another user's directory");
        assert!(why.contains("owned by uid 65534"), "{why}");
        let _ = fs::remove_dir_all(&dir);
        Ok(())
    }
}
