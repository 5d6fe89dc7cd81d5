//! From RESP3 elements to a typed command (spec §5.2 - §5.4, steps 1 to 5).

use crate::errors::ServiceError;
use crate::resp3::{Decoded, decode_request};

/// SET's condition (spec §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Always apply.
    Always,
    /// `NX`: only if the key is absent.
    Nx,
    /// `NEX`: if the key is absent or already holds this value.
    Nex,
}

/// A parsed state store request. Keys are never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `GET key`.
    Get {
        /// The key.
        key: &'a [u8],
    },
    /// `SET key value [NX|NEX] [PX ms]`.
    Set {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// NX / NEX.
        condition: Condition,
        /// Time to live in ms (> 0).
        px: Option<u64>,
    },
    /// `DEL key`.
    Del {
        /// The key.
        key: &'a [u8],
    },
    /// `VDEL key value`.
    VDel {
        /// The key.
        key: &'a [u8],
        /// Delete only if the key holds this value.
        value: &'a [u8],
    },
    /// `SCAN pattern [token]` (spec §12).
    Scan {
        /// The glob pattern (may be empty: it matches no key).
        pattern: &'a [u8],
        /// The previous page's token.
        token: Option<&'a [u8]>,
    },
    /// `KEYNOTIFY key [STOP]`.
    KeyNotify {
        /// The key.
        key: &'a [u8],
        /// Unregister instead of register.
        stop: bool,
    },
}

impl Command<'_> {
    /// Whether this command may carry a fencing token (`__ft`).
    pub fn is_fenced_write(&self) -> bool {
        matches!(
            self,
            Command::Set { .. } | Command::Del { .. } | Command::VDel { .. }
        )
    }
}

/// The largest PX accepted (2^53 ms, spec §5.3).
pub const MAX_PX: u64 = 1 << 53;

/// Parses a request payload in the validation order of spec §5.4: framing,
/// verb, element count, options, empty key.
pub fn parse(payload: &[u8]) -> Result<Command<'_>, ServiceError> {
    let items = match decode_request(payload) {
        Ok(Decoded::Complete(items, used)) if used == payload.len() => items,
        _ => return Err(ServiceError::SyntaxError),
    };
    let verb = items[0];
    let args = &items[1..];
    let is = |name: &str| verb.eq_ignore_ascii_case(name.as_bytes());
    let command = if is("GET") {
        let [key] = args else {
            return Err(ServiceError::WrongNumberOfArguments);
        };
        Command::Get { key }
    } else if is("SET") {
        let [key, value, options @ ..] = args else {
            return Err(ServiceError::WrongNumberOfArguments);
        };
        let (condition, px) = set_options(options)?;
        Command::Set {
            key,
            value,
            condition,
            px,
        }
    } else if is("DEL") {
        let [key] = args else {
            return Err(ServiceError::WrongNumberOfArguments);
        };
        Command::Del { key }
    } else if is("VDEL") {
        let [key, value] = args else {
            return Err(ServiceError::WrongNumberOfArguments);
        };
        Command::VDel { key, value }
    } else if is("KEYNOTIFY") {
        match args {
            [key] => Command::KeyNotify { key, stop: false },
            [key, option] if option.eq_ignore_ascii_case(b"STOP") => {
                Command::KeyNotify { key, stop: true }
            }
            [_, _] => return Err(ServiceError::SyntaxError),
            _ => return Err(ServiceError::WrongNumberOfArguments),
        }
    } else if is("SCAN") {
        match *args {
            [pattern] => Command::Scan {
                pattern,
                token: None,
            },
            [pattern, token] => Command::Scan {
                pattern,
                token: Some(token),
            },
            _ => return Err(ServiceError::WrongNumberOfArguments),
        }
    } else {
        return Err(ServiceError::UnknownCommand);
    };
    if !matches!(command, Command::Scan { .. }) && command.key().is_empty() {
        return Err(ServiceError::KeyLengthZero);
    }
    Ok(command)
}

impl<'a> Command<'a> {
    /// The key the command is about (SCAN's pattern).
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Command::Scan { pattern, .. } => pattern,
            Command::Get { key }
            | Command::Set { key, .. }
            | Command::Del { key }
            | Command::VDel { key, .. }
            | Command::KeyNotify { key, .. } => key,
        }
    }
}

/// SET options in any order; a repeat, NX with NEX, PX without a valid value or
/// an unknown token is a syntax error.
fn set_options(options: &[&[u8]]) -> Result<(Condition, Option<u64>), ServiceError> {
    let mut condition = None;
    let mut px = None;
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"NX") || option.eq_ignore_ascii_case(b"NEX") {
            if condition.is_some() {
                return Err(ServiceError::SyntaxError);
            }
            condition = Some(if option.len() == 2 {
                Condition::Nx
            } else {
                Condition::Nex
            });
        } else if option.eq_ignore_ascii_case(b"PX") {
            if px.is_some() {
                return Err(ServiceError::SyntaxError);
            }
            let value = rest.next().ok_or(ServiceError::SyntaxError)?;
            px = Some(milliseconds(value).ok_or(ServiceError::SyntaxError)?);
        } else {
            return Err(ServiceError::SyntaxError);
        }
    }
    Ok((condition.unwrap_or(Condition::Always), px))
}

/// A PX value: ASCII digits with an optional fraction (the .NET client formats
/// a double), rounded up to whole ms; must be > 0 and <= [`MAX_PX`].
fn milliseconds(text: &[u8]) -> Option<u64> {
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    let all_digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    if !all_digits(whole) || fraction.is_some_and(|f| !all_digits(f)) {
        return None;
    }
    let mut ms: u64 = 0;
    for &b in whole {
        ms = ms.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if ms > MAX_PX {
            return None;
        }
    }
    if fraction.is_some_and(|f| f.iter().any(|&b| b != b'0')) {
        ms += 1;
    }
    (ms > 0 && ms <= MAX_PX).then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(parts: &[&[u8]]) -> Vec<u8> {
        crate::resp3::request(parts)
    }

    #[test]
    fn set_options_any_order_any_case() {
        let r = req(&[b"set", b"k", b"v", b"px", b"5000", b"nx"]);
        assert_eq!(
            parse(&r),
            Ok(Command::Set {
                key: b"k",
                value: b"v",
                condition: Condition::Nx,
                px: Some(5000)
            })
        );
        let r = req(&[b"SET", b"k", b"v", b"NEX"]);
        assert_eq!(
            parse(&r),
            Ok(Command::Set {
                key: b"k",
                value: b"v",
                condition: Condition::Nex,
                px: None
            })
        );
    }

    #[test]
    fn validation_order_and_errors() {
        use ServiceError::*;
        let cases: &[(&[&[u8]], ServiceError)] = &[
            (&[b"MGET", b"a"], UnknownCommand),
            (&[b"SCANX", b"a"], UnknownCommand),
            (&[b"SCAN"], WrongNumberOfArguments),
            (&[b"SCAN", b"a", b"0;1;a", b"x"], WrongNumberOfArguments),
            (&[b"GET", b"a", b"b"], WrongNumberOfArguments),
            (&[b"GET"], WrongNumberOfArguments),
            (&[b"SET", b"k"], WrongNumberOfArguments),
            (&[b"DEL"], WrongNumberOfArguments),
            (&[b"VDEL", b"k"], WrongNumberOfArguments),
            (&[b"KEYNOTIFY"], WrongNumberOfArguments),
            (&[b"KEYNOTIFY", b"k", b"STOP", b"x"], WrongNumberOfArguments),
            (&[b"KEYNOTIFY", b"k", b"GO"], SyntaxError),
            (&[b"SET", b"k", b"v", b"PX"], SyntaxError),
            (&[b"SET", b"k", b"v", b"XX"], SyntaxError),
            (&[b"SET", b"k", b"v", b"PX", b"abc"], SyntaxError),
            (&[b"SET", b"k", b"v", b"PX", b"0"], SyntaxError),
            (&[b"SET", b"k", b"v", b"PX", b"-5"], SyntaxError),
            (
                &[b"SET", b"k", b"v", b"PX", b"9007199254740993"],
                SyntaxError,
            ),
            (&[b"SET", b"k", b"v", b"NX", b"NEX"], SyntaxError),
            (&[b"SET", b"k", b"v", b"NX", b"NX"], SyntaxError),
            (&[b"SET", b"k", b"v", b"PX", b"1", b"PX", b"2"], SyntaxError),
            (&[b"GET", b""], KeyLengthZero),
            (&[b"SET", b"", b"v", b"BAD"], SyntaxError),
            (&[b"SET", b"", b"v"], KeyLengthZero),
        ];
        for (parts, want) in cases {
            assert_eq!(parse(&req(parts)), Err(*want), "{parts:?}");
        }
        assert_eq!(parse(b"hello"), Err(SyntaxError));
        assert_eq!(parse(b"*1\r\n$3\r\nGET"), Err(SyntaxError));
        assert_eq!(parse(b""), Err(SyntaxError));
        assert_eq!(parse(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\nX"), Err(SyntaxError));
    }

    #[test]
    fn px_values() {
        assert_eq!(milliseconds(b"1000"), Some(1000));
        assert_eq!(milliseconds(b"1500.5"), Some(1501));
        assert_eq!(milliseconds(b"1500.000"), Some(1500));
        assert_eq!(milliseconds(b"0.1"), Some(1));
        assert_eq!(milliseconds(b"9007199254740992"), Some(MAX_PX));
        for bad in [&b"0"[..], b"0.0", b"", b".5", b"5.", b"1e3", b" 1", b"+1"] {
            assert_eq!(milliseconds(bad), None, "{bad:?}");
        }
    }
}
