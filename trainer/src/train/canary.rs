//! A candidate on trial: the rewards its users gave it, beside the live version's over the same
//! time, and the rule ([`CanaryConfig`]) that promotes or drops it.
//!
//! Both sides are counted from the trajectories the trainer reads anyway (its ready queue), by
//! the version each step records it was served by, with the tenant's reward weights: a step's
//! own reward, else its trajectory's. The live version's share is counted over the same calls'
//! time, so a change in what users ask moves both sides alike.

use std::time::Instant;

use clawback_datapool::reward::{self, RewardWeights};
use clawback_datapool::{TenantId, TrajectoryRecord};
use serde::Serialize;

use crate::publish::CanaryConfig;

/// Rewarded steps of one version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Tally {
    pub steps: usize,
    pub sum: f64,
}

impl Tally {
    fn add(&mut self, reward: f64) {
        self.steps += 1;
        self.sum += reward;
    }

    pub fn mean(&self) -> Option<f64> {
        (self.steps > 0).then(|| self.sum / self.steps as f64)
    }
}

/// A canary on trial beside the live version.
#[derive(Debug)]
pub struct Trial {
    pub version: u64,
    pub live: u64,
    started: Instant,
    candidate: Tally,
    incumbent: Tally,
}

/// What the trial came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CanaryDecision {
    pub tenant: TenantId,
    pub version: u64,
    pub live: u64,
    pub promoted: bool,
    pub reason: String,
    pub candidate: Tally,
    pub incumbent: Tally,
    pub seconds: f64,
}

impl CanaryDecision {
    /// The progress line.
    pub fn line(&self) -> String {
        let mean = |t: &Tally| t.mean().map_or("-".to_owned(), |m| format!("{m:+.3}"));
        format!(
            "[{}] canary v{} {} ({}): mean reward {} over {} steps, live v{} {} over {}",
            self.tenant,
            self.version,
            if self.promoted { "promoted" } else { "dropped" },
            self.reason,
            mean(&self.candidate),
            self.candidate.steps,
            self.live,
            mean(&self.incumbent),
            self.incumbent.steps,
        )
    }
}

impl Trial {
    pub fn new(live: u64, version: u64) -> Self {
        Self {
            version,
            live,
            started: Instant::now(),
            candidate: Tally::default(),
            incumbent: Tally::default(),
        }
    }

    /// Counts the rewarded steps of `records` that either version served.
    pub fn count(&mut self, records: &[TrajectoryRecord], weights: &RewardWeights) {
        for record in records {
            let rewards = reward::combine(&record.evaluations, weights);
            for step in &record.steps {
                let (Some(policy), Some(reward)) = (&step.policy, rewards.step_reward(&step.id))
                else {
                    continue;
                };
                if policy.version == self.version {
                    self.candidate.add(reward);
                } else if policy.version == self.live {
                    self.incumbent.add(reward);
                }
            }
        }
    }

    /// The trial ends: promoted or not, and why, with what was counted.
    pub fn decided(&self, tenant: &TenantId, promoted: bool, reason: String) -> CanaryDecision {
        CanaryDecision {
            tenant: tenant.clone(),
            version: self.version,
            live: self.live,
            promoted,
            reason,
            candidate: self.candidate,
            incumbent: self.incumbent,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }

    /// The decision, once the rule can make it; `None`: the trial goes on.
    pub fn judge(&self, tenant: &TenantId, rule: &CanaryConfig) -> Option<CanaryDecision> {
        let decided = |promoted: bool, reason: String| self.decided(tenant, promoted, reason);
        let enough =
            self.candidate.steps >= rule.min_steps && self.incumbent.steps >= rule.min_steps;
        if let (true, Some(candidate), Some(incumbent)) =
            (enough, self.candidate.mean(), self.incumbent.mean())
        {
            let drop = incumbent - candidate;
            return Some(if drop <= rule.max_drop {
                decided(
                    true,
                    format!(
                        "{drop:+.3} below the live version, within {}",
                        rule.max_drop
                    ),
                )
            } else {
                decided(
                    false,
                    format!("{drop:+.3} below the live version, over {}", rule.max_drop),
                )
            });
        }
        (self.started.elapsed() >= rule.max_wait).then(|| {
            decided(
                false,
                format!(
                    "fewer than {} rewarded steps a side within {:?}",
                    rule.min_steps, rule.max_wait
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clawback_datapool::example::tool_use_trajectory;
    use clawback_datapool::{PolicyRef, Verdict};

    use super::*;

    fn rule(max_wait: Duration) -> CanaryConfig {
        CanaryConfig {
            percent: 10,
            min_steps: 2,
            max_drop: 0.25,
            max_wait,
        }
    }

    fn tenant() -> TenantId {
        TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"))
    }

    /// A recorded trajectory of two steps, both served by `version` and rewarded `reward`.
    fn served(version: u64, reward: f64) -> TrajectoryRecord {
        let mut record = tool_use_trajectory(tenant());
        for evaluation in &mut record.evaluations {
            if let Verdict::Score {
                reward: Some(given),
                ..
            } = &mut evaluation.verdict
            {
                *given = reward;
            }
        }
        for step in &mut record.steps {
            step.policy = Some(PolicyRef {
                adapter: format!("acme@v{version}"),
                version,
            });
        }
        record
    }

    #[test]
    fn a_canary_is_promoted_within_the_drop_and_dropped_past_it() {
        let tenant = tenant();
        let weights = RewardWeights::default();
        let mut trial = Trial::new(3, 4);
        trial.count(&[served(3, 1.0)], &weights);
        assert_eq!(trial.judge(&tenant, &rule(Duration::from_secs(3600))), None);
        trial.count(&[served(4, 0.9), served(9, -1.0)], &weights);
        let decision = trial.judge(&tenant, &rule(Duration::from_secs(3600)));
        let decision = decision.unwrap_or_else(|| panic!("both sides have two steps"));
        assert!(decision.promoted, "{}", decision.line());

        let mut worse = Trial::new(3, 4);
        worse.count(&[served(3, 1.0), served(4, 0.5)], &weights);
        let decision = worse.judge(&tenant, &rule(Duration::from_secs(3600)));
        assert!(decision.is_some_and(|d| !d.promoted));

        let starved = Trial::new(3, 4);
        let decision = starved.judge(&tenant, &rule(Duration::ZERO));
        assert!(decision.is_some_and(|d| !d.promoted && d.reason.contains("fewer than")));
    }
}
