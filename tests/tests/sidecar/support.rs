//! What the tests share: an OpenClaw-like request, the weather conversation, and small client
//! and datapool helpers.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::Store;
use clawback_tests::harness::Sidecar;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// A chat request shaped like OpenClaw's: streaming, a dozen tools, `tool_choice`,
/// `max_completion_tokens`, `stream_options` and a long system prompt — about 35 kB.
pub fn openclaw_request() -> Value {
    let tool = |name: &str, description: &str| {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Absolute or workspace-relative path."},
                        "content": {"type": "string", "description": "Text to write; UTF-8."},
                        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000},
                        "flags": {"type": "array", "items": {"type": "string", "enum": ["-r", "-f", "-n"]}}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }
            }
        })
    };
    let names = [
        "read",
        "write",
        "edit",
        "exec",
        "process",
        "browser",
        "web_search",
        "web_fetch",
        "memory_search",
        "memory_get",
        "sessions_send",
        "cron",
    ];
    let tools: Vec<Value> = names
        .iter()
        .map(|n| {
            tool(
                n,
                &format!(
                    "{n}: {}",
                    "Use this tool when the task requires it. ".repeat(12)
                ),
            )
        })
        .collect();
    let system = format!(
        "You are a personal assistant running inside OpenClaw.\n## Tooling\n{}\n## Workspace\n{}",
        "Tool availability (filtered by policy): read, write, edit, exec. ".repeat(120),
        "Your working directory is /home/agent/workspace. Treat it as the single global workspace. "
            .repeat(120)
    );
    json!({
        "model": "mock-llama",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris? Use the tool."}]}
        ],
        "tools": tools,
        "tool_choice": "auto",
        "max_completion_tokens": 8192,
        "stream": true,
        "stream_options": {"include_usage": true},
        "store": false
    })
}

pub fn chat_request(stream: bool) -> Value {
    json!({
        "model": "mock-llama",
        "messages": [{"role": "user", "content": "Say something about Paris."}],
        "stream": stream
    })
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client builds")
}

/// A small chat call through `sidecar`, streamed or not.
pub async fn post_chat(sidecar: &Sidecar, stream: bool) -> reqwest::Response {
    client()
        .post(sidecar.url("/v1/chat/completions"))
        .json(&chat_request(stream))
        .send()
        .await
        .expect("the sidecar answers")
}

/// Body chunks as the client received them, with their arrival times.
pub async fn read_chunks(response: reqwest::Response) -> Vec<(Instant, bytes::Bytes)> {
    let mut stream = response.bytes_stream();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.next().await {
        chunks.push((Instant::now(), chunk.expect("body chunk")));
    }
    chunks
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|line| line.strip_prefix("data: "))
                .map(str::to_owned)
        })
        .collect()
}

/// Polls `check` until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

pub fn assert_openai_error(body: &Value, code: &str) {
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["code"], code, "{body}");
}

// The weather conversation the recording and viewer tests replay: the tool offered, the first
// turn, and the tool's result.
const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]"#;

pub fn tools() -> Value {
    serde_json::from_str(TOOLS).unwrap_or_default()
}

pub fn first_turn() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a weather assistant."}),
        json!({"role": "user", "content": "What's the weather in Paris?"}),
    ]
}

pub fn tool_result(call_id: &str) -> Value {
    json!({"role": "tool", "tool_call_id": call_id, "content": "{\"temp_c\": 21, \"sky\": \"sunny\"}"})
}

/// The datapool `sidecar` records into.
pub fn store(sidecar: &Sidecar) -> Arc<dyn Store> {
    Arc::clone(
        sidecar
            .app
            .recorder
            .as_ref()
            .expect("recording is on")
            .store(),
    )
}

/// Polls `attempt` until it yields a value; panics naming `what` after ten seconds.
pub async fn poll<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Serves tenants `alpha` (`sk-alpha`) and `bravo` (`sk-bravo`) only: no default tenant.
pub fn alpha_and_bravo(config: &mut clawback_sidecar::config::Config) {
    config.tenants.default = None;
    for (key, tenant) in [("sk-alpha", "alpha"), ("sk-bravo", "bravo")] {
        config.tenants.keys.insert(
            clawback_sidecar::data_plane::tenant::key_hash(key),
            tenant.to_owned(),
        );
    }
}
