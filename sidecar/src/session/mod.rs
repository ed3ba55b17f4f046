//! Session resolution: which trajectory a call belongs to. [`stitch`] decides it for calls that
//! carry no explicit session id, from the canonical form of their history ([`canonical`]).

pub mod canonical;
pub mod stitch;

pub use stitch::{CallKeys, Clock, Continuation, Lookup, RequestKeys, StitchConfig, Stitcher};
