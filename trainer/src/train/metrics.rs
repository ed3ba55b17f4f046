//! What each optimizer step reports, and where: a progress line on stdout, one JSON object per
//! step in a JSONL file, and Prometheus gauges and counters on `GET /metrics`.
//!
//! The only label is the tenant (and, for dropped samples, a fixed reason name): a trainer trains
//! a handful of tenants, so the series stay few.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawback_datapool::TenantId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::gate::Decision;
use crate::samples::SampleStats;
use crate::train::advantages::Dropped;

/// One optimizer step of one tenant.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub tenant: TenantId,
    /// Optimizer steps taken by this tenant's adapter, this one included.
    pub step: u64,
    pub lr: f64,
    /// The loss that was backpropagated (surrogate + KL term), token-mean over the step.
    pub loss: f64,
    pub clip_fraction: f64,
    pub ratio_mean: f64,
    pub kl: f64,
    pub entropy: f64,
    pub grad_norm: f64,
    pub reward_mean: Option<f64>,
    pub advantage_mean: f64,
    pub advantage_std: f64,
    /// What the step's generated spans (one per recorded step) had to learn from.
    pub signal: Signal,
    /// The hint-distillation advantage `log π_teacher − log π_behaviour` over the step's
    /// distilled tokens, before `loss.opd_weight`; `None` when no span was distilled.
    pub opd: Option<OpdAdvantage>,
    pub samples: usize,
    pub micro_batches: usize,
    /// Tokens under the loss.
    pub loss_tokens: usize,
    /// Every token the forward passes saw, padding excluded.
    pub tokens: usize,
    pub tokens_per_second: f64,
    pub seconds: f64,
    /// The trainer's log-probs against the engine's, where they describe the same weights and
    /// sampler; `None` when no recorded token of the step was served by the weights trained now.
    pub agreement: Option<Agreement>,
    /// Generated tokens the current policy's truncation (top-k, top-p, min-p) no longer keeps:
    /// left out of the loss.
    pub outside_support: u64,
    /// Totals since start: what samples.rs left out ...
    pub samples_stats: SampleStats,
    /// ... and what scoring and batching left out.
    pub dropped: Dropped,
    /// The recorded steps this optimizer step trained on (their ids, from the datapool): an
    /// audit trail that no step is trained twice, across restarts too (the JSONL log only).
    pub trained_steps: Vec<clawback_datapool::StepId>,
}

/// The learning signal of one optimizer step's spans: how many carried a reward (an RL
/// advantage), a hint turned into a teacher prompt, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    pub spans: u64,
    pub rewarded: u64,
    pub hinted: u64,
    pub both: u64,
}

impl Signal {
    /// Shares of the spans with a reward, with a hint, with both.
    pub fn shares(&self) -> (f64, f64, f64) {
        let of = |n: u64| n as f64 / self.spans.max(1) as f64;
        (of(self.rewarded), of(self.hinted), of(self.both))
    }
}

/// Mean and spread of the hint-distillation advantage over the tokens it applied to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpdAdvantage {
    pub tokens: u64,
    pub mean: f64,
    pub std: f64,
}

/// Train/inference agreement over one step: on generated tokens whose behaviour log-prob was
/// recorded by the engine serving the very weights the trainer held at the step's start,
/// `Δ = log π_trainer − log π_engine` under the call's sampler. bf16 serving against the
/// trainer's f32 makes Δ nonzero; a wrong sampler makes it large.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    pub tokens: u64,
    pub mean_abs_logprob_diff: f64,
    pub max_abs_logprob_diff: f64,
    /// Spread of the importance ratio `exp(Δ)` (1 everywhere when they agree exactly).
    pub ratio_std: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
}

impl StepReport {
    /// The progress line.
    pub fn line(&self) -> String {
        let reward = self
            .reward_mean
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"));
        let agreement = self.agreement.map_or_else(String::new, |a| {
            format!(
                " |Δlogp| {:.4} (max {:.4}) ratio σ {:.4} [{:.3}, {:.3}] over {}",
                a.mean_abs_logprob_diff,
                a.max_abs_logprob_diff,
                a.ratio_std,
                a.ratio_min,
                a.ratio_max,
                a.tokens
            )
        });
        let (rewarded, hinted, both) = self.signal.shares();
        let opd = self.opd.map_or_else(String::new, |o| {
            format!(" opd adv {:.3}±{:.3} over {}", o.mean, o.std, o.tokens)
        });
        format!(
            "[{}] step {} lr {:.2e} loss {:.4} reward {} adv {:.3}±{:.3} clip {:.3} kl {:.4} \
             entropy {:.3} |g| {:.3} samples {} tokens {} ({:.0} tok/s) spans with reward \
             {:.0}% hint {:.0}% both {:.0}%{opd}{agreement}",
            self.tenant,
            self.step,
            self.lr,
            self.loss,
            reward,
            self.advantage_mean,
            self.advantage_std,
            self.clip_fraction,
            self.kl,
            self.entropy,
            self.grad_norm,
            self.samples,
            self.tokens,
            self.tokens_per_second,
            rewarded * 100.0,
            hinted * 100.0,
            both * 100.0,
        )
    }
}

/// A checkpoint on disk: the recorded steps whose updates it holds for the first time. The
/// checkpoints' lines are the lineage of the adapter — a step an optimizer step trained whose
/// checkpoint never landed (the process died first) is trained again after the restart, and
/// appears in one checkpoint only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub tenant: TenantId,
    pub optimizer_steps: u64,
    pub applied_steps: Vec<clawback_datapool::StepId>,
}

/// What publishing one version did: the timings when it went live, the error when it did not.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishReport {
    pub tenant: TenantId,
    pub version: u64,
    pub adapter: String,
    /// `None` when the version went live; else why not (the previous version stays live).
    pub error: Option<String>,
    pub save_seconds: f64,
    pub load_seconds: f64,
    pub switch_seconds: f64,
    pub drain_seconds: f64,
    pub load_attempts: u32,
}

impl PublishReport {
    /// What publishing `version` of `tenant` came to.
    pub fn of(
        tenant: &TenantId,
        version: u64,
        outcome: &Result<crate::publish::Published, crate::publish::PublishError>,
    ) -> Self {
        match outcome {
            Ok(published) => PublishReport {
                tenant: tenant.clone(),
                version,
                adapter: published.policy.adapter.clone(),
                error: None,
                save_seconds: published.timings.save.as_secs_f64(),
                load_seconds: published.timings.load.as_secs_f64(),
                switch_seconds: published.timings.switch.as_secs_f64(),
                drain_seconds: published.timings.drain.as_secs_f64(),
                load_attempts: published.load_attempts,
            },
            Err(e) => PublishReport {
                tenant: tenant.clone(),
                version,
                adapter: crate::publish::Publisher::adapter_name(tenant, version),
                error: Some(e.to_string()),
                save_seconds: 0.0,
                load_seconds: 0.0,
                switch_seconds: 0.0,
                drain_seconds: 0.0,
                load_attempts: 0,
            },
        }
    }

    /// The progress line.
    pub fn line(&self) -> String {
        match &self.error {
            None => format!(
                "[{}] published {} (save {:.3}s, load {:.3}s in {} tries, switch {:.3}s, drain {:.3}s)",
                self.tenant,
                self.adapter,
                self.save_seconds,
                self.load_seconds,
                self.load_attempts,
                self.switch_seconds,
                self.drain_seconds,
            ),
            Some(e) => format!(
                "[{}] publishing {} failed, the previous version stays live: {e}",
                self.tenant, self.adapter
            ),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    tenant: String,
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabels {
    tenant: String,
    /// `promoted`, `held_back`, or `not_judged` (the gate itself failed).
    decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateSetLabels {
    tenant: String,
    set: String,
    /// `candidate`, `live` or `base`.
    version: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    tenant: String,
    reason: &'static str,
}

type GaugeF = Gauge<f64, AtomicU64>;

struct Prom {
    registry: Registry,
    steps: Family<TenantLabels, Counter>,
    tokens: Family<TenantLabels, Counter>,
    samples: Family<TenantLabels, Counter>,
    loss: Family<TenantLabels, GaugeF>,
    reward: Family<TenantLabels, GaugeF>,
    clip_fraction: Family<TenantLabels, GaugeF>,
    kl: Family<TenantLabels, GaugeF>,
    entropy: Family<TenantLabels, GaugeF>,
    grad_norm: Family<TenantLabels, GaugeF>,
    lr: Family<TenantLabels, GaugeF>,
    tokens_per_second: Family<TenantLabels, GaugeF>,
    agreement_mean: Family<TenantLabels, GaugeF>,
    agreement_max: Family<TenantLabels, GaugeF>,
    ratio_std: Family<TenantLabels, GaugeF>,
    outside_support: Family<TenantLabels, Counter>,
    rewarded_share: Family<TenantLabels, GaugeF>,
    hinted_share: Family<TenantLabels, GaugeF>,
    both_share: Family<TenantLabels, GaugeF>,
    opd_mean: Family<TenantLabels, GaugeF>,
    opd_std: Family<TenantLabels, GaugeF>,
    dropped: Family<DroppedLabels, Counter>,
    published: Family<TenantLabels, Counter>,
    publish_failures: Family<TenantLabels, Counter>,
    live_version: Family<TenantLabels, Gauge>,
    publish_seconds: Family<PhaseLabels, GaugeF>,
    gate_decisions: Family<GateLabels, Counter>,
    gate_kl: Family<TenantLabels, GaugeF>,
    gate_seconds: Family<TenantLabels, GaugeF>,
    gate_passed: Family<GateSetLabels, Gauge>,
    /// Last totals seen per (tenant, reason), to turn totals into counter increments.
    dropped_seen: HashMap<(String, &'static str), u64>,
}

impl Prom {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("clawback_trainer");
        let mut p = Prom {
            registry: Registry::default(),
            steps: Family::default(),
            tokens: Family::default(),
            samples: Family::default(),
            loss: Family::default(),
            reward: Family::default(),
            clip_fraction: Family::default(),
            kl: Family::default(),
            entropy: Family::default(),
            grad_norm: Family::default(),
            lr: Family::default(),
            tokens_per_second: Family::default(),
            agreement_mean: Family::default(),
            agreement_max: Family::default(),
            ratio_std: Family::default(),
            outside_support: Family::default(),
            rewarded_share: Family::default(),
            hinted_share: Family::default(),
            both_share: Family::default(),
            opd_mean: Family::default(),
            opd_std: Family::default(),
            dropped: Family::default(),
            published: Family::default(),
            publish_failures: Family::default(),
            live_version: Family::default(),
            publish_seconds: Family::default(),
            gate_decisions: Family::default(),
            gate_kl: Family::default(),
            gate_seconds: Family::default(),
            gate_passed: Family::default(),
            dropped_seen: HashMap::new(),
        };
        registry.register("optimizer_steps", "Optimizer steps taken", p.steps.clone());
        registry.register(
            "tokens",
            "Tokens trained on (padding excluded)",
            p.tokens.clone(),
        );
        registry.register("samples", "Samples trained on", p.samples.clone());
        registry.register("loss", "Loss of the last step", p.loss.clone());
        registry.register(
            "reward_mean",
            "Mean reward of the last step's samples",
            p.reward.clone(),
        );
        registry.register(
            "clip_fraction",
            "Share of tokens clipped in the last step",
            p.clip_fraction.clone(),
        );
        registry.register("kl", "k3 KL of the last step", p.kl.clone());
        registry.register(
            "entropy",
            "Policy entropy (nats) of the last step",
            p.entropy.clone(),
        );
        registry.register(
            "grad_norm",
            "Gradient norm before clipping of the last step",
            p.grad_norm.clone(),
        );
        registry.register(
            "learning_rate",
            "Learning rate of the last step",
            p.lr.clone(),
        );
        registry.register(
            "tokens_per_second",
            "Training throughput of the last step",
            p.tokens_per_second.clone(),
        );
        registry.register(
            "logprob_diff_mean",
            "Mean |trainer - engine| log-prob of the last step's tokens served by the trained weights",
            p.agreement_mean.clone(),
        );
        registry.register(
            "logprob_diff_max",
            "Max |trainer - engine| log-prob of the last step's tokens served by the trained weights",
            p.agreement_max.clone(),
        );
        registry.register(
            "importance_ratio_std",
            "Spread of the importance ratio on those tokens",
            p.ratio_std.clone(),
        );
        registry.register(
            "outside_support",
            "Generated tokens the current policy's top-k/top-p/min-p no longer keeps (left out of the loss)",
            p.outside_support.clone(),
        );
        registry.register(
            "spans_with_reward_share",
            "Share of the last step's generated spans with a reward",
            p.rewarded_share.clone(),
        );
        registry.register(
            "spans_with_hint_share",
            "Share of the last step's generated spans with a hint distilled",
            p.hinted_share.clone(),
        );
        registry.register(
            "spans_with_both_share",
            "Share of the last step's generated spans with a reward and a hint",
            p.both_share.clone(),
        );
        registry.register(
            "opd_advantage_mean",
            "Mean hint-distillation advantage (teacher - behaviour log-prob) of the last step that distilled",
            p.opd_mean.clone(),
        );
        registry.register(
            "opd_advantage_std",
            "Spread of that advantage",
            p.opd_std.clone(),
        );
        registry.register(
            "dropped",
            "Steps or samples left out, by reason",
            p.dropped.clone(),
        );
        registry.register(
            "published",
            "Versions published and made live",
            p.published.clone(),
        );
        registry.register(
            "publish_failures",
            "Publishes that failed, leaving the previous version live",
            p.publish_failures.clone(),
        );
        registry.register(
            "live_version",
            "The version this trainer last made live",
            p.live_version.clone(),
        );
        registry.register(
            "publish_seconds",
            "Duration of each phase (save, load, switch, drain) of the last publish",
            p.publish_seconds.clone(),
        );
        registry.register(
            "gate_decisions",
            "Candidate versions the gate promoted, held back, or could not judge",
            p.gate_decisions.clone(),
        );
        registry.register(
            "gate_kl",
            "Mean per-token KL(candidate ‖ base) of the last candidate, in nats",
            p.gate_kl.clone(),
        );
        registry.register(
            "gate_seconds",
            "Duration of the last gate decision",
            p.gate_seconds.clone(),
        );
        registry.register(
            "gate_passed",
            "Prompts of each gate set the last candidate, the live version and the base passed",
            p.gate_passed.clone(),
        );
        p.registry = registry;
        p
    }

    fn record_publish(&mut self, r: &PublishReport) {
        let l = TenantLabels {
            tenant: r.tenant.to_string(),
        };
        if r.error.is_some() {
            self.publish_failures.get_or_create(&l).inc();
            return;
        }
        self.published.get_or_create(&l).inc();
        self.live_version
            .get_or_create(&l)
            .set(i64::try_from(r.version).unwrap_or(i64::MAX));
        for (phase, seconds) in [
            ("save", r.save_seconds),
            ("load", r.load_seconds),
            ("switch", r.switch_seconds),
            ("drain", r.drain_seconds),
        ] {
            self.publish_seconds
                .get_or_create(&PhaseLabels {
                    tenant: l.tenant.clone(),
                    phase,
                })
                .set(seconds);
        }
    }

    fn record_gate(&mut self, d: &Decision) {
        let tenant = d.tenant.to_string();
        let decision = if d.promoted { "promoted" } else { "held_back" };
        self.count_gate(&tenant, decision);
        let l = TenantLabels {
            tenant: tenant.clone(),
        };
        self.gate_kl.get_or_create(&l).set(d.kl);
        self.gate_seconds.get_or_create(&l).set(d.seconds);
        for set in &d.sets {
            for (version, side) in [
                ("candidate", &set.candidate),
                ("live", &set.live),
                ("base", &set.base),
            ] {
                self.gate_passed
                    .get_or_create(&GateSetLabels {
                        tenant: tenant.clone(),
                        set: set.name.clone(),
                        version,
                    })
                    .set(i64::try_from(side.passed).unwrap_or(i64::MAX));
            }
        }
    }

    fn count_gate(&mut self, tenant: &str, decision: &'static str) {
        self.gate_decisions
            .get_or_create(&GateLabels {
                tenant: tenant.to_owned(),
                decision,
            })
            .inc();
    }

    fn record(&mut self, r: &StepReport) {
        let l = TenantLabels {
            tenant: r.tenant.to_string(),
        };
        self.steps.get_or_create(&l).inc();
        self.tokens.get_or_create(&l).inc_by(r.tokens as u64);
        self.samples.get_or_create(&l).inc_by(r.samples as u64);
        self.loss.get_or_create(&l).set(r.loss);
        if let Some(reward) = r.reward_mean {
            self.reward.get_or_create(&l).set(reward);
        }
        self.clip_fraction.get_or_create(&l).set(r.clip_fraction);
        self.kl.get_or_create(&l).set(r.kl);
        self.entropy.get_or_create(&l).set(r.entropy);
        self.grad_norm.get_or_create(&l).set(r.grad_norm);
        self.lr.get_or_create(&l).set(r.lr);
        self.tokens_per_second
            .get_or_create(&l)
            .set(r.tokens_per_second);
        if let Some(a) = r.agreement {
            self.agreement_mean
                .get_or_create(&l)
                .set(a.mean_abs_logprob_diff);
            self.agreement_max
                .get_or_create(&l)
                .set(a.max_abs_logprob_diff);
            self.ratio_std.get_or_create(&l).set(a.ratio_std);
        }
        self.outside_support
            .get_or_create(&l)
            .inc_by(r.outside_support);
        let (rewarded, hinted, both) = r.signal.shares();
        self.rewarded_share.get_or_create(&l).set(rewarded);
        self.hinted_share.get_or_create(&l).set(hinted);
        self.both_share.get_or_create(&l).set(both);
        if let Some(opd) = r.opd {
            self.opd_mean.get_or_create(&l).set(opd.mean);
            self.opd_std.get_or_create(&l).set(opd.std);
        }
        for (reason, total) in dropped_totals(&r.samples_stats, &r.dropped) {
            let key = (l.tenant.clone(), reason);
            let before = self.dropped_seen.insert(key, total).unwrap_or(0);
            self.dropped
                .get_or_create(&DroppedLabels {
                    tenant: l.tenant.clone(),
                    reason,
                })
                .inc_by(total.saturating_sub(before));
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Every reason a step or sample was left out, with its total.
pub fn dropped_totals(s: &SampleStats, d: &Dropped) -> [(&'static str, u64); 22] {
    [
        ("stale", s.stale_dropped),
        ("duplicate", s.duplicate_dropped),
        ("not_trainable", s.not_trainable),
        ("empty_completion", s.empty_completion),
        ("logprobs_missing", s.logprobs_missing),
        ("logprobs_not_sampler", s.logprobs_not_sampler),
        ("sampler_unmodelled", s.sampler_unmodelled),
        ("text_only", s.text_only),
        ("no_reward", d.no_reward),
        ("no_signal", d.no_signal),
        ("samples_without_signal", d.samples_without_signal),
        ("filter_errors", d.filter_errors),
        ("invalid_rewards", d.invalid_rewards),
        ("text_only_skipped", d.text_only_skipped),
        ("hints_opd_off", d.hints_opd_off),
        ("rewards_rl_off", d.rewards_rl_off),
        ("hints_no_tokenizer", d.hints_no_tokenizer),
        ("hints_unrenderable", d.hints_unrenderable),
        ("too_long", d.too_long),
        ("out_of_vocab", d.out_of_vocab),
        ("missing", d.missing),
        ("not_completed", d.not_completed),
    ]
}

/// What went wrong setting up the metrics outputs.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot open the metrics log {path}: {source}")]
    Jsonl {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen for /metrics on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The sinks of the step reports.
pub struct Metrics {
    progress: bool,
    jsonl: Option<File>,
    prom: Arc<Mutex<Prom>>,
    server: Option<MetricsServer>,
}

impl Metrics {
    pub fn new(
        progress: bool,
        jsonl: Option<&Path>,
        listen: Option<SocketAddr>,
    ) -> Result<Self, MetricsError> {
        let jsonl = match jsonl {
            Some(path) => Some(
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| {
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                    })
                    .map_err(|source| MetricsError::Jsonl {
                        path: path.display().to_string(),
                        source,
                    })?,
            ),
            None => None,
        };
        let prom = Arc::new(Mutex::new(Prom::new()));
        let server = match listen {
            Some(addr) => Some(MetricsServer::start(addr, Arc::clone(&prom))?),
            None => None,
        };
        Ok(Metrics {
            progress,
            jsonl,
            prom,
            server,
        })
    }

    /// Where `/metrics` is served, when it is.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// Reports one step to every sink. A JSONL write that fails is logged, not fatal: the
    /// training itself is what must go on.
    pub fn record(&mut self, report: &StepReport) {
        if self.progress {
            println!("{}", report.line());
        }
        self.append(report);
        if let Ok(mut prom) = self.prom.lock() {
            prom.record(report);
        }
    }

    /// Reports one publish to every sink, as [`Metrics::record`] does a step (the JSONL line
    /// is `{"publish": {...}}`).
    pub fn record_publish(&mut self, report: &PublishReport) {
        if self.progress || report.error.is_some() {
            println!("{}", report.line());
        }
        self.append(&serde_json::json!({ "publish": report }));
        if let Ok(mut prom) = self.prom.lock() {
            prom.record_publish(report);
        }
    }

    /// Reports a gate decision: the progress line, `{"gate": {...}}` in the JSONL log (every
    /// set's scores, the reasons), the Prometheus counters.
    pub fn record_gate(&mut self, decision: &Decision) {
        if self.progress || !decision.promoted {
            println!("{}", decision.line());
        }
        self.append(&serde_json::json!({ "gate": decision }));
        if let Ok(mut prom) = self.prom.lock() {
            prom.record_gate(decision);
        }
    }

    /// Reports a rollback order carried out (or not): the line, always (an operator asked for
    /// it), and `{"rollback": {...}}` in the JSONL log.
    pub fn record_rollback(&mut self, order: &clawback_datapool::Rollback) {
        let what = match &order.outcome {
            Some(clawback_datapool::RollbackOutcome::Done { version, .. }) => {
                format!("version {} is live again as v{version}", order.to)
            }
            Some(clawback_datapool::RollbackOutcome::Failed { reason, .. }) => {
                format!("not done, the live version stays: {reason}")
            }
            None => "not carried out".to_owned(),
        };
        println!(
            "[{}] rollback to v{} (from v{}): {what}",
            order.tenant, order.to, order.from
        );
        self.append(&serde_json::json!({ "rollback": order }));
    }

    /// Reports a canary put on trial (or a start that failed: the live version serves on alone):
    /// the line, always, and `{"trial": {...}}` (the publish's timings) in the JSONL log.
    pub fn record_trial(&mut self, report: &PublishReport, percent: u8) {
        match &report.error {
            None => println!(
                "[{}] {} on trial for {percent}% of calls (save {:.3}s, load {:.3}s, switch {:.3}s)",
                report.tenant,
                report.adapter,
                report.save_seconds,
                report.load_seconds,
                report.switch_seconds
            ),
            Some(_) => println!("{}", report.line()),
        }
        self.append(&serde_json::json!({ "trial": report }));
    }

    /// Reports a canary's trial ending: the line, always, and `{"canary": {...}}` in the JSONL
    /// log.
    pub fn record_canary(&mut self, decision: &crate::train::canary::CanaryDecision) {
        println!("{}", decision.line());
        self.append(&serde_json::json!({ "canary": decision }));
    }

    /// Counts a candidate the gate could not judge (it was not published).
    pub fn record_gate_failure(&mut self, tenant: &TenantId) {
        if let Ok(mut prom) = self.prom.lock() {
            prom.count_gate(tenant.as_str(), "not_judged");
        }
    }

    /// Appends a checkpoint to the JSONL log (`{"checkpoint": {...}}`), after it is on disk.
    pub fn record_checkpoint(&mut self, report: &CheckpointReport) {
        self.append(&serde_json::json!({ "checkpoint": report }));
    }

    /// One line of the JSONL log. A write that fails is logged, not fatal: the training itself
    /// is what must go on.
    fn append(&mut self, line: &impl Serialize) {
        if let Some(file) = &mut self.jsonl {
            let written = serde_json::to_string(line)
                .map_err(std::io::Error::other)
                .and_then(|line| writeln!(file, "{line}"));
            if let Err(e) = written {
                eprintln!("clawback-trainer: cannot append to the metrics log: {e}");
            }
        }
    }

    /// The Prometheus text exposition, as `/metrics` serves it.
    pub fn render(&self) -> String {
        self.prom.lock().map(|p| p.render()).unwrap_or_default()
    }
}

/// A tiny HTTP/1.1 server for `GET /metrics` on its own thread: one connection at a time,
/// which is all a scraper needs. Stops when dropped.
struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    fn start(addr: SocketAddr, prom: Arc<Mutex<Prom>>) -> Result<Self, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Listen { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| MetricsError::Listen { addr, source })?;
        // Non-blocking accept, so the loop sees the stop flag within a poll interval.
        listener
            .set_nonblocking(true)
            .map_err(|source| MetricsError::Listen { addr, source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let body = prom.lock().map(|p| p.render()).unwrap_or_default();
                        let _ = answer(stream, &body);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Ok(MetricsServer {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads the request head and answers `/metrics` with the exposition, anything else with 404.
fn answer(stream: TcpStream, body: &str) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Skip the headers (bounded: a scraper sends a few).
    for _ in 0..100 {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("");
    let mut stream = stream;
    if request_line.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        let msg = "only GET /metrics is served here\n";
        write!(
            stream,
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{msg}",
            msg.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn report() -> StepReport {
        StepReport {
            tenant: TenantId::new("acme").unwrap_or_else(|e| panic!("{e}")),
            step: 3,
            lr: 1e-5,
            loss: -0.25,
            clip_fraction: 0.1,
            ratio_mean: 1.0,
            kl: 0.001,
            entropy: 2.5,
            grad_norm: 0.7,
            reward_mean: Some(0.5),
            advantage_mean: 0.0,
            advantage_std: 1.0,
            signal: Signal {
                spans: 8,
                rewarded: 6,
                hinted: 4,
                both: 2,
            },
            opd: Some(OpdAdvantage {
                tokens: 40,
                mean: 0.25,
                std: 0.5,
            }),
            samples: 8,
            micro_batches: 2,
            loss_tokens: 100,
            tokens: 400,
            tokens_per_second: 1234.0,
            seconds: 0.3,
            agreement: Some(Agreement {
                tokens: 90,
                mean_abs_logprob_diff: 0.004,
                max_abs_logprob_diff: 0.03,
                ratio_std: 0.005,
                ratio_min: 0.97,
                ratio_max: 1.03,
            }),
            outside_support: 2,
            samples_stats: SampleStats {
                stale_dropped: 2,
                ..SampleStats::default()
            },
            dropped: Dropped {
                filter_errors: 1,
                ..Dropped::default()
            },
            trained_steps: Vec::new(),
        }
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap_or_else(|e| panic!("{e}"));
        let mut out = String::new();
        stream
            .read_to_string(&mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        out
    }

    #[test]
    fn a_step_shows_up_on_the_prometheus_endpoint_and_in_the_jsonl_log() {
        let dir = std::env::temp_dir().join(format!("train-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let log = dir.join("m.jsonl");
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let mut m =
            Metrics::new(false, Some(&log), Some(loopback)).unwrap_or_else(|e| panic!("{e}"));
        m.record(&report());
        m.record(&StepReport {
            step: 4,
            dropped: Dropped {
                filter_errors: 3,
                ..Dropped::default()
            },
            ..report()
        });
        let addr = m.local_addr().unwrap_or_else(|| panic!("no server"));
        let page = get(addr, "/metrics");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(
            page.contains("clawback_trainer_optimizer_steps_total{tenant=\"acme\"} 2"),
            "{page}"
        );
        assert!(
            page.contains("clawback_trainer_loss{tenant=\"acme\"} -0.25"),
            "{page}"
        );
        // Totals become counter increments: 3 filter errors in all, not 1 + 3.
        assert!(
            page.contains(
                "clawback_trainer_dropped_total{tenant=\"acme\",reason=\"filter_errors\"} 3"
            ),
            "{page}"
        );
        assert!(page.contains("reason=\"stale\"} 2"), "{page}");
        assert!(
            page.contains("clawback_trainer_logprob_diff_max{tenant=\"acme\"} 0.03"),
            "{page}"
        );
        assert!(
            page.contains("clawback_trainer_outside_support_total{tenant=\"acme\"} 4"),
            "{page}"
        );
        assert!(
            page.contains("clawback_trainer_spans_with_hint_share{tenant=\"acme\"} 0.5"),
            "{page}"
        );
        assert!(
            page.contains("clawback_trainer_opd_advantage_mean{tenant=\"acme\"} 0.25"),
            "{page}"
        );
        assert!(get(addr, "/").starts_with("HTTP/1.1 404"));

        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["step"], 4);
        assert_eq!(lines[1]["dropped"]["filter_errors"], 3);
        assert_eq!(lines[1]["agreement"]["mean_abs_logprob_diff"], 0.004);
        assert!(report().line().contains("|Δlogp| 0.0040 (max 0.0300)"));
        assert!(report().line().contains("[acme] step 3"));
        assert!(
            report()
                .line()
                .contains("spans with reward 75% hint 50% both 25% opd adv 0.250±0.500 over 40"),
            "{}",
            report().line()
        );
        assert_eq!(lines[1]["signal"]["both"], 2);
        assert_eq!(lines[1]["opd"]["tokens"], 40);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
