//! The judge plugins against a real judge endpoint: `judge_vote` and `hint_extractor` ask the
//! real vLLM (its OpenAI chat API, as they would ask any judge model) about a recorded step and
//! its next state. The tiny random model answers text that is no verdict: every vote comes back,
//! is read as unparsable — a 0 for `judge_vote`, no hint from `hint_extractor` — and nothing
//! fails; what a capable judge answers is checked with scripted answers in
//! `tests/tests/filters.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{EvaluationSource, TenantId, Verdict};
use clawback_filters::JudgeConfig;
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::harness::{repo_root, scratch_dir, test_config, Sidecar};
use clawback_tests::vllm::{self, MODEL};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn the_judge_plugins_ask_the_real_vllm_and_read_what_it_answers() {
    let _engine = super::share().await;
    let plugins = scratch_dir("judge-plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    for name in ["judge_vote", "hint_extractor"] {
        let built = repo_root()
            .join("wasm-plugins/target/wasm32-wasip2/release")
            .join(format!("{name}.wasm"));
        std::fs::copy(&built, plugins.join(format!("{name}.wasm"))).unwrap_or_else(|e| {
            panic!("{}: {e} (scripts/test builds the plugins)", built.display())
        });
    }
    let engine = vllm::shared().url.clone();
    let mut config = test_config(std::slice::from_ref(&engine));
    config.upstream_kind = UpstreamKind::Vllm;
    config.filters.dir = Some(plugins);
    config.filters.judge = Some(JudgeConfig {
        url: format!("{engine}/v1"),
        model: MODEL.to_owned(),
        api_key: None,
        timeout: Duration::from_secs(60),
        max_concurrency: 4,
        budget_per_evaluation: 8,
        temperature: 1.0,
        // The tiny model's context is 1024 tokens, the judge prompt a few hundred.
        max_tokens: 32,
    });
    let sidecar = Sidecar::start(config).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());

    let client = reqwest::Client::new();
    let mut messages = vec![json!({"role": "user", "content": "Name a city."})];
    let first: serde_json::Value = client
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-session", "judged")
        .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8}))
        .send()
        .await
        .expect("first call")
        .json()
        .await
        .expect("first call answers JSON");
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "No, I asked for a city in France."}));
    let second = client
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-session", "judged")
        .header("x-clawback-done", "true")
        .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8}))
        .send()
        .await
        .expect("second call");
    assert_eq!(second.status(), 200);

    // judge_vote's verdict on the first step, once its three votes are in.
    let tenant = TenantId::new("default").expect("tenant");
    let deadline = Instant::now() + Duration::from_secs(120);
    let (record, vote) = loop {
        let header = store
            .list_trajectories(&tenant, None, 10)
            .await
            .unwrap_or_default()
            .into_iter()
            .next();
        if let Some(header) = header {
            if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
                let vote = record.evaluations.iter().find(|e| {
                    matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == "judge_vote")
                });
                if let Some(vote) = vote.cloned() {
                    break (record, vote);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "judge_vote never scored the step"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(vote.step, Some(record.steps[0].id));
    assert!(
        matches!(vote.verdict, Verdict::Score { reward: Some(r), .. } if r == 0.0),
        "{vote:?}"
    );
    assert_eq!(
        vote.labels.get("judge_votes").map(String::as_str),
        Some("?,?,?"),
        "three answers came back, none of them a verdict: {vote:?}"
    );
    // hint_extractor asked too, three times, and found no hint in the answers.
    let answered = |metrics: &str, plugin: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("clawback_filter_judge_requests_total{")
                    && l.contains(&format!("plugin=\"{plugin}\""))
                    && l.contains("outcome=\"answered\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    loop {
        let metrics = client
            .get(sidecar.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        let counts = (
            answered(&metrics, "judge_vote"),
            answered(&metrics, "hint_extractor"),
        );
        if counts == (3.0, 3.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "judge answers {counts:?}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let record = store
        .trajectory(&tenant, &record.trajectory.id)
        .await
        .expect("the trajectory")
        .expect("the trajectory");
    assert!(record.evaluations.iter().all(|e| !matches!(
        &e.source,
        EvaluationSource::Plugin { name, .. } if name == "hint_extractor"
    )));
}
