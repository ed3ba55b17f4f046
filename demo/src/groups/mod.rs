//! The group scenario: each round, every tenant runs a group of rollouts of one prompt, opened
//! through the handshake API as a rollout orchestrator would. The `letter_case` Wasm plugin
//! scores every finished rollout by the tenant's own taste — one tenant likes UPPERCASE
//! letters, the other lowercase — the trainer turns the groups into GRPO updates of that
//! tenant's adapter and publishes it, the sidecars route the tenant's next calls to it. It
//! prints progress as it goes and ends with a reward curve (SVG and PNG) and a summary (text
//! and JSON): each tenant's reward against its baseline, the requests served and failed, the
//! swaps and how long publishing took.
//!
//! The `arithmetic` scenario runs the same loop on a real model (SmolLM2-135M-Instruct, served
//! by the real vLLM) with a reward that can be checked: every group asks a fresh two-digit sum
//! ([`sums`]), its answer goes to the handshake as trusted metadata, and `exact_answer` scores
//! each rollout ±1; held-out sums, answered greedily, measure each tenant's accuracy before and
//! after.

mod summary;
pub mod sums;
mod watch;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use summary::Summary;

use crate::chart::{self, Chart, Line};
use crate::chat::{Sampling, Talk, MAX_TOKENS};
use crate::engine::Served;
use crate::files::{self, Plugin, RunDir, Training};
use crate::stack::{Stack, StackSpec};
use crate::{all_prompts, say, teach, Common, DemoTenant, Engine};

/// Optimizer steps that teach the base model its three cases.
const TEACH_STEPS: u64 = 150;

/// What the groups are about.
#[derive(Debug, Clone)]
pub enum Task {
    /// The tiny model, taught its three letter cases on the spot; `letter_case` scores each
    /// rollout by its tenant's taste.
    LetterCase,
    /// A real model's HF folder answering two-digit sums; `exact_answer` scores each rollout
    /// against the answer the handshake was given; `held_out` sums measure accuracy.
    Sums {
        model_dir: PathBuf,
        name: String,
        held_out: usize,
    },
}

impl Task {
    /// The scoring plugin, by its file stem.
    pub fn plugin(&self) -> &'static str {
        match self {
            Task::LetterCase => "letter_case",
            Task::Sums { .. } => "exact_answer",
        }
    }

    /// How the agents ask: the tiny model with its short system message, sampled at
    /// temperature 1 (GRPO explores); the real model with its template's own system message,
    /// room for a worked answer, and a cooler sampler (at temperature 1 SmolLM2 gets 2 % of
    /// two-digit sums right, at 0.7 about 14 %: GRPO needs some right answers in a group).
    fn talk(&self) -> Talk {
        match self {
            Task::LetterCase => Talk {
                system: Some(teach::SYSTEM),
                sampling: Sampling {
                    max_tokens: MAX_TOKENS,
                    temperature: 1.0,
                    top_p: 1.0,
                },
            },
            Task::Sums { .. } => Talk {
                system: None,
                sampling: Sampling {
                    max_tokens: 64,
                    temperature: 0.7,
                    top_p: 1.0,
                },
            },
        }
    }
}

/// What the group scenario is asked to do.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    pub common: Common,
    pub rounds: u32,
    /// Rollouts per group (and samples per optimizer step).
    pub group_size: u32,
    /// Kill the backend before this round and start it again (it gets its adapters back
    /// through the LoRA resolver directory).
    pub restart_backend_at: Option<u32>,
    pub task: Task,
}

/// Runs the scenario and returns its summary (also written to `summary.json`, with the chart
/// beside it in `reward-curve.svg` and `.png`).
pub fn run(options: &GroupOptions) -> Result<Summary> {
    let common = &options.common;
    if options.rounds < 4 || options.group_size < 2 || common.replicas < 1 {
        bail!("the demo needs --rounds ≥ 4, --group-size ≥ 2 and --replicas ≥ 1");
    }
    if options.restart_backend_at.is_some() && common.engine != Engine::Reference {
        bail!(
            "--restart-backend-at needs the reference backend: vLLM forgets the adapters it \
             loaded at run time when it restarts, and its filesystem resolver only takes adapters \
             whose base_model_name_or_path is the served name"
        );
    }
    let started = Instant::now();
    let run = RunDir::create(&common.dir)?;
    say(&format!("run folder {}", run.root.display()));
    let suffix = common
        .redis
        .as_ref()
        .map(|_| format!("{:x}", std::process::id()));
    let (tenants, plugins, served) = match &options.task {
        Task::LetterCase => {
            let tenants = DemoTenant::pair(suffix.as_deref());
            teach_cases(common, &run, &tenants)?;
            let plugin = Plugin {
                name: options.task.plugin(),
                tenant_config: tenants
                    .iter()
                    .map(|t| (t.name.clone(), format!("prefer = {:?}", t.prefers.as_str())))
                    .collect(),
            };
            (tenants, plugin, Served::Tiny)
        }
        Task::Sums {
            model_dir, name, ..
        } => {
            files::link_model(model_dir, &run.model())?;
            say(&format!("base model: {name} ({})", model_dir.display()));
            let plugin = Plugin {
                name: options.task.plugin(),
                tenant_config: Vec::new(),
            };
            (sums::tenants(suffix.as_deref()), plugin, Served::Pretrained)
        }
    };
    let real = served == Served::Pretrained;
    let mut stack = Stack::start(&StackSpec {
        run: &run,
        engine: &common.engine,
        served,
        trainer: &common.trainer,
        serve: &common.serve,
        sidecar: &common.sidecar,
        redis: common.redis.as_deref(),
        tenants: &tenants,
        replicas: common.replicas,
        plugins: std::slice::from_ref(&plugins),
        plugin_dir: &common.plugins,
        idle_timeout: "1m",
        training: Training {
            samples_per_step: options.group_size,
            lr: common.lr,
            rank: if real { 16 } else { 8 },
            rl_weight: 1.0,
            opd_weight: 1.0,
            opd_clip: 0.0,
            max_wait: "2s",
            // A real model's rounds wait for the trainer (below): it has every core.
            threads: if real { cores() } else { 1 },
            kl_coef: 0.0,
            gate: None,
        },
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let plan = workload::Plan {
        sidecars: stack.sidecar_urls.clone(),
        admin_token: stack.admin_token.clone(),
        tenants: tenants.to_vec(),
        rounds: options.rounds,
        group_size: options.group_size,
        restart_backend_at: options.restart_backend_at,
        progress_every: common.progress_every,
        plugin: options.task.plugin(),
        sums: real.then_some(common.seed),
        talk: options.task.talk(),
        // A tiny model's steps take milliseconds: the agents may run two rounds ahead. A real
        // model's rounds wait for the trainer, so serving and training take turns on the CPU.
        lag: if real { 0 } else { 2 },
        patience: Duration::from_secs(if real { 600 } else { 60 }),
    };
    let held_out = match &options.task {
        Task::Sums { held_out, .. } => *held_out,
        Task::LetterCase => 0,
    };
    let client = reqwest::Client::new();
    let before = runtime.block_on(held_out_accuracy(&client, &plan, held_out));
    let outcome = runtime.block_on(workload::drive(
        &plan,
        &run,
        &mut stack.backend,
        &mut stack.trainer,
    ));
    let after = match &outcome {
        Ok(_) => runtime.block_on(held_out_accuracy(&client, &plan, held_out)),
        Err(_) => Default::default(),
    };
    stack.stop();
    let mut outcome = outcome?;
    for (probed, failures) in [&before, &after] {
        outcome.requests.served += probed.iter().map(|a| a.asked as u64).sum::<u64>();
        for failure in failures {
            outcome
                .requests
                .count::<()>(&Err(failure.clone()), || "held-out sum".to_owned());
        }
    }
    let accuracy = (held_out > 0).then(|| before.0.into_iter().zip(after.0).collect());
    let swap_rounds = outcome.observations.swap_rounds.clone();
    let summary = Summary::new(
        &plan,
        &run,
        outcome,
        accuracy,
        started.elapsed(),
        common.engine.describe(),
    )?;
    std::fs::write(run.summary(), serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", run.summary().display()))?;
    let chart = reward_chart(&summary, &swap_rounds);
    let written = chart::write(&chart, &run.chart("reward-curve"))?;
    println!("{}", summary.text());
    say(&format!(
        "reward curve: {}   summary: {}   logs: {}",
        written.join("  "),
        run.summary().display(),
        run.logs().display()
    ));
    Ok(summary)
}

/// Each tenant's accuracy on `n` held-out sums (none when `n` is 0), and the failed probes.
async fn held_out_accuracy(
    client: &reqwest::Client,
    plan: &workload::Plan,
    n: usize,
) -> (Vec<sums::Accuracy>, Vec<String>) {
    let (mut found, mut failures) = (Vec::new(), Vec::new());
    if n == 0 {
        return (found, failures);
    }
    for tenant in &plan.tenants {
        let (accuracy, failed) =
            sums::accuracy(client, &plan.sidecars[0], tenant, plan.talk, n).await;
        say(&format!(
            "{}: {} of {} held-out sums right ({:.2}), answered by version {}",
            tenant.name,
            accuracy.right,
            accuracy.asked,
            accuracy.rate(),
            accuracy.version
        ));
        found.push(accuracy);
        failures.extend(failed);
    }
    (found, failures)
}

/// Writes the tiny model into the run and teaches it its three cases.
fn teach_cases(common: &Common, run: &RunDir, tenants: &[DemoTenant]) -> Result<()> {
    common
        .engine
        .tiny_model(common.seed as i64)
        .write(&run.model())?;
    let lessons = teach::cases(&all_prompts(tenants));
    let stages = [teach::Stage {
        lessons: lessons.clone(),
        steps: TEACH_STEPS,
    }];
    let taught = teach::teach(&run.model(), &stages, &lessons, common.seed)?;
    say(&format!(
        "taught the tiny model to answer in lower, UPPER or Title case: {} steps in {:.1} s, loss {:.3}",
        taught.steps, taught.seconds, taught.loss
    ));
    Ok(())
}

fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Each tenant's mean reward per round, the rounds in which versions went live marked.
fn reward_chart(summary: &Summary, swap_rounds: &[u32]) -> Chart {
    Chart {
        title: "clawback demo: mean reward per round, each tenant by its own preference".into(),
        x_label: "round".into(),
        y_label: "reward".into(),
        y_range: (-1.0, 1.0),
        panels: vec![chart::Panel {
            title: None,
            lines: summary
                .tenants
                .iter()
                .map(|t| Line {
                    label: format!(
                        "{} (prefers {}): {} → {}",
                        t.name,
                        t.prefers,
                        chart::signed(t.baseline),
                        chart::signed(t.last)
                    ),
                    points: t
                        .rounds
                        .iter()
                        .filter_map(|r| Some((f64::from(r.round), r.mean?)))
                        .collect(),
                })
                .collect(),
            marks: swap_rounds.iter().map(|&r| f64::from(r)).collect(),
        }],
        marks_label: format!(
            "{} swaps, {} failed requests",
            summary.swaps, summary.requests.failed
        ),
    }
}
