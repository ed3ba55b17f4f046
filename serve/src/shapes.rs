//! Response bodies in vLLM's (≈0.11) shapes: chat completions and their SSE chunks, text
//! completions and theirs, token logprobs, usage and the model list — field order and
//! explicit nulls as its protocol models serialise them, so that the sidecar records this
//! server exactly as it records vLLM.

use serde_json::{json, Map, Value};

use clawback_model::generate::FinishReason;
use clawback_model::tokenizer::Tokenizer;

use super::engine::{ModelEntry, SampledToken};
use super::tool_calls::ToolCall;

/// The text of one token as vLLM reports it in logprobs (special tokens included).
pub fn token_text(tokenizer: &Tokenizer, id: i64) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// vLLM's `UsageInfo`; the non-streamed bodies add `prompt_tokens_details`.
pub fn usage(prompt: usize, completion: usize, with_details: bool) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    });
    if with_details {
        usage["prompt_tokens_details"] = Value::Null;
        usage["completion_tokens_details"] = Value::Null;
    }
    usage
}

/// `system_fingerprint`: vLLM names its version (and a config hash) there; so does this server.
pub const SYSTEM_FINGERPRINT: &str = concat!("clawback-serve-", env!("CARGO_PKG_VERSION"));

/// The closing chunk of a stream with `stream_options.include_usage`.
pub fn usage_chunk(
    id: &str,
    object: &str,
    created: u64,
    model: &str,
    prompt: usize,
    completion: usize,
) -> Value {
    json!({"id": id, "object": object, "created": created, "model": model, "choices": [],
           "usage": usage(prompt, completion, false)})
}

fn ids(tokens: &[SampledToken]) -> Value {
    json!(tokens.iter().map(|t| t.id).collect::<Vec<_>>())
}

/// `choices[i].token_ids`, or null when the request did not ask for ids.
pub fn token_ids(wanted: bool, tokens: &[SampledToken]) -> Value {
    if wanted {
        ids(tokens)
    } else {
        Value::Null
    }
}

/// `prompt_token_ids`, or null when the request did not ask for ids.
pub fn prompt_ids(wanted: bool, prompt: &[i64]) -> Value {
    if wanted {
        json!(prompt)
    } else {
        Value::Null
    }
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`, or null.
pub fn chat_logprobs(tokenizer: &Tokenizer, wanted: bool, tokens: &[SampledToken]) -> Value {
    if !wanted {
        return Value::Null;
    }
    let entry = |id: i64, logprob: f64| {
        let text = token_text(tokenizer, id);
        json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.id, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs`: parallel arrays, `top_logprobs` a map per token that holds the
/// sampled token and the alternatives; `text_offset` counts bytes from `offset`.
pub fn completion_logprobs(
    tokenizer: &Tokenizer,
    wanted: bool,
    tokens: &[SampledToken],
    offset: usize,
) -> Value {
    if !wanted {
        return Value::Null;
    }
    let mut at = offset;
    let (mut text_offset, mut texts, mut tops) = (Vec::new(), Vec::new(), Vec::new());
    for t in tokens {
        let text = token_text(tokenizer, t.id);
        text_offset.push(at);
        at += text.len();
        let mut top = Map::new();
        top.insert(text.clone(), json!(t.logprob));
        for &(id, lp) in &t.top {
            top.entry(token_text(tokenizer, id)).or_insert(json!(lp));
        }
        texts.push(text);
        tops.push(Value::Object(top));
    }
    json!({
        "text_offset": text_offset,
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "tokens": texts,
        "top_logprobs": tops
    })
}

/// `tool_calls` entries of a message or a delta.
pub fn tool_calls(calls: &[(String, ToolCall)], with_index: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, (id, call))| {
            let mut v = json!({"id": id, "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}});
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// The assistant message of a non-streamed chat completion.
pub fn chat_message(content: Option<&str>, calls: &[(String, ToolCall)]) -> Value {
    let mut message = json!({
        "role": "assistant", "content": content, "refusal": null, "annotations": null,
        "audio": null, "function_call": null
    });
    // vLLM 0.32 has no `tool_calls` key on a message without any, and names the thinking
    // text `reasoning`.
    if !calls.is_empty() {
        message["tool_calls"] = tool_calls(calls, false);
    }
    message["reasoning"] = Value::Null;
    message
}

/// `GET /v1/models`.
pub fn models(entries: &[ModelEntry], max_model_len: i64, created: u64, perm_id: &str) -> Value {
    let data: Vec<Value> = entries
        .iter()
        .map(|m| {
            json!({
                "id": m.id, "object": "model", "created": created, "owned_by": "vllm",
                "root": m.root, "parent": m.parent,
                "max_model_len": if m.parent.is_none() { json!(max_model_len) } else { Value::Null },
                "permission": [{
                    "id": format!("modelperm-{perm_id}"), "object": "model_permission",
                    "created": created, "allow_create_engine": false, "allow_sampling": true,
                    "allow_logprobs": true, "allow_search_indices": false, "allow_view": true,
                    "allow_fine_tuning": false, "organization": "*", "group": null,
                    "is_blocking": false
                }]
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}
