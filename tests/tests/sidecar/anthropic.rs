//! Anthropic's Messages API where the real engine cannot be made to misbehave: an engine that
//! dies mid-stream, fails, or is not there, and the sidecar's own refusals — each reaches the
//! client in Anthropic's error shape, and a call that was not served is not recorded. (What the
//! translation gives against the real engine: tests/tests/vllm/anthropic.rs.)

use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use serde_json::{json, Value};

use crate::support::{client, store};

fn messages(stream: bool) -> Value {
    json!({"model": "mock-llama", "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "What's the weather in Paris?"}]})
}

async fn sidecar(engine: &MockUpstream) -> Sidecar {
    let mut config = test_config(&[engine.url()]);
    config.upstream_kind = UpstreamKind::Vllm;
    Sidecar::start(config).await
}

/// The SSE events of a Messages stream: (event name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name?, data?))
        })
        .collect()
}

pub(crate) fn assert_anthropic_error(body: &Value, kind: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn a_streamed_message_is_translated_event_by_event_and_recorded_as_a_chat_step() {
    let engine = MockUpstream::start().await;
    let sidecar = sidecar(&engine).await;
    let response = client()
        .post(sidecar.url("/v1/messages"))
        .json(&messages(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let got = events(&body);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{body}");
    assert_eq!(names.get(1), Some(&"ping"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let text: String = got
        .iter()
        .filter_map(|(_, e)| e["delta"]["text"].as_str())
        .collect();
    assert!(text.starts_with("The weather"), "{body}");
    // What the engine got was a chat call asking for ids and logprobs.
    let sent = &engine.received()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    let chat: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(chat["return_token_ids"], true);
    assert_eq!(chat["stream_options"]["include_usage"], true);
    let store = store(&sidecar);
    let step = crate::support::poll("the step", || async {
        let tenant = clawback_datapool::TenantId::new("default").ok()?;
        let header = store
            .list_trajectories(&tenant, None, 10)
            .await
            .ok()?
            .pop()?;
        let record = store.trajectory(&tenant, &header.id).await.ok()??;
        record.steps.into_iter().next()
    })
    .await;
    assert_eq!(step.endpoint, clawback_datapool::Endpoint::ChatCompletions);
    assert_eq!(step.output.content.as_deref(), Some(text.as_str()));
    assert!(matches!(step.tokens, clawback_datapool::Tokens::Engine(_)));
}

#[tokio::test]
async fn an_engine_that_dies_mid_stream_ends_the_stream_with_an_anthropic_error_event() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        die_after_chunks: Some(3),
        chunk_delay: std::time::Duration::from_millis(50),
        ..Behaviour::default()
    });
    let sidecar = sidecar(&engine).await;
    let body = client()
        .post(sidecar.url("/v1/messages"))
        .json(&messages(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let got = events(&body);
    assert_eq!(
        got.first().map(|(n, _)| n.as_str()),
        Some("message_start"),
        "{body}"
    );
    let (name, error) = got.last().expect("events");
    assert_eq!(name, "error", "{body}");
    assert_anthropic_error(error, "api_error");
    assert!(
        !got.iter().any(|(n, _)| n == "message_stop"),
        "a broken stream must not look finished: {body}"
    );
}

#[tokio::test]
async fn engine_and_sidecar_errors_reach_the_client_in_anthropics_shape() {
    let engine = MockUpstream::start().await;
    let sidecar = sidecar(&engine).await;
    let send = |body: Value| {
        let url = sidecar.url("/v1/messages");
        async move {
            let response = client().post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    // The sidecar refuses what a self-hosted engine cannot serve, saying where it is.
    let mut server_tool = messages(false);
    server_tool["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    let (status, body) = send(server_tool).await;
    assert_eq!(status, 400);
    assert_anthropic_error(&body, "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .starts_with("tools.0.type"));
    // Another tenant's adapter does not exist for this one.
    let mut foreign = messages(false);
    foreign["model"] = json!("other@v1");
    let (status, body) = send(foreign).await;
    assert_eq!(status, 404, "{body}");
    assert_anthropic_error(&body, "not_found_error");
    // The engine's own error, translated.
    engine.set_behaviour(Behaviour {
        fail_with: Some(500),
        ..Behaviour::default()
    });
    let (status, body) = send(messages(true)).await;
    assert_eq!(status, 500);
    assert_anthropic_error(&body, "api_error");
    // No engine at all.
    engine.stop();
    let (status, body) = send(messages(false)).await;
    assert_eq!(status, 502);
    assert_anthropic_error(&body, "api_error");
    // None of it was a step.
    let tenant = clawback_datapool::TenantId::new("default").unwrap();
    let store = store(&sidecar);
    for header in store.list_trajectories(&tenant, None, 10).await.unwrap() {
        let record = store.trajectory(&tenant, &header.id).await.unwrap();
        let steps = record.map(|r| r.steps.len()).unwrap_or_default();
        assert_eq!(steps, 0, "a call that was not served was recorded");
    }
}

#[tokio::test]
async fn with_recording_off_a_message_is_still_translated_both_ways() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.upstream_kind = UpstreamKind::Vllm;
    config.recording.enabled = false;
    let sidecar = Sidecar::start(config).await;
    let response = client()
        .post(sidecar.url("/v1/messages"))
        .json(&messages(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["type"], "message");
    assert!(message["content"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("The weather")));
    assert_eq!(engine.received()[0].path, "/v1/chat/completions");
    let chat: Value = serde_json::from_slice(&engine.received()[0].body).unwrap();
    assert!(
        chat.get("return_token_ids").is_none(),
        "nothing is asked for when nothing is recorded"
    );
}
