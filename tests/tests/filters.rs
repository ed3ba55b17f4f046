//! Filter plugins end to end: an agent talks to the sidecar, the sidecar to a mock engine (which
//! also plays the judge), and each plugin's evaluation ends up in Redis beside the steps it
//! scores. Hostile plugins are isolated: the sidecar keeps serving and the stored evaluation
//! says why each failed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawback_datapool::{
    Evaluation, EvaluationSource, RedisConfig, RedisStore, Store, TenantId, TrajectoryRecord,
    Verdict,
};
use clawback_filters::JudgeConfig;
use clawback_tests::harness::{repo_root, scratch_dir, test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use clawback_tests::redis_server::RedisServer;
use serde_json::{json, Value};

const JUDGE_ANSWER: &str = "The weather tool was the right call and its result was used. \\boxed{1}\n[HINT_START]Say which tool result the answer comes from before giving it.[HINT_END]";

fn plugin_file(name: &str) -> PathBuf {
    let path = repo_root()
        .join("wasm-plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the plugins first with \
         `cd wasm-plugins && cargo build --release --target wasm32-wasip2` (scripts/test does it)",
        path.display()
    );
    path
}

fn plugin_dir(names: &[&str]) -> PathBuf {
    let dir = scratch_dir("plugins");
    std::fs::create_dir_all(&dir).expect("plugin dir");
    for name in names {
        std::fs::copy(plugin_file(name), dir.join(format!("{name}.wasm"))).expect("plugin copied");
    }
    dir
}

/// A sidecar recording into its own Redis, with `plugins`, the mock engine as its judge.
async fn sidecar_with(plugins: &Path, engine: &MockUpstream, redis: &RedisServer) -> Sidecar {
    Sidecar::start(sidecar_config(plugins, engine, redis)).await
}

fn sidecar_config(
    plugins: &Path,
    engine: &MockUpstream,
    redis: &RedisServer,
) -> clawback_sidecar::config::Config {
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(redis.url());
    config.filters.dir = Some(plugins.to_owned());
    config.filters.judge = Some(JudgeConfig {
        url: format!("{}/v1", engine.url()),
        model: "judge".to_owned(),
        api_key: None,
        timeout: Duration::from_secs(10),
        max_concurrency: 4,
        budget_per_evaluation: 8,
        temperature: 0.6,
        max_tokens: 256,
    });
    config.admin.token = Some(ADMIN.to_owned());
    config
}

const ADMIN: &str = "filters-admin-token";

/// Where the conversation's ground truth (`answer`) comes from.
#[derive(Clone, Copy)]
enum Truth {
    /// The handshake API opens the trajectory with `metadata.answer` (trusted); the agent's body
    /// claims another answer, which must change nothing.
    Handshake,
    /// Only the agent's own request body says `metadata.answer`: the policy naming its target.
    AgentBody,
}

/// A two-call tool-using conversation: a tool call, then (after the tool result and the user's
/// thanks) the final answer, closing the trajectory. The second call goes to `then` (another
/// replica of a pool, or the same sidecar).
async fn converse(sidecar: &Sidecar, then: &Sidecar, session: &str, truth: Truth) -> Vec<u16> {
    let client = reqwest::Client::new();
    let (path, claimed) = match truth {
        Truth::Handshake => {
            let opened: Value = client
                .post(sidecar.url("/trajectories"))
                .bearer_auth(ADMIN)
                .json(&json!({"metadata": {"answer": "21"}}))
                .send()
                .await
                .expect("handshake")
                .json()
                .await
                .expect("handshake answers JSON");
            let id = opened["trajectory_id"].as_str().expect("a trajectory id");
            (format!("/s/{id}/v1/chat/completions"), "99")
        }
        Truth::AgentBody => ("/v1/chat/completions".to_owned(), "21"),
    };
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant. Use tools when they help."}),
        json!({"role": "user", "content": "What's the temperature in Paris in Celsius?"}),
    ];
    let first: Value = client
        .post(sidecar.url(&path))
        .header("x-clawback-session", session)
        .json(
            &json!({"model": "mock-llama", "messages": messages, "tools": tools,
                      "metadata": {"answer": claimed}}),
        )
        .send()
        .await
        .expect("first call")
        .json()
        .await
        .expect("first call answers JSON");
    let reply = first["choices"][0]["message"].clone();
    let call_id = reply["tool_calls"][0]["id"]
        .as_str()
        .unwrap_or("call_0")
        .to_owned();
    messages.push(reply);
    messages.push(json!({"role": "tool", "tool_call_id": call_id,
                         "content": "{\"city\":\"Paris\",\"temperature\":21,\"unit\":\"celsius\"}"}));
    messages.push(json!({"role": "user", "content": "Thanks! Now tell me in one line."}));
    let second = client
        .post(then.url(&path))
        .header("x-clawback-session", session)
        .header("x-clawback-done", "true")
        .json(&json!({"model": "mock-llama", "messages": messages}))
        .send()
        .await
        .expect("second call");
    vec![200, second.status().as_u16()]
}

/// The one trajectory of the default tenant, once it holds `want` evaluations (within 60 s).
async fn stored(redis: &RedisServer, want: usize) -> TrajectoryRecord {
    let store = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .expect("redis store");
    let tenant = TenantId::new("default").expect("tenant");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let headers = store
            .list_trajectories(&tenant, None, 100)
            .await
            .unwrap_or_default();
        if let Some(header) = headers.first() {
            if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
                if record.evaluations.len() >= want || Instant::now() >= deadline {
                    return record;
                }
            }
        }
        assert!(Instant::now() < deadline, "no trajectory stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn from<'a>(record: &'a TrajectoryRecord, plugin: &str) -> &'a Evaluation {
    record
        .evaluations
        .iter()
        .find(|e| matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == plugin))
        .unwrap_or_else(|| panic!("an evaluation from {plugin}: {:#?}", record.evaluations))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_example_plugin_scores_a_conversation_and_its_evaluation_lands_in_redis() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        judge_answers: vec![JUDGE_ANSWER.to_owned()],
        ..Behaviour::default()
    });
    let plugins = plugin_dir(&[
        "tool_outcome",
        "user_feedback",
        "judge_vote",
        "hint_extractor",
        "exact_answer",
    ]);
    let sidecar = sidecar_with(&plugins, &engine, &redis).await;
    assert_eq!(
        converse(&sidecar, &sidecar, "weather-1", Truth::Handshake).await,
        vec![200, 200]
    );

    let record = stored(&redis, 5).await;
    let first_step = record.steps[0].id;
    let score = |plugin: &str| match &from(&record, plugin).verdict {
        Verdict::Score { reward, hint } => (*reward, hint.clone()),
        Verdict::FilterError { reason } => panic!("{plugin} failed: {reason}"),
    };
    // The tool result was clean; the user said thanks; the judge voted +1 three times.
    assert_eq!(score("tool_outcome").0, Some(1.0));
    assert_eq!(score("user_feedback").0, Some(1.0));
    assert_eq!(score("judge_vote").0, Some(1.0));
    assert_eq!(
        score("hint_extractor").1.as_deref(),
        Some("Say which tool result the answer comes from before giving it.")
    );
    for plugin in [
        "tool_outcome",
        "user_feedback",
        "judge_vote",
        "hint_extractor",
    ] {
        assert_eq!(
            from(&record, plugin).step,
            Some(first_step),
            "{plugin} scores the first step"
        );
    }
    // The final answer ("... 21 °C.") matches the handshake's metadata.answer, not the 99 the
    // agent's body claimed.
    assert_eq!(score("exact_answer").0, Some(1.0));
    assert_eq!(from(&record, "exact_answer").step, None);
    assert_eq!(
        engine.judge_calls(),
        6,
        "three votes each for judge_vote and hint_extractor"
    );
}

/// In a pool the next state and the trajectory's end reach a replica that did not record what
/// they follow: it reads that from the datapool, and every plugin scores as with one sidecar.
#[tokio::test(flavor = "multi_thread")]
async fn plugins_in_a_pool_score_what_another_replica_recorded() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let plugins = plugin_dir(&["tool_outcome", "user_feedback", "exact_answer"]);
    let first = sidecar_with(&plugins, &engine, &redis).await;
    let second = sidecar_with(&plugins, &engine, &redis).await;
    assert_eq!(
        converse(&first, &second, "pool-1", Truth::Handshake).await,
        vec![200, 200]
    );
    let record = stored(&redis, 3).await;
    let first_step = record.steps[0].id;
    for (plugin, step) in [
        ("tool_outcome", Some(first_step)),
        ("user_feedback", Some(first_step)),
        ("exact_answer", None),
    ] {
        let evaluation = from(&record, plugin);
        assert_eq!(evaluation.step, step, "{plugin}");
        assert!(
            matches!(evaluation.verdict, Verdict::Score { reward: Some(r), .. } if r == 1.0),
            "{plugin}: {:?}",
            evaluation.verdict
        );
    }
    assert_eq!(record.evaluations.len(), 3, "{:#?}", record.evaluations);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_the_agent_claims_in_its_own_body_is_no_ground_truth() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let plugins = plugin_dir(&["exact_answer", "tool_outcome"]);
    let sidecar = sidecar_with(&plugins, &engine, &redis).await;
    assert_eq!(
        converse(&sidecar, &sidecar, "self-graded", Truth::AgentBody).await,
        vec![200, 200]
    );
    // tool_outcome's evaluation shows the plugins ran; exact_answer found no trusted answer.
    let record = stored(&redis, 1).await;
    from(&record, "tool_outcome");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let record = stored(&redis, 1).await;
    assert!(
        !record.evaluations.iter().any(
            |e| matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == "exact_answer")
        ),
        "the agent's own metadata.answer must not score it: {:#?}",
        record.evaluations
    );
    // What the agent said is kept, apart, for the record.
    assert_eq!(
        record.trajectory.metadata[clawback_datapool::AGENT_METADATA_KEY]["answer"],
        "21"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_plugins_are_isolated_and_the_stored_evaluation_says_why() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        judge_answers: vec!["\\boxed{1}".to_owned()],
        ..Behaviour::default()
    });
    let plugins = plugin_dir(&[
        "endless_loop",
        "memory_bomb",
        "trap",
        "huge_output",
        "judge_flood",
        "tool_outcome",
    ]);
    let mut config = sidecar_config(&plugins, &engine, &redis);
    config.filters.memory_limit = 16 << 20;
    let sidecar = Sidecar::start(config).await;
    assert_eq!(
        converse(&sidecar, &sidecar, "hostile-1", Truth::AgentBody).await,
        vec![200, 200]
    );
    // The sidecar keeps serving while the hostile plugins are being stopped.
    for i in 0..20 {
        let status = reqwest::Client::new()
            .post(sidecar.url("/v1/chat/completions"))
            .json(&json!({"model": "mock-llama", "messages": [{"role": "user", "content": format!("ping {i}")}]}))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        assert_eq!(status, 200);
    }

    let record = stored(&redis, 6).await;
    let reason = |plugin: &str| match &from(&record, plugin).verdict {
        Verdict::FilterError { reason } => reason.clone(),
        other => panic!("{plugin} should have failed, got {other:?}"),
    };
    assert!(
        reason("endless_loop").starts_with("fuel:"),
        "{}",
        reason("endless_loop")
    );
    assert!(
        reason("memory_bomb").starts_with("out of memory:"),
        "{}",
        reason("memory_bomb")
    );
    assert!(reason("trap").starts_with("trap:"), "{}", reason("trap"));
    assert!(
        reason("huge_output").starts_with("invalid output:"),
        "{}",
        reason("huge_output")
    );
    assert!(
        reason("judge_flood").starts_with("judge budget:"),
        "{}",
        reason("judge_flood")
    );
    assert!(matches!(
        from(&record, "tool_outcome").verdict,
        Verdict::Score { reward: Some(r), .. } if r == 1.0
    ));
    let metrics = reqwest::get(sidecar.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("clawback_filter_errors_total{plugin=\"endless_loop\",reason=\"fuel\"} 1"),
        "{metrics}"
    );
}

#[test]
fn plugin_check_prints_what_a_plugin_exports() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .args(["plugin", "check"])
        .arg(plugin_file("exact_answer"))
        .output()
        .expect("sidecar runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.starts_with("exact_answer: a filter plugin for clawback:filter/filter@0.1.0"),
        "{stdout}"
    );
    assert!(stdout.contains("hash: sha256:"), "{stdout}");
    assert!(stdout.contains("evaluates trajectories"), "{stdout}");
}

#[test]
fn plugin_check_refuses_a_plugin_of_another_world() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .args(["plugin", "check"])
        .arg(plugin_file("other_world"))
        .output()
        .expect("sidecar runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("was built against a different world"),
        "{stderr}"
    );
}

#[test]
fn plugin_run_scores_a_recorded_step() {
    let record =
        clawback_datapool::example::tool_use_trajectory(TenantId::new("acme").expect("tenant"));
    let dir = scratch_dir("plugin-run");
    std::fs::create_dir_all(&dir).expect("dir");
    let step = dir.join("step.json");
    std::fs::write(
        &step,
        serde_json::to_vec(&record.steps[1]).expect("step json"),
    )
    .expect("step written");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .args(["plugin", "run"])
        .arg(plugin_file("user_feedback"))
        .arg("--step")
        .arg(&step)
        .output()
        .expect("sidecar runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let evaluation: Value = serde_json::from_slice(&output.stdout).expect("evaluation JSON");
    // The step's recorded next state is "Thanks! Do I need an umbrella?".
    assert_eq!(evaluation["kind"], "score");
    assert_eq!(evaluation["reward"], 1.0);
    assert_eq!(evaluation["labels"]["reaction"], "thanks");
}
