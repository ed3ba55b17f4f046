//! Takes out of a response what the sidecar asked for and the agent did not: the agent sees what
//! the engine would have sent it had the request not been touched.
//!
//! Works on one parsed event — a streamed chunk or a whole non-streamed body — in place, and says
//! whether anything changed, so that an unchanged event is forwarded as the original bytes and
//! only a changed one is serialised again. Everything else keeps its value and its key order.

use serde_json::{Map, Value};

use super::request::{Injected, Unasked};

/// Removes from `event` exactly the fields `injected` names; `true` when something changed.
///
/// - token ids: top-level `prompt_token_ids` (vLLM chat) and per-choice `prompt_token_ids`
///   (vLLM completions, SGLang) and `token_ids` become what the engine sends unasked — `null`
///   for vLLM, no key for SGLang;
/// - logprobs: every choice's `logprobs` goes back to `null`, which both engines send unasked.
pub fn strip(event: &mut Value, injected: &Injected) -> bool {
    if injected.is_empty() {
        return false;
    }
    let Some(object) = event.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if injected.token_ids {
        changed |= unask(object, "prompt_token_ids", injected.unasked);
    }
    let Some(choices) = object.get_mut("choices").and_then(Value::as_array_mut) else {
        return changed;
    };
    for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
        if injected.token_ids {
            changed |= unask(choice, "prompt_token_ids", injected.unasked);
            changed |= unask(choice, "token_ids", injected.unasked);
        }
        if injected.logprobs {
            changed |= unask(choice, "logprobs", Unasked::Null);
        }
    }
    changed
}

/// Puts `key` back the way the engine writes it unasked; `true` when that changed something.
fn unask(object: &mut Map<String, Value>, key: &str, unasked: Unasked) -> bool {
    match (object.get_mut(key), unasked) {
        (None, _) | (Some(Value::Null), Unasked::Null) => false,
        (Some(value), Unasked::Null) => {
            *value = Value::Null;
            true
        }
        // `shift_remove` keeps the order of the keys after it.
        (Some(_), Unasked::Absent) => object.shift_remove(key).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const BOTH: Injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Null,
    };

    #[test]
    fn a_vllm_body_gets_nulls_where_the_injected_fields_were() {
        let mut body = json!({
            "id": "chatcmpl-1", "choices": [{"index": 0, "message": {"content": "hi"},
            "logprobs": {"content": [{"token": "hi", "logprob": -0.1, "bytes": [104],
            "top_logprobs": []}]}, "finish_reason": "stop", "token_ids": [5, 2]}],
            "usage": {"prompt_tokens": 3}, "prompt_token_ids": [1, 2, 3],
            "kv_transfer_params": null
        });
        assert!(strip(&mut body, &BOTH));
        assert_eq!(
            serde_json::to_string(&body).unwrap_or_default(),
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}],"usage":{"prompt_tokens":3},"prompt_token_ids":null,"kv_transfer_params":null}"#
        );
    }

    #[test]
    fn an_sglang_body_loses_the_id_keys_altogether() {
        let mut body = json!({"choices": [{"index": 0, "logprobs": {"content": []},
            "finish_reason": "stop", "prompt_token_ids": [1], "token_ids": [2]}]});
        let injected = Injected {
            unasked: Unasked::Absent,
            ..BOTH
        };
        assert!(strip(&mut body, &injected));
        assert_eq!(
            body,
            json!({"choices": [{"index": 0, "logprobs": null, "finish_reason": "stop"}]})
        );
    }

    #[test]
    fn a_chunk_without_injected_fields_is_reported_unchanged() {
        let mut chunk = json!({"choices": [{"index": 0, "delta": {"content": "a"},
            "logprobs": null, "token_ids": null}]});
        assert!(!strip(&mut chunk, &BOTH));
        let mut usage = json!({"choices": [], "usage": {"prompt_tokens": 1}});
        assert!(!strip(&mut usage, &BOTH));
    }

    #[test]
    fn only_the_fields_that_were_injected_are_touched() {
        let mut chunk = json!({"prompt_token_ids": [1], "choices": [{"index": 0,
            "logprobs": {"content": []}, "token_ids": [7]}]});
        let logprobs_only = Injected {
            token_ids: false,
            ..BOTH
        };
        assert!(strip(&mut chunk, &logprobs_only));
        assert_eq!(
            chunk,
            json!({"prompt_token_ids": [1], "choices": [{"index": 0, "logprobs": null,
                   "token_ids": [7]}]})
        );
    }

    #[test]
    fn nothing_injected_means_nothing_is_looked_at() {
        let mut chunk = json!({"choices": [{"logprobs": {"content": []}}]});
        assert!(!strip(&mut chunk, &Injected::default()));
    }
}
