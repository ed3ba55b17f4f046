//! What the demo shows at the end: each tenant's reward per round and against its baseline,
//! the requests served and failed, the swaps and the publish latencies, what each replica has
//! live, and how far apart the two tenants' adapters ended up.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tch::Tensor;

use super::files::RunDir;
use super::workload::{Outcome, Plan};
use crate::train::metrics::PublishReport;

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
pub struct Requests {
    pub served: u64,
    pub failed: u64,
    pub failures: Vec<String>,
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
}

/// The mean plugin reward of one tenant's rollouts of one round.
#[derive(Debug, Clone, Serialize)]
pub struct RoundMean {
    pub round: u32,
    pub mean: Option<f64>,
    pub rewarded: usize,
}

/// Median and worst of each publishing phase, in seconds.
#[derive(Debug, Serialize)]
pub struct PublishTimes {
    pub save: (f64, f64),
    pub load: (f64, f64),
    pub switch: (f64, f64),
    pub total: (f64, f64),
}

#[derive(Debug, Serialize)]
pub struct ReplicaSummary {
    pub url: String,
    pub served: usize,
    pub live: BTreeMap<String, String>,
}

/// The two tenants' last adapters, compared by their weight updates ΔW = B·A.
#[derive(Debug, Serialize)]
pub struct AdapterComparison {
    pub adapters: (String, String),
    /// cos(ΔW₁, ΔW₂) over all adapted modules.
    pub cosine: f64,
    /// ‖ΔW₁ − ΔW₂‖ / max(‖ΔW₁‖, ‖ΔW₂‖).
    pub relative_distance: f64,
}

pub fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
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

fn median_and_max(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    (median, values.last().copied().unwrap_or(0.0))
}

impl Summary {
    pub fn new(
        plan: &Plan,
        run: &RunDir,
        outcome: Outcome,
        elapsed: Duration,
        engine: String,
    ) -> Result<Self> {
        let window = (plan.rounds / 5).max(2);
        let obs = &outcome.observations;
        let live_publishes: Vec<&PublishReport> =
            obs.publishes.iter().filter(|p| p.error.is_none()).collect();
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
                    optimizer_steps: obs.steps_of(&tenant.name),
                    unrewarded,
                    stale_dropped: obs.stale_dropped.get(&tenant.name).copied().unwrap_or(0),
                    equal_reward_groups: obs.no_signal.get(&tenant.name).copied().unwrap_or(0),
                    swaps: live_publishes
                        .iter()
                        .filter(|p| p.tenant.as_str() == tenant.name)
                        .count(),
                    live: obs.live.first().and_then(|l| l.get(&tenant.name)).cloned(),
                }
            })
            .collect();
        let publish = (!live_publishes.is_empty()).then(|| {
            let times = |f: fn(&PublishReport) -> f64| {
                median_and_max(live_publishes.iter().map(|p| f(p)).collect())
            };
            PublishTimes {
                save: times(|p| p.save_seconds),
                load: times(|p| p.load_seconds),
                switch: times(|p| p.switch_seconds),
                total: times(|p| p.save_seconds + p.load_seconds + p.switch_seconds),
            }
        });
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
        let latest = |tenant: &str| {
            live_publishes
                .iter()
                .filter(|p| p.tenant.as_str() == tenant)
                .max_by_key(|p| p.version)
                .map(|p| p.adapter.clone())
        };
        let adapters = match (
            plan.tenants.first().and_then(|t| latest(&t.name)),
            plan.tenants.get(1).and_then(|t| latest(&t.name)),
        ) {
            (Some(a), Some(b)) => Some(compare(&run.adapters(), a, b)?),
            _ => None,
        };
        Ok(Summary {
            engine,
            seconds: elapsed.as_secs_f64(),
            rounds: plan.rounds,
            group_size: plan.group_size,
            window,
            requests: Requests {
                served: outcome.served,
                failed: outcome.failed,
                failures: outcome.failures.clone(),
            },
            tenants,
            swaps: live_publishes.len(),
            publish_failures: obs.publishes.len() - live_publishes.len(),
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
        }
        out.push_str(&format!(
            "  requests: {} served, {} failed\n",
            self.requests.served, self.requests.failed
        ));
        for failure in &self.requests.failures {
            out.push_str(&format!("    {failure}\n"));
        }
        out.push_str(&format!(
            "  swaps: {} adapter versions made live ({} publishes failed) on {} sidecar replica(s); \
             backend restarted {} time(s)\n",
            self.swaps,
            self.publish_failures,
            self.replicas.len(),
            self.backend_restarts
        ));
        if let Some(p) = &self.publish {
            out.push_str(&format!(
                "  publish latency, median / max: save {:.3} / {:.3} s, load {:.3} / {:.3} s, \
                 switch {:.3} / {:.3} s, all three {:.3} / {:.3} s\n",
                p.save.0,
                p.save.1,
                p.load.0,
                p.load.1,
                p.switch.0,
                p.switch.1,
                p.total.0,
                p.total.1
            ));
        }
        if let Some(a) = &self.adapters {
            out.push_str(&format!(
                "  adapters {} and {}: cos(ΔW, ΔW) = {:+.3}, relative distance {:.3}\n",
                a.adapters.0, a.adapters.1, a.cosine, a.relative_distance
            ));
        }
        out
    }
}

/// Compares two published PEFT adapters under `root` by their ΔW = B·A.
fn compare(root: &Path, a: String, b: String) -> Result<AdapterComparison> {
    let delta = |name: &str| -> Result<Tensor> {
        let file = root.join(name).join("adapter_model.safetensors");
        let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .into_iter()
            .collect();
        let mut parts = Vec::new();
        for (key, lora_a) in tensors.iter().filter(|(k, _)| k.contains("lora_A")) {
            let key_b = key.replace("lora_A", "lora_B");
            let lora_b = tensors
                .get(&key_b)
                .with_context(|| format!("{}: {key} without {key_b}", file.display()))?;
            parts.push(lora_b.matmul(lora_a).flatten(0, -1));
        }
        Ok(Tensor::cat(&parts, 0))
    };
    let (da, db) = (delta(&a)?, delta(&b)?);
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let (na, nb) = (norm(&da), norm(&db));
    let dot = (&da * &db).sum(tch::Kind::Double).double_value(&[]);
    let cosine = if na > 0.0 && nb > 0.0 {
        dot / (na * nb)
    } else {
        0.0
    };
    let relative_distance = norm(&(&da - &db)) / na.max(nb).max(f64::MIN_POSITIVE);
    Ok(AdapterComparison {
        adapters: (a, b),
        cosine,
        relative_distance,
    })
}
