//! What to ask the engine for: rewrites an agent's request so that a vLLM or SGLang engine returns
//! the token ids and logprobs it sampled, and remembers what was added so that the response can
//! be given back to the agent as if nothing had been asked.
//!
//! What each engine can give (from their OpenAI-compatible servers' source):
//! - **vLLM**, chat and completions: `return_token_ids: true` → `prompt_token_ids` and per-choice
//!   `token_ids` (EOS included), streaming or not; `logprobs` (chat: `true`, completions: an
//!   integer, `0` = only the sampled token). vLLM ≈0.10.2 turns logprobs off when `top_logprobs`
//!   is an explicit `null`, so it becomes `0` whenever logprobs are injected.
//! - **SGLang**, chat and completions: `return_token_ids` only when not streaming (a streamed call
//!   with it is refused with an error), `logprobs` either way. A streamed SGLang call therefore
//!   only gets logprobs injected, and its step is recorded text-only: logprobs whose tokens are
//!   strings cannot be tied to ids without re-tokenising, which is what `Tokens::None` tells the
//!   trainer it must do.
//! - `/v1/responses` (every engine), kind `openai`, and completions with `echo`: nothing to ask
//!   for; text only.
//!
//! Keys keep their order: a field the client sent is changed in place, a new one is appended.

use serde_json::{Map, Value};

use clawback_datapool::Endpoint;

use crate::data_plane::upstream::UpstreamKind;

/// What the sidecar added to a request that the client did not ask for, and therefore must be
/// taken out of the response ([`super::strip`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Injected {
    /// `return_token_ids` was injected: `prompt_token_ids` and `token_ids` come back unasked.
    pub token_ids: bool,
    /// `logprobs` was injected: every choice's `logprobs` comes back filled.
    pub logprobs: bool,
    /// How the engine writes a token-id field it was not asked for.
    pub unasked: Unasked,
}

impl Injected {
    /// Whether responses need stripping at all; when not, they are forwarded byte for byte.
    pub fn is_empty(&self) -> bool {
        !self.token_ids && !self.logprobs
    }
}

/// How an engine spells a token-id field nobody asked for, so that stripping gives back exactly
/// what it would have sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unasked {
    /// vLLM sets `prompt_token_ids` and `token_ids` to `null` explicitly.
    #[default]
    Null,
    /// SGLang's serialisers drop them.
    Absent,
}

/// Rewrites `body` to ask `kind`'s engine for token ids and logprobs on `endpoint`, and returns
/// what was added. A body that is not a JSON object is left alone.
pub fn inject(kind: UpstreamKind, endpoint: Endpoint, body: &mut Value) -> Injected {
    let Some(request) = body.as_object_mut() else {
        return Injected::default();
    };
    let streaming = request.get("stream") == Some(&Value::Bool(true));
    // With `echo`, a completion's ids and logprobs start with the prompt's: they would not be
    // the sampled tokens alone, so the call is recorded as text.
    let echo = request.get("echo") == Some(&Value::Bool(true));
    let (ids_possible, unasked) = match (kind, endpoint) {
        (UpstreamKind::Openai | UpstreamKind::Anthropic, _)
        | (_, Endpoint::Responses | Endpoint::Messages) => return Injected::default(),
        (_, Endpoint::Completions) if echo => return Injected::default(),
        (UpstreamKind::Vllm, _) => (true, Unasked::Null),
        (UpstreamKind::Sglang, _) => (!streaming, Unasked::Absent),
    };
    let token_ids = ids_possible && ask_for_token_ids(request);
    let logprobs = match endpoint {
        Endpoint::Completions => ask_for_completion_logprobs(request),
        _ => ask_for_chat_logprobs(request),
    };
    Injected {
        token_ids,
        logprobs,
        unasked,
    }
}

/// Sets `return_token_ids: true`; `true` when the client had not asked for them itself.
fn ask_for_token_ids(request: &mut Map<String, Value>) -> bool {
    if request.get("return_token_ids") == Some(&Value::Bool(true)) {
        return false;
    }
    request.insert("return_token_ids".to_owned(), Value::Bool(true));
    true
}

/// Chat: `logprobs: true`, with `top_logprobs` at least explicit `0`.
fn ask_for_chat_logprobs(request: &mut Map<String, Value>) -> bool {
    if request.get("logprobs") == Some(&Value::Bool(true)) {
        return false;
    }
    request.insert("logprobs".to_owned(), Value::Bool(true));
    if request.get("top_logprobs").is_none_or(Value::is_null) {
        request.insert("top_logprobs".to_owned(), Value::from(0));
    }
    true
}

/// Completions: `logprobs` is the number of alternatives; `0` asks for the sampled token only.
fn ask_for_completion_logprobs(request: &mut Map<String, Value>) -> bool {
    if request.get("logprobs").is_some_and(Value::is_u64) {
        return false;
    }
    request.insert("logprobs".to_owned(), Value::from(0));
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(body: &Value) -> Vec<&str> {
        body.as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_vllm_chat_request_asks_for_ids_and_logprobs_and_keeps_its_key_order() {
        let mut body = json!({"model": "m", "logprobs": false, "messages": [], "stream": true});
        let injected = inject(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body);
        assert_eq!(
            injected,
            Injected {
                token_ids: true,
                logprobs: true,
                unasked: Unasked::Null
            }
        );
        assert_eq!(
            keys(&body),
            [
                "model",
                "logprobs",
                "messages",
                "stream",
                "return_token_ids",
                "top_logprobs"
            ]
        );
        assert_eq!(body["logprobs"], json!(true));
        assert_eq!(body["top_logprobs"], json!(0));
        assert_eq!(body["return_token_ids"], json!(true));
    }

    #[test]
    fn an_explicit_null_top_logprobs_becomes_zero_so_vllm_keeps_logprobs_on() {
        let mut body = json!({"messages": [], "top_logprobs": null});
        inject(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body);
        assert_eq!(body["top_logprobs"], json!(0));
        assert_eq!(
            keys(&body),
            ["messages", "top_logprobs", "return_token_ids", "logprobs"]
        );
    }

    #[test]
    fn what_the_client_asked_for_itself_is_kept_and_not_marked_for_stripping() {
        let mut body = json!({"messages": [], "logprobs": true, "top_logprobs": 5,
                              "return_token_ids": true});
        let before = body.clone();
        let injected = inject(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body);
        assert!(injected.is_empty());
        assert_eq!(body, before);
    }

    #[test]
    fn a_client_top_logprobs_survives_injected_logprobs() {
        let mut body = json!({"messages": [], "top_logprobs": 3});
        let injected = inject(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body);
        assert!(injected.logprobs);
        assert_eq!(body["top_logprobs"], json!(3));
    }

    #[test]
    fn completions_ask_for_an_integer_logprobs_of_zero() {
        let mut body = json!({"prompt": "hi", "logprobs": null});
        let injected = inject(UpstreamKind::Vllm, Endpoint::Completions, &mut body);
        assert!(injected.token_ids && injected.logprobs);
        assert_eq!(body["logprobs"], json!(0));
        assert!(body.get("top_logprobs").is_none());

        let mut asked = json!({"prompt": "hi", "logprobs": 2});
        let injected = inject(UpstreamKind::Vllm, Endpoint::Completions, &mut asked);
        assert!(!injected.logprobs);
        assert_eq!(asked["logprobs"], json!(2));
    }

    #[test]
    fn a_streamed_sglang_call_only_gets_logprobs_because_ids_would_be_an_error() {
        let mut body = json!({"messages": [], "stream": true});
        let injected = inject(UpstreamKind::Sglang, Endpoint::ChatCompletions, &mut body);
        assert!(!injected.token_ids && injected.logprobs);
        assert!(body.get("return_token_ids").is_none());
        assert_eq!(injected.unasked, Unasked::Absent);

        let mut whole = json!({"messages": [], "stream": false});
        let injected = inject(UpstreamKind::Sglang, Endpoint::ChatCompletions, &mut whole);
        assert!(injected.token_ids && injected.logprobs);
    }

    #[test]
    fn openai_upstreams_and_the_responses_api_are_left_alone() {
        for (kind, endpoint) in [
            (UpstreamKind::Openai, Endpoint::ChatCompletions),
            (UpstreamKind::Openai, Endpoint::Completions),
            (UpstreamKind::Vllm, Endpoint::Responses),
            (UpstreamKind::Sglang, Endpoint::Responses),
        ] {
            let mut body = json!({"model": "m", "input": "hi", "messages": []});
            let before = body.clone();
            assert!(inject(kind, endpoint, &mut body).is_empty());
            assert_eq!(body, before);
        }
    }

    #[test]
    fn an_echoed_completion_is_left_alone_as_its_ids_would_include_the_prompt() {
        let mut body = json!({"prompt": "hi", "echo": true});
        assert!(inject(UpstreamKind::Vllm, Endpoint::Completions, &mut body).is_empty());
        assert_eq!(body, json!({"prompt": "hi", "echo": true}));
    }

    #[test]
    fn a_body_that_is_not_an_object_is_left_alone() {
        let mut body = json!([1, 2]);
        assert!(inject(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut body).is_empty());
    }
}
