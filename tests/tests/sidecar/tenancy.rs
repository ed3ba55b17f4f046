//! Tenant boundaries against a hostile agent: each test replays an attack a tenant's agent could
//! make with its own API key and shows it fail — engine control routes, other tenants' adapters,
//! a model list that gives paths away, unknown keys, requests that trip upstream health, orphaned
//! calls beyond the cap, silent connections, and answers too large to hold.

use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId, TrajectoryRecord};
use clawback_sidecar::config::{Config, Overrides};
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, Hold, MockUpstream};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{assert_openai_error, client, eventually, poll, post_chat, store};

pub(crate) const ALPHA_KEY: &str = "sk-alpha-0123456789";
pub(crate) const BRAVO_KEY: &str = "sk-bravo-0123456789";

/// Two tenants with keys, routing on with `mock-llama` as the base model, unknown keys refused.
pub(crate) fn two_tenants(engine: &MockUpstream) -> Config {
    let mut config = test_config(&[engine.url()]);
    config
        .tenants
        .keys
        .insert(key_hash(ALPHA_KEY), "alpha".to_owned());
    config
        .tenants
        .keys
        .insert(key_hash(BRAVO_KEY), "bravo".to_owned());
    config.tenants.default = None;
    config.routing.base_model = Some("mock-llama".to_owned());
    config.routing.poll_interval = Duration::from_millis(50);
    config.upstream_api_key = Some("sidecar-own-engine-credential".to_owned());
    config
}

async fn chat_as(sidecar: &Sidecar, key: &str, model: &str) -> reqwest::Response {
    client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-clawback-done", "true")
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("the sidecar answers")
}

#[tokio::test]
async fn an_agent_cannot_reach_the_engines_adapter_or_weight_routes() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(two_tenants(&engine)).await;
    let lora = json!({"lora_name": "bravo@v1", "lora_path": "/tmp/attacker"});
    for (path, code) in [
        ("/v1/load_lora_adapter", "engine_control_route"),
        ("/v1/unload_lora_adapter", "engine_control_route"),
        ("/s/sess-1/v1/load_lora_adapter", "engine_control_route"),
        ("/v1/update_weights_from_disk", "engine_control_route"),
        ("/v1/reset_prefix_cache", "engine_control_route"),
        // Percent-escapes an engine would decode into another route match nothing allowed.
        ("/v1/load%5Flora_adapter", "engine_control_route"),
        ("/v1/chat%2Fcompletions", "not_agent_api"),
        ("/v1/files", "not_agent_api"),
        // vLLM's and SGLang's routes outside /v1 are no agent routes at all.
        ("/load_lora_adapter", "not_found"),
        ("/update_weights_from_disk", "not_found"),
        ("/reset_prefix_cache", "not_found"),
        ("/sleep", "not_found"),
        ("/pause_generation", "not_found"),
    ] {
        for key in [Some(ALPHA_KEY), None] {
            let mut request = client().post(sidecar.url(path)).json(&lora);
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await.unwrap();
            let status = response.status();
            assert!(status == 403 || status == 404, "{path}: {status}");
            assert_openai_error(&response.json().await.unwrap(), code);
        }
    }
    assert_eq!(
        engine.request_count(),
        0,
        "nothing reached the engine, least of all with the sidecar's credential"
    );
}

#[tokio::test]
async fn a_tenant_is_served_only_its_own_adapters_and_records_the_one_it_named() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(two_tenants(&engine)).await;
    for model in ["bravo@v1", "gpt-4o"] {
        let refused = chat_as(&sidecar, ALPHA_KEY, model).await;
        assert_eq!(refused.status(), 404, "{model}");
        assert_openai_error(&refused.json().await.unwrap(), "model_not_found");
    }
    assert_eq!(engine.request_count(), 0);

    let own = chat_as(&sidecar, ALPHA_KEY, "alpha@v1").await;
    assert_eq!(own.status(), 200);
    let sent: Value = serde_json::from_slice(&engine.received()[0].body).unwrap();
    assert_eq!(sent["model"], "alpha@v1");
    let alpha = TenantId::new("alpha").unwrap();
    let record = one_record(&store(&sidecar), &alpha).await;
    let policy = record.steps[0]
        .policy
        .as_ref()
        .expect("the step names its policy");
    assert_eq!((policy.adapter.as_str(), policy.version), ("alpha@v1", 1));
}

#[tokio::test]
async fn another_tenants_adapter_is_refused_with_routing_and_recording_off() {
    let engine = MockUpstream::start().await;
    let mut config = two_tenants(&engine);
    config.routing.base_model = None;
    config.recording.enabled = false;
    let sidecar = Sidecar::start(config).await;
    let refused = chat_as(&sidecar, ALPHA_KEY, "bravo@v3").await;
    assert_eq!(refused.status(), 404);
    assert_eq!(
        chat_as(&sidecar, ALPHA_KEY, "mock-llama").await.status(),
        200
    );
    assert_eq!(engine.request_count(), 1);
}

#[tokio::test]
async fn the_model_list_shows_a_tenant_what_it_may_call_and_no_paths() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        loaded_adapters: vec!["alpha@v2".to_owned(), "bravo@v1".to_owned()],
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(two_tenants(&engine)).await;
    let list: Value = client()
        .get(sidecar.url("/v1/models"))
        .bearer_auth(ALPHA_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .expect("a model list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["mock-llama", "alpha@v2"]);
    let text = list.to_string();
    assert!(
        !text.contains("/var/lib") && !text.contains("/models/"),
        "{text}"
    );
}

#[tokio::test]
async fn with_the_default_tenant_off_unknown_keys_get_401() {
    let engine = MockUpstream::start().await;
    let mut base = test_config(&[engine.url()]);
    base.recording.enabled = false;
    // The documented way: `tenants.default = false` in the file, env or --set.
    let overrides = Overrides {
        set: vec![
            "tenants.default=false".to_owned(),
            format!("upstreams=[\"{}\"]", engine.url()),
            "recording.enabled=false".to_owned(),
            "listen=\"127.0.0.1:0\"".to_owned(),
        ],
        ..Overrides::default()
    };
    let loaded = Config::load(None, &overrides).expect("config loads");
    assert_eq!(loaded.tenants.default, None);
    let config = Config {
        tenants: loaded.tenants,
        ..base
    };
    let sidecar = Sidecar::start(config).await;
    for key in [Some("sk-nobody"), None] {
        let mut request = client()
            .post(sidecar.url("/v1/chat/completions"))
            .json(&json!({"model": "mock-llama", "messages": []}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401);
        assert_openai_error(&response.json().await.unwrap(), "invalid_api_key");
    }
    assert_eq!(engine.request_count(), 0);
}

#[tokio::test]
async fn requests_that_make_the_engine_fail_eject_no_one() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.health.eject_after_5xx = 3;
    let sidecar = Sidecar::start(config).await;
    // An input that breaks the engine: vLLM answers 500, 400 or 422. Many times over.
    for status in [500, 500, 500, 400, 422, 500] {
        engine.set_behaviour(Behaviour {
            fail_with: Some(status),
            ..Behaviour::default()
        });
        assert_eq!(post_chat(&sidecar, false).await.status(), status);
    }
    engine.set_behaviour(Behaviour::default());
    assert_eq!(sidecar.app.pool.healthy_count(), 1);
    assert_eq!(post_chat(&sidecar, false).await.status(), 200);
    let ready = client().get(sidecar.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn with_the_only_engine_ejected_for_failures_calls_still_reach_it() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        fail_with: Some(503),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.health.eject_after_5xx = 2;
    config.health.ejection = Duration::from_secs(60);
    let sidecar = Sidecar::start(config).await;
    for _ in 0..2 {
        assert_eq!(post_chat(&sidecar, false).await.status(), 503);
    }
    assert_eq!(sidecar.app.pool.healthy_count(), 0);
    engine.set_behaviour(Behaviour::default());
    // Panic mode: ejected, but the last one left, so it still serves.
    assert_eq!(post_chat(&sidecar, false).await.status(), 200);
    let ready: Value = client()
        .get(sidecar.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "panic_mode");
}

/// Starts a streamed call and leaves after its first bytes; the engine holds the rest.
async fn leave_after_first_bytes(sidecar: &Sidecar) {
    leave_after_first_bytes_as(sidecar, None).await;
}

/// [`leave_after_first_bytes`], with a tenant's API key.
async fn leave_after_first_bytes_as(sidecar: &Sidecar, key: Option<&str>) {
    let mut call = client().post(sidecar.url("/v1/chat/completions"));
    if let Some(key) = key {
        call = call.bearer_auth(key);
    }
    let response = call
        .json(&json!({"model": "mock-llama", "stream": true,
                      "messages": [{"role": "user", "content": "a long story"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    use futures_util::StreamExt;
    let _ = body.next().await;
    drop(body);
}

#[tokio::test]
async fn orphaned_calls_hold_their_concurrency_permit_and_have_a_cap_of_their_own() {
    let engine = MockUpstream::start().await;
    let hold = Hold::after_chunks(1);
    engine.set_behaviour(Behaviour {
        hold: Some(hold.clone()),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.limits.max_concurrent_requests = 2;
    config.limits.max_orphaned_calls = 1;
    let sidecar = Sidecar::start(config).await;
    for _ in 0..2 {
        leave_after_first_bytes(&sidecar).await;
    }
    // Two clients gone while the engine is silent: one orphan drains, the other was cut off.
    let metrics = &sidecar.app.metrics;
    assert!(eventually(Duration::from_secs(5), || metrics.orphans_cut.get() == 1).await);
    assert!(
        eventually(Duration::from_secs(5), || metrics.orphaned_streams.get()
            == 1)
        .await
    );
    // The orphan holds one of the two permits: one call that stays takes the other...
    let staying = client()
        .post(sidecar.url("/v1/chat/completions"))
        .json(&json!({"model": "mock-llama", "stream": true,
                      "messages": [{"role": "user", "content": "stay"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(staying.status(), 200);
    // ...and the next is shed.
    let shed = post_chat(&sidecar, false).await;
    assert_eq!(
        shed.status(),
        503,
        "the orphan still counts against the cap"
    );
    hold.release();
    let _ = staying.bytes().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || engine.completed() >= 2).await,
        "the orphan and the call that stayed were read to their end"
    );
    poll("a permit back", || async {
        let response = post_chat(&sidecar, false).await;
        (response.status() == 200).then_some(())
    })
    .await;
}

/// One tenant's abandoned calls take its own share of the orphans' places only: another
/// tenant's orphan still drains (and is recorded).
#[tokio::test]
async fn one_tenants_orphans_leave_the_others_their_share() {
    let engine = MockUpstream::start().await;
    let hold = Hold::after_chunks(1);
    engine.set_behaviour(Behaviour {
        hold: Some(hold.clone()),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.limits.max_orphaned_calls = 2;
    crate::support::alpha_and_bravo(&mut config);
    let sidecar = Sidecar::start(config).await;
    let metrics = &sidecar.app.metrics;
    for _ in 0..2 {
        leave_after_first_bytes_as(&sidecar, Some("sk-alpha")).await;
    }
    assert!(eventually(Duration::from_secs(5), || metrics.orphans_cut.get() == 1).await);
    leave_after_first_bytes_as(&sidecar, Some("sk-bravo")).await;
    assert!(
        eventually(Duration::from_secs(5), || metrics.orphaned_streams.get()
            == 2)
        .await,
        "bravo's orphan drains beside alpha's one"
    );
    assert_eq!(metrics.orphans_cut.get(), 1);
    hold.release();
}

/// Sockets opened and left idle up to the connection cap, and reopened as they are closed, do
/// not lock health checks (or anyone) out: at the cap the idlest connection makes room.
#[tokio::test]
async fn idle_sockets_at_the_connection_cap_make_room_for_health_checks() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_connections = 16;
    config.timeouts.header_read = Duration::from_secs(30);
    let sidecar = Sidecar::start(config).await;
    let addr = sidecar.addr;
    // The attacker keeps 16 idle sockets open, reopening each one the sidecar closes.
    let attack = tokio::spawn(async move {
        let mut sockets = Vec::new();
        loop {
            sockets.retain(|s: &tokio::net::TcpStream| {
                let mut buf = [0u8; 1];
                !matches!(s.try_read(&mut buf), Ok(0))
            });
            while sockets.len() < 16 {
                match tokio::net::TcpStream::connect(addr).await {
                    Ok(socket) => sockets.push(socket),
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..9 {
        let answer = health.get(sidecar.url("/healthz")).send().await;
        assert_eq!(answer.map(|a| a.status().as_u16()).ok(), Some(200));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    attack.abort();
}

#[tokio::test]
async fn connections_that_send_no_request_are_closed_after_header_read() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.timeouts.header_read = Duration::from_millis(300);
    config.timeouts.idle_connection = Duration::from_millis(600);
    let sidecar = Sidecar::start(config).await;
    let closed_within = |mut socket: tokio::net::TcpStream| async move {
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => continue,
                }
            }
        });
        read.await.unwrap_or(false)
    };
    // Nothing at all.
    let silent = tokio::net::TcpStream::connect(sidecar.addr).await.unwrap();
    assert!(closed_within(silent).await, "a silent connection was kept");
    // Only the h2 preface and an empty SETTINGS frame.
    let mut preface = tokio::net::TcpStream::connect(sidecar.addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_within(preface).await,
        "an h2 preface held a connection"
    );
    // A keep-alive connection after its request: closed once idle.
    let mut idle = tokio::net::TcpStream::connect(sidecar.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(idle).await, "an idle connection was kept");
    // The sidecar still serves.
    assert_eq!(post_chat(&sidecar, false).await.status(), 200);
}

/// The one trajectory of `tenant`, once it has a step.
async fn one_record(store: &Arc<dyn Store>, tenant: &TenantId) -> TrajectoryRecord {
    poll("a recorded step", || async {
        let headers = store.list_trajectories(tenant, None, 10).await.ok()?;
        let record = store
            .trajectory(tenant, &headers.first()?.id)
            .await
            .ok()??;
        (!record.steps.is_empty()).then_some(record)
    })
    .await
}

#[tokio::test]
async fn an_answer_over_the_step_cap_reaches_the_agent_whole_and_is_stored_truncated() {
    // About 1 MB in 1,000 tokens of 1,000 bytes; the cap is 64 kB.
    let answer = format!("{} ", "x".repeat(999)).repeat(1000);
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        answer_text: Some(answer.clone()),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.recording.max_step_bytes = 64 << 10;
    // The sidecar asks vLLM for token ids and logprobs: they must not reach the agent.
    config.upstream_kind = clawback_sidecar::config::UpstreamKind::Vllm;
    let sidecar = Sidecar::start(config).await;
    let tenant = TenantId::new("default").unwrap();

    for stream in [false, true] {
        let response = client()
            .post(sidecar.url("/v1/chat/completions"))
            .header("x-clawback-session", format!("big-{stream}"))
            .json(&json!({"model": "mock-llama", "stream": stream,
                          "messages": [{"role": "user", "content": "say a lot"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.unwrap();
        let received: String = if stream {
            crate::support::sse_data(&body)
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|c| {
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect()
        } else {
            // Past the cap a plain body is no longer held; what the sidecar asked for is still
            // taken out as it streams past: the agent gets what it would have unasked.
            let json: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["prompt_token_ids"], Value::Null);
            assert_eq!(json["choices"][0]["token_ids"], Value::Null);
            assert_eq!(json["choices"][0]["logprobs"], Value::Null);
            assert!(body.len() < answer.len() + 4096, "{} bytes", body.len());
            json["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(received.len(), answer.len(), "stream={stream}");
    }
    let store = store(&sidecar);
    let steps = poll("both steps", || async {
        let headers = store.list_trajectories(&tenant, None, 10).await.ok()?;
        let mut steps = Vec::new();
        for header in headers {
            steps.extend(store.trajectory(&tenant, &header.id).await.ok()??.steps);
        }
        (steps.len() == 2).then_some(steps)
    })
    .await;
    for step in steps {
        assert!(step.truncated, "step {} is flagged", step.index);
        assert!(!step.trainable);
        assert_eq!(step.tokens, clawback_datapool::Tokens::None);
        let stored = step.output.content.as_deref().unwrap_or_default().len();
        assert!(stored <= 64 << 10, "{stored} bytes stored");
    }
}

#[tokio::test]
async fn a_secret_is_redacted_from_every_stored_field_and_takes_the_tokens_with_it() {
    const SECRET: &str = "sk-live-0123456789abcdef";
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        answer_text: Some(format!("Your key is {SECRET}, keep it safe.")),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.recording.redact = vec![clawback_sidecar::config::Redaction {
        pattern: r"sk-live-[0-9a-f]{16}".to_owned(),
        replacement: "[REDACTED]".to_owned(),
    }];
    let sidecar = Sidecar::start(config).await;
    let tools = json!([{"type": "function", "function": {"name": "login",
        "description": format!("Logs in with {SECRET}."),
        "parameters": {"type": "object", "properties": {}}}}]);
    for turn in 0..2 {
        let mut messages = vec![json!({"role": "user", "content": format!("my key: {SECRET}")})];
        if turn == 1 {
            messages.push(json!({"role": "assistant", "content": format!("Your key is {SECRET}, keep it safe.")}));
            messages.push(json!({"role": "user", "content": format!("again {SECRET}")}));
        }
        let response = client()
            .post(sidecar.url("/v1/chat/completions"))
            .header("x-clawback-session", "leaky")
            .json(
                &json!({"model": "mock-llama", "messages": messages, "tools": tools,
                          "tool_choice": "none", "user": SECRET, "stop": [SECRET],
                          "metadata": {"note": SECRET}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.text().await.unwrap();
        assert!(
            body.contains(SECRET),
            "the agent's own answer is not redacted"
        );
    }
    let tenant = TenantId::new("default").unwrap();
    let store = store(&sidecar);
    let record = poll("two steps with a next state", || async {
        let record = one_record(&store, &tenant).await;
        (record.steps.len() == 2 && record.steps[0].next_state.is_some()).then_some(record)
    })
    .await;
    let stored = serde_json::to_string(&record).unwrap();
    assert!(!stored.contains(SECRET), "{stored}");
    assert!(!stored.contains("0123456789abcdef"), "{stored}");
    for step in &record.steps {
        assert_eq!(
            step.tokens,
            clawback_datapool::Tokens::None,
            "token ids would spell the secret"
        );
    }
}

const GLOBAL_ADMIN: &str = "global-admin-token-0123456789";
const ALPHA_VIEWER: &str = "alpha-viewer-token-0123456789";

/// Two tenants with a recorded, completed call each; the global token and alpha's tenant token.
async fn two_recorded_tenants(listen_admin: bool) -> (MockUpstream, Sidecar) {
    let engine = MockUpstream::start().await;
    let mut config = two_tenants(&engine);
    config.routing.base_model = None;
    config.admin.token = Some(GLOBAL_ADMIN.to_owned());
    config
        .admin
        .tenant_tokens
        .insert(key_hash(ALPHA_VIEWER), "alpha".to_owned());
    if listen_admin {
        config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    }
    let sidecar = Sidecar::start(config).await;
    for key in [ALPHA_KEY, BRAVO_KEY] {
        assert_eq!(chat_as(&sidecar, key, "mock-llama").await.status(), 200);
    }
    (engine, sidecar)
}

async fn admin_get(sidecar: &Sidecar, token: &str, path: &str) -> (u16, String) {
    let response = client()
        .get(sidecar.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn a_tenant_token_sees_and_scores_only_its_own_tenant() {
    let (_engine, sidecar) = two_recorded_tenants(false).await;
    let store = store(&sidecar);
    let alpha = one_record(&store, &TenantId::new("alpha").unwrap()).await;
    let bravo = one_record(&store, &TenantId::new("bravo").unwrap()).await;
    let (alpha_id, bravo_id) = (alpha.trajectory.id, bravo.trajectory.id);

    let (status, tenants) = admin_get(&sidecar, ALPHA_VIEWER, "/tenants").await;
    assert_eq!(status, 200);
    let tenants: Value = serde_json::from_str(&tenants).unwrap();
    let names: Vec<&str> = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["tenant"].as_str())
        .collect();
    assert_eq!(names, ["alpha"]);
    let (_, listed) = admin_get(&sidecar, ALPHA_VIEWER, "/trajectories").await;
    assert!(listed.contains(&alpha_id.to_string()) && !listed.contains(&bravo_id.to_string()));
    for path in [
        "/trajectories?tenant=bravo".to_owned(),
        "/tenants/bravo/rewards".to_owned(),
        "/tenants/bravo/export".to_owned(),
        "/tenants/bravo/gate".to_owned(),
        "/admin/policies".to_owned(),
    ] {
        let (status, body) = admin_get(&sidecar, ALPHA_VIEWER, &path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    for path in [
        format!("/trajectories/{bravo_id}"),
        format!("/trajectories/{bravo_id}?tenant=bravo"),
    ] {
        let (status, _) = admin_get(&sidecar, ALPHA_VIEWER, &path).await;
        assert!(status == 403 || status == 404, "{path}: {status}");
    }
    let feedback = |id: String, token: &'static str| {
        client()
            .post(sidecar.url(&format!("/trajectories/{id}/feedback")))
            .bearer_auth(token)
            .json(&json!({"reward": 1.0}))
            .send()
    };
    let refused = feedback(bravo_id.to_string(), ALPHA_VIEWER).await.unwrap();
    assert!(refused.status() == 403 || refused.status() == 404);
    assert_eq!(
        feedback(alpha_id.to_string(), ALPHA_VIEWER)
            .await
            .unwrap()
            .status(),
        202
    );
    // The export: alpha's rows, as JSONL.
    let (status, rows) = admin_get(&sidecar, ALPHA_VIEWER, "/tenants/alpha/export").await;
    assert_eq!(status, 200, "{rows}");
    let rows: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].to_string().contains(&alpha_id.to_string()));
    // The global token sees both.
    let (_, all) = admin_get(&sidecar, GLOBAL_ADMIN, "/tenants").await;
    assert!(all.contains("alpha") && all.contains("bravo"));
    assert_eq!(
        admin_get(&sidecar, GLOBAL_ADMIN, "/tenants/bravo/export")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn with_an_admin_listener_the_agent_port_has_no_admin_api_and_the_admin_port_no_agent_api() {
    let (engine, sidecar) = two_recorded_tenants(true).await;
    let admin = sidecar.admin_addr.expect("an admin listener");
    // Metrics name every tenant and its adapters: the agents' port has none.
    for path in [
        "/trajectories",
        "/tenants",
        "/ui",
        "/admin/policies",
        "/metrics",
    ] {
        let (status, _) = admin_get(&sidecar, GLOBAL_ADMIN, path).await;
        assert_eq!(status, 404, "{path} on the agent port");
    }
    let on_admin = |path: &str| format!("http://{admin}{path}");
    let metrics = client().get(on_admin("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics
        .text()
        .await
        .unwrap()
        .contains("clawback_requests_total"));
    let listed = client()
        .get(on_admin("/tenants"))
        .bearer_auth(GLOBAL_ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let before = engine.request_count();
    let call = client()
        .post(on_admin("/v1/chat/completions"))
        .bearer_auth(ALPHA_KEY)
        .json(&json!({"model": "mock-llama", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 404);
    assert_eq!(engine.request_count(), before);
    let health = client().get(on_admin("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_orphaned_and_its_answer_still_recorded() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        // About 16 MB of answer: more than the socket buffers and the relay's queue hold.
        answer_text: Some(format!("{} ", "y".repeat(7999)).repeat(2000)),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    // Text only: nothing to strip, so the answer flows as fast as the engine sends it.
    config.upstream_kind = clawback_sidecar::config::UpstreamKind::Openai;
    config.timeouts.client_write = Duration::from_millis(300);
    config.limits.max_concurrent_requests = 1;
    let sidecar = Sidecar::start(config).await;
    // A client with a tiny receive window that never reads its answer.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(sidecar.addr).await.unwrap();
    let body = json!({"model": "mock-llama", "stream": true,
                      "messages": [{"role": "user", "content": "say a lot"}]})
    .to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-clawback-session: stalled\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(body.as_bytes()).await.unwrap();
    let metrics = &sidecar.app.metrics;
    assert!(
        eventually(Duration::from_secs(10), || metrics.orphaned_streams.get()
            == 1)
        .await,
        "the stalled client was never given up on"
    );
    // Its permit came back when the orphan's answer ended: the only slot serves again.
    poll("the slot back", || async {
        (post_chat(&sidecar, false).await.status() == 200).then_some(())
    })
    .await;
    let tenant = TenantId::new("default").unwrap();
    let record = one_record(&store(&sidecar), &tenant).await;
    assert_eq!(record.trajectory.metadata["session"], "stalled");
    drop(stalled);
}
