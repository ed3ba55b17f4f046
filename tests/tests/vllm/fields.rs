//! What the sidecar forwards to the real vLLM is what it decided on: the engine's sampling
//! options pass and vLLM serves them (with the per-tenant `cache_salt` the sidecar adds), its
//! extensions that act beyond the caller's answer are refused, and each tenant reads only its
//! own prefix cache — which, unsalted, vLLM shares between everyone who sends the same prefix.

use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::vllm::{self, MODEL};
use serde_json::{json, Value};

const ALPHA: &str = "sk-fields-alpha";
const BRAVO: &str = "sk-fields-bravo";

/// A prompt several of vLLM's cache blocks long, so a cached prefix shows in `cached_tokens`
/// (the tiny model's tokenizer takes about a token per byte: ~550 of its 1024).
fn long_prompt() -> String {
    (0..10)
        .map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog."))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `cached_tokens` of one chat call with `body` to `base` (the engine or the sidecar) as `key`.
async fn cached_tokens(base: &str, key: Option<&str>, body: &Value) -> u64 {
    let mut request = super::client()
        .post(format!("{base}/v1/chat/completions"))
        .json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status();
    let answer: Value = response.json().await.expect("a JSON answer");
    assert_eq!(status, 200, "{answer}");
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn vllm_serves_what_is_forwarded_and_each_tenant_reads_only_its_own_prefix_cache() {
    // An engine of its own: the cache this test reads must hold only its own calls.
    let engine = tokio::task::spawn_blocking(|| vllm::start(&["--enable-prompt-tokens-details"]))
        .await
        .expect("vLLM starts");
    let mut config = test_config(std::slice::from_ref(&engine.url));
    config.upstream_kind = UpstreamKind::Vllm;
    config.tenants.default = None;
    for (key, tenant) in [(ALPHA, "alpha"), (BRAVO, "bravo")] {
        config.tenants.keys.insert(key_hash(key), tenant.to_owned());
    }
    let sidecar = Sidecar::start(config).await;
    let base = sidecar.base_url();
    let base = base.trim_end_matches("/v1");

    // Unsalted, vLLM shares a prefix between callers: the second call reads the first's.
    let shared = json!({"model": MODEL, "max_tokens": 1, "temperature": 0,
                        "messages": [{"role": "user", "content": format!("A {}", long_prompt())}]});
    assert_eq!(cached_tokens(&engine.url, None, &shared).await, 0);
    let unsalted = cached_tokens(&engine.url, None, &shared).await;
    assert!(
        unsalted > 0,
        "vLLM cached nothing: {}",
        engine.log.display()
    );

    // Through the sidecar, each tenant has a cache of its own.
    let mut own = shared.clone();
    own["messages"][0]["content"] = json!(format!("B {}", long_prompt()));
    assert_eq!(cached_tokens(base, Some(ALPHA), &own).await, 0);
    assert!(cached_tokens(base, Some(ALPHA), &own).await > 0);
    assert_eq!(
        cached_tokens(base, Some(BRAVO), &own).await,
        0,
        "bravo read alpha's cached prefix"
    );
    // Nor does the unsalted prefix of someone who reached the engine some other way reach them.
    assert_eq!(cached_tokens(base, Some(BRAVO), &shared).await, 0);

    // vLLM takes every sampling option the sidecar forwards.
    let mut options = shared.clone();
    for (field, value) in [
        ("top_k", json!(5)),
        ("min_p", json!(0.05)),
        ("repetition_penalty", json!(1.1)),
        ("min_tokens", json!(1)),
        ("stop_token_ids", json!([0])),
        ("include_stop_str_in_output", json!(false)),
        ("skip_special_tokens", json!(true)),
        ("truncate_prompt_tokens", json!(900)),
        ("chat_template_kwargs", json!({"enable_thinking": false})),
        ("include_reasoning", json!(false)),
        ("return_tokens_as_token_ids", json!(false)),
    ] {
        options[field] = value;
    }
    cached_tokens(base, Some(ALPHA), &options).await;

    // And refuses, before vLLM sees them, what acts beyond the caller's own answer.
    for (field, value) in [
        ("priority", json!(-100)),
        ("cache_salt", json!("someone-elses")),
        ("kv_transfer_params", json!({"do_remote_prefill": true})),
        ("vllm_xargs", json!({"x": 1})),
        ("request_id", json!("fixed")),
        ("chat_template", json!("{{ messages }}")),
    ] {
        let mut body = shared.clone();
        body[field] = value;
        let response = super::client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(ALPHA)
            .json(&body)
            .send()
            .await
            .expect("an answer");
        assert_eq!(response.status(), 400, "{field}");
        let answer: Value = response.json().await.expect("an OpenAI error");
        assert_eq!(
            answer["error"]["code"], "not_forwarded",
            "{field}: {answer}"
        );
    }
}
