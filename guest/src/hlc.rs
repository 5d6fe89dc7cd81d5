//! The hybrid logical clock of spec §8.
//!
//! Text form `<wall>:<counter>:<node>`, emitted as `%015d:%05d:%s`. Ordering is
//! wall, then counter, then node id by bytes (§8.3), which is the derived order
//! of [`Hlc`]'s fields.
//!
//! The request path works on [`Version`]s (the server's own timestamps: the
//! node id is always the store's) and on [`Hlc::parse_parts`] (a request's
//! `__ts`, borrowed), so that handling a request allocates no HLC: an owned
//! [`Hlc`] is only built where a node id other than ours must be kept (a
//! fencing token).

use core::fmt;

/// How far ahead of the server clock a request `__ts` or `__ft` may be (§8.4, §9).
pub const MAX_SKEW_MS: u64 = 60_000;

/// The largest counter we emit: .NET parses the counter as an `Int32` (§8.4).
pub const MAX_COUNTER: u64 = i32::MAX as u64 - 1;

/// A hybrid-logical-clock timestamp: a key's version, a fencing token, a request `__ts`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub wall: u64,
    /// Logical counter within one millisecond.
    pub counter: u64,
    /// Opaque node id (no `:`).
    pub node: String,
}

/// A server-issued version: the node id is always the store's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// HLC wall time, ms.
    pub wall: u64,
    /// HLC counter (< 2^31).
    pub counter: u32,
}

impl Version {
    /// The version part of a server-issued HLC.
    pub fn of(hlc: &Hlc) -> Version {
        // The clock never issues a counter above MAX_COUNTER < u32::MAX.
        Version {
            wall: hlc.wall,
            counter: u32::try_from(hlc.counter).unwrap_or(u32::MAX),
        }
    }

    /// This version as an HLC of `node`.
    pub fn to_hlc(self, node: &str) -> Hlc {
        Hlc {
            wall: self.wall,
            counter: u64::from(self.counter),
            node: node.to_string(),
        }
    }

    /// The wire form of this version as an HLC of `node` (what
    /// `self.to_hlc(node).encode()` gives, with one allocation).
    pub fn encode(self, node: &str) -> String {
        encode(self.wall, u64::from(self.counter), node)
    }

    /// Appends [`Version::encode`]'s text to `out` (no allocation of its own).
    pub fn encode_into(self, node: &str, out: &mut Vec<u8>) {
        let (digits, i) = padded(self.wall, 15);
        out.extend_from_slice(&digits[i..]);
        out.push(b':');
        let (digits, i) = padded(u64::from(self.counter), 5);
        out.extend_from_slice(&digits[i..]);
        out.push(b':');
        out.extend_from_slice(node.as_bytes());
    }
}

/// A `__ts` or `__ft` value that is not `<digits>:<digits>:<node>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedTimestamp;

impl Hlc {
    /// Parses the text form (§8.2): exactly three `:`-separated parts, the first
    /// two non-empty ASCII digits that fit in a u64, the third kept as is.
    pub fn parse(text: &str) -> Result<Hlc, MalformedTimestamp> {
        let (wall, counter, node) = Hlc::parse_parts(text)?;
        Ok(Hlc {
            wall,
            counter,
            node: node.to_string(),
        })
    }

    /// [`Hlc::parse`] without copying the node id: `(wall, counter, node)`.
    /// One pass over the text (this runs for every request).
    pub fn parse_parts(text: &str) -> Result<(u64, u64, &str), MalformedTimestamp> {
        let b = text.as_bytes();
        let (wall, i) = digits_to_colon(b, 0)?;
        let (counter, j) = digits_to_colon(b, i)?;
        let node = &text[j..];
        if node.as_bytes().contains(&b':') {
            return Err(MalformedTimestamp);
        }
        Ok((wall, counter, node))
    }

    /// Whether this timestamp is more than [`MAX_SKEW_MS`] ahead of `now`.
    pub fn too_far_ahead_of(&self, now: u64) -> bool {
        too_far_ahead(self.wall, now)
    }
}

/// Whether a timestamp of wall time `wall` is more than [`MAX_SKEW_MS`] ahead of `now`.
pub fn too_far_ahead(wall: u64, now: u64) -> bool {
    wall.saturating_sub(now) > MAX_SKEW_MS
}

/// The non-empty run of ASCII digits at `b[start..]` that ends with a `:`,
/// as a u64, and the index after the `:`.
///
/// Eight bytes a step: the digits at the start of a word are found and
/// valued with word arithmetic, so a `__ts` (15 + 5 digits) takes four
/// steps and no loop per digit.
fn digits_to_colon(b: &[u8], start: usize) -> Result<(u64, usize), MalformedTimestamp> {
    let mut v = 0u64;
    let mut i = start;
    loop {
        let x = match b.get(i..i + 8) {
            Some(w) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(w);
                u64::from_le_bytes(a)
            }
            None => {
                // The last bytes, padded with bytes that are not digits.
                let mut a = [0xFFu8; 8];
                for (d, s) in a.iter_mut().zip(b.get(i..).unwrap_or_default()) {
                    *d = *s;
                }
                u64::from_le_bytes(a)
            }
        };
        let k = leading_digits(x);
        if k > 0 {
            // The k digits' values in the top bytes, zeros below them.
            let value = digit_values(x.wrapping_sub(ZEROS) << (8 * (8 - k)));
            let digits = i - start + k;
            v = if digits <= 19 {
                // Up to 19 digits fit in a u64: no overflow checks (in wasm,
                // 64-bit overflow checks call a 128-bit multiply).
                v * POW10[k] + value
            } else {
                v.checked_mul(POW10[k])
                    .and_then(|v| v.checked_add(value))
                    .ok_or(MalformedTimestamp)?
            };
        }
        i += k;
        if k < 8 {
            break;
        }
    }
    if i == start || b.get(i) != Some(&b':') {
        return Err(MalformedTimestamp);
    }
    Ok((v, i + 1))
}

const ZEROS: u64 = 0x3030_3030_3030_3030;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// 10^0 to 10^8.
const POW10: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// How many of the bytes of `x`, read little-endian (the first byte in the
/// lowest), are ASCII digits before the first one that is not (0 to 8).
fn leading_digits(x: u64) -> usize {
    // A byte minus '0' is a digit's value (0..=9) exactly when adding 0x76
    // leaves its high bit clear and it was clear before. Carries only go
    // from a byte that is not a digit to higher ones: the lowest flagged
    // byte is the first that is not a digit.
    let t = x ^ ZEROS;
    let not_digit = (t.wrapping_add(0x7676_7676_7676_7676) | t) & HIGH_BITS;
    (not_digit.trailing_zeros() / 8) as usize
}

/// The value of the eight decimal digit values (0..=9) in the bytes of `x`,
/// the first and most significant in the lowest byte: pairs, then fours,
/// then all eight.
fn digit_values(x: u64) -> u64 {
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00FF_00FF_00FF_00FF;
    let x = (x.wrapping_mul(100) + (x >> 16)) & 0x0000_FFFF_0000_FFFF;
    (x.wrapping_mul(10_000) + (x >> 32)) & 0xFFFF_FFFF
}

/// "00" to "99".
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends `v` in decimal, zero-padded to at least `width` digits (what
/// `{:0width$}` does, without the formatting machinery: this is on the path
/// of every reply).
fn push_padded(out: &mut String, v: u64, width: usize) {
    let (digits, i) = padded(v, width);
    // ASCII digits: always UTF-8.
    out.push_str(core::str::from_utf8(&digits[i..]).unwrap_or_default());
}

/// `v` in decimal, zero-padded to at least `width` (at most 20) digits: the
/// digits are `array[index..]`.
fn padded(v: u64, width: usize) -> ([u8; 20], usize) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    let mut pair = |i: &mut usize, d: u32| {
        *i -= 2;
        let d = d as usize * 2;
        digits[*i..*i + 2].copy_from_slice(&PAIRS[d..d + 2]);
    };
    // 64-bit division in wasm32 goes through a 128-bit multiply: peel off
    // eight digits at a time with it, then use 32-bit arithmetic.
    let mut n = v;
    while n > u64::from(u32::MAX) {
        let (q, mut r) = (n / 100_000_000, (n % 100_000_000) as u32);
        for _ in 0..4 {
            pair(&mut i, r % 100);
            r /= 100;
        }
        n = q;
    }
    let mut r = n as u32;
    while r >= 100 {
        pair(&mut i, r % 100);
        r /= 100;
    }
    if r >= 10 {
        pair(&mut i, r);
    } else {
        i -= 1;
        digits[i] = b'0' + r as u8;
    }
    let len = (digits.len() - i).max(width.min(digits.len()));
    (digits, digits.len() - len)
}

/// `{wall:015}:{counter:05}:{node}`.
fn encode(wall: u64, counter: u64, node: &str) -> String {
    let mut s = String::with_capacity(22 + node.len());
    push_padded(&mut s, wall, 15);
    s.push(':');
    push_padded(&mut s, counter, 5);
    s.push(':');
    s.push_str(node);
    s
}

impl Hlc {
    /// The wire form `{wall:015}:{counter:05}:{node}`, as [`fmt::Display`] gives it.
    pub fn encode(&self) -> String {
        encode(self.wall, self.counter, &self.node)
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

/// The clock cannot move: its wall time is at `u64::MAX` (no client can get
/// it there: request timestamps are at most [`MAX_SKEW_MS`] ahead). The
/// request gets a 500 (`__propName: Counter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterOverflow;

/// The server's clock `L = (lw, lc, NODE)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    wall: u64,
    counter: u64,
    node: String,
}

impl Clock {
    /// A clock at zero with this node id.
    pub fn new(node: String) -> Clock {
        Clock {
            wall: 0,
            counter: 0,
            node,
        }
    }

    /// A clock restored at `(wall, counter)`.
    pub fn restored(node: String, wall: u64, counter: u64) -> Clock {
        Clock {
            wall,
            counter,
            node,
        }
    }

    /// The current value of L.
    pub fn current(&self) -> Hlc {
        Hlc {
            wall: self.wall,
            counter: self.counter,
            node: self.node.clone(),
        }
    }

    /// The current value of L as a version.
    pub fn version(&self) -> Version {
        Version {
            wall: self.wall,
            counter: u32::try_from(self.counter).unwrap_or(u32::MAX),
        }
    }

    /// `(wall, counter)` of L, for snapshots.
    pub fn parts(&self) -> (u64, u64) {
        (self.wall, self.counter)
    }

    /// Moves L up to `(wall, counter)` if that is later (journal replay: no
    /// version issued after a restart may be older than one issued before).
    pub fn observe(&mut self, wall: u64, counter: u64) {
        if (wall, counter) > (self.wall, self.counter) {
            self.wall = wall;
            self.counter = counter;
        }
    }

    /// The receive rule of §8.4 for a request carrying `remote` (already checked
    /// for skew), at `now`. Returns the new L. L is unchanged on error.
    pub fn receive(&mut self, remote: &Hlc, now: u64) -> Result<Hlc, CounterOverflow> {
        self.receive_parts(remote.wall, remote.counter, now)?;
        Ok(self.current())
    }

    /// [`Clock::receive`] of a remote `(wall, counter)` (the node id plays no
    /// part), returning the new L as a version.
    pub fn receive_parts(
        &mut self,
        rw: u64,
        rc: u64,
        now: u64,
    ) -> Result<Version, CounterOverflow> {
        let (lw, lc) = (self.wall, self.counter);
        let next = if now > lw && now > rw {
            (now, 0)
        } else if lw == rw {
            (lw, lc.max(rc).saturating_add(1))
        } else if lw > rw {
            (lw, lc.saturating_add(1))
        } else {
            (rw, rc.saturating_add(1))
        };
        self.set(next)
    }

    /// The local tick of §8.4 (no remote timestamp, or a timer event).
    pub fn tick(&mut self, now: u64) -> Result<Hlc, CounterOverflow> {
        self.tick_version(now)?;
        Ok(self.current())
    }

    /// [`Clock::tick`], returning the new L as a version.
    pub fn tick_version(&mut self, now: u64) -> Result<Version, CounterOverflow> {
        let next = if now > self.wall {
            (now, 0)
        } else {
            (self.wall, self.counter.saturating_add(1))
        };
        self.set(next)
    }

    /// Moves L to `(wall, counter)`, or, if the counter would pass
    /// [`MAX_COUNTER`] (the .NET client reads it as an `Int32`), to the next
    /// millisecond with counter 0: still later than both the old L and any
    /// remote timestamp it absorbed. This is the "wait for the next ms" of
    /// §8.4, done logically rather than by waiting, so that a client whose
    /// `__ts` carries a huge counter (up to the skew limit ahead) cannot make
    /// every other client's requests fail until real time catches up.
    fn set(&mut self, (wall, counter): (u64, u64)) -> Result<Version, CounterOverflow> {
        let (wall, counter) = if counter > MAX_COUNTER {
            (wall.checked_add(1).ok_or(CounterOverflow)?, 0)
        } else {
            (wall, counter)
        };
        self.wall = wall;
        self.counter = counter;
        Ok(self.version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_matches_the_format_string() {
        for (wall, counter) in [
            (0, 0),
            (1, 2),
            (1_700_000_000_000, 99_999),
            (999_999_999_999_999, 100_000),
            (1_000_000_000_000_000, 7),
            (u64::MAX, u64::MAX),
        ] {
            let h = Hlc {
                wall,
                counter,
                node: "n1".into(),
            };
            assert_eq!(h.encode(), format!("{wall:015}:{counter:05}:n1"));
            assert_eq!(h.to_string(), h.encode());
        }
        // Powers of ten and their neighbours, and pseudo-random values.
        let mut values = vec![u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        for _ in 0..20 {
            values.extend([
                p - 1,
                p,
                p.saturating_add(1),
                p.saturating_mul(3).saturating_add(7),
            ]);
            p = p.saturating_mul(10);
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            for width in [0, 5, 15] {
                let mut s = String::new();
                push_padded(&mut s, v, width);
                assert_eq!(s, format!("{v:0width$}"), "{v} width {width}");
            }
            let version = Version {
                wall: v,
                counter: (v % 100_000) as u32,
            };
            let mut bytes = b"prefix".to_vec();
            version.encode_into("node-1", &mut bytes);
            assert_eq!(
                bytes,
                format!("prefix{}", version.encode("node-1")).as_bytes()
            );
            let text = format!("{v}:{}:n", v % 100_000);
            let h = Hlc::parse(&text).expect("parses");
            assert_eq!((h.wall, h.counter), (v, v % 100_000));
        }
        assert!(
            Hlc::parse("18446744073709551616:0:n").is_err(),
            "u64 overflow"
        );
        assert!(Hlc::parse("99999999999999999999:0:n").is_err());
    }

    fn hlc(wall: u64, counter: u64, node: &str) -> Hlc {
        Hlc {
            wall,
            counter,
            node: node.into(),
        }
    }

    #[test]
    fn format_is_padded() {
        assert_eq!(
            hlc(1696374425000, 1, "StateStore").to_string(),
            "001696374425000:00001:StateStore"
        );
        assert_eq!(hlc(0, 0, "").to_string(), "000000000000000:00000:");
    }

    #[test]
    fn parse() {
        assert_eq!(
            Hlc::parse("1696374425000:0:CLIENT"),
            Ok(hlc(1696374425000, 0, "CLIENT"))
        );
        assert_eq!(Hlc::parse("001:00002:"), Ok(hlc(1, 2, "")));
        for bad in [
            "abc",
            "1:2",
            "x:0:n",
            "1:2:3:4",
            ":1:n",
            "1::n",
            "-1:0:n",
            "1:+2:n",
            " 1:2:n",
            "99999999999999999999:0:n",
        ] {
            assert_eq!(Hlc::parse(bad), Err(MalformedTimestamp), "{bad}");
        }
    }

    #[test]
    fn parse_parts_borrows_what_parse_copies() {
        for text in [
            "1696374425000:0:CLIENT",
            "001:00002:",
            "000000000000000000000001:7:n",
            "18446744073709551615:18446744073709551615:x y",
        ] {
            let h = Hlc::parse(text).expect("parses");
            assert_eq!(
                Hlc::parse_parts(text),
                Ok((h.wall, h.counter, h.node.as_str()))
            );
        }
        assert_eq!(
            Hlc::parse("18446744073709551615:0:n").map(|h| h.wall),
            Ok(u64::MAX)
        );
        for bad in ["1:2", "1:2:3:4", ":1:n", "1::n", "1:2x:n", "", ":", "::"] {
            assert_eq!(Hlc::parse_parts(bad), Err(MalformedTimestamp), "{bad}");
        }
    }

    #[test]
    fn digits_a_word_at_a_time() {
        for (text, digits) in [
            ("00000000", 8),
            ("12345678", 8),
            ("1234567:", 7),
            ("/2345678", 0),
            ("12345a78", 5),
            ("1234 678", 4),
            ("\x7f2345678", 0),
            ("9:::::::", 1),
        ] {
            let mut w = [0u8; 8];
            w.copy_from_slice(&text.as_bytes()[..8]);
            let x = u64::from_le_bytes(w);
            assert_eq!(leading_digits(x), digits, "{text:?}");
            if digits == 8 {
                assert_eq!(
                    digit_values(x - ZEROS),
                    text.parse::<u64>().expect("digits")
                );
            }
        }
        // Every byte after a digit: only '0'..='9' count.
        for byte in 0..=255u8 {
            let x = u64::from_le_bytes([b'7', byte, b'x', 0, 0, 0, 0, 0]);
            let want = if byte.is_ascii_digit() { 2 } else { 1 };
            assert_eq!(leading_digits(x), want, "{byte:#x}");
        }
        // Against a plain parser, on strings made of digits, colons and
        // other characters, of every length up to 30.
        let reference = |text: &str| -> Option<(u64, u64, String)> {
            let parts: Vec<&str> = text.split(':').collect();
            let [wall, counter, node] = parts[..] else {
                return None;
            };
            let number = |p: &str| {
                (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse::<u64>().ok())
                    .flatten()
            };
            Some((number(wall)?, number(counter)?, node.to_string()))
        };
        let alphabet = ['0', '1', '5', '9', ':', 'a', '/', '\u{e9}', '\u{7f}'];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 31) as usize;
            let mut y = x;
            let text: String = (0..len)
                .map(|_| {
                    y = y.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    // Mostly digits, so that long runs happen.
                    let r = (y >> 33) as usize;
                    if r.is_multiple_of(4) {
                        alphabet[r / 4 % alphabet.len()]
                    } else {
                        '3'
                    }
                })
                .collect();
            assert_eq!(
                Hlc::parse_parts(&text)
                    .ok()
                    .map(|(w, c, n)| (w, c, n.to_string())),
                reference(&text),
                "{text:?}"
            );
        }
        // Every length of digit run around the 8- and 16-digit steps.
        for len in 1..=24 {
            let digits: String = (0..len).map(|i| char::from(b'1' + (i % 9) as u8)).collect();
            let text = format!("{digits}:{digits}:node");
            let expected = digits.parse::<u64>().ok();
            assert_eq!(
                Hlc::parse_parts(&text)
                    .ok()
                    .map(|(w, c, n)| (w, c, n.to_string())),
                expected.map(|v| (v, v, "node".to_string())),
                "{text}"
            );
        }
    }

    #[test]
    fn version_encodes_as_its_hlc() {
        for (wall, counter) in [(0, 0), (1_700_000_000_123, 42), (u64::MAX, u32::MAX)] {
            let v = Version { wall, counter };
            assert_eq!(v.encode("node-1"), v.to_hlc("node-1").encode());
            assert_eq!(Version::of(&v.to_hlc("x")), v);
        }
    }

    #[test]
    fn order() {
        assert!(hlc(1, 9, "z") < hlc(2, 0, "a"));
        assert!(hlc(1, 1, "z") < hlc(1, 2, "a"));
        assert!(hlc(1, 1, "a") < hlc(1, 1, "b"));
    }

    #[test]
    fn receive_rules() {
        // Article example: equal clocks give counter + 1.
        let mut c = Clock::new("StateStore".into());
        let t = 1696374425000;
        assert_eq!(
            c.receive(&hlc(t, 0, "CLIENT"), t),
            Ok(hlc(t, 1, "StateStore"))
        );
        // now ahead of both: fresh ms, counter 0.
        assert_eq!(
            c.receive(&hlc(t, 5, "C"), t + 10),
            Ok(hlc(t + 10, 0, "StateStore"))
        );
        // lw == rw: max(lc, rc) + 1.
        assert_eq!(
            c.receive(&hlc(t + 10, 7, "C"), t + 5),
            Ok(hlc(t + 10, 8, "StateStore"))
        );
        // lw > rw: lc + 1.
        assert_eq!(
            c.receive(&hlc(t, 100, "C"), t + 5),
            Ok(hlc(t + 10, 9, "StateStore"))
        );
        // rw > lw: (rw, rc + 1).
        assert_eq!(
            c.receive(&hlc(t + 20, 3, "C"), t + 5),
            Ok(hlc(t + 20, 4, "StateStore"))
        );
        assert_eq!(c.tick(t + 5), Ok(hlc(t + 20, 5, "StateStore")));
        assert_eq!(c.tick(t + 21), Ok(hlc(t + 21, 0, "StateStore")));
    }

    #[test]
    fn a_counter_that_would_overflow_moves_to_the_next_millisecond() {
        let mut c = Clock::new("N".into());
        assert_eq!(c.receive(&hlc(5, u64::MAX, "C"), 5), Ok(hlc(6, 0, "N")));
        let mut c = Clock::new("N".into());
        assert_eq!(c.receive(&hlc(5, MAX_COUNTER, "C"), 5), Ok(hlc(6, 0, "N")));
        let mut c = Clock::new("N".into());
        assert_eq!(
            c.receive(&hlc(5, MAX_COUNTER - 1, "C"), 5),
            Ok(hlc(5, MAX_COUNTER, "N"))
        );
        // A poisoned clock: a timestamp 59 s ahead with a counter at the
        // limit. Every later receive and tick still succeeds, each later
        // than the last, and the clock stays within a millisecond or so of
        // the highest timestamp it was given.
        let now = 1_700_000_000_000;
        let mut c = Clock::new("N".into());
        let mut last = c
            .receive(&hlc(now + 59_000, MAX_COUNTER - 1, "A"), now)
            .expect("ok");
        for i in 0..1000 {
            let next = if i % 2 == 0 {
                c.receive(&hlc(now + i, 0, "B"), now + i)
            } else {
                c.tick(now + i)
            }
            .expect("the clock keeps moving");
            assert!(next > last, "{next:?} after {last:?}");
            assert!(next.counter <= MAX_COUNTER);
            last = next;
        }
        assert!(last.wall <= now + 59_001, "{last:?}");
        // Only a wall time at the end of u64 cannot move.
        let mut c = Clock::restored("N".into(), u64::MAX, MAX_COUNTER);
        assert_eq!(c.tick(0), Err(CounterOverflow));
    }

    #[test]
    fn skew() {
        assert!(!hlc(160_000, 0, "").too_far_ahead_of(100_000));
        assert!(hlc(160_001, 0, "").too_far_ahead_of(100_000));
        assert!(!hlc(0, 0, "").too_far_ahead_of(100_000));
    }
}
