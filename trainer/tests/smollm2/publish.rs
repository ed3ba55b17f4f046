//! Adapters the trainer makes on the real model go live in the real vLLM while agents stream:
//! calls recorded through the sidecar are scored and completed, `clawback-trainer train`
//! (its library entry, as the binary runs it) takes optimizer steps on them and publishes each
//! checkpoint — written, loaded with `/v1/load_lora_adapter`, switched in the datapool, drained
//! and the old version unloaded — and not one of the agents' calls fails meanwhile.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Complete, CompletionReason, Store, TenantId};
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{scratch_dir, test_config, Sidecar};
use clawback_trainer::train::{self, RunOptions, TrainConfig};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::{common, model_dir, started_engine, SERVED};

const ADMIN: &str = "smollm2-publish-admin";
const TENANT: &str = "personal";
/// Recorded calls, and the samples of each optimizer step: three versions.
const CALLS: usize = 6;
const PER_STEP: usize = 2;

/// One streamed call through the sidecar as the tenant; the model that answered, or why the
/// call failed.
async fn stream_once(client: &reqwest::Client, sidecar: &str, n: usize) -> Result<String, String> {
    let response = client
        .post(format!("{sidecar}/v1/chat/completions"))
        .header("x-clawback-tenant", TENANT)
        .json(
            &json!({"model": SERVED, "stream": true, "max_tokens": 16, "temperature": 0.7,
                      "messages": [{"role": "user", "content": format!("Name a fruit, {n}.")}]}),
        )
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status()));
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.map_err(|e| format!("body: {e}"))?);
    }
    let text = String::from_utf8_lossy(&body);
    if text.contains("\"error\"") || !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("a broken stream: {text}"));
    }
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["model"].as_str().map(str::to_owned))
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adapters_the_trainer_makes_go_live_in_vllm_while_agents_stream() {
    let _adapters = super::ENGINE_USE.write().await;
    let engine = started_engine().await;
    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.trusted_header = true;
    config.routing.base_model = Some(SERVED.to_owned());
    config.routing.poll_interval = Duration::from_millis(50);
    config.admin.token = Some(ADMIN.to_owned());
    let sidecar = Sidecar::start(config.clone()).await;
    let store: Arc<dyn Store> =
        Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let tenant = TenantId::new(TENANT).expect("tenant");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("a client");

    // What the trainer learns from: the tenant's calls, each a whole trajectory, scored ±1.
    for n in 0..CALLS {
        let response = client
            .post(sidecar.url("/v1/chat/completions"))
            .header("x-clawback-tenant", TENANT)
            .header("x-clawback-done", "true")
            .json(&json!({"model": SERVED, "max_tokens": 24, "temperature": 0.7,
                "messages": [{"role": "user", "content": format!("Give me a tip for sleeping well, {n}.")}]}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }
    let mut trajectories = Vec::new();
    for _ in 0..200 {
        trajectories = store
            .list_trajectories(&tenant, None, 100)
            .await
            .expect("trajectories");
        if trajectories.len() >= CALLS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(trajectories.len(), CALLS);
    for (i, header) in trajectories.iter().enumerate() {
        let reward = if i % 2 == 0 { 1.0 } else { -1.0 };
        store
            .append_evaluations(&[common::feedback(&tenant, header.id, reward)])
            .await
            .expect("feedback");
        let done = Complete::now(tenant.clone(), header.id, CompletionReason::Handshake);
        store.complete_trajectory(&done).await.expect("complete");
    }

    // Agents streaming the whole time, as the tenant: each call goes to its live version.
    let stop = Arc::new(AtomicBool::new(false));
    let mut agents = Vec::new();
    for agent in 0..3 {
        let (stop, url, client) = (Arc::clone(&stop), sidecar.url(""), client.clone());
        agents.push(tokio::spawn(async move {
            let mut models = Vec::new();
            let mut n = agent * 10_000;
            while !stop.load(Ordering::SeqCst) {
                models.push(stream_once(&client, &url, n).await);
                n += 1;
            }
            models
        }));
    }

    let root = scratch_dir("smollm2-publish");
    let text = format!(
        r#"
model = "{model}"
device = "cpu"
threads = 1
datapool = "{data}"
tenants = ["{TENANT}"]
poll_interval = "50ms"

[consumer]
group = "publish"
name = "publish-0"

[lora]
rank = 8
alpha = 16.0

[optimizer]
lr = 1e-4

[batch]
samples_per_step = {PER_STEP}
max_wait = "0s"

[checkpoint]
dir = "{checkpoints}"
every = 1

[metrics]
progress = false
jsonl = "{jsonl}"

[sampler]
logprobs = "processed"

[publish]
adapter_root = "{adapters}"
switch_timeout = "10s"
drain_timeout = "60s"
poll_interval = "50ms"

[[publish.backends]]
kind = "vllm"
url = "{engine}"

[[publish.sidecars]]
url = "{sidecar}"
admin_token = "{ADMIN}"
"#,
        model = model_dir().display(),
        data = config.data_dir.display(),
        checkpoints = root.join("checkpoints").display(),
        jsonl = root.join("metrics.jsonl").display(),
        adapters = root.join("adapters").display(),
        engine = engine.url,
        sidecar = sidecar.url(""),
    );
    let train_config = TrainConfig::from_toml(&text).unwrap_or_else(|e| panic!("{e}"));
    let summary = tokio::task::spawn_blocking(move || {
        let options = RunOptions {
            exit_when_idle: true,
            handle_signals: false,
        };
        train::run(&train_config, options, Arc::new(AtomicBool::new(false)))
    })
    .await
    .expect("the trainer ran")
    .unwrap_or_else(|e| panic!("the trainer: {e}"));
    let versions = CALLS / PER_STEP;
    assert_eq!(
        summary.published.get(&tenant).copied(),
        Some(versions as u64),
        "{summary:?}"
    );
    let live = format!("{TENANT}@v{versions}");
    // A few calls on the last version, then the agents stop.
    let mut answered_by_live = 0;
    while answered_by_live < 3 {
        let model = stream_once(&client, &sidecar.url(""), 99_999).await;
        answered_by_live += usize::from(model.as_deref() == Ok(live.as_str()));
    }
    stop.store(true, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for agent in agents {
        outcomes.extend(agent.await.expect("an agent"));
    }
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    let seen: BTreeSet<&str> = outcomes.iter().filter_map(|o| o.as_deref().ok()).collect();
    println!(
        "{} streamed calls across the swaps, answered by {seen:?}",
        outcomes.len()
    );
    assert!(seen.len() >= 2, "the agents saw no swap: {seen:?}");

    // vLLM holds the base model and the live version only.
    let models: Value = client
        .get(format!("{}/v1/models", engine.url))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    let loaded: BTreeSet<&str> = models["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .filter(|id| id.starts_with(TENANT) || *id == SERVED)
        .collect();
    assert_eq!(loaded, BTreeSet::from([SERVED, live.as_str()]));
}
