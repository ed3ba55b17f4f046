//! Chat and completions answers read from the members one scan of their bytes found
//! ([`Members`]): the fields the assembler keeps are deserialised from their text into their own
//! types — token ids as integers, logprobs into the schema's entries, a delta's text borrowed —
//! and everything else was skipped by the scan, so no JSON tree of the answer is built. Those
//! fields are most of an answer's bytes once the sidecar asked for ids and logprobs (a logprob
//! object per token), and building a tree of them was most of what recording cost. The same scan
//! tells the strip what to cut out for the agent ([`super::super::strip::strip_scanned`]).
//!
//! Whatever does not fit these shapes (an error object, a field of an unexpected type, a chat
//! logprob entry the schema cannot take) is refused, and the caller reads the answer as a tree
//! instead: what is recorded is the same either way.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use clawback_datapool::{CompletionLogprobs, Endpoint};

use super::{chat_usage, Assembler, Ending};
use crate::data_plane::capture::members::{ChoiceMembers, Members};

/// A member's value, parsed from its text; `null` or absent is `None`, a value of another shape
/// an error.
fn read<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> serde_json::Result<Option<T>> {
    match raw {
        Some(raw) => serde_json::from_str(raw.get()),
        None => Ok(None),
    }
}

/// A string, borrowed from the event's bytes where it has no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// What the assembler takes from a chat or completions body or chunk, all of it parsed before
/// any is kept (the logprobs last, straight onto the answer's, undone if they fail): an event it
/// cannot take whole is read as a tree instead.
struct Event<'a> {
    model: Option<Text<'a>>,
    usage: Option<Value>,
    prompt_token_ids: Option<Vec<u32>>,
    /// Choice 0 (by its `index`, else its place), when the event has one.
    choice: Option<Choice<'a>>,
}

struct Choice<'a> {
    prompt_token_ids: Option<Vec<u32>>,
    token_ids: Option<Vec<u32>>,
    /// Read last, by the endpoint's [`Logprobs`].
    logprobs: Option<&'a RawValue>,
    finish_reason: Option<Text<'a>>,
    /// `message` (a whole answer) or `delta` (a chunk).
    part: Option<Message<'a>>,
    /// A completions choice's text.
    text: Option<Text<'a>>,
}

/// A choice's `message` or `delta`: its text borrowed from the event's bytes where it has no
/// escapes, so a streamed token's delta is appended without a JSON object built for it.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
    tool_calls: Option<Vec<Value>>,
}

/// A choice's logprobs as its endpoint spells them, read onto the answer's: on an error nothing
/// is added (and the event is read as a tree instead).
trait Logprobs {
    fn read_onto(raw: &RawValue, assembler: &mut Assembler) -> serde_json::Result<()>;
}

/// Chat's `{"content": [entries]}`, each entry read onto the answer's columns
/// ([`CompletionLogprobs::append_from`]): no object per token, nor columns per chunk. An entry
/// the schema cannot take fails the whole event, which the tree reader then reads (and marks
/// the logprobs broken).
struct ChatLogprobs;

impl Logprobs for ChatLogprobs {
    fn read_onto(raw: &RawValue, assembler: &mut Assembler) -> serde_json::Result<()> {
        let before = assembler.logprobs.len();
        let mut json = serde_json::Deserializer::from_str(raw.get());
        let read = ContentOnto(&mut assembler.logprobs)
            .deserialize(&mut json)
            .and_then(|()| json.end());
        if read.is_err() {
            // The tree reader reads the event again: none of it may stay.
            assembler.logprobs.truncate(before);
        }
        read
    }
}

/// Completions' parallel `tokens` / `token_logprobs` arrays, read as a tree.
struct CompletionsLogprobs;

impl Logprobs for CompletionsLogprobs {
    fn read_onto(raw: &RawValue, assembler: &mut Assembler) -> serde_json::Result<()> {
        assembler.add_logprobs(&serde_json::from_str(raw.get())?);
        Ok(())
    }
}

/// A chat choice's `logprobs` (`null`, or an object with `content`), its entries appended.
struct ContentOnto<'c>(&'c mut CompletionLogprobs);

impl<'de> DeserializeSeed<'de> for ContentOnto<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ContentOnto<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("chat logprobs: null or {\"content\": [entries]}")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut content = false;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if key.0 == "content" && !content {
                content = true;
                map.next_value_seed(Appended(&mut *self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if !content {
            return Err(de::Error::missing_field("content"));
        }
        Ok(())
    }
}

/// An array of entries appended to the columns ([`CompletionLogprobs::append_from`]).
struct Appended<'c>(&'c mut CompletionLogprobs);

impl<'de> DeserializeSeed<'de> for Appended<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.0.append_from(deserializer)
    }
}

impl<'a> Event<'a> {
    /// `None` for an error answer (which the tree reader records) or a member of another shape
    /// than these readers take.
    fn read(members: &Members<'a>, whole: bool) -> Option<Self> {
        let is_error = members.error.is_some_and(|e| e.get().starts_with('{'))
            || read::<Text>(members.object)
                .ok()?
                .is_some_and(|o| o.0 == "error")
            || read::<Text>(members.kind)
                .ok()?
                .is_some_and(|k| k.0 == "error");
        if is_error {
            return None;
        }
        let choice = match members.choices.as_deref() {
            Some(choices) => Self::choice_zero(choices, whole)?,
            None => None,
        };
        Some(Event {
            model: read(members.model).ok()?,
            usage: read(members.usage).ok()?,
            prompt_token_ids: read(members.prompt_token_ids).ok()?,
            choice,
        })
    }

    /// The choice with `index` 0 (or, without an index, the first), parsed: `Some(None)` when
    /// there is none, `None` when the choices are not what these readers take.
    fn choice_zero(
        choices: &[Option<ChoiceMembers<'a>>],
        whole: bool,
    ) -> Option<Option<Choice<'a>>> {
        let mut zero = None;
        for (position, choice) in choices.iter().enumerate() {
            // An element that is no object is the tree reader's business.
            let choice = choice.as_ref()?;
            let index = read::<u64>(choice.index).ok()?.unwrap_or(position as u64);
            if index == 0 && zero.is_none() {
                zero = Some(choice);
            }
        }
        let Some(choice) = zero else {
            return Some(None);
        };
        Some(Some(Choice {
            prompt_token_ids: read(choice.prompt_token_ids).ok()?,
            token_ids: read(choice.token_ids).ok()?,
            logprobs: choice.logprobs,
            finish_reason: read(choice.finish_reason).ok()?,
            part: read(if whole { choice.message } else { choice.delta }).ok()?,
            text: read(choice.text).ok()?,
        }))
    }
}

impl Assembler {
    /// Whether this answer is read from its [`Members`] ([`Assembler::on_chat_members`]): a
    /// chat or completions answer.
    pub fn reads_members(&self) -> bool {
        matches!(
            self.endpoint,
            Endpoint::ChatCompletions | Endpoint::Completions
        )
    }

    /// A chat or completions body (`whole`) or streamed chunk, read from the members its scan
    /// found. `false` when it is not of that shape: the caller then reads it as a tree
    /// ([`Assembler::on_body`], [`Assembler::on_event`]), which also records errors.
    pub fn on_chat_members(&mut self, members: &Members<'_>, whole: bool) -> bool {
        match self.endpoint {
            Endpoint::Completions => self.typed::<CompletionsLogprobs>(members, whole),
            Endpoint::ChatCompletions => self.typed::<ChatLogprobs>(members, whole),
            Endpoint::Responses | Endpoint::Messages => false,
        }
    }

    fn typed<L: Logprobs>(&mut self, members: &Members<'_>, whole: bool) -> bool {
        let Some(event) = Event::read(members, whole) else {
            return false;
        };
        let logprobs = event.choice.as_ref().and_then(|c| c.logprobs);
        if let Some(raw) = logprobs {
            if L::read_onto(raw, self).is_err() {
                return false;
            }
        }
        if whole && members.choices.is_none() {
            // A body without an answer in it.
            return true;
        }
        self.typed_chunk(event);
        if whole {
            self.ending = Ending::Complete;
        }
        true
    }

    /// [`Assembler::chunk`] for a typed event.
    fn typed_chunk(&mut self, event: Event<'_>) {
        if let Some(Text(model)) = event.model.filter(|m| !m.0.is_empty()) {
            self.model.get_or_insert_with(|| model.into_owned());
        }
        if let Some(usage) = event.usage.as_ref().and_then(chat_usage) {
            self.usage = Some(usage);
        }
        if let Some(ids) = event.prompt_token_ids {
            self.prompt_ids.get_or_insert(ids);
        }
        let Some(choice) = event.choice else { return };
        if let Some(ids) = choice.prompt_token_ids {
            self.prompt_ids.get_or_insert(ids);
        }
        if let Some(ids) = choice.token_ids {
            self.completion_ids.get_or_insert_with(Vec::new).extend(ids);
        }
        if let Some(Text(reason)) = choice.finish_reason {
            self.finish_reason = Some(reason.into_owned());
        }
        let text = match self.endpoint {
            Endpoint::Completions => choice.text.map(|t| t.0),
            _ => {
                let Some(part) = choice.part else { return };
                // vLLM ≥0.11 names it `reasoning`, older versions and SGLang
                // `reasoning_content` (as the tree reader reads them).
                if let Some(reasoning) = part.reasoning_content.or(part.reasoning) {
                    self.reasoning.push_str(&reasoning);
                }
                if let Some(calls) = &part.tool_calls {
                    self.add_tool_calls(calls);
                }
                part.content
            }
        };
        if let Some(text) = text {
            self.content.push_str(&text);
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
            let members = Members::scan(&bytes);
            if members.is_some_and(|members| assembler.on_chat_members(&members, whole)) {
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
            // `top_logprobs: null` reads as no alternatives, as the tree reader reads it.
            (
                chat,
                vec![json!({"choices": [{"index": 0, "message": {"content": "x"},
                "logprobs": {"content": [{"token": "x", "logprob": -1.0, "top_logprobs": null}]},
                "token_ids": [3]}], "prompt_token_ids": [1]})],
                true,
                1,
            ),
            // An entry the schema cannot take (a null logprob): the event read as a tree.
            (
                chat,
                vec![json!({"choices": [{"index": 0, "message": {"content": "x"},
                "logprobs": {"content": [{"token": "x", "logprob": null}]},
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
