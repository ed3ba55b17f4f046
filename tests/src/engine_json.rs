//! Response bodies in the exact shapes vLLM's OpenAI-compatible server sends (v0.10-era field
//! set): chat completions and their SSE chunks, text completions, the Responses API and its
//! streaming events, the model list and the error object.
//!
//! The answer is chosen the way a tool-using model behaves: when the request offers tools and the
//! last message is not a tool result, the model calls the first tool; otherwise it answers text.

use serde_json::{json, Value};

pub const MODEL: &str = "mock-llama";
pub const ANSWER: &str = "The weather in Paris is sunny, 21 °C.";
const CREATED: u64 = 1_764_400_000;

/// What the mock model decided to say.
#[derive(Debug, Clone)]
pub enum Reply {
    Text(String),
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
}

impl Reply {
    /// The reply to a chat-completions or responses request body.
    pub fn for_request(request: &Value) -> Self {
        let first_tool = request["tools"]
            .as_array()
            .and_then(|tools| tools.first())
            .and_then(|tool| {
                tool["function"]["name"]
                    .as_str()
                    .or_else(|| tool["name"].as_str())
            });
        let last_is_tool_result = last_message(request)
            .is_some_and(|m| m["role"] == "tool" || m["type"] == "function_call_output");
        match first_tool {
            Some(name) if !last_is_tool_result => Self::ToolCall {
                id: "chatcmpl-tool-8f2e4a1c9b7d4e05a3c6".to_owned(),
                name: name.to_owned(),
                arguments: r#"{"city": "Paris", "unit": "celsius"}"#.to_owned(),
            },
            _ => Self::Text(ANSWER.to_owned()),
        }
    }

    fn finish_reason(&self) -> &'static str {
        match self {
            Self::Text(_) => "stop",
            Self::ToolCall { .. } => "tool_calls",
        }
    }
}

fn last_message(request: &Value) -> Option<&Value> {
    request["messages"]
        .as_array()
        .or_else(|| request["input"].as_array())
        .and_then(|m| m.last())
}

fn model_of(request: &Value) -> &str {
    request["model"].as_str().unwrap_or(MODEL)
}

/// A whitespace tokeniser stands in for the engine's: counts only feed `usage`.
fn count_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn prompt_tokens(request: &Value) -> u64 {
    count_tokens(&request.to_string()) + 7
}

fn usage(request: &Value, completion: &str) -> Value {
    let prompt = prompt_tokens(request);
    let completion = count_tokens(completion) + 1;
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": null
    })
}

fn reply_text(reply: &Reply) -> &str {
    match reply {
        Reply::Text(text) => text,
        Reply::ToolCall { arguments, .. } => arguments,
    }
}

pub fn chat_completion(id: &str, request: &Value, reply: &Reply) -> Value {
    let message = match reply {
        Reply::Text(text) => json!({
            "role": "assistant", "reasoning_content": null, "content": text, "tool_calls": []
        }),
        Reply::ToolCall {
            id: call_id,
            name,
            arguments,
        } => json!({
            "role": "assistant", "reasoning_content": null, "content": null,
            "tool_calls": [{
                "id": call_id, "type": "function",
                "function": { "name": name, "arguments": arguments }
            }]
        }),
    };
    json!({
        "id": id,
        "object": "chat.completion",
        "created": CREATED,
        "model": model_of(request),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": reply.finish_reason(),
            "stop_reason": null
        }],
        "usage": usage(request, reply_text(reply)),
        "prompt_logprobs": null,
        "kv_transfer_params": null
    })
}

/// The `data:` payloads of a streamed chat completion, `[DONE]` excluded. Text arrives a word
/// at a time; tool-call arguments arrive in several pieces after a head that carries id and name.
pub fn chat_completion_chunks(id: &str, request: &Value, reply: &Reply) -> Vec<Value> {
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model_of(request),
            "choices": [{
                "index": 0, "delta": delta, "logprobs": null,
                "finish_reason": finish, "stop_reason": null
            }]
        })
    };
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    match reply {
        Reply::Text(text) => {
            for piece in split_keeping_spaces(text) {
                chunks.push(chunk(json!({ "content": piece }), None));
            }
        }
        Reply::ToolCall {
            id: call_id,
            name,
            arguments,
        } => {
            chunks.push(chunk(
                json!({"tool_calls": [{
                    "id": call_id, "type": "function", "index": 0,
                    "function": {"name": name, "arguments": ""}
                }]}),
                None,
            ));
            for piece in split_in(arguments, 4) {
                chunks.push(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
    }
    chunks.push(chunk(json!({"content": ""}), Some(reply.finish_reason())));
    if request["stream_options"]["include_usage"] == true {
        chunks.push(json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model_of(request),
            "choices": [],
            "usage": usage(request, reply_text(reply))
        }));
    }
    chunks
}

pub fn completion(id: &str, request: &Value) -> Value {
    json!({
        "id": id,
        "object": "text_completion",
        "created": CREATED,
        "model": model_of(request),
        "choices": [{
            "index": 0, "text": ANSWER, "logprobs": null,
            "finish_reason": "stop", "stop_reason": null, "prompt_logprobs": null
        }],
        "usage": usage(request, ANSWER),
        "kv_transfer_params": null
    })
}

pub fn completion_chunks(id: &str, request: &Value) -> Vec<Value> {
    let pieces = split_keeping_spaces(ANSWER);
    let last = pieces.len().saturating_sub(1);
    let mut chunks: Vec<Value> = pieces
        .into_iter()
        .enumerate()
        .map(|(i, piece)| {
            json!({
                "id": id, "object": "text_completion", "created": CREATED,
                "model": model_of(request),
                "choices": [{
                    "index": 0, "text": piece, "logprobs": null,
                    "finish_reason": if i == last { json!("stop") } else { Value::Null },
                    "stop_reason": null
                }]
            })
        })
        .collect();
    if request["stream_options"]["include_usage"] == true {
        chunks.push(json!({
            "id": id, "object": "text_completion", "created": CREATED,
            "model": model_of(request), "choices": [], "usage": usage(request, ANSWER)
        }));
    }
    chunks
}

fn response_output_item(reply: &Reply, done: bool) -> Value {
    let status = if done { "completed" } else { "in_progress" };
    match reply {
        Reply::Text(text) => json!({
            "id": "msg_6b9f1c2e7d", "type": "message", "status": status, "role": "assistant",
            "content": if done {
                json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
            } else {
                json!([])
            }
        }),
        Reply::ToolCall {
            name, arguments, ..
        } => json!({
            "id": "fc_4e1a9d03b2", "type": "function_call", "status": status,
            "call_id": "call_Xk2pQ9rT", "name": name,
            "arguments": if done { arguments.as_str() } else { "" }
        }),
    }
}

pub fn response(id: &str, request: &Value, reply: &Reply, done: bool) -> Value {
    let (input, output) = (prompt_tokens(request), count_tokens(reply_text(reply)) + 1);
    json!({
        "id": id,
        "object": "response",
        "created_at": CREATED,
        "status": if done { "completed" } else { "in_progress" },
        "error": null,
        "incomplete_details": null,
        "instructions": request.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": request.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "model": model_of(request),
        "output": if done { json!([response_output_item(reply, true)]) } else { json!([]) },
        "parallel_tool_calls": true,
        "temperature": request.get("temperature").cloned().unwrap_or(json!(1.0)),
        "tool_choice": request.get("tool_choice").cloned().unwrap_or(json!("auto")),
        "tools": request.get("tools").cloned().unwrap_or(json!([])),
        "top_p": request.get("top_p").cloned().unwrap_or(json!(1.0)),
        "usage": if done {
            json!({
                "input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input + output
            })
        } else {
            Value::Null
        }
    })
}

/// `(event name, data)` pairs of a streamed Responses API call.
pub fn response_events(id: &str, request: &Value, reply: &Reply) -> Vec<(String, Value)> {
    let mut events: Vec<Value> = vec![
        json!({"type": "response.created", "response": response(id, request, reply, false)}),
        json!({"type": "response.in_progress", "response": response(id, request, reply, false)}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": response_output_item(reply, false)}),
    ];
    match reply {
        Reply::Text(text) => {
            let part =
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            events.push(
                json!({"type": "response.content_part.added", "item_id": "msg_6b9f1c2e7d",
                               "output_index": 0, "content_index": 0, "part": part}),
            );
            for piece in split_keeping_spaces(text) {
                events.push(
                    json!({"type": "response.output_text.delta", "item_id": "msg_6b9f1c2e7d",
                                   "output_index": 0, "content_index": 0, "delta": piece,
                                   "logprobs": []}),
                );
            }
            events.push(
                json!({"type": "response.output_text.done", "item_id": "msg_6b9f1c2e7d",
                               "output_index": 0, "content_index": 0, "text": text,
                               "logprobs": []}),
            );
            events.push(
                json!({"type": "response.content_part.done", "item_id": "msg_6b9f1c2e7d",
                               "output_index": 0, "content_index": 0,
                               "part": {"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": []}}),
            );
        }
        Reply::ToolCall { arguments, .. } => {
            for piece in split_in(arguments, 3) {
                events.push(json!({"type": "response.function_call_arguments.delta",
                                   "item_id": "fc_4e1a9d03b2", "output_index": 0, "delta": piece}));
            }
            events.push(json!({"type": "response.function_call_arguments.done",
                               "item_id": "fc_4e1a9d03b2", "output_index": 0,
                               "arguments": arguments}));
        }
    }
    events.push(
        json!({"type": "response.output_item.done", "output_index": 0,
                       "item": response_output_item(reply, true)}),
    );
    events.push(
        json!({"type": "response.completed", "response": response(id, request, reply, true)}),
    );
    events
        .into_iter()
        .enumerate()
        .map(|(seq, mut event)| {
            event["sequence_number"] = json!(seq);
            let name = event["type"].as_str().unwrap_or_default().to_owned();
            (name, event)
        })
        .collect()
}

pub fn models() -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": MODEL, "object": "model", "created": CREATED, "owned_by": "vllm",
            "root": "/models/mock-llama", "parent": null, "max_model_len": 32768,
            "permission": [{
                "id": "modelperm-1f6e0b7a", "object": "model_permission", "created": CREATED,
                "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
                "allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
                "organization": "*", "group": null, "is_blocking": false
            }]
        }]
    })
}

/// vLLM's error body (`ErrorResponse`, nested form).
pub fn error(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        _ => "InternalServerError",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": status}})
}

/// Splits into words, each keeping its leading space, as detokenised deltas do.
fn split_keeping_spaces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        if ch == ' ' && !current.is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
        current.push(ch);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// `n` roughly equal pieces on character boundaries.
fn split_in(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}
