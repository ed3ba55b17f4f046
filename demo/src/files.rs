//! The demo's run folder and the configuration files it writes there: one TOML file per
//! sidecar replica and one for the trainer, the same files a deployment would write by hand
//! (`deploy/clawback.example.toml`, `trainer/trainer.example.toml`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::{DemoTenant, Engine, BASE_MODEL};

/// Where everything of one run lives; emptied when the run starts.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
}

/// Marks a folder as a demo run's, so that only such a folder is ever emptied.
const MARKER: &str = ".clawback-demo";

impl RunDir {
    /// Empties `root` (only what an earlier demo run put there) and creates the layout. A
    /// folder that holds anything but is not an earlier run's is refused, never emptied.
    pub fn create(root: &Path) -> Result<Self> {
        let dir = Self {
            root: root.to_owned(),
        };
        let occupied = std::fs::read_dir(root).is_ok_and(|mut entries| entries.next().is_some());
        if occupied && !root.join(MARKER).is_file() {
            bail!(
                "{} is not empty and not a demo run folder: give --dir a new or empty folder",
                root.display()
            );
        }
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        std::fs::write(root.join(MARKER), "clawback-demo run folder\n")
            .with_context(|| format!("marking {}", root.display()))?;
        for sub in [
            "model",
            "plugins",
            "adapters",
            "checkpoints",
            "data",
            "logs",
            "arms",
        ] {
            let path = dir.root.join(sub);
            if path.exists() {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("emptying {}", path.display()))?;
            }
            std::fs::create_dir_all(&path)
                .with_context(|| format!("creating {}", path.display()))?;
        }
        for file in [
            "train-metrics.jsonl",
            "summary.json",
            "reward-curve.svg",
            "reward-curve.png",
            "preference-rate.svg",
            "preference-rate.png",
        ] {
            let _ = std::fs::remove_file(dir.root.join(file));
        }
        Ok(dir)
    }

    pub fn model(&self) -> PathBuf {
        self.root.join("model")
    }
    pub fn plugins(&self) -> PathBuf {
        self.root.join("plugins")
    }
    pub fn adapters(&self) -> PathBuf {
        self.root.join("adapters")
    }
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn metrics(&self) -> PathBuf {
        self.root.join("train-metrics.jsonl")
    }
    /// A chart of the run, without its extension (written as `.svg` and `.png`).
    pub fn chart(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    pub fn summary(&self) -> PathBuf {
        self.root.join("summary.json")
    }

    /// Writes `text` to `name` in the run folder and returns its path.
    pub fn write(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.root.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// Puts the files of the model folder `from` (flat) into `to`: hard links where both are on one
/// file system (a real model's weights are hundreds of megabytes, and nothing writes to them),
/// else copies.
pub fn link_model(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let target = to.join(entry.file_name());
        let _ = std::fs::remove_file(&target);
        if std::fs::hard_link(entry.path(), &target).is_err() {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// A TOML basic string (JSON's escaping is a subset of TOML's).
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn path(p: &Path) -> String {
    quoted(&p.display().to_string())
}

/// A filter plugin the sidecars run, by its file stem in the run's `plugins/`, with each
/// tenant's config (`key = value` TOML pairs).
#[derive(Debug, Clone)]
pub struct Plugin {
    pub name: &'static str,
    pub tenant_config: Vec<(String, String)>,
}

/// What the sidecars and the trainer share.
pub struct Wiring<'a> {
    pub run: &'a RunDir,
    pub backend: &'a str,
    pub redis: Option<&'a str>,
    pub admin_token: &'a str,
    pub tenants: &'a [DemoTenant],
    pub engine: &'a Engine,
    pub plugins: &'a [Plugin],
    /// When a trajectory nobody calls any more is complete.
    pub idle_timeout: &'a str,
}

/// One sidecar replica's config: the backend in vLLM's shapes, the tenants' keys, the admin
/// token, routing to each tenant's live adapter, and the scenario's plugins with each tenant's
/// config.
pub fn sidecar_toml(w: &Wiring<'_>) -> String {
    let mut toml = String::new();
    let _ = writeln!(toml, "listen = \"127.0.0.1:0\"");
    let _ = writeln!(toml, "upstreams = [{}]", quoted(w.backend));
    let _ = writeln!(toml, "upstream_kind = \"vllm\"");
    let _ = writeln!(toml, "data_dir = {}", path(&w.run.data()));
    if let Some(redis) = w.redis {
        let _ = writeln!(toml, "redis = {}", quoted(redis));
    }
    let _ = writeln!(toml, "\n[tenants.keys]");
    for tenant in w.tenants {
        let _ = writeln!(
            toml,
            "{} = {}",
            quoted(&tenant.key_hash()),
            quoted(&tenant.name)
        );
    }
    let _ = writeln!(
        toml,
        "\n[recording]\nidle_timeout = {}\ngroup_timeout = \"2m\"",
        quoted(w.idle_timeout)
    );
    let _ = writeln!(toml, "\n[admin]\ntoken = {}", quoted(w.admin_token));
    let _ = writeln!(
        toml,
        "\n[routing]\nbase_model = {}\npoll_interval = \"100ms\"",
        quoted(BASE_MODEL)
    );
    let _ = writeln!(toml, "\n[filters]\ndir = {}", path(&w.run.plugins()));
    for plugin in w.plugins.iter().filter(|p| !p.tenant_config.is_empty()) {
        let _ = writeln!(toml, "\n[filters.plugins.{}.tenant_config]", plugin.name);
        for (tenant, config) in &plugin.tenant_config {
            let _ = writeln!(toml, "{} = {{ {config} }}", quoted(tenant));
        }
    }
    toml
}

/// How hard the trainer pushes: the demo's knobs, chosen so a tiny model moves in minutes.
pub struct Training {
    /// Samples an optimizer step waits for: one group's rollouts, or one round's sessions.
    pub samples_per_step: u32,
    pub lr: f64,
    pub rank: u32,
    /// The weights of the combined advantage's reward and hint-distillation terms.
    pub rl_weight: f64,
    pub opd_weight: f64,
    /// The clamp of the distillation advantage (nats; 0: none).
    pub opd_clip: f64,
    /// How long a step waits for `samples_per_step` before it takes fewer.
    pub max_wait: &'static str,
    /// libtorch's threads in the trainer.
    pub threads: u32,
    /// The k3 KL term to the base: what keeps the model close to what it knew.
    pub kl_coef: f64,
    /// The gate before a version goes live; `None`: every checkpoint goes live.
    pub gate: Option<GateFiles>,
}

/// What the trainer's gate reads: the run's copies of the prompt sets, the check plugins, and
/// the form each tenant's users asked for.
pub struct GateFiles {
    pub retention: PathBuf,
    pub preference: PathBuf,
    pub plugins: PathBuf,
    /// `(tenant, form)` for the `reply_form` check.
    pub forms: Vec<(String, &'static str)>,
}

impl GateFiles {
    /// The `[gate]` section: retention (answers and no question given back) at most 2 fewer
    /// than the live version and than the base, preference (each tenant's form) at most 1
    /// fewer than the live version; a larger drop holds a candidate back where a sign test on
    /// the prompts the two disagree on gives p < 0.05. On 40 questions that tells noise (a
    /// version that forgot nothing moves by 2-3 either way) from a collapse, not from a drift of
    /// 6 (bench/results.md, 2026-12-08).
    fn toml(&self) -> String {
        let mut toml = format!(
            "\n[gate]\nmax_new_tokens = 48\n\n[gate.filters]\ndir = {}\n",
            path(&self.plugins)
        );
        toml.push_str("\n[gate.filters.plugins.reply_form.tenant_config]\n");
        for (tenant, form) in &self.forms {
            let _ = writeln!(toml, "{} = {{ form = {} }}", quoted(tenant), quoted(form));
        }
        let _ = write!(
            toml,
            "\n[[gate.sets]]\nname = \"retention\"\nfile = {}\n\
             checks = [\"knows_answer\", \"restates_question\"]\nmax_drop = 2\n\
             max_drop_from_base = 2\nsignificance = 0.05\n\n[[gate.sets]]\nname = \"preference\"\n\
             file = {}\nchecks = [\"reply_form\"]\nmax_drop = 1\nsignificance = 0.05\n",
            path(&self.retention),
            path(&self.preference)
        );
        toml
    }
}

/// The trainer's config: every tenant's adapter from the sidecars' datapool, a checkpoint (and
/// so a publish) whenever a tenant's queue runs dry, into the backend and every replica.
pub fn trainer_toml(w: &Wiring<'_>, sidecars: &[String], training: &Training) -> String {
    let datapool = match w.redis {
        Some(redis) => quoted(redis),
        None => path(&w.run.data()),
    };
    let tenants: Vec<String> = w.tenants.iter().map(|t| quoted(&t.name)).collect();
    let mut toml = format!(
        r#"model = {model}
device = "cpu"
threads = {threads}
datapool = {datapool}
tenants = [{tenants}]
poll_interval = "100ms"

[consumer]
group = "demo"
name = "trainer-0"

[lora]
rank = {rank}
alpha = {alpha:.1}

[optimizer]
lr = {lr:e}
max_grad_norm = 1.0

[schedule]
warmup_steps = 2
decay = "constant"

[loss]
group_normalization = "grpo"
rl_weight = {rl_weight:.1}
opd_weight = {opd_weight:.1}
opd_clip = {opd_clip:.1}
kl_coef = {kl_coef:?}

[batch]
samples_per_step = {group}
max_wait = "{max_wait}"
max_staleness = 8

[checkpoint]
dir = {checkpoints}
every = 1
keep_last = 2

[metrics]
progress = false
jsonl = {metrics}

[sampler]
logprobs = "{logprobs}"

[publish]
adapter_root = {adapters}
switch_timeout = "5s"
drain_timeout = "10s"
poll_interval = "50ms"

[[publish.backends]]
kind = "{kind}"
url = {backend}
"#,
        model = path(&w.run.model()),
        tenants = tenants.join(", "),
        rank = training.rank,
        alpha = 2.0 * f64::from(training.rank),
        lr = training.lr,
        group = training.samples_per_step,
        threads = training.threads,
        rl_weight = training.rl_weight,
        opd_weight = training.opd_weight,
        opd_clip = training.opd_clip,
        kl_coef = training.kl_coef,
        max_wait = training.max_wait,
        checkpoints = path(&w.run.root.join("checkpoints")),
        metrics = path(&w.run.metrics()),
        adapters = path(&w.run.adapters()),
        backend = quoted(w.backend),
        kind = w.engine.publish_kind(),
        logprobs = w.engine.logprobs_mode(),
    );
    for url in sidecars {
        let _ = write!(
            toml,
            "\n[[publish.sidecars]]\nurl = {}\nadmin_token = {}\n",
            quoted(url),
            quoted(w.admin_token)
        );
    }
    if let Some(gate) = &training.gate {
        toml.push_str(&gate.toml());
    }
    toml
}
