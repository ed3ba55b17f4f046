//! What an agent sends arrives at the engine intact, and what the engine answers reaches the
//! agent unchanged — and, when streamed, as it is produced.
//!
//! These tests forward to an `openai`-kind upstream, for which the sidecar asks nothing extra,
//! so bodies can be compared byte for byte. What token capture adds and strips for vLLM and
//! SGLang upstreams is checked in `recording.rs` and `tests/tests/capture.rs`.

use std::time::{Duration, Instant};

use clawback_sidecar::config::{Config, UpstreamKind};
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use serde_json::{json, Value};

use crate::support::{
    assert_openai_error, chat_request, client, openclaw_request, post_chat, read_chunks, sse_data,
};

/// A sidecar in front of `engine` that adds nothing to requests.
fn transparent(engine: &MockUpstream) -> Config {
    let mut config = test_config(&[engine.url()]);
    config.upstream_kind = UpstreamKind::Openai;
    config
}

#[tokio::test]
async fn a_non_streaming_answer_passes_byte_for_byte() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let response = post_chat(&sidecar, false).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(response.headers().contains_key("x-request-id"));
    let body = response.bytes().await.unwrap();
    assert_eq!(body, engine.sent()[0]);
}

#[tokio::test]
async fn a_streamed_answer_arrives_event_by_event_not_at_the_end() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        chunk_delay: Duration::from_millis(150),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let started = Instant::now();
    let response = post_chat(&sidecar, true).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let chunks = read_chunks(response).await;
    let finished = Instant::now();

    let events = sse_data(&engine.sent()[0]).len();
    assert!(
        events >= 8,
        "the mock streams word by word: {events} events"
    );
    assert!(
        chunks.len() * 2 >= events,
        "events were coalesced: {} chunks for {events} events",
        chunks.len()
    );
    let first = chunks[0].0 - started;
    assert!(
        first < (finished - started) / 3,
        "first event after {first:?} of {:?}: the stream was buffered",
        finished - started
    );
    let body: Vec<u8> = chunks.iter().flat_map(|(_, c)| c.iter().copied()).collect();
    assert_eq!(body, engine.sent()[0]);
}

#[tokio::test]
async fn an_openclaw_request_reaches_the_engine_intact_with_its_headers() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let body = serde_json::to_vec(&openclaw_request()).unwrap();
    assert!(body.len() > 30_000, "{} bytes", body.len());

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let response = client()
        .post(sidecar.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-agent-key")
        .header("traceparent", traceparent)
        .header("x-stainless-lang", "js")
        .header("x-stainless-package-version", "5.23.2")
        .header("x-stainless-retry-count", "0")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["x-request-id"].clone();
    let streamed = response.bytes().await.unwrap();

    let received = &engine.received()[0];
    assert_eq!(received.path, "/v1/chat/completions");
    assert_eq!(received.body, body);
    assert_eq!(received.headers["traceparent"], traceparent);
    assert_eq!(received.headers["authorization"], "Bearer sk-agent-key");
    assert_eq!(received.headers["x-stainless-lang"], "js");
    assert_eq!(received.headers["x-stainless-package-version"], "5.23.2");
    // The engine's id starts with the agent's and is unique whatever the agent sent.
    let upstream_id = received.headers["x-request-id"].to_str().unwrap();
    let agent_id = request_id.to_str().unwrap();
    assert!(
        upstream_id.starts_with(&format!("{agent_id}-")),
        "{upstream_id}"
    );

    // The tool call split over several chunks and the usage chunk arrive as sent.
    let events = sse_data(&streamed);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(usage["usage"]["total_tokens"].as_u64().unwrap() > 0);
    let arguments: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|e| {
            e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    let arguments: Value = serde_json::from_str(&arguments).unwrap();
    assert_eq!(arguments["city"], "Paris");
}

#[tokio::test]
async fn a_configured_upstream_key_replaces_the_agents() {
    let engine = MockUpstream::start().await;
    let mut config = transparent(&engine);
    config.upstream_api_key = Some("sk-upstream-secret".to_owned());
    let sidecar = Sidecar::start(config).await;

    client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth("sk-agent-key")
        .json(&chat_request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(
        engine.received()[0].headers["authorization"],
        "Bearer sk-upstream-secret"
    );
}

#[tokio::test]
async fn the_session_path_form_is_stripped_before_forwarding() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let response = client()
        .post(sidecar.url("/s/run-7f3a/v1/chat/completions"))
        .json(&chat_request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(engine.received()[0].path, "/v1/chat/completions");
}

#[tokio::test]
async fn allowed_v1_paths_pass_through_with_method_and_query() {
    let engine = MockUpstream::start().await;
    let mut config = transparent(&engine);
    // Not in the default allow-list: an operator widens it.
    config.agent_api.allow.push("DELETE /v1/files/*".to_owned());
    let sidecar = Sidecar::start(config).await;

    let response = client()
        .post(sidecar.url("/v1/embeddings?dimensions=8"))
        .json(&json!({"model": "mock-llama", "input": "hello"}))
        .send()
        .await
        .unwrap();
    let echo: Value = response.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/embeddings");
    assert_eq!(engine.received()[0].path, "/v1/embeddings?dimensions=8");
    assert_eq!(engine.received()[0].method, http::Method::POST);

    let response = client()
        .delete(sidecar.url("/v1/files/file-abc"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(engine.received()[1].method, http::Method::DELETE);
}

#[tokio::test]
async fn an_engine_error_reaches_the_agent_as_the_engine_sent_it() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        fail_with: Some(400),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let response = post_chat(&sidecar, false).await;
    assert_eq!(response.status(), 400);
    let body = response.bytes().await.unwrap();
    assert_eq!(body, engine.sent()[0]);
    // A client error does not make the engine unhealthy.
    assert_eq!(sidecar.app.pool.healthy_count(), 1);
}

#[tokio::test]
async fn an_engine_dying_mid_stream_ends_the_stream_with_an_openai_error_event() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        die_after_chunks: Some(3),
        chunk_delay: Duration::from_millis(50),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let response = post_chat(&sidecar, true).await;
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.unwrap();
    let events = sse_data(&body);
    // What arrived before the break is what the engine sent, then one error event.
    let sent = sse_data(&engine.sent()[0]);
    let (last, before) = events.split_last().unwrap();
    assert!(!before.is_empty() && before.len() <= 3, "{events:?}");
    assert_eq!(before, &sent[..before.len()]);
    let last: Value = serde_json::from_str(last).unwrap();
    assert_openai_error(&last, "upstream_stream_broken");
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();

    let response = h2
        .post(sidecar.url("/v1/chat/completions"))
        .json(&chat_request(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.unwrap();
    assert_eq!(body, engine.sent()[0]);
}

#[tokio::test]
async fn completions_and_responses_streams_pass_through_unchanged() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;

    let completion = client()
        .post(sidecar.url("/v1/completions"))
        .json(
            &json!({"model": "mock-llama", "prompt": "Paris is", "stream": true,
                      "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let response = client()
        .post(sidecar.url("/v1/responses"))
        .json(&json!({"model": "mock-llama", "input": "Weather in Paris?", "stream": true}))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let sent = engine.sent();
    assert_eq!(completion, sent[0]);
    assert_eq!(response, sent[1]);
    assert!(String::from_utf8_lossy(&response).contains("event: response.completed"));
}

#[tokio::test]
async fn health_readiness_and_metrics_are_served() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let client = client();

    assert_eq!(
        client
            .get(sidecar.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(sidecar.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    client
        .post(sidecar.url("/v1/chat/completions"))
        .json(&chat_request(false))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let metrics = client
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let upstream = engine.addr().to_string();
    assert!(metrics.contains(&format!(
        "clawback_requests_total{{route=\"chat_completions\",status=\"200\",upstream=\"{upstream}\"}} 1"
    )), "{metrics}");
    for family in [
        "clawback_request_duration_seconds_bucket",
        "clawback_added_latency_seconds_bucket",
        "clawback_upstream_first_byte_seconds_bucket",
        "clawback_in_flight_requests",
    ] {
        assert!(metrics.contains(family), "{family} missing");
    }
    let not_found = client.get(sidecar.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(not_found.status(), 404);
    assert_openai_error(&not_found.json().await.unwrap(), "not_found");
}
