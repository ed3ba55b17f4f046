//! `clawback-trainer demo`: deploy = training on one machine, CPU only, in a few minutes.
//!
//! It writes a tiny random model, starts an engine on it (the reference backend, `serve`, or
//! the real vLLM with `--backend vllm`), one or more
//! sidecars in front of it (`clawback-sidecar serve`, the embedded store or Redis), and the
//! trainer (`train`, publishing every checkpoint), then plays two tenants' agents against the
//! sidecars: each round, every tenant runs a group of rollouts of one prompt, opened through
//! the handshake API. The `letter_case` Wasm plugin scores every finished rollout by the
//! tenant's own taste — one tenant likes UPPERCASE letters, the other lowercase — the trainer
//! turns the groups into GRPO updates of that tenant's adapter and publishes it, the sidecars
//! route the tenant's next calls to it. It prints progress as it goes and ends with a reward
//! curve (SVG) and a summary (text and JSON): each tenant's reward against its baseline, the
//! requests served and failed, the swaps and how long publishing took.

mod chart;
mod engine;
mod files;
mod processes;
mod summary;
mod teach;
mod watch;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use engine::{Backend, Engine};
pub use summary::Summary;

use files::{RunDir, Training, Wiring};
use processes::Process;

/// The base model's name in requests, as the backend serves it and the sidecars route it.
pub const BASE_MODEL: &str = "tiny-demo";
/// The scoring plugin, by its file stem.
pub const PLUGIN: &str = "letter_case";

/// What the demo is asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The run folder (model, configs, logs, checkpoints, adapters, the chart, the summary).
    pub dir: PathBuf,
    /// The `clawback-sidecar` binary.
    pub sidecar: PathBuf,
    /// The `letter_case.wasm` plugin (built in `wasm-plugins/`).
    pub plugin: PathBuf,
    /// What serves the model.
    pub engine: Engine,
    /// Redis instead of the embedded store.
    pub redis: Option<String>,
    pub rounds: u32,
    /// Rollouts per group (and samples per optimizer step).
    pub group_size: u32,
    /// Sidecar replicas; the agents' calls are spread over them.
    pub replicas: u32,
    /// Kill the backend before this round and start it again (it gets its adapters back
    /// through the LoRA resolver directory).
    pub restart_backend_at: Option<u32>,
    pub seed: u64,
    pub lr: f64,
    /// A progress line this often.
    pub progress_every: Duration,
}

/// The preference a tenant's plugin config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefers {
    Upper,
    Lower,
}

impl Prefers {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upper => "upper",
            Self::Lower => "lower",
        }
    }
}

/// One simulated tenant: its name, its API key and its taste.
#[derive(Debug, Clone)]
pub struct DemoTenant {
    pub name: String,
    pub key: String,
    pub prefers: Prefers,
    /// What its agents ask.
    pub prompts: &'static [&'static str],
}

impl DemoTenant {
    /// The two tenants; with `suffix` (a Redis run), names unique to the run, so an earlier
    /// run's data in the same Redis is not trained on.
    fn pair(suffix: Option<&str>) -> [DemoTenant; 2] {
        let name = |base: &str| match suffix {
            Some(s) => format!("{base}-{s}"),
            None => base.to_owned(),
        };
        [
            DemoTenant {
                name: name("loud"),
                key: format!("sk-demo-loud-{}", suffix.unwrap_or("local")),
                prefers: Prefers::Upper,
                prompts: &[
                    "Announce the launch.",
                    "Write a headline about the weather.",
                    "Name a city.",
                    "Say hello to the team.",
                ],
            },
            DemoTenant {
                name: name("quiet"),
                key: format!("sk-demo-quiet-{}", suffix.unwrap_or("local")),
                prefers: Prefers::Lower,
                prompts: &[
                    "Whisper a greeting.",
                    "Describe the sea softly.",
                    "Name a flower.",
                    "Say goodnight.",
                ],
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

/// Runs the whole demo and returns its summary (also written to `summary.json`, with the chart
/// beside it in `reward-curve.svg`).
pub fn run(options: &DemoOptions) -> Result<Summary> {
    if options.rounds < 4 || options.group_size < 2 || options.replicas < 1 {
        bail!("the demo needs --rounds ≥ 4, --group-size ≥ 2 and --replicas ≥ 1");
    }
    if !options.plugin.is_file() {
        bail!(
            "{} is missing: build the plugins (cd wasm-plugins && cargo build --release \
             --target wasm32-wasip2)",
            options.plugin.display()
        );
    }
    if options.restart_backend_at.is_some() && options.engine != Engine::Reference {
        bail!(
            "--restart-backend-at needs the reference backend: vLLM forgets the adapters it \
             loaded at run time when it restarts, and its filesystem resolver only takes adapters \
             whose base_model_name_or_path is the served name"
        );
    }
    if !options.sidecar.is_file() {
        bail!(
            "{} is missing: build it (cargo build --release -p clawback-sidecar)",
            options.sidecar.display()
        );
    }
    let started = Instant::now();
    // The demo's own torch work (teaching the model, comparing adapters) is small: a second
    // thread would only spin against the processes it starts.
    tch::set_num_threads(1);
    let run = RunDir::create(&options.dir)?;
    say(&format!("run folder {}", run.root.display()));
    options
        .engine
        .tiny_model(options.seed as i64)
        .write(&run.model())?;
    let suffix = options
        .redis
        .as_ref()
        .map(|_| format!("{:x}", std::process::id()));
    let tenants = DemoTenant::pair(suffix.as_deref());
    let prompts: Vec<&str> = tenants
        .iter()
        .flat_map(|t| t.prompts.iter().copied())
        .collect();
    let taught = teach::teach(&run.model(), &prompts, options.seed)?;
    say(&format!(
        "taught the tiny model to answer in lower, UPPER or Title case: {} steps in {:.1} s, loss {:.3}",
        taught.steps, taught.seconds, taught.loss
    ));
    let plugin = run.plugins().join(format!("{PLUGIN}.wasm"));
    std::fs::copy(&options.plugin, &plugin)
        .with_context(|| format!("copying {}", options.plugin.display()))?;

    let exe = std::env::current_exe().context("finding this executable")?;
    say(&format!("starting {}", options.engine.describe()));
    // Each tenant's live version and the one replacing it, loaded side by side while it drains.
    let mut backend = Backend::start(&options.engine, exe.clone(), &run, 0, 2 * tenants.len())?;
    say(&format!(
        "{} (tiny model) on {}",
        options.engine.describe(),
        backend.url()
    ));
    let admin_token = format!("demo-admin-{:x}", std::process::id());
    let backend_url = backend.url();
    let wiring = Wiring {
        run: &run,
        backend: &backend_url,
        redis: options.redis.as_deref(),
        admin_token: &admin_token,
        tenants: &tenants,
        engine: &options.engine,
    };
    let config = run.write("sidecar.toml", &files::sidecar_toml(&wiring))?;
    let mut sidecars = Vec::new();
    let mut sidecar_urls = Vec::new();
    for replica in 0..options.replicas {
        let (process, addr) = Process::start(
            &format!("sidecar-{replica}"),
            &options.sidecar,
            &[
                "serve".into(),
                "--config".into(),
                config.display().to_string(),
            ],
            &run.logs(),
            Some("clawback-sidecar listening on "),
            Duration::from_secs(120),
        )?;
        let url = addr.context("the sidecar's address")?;
        say(&format!("sidecar {replica} on {url}"));
        sidecars.push(process);
        sidecar_urls.push(url);
    }
    let training = Training {
        group_size: options.group_size,
        lr: options.lr,
        rank: 8,
    };
    let trainer_config = run.write(
        "trainer.toml",
        &files::trainer_toml(&wiring, &sidecar_urls, &training),
    )?;
    let (mut trainer, _) = Process::start(
        "trainer",
        &exe,
        &[
            "train".into(),
            "--config".into(),
            trainer_config.display().to_string(),
        ],
        &run.logs(),
        None,
        Duration::ZERO,
    )?;
    say(&format!(
        "trainer: one LoRA adapter per tenant, publishing into the backend and {} sidecar(s)",
        sidecar_urls.len()
    ));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let plan = workload::Plan {
        sidecars: sidecar_urls.clone(),
        admin_token: admin_token.clone(),
        tenants: tenants.to_vec(),
        rounds: options.rounds,
        group_size: options.group_size,
        restart_backend_at: options.restart_backend_at,
        progress_every: options.progress_every,
    };
    let outcome = runtime.block_on(workload::drive(&plan, &run, &mut backend, &mut trainer));
    // Whatever happened: the trainer checkpoints on SIGTERM, the others just stop.
    trainer.stop(Duration::from_secs(20));
    for sidecar in &mut sidecars {
        sidecar.stop(Duration::from_secs(5));
    }
    backend.process.stop(Duration::from_secs(5));
    let outcome = outcome?;
    let summary = Summary::new(
        &plan,
        &run,
        outcome,
        started.elapsed(),
        options.engine.describe(),
    )?;
    std::fs::write(run.summary(), serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", run.summary().display()))?;
    std::fs::write(run.chart(), chart::svg(&summary))
        .with_context(|| format!("writing {}", run.chart().display()))?;
    println!("{}", summary.text());
    say(&format!(
        "reward curve: {}   summary: {}   logs: {}",
        run.chart().display(),
        run.summary().display(),
        run.logs().display()
    ));
    Ok(summary)
}

/// A line of the demo's own narration, on stderr.
fn say(line: &str) {
    eprintln!("demo: {line}");
}
