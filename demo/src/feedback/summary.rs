//! What the feedback scenario shows at the end, per arm and tenant: the preferred-style rate
//! of its probes before and after the arm's optimizer steps, the curve in between, what the
//! users themselves saw, what the datapool recorded (rewards, hints), what the trainer learned
//! from (shares of spans with a reward, a hint, both; the distillation advantage) — and the
//! requests served and failed across the swaps.

use serde::Serialize;

use super::export::Recorded;
use super::probe::ProbePoint;
use super::retention::Kept;
use super::workload::Outcome;
use super::{Arm, Keeping};
use crate::report::{AdapterComparison, PublishTimes, Requests};
use crate::trainer_log::TrainerLog;
use crate::DemoTenant;

#[derive(Debug, Serialize)]
pub struct Summary {
    /// `feedback` (the tiny model) or `personal` (a real one).
    pub scenario: &'static str,
    /// The engine that served the model, in words.
    pub engine: String,
    /// The base model, in words.
    pub model: String,
    pub seconds: f64,
    #[serde(flatten)]
    pub schedule: super::workload::Schedule,
    /// How the users' and the probes' calls were sampled.
    pub sampling: crate::chat::Sampling,
    /// How the tiny base model was taught, and how it follows a request in its context.
    pub teaching: Option<crate::teach::Taught>,
    pub arms: Vec<ArmSummary>,
}

#[derive(Debug, Serialize)]
pub struct ArmSummary {
    pub arm: &'static str,
    pub rl_weight: f64,
    pub opd_weight: f64,
    /// The gate and the KL anchor, where the scenario keeps answers.
    pub keeping: Option<Keeping>,
    pub seconds: f64,
    pub requests: Requests,
    /// Adapter versions made live.
    pub swaps: usize,
    pub publish_failures: usize,
    pub publish: Option<PublishTimes>,
    pub adapters: Option<AdapterComparison>,
    pub tenants: Vec<ArmTenant>,
}

#[derive(Debug, Serialize)]
pub struct ArmTenant {
    pub name: String,
    pub prefers: &'static str,
    /// The hint the teacher was measured with.
    pub hint: &'static str,
    /// The base model with the tenant's hint in its context (what the teacher would say).
    pub teacher: ProbePoint,
    pub before: ProbePoint,
    pub after: ProbePoint,
    /// `after − before`: how far the preferred-style rate moved, with no hint in the context.
    pub gain: f64,
    pub points: Vec<ProbePoint>,
    /// The share of the users' replies that fitted their taste, in the first and last round.
    pub users_fitted: (Option<f64>, Option<f64>),
    pub optimizer_steps: u64,
    /// Summed over the optimizer steps: spans with a reward, a hint, both.
    pub spans: u64,
    pub rewarded: u64,
    pub hinted: u64,
    pub both: u64,
    /// The distillation advantage over every distilled token: mean and the steps' mean spread.
    pub opd_advantage: Option<(f64, f64)>,
    /// Hints the trainer did not distill, by why (its latest totals).
    pub hints_not_distilled: HintsNotDistilled,
    pub recorded: Recorded,
    pub live: Option<String>,
    /// Answers kept on the held-out factual questions, before (the base) and after.
    pub kept: Option<(Kept, Kept)>,
    /// The gate's decisions: candidates promoted, held back (and the first reason of each).
    pub gate: GateTally,
}

/// What the gate did with a tenant's candidates.
#[derive(Debug, Default, Serialize)]
pub struct GateTally {
    pub promoted: usize,
    pub held_back: usize,
    /// Each held-back version and its reasons.
    pub reasons: Vec<(u64, Vec<String>)>,
    /// Seconds the decisions took, summed.
    pub seconds: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct HintsNotDistilled {
    pub opd_off: u64,
    pub no_tokenizer: u64,
    pub unrenderable: u64,
}

impl std::fmt::Display for HintsNotDistilled {
    /// `none`, or each reason with a count: `31 (OPD off)`, `2 (no tokenizer), 1 (unrenderable)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reasons = [
            (self.opd_off, "OPD off"),
            (self.no_tokenizer, "no tokenizer"),
            (self.unrenderable, "unrenderable"),
        ];
        let given: Vec<String> = reasons
            .iter()
            .filter(|(count, _)| *count > 0)
            .map(|(count, why)| format!("{count} ({why})"))
            .collect();
        if given.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&given.join(", "))
        }
    }
}

fn share((fitted, all): (u32, u32)) -> Option<f64> {
    (all > 0).then(|| f64::from(fitted) / f64::from(all))
}

impl ArmSummary {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arm: Arm,
        keeping: Option<Keeping>,
        tenants: &[DemoTenant],
        mut outcome: Outcome,
        teacher: Vec<ProbePoint>,
        recorded: Vec<Recorded>,
        kept: Vec<(Kept, Kept)>,
        adapters: Option<AdapterComparison>,
        seconds: f64,
    ) -> Self {
        let (rl_weight, opd_weight) = arm.weights();
        let log = &outcome.log;
        let live: Vec<_> = log.live_publishes().collect();
        let tenants = tenants
            .iter()
            .zip(teacher)
            .zip(recorded)
            .enumerate()
            .map(|(index, ((tenant, teacher), recorded))| {
                let mut summary = tenant_summary(tenant, log, &outcome, index, teacher, recorded);
                summary.kept = kept.get(index).cloned();
                summary
            })
            .collect();
        ArmSummary {
            arm: arm.name(),
            rl_weight,
            opd_weight,
            keeping,
            seconds,
            swaps: live.len(),
            publish_failures: log.publishes.len() - live.len(),
            publish: PublishTimes::of(&live),
            adapters,
            tenants,
            requests: std::mem::take(&mut outcome.requests),
        }
    }
}

fn tenant_summary(
    tenant: &DemoTenant,
    log: &TrainerLog,
    outcome: &Outcome,
    index: usize,
    teacher: ProbePoint,
    recorded: Recorded,
) -> ArmTenant {
    let points = outcome.points[index].clone();
    let empty = ProbePoint {
        version: 0,
        probes: 0,
        fitted: 0,
    };
    let before = points.first().cloned().unwrap_or_else(|| empty.clone());
    let after = points.last().cloned().unwrap_or(empty);
    let lines: Vec<_> = log.lines_of(&tenant.name).collect();
    let (mut spans, mut rewarded, mut hinted, mut both) = (0, 0, 0, 0);
    let (mut opd_tokens, mut opd_sum, mut opd_spread, mut opd_steps) = (0u64, 0.0, 0.0, 0u64);
    for line in &lines {
        spans += line.signal.spans;
        rewarded += line.signal.rewarded;
        hinted += line.signal.hinted;
        both += line.signal.both;
        if let Some(opd) = line.opd {
            opd_tokens += opd.tokens;
            opd_sum += opd.mean * opd.tokens as f64;
            opd_spread += opd.std;
            opd_steps += 1;
        }
    }
    let latest = |reason: &str| lines.last().map_or(0, |l| l.dropped(reason));
    let fitted = &outcome.fitted[index];
    ArmTenant {
        name: tenant.name.clone(),
        prefers: tenant.prefers.as_str(),
        hint: tenant.prefers.hint(),
        teacher,
        gain: after.rate() - before.rate(),
        before,
        after,
        points,
        users_fitted: (
            fitted.first().copied().and_then(share),
            fitted.last().copied().and_then(share),
        ),
        optimizer_steps: log.steps_of(&tenant.name),
        spans,
        rewarded,
        hinted,
        both,
        opd_advantage: (opd_tokens > 0).then(|| {
            (
                opd_sum / opd_tokens as f64,
                opd_spread / opd_steps.max(1) as f64,
            )
        }),
        hints_not_distilled: HintsNotDistilled {
            opd_off: latest("hints_opd_off"),
            no_tokenizer: latest("hints_no_tokenizer"),
            unrenderable: latest("hints_unrenderable"),
        },
        recorded,
        live: log
            .live_publishes()
            .filter(|p| p.tenant.as_str() == tenant.name)
            .max_by_key(|p| p.version)
            .map(|p| p.adapter.clone()),
        kept: None,
        gate: log
            .gates_of(&tenant.name)
            .fold(GateTally::default(), |mut tally, decision| {
                tally.seconds += decision.seconds;
                if decision.promoted {
                    tally.promoted += 1;
                } else {
                    tally.held_back += 1;
                    tally
                        .reasons
                        .push((decision.version, decision.reasons.clone()));
                }
                tally
            }),
    }
}

impl Summary {
    /// The closing lines the demo prints.
    pub fn text(&self) -> String {
        let base = match &self.teaching {
            Some(taught) => format!(
                "base model taught in {} steps, {:.1} s",
                taught.steps, taught.seconds
            ),
            None => format!("base model {}", self.model),
        };
        let mut out = format!(
            "\nclawback {} demo on {}: {} arm(s) × {} rounds × {} users × {} turns, in {:.0} s \
             ({base})\n",
            self.scenario,
            self.engine,
            self.arms.len(),
            self.schedule.rounds,
            self.schedule.sessions,
            self.schedule.turns,
            self.seconds,
        );
        for arm in &self.arms {
            let keeping = arm.keeping.map_or(String::new(), |k| {
                format!(
                    ", gate {}, kl_coef {}, users notice a restated question: {}",
                    if k.gate { "on" } else { "off" },
                    k.kl_coef,
                    if k.users_notice { "yes" } else { "no" }
                )
            });
            out.push_str(&format!(
                "\n  arm {} (w_rl {:.1}, w_opd {:.1}{keeping}), {:.0} s:\n",
                arm.arm, arm.rl_weight, arm.opd_weight, arm.seconds
            ));
            for t in &arm.tenants {
                let pct =
                    |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{:.0}%", 100.0 * v));
                out.push_str(&format!(
                    "    {:<8} prefers {}: preferred-style rate without a hint {:.2} ({} probes) → {:.2} \
                     after {} optimizer steps, change {:+.2}; with the hint ({:?}) the base model gives \
                     {:.2}; users saw {} → {} of replies fit\n",
                    t.name,
                    t.prefers,
                    t.before.rate(),
                    t.before.probes,
                    t.after.rate(),
                    t.optimizer_steps,
                    t.gain,
                    t.hint,
                    t.teacher.rate(),
                    pct(t.users_fitted.0),
                    pct(t.users_fitted.1),
                ));
                let opd = t.opd_advantage.map_or("none".to_owned(), |(mean, spread)| {
                    format!("{mean:+.2} (spread {spread:.2})")
                });
                out.push_str(&format!(
                    "             recorded {} steps: {} rewarded ({} −1, {} +1), {} hinted; trained on {} spans: \
                     {} with a reward, {} with a hint, {} both; OPD advantage {opd}; hints not distilled: \
                     {}\n",
                    t.recorded.steps,
                    t.recorded.rewarded,
                    t.recorded.negative,
                    t.recorded.positive,
                    t.recorded.hinted,
                    t.spans,
                    t.rewarded,
                    t.hinted,
                    t.both,
                    t.hints_not_distilled,
                ));
                if let Some((before, after)) = &t.kept {
                    out.push_str(&format!(
                        "             answers kept (held-out factual questions, greedy): {} → {} of {}, \
                         questions restated {} → {}; gate: {} versions promoted, {} held back ({:.0} s)\n",
                        before.answered,
                        after.answered,
                        after.asked,
                        before.restated,
                        after.restated,
                        t.gate.promoted,
                        t.gate.held_back,
                        t.gate.seconds,
                    ));
                    if let Some((version, reasons)) = t.gate.reasons.last() {
                        out.push_str(&format!(
                            "             last held back: v{version}: {}\n",
                            reasons.join("; ")
                        ));
                    }
                }
                if let Some((hint, count)) = t.recorded.hints.first() {
                    out.push_str(&format!(
                        "             most frequent hint ({count}×): {hint:?}\n"
                    ));
                }
            }
            out.push_str(&arm.requests.text());
            out.push_str(&format!(
                "    swaps: {} versions made live, {} publishes failed\n",
                arm.swaps, arm.publish_failures
            ));
            if let Some(p) = &arm.publish {
                out.push_str(&format!("  {}", p.text()));
            }
            if let Some(a) = &arm.adapters {
                out.push_str(&format!("  {}", a.text()));
            }
        }
        out
    }
}
