//! What the demo shows at the end: each tenant's reward per round and against its baseline,
//! the requests served and failed, the swaps and the publish latencies, what each replica has
//! live, and how far apart the two tenants' adapters ended up.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use clawback_trainer::train::metrics::PublishReport;
use serde::Serialize;

use super::sums::Accuracy;
use super::workload::{Outcome, Plan};
use crate::files::RunDir;
use crate::report::{mean, AdapterComparison, PublishTimes, Requests};

#[derive(Debug, Serialize)]
pub struct Summary {
    /// The engine that served the model, in words.
    pub engine: String,
    pub seconds: f64,
    pub rounds: u32,
    pub group_size: u32,
    /// Rounds averaged for the baseline (the first ones) and the result (the last ones).
    pub window: u32,
    pub requests: Requests,
    pub tenants: Vec<TenantSummary>,
    /// Adapter versions made live.
    pub swaps: usize,
    pub publish_failures: usize,
    pub publish: Option<PublishTimes>,
    pub replicas: Vec<ReplicaSummary>,
    pub backend_restarts: u32,
    pub adapters: Option<AdapterComparison>,
}

#[derive(Debug, Serialize)]
pub struct TenantSummary {
    pub name: String,
    pub prefers: &'static str,
    pub rounds: Vec<RoundMean>,
    pub baseline: Option<f64>,
    pub last: Option<f64>,
    /// `last - baseline`: how far the reward moved toward the tenant's own preference.
    pub gain: Option<f64>,
    pub optimizer_steps: u64,
    /// Served rollouts whose plugin reward the demo never saw.
    pub unrewarded: usize,
    pub stale_dropped: u64,
    pub equal_reward_groups: u64,
    pub swaps: usize,
    pub live: Option<String>,
    /// Greedy accuracy on the held-out sums before the first round and after the last (the
    /// arithmetic scenario).
    pub held_out: Option<HeldOut>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct HeldOut {
    pub before: Accuracy,
    pub after: Accuracy,
}

/// The mean plugin reward of one tenant's rollouts of one round.
#[derive(Debug, Clone, Serialize)]
pub struct RoundMean {
    pub round: u32,
    pub mean: Option<f64>,
    pub rewarded: usize,
}

#[derive(Debug, Serialize)]
pub struct ReplicaSummary {
    pub url: String,
    pub served: usize,
    pub live: BTreeMap<String, String>,
}

/// Tenant `tenant`'s mean reward per round, from the rewards seen so far.
pub fn round_means(outcome: &Outcome, tenant: usize) -> Vec<RoundMean> {
    let mut by_round: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for rollout in outcome.rollouts.iter().filter(|r| r.tenant == tenant) {
        let rewards = by_round.entry(rollout.round).or_default();
        if let Some(reward) = outcome.observations.rewards.get(&rollout.trajectory) {
            rewards.push(*reward);
        }
    }
    by_round
        .into_iter()
        .map(|(round, rewards)| RoundMean {
            round,
            mean: mean(rewards.iter().copied()),
            rewarded: rewards.len(),
        })
        .collect()
}

impl Summary {
    pub fn new(
        plan: &Plan,
        run: &RunDir,
        mut outcome: Outcome,
        accuracy: Option<Vec<(Accuracy, Accuracy)>>,
        elapsed: Duration,
        engine: String,
    ) -> Result<Self> {
        let window = (plan.rounds / 5).max(2);
        let obs = &outcome.observations;
        let live_publishes: Vec<&PublishReport> = obs.log.live_publishes().collect();
        let tenants: Vec<TenantSummary> = plan
            .tenants
            .iter()
            .enumerate()
            .map(|(index, tenant)| {
                let rounds = round_means(&outcome, index);
                let windowed = |rounds: &mut dyn Iterator<Item = &RoundMean>| {
                    mean(rounds.take(window as usize).filter_map(|r| r.mean))
                };
                let baseline = windowed(&mut rounds.iter());
                let last = windowed(&mut rounds.iter().rev());
                let unrewarded = outcome
                    .rollouts
                    .iter()
                    .filter(|r| r.tenant == index)
                    .filter(|r| !obs.rewards.contains_key(&r.trajectory))
                    .count();
                TenantSummary {
                    name: tenant.name.clone(),
                    prefers: tenant.prefers.as_str(),
                    gain: baseline.zip(last).map(|(b, l)| l - b),
                    baseline,
                    last,
                    rounds,
                    optimizer_steps: obs.log.steps_of(&tenant.name),
                    unrewarded,
                    stale_dropped: obs.latest(&tenant.name, "stale_dropped"),
                    equal_reward_groups: obs.latest(&tenant.name, "no_signal"),
                    swaps: live_publishes
                        .iter()
                        .filter(|p| p.tenant.as_str() == tenant.name)
                        .count(),
                    live: obs.live.first().and_then(|l| l.get(&tenant.name)).cloned(),
                    held_out: accuracy
                        .as_ref()
                        .and_then(|a| a.get(index))
                        .map(|&(before, after)| HeldOut { before, after }),
                }
            })
            .collect();
        let publish = PublishTimes::of(&live_publishes);
        let replicas = plan
            .sidecars
            .iter()
            .enumerate()
            .map(|(index, url)| ReplicaSummary {
                url: url.clone(),
                served: outcome
                    .rollouts
                    .iter()
                    .filter(|r| r.replica == index)
                    .count(),
                live: obs
                    .live
                    .get(index)
                    .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default(),
            })
            .collect();
        let adapters = match plan.tenants.as_slice() {
            [a, b, ..] => AdapterComparison::latest(&run.adapters(), &obs.log, &a.name, &b.name)?,
            _ => None,
        };
        Ok(Summary {
            engine,
            seconds: elapsed.as_secs_f64(),
            rounds: plan.rounds,
            group_size: plan.group_size,
            window,
            requests: std::mem::take(&mut outcome.requests),
            tenants,
            swaps: live_publishes.len(),
            publish_failures: obs.log.publishes.len() - live_publishes.len(),
            publish,
            replicas,
            backend_restarts: outcome.backend_restarts,
            adapters,
        })
    }

    /// The closing lines the demo prints.
    pub fn text(&self) -> String {
        let fmt = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:+.3}"));
        let mut out = format!(
            "\nclawback demo on {}: {} rounds × {} tenants × {} rollouts in {:.0} s\n",
            self.engine,
            self.rounds,
            self.tenants.len(),
            self.group_size,
            self.seconds
        );
        for t in &self.tenants {
            out.push_str(&format!(
                "  {:<12} prefers {}: mean reward {} (first {} rounds) → {} (last {}), change {}; \
                 {} optimizer steps, {} swaps, live {}\n",
                t.name,
                t.prefers,
                fmt(t.baseline),
                self.window,
                fmt(t.last),
                self.window,
                fmt(t.gain),
                t.optimizer_steps,
                t.swaps,
                t.live.as_deref().unwrap_or("base"),
            ));
            if let Some(h) = &t.held_out {
                out.push_str(&format!(
                    "  {:<12} held-out sums answered greedily: {} of {} right ({:.2}) → {} of {} \
                     ({:.2}) at v{}, change {:+.2}\n",
                    "",
                    h.before.right,
                    h.before.asked,
                    h.before.rate(),
                    h.after.right,
                    h.after.asked,
                    h.after.rate(),
                    h.after.version,
                    h.after.rate() - h.before.rate(),
                ));
            }
        }
        out.push_str(&self.requests.text());
        out.push_str(&format!(
            "  swaps: {} adapter versions made live ({} publishes failed) on {} sidecar replica(s); \
             backend restarted {} time(s)\n",
            self.swaps,
            self.publish_failures,
            self.replicas.len(),
            self.backend_restarts
        ));
        if let Some(p) = &self.publish {
            out.push_str(&p.text());
        }
        if let Some(a) = &self.adapters {
            out.push_str(&a.text());
        }
        out
    }
}
