//! A body the sidecar cannot read never reaches the engine: the real vLLM serving two tenants'
//! adapters takes JSON that serde_json refuses (`NaN`, `1e400`, a key twice, a byte-order mark)
//! and would serve the adapter it names to anyone — shown by sending each body to vLLM
//! directly — while through the sidecar, under the other tenant's key, every one is refused
//! with a 400 in OpenAI's shape and the tenant's own calls are still served.

use std::time::Duration;

use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{scratch_dir, test_config, Sidecar};
use serde_json::{json, Value};

use super::{model_dir, started_engine, SERVED};

const EVE_KEY: &str = "sk-eve-0123456789";
const VICTIM_KEY: &str = "sk-victim-0123456789";

/// Writes an adapter for SmolLM2 into a scratch folder and loads it into vLLM as `name`.
async fn load_adapter(client: &reqwest::Client, engine: &str, name: &str, seed: i64) {
    let dir = scratch_dir(&format!("smollm2-tenancy-{name}"));
    let config = clawback_model::config::ModelConfig::from_dir(&model_dir()).expect("its config");
    let lora = clawback_model::lora::LoraConfig {
        rank: 8,
        alpha: 16.0,
        ..Default::default()
    };
    clawback_model::test_support::random_adapter(&config, lora, seed, 0.05)
        .save(&dir, Some(SERVED))
        .expect("the adapter saves");
    let response = client
        .post(format!("{engine}/v1/load_lora_adapter"))
        .json(&json!({"lora_name": name, "lora_path": dir}))
        .send()
        .await
        .expect("vLLM answers");
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

/// `body` posted to `url`'s chat completions with `key`: the status and the answer.
async fn chat(client: &reqwest::Client, url: &str, key: &str, body: &[u8]) -> (u16, Value) {
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_body_vllm_reads_and_the_sidecar_cannot_is_refused_not_served_on_another_tenants_adapter()
{
    let _adapters = super::ENGINE_USE.write().await;
    let engine = started_engine().await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("a client");
    load_adapter(&client, &engine.url, "victim@v1", 11).await;
    load_adapter(&client, &engine.url, "eve@v1", 12).await;

    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.default = None;
    config
        .tenants
        .keys
        .insert(key_hash(EVE_KEY), "eve".to_owned());
    config
        .tenants
        .keys
        .insert(key_hash(VICTIM_KEY), "victim".to_owned());
    config.routing.base_model = Some(SERVED.to_owned());
    config.routing.poll_interval = Duration::from_millis(50);
    let sidecar = Sidecar::start(config).await;

    let messages = r#""messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2"#;
    let attacks: Vec<(&str, Vec<u8>)> = vec![
        (
            "NaN",
            format!(r#"{{"model": "victim@v1", {messages}, "x": NaN}}"#).into(),
        ),
        (
            "Infinity",
            format!(r#"{{"model": "victim@v1", {messages}, "x": Infinity}}"#).into(),
        ),
        (
            "1e400",
            format!(r#"{{"model": "victim@v1", {messages}, "x": 1e400}}"#).into(),
        ),
        (
            "a key twice",
            format!(r#"{{"model": "eve@v1", "model": "victim@v1", {messages}}}"#).into(),
        ),
        (
            "a byte-order mark",
            format!("\u{feff}{{\"model\": \"victim@v1\", {messages}}}").into(),
        ),
    ];
    for (what, body) in &attacks {
        // vLLM itself serves each one, on the adapter it names: the threat is real.
        let (status, answer) = chat(&client, &engine.url, EVE_KEY, body).await;
        assert_eq!(status, 200, "vLLM directly, {what}: {answer}");
        assert_eq!(answer["model"], "victim@v1", "vLLM directly, {what}");
        // Through the sidecar, as eve: refused.
        let (status, answer) = chat(&client, &sidecar.url(""), EVE_KEY, body).await;
        assert_eq!(status, 400, "through the sidecar, {what}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_body", "{what}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{what}");
    }

    // Each tenant's own adapter, in standard JSON, is served.
    for (key, adapter) in [(EVE_KEY, "eve@v1"), (VICTIM_KEY, "victim@v1")] {
        let body = format!(r#"{{"model": "{adapter}", {messages}}}"#);
        let (status, answer) = chat(&client, &sidecar.url(""), key, body.as_bytes()).await;
        assert_eq!(status, 200, "{adapter}: {answer}");
        assert_eq!(answer["model"], adapter);
    }
}
