//! Puts a response back together for the recorder: whether it came whole or streamed, the
//! recorded output equals what the non-streaming call would have returned.
//!
//! An [`Assembler`] is fed the engine's own JSON — before [`super::strip`] takes out what the
//! agent did not ask for — either once with a whole body ([`Assembler::on_body`]) or event by
//! event ([`Assembler::on_event`], [`Assembler::on_done`]). It understands:
//! - chat completions: `message` or `delta` content, `reasoning_content` (vLLM also spells it
//!   `reasoning`), tool calls rebuilt from index-keyed deltas (id, type and name from the first
//!   delta that has them, arguments concatenated) into OpenAI's `tool_calls` shape;
//! - completions: the `text` of the choice;
//! - for both: `prompt_token_ids` (top level or per choice), `token_ids` concatenated across
//!   chunks, `logprobs` (chat `content` entries, or completions' parallel `tokens` /
//!   `token_logprobs` arrays) appended to the schema's [`CompletionLogprobs`] columns, `usage`,
//!   `model`;
//! - the Responses API: the `output` items of a body or of the authoritative `response` of
//!   `response.completed`; when a stream breaks before that, what the `output_item.done` events
//!   and the text, reasoning and argument deltas gave so far. Message text becomes content,
//!   `function_call` items tool calls, `reasoning` items reasoning content.
//!
//! Only choice 0 is recorded: a step is one sampled answer, and agents ask for `n = 1`.
//! Empty content beside tool calls is recorded as absent, as a non-streamed tool call has
//! `content: null` where its stream sent `""`; an empty reply without tool calls (an immediate
//! EOS) is `""`, as vLLM returns it. Empty reasoning is absent.

mod typed;

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use clawback_datapool::{
    AssistantOutput, CompletionLogprobs, Endpoint, EngineTokens, TokenLogprob, TopLogprob, Usage,
};

/// Everything the recorder needs from one response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Assembled {
    pub output: AssistantOutput,
    /// The engine's token ids and logprobs when it returned ids; `None` means text only.
    pub engine: Option<EngineTokens>,
    /// Logprobs an engine returned without token ids (a streamed SGLang call). The schema has
    /// no place for them yet; they are kept so the recorder can decide.
    pub logprobs_without_ids: CompletionLogprobs,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The `model` of the response: the base model or adapter that served it.
    pub model: Option<String>,
    /// A Responses API response's `id` (what a next call names as `previous_response_id`).
    pub response_id: Option<String>,
    pub ending: Ending,
}

/// How the response ended, as far as its content tells.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Ending {
    /// A whole body, `data: [DONE]`, or a final Responses event (`completed`, `incomplete`).
    Complete,
    /// The engine answered or ended with an error object.
    Error(String),
    /// The stream stopped before its end, or the body was not whole JSON.
    #[default]
    Truncated,
}

/// Reassembles one response; see the module docs for what it reads.
#[derive(Debug)]
pub struct Assembler {
    endpoint: Endpoint,
    content: String,
    reasoning: String,
    /// Tool calls by their `index`.
    tool_calls: BTreeMap<u64, ToolCall>,
    /// Responses API output items by `output_index`.
    items: BTreeMap<u64, Item>,
    prompt_ids: Option<Vec<u32>>,
    completion_ids: Option<Vec<u32>>,
    logprobs: CompletionLogprobs,
    /// An entry could not be read: the logprobs no longer line up with the ids.
    logprobs_broken: bool,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
    response_id: Option<String>,
    ending: Ending,
}

#[derive(Debug, Default)]
struct ToolCall {
    id: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// A Responses API output item, reduced to what a step records.
#[derive(Debug)]
enum Item {
    Message(String),
    Reasoning(String),
    FunctionCall(ToolCall),
    Other,
}

impl Assembler {
    pub fn new(endpoint: Endpoint) -> Self {
        Assembler {
            endpoint,
            content: String::new(),
            reasoning: String::new(),
            tool_calls: BTreeMap::new(),
            items: BTreeMap::new(),
            prompt_ids: None,
            completion_ids: None,
            logprobs: CompletionLogprobs::default(),
            logprobs_broken: false,
            finish_reason: None,
            usage: None,
            model: None,
            response_id: None,
            ending: Ending::Truncated,
        }
    }

    /// A whole, non-streamed response body.
    pub fn on_body(&mut self, body: &Value) {
        if self.error(body) {
            return;
        }
        match self.endpoint {
            Endpoint::Responses => self.response(body),
            Endpoint::Messages => self.anthropic_message(body, true),
            Endpoint::ChatCompletions | Endpoint::Completions => {
                if body.get("choices").is_some_and(Value::is_array) {
                    self.chunk(body, "message");
                    self.ending = Ending::Complete;
                }
            }
        }
    }

    /// One streamed event's `data` (parsed), with its `event:` name when it had one.
    pub fn on_event(&mut self, name: Option<&str>, data: &Value) {
        if self.error(data) {
            return;
        }
        match self.endpoint {
            Endpoint::Responses => self.response_event(name, data),
            Endpoint::Messages => self.message_event(data),
            Endpoint::ChatCompletions | Endpoint::Completions => self.chunk(data, "delta"),
        }
    }

    /// Whether the answer's end arrived (`[DONE]`, `message_stop`, `response.completed`, a whole
    /// body) — whatever else the connection still sends.
    pub fn is_complete(&self) -> bool {
        self.ending == Ending::Complete
    }

    /// `data: [DONE]`: a chat or completions stream ended as it should.
    pub fn on_done(&mut self) {
        if self.ending == Ending::Truncated {
            self.ending = Ending::Complete;
        }
    }

    pub fn finish(self) -> Assembled {
        let tool_calls: Vec<Value> = self
            .tool_calls
            .into_values()
            .map(ToolCall::into_json)
            .collect();
        let mut output = AssistantOutput {
            content: reply_text(self.content, &tool_calls),
            reasoning_content: non_empty(self.reasoning),
            tool_calls,
        };
        if !self.items.is_empty() {
            output = items_output(self.items);
        }
        let finish_reason = match self.endpoint {
            Endpoint::Responses => self
                .finish_reason
                .map(|status| responses_finish_reason(status, &output)),
            _ => self.finish_reason,
        };
        let logprobs = if self.logprobs_broken {
            CompletionLogprobs::default()
        } else {
            self.logprobs
        };
        let (engine, logprobs_without_ids) = match (self.prompt_ids, self.completion_ids) {
            (Some(prompt), Some(completion)) => {
                // Logprobs that do not pair up one-to-one with the ids would mislead the
                // trainer's ratio: keep the ids, drop the logprobs.
                let logprobs = if logprobs.len() == completion.len() {
                    logprobs
                } else {
                    CompletionLogprobs::default()
                };
                let engine = EngineTokens {
                    prompt_token_ids: prompt,
                    completion_token_ids: completion,
                    completion_logprobs: logprobs,
                };
                (Some(engine), CompletionLogprobs::default())
            }
            _ => (None, logprobs),
        };
        // A stream the client did not ask `include_usage` for has no usage chunk; the engines
        // count usage from these very ids, so a non-streamed call would have said the same.
        let usage = self.usage.or_else(|| engine.as_ref().map(counted_usage));
        Assembled {
            output,
            engine,
            logprobs_without_ids,
            finish_reason,
            usage,
            model: self.model,
            response_id: self.response_id,
            ending: self.ending,
        }
    }

    /// An error object in place of a response or a chunk; `true` when it was one.
    fn error(&mut self, data: &Value) -> bool {
        let message = if let Some(error) = data.get("error").filter(|e| e.is_object()) {
            error["message"].as_str().unwrap_or("engine error")
        } else if data["object"] == "error" || data["type"] == "error" {
            data["message"].as_str().unwrap_or("engine error")
        } else {
            return false;
        };
        self.ending = Ending::Error(message.to_owned());
        true
    }

    /// A chat or completions body or chunk; `part` is `message` (body) or `delta` (chunk).
    fn chunk(&mut self, data: &Value, part: &str) {
        self.set_model(data);
        if let Some(usage) = chat_usage(&data["usage"]) {
            self.usage = Some(usage);
        }
        if let Some(ids) = token_ids(&data["prompt_token_ids"]) {
            self.prompt_ids.get_or_insert(ids);
        }
        let Some(choice) = choice_zero(&data["choices"]) else {
            return;
        };
        if let Some(ids) = token_ids(&choice["prompt_token_ids"]) {
            self.prompt_ids.get_or_insert(ids);
        }
        if let Some(ids) = token_ids(&choice["token_ids"]) {
            self.completion_ids.get_or_insert_with(Vec::new).extend(ids);
        }
        self.add_logprobs(&choice["logprobs"]);
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        match self.endpoint {
            Endpoint::Completions => push_str(&mut self.content, &choice["text"]),
            _ => self.message(&choice[part]),
        }
    }

    fn message(&mut self, message: &Value) {
        push_str(&mut self.content, &message["content"]);
        // vLLM ≥0.11 names it `reasoning`, older versions and SGLang `reasoning_content`; some
        // versions send both with the same text.
        let reasoning = match &message["reasoning_content"] {
            Value::String(_) => &message["reasoning_content"],
            _ => &message["reasoning"],
        };
        push_str(&mut self.reasoning, reasoning);
        if let Some(calls) = message["tool_calls"].as_array() {
            self.add_tool_calls(calls);
        }
    }

    /// A message's or a delta's `tool_calls`.
    fn add_tool_calls(&mut self, calls: &[Value]) {
        for (position, call) in calls.iter().enumerate() {
            // A whole message's tool calls have no `index`: their place in the list is it.
            let index = call["index"].as_u64().unwrap_or(position as u64);
            let parts = self.tool_calls.entry(index).or_default();
            parts.add_delta(call);
        }
    }

    fn add_logprobs(&mut self, logprobs: &Value) {
        let converted = if let Some(content) = logprobs["content"].as_array() {
            content.iter().map(chat_logprob).collect::<Option<Vec<_>>>()
        } else if logprobs["tokens"].is_array() {
            completion_logprobs(logprobs)
        } else {
            return;
        };
        match converted {
            Some(entries) => self.logprobs.append(entries.into()),
            None => self.logprobs_broken = true,
        }
    }

    /// An Anthropic `message`: its start in a stream, or (`whole`) a non-streamed answer.
    fn anthropic_message(&mut self, message: &Value, whole: bool) {
        self.set_model(message);
        if let Some(usage) = messages_usage(&message["usage"]) {
            self.usage = Some(usage);
        }
        if !whole {
            return;
        }
        for (index, block) in message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            self.content_block(index as u64, block);
        }
        if let Some(reason) = message["stop_reason"].as_str() {
            self.finish_reason = Some(messages_finish_reason(reason));
        }
        self.ending = Ending::Complete;
    }

    /// One event of an Anthropic Messages stream.
    fn message_event(&mut self, data: &Value) {
        let index = data["index"].as_u64().unwrap_or(0);
        match data["type"].as_str().unwrap_or_default() {
            "message_start" => self.anthropic_message(&data["message"], false),
            "content_block_start" => self.content_block(index, &data["content_block"]),
            "content_block_delta" => {
                let delta = &data["delta"];
                match delta["type"].as_str().unwrap_or_default() {
                    "text_delta" => push_str(&mut self.content, &delta["text"]),
                    "thinking_delta" => push_str(&mut self.reasoning, &delta["thinking"]),
                    "input_json_delta" => {
                        if let Some(call) = self.tool_calls.get_mut(&index) {
                            push_str(&mut call.arguments, &delta["partial_json"]);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.finish_reason = Some(messages_finish_reason(reason));
                }
                if let Some(output) = data["usage"]["output_tokens"].as_u64() {
                    let usage = self.usage.get_or_insert_with(Usage::default);
                    usage.completion_tokens = u32::try_from(output).unwrap_or(u32::MAX);
                    usage.total_tokens =
                        usage.prompt_tokens.saturating_add(usage.completion_tokens);
                }
            }
            "message_stop" => self.ending = Ending::Complete,
            _ => {}
        }
    }

    /// A content block of a message: text, thinking, or a tool call (whose input a stream sends
    /// as `input_json_delta`s after an empty one).
    fn content_block(&mut self, index: u64, block: &Value) {
        match block["type"].as_str().unwrap_or_default() {
            "text" => push_str(&mut self.content, &block["text"]),
            "thinking" => push_str(&mut self.reasoning, &block["thinking"]),
            "tool_use" => {
                let input = &block["input"];
                let empty = input.as_object().is_none_or(serde_json::Map::is_empty);
                let call = ToolCall {
                    id: block["id"].as_str().map(str::to_owned),
                    kind: Some("function".to_owned()),
                    name: block["name"].as_str().map(str::to_owned),
                    arguments: if empty {
                        String::new()
                    } else {
                        input.to_string()
                    },
                };
                self.tool_calls.insert(index, call);
            }
            _ => {}
        }
    }

    fn set_response_id(&mut self, response: &Value) {
        if self.response_id.is_none() {
            if let Some(id) = response["id"].as_str().filter(|id| !id.is_empty()) {
                self.response_id = Some(id.to_owned());
            }
        }
    }

    fn set_model(&mut self, data: &Value) {
        if self.model.is_none() {
            if let Some(model) = data["model"].as_str().filter(|m| !m.is_empty()) {
                self.model = Some(model.to_owned());
            }
        }
    }

    /// A whole Responses API `response` object: its output is authoritative.
    fn response(&mut self, response: &Value) {
        self.set_model(response);
        self.set_response_id(response);
        if let Some(usage) = responses_usage(&response["usage"]) {
            self.usage = Some(usage);
        }
        if let Some(output) = response["output"].as_array() {
            self.items = output
                .iter()
                .enumerate()
                .map(|(i, item)| (i as u64, Item::from_json(item)))
                .collect();
        }
        let status = response["status"].as_str().unwrap_or_default();
        match status {
            "completed" | "incomplete" => {
                let reason = match &response["incomplete_details"]["reason"] {
                    Value::String(reason) if status == "incomplete" => reason.clone(),
                    _ => status.to_owned(),
                };
                self.finish_reason = Some(reason);
                self.ending = Ending::Complete;
            }
            "failed" => {
                let message = response["error"]["message"].as_str().unwrap_or("failed");
                self.ending = Ending::Error(message.to_owned());
            }
            _ => {}
        }
    }

    fn response_event(&mut self, name: Option<&str>, data: &Value) {
        let kind = data["type"].as_str().or(name).unwrap_or_default();
        let index = data["output_index"].as_u64().unwrap_or(0);
        match kind {
            "response.created" | "response.in_progress" => {
                self.set_model(&data["response"]);
                self.set_response_id(&data["response"]);
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.response(&data["response"]);
            }
            "response.output_item.added" | "response.output_item.done" => {
                self.items.insert(index, Item::from_json(&data["item"]));
            }
            "response.output_text.delta" => {
                self.item_delta(index, || Item::Message(String::new()), &data["delta"]);
            }
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                self.item_delta(index, || Item::Reasoning(String::new()), &data["delta"]);
            }
            "response.function_call_arguments.delta" => {
                let new = || Item::FunctionCall(ToolCall::default());
                self.item_delta(index, new, &data["delta"]);
            }
            _ => {}
        }
    }
}

impl Assembler {
    /// Appends a streamed piece to the text (or the arguments) of output item `index`, which
    /// `new` starts when the stream did not announce it.
    fn item_delta(&mut self, index: u64, new: impl FnOnce() -> Item, delta: &Value) {
        match self.items.entry(index).or_insert_with(new) {
            Item::Message(text) | Item::Reasoning(text) => push_str(text, delta),
            Item::FunctionCall(call) => push_str(&mut call.arguments, delta),
            Item::Other => {}
        }
    }
}

impl ToolCall {
    /// Takes in a streamed tool-call delta, or a whole tool call.
    fn add_delta(&mut self, call: &Value) {
        set_once(&mut self.id, &call["id"]);
        set_once(&mut self.kind, &call["type"]);
        set_once(&mut self.name, &call["function"]["name"]);
        match &call["function"]["arguments"] {
            Value::String(piece) => self.arguments.push_str(piece),
            // SGLang may hand back arguments already parsed.
            Value::Object(_) => self
                .arguments
                .push_str(&call["function"]["arguments"].to_string()),
            _ => {}
        }
    }

    /// OpenAI's `tool_calls` entry.
    fn into_json(self) -> Value {
        json!({
            "id": self.id.unwrap_or_default(),
            "type": self.kind.unwrap_or_else(|| "function".to_owned()),
            "function": {"name": self.name.unwrap_or_default(), "arguments": self.arguments}
        })
    }
}

impl Item {
    fn from_json(item: &Value) -> Self {
        match item["type"].as_str() {
            Some("message") => {
                let mut text = String::new();
                for part in item["content"].as_array().into_iter().flatten() {
                    if part["type"] == "output_text" {
                        push_str(&mut text, &part["text"]);
                    }
                }
                Item::Message(text)
            }
            Some("reasoning") => {
                let mut text = String::new();
                let parts = match item["content"].as_array() {
                    Some(content) if !content.is_empty() => content,
                    _ => item["summary"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default(),
                };
                for part in parts {
                    push_str(&mut text, &part["text"]);
                }
                Item::Reasoning(text)
            }
            Some("function_call") => {
                let mut call = ToolCall::default();
                set_once(&mut call.id, &item["call_id"]);
                set_once(&mut call.name, &item["name"]);
                push_str(&mut call.arguments, &item["arguments"]);
                Item::FunctionCall(call)
            }
            _ => Item::Other,
        }
    }
}

/// The assistant output of Responses API items, in output order.
fn items_output(items: BTreeMap<u64, Item>) -> AssistantOutput {
    let (mut content, mut reasoning, mut tool_calls) = (String::new(), String::new(), Vec::new());
    for item in items.into_values() {
        match item {
            Item::Message(text) => content.push_str(&text),
            Item::Reasoning(text) => reasoning.push_str(&text),
            Item::FunctionCall(call) => tool_calls.push(call.into_json()),
            Item::Other => {}
        }
    }
    AssistantOutput {
        content: reply_text(content, &tool_calls),
        reasoning_content: non_empty(reasoning),
        tool_calls,
    }
}

/// The Responses API has a status, not a finish reason: say it the way chat completions do.
fn responses_finish_reason(status: String, output: &AssistantOutput) -> String {
    match status.as_str() {
        "completed" if !output.tool_calls.is_empty() => "tool_calls".to_owned(),
        "completed" => "stop".to_owned(),
        "max_output_tokens" => "length".to_owned(),
        _ => status,
    }
}

/// The choice with `index` 0 (streamed chunks may carry other choices alone).
fn choice_zero(choices: &Value) -> Option<&Value> {
    choices
        .as_array()?
        .iter()
        .enumerate()
        .find(|(position, c)| c["index"].as_u64().unwrap_or(*position as u64) == 0)
        .map(|(_, c)| c)
}

fn token_ids(ids: &Value) -> Option<Vec<u32>> {
    ids.as_array()?
        .iter()
        .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

fn chat_logprob(entry: &Value) -> Option<TokenLogprob> {
    let top_logprobs = match &entry["top_logprobs"] {
        Value::Array(top) => top
            .iter()
            .map(|t| {
                Some(TopLogprob {
                    token: t["token"].as_str()?.to_owned(),
                    logprob: t["logprob"].as_f64()?,
                    bytes: bytes(&t["bytes"]),
                })
            })
            .collect::<Option<Vec<_>>>()?,
        _ => Vec::new(),
    };
    Some(TokenLogprob {
        token: entry["token"].as_str()?.to_owned(),
        logprob: entry["logprob"].as_f64()?,
        bytes: bytes(&entry["bytes"]),
        top_logprobs,
    })
}

/// Completions' parallel arrays: `tokens[i]`, `token_logprobs[i]`, `top_logprobs[i]` (a map of
/// token to logprob, or null).
fn completion_logprobs(logprobs: &Value) -> Option<Vec<TokenLogprob>> {
    let tokens = logprobs["tokens"].as_array()?;
    let values = logprobs["token_logprobs"].as_array()?;
    if tokens.len() != values.len() {
        return None;
    }
    let tops = logprobs["top_logprobs"].as_array();
    tokens
        .iter()
        .zip(values)
        .enumerate()
        .map(|(i, (token, logprob))| {
            let top = match tops.and_then(|t| t.get(i)).and_then(Value::as_object) {
                Some(top) => top_map(top)?,
                None => Vec::new(),
            };
            Some(TokenLogprob {
                token: token.as_str()?.to_owned(),
                logprob: logprob.as_f64()?,
                bytes: None,
                top_logprobs: top,
            })
        })
        .collect()
}

fn top_map(top: &Map<String, Value>) -> Option<Vec<TopLogprob>> {
    top.iter()
        .map(|(token, logprob)| {
            Some(TopLogprob {
                token: token.clone(),
                logprob: logprob.as_f64()?,
                bytes: None,
            })
        })
        .collect()
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    value
        .as_array()?
        .iter()
        .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect()
}

fn chat_usage(usage: &Value) -> Option<Usage> {
    usage_from(usage, "prompt_tokens", "completion_tokens")
}

/// Anthropic's usage: its `input_tokens` leave out what was read from or written to its cache.
fn messages_usage(usage: &Value) -> Option<Usage> {
    let count = |key: &str| usage[key].as_u64().and_then(|n| u32::try_from(n).ok());
    let prompt_tokens = count("input_tokens")?
        .saturating_add(count("cache_read_input_tokens").unwrap_or(0))
        .saturating_add(count("cache_creation_input_tokens").unwrap_or(0));
    let completion_tokens = count("output_tokens").unwrap_or(0);
    Some(Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens.saturating_add(completion_tokens),
    })
}

/// An Anthropic `stop_reason` as the chat `finish_reason` a trainer reads.
fn messages_finish_reason(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        other => other,
    }
    .to_owned()
}

fn responses_usage(usage: &Value) -> Option<Usage> {
    usage_from(usage, "input_tokens", "output_tokens")
}

fn usage_from(usage: &Value, prompt: &str, completion: &str) -> Option<Usage> {
    let count = |key: &str| usage[key].as_u64().and_then(|n| u32::try_from(n).ok());
    let prompt_tokens = count(prompt)?;
    let completion_tokens = count(completion).unwrap_or(0);
    Some(Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: count("total_tokens").unwrap_or(prompt_tokens + completion_tokens),
    })
}

/// Usage as vLLM and SGLang count it: the lengths of the prompt and completion ids.
fn counted_usage(engine: &EngineTokens) -> Usage {
    let count = |ids: &[u32]| u32::try_from(ids.len()).unwrap_or(u32::MAX);
    let prompt_tokens = count(&engine.prompt_token_ids);
    let completion_tokens = count(&engine.completion_token_ids);
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens.saturating_add(completion_tokens),
    }
}

fn push_str(to: &mut String, piece: &Value) {
    if let Value::String(piece) = piece {
        to.push_str(piece);
    }
}

fn set_once(slot: &mut Option<String>, value: &Value) {
    if slot.is_none() {
        if let Some(s) = value.as_str().filter(|s| !s.is_empty()) {
            *slot = Some(s.to_owned());
        }
    }
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

/// The reply's text as the engine gives it whole: `null` beside tool calls when there is none
/// (vLLM's non-streamed tool call), else the text, `""` included — an immediate EOS is an empty
/// reply, and chat templates (Qwen2.5's) fail on a `null` assistant content without tool calls.
fn reply_text(text: String, tool_calls: &[Value]) -> Option<String> {
    if text.is_empty() && !tool_calls.is_empty() {
        None
    } else {
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chunk(choice: Value) -> Value {
        json!({"id": "chatcmpl-9c1", "object": "chat.completion.chunk", "created": 1764400000,
               "model": "Qwen/Qwen3-8B", "choices": [choice]})
    }

    fn delta(delta: Value) -> Value {
        chunk(json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}))
    }

    fn stream(chunks: &[Value], done: bool) -> Assembled {
        let mut assembler = Assembler::new(Endpoint::ChatCompletions);
        for c in chunks {
            assembler.on_event(None, c);
        }
        if done {
            assembler.on_done();
        }
        assembler.finish()
    }

    #[test]
    fn two_parallel_tool_calls_interleaved_across_chunks_are_recorded_whole_in_index_order() {
        let call = |index: u64, head: bool, args: &str| {
            let mut call = json!({"index": index, "function": {"arguments": args}});
            if head {
                call = json!({"id": format!("chatcmpl-tool-{index}"), "type": "function",
                              "index": index, "function": {"name": format!("tool_{index}"),
                              "arguments": args}});
            }
            delta(json!({"tool_calls": [call]}))
        };
        let assembled = stream(
            &[
                delta(json!({"role": "assistant", "content": ""})),
                call(0, true, ""),
                call(1, true, "{\"q\": "),
                call(0, false, "{\"city\": "),
                call(1, false, "\"news\"}"),
                call(0, false, "\"Paris\"}"),
                chunk(json!({"index": 0, "delta": {}, "logprobs": null,
                             "finish_reason": "tool_calls", "stop_reason": null})),
            ],
            true,
        );
        assert_eq!(
            assembled.output.tool_calls,
            vec![
                json!({"id": "chatcmpl-tool-0", "type": "function",
                       "function": {"name": "tool_0", "arguments": "{\"city\": \"Paris\"}"}}),
                json!({"id": "chatcmpl-tool-1", "type": "function",
                       "function": {"name": "tool_1", "arguments": "{\"q\": \"news\"}"}}),
            ]
        );
        assert_eq!(
            assembled.output.content, None,
            "an empty content delta is no content"
        );
        assert_eq!(assembled.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(assembled.ending, Ending::Complete);
    }

    #[test]
    fn reasoning_deltas_are_recorded_under_either_of_vllms_spellings() {
        let assembled = stream(
            &[
                delta(json!({"role": "assistant", "content": ""})),
                delta(json!({"reasoning_content": "The user wants "})),
                delta(json!({"reasoning": "the weather."})),
                // vLLM versions in between send both fields with the same text.
                delta(json!({"reasoning_content": " Call", "reasoning": " Call"})),
                delta(json!({"content": "Calling."})),
            ],
            true,
        );
        assert_eq!(
            assembled.output.reasoning_content.as_deref(),
            Some("The user wants the weather. Call")
        );
        assert_eq!(assembled.output.content.as_deref(), Some("Calling."));
    }

    #[test]
    fn a_stream_that_breaks_before_done_keeps_what_came_and_says_it_was_truncated() {
        let assembled = stream(
            &[
                delta(json!({"role": "assistant", "content": ""})),
                delta(json!({"content": "The weather"})),
            ],
            false,
        );
        assert_eq!(assembled.ending, Ending::Truncated);
        assert_eq!(assembled.output.content.as_deref(), Some("The weather"));
        assert_eq!(assembled.finish_reason, None);
    }

    #[test]
    fn an_error_event_mid_stream_is_an_error_even_after_done() {
        let mut assembler = Assembler::new(Endpoint::ChatCompletions);
        assembler.on_event(None, &delta(json!({"content": "The"})));
        assembler.on_event(
            None,
            &json!({"error": {"message": "engine died", "type": "InternalServerError",
                              "param": null, "code": 500}}),
        );
        assembler.on_done();
        assert_eq!(
            assembler.finish().ending,
            Ending::Error("engine died".to_owned())
        );
    }

    #[test]
    fn the_usage_chunk_with_no_choices_gives_the_usage() {
        let assembled = stream(
            &[
                delta(json!({"content": "Hi"})),
                json!({"id": "chatcmpl-9c1", "object": "chat.completion.chunk",
                       "created": 1764400000, "model": "Qwen/Qwen3-8B", "choices": [],
                       "usage": {"prompt_tokens": 12, "total_tokens": 14,
                                 "completion_tokens": 2}}),
            ],
            true,
        );
        assert_eq!(
            assembled.usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 2,
                total_tokens: 14
            })
        );
        assert_eq!(assembled.model.as_deref(), Some("Qwen/Qwen3-8B"));
    }

    #[test]
    fn token_ids_and_logprobs_of_every_chunk_are_concatenated_empty_deltas_included() {
        let entry = |token: &str, logprob: f64| {
            json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(),
                   "top_logprobs": []})
        };
        let mut first = delta(json!({"role": "assistant", "content": ""}));
        first["prompt_token_ids"] = json!([151644, 872, 198]);
        let assembled = stream(
            &[
                first,
                chunk(json!({"index": 0, "delta": {"content": "Hi"},
                             "logprobs": {"content": [entry("Hi", -0.25)]},
                             "finish_reason": null, "token_ids": [13048]})),
                // vLLM sends a chunk with an empty delta when a token produced no text yet.
                chunk(json!({"index": 0, "delta": {},
                             "logprobs": {"content": [entry("\u{fffd}", -1.5)]},
                             "finish_reason": null, "token_ids": [9468]})),
                chunk(json!({"index": 0, "delta": {"content": ""},
                             "logprobs": {"content": [entry("<|im_end|>", -0.0004)]},
                             "finish_reason": "stop", "stop_reason": null,
                             "token_ids": [151645]})),
            ],
            true,
        );
        let engine = assembled.engine.unwrap_or_default();
        assert_eq!(engine.prompt_token_ids, vec![151644, 872, 198]);
        assert_eq!(engine.completion_token_ids, vec![13048, 9468, 151645]);
        let logprobs: Vec<f64> = engine
            .completion_logprobs
            .iter()
            .map(|l| l.logprob)
            .collect();
        assert_eq!(logprobs, vec![-0.25, -1.5, -0.0004]);
        let first = engine.completion_logprobs.get(0).map(|e| e.to_entry());
        assert_eq!(first.and_then(|e| e.bytes), Some(b"Hi".to_vec()));
        assert_eq!(assembled.output.content.as_deref(), Some("Hi"));
    }

    #[test]
    fn logprobs_that_do_not_pair_up_with_the_ids_are_dropped_and_the_ids_kept() {
        let mut body = json!({"model": "m", "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                         "logprobs": {"content": [{"token": "Hi", "logprob": -0.1}]},
                         "finish_reason": "stop", "token_ids": [7, 151645]}]});
        let mut assembler = Assembler::new(Endpoint::ChatCompletions);
        assembler.on_body(&body);
        let engine = assembler.finish().engine.unwrap_or_default();
        assert_eq!(engine.completion_token_ids, vec![7, 151645]);
        assert!(engine.completion_logprobs.is_empty());

        body["prompt_token_ids"] = Value::Null;
        let mut assembler = Assembler::new(Endpoint::ChatCompletions);
        assembler.on_body(&body);
        assert_eq!(
            assembler.finish().engine,
            None,
            "no prompt ids, no engine tokens"
        );
    }

    #[test]
    fn a_streamed_sglang_call_keeps_its_logprobs_without_ids() {
        let assembled = stream(
            &[chunk(json!({"index": 0, "delta": {"content": "Hi"},
                           "logprobs": {"content": [{"token": "Hi", "bytes": [72, 105],
                                                      "logprob": -0.3, "top_logprobs": []}]},
                           "finish_reason": "stop", "matched_stop": 151645}))],
            true,
        );
        assert_eq!(assembled.engine, None);
        assert_eq!(assembled.logprobs_without_ids.len(), 1);
        let first = assembled.logprobs_without_ids.get(0).map(|e| e.token);
        assert_eq!(first, Some("Hi"));
    }

    #[test]
    fn completions_logprobs_arrays_become_one_entry_per_token() {
        let body = json!({"id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "Paris is",
                "logprobs": {"text_offset": [0, 5], "token_logprobs": [-0.5, -0.25],
                             "tokens": ["Paris", " is"],
                             "top_logprobs": [{"Paris": -0.5}, {" is": -0.25, " was": -2.0}]},
                "finish_reason": "length", "stop_reason": null, "token_ids": [12366, 374],
                "prompt_logprobs": null, "prompt_token_ids": [785, 6722]}],
            "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}});
        let mut assembler = Assembler::new(Endpoint::Completions);
        assembler.on_body(&body);
        let assembled = assembler.finish();
        assert_eq!(assembled.output.content.as_deref(), Some("Paris is"));
        assert_eq!(assembled.finish_reason.as_deref(), Some("length"));
        let engine = assembled.engine.unwrap_or_default();
        assert_eq!(engine.prompt_token_ids, vec![785, 6722]);
        let second = engine.completion_logprobs.get(1).map(|e| e.to_entry());
        let second = second.unwrap_or_default();
        assert_eq!(second.token, " is");
        assert_eq!(second.logprob, -0.25);
        let alternatives: Vec<&str> = second
            .top_logprobs
            .iter()
            .map(|t| t.token.as_str())
            .collect();
        assert_eq!(alternatives, vec![" is", " was"]);
    }

    #[test]
    fn other_choices_than_zero_are_not_recorded() {
        let assembled = stream(
            &[
                chunk(json!({"index": 1, "delta": {"content": "other"}})),
                chunk(json!({"index": 0, "delta": {"content": "mine"}})),
            ],
            true,
        );
        assert_eq!(assembled.output.content.as_deref(), Some("mine"));
    }

    #[test]
    fn a_responses_stream_broken_mid_function_call_keeps_the_items_so_far() {
        let mut assembler = Assembler::new(Endpoint::Responses);
        let events = [
            json!({"type": "response.created", "response": {"model": "m", "output": [],
                   "status": "in_progress"}}),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "reasoning", "summary": [],
                            "content": [{"type": "reasoning_text", "text": ""}]}}),
            json!({"type": "response.reasoning_text.delta", "output_index": 0,
                   "delta": "Need weather."}),
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                            "arguments": "", "status": "in_progress"}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1,
                   "delta": "{\"city\": "}),
        ];
        for event in &events {
            assembler.on_event(event["type"].as_str(), event);
        }
        let assembled = assembler.finish();
        assert_eq!(assembled.ending, Ending::Truncated);
        assert_eq!(
            assembled.output.reasoning_content.as_deref(),
            Some("Need weather.")
        );
        assert_eq!(
            assembled.output.tool_calls,
            vec![json!({"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": "}})]
        );
        assert_eq!(assembled.finish_reason, None);
        assert_eq!(assembled.model.as_deref(), Some("m"));
    }

    #[test]
    fn an_incomplete_response_finishes_for_length() {
        let mut assembler = Assembler::new(Endpoint::Responses);
        assembler.on_body(
            &json!({"object": "response", "status": "incomplete", "model": "m",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": "The weath"}]}],
            "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}),
        );
        let assembled = assembler.finish();
        assert_eq!(assembled.finish_reason.as_deref(), Some("length"));
        assert_eq!(assembled.output.content.as_deref(), Some("The weath"));
        assert_eq!(assembled.usage.map(|u| u.completion_tokens), Some(3));
        assert_eq!(assembled.ending, Ending::Complete);
    }

    #[test]
    fn an_error_body_is_recorded_as_the_engines_error() {
        let mut assembler = Assembler::new(Endpoint::ChatCompletions);
        assembler.on_body(&json!({"error": {"message": "max_tokens is too large",
            "type": "BadRequestError", "param": null, "code": 400}}));
        assert_eq!(
            assembler.finish().ending,
            Ending::Error("max_tokens is too large".to_owned())
        );
    }
}
