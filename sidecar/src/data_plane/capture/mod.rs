//! Token capture: ask the engine for the token ids and logprobs it sampled, hand the agent the
//! response it would have had without that, and put a copy of the answer together for the
//! recorder.
//!
//! One call goes through it in three steps:
//! 1. [`Capture::for_request`] rewrites the parsed request body ([`request`]) before it is
//!    forwarded;
//! 2. when the upstream's response head is in, [`Capture::response`] starts a [`ResponseCapture`],
//!    and the relay passes it every body frame ([`ResponseCapture::on_frame`]) and forwards what
//!    it says ([`Forward`]). Streams are cut into events ([`sse`]); each event is scanned once
//!    ([`members`]) for the [`assemble::Assembler`], which parses what it keeps, and for the
//!    strip ([`strip`]), which cuts injected fields out of its bytes when it held any. A plain body is held to its end and stripped whole, or,
//!    past the step cap, stripped as it streams past ([`strip_stream`]). When nothing was
//!    injected every frame goes through as it came;
//! 3. at the end of the body, [`ResponseCapture::finish`] gives the bytes still to send and the
//!    [`Assembled`] answer.
//!
//! ```text
//! let capture = Capture::for_request(kind, endpoint, &mut body_json);   // then serialise, send
//! let mut tap = capture.response(is_sse);
//! if tap.rewrites_response() { response_headers.remove(CONTENT_LENGTH) }
//! for frame in upstream_body { if let Some(b) = tap.on_frame(&frame).bytes(frame) { send(b) } }
//! let Finished { tail, assembled } = tap.finish();                     // also after a break
//! if let Some(tail) = tail { send(tail) }
//! ```
//!
//! [`Endpoint`] here is the schema's (what a step records), not the router's.

pub mod assemble;
pub mod members;
pub mod request;
pub mod sse;
pub mod strip;
pub mod strip_stream;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

// Re-exported: it is part of this module's signatures.
pub use clawback_datapool::Endpoint;

use crate::data_plane::upstream::UpstreamKind;

pub use assemble::{Assembled, Assembler, Ending};
use members::Members;
pub use request::{Injected, Unasked};
pub use sse::{SseEvent, SseSplitter};
use strip::Stripped;

/// Most of an engine's error body kept for its translation.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// The capture of one call, between rewriting its request and seeing its response.
#[derive(Debug, Clone, Copy)]
pub struct Capture {
    endpoint: Endpoint,
    injected: Injected,
    answer: Answer,
}

/// What the agent gets of the engine's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Answer {
    /// The answer as the engine sent it, less what the sidecar asked for.
    #[default]
    AsSent,
    /// A chat answer translated to Anthropic's Messages API ([`crate::data_plane::anthropic`]).
    Messages,
    /// The engine's error answer to a translated Messages call, in Anthropic's error shape.
    MessagesError(http::StatusCode),
    /// A Messages answer from an upstream that speaks Messages itself, as it came.
    MessagesAsSent,
}

impl Answer {
    /// The API the agent speaks.
    pub fn dialect(self) -> crate::data_plane::route::Dialect {
        match self {
            Self::AsSent => crate::data_plane::route::Dialect::OpenAi,
            Self::Messages | Self::MessagesError(_) | Self::MessagesAsSent => {
                crate::data_plane::route::Dialect::Anthropic
            }
        }
    }
}

/// How an answer is translated on its way to the agent.
#[derive(Debug)]
enum Translation {
    Messages(crate::data_plane::anthropic::stream::StreamTranslator),
    Error(http::StatusCode),
}

impl Capture {
    /// Rewrites `body` to ask `kind`'s engine for token ids and logprobs on `endpoint`.
    pub fn for_request(kind: UpstreamKind, endpoint: Endpoint, body: &mut Value) -> Self {
        let injected = request::inject(kind, endpoint, body);
        Capture {
            endpoint,
            injected,
            answer: Answer::AsSent,
        }
    }

    /// A capture that asked the engine for nothing (a call that is translated, not recorded).
    pub fn untouched(endpoint: Endpoint) -> Self {
        Capture {
            endpoint,
            injected: Injected::default(),
            answer: Answer::AsSent,
        }
    }

    /// The agent gets the answer as `answer`.
    pub fn answering(mut self, answer: Answer) -> Self {
        self.answer = answer;
        self
    }

    /// What was added to the request, to be stripped from the response.
    pub fn injected(&self) -> Injected {
        self.injected
    }

    /// Starts reading the response; `is_sse` from its `Content-Type` (`text/event-stream`),
    /// since an error answer to a streamed request comes back as a plain JSON body.
    pub fn response(self, is_sse: bool) -> ResponseCapture {
        let mode = if is_sse {
            Mode::Sse(SseSplitter::new())
        } else {
            Mode::Body(BytesMut::new())
        };
        let translation = match self.answer {
            Answer::AsSent | Answer::MessagesAsSent => None,
            Answer::Messages => Some(Translation::Messages(
                crate::data_plane::anthropic::stream::StreamTranslator::new(),
            )),
            Answer::MessagesError(status) => Some(Translation::Error(status)),
        };
        ResponseCapture {
            injected: self.injected,
            assembler: Assembler::new(self.endpoint),
            mode,
            translation,
            limit: usize::MAX,
            seen: 0,
        }
    }
}

/// What the relay sends the agent for one upstream frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// The frame as it came.
    Original,
    /// These bytes instead: whole events, some with injected fields taken out.
    Rewritten(Bytes),
    /// Nothing yet: the bytes wait for the rest of their event or body, and come out later.
    Held,
}

impl Forward {
    /// The bytes to send the agent for `frame`, given what [`ResponseCapture::on_frame`] said.
    pub fn bytes(self, frame: Bytes) -> Option<Bytes> {
        match self {
            Forward::Original => Some(frame),
            Forward::Rewritten(bytes) => Some(bytes),
            Forward::Held => None,
        }
    }
}

/// The response side of a [`Capture`]: follows the body frame by frame.
#[derive(Debug)]
pub struct ResponseCapture {
    injected: Injected,
    assembler: Assembler,
    mode: Mode,
    /// Set when the agent gets the answer translated (a stream event by event; a plain body
    /// whole at its end).
    translation: Option<Translation>,
    /// Body bytes the capture keeps and assembles; past them the response passes through.
    limit: usize,
    seen: usize,
}

#[derive(Debug)]
enum Mode {
    Sse(SseSplitter),
    /// A plain body is only whole JSON at its end.
    Body(BytesMut),
    /// A plain body past the limit, no longer held: stripped as it streams past.
    Stripping(strip_stream::StreamStrip),
}

/// The end of a response.
#[derive(Debug)]
pub struct Finished {
    /// Bytes still to send the agent: a held (and stripped) non-streamed body.
    pub tail: Option<Bytes>,
    pub assembled: Assembled,
    /// The body was larger than the limit: `assembled` holds at most its beginning.
    pub truncated: bool,
}

impl ResponseCapture {
    /// Keeps and assembles at most `limit` body bytes (the recorder's step cap): memory per
    /// call stays bounded whatever the engine sends, and the agent still gets all of it.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    fn over_limit(&self) -> bool {
        self.seen > self.limit
    }

    /// Whether the agent may get other bytes than the engine sent: then the upstream's
    /// `Content-Length` no longer holds and must not be forwarded.
    pub fn rewrites_response(&self) -> bool {
        !self.injected.is_empty() || self.translation.is_some()
    }

    /// Whether the frames taken in so far hold the end of the answer — what tells an agent
    /// that it has its answer (`[DONE]`, `message_stop`, `response.completed`). Known only while
    /// the answer is assembled (within the step cap).
    pub fn answered(&self) -> bool {
        self.assembler.is_complete()
    }

    /// Takes in one frame of the upstream body and says what to send the agent for it.
    pub fn on_frame(&mut self, frame: &Bytes) -> Forward {
        self.seen = self.seen.saturating_add(frame.len());
        let assemble = !self.over_limit();
        match &mut self.translation {
            Some(Translation::Messages(translator)) => {
                let assembler = assemble.then_some(&mut self.assembler);
                return translate_frame(&mut self.mode, translator, assembler, frame);
            }
            Some(Translation::Error(_)) => {
                // An error body is small; it is held and written again at its end.
                if let Mode::Body(body) = &mut self.mode {
                    if body.len() < ERROR_BODY_LIMIT {
                        body.extend_from_slice(frame);
                    }
                }
                return Forward::Held;
            }
            None => {}
        }
        match &mut self.mode {
            Mode::Body(body) if !assemble => {
                // Past the limit a plain body is no longer held: what was held goes out with
                // this frame, and the rest as it comes — the fields the sidecar asked for taken
                // out as they stream past.
                let held = std::mem::take(body);
                if self.injected.is_empty() {
                    return Forward::Original;
                }
                let mut strip = strip_stream::StreamStrip::new(self.injected);
                let mut out = strip.push(&held);
                out.extend(strip.push(frame));
                self.mode = Mode::Stripping(strip);
                Forward::Rewritten(Bytes::from(out))
            }
            Mode::Stripping(strip) => {
                let out = strip.push(frame);
                match out.is_empty() {
                    true => Forward::Held,
                    false => Forward::Rewritten(Bytes::from(out)),
                }
            }
            Mode::Body(body) => {
                body.extend_from_slice(frame);
                if self.injected.is_empty() {
                    Forward::Original
                } else {
                    Forward::Held
                }
            }
            Mode::Sse(splitter) => {
                let aligned = splitter.is_empty();
                splitter.push(frame);
                // Past the limit events are still cut and stripped (one at a time: bounded), but
                // no longer assembled.
                let assembler = assemble.then_some(&mut self.assembler);
                if self.injected.is_empty() {
                    if let Some(assembler) = assembler {
                        while let Some(event) = splitter.next_event() {
                            on_event(Some(&mut *assembler), &self.injected, &event);
                        }
                    } else {
                        splitter.finish();
                    }
                    return Forward::Original;
                }
                let mut assembler = assembler;
                let mut out = BytesMut::new();
                let mut rewritten = false;
                while let Some(event) = splitter.next_event() {
                    match on_event(assembler.as_deref_mut(), &self.injected, &event) {
                        Stripped::Rewritten(edits) => {
                            rewritten = true;
                            write_event(&event, &edits, &mut out);
                        }
                        Stripped::Dropped => rewritten = true,
                        Stripped::Unchanged => out.extend_from_slice(&event.raw),
                    }
                }
                if aligned && !rewritten && splitter.is_empty() {
                    Forward::Original
                } else if out.is_empty() {
                    Forward::Held
                } else {
                    Forward::Rewritten(out.freeze())
                }
            }
        }
    }

    /// The body ended (completely or not): the bytes still to send, and the assembled answer.
    pub fn finish(self) -> Finished {
        let truncated = self.over_limit();
        let ResponseCapture {
            injected,
            mut assembler,
            mode,
            translation,
            ..
        } = self;
        let tail = match (mode, translation) {
            (Mode::Body(body), Some(Translation::Error(status))) => Some(Bytes::from(
                crate::data_plane::anthropic::response::translate_error(status, &body),
            )),
            (Mode::Sse(mut splitter), Some(_)) => {
                splitter.finish();
                None
            }
            // A translated body is held whole, never stripped as it streams.
            (Mode::Stripping(_), Some(_)) => None,
            // Translated whole: the agent gets a message or, when the engine's body is not
            // JSON, what it sent.
            (Mode::Body(body), Some(Translation::Messages(_))) => {
                let body = body.freeze();
                match serde_json::from_slice::<Value>(&body) {
                    Ok(json) => {
                        if !truncated {
                            assembler.on_body(&json);
                        }
                        Some(Bytes::from(
                            crate::data_plane::anthropic::response::message(&json).to_string(),
                        ))
                    }
                    Err(_) => (!body.is_empty()).then_some(body),
                }
            }
            (mode, None) => finish_as_sent(mode, &injected, &mut assembler, truncated),
        };
        Finished {
            tail,
            assembled: assembler.finish(),
            truncated,
        }
    }
}

/// The bytes still to send at the end of an answer that reaches the agent as it came.
fn finish_as_sent(
    mode: Mode,
    injected: &Injected,
    assembler: &mut Assembler,
    truncated: bool,
) -> Option<Bytes> {
    match mode {
        Mode::Sse(mut splitter) => {
            // An event cut off by the end of the stream: when nothing needed stripping it was
            // forwarded already; otherwise it is dropped, as an SSE client would drop it, and
            // so that an error event the relay appends is not glued onto half a line.
            splitter.finish();
            None
        }
        // Past the limit everything was passed on already (but a key held at its very end).
        Mode::Stripping(mut strip) => Some(Bytes::from(strip.finish())).filter(|b| !b.is_empty()),
        Mode::Body(_) if truncated => None,
        Mode::Body(body) => {
            let body = body.freeze();
            // One scan of the body for the assembler and the strip.
            let members = scan(&body, Some(assembler), injected);
            let typed = members
                .as_ref()
                .is_some_and(|members| assembler.on_chat_members(members, true));
            if !typed {
                if let Ok(json) = serde_json::from_slice::<Value>(&body) {
                    assembler.on_body(&json);
                }
            }
            let stripped = members
                .as_ref()
                .map(|members| strip::strip_scanned(&body, members, injected));
            let rewritten = match stripped {
                Some(Stripped::Rewritten(edits)) => Some(Bytes::from(edits.apply(&body))),
                _ => None,
            };
            match rewritten {
                Some(bytes) => Some(bytes),
                None if injected.is_empty() || body.is_empty() => None,
                None => Some(body),
            }
        }
    }
}

/// One upstream frame of an answer translated to Messages: a stream's whole events become the
/// Anthropic events they translate to; a plain body is held for its end.
fn translate_frame(
    mode: &mut Mode,
    translator: &mut crate::data_plane::anthropic::stream::StreamTranslator,
    mut assembler: Option<&mut Assembler>,
    frame: &Bytes,
) -> Forward {
    match mode {
        Mode::Body(body) => {
            body.extend_from_slice(frame);
            Forward::Held
        }
        // Never for a translated answer (it is held whole).
        Mode::Stripping(_) => Forward::Original,
        Mode::Sse(splitter) => {
            splitter.push(frame);
            let mut out = BytesMut::new();
            while let Some(event) = splitter.next_event() {
                let Some(data) = event.data.as_ref() else {
                    continue;
                };
                if event.is_done() {
                    if let Some(assembler) = assembler.as_deref_mut() {
                        assembler.on_done();
                    }
                    translator.on_done(&mut out);
                    continue;
                }
                if let Ok(json) = serde_json::from_slice::<Value>(data) {
                    if let Some(assembler) = assembler.as_deref_mut() {
                        assembler.on_event(event.event.as_deref(), &json);
                    }
                    translator.on_chunk(&json, &mut out);
                }
            }
            if out.is_empty() {
                Forward::Held
            } else {
                Forward::Rewritten(out.freeze())
            }
        }
    }
}

/// Feeds one event to the assembler (when there is one), and says what the agent gets for it.
fn on_event(assembler: Option<&mut Assembler>, injected: &Injected, event: &SseEvent) -> Stripped {
    let Some(data) = event.data.as_ref() else {
        return Stripped::Unchanged;
    };
    if event.is_done() {
        if let Some(assembler) = assembler {
            assembler.on_done();
        }
        return Stripped::Unchanged;
    }
    // One scan of the event for the assembler and the strip.
    let members = scan(data, assembler.as_deref(), injected);
    if let Some(assembler) = assembler {
        let typed = members
            .as_ref()
            .is_some_and(|members| assembler.on_chat_members(members, false));
        if !typed {
            if let Ok(json) = serde_json::from_slice::<Value>(data) {
                assembler.on_event(event.event.as_deref(), &json);
            }
        }
    }
    match &members {
        Some(members) => strip::strip_scanned(data, members, injected),
        None => Stripped::Unchanged,
    }
}

/// The members of a chat or completions event (or body) for the assembler and the strip, when
/// either reads them.
fn scan<'a>(
    event: &'a [u8],
    assembler: Option<&Assembler>,
    injected: &Injected,
) -> Option<Members<'a>> {
    let read = assembler.is_some_and(Assembler::reads_members) || !injected.is_empty();
    read.then(|| Members::scan(event)).flatten()
}

/// Appends `event` to `out` with its data edited: its `event:` name, then the data on one line.
fn write_event(event: &SseEvent, edits: &strip::Edits, out: &mut BytesMut) {
    out.reserve(event.raw.len());
    if let Some(name) = &event.event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"data: ");
    edits.write_to(event.data.as_deref().unwrap_or_default(), out);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A vLLM chat stream asked for ids and logprobs by the sidecar.
    fn engine_stream() -> String {
        let chunks = [
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": null, "finish_reason": null}],
                   "prompt_token_ids": [1, 2]}),
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": {"content": "Hi"},
                                "logprobs": {"content": [{"token": "Hi", "logprob": -0.5,
                                                          "bytes": [72, 105],
                                                          "top_logprobs": []}]},
                                "finish_reason": "stop", "token_ids": [7]}]}),
        ];
        let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        out
    }

    fn vllm_chat(stream: bool) -> Capture {
        let mut body = json!({"model": "m", "messages": [], "stream": stream});
        Capture::for_request(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body)
    }

    fn relay(mut capture: ResponseCapture, frames: &[&[u8]]) -> (Vec<u8>, Assembled) {
        let mut sent = Vec::new();
        for frame in frames {
            let frame = Bytes::copy_from_slice(frame);
            sent.extend(capture.on_frame(&frame).bytes(frame).unwrap_or_default());
        }
        let finished = capture.finish();
        sent.extend_from_slice(finished.tail.as_deref().unwrap_or_default());
        (sent, finished.assembled)
    }

    fn data_lines(sse: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(sse)
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_stream_split_anywhere_reaches_the_agent_stripped_and_is_assembled_whole() {
        let input = engine_stream();
        let input = input.as_bytes();
        let expected = vec![
            r#"data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}"#,
            r#"data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}]}"#,
            "data: [DONE]",
        ];
        for cut in 0..=input.len() {
            let (sent, assembled) = relay(
                vllm_chat(true).response(true),
                &[&input[..cut], &input[cut..]],
            );
            assert_eq!(data_lines(&sent), expected, "cut at byte {cut}");
            assert_eq!(assembled.output.content.as_deref(), Some("Hi"));
            assert_eq!(assembled.ending, Ending::Complete);
            let engine = assembled.engine.unwrap_or_default();
            assert_eq!(engine.prompt_token_ids, vec![1, 2]);
            assert_eq!(engine.completion_token_ids, vec![7]);
            assert_eq!(engine.completion_logprobs.len(), 1);
        }
    }

    #[test]
    fn without_injected_fields_every_frame_goes_through_untouched() {
        let mut body = json!({"model": "m", "messages": [], "stream": true});
        let capture =
            Capture::for_request(UpstreamKind::Openai, Endpoint::ChatCompletions, &mut body);
        let input = engine_stream();
        let mut response = capture.response(true);
        let frame = Bytes::from(input[..7].to_owned());
        assert_eq!(response.on_frame(&frame), Forward::Original);
        let frame = Bytes::from(input[7..].to_owned());
        assert_eq!(response.on_frame(&frame), Forward::Original);
        let finished = response.finish();
        assert_eq!(finished.tail, None);
        assert_eq!(finished.assembled.output.content.as_deref(), Some("Hi"));
    }

    #[test]
    fn a_frame_of_whole_events_with_nothing_to_strip_is_forwarded_as_it_came() {
        let mut response = vllm_chat(true).response(true);
        let frame = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        );
        assert_eq!(response.on_frame(&frame), Forward::Original);
    }

    #[test]
    fn a_chunk_vllm_sends_only_for_the_injected_fields_does_not_reach_the_agent() {
        let mut response = vllm_chat(true).response(true);
        let role = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"prompt_token_ids\":[1,2]}\n\n",
        );
        assert!(matches!(response.on_frame(&role), Forward::Rewritten(_)));
        let held = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":{\"content\":[]},\"finish_reason\":null,\"token_ids\":[226]}]}\n\n",
        );
        assert_eq!(response.on_frame(&held), Forward::Held);
        let finished = response.finish();
        let engine = finished.assembled.engine.unwrap_or_default();
        assert_eq!(
            engine.completion_token_ids,
            vec![226],
            "its ids are recorded"
        );
    }

    #[test]
    fn a_stripped_body_is_held_and_sent_whole_at_the_end_in_its_key_order() {
        let body = json!({"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                         "logprobs": {"content": [{"token": "Hi", "logprob": -0.5}]},
                         "finish_reason": "stop", "token_ids": [7]}],
            "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1},
            "prompt_token_ids": [1, 2]})
        .to_string();
        let (sent, assembled) = relay(
            vllm_chat(false).response(false),
            &[&body.as_bytes()[..10], &body.as_bytes()[10..]],
        );
        assert_eq!(
            String::from_utf8_lossy(&sent),
            r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1},"prompt_token_ids":null}"#
        );
        assert_eq!(
            assembled.engine.map(|e| e.completion_token_ids),
            Some(vec![7])
        );
        assert_eq!(assembled.usage.map(|u| u.total_tokens), Some(3));
    }

    #[test]
    fn a_body_that_is_not_json_is_sent_as_it_came_and_recorded_as_truncated() {
        let (sent, assembled) = relay(
            vllm_chat(false).response(false),
            &[b"{\"id\": \"c\", \"cho"],
        );
        assert_eq!(sent, b"{\"id\": \"c\", \"cho");
        assert_eq!(assembled.ending, Ending::Truncated);
    }

    #[test]
    fn a_stream_cut_mid_event_forwards_its_whole_events_only() {
        let input = engine_stream();
        let cut = input.len() - 20;
        let (sent, assembled) = relay(vllm_chat(true).response(true), &[&input.as_bytes()[..cut]]);
        assert_eq!(data_lines(&sent).len(), 1);
        assert!(sent.ends_with(b"\n\n"));
        assert_eq!(assembled.ending, Ending::Truncated);
        assert_eq!(assembled.output.content.as_deref(), Some(""));
    }

    /// SGLang's chat body, in its field order, as asked for ids and logprobs by the sidecar.
    fn sglang_body(asked: bool) -> Value {
        let mut choice = json!({"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": null,
                        "tool_calls": null},
            "logprobs": null, "finish_reason": "stop", "matched_stop": 151645});
        if asked {
            choice["logprobs"] = json!({"content": [
                {"token": "Hi", "bytes": [72, 105], "logprob": -0.5, "top_logprobs": []},
                {"token": "<|im_end|>", "bytes": [60], "logprob": -0.01, "top_logprobs": []}]});
            choice["prompt_token_ids"] = json!([151644, 872]);
            choice["token_ids"] = json!([13048, 151645]);
        }
        json!({"id": "1f3e", "object": "chat.completion", "created": 1764400000,
               "model": "qwen", "choices": [choice],
               "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2,
                         "prompt_tokens_details": null, "reasoning_tokens": 0},
               "metadata": {"weight_version": "default"}})
    }

    #[test]
    fn an_sglang_body_reaches_the_agent_without_the_id_keys_and_is_recorded_with_them() {
        let mut request = json!({"model": "qwen", "messages": []});
        let capture = Capture::for_request(
            UpstreamKind::Sglang,
            Endpoint::ChatCompletions,
            &mut request,
        );
        let body = sglang_body(true).to_string();
        let (sent, assembled) = relay(capture.response(false), &[body.as_bytes()]);
        assert_eq!(sent, sglang_body(false).to_string().as_bytes());
        let engine = assembled.engine.unwrap_or_default();
        assert_eq!(engine.prompt_token_ids, vec![151644, 872]);
        assert_eq!(engine.completion_token_ids, vec![13048, 151645]);
        assert_eq!(engine.completion_logprobs.len(), 2);
    }

    #[test]
    fn a_streamed_sglang_call_reaches_the_agent_without_logprobs_and_is_recorded_text_only() {
        let mut request = json!({"model": "qwen", "messages": [], "stream": true});
        let capture = Capture::for_request(
            UpstreamKind::Sglang,
            Endpoint::ChatCompletions,
            &mut request,
        );
        let chunk = json!({"id": "1f3e", "object": "chat.completion.chunk", "created": 1,
            "model": "qwen", "choices": [{"index": 0, "delta": {"role": null, "content": "Hi",
            "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5,
                                      "top_logprobs": []}]},
            "finish_reason": null, "matched_stop": null}], "usage": null});
        let stream = format!("data: {chunk}\n\ndata: [DONE]\n\n");
        let (sent, assembled) = relay(capture.response(true), &[stream.as_bytes()]);
        assert!(!String::from_utf8_lossy(&sent).contains("-0.5"));
        assert!(String::from_utf8_lossy(&sent).contains("\"logprobs\":null"));
        assert_eq!(assembled.engine, None);
        assert_eq!(assembled.logprobs_without_ids.len(), 1);
        assert_eq!(assembled.output.content.as_deref(), Some("Hi"));
    }
}
