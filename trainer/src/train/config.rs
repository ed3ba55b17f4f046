//! The `train` command's configuration: one typed struct, loaded from a TOML file and then
//! `CLAWBACK_TRAINER_*` environment variables (`CLAWBACK_TRAINER_BATCH__SAMPLES_PER_STEP=16`),
//! later wins. Unknown keys are refused so a typo fails at start with the key's name; every
//! field but `model` and `datapool` has a default. `trainer/trainer.example.toml` lists them all.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clawback_datapool::reward::RewardWeights;
use clawback_datapool::{ConsumerName, TenantId};
use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::gate::GateSection;
use crate::losses::{AdvantageWeights, ClipRange, GroupNormalization, LossConfig};
use crate::optim::AdamWConfig;
use crate::publish::PublishConfig;
use crate::sampler::{EngineDefaults, LogprobsMode, SamplerError};
use crate::schedule::{Decay, LrSchedule};
use crate::scoring::Teacher;
use clawback_model::lora::{LoraConfig, Target};
use clawback_model::model::Placement;

/// What is wrong with the configuration, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid trainer configuration: {0}")]
    Invalid(#[from] Box<figment::Error>),
    #[error("invalid trainer configuration: `{key}`: {problem}")]
    Value { key: &'static str, problem: String },
}

fn bad(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        key,
        problem: problem.into(),
    }
}

/// The whole `trainer.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The base model: an HF folder (`config.json`, safetensors; `tokenizer.json` and
    /// `tokenizer_config.json` for re-tokenising text-only steps and for hints).
    pub model: PathBuf,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    #[serde(default = "default_device")]
    pub device: String,
    /// CPU threads for libtorch; unset: libtorch's own choice.
    #[serde(default)]
    pub threads: Option<i32>,
    /// `redis://…` / `rediss://…`, or the embedded store: a directory holding the sidecar's
    /// `clawback.sqlite3`, or the SQLite file itself.
    pub datapool: String,
    /// `"all"` (every tenant with data, looked up again as new ones appear) or a list.
    #[serde(default)]
    pub tenants: Tenants,
    /// How long to sleep when no tenant had anything ready.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
    #[serde(default)]
    pub consumer: ConsumerSection,
    #[serde(default)]
    pub lora: LoraSection,
    #[serde(default)]
    pub optimizer: OptimizerSection,
    #[serde(default)]
    pub schedule: ScheduleSection,
    #[serde(default)]
    pub loss: LossSection,
    #[serde(default)]
    pub batch: BatchSection,
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub sampler: SamplerSection,
    /// Per tenant: plugin name → weight in the reward's weighted mean (1.0 when not listed).
    #[serde(default)]
    pub reward_weights: BTreeMap<TenantId, RewardWeights>,
    /// Where new versions go live: every checkpoint that holds new optimizer steps is published
    /// as `<tenant>@v<optimizer step>` to these backends and routed to by the sidecars. Unset:
    /// the trainer only checkpoints.
    #[serde(default)]
    pub publish: Option<PublishConfig>,
    /// What a candidate version must pass before it is published (needs `[publish]`). Unset:
    /// every checkpoint with new steps goes live.
    #[serde(default)]
    pub gate: Option<GateSection>,
}

fn default_device() -> String {
    "auto".into()
}
fn default_poll() -> Duration {
    Duration::from_secs(1)
}

/// Which tenants this trainer trains.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "TenantsRaw")]
pub enum Tenants {
    #[default]
    All,
    List(Vec<TenantId>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TenantsRaw {
    Word(String),
    List(Vec<TenantId>),
}

impl TryFrom<TenantsRaw> for Tenants {
    type Error = String;
    fn try_from(raw: TenantsRaw) -> Result<Self, String> {
        match raw {
            TenantsRaw::Word(w) if w == "all" => Ok(Tenants::All),
            TenantsRaw::Word(w) => Err(format!("{w:?}: expected \"all\" or a list of tenant ids")),
            TenantsRaw::List(list) if list.is_empty() => {
                Err("an empty list trains nothing; use \"all\" or name tenants".into())
            }
            TenantsRaw::List(list) => Ok(Tenants::List(list)),
        }
    }
}

/// The trainer's membership of the ready queue's consumer group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerSection {
    pub group: ConsumerName,
    pub name: ConsumerName,
    /// An entry unacked this long is taken over by another member.
    #[serde(with = "humantime_serde")]
    pub claim_idle: Duration,
    /// After this many deliveries an unacked entry is dead-lettered.
    pub max_deliveries: u32,
    /// Ready entries read per call.
    pub read_count: usize,
}

impl Default for ConsumerSection {
    fn default() -> Self {
        let name = |s: &str| ConsumerName::new(s).unwrap_or_else(|e| panic!("default name: {e}"));
        ConsumerSection {
            group: name("trainer"),
            name: name("trainer-0"),
            claim_idle: Duration::from_secs(300),
            max_deliveries: 5,
            read_count: 16,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    pub rank: i64,
    pub alpha: f64,
    pub dropout: f64,
    pub targets: Vec<Target>,
    pub use_rslora: bool,
}

impl Default for LoraSection {
    fn default() -> Self {
        let d = LoraConfig::default();
        LoraSection {
            rank: d.rank,
            alpha: d.alpha,
            dropout: d.dropout,
            targets: d.targets,
            use_rslora: d.use_rslora,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSection {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip; 0 turns it off.
    pub max_grad_norm: f64,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        let d = AdamWConfig::default();
        OptimizerSection {
            lr: 1e-5,
            beta1: d.beta1,
            beta2: d.beta2,
            eps: d.eps,
            weight_decay: d.weight_decay,
            max_grad_norm: d.max_grad_norm,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayKind {
    Constant,
    Cosine,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSection {
    pub warmup_steps: u64,
    pub decay: DecayKind,
    /// Where the cosine reaches `min_lr`.
    pub total_steps: u64,
    pub min_lr: f64,
}

impl Default for ScheduleSection {
    fn default() -> Self {
        ScheduleSection {
            warmup_steps: 10,
            decay: DecayKind::Constant,
            total_steps: 10_000,
            min_lr: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupNorm {
    /// `(R − mean) / std`.
    Grpo,
    /// `R − mean`.
    DrGrpo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherKind {
    Base,
    Policy,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossSection {
    pub eps_low: f64,
    pub eps_high: f64,
    pub group_normalization: GroupNorm,
    /// Weight of the reward term of the combined advantage.
    pub rl_weight: f64,
    /// Weight of the hint-distillation term; 0 turns OPD off.
    pub opd_weight: f64,
    /// Clamp of each token's hint-distillation advantage, in nats; 0 leaves it as it is.
    pub opd_clip: f64,
    /// k3 KL to the frozen base; 0 turns it off.
    pub kl_coef: f64,
    /// Who scores a completion under the hint-augmented prompt.
    pub teacher: TeacherKind,
}

impl Default for LossSection {
    fn default() -> Self {
        let clip = ClipRange::default();
        let w = AdvantageWeights::default();
        LossSection {
            eps_low: clip.low,
            eps_high: clip.high,
            group_normalization: GroupNorm::Grpo,
            rl_weight: w.rl,
            opd_weight: w.opd,
            opd_clip: 0.0,
            kl_coef: 0.0,
            teacher: TeacherKind::Base,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSection {
    /// An optimizer step waits for this many samples (whole deliveries, so it may take more).
    pub samples_per_step: usize,
    /// Tokens (rows × padded length) of one forward/backward; gradients accumulate across them.
    pub micro_batch_tokens: usize,
    /// Longer samples are skipped and counted.
    pub max_seq_len: usize,
    /// K: steps served by a policy more than K versions behind the live one are dropped.
    pub max_staleness: u64,
    /// With fewer than `samples_per_step` samples waiting and nothing more ready, step anyway
    /// once the oldest has waited this long.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// How many applied step ids are remembered to drop redeliveries.
    pub seen_capacity: usize,
}

impl Default for BatchSection {
    fn default() -> Self {
        BatchSection {
            samples_per_step: 8,
            micro_batch_tokens: 8192,
            max_seq_len: 4096,
            max_staleness: 4,
            max_wait: Duration::from_secs(30),
            seen_capacity: 200_000,
        }
    }
}

/// How the engine sampled, so that the trainer scores each token under the distribution it was
/// drawn from (see `sampler.rs`). Match it to how the engine runs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerSection {
    /// Where the engine takes the parameters a request leaves unset from.
    pub defaults: DefaultsSource,
    /// What the engine's logprobs are: `raw` (vLLM's default) or `processed` (vLLM
    /// `--logprobs-mode processed_logprobs`, which the deploy scripts set).
    pub logprobs: LogprobsMode,
}

/// vLLM's `--generation-config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultsSource {
    /// The model folder's `generation_config.json` (vLLM's `auto`, its default).
    #[default]
    GenerationConfig,
    /// None beyond neutral (vLLM's `--generation-config vllm`).
    Engine,
}

impl SamplerSection {
    /// The engine's defaults for the base model in `model`.
    pub fn engine_defaults(&self, model: &Path) -> Result<EngineDefaults, SamplerError> {
        match self.defaults {
            DefaultsSource::GenerationConfig => EngineDefaults::from_model_dir(model),
            DefaultsSource::Engine => Ok(EngineDefaults::NONE),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// One folder per tenant inside.
    pub dir: PathBuf,
    /// Optimizer steps between checkpoints (deliveries are acked after each).
    pub every: u64,
    /// Checkpoints kept per tenant, newest first; 0 keeps them all.
    pub keep_last: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            dir: PathBuf::from("checkpoints"),
            every: 10,
            keep_last: 3,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// One JSON object per optimizer step.
    pub jsonl: Option<PathBuf>,
    /// Serve Prometheus `/metrics` here (loopback unless you mean it).
    pub prometheus: Option<SocketAddr>,
    /// A line per optimizer step on stdout.
    pub progress: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            jsonl: None,
            prometheus: None,
            progress: true,
        }
    }
}

impl TrainConfig {
    /// The file, then the environment.
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let config: TrainConfig = Figment::from(Toml::file_exact(file))
            .merge(Env::prefixed("CLAWBACK_TRAINER_").split("__"))
            .extract()
            .map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document (no environment): for tests.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: TrainConfig = Figment::from(Toml::string(text))
            .extract()
            .map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.placement()?;
        let positive = |key, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(key, format!("{v} must be a number > 0")))
            }
        };
        let unit = |key, v: f64| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(bad(key, format!("{v} must be in [0, 1)")))
            }
        };
        let non_negative = |key, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(bad(key, format!("{v} must be a number ≥ 0")))
            }
        };
        if let Some(publish) = &self.publish {
            publish.check().map_err(|problem| bad("publish", problem))?;
            if matches!(publish.mode, crate::publish::Mode::FullWeights { .. }) {
                return Err(bad(
                    "publish.mode",
                    "`train` publishes LoRA adapters; full_weights needs merged weights, which \
                     it does not write (use mode = { kind = \"lora\" })",
                ));
            }
        }
        if let Some(gate) = &self.gate {
            gate.check().map_err(|problem| bad("gate", problem))?;
            if self.publish.is_none() {
                return Err(bad(
                    "gate",
                    "the gate decides what is published: it needs [publish]",
                ));
            }
        }
        if self.lora.rank <= 0 {
            return Err(bad("lora.rank", "must be at least 1"));
        }
        if self.lora.targets.is_empty() {
            return Err(bad("lora.targets", "name at least one projection"));
        }
        positive("lora.alpha", self.lora.alpha)?;
        unit("lora.dropout", self.lora.dropout)?;
        positive("optimizer.lr", self.optimizer.lr)?;
        unit("optimizer.beta1", self.optimizer.beta1)?;
        unit("optimizer.beta2", self.optimizer.beta2)?;
        positive("optimizer.eps", self.optimizer.eps)?;
        non_negative("optimizer.weight_decay", self.optimizer.weight_decay)?;
        non_negative("optimizer.max_grad_norm", self.optimizer.max_grad_norm)?;
        non_negative("schedule.min_lr", self.schedule.min_lr)?;
        unit("loss.eps_low", self.loss.eps_low)?;
        non_negative("loss.eps_high", self.loss.eps_high)?;
        non_negative("loss.rl_weight", self.loss.rl_weight)?;
        non_negative("loss.opd_weight", self.loss.opd_weight)?;
        non_negative("loss.opd_clip", self.loss.opd_clip)?;
        non_negative("loss.kl_coef", self.loss.kl_coef)?;
        if self.batch.samples_per_step == 0 {
            return Err(bad("batch.samples_per_step", "must be at least 1"));
        }
        if self.batch.max_seq_len < 2 {
            return Err(bad("batch.max_seq_len", "must be at least 2"));
        }
        if self.batch.micro_batch_tokens < self.batch.max_seq_len {
            return Err(bad(
                "batch.micro_batch_tokens",
                format!(
                    "{} cannot hold one sequence of batch.max_seq_len = {}",
                    self.batch.micro_batch_tokens, self.batch.max_seq_len
                ),
            ));
        }
        if self.checkpoint.every == 0 {
            return Err(bad("checkpoint.every", "must be at least 1"));
        }
        if self.consumer.claim_idle <= self.batch.max_wait {
            // Our own queued entries would be taken over (and counted towards dead-lettering)
            // while they wait for a fuller step.
            return Err(bad(
                "consumer.claim_idle",
                format!(
                    "{:?} must be longer than batch.max_wait ({:?})",
                    self.consumer.claim_idle, self.batch.max_wait
                ),
            ));
        }
        if self.consumer.read_count == 0 {
            return Err(bad("consumer.read_count", "must be at least 1"));
        }
        Ok(())
    }

    /// The device and dtype to train on.
    pub fn placement(&self) -> Result<Placement, ConfigError> {
        self.device.parse().map_err(|e: String| bad("device", e))
    }

    pub fn lora_config(&self) -> LoraConfig {
        LoraConfig {
            rank: self.lora.rank,
            alpha: self.lora.alpha,
            dropout: self.lora.dropout,
            targets: self.lora.targets.clone(),
            use_rslora: self.lora.use_rslora,
        }
    }

    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.optimizer.beta1,
            beta2: self.optimizer.beta2,
            eps: self.optimizer.eps,
            weight_decay: self.optimizer.weight_decay,
            max_grad_norm: self.optimizer.max_grad_norm,
        }
    }

    pub fn lr_schedule(&self) -> LrSchedule {
        LrSchedule {
            peak_lr: self.optimizer.lr,
            min_lr: self.schedule.min_lr,
            warmup_steps: self.schedule.warmup_steps,
            total_steps: self.schedule.total_steps,
            decay: match self.schedule.decay {
                DecayKind::Constant => Decay::Constant,
                DecayKind::Cosine => Decay::Cosine,
            },
        }
    }

    pub fn loss_config(&self) -> LossConfig {
        LossConfig {
            clip: ClipRange {
                low: self.loss.eps_low,
                high: self.loss.eps_high,
            },
            kl_coef: self.loss.kl_coef,
            opd_clip: (self.loss.opd_clip > 0.0).then_some(self.loss.opd_clip),
        }
    }

    pub fn advantage_weights(&self) -> AdvantageWeights {
        AdvantageWeights {
            rl: self.loss.rl_weight,
            opd: self.loss.opd_weight,
        }
    }

    pub fn group_normalization(&self) -> GroupNormalization {
        match self.loss.group_normalization {
            GroupNorm::Grpo => GroupNormalization::MeanStd,
            GroupNorm::DrGrpo => GroupNormalization::MeanOnly,
        }
    }

    pub fn teacher(&self) -> Teacher {
        match self.loss.teacher {
            TeacherKind::Base => Teacher::FrozenBase,
            TeacherKind::Policy => Teacher::CurrentPolicy,
        }
    }

    /// The tenant's plugin weights (every plugin 1.0 when none are configured).
    pub fn reward_weights(&self, tenant: &TenantId) -> RewardWeights {
        self.reward_weights.get(tenant).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../trainer.example.toml");

    fn error_of(text: &str) -> String {
        TrainConfig::from_toml(text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn the_example_config_loads_with_every_section() {
        let c = TrainConfig::from_toml(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tenants, Tenants::All);
        assert_eq!(c.consumer.claim_idle, Duration::from_secs(300));
        assert_eq!(c.lora_config().targets.len(), 7);
        assert_eq!(c.batch.max_wait, Duration::from_secs(30));
        assert_eq!(c.group_normalization(), GroupNormalization::MeanStd);
        assert_eq!(c.teacher(), Teacher::FrozenBase);
        let acme = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.reward_weights(&acme).weight("tool-success"), 2.0);
        assert_eq!(c.reward_weights(&acme).weight("politeness"), 0.0);
        assert_eq!(c.reward_weights(&acme).weight("other"), 1.0);
        let publish = c
            .publish
            .unwrap_or_else(|| panic!("the example has [publish]"));
        assert_eq!(publish.backends.len(), 1);
        assert_eq!(publish.sidecars.len(), 1);
        assert_eq!(publish.drain_timeout, Duration::from_secs(300));
        let canary = publish
            .canary
            .unwrap_or_else(|| panic!("the example has a canary"));
        assert_eq!((canary.percent, canary.min_steps), (10, 50));
        let gate = c.gate.unwrap_or_else(|| panic!("the example has [gate]"));
        assert_eq!(gate.sets.len(), 2);
        assert_eq!(gate.sets[0].max_drop_from_base, Some(2));
        assert!(gate.sets[1].applies_to(&acme));
    }

    #[test]
    fn a_canary_outside_its_bounds_is_refused_by_its_key() {
        let base = "model = \"m\"\ndatapool = \"d\"\n[publish]\nadapter_root = \"a\"\n\
                    [[publish.backends]]\nkind = \"vllm\"\nurl = \"http://v\"\n";
        for (canary, key) in [
            (
                "percent = 0\nmin_steps = 5\nmax_drop = 0.1\nmax_wait = \"1h\"",
                "percent",
            ),
            (
                "percent = 100\nmin_steps = 5\nmax_drop = 0.1\nmax_wait = \"1h\"",
                "percent",
            ),
            (
                "percent = 10\nmin_steps = 0\nmax_drop = 0.1\nmax_wait = \"1h\"",
                "min_steps",
            ),
            (
                "percent = 10\nmin_steps = 5\nmax_drop = -1.0\nmax_wait = \"1h\"",
                "max_drop",
            ),
        ] {
            let err = error_of(&format!("{base}[publish.canary]\n{canary}\n"));
            assert!(err.contains(key), "{canary}: {err}");
        }
    }

    #[test]
    fn a_gate_needs_publishing_and_its_sets() {
        let base = "model = \"m\"\ndatapool = \"d\"\n";
        let gate = "[gate.filters]\ndir = \"p\"\n[[gate.sets]]\nname = \"r\"\nfile = \"r.jsonl\"\nchecks = [\"knows_answer\"]\n";
        let err = error_of(&format!("{base}{gate}"));
        assert!(err.contains("[publish]"), "{err}");
        let publish = "[publish]\nadapter_root = \"a\"\n[[publish.backends]]\nkind = \"vllm\"\nurl = \"http://v\"\n";
        let c = TrainConfig::from_toml(&format!("{base}{publish}{gate}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.gate.map(|g| g.max_new_tokens), Some(48));
        let err = error_of(&format!(
            "{base}{publish}{}",
            gate.replace("checks = [\"knows_answer\"]", "checks = []")
        ));
        assert!(err.contains("names no check"), "{err}");
    }

    #[test]
    fn the_kubernetes_trainer_config_loads() {
        let text = include_str!("../../../deploy/k8s/base/trainer.toml");
        let c = TrainConfig::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.datapool.starts_with("redis://"));
        assert!(c.publish.is_some());
    }

    #[test]
    fn the_gpu_trainer_configs_load_and_point_at_their_engines() {
        for (text, kind) in [
            (
                include_str!("../../../deploy/gpu/trainer-vllm.toml"),
                crate::publish::BackendKind::Vllm,
            ),
            (
                include_str!("../../../deploy/gpu/trainer-sglang.toml"),
                crate::publish::BackendKind::Sglang,
            ),
        ] {
            let c = TrainConfig::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
            let publish = c.publish.unwrap_or_else(|| panic!("[publish] is set"));
            assert_eq!(publish.backends.len(), 1);
            assert_eq!(publish.backends[0].kind, kind);
            assert_eq!(publish.sidecars.len(), 1);
        }
    }

    #[test]
    fn publishing_is_checked_at_load() {
        let err = error_of(
            "model = \"m\"\ndatapool = \"d\"\n[publish]\nadapter_root = \"a\"\nbackends = []\n",
        );
        assert!(err.contains("publish") && err.contains("backends"), "{err}");
        let err = error_of(
            "model = \"m\"\ndatapool = \"d\"\n[publish]\nadapter_root = \"a\"\n\
             mode = { kind = \"full_weights\", served_model = \"m\" }\n\
             [[publish.backends]]\nkind = \"sglang\"\nurl = \"http://s\"\n",
        );
        assert!(err.contains("full_weights"), "{err}");
    }

    #[test]
    fn model_and_datapool_are_all_a_minimal_config_needs() {
        let c = TrainConfig::from_toml("model = \"m\"\ndatapool = \"d\"\ntenants = [\"a\", \"b\"]")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.batch.samples_per_step, 8);
        assert_eq!(c.checkpoint.every, 10);
        assert!(matches!(c.tenants, Tenants::List(ref l) if l.len() == 2));
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_name() {
        let err = error_of("model = \"m\"\ndatapool = \"d\"\n[batch]\nsamples_per_stp = 4\n");
        assert!(err.contains("samples_per_stp"), "{err}");
        let err = error_of("model = \"m\"\ndatapool = \"d\"\nlearning_rate = 1\n");
        assert!(err.contains("learning_rate"), "{err}");
    }

    #[test]
    fn a_bad_value_is_refused_with_its_key() {
        let base = "model = \"m\"\ndatapool = \"d\"\n";
        let err = error_of(&format!("{base}[optimizer]\nlr = -1.0\n"));
        assert!(err.contains("optimizer.lr"), "{err}");
        let err = error_of(&format!(
            "{base}[batch]\nmax_seq_len = 4096\nmicro_batch_tokens = 100\n"
        ));
        assert!(err.contains("batch.micro_batch_tokens"), "{err}");
        let err = error_of(&format!("{base}device = \"tpu\"\n"));
        assert!(err.contains("device"), "{err}");
        let err = error_of(&format!("{base}tenants = \"some\"\n"));
        assert!(err.contains("tenants"), "{err}");
        let err = error_of(&format!("{base}[reward_weights.acme]\njudge = -2.0\n"));
        assert!(err.contains("judge"), "{err}");
        let err = error_of(&format!("{base}[consumer]\nclaim_idle = \"10s\"\n"));
        assert!(err.contains("consumer.claim_idle"), "{err}");
        let err = error_of(&format!("{base}[loss]\nteacher = \"oracle\"\n"));
        assert!(err.contains("teacher"), "{err}");
    }
}
