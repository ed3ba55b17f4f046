//! Stateful Responses through the sidecar to the real vLLM: the OpenAI Python SDK sends only new
//! items with `previous_response_id` — vLLM keeps no responses of its own here
//! (`VLLM_ENABLE_RESPONSES_API_STORE` is off, its default), the sidecar resolves the id — and
//! the session is recorded as one trajectory whose steps carry the whole conversation. Another
//! tenant can neither continue nor read it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId, TrajectoryRecord};
use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{
    printed_json, repo_root, run_client, sdk_python, test_config, Sidecar,
};
use clawback_tests::vllm::{self, MODEL};
use serde_json::json;

const KEY: &str = "sk-stateful";
const OTHER: &str = "sk-someone-else";

async fn one_trajectory(store: &Arc<dyn Store>, steps: usize) -> TrajectoryRecord {
    let tenant = TenantId::new("stateful").expect("tenant");
    for _ in 0..200 {
        for header in store
            .list_trajectories(&tenant, None, 100)
            .await
            .unwrap_or_default()
        {
            if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
                if record.steps.len() >= steps {
                    return record;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no trajectory of {steps} steps");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_previous_response_id_session_is_served_by_vllm_and_recorded_whole_as_one_trajectory() {
    let _engine = super::share().await;
    let mut config = test_config(&[vllm::shared().url.clone()]);
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.default = None;
    config
        .tenants
        .keys
        .insert(key_hash(KEY), "stateful".to_owned());
    config
        .tenants
        .keys
        .insert(key_hash(OTHER), "other".to_owned());
    let sidecar = Sidecar::start(config).await;
    let store = Arc::clone(sidecar.app.recorder.as_ref().expect("recording").store());

    let mut command = Command::new(sdk_python());
    command
        .arg(repo_root().join("tests/sdk/python/responses_session.py"))
        .env("OPENAI_BASE_URL", sidecar.base_url())
        .env("OPENAI_API_KEY", KEY)
        .env("OTHER_API_KEY", OTHER)
        .env("CLAWBACK_MODEL", MODEL);
    let cases = [
        "previous_response_id",
        "previous_response_id_stream",
        "other_tenant_refused",
    ];
    let stdout = run_client(command, "the OpenAI Python SDK", &cases).await;
    let session = printed_json(&stdout, "session");

    let record = one_trajectory(&store, 3).await;
    assert_eq!(record.steps.len(), 3, "the session is one trajectory");
    let texts: Vec<&str> = session["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().unwrap_or_default())
        .collect();
    let system = json!({"role": "system", "content": "You are a weather agent."});
    assert_eq!(
        record.steps[0].request.messages,
        vec![
            system.clone(),
            json!({"role": "user", "content": "What's the weather in Paris?"})
        ]
    );
    // The third step carries the whole conversation, though the call sent one new item.
    let mut whole = vec![
        system,
        json!({"role": "user", "content": "What's the weather in Paris?"}),
    ];
    if !texts[0].is_empty() {
        whole.push(json!({"role": "assistant", "content": texts[0]}));
    }
    whole.push(json!({"role": "user", "content": "And in Rome?"}));
    if !texts[1].is_empty() {
        whole.push(json!({"role": "assistant", "content": texts[1]}));
    }
    whole.push(json!({"role": "user", "content": "Thanks. And tomorrow?"}));
    assert_eq!(record.steps[2].request.messages, whole);
    for (i, step) in record.steps.iter().enumerate() {
        assert_eq!(
            step.output.content.as_deref().unwrap_or_default(),
            texts[i],
            "step {i}"
        );
    }
    // The next state of each step is what the following call added.
    let next = record.steps[1].next_state.as_ref().expect("a next state");
    assert_eq!(
        next.messages,
        vec![json!({"role": "user", "content": "Thanks. And tomorrow?"})]
    );
}
