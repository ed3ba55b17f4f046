//! Which trajectory a call belongs to: the ids a call names itself ([`explicit`]), and, for calls
//! that name none, [`stitch`]ing by the canonical form of their history ([`canonical`]); the
//! session state every replica of a pool shares ([`shared`]).

pub mod canonical;
pub mod explicit;
pub mod keys;
pub mod responses;
pub mod shared;
pub mod stitch;

pub use shared::{Held, SessionState};
pub use stitch::{CallKeys, Continuation, RequestKeys};
