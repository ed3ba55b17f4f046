//! The group scenario: each round, every tenant runs a group of rollouts of one prompt, opened
//! through the handshake API as a rollout orchestrator would. The `letter_case` Wasm plugin
//! scores every finished rollout by the tenant's own taste — one tenant likes UPPERCASE
//! letters, the other lowercase — the trainer turns the groups into GRPO updates of that
//! tenant's adapter and publishes it, the sidecars route the tenant's next calls to it. It
//! prints progress as it goes and ends with a reward curve (SVG and PNG) and a summary (text
//! and JSON): each tenant's reward against its baseline, the requests served and failed, the
//! swaps and how long publishing took.

mod summary;
mod watch;
mod workload;

use std::time::Instant;

use anyhow::{bail, Context, Result};

pub use summary::Summary;

use crate::chart::{self, Chart, Line};
use crate::engine::Served;
use crate::files::{Plugin, RunDir, Training};
use crate::stack::{Stack, StackSpec};
use crate::{all_prompts, say, teach, Common, DemoTenant, Engine};

/// The scoring plugin, by its file stem.
pub const PLUGIN: &str = "letter_case";
/// Optimizer steps that teach the base model its three cases.
const TEACH_STEPS: u64 = 150;

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
    common
        .engine
        .tiny_model(common.seed as i64)
        .write(&run.model())?;
    let suffix = common
        .redis
        .as_ref()
        .map(|_| format!("{:x}", std::process::id()));
    let tenants = DemoTenant::pair(suffix.as_deref());
    let lessons = teach::cases(&all_prompts(&tenants));
    let stages = [teach::Stage {
        lessons: lessons.clone(),
        steps: TEACH_STEPS,
    }];
    let taught = teach::teach(&run.model(), &stages, &lessons, common.seed)?;
    say(&format!(
        "taught the tiny model to answer in lower, UPPER or Title case: {} steps in {:.1} s, loss {:.3}",
        taught.steps, taught.seconds, taught.loss
    ));
    let plugins = [Plugin {
        name: PLUGIN,
        tenant_config: tenants
            .iter()
            .map(|t| (t.name.clone(), format!("prefer = {:?}", t.prefers.as_str())))
            .collect(),
    }];
    let mut stack = Stack::start(&StackSpec {
        run: &run,
        engine: &common.engine,
        served: Served::Tiny,
        trainer: &common.trainer,
        sidecar: &common.sidecar,
        redis: common.redis.as_deref(),
        tenants: &tenants,
        replicas: common.replicas,
        plugins: &plugins,
        plugin_dir: &common.plugins,
        idle_timeout: "1m",
        training: Training {
            samples_per_step: options.group_size,
            lr: common.lr,
            rank: 8,
            rl_weight: 1.0,
            opd_weight: 1.0,
            opd_clip: 0.0,
            max_wait: "2s",
            threads: 1,
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
    };
    let outcome = runtime.block_on(workload::drive(
        &plan,
        &run,
        &mut stack.backend,
        &mut stack.trainer,
    ));
    stack.stop();
    let outcome = outcome?;
    let swap_rounds = outcome.observations.swap_rounds.clone();
    let summary = Summary::new(
        &plan,
        &run,
        outcome,
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
