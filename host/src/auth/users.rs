//! The embedded broker's users: a password file in the format
//! `mosquitto_passwd` writes, so operators keep using that tool.
//!
//! ```text
//! user:$7$<iterations>$<base64 salt>$<base64 hash>   PBKDF2-HMAC-SHA512 (mosquitto 2)
//! user:$6$<base64 salt>$<base64 hash>                SHA-512 of password and salt
//! ```
//!
//! Hashes are compared in constant time, and an unknown user costs the same
//! hashing as a known one.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine;
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone)]
enum Hash {
    Pbkdf2 {
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    Sha512 {
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl Hash {
    fn parse(text: &str) -> Result<Hash> {
        let b64 = |s: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .context("not base64")
        };
        // A hash of SHA-512's 64 bytes and a salt: an empty or cut hash
        // (a truncated or hand-edited file) would match every password.
        let checked = |salt: Vec<u8>, hash: Vec<u8>| {
            if hash.len() != 64 {
                bail!(
                    "a hash of {} bytes (SHA-512's are 64): a truncated or hand-edited line? Write it again with mosquitto_passwd",
                    hash.len()
                );
            }
            if salt.is_empty() {
                bail!("an empty salt: write the line again with mosquitto_passwd");
            }
            Ok((salt, hash))
        };
        let parts: Vec<&str> = text.split('$').collect();
        match parts.as_slice() {
            ["", "7", iterations, salt, hash] => {
                let (salt, hash) = checked(b64(salt)?, b64(hash)?)?;
                Ok(Hash::Pbkdf2 {
                    iterations: iterations
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .context("bad iteration count")?,
                    salt,
                    hash,
                })
            }
            ["", "6", salt, hash] => {
                let (salt, hash) = checked(b64(salt)?, b64(hash)?)?;
                Ok(Hash::Sha512 { salt, hash })
            }
            _ => {
                bail!("not a mosquitto_passwd hash ($7$ or $6$); plain passwords are not accepted")
            }
        }
    }

    fn matches(&self, password: &[u8]) -> bool {
        let (computed, expected) = match self {
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => {
                let mut out = vec![0u8; hash.len()];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut out);
                (out, hash)
            }
            Hash::Sha512 { salt, hash } => {
                let mut h = Sha512::new();
                h.update(password);
                h.update(salt);
                (h.finalize().to_vec(), hash)
            }
        };
        computed.ct_eq(expected).into()
    }
}

/// The users of a password file.
#[derive(Debug, Clone)]
pub struct Users {
    by_name: HashMap<String, Hash>,
    /// Hashed against when the user is unknown, so that the time does not
    /// tell which users exist.
    decoy: Hash,
}

impl Users {
    /// Reads a `mosquitto_passwd` file; a bad line is an error with its
    /// number.
    pub fn load(path: &Path) -> Result<Users> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the users file {}", path.display()))?;
        Users::parse(&text).with_context(|| format!("in the users file {}", path.display()))
    }

    /// Parses the text of a password file.
    pub fn parse(text: &str) -> Result<Users> {
        let mut by_name = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                bail!("line {}: not `user:hash`", i + 1);
            };
            if user.is_empty() {
                bail!("line {}: an empty user name", i + 1);
            }
            let hash = Hash::parse(hash).with_context(|| format!("line {}", i + 1))?;
            if by_name.insert(user.to_string(), hash).is_some() {
                bail!("line {}: user {user:?} appears twice", i + 1);
            }
        }
        if by_name.is_empty() {
            bail!("no users");
        }
        let decoy = by_name.values().next().cloned().context("no users")?;
        Ok(Users { by_name, decoy })
    }

    /// Whether `user` exists and `password` is theirs.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.by_name.get(user) {
            Some(hash) => hash.matches(password),
            None => {
                let _ = self.decoy.matches(password);
                false
            }
        }
    }

    /// The user names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// How many users there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none (never: loading refuses an empty file).
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The users in force, replaced whole when their file is read again
/// (SIGHUP): a connection in progress keeps the users it started with.
#[derive(Debug)]
pub struct UsersCell(std::sync::RwLock<std::sync::Arc<Users>>);

impl UsersCell {
    /// A cell holding `users`.
    pub fn new(users: Users) -> std::sync::Arc<UsersCell> {
        std::sync::Arc::new(UsersCell(std::sync::RwLock::new(std::sync::Arc::new(
            users,
        ))))
    }

    /// The users now.
    pub fn get(&self) -> std::sync::Arc<Users> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads `path` again: the users it holds are in force from now on, or,
    /// if it does not load (a bad line, gone), the old ones stay and the
    /// error says why. Returns how many users there are now.
    pub fn reload(&self, path: &Path) -> Result<usize> {
        let users = Users::load(path)?;
        let n = users.len();
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(users);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines `mosquitto_passwd` 2.0 wrote (`-b`, and `-H sha512`).
    const FILE: &str = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA==\nbob:$6$+WrkT2PZ5wWtbE+1$HLF4UcZpjOs6isr04Y8ckhN5Qz8w7eP4mgR2TPvBt5MCNXIOVUycGCJ0rZSMPxiG3EMI0mXs5OIH3EBYTBM/IQ==\n";

    #[test]
    fn a_reload_replaces_the_users_or_keeps_them() {
        let dir = std::env::temp_dir().join(format!("statestore-users-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("users");
        std::fs::write(&path, FILE).expect("write");
        let cell = UsersCell::new(Users::load(&path).expect("load"));
        assert!(cell.get().verify("bob", b"hunter2"));
        // bob removed: he is refused from now on.
        std::fs::write(&path, FILE.lines().next().expect("alice")).expect("write");
        assert_eq!(cell.reload(&path).expect("reload"), 1);
        assert!(!cell.get().verify("bob", b"hunter2"));
        assert!(cell.get().verify("alice", b"secret"));
        // A bad file: the users stay as they were.
        std::fs::write(&path, "alice:$7$101$AAAA$\n").expect("write");
        let e = format!("{:#}", cell.reload(&path).expect_err("a cut hash"));
        assert!(e.contains("line 1"), "{e}");
        assert!(cell.get().verify("alice", b"secret"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn mosquitto_passwd_hashes_verify() {
        let users = Users::parse(FILE).expect("parses");
        assert_eq!(users.len(), 2);
        assert!(users.verify("alice", b"secret"));
        assert!(!users.verify("alice", b"Secret"));
        assert!(users.verify("bob", b"hunter2"));
        assert!(!users.verify("bob", b"secret"));
        assert!(!users.verify("carol", b"secret"));
    }

    #[test]
    fn bad_files_name_the_line() {
        for (text, want) in [
            ("alice:plain\n", "line 1"),
            ("# users\nalice\n", "line 2"),
            ("alice:$7$x$AA==$AA==\n", "line 1"),
            ("", "no users"),
            (":$6$+WrkT2PZ5wWtbE+1$AA==\n", "empty user name"),
        ] {
            let e = format!("{:#}", Users::parse(text).expect_err(text));
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// A line whose hash is empty or cut short (a truncated or hand-edited
    /// file) would accept every password: it stops the load, naming it.
    #[test]
    fn an_empty_or_cut_hash_is_refused_not_a_key_to_every_password() {
        let good = FILE.lines().next().expect("alice");
        let (head, hash) = good.rsplit_once('$').expect("hash");
        for (line, says) in [
            (format!("{head}$"), "a hash of 0 bytes"),
            (format!("{head}${}", &hash[..8]), "a hash of 6 bytes"),
            ("bob:$6$+WrkT2PZ5wWtbE+1$".to_string(), "a hash of 0 bytes"),
            (format!("carol:$7$101$${hash}"), "an empty salt"),
        ] {
            let text = format!(
                "{}\n{line}\n",
                FILE.lines().nth(1).expect("bob").replace("bob", "dave")
            );
            let e = format!("{:#}", Users::parse(&text).expect_err(&line));
            assert!(e.contains("line 2") && e.contains(says), "{line}: {e}");
        }
    }
}
