//! Request decoder.

/// The result of feeding bytes to [`decode_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole request: its bulk strings (borrowed from the input) and how many
    /// bytes of input it used.
    Complete(Vec<&'a [u8]>, usize),
    /// The input is a valid prefix of a request; more bytes are needed.
    Partial,
}

/// Why the input can never be a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The first byte is not `*`.
    NotAnArray,
    /// An element is not a bulk string (`$`).
    NotABulkString,
    /// A length or count is not plain ASCII decimal (sign, empty, other bytes).
    BadNumber,
    /// A length or count does not fit in memory.
    Overflow,
    /// An array with no elements.
    EmptyArray,
    /// A line or a bulk string is not terminated by CRLF.
    MissingCrlf,
}

/// The largest count or length accepted: larger cannot fit in an MQTT message.
const MAX_LEN: u64 = 1 << 32;

/// Decodes one request from the start of `buf`.
pub fn decode_request(buf: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    let mut pos = 0;
    match buf.first() {
        None => return Ok(Decoded::Partial),
        Some(b'*') => pos += 1,
        Some(_) => return Err(DecodeError::NotAnArray),
    }
    let Some((count, used)) = number(&buf[pos..])? else {
        return Ok(Decoded::Partial);
    };
    pos += used;
    if count == 0 {
        return Err(DecodeError::EmptyArray);
    }
    // Every element takes at least 6 bytes (`$0\r\n\r\n`): never reserve more
    // than the input could hold, whatever the peer claims.
    let room = (buf.len() - pos) / 6 + 1;
    let mut items = Vec::with_capacity((count as usize).min(room));
    for _ in 0..count {
        match buf.get(pos) {
            None => return Ok(Decoded::Partial),
            Some(b'$') => pos += 1,
            Some(_) => return Err(DecodeError::NotABulkString),
        }
        let Some((len, used)) = number(&buf[pos..])? else {
            return Ok(Decoded::Partial);
        };
        pos += used;
        // `len` <= MAX_LEN, so this cannot overflow a 64-bit usize; on 32-bit
        // targets checked_add catches it.
        let Some(end) = pos.checked_add(len as usize) else {
            return Err(DecodeError::Overflow);
        };
        let Some(after) = end.checked_add(2) else {
            return Err(DecodeError::Overflow);
        };
        if buf.len() < after {
            // Bytes present so far must still be able to end in CRLF.
            if buf.len() > end && buf[end] != b'\r' {
                return Err(DecodeError::MissingCrlf);
            }
            return Ok(Decoded::Partial);
        }
        if &buf[end..after] != b"\r\n" {
            return Err(DecodeError::MissingCrlf);
        }
        items.push(&buf[pos..end]);
        pos = after;
    }
    Ok(Decoded::Complete(items, pos))
}

/// Parses `<digits>\r\n`. `Ok(None)` if the line is not complete yet.
fn number(buf: &[u8]) -> Result<Option<(u64, usize)>, DecodeError> {
    let mut value: u64 = 0;
    for (i, &b) in buf.iter().enumerate() {
        match b {
            b'0'..=b'9' => {
                // `value` <= MAX_LEN = 2^32 here: no u64 overflow (and no
                // overflow check, which in wasm32 is a 128-bit multiply).
                value = value * 10 + u64::from(b - b'0');
                if value > MAX_LEN {
                    return Err(DecodeError::Overflow);
                }
            }
            b'\r' => {
                if i == 0 {
                    return Err(DecodeError::BadNumber);
                }
                return match buf.get(i + 1) {
                    None => Ok(None),
                    Some(b'\n') => Ok(Some((value, i + 2))),
                    Some(_) => Err(DecodeError::MissingCrlf),
                };
            }
            _ => return Err(DecodeError::BadNumber),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(buf: &[u8]) -> Vec<Vec<u8>> {
        match decode_request(buf) {
            Ok(Decoded::Complete(items, used)) => {
                assert_eq!(used, buf.len());
                items.into_iter().map(<[u8]>::to_vec).collect()
            }
            other => panic!("expected a complete frame, got {other:?}"),
        }
    }

    #[test]
    fn sdk_examples() {
        assert_eq!(
            complete(b"*3\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n"),
            vec![b"SET".to_vec(), b"testkey".to_vec(), b"testvalue".to_vec()]
        );
        assert_eq!(
            complete(b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n"),
            vec![b"KEYNOTIFY".to_vec(), b"SOMEKEY".to_vec()]
        );
    }

    #[test]
    fn binary_safe() {
        let item = b"a\r\n\0$*\r\n";
        let mut buf = b"*1\r\n$8\r\n".to_vec();
        buf.extend_from_slice(item);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(complete(&buf), vec![item.to_vec()]);
        assert_eq!(complete(b"*1\r\n$0\r\n\r\n"), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn every_prefix_is_partial() {
        let full = b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n";
        for i in 0..full.len() {
            assert_eq!(
                decode_request(&full[..i]),
                Ok(Decoded::Partial),
                "prefix {i}"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_not_consumed() {
        match decode_request(b"*1\r\n$1\r\na\r\nxyz") {
            Ok(Decoded::Complete(items, used)) => {
                assert_eq!(items, vec![b"a".as_slice()]);
                assert_eq!(used, 11);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors() {
        use DecodeError::*;
        let cases: &[(&[u8], DecodeError)] = &[
            (b"hello", NotAnArray),
            (b"*0\r\n", EmptyArray),
            (b"*-1\r\n", BadNumber),
            (b"*+1\r\n", BadNumber),
            (b"*\r\n", BadNumber),
            (b"*1\r\n:1\r\n", NotABulkString),
            (b"*1\r\n$1\r\nab\r\n", MissingCrlf),
            (b"*1\r\n$1\r\na\n\r", MissingCrlf),
            (b"*1\r\n$1\rx", MissingCrlf),
            (b"*99999999999999999999999\r\n", Overflow),
            (b"*1\r\n$99999999999\r\n", Overflow),
        ];
        for (input, want) in cases {
            assert_eq!(
                decode_request(input),
                Err(*want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn huge_count_does_not_allocate() {
        // Claims 2^32 elements but holds none: must be Partial, not an OOM.
        assert_eq!(decode_request(b"*4294967296\r\n"), Ok(Decoded::Partial));
    }
}
