//! A pool of sidecars in front of the real vLLM, as a platform team runs one: two replicas
//! sharing one Redis behind a real NGINX (the repo's `deploy/nginx` settings), and an agent on
//! the official OpenAI Python SDK holding a three-turn tool session with no session id. The
//! turns land on both replicas; the session is one trajectory, each step with vLLM's own tokens
//! and, as its next state, exactly the tool results the agent sent.

use std::process::Command;
use std::sync::Arc;

use clawback_datapool::Tokens;
use clawback_sidecar::config::UpstreamKind;
use clawback_tests::front_door::start_nginx;
use clawback_tests::harness::{
    printed_json, repo_root, run_client, sdk_python, test_config, Sidecar,
};
use clawback_tests::redis_server::RedisServer;
use clawback_tests::vllm::{self, MODEL};

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_behind_nginx_record_an_agents_tool_session_as_one_trajectory() {
    let _engine = super::share().await;
    let redis = RedisServer::start();
    let replica = || {
        let mut config = test_config(&[vllm::shared().url.clone()]);
        config.upstream_kind = UpstreamKind::Vllm;
        config.redis = Some(redis.url());
        config
    };
    let sidecars = [
        Sidecar::start(replica()).await,
        Sidecar::start(replica()).await,
    ];
    let nginx = start_nginx(&[sidecars[0].addr, sidecars[1].addr]).await;

    let mut command = Command::new(sdk_python());
    command
        .arg(repo_root().join("tests/sdk/python/tool_session.py"))
        .env("OPENAI_BASE_URL", nginx.url("/v1"))
        .env("OPENAI_API_KEY", "sk-agent")
        .env("CLAWBACK_MODEL", MODEL);
    let stdout = run_client(
        command,
        "the OpenAI Python SDK's tool session",
        &["turn_1", "turn_2", "turn_3"],
    )
    .await;
    let added = printed_json(&stdout, "session")["added"].clone();

    let served: Vec<u64> = sidecars
        .iter()
        .map(|s| s.app.metrics.steps_recorded.get())
        .collect();
    assert!(
        served.iter().all(|&n| n > 0),
        "NGINX kept the session on one replica ({served:?}): nothing was shared"
    );
    let store = Arc::clone(
        sidecars[0]
            .app
            .recorder
            .as_ref()
            .expect("recording")
            .store(),
    );
    let records = crate::trajectories_of(&store, "default", 3).await;
    let lengths: Vec<usize> = records.iter().map(|r| r.steps.len()).collect();
    assert_eq!(lengths, [3], "the session was split over the replicas");
    let steps = &records[0].steps;
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step.index as usize, i);
        let Tokens::Engine(tokens) = &step.tokens else {
            panic!("step {i} has no engine tokens: {:?}", step.tokens)
        };
        assert_eq!(
            tokens.completion_logprobs.len(),
            tokens.completion_token_ids.len(),
            "step {i}: a logprob per sampled token"
        );
    }
    for turn in 0..2 {
        let next = steps[turn]
            .next_state
            .as_ref()
            .unwrap_or_else(|| panic!("step {turn} has no next state"));
        assert_eq!(
            serde_json::Value::Array(next.messages.clone()),
            added[turn],
            "step {turn}'s next state is not the tool results the agent sent"
        );
        // The tool results answer the calls the engine made in that very step.
        let ids: Vec<&str> = steps[turn]
            .output
            .tool_calls
            .iter()
            .filter_map(|c| c["id"].as_str())
            .collect();
        let answered: Vec<&str> = next
            .messages
            .iter()
            .filter_map(|m| m["tool_call_id"].as_str())
            .collect();
        assert_eq!(ids, answered, "step {turn}");
    }
    assert!(steps[2].next_state.is_none());
}
