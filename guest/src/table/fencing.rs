//! Fencing tokens (spec §9).
//!
//! ```text
//!   key has no token ──────────────> proceed (a SET that applies stores __ft)
//!   key has token FT, no __ft ─────> -ERR a fencing token is required ...
//!   key has token FT, __ft <  FT ──> -ERR ... lower version ...
//!   key has token FT, __ft >= FT ──> proceed (an applied SET keeps max(FT, __ft))
//! ```
//! The token's format and skew are checked before this (§5.4 step 7), even
//! when the key is absent.

use crate::errors::ServiceError;
use crate::hlc::Hlc;

/// Whether a write presenting `presented` may touch a key protected by `stored`.
pub fn check(stored: Option<&Hlc>, presented: Option<&Hlc>) -> Result<(), ServiceError> {
    match (stored, presented) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(ServiceError::MissingFencingToken),
        (Some(ft), Some(p)) if p < ft => Err(ServiceError::FencingTokenLowerVersion),
        (Some(_), Some(_)) => Ok(()),
    }
}

/// The token a key keeps after an applied SET.
pub fn after_set(stored: Option<Hlc>, presented: Option<&Hlc>) -> Option<Hlc> {
    match (stored, presented) {
        (Some(ft), Some(p)) if *p > ft => Some(p.clone()),
        (Some(ft), _) => Some(ft),
        (None, p) => p.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(wall: u64) -> Hlc {
        Hlc {
            wall,
            counter: 0,
            node: "n".into(),
        }
    }

    #[test]
    fn rules() {
        assert_eq!(check(None, None), Ok(()));
        assert_eq!(check(None, Some(&t(1))), Ok(()));
        assert_eq!(
            check(Some(&t(5)), None),
            Err(ServiceError::MissingFencingToken)
        );
        assert_eq!(
            check(Some(&t(5)), Some(&t(4))),
            Err(ServiceError::FencingTokenLowerVersion)
        );
        assert_eq!(check(Some(&t(5)), Some(&t(5))), Ok(()));
        assert_eq!(check(Some(&t(5)), Some(&t(6))), Ok(()));
        assert_eq!(after_set(None, None), None);
        assert_eq!(after_set(None, Some(&t(3))), Some(t(3)));
        assert_eq!(after_set(Some(t(5)), Some(&t(6))), Some(t(6)));
        assert_eq!(after_set(Some(t(5)), Some(&t(5))), Some(t(5)));
    }
}
