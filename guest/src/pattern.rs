//! Glob patterns with the rules of the real store: the `glob` crate's
//! (SCAN, `--persist custom`). A leaf module: it uses no other.

/// Longest pattern accepted (its matching cost grows with its length).
pub const MAX_PATTERN_BYTES: usize = 4096;

/// A compiled glob pattern.
#[derive(Debug, Clone)]
pub struct Glob(glob::Pattern);

impl Glob {
    /// Compiles `pattern`, or says why it is not one.
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!("it is longer than {MAX_PATTERN_BYTES} bytes"));
        }
        glob::Pattern::new(pattern)
            .map(Glob)
            .map_err(|e| format!("{} (near character {})", e.msg, e.pos))
    }

    /// Whether `key` is UTF-8 text the pattern matches as a whole.
    pub fn matches(&self, key: &[u8]) -> bool {
        core::str::from_utf8(key).is_ok_and(|k| self.0.matches(k))
    }
}
