//! Chat and completions answers read straight from their bytes: the fields the assembler keeps
//! are deserialised into their own types — token ids as integers, logprobs into the schema's
//! entries — and everything else is skipped, so no JSON tree of the answer is built. Those
//! fields are most of an answer's bytes once the sidecar asked for ids and logprobs (a logprob
//! object per token), and building a tree of them was most of what recording cost.
//!
//! Whatever does not fit these shapes (an error object, a field of an unexpected type, a chat
//! logprob entry the schema cannot take) is refused, and the caller reads the answer as a tree
//! instead: what is recorded is the same either way.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use clawback_datapool::{Endpoint, TokenLogprob};

use super::{chat_usage, push_str, set_once, Assembler, Ending};

/// A chat or completions body or chunk, as far as the assembler reads it; `L` is how its
/// endpoint spells a choice's logprobs.
#[derive(Deserialize)]
#[serde(bound(deserialize = "L: Deserialize<'de>"))]
struct Event<'a, L> {
    model: Option<Value>,
    usage: Option<Value>,
    prompt_token_ids: Option<Vec<u32>>,
    choices: Option<Vec<Choice<L>>>,
    // What makes it an error answer, which the tree reader handles.
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    object: Option<Cow<'a, str>>,
    #[serde(rename = "type")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "L: Deserialize<'de>"))]
struct Choice<L> {
    index: Option<u64>,
    prompt_token_ids: Option<Vec<u32>>,
    token_ids: Option<Vec<u32>>,
    logprobs: Option<L>,
    finish_reason: Option<Value>,
    message: Option<Value>,
    delta: Option<Value>,
    text: Option<Value>,
}

/// Chat logprobs, read straight into the schema's entries: an entry the schema cannot take
/// fails the whole event, which the tree reader then reads (and marks the logprobs broken).
#[derive(Deserialize)]
struct ChatLogprobs {
    content: Vec<TokenLogprob>,
}

/// A choice's logprobs as its endpoint spells them, added to the answer.
trait Logprobs: for<'de> Deserialize<'de> {
    fn add_to(self, assembler: &mut Assembler);
}

impl Logprobs for ChatLogprobs {
    fn add_to(self, assembler: &mut Assembler) {
        assembler.logprobs.extend(self.content);
    }
}

/// Completions' parallel `tokens` / `token_logprobs` arrays, read as a tree.
impl Logprobs for Value {
    fn add_to(self, assembler: &mut Assembler) {
        assembler.add_logprobs(&self);
    }
}

impl<L> Event<'_, L> {
    fn is_error(&self) -> bool {
        self.error.is_some_and(|e| e.get().starts_with('{'))
            || self.object.as_deref() == Some("error")
            || self.kind.as_deref() == Some("error")
    }
}

impl Assembler {
    /// A chat or completions body (`whole`) or streamed chunk, read from its bytes. `false` when
    /// it is not of that shape: the caller then reads it as a tree ([`Assembler::on_body`],
    /// [`Assembler::on_event`]), which also records errors.
    pub fn on_chat_bytes(&mut self, bytes: &[u8], whole: bool) -> bool {
        if !matches!(
            self.endpoint,
            Endpoint::ChatCompletions | Endpoint::Completions
        ) {
            return false;
        }
        match self.endpoint {
            Endpoint::Completions => self.typed_bytes::<Value>(bytes, whole),
            _ => self.typed_bytes::<ChatLogprobs>(bytes, whole),
        }
    }

    fn typed_bytes<L: Logprobs>(&mut self, bytes: &[u8], whole: bool) -> bool {
        let Ok(event) = serde_json::from_slice::<Event<'_, L>>(bytes) else {
            return false;
        };
        if event.is_error() {
            return false;
        }
        if whole && event.choices.is_none() {
            return true;
        }
        self.typed_chunk(event, whole);
        if whole {
            self.ending = Ending::Complete;
        }
        true
    }

    /// [`Assembler::chunk`] for a typed event.
    fn typed_chunk<L: Logprobs>(&mut self, event: Event<'_, L>, whole: bool) {
        if let Some(model) = &event.model {
            set_once(&mut self.model, model);
        }
        if let Some(usage) = event.usage.as_ref().and_then(chat_usage) {
            self.usage = Some(usage);
        }
        if let Some(ids) = event.prompt_token_ids {
            self.prompt_ids.get_or_insert(ids);
        }
        let Some(choice) = event
            .choices
            .into_iter()
            .flatten()
            .enumerate()
            .find(|(position, c)| c.index.unwrap_or(*position as u64) == 0)
            .map(|(_, c)| c)
        else {
            return;
        };
        if let Some(ids) = choice.prompt_token_ids {
            self.prompt_ids.get_or_insert(ids);
        }
        if let Some(ids) = choice.token_ids {
            self.completion_ids.get_or_insert_with(Vec::new).extend(ids);
        }
        if let Some(logprobs) = choice.logprobs {
            logprobs.add_to(self);
        }
        if let Some(reason) = choice.finish_reason.as_ref().and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        match self.endpoint {
            Endpoint::Completions => {
                push_str(
                    &mut self.content,
                    choice.text.as_ref().unwrap_or(&Value::Null),
                );
            }
            _ => {
                let part = if whole { choice.message } else { choice.delta };
                self.message(part.as_ref().unwrap_or(&Value::Null));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::data_plane::capture::Assembled;

    /// What the tree reader makes of `events` (a body when `whole`).
    fn as_tree(endpoint: Endpoint, events: &[Value], whole: bool) -> Assembled {
        let mut assembler = Assembler::new(endpoint);
        for event in events {
            if whole {
                assembler.on_body(event);
            } else {
                assembler.on_event(None, event);
            }
        }
        if !whole {
            assembler.on_done();
        }
        assembler.finish()
    }

    /// What the typed reader makes of them, with the tree reader behind it as in the capture.
    fn as_bytes(endpoint: Endpoint, events: &[Value], whole: bool) -> (Assembled, usize) {
        let mut assembler = Assembler::new(endpoint);
        let mut typed = 0;
        for event in events {
            let bytes = serde_json::to_vec(event).unwrap_or_default();
            if assembler.on_chat_bytes(&bytes, whole) {
                typed += 1;
            } else if whole {
                assembler.on_body(event);
            } else {
                assembler.on_event(None, event);
            }
        }
        if !whole {
            assembler.on_done();
        }
        (assembler.finish(), typed)
    }

    fn entry(token: &str, logprob: f64) -> Value {
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(),
               "top_logprobs": [{"token": token, "logprob": logprob, "bytes": null}]})
    }

    #[test]
    fn bytes_and_tree_record_the_same_answer() {
        let chat = Endpoint::ChatCompletions;
        let cases: Vec<(Endpoint, Vec<Value>, bool, usize)> = vec![
            // A vLLM chat body with ids and logprobs.
            (
                chat,
                vec![
                    json!({"id": "c", "model": "m", "prompt_token_ids": [1, 2, 3],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there",
                    "reasoning_content": "think", "tool_calls": []},
                    "logprobs": {"content": [entry("Hi", -0.5), entry(" there", -0.25)]},
                    "finish_reason": "stop", "token_ids": [7, 8]}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
                ],
                true,
                1,
            ),
            // A stream: role chunk, tool-call deltas, a held-back chunk, the finish.
            (
                chat,
                vec![
                    json!({"model": "m", "prompt_token_ids": [1],
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": null, "finish_reason": null}]}),
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t1",
                        "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]},
                        "logprobs": {"content": [entry("{", -1.0)]}, "token_ids": [5]}]}),
                    json!({"choices": [{"index": 0, "delta": {},
                        "logprobs": {"content": [entry("", -2.0)]}, "token_ids": [6]}]}),
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                        "function": {"arguments": ":1}"}}]},
                        "logprobs": {"content": [entry(":1}", -0.1)]}, "token_ids": [9],
                        "finish_reason": "tool_calls"}]}),
                    json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}),
                ],
                false,
                5,
            ),
            // Completions with parallel logprob arrays (read as a tree inside).
            (
                Endpoint::Completions,
                vec![json!({"model": "m", "choices": [{"index": 0,
                "text": "ab", "prompt_token_ids": [4], "token_ids": [1, 2],
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
                             "top_logprobs": [{"a": -0.1}, null]}, "finish_reason": "length"}]})],
                true,
                1,
            ),
            // An entry the schema cannot take (top_logprobs null): the event read as a tree.
            (
                chat,
                vec![json!({"choices": [{"index": 0, "message": {"content": "x"},
                "logprobs": {"content": [{"token": "x", "logprob": -1.0, "top_logprobs": null}]},
                "token_ids": [3]}], "prompt_token_ids": [1]})],
                true,
                0,
            ),
            // Choice 0 second in the list; an id past u32 (the tree reader's business).
            (
                chat,
                vec![
                    json!({"choices": [{"index": 1, "message": {"content": "no"}},
                {"index": 0, "message": {"content": "yes"}, "token_ids": [4_294_967_296_u64]}]}),
                ],
                true,
                0,
            ),
            // Errors: an object, `object: error`, and a body without choices.
            (chat, vec![json!({"error": {"message": "boom"}})], true, 0),
            (
                chat,
                vec![json!({"object": "error", "message": "bad"})],
                false,
                0,
            ),
            (chat, vec![json!({"id": "x"})], true, 1),
        ];
        for (endpoint, events, whole, want_typed) in cases {
            let (typed, read_typed) = as_bytes(endpoint, &events, whole);
            assert_eq!(typed, as_tree(endpoint, &events, whole), "{events:?}");
            assert_eq!(read_typed, want_typed, "{events:?}");
        }
    }
}
