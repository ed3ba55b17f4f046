//! From the trajectories of one delivery to samples that carry their learning signal: rewards
//! combined by `datapool::reward`, samples built by `samples.rs`, and per generated span the
//! advantage and, for hint distillation, the teacher's prompt.
//!
//! - A **group** delivery (rollouts of one task): each completed trajectory's reward is compared
//!   with the others' (`losses::group_advantages`), and the trajectory's advantage is broadcast
//!   over every step it trains. Rollouts without any reward are left out of the comparison; a
//!   group whose rewards are all equal carries no signal and is dropped.
//! - A **single** trajectory (binary RL, OpenClaw-RL style): each step's own reward (else the
//!   outcome's) is its advantage; a reward of 0 or none masks the step out of the RL term.
//! - A step with a hint gets the teacher's hint-augmented prompt, scored at step time.
//!
//! A sample with neither an advantage nor a hint on any span is dropped here and counted.

use std::collections::HashMap;

use clawback_datapool::reward::{self, RewardWeights, Rewards};
use clawback_datapool::{StepId, TrajectoryRecord, TrajectoryStatus};
use serde::Serialize;

use crate::losses::{group_advantages, GroupNormalization};
use crate::samples::{samples_from, Sample, SampleOptions, SampleStats, SeenSteps};
use crate::train::text::TextCodec;

/// A sample ready for the optimizer.
#[derive(Debug, Clone)]
pub struct Scored {
    pub sample: Sample,
    /// Per span of `sample.spans`: the reward-driven advantage; `None` masks the span out of
    /// the RL term.
    pub advantages: Vec<Option<f32>>,
    /// Per span: the teacher's prompt ids (the step's prompt with its hint) when distilling.
    pub teacher_prompts: Vec<Option<Vec<u32>>>,
    /// The trajectory's reward, for the metrics.
    pub reward: Option<f64>,
}

impl Scored {
    /// Whether any span has something to learn from.
    pub fn has_signal(&self) -> bool {
        self.advantages.iter().any(Option::is_some)
            || self.teacher_prompts.iter().any(Option::is_some)
    }
}

/// Samples and steps left out, by reason (cumulative over a run, beside [`SampleStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Dropped {
    /// Trajectories without any reward (and, for single trajectories, without hints).
    pub no_reward: u64,
    /// Groups whose rewards were all equal (or that had fewer than two rewarded rollouts).
    pub no_signal: u64,
    /// Samples none of whose spans had an advantage or a hint.
    pub samples_without_signal: u64,
    /// `filter_error` evaluations ignored.
    pub filter_errors: u64,
    /// NaN or infinite rewards ignored.
    pub invalid_rewards: u64,
    /// Text-only steps skipped: no tokenizer/template in the model folder, or rendering failed.
    pub text_only_skipped: u64,
    /// Hints not distilled because distillation is off (`loss.opd_weight = 0`).
    pub hints_opd_off: u64,
    /// Step rewards not trained on because the reward term is off (`loss.rl_weight = 0`).
    pub rewards_rl_off: u64,
    /// Hints not distilled because the model folder has no tokenizer or chat template to
    /// render the teacher's prompt with.
    pub hints_no_tokenizer: u64,
    /// Hints whose teacher prompt could not be rendered (no user message to append the hint
    /// to, or the template failed).
    pub hints_unrenderable: u64,
    /// Samples longer than `batch.max_seq_len`.
    pub too_long: u64,
    /// Samples with a token id the model's vocabulary does not have (recorded by another model?).
    pub out_of_vocab: u64,
    /// Ready entries whose trajectory or group was gone from the store.
    pub missing: u64,
    /// Group members that were abandoned or still open.
    pub not_completed: u64,
}

/// How samples are built and scored.
#[derive(Debug, Clone)]
pub struct ScoreOptions<'a> {
    pub samples: SampleOptions,
    pub weights: &'a RewardWeights,
    pub normalization: GroupNormalization,
    /// Rewards only become advantages when the reward term counts (`loss.rl_weight > 0`):
    /// with it off, a reward is no signal — a sample with nothing else is not trained, and
    /// does not dilute the token mean of the samples that distil a hint.
    pub reinforce: bool,
    /// Hints are only turned into teacher prompts when distillation is on.
    pub distill: bool,
    pub max_seq_len: usize,
    /// Ids at or above it cannot be embedded: such samples are dropped, not trained.
    pub vocab_size: usize,
    pub text: Option<&'a TextCodec>,
}

/// The scored samples of one delivery: several trajectories when `is_group`, else one.
pub fn score_delivery(
    records: &[TrajectoryRecord],
    is_group: bool,
    options: &ScoreOptions<'_>,
    seen: &mut SeenSteps,
    stats: &mut SampleStats,
    dropped: &mut Dropped,
) -> Vec<Scored> {
    let completed: Vec<&TrajectoryRecord> = records
        .iter()
        .filter(|r| {
            let done = r.trajectory.status == TrajectoryStatus::Completed;
            if !done {
                dropped.not_completed += 1;
            }
            done
        })
        .collect();
    let rewards: Vec<Rewards> = completed
        .iter()
        .map(|r| {
            let rw = reward::combine(&r.evaluations, options.weights);
            dropped.filter_errors += rw.filter_errors;
            dropped.invalid_rewards += rw.invalid_rewards;
            rw
        })
        .collect();

    // Per trajectory: a fixed advantage (group) or per-step rewards (single).
    let group: Option<Vec<Option<f64>>> = is_group.then(|| {
        let rewarded: Vec<(usize, f64)> = rewards
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.trajectory_reward().map(|x| (i, x)))
            .collect();
        dropped.no_reward += (rewards.len() - rewarded.len()) as u64;
        let values: Vec<f64> = rewarded.iter().map(|&(_, r)| r).collect();
        let mut per = vec![None; rewards.len()];
        match group_advantages(&values, options.normalization) {
            Some(adv) => {
                for ((i, _), a) in rewarded.iter().zip(adv) {
                    per[*i] = Some(a);
                }
            }
            None => dropped.no_signal += 1,
        }
        per
    });

    let mut out = Vec::new();
    for (i, (record, rw)) in completed.iter().zip(&rewards).enumerate() {
        let built = samples_from(record, &options.samples, seen, stats);
        let steps: HashMap<StepId, &clawback_datapool::Step> =
            record.steps.iter().map(|s| (s.id, s)).collect();
        let mut samples = built.samples;
        for text_only in built.retokenise {
            let step = steps.get(&text_only.step);
            let ids = match (options.text, step) {
                (Some(text), Some(step)) => text.retokenise(step).ok(),
                _ => None,
            };
            match ids {
                Some((prompt, completion)) if !completion.is_empty() => {
                    samples.push(text_only.into_sample(&prompt, &completion))
                }
                _ => dropped.text_only_skipped += 1,
            }
        }
        let trajectory_reward = rw.trajectory_reward();
        let before = out.len();
        for sample in samples {
            if sample.len() > options.max_seq_len {
                dropped.too_long += 1;
                continue;
            }
            if sample
                .input_ids
                .iter()
                .any(|&id| id as usize >= options.vocab_size)
            {
                dropped.out_of_vocab += 1;
                continue;
            }
            let advantages = sample
                .spans
                .iter()
                .map(|span| {
                    let a = match &group {
                        Some(per) => per[i],
                        None => rw.step_reward(&span.step).filter(|&r| r != 0.0),
                    };
                    if a.is_some() && !options.reinforce {
                        dropped.rewards_rl_off += 1;
                        return None;
                    }
                    a.map(|a| a as f32)
                })
                .collect();
            let teacher_prompts = sample
                .spans
                .iter()
                .map(|span| {
                    let hint = rw.step_hint(&span.step)?;
                    let prompt = match (options.distill, options.text, steps.get(&span.step)) {
                        (false, _, _) => Err(&mut dropped.hints_opd_off),
                        (true, None, _) => Err(&mut dropped.hints_no_tokenizer),
                        (true, Some(text), Some(step)) => text
                            .hinted_prompt_ids(step, hint)
                            .map_err(|_| &mut dropped.hints_unrenderable),
                        (true, Some(_), None) => Err(&mut dropped.hints_unrenderable),
                    };
                    prompt.map_err(|counter| *counter += 1).ok()
                })
                .collect();
            let scored = Scored {
                sample,
                advantages,
                teacher_prompts,
                reward: trajectory_reward,
            };
            if scored.has_signal() {
                out.push(scored);
            } else {
                dropped.samples_without_signal += 1;
            }
        }
        if !is_group && out.len() == before && trajectory_reward.is_none() {
            dropped.no_reward += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clawback_datapool::example::tool_use_trajectory;
    use clawback_datapool::{
        Evaluation, EvaluationSource, GroupId, TenantId, TrajectoryId, UnixMs, Verdict,
    };

    use super::*;

    /// A rollout of the schema example with fresh ids and only `reward` (an outcome) as evaluation.
    fn rollout(reward: Option<f64>) -> TrajectoryRecord {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let mut r = tool_use_trajectory(tenant.clone());
        r.trajectory.id = TrajectoryId::new();
        r.trajectory = r.trajectory.in_group(GroupId::new(), 4);
        for s in &mut r.steps {
            s.id = StepId::new();
        }
        r.evaluations = reward
            .map(|reward| Evaluation {
                step: None,
                source: EvaluationSource::Plugin {
                    name: "task-solved".into(),
                    content_hash: "sha256:00".into(),
                },
                verdict: Verdict::Score {
                    reward: Some(reward),
                    hint: None,
                },
                created_at: UnixMs(1),
                ..r.evaluations[0].clone()
            })
            .into_iter()
            .collect();
        r
    }

    fn score(records: &[TrajectoryRecord], is_group: bool) -> (Vec<Scored>, Dropped) {
        score_with(records, is_group, true)
    }

    fn score_with(
        records: &[TrajectoryRecord],
        is_group: bool,
        reinforce: bool,
    ) -> (Vec<Scored>, Dropped) {
        let weights = RewardWeights::equal();
        let options = ScoreOptions {
            samples: SampleOptions::default(),
            weights: &weights,
            normalization: GroupNormalization::MeanOnly,
            reinforce,
            distill: true,
            max_seq_len: 4096,
            vocab_size: 200_000,
            text: None,
        };
        let mut dropped = Dropped::default();
        let out = score_delivery(
            records,
            is_group,
            &options,
            &mut SeenSteps::new(64),
            &mut SampleStats::default(),
            &mut dropped,
        );
        (out, dropped)
    }

    #[test]
    fn a_group_compares_its_rollouts_and_broadcasts_each_advantage_over_its_steps() {
        let records = [
            rollout(Some(1.0)),
            rollout(Some(0.0)),
            rollout(None),
            rollout(Some(0.5)),
        ];
        let (out, dropped) = score(&records, true);
        // The unrewarded rollout is left out of the comparison: mean of 1, 0, 0.5 is 0.5. A zero
        // advantage stays a sample: it adds no gradient but counts in the token mean, as in GRPO.
        let advantages: Vec<Vec<Option<f32>>> = out.iter().map(|s| s.advantages.clone()).collect();
        assert_eq!(
            advantages,
            vec![
                vec![Some(0.5), Some(0.5)],
                vec![Some(-0.5), Some(-0.5)],
                vec![Some(0.0), Some(0.0)]
            ]
        );
        assert_eq!(dropped.no_reward, 1);
        assert_eq!(dropped.samples_without_signal, 1); // the unrewarded rollout's sample
    }

    #[test]
    fn a_group_whose_rewards_are_all_equal_carries_no_signal() {
        let records = [rollout(Some(1.0)), rollout(Some(1.0))];
        let (out, dropped) = score(&records, true);
        assert!(out.is_empty());
        assert_eq!(dropped.no_signal, 1);
        assert_eq!(dropped.samples_without_signal, 2);
    }

    #[test]
    fn a_single_session_learns_from_each_steps_reward_and_a_zero_masks_it_out() {
        let (out, _) = score(&[rollout(Some(-1.0))], false);
        assert_eq!(out[0].advantages, vec![Some(-1.0), Some(-1.0)]);
        let (out, dropped) = score(&[rollout(Some(0.0))], false);
        assert!(out.is_empty());
        assert_eq!(dropped.samples_without_signal, 1);
    }

    #[test]
    fn a_sample_with_ids_beyond_the_vocabulary_is_dropped_not_trained() {
        let weights = RewardWeights::equal();
        let options = ScoreOptions {
            samples: SampleOptions::default(),
            weights: &weights,
            normalization: GroupNormalization::MeanOnly,
            reinforce: true,
            distill: false,
            max_seq_len: 4096,
            vocab_size: 1000, // the example's ids are Qwen's (151 644 and up)
            text: None,
        };
        let mut dropped = Dropped::default();
        let out = score_delivery(
            &[rollout(Some(1.0))],
            false,
            &options,
            &mut SeenSteps::new(64),
            &mut SampleStats::default(),
            &mut dropped,
        );
        assert!(out.is_empty());
        assert_eq!(dropped.out_of_vocab, 1);
    }

    #[test]
    fn with_the_reward_term_off_rewards_are_no_signal_and_counted() {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        // Both steps are rewarded; the one hint cannot be distilled without a tokenizer.
        let (out, dropped) = score_with(&[tool_use_trajectory(tenant)], false, false);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(dropped.rewards_rl_off, 2);
        assert_eq!(dropped.samples_without_signal, 1);
        let (_, grouped) = score_with(&[rollout(Some(1.0)), rollout(Some(0.0))], true, false);
        assert!(grouped.rewards_rl_off > 0);
    }

    #[test]
    fn the_schema_examples_hint_is_counted_as_dropped_without_a_tokenizer() {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let (out, dropped) = score(&[tool_use_trajectory(tenant)], false);
        assert_eq!(out.len(), 1);
        // Step 0 has its plugin's 1.0, step 1 the thumbs-up outcome.
        assert_eq!(out[0].advantages, vec![Some(1.0), Some(1.0)]);
        assert_eq!(out[0].teacher_prompts, vec![None, None]);
        assert_eq!(dropped.hints_no_tokenizer, 1);
        assert_eq!(dropped.hints_opd_off + dropped.hints_unrenderable, 0);
    }
}
