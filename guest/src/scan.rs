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

pub use crate::pattern::{Glob, MAX_PATTERN_BYTES};
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

/// The key a token resumes after, if the token parses.
pub fn parse_token(token: &[u8]) -> Option<&[u8]> {
    let mut parts = token.splitn(3, |&b| b == b';');
    let number = |p: Option<&[u8]>| {
        p.is_some_and(|p| (1..=20).contains(&p.len()) && p.iter().all(u8::is_ascii_digit))
    };
    let (chain, topology, key) = (parts.next(), parts.next(), parts.next());
    (number(chain) && number(topology)).then_some(key?)
}

/// The reply payload of one SCAN page: `pattern` over `table` at `now`,
/// after the key of `token`, of the keys `readable` allows (the others are
/// looked at, never listed). `Err` is the text of an `-ERR` reply.
pub fn page(
    table: &Table,
    pattern: &[u8],
    token: Option<&[u8]>,
    now: u64,
    limits: ScanPage,
    readable: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>, String> {
    let after = match token {
        None => None,
        Some(t) => Some(parse_token(t).ok_or_else(|| BAD_TOKEN.to_string())?),
    };
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
    let token = if more { last } else { None };
    Ok(encode(&keys, bytes, token))
}

/// `*1\r\n*<k>\r\n<keys>` (the last page) or `*2\r\n*<k>\r\n<keys><token>`.
fn encode(keys: &[&[u8]], bytes: usize, resume_after: Option<&[u8]>) -> Vec<u8> {
    let token_len = resume_after.map_or(0, |k| resp3::bulk_len(TOKEN_PREFIX.len() + k.len()));
    let mut out = Vec::with_capacity(32 + bytes + token_len);
    let parts = if resume_after.is_some() { 2 } else { 1 };
    out.extend_from_slice(format!("*{parts}\r\n*{}\r\n", keys.len()).as_bytes());
    for key in keys {
        resp3::push_bulk(&mut out, key);
    }
    if let Some(key) = resume_after {
        let mut token = Vec::with_capacity(TOKEN_PREFIX.len() + key.len());
        token.extend_from_slice(TOKEN_PREFIX);
        token.extend_from_slice(key);
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

    #[test]
    fn pages_and_tokens() {
        let t = table(&[b"a1", b"a2", b"b1", b"exp1", b"\xff\xfe"]);
        let all = page(&t, b"*", None, 20, ScanPage::default(), |_| true).expect("ok");
        assert_eq!(all, b"*1\r\n*3\r\n$2\r\na1\r\n$2\r\na2\r\n$2\r\nb1\r\n");
        let live = page(&t, b"*", None, 5, ScanPage::default(), |_| true).expect("ok");
        assert!(live.starts_with(b"*1\r\n*4\r\n"), "exp1 is live at 5");
        let one = page(&t, b"a*", None, 20, limits(1, 1000), |_| true).expect("ok");
        assert_eq!(one, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a1\r\n");
        let two = page(&t, b"a*", Some(b"0;1;a1"), 20, limits(1, 1000), |_| true).expect("ok");
        assert_eq!(two, b"*2\r\n*1\r\n$2\r\na2\r\n$6\r\n0;1;a2\r\n");
        // The page that finds no more matches and nothing after: the last.
        let three = page(&t, b"a*", Some(b"0;1;a2"), 20, limits(1, 1000), |_| true).expect("ok");
        assert_eq!(three, b"*1\r\n*0\r\n");
        // A token names any key, present or not.
        let gone = page(&t, b"*", Some(b"7;42;a15"), 20, ScanPage::default(), |_| {
            true
        })
        .expect("ok");
        assert_eq!(gone, b"*1\r\n*2\r\n$2\r\na2\r\n$2\r\nb1\r\n");
        // A byte limit smaller than one key still returns one key a page;
        // the token names the last key looked at (a2), not the last returned.
        let tiny = page(&t, b"?1", None, 20, limits(100, 1), |_| true).expect("ok");
        assert_eq!(tiny, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a2\r\n");
        let next = page(&t, b"?1", Some(b"0;1;a2"), 20, limits(100, 1), |_| true).expect("ok");
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
                page(&t, b"*", Some(bad), 0, ScanPage::default(), |_| true),
                Err(BAD_TOKEN.into()),
                "{bad:?}"
            );
        }
        assert_eq!(parse_token(b"1;2;"), Some(&b""[..]));
        assert_eq!(parse_token(b"1;2;a;b"), Some(&b"a;b"[..]));
        for bad in [&b"***"[..], b"a**", b"[ab"] {
            let e = page(&t, bad, None, 0, ScanPage::default(), |_| true).expect_err("an error");
            assert!(e.starts_with("the pattern is not valid: "), "{e}");
        }
        assert_eq!(
            page(&t, b"\xff*", None, 0, ScanPage::default(), |_| true).expect("ok"),
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
