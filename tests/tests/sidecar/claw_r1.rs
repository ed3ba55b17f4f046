//! Claw-R1's black-box protocol: rollout code shaped like Claw-R1's GSM8K agent flow (init,
//! the prompt_uid rewritten to the task id, register, tool-calling chat turns through the official
//! OpenAI Python SDK with that base_url, complete with a reward) runs unchanged against the
//! sidecar, and the group of rollouts of one task becomes ready with its rewards. Unknown uids,
//! another tenant's uids and engine control routes under a base_url are refused.

use std::process::Command;

use clawback_datapool::{
    Consumer, ConsumerName, EvaluationSource, ReadyItem, TenantId, Tokens, TrajectoryId, Verdict,
};
use clawback_sidecar::config::Config;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{repo_root, run_client, sdk_python as python, test_config, Sidecar};
use clawback_tests::mock::MockUpstream;
use serde_json::{json, Value};

use crate::support::{assert_openai_error, client, poll, store};

const KEY_A: &str = "sk-claw-a";
const KEY_B: &str = "sk-claw-b";

fn config(engine: &MockUpstream, enabled: bool) -> Config {
    let mut config = test_config(&[engine.url()]);
    config.claw_r1.enabled = enabled;
    config.claw_r1.group_size = 2;
    config.tenants.default = None;
    config
        .tenants
        .keys
        .insert(key_hash(KEY_A), "math".to_owned());
    config
        .tenants
        .keys
        .insert(key_hash(KEY_B), "other".to_owned());
    config
}

/// One rollout of `task` by the Claw-R1-shaped flow; its trajectory uid.
async fn rollout(sidecar: &Sidecar, task: &str, reward: f64) -> String {
    rollout_on(sidecar, task, reward, "train").await
}

/// One rollout on Claw-R1's `channel` (`train` or `val`).
async fn rollout_on(sidecar: &Sidecar, task: &str, reward: f64, channel: &str) -> String {
    let mut command = Command::new(python());
    command
        .arg(repo_root().join("tests/sdk/python/claw_r1_flow.py"))
        .env("CLAW_GATEWAY", sidecar.url(""))
        .env("CLAW_TASK", task)
        .env("CLAW_CHANNEL", channel)
        .env("CLAW_REWARD", reward.to_string())
        .env("OPENAI_API_KEY", KEY_A);
    let stdout = run_client(command, "the Claw-R1 flow", &[]).await;
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ok "))
        .unwrap_or_else(|| panic!("no uid in {stdout}"))
        .to_owned()
}

#[tokio::test]
async fn a_claw_r1_gsm8k_flow_runs_unchanged_and_its_group_becomes_ready_with_rewards() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(config(&engine, true)).await;
    let (first, second) = tokio::join!(
        rollout(&sidecar, "gsm8k-17", 1.0),
        rollout(&sidecar, "gsm8k-17", 0.0)
    );
    assert_ne!(first, second);

    let store = store(&sidecar);
    let tenant = TenantId::new("math").unwrap();
    let consumer = Consumer::new(
        ConsumerName::new("trainers").unwrap(),
        ConsumerName::new("t1").unwrap(),
    );
    let group = poll("the task's group to be ready", || async {
        let ready = store.read_ready(&tenant, &consumer, 10).await.ok()?;
        ready.iter().find_map(|d| match d.item {
            ReadyItem::Group(id) => Some(id),
            ReadyItem::Trajectory(_) => None,
        })
    })
    .await;
    let group = store.group(&tenant, &group).await.unwrap().unwrap();
    assert_eq!(group.size, 2);
    assert_eq!(group.members.len(), 2);

    let mut rewards = Vec::new();
    for id in &group.members {
        let record = store.trajectory(&tenant, id).await.unwrap().unwrap();
        // Two tool-calling turns, vLLM's tokens on each, the tool result as the first's next state.
        assert_eq!(record.steps.len(), 2, "{:?}", record.steps);
        assert!(record
            .steps
            .iter()
            .all(|s| matches!(s.tokens, Tokens::Engine(_))));
        assert!(record.steps[0].next_state.is_some());
        let session = record.trajectory.metadata["session"].as_str().unwrap();
        assert!([first.as_str(), second.as_str()].contains(&session));
        // What register sent is the agent's metadata: recorded, never shown to plugins.
        let agent = &record.trajectory.metadata["agent"];
        assert_eq!(agent["channel"], "train");
        assert_eq!(agent["prompt_uid"], "gsm8k-17");
        assert_eq!(agent["data_source"], "gsm8k");
        for evaluation in &record.evaluations {
            if let (EvaluationSource::Feedback { channel }, Verdict::Score { reward, .. }) =
                (&evaluation.source, &evaluation.verdict)
            {
                assert_eq!(channel, "claw_r1");
                rewards.extend(*reward);
            }
        }
    }
    rewards.sort_by(f64::total_cmp);
    assert_eq!(rewards, vec![0.0, 1.0]);
}

#[tokio::test]
async fn a_validation_rollout_is_recorded_and_never_trained_on() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(config(&engine, true)).await;
    let uid = rollout_on(&sidecar, "gsm8k-val-3", 1.0, "val").await;
    let store = store(&sidecar);
    let tenant = TenantId::new("math").unwrap();
    let record = poll("the validation rollout's steps", || {
        let store = std::sync::Arc::clone(&store);
        let tenant = tenant.clone();
        let uid = uid.clone();
        async move {
            for header in store.list_trajectories(&tenant, None, 10).await.ok()? {
                if header.metadata.get("session") == Some(&json!(uid)) {
                    let record = store.trajectory(&tenant, &header.id).await.ok()??;
                    if record.steps.len() == 2 {
                        return Some(record);
                    }
                }
            }
            None
        }
    })
    .await;
    assert!(
        record.steps.iter().all(|s| !s.trainable),
        "a `val` rollout was handed to training"
    );
    assert_eq!(record.trajectory.metadata["agent"]["channel"], "val");
}

#[tokio::test]
async fn unknown_or_foreign_uids_engine_routes_and_a_disabled_protocol_are_refused() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(config(&engine, true)).await;
    let post = |path: String, key: &'static str, body: Value| {
        let url = sidecar.url(&path);
        async move {
            let response = client()
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let chat = json!({"model": "mock-llama", "messages": [{"role": "user", "content": "2+2?"}]});

    // A uid this sidecar never minted: 404 on every route (Claw-R1 would accept it silently).
    let stranger = TrajectoryId::new().to_string();
    for path in [
        format!("/{stranger}/1/v1/chat/completions"),
        format!("/{stranger}/1/v1/register_trajectory"),
        format!("/{stranger}/1/v1/complete_trajectory"),
        format!("/complete_trajectory/{stranger}"),
    ] {
        let (status, body) = post(path.clone(), KEY_A, chat.clone()).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_openai_error(&body, "trajectory_not_found");
    }

    // Tenant math's uid, used with tenant other's key: not found, and nothing reaches the engine.
    let (status, init) = post("/init_trajectory".into(), KEY_A, json!({})).await;
    assert_eq!(status, 200, "{init}");
    let uid = init["trajectory_uid"].as_str().unwrap().to_owned();
    assert!(init["base_url"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/{uid}/1/v1")));
    let before = engine.request_count();
    let (status, _) = post(format!("/{uid}/7/v1/chat/completions"), KEY_B, chat.clone()).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        format!("/{uid}/7/v1/complete_trajectory"),
        KEY_B,
        json!({"reward": 1.0}),
    )
    .await;
    assert_eq!(status, 404);
    // The engine's control plane stays out of reach under a base_url too.
    let (status, body) = post(
        format!("/{uid}/7/v1/load_lora_adapter"),
        KEY_A,
        json!({"lora_name": "x", "lora_path": "/tmp"}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_openai_error(&body, "engine_control_route");
    assert_eq!(engine.request_count(), before);
    // A reward that is not a number is refused; the owner's own calls go through.
    let (status, _) = post(format!("/{uid}/7/v1/chat/completions"), KEY_A, chat.clone()).await;
    assert_eq!(status, 200);
    for reward in [
        json!("high"),
        json!(5.0),
        json!(1e308),
        json!(-1e308),
        json!(-1.5),
    ] {
        let (status, body) = post(
            format!("/{uid}/7/v1/complete_trajectory"),
            KEY_A,
            json!({ "reward": reward }),
        )
        .await;
        assert_eq!(status, 400, "reward {reward}: {body}");
    }

    // A session key nobody minted is refused on every route, never taken for the default
    // tenant's key.
    let mut with_default = config(&engine, true);
    with_default.tenants.default = Some("math".to_owned());
    let open = Sidecar::start(with_default).await;
    let unminted = format!("cbsk-{}", "0".repeat(64));
    for path in [
        "/init_trajectory".to_owned(),
        format!("/{uid}/1/v1/register_trajectory"),
        format!("/{uid}/1/v1/complete_trajectory"),
        format!("/{uid}/1/v1/chat/completions"),
    ] {
        let response = client()
            .post(open.url(&path))
            .bearer_auth(&unminted)
            .json(&chat)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{path}");
    }
    assert_eq!(engine.request_count(), before + 1);

    // Off (the default): the routes do not exist.
    let off_engine = MockUpstream::start().await;
    let off = Sidecar::start(config(&off_engine, false)).await;
    let response = client()
        .post(off.url("/init_trajectory"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}
