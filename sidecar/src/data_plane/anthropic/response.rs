//! A chat completion as the Anthropic `message` an SDK expects, and errors in Anthropic's shape.

use http::StatusCode;
use serde_json::{json, Map, Value};

/// The message id for chat completion id `id`: Anthropic's ids start `msg_`.
pub fn message_id(id: &str) -> String {
    let rest = id.strip_prefix("chatcmpl-").unwrap_or(id);
    format!("msg_{rest}")
}

/// `stop_reason` (and `stop_sequence`) for a choice's `finish_reason` and, for vLLM, its
/// `stop_reason` (the stop string that matched, or a stop token id).
pub fn stop_reason(finish_reason: Option<&str>, matched: &Value) -> (Value, Value) {
    match finish_reason {
        Some("length") => (json!("max_tokens"), Value::Null),
        Some("tool_calls") => (json!("tool_use"), Value::Null),
        Some(_) if matched.is_string() => (json!("stop_sequence"), matched.clone()),
        Some(_) => (json!("end_turn"), Value::Null),
        None => (Value::Null, Value::Null),
    }
}

/// The usage object for chat `usage`.
pub fn usage(chat_usage: &Value) -> Value {
    let mut usage = Map::new();
    usage.insert(
        "input_tokens".to_owned(),
        chat_usage["prompt_tokens"].as_u64().unwrap_or(0).into(),
    );
    usage.insert(
        "output_tokens".to_owned(),
        chat_usage["completion_tokens"].as_u64().unwrap_or(0).into(),
    );
    if let Some(cached) = chat_usage["prompt_tokens_details"]["cached_tokens"].as_u64() {
        usage.insert("cache_read_input_tokens".to_owned(), cached.into());
    }
    Value::Object(usage)
}

/// A tool call's `arguments` string as the `input` object a `tool_use` block carries. Engines'
/// tool parsers emit JSON objects; anything else (a model that wrote `3` for its arguments, as
/// vLLM's own `/v1/messages` then fails on) is kept whole as `{"arguments": "<as written>"}`,
/// which [`super::request`] turns back into those arguments when the client sends the turn back.
pub fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({"arguments": arguments}),
    }
}

/// The whole message for a non-streamed chat completion body.
pub fn message(chat: &Value) -> Value {
    let choice = &chat["choices"][0];
    let reply = &choice["message"];
    let mut content = Vec::new();
    let reasoning = reply["reasoning"]
        .as_str()
        .or_else(|| reply["reasoning_content"].as_str())
        .unwrap_or_default();
    if !reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
    }
    let text = reply["content"].as_str().unwrap_or_default();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in reply["tool_calls"].as_array().into_iter().flatten() {
        content.push(json!({
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": tool_input(call["function"]["arguments"].as_str().unwrap_or_default()),
        }));
    }
    let (stop_reason, stop_sequence) =
        stop_reason(choice["finish_reason"].as_str(), &choice["stop_reason"]);
    json!({
        "id": message_id(chat["id"].as_str().unwrap_or_default()),
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(&chat["usage"]),
    })
}

/// Anthropic's `error.type` for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's error body.
pub fn error_json(status: StatusCode, message: &str) -> String {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}}).to_string()
}

/// An engine's error body (OpenAI's `{"error": {"message": ...}}`, FastAPI's `{"detail": ...}`,
/// or anything else) in Anthropic's shape, keeping the engine's message.
pub fn translate_error(status: StatusCode, body: &[u8]) -> String {
    let parsed = serde_json::from_slice::<Value>(body).ok();
    let message = parsed.as_ref().and_then(|json| {
        json["error"]["message"]
            .as_str()
            .or_else(|| json["message"].as_str())
            .map(str::to_owned)
            .or_else(|| match &json["detail"] {
                Value::Null => None,
                Value::String(detail) => Some(detail.clone()),
                detail => Some(detail.to_string()),
            })
    });
    let message = message.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            format!("the engine answered {status} without a body")
        } else {
            text.chars().take(2000).collect()
        }
    });
    error_json(status, &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vllm_tool_reply_becomes_a_message_with_thinking_text_and_tool_use() {
        let chat = json!({"id": "chatcmpl-abc", "object": "chat.completion", "model": "qwen",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "stop_reason": null,
                "message": {"role": "assistant", "content": "Let me look.", "reasoning": "need a file",
                    "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                        "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}});
        assert_eq!(
            message(&chat),
            json!({"id": "msg_abc", "type": "message", "role": "assistant", "model": "qwen",
                "content": [
                    {"type": "thinking", "thinking": "need a file", "signature": ""},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "read", "input": {"path": "a"}}],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 12, "output_tokens": 7}})
        );
    }

    #[test]
    fn a_matched_stop_string_is_a_stop_sequence_and_a_stop_token_the_end_of_a_turn() {
        assert_eq!(
            stop_reason(Some("stop"), &json!("END")),
            (json!("stop_sequence"), json!("END"))
        );
        assert_eq!(
            stop_reason(Some("stop"), &json!(151645)),
            (json!("end_turn"), Value::Null)
        );
        assert_eq!(
            stop_reason(Some("length"), &Value::Null),
            (json!("max_tokens"), Value::Null)
        );
    }

    #[test]
    fn arguments_that_are_not_an_object_are_kept() {
        assert_eq!(tool_input(""), json!({}));
        assert_eq!(tool_input("[1]"), json!({"arguments": "[1]"}));
        assert_eq!(tool_input("{\"a\":1}"), json!({"a": 1}));
    }

    #[test]
    fn engine_errors_keep_their_message_in_anthropics_shape() {
        let vllm = br#"{"error":{"message":"max_tokens is too large","type":"Bad Request","param":"max_tokens","code":400}}"#;
        assert_eq!(
            serde_json::from_str::<Value>(&translate_error(StatusCode::BAD_REQUEST, vllm)).unwrap(),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "max_tokens is too large"}})
        );
        let fastapi = br#"{"detail":"Not Found"}"#;
        assert!(translate_error(StatusCode::NOT_FOUND, fastapi).contains("not_found_error"));
        assert!(translate_error(StatusCode::BAD_GATEWAY, b"").contains("without a body"));
    }
}
