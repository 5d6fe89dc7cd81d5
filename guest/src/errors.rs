//! The state store's error replies (spec §7), byte-exact.

/// A `-ERR <text>` reply. The status stays 200: these are store outcomes, not
/// RPC failures (spec §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceError {
    /// `__ts` more than 60 s ahead of the server clock.
    TimestampSkew,
    /// The key is fenced and the request carries no `__ft`.
    MissingFencingToken,
    /// `__ft` more than 60 s ahead of the server clock.
    FencingTokenSkew,
    /// `__ft` older than the key's fencing token.
    FencingTokenLowerVersion,
    /// A new key would exceed the quota.
    QuotaExceeded,
    /// The request is not well-formed.
    SyntaxError,
    /// The client may not do this.
    NotAuthorized,
    /// Not a state store verb.
    UnknownCommand,
    /// The verb got the wrong number of elements.
    WrongNumberOfArguments,
    /// A SET without `__ts`.
    TimestampMissing,
    /// `__ts` or `__ft` is not an HLC.
    TimestampMalformed,
    /// An empty key.
    KeyLengthZero,
}

impl ServiceError {
    /// The exact wire text after `-ERR `.
    pub fn text(self) -> &'static str {
        match self {
            ServiceError::TimestampSkew => {
                "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            ServiceError::MissingFencingToken => "a fencing token is required for this request",
            ServiceError::FencingTokenSkew => {
                "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            ServiceError::FencingTokenLowerVersion => {
                "the request fencing token is a lower version than the fencing token protecting the resource"
            }
            ServiceError::QuotaExceeded => "the quota has been exceeded",
            ServiceError::SyntaxError => "syntax error",
            ServiceError::NotAuthorized => "not authorized",
            ServiceError::UnknownCommand => "unknown command",
            ServiceError::WrongNumberOfArguments => "wrong number of arguments",
            ServiceError::TimestampMissing => "missing timestamp",
            ServiceError::TimestampMalformed => "malformed timestamp",
            ServiceError::KeyLengthZero => "the key length is zero",
        }
    }

    /// The whole reply payload, `-ERR <text>\r\n`.
    pub fn reply(self) -> Vec<u8> {
        crate::resp3::error(self.text())
    }
}
