//! The official OpenAI SDKs (Python and Node) as agents, through the sidecar.
//!
//! The SDKs are installed by `scripts/test` (a venv under ~/.cache/clawback and `npm ci` in
//! tests/sdk/node); their locations can be overridden with CLAWBACK_SDK_PYTHON and
//! CLAWBACK_SDK_NODE_DIR.

use std::process::Command;

use clawback_tests::harness::{
    repo_root, sdk_node_dir, sdk_python as python, test_config, Sidecar,
};
use clawback_tests::mock::MockUpstream;

async fn run_client(mut command: Command, what: &str) {
    let sidecar_engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[sidecar_engine.url()])).await;
    command
        .env("OPENAI_BASE_URL", sidecar.base_url())
        .env("OPENAI_API_KEY", "sk-test-agent");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!("{what} did not start ({e}); run scripts/test, which installs the SDKs")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{stderr}"
    );
    for case in [
        "chat",
        "chat_stream_tools",
        "completions",
        "responses",
        "previous_response_id",
        "responses_stream",
        "models",
    ] {
        assert!(
            stdout.contains(&format!("ok {case}")),
            "{what} skipped {case}:\n{stdout}"
        );
    }
    // The follow-up reached the engine as the whole conversation, without the id.
    let follow_up = sidecar_engine
        .received()
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .find(|body| body.to_string().contains("And tomorrow?"))
        .expect("the follow-up reached the engine");
    assert!(
        follow_up.get("previous_response_id").is_none(),
        "{follow_up}"
    );
    assert!(
        follow_up["input"].to_string().contains("Weather in Paris?"),
        "{follow_up}"
    );
    // Every call went through the sidecar to the engine.
    assert!(sidecar_engine.request_count() >= 6);
    assert!(sidecar_engine
        .received()
        .iter()
        .all(|r| r.headers.contains_key("x-stainless-lang")));
}

#[tokio::test]
async fn the_python_sdk_works_through_the_sidecar() {
    let python = python();
    assert!(
        python.exists(),
        "{} missing: run scripts/test, which installs the OpenAI Python SDK",
        python.display()
    );
    let mut command = Command::new(python);
    command.arg(repo_root().join("tests/sdk/python/agent.py"));
    run_client(command, "python SDK").await;
}

#[tokio::test]
async fn the_node_sdk_works_through_the_sidecar() {
    let dir = sdk_node_dir();
    assert!(
        dir.join("node_modules/openai").exists(),
        "{} has no node_modules/openai: run scripts/test",
        dir.display()
    );
    let mut command = Command::new("node");
    command.arg(dir.join("agent.mjs")).current_dir(&dir);
    run_client(command, "node SDK").await;
}
