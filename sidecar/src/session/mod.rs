//! Which trajectory a call belongs to: the ids a call names itself ([`explicit`]), and, when it
//! names none, stitching by message history.

pub mod explicit;
