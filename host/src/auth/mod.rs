//! Who may do what: the embedded broker's users file ([`users`]), the
//! authorization rules ([`policy`]), and the protection of the store's own
//! streams from other clients ([`isolation`]).

pub mod isolation;
pub mod policy;
pub mod users;
