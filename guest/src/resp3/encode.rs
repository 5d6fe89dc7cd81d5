//! Reply and notification encodings (spec §6, §7, §11.3), byte for byte.

/// `+OK\r\n`: SET applied, KEYNOTIFY registered or removed.
pub const REPLY_OK: &[u8] = b"+OK\r\n";
/// `:-1\r\n`: SET not applied (NX / NEX), VDEL value mismatch.
pub const REPLY_NOT_APPLIED: &[u8] = b":-1\r\n";
/// `:1\r\n`: DEL / VDEL removed the key.
pub const REPLY_DELETED: &[u8] = b":1\r\n";
/// `:0\r\n`: DEL / VDEL of an absent key; STOP of a registration that did not exist.
pub const REPLY_NOT_FOUND: &[u8] = b":0\r\n";
/// `$-1\r\n`: GET miss.
pub const REPLY_NIL: &[u8] = b"$-1\r\n";

/// A request: a RESP3 array of bulk strings (what clients send).
pub fn request(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 16).sum::<usize>() + 8);
    out.push(b'*');
    push_decimal(&mut out, parts.len());
    out.extend_from_slice(b"\r\n");
    for p in parts {
        push_bulk(&mut out, p);
    }
    out
}

/// `$<n>\r\n<bytes>\r\n`.
pub fn bulk(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 16);
    push_bulk(&mut out, value);
    out
}

/// `-ERR <text>\r\n`.
pub fn error(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 7);
    out.extend_from_slice(b"-ERR ");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
    out
}

/// The SET notification: `*4 NOTIFY SET VALUE <value>`.
pub fn notify_set(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 48);
    out.extend_from_slice(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n");
    push_bulk(&mut out, value);
    out
}

/// The delete notification: `*2 NOTIFY DELETE` (the literal is `DELETE`, spec §11.3).
pub fn notify_delete() -> Vec<u8> {
    b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n".to_vec()
}

/// Bytes of `$<n>\r\n<n bytes>\r\n`.
pub fn bulk_len(n: usize) -> usize {
    let mut digits = 1;
    let mut rest = n / 10;
    while rest > 0 {
        digits += 1;
        rest /= 10;
    }
    n + digits + 5
}

/// Appends `$<n>\r\n<bytes>\r\n`.
pub fn push_bulk(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'$');
    push_decimal(out, value.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal: no formatting machinery and no allocation (this
/// is on the path of every GET reply and notification). In 32-bit steps, so
/// that wasm32 needs no 128-bit multiply.
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n as u64;
    while n >= 1_000_000_000 {
        let mut chunk = (n % 1_000_000_000) as u32;
        n /= 1_000_000_000;
        for _ in 0..9 {
            i -= 1;
            digits[i] = b'0' + (chunk % 10) as u8;
            chunk /= 10;
        }
    }
    let mut low = n as u32;
    loop {
        i -= 1;
        digits[i] = b'0' + (low % 10) as u8;
        low /= 10;
        if low == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        for n in [
            0usize,
            7,
            10,
            99,
            1_000_000_000,
            1_234_567_890_123,
            usize::MAX,
        ] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn exact_bytes() {
        assert_eq!(bulk(b"v1"), b"$2\r\nv1\r\n");
        assert_eq!(bulk(b""), b"$0\r\n\r\n");
        assert_eq!(error("syntax error"), b"-ERR syntax error\r\n");
        assert_eq!(
            notify_set(b"abc"),
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
        );
        assert_eq!(notify_delete(), b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    }
}
