//! What a step keeps of the agent's request: the conversation (chat `messages`, Responses
//! `input` items, or the completions `prompt` as one user message), the tools, and the sampling
//! parameters — never headers, so credentials cannot reach storage.

use clawback_datapool::{Endpoint, SamplingParams, StepRequest};
use serde_json::{json, Map, Value};

use crate::data_plane::route;

/// The datapool's endpoint for a recordable route; `None` for routes that are not model calls.
pub fn endpoint(route: route::Endpoint) -> Option<Endpoint> {
    match route {
        route::Endpoint::ChatCompletions => Some(Endpoint::ChatCompletions),
        route::Endpoint::Completions => Some(Endpoint::Completions),
        route::Endpoint::Responses => Some(Endpoint::Responses),
        // Reaches here only towards an upstream that speaks Messages; otherwise the call was
        // translated to chat first.
        route::Endpoint::Messages => Some(Endpoint::Messages),
        // A Messages call is recorded as the chat call it is translated to.
        route::Endpoint::CountTokens
        | route::Endpoint::StoredResponse
        | route::Endpoint::Models
        | route::Endpoint::Other => None,
    }
}

/// The request as its step records it: a Messages request as the chat request it stands for
/// (what the trainer renders), anything else as it came.
pub fn recorded(endpoint: Endpoint, body: &Value) -> std::borrow::Cow<'_, Value> {
    match endpoint {
        Endpoint::Messages => std::borrow::Cow::Owned(
            crate::data_plane::anthropic::request::to_chat(body).unwrap_or_default(),
        ),
        _ => std::borrow::Cow::Borrowed(body),
    }
}

/// The conversation of a request (its [`recorded`] view), as a list of messages or items.
pub fn messages(endpoint: Endpoint, body: &Value) -> Vec<Value> {
    match endpoint {
        Endpoint::Responses => {
            let mut items = Vec::new();
            if let Some(instructions) = body["instructions"].as_str() {
                items.push(json!({"role": "system", "content": instructions}));
            }
            match &body["input"] {
                Value::String(text) => items.push(json!({"role": "user", "content": text})),
                Value::Array(input) => items.extend(input.iter().cloned()),
                _ => {}
            }
            items
        }
        // A Messages request's [`recorded`] view is chat.
        Endpoint::ChatCompletions | Endpoint::Messages => {
            body["messages"].as_array().cloned().unwrap_or_default()
        }
        Endpoint::Completions => match &body["prompt"] {
            Value::Null => Vec::new(),
            prompt => vec![json!({"role": "user", "content": prompt})],
        },
    }
}

/// Fields that are not sampling parameters (they describe the conversation, the transport, or
/// clawback's own capture).
const NOT_SAMPLING: &[&str] = &[
    "model",
    "messages",
    "input",
    "prompt",
    "instructions",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "metadata",
    "user",
    "store",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "echo",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "include",
    "truncation",
    "suffix",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
    "background",
];

pub fn sampling(body: &Value) -> SamplingParams {
    let f = |key: &str| body[key].as_f64();
    let max_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| body[*k].as_u64())
        .and_then(|n| u32::try_from(n).ok());
    let mut extra = Map::new();
    if let Some(object) = body.as_object() {
        for (key, value) in object {
            let known = matches!(
                key.as_str(),
                "temperature"
                    | "top_p"
                    | "top_k"
                    | "max_completion_tokens"
                    | "max_tokens"
                    | "max_output_tokens"
                    | "seed"
                    | "stop"
                    | "presence_penalty"
                    | "frequency_penalty"
            );
            if !known && !NOT_SAMPLING.contains(&key.as_str()) {
                extra.insert(key.clone(), value.clone());
            }
        }
    }
    SamplingParams {
        temperature: f("temperature"),
        top_p: f("top_p"),
        top_k: body["top_k"].as_i64(),
        max_tokens,
        seed: body["seed"].as_i64(),
        stop: body.get("stop").filter(|v| !v.is_null()).cloned(),
        presence_penalty: f("presence_penalty"),
        frequency_penalty: f("frequency_penalty"),
        extra,
    }
}

/// The step's record of a request whose conversation is `messages` (from [`messages`]).
pub fn step_request(messages: Vec<Value>, body: &Value) -> StepRequest {
    StepRequest {
        messages,
        tools: body["tools"].as_array().cloned().unwrap_or_default(),
        tool_choice: body.get("tool_choice").filter(|v| !v.is_null()).cloned(),
        sampling: sampling(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_keeps_known_and_extra_parameters_only() {
        let body = json!({
            "model": "m", "messages": [], "temperature": 0.7, "max_completion_tokens": 512,
            "min_p": 0.05, "stream": true, "return_token_ids": true, "stop": ["\n\n"],
            "response_format": {"type": "json_object"}
        });
        let s = sampling(&body);
        assert_eq!(s.temperature, Some(0.7));
        assert_eq!(s.max_tokens, Some(512));
        assert_eq!(s.stop, Some(json!(["\n\n"])));
        // A response format constrains what is sampled (the trainer must know): it is kept.
        assert_eq!(
            s.extra.keys().collect::<Vec<_>>(),
            vec!["min_p", "response_format"]
        );
    }

    #[test]
    fn a_responses_request_becomes_a_message_list() {
        let body = json!({"instructions": "Be brief.", "input": "Hi"});
        let m = messages(Endpoint::Responses, &body);
        assert_eq!(
            m,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Hi"})
            ]
        );
    }
}
