//! Every served call becomes a trajectory step in the datapool — with the engine's own token ids
//! and logprobs, whichever way the agent called — and trajectories complete, group and stay
//! within their tenant.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{
    CompletionReason, Consumer, ConsumerName, ReadyItem, Store, TenantId, Tokens, TrajectoryRecord,
    TrajectoryStatus,
};
use clawback_sidecar::config::Config;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::MockUpstream;
use serde_json::{json, Value};

use crate::support::{assert_openai_error, client, first_turn, poll, store, tool_result, tools};

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

/// Every stored trajectory of `tenant` with its steps, oldest first.
async fn records(store: &Arc<dyn Store>, tenant: &TenantId) -> Vec<TrajectoryRecord> {
    let mut out = Vec::new();
    for header in store.list_trajectories(tenant, None, 1000).await.unwrap() {
        if let Some(record) = store.trajectory(tenant, &header.id).await.unwrap() {
            out.push(record);
        }
    }
    out
}

/// The trajectory whose `session` metadata is `session`, once it is completed with `steps` steps.
async fn completed(
    store: &Arc<dyn Store>,
    tenant: &TenantId,
    session: &str,
    steps: usize,
) -> TrajectoryRecord {
    poll(
        &format!("trajectory {session} completed with {steps} steps"),
        || {
            let (store, tenant, session) = (Arc::clone(store), tenant.clone(), session.to_owned());
            async move {
                records(&store, &tenant).await.into_iter().find(|r| {
                    r.trajectory.metadata.get("session") == Some(&json!(session))
                        && r.trajectory.status == TrajectoryStatus::Completed
                        && r.steps.len() == steps
                })
            }
        },
    )
    .await
}

/// One chat call; returns the assistant message as the agent would append it to its history.
async fn chat(
    sidecar: &Sidecar,
    headers: &[(&str, &str)],
    messages: &[Value],
    stream: bool,
) -> Value {
    let mut request = client().post(sidecar.url("/v1/chat/completions"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = json!({"model": "mock-llama", "messages": messages, "tools": tools(),
                      "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }});
    let response = request.json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    // Whatever the sidecar asked the engine for, the agent gets none of it.
    assert!(!text.contains("\"prompt_token_ids\":["), "{text}");
    assert!(!text.contains("\"token_ids\":["), "{text}");
    assert!(!text.contains("\"logprob\":"), "{text}");
    if !stream {
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        return value["choices"][0]["message"].clone();
    }
    // Assemble the streamed message the way an SDK does.
    let (mut content, mut calls) = (String::new(), Vec::<Value>::new());
    for data in crate::support::sse_data(&bytes) {
        let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        let delta = &chunk["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap_or(0) as usize;
            if calls.len() <= i {
                calls.push(json!({"id": call["id"], "type": "function",
                                  "function": {"name": call["function"]["name"], "arguments": ""}}));
            }
            let args = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
                + call["function"]["arguments"].as_str().unwrap_or_default();
            calls[i]["function"]["arguments"] = json!(args);
        }
    }
    let mut message = json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    message
}

/// A two-turn tool-using session: the model calls the tool, gets its result, answers.
async fn tool_session(sidecar: &Sidecar, session: &str, stream: bool) {
    let mut messages = first_turn();
    let reply = chat(
        sidecar,
        &[("x-clawback-session", session)],
        &messages,
        stream,
    )
    .await;
    let call_id = reply["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    messages.push(reply);
    messages.push(tool_result(&call_id));
    chat(
        sidecar,
        &[("x-clawback-session", session), ("x-clawback-done", "true")],
        &messages,
        stream,
    )
    .await;
}

#[tokio::test]
async fn a_tool_using_session_is_recorded_identically_streamed_or_not() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    tool_session(&sidecar, "streamed", true).await;
    tool_session(&sidecar, "plain", false).await;

    let store = store(&sidecar);
    let default = tenant("default");
    let streamed = completed(&store, &default, "streamed", 2).await;
    let plain = completed(&store, &default, "plain", 2).await;
    assert_eq!(
        streamed.trajectory.completion,
        Some(CompletionReason::DoneHeader)
    );
    for (s, p) in streamed.steps.iter().zip(&plain.steps) {
        assert_eq!(s.output, p.output);
        assert_eq!(s.tokens, p.tokens);
        assert_eq!(s.finish_reason, p.finish_reason);
        assert_eq!(s.usage, p.usage);
        assert!(s.trainable && p.trainable);
    }

    // The engine's own ids and one logprob per id, EOS included on the text answer.
    let first = &plain.steps[0];
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        first.output.tool_calls[0]["function"]["name"],
        "get_weather"
    );
    let last = &plain.steps[1];
    let Tokens::Engine(tokens) = &last.tokens else {
        panic!("a vLLM step must carry engine tokens: {:?}", last.tokens)
    };
    assert!(!tokens.prompt_token_ids.is_empty());
    assert_eq!(
        tokens.completion_token_ids.last(),
        Some(&clawback_tests::engine_json::EOS_ID)
    );
    assert_eq!(
        tokens.completion_logprobs.len(),
        tokens.completion_token_ids.len()
    );
    assert_eq!(
        last.output.content.as_deref(),
        Some(clawback_tests::engine_json::ANSWER)
    );

    // The tool result the second call added is the first step's next state.
    let call_id = first.output.tool_calls[0]["id"].as_str().unwrap();
    let next = first
        .next_state
        .as_ref()
        .expect("first step has a next state");
    assert_eq!(next.messages, vec![tool_result(call_id)]);
    assert!(last.next_state.is_none());

    // Both trajectories are ready for a trainer.
    let consumer = Consumer::new(
        ConsumerName::new("trainers").unwrap(),
        ConsumerName::new("t1").unwrap(),
    );
    let ready = store.read_ready(&default, &consumer, 10).await.unwrap();
    let ids: Vec<ReadyItem> = ready.iter().map(|d| d.item).collect();
    assert!(ids.contains(&ReadyItem::Trajectory(streamed.trajectory.id)));
    assert!(ids.contains(&ReadyItem::Trajectory(plain.trajectory.id)));
}

#[tokio::test]
async fn an_idle_trajectory_is_completed_with_its_last_turn() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.recording.idle_timeout = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;
    chat(
        &sidecar,
        &[("x-clawback-session", "quiet")],
        &first_turn(),
        false,
    )
    .await;

    let record = completed(&store(&sidecar), &tenant("default"), "quiet", 1).await;
    assert_eq!(
        record.trajectory.completion,
        Some(CompletionReason::IdleTimeout)
    );
}

#[tokio::test]
async fn a_group_is_ready_when_all_rollouts_are_done_or_partial_after_its_timeout() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    // Long enough that a busy host's two calls of the full group always land within it: the
    // test asks which group is complete, not how fast the calls are.
    config.recording.group_timeout = Duration::from_secs(3);
    let sidecar = Sidecar::start(config).await;
    let store = store(&sidecar);
    let default = tenant("default");
    for rollout in ["r1", "r2"] {
        let headers = [
            ("x-clawback-session", rollout),
            ("x-clawback-group", "task-7"),
            ("x-clawback-group-size", "2"),
            ("x-clawback-done", "true"),
        ];
        chat(&sidecar, &headers, &first_turn(), false).await;
    }
    // A three-rollout group where one rollout never finishes.
    for rollout in ["s1", "s2"] {
        let headers = [
            ("x-clawback-session", rollout),
            ("x-clawback-group", "task-8"),
            ("x-clawback-group-size", "3"),
            ("x-clawback-done", "true"),
        ];
        chat(&sidecar, &headers, &first_turn(), false).await;
    }

    let consumer = Consumer::new(
        ConsumerName::new("trainers").unwrap(),
        ConsumerName::new("t1").unwrap(),
    );
    let groups = Arc::new(std::sync::Mutex::new(Vec::new()));
    poll("both groups delivered", || {
        let (store, default, consumer, groups) = (
            Arc::clone(&store),
            default.clone(),
            consumer.clone(),
            Arc::clone(&groups),
        );
        async move {
            for delivery in store.read_ready(&default, &consumer, 10).await.unwrap() {
                if let ReadyItem::Group(id) = delivery.item {
                    let group = store.group(&default, &id).await.unwrap().unwrap();
                    groups.lock().unwrap().push(group);
                }
            }
            (groups.lock().unwrap().len() == 2).then_some(())
        }
    })
    .await;
    let groups = groups.lock().unwrap().clone();
    let sizes: Vec<(u32, usize, clawback_datapool::GroupState)> = groups
        .iter()
        .map(|g| (g.size, g.finished.len(), g.state))
        .collect();
    assert!(
        sizes.contains(&(2, 2, clawback_datapool::GroupState::Ready)),
        "{sizes:?}"
    );
    assert!(
        sizes.contains(&(3, 2, clawback_datapool::GroupState::Partial)),
        "{sizes:?}"
    );
}

#[tokio::test]
async fn side_turns_are_recorded_but_not_for_training() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    let headers = [
        ("x-session-id", "oc-1"),
        ("x-turn-type", "side"),
        ("x-session-done", "true"),
    ];
    chat(&sidecar, &headers, &first_turn(), false).await;
    let record = completed(&store(&sidecar), &tenant("default"), "oc-1", 1).await;
    assert!(!record.steps[0].trainable);
}

fn two_tenants(engine: &MockUpstream) -> Config {
    let mut config = test_config(&[engine.url()]);
    config.tenants.default = None;
    config.tenants.keys = BTreeMap::from([
        (key_hash("sk-alpha-0123456789"), "alpha".to_owned()),
        (key_hash("sk-beta-0123456789"), "beta".to_owned()),
    ]);
    config
}

#[tokio::test]
async fn each_tenant_sees_only_its_own_trajectories_and_keys_are_never_stored() {
    let engine = MockUpstream::start().await;
    let config = two_tenants(&engine);
    let data_dir = config.data_dir.clone();
    let sidecar = Sidecar::start(config).await;

    let auth = |key: &str| format!("Bearer {key}");
    chat(
        &sidecar,
        &[
            ("authorization", &auth("sk-alpha-0123456789")),
            ("x-clawback-session", "same-name"),
            ("x-clawback-done", "true"),
        ],
        &first_turn(),
        false,
    )
    .await;
    chat(
        &sidecar,
        &[
            ("authorization", &auth("sk-beta-0123456789")),
            ("x-clawback-session", "same-name"),
            ("x-clawback-done", "true"),
        ],
        &first_turn(),
        false,
    )
    .await;
    let unknown = client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth("sk-nobody")
        .json(&json!({"model": "m", "messages": first_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
    assert_openai_error(&unknown.json().await.unwrap(), "invalid_api_key");

    let store = store(&sidecar);
    let alpha = completed(&store, &tenant("alpha"), "same-name", 1).await;
    let beta = completed(&store, &tenant("beta"), "same-name", 1).await;
    assert_ne!(
        alpha.trajectory.id, beta.trajectory.id,
        "two tenants were joined"
    );
    assert!(store
        .trajectory(&tenant("beta"), &alpha.trajectory.id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(records(&store, &tenant("alpha")).await.len(), 1);

    // Nothing on disk (the journal included) holds an API key.
    for file in files_under(&data_dir) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        assert!(
            !text.contains("sk-alpha") && !text.contains("sk-beta"),
            "{file:?}"
        );
    }
}

#[tokio::test]
async fn the_handshake_api_opens_completes_and_shows_a_trajectory() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.admin.token = Some("admin-secret".to_owned());
    let sidecar = Sidecar::start(config).await;
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth("admin-secret");

    let refused = client()
        .post(sidecar.url("/trajectories"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    let created: Value = admin(client().post(sidecar.url("/trajectories")))
        .json(&json!({"metadata": {"task": "weather"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["trajectory_id"].as_str().unwrap().to_owned();
    let base_url = created["base_url"].as_str().unwrap().to_owned();
    assert!(base_url.ends_with(&format!("/s/{id}/v1")), "{base_url}");

    // The agent uses the base_url it was given.
    let answer = client()
        .post(format!("{base_url}/chat/completions"))
        .json(&json!({"model": "mock-llama", "messages": first_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();

    let completed_reply =
        admin(client().post(sidecar.url(&format!("/trajectories/{id}/complete"))))
            .json(&json!({"reward": 1.0}))
            .send()
            .await
            .unwrap();
    assert_eq!(completed_reply.status(), 200);

    let shown = poll("the completed trajectory with its step and reward", || {
        let url = sidecar.url(&format!("/trajectories/{id}"));
        async move {
            let response = client()
                .get(url)
                .bearer_auth("admin-secret")
                .send()
                .await
                .ok()?;
            let shown: Value = response.json().await.ok()?;
            let ready = shown["trajectory"]["status"] == "completed"
                && shown["steps"].as_array().is_some_and(|s| s.len() == 1)
                && shown["evaluations"]
                    .as_array()
                    .is_some_and(|e| e.len() == 1);
            ready.then_some(shown)
        }
    })
    .await;
    assert_eq!(shown["trajectory"]["metadata"]["task"], "weather");
    assert_eq!(shown["evaluations"][0]["reward"], 1.0);

    let unknown =
        admin(client().get(sidecar.url("/trajectories/0192f6a0-0000-7000-8000-000000000000")))
            .send()
            .await
            .unwrap();
    assert_eq!(unknown.status(), 404);
    let unknown = admin(
        client().post(sidecar.url("/trajectories/0192f6a0-0000-7000-8000-000000000000/complete")),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(unknown.status(), 404);
}

/// Every step of `tenant`, grouped by trajectory, once there are `steps` of them and every step
/// that another followed has its next state (the recorder writes a next state after the steps of
/// its round, so the steps alone can be seen before it).
async fn steps_by_trajectory(
    store: &Arc<dyn Store>,
    tenant: &TenantId,
    steps: usize,
) -> Vec<TrajectoryRecord> {
    poll(&format!("{steps} steps stored"), || {
        let (store, tenant) = (Arc::clone(store), tenant.clone());
        async move {
            let all = records(&store, &tenant).await;
            let stored: usize = all.iter().map(|r| r.steps.len()).sum();
            let settled = all.iter().all(|r| {
                let followed = &r.steps[..r.steps.len().saturating_sub(1)];
                followed.iter().all(|s| s.next_state.is_some())
            });
            (stored == steps && settled).then_some(all)
        }
    })
    .await
}

#[tokio::test]
async fn a_session_without_ids_is_stitched_from_its_re_encoded_history() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    let mut messages = first_turn();
    let reply = chat(&sidecar, &[], &messages, true).await;
    // The client re-serialises its history: arguments re-encoded, the id normalised, text as parts.
    let call = &reply["tool_calls"][0];
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let id: String = call["id"]
        .as_str()
        .unwrap()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    messages[1] = json!({"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris?"}]});
    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [{
        "id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": serde_json::to_string_pretty(&arguments).unwrap()}
    }]}));
    messages.push(tool_result(&id));
    chat(&sidecar, &[], &messages, false).await;

    let stored = steps_by_trajectory(&store(&sidecar), &tenant("default"), 2).await;
    assert_eq!(stored.len(), 1, "the two calls were not joined");
    let steps = &stored[0].steps;
    assert_eq!(
        steps[0].next_state.as_ref().unwrap().messages,
        vec![tool_result(&id)]
    );
}

#[tokio::test]
async fn look_alike_sessions_are_never_joined() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    // Two rollouts of the same task: identical first calls get identical replies.
    let first_a = chat(&sidecar, &[], &first_turn(), false).await;
    let first_b = chat(&sidecar, &[], &first_turn(), false).await;
    for (reply, result) in [(first_a, "sunny"), (first_b, "raining")] {
        let mut messages = first_turn();
        let id = reply["tool_calls"][0]["id"].as_str().unwrap().to_owned();
        messages.push(reply);
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        chat(&sidecar, &[], &messages, false).await;
    }

    let stored = steps_by_trajectory(&store(&sidecar), &tenant("default"), 4).await;
    // Which continuation belongs to which rollout is undecidable: none is guessed.
    assert_eq!(
        stored.len(),
        4,
        "{:?}",
        stored.iter().map(|r| r.steps.len()).collect::<Vec<_>>()
    );
    assert!(stored.iter().all(|r| r.steps.len() == 1));
}

/// Replaces what differs between runs — ids and clock readings — with stable stand-ins, so a
/// recording can be compared with the committed one.
fn normalise(value: &mut Value, ids: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                if key.ends_with("_at") && item.is_u64() {
                    *item = json!(1_764_400_000_000_u64);
                } else {
                    normalise(item, ids);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalise(v, ids)),
        Value::String(s)
            if s.len() == 36
                && s.as_bytes().get(14) == Some(&b'7')
                && s.matches('-').count() == 4 =>
        {
            let n = ids.iter().position(|id| id == s).unwrap_or_else(|| {
                ids.push(s.clone());
                ids.len() - 1
            });
            *s = format!("0193a8f0-0000-7000-8000-{:012x}", n + 1);
        }
        _ => {}
    }
}

/// `datapool/examples/recorded-trajectory.json` is a real recording: this records the same
/// session again and compares. `CLAWBACK_BLESS=1` rewrites the file after a deliberate change.
#[tokio::test]
async fn the_documented_recording_is_what_the_sidecar_records() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    tool_session(&sidecar, "weather-run", true).await;
    let record = completed(&store(&sidecar), &tenant("default"), "weather-run", 2).await;
    let mut value = serde_json::to_value(&record).unwrap();
    normalise(&mut value, &mut Vec::new());
    for step in value["steps"].as_array_mut().into_iter().flatten() {
        step["upstream"]["name"] = json!("vllm-0:8000");
    }
    let recorded = serde_json::to_string_pretty(&value).unwrap() + "\n";

    let path =
        clawback_tests::harness::repo_root().join("datapool/examples/recorded-trajectory.json");
    if std::env::var_os("CLAWBACK_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &recorded).unwrap();
    }
    let documented = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        documented, recorded,
        "run with CLAWBACK_BLESS=1 after a deliberate change"
    );
}

#[tokio::test]
async fn redaction_rules_scrub_secrets_before_they_are_stored() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.recording.redact = vec![clawback_sidecar::config::Redaction {
        pattern: r"sk-live-[A-Za-z0-9]{8,}".to_owned(),
        replacement: "[REDACTED]".to_owned(),
    }];
    let data_dir = config.data_dir.clone();
    let sidecar = Sidecar::start(config).await;
    let messages =
        vec![json!({"role": "user", "content": "my key is sk-live-abcdef123456, keep it"})];
    chat(
        &sidecar,
        &[
            ("x-clawback-session", "secretive"),
            ("x-clawback-done", "true"),
        ],
        &messages,
        false,
    )
    .await;

    let record = completed(&store(&sidecar), &tenant("default"), "secretive", 1).await;
    assert_eq!(
        record.steps[0].request.messages[0]["content"],
        "my key is [REDACTED], keep it"
    );
    // The engine still got the real text: redaction is about storage only.
    assert!(String::from_utf8_lossy(&engine.received()[0].body).contains("sk-live-abcdef123456"));
    // Nor in any file the sidecar keeps: the journal holds the redacted step too.
    for file in files_under(&data_dir) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("sk-live-abcdef"),
            "{file:?}"
        );
    }
}

#[tokio::test]
async fn a_session_key_from_the_handshake_puts_every_call_in_its_trajectory_and_tenant() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.admin.token = Some("admin-secret".to_owned());
    config.tenants.default = None;
    config.tenants.keys.insert(
        clawback_sidecar::data_plane::tenant::key_hash("sk-acme"),
        "acme".to_owned(),
    );
    let sidecar = Sidecar::start(config).await;
    let created: Value = client()
        .post(sidecar.url("/trajectories"))
        .bearer_auth("admin-secret")
        .json(&json!({"tenant": "acme", "session_key": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["trajectory_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();

    // Two unrelated conversations, sent as an agent that only takes a key would send them, one
    // with a header naming another session: the key wins.
    for (i, header) in [None, Some("another-session")].into_iter().enumerate() {
        let mut call = client()
            .post(sidecar.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({"model": "mock-llama",
                          "messages": [{"role": "user", "content": format!("question {i}")}]}));
        if let Some(header) = header {
            call = call.header("x-clawback-session", header);
        }
        let answer = call.send().await.unwrap();
        assert_eq!(answer.status(), 200);
        answer.bytes().await.unwrap();
    }
    // As `x-api-key` (an Anthropic client) too.
    let answer = client()
        .post(sidecar.url("/v1/messages"))
        .header("x-api-key", &key)
        .json(&json!({"model": "mock-llama", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "question 2"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();
    // Beside the tenant's own key, which decides the call (a trajectory of its own): the
    // session key is not forwarded either.
    let answer = client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth("sk-acme")
        .header("x-api-key", &key)
        .header("api-key", &key)
        .json(&json!({"model": "mock-llama",
                      "messages": [{"role": "user", "content": "question 3"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();

    let store = store(&sidecar);
    let tenant = TenantId::new("acme").unwrap();
    let trajectory: clawback_datapool::TrajectoryId = id.parse().unwrap();
    let record = poll("three steps in the key's trajectory", || {
        let store = Arc::clone(&store);
        let tenant = tenant.clone();
        async move {
            let record = store.trajectory(&tenant, &trajectory).await.ok()??;
            (record.steps.len() == 3).then_some(record)
        }
    })
    .await;
    assert_eq!(record.trajectory.tenant, tenant);
    // The engine never saw the session key.
    for received in engine.received() {
        for name in ["authorization", "x-api-key", "api-key"] {
            let value = received.headers.get(name).and_then(|v| v.to_str().ok());
            assert!(
                !value.is_some_and(|v| v.contains(&key)),
                "the session key reached the engine in {name}"
            );
        }
    }
    // The key ends with its trajectory: completed through the admin API (how a key is
    // revoked), it is refused.
    let done = client()
        .post(sidecar.url(&format!("/trajectories/{id}/complete")))
        .bearer_auth("admin-secret")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    let ended = client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": "mock-llama", "messages": first_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 401);
    assert_openai_error(&ended.json().await.unwrap(), "session_key_ended");
    // A key nobody minted is an unknown key.
    let unknown = client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth(format!("{key}0"))
        .json(&json!({"model": "mock-llama", "messages": first_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
}

#[tokio::test]
async fn readyz_shows_the_capture_level_and_what_a_trainer_must_know() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.upstream_kind = clawback_sidecar::config::UpstreamKind::Vllm;
    let sidecar = Sidecar::start(config).await;
    // A whole task in one model call, its trajectory closed by the done header.
    let answer = client()
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-done", "true")
        .json(&json!({"model": "mock-llama", "messages": first_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();
    let ready = poll("the finding at /readyz", || {
        let url = sidecar.url("/readyz");
        async move {
            let ready: Value = client().get(url).send().await.ok()?.json().await.ok()?;
            (ready["capture"]["findings"]["single_call_task"] == 1).then_some(ready)
        }
    })
    .await;
    assert_eq!(ready["capture"]["expected"], "tokens");
    assert_eq!(ready["capture"]["steps"]["tokens"], 1, "{ready}");
    assert_eq!(
        ready["capture"]["findings"]["trainable_without_logprobs"],
        0
    );
    // /readyz counts a step when it is recorded; the store has it once the writer wrote it.
    let store = store(&sidecar);
    let record = poll("the completed trajectory in the store", || {
        let store = Arc::clone(&store);
        async move {
            records(&store, &tenant("default"))
                .await
                .into_iter()
                .find(|r| r.trajectory.status == TrajectoryStatus::Completed && !r.steps.is_empty())
        }
    })
    .await;
    assert_eq!(
        record.steps[0].capture,
        Some(clawback_datapool::Capture::Tokens)
    );
    let metrics = client()
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("clawback_capture_findings_total{finding=\"single_call_task\"} 1"));
}

#[tokio::test]
async fn a_full_recorder_queue_spills_to_its_journal_and_loses_no_served_call() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    // A queue of one: nearly every write finds it full.
    config.recording.queue_capacity = 1;
    let sidecar = Sidecar::start(config).await;
    let calls = 200;
    let mut served = 0;
    for wave in 0..(calls / 25) {
        let answers = futures_util::future::join_all((0..25).map(|i| {
            let url = sidecar.url("/v1/chat/completions");
            async move {
                client()
                    .post(url)
                    .header("x-clawback-done", "true")
                    .json(&json!({"model": "mock-llama", "messages": [
                        {"role": "user", "content": format!("burst {wave}-{i}")}]}))
                    .send()
                    .await
                    .ok()?
                    .bytes()
                    .await
                    .ok()
            }
        }))
        .await;
        served += answers.iter().filter(|a| a.is_some()).count();
    }
    assert_eq!(served, calls);
    let store = store(&sidecar);
    let tenant = TenantId::new("default").unwrap();
    let stored = steps_by_trajectory(&store, &tenant, calls).await;
    assert_eq!(stored.len(), calls, "one trajectory per call");
    let metrics = client()
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(value("clawback_records_dropped_total"), 0.0, "{metrics}");
    assert!(
        value("clawback_records_spilled_total") > 0.0,
        "the queue never filled: the test tested nothing"
    );
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}
