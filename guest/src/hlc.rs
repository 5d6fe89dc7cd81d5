//! The hybrid logical clock of spec §8.
//!
//! Text form `<wall>:<counter>:<node>`, emitted as `%015d:%05d:%s`. Ordering is
//! wall, then counter, then node id by bytes (§8.3), which is the derived order
//! of [`Hlc`]'s fields.

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

/// A `__ts` or `__ft` value that is not `<digits>:<digits>:<node>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedTimestamp;

impl Hlc {
    /// Parses the text form (§8.2): exactly three `:`-separated parts, the first
    /// two non-empty ASCII digits that fit in a u64, the third kept as is.
    pub fn parse(text: &str) -> Result<Hlc, MalformedTimestamp> {
        // Byte searches rather than `split`: this runs for every request.
        let colon = |s: &str| s.bytes().position(|b| b == b':');
        let first = colon(text).ok_or(MalformedTimestamp)?;
        let (wall, rest) = (&text[..first], &text[first + 1..]);
        let second = colon(rest).ok_or(MalformedTimestamp)?;
        let (counter, node) = (&rest[..second], &rest[second + 1..]);
        if colon(node).is_some() {
            return Err(MalformedTimestamp);
        }
        Ok(Hlc {
            wall: digits(wall)?,
            counter: digits(counter)?,
            node: node.to_string(),
        })
    }

    /// Whether this timestamp is more than [`MAX_SKEW_MS`] ahead of `now`.
    pub fn too_far_ahead_of(&self, now: u64) -> bool {
        self.wall.saturating_sub(now) > MAX_SKEW_MS
    }
}

fn digits(s: &str) -> Result<u64, MalformedTimestamp> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MalformedTimestamp);
    }
    if s.len() > 19 {
        // Could overflow: the checked (slower) parse.
        return s.parse().map_err(|_| MalformedTimestamp);
    }
    // Up to 19 digits fit in a u64: no overflow checks (in wasm, 64-bit
    // overflow checks call a 128-bit multiply).
    Ok(s.bytes().fold(0u64, |v, b| v * 10 + u64::from(b - b'0')))
}

/// Appends `v` in decimal, zero-padded to at least `width` digits (what
/// `{:0width$}` does, without the formatting machinery: this is on the path
/// of every reply).
fn push_padded(out: &mut String, v: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    // 64-bit division in wasm32 goes through a 128-bit multiply: peel off
    // nine digits at a time with it, then use 32-bit arithmetic.
    let mut n = v;
    loop {
        let (mut chunk, rest) = if n >= 1_000_000_000 {
            ((n % 1_000_000_000) as u32, n / 1_000_000_000)
        } else {
            (n as u32, 0)
        };
        let mut produced = 0;
        while chunk != 0 || (rest != 0 && produced < 9) || produced == 0 {
            i -= 1;
            digits[i] = b'0' + (chunk % 10) as u8;
            chunk /= 10;
            produced += 1;
            if rest == 0 && chunk == 0 {
                break;
            }
        }
        if rest == 0 {
            break;
        }
        n = rest;
    }
    let len = (digits.len() - i).max(width.min(digits.len()));
    for &d in &digits[digits.len() - len..] {
        out.push(char::from(d));
    }
}

impl Hlc {
    /// The wire form `{wall:015}:{counter:05}:{node}`, as [`fmt::Display`] gives it.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(22 + self.node.len());
        push_padded(&mut s, self.wall, 15);
        s.push(':');
        push_padded(&mut s, self.counter, 5);
        s.push(':');
        s.push_str(&self.node);
        s
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

/// The counter would pass [`MAX_COUNTER`]; the request gets a 500 (`__propName: Counter`).
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
        let (lw, lc) = (self.wall, self.counter);
        let (rw, rc) = (remote.wall, remote.counter);
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
        let next = if now > self.wall {
            (now, 0)
        } else {
            (self.wall, self.counter.saturating_add(1))
        };
        self.set(next)
    }

    fn set(&mut self, (wall, counter): (u64, u64)) -> Result<Hlc, CounterOverflow> {
        if counter > MAX_COUNTER {
            return Err(CounterOverflow);
        }
        self.wall = wall;
        self.counter = counter;
        Ok(self.current())
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
    fn counter_overflow_leaves_clock_alone() {
        let mut c = Clock::new("N".into());
        assert_eq!(c.receive(&hlc(5, u64::MAX, "C"), 5), Err(CounterOverflow));
        assert_eq!(c.current(), hlc(0, 0, "N"));
        assert_eq!(
            c.receive(&hlc(5, MAX_COUNTER, "C"), 5),
            Err(CounterOverflow)
        );
        assert_eq!(
            c.receive(&hlc(5, MAX_COUNTER - 1, "C"), 5),
            Ok(hlc(5, MAX_COUNTER, "N"))
        );
    }

    #[test]
    fn skew() {
        assert!(!hlc(160_000, 0, "").too_far_ahead_of(100_000));
        assert!(hlc(160_001, 0, "").too_far_ahead_of(100_000));
        assert!(!hlc(0, 0, "").too_far_ahead_of(100_000));
    }
}
