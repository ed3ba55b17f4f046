//! What the gate reads of a version: its greedy reply to each prompt, and how far its
//! next-token distributions moved from the base's along the base's own replies.

use std::collections::BTreeMap;

use clawback_model::generate::greedy_batch;
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

/// Rows of one generation batch at most: what bounds the gate's memory, not its work.
const BATCH_ROWS: usize = 16;

/// The greedy replies of the base (`adapter` `None`) or the base plus `adapter` to `prompts`,
/// each asked as a user's one message in the model's chat template (its own default system
/// prompt, as an agent that sends none gets), in order. Prompts that render to the same number
/// of tokens are generated together as one batch.
pub fn greedy(
    model: &Model,
    text: &TextCodec,
    adapter: Option<&LoraAdapter>,
    prompts: &[&str],
    max_new_tokens: usize,
) -> Result<Vec<Reply>, RepliesError> {
    let rendered: Vec<Vec<i64>> = prompts
        .iter()
        .map(|prompt| {
            Ok(text
                .prompt_ids(&[json!({"role": "user", "content": prompt})], &[])?
                .into_iter()
                .map(i64::from)
                .collect())
        })
        .collect::<Result<_, RepliesError>>()?;
    let stop: Vec<i64> = text.eos().map(i64::from).into_iter().collect();
    let mut by_length: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, ids) in rendered.iter().enumerate() {
        by_length.entry(ids.len()).or_default().push(i);
    }
    let mut generated: Vec<Vec<i64>> = vec![Vec::new(); prompts.len()];
    for rows in by_length.values() {
        for chunk in rows.chunks(BATCH_ROWS) {
            let batch: Vec<Vec<i64>> = chunk.iter().map(|&i| rendered[i].clone()).collect();
            let replies = greedy_batch(model, adapter, &batch, max_new_tokens, &stop)?;
            for (&i, ids) in chunk.iter().zip(replies) {
                generated[i] = ids;
            }
        }
    }
    rendered
        .into_iter()
        .zip(generated)
        .map(|(prompt_ids, ids)| {
            let reply = text.reply_text(&ids)?;
            Ok(Reply {
                prompt_ids,
                ids,
                text: reply.trim().to_owned(),
            })
        })
        .collect()
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
