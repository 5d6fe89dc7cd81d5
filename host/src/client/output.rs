//! How the commands print: text (escaped lines) or JSON.

use base64::Engine;

use super::Encoding;

/// How the client commands print what they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// `get`: the value as it is; `keys` and `watch`: one line each, keys
    /// and values escaped (see [`escape`]).
    #[default]
    Text,
    /// One JSON document (`get`, `keys`) or one JSON object per line
    /// (`watch`). Keys and values are strings: UTF-8 as it is, else in a
    /// `key_base64` / `value_base64` field; with --hex / --base64, strings
    /// of that encoding.
    Json,
}

/// `bytes` as one line's field: with --hex or --base64 in that encoding,
/// else with a backslash, control characters and bytes that are not UTF-8
/// written `\\`, `\n`, `\r`, `\t` or `\xHH`, so that a line is one key or
/// one notification whatever the bytes.
pub fn escape(bytes: &[u8], enc: Encoding) -> Vec<u8> {
    if enc != Encoding::Raw {
        return enc.encode(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if c.is_control() => {
                    for b in c.to_string().bytes() {
                        out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                    }
                }
                c => out.extend_from_slice(c.to_string().as_bytes()),
            }
        }
        for b in chunk.invalid() {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
    }
    out
}

/// Puts `bytes` in `object` as `name` (a string: UTF-8 as it is, or in
/// the --hex / --base64 encoding), or as `<name>_base64` when it is raw
/// bytes that are not UTF-8.
pub fn json_field(
    object: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    bytes: &[u8],
    enc: Encoding,
) {
    let (name, text) = match (enc, std::str::from_utf8(bytes)) {
        (Encoding::Raw, Ok(text)) => (name.to_string(), text.to_string()),
        (Encoding::Raw, Err(_)) => (
            format!("{name}_base64"),
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ),
        (enc, _) => (
            name.to_string(),
            String::from_utf8_lossy(&enc.encode(bytes)).into_owned(),
        ),
    };
    object.insert(name, serde_json::Value::String(text));
}
