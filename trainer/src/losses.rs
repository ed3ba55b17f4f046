//! The trainer's RL objective (DESIGN.md "Losses"): importance ratios against the behaviour
//! log-probs the sidecar recorded, the asymmetric clipped surrogate with token-mean
//! aggregation, the advantage sources (group rollouts, binary per-step rewards, hint-guided
//! on-policy distillation) and their weighted combination, an optional k3 KL to the base,
//! and the metrics a step reports.
//!
//! Token tensors are `[batch, seq]` and aligned with the sequence they score: entry `t`
//! is about token `t`, and the loss mask is 1 only on tokens the model generated.
//! A step recorded without engine token ids is re-tokenised and has no behaviour
//! log-probs; pass the current policy's (detached) log-probs as behaviour for it, which
//! makes its ratio 1 — the batching code counts such steps in its metrics.

use tch::{Kind, Tensor};

/// What went wrong assembling a loss.
#[derive(Debug, thiserror::Error)]
pub enum LossError {
    #[error("{what} has shape {got:?}, expected {want:?}")]
    Shape {
        what: &'static str,
        got: Vec<i64>,
        want: Vec<i64>,
    },
    #[error("a step needs at least one judge vote")]
    NoVotes,
}

/// The asymmetric trust region of the ratio: `[1 - low, 1 + high]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipRange {
    pub low: f64,
    pub high: f64,
}

impl Default for ClipRange {
    fn default() -> Self {
        ClipRange {
            low: 0.2,
            high: 0.28,
        }
    }
}

/// Log-probabilities `[batch, seq]` of `targets` `[batch, seq]` under `logits`
/// `[batch, seq, vocab]`, in f32. For next-token prediction pass the logits of positions
/// `0..n-1` and the ids of positions `1..n`.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Tensor {
    logits
        .log_softmax(-1, Kind::Float)
        .gather(-1, &targets.unsqueeze(-1), false)
        .squeeze_dim(-1)
}

/// `sum(x · mask) / sum(mask)`: the mean over the tokens that count, 0 when none do.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Tensor {
    let mask = mask.to_kind(Kind::Float);
    (x * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)
}

/// The clipped surrogate and what it saw.
#[derive(Debug)]
pub struct Surrogate {
    /// Token-mean of `max(-ρA, -clip(ρ)A)` over the mask, differentiable in `logprobs`.
    pub loss: Tensor,
    /// Share of masked tokens whose gradient the clip removed.
    pub clip_fraction: f64,
    /// Mean ratio over the masked tokens.
    pub ratio_mean: f64,
}

/// `ℓ_t = max(−ρ_t A_t, −clip(ρ_t, 1−ε_low, 1+ε_high) A_t)`, `ρ_t = exp(logπ_θ − logπ_behaviour)`,
/// averaged over all masked tokens of the batch (token-mean, so long completions weigh
/// by their length rather than being averaged per sequence first).
pub fn clipped_surrogate(
    logprobs: &Tensor,
    behaviour_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: ClipRange,
) -> Result<Surrogate, LossError> {
    let shape = logprobs.size();
    for (what, t) in [
        ("behaviour log-probs", behaviour_logprobs),
        ("advantages", advantages),
        ("loss mask", mask),
    ] {
        same_shape(what, t, &shape)?;
    }
    let ratio = (logprobs - behaviour_logprobs.detach()).exp();
    let advantages = advantages.detach();
    let unclipped = -(&ratio * &advantages);
    let clipped = -(ratio.clamp(1.0 - clip.low, 1.0 + clip.high) * &advantages);
    let per_token = unclipped.maximum(&clipped);
    let loss = masked_mean(&per_token, mask);
    let (clip_fraction, ratio_mean) = tch::no_grad(|| {
        let clipped_active = clipped.gt_tensor(&unclipped).to_kind(Kind::Float);
        (
            masked_mean(&clipped_active, mask).double_value(&[]),
            masked_mean(&ratio, mask).double_value(&[]),
        )
    });
    Ok(Surrogate {
        loss,
        clip_fraction,
        ratio_mean,
    })
}

/// How group rewards become advantages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupNormalization {
    /// GRPO: `(R − mean) / std`, with the sample (n − 1) standard deviation.
    MeanStd,
    /// Dr. GRPO: `R − mean`, which does not up-weight groups that barely differ.
    MeanOnly,
}

/// Keeps the division finite when a group's rewards differ only by rounding.
const STD_EPSILON: f64 = 1e-6;

/// Per-rollout advantages of one group, or None when every reward is equal: such a
/// group carries no signal and is dropped.
pub fn group_advantages(rewards: &[f64], norm: GroupNormalization) -> Option<Vec<f64>> {
    let first = *rewards.first()?;
    if rewards.iter().all(|&r| r == first) {
        return None;
    }
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let centred = rewards.iter().map(|r| r - mean);
    Some(match norm {
        GroupNormalization::MeanOnly => centred.collect(),
        GroupNormalization::MeanStd => {
            let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let std = var.sqrt() + STD_EPSILON;
            centred.map(|c| c / std).collect()
        }
    })
}

/// A step's binary reward from `m` judge votes in {−1, 0, +1}: the value more than half
/// of the votes agree on, else 0 (no verdict, so the step is masked out).
pub fn majority_vote(votes: &[i8]) -> Result<i8, LossError> {
    if votes.is_empty() {
        return Err(LossError::NoVotes);
    }
    let half = votes.len() / 2;
    let count = |v: i8| votes.iter().filter(|&&x| x == v).count();
    Ok(if count(1) > half {
        1
    } else if count(-1) > half {
        -1
    } else {
        0
    })
}

/// Advantages and mask from one reward per sequence (`rewards` `[batch]`): the reward is
/// broadcast over the sequence's tokens, and sequences with reward 0 are masked out.
pub fn broadcast_step_rewards(
    rewards: &Tensor,
    loss_mask: &Tensor,
) -> Result<(Tensor, Tensor), LossError> {
    let batch = loss_mask.size()[0];
    same_shape("step rewards", rewards, &[batch])?;
    let r = rewards.to_kind(Kind::Float).unsqueeze(1);
    let advantages = r.expand_as(loss_mask).contiguous();
    let mask = loss_mask.to_kind(Kind::Float) * r.ne(0.0).to_kind(Kind::Float);
    Ok((advantages, mask))
}

/// Hint-guided on-policy distillation: `A_t = log π_teacher(a_t | s + hint) − log π_behaviour(a_t | s)`.
/// The teacher's log-probs are of the same completion tokens under the hint-augmented prompt
/// (see `chat_template::with_hint`), scored by `scoring::completion_logprobs` with the
/// frozen base or the current policy as `scoring::Teacher`. With `clip`, each `A_t` is clamped
/// to `±clip` nats: a token the teacher finds all but impossible (−10 nats) then counts as much
/// as one it merely disfavours, instead of steering the whole step alone.
pub fn opd_advantages(
    teacher_logprobs: &Tensor,
    behaviour_logprobs: &Tensor,
    clip: Option<f64>,
) -> Result<Tensor, LossError> {
    same_shape(
        "behaviour log-probs",
        behaviour_logprobs,
        &teacher_logprobs.size(),
    )?;
    let advantages = (teacher_logprobs - behaviour_logprobs).detach();
    Ok(match clip {
        Some(clip) => advantages.clamp(-clip, clip),
        None => advantages,
    })
}

/// The weights of the combined advantage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvantageWeights {
    pub rl: f64,
    pub opd: f64,
}

impl Default for AdvantageWeights {
    fn default() -> Self {
        AdvantageWeights { rl: 1.0, opd: 1.0 }
    }
}

/// One advantage source over the batch: per-token advantages and where they apply.
#[derive(Debug)]
pub struct AdvantageSource<'a> {
    pub advantages: &'a Tensor,
    pub mask: &'a Tensor,
}

/// `A_t = w_rl · r + w_opd · (teacher − behaviour)`, each term counted where its source
/// applies; the mask is where either does (a step the judges had no verdict on can still
/// learn from its hint, and the other way round).
pub fn combined_advantages(
    rl: Option<AdvantageSource<'_>>,
    opd: Option<AdvantageSource<'_>>,
    weights: AdvantageWeights,
) -> Option<(Tensor, Tensor)> {
    let term = |s: &AdvantageSource<'_>, w: f64| {
        let mask = s.mask.to_kind(Kind::Float);
        (s.advantages * &mask * w, mask)
    };
    match (
        rl.map(|s| term(&s, weights.rl)),
        opd.map(|s| term(&s, weights.opd)),
    ) {
        (Some((a, m)), None) | (None, Some((a, m))) => Some((a, m)),
        (Some((a1, m1)), Some((a2, m2))) => Some((a1 + a2, m1.maximum(&m2))),
        (None, None) => None,
    }
}

/// k3 estimator of KL(π_θ ‖ π_ref) per token, `exp(r) − r − 1` with `r = log π_ref − log π_θ`:
/// unbiased, always ≥ 0, and low-variance. Token-mean over the mask.
pub fn k3_kl(logprobs: &Tensor, reference_logprobs: &Tensor, mask: &Tensor) -> Tensor {
    let r = reference_logprobs.detach() - logprobs;
    masked_mean(&(r.exp() - &r - 1.0), mask)
}

/// Mean entropy (nats) of the policy's next-token distributions over the masked tokens.
pub fn entropy(logits: &Tensor, mask: &Tensor) -> f64 {
    tch::no_grad(|| {
        let logp = logits.log_softmax(-1, Kind::Float);
        let h = -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float);
        masked_mean(&h, mask).double_value(&[])
    })
}

/// The whole objective's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    pub clip: ClipRange,
    /// Coefficient of the k3 KL to the reference (the frozen base); 0 turns it off.
    pub kl_coef: f64,
    /// Clamp of the hint-distillation advantage, in nats ([`opd_advantages`]); `None`: none.
    pub opd_clip: Option<f64>,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            clip: ClipRange::default(),
            kl_coef: 0.0,
            opd_clip: None,
        }
    }
}

/// The tensors of one batch that the objective needs.
#[derive(Debug)]
pub struct PolicyBatch<'a> {
    /// `[batch, seq, vocab]` logits of the policy, aligned with the scored tokens.
    pub logits: &'a Tensor,
    /// `[batch, seq]` ids of the scored tokens.
    pub tokens: &'a Tensor,
    pub behaviour_logprobs: &'a Tensor,
    pub advantages: &'a Tensor,
    pub mask: &'a Tensor,
    /// Log-probs under the reference, needed when `kl_coef > 0`.
    pub reference_logprobs: Option<&'a Tensor>,
}

/// What a step reports besides its loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossMetrics {
    pub policy_loss: f64,
    pub clip_fraction: f64,
    pub ratio_mean: f64,
    /// k3 KL to the reference when one is given, else to the behaviour policy.
    pub kl: f64,
    pub entropy: f64,
    pub tokens: f64,
}

/// The loss to backpropagate and its metrics.
pub fn policy_loss(
    batch: &PolicyBatch<'_>,
    config: &LossConfig,
) -> Result<(Tensor, LossMetrics), LossError> {
    let logprobs = token_logprobs(batch.logits, batch.tokens);
    let surrogate = clipped_surrogate(
        &logprobs,
        batch.behaviour_logprobs,
        batch.advantages,
        batch.mask,
        config.clip,
    )?;
    let kl_to = batch.reference_logprobs.unwrap_or(batch.behaviour_logprobs);
    same_shape("reference log-probs", kl_to, &logprobs.size())?;
    let kl = k3_kl(&logprobs, kl_to, batch.mask);
    let metrics = LossMetrics {
        policy_loss: surrogate.loss.double_value(&[]),
        clip_fraction: surrogate.clip_fraction,
        ratio_mean: surrogate.ratio_mean,
        kl: kl.double_value(&[]),
        entropy: entropy(batch.logits, batch.mask),
        tokens: batch
            .mask
            .to_kind(Kind::Float)
            .sum(Kind::Float)
            .double_value(&[]),
    };
    let loss = if config.kl_coef > 0.0 && batch.reference_logprobs.is_some() {
        surrogate.loss + kl * config.kl_coef
    } else {
        surrogate.loss
    };
    Ok((loss, metrics))
}

fn same_shape(what: &'static str, t: &Tensor, want: &[i64]) -> Result<(), LossError> {
    if t.size() != want {
        return Err(LossError::Shape {
            what,
            got: t.size(),
            want: want.to_vec(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_slice(values).unsqueeze(0)
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }

    fn values(x: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(&x.to_kind(Kind::Double).flatten(0, -1)).unwrap()
    }

    #[test]
    fn the_surrogate_clips_asymmetrically_and_averages_over_masked_tokens() {
        // Ratios 1.5, 0.5, 0.5, 1.5, 1.0 against advantages +1, +1, −1, −1, +2:
        //   ρ=1.5 A=+1: max(−1.5, −1.28) = −1.28  (clipped at 1 + 0.28)
        //   ρ=0.5 A=+1: max(−0.5, −0.8)  = −0.5
        //   ρ=0.5 A=−1: max( 0.5,  0.8)  =  0.8   (clipped at 1 − 0.2)
        //   ρ=1.5 A=−1: max( 1.5,  1.28) =  1.5
        //   the fifth token is masked out.
        // Token mean: (−1.28 − 0.5 + 0.8 + 1.5) / 4 = 0.13; clip fraction 2/4.
        let behaviour = t(&[0.0, 0.0, 0.0, 0.0, 0.0]);
        let logp =
            t(&[1.5f32.ln(), 0.5f32.ln(), 0.5f32.ln(), 1.5f32.ln(), 0.0]).set_requires_grad(true);
        let adv = t(&[1.0, 1.0, -1.0, -1.0, 2.0]);
        let mask = t(&[1.0, 1.0, 1.0, 1.0, 0.0]);
        let s = clipped_surrogate(&logp, &behaviour, &adv, &mask, ClipRange::default()).unwrap();
        close(s.loss.double_value(&[]), 0.13);
        close(s.clip_fraction, 0.5);
        close(s.ratio_mean, 1.0);
        // d/dlogp of −ρA/4 is −ρA/4 where unclipped, 0 where the clip holds.
        s.loss.backward();
        let grad = values(&logp.grad());
        for (g, want) in grad.iter().zip([0.0, -0.125, 0.0, 0.375, 0.0]) {
            close(*g, want);
        }
    }

    #[test]
    fn grpo_divides_by_the_sample_std_and_dr_grpo_only_centres() {
        // mean 0.5, sample std sqrt(4 · 0.25 / 3) = 0.57735
        let grpo = group_advantages(&[1.0, 0.0, 0.0, 1.0], GroupNormalization::MeanStd).unwrap();
        for (a, want) in grpo.iter().zip([0.866025, -0.866025, -0.866025, 0.866025]) {
            close(*a, want);
        }
        let dr = group_advantages(&[1.0, 0.0, 0.0, 1.0], GroupNormalization::MeanOnly).unwrap();
        assert_eq!(dr, vec![0.5, -0.5, -0.5, 0.5]);
        let dr = group_advantages(&[3.0, 0.0, 0.0], GroupNormalization::MeanOnly).unwrap();
        assert_eq!(dr, vec![2.0, -1.0, -1.0]);
    }

    #[test]
    fn groups_whose_rewards_are_all_equal_are_dropped() {
        assert_eq!(
            group_advantages(&[1.0, 1.0, 1.0], GroupNormalization::MeanStd),
            None
        );
        assert_eq!(
            group_advantages(&[0.0; 4], GroupNormalization::MeanOnly),
            None
        );
        assert_eq!(group_advantages(&[], GroupNormalization::MeanOnly), None);
    }

    #[test]
    fn a_strict_majority_of_judge_votes_decides_the_step_reward() {
        assert_eq!(majority_vote(&[1, 1, -1]).unwrap(), 1);
        assert_eq!(majority_vote(&[-1, -1, 0]).unwrap(), -1);
        assert_eq!(majority_vote(&[1, -1, 0]).unwrap(), 0);
        assert_eq!(majority_vote(&[1, 1, -1, -1]).unwrap(), 0);
        assert!(majority_vote(&[]).is_err());
    }

    #[test]
    fn binary_rewards_cover_their_steps_tokens_and_zero_rewards_mask_the_step_out() {
        let loss_mask =
            Tensor::from_slice(&[0.0f32, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]).view([3, 3]);
        let rewards = Tensor::from_slice(&[1.0f32, 0.0, -1.0]);
        let (adv, mask) = broadcast_step_rewards(&rewards, &loss_mask).unwrap();
        assert_eq!(
            values(&adv),
            vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0, -1.0, -1.0, -1.0]
        );
        assert_eq!(
            values(&mask),
            vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
        );
        assert!(broadcast_step_rewards(&Tensor::from_slice(&[1.0f32]), &loss_mask).is_err());
    }

    #[test]
    fn opd_advantage_is_teacher_minus_behaviour_per_token() {
        let teacher = t(&[-1.0, -2.0, -0.25]);
        let behaviour = t(&[-1.5, -1.0, -0.25]);
        assert_eq!(
            values(&opd_advantages(&teacher, &behaviour, None).unwrap()),
            vec![0.5, -1.0, 0.0]
        );
        assert_eq!(
            values(&opd_advantages(&teacher, &behaviour, Some(0.75)).unwrap()),
            vec![0.5, -0.75, 0.0]
        );
    }

    #[test]
    fn combined_advantages_weigh_each_source_where_it_applies() {
        let rl_adv = t(&[1.0, 1.0, 1.0]);
        let rl_mask = t(&[1.0, 1.0, 0.0]);
        let opd_adv = t(&[0.5, -1.0, 2.0]);
        let opd_mask = t(&[1.0, 0.0, 1.0]);
        let weights = AdvantageWeights { rl: 1.0, opd: 0.5 };
        let (adv, mask) = combined_advantages(
            Some(AdvantageSource {
                advantages: &rl_adv,
                mask: &rl_mask,
            }),
            Some(AdvantageSource {
                advantages: &opd_adv,
                mask: &opd_mask,
            }),
            weights,
        )
        .unwrap();
        // 1 + 0.5·0.5, 1 + 0, 0 + 0.5·2
        assert_eq!(values(&adv), vec![1.25, 1.0, 1.0]);
        assert_eq!(values(&mask), vec![1.0, 1.0, 1.0]);
        assert!(combined_advantages(None, None, weights).is_none());
    }

    #[test]
    fn k3_kl_is_zero_on_agreement_and_matches_the_formula_otherwise() {
        // r = ln 2: 2 − ln 2 − 1 = 0.306853; r = −ln 2: 0.5 + ln 2 − 1 = 0.193147
        let logp = t(&[-1.0, -1.0, -1.0]);
        let reference = t(&[-1.0, -1.0 + 2f32.ln(), -1.0 - 2f32.ln()]);
        let each = |m: &[f32]| k3_kl(&logp, &reference, &t(m)).double_value(&[]);
        close(each(&[1.0, 0.0, 0.0]), 0.0);
        close(each(&[0.0, 1.0, 0.0]), 0.306853);
        close(each(&[0.0, 0.0, 1.0]), 0.193147);
        close(each(&[1.0, 1.0, 1.0]), (0.306853 + 0.193147) / 3.0);
    }

    #[test]
    fn entropy_is_log_vocab_for_uniform_and_near_zero_for_peaked_logits() {
        let logits =
            Tensor::from_slice(&[0.0f32, 0.0, 0.0, 0.0, 50.0, 0.0, 0.0, 0.0]).view([1, 2, 4]);
        close(entropy(&logits, &t(&[1.0, 0.0])), 4f64.ln());
        assert!(entropy(&logits, &t(&[0.0, 1.0])) < 1e-6);
    }

    #[test]
    fn token_logprobs_pick_the_target_from_the_log_softmax() {
        // log softmax of [0, ln 3] = [ln 1/4, ln 3/4]
        let logits = Tensor::from_slice(&[0.0f32, 3f32.ln()]).view([1, 1, 2]);
        let targets = Tensor::from_slice(&[1i64]).view([1, 1]);
        close(
            token_logprobs(&logits, &targets).double_value(&[0, 0]),
            0.75f64.ln(),
        );
    }

    #[test]
    fn the_policy_loss_adds_the_kl_term_only_with_a_reference() {
        let logits = Tensor::from_slice(&[0.0f32, 3f32.ln(), 0.0, 0.0]).view([1, 2, 2]);
        let tokens = Tensor::from_slice(&[1i64, 0]).view([1, 2]);
        let behaviour = t(&[0.75f32.ln(), 0.5f32.ln()]);
        let adv = t(&[1.0, -1.0]);
        let mask = t(&[1.0, 1.0]);
        let reference = t(&[0.75f32.ln() + 2f32.ln(), 0.5f32.ln()]);
        let batch = PolicyBatch {
            logits: &logits,
            tokens: &tokens,
            behaviour_logprobs: &behaviour,
            advantages: &adv,
            mask: &mask,
            reference_logprobs: Some(&reference),
        };
        let config = LossConfig {
            kl_coef: 0.1,
            ..LossConfig::default()
        };
        let (loss, m) = policy_loss(&batch, &config).unwrap();
        // Ratios are 1: surrogate = mean(−1, +1) = 0; KL = 0.306853 / 2.
        close(m.policy_loss, 0.0);
        close(m.kl, 0.306853 / 2.0);
        close(loss.double_value(&[]), 0.1 * 0.306853 / 2.0);
        close(m.tokens, 2.0);
        close(m.clip_fraction, 0.0);
    }
}
