//! Which trajectory a call belongs to: the ids a call names itself ([`explicit`]), and, for calls
//! that name none, [`stitch`]ing by the canonical form of their history ([`canonical`]).

pub mod canonical;
pub mod explicit;
pub mod keys;
pub mod responses;
pub mod stitch;

pub use stitch::{CallKeys, Clock, Continuation, Lookup, RequestKeys, StitchConfig, Stitcher};
