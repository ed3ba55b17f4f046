//! An Anthropic Messages request as the chat-completions request an OpenAI-compatible engine
//! serves: the engine then gives its token ids and logprobs exactly as for chat, and the step
//! recorded is a chat step.
//!
//! The mapping follows vLLM 0.32's own `/v1/messages` (`entrypoints/anthropic/serving.py`), so
//! the engine sees the prompt its own endpoint would have rendered, with three changes a
//! recorder needs:
//! - tool results are put in the order of the tool calls they answer (clients re-order them),
//!   so the same history always gives the same chat messages;
//! - what a self-hosted engine cannot do is refused with a clear error instead of dropped
//!   silently: server tools (`web_search_…`, `bash_…`), documents, MCP servers;
//! - `thinking` becomes `chat_template_kwargs.enable_thinking`, the switch the reasoning chat
//!   templates (Qwen3, DeepSeek) read.
//!
//! `cache_control` markers, `citations` and block ids that say nothing to the engine are left out
//! (a new block is built for each one read), so re-sent histories match what was recorded.

use serde_json::{json, Map, Value};

/// Why a Messages request cannot be served; the agent gets it as an `invalid_request_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct Invalid {
    /// Where in the request, as Anthropic's API names it (`messages.2.content.0.type`).
    pub param: String,
    pub message: String,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid {
        param: param.into(),
        message: message.into(),
    }
}

/// Sampling and engine fields that mean the same in both APIs, or are vLLM's own extensions an
/// agent sends through the Anthropic SDK's `extra_body`: passed on unchanged.
const PASSED_ON: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "chat_template_kwargs",
    "kv_transfer_params",
    // Session hints (`metadata.session_id`) are read from it; the engine ignores it.
    "metadata",
];

/// Fields of the Messages API a self-hosted engine has nothing to do with; refused when set.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "mcp_servers",
        "MCP servers are run by Anthropic's API, not by this engine",
    ),
    (
        "container",
        "code execution containers are run by Anthropic's API, not by this engine",
    ),
];

/// Fields accepted and not needed by the engine (`metadata` is read for session hints before).
const IGNORED: &[&str] = &["service_tier", "anthropic_version", "context_management"];

/// Blocks the system prompt starts with that change on every request (Claude Code's billing
/// header holds a per-request hash): left out, as vLLM does, so prefixes stay cacheable.
const VOLATILE_SYSTEM_PREFIX: &str = "x-anthropic-billing-header";

/// The chat-completions body for Messages request `body`.
pub fn to_chat(body: &Value) -> Result<Value, Invalid> {
    let Some(request) = body.as_object() else {
        return Err(invalid("body", "the request body must be a JSON object"));
    };
    let mut chat = Map::new();
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("model", "Field required"))?;
    chat.insert("model".to_owned(), model.into());
    let mut messages = Vec::new();
    if let Some(system) = system_prompt(request)? {
        messages.push(json!({"role": "system", "content": system}));
    }
    let turns = request
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "Field required"))?;
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    convert_messages(turns, tools, &mut messages)?;
    chat.insert("messages".to_owned(), Value::Array(messages));
    let max_tokens = request
        .get("max_tokens")
        .ok_or_else(|| invalid("max_tokens", "Field required"))?;
    if max_tokens.as_u64().is_none_or(|n| n < 1) {
        return Err(invalid(
            "max_tokens",
            "must be a whole number of at least 1",
        ));
    }
    chat.insert("max_tokens".to_owned(), max_tokens.clone());
    for (key, value) in request {
        match key.as_str() {
            "model" | "messages" | "system" | "max_tokens" | "tools" | "tool_choice" => {}
            "stream" => {
                chat.insert("stream".to_owned(), value.clone());
                if value == &Value::Bool(true) {
                    // Usage comes in a last chunk only when asked for; `message_delta` needs it.
                    chat.insert("stream_options".to_owned(), json!({"include_usage": true}));
                }
            }
            "stop_sequences" if !value.is_null() => {
                chat.insert("stop".to_owned(), value.clone());
            }
            "thinking" => thinking(value, &mut chat)?,
            "output_config" => output_config(value, &mut chat)?,
            key if PASSED_ON.contains(&key) => {
                chat.insert(key.to_owned(), value.clone());
            }
            key if IGNORED.contains(&key) || value.is_null() => {}
            key => {
                let message = UNSUPPORTED.iter().find(|(name, _)| *name == key).map_or(
                    "is not a field of the Messages API this sidecar serves",
                    |(_, m)| *m,
                );
                return Err(invalid(key, message));
            }
        }
    }
    if let Some(tools) = request.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".to_owned(), convert_tools(tools)?);
    }
    if let Some(choice) = request.get("tool_choice").filter(|v| !v.is_null()) {
        convert_tool_choice(choice, &mut chat)?;
    }
    Ok(Value::Object(chat))
}

/// The system prompt: a string, or text blocks joined (without separator, as vLLM joins them).
fn system_prompt(request: &Map<String, Value>) -> Result<Option<String>, Invalid> {
    let text = match request.get("system") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                if block["type"] != "text" {
                    return Err(invalid(
                        format!("system.{i}.type"),
                        "system blocks must be text",
                    ));
                }
                let part = block["text"].as_str().unwrap_or_default();
                if !part.starts_with(VOLATILE_SYSTEM_PREFIX) {
                    text.push_str(part);
                }
            }
            text
        }
        Some(_) => {
            return Err(invalid(
                "system",
                "must be a string or a list of text blocks",
            ))
        }
    };
    Ok((!text.is_empty()).then_some(text))
}

fn convert_messages(turns: &[Value], tools: &[Value], out: &mut Vec<Value>) -> Result<(), Invalid> {
    // The ids of the last assistant turn's tool calls, in order: its results follow that order.
    let mut call_order: Vec<String> = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = turn["role"].as_str().unwrap_or_default();
        if role == "system" {
            // Not Anthropic's API, but vLLM's endpoint takes it: a system turn in place.
            let (text, _) = tool_result_content(&turn["content"], &at)?;
            out.push(json!({"role": "system", "content": text}));
            continue;
        }
        if role != "user" && role != "assistant" {
            return Err(invalid(
                format!("{at}.role"),
                "must be \"user\" or \"assistant\"",
            ));
        }
        let blocks = match &turn["content"] {
            Value::String(text) => {
                out.push(json!({"role": role, "content": text}));
                call_order.clear();
                continue;
            }
            Value::Array(blocks) => blocks,
            _ => {
                return Err(invalid(
                    format!("{at}.content"),
                    "must be a string or a list of content blocks",
                ))
            }
        };
        let converted = convert_blocks(role, blocks, tools, &at)?;
        if role == "assistant" {
            call_order = converted
                .tool_calls
                .iter()
                .filter_map(|c| c["id"].as_str().map(str::to_owned))
                .collect();
        } else {
            let mut results = converted.tool_results;
            results.sort_by_key(|r| {
                let id = r["tool_call_id"].as_str().unwrap_or_default();
                call_order
                    .iter()
                    .position(|c| c == id)
                    .unwrap_or(usize::MAX)
            });
            out.extend(results);
            call_order.clear();
        }
        let mut message = Map::new();
        message.insert("role".to_owned(), role.into());
        match converted.parts.as_slice() {
            [] => {}
            [only] if only["type"] == "text" => {
                message.insert("content".to_owned(), only["text"].clone());
            }
            parts => {
                message.insert("content".to_owned(), Value::Array(parts.to_vec()));
            }
        }
        if !converted.reasoning.is_empty() {
            message.insert("reasoning".to_owned(), converted.reasoning.into());
        }
        if !converted.tool_calls.is_empty() {
            message.insert("tool_calls".to_owned(), Value::Array(converted.tool_calls));
        }
        // A user turn of tool results only is those results; an empty assistant turn (a client
        // that sends back a reply without content) stays, as a turn.
        if message.len() > 1 || role == "assistant" {
            if role == "assistant" && !message.contains_key("content") {
                message.insert("content".to_owned(), Value::Null);
            }
            out.push(Value::Object(message));
        }
    }
    Ok(())
}

#[derive(Default)]
struct Blocks {
    parts: Vec<Value>,
    reasoning: String,
    tool_calls: Vec<Value>,
    tool_results: Vec<Value>,
}

fn convert_blocks(
    role: &str,
    blocks: &[Value],
    tools: &[Value],
    at: &str,
) -> Result<Blocks, Invalid> {
    let mut out = Blocks::default();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content.{j}");
        match block["type"].as_str().unwrap_or_default() {
            "text" => {
                let text = block["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    out.parts.push(json!({"type": "text", "text": text}));
                }
            }
            "image" => out.parts.push(json!({
                "type": "image_url",
                "image_url": {"url": image_url(&block["source"], &at)?},
            })),
            "thinking" if role == "assistant" => {
                out.reasoning
                    .push_str(block["thinking"].as_str().unwrap_or_default());
            }
            // Opaque (encrypted) reasoning: nothing an engine can read. Accepted so that a client
            // echoing a whole reply back is not refused.
            "redacted_thinking" if role == "assistant" => {}
            "tool_use" if role == "assistant" => {
                let id = block["id"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("{at}.id"), "Field required"))?;
                let name = block["name"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("{at}.name"), "Field required"))?;
                out.tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments(&block["input"], name, tools)},
                }));
            }
            "tool_result" if role == "user" => {
                let id = block["tool_use_id"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("{at}.tool_use_id"), "Field required"))?;
                let (text, images) = tool_result_content(&block["content"], &at)?;
                out.tool_results
                    .push(json!({"role": "tool", "tool_call_id": id, "content": text}));
                if !images.is_empty() {
                    // Chat tool messages hold text only: the images follow as a user turn.
                    let parts: Vec<Value> = images
                        .into_iter()
                        .map(|url| json!({"type": "image_url", "image_url": {"url": url}}))
                        .collect();
                    out.tool_results
                        .push(json!({"role": "user", "content": parts}));
                }
            }
            other => {
                let message = match other {
                    "" => "Field required".to_owned(),
                    "tool_use" | "thinking" | "redacted_thinking" => {
                        format!("a {other} block belongs to an assistant turn")
                    }
                    "tool_result" => "a tool_result block belongs to a user turn".to_owned(),
                    _ => format!("content blocks of type {other:?} are not served by this engine"),
                };
                return Err(invalid(format!("{at}.type"), message));
            }
        }
    }
    Ok(out)
}

/// A `tool_use` block's `input` as the arguments string of a chat tool call: its JSON, or, for
/// the `{"arguments": "<as written>"}` the sidecar made of arguments that were no JSON object
/// ([`super::response::tool_input`]), those arguments as the engine wrote them — unless the tool
/// really has a parameter called `arguments`.
fn arguments(input: &Value, name: &str, tools: &[Value]) -> String {
    let declares_arguments = || {
        tools
            .iter()
            .filter(|tool| tool["name"] == name)
            .any(|tool| !tool["input_schema"]["properties"]["arguments"].is_null())
    };
    match input {
        Value::Null => "{}".to_owned(),
        Value::Object(fields) if fields.len() == 1 && !declares_arguments() => {
            match fields.get("arguments") {
                Some(Value::String(raw)) => raw.clone(),
                _ => input.to_string(),
            }
        }
        input => input.to_string(),
    }
}

/// A tool result's text (text blocks joined by newlines, as vLLM joins them) and image URLs.
fn tool_result_content(content: &Value, at: &str) -> Result<(String, Vec<String>), Invalid> {
    match content {
        Value::Null => Ok((String::new(), Vec::new())),
        Value::String(text) => Ok((text.clone(), Vec::new())),
        Value::Array(items) => {
            let mut texts = Vec::new();
            let mut images = Vec::new();
            for (k, item) in items.iter().enumerate() {
                let at = format!("{at}.content.{k}");
                match item["type"].as_str().unwrap_or_default() {
                    "text" => texts.push(item["text"].as_str().unwrap_or_default()),
                    "image" => images.push(image_url(&item["source"], &at)?),
                    other => {
                        return Err(invalid(
                            format!("{at}.type"),
                            format!("tool results of type {other:?} are not served by this engine"),
                        ))
                    }
                }
            }
            Ok((texts.join("\n"), images))
        }
        _ => Err(invalid(
            format!("{at}.content"),
            "must be a string or a list of content blocks",
        )),
    }
}

/// An image source as the URL a chat `image_url` part takes (a `data:` URL for base64).
fn image_url(source: &Value, at: &str) -> Result<String, Invalid> {
    match source["type"].as_str() {
        Some("url") => source["url"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| invalid(format!("{at}.source.url"), "Field required")),
        Some("base64") => {
            let media = source["media_type"]
                .as_str()
                .ok_or_else(|| invalid(format!("{at}.source.media_type"), "Field required"))?;
            let data = source["data"]
                .as_str()
                .ok_or_else(|| invalid(format!("{at}.source.data"), "Field required"))?;
            Ok(format!("data:{media};base64,{data}"))
        }
        _ => Err(invalid(
            format!("{at}.source.type"),
            "images are served from \"base64\" or \"url\" sources",
        )),
    }
}

fn convert_tools(tools: &Value) -> Result<Value, Invalid> {
    let Some(tools) = tools.as_array() else {
        return Err(invalid("tools", "must be a list of tools"));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool["type"].as_str() {
            None | Some("custom") => {}
            Some(server) => {
                return Err(invalid(
                    format!("tools.{i}.type"),
                    format!("{server:?} is a server tool run by Anthropic's API; a self-hosted engine only calls the client's own tools"),
                ))
            }
        }
        let name = tool["name"]
            .as_str()
            .ok_or_else(|| invalid(format!("tools.{i}.name"), "Field required"))?;
        let schema = tool
            .get("input_schema")
            .filter(|s| s.is_object())
            .ok_or_else(|| invalid(format!("tools.{i}.input_schema"), "Field required"))?;
        let mut function = Map::new();
        function.insert("name".to_owned(), name.into());
        if let Some(description) = tool.get("description").filter(|d| d.is_string()) {
            function.insert("description".to_owned(), description.clone());
        }
        function.insert("parameters".to_owned(), schema.clone());
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

fn convert_tool_choice(choice: &Value, chat: &mut Map<String, Value>) -> Result<(), Invalid> {
    let converted = match choice["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice["name"]
                .as_str()
                .ok_or_else(|| invalid("tool_choice.name", "Field required"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(invalid(
                "tool_choice.type",
                "must be \"auto\", \"any\", \"tool\" or \"none\"",
            ))
        }
    };
    chat.insert("tool_choice".to_owned(), converted);
    if choice["disable_parallel_tool_use"] == Value::Bool(true) {
        chat.insert("parallel_tool_calls".to_owned(), Value::Bool(false));
    }
    Ok(())
}

/// `thinking: {type: enabled|disabled|adaptive}` as the chat template's `enable_thinking`,
/// unless the client set that itself in `chat_template_kwargs`.
fn thinking(value: &Value, chat: &mut Map<String, Value>) -> Result<(), Invalid> {
    let enable = match value["type"].as_str() {
        Some("enabled" | "adaptive") => true,
        Some("disabled") => false,
        _ => {
            return Err(invalid(
                "thinking.type",
                "must be \"enabled\", \"adaptive\" or \"disabled\"",
            ))
        }
    };
    let kwargs = chat
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Some(kwargs) = kwargs.as_object_mut() {
        kwargs
            .entry("enable_thinking")
            .or_insert(Value::Bool(enable));
    }
    Ok(())
}

/// `output_config.format` (a JSON schema the answer must follow) as the chat `response_format`.
fn output_config(value: &Value, chat: &mut Map<String, Value>) -> Result<(), Invalid> {
    let format = &value["format"];
    if format.is_null() {
        return Ok(());
    }
    if format["type"] != "json_schema" || !format["schema"].is_object() {
        return Err(invalid(
            "output_config.format",
            "must be {\"type\": \"json_schema\", \"schema\": {...}}",
        ));
    }
    chat.insert(
        "response_format".to_owned(),
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": format["schema"]}}),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Value {
        to_chat(&body).unwrap()
    }

    #[test]
    fn a_plain_request_becomes_chat_with_its_system_prompt_first() {
        let out = chat(json!({
            "model": "m", "max_tokens": 64, "stream": true, "temperature": 0.5,
            "stop_sequences": ["END"],
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                       "cache_control": {"type": "ephemeral"}}]}],
            "metadata": {"user_id": "u1"}
        }));
        assert_eq!(
            out,
            json!({
                "model": "m",
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}],
                "max_tokens": 64, "stream": true, "stream_options": {"include_usage": true},
                "temperature": 0.5, "stop": ["END"], "metadata": {"user_id": "u1"}
            })
        );
    }

    #[test]
    fn a_tool_session_becomes_tool_calls_and_tool_messages_in_call_order() {
        let out = chat(json!({
            "model": "m", "max_tokens": 8,
            "tools": [{"name": "read", "description": "Read a file",
                       "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                       "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Read a and b"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "two files", "signature": "s"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {"path": "b"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_b",
                     "content": [{"type": "text", "text": "B"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A", "is_error": false},
                    {"type": "text", "text": "Now summarise."}]}
            ]
        }));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": "Read a and b"},
                {"role": "assistant", "content": "Reading.", "reasoning": "two files",
                 "tool_calls": [
                    {"id": "toolu_a", "type": "function",
                     "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}},
                    {"id": "toolu_b", "type": "function",
                     "function": {"name": "read", "arguments": "{\"path\":\"b\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_a", "content": "A"},
                {"role": "tool", "tool_call_id": "toolu_b", "content": "B"},
                {"role": "user", "content": "Now summarise."}
            ])
        );
        assert_eq!(
            out["tools"],
            json!([{"type": "function", "function": {"name": "read", "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
        );
        assert_eq!(out["tool_choice"], json!("required"));
        assert_eq!(out["parallel_tool_calls"], json!(false));
    }

    #[test]
    fn arguments_kept_whole_because_they_were_no_object_go_back_as_written() {
        let turn = |tools: Value| {
            chat(
                json!({"model": "m", "max_tokens": 8, "tools": tools, "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                   "input": {"arguments": "94"}}]}]}),
            )
        };
        let schema = |properties: Value| json!([{"name": "f", "input_schema": {"type": "object", "properties": properties}}]);
        let out = turn(schema(json!({"city": {"type": "string"}})));
        assert_eq!(
            out["messages"][0]["tool_calls"][0]["function"]["arguments"],
            "94"
        );
        // A tool whose one parameter is called `arguments` gets its object.
        let out = turn(schema(json!({"arguments": {"type": "string"}})));
        assert_eq!(
            out["messages"][0]["tool_calls"][0]["function"]["arguments"],
            r#"{"arguments":"94"}"#
        );
    }

    #[test]
    fn a_user_turn_of_tool_results_only_is_those_results() {
        let out = chat(json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t", "content": "ok"}
            ])
        );
    }

    #[test]
    fn images_become_image_urls_and_thinking_the_template_switch() {
        let out = chat(json!({"model": "m", "max_tokens": 8,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "What is it?"}]}]}));
        assert_eq!(
            out["messages"][0]["content"],
            json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                   {"type": "text", "text": "What is it?"}])
        );
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
    }

    #[test]
    fn the_volatile_billing_block_is_left_out_of_the_system_prompt() {
        let out = chat(json!({"model": "m", "max_tokens": 8, "messages": [],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
                       {"type": "text", "text": "You are a coding agent."}]}));
        assert_eq!(
            out["messages"],
            json!([{"role": "system", "content": "You are a coding agent."}])
        );
    }

    #[test]
    fn what_an_engine_cannot_do_is_refused_with_where_it_is() {
        let cases = [
            (json!({"model": "m", "messages": []}), "max_tokens"),
            (json!({"max_tokens": 8, "messages": []}), "model"),
            (
                json!({"model": "m", "max_tokens": 8, "messages": [],
                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools.0.type",
            ),
            (
                json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
                    {"type": "document", "source": {"type": "text", "data": "x"}}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"model": "m", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}),
                "messages.0.role",
            ),
            (
                json!({"model": "m", "max_tokens": 8, "messages": [], "mcp_servers": []}),
                "mcp_servers",
            ),
            (
                json!({"model": "m", "max_tokens": 0, "messages": []}),
                "max_tokens",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(
                to_chat(&body).map_err(|e| e.param),
                Err(param.to_owned()),
                "{body}"
            );
        }
    }
}
