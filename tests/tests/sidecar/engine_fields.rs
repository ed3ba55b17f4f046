//! What the engine gets is what the sidecar decided on: each test replays what a tenant's agent
//! could send to reach beyond its own answer — another tenant's adapter through SGLang's own
//! fields, engine extensions, a shared prefix cache, addresses for the engine to fetch, an id
//! another tenant also sends — and shows it refused or taken out; and that an answer the
//! sidecar cannot read (a compressing hop between it and the engine) is never passed on
//! unfiltered.

use clawback_datapool::TenantId;
use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::engine_fields;
use clawback_tests::front_door::start_compressing_hop;
use clawback_tests::harness::Sidecar;
use clawback_tests::mock::{Behaviour, MockUpstream};
use serde_json::{json, Value};

use crate::support::{assert_openai_error, client};
use crate::tenancy::{two_tenants, ALPHA_KEY, BRAVO_KEY};

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(sidecar: &Sidecar, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = client()
        .post(sidecar.url(path))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("the sidecar answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The bodies of the model calls the engine received.
fn engine_bodies(engine: &MockUpstream) -> Vec<Value> {
    engine
        .received()
        .iter()
        .filter(|r| r.path.starts_with("/v1/chat") || r.path.starts_with("/v1/completions"))
        .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
        .collect()
}

#[tokio::test]
async fn with_sglang_a_tenant_cannot_name_another_tenants_adapter_in_the_engines_own_fields() {
    let engine = MockUpstream::start().await;
    for routing in [true, false] {
        let mut config = two_tenants(&engine);
        config.upstream_kind = UpstreamKind::Sglang;
        if !routing {
            config.routing.base_model = None;
        }
        let sidecar = Sidecar::start(config).await;
        let mut lora_path = chat("mock-llama");
        lora_path["lora_path"] = json!("bravo@v1");
        let (status, body) = post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &lora_path).await;
        assert_eq!(status, 400, "routing {routing}: {body}");
        assert_openai_error(&body, "not_forwarded");
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("lora_path")));
        for model in ["mock-llama:bravo@v1", "mock-llama:bravo"] {
            let (status, body) =
                post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &chat(model)).await;
            assert_eq!(status, 404, "{model}, routing {routing}: {body}");
            assert_openai_error(&body, "model_not_found");
        }
        // Its own adapter in the same form is the engine's to serve where the sidecar does not
        // route (with routing on, only the names it routes are called).
        let (status, body) = post(
            &sidecar,
            "/v1/chat/completions",
            ALPHA_KEY,
            &chat("mock-llama:alpha@v1"),
        )
        .await;
        assert_eq!(status, if routing { 404 } else { 200 }, "{body}");
    }
    let named: Vec<Value> = engine_bodies(&engine)
        .into_iter()
        .filter(|b| {
            b.get("lora_path").is_some() || b["model"].as_str() != Some("mock-llama:alpha@v1")
        })
        .collect();
    assert!(named.is_empty(), "the engine got {named:?}");
}

#[tokio::test]
async fn engine_extensions_are_refused_in_the_agents_own_api_shape_unless_allowed() {
    let engine = MockUpstream::start().await;
    let mut config = two_tenants(&engine);
    config.upstream_kind = UpstreamKind::Vllm;
    let sidecar = Sidecar::start(config).await;
    for field in engine_fields::known_extensions() {
        let mut body = chat("mock-llama");
        body[field] = json!(1);
        let (status, answer) = post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &body).await;
        assert_eq!(status, 400, "{field}: {answer}");
        assert_openai_error(&answer, "not_forwarded");
    }
    // An Anthropic agent reads the refusal in Anthropic's shape.
    let messages = json!({"model": "mock-llama", "max_tokens": 8, "priority": -100,
                          "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) = post(&sidecar, "/v1/messages", ALPHA_KEY, &messages).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["type"], "error", "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("priority")));
    // Media the engine would fetch from where it runs.
    let mut fetch = chat("mock-llama");
    fetch["messages"][0]["content"] = json!([
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}
    ]);
    let (status, answer) = post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &fetch).await;
    assert_eq!(status, 400, "{answer}");
    // What the sidecar reads to decide must mean the same to it and the engine.
    let mut one = chat("mock-llama");
    one["stream"] = json!(1);
    let (status, answer) = post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &one).await;
    assert_eq!(status, 400, "{answer}");
    assert!(engine_bodies(&engine).is_empty(), "{:?}", engine.received());

    // An operator who vouches for one lets that one through, and only that one.
    let mut config = two_tenants(&engine);
    config.upstream_kind = UpstreamKind::Vllm;
    config.forwarding.allow = vec!["priority".to_owned()];
    let trusting = Sidecar::start(config).await;
    let mut body = chat("mock-llama");
    body["priority"] = json!(-5);
    let (status, answer) = post(&trusting, "/v1/chat/completions", ALPHA_KEY, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(engine_bodies(&engine).len(), 1);
    assert_eq!(engine_bodies(&engine)[0]["priority"], -5);
}

#[tokio::test]
async fn each_tenant_has_a_prefix_cache_of_its_own_and_cannot_pick_another() {
    let engine = MockUpstream::start().await;
    let mut config = two_tenants(&engine);
    config.upstream_kind = UpstreamKind::Vllm;
    let sidecar = Sidecar::start(config).await;
    for key in [ALPHA_KEY, BRAVO_KEY] {
        let (status, answer) =
            post(&sidecar, "/v1/chat/completions", key, &chat("mock-llama")).await;
        assert_eq!(status, 200, "{answer}");
    }
    let salts: Vec<Value> = engine_bodies(&engine)
        .iter()
        .map(|b| b["cache_salt"].clone())
        .collect();
    let salt_of = |tenant: &str| {
        json!(engine_fields::salt(
            &TenantId::new(tenant).expect("a tenant")
        ))
    };
    assert_eq!(salts, [salt_of("alpha"), salt_of("bravo")]);
    let mut bravos = chat("mock-llama");
    bravos["cache_salt"] = salt_of("bravo");
    let (status, answer) = post(&sidecar, "/v1/chat/completions", ALPHA_KEY, &bravos).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(engine_bodies(&engine).len(), 2);
}

#[tokio::test]
async fn two_tenants_sending_one_request_id_reach_the_engine_under_two() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(two_tenants(&engine)).await;
    for key in [ALPHA_KEY, BRAVO_KEY] {
        let response = client()
            .post(sidecar.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("x-request-id", "agent-chosen-7")
            .json(&chat("mock-llama"))
            .send()
            .await
            .expect("the sidecar answers");
        assert_eq!(response.status(), 200);
        // The agent's id comes back as it sent it.
        assert_eq!(response.headers()["x-request-id"], "agent-chosen-7");
    }
    let ids: Vec<String> = engine
        .received()
        .iter()
        .filter_map(|r| {
            r.headers
                .get("x-request-id")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    assert!(
        ids.iter().all(|id| id.starts_with("agent-chosen-7-")),
        "{ids:?}"
    );
}

#[tokio::test]
async fn behind_a_compressing_hop_the_model_list_and_the_strip_still_hold() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        loaded_adapters: vec!["alpha@v2".to_owned(), "bravo@v1".to_owned()],
        ..Behaviour::default()
    });
    let hop = start_compressing_hop(engine.addr()).await;
    let mut config = two_tenants(&engine);
    config.upstreams = vec![hop.url("")];
    config.upstream_kind = UpstreamKind::Vllm;
    let sidecar = Sidecar::start(config).await;
    // The agent accepts gzip (as every HTTP client library does); the sidecar reads what it
    // filters all the same.
    let plain = reqwest::Client::builder()
        .no_gzip()
        .build()
        .expect("client");
    let models = plain
        .get(sidecar.url("/v1/models"))
        .bearer_auth(ALPHA_KEY)
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(models.status(), 200, "{}", hop.logs());
    assert!(models.headers().get("content-encoding").is_none());
    let list: Value = models.json().await.expect("an uncompressed model list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        ids.contains(&"alpha@v2") && !ids.contains(&"bravo@v1"),
        "{ids:?}"
    );
    let answer = plain
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth(ALPHA_KEY)
        .header("accept-encoding", "gzip")
        .json(&chat("mock-llama"))
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("an uncompressed answer");
    // The ids and logprobs the sidecar asked for were taken out again (vLLM's `null`s).
    let choice = &answer["choices"][0];
    assert!(
        choice["token_ids"].is_null() && choice["logprobs"].is_null(),
        "{answer}"
    );
    assert!(answer["prompt_token_ids"].is_null(), "{answer}");
    assert!(engine
        .received()
        .iter()
        .all(|r| r.headers["accept-encoding"] == "identity"));
}

#[tokio::test]
async fn an_answer_encoded_against_the_sidecars_ask_is_refused_not_passed_on_unfiltered() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        loaded_adapters: vec!["bravo@v1".to_owned()],
        content_encoding: Some("gzip"),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(two_tenants(&engine)).await;
    let models = client()
        .get(sidecar.url("/v1/models"))
        .bearer_auth(ALPHA_KEY)
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(models.status(), 502);
    let body: Value = models.json().await.expect("an OpenAI-shaped error");
    assert_openai_error(&body, "upstream_encoded");
    assert!(!body.to_string().contains("bravo"));
}
