//! RESP3 codec: the request framing of spec §5.1 and the reply encodings of §6.
//!
//! A request is one RESP array of bulk strings: `*<n>\r\n` then n times
//! `$<len>\r\n<len bytes>\r\n`. [`decode_request`] is a push parser in the style
//! of httparse: it returns [`Decoded::Complete`] with the elements and the bytes
//! used, [`Decoded::Partial`] when more input could complete the frame, or an
//! error when no more input could.

mod decode;
mod encode;

pub use decode::{DecodeError, Decoded, decode_request};
pub use encode::{
    REPLY_DELETED, REPLY_NIL, REPLY_NOT_APPLIED, REPLY_NOT_FOUND, REPLY_OK, bulk, bulk_len, error,
    notify_delete, notify_set, push_bulk, request,
};
