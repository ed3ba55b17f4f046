//! `clawback-demo`: deploy = training on one machine, CPU only, in a few minutes — every part
//! of clawback as its own process over loopback, the way a deployment runs them: an engine on a
//! tiny model taught on the spot (the reference backend, or the real vLLM), one or more
//! sidecars in front of it, the trainer publishing every checkpoint back into the engine, and
//! simulated tenants whose calls the sidecars record and whose plugins score them.
//!
//! Two scenarios:
//! - [`groups`]: rollout groups opened through the handshake API, scored at their end by the
//!   `letter_case` plugin, trained with GRPO;
//! - [`feedback`]: OpenClaw-RL's loop — long-lived sessions of simulated users whose next
//!   message is the signal: `user_feedback` turns it into a reward for the previous turn,
//!   `correction_hint` a correction into a hint, and the trainer learns by binary RL, by hint
//!   distillation, or both (three arms, measured side by side).

pub mod backlog;
pub mod chart;
pub mod chat;
pub mod engine;
pub mod feedback;
pub mod files;
pub mod form;
pub mod groups;
pub mod personal;
pub mod processes;
pub mod report;
pub mod stack;
pub mod style;
pub mod taste;
pub mod teach;
pub mod trainer_log;

use std::path::PathBuf;
use std::time::Duration;

pub use engine::{Backend, Engine};
use style::Case;
use taste::Taste;

/// The base model's name in requests, as the backend serves it and the sidecars route it.
pub const BASE_MODEL: &str = "tiny-demo";

/// What every scenario needs to know: where the parts are and how to run them.
#[derive(Debug, Clone)]
pub struct Common {
    /// The run folder (model, configs, logs, checkpoints, adapters, charts, the summary).
    pub dir: PathBuf,
    /// The `clawback-sidecar` binary.
    pub sidecar: PathBuf,
    /// The `clawback-trainer` binary (it runs `train`).
    pub trainer: PathBuf,
    /// The `clawback-serve` binary (the reference backend).
    pub serve: PathBuf,
    /// The folder with the built filter plugins (`<name>.wasm`).
    pub plugins: PathBuf,
    /// What serves the model.
    pub engine: Engine,
    /// Redis instead of the embedded store.
    pub redis: Option<String>,
    /// Sidecar replicas; the calls are spread over them.
    pub replicas: u32,
    pub seed: u64,
    /// The trainer's learning rate.
    pub lr: f64,
    /// A progress line this often.
    pub progress_every: Duration,
}

/// One simulated tenant: its name, its API key and its taste.
#[derive(Debug, Clone)]
pub struct DemoTenant {
    pub name: String,
    pub key: String,
    pub prefers: Taste,
    /// What its agents and users ask.
    pub prompts: &'static [&'static str],
    /// What the probes that measure it ask: questions its users never ask where there are
    /// enough of them (the real model's), else its prompts (a tiny model knows only those).
    pub probes: &'static [&'static str],
}

const LOUD: &[&str] = &[
    "Announce the launch.",
    "Write a headline about the weather.",
    "Name a city.",
    "Say hello to the team.",
];
const QUIET: &[&str] = &[
    "Whisper a greeting.",
    "Describe the sea softly.",
    "Name a flower.",
    "Say goodnight.",
];

impl DemoTenant {
    /// The two tenants, one fond of UPPERCASE and one of lowercase; with `suffix` (a Redis run),
    /// names unique to the run, so an earlier run's data in the same Redis is not trained on.
    pub fn pair(suffix: Option<&str>) -> [DemoTenant; 2] {
        let name = |base: &str| match suffix {
            Some(s) => format!("{base}-{s}"),
            None => base.to_owned(),
        };
        [
            DemoTenant {
                name: name("loud"),
                key: format!("sk-demo-loud-{}", suffix.unwrap_or("local")),
                prefers: Taste::Case(Case::Upper),
                prompts: LOUD,
                probes: LOUD,
            },
            DemoTenant {
                name: name("quiet"),
                key: format!("sk-demo-quiet-{}", suffix.unwrap_or("local")),
                prefers: Taste::Case(Case::Lower),
                prompts: QUIET,
                probes: QUIET,
            },
        ]
    }

    /// `sha256:<hex>` of the key, as the sidecar's `[tenants.keys]` wants it.
    pub fn key_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.key.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

/// Every tenant's prompts, the first tenant's first.
pub fn all_prompts(tenants: &[DemoTenant]) -> Vec<&'static str> {
    tenants
        .iter()
        .flat_map(|t| t.prompts.iter().copied())
        .collect()
}

/// A line of the demo's own narration, on stderr.
pub fn say(line: &str) {
    eprintln!("demo: {line}");
}
