//! Log-probabilities of a given completion after a given prompt: the teacher's side of
//! hint-guided distillation (the completion scored under the hint-augmented prompt), and
//! the behaviour log-probs of steps recorded without them (scored by the current policy).

use tch::{Kind, Tensor};

use crate::losses::token_logprobs;
use crate::sampler::Sampler;
use clawback_model::lora::LoraAdapter;
use clawback_model::model::{Model, ModelError};

/// Which weights score the completion under the hint-augmented context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teacher {
    /// The base model without any adapter: a fixed teacher.
    FrozenBase,
    /// The tenant's adapter being trained: the policy teaches itself with the hint.
    CurrentPolicy,
}

impl Teacher {
    /// The adapter the teacher runs with, given the policy's.
    pub fn adapter(self, policy: &LoraAdapter) -> Option<&LoraAdapter> {
        match self {
            Teacher::FrozenBase => None,
            Teacher::CurrentPolicy => Some(policy),
        }
    }
}

/// `log π(completion_t | prompt, completion_<t)` for every completion token under `sampler`'s
/// distribution (the model's own softmax when it is neutral), `[n]` in f32, without
/// gradients. Empty when the completion is.
pub fn completion_logprobs(
    model: &Model,
    adapter: Option<&LoraAdapter>,
    prompt: &[i64],
    completion: &[i64],
    sampler: &Sampler,
) -> Result<Tensor, ModelError> {
    if completion.is_empty() || prompt.is_empty() {
        return Ok(Tensor::zeros([0], (Kind::Float, model.placement().device)));
    }
    let _no_grad = tch::no_grad_guard();
    let ids = Tensor::from_slice(&[prompt, completion].concat()).unsqueeze(0);
    let total = ids.size()[1];
    // Position t predicts token t + 1: the completion is predicted from the prompt's last
    // position onwards, and the sequence's last position predicts nothing we score.
    let inputs = ids.narrow(1, 0, total - 1);
    let logits = model.forward(&inputs, adapter, false)?;
    let start = prompt.len() as i64 - 1;
    let n = completion.len() as i64;
    let scored = logits.narrow(1, start, n);
    if !sampler.is_neutral() {
        return Ok(sampler
            .token_logprobs(&scored.squeeze_dim(0), prompt, completion)
            .0);
    }
    let targets = ids.narrow(1, start + 1, n).to_device(scored.device());
    Ok(token_logprobs(&scored, &targets).squeeze_dim(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawback_model::generate::{generate, SamplingParams};
    use clawback_model::lora::LoraConfig;
    use clawback_model::test_support::tiny_model;

    #[test]
    fn scoring_a_sampled_completion_gives_the_logprobs_generation_reported() {
        let model = tiny_model(5);
        let prompt = [4i64, 8, 15, 16];
        let params = SamplingParams {
            max_new_tokens: 6,
            temperature: 1.0,
            seed: 9,
            ..SamplingParams::default()
        };
        let out = generate(&model, None, &prompt, &params).unwrap();
        let scored =
            completion_logprobs(&model, None, &prompt, &out.token_ids, &Sampler::NEUTRAL).unwrap();
        let scored = Vec::<f64>::try_from(&scored.to_kind(Kind::Double)).unwrap();
        for (a, b) in scored.iter().zip(&out.logprobs) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert_eq!(scored.len(), 6);
    }

    #[test]
    fn the_teacher_is_the_base_or_the_policy_as_configured() {
        let model = tiny_model(6);
        let policy =
            LoraAdapter::new(model.config(), LoraConfig::default(), tch::Device::Cpu).unwrap();
        assert!(Teacher::FrozenBase.adapter(&policy).is_none());
        assert!(Teacher::CurrentPolicy.adapter(&policy).is_some());
    }
}
