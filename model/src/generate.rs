//! Token generation with a KV cache: greedy, or sampled with temperature and top-p from a
//! seeded generator of our own, so that a rollout is reproducible from its seed alone.
//!
//! The log-probability reported for each token is the raw one (before temperature), which
//! is what vLLM reports by default and what the losses take as the behaviour policy.

use tch::{Kind, Tensor};

use crate::lora::LoraAdapter;
use crate::model::{Model, ModelError};

/// How to pick each next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub max_new_tokens: usize,
    /// 0 picks the most likely token (greedy).
    pub temperature: f64,
    /// Sample only from the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f64,
    pub seed: u64,
    /// Generation stops after emitting one of these (it is included in the output).
    pub stop_token_ids: Vec<i64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            stop_token_ids: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_new_tokens` were generated.
    Length,
}

/// The completion of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub token_ids: Vec<i64>,
    /// Raw log-probability of each generated token under the model.
    pub logprobs: Vec<f64>,
    pub finish_reason: FinishReason,
}

/// Continues `prompt` with the base model or the base plus `adapter`.
pub fn generate(
    model: &Model,
    adapter: Option<&LoraAdapter>,
    prompt: &[i64],
    params: &SamplingParams,
) -> Result<Generation, ModelError> {
    let _no_grad = tch::no_grad_guard();
    let mut rng = SplitMix64(params.seed);
    let mut cache = model.new_cache();
    let mut out = Generation {
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Length,
    };
    if prompt.is_empty() || params.max_new_tokens == 0 {
        return Ok(out);
    }
    let mut input = Tensor::from_slice(prompt).unsqueeze(0);
    for _ in 0..params.max_new_tokens {
        let logits = model.forward_cached(&input, adapter, &mut cache)?;
        let last: Vec<f32> = last_position(&logits)?;
        let next = if params.temperature <= 0.0 {
            argmax(&last)
        } else {
            sample(&last, params.temperature, params.top_p, &mut rng)
        };
        out.logprobs.push(log_softmax_at(&last, next));
        let id = next as i64;
        out.token_ids.push(id);
        if params.stop_token_ids.contains(&id) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        input = Tensor::from_slice(&[id]).unsqueeze(0);
    }
    Ok(out)
}

/// Greedy continuations of `prompts`, all of one length, run as one batch: each prompt's
/// generated ids up to and including its first stop token, or `max_new_tokens` of them. Prompts
/// of one length need no padding and no mask; a batch reads the weights once per position for
/// all its rows, which on a CPU is most of a small model's cost per token. (The trainer's gate
/// reads many short replies this way, prompts grouped by length.)
pub fn greedy_batch(
    model: &Model,
    adapter: Option<&LoraAdapter>,
    prompts: &[Vec<i64>],
    max_new_tokens: usize,
    stop_token_ids: &[i64],
) -> Result<Vec<Vec<i64>>, ModelError> {
    let _no_grad = tch::no_grad_guard();
    let rows = prompts.len();
    let mut out = vec![Vec::new(); rows];
    let Some(length) = prompts.first().map(Vec::len) else {
        return Ok(out);
    };
    if length == 0 || max_new_tokens == 0 {
        return Ok(out);
    }
    if prompts.iter().any(|p| p.len() != length) {
        return Err(ModelError::Tensor(
            "a greedy batch takes prompts of one length".to_owned(),
        ));
    }
    let (rows_i, length_i) = (
        i64::try_from(rows).map_err(|e| ModelError::Tensor(e.to_string()))?,
        i64::try_from(length).map_err(|e| ModelError::Tensor(e.to_string()))?,
    );
    let mut input = Tensor::from_slice(&prompts.concat()).view([rows_i, length_i]);
    let mut cache = model.new_cache();
    let mut done = vec![false; rows];
    for _ in 0..max_new_tokens {
        let logits = model.forward_cached(&input, adapter, &mut cache)?;
        let next = logits
            .select(1, -1)
            .argmax(-1, false)
            .to_device(tch::Device::Cpu);
        let next = Vec::<i64>::try_from(&next).map_err(|e| ModelError::Tensor(e.to_string()))?;
        for (row, &id) in next.iter().enumerate() {
            if !done[row] {
                out[row].push(id);
                done[row] = stop_token_ids.contains(&id);
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        input = Tensor::from_slice(&next).view([rows_i, 1]);
    }
    Ok(out)
}

/// The logits of the last position of the first sequence, as f32 on the host.
pub fn last_position(logits: &Tensor) -> Result<Vec<f32>, ModelError> {
    let seq = logits.size()[1];
    let last = logits
        .get(0)
        .get(seq - 1)
        .to_kind(Kind::Float)
        .to_device(tch::Device::Cpu);
    Vec::<f32>::try_from(&last).map_err(|e| ModelError::Tensor(e.to_string()))
}

pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

pub fn log_softmax_at(logits: &[f32], index: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum: f64 = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits[index] as f64 - max - log_sum
}

pub fn sample(logits: &[f32], temperature: f64, top_p: f64, rng: &mut SplitMix64) -> usize {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i, ((l as f64 - max) / temperature).exp()))
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= total);
    // Most likely first; ties broken by id so the order is reproducible.
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = 0;
    let mut mass = 0.0;
    for p in &probs {
        kept += 1;
        mass += p.1;
        if mass >= top_p {
            break;
        }
    }
    let probs = &probs[..kept];
    let mut target = rng.next_f64() * mass;
    for &(id, p) in probs {
        target -= p;
        if target <= 0.0 {
            return id;
        }
    }
    probs[kept - 1].0
}

/// A small, fast, seedable generator (Steele et al.'s SplitMix64); sampling needs
/// reproducibility, not cryptographic strength.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tiny_model;

    #[test]
    fn cached_decoding_gives_the_logits_of_a_full_forward_pass() {
        let model = tiny_model(3);
        let ids: Vec<i64> = vec![3, 14, 15, 9, 26, 5, 35, 8];
        let full = model
            .forward(&Tensor::from_slice(&ids).unsqueeze(0), None, false)
            .unwrap();
        let mut cache = model.new_cache();
        // A chunk of several positions after a cached prefix exercises the offset mask.
        let mut pieces = Vec::new();
        for chunk in [&ids[..3], &ids[3..6], &ids[6..7], &ids[7..]] {
            let input = Tensor::from_slice(chunk).unsqueeze(0);
            pieces.push(model.forward_cached(&input, None, &mut cache).unwrap());
        }
        let stepwise = Tensor::cat(&pieces, 1);
        let diff = (full - stepwise).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "max diff {diff}");
        assert_eq!(cache.len(), 8);
    }

    #[test]
    fn a_greedy_batch_gives_each_row_what_greedy_decoding_gives_it_alone() {
        let model = tiny_model(3);
        let prompts: Vec<Vec<i64>> = vec![vec![3, 14, 15, 9], vec![26, 5, 35, 8], vec![1, 2, 3, 4]];
        let alone: Vec<Vec<i64>> = prompts
            .iter()
            .map(|p| {
                let params = SamplingParams {
                    max_new_tokens: 10,
                    ..SamplingParams::default()
                };
                generate(&model, None, p, &params).unwrap().token_ids
            })
            .collect();
        let batch = greedy_batch(&model, None, &prompts, 10, &[]).unwrap();
        assert_eq!(batch, alone);
        // A row stops at its first stop token; the others go on.
        let stop = alone[0][2];
        let stopped = greedy_batch(&model, None, &prompts, 10, &[stop]).unwrap();
        for (row, ids) in stopped.iter().enumerate() {
            let end = alone[row]
                .iter()
                .position(|&id| id == stop)
                .map_or(alone[row].len(), |at| at + 1);
            assert_eq!(ids[..], alone[row][..end], "row {row}");
        }
        assert!(greedy_batch(&model, None, &[vec![1], vec![1, 2]], 4, &[]).is_err());
        assert_eq!(
            greedy_batch(&model, None, &[], 4, &[]).unwrap(),
            Vec::<Vec<i64>>::new()
        );
    }

    #[test]
    fn the_same_seed_samples_the_same_tokens_and_stop_ids_end_early() {
        let model = tiny_model(3);
        let params = SamplingParams {
            max_new_tokens: 12,
            temperature: 1.0,
            top_p: 0.9,
            seed: 42,
            stop_token_ids: vec![],
        };
        let a = generate(&model, None, &[1, 2, 3], &params).unwrap();
        let b = generate(&model, None, &[1, 2, 3], &params).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.token_ids.len(), 12);
        assert!(a.logprobs.iter().all(|&l| l <= 0.0));
        let stop = a.token_ids[4];
        let first = a.token_ids.iter().position(|&t| t == stop).unwrap();
        let stopped = generate(
            &model,
            None,
            &[1, 2, 3],
            &SamplingParams {
                stop_token_ids: vec![stop],
                ..params
            },
        )
        .unwrap();
        assert_eq!(stopped.finish_reason, FinishReason::Stop);
        assert_eq!(stopped.token_ids, a.token_ids[..=first]);
    }

    #[test]
    fn top_p_keeps_only_the_head_of_the_distribution() {
        // p ≈ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 leaves only the first token.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut rng = SplitMix64(7);
        for _ in 0..50 {
            assert_eq!(sample(&logits, 1.0, 0.5, &mut rng), 0);
        }
        let mut seen = [false; 4];
        for _ in 0..400 {
            seen[sample(&logits, 1.0, 1.0, &mut rng)] = true;
        }
        assert_eq!(seen, [true; 4]);
    }
}
