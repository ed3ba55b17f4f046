//! What the gate reads of a version: its greedy reply to each prompt, and how far its
//! next-token distributions moved from the base's along the base's own replies.

use clawback_model::generate::{generate, SamplingParams};
use clawback_model::lora::LoraAdapter;
use clawback_model::model::{Model, ModelError};
use serde_json::json;
use tch::{Kind, Tensor};

use crate::train::text::{TextCodec, TextError};

#[derive(Debug, thiserror::Error)]
pub enum RepliesError {
    #[error("the gate's prompt: {0}")]
    Text(#[from] TextError),
    #[error("the gate's generation: {0}")]
    Model(#[from] ModelError),
    #[error("the gate's KL: {0}")]
    Tensor(String),
}

/// One greedy reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The prompt as the chat template renders it (the generation prompt included).
    pub prompt_ids: Vec<i64>,
    /// The generated ids, the end of turn included when it came.
    pub ids: Vec<i64>,
    pub text: String,
}

/// The greedy reply of the base (`adapter` `None`) or the base plus `adapter` to `prompt`, asked
/// as a user's one message in the model's chat template (its own default system prompt, as an
/// agent that sends none gets).
pub fn greedy(
    model: &Model,
    text: &TextCodec,
    adapter: Option<&LoraAdapter>,
    prompt: &str,
    max_new_tokens: usize,
) -> Result<Reply, RepliesError> {
    let prompt_ids: Vec<i64> = text
        .prompt_ids(&[json!({"role": "user", "content": prompt})], &[])?
        .into_iter()
        .map(i64::from)
        .collect();
    let params = SamplingParams {
        max_new_tokens,
        stop_token_ids: text.eos().map(i64::from).into_iter().collect(),
        ..SamplingParams::default()
    };
    let generated = generate(model, adapter, &prompt_ids, &params)?;
    let reply = text.reply_text(&generated.token_ids)?;
    Ok(Reply {
        prompt_ids,
        ids: generated.token_ids,
        text: reply.trim().to_owned(),
    })
}

/// Σ over `reply`'s tokens of KL(candidate ‖ base) of the next-token distribution at each, in
/// nats, and the number of tokens: the full distributions compared, not one sampled token.
pub fn kl_along(
    model: &Model,
    candidate: &LoraAdapter,
    reply: &Reply,
) -> Result<(f64, usize), RepliesError> {
    if reply.ids.is_empty() {
        return Ok((0.0, 0));
    }
    let _no_grad = tch::no_grad_guard();
    let mut ids = reply.prompt_ids.clone();
    ids.extend(&reply.ids);
    let input = Tensor::from_slice(&ids)
        .unsqueeze(0)
        .to_device(model.placement().device);
    // The positions that predict the reply's tokens: the prompt's last, and each reply token
    // but the last.
    let start = i64::try_from(reply.prompt_ids.len() - 1)
        .map_err(|e| RepliesError::Tensor(e.to_string()))?;
    let len = i64::try_from(reply.ids.len()).map_err(|e| RepliesError::Tensor(e.to_string()))?;
    let log_probs = |adapter: Option<&LoraAdapter>| -> Result<Tensor, RepliesError> {
        Ok(model
            .forward(&input, adapter, false)?
            .narrow(1, start, len)
            .to_kind(Kind::Float)
            .log_softmax(-1, Kind::Float))
    };
    let candidate = log_probs(Some(candidate))?;
    let base = log_probs(None)?;
    let kl = (candidate.exp() * (&candidate - &base)).sum(Kind::Double);
    let total = kl.double_value(&[]);
    Ok((total.max(0.0), reply.ids.len()))
}
