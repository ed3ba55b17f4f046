//! How a trajectory's evaluations combine into the rewards and hints the trainer learns from.
//! Pure functions over `&[Evaluation]`: the same rule for every store, every trainer and every
//! export, written down once here and in `SCHEMA.md` ("Rewards").
//!
//! **The rule.** Evaluations are grouped by what they judge: one step, or the whole trajectory
//! (the outcome, `step` absent). For each of them:
//! 1. **Explicit feedback wins.** When any `feedback` evaluation gives a reward, the most recent one
//!    is the reward (a person who corrects a thumb means the correction), and no plugin counts.
//! 2. **Otherwise the plugins' weighted mean**: `Σ wᵢ·rᵢ / Σ wᵢ` over the plugins that gave a
//!    reward, `wᵢ` from [`RewardWeights`] (1.0 unless configured; a weight of 0 leaves the
//!    plugin out). A plugin that scored the same target more than once (a re-run after a hot
//!    reload) counts once, with its most recent score.
//! 3. `filter_error` verdicts carry no score: they are ignored and counted, and so are rewards
//!    that are not finite numbers.
//! 4. **Hints**: the most recent hint, feedback before plugins (the same precedence as rewards).
//!    The most recent rather than the longest: a later hint was written knowing more of the
//!    trajectory, and length is no measure of quality.
//!
//! "Most recent" is by `created_at`; evaluations with the same time keep the order they were
//! appended in, the later one winning. The trajectory-level outcome is combined by the same rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::StepId;
use crate::schema::{Evaluation, EvaluationSource, Verdict};

/// A plugin weight that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("reward weight {weight} for plugin {plugin:?} must be a finite number ≥ 0")]
pub struct InvalidWeight {
    pub plugin: String,
    pub weight: f64,
}

/// Per-plugin weights of the plugins' weighted mean, keyed by plugin name: 1.0 for a plugin not
/// listed, 0 to ignore one. In TOML a table of `plugin-name = weight`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, f64>", into = "BTreeMap<String, f64>")]
pub struct RewardWeights {
    weights: BTreeMap<String, f64>,
}

impl RewardWeights {
    /// Every plugin weighs 1.0.
    pub fn equal() -> Self {
        RewardWeights::default()
    }

    /// Sets `plugin`'s weight.
    pub fn with(mut self, plugin: impl Into<String>, weight: f64) -> Result<Self, InvalidWeight> {
        let plugin = plugin.into();
        if !weight.is_finite() || weight < 0.0 {
            return Err(InvalidWeight { plugin, weight });
        }
        self.weights.insert(plugin, weight);
        Ok(self)
    }

    /// The weight of `plugin`: as configured, else 1.0.
    pub fn weight(&self, plugin: &str) -> f64 {
        self.weights.get(plugin).copied().unwrap_or(1.0)
    }
}

impl TryFrom<BTreeMap<String, f64>> for RewardWeights {
    type Error = InvalidWeight;
    fn try_from(map: BTreeMap<String, f64>) -> Result<Self, InvalidWeight> {
        map.into_iter()
            .try_fold(RewardWeights::equal(), |w, (plugin, weight)| {
                w.with(plugin, weight)
            })
    }
}

impl From<RewardWeights> for BTreeMap<String, f64> {
    fn from(w: RewardWeights) -> Self {
        w.weights
    }
}

/// Where a combined reward came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardOrigin {
    /// Explicit feedback (the most recent one).
    Feedback,
    /// The weighted mean of one or more plugins' scores.
    Plugins,
}

/// The combined judgement of one step or of the whole trajectory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// `None`: nothing that counts gave a reward.
    pub reward: Option<f64>,
    pub origin: Option<RewardOrigin>,
    /// The hint to distil from, if any.
    pub hint: Option<String>,
}

/// What [`combine`] made of a trajectory's evaluations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rewards {
    /// Per judged step.
    pub steps: BTreeMap<StepId, Judgement>,
    /// The trajectory-level (outcome) judgement.
    pub outcome: Judgement,
    /// `filter_error` verdicts, ignored.
    pub filter_errors: u64,
    /// Rewards that were NaN or infinite, ignored.
    pub invalid_rewards: u64,
    /// Plugin scores left out because their plugin's weight is 0.
    pub zero_weight: u64,
}

impl Rewards {
    /// The step's own reward, else the outcome's: a trajectory-level reward applies to every
    /// step no step-level evaluation scored.
    pub fn step_reward(&self, step: &StepId) -> Option<f64> {
        self.steps
            .get(step)
            .and_then(|j| j.reward)
            .or(self.outcome.reward)
    }

    /// The step's hint, if any (a trajectory-level hint belongs to no step).
    pub fn step_hint(&self, step: &StepId) -> Option<&str> {
        self.steps.get(step).and_then(|j| j.hint.as_deref())
    }

    /// One reward for the whole trajectory (what group advantages compare): the outcome when
    /// there is one, else the mean of the step rewards, else `None`.
    pub fn trajectory_reward(&self) -> Option<f64> {
        if let Some(r) = self.outcome.reward {
            return Some(r);
        }
        let rewards: Vec<f64> = self.steps.values().filter_map(|j| j.reward).collect();
        if rewards.is_empty() {
            None
        } else {
            Some(rewards.iter().sum::<f64>() / rewards.len() as f64)
        }
    }
}

/// Combines `evaluations` (one trajectory's, in the order they were appended) under the rule of
/// the module docs.
pub fn combine(evaluations: &[Evaluation], weights: &RewardWeights) -> Rewards {
    let mut out = Rewards::default();
    // Stable sort: equal times keep their append order, so "later wins" holds for ties too.
    let mut ordered: Vec<&Evaluation> = evaluations.iter().collect();
    ordered.sort_by_key(|e| e.created_at);

    let mut targets: BTreeMap<Option<StepId>, Pending> = BTreeMap::new();
    for e in ordered {
        let (reward, hint) = match &e.verdict {
            Verdict::FilterError { .. } => {
                out.filter_errors += 1;
                continue;
            }
            Verdict::Score { reward, hint } => (*reward, hint.as_deref()),
        };
        let reward = match reward {
            Some(r) if !r.is_finite() => {
                out.invalid_rewards += 1;
                None
            }
            r => r,
        };
        let pending = targets.entry(e.step).or_default();
        match &e.source {
            EvaluationSource::Feedback { .. } => {
                pending.feedback_reward = reward.or(pending.feedback_reward);
                pending.feedback_hint = hint.map(str::to_owned).or(pending.feedback_hint.take());
            }
            EvaluationSource::Plugin { name, .. } => {
                if let Some(r) = reward {
                    let w = weights.weight(name);
                    if w > 0.0 {
                        pending.plugin_rewards.insert(name.clone(), (w, r));
                    } else {
                        out.zero_weight += 1;
                    }
                }
                pending.plugin_hint = hint.map(str::to_owned).or(pending.plugin_hint.take());
            }
        }
    }
    for (target, pending) in targets {
        let judgement = pending.judge();
        match target {
            Some(step) => {
                out.steps.insert(step, judgement);
            }
            None => out.outcome = judgement,
        }
    }
    out
}

/// One target's evaluations, gathered oldest first (later ones overwrite).
#[derive(Default)]
struct Pending {
    feedback_reward: Option<f64>,
    feedback_hint: Option<String>,
    /// Plugin name → (weight, its most recent reward).
    plugin_rewards: BTreeMap<String, (f64, f64)>,
    plugin_hint: Option<String>,
}

impl Pending {
    fn judge(self) -> Judgement {
        let (reward, origin) = match self.feedback_reward {
            Some(r) => (Some(r), Some(RewardOrigin::Feedback)),
            None if self.plugin_rewards.is_empty() => (None, None),
            None => {
                let (sum, total) = self
                    .plugin_rewards
                    .values()
                    .fold((0.0, 0.0), |(s, t), (w, r)| (s + w * r, t + w));
                (Some(sum / total), Some(RewardOrigin::Plugins))
            }
        };
        Judgement {
            reward,
            origin,
            hint: self.feedback_hint.or(self.plugin_hint),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::example::tool_use_trajectory;
    use crate::ids::{EvaluationId, TenantId, TrajectoryId, UnixMs};
    use crate::schema::SCHEMA_VERSION;

    struct Judge {
        trajectory: TrajectoryId,
        tenant: TenantId,
        clock: u64,
    }

    impl Judge {
        fn new() -> Self {
            Judge {
                trajectory: TrajectoryId::new(),
                tenant: TenantId::new("acme").unwrap_or_else(|e| panic!("{e}")),
                clock: 1_000,
            }
        }

        fn eval(
            &mut self,
            step: Option<StepId>,
            source: EvaluationSource,
            verdict: Verdict,
        ) -> Evaluation {
            self.clock += 10;
            Evaluation {
                schema_version: SCHEMA_VERSION,
                id: EvaluationId::new(),
                tenant: self.tenant.clone(),
                trajectory: self.trajectory,
                step,
                source,
                verdict,
                labels: BTreeMap::new(),
                created_at: UnixMs(self.clock),
            }
        }

        fn plugin(&mut self, step: Option<StepId>, name: &str, reward: f64) -> Evaluation {
            self.eval(step, plugin(name), score(Some(reward), None))
        }

        fn feedback(&mut self, step: Option<StepId>, reward: f64) -> Evaluation {
            self.eval(step, feedback(), score(Some(reward), None))
        }
    }

    fn plugin(name: &str) -> EvaluationSource {
        EvaluationSource::Plugin {
            name: name.into(),
            content_hash: "sha256:00".into(),
        }
    }

    fn feedback() -> EvaluationSource {
        EvaluationSource::Feedback {
            channel: "handshake".into(),
        }
    }

    fn score(reward: Option<f64>, hint: Option<&str>) -> Verdict {
        Verdict::Score {
            reward,
            hint: hint.map(str::to_owned),
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-12)
    }

    #[test]
    fn a_step_reward_is_the_weighted_mean_of_the_plugins_scores() {
        let mut j = Judge::new();
        let step = StepId::new();
        let evals = [
            j.plugin(Some(step), "tool-success", 1.0),
            j.plugin(Some(step), "politeness", 0.0),
            j.plugin(Some(step), "format", -1.0),
        ];
        let equal = combine(&evals, &RewardWeights::equal());
        assert!(close(equal.steps[&step].reward, 0.0));
        assert_eq!(equal.steps[&step].origin, Some(RewardOrigin::Plugins));

        let weights = RewardWeights::equal()
            .with("tool-success", 3.0)
            .and_then(|w| w.with("format", 0.0))
            .unwrap_or_else(|e| panic!("{e}"));
        let weighted = combine(&evals, &weights);
        // (3·1 + 1·0) / (3 + 1): the zero-weight plugin is out of both sums.
        assert!(close(weighted.steps[&step].reward, 0.75));
        assert_eq!(weighted.zero_weight, 1);
    }

    #[test]
    fn explicit_feedback_on_a_step_takes_precedence_over_every_plugin() {
        let mut j = Judge::new();
        let step = StepId::new();
        let evals = [
            j.plugin(Some(step), "tool-success", 1.0),
            j.feedback(Some(step), -1.0),
            j.plugin(Some(step), "format", 1.0),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert_eq!(r.steps[&step].reward, Some(-1.0));
        assert_eq!(r.steps[&step].origin, Some(RewardOrigin::Feedback));
    }

    #[test]
    fn the_most_recent_feedback_wins_also_when_appended_out_of_time_order() {
        let mut j = Judge::new();
        let step = StepId::new();
        let first = j.feedback(Some(step), 1.0);
        let correction = j.feedback(Some(step), -1.0);
        let r = combine(&[correction, first], &RewardWeights::equal());
        assert_eq!(r.steps[&step].reward, Some(-1.0));
    }

    #[test]
    fn filter_errors_and_non_finite_rewards_are_ignored_and_counted() {
        let mut j = Judge::new();
        let step = StepId::new();
        let error = Verdict::FilterError {
            reason: "plugin trapped: fuel exhausted".into(),
        };
        let evals = [
            j.eval(Some(step), plugin("judge"), error),
            j.plugin(Some(step), "nan", f64::NAN),
            j.plugin(Some(step), "tool-success", 0.5),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert!(close(r.steps[&step].reward, 0.5));
        assert_eq!(r.filter_errors, 1);
        assert_eq!(r.invalid_rewards, 1);
    }

    #[test]
    fn a_step_with_only_filter_errors_has_no_reward_and_falls_back_to_the_outcome() {
        let mut j = Judge::new();
        let step = StepId::new();
        let error = Verdict::FilterError {
            reason: "timeout".into(),
        };
        let evals = [
            j.eval(Some(step), plugin("judge"), error),
            j.plugin(None, "task-solved", 1.0),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert_eq!(r.steps.get(&step).and_then(|s| s.reward), None);
        assert_eq!(r.step_reward(&step), Some(1.0));
        assert_eq!(r.trajectory_reward(), Some(1.0));
    }

    #[test]
    fn a_plugin_that_scored_a_step_twice_counts_once_with_its_latest_score() {
        let mut j = Judge::new();
        let step = StepId::new();
        let evals = [
            j.plugin(Some(step), "tool-success", 0.0),
            j.plugin(Some(step), "tool-success", 1.0),
            j.plugin(Some(step), "format", 0.0),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert!(close(r.steps[&step].reward, 0.5));
    }

    #[test]
    fn the_outcome_is_combined_by_the_same_rule_and_feedback_wins_there_too() {
        let mut j = Judge::new();
        let evals = [
            j.plugin(None, "task-solved", 1.0),
            j.plugin(None, "efficiency", 0.0),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert!(close(r.outcome.reward, 0.5));
        let evals = [evals[0].clone(), evals[1].clone(), j.feedback(None, -1.0)];
        let r = combine(&evals, &RewardWeights::equal());
        assert_eq!(r.outcome.reward, Some(-1.0));
        assert_eq!(r.outcome.origin, Some(RewardOrigin::Feedback));
    }

    #[test]
    fn without_an_outcome_the_trajectory_reward_is_the_mean_of_the_step_rewards() {
        let mut j = Judge::new();
        let (a, b) = (StepId::new(), StepId::new());
        let evals = [
            j.plugin(Some(a), "tool-success", 1.0),
            j.plugin(Some(b), "tool-success", 0.0),
        ];
        let r = combine(&evals, &RewardWeights::equal());
        assert!(close(r.trajectory_reward(), 0.5));
        assert!(combine(&[], &RewardWeights::equal())
            .trajectory_reward()
            .is_none());
    }

    #[test]
    fn the_most_recent_hint_is_kept_and_a_feedback_hint_beats_a_plugin_hint() {
        let mut j = Judge::new();
        let step = StepId::new();
        let older = j.eval(
            Some(step),
            plugin("opd-hint"),
            score(
                None,
                Some("A much longer but older hint about the weather tool."),
            ),
        );
        let newer = j.eval(
            Some(step),
            plugin("critic"),
            score(None, Some("Ask first.")),
        );
        let r = combine(&[older.clone(), newer.clone()], &RewardWeights::equal());
        assert_eq!(r.step_hint(&step), Some("Ask first."));
        // A hint alone gives no reward.
        assert_eq!(r.steps[&step].reward, None);

        let person = j.eval(Some(step), feedback(), score(None, Some("Say please.")));
        let later_plugin = j.eval(Some(step), plugin("critic"), score(None, Some("Later.")));
        let r = combine(
            &[older, person, newer, later_plugin],
            &RewardWeights::equal(),
        );
        assert_eq!(r.step_hint(&step), Some("Say please."));
    }

    #[test]
    fn the_schema_example_gives_its_plugin_reward_its_hint_and_the_thumbs_up_as_outcome() {
        let record = tool_use_trajectory(TenantId::new("acme").unwrap_or_else(|e| panic!("{e}")));
        let (s0, s1) = (record.steps[0].id, record.steps[1].id);
        let r = combine(&record.evaluations, &RewardWeights::equal());
        assert_eq!(r.steps[&s0].reward, Some(1.0));
        assert_eq!(r.step_reward(&s1), Some(1.0)); // the outcome, from the thumbs-up
        assert_eq!(
            r.step_hint(&s1),
            Some("Answer whether an umbrella is needed too: light rain means yes.")
        );
        assert_eq!(r.outcome.origin, Some(RewardOrigin::Feedback));
    }

    #[test]
    fn weights_come_from_a_toml_like_table_and_negative_ones_are_refused() {
        let ok: RewardWeights = serde_json::from_str(r#"{"tool-success": 2.0, "format": 0}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.weight("tool-success"), 2.0);
        assert_eq!(ok.weight("format"), 0.0);
        assert_eq!(ok.weight("unlisted"), 1.0);
        let err = serde_json::from_str::<RewardWeights>(r#"{"judge": -1}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("judge"), "{err}");
    }
}
