//! How the stores encode what they keep: records as JSON text, ids as their text form. Shared by
//! Redis and SQLite so both read and write exactly the same bytes.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::schema::{check_version, GateDecision};

/// A record as stored JSON.
pub(crate) fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::codec(what, e))
}

/// A record from stored JSON.
pub(crate) fn decode<T: DeserializeOwned>(what: &'static str, json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| Error::codec(what, e))
}

/// A gate decision from stored JSON, of a schema version this build reads.
pub(crate) fn decode_gate_decision(json: &str) -> Result<GateDecision> {
    let decision: GateDecision = decode("gate decision", json)?;
    check_version("gate decision", decision.schema_version)?;
    Ok(decision)
}

/// An id (or other `FromStr` value) read back from storage; a malformed one is an unexpected
/// reply, not a caller error.
pub(crate) fn parse_stored<T>(what: &'static str, s: &str) -> Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| Error::UnexpectedReply {
        what,
        detail: format!("{s:?}: {e}"),
    })
}
