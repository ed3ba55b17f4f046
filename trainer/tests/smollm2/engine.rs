//! The real model served by the real vLLM, behind the sidecar: what is recorded is vLLM's own
//! token ids and logprobs, streamed or not; and the trainer, scoring those tokens with the same
//! weights under the sampler that drew them, agrees with vLLM's logprobs to rounding.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Complete, CompletionReason, Store, TenantId, Tokens, TrajectoryRecord};
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{scratch_dir, test_config, Sidecar};
use clawback_trainer::train::{self, RunOptions, TrainConfig};
use serde_json::{json, Value};

use super::{common, started_engine, SERVED};

async fn sidecar(trusted_tenants: bool) -> Sidecar {
    let engine = started_engine().await;
    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.trusted_header = trusted_tenants;
    Sidecar::start(config).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("a client")
}

/// A chat call's body, which must come with 200.
async fn chat(url: &str, body: &Value, headers: &[(&str, &str)]) -> String {
    let mut request = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status();
    let text = response.text().await.expect("a body");
    assert_eq!(status, 200, "{text}");
    text
}

/// The steps of `tenant` once `count` are recorded (or ten seconds passed).
async fn recorded(
    store: &Arc<dyn Store>,
    tenant: &TenantId,
    count: usize,
) -> Vec<TrajectoryRecord> {
    let mut records = Vec::new();
    for _ in 0..200 {
        records.clear();
        for header in store
            .list_trajectories(tenant, None, 1000)
            .await
            .unwrap_or_default()
        {
            if let Ok(Some(record)) = store.trajectory(tenant, &header.id).await {
                records.push(record);
            }
        }
        if records.iter().map(|r| r.steps.len()).sum::<usize>() >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    records
}

/// vLLM's answer as ids and logprobs: a JSON body's, or a stream's chunks in order (the prompt's
/// ids come with the first chunk that has them).
fn answer_tokens(text: &str, stream: bool) -> (Vec<u32>, Vec<u32>, Vec<f64>) {
    let events: Vec<Value> = if stream {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
            .collect()
    } else {
        vec![serde_json::from_str(text).expect("a JSON body")]
    };
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect()
    };
    let (mut prompt, mut completion, mut logprobs) = (Vec::new(), Vec::new(), Vec::new());
    for event in &events {
        let choice = &event["choices"][0];
        if prompt.is_empty() {
            prompt = ids(&event["prompt_token_ids"]);
            if prompt.is_empty() {
                prompt = ids(&choice["prompt_token_ids"]);
            }
        }
        completion.extend(ids(&choice["token_ids"]));
        logprobs.extend(
            choice["logprobs"]["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["logprob"].as_f64()),
        );
    }
    (prompt, completion, logprobs)
}

/// The agent asks for vLLM's ids and logprobs itself, so the very answer the sidecar recorded
/// from is in its hands: the recording must be that answer's ids and logprobs to the last digit.
/// (Asking vLLM again would not do: batched beside the other tests' calls, the same request's
/// logprobs differ in the sixth digit. The tiny-model tier checks the path where the sidecar
/// asks for them on the agent's behalf.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_recorded_ids_and_logprobs_of_the_real_model_are_vllms_own() {
    let _base_model_only = super::ENGINE_USE.read().await;
    let sidecar = sidecar(true).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    for (tenant, stream) in [("ids-plain", false), ("ids-stream", true)] {
        let body = json!({"model": SERVED, "temperature": 0, "max_tokens": 32, "stream": stream,
            "logprobs": true, "return_token_ids": true,
            "messages": [{"role": "user", "content": "How do I make a cup of green tea?"}]});
        let answer = chat(&sidecar.url(""), &body, &[("x-clawback-tenant", tenant)]).await;
        let (prompt, completion, logprobs) = answer_tokens(&answer, stream);
        let tenant = TenantId::new(tenant).expect("tenant");
        let records = recorded(&store, &tenant, 1).await;
        let step = &records.first().expect("a trajectory").steps[0];
        let Tokens::Engine(tokens) = &step.tokens else {
            panic!("{tenant}: no engine tokens recorded");
        };
        let recorded: Vec<f64> = tokens
            .completion_logprobs
            .iter()
            .map(|l| l.logprob)
            .collect();
        assert!(
            !prompt.is_empty() && !completion.is_empty(),
            "{tenant}: {answer:.600}"
        );
        assert_eq!(tokens.prompt_token_ids, prompt, "{tenant}: prompt ids");
        assert_eq!(
            tokens.completion_token_ids, completion,
            "{tenant}: completion ids"
        );
        assert_eq!(recorded, logprobs, "{tenant}: logprobs");
        assert!(recorded.iter().all(|l| l.is_finite() && *l <= 0.0));
    }
}

const CALLS: usize = 8;

/// One optimizer step over everything `tenant` has ready, read by consumer group `group`, with
/// vLLM's logprobs read as processed (the tests' vLLM runs `processed_logprobs`); the step's
/// JSONL line.
fn train_once(
    root: &std::path::Path,
    data: &std::path::Path,
    tenant: &TenantId,
    group: &str,
) -> Value {
    let run = root.join(group);
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
rank = 8
alpha = 16.0

[batch]
samples_per_step = {CALLS}
max_wait = "0s"

[checkpoint]
dir = "{checkpoints}"

[metrics]
progress = false
jsonl = "{jsonl}"

[sampler]
logprobs = "processed"
"#,
        model = super::model_dir().display(),
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

fn agreement(step: &Value, key: &str) -> f64 {
    step["agreement"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no agreement.{key} in {step}"))
}

/// vLLM serves the model in f32, as the trainer computes: what is left between the two is the
/// order of the sums. Calls that set no sampling parameter are sampled under the model's
/// `generation_config.json` (SmolLM2's sets none: temperature 1, the whole vocabulary); calls
/// sampled as the personal demo samples (temperature 0.7, top-p 0.9) are scored under that
/// sampler (scored at temperature 1 instead, they would differ by tenths of a nat). Measured
/// here: mean |Δ logprob| about 5e-6, the largest about 6e-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_trainer_scores_what_vllm_sampled_from_the_real_model_as_vllm_did() {
    let _base_model_only = super::ENGINE_USE.read().await;
    let sidecar = sidecar(true).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());
    let url = sidecar.url("");
    for n in 0..CALLS {
        let messages =
            json!([{"role": "user", "content": format!("Tell me one fact about the number {n}.")}]);
        let done = [("x-clawback-done", "true")];
        chat(
            &url,
            &json!({"model": SERVED, "max_tokens": 40, "messages": messages}),
            &[("x-clawback-tenant", "defaults"), done[0]],
        )
        .await;
        chat(
            &url,
            &json!({"model": SERVED, "max_tokens": 40, "messages": messages,
                           "temperature": 0.7, "top_p": 0.9}),
            &[("x-clawback-tenant", "chat-sampler"), done[0]],
        )
        .await;
    }
    let root = scratch_dir("smollm2-agreement");
    let mut lines = Vec::new();
    for tenant in ["defaults", "chat-sampler"] {
        let tenant = TenantId::new(tenant).expect("tenant");
        let records = recorded(&store, &tenant, CALLS).await;
        assert_eq!(records.len(), CALLS, "{tenant}");
        for (i, record) in records.iter().enumerate() {
            let reward = if i % 2 == 0 { 1.0 } else { -1.0 };
            store
                .append_evaluations(&[common::feedback(&tenant, record.trajectory.id, reward)])
                .await
                .expect("feedback");
            let done = Complete::now(
                tenant.clone(),
                record.trajectory.id,
                CompletionReason::Handshake,
            );
            store.complete_trajectory(&done).await.expect("complete");
        }
        let group = tenant.as_str().to_owned();
        let (root, data) = (root.clone(), sidecar.app.config.data_dir.clone());
        let line = tokio::task::spawn_blocking(move || train_once(&root, &data, &tenant, &group))
            .await
            .expect("the trainer runs");
        println!(
            "{}: mean |Δ logprob| {:.2e}, max {:.2e} over {} tokens, {} outside the support",
            line["tenant"],
            agreement(&line, "mean_abs_logprob_diff"),
            agreement(&line, "max_abs_logprob_diff"),
            agreement(&line, "tokens"),
            line["outside_support"],
        );
        lines.push(line);
    }
    for line in &lines {
        assert!(agreement(line, "tokens") >= CALLS as f64, "{line}");
        assert!(agreement(line, "mean_abs_logprob_diff") < 1e-4, "{line}");
        assert!(agreement(line, "max_abs_logprob_diff") < 1e-3, "{line}");
        assert_eq!(line["outside_support"], 0, "{line}");
    }
}
