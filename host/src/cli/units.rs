//! One rule for the units of the command line and the config file:
//! durations with a suffix (`500ms`, `10s`, `5m`, `1h`), sizes with one
//! (`512KiB`, `64MiB`, `1GiB`, `100B`). A bare number is the flag's old
//! unit (the one its old name, e.g. `--max-value-mib`, still accepted,
//! says), so that old command lines and files mean what they meant.

use std::time::Duration;

/// Splits `s` into its number and its suffix.
fn split(s: &str) -> Result<(u64, &str), String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits == 0 {
        return Err(format!("{s:?} is not a number with a unit"));
    }
    let n = s[..digits]
        .parse::<u64>()
        .map_err(|_| format!("{s:?} is too large"))?;
    Ok((n, s[digits..].trim()))
}

/// A duration; `bare` is the unit of a number without a suffix.
fn duration(s: &str, bare: Duration) -> Result<Duration, String> {
    let (n, unit) = split(s)?;
    let unit = match unit.to_ascii_lowercase().as_str() {
        "" => bare,
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" | "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}: use ms, s, m or h (e.g. 500ms, 10s)"
            ));
        }
    };
    u32::try_from(n)
        .ok()
        .and_then(|n| unit.checked_mul(n))
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A size in bytes; `bare` is the unit of a number without a suffix.
fn size(s: &str, bare: u64) -> Result<u64, String> {
    let (n, unit) = split(s)?;
    let unit = match unit.to_ascii_lowercase().as_str() {
        "" => bare,
        "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}: use B, KiB, MiB or GiB (e.g. 64MiB)"
            ));
        }
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A duration whose bare number is in milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<Duration, String> {
    duration(s, Duration::from_millis(1))
}

/// A duration whose bare number is in seconds.
pub fn parse_duration_secs(s: &str) -> Result<Duration, String> {
    duration(s, Duration::from_secs(1))
}

/// A size whose bare number is in MiB.
pub fn parse_size_mib(s: &str) -> Result<u64, String> {
    size(s, 1 << 20)
}

/// A size whose bare number is in KiB.
pub fn parse_size_kib(s: &str) -> Result<u64, String> {
    size(s, 1 << 10)
}

/// A size as the help and `config check` print it: the largest unit that
/// divides it.
pub fn show_size(bytes: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}B")
}

/// A duration as the help and `config check` print it.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_numbers_keep_the_old_unit_and_suffixes_say_theirs() {
        assert_eq!(parse_duration_ms("1500"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration_ms("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration_secs("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration_secs("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration_secs("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration_secs("1H"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_size_mib("16"), Ok(16 << 20));
        assert_eq!(parse_size_mib("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size_mib("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size_kib("64"), Ok(64 << 10));
        assert_eq!(parse_size_kib("100B"), Ok(100));
        assert!(matches!(parse_size_mib("lots"), Err(e) if e.contains("not a number")));
        assert!(matches!(parse_size_mib("5MB"), Err(e) if e.contains("unknown unit")));
        assert!(parse_duration_ms("-1").is_err());
        assert!(parse_size_mib("99999999999999GiB").is_err());
        assert_eq!(show_size(64 << 20), "64MiB");
        assert_eq!(show_size(1536), "1536B");
        assert_eq!(show_size(3 << 10), "3KiB");
        assert_eq!(show_duration(Duration::from_secs(300)), "5m");
        assert_eq!(show_duration(Duration::from_millis(250)), "250ms");
    }
}
