//! SCAN (spec §12): pages of the keys that match a glob pattern, in key-byte
//! order, each page resumable from a token.
//!
//! - The pattern is matched against the whole key as UTF-8 text by the
//!   `glob` crate, which the real store uses: `*`, `?`, `[abc]`, `[a-z]`,
//!   `[!abc]`, case-sensitive, `*` and `?` also match `/` and a leading `.`.
//!   A pattern it refuses gets `-ERR the pattern is not valid: <why>`; a
//!   pattern that is not UTF-8 matches nothing; keys that are not UTF-8 are
//!   never returned, nor are expired keys.
//! - A page ends at [`ScanPage`]'s limits, or after [`EXAMINE_KEYS`] keys or
//!   [`EXAMINE_BYTES`] bytes of keys were looked at (so a scan of a million
//!   keys that match nothing does not hold the store up: it answers empty
//!   pages with a token instead).
//! - The token is `0;1;<key>`: the shape of the real store's
//!   (`<chain>;<topology version>;<last key>`), naming the last key the
//!   page looked at. The next page starts strictly after that key, whether
//!   it still exists or not, so every key present for the whole scan is
//!   returned exactly once. A token that is not `<digits>;<digits>;<bytes>`
//!   gets `-ERR the scan token is not valid`.
//! - Where that key is one the client may not read (per-key authorization),
//!   its name must not reach the client: the token is `0;2;<hex>` instead,
//!   the key sealed by [`Seal`] (AES-256-GCM-SIV under a key derived from
//!   the store's hash seed). Only this store (or a replica of it) can open
//!   it; a token that does not open is not valid.

pub use crate::pattern::{Glob, MAX_PATTERN_BYTES};
use std::borrow::Cow;

use aes_gcm_siv::aead::{Aead as _, KeyInit as _};
use aes_gcm_siv::{Aes256GcmSiv, Nonce};

use crate::resp3;
use crate::table::Table;
use crate::types::{KeyMatch, ScanPage};

/// Most keys one page looks at.
pub const EXAMINE_KEYS: usize = 16 * 1024;
/// Most bytes of keys one page looks at.
pub const EXAMINE_BYTES: usize = 1024 * 1024;
/// ... or once matching could have taken this many steps ([`Glob::cost`]:
/// a long pattern with a `*` costs more a key), so that a hostile pattern
/// cannot hold a call for long.
pub const EXAMINE_WORK: usize = 1 << 26;
/// What every token this store writes starts with.
pub const TOKEN_PREFIX: &[u8] = b"0;1;";
/// ... and a sealed token (naming a key its client may not read).
pub const SEALED_PREFIX: &[u8] = b"0;2;";

/// Seals the key a page token names when its client may not read it, and
/// opens it again: AES-256-GCM-SIV, deterministic (a fixed nonce: that
/// scheme then tells only whether two sealed keys are equal), under a key
/// derived from the store's hash seed, which the host keeps secret (random
/// per process; the same on every replica of a cluster).
#[derive(Clone)]
pub struct Seal(Aes256GcmSiv);

impl core::fmt::Debug for Seal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Seal")
    }
}

impl Seal {
    /// The seal of a store with hash seed `seed`.
    pub fn new(seed: u64) -> Seal {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        // The rest names the use, so that this key is used for nothing else.
        key[8..].copy_from_slice(b"statestore scan token v1");
        Seal(Aes256GcmSiv::new(&key.into()))
    }

    /// `SEALED_PREFIX` and the sealed `key`, in hex.
    fn seal(&self, key: &[u8]) -> Vec<u8> {
        let sealed = self.0.encrypt(&Nonce::default(), key).unwrap_or_default();
        let mut out = Vec::with_capacity(SEALED_PREFIX.len() + 2 * sealed.len());
        out.extend_from_slice(SEALED_PREFIX);
        for b in sealed {
            out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
        out
    }

    /// The key of a sealed token's `hex`, if it is one this store sealed.
    fn open(&self, hex: &[u8]) -> Option<Vec<u8>> {
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        let digit = |c: u8| HEX.iter().position(|&h| h == c);
        let bytes: Option<Vec<u8>> = hex
            .chunks(2)
            .map(|p| u8::try_from(digit(p[0])? * 16 + digit(p[1])?).ok())
            .collect();
        self.0.decrypt(&Nonce::default(), bytes?.as_slice()).ok()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The reply to a token that does not parse.
pub const BAD_TOKEN: &str = "the scan token is not valid";

/// The keys that persist under `Persist::Custom`.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    patterns: Vec<Glob>,
    exact: Vec<Box<[u8]>>,
}

impl KeySet {
    /// The set of `matches` (patterns were checked by `Config::validate`;
    /// one that does not compile matches nothing).
    pub fn new(matches: &[KeyMatch]) -> KeySet {
        let mut set = KeySet::default();
        for m in matches {
            match m {
                KeyMatch::Pattern(p) => set.patterns.extend(Glob::new(p).ok()),
                KeyMatch::Exact(k) => set.exact.push(k.as_slice().into()),
            }
        }
        set
    }

    /// Whether `key` is in the set.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.exact.iter().any(|k| **k == *key) || self.patterns.iter().any(|p| p.matches(key))
    }
}

/// The key a token resumes after, if the token parses (and, sealed,
/// opens).
pub fn parse_token<'t>(token: &'t [u8], seal: &Seal) -> Option<Cow<'t, [u8]>> {
    if let Some(hex) = token.strip_prefix(SEALED_PREFIX) {
        return seal.open(hex).map(Cow::Owned);
    }
    let mut parts = token.splitn(3, |&b| b == b';');
    let number = |p: Option<&[u8]>| {
        p.is_some_and(|p| (1..=20).contains(&p.len()) && p.iter().all(u8::is_ascii_digit))
    };
    let (chain, topology, key) = (parts.next(), parts.next(), parts.next());
    (number(chain) && number(topology)).then_some(Cow::Borrowed(key?))
}

/// The reply payload of one SCAN page: `pattern` over `table` at `now`,
/// after the key of `token`, of the keys `readable` allows (the others are
/// looked at, never listed, never named: a token that would name one is
/// sealed with `seal`). `Err` is the text of an `-ERR` reply.
pub fn page(
    table: &Table,
    pattern: &[u8],
    token: Option<&[u8]>,
    now: u64,
    limits: ScanPage,
    readable: impl Fn(&[u8]) -> bool,
    seal: &Seal,
) -> Result<Vec<u8>, String> {
    let after = match token {
        None => None,
        Some(t) => Some(parse_token(t, seal).ok_or_else(|| BAD_TOKEN.to_string())?),
    };
    let after = after.as_deref();
    let Ok(text) = core::str::from_utf8(pattern) else {
        return Ok(encode(&[], 0, None)); // Matches no key: the last page.
    };
    let glob = Glob::new(text).map_err(|e| format!("the pattern is not valid: {e}"))?;
    let max_keys = usize::try_from(limits.max_keys).unwrap_or(usize::MAX);
    let max_bytes = usize::try_from(limits.max_bytes).unwrap_or(usize::MAX);
    let mut keys: Vec<&[u8]> = Vec::new();
    let (mut bytes, mut examined, mut examined_bytes, mut work) = (0usize, 0usize, 0usize, 0usize);
    let mut last = None;
    let mut more = false;
    for (key, entry) in table.after(after) {
        if keys.len() >= max_keys
            || examined >= EXAMINE_KEYS
            || examined_bytes >= EXAMINE_BYTES
            || work >= EXAMINE_WORK
        {
            more = true;
            break;
        }
        let matched = entry.live_at(now) && glob.matches(key) && readable(key);
        let size = resp3::bulk_len(key.len());
        if matched && !keys.is_empty() && bytes + size > max_bytes {
            more = true;
            break;
        }
        examined += 1;
        examined_bytes += key.len();
        work = work.saturating_add(glob.cost(key.len()));
        last = Some(key);
        if matched {
            bytes += size;
            keys.push(key);
        }
    }
    let token = match last.filter(|_| more) {
        None => None,
        Some(key) if readable(key) => Some(Token::Plain(key)),
        Some(key) => Some(Token::Sealed(seal.seal(key))),
    };
    Ok(encode(&keys, bytes, token))
}

/// A page's token: the key it names, or that key sealed.
enum Token<'k> {
    Plain(&'k [u8]),
    Sealed(Vec<u8>),
}

/// `*1\r\n*<k>\r\n<keys>` (the last page) or `*2\r\n*<k>\r\n<keys><token>`.
fn encode(keys: &[&[u8]], bytes: usize, token: Option<Token<'_>>) -> Vec<u8> {
    let token = token.map(|t| match t {
        Token::Plain(key) => [TOKEN_PREFIX, key].concat(),
        Token::Sealed(sealed) => sealed,
    });
    let token_len = token.as_ref().map_or(0, |t| resp3::bulk_len(t.len()));
    let mut out = Vec::with_capacity(32 + bytes + token_len);
    let parts = if token.is_some() { 2 } else { 1 };
    out.extend_from_slice(format!("*{parts}\r\n*{}\r\n", keys.len()).as_bytes());
    for key in keys {
        resp3::push_bulk(&mut out, key);
    }
    if let Some(token) = token {
        resp3::push_bulk(&mut out, &token);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Entry, Version};

    fn table(keys: &[&[u8]]) -> Table {
        let mut t = Table::default();
        for k in keys {
            let e = Entry {
                value: Box::from(&b"v"[..]),
                version: Version {
                    wall: 1,
                    counter: 0,
                },
                fencing_token: None,
                expires_at: k.starts_with(b"exp").then_some(10),
                persist: false,
            };
            t.put(k, e.as_ref());
        }
        t
    }

    fn limits(max_keys: u32, max_bytes: u32) -> ScanPage {
        ScanPage {
            max_keys,
            max_bytes,
        }
    }

    /// The token of a page that `page` ends, if any.
    fn token_of(p: &[u8]) -> Option<Vec<u8>> {
        let rest = p.strip_prefix(b"*2\r\n")?;
        // The last bulk string is the token.
        let at = rest.windows(3).rposition(|w| w == b"\r\n$")? + 2;
        let bulk = &rest[at + 1..];
        let nl = bulk.iter().position(|&b| b == b'\r')?;
        let len: usize = core::str::from_utf8(&bulk[..nl]).ok()?.parse().ok()?;
        Some(bulk[nl + 2..nl + 2 + len].to_vec())
    }

    /// A page that ends on a key its client may not read (its work budget
    /// spent on keys it may not see) names that key in no token: the token
    /// is sealed, resumes where it should, and opens only in this store.
    #[test]
    fn a_token_never_names_a_key_its_client_may_not_read() {
        let names: Vec<Vec<u8>> = (0..EXAMINE_KEYS + 10)
            .map(|i| format!("secret/{i:06}").into_bytes())
            .chain(["public/a", "zz/public"].map(|k| k.as_bytes().to_vec()))
            .collect();
        let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        let t = table(&refs);
        let readable = |k: &[u8]| !k.starts_with(b"secret/");
        let seal = Seal::new(0x5eed);
        let mut listed = Vec::new();
        let mut token: Option<Vec<u8>> = None;
        for _ in 0..10 {
            let p = page(
                &t,
                b"*",
                token.as_deref(),
                0,
                ScanPage::default(),
                readable,
                &seal,
            )
            .expect("ok");
            assert!(
                !p.windows(7).any(|w| w == b"secret/"),
                "a page names a key it may not: {}",
                String::from_utf8_lossy(&p[..p.len().min(200)])
            );
            if p.windows(8).any(|w| w == b"public/a") {
                listed.push("public/a");
            }
            if p.windows(9).any(|w| w == b"zz/public") {
                listed.push("zz/public");
            }
            token = token_of(&p);
            let Some(t) = &token else { break };
            assert!(
                t.starts_with(SEALED_PREFIX) || t.starts_with(TOKEN_PREFIX),
                "{t:?}"
            );
        }
        assert_eq!(listed, ["public/a", "zz/public"], "every readable key once");
        // The first page ended on a secret key: sealed. Tampered, or from
        // another store, it is not valid.
        let first = page(&t, b"*", None, 0, ScanPage::default(), readable, &seal).expect("ok");
        let sealed = token_of(&first).expect("more");
        assert!(sealed.starts_with(SEALED_PREFIX), "{sealed:?}");
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'0' { b'1' } else { b'0' };
        for bad in [&tampered[..], &sealed[..sealed.len() - 1], b"0;2;zz"] {
            let e = page(&t, b"*", Some(bad), 0, ScanPage::default(), readable, &seal);
            assert_eq!(e, Err(BAD_TOKEN.to_string()), "{bad:?}");
        }
        let other = page(
            &t,
            b"*",
            Some(&sealed),
            0,
            ScanPage::default(),
            readable,
            &Seal::new(1),
        );
        assert_eq!(other, Err(BAD_TOKEN.to_string()));
        // Everyone may read everything: tokens stay plain, as before.
        let open = page(&t, b"*", None, 0, ScanPage::default(), |_| true, &seal).expect("ok");
        assert!(token_of(&open).expect("more").starts_with(TOKEN_PREFIX));
    }

    #[test]
    fn pages_and_tokens() {
        let t = table(&[b"a1", b"a2", b"b1", b"exp1", b"\xff\xfe"]);
        let all = page(
            &t,
            b"*",
            None,
            20,
            ScanPage::default(),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(all, b"*1\r\n*3\r\n$2\r\na1\r\n$2\r\na2\r\n$2\r\nb1\r\n");
        let live = page(
            &t,
            b"*",
            None,
            5,
            ScanPage::default(),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert!(live.starts_with(b"*1\r\n*4\r\n"), "exp1 is live at 5");
        let one = page(
            &t,
            b"a*",
            None,
            20,
            limits(1, 1000),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(one, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a1\r\n");
        let two = page(
            &t,
            b"a*",
            Some(b"0;1;a1"),
            20,
            limits(1, 1000),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(two, b"*2\r\n*1\r\n$2\r\na2\r\n$6\r\n0;1;a2\r\n");
        // The page that finds no more matches and nothing after: the last.
        let three = page(
            &t,
            b"a*",
            Some(b"0;1;a2"),
            20,
            limits(1, 1000),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(three, b"*1\r\n*0\r\n");
        // A token names any key, present or not.
        let gone = page(
            &t,
            b"*",
            Some(b"7;42;a15"),
            20,
            ScanPage::default(),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(gone, b"*1\r\n*2\r\n$2\r\na2\r\n$2\r\nb1\r\n");
        // A byte limit smaller than one key still returns one key a page;
        // the token names the last key looked at (a2), not the last returned.
        let tiny = page(&t, b"?1", None, 20, limits(100, 1), |_| true, &Seal::new(0)).expect("ok");
        assert_eq!(tiny, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a2\r\n");
        let next = page(
            &t,
            b"?1",
            Some(b"0;1;a2"),
            20,
            limits(100, 1),
            |_| true,
            &Seal::new(0),
        )
        .expect("ok");
        assert_eq!(next, b"*1\r\n*1\r\n$2\r\nb1\r\n");
    }

    #[test]
    fn errors_and_non_utf8() {
        let t = table(&[b"a"]);
        for bad in [
            &b"1;2"[..],
            b"x;1;a",
            b";1;a",
            b"1;;a",
            b"",
            b"123456789012345678901;1;a",
        ] {
            assert_eq!(
                page(
                    &t,
                    b"*",
                    Some(bad),
                    0,
                    ScanPage::default(),
                    |_| true,
                    &Seal::new(0)
                ),
                Err(BAD_TOKEN.into()),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_token(b"1;2;", &Seal::new(0)).as_deref(),
            Some(&b""[..])
        );
        assert_eq!(
            parse_token(b"1;2;a;b", &Seal::new(0)).as_deref(),
            Some(&b"a;b"[..])
        );
        for bad in [&b"***"[..], b"a**", b"[ab"] {
            let e = page(
                &t,
                bad,
                None,
                0,
                ScanPage::default(),
                |_| true,
                &Seal::new(0),
            )
            .expect_err("an error");
            assert!(e.starts_with("the pattern is not valid: "), "{e}");
        }
        assert_eq!(
            page(
                &t,
                b"\xff*",
                None,
                0,
                ScanPage::default(),
                |_| true,
                &Seal::new(0)
            )
            .expect("ok"),
            b"*1\r\n*0\r\n"
        );
    }

    #[test]
    fn glob_rules_of_the_real_store() {
        let g = |p: &str| Glob::new(p).expect("ok");
        assert!(g("a*").matches(b"a/b/.c"));
        assert!(g("?b").matches(b"/b"));
        assert!(g("[!x]y").matches(b"zy") && !g("[!x]y").matches(b"xy"));
        assert!(g("[^x]y").matches(b"^y") && !g("[^x]y").matches(b"zy"));
        assert!(g("[*]").matches(b"*") && !g("[*]").matches(b"a"));
        assert!(!g("A*").matches(b"a1"));
        assert!(g("a\\b").matches(b"a\\b"), "no backslash escape");
        assert!(g("**/x").matches(b"a/b/x"));
    }

    #[test]
    fn work_per_page_is_bounded() {
        let keys: Vec<Vec<u8>> = (0..40_000u32)
            .map(|i| format!("k{i:06}").into_bytes())
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let t = table(&refs);
        let mut token: Option<Vec<u8>> = None;
        let mut pages = 0;
        loop {
            let p = page(
                &t,
                b"nomatch*",
                token.as_deref(),
                0,
                ScanPage::default(),
                |_| true,
                &Seal::new(0),
            )
            .expect("ok");
            pages += 1;
            if p == b"*1\r\n*0\r\n" {
                break;
            }
            let prefix = format!("*2\r\n*0\r\n${}\r\n", 4 + 7);
            assert!(
                p.starts_with(prefix.as_bytes()),
                "{}",
                String::from_utf8_lossy(&p)
            );
            token = Some(p[prefix.len()..p.len() - 2].to_vec());
        }
        assert_eq!(pages, 40_000usize.div_ceil(EXAMINE_KEYS));
    }

    /// A long pattern with a `*` against long keys (the matcher backtracks:
    /// a key costs its length times the pattern's): a page stops once that
    /// work reaches [`EXAMINE_WORK`], however few keys it looked at.
    #[test]
    fn a_hostile_pattern_costs_a_bounded_page() {
        let keys: Vec<Vec<u8>> = (0..100u32)
            .map(|i| {
                let mut k = format!("{i:03}").into_bytes();
                k.resize(4096, b'a');
                k
            })
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let t = table(&refs);
        let pattern = format!("*{}b", "a".repeat(1000));
        let glob = Glob::new(&pattern).expect("ok");
        let per_page = EXAMINE_WORK.div_ceil(glob.cost(4096));
        assert!(per_page < 20, "{per_page}");
        let mut token: Option<Vec<u8>> = None;
        let mut pages = 0;
        loop {
            let p = page(
                &t,
                pattern.as_bytes(),
                token.as_deref(),
                0,
                ScanPage::default(),
                |_| true,
                &Seal::new(0),
            )
            .expect("ok");
            pages += 1;
            if p == b"*1\r\n*0\r\n" {
                break;
            }
            let prefix = format!("*2\r\n*0\r\n${}\r\n", 4 + 4096);
            assert!(p.starts_with(prefix.as_bytes()));
            token = Some(p[prefix.len()..p.len() - 2].to_vec());
        }
        assert_eq!(pages, 100usize.div_ceil(per_page));
        assert_eq!(
            Glob::new(&"a".repeat(MAX_PATTERN_BYTES + 1)).map(|_| ()),
            Err(format!("it is longer than {MAX_PATTERN_BYTES} bytes"))
        );
    }
}
