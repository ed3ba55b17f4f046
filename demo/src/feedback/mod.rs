//! The feedback loop: OpenClaw-RL's loop, end to end — the `feedback` scenario on the tiny
//! taught model and the `personal` one on a real model ([`crate::personal`]). Two tenants, each
//! a simulated user holding long multi-turn sessions with opposite tastes ([`user`]); no
//! groups, no handshake — plain chat calls the sidecars stitch. The signal is the user's next
//! message: the `user_feedback` plugin gives the previous turn −1 (a correction) or +1 (thanks,
//! moving on), and `correction_hint` turns a correction into a one-sentence directive hint. The
//! trainer learns from them in one of three arms — binary RL only, hint distillation (OPD)
//! only, both — each run on its own stack from the same base model, with the same users' seeds.
//! Probes measure each tenant's preferred-style rate *with no hint in the context* before the
//! arm and after its optimizer steps; a chart draws the rate over optimizer steps, one line
//! per arm.

mod export;
pub mod lessons;
mod probe;
pub mod retention;
mod summary;
pub mod user;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;

pub use summary::Summary;
pub use workload::{Pacing, Schedule};

use clawback_model::tiny_model::TinyModel;

use crate::chart::{self, Chart, Line, Panel};
use crate::chat::Talk;
use crate::engine::Served;
use crate::files::{self, GateFiles, Plugin, RunDir, Training};
use crate::stack::{Stack, StackSpec};
use crate::{all_prompts, say, teach, Common, DemoTenant};
use summary::ArmSummary;

/// The plugins that read the next state, by their file stems.
pub const PLUGINS: [&str; 2] = ["user_feedback", "correction_hint"];
/// How long a session stays open after its user's last call.
const IDLE: Duration = Duration::from_secs(1);
/// Conversations the taught model is measured on.
const HELD_OUT: usize = 40;

/// How the trainer combines the two signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arm {
    /// Binary RL only: the reward of each turn, no distillation (`w_opd = 0`).
    Rl,
    /// Hint distillation only (`w_rl = 0`): the teacher is the base model with the hint.
    Opd,
    /// Both, weight 1 each.
    Combined,
}

impl Arm {
    pub fn name(self) -> &'static str {
        match self {
            Arm::Rl => "rl",
            Arm::Opd => "opd",
            Arm::Combined => "combined",
        }
    }

    /// `(w_rl, w_opd)`.
    pub fn weights(self) -> (f64, f64) {
        match self {
            Arm::Rl => (1.0, 0.0),
            Arm::Opd => (0.0, 1.0),
            Arm::Combined => (1.0, 1.0),
        }
    }
}

/// The base model every arm starts from.
#[derive(Debug, Clone)]
pub enum Base {
    /// The tiny random model, taught on the spot: conversations and optimizer steps.
    Taught { lessons: usize, steps: u64 },
    /// A real pretrained model's HF folder, linked into each run (never written to).
    Pretrained { dir: PathBuf, name: String },
}

/// The trainer's knobs that differ between a tiny and a real model.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    pub rank: u32,
    /// The clamp of the distillation advantage, in nats.
    pub opd_clip: f64,
    /// libtorch threads in the trainer.
    pub threads: u32,
}

/// What the feedback loop is asked to do.
#[derive(Debug, Clone)]
pub struct FeedbackOptions {
    pub common: Common,
    /// The scenario's name, for the narration and the summary (`feedback`, `personal`).
    pub scenario: &'static str,
    pub arms: Vec<Arm>,
    pub schedule: Schedule,
    pub base: Base,
    /// The two tenants, named for a run (and an arm) on Redis: see [`DemoTenant::pair`].
    pub tenants: fn(Option<&str>) -> [DemoTenant; 2],
    pub talk: Talk,
    pub pacing: Pacing,
    pub knobs: Knobs,
    /// What keeps the model's answers while it learns; `None`: nothing, and nothing measured
    /// (the tiny model has no answers to keep).
    pub keeping: Option<Keeping>,
}

/// What keeps a real model's answers while it learns the users' form, and the measure of what
/// it kept ([`retention`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Keeping {
    /// The trainer's gate before a version goes live (`trainer/src/gate`).
    pub gate: bool,
    /// The k3 KL term to the base in the trainer's loss.
    pub kl_coef: f64,
    /// Whether the users correct a reply that gives their question back (else they judge its
    /// form alone).
    pub users_notice: bool,
}

/// Runs every arm and returns the summary (also written to `summary.json`, with the chart
/// beside it in `preference-rate.svg` and `.png`).
pub fn run(options: &FeedbackOptions) -> Result<Summary> {
    let common = &options.common;
    if options.arms.is_empty() || options.schedule.sessions < 1 || options.schedule.turns < 2 {
        bail!("the feedback loop needs an arm, --sessions ≥ 1 and --turns ≥ 2");
    }
    let started = Instant::now();
    let run = RunDir::create(&common.dir)?;
    say(&format!("run folder {}", run.root.display()));
    let suffix = common
        .redis
        .as_ref()
        .map(|_| format!("{:x}", std::process::id()));
    let tenants = (options.tenants)(suffix.as_deref());
    let taught = match &options.base {
        Base::Taught { lessons, steps } => {
            Some(teach_tiny(options, &run, &tenants, *lessons, *steps)?)
        }
        Base::Pretrained { dir, name } => {
            files::link_model(dir, &run.model())?;
            say(&format!("base model: {name} ({})", dir.display()));
            None
        }
    };
    if options.schedule.rounds == 0 {
        say("--rounds 0: measured the base model only");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut arms = Vec::new();
    let arms_to_run = if options.schedule.rounds == 0 {
        &[][..]
    } else {
        &options.arms[..]
    };
    for &arm in arms_to_run {
        // A Redis run gives each arm tenants of its own: one arm never trains on another's data.
        let tenants = match &suffix {
            Some(suffix) => (options.tenants)(Some(&format!("{suffix}-{}", arm.name()))),
            None => tenants.clone(),
        };
        arms.push(run_arm(options, &run, arm, &tenants, &runtime)?);
    }
    let summary = Summary {
        scenario: options.scenario,
        engine: common.engine.describe(),
        model: match &options.base {
            Base::Taught { .. } => "a tiny random model taught on the spot".to_owned(),
            Base::Pretrained { name, .. } => name.clone(),
        },
        seconds: started.elapsed().as_secs_f64(),
        schedule: options.schedule,
        sampling: options.talk.sampling,
        teaching: taught,
        arms,
    };
    std::fs::write(run.summary(), serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", run.summary().display()))?;
    let written = chart::write(&rate_chart(&summary), &run.chart("preference-rate"))?;
    println!("{}", summary.text());
    say(&format!(
        "preference rate: {}   summary: {}   logs: {}",
        written.join("  "),
        run.summary().display(),
        run.root.join("arms").display()
    ));
    Ok(summary)
}

/// Writes the tiny model into the run and teaches it its three cases and to follow a request
/// for one in the last user message.
fn teach_tiny(
    options: &FeedbackOptions,
    run: &RunDir,
    tenants: &[DemoTenant],
    lessons: usize,
    steps: u64,
) -> Result<teach::Taught> {
    let common = &options.common;
    // Narrower random weights than the group scenario's: a tiny model learns to follow a
    // request from them (with the wider ones it mostly does not, measured over seeds).
    TinyModel {
        init_std: 0.15,
        ..common.engine.tiny_model(common.seed as i64)
    }
    .write(&run.model())?;
    let prompts = all_prompts(tenants);
    let mut rng = StdRng::seed_from_u64(common.seed);
    let history = options.schedule.turns as usize - 1;
    let stages = lessons::curriculum(&prompts, lessons, history, steps, &mut rng);
    let held_out = lessons::lessons(&prompts, HELD_OUT, history, &mut rng);
    let taught = teach::teach(&run.model(), &stages, &held_out, common.seed)?;
    let [lower, upper, title] = taught.mass.free;
    say(&format!(
        "taught the tiny model to answer in lower, UPPER or Title case, and in the case a request \
         in the last user message asks for: {} steps in {:.1} s, loss {:.3}; on {HELD_OUT} \
         conversations it never saw, asked for a case it gives it {:.0}% of its probability, \
         asked for nothing lower {:.0}% / UPPER {:.0}% / Title {:.0}%",
        taught.steps,
        taught.seconds,
        taught.loss,
        100.0 * taught.mass.asked.unwrap_or(0.0),
        100.0 * lower,
        100.0 * upper,
        100.0 * title,
    ));
    Ok(taught)
}

/// One arm on a stack of its own, from a copy of the base model.
fn run_arm(
    options: &FeedbackOptions,
    run: &RunDir,
    arm: Arm,
    tenants: &[DemoTenant],
    runtime: &tokio::runtime::Runtime,
) -> Result<ArmSummary> {
    let common = &options.common;
    let started = Instant::now();
    say(&format!("arm {}: starting", arm.name()));
    let arm_run = RunDir::create(&run.root.join("arms").join(arm.name()))?;
    files::link_model(&run.model(), &arm_run.model())?;
    let plugins = PLUGINS.map(|name| Plugin {
        name,
        tenant_config: Vec::new(),
    });
    let (rl_weight, opd_weight) = arm.weights();
    // The gate's prompt sets, copied into the run: what the trainer's gate and the retention
    // probes read.
    let sets = arm_run.root.join("gate");
    let retention_file = sets.join("retention.jsonl");
    if options.keeping.is_some() {
        std::fs::create_dir_all(&sets).with_context(|| format!("creating {}", sets.display()))?;
        std::fs::write(&retention_file, retention::RETENTION)?;
        std::fs::write(sets.join("preference.jsonl"), retention::PREFERENCE)?;
    }
    let gate = options
        .keeping
        .filter(|keeping| keeping.gate)
        .map(|_| GateFiles {
            retention: retention_file.clone(),
            preference: sets.join("preference.jsonl"),
            plugins: common.plugins.clone(),
            forms: tenants
                .iter()
                .filter_map(|t| Some((t.name.clone(), t.prefers.gate_form()?)))
                .collect(),
        });
    let served = match options.base {
        Base::Taught { .. } => Served::Tiny,
        Base::Pretrained { .. } => Served::Pretrained,
    };
    let mut stack = Stack::start(&StackSpec {
        run: &arm_run,
        engine: &common.engine,
        served,
        trainer: &common.trainer,
        serve: &common.serve,
        sidecar: &common.sidecar,
        redis: common.redis.as_deref(),
        tenants,
        replicas: common.replicas,
        plugins: &plugins,
        plugin_dir: &common.plugins,
        idle_timeout: "1s",
        training: Training {
            samples_per_step: options.schedule.sessions,
            lr: common.lr,
            rank: options.knobs.rank,
            rl_weight,
            opd_weight,
            opd_clip: options.knobs.opd_clip,
            threads: options.knobs.threads,
            // Sessions without a signal for the arm (no hint, for OPD) give no sample: a step
            // waits for a whole batch of those that do, across rounds, rather than taking one
            // or two (Adam moves as far on one sample as on sixteen).
            max_wait: "10s",
            kl_coef: options.keeping.map_or(0.0, |k| k.kl_coef),
            gate,
        },
    })?;
    let plan = workload::Plan {
        arm: arm.name(),
        sidecars: stack.sidecar_urls.clone(),
        tenants: tenants.to_vec(),
        schedule: options.schedule,
        talk: options.talk,
        pacing: options.pacing,
        metrics: arm_run.metrics(),
        idle: IDLE,
        seed: common.seed,
        progress_every: common.progress_every,
    };
    let played = runtime.block_on(async {
        let client = reqwest::Client::new();
        let sidecar = &plan.sidecars[0];
        // What the users could lose: each tenant's answers, before (the base) and after.
        let checks = match options.keeping {
            Some(_) => Some(retention::Checks::load(&common.plugins, &retention_file).await?),
            None => None,
        };
        let kept = |when: &'static str| {
            let (client, checks) = (&client, checks.as_ref());
            async move {
                let Some(checks) = checks else {
                    return Vec::new();
                };
                let mut kept = Vec::new();
                for tenant in tenants {
                    let (point, failures) = checks.probe(client, sidecar, tenant).await;
                    if let Some(failure) = failures.first() {
                        say(&format!(
                            "{} of {}'s answers probes {when} failed: {failure}",
                            failures.len(),
                            tenant.name
                        ));
                    }
                    kept.push(point);
                }
                kept
            }
        };
        let kept_before = kept("before").await;
        // What the teacher would say: the base model with each tenant's hint in its context.
        let mut teacher = Vec::new();
        for tenant in tenants {
            let (point, _) = probe::probe(
                &client,
                sidecar,
                tenant,
                options.talk,
                options.schedule.final_probes,
                Some(tenant.prefers.hint()),
            )
            .await;
            teacher.push(point);
        }
        // The users tell a reply that gives their question back, as the answers probes do
        // (unless the run asks for users who judge the form alone).
        let restates = checks
            .as_ref()
            .filter(|_| options.keeping.is_some_and(|k| k.users_notice))
            .map(retention::Checks::restates);
        let outcome = workload::drive(&plan, restates, &mut stack.trainer).await?;
        let kept_after = kept("after").await;
        let mut recorded = Vec::new();
        for tenant in tenants {
            let read = export::recorded(&client, sidecar, &stack.admin_token, &tenant.name).await;
            recorded.push(read.unwrap_or_else(|e| {
                say(&format!("{e}: the recorded counts are left out"));
                Default::default()
            }));
        }
        let kept: Vec<_> = kept_before.into_iter().zip(kept_after).collect();
        anyhow::Ok((teacher, outcome, recorded, kept))
    });
    stack.stop();
    let (teacher, outcome, recorded, kept) = played?;
    let adapters = match tenants {
        [a, b, ..] => crate::report::AdapterComparison::latest(
            &arm_run.adapters(),
            &outcome.log,
            &a.name,
            &b.name,
        )?,
        _ => None,
    };
    Ok(ArmSummary::new(
        arm,
        options.keeping,
        tenants,
        outcome,
        teacher,
        recorded,
        kept,
        adapters,
        started.elapsed().as_secs_f64(),
    ))
}

/// Per tenant, the preferred-style rate without a hint over optimizer steps: one line per arm,
/// the versions that went live marked.
fn rate_chart(summary: &Summary) -> Chart {
    let tenant_names: Vec<(String, &str)> = summary
        .arms
        .first()
        .map(|arm| {
            arm.tenants
                .iter()
                .map(|t| (t.name.clone(), t.prefers))
                .collect()
        })
        .unwrap_or_default();
    let panels = tenant_names
        .iter()
        .enumerate()
        .map(|(index, (name, prefers))| {
            let arms = summary
                .arms
                .iter()
                .filter_map(|arm| Some((arm, arm.tenants.get(index)?)));
            let lines = arms
                .clone()
                .map(|(arm, t)| Line {
                    label: format!(
                        "{}: {:.2} → {:.2} ({:+.2})",
                        arm.arm,
                        t.before.rate(),
                        t.after.rate(),
                        t.gain
                    ),
                    points: t
                        .points
                        .iter()
                        .map(|p| (p.version as f64, p.rate()))
                        .collect(),
                })
                .collect();
            let steps = arms.map(|(_, t)| t.optimizer_steps).max().unwrap_or(0);
            Panel {
                title: Some(format!("{name} (prefers {prefers})")),
                lines,
                marks: (1..=steps).map(|v| v as f64).collect(),
            }
        })
        .collect();
    Chart {
        title: "clawback: preferred-style rate with no hint in the context, by how the trainer \
                learned from the users' next messages"
            .into(),
        x_label: "optimizer steps (adapter version live)".into(),
        y_label: "replies in the preferred style".into(),
        y_range: (0.0, 1.0),
        panels,
        marks_label: "a version went live".into(),
    }
}
