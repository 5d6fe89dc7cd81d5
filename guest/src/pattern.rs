//! Glob patterns with the rules of the real store: the `glob` crate's
//! (SCAN, `--persist custom`). A leaf module: it uses no other.

/// Longest pattern accepted (its matching cost grows with its length).
pub const MAX_PATTERN_BYTES: usize = 1024;

/// A compiled glob pattern.
#[derive(Debug, Clone)]
pub struct Glob(glob::Pattern, usize);

impl Glob {
    /// Compiles `pattern`, or says why it is not one.
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!("it is longer than {MAX_PATTERN_BYTES} bytes"));
        }
        // The matcher backtracks at each `*`: a key may then cost its
        // length times the pattern's; without one, about its length.
        let factor = if pattern.contains('*') {
            pattern.len().max(1)
        } else {
            1
        };
        glob::Pattern::new(pattern)
            .map(|p| Glob(p, factor))
            .map_err(|e| format!("{} (near character {})", e.msg, e.pos))
    }

    /// `text` as a pattern that matches exactly it (`*`, `?` and `[` put
    /// in brackets).
    pub fn escape(text: &str) -> String {
        glob::Pattern::escape(text)
    }

    /// About how many steps matching a key of `len` bytes can take, at
    /// worst (for budgets of work).
    pub fn cost(&self, len: usize) -> usize {
        len.saturating_add(1).saturating_mul(self.1)
    }

    /// Whether `key` is UTF-8 text the pattern matches as a whole.
    pub fn matches(&self, key: &[u8]) -> bool {
        core::str::from_utf8(key).is_ok_and(|k| self.0.matches(k))
    }
}
