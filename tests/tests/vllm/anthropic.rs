//! Anthropic's Messages API through the sidecar to the real vLLM: the official Anthropic SDKs
//! (Python and TypeScript) get what vLLM's own `/v1/messages` would give them, and a coding
//! agent's multi-turn tool session — no session id anywhere — is recorded as one trajectory of
//! chat steps with vLLM's exact token ids and logprobs.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId, Tokens, TrajectoryRecord};
use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{
    printed_json, repo_root, run_client, sdk_node_dir, sdk_python, test_config, Sidecar,
};
use clawback_tests::vllm::{self, MODEL};
use serde_json::{json, Value};

const KEY: &str = "sk-coder";

async fn sidecar() -> Sidecar {
    let mut config = test_config(&[vllm::shared().url.clone()]);
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.default = None;
    config
        .tenants
        .keys
        .insert(key_hash(KEY), "coder".to_owned());
    Sidecar::start(config).await
}

/// Runs an SDK script against `sidecar`; its stdout, once it printed `ok` for `cases`.
async fn run(mut command: Command, sidecar: &Sidecar, what: &str, cases: &[&str]) -> String {
    command
        .env("ANTHROPIC_BASE_URL", sidecar.url(""))
        .env("ANTHROPIC_API_KEY", KEY)
        .env("CLAWBACK_MODEL", MODEL);
    run_client(command, what, cases).await
}

/// The trajectories of tenant `coder` once `count` steps are recorded in all.
async fn trajectories(store: &Arc<dyn Store>, count: usize) -> Vec<TrajectoryRecord> {
    let records = crate::trajectories_of(store, "coder", count).await;
    assert!(
        records.iter().map(|r| r.steps.len()).sum::<usize>() >= count,
        "{count} steps were not recorded: {} trajectories",
        records.len()
    );
    records
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_is_served_by_vllm_and_its_tool_session_is_one_trajectory_with_exact_tokens()
{
    let _engine = super::share().await;
    let sidecar = sidecar().await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let mut command = Command::new(sdk_python());
    command.arg(repo_root().join("tests/sdk/python/anthropic_agent.py"));
    let cases = [
        "message",
        "stream_tool_use",
        "tool_session",
        "count_tokens",
        "engine_error",
        "sidecar_error",
        "unknown_key",
    ];
    let stdout = run(command, &sidecar, "the Anthropic Python SDK", &cases).await;
    let session = printed_json(&stdout, "session");

    // A message, a streamed tool call and the three-turn session: five steps, and count_tokens
    // and the refused calls none.
    let records = trajectories(&store, 5).await;
    let steps: usize = records.iter().map(|r| r.steps.len()).sum();
    assert_eq!(steps, 5, "count_tokens or an error was recorded as a step");
    let sessions: Vec<&TrajectoryRecord> = records.iter().filter(|r| r.steps.len() == 3).collect();
    assert_eq!(
        sessions.len(),
        1,
        "the tool session is not one trajectory: {:?}",
        records.iter().map(|r| r.steps.len()).collect::<Vec<_>>()
    );
    let steps = &sessions[0].steps;
    let tool_use_id = session["tool_use_id"].as_str().expect("an id");
    assert_eq!(
        steps[0].output.tool_calls[0]["id"], tool_use_id,
        "the tool_use id the agent got is the engine's tool call id"
    );
    assert_eq!(
        steps[0].request.messages,
        vec![
            json!({"role": "system", "content": "You are a weather agent."}),
            json!({"role": "user", "content": "What's the weather in Paris?"}),
        ]
    );
    assert!(
        steps[1].request.messages.contains(
            &json!({"role": "tool", "tool_call_id": tool_use_id, "content": "18 C and sunny"})
        ),
        "{:?}",
        steps[1].request.messages
    );
    let next = steps[0]
        .next_state
        .as_ref()
        .expect("the tool result is step 0's next state");
    assert_eq!(next.messages[0]["content"], "18 C and sunny");
    for (i, step) in steps.iter().enumerate() {
        let Tokens::Engine(tokens) = &step.tokens else {
            panic!("step {i}: no engine tokens");
        };
        assert!(!tokens.completion_token_ids.is_empty(), "step {i}");
        assert_eq!(
            tokens.completion_logprobs.len(),
            tokens.completion_token_ids.len(),
            "step {i}: a logprob per sampled token"
        );
        assert_eq!(
            step.output.content.as_deref().unwrap_or_default(),
            session["texts"][i].as_str().unwrap_or_default(),
            "step {i}: the text the agent got is the text recorded"
        );
    }
    // vLLM's own count_tokens renders the first call's prompt as its Messages endpoint would;
    // the recorded prompt, rendered from the sidecar's translation, is as long. (Later prompts
    // differ on purpose: the random model writes a number for its tool arguments, which the
    // client gets as `{"arguments": "<number>"}` and the sidecar gives the engine back as the
    // number it wrote, where vLLM's own endpoint would render the wrapper the model never wrote.)
    let Tokens::Engine(first) = &steps[0].tokens else {
        unreachable!()
    };
    assert_eq!(
        first.prompt_token_ids.len() as u64,
        session["counted"].as_u64().expect("a count"),
        "the sidecar's translation renders another prompt than vLLM's own Messages endpoint"
    );
}

/// The parts of a message two servers agree on, whoever made the ids.
fn comparable(message: &Value) -> Value {
    let content: Vec<Value> = message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|block| {
            let mut block = block.clone();
            if let Some(block) = block.as_object_mut() {
                block.remove("id");
                block.remove("signature");
            }
            block
        })
        .collect();
    json!({"content": content, "stop_reason": message["stop_reason"],
           "input_tokens": message["usage"]["input_tokens"],
           "output_tokens": message["usage"]["output_tokens"]})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_through_the_sidecar_is_what_vllms_own_messages_endpoint_answers() {
    let _engine = super::share().await;
    let sidecar = sidecar().await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let tools = json!([{"name": "get_weather", "description": "Current weather for a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                         "required": ["city"]}}]);
    let post = |url: String, request: Value| {
        let client = client.clone();
        async move {
            let response = client
                .post(url)
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
                .json(&request)
                .send()
                .await
                .expect("an answer");
            let status = response.status();
            let body = response.text().await.expect("a body");
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<Value>(&body).expect("JSON")
        }
    };
    let vllm_url = &vllm::shared().url;
    for request in [
        json!({"model": MODEL, "max_tokens": 16, "temperature": 0, "system": "Be brief.",
               "messages": [{"role": "user", "content": "Tell me a story"}]}),
        json!({"model": MODEL, "max_tokens": 16, "temperature": 0, "stop_sequences": ["e"],
               "messages": [{"role": "user", "content": [{"type": "text", "text": "Go on"}]}]}),
    ] {
        let direct = post(format!("{vllm_url}/v1/messages"), request.clone()).await;
        let through = post(sidecar.url("/v1/messages"), request.clone()).await;
        assert_eq!(comparable(&through), comparable(&direct), "{request}");
        assert_eq!(through["type"], "message");
    }
    // A forced tool call. vLLM's own /v1/messages answers this one with a 400 (the random model
    // writes a number for the arguments, which its pydantic model refuses), so the reference is
    // vLLM's chat answer to the translated request: the same calls, the arguments kept whole.
    let request = json!({"model": MODEL, "max_tokens": 200, "temperature": 0, "tools": tools,
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "What's the weather in Oslo?"}]});
    let chat =
        clawback_sidecar::data_plane::anthropic::request::to_chat(&request).expect("translates");
    let direct = post(format!("{vllm_url}/v1/chat/completions"), chat).await;
    let through = post(sidecar.url("/v1/messages"), request).await;
    let calls: Vec<Value> = direct["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool calls")
        .iter()
        .map(|call| {
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            json!({"type": "tool_use", "name": call["function"]["name"],
                   "input": clawback_sidecar::data_plane::anthropic::response::tool_input(arguments)})
        })
        .collect();
    assert_eq!(comparable(&through)["content"], json!(calls));
    assert_eq!(through["stop_reason"], "tool_use");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_streams_tool_use_from_vllm_through_the_sidecar() {
    let _engine = super::share().await;
    let sidecar = sidecar().await;
    let dir = sdk_node_dir();
    let mut command = Command::new("node");
    command
        .arg(dir.join("anthropic_agent.mjs"))
        .current_dir(&dir);
    let cases = ["message", "stream_tool_use", "engine_error"];
    run(command, &sidecar, "the Anthropic TypeScript SDK", &cases).await;
}

/// Towards an upstream that speaks Messages itself (kind `anthropic`; here vLLM's own
/// `/v1/messages`, the one such server this machine can run) the call passes through unchanged
/// and is recorded text-only, as the chat messages it stands for.
#[tokio::test(flavor = "multi_thread")]
async fn towards_an_anthropic_upstream_messages_pass_through_and_are_recorded_as_text() {
    let _engine = super::share().await;
    let mut config = test_config(&[vllm::shared().url.clone()]);
    config.upstream_kind = UpstreamKind::Anthropic;
    let sidecar = Sidecar::start(config).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let request = |stream: bool, session: &str| {
        json!({"model": MODEL, "max_tokens": 12, "temperature": 0, "stream": stream,
               "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
               "metadata": {"session_id": session},
               "messages": [{"role": "user", "content": "Tell me a story"}]})
    };
    for (stream, session) in [(false, "passthrough-plain"), (true, "passthrough-stream")] {
        let send = |url: String| {
            let client = client.clone();
            let body = request(stream, session);
            async move {
                let response = client
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("an answer");
                assert_eq!(response.status(), 200);
                response.text().await.expect("a body")
            }
        };
        let direct = send(format!("{}/v1/messages", vllm::shared().url)).await;
        let through = send(sidecar.url("/v1/messages")).await;
        let ids = |text: &str| super::without_ids(text);
        if !stream {
            // A whole body passes byte for byte (ids aside); a stream's chunking may differ.
            assert_eq!(ids(&through), ids(&direct));
        }
        let text = |body: &str| -> String {
            if stream {
                body.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .filter_map(|e| e["delta"]["text"].as_str().map(str::to_owned))
                    .collect()
            } else {
                let message: Value = serde_json::from_str(body).expect("JSON");
                message["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }
        };
        assert_eq!(text(&through), text(&direct));
        let tenant = TenantId::new("default").expect("tenant");
        let mut step = None;
        for _ in 0..200 {
            for header in store
                .list_trajectories(&tenant, None, 100)
                .await
                .unwrap_or_default()
            {
                if header.metadata.get("session") == Some(&json!(session)) {
                    if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
                        step = record.steps.into_iter().next();
                    }
                }
            }
            if step.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let step = step.unwrap_or_else(|| panic!("{session}: no step"));
        assert_eq!(step.endpoint, clawback_datapool::Endpoint::Messages);
        assert_eq!(step.capture, Some(clawback_datapool::Capture::Text));
        assert!(matches!(step.tokens, Tokens::None));
        assert_eq!(
            step.request.messages,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Tell me a story"})
            ]
        );
        assert_eq!(step.output.content.unwrap_or_default(), text(&direct));
        assert_eq!(step.finish_reason.as_deref(), Some("length"), "{session}");
    }
}
