//! How the stores keep a step's token ids and logprobs: packed. Ids and logprobs are most of a
//! recorded step's bytes — a prompt of 4,000 tokens is ~24 kB of decimal ids, and each sampled
//! token's `{"token","logprob","bytes"}` object ~70 bytes — and writing, scanning and reading them
//! as JSON numbers was most of what a step cost on its way to the store.
//!
//! A stored step ([`crate::EncodedStep`], the journal, the spool, Redis, SQLite) writes:
//! - `prompt_token_ids`, `completion_token_ids`: a base64 string of the ids as little-endian
//!   u32s;
//! - `completion_logprobs`: an object of columns — `logprob`, a base64 string of the logprobs as
//!   little-endian f64s (bit for bit what was recorded); `token`, the token strings; `bytes`, one
//!   entry per token (`null` or the byte array), present only when some token's bytes are not
//!   simply its UTF-8; `top_logprobs`, one array per token, present only when one is not empty.
//!
//! Everything else that serialises a step (the handshake API, the viewer, the examples) writes
//! the plain arrays of `SCHEMA.md`, and every reader takes either form: steps stored before this
//! encoding read as they always did.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::logprobs::{CompletionLogprobs, TokenRef};
use crate::schema::TopLogprob;

thread_local! {
    /// Whether the serialisation running on this thread is a store's.
    static PACKED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `serialise` with token ids and logprobs written packed: how a store's bytes are made.
pub(crate) fn packed<T>(serialise: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PACKED.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PACKED.with(|p| p.replace(true)));
    serialise()
}

pub(crate) fn is_packed() -> bool {
    PACKED.with(Cell::get)
}

/// Token ids: packed for a store, an array otherwise.
pub(crate) fn write_ids<S: Serializer>(ids: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
    if !is_packed() {
        return serializer.collect_seq(ids);
    }
    let raw: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    serializer.serialize_str(&STANDARD.encode(raw))
}

/// Token ids from either form.
pub(crate) fn read_ids<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = Vec<u32>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("token ids: an array of u32, or base64 of little-endian u32s")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<u32>, A::Error> {
            Vec::deserialize(SeqAccessDeserializer::new(seq))
        }

        fn visit_str<E: de::Error>(self, packed: &str) -> Result<Vec<u32>, E> {
            Ok(unpack::<4, E>("token ids", packed)?
                .into_iter()
                .map(u32::from_le_bytes)
                .collect())
        }
    }
    deserializer.deserialize_any(Ids)
}

/// The `N`-byte little-endian values of a base64 string.
fn unpack<const N: usize, E: de::Error>(what: &str, packed: &str) -> Result<Vec<[u8; N]>, E> {
    let raw = STANDARD
        .decode(packed)
        .map_err(|e| E::custom(format!("packed {what}: {e}")))?;
    let (values, rest) = raw.as_chunks::<N>();
    if !rest.is_empty() {
        return Err(E::custom(format!(
            "packed {what}: {} bytes is not a whole number of {N}-byte values",
            raw.len()
        )));
    }
    Ok(values.to_vec())
}

/// Logprobs as a store keeps them: their columns.
pub(crate) fn write_logprobs<S: Serializer>(
    columns: &CompletionLogprobs,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let logprobs: Vec<u8> = columns
        .logprobs()
        .iter()
        .flat_map(|logprob| logprob.to_le_bytes())
        .collect();
    let mut map = serializer.serialize_map(None)?;
    map.serialize_entry("logprob", &STANDARD.encode(logprobs))?;
    map.serialize_entry("token", &Column(columns, |e| e.token))?;
    if !columns.bytes_are_the_text() {
        map.serialize_entry("bytes", &Column(columns, |e| e.bytes))?;
    }
    if columns.has_alternatives() {
        map.serialize_entry("top_logprobs", &Column(columns, |e| e.top_logprobs))?;
    }
    map.end()
}

/// One field of every entry, written as an array.
struct Column<'a, T>(&'a CompletionLogprobs, fn(TokenRef<'a>) -> T);

impl<'a, T: Serialize> Serialize for Column<'a, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(self.1))
    }
}

/// The packed columns, as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Columns<'a> {
    logprob: Cow<'a, str>,
    #[serde(borrow)]
    token: Vec<Cow<'a, str>>,
    #[serde(default)]
    bytes: Option<Vec<Option<Vec<u8>>>>,
    #[serde(default)]
    top_logprobs: Option<Vec<Vec<TopLogprob>>>,
}

/// Logprobs from their packed columns; columns of different lengths are refused.
pub(crate) fn read_logprobs<'de, A: MapAccess<'de>>(
    map: A,
) -> Result<CompletionLogprobs, A::Error> {
    let Columns {
        logprob,
        token,
        bytes,
        top_logprobs,
    } = Columns::deserialize(MapAccessDeserializer::new(map))?;
    let logprobs: Vec<f64> = unpack::<8, A::Error>("logprobs", &logprob)?
        .into_iter()
        .map(f64::from_le_bytes)
        .collect();
    let n = token.len();
    let lengths = [
        Some(logprobs.len()),
        bytes.as_ref().map(Vec::len),
        top_logprobs.as_ref().map(Vec::len),
    ];
    if lengths.iter().flatten().any(|&len| len != n) {
        return Err(de::Error::custom(format!(
            "packed logprobs: columns of different lengths ({n} tokens, {} logprobs, bytes {:?}, top_logprobs {:?})",
            logprobs.len(),
            lengths[1],
            lengths[2]
        )));
    }
    let mut bytes = bytes.map(Vec::into_iter);
    let mut top = top_logprobs.map(Vec::into_iter);
    let mut columns = CompletionLogprobs::default();
    for (token, logprob) in token.iter().zip(logprobs) {
        let odd;
        let bytes = match &mut bytes {
            Some(column) => {
                odd = column.next().flatten();
                odd.as_deref()
            }
            None => Some(token.as_bytes()),
        };
        let top = top.as_mut().and_then(Iterator::next).unwrap_or_default();
        columns.push(token, logprob, bytes, top);
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use serde_json::json;

    use super::*;
    use crate::schema::{EngineTokens, TokenLogprob};

    fn tokens() -> EngineTokens {
        EngineTokens {
            prompt_token_ids: vec![1, 70_000, u32::MAX],
            completion_token_ids: vec![9, 0],
            completion_logprobs: CompletionLogprobs::from(vec![
                TokenLogprob {
                    token: "Hé".into(),
                    logprob: -0.012_345_678_901_234_5,
                    bytes: Some("Hé".as_bytes().to_vec()),
                    top_logprobs: Vec::new(),
                },
                TokenLogprob {
                    token: "bytes:\\xe2".into(),
                    logprob: -9999.0,
                    bytes: Some(vec![0xe2]),
                    top_logprobs: vec![TopLogprob {
                        token: "x".into(),
                        logprob: -1.5,
                        bytes: None,
                    }],
                },
            ]),
        }
    }

    fn json<T: Serialize>(value: &T) -> String {
        serde_json::to_string(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_store_writes_ids_and_logprobs_packed_and_reads_them_back_bit_for_bit() {
        let tokens = tokens();
        let stored = packed(|| json(&tokens));
        assert!(stored.contains(r#""prompt_token_ids":""#), "{stored}");
        assert!(
            stored.contains(r#""completion_logprobs":{"logprob":""#),
            "{stored}"
        );
        let back: EngineTokens = serde_json::from_str(&stored).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, tokens);
        assert_eq!(
            back.completion_logprobs.logprobs()[0].to_bits(),
            tokens.completion_logprobs.logprobs()[0].to_bits()
        );
    }

    #[test]
    fn outside_a_store_the_arrays_are_written_and_packing_ends_with_the_store_write() {
        let tokens = tokens();
        let _ = packed(|| json(&tokens));
        let plain = serde_json::to_value(&tokens).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain["prompt_token_ids"], json!([1, 70_000, u32::MAX]));
        assert_eq!(plain["completion_logprobs"][1]["bytes"], json!([0xe2]));
    }

    #[test]
    fn bytes_that_are_the_tokens_own_utf8_are_left_out_and_come_back() {
        let mut tokens = tokens();
        tokens.completion_logprobs.truncate(1);
        let stored = packed(|| json(&tokens));
        assert!(!stored.contains("bytes"), "{stored}");
        assert!(!stored.contains("top_logprobs"), "{stored}");
        let back: EngineTokens = serde_json::from_str(&stored).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, tokens);
    }

    #[test]
    fn columns_of_different_lengths_or_bad_base64_are_refused() {
        let short = json!({"prompt_token_ids": [], "completion_token_ids": [],
            "completion_logprobs": {"logprob": STANDARD.encode((-1.0f64).to_le_bytes()),
                "token": ["a", "b"]}});
        let err = serde_json::from_value::<EngineTokens>(short).err();
        assert!(format!("{err:?}").contains("different lengths"), "{err:?}");
        let odd = json!({"prompt_token_ids": STANDARD.encode([1u8, 2, 3]),
            "completion_token_ids": []});
        let err = serde_json::from_value::<EngineTokens>(odd).err();
        assert!(format!("{err:?}").contains("whole number"), "{err:?}");
        let garbage = json!({"prompt_token_ids": "%%%", "completion_token_ids": []});
        assert!(serde_json::from_value::<EngineTokens>(garbage).is_err());
    }
}
