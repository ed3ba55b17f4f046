//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) for agents
//! that speak it — coding agents set `ANTHROPIC_BASE_URL` to the sidecar.
//!
//! Towards an OpenAI-compatible engine (`vllm`, `sglang`, `openai`) a Messages call is served as
//! the chat call it translates to ([`request`]): the engine is asked for its token ids and
//! logprobs exactly as for chat, the step recorded is a chat step (so stitching, plugins, export
//! and the trainer have no special case), and the answer goes back translated ([`response`]; a
//! stream event by event as the engine sends it, [`stream`]). `count_tokens` is the engine's own
//! (vLLM renders the prompt with its tokenizer), routed like a model call and never recorded.
//!
//! Errors reach the client in Anthropic's shape: the engine's are translated where the response
//! is read ([`crate::data_plane::forward`]), the sidecar's own by [`crate::data_plane::layers::dialect`].

pub mod request;
pub mod response;
pub mod stream;

/// The path a translated Messages call is forwarded to (the client's query string, such as the
/// SDK's `?beta=true`, means nothing to a chat endpoint).
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// The chat-completions body a Messages request body is served as.
pub fn to_chat_body(
    messages: &serde_json::Value,
) -> Result<(bytes::Bytes, serde_json::Value), request::Invalid> {
    let chat = request::to_chat(messages)?;
    let body = serde_json::to_vec(&chat).map_err(|e| request::Invalid {
        param: "body".to_owned(),
        message: e.to_string(),
    })?;
    Ok((bytes::Bytes::from(body), chat))
}
