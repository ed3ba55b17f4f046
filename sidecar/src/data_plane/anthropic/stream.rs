//! A chat-completions stream as the Messages stream an Anthropic SDK expects, chunk by chunk as
//! the engine sends them — never gathered and replayed.
//!
//! The lifecycle: `message_start` (with the prompt's token count) and a `ping` on the first
//! chunk; then for each run of thinking, text or one tool call a `content_block_start`, its
//! `content_block_delta`s (`thinking_delta`, `text_delta`, `input_json_delta`) and a
//! `content_block_stop`; at the end of the engine's stream `message_delta` (`stop_reason`,
//! `stop_sequence`, usage) and `message_stop`.

use bytes::{BufMut, BytesMut};
use serde_json::{json, Value};

use super::response::{message_id, stop_reason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// A tool call: the chat delta's `index` for it.
    Tool(u64),
}

/// Follows one stream; [`on_chunk`](Self::on_chunk) and [`on_done`](Self::on_done) append the
/// events to send.
#[derive(Debug, Default)]
pub struct StreamTranslator {
    started: bool,
    /// The open block and its index in the message's content.
    open: Option<(usize, Block)>,
    next_index: usize,
    input_tokens: u64,
    output_tokens: u64,
    finish_reason: Option<String>,
    matched_stop: Value,
    ended: bool,
    /// The open tool call's arguments.
    arguments: Arguments,
}

/// A tool call's arguments as they stream. They are held until their first character says
/// what they are: an object is then streamed as it comes; anything else is sent whole at the
/// block's end, as `{"arguments": "<as written>"}` (what a whole message says,
/// [`super::response::tool_input`]), since an SDK parses every `partial_json` as the beginning
/// of an object.
#[derive(Debug)]
enum Arguments {
    Held(String),
    Streaming,
}

impl Default for Arguments {
    fn default() -> Self {
        Self::Held(String::new())
    }
}

fn event(out: &mut BytesMut, data: &Value) {
    let name = data["type"].as_str().unwrap_or("message");
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    out.put_slice(data.to_string().as_bytes());
    out.put_slice(b"\n\n");
}

/// The `error` event Anthropic's API sends when a stream fails after it started.
pub fn error_event(message: &str) -> String {
    let data = json!({"type": "error", "error": {"type": "api_error", "message": message}});
    format!("event: error\ndata: {data}\n\n")
}

impl StreamTranslator {
    pub fn new() -> Self {
        Self::default()
    }

    /// One chat chunk of the engine's stream.
    pub fn on_chunk(&mut self, chunk: &Value, out: &mut BytesMut) {
        if self.ended {
            return;
        }
        // vLLM reports a failure mid-generation as a chunk of its own.
        if let Some(error) = chunk.get("error").filter(|e| e.is_object()) {
            let message = error["message"]
                .as_str()
                .unwrap_or("the engine failed mid-stream");
            out.put_slice(error_event(message).as_bytes());
            self.ended = true;
            return;
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.input_tokens = usage["prompt_tokens"].as_u64().unwrap_or(self.input_tokens);
            self.output_tokens = usage["completion_tokens"]
                .as_u64()
                .unwrap_or(self.output_tokens);
        }
        if !self.started {
            self.start(chunk, out);
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return;
        };
        let delta = &choice["delta"];
        let reasoning = delta["reasoning"]
            .as_str()
            .or_else(|| delta["reasoning_content"].as_str())
            .unwrap_or_default();
        if !reasoning.is_empty() {
            let index = self.open_block(
                Block::Thinking,
                out,
                || json!({"type": "thinking", "thinking": "", "signature": ""}),
            );
            event(
                out,
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "thinking_delta", "thinking": reasoning}}),
            );
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let index = self.open_block(Block::Text, out, || json!({"type": "text", "text": ""}));
            event(
                out,
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": text}}),
            );
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.on_tool_call(call, out);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
            self.matched_stop = choice["stop_reason"].clone();
        }
    }

    /// The engine's `[DONE]`: the open block closes and the message ends.
    pub fn on_done(&mut self, out: &mut BytesMut) {
        if self.ended || !self.started {
            return;
        }
        self.close_block(out);
        let (stop_reason, stop_sequence) = stop_reason(
            Some(self.finish_reason.as_deref().unwrap_or("stop")),
            &self.matched_stop,
        );
        event(
            out,
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"input_tokens": self.input_tokens,
                              "output_tokens": self.output_tokens}}),
        );
        event(out, &json!({"type": "message_stop"}));
        self.ended = true;
    }

    fn start(&mut self, chunk: &Value, out: &mut BytesMut) {
        // With the token ids the sidecar asks vLLM for, the first chunk has the prompt's.
        if let Some(ids) = chunk["prompt_token_ids"].as_array() {
            self.input_tokens = ids.len() as u64;
        }
        event(
            out,
            &json!({"type": "message_start", "message": {
                "id": message_id(chunk["id"].as_str().unwrap_or_default()),
                "type": "message", "role": "assistant", "model": chunk["model"],
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}),
        );
        event(out, &json!({"type": "ping"}));
        self.started = true;
    }

    fn on_tool_call(&mut self, call: &Value, out: &mut BytesMut) {
        let chat_index = call["index"].as_u64().unwrap_or(0);
        let function = &call["function"];
        let is_new = match self.open {
            Some((_, Block::Tool(open))) => open != chat_index,
            _ => true,
        };
        if is_new {
            self.close_block(out);
            let index = self.next_index;
            event(
                out,
                &json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use",
                                          "id": call["id"].as_str().unwrap_or_default(),
                                          "name": function["name"].as_str().unwrap_or_default(),
                                          "input": {}}}),
            );
            self.open = Some((index, Block::Tool(chat_index)));
            self.next_index += 1;
        }
        let Some(arguments) = function["arguments"].as_str().filter(|a| !a.is_empty()) else {
            return;
        };
        let Arguments::Held(held) = &mut self.arguments else {
            self.arguments_delta(arguments, out);
            return;
        };
        held.push_str(arguments);
        if held.trim_start().starts_with('{') {
            let held = std::mem::take(held);
            self.arguments = Arguments::Streaming;
            self.arguments_delta(&held, out);
        }
    }

    fn arguments_delta(&self, partial: &str, out: &mut BytesMut) {
        if let Some((index, _)) = self.open {
            event(
                out,
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": partial}}),
            );
        }
    }

    /// The index of the open block of `kind`, opening one (and closing another) if needed.
    fn open_block(
        &mut self,
        kind: Block,
        out: &mut BytesMut,
        content_block: impl FnOnce() -> Value,
    ) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close_block(out);
        let index = self.next_index;
        event(
            out,
            &json!({"type": "content_block_start", "index": index,
                    "content_block": content_block()}),
        );
        self.open = Some((index, kind));
        self.next_index += 1;
        index
    }

    fn close_block(&mut self, out: &mut BytesMut) {
        if let Arguments::Held(held) = std::mem::take(&mut self.arguments) {
            if !held.trim().is_empty() {
                let input = super::response::tool_input(&held).to_string();
                self.arguments_delta(&input, out);
            }
        }
        if let Some((index, _)) = self.open.take() {
            event(out, &json!({"type": "content_block_stop", "index": index}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(out: &BytesMut) -> Vec<(String, Value)> {
        String::from_utf8_lossy(out)
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_owned();
                let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (name, data)
            })
            .collect()
    }

    #[test]
    fn a_streamed_tool_call_goes_through_the_whole_lifecycle() {
        // vLLM 0.32 with the hermes parser, asked for ids, logprobs and usage.
        let chunks = [
            json!({"id": "chatcmpl-9", "model": "qwen", "prompt_token_ids": [1, 2, 3],
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "chatcmpl-9", "model": "qwen",
                   "choices": [{"index": 0, "delta": {"content": "Checking"}}]}),
            json!({"id": "chatcmpl-9", "model": "qwen", "choices": [{"index": 0, "delta": {
                "tool_calls": [{"index": 0, "id": "chatcmpl-tool-1", "type": "function",
                                "function": {"name": "read", "arguments": ""}}]}}]}),
            json!({"id": "chatcmpl-9", "model": "qwen", "choices": [{"index": 0, "delta": {
                "tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": "}}]}}]}),
            json!({"id": "chatcmpl-9", "model": "qwen", "choices": [{"index": 0, "delta": {
                "tool_calls": [{"index": 0, "function": {"arguments": "\"a\"}"}}]},
                "finish_reason": "tool_calls", "stop_reason": null}]}),
            json!({"id": "chatcmpl-9", "model": "qwen", "choices": [],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}),
        ];
        let mut translator = StreamTranslator::new();
        let mut out = BytesMut::new();
        for chunk in &chunks {
            translator.on_chunk(chunk, &mut out);
        }
        translator.on_done(&mut out);
        let got = events(&out);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[0].1["message"]["id"], "msg_9");
        assert_eq!(got[0].1["message"]["usage"]["input_tokens"], 3);
        assert_eq!(got[5].1["content_block"]["name"], "read");
        assert_eq!(got[5].1["index"], 1);
        let json: String = got[6..8]
            .iter()
            .map(|(_, e)| e["delta"]["partial_json"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(json, "{\"path\": \"a\"}");
        assert_eq!(got[9].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(got[9].1["usage"]["output_tokens"], 9);
    }

    #[test]
    fn arguments_that_are_no_object_are_sent_whole_at_the_blocks_end() {
        // The tiny random model under `tool_choice: required` writes `94` for its arguments.
        let mut translator = StreamTranslator::new();
        let mut out = BytesMut::new();
        for arguments in ["", "9", "4"] {
            translator.on_chunk(
                &json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {
                    "tool_calls": [{"index": 0, "id": if arguments.is_empty() { json!("t1") } else { Value::Null },
                                    "function": {"name": "f", "arguments": arguments}}]}}]}),
                &mut out,
            );
        }
        translator.on_done(&mut out);
        let partial: Vec<String> = events(&out)
            .iter()
            .filter_map(|(_, e)| e["delta"]["partial_json"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(partial, vec![r#"{"arguments":"94"}"#.to_owned()]);
    }

    #[test]
    fn nothing_is_sent_after_the_end_and_a_stream_without_chunks_sends_nothing() {
        let mut translator = StreamTranslator::new();
        let mut out = BytesMut::new();
        translator.on_done(&mut out);
        assert!(out.is_empty());
        translator.on_chunk(
            &json!({"id": "c", "model": "m", "choices": [{"index": 0,
            "delta": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}]}),
            &mut out,
        );
        translator.on_done(&mut out);
        let got = events(&out);
        assert_eq!(got.last().unwrap().0, "message_stop");
        assert_eq!(got[got.len() - 2].1["delta"]["stop_sequence"], "END");
        let before = out.len();
        translator.on_chunk(
            &json!({"choices": [{"delta": {"content": "late"}}]}),
            &mut out,
        );
        translator.on_done(&mut out);
        assert_eq!(out.len(), before);
    }
}
