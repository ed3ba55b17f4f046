//! Token capture against the mock engine's exact vLLM shapes: what is recorded from a streamed
//! call equals what is recorded from the same call not streamed, and what the agent receives
//! equals what the engine would have sent had the sidecar not asked for ids and logprobs.

use bytes::Bytes;
use serde_json::{json, Value};

use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::capture::{
    Assembled, Capture, Ending, Endpoint, ResponseCapture,
};
use clawback_tests::engine_json::{self, Reply, EOS_ID};

const ID: &str = "chatcmpl-5e0c2b7f";

/// Frame sizes the upstream body is cut into: one byte, odd sizes that cut events anywhere,
/// and the whole body at once.
const FRAME_SIZES: [usize; 4] = [1, 7, 64, usize::MAX];

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}}])
}

fn chat_request(with_tools: bool, stream: bool) -> Value {
    let mut request = json!({
        "model": "mock-llama",
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the weather in Paris?"}],
        "temperature": 0.7,
        "stream": stream
    });
    if with_tools {
        request["tools"] = tools();
    }
    if stream {
        request["stream_options"] = json!({"include_usage": true});
    }
    request
}

fn completion_request(stream: bool) -> Value {
    let mut request = json!({"model": "mock-llama", "prompt": "The weather in Paris is",
                             "max_tokens": 16, "stream": stream});
    if stream {
        request["stream_options"] = json!({"include_usage": true});
    }
    request
}

fn responses_request(with_tools: bool, stream: bool) -> Value {
    let mut request = json!({"model": "mock-llama", "input": "What is the weather in Paris?",
                             "stream": stream});
    if with_tools {
        request["tools"] = json!([{"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    }
    request
}

/// What the engine answers `request` with, whole or as SSE bytes.
fn engine_response(endpoint: Endpoint, request: &Value) -> Vec<u8> {
    let stream = request["stream"] == true;
    let reply = Reply::for_request(request);
    match (endpoint, stream) {
        (Endpoint::ChatCompletions, false) => engine_json::chat_completion(ID, request, &reply)
            .to_string()
            .into_bytes(),
        (Endpoint::ChatCompletions, true) => {
            sse(engine_json::chat_completion_chunks(ID, request, &reply)
                .into_iter()
                .map(|c| (None, c)))
        }
        (Endpoint::Completions, false) => engine_json::completion(ID, request)
            .to_string()
            .into_bytes(),
        (Endpoint::Completions, true) => sse(engine_json::completion_chunks(ID, request)
            .into_iter()
            .map(|c| (None, c))),
        (Endpoint::Responses, false) => engine_json::response(ID, request, &reply, true)
            .to_string()
            .into_bytes(),
        (Endpoint::Responses, true) => sse(engine_json::response_events(ID, request, &reply)
            .into_iter()
            .map(|(name, data)| (Some(name), data))),
        // Not among the endpoints these properties run (its shapes are vLLM's own, tested
        // against vLLM in tests/tests/vllm/anthropic.rs).
        (Endpoint::Messages, _) => Vec::new(),
    }
}

/// Events as the engine writes them; chat and completions end with `[DONE]`, the Responses API
/// with its `response.completed` event.
fn sse(events: impl Iterator<Item = (Option<String>, Value)>) -> Vec<u8> {
    let mut out = String::new();
    let mut named = false;
    for (name, data) in events {
        if let Some(name) = name {
            named = true;
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    if !named {
        out.push_str("data: [DONE]\n\n");
    }
    out.into_bytes()
}

/// Runs `upstream` through the capture cut into `frame_size` frames, as the relay will: the
/// bytes the agent receives and what is recorded.
fn relay(mut capture: ResponseCapture, upstream: &[u8], frame_size: usize) -> (Vec<u8>, Assembled) {
    let mut sent = Vec::new();
    for frame in upstream.chunks(frame_size.min(upstream.len()).max(1)) {
        let frame = Bytes::copy_from_slice(frame);
        sent.extend(capture.on_frame(&frame).bytes(frame).unwrap_or_default());
    }
    let finished = capture.finish();
    sent.extend_from_slice(finished.tail.as_deref().unwrap_or_default());
    (sent, finished.assembled)
}

/// One call through the capture: the request as the agent sent it, rewritten for `kind`,
/// answered by the mock engine, relayed back in `frame_size` frames. Checks that the agent
/// received exactly what the engine sends for its own request, and returns what is recorded.
fn call(
    kind: UpstreamKind,
    endpoint: Endpoint,
    agent_request: &Value,
    frame_size: usize,
) -> Assembled {
    let mut upstream_request = agent_request.clone();
    let capture = Capture::for_request(kind, endpoint, &mut upstream_request);
    let upstream = engine_response(endpoint, &upstream_request);
    let (sent, assembled) = relay(
        capture.response(agent_request["stream"] == true),
        &upstream,
        frame_size,
    );
    let unasked = engine_response(endpoint, agent_request);
    assert_eq!(
        String::from_utf8_lossy(&sent),
        String::from_utf8_lossy(&unasked),
        "the agent must receive what the engine sends for its own request"
    );
    assembled
}

/// The same call streamed in every frame size and not streamed; all recordings must be equal.
fn recorded_alike(
    kind: UpstreamKind,
    endpoint: Endpoint,
    request: impl Fn(bool) -> Value,
) -> Assembled {
    let whole = call(kind, endpoint, &request(false), usize::MAX);
    assert_eq!(whole.ending, Ending::Complete);
    for size in FRAME_SIZES {
        let streamed = call(kind, endpoint, &request(true), size);
        assert_eq!(streamed, whole, "streamed in {size}-byte frames");
    }
    whole
}

#[test]
fn a_streamed_text_reply_is_recorded_as_the_non_streamed_one_with_engine_tokens() {
    let recorded = recorded_alike(UpstreamKind::Vllm, Endpoint::ChatCompletions, |stream| {
        chat_request(false, stream)
    });
    assert_eq!(
        recorded.output.content.as_deref(),
        Some(engine_json::ANSWER)
    );
    assert_eq!(recorded.finish_reason.as_deref(), Some("stop"));
    assert_eq!(recorded.model.as_deref(), Some("mock-llama"));
    let engine = recorded.engine.unwrap_or_default();
    let request = chat_request(false, false);
    assert_eq!(
        engine.prompt_token_ids,
        engine_json::prompt_token_ids(&request)
    );
    assert_eq!(
        engine.completion_token_ids.last(),
        Some(&EOS_ID),
        "EOS is kept"
    );
    assert_eq!(
        engine.completion_logprobs.len(),
        engine.completion_token_ids.len()
    );
    let usage = recorded.usage.unwrap_or_default();
    assert_eq!(
        usage.completion_tokens as usize,
        engine.completion_token_ids.len()
    );
}

#[test]
fn a_streamed_tool_call_is_recorded_whole_as_the_non_streamed_one() {
    let recorded = recorded_alike(UpstreamKind::Vllm, Endpoint::ChatCompletions, |stream| {
        chat_request(true, stream)
    });
    assert_eq!(recorded.output.content, None);
    assert_eq!(
        recorded.output.tool_calls,
        vec![
            json!({"id": "chatcmpl-tool-8f2e4a1c9b7d4e05a3c6", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}})
        ]
    );
    assert_eq!(recorded.finish_reason.as_deref(), Some("tool_calls"));
    let engine = recorded.engine.unwrap_or_default();
    assert_eq!(
        engine.completion_token_ids.len(),
        5,
        "the name and four argument pieces"
    );
}

#[test]
fn ids_and_logprobs_the_agent_asked_for_itself_reach_it_and_are_recorded() {
    let request = |stream: bool| {
        let mut request = chat_request(false, stream);
        request["logprobs"] = json!(true);
        request["top_logprobs"] = json!(0);
        request["return_token_ids"] = json!(true);
        request
    };
    let recorded = recorded_alike(UpstreamKind::Vllm, Endpoint::ChatCompletions, request);
    let engine = recorded.engine.unwrap_or_default();
    assert!(!engine.completion_logprobs.is_empty());
}

#[test]
fn an_openai_upstream_records_text_only_and_streamed_equals_whole() {
    for tools in [false, true] {
        let recorded = recorded_alike(UpstreamKind::Openai, Endpoint::ChatCompletions, |stream| {
            chat_request(tools, stream)
        });
        assert_eq!(recorded.engine, None);
        assert!(recorded.output.content.is_some() || !recorded.output.tool_calls.is_empty());
    }
}

#[test]
fn a_streamed_completion_is_recorded_as_the_non_streamed_one() {
    let recorded = recorded_alike(
        UpstreamKind::Vllm,
        Endpoint::Completions,
        completion_request,
    );
    assert_eq!(
        recorded.output.content.as_deref(),
        Some(engine_json::ANSWER)
    );
    let engine = recorded.engine.unwrap_or_default();
    assert_eq!(engine.completion_token_ids.last(), Some(&EOS_ID));
    assert_eq!(
        engine.completion_logprobs.len(),
        engine.completion_token_ids.len()
    );
    assert_eq!(
        engine.completion_logprobs.iter().last().map(|l| l.token),
        Some(engine_json::EOS_TEXT)
    );
}

#[test]
fn a_streamed_responses_call_is_recorded_as_the_non_streamed_one() {
    let text = recorded_alike(UpstreamKind::Vllm, Endpoint::Responses, |stream| {
        responses_request(false, stream)
    });
    assert_eq!(text.output.content.as_deref(), Some(engine_json::ANSWER));
    assert_eq!(text.finish_reason.as_deref(), Some("stop"));
    assert_eq!(text.engine, None, "the Responses API returns no token ids");
    assert!(text
        .usage
        .is_some_and(|u| u.prompt_tokens > 0 && u.completion_tokens > 0));

    let tool = recorded_alike(UpstreamKind::Vllm, Endpoint::Responses, |stream| {
        responses_request(true, stream)
    });
    assert_eq!(
        tool.output.tool_calls,
        vec![json!({"id": "call_Xk2pQ9rT", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}})]
    );
    assert_eq!(tool.finish_reason.as_deref(), Some("tool_calls"));
}

#[test]
fn a_responses_stream_without_its_completed_event_is_recorded_from_the_deltas() {
    let request = responses_request(false, true);
    let reply = Reply::for_request(&request);
    let events: Vec<(Option<String>, Value)> = engine_json::response_events(ID, &request, &reply)
        .into_iter()
        .filter(|(name, _)| name != "response.completed" && name != "response.output_item.done")
        .map(|(name, data)| (Some(name), data))
        .collect();
    let mut body = json!({});
    let capture = Capture::for_request(UpstreamKind::Vllm, Endpoint::Responses, &mut body);
    let (_, recorded) = relay(capture.response(true), &sse(events.into_iter()), 13);
    assert_eq!(recorded.ending, Ending::Truncated);
    assert_eq!(
        recorded.output.content.as_deref(),
        Some(engine_json::ANSWER)
    );
    assert_eq!(recorded.finish_reason, None);
}

#[test]
fn a_stream_without_a_usage_chunk_gets_the_usage_the_engine_counts_from_its_ids() {
    let request = |stream: bool| {
        let mut request = chat_request(false, stream);
        if let Some(fields) = request.as_object_mut() {
            fields.shift_remove("stream_options");
        }
        request
    };
    let recorded = recorded_alike(UpstreamKind::Vllm, Endpoint::ChatCompletions, request);
    assert!(recorded.usage.is_some());
}

#[test]
fn a_text_only_stream_without_a_usage_chunk_records_no_usage() {
    let mut request = chat_request(false, true);
    if let Some(fields) = request.as_object_mut() {
        fields.shift_remove("stream_options");
    }
    let recorded = call(
        UpstreamKind::Openai,
        Endpoint::ChatCompletions,
        &request,
        64,
    );
    assert_eq!(recorded.usage, None);
    assert_eq!(
        recorded.output.content.as_deref(),
        Some(engine_json::ANSWER)
    );
}
