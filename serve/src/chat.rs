//! POST /v1/chat/completions: the conversation rendered with the model's chat template,
//! generated, and answered as one body or as vLLM's SSE chunks — a role chunk carrying
//! `prompt_token_ids`, one chunk per generated token with its `token_ids` and logprobs, the
//! finish reason on the last token's chunk, then usage when asked for.
//!
//! When the request offers tools, the reply is read for `<tool_call>` markup; a stream shows
//! the text before the first call as it comes and sends the parsed calls with the last chunk.

use std::sync::Arc;

use serde_json::{json, Value};

use clawback_model::chat_template::ChatInput;

use super::app::{unix_seconds, App};
use super::engine::SampledToken;
use super::error::ServeError;
use super::http::{json_response, sse_response, Reply, SseSender};
use super::protocol::{self, ChatRequest, Checked, StreamOptions};
use super::reply::{self, Chunk, Chunker, Finish, Generation};
use super::shapes;
use super::tool_calls::{self, ToolCall, ToolCalls};

pub async fn handle(app: Arc<App>, body: &[u8]) -> Reply {
    let request: ChatRequest = protocol::parse(body)?;
    let max_tokens = request
        .max_completion_tokens
        .or(request.sampling.max_tokens);
    let checked = request.sampling.check(max_tokens)?;
    let top_logprobs = request.top_logprobs()?;
    let messages = string_contents(&request.messages)?;
    let prompt_text = app.template.render(ChatInput {
        messages: &messages,
        tools: request.tools.as_deref(),
        add_generation_prompt: request.add_generation_prompt,
        extra: request.chat_template_kwargs.as_ref(),
    })?;
    let prompt = app.tokenizer.encode(&prompt_text, false)?;
    let generation = reply::start(
        &app,
        request.model.clone(),
        prompt,
        &checked,
        top_logprobs,
        "messages",
    )
    .await?;
    let call = Call {
        id: format!("chatcmpl-{}", app.random_id()),
        created: unix_seconds(),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| app.base_name.clone()),
        request,
        checked,
        app,
    };
    if call.request.stream {
        let (sse, response) = sse_response();
        tokio::spawn(call.stream(generation, sse));
        Ok(response)
    } else {
        let body = call.whole(generation).await?;
        Ok(json_response(http::StatusCode::OK, &body))
    }
}

/// One chat completion being answered.
struct Call {
    app: Arc<App>,
    request: ChatRequest,
    checked: Checked,
    id: String,
    created: u64,
    model: String,
}

impl Call {
    async fn whole(&self, mut generation: Generation) -> Result<Value, ServeError> {
        let mut text = reply::text_stream(&self.app, &self.checked);
        let (tokens, all, finish) = generation.collect(&mut text).await?;
        let parsed = if self.request.parses_tool_calls() {
            tool_calls::parse(&all)
        } else {
            None
        };
        let (content, calls, reason) = match parsed {
            Some(ToolCalls { content, calls }) => (content, self.with_ids(calls), "tool_calls"),
            None => (Some(all), Vec::new(), finish.reason),
        };
        let r = &self.request;
        Ok(json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": shapes::chat_message(content.as_deref(), &calls),
                "logprobs": shapes::chat_logprobs(&self.app.tokenizer, r.logprobs, &tokens),
                "finish_reason": reason,
                "stop_reason": finish.stop_reason,
                "token_ids": shapes::token_ids(r.return_token_ids, &tokens),
                "routed_experts": null
            }],
            "service_tier": null,
            "system_fingerprint": shapes::SYSTEM_FINGERPRINT,
            "usage": shapes::usage(generation.prompt.len(), tokens.len(), true),
            "prompt_logprobs": null,
            "prompt_token_ids": shapes::prompt_ids(r.return_token_ids, &generation.prompt),
            "prompt_text": null,
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "metrics": null
        }))
    }

    fn with_ids(&self, calls: Vec<ToolCall>) -> Vec<(String, ToolCall)> {
        calls
            .into_iter()
            .map(|c| (format!("chatcmpl-tool-{}", self.app.random_id()), c))
            .collect()
    }

    fn chunk(&self, choice: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.model, "choices": [choice]})
    }

    /// The chunk of one or more tokens whose visible text is `delta`.
    fn token_chunk(&self, delta: Value, tokens: &[SampledToken], finish: Option<&Finish>) -> Value {
        let r = &self.request;
        let mut choice = json!({
            "index": 0, "delta": delta,
            "logprobs": shapes::chat_logprobs(&self.app.tokenizer, r.logprobs, tokens),
            "finish_reason": finish.map(|f| f.reason),
        });
        if let Some(finish) = finish {
            choice["stop_reason"] = finish.stop_reason.clone();
        }
        choice["token_ids"] = shapes::token_ids(r.return_token_ids, tokens);
        self.chunk(choice)
    }

    /// Produces the SSE stream; ends early, dropping the generation (which stops the
    /// worker's sequence), when the client goes away.
    async fn stream(self, mut generation: Generation, sse: SseSender) {
        let mut first = self.chunk(json!({
            "index": 0, "delta": {"role": "assistant", "content": ""},
            "logprobs": null, "finish_reason": null
        }));
        first["prompt_token_ids"] =
            shapes::prompt_ids(self.request.return_token_ids, &generation.prompt);
        first["prompt_text"] = Value::Null;
        if !sse.data(&first).await {
            return;
        }
        match self.stream_tokens(&mut generation, &sse).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                let _ = sse.data(&error.body()).await;
            }
        }
        sse.done().await;
    }

    /// Sends the token chunks; Ok(false) when the client went away.
    async fn stream_tokens(
        &self,
        generation: &mut Generation,
        sse: &SseSender,
    ) -> Result<bool, ServeError> {
        let mut text = reply::text_stream(&self.app, &self.checked);
        let mut visible = Visible::new(self.request.parses_tool_calls());
        let mut chunker = Chunker::default();
        let mut count = 0;
        // vLLM sends a token whose text it holds back (half a UTF-8 character, a special token)
        // as an empty delta only when the chunk carries its ids or logprobs.
        let extras = self.request.logprobs || self.request.return_token_ids;
        while let Some(mut update) = generation.next(&mut text).await? {
            count += usize::from(update.token.is_some());
            update.text = visible.push(&update.text);
            let chunk = match chunker.take(update) {
                None => continue,
                Some(Chunk::Token(token, shown)) if shown.is_empty() => {
                    if !extras {
                        continue;
                    }
                    self.token_chunk(json!({}), &[token], None)
                }
                Some(Chunk::Token(token, shown)) => {
                    self.token_chunk(json!({ "content": shown }), &[token], None)
                }
                Some(Chunk::Last(tokens, mut content, finish)) => {
                    let (rest, calls) = visible.finish();
                    content.push_str(&rest);
                    let (delta, finish) = match calls {
                        Some(parsed) => {
                            let mut delta = json!({});
                            if !content.is_empty() {
                                delta["content"] = json!(content);
                            }
                            let calls = self.with_ids(parsed.calls);
                            delta["tool_calls"] = shapes::tool_calls(&calls, true);
                            let finish = Finish {
                                reason: "tool_calls",
                                ..finish
                            };
                            (delta, finish)
                        }
                        // EOS has no text: the finishing chunk's delta is then empty.
                        None if content.is_empty() => (json!({}), finish),
                        None => (json!({ "content": content }), finish),
                    };
                    let mut last = self.token_chunk(delta, &tokens, Some(&finish));
                    last["system_fingerprint"] = json!(shapes::SYSTEM_FINGERPRINT);
                    if !sse.data(&last).await {
                        return Ok(false);
                    }
                    if !StreamOptions::wants_usage(&self.request.stream_options) {
                        return Ok(true);
                    }
                    let usage = shapes::usage_chunk(
                        &self.id,
                        "chat.completion.chunk",
                        self.created,
                        &self.model,
                        generation.prompt.len(),
                        count,
                    );
                    return Ok(sse.data(&usage).await);
                }
            };
            if !sse.data(&chunk).await {
                return Ok(false);
            }
        }
        Err(ServeError::WorkerGone)
    }
}

/// The messages with content given as text parts joined into one string (with "\n"), as
/// vLLM hands them to templates that print `message.content` (Qwen's and Llama's do).
/// Parts other than text (images, audio) are refused: the served models read text only.
fn string_contents(messages: &[Value]) -> Result<Vec<Value>, ServeError> {
    messages
        .iter()
        .map(|message| {
            let Some(parts) = message.get("content").and_then(Value::as_array) else {
                return Ok(message.clone());
            };
            let texts = parts
                .iter()
                .map(
                    |part| match (part["type"].as_str(), part["text"].as_str()) {
                        (Some("text"), Some(text)) => Ok(text),
                        _ => Err(ServeError::BadRequest(format!(
                            "only text content parts are supported, got {}",
                            part["type"]
                        ))),
                    },
                )
                .collect::<Result<Vec<&str>, _>>()?;
            let mut flat = message.clone();
            flat["content"] = json!(texts.join("\n"));
            Ok(flat)
        })
        .collect()
}

/// The content a stream may show so far: all of it, or, when tools are offered, what comes
/// before the first `<tool_call>` (and not what might be the beginning of one).
struct Visible {
    tools: bool,
    all: String,
    shown: usize,
}

impl Visible {
    fn new(tools: bool) -> Self {
        Visible {
            tools,
            all: String::new(),
            shown: 0,
        }
    }

    fn push(&mut self, piece: &str) -> String {
        self.all.push_str(piece);
        let end = if !self.tools {
            self.all.len()
        } else {
            match self.all.find(tool_calls::START) {
                Some(at) => at,
                None => self.all.len() - tool_calls::partial_start_len(&self.all),
            }
        };
        self.take_until(end)
    }

    /// The rest of the content and the tool calls, once the reply is over.
    fn finish(&mut self) -> (String, Option<ToolCalls>) {
        let parsed = if self.tools {
            tool_calls::parse(&self.all)
        } else {
            None
        };
        let end = match (&parsed, self.all.find(tool_calls::START)) {
            (Some(_), Some(at)) => at,
            _ => self.all.len(),
        };
        (self.take_until(end), parsed)
    }

    fn take_until(&mut self, end: usize) -> String {
        let end = end.max(self.shown);
        let out = self.all[self.shown..end].to_owned();
        self.shown = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{string_contents, Visible};

    #[test]
    fn text_parts_become_one_string_and_other_parts_are_refused() {
        let messages = [
            json!({"role": "system", "content": "plain"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}),
        ];
        let flat = string_contents(&messages).unwrap();
        assert_eq!(flat[0], messages[0]);
        assert_eq!(flat[1], json!({"role": "user", "content": "a\nb"}));
        let image = [json!({"role": "user", "content": [{"type": "image_url",
                                                        "image_url": {"url": "x"}}]})];
        let error = string_contents(&image).unwrap_err();
        assert!(error.to_string().contains("image_url"), "{error}");
    }

    #[test]
    fn a_stream_shows_the_text_before_a_tool_call_and_hands_over_the_call_at_the_end() {
        let mut visible = Visible::new(true);
        let pieces = [
            "Checking",
            " <",
            "tool",
            "_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        ];
        let shown: Vec<String> = pieces.iter().map(|p| visible.push(p)).collect();
        assert_eq!(shown, ["Checking", " ", "", "", ""]);
        let (rest, calls) = visible.finish();
        assert_eq!(rest, "");
        let calls = calls.unwrap();
        assert_eq!(calls.content.as_deref(), Some("Checking "));
        assert_eq!(calls.calls[0].name, "get_weather");
        assert_eq!(calls.calls[0].arguments, r#"{"city": "Oslo"}"#);
    }

    #[test]
    fn what_only_looked_like_a_tag_is_shown_at_the_end_and_without_tools_nothing_waits() {
        let mut visible = Visible::new(true);
        assert_eq!(visible.push("a <"), "a ");
        assert_eq!(visible.push("tool"), "");
        assert_eq!(visible.finish(), ("<tool".to_owned(), None));

        let mut plain = Visible::new(false);
        assert_eq!(plain.push("<tool_call>{}"), "<tool_call>{}");
        assert_eq!(plain.finish(), (String::new(), None));
    }
}
