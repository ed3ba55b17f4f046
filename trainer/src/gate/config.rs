//! The `[gate]` section of `trainer.toml`: what a candidate version must pass before it goes
//! live.

use std::path::PathBuf;

use clawback_datapool::TenantId;
use clawback_filters::FiltersConfig;
use serde::Deserialize;

/// What a candidate version is checked on and how it must compare.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSection {
    /// The check plugins, in the sidecar's `[filters]` shape: `dir` holds them (`<name>.wasm`),
    /// with their fuel, memory limit and per-tenant `config` (`[gate.filters.plugins.reply_form]
    /// tenant_config.brief = { form = "brief" }`).
    pub filters: FiltersConfig,
    /// The prompt sets, each with its checks and its rule.
    pub sets: Vec<PromptSetConfig>,
    /// Tokens of each greedy reply the gate reads.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// The most mean per-token KL(candidate ‖ base), in nats, over the base's greedy replies to
    /// the tenant's prompts: how far the candidate moved from what the model knew, on text it
    /// was not trained to change. Unset: not a rule, only reported.
    #[serde(default)]
    pub max_kl: Option<f64>,
    /// Where a candidate that did not pass is kept for inspection (`<dir>/<tenant>@v<N>/`, the
    /// adapter and `gate.json`). Unset: `<publish.adapter_root>/held-back`.
    #[serde(default)]
    pub held_back_dir: Option<PathBuf>,
}

fn default_max_new_tokens() -> usize {
    48
}

/// One prompt set and its rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSetConfig {
    /// Names the set in reasons and metrics (`retention`, `preference`).
    pub name: String,
    /// JSON lines, one prompt each: `{"prompt": "What is the capital of France?", "answer":
    /// "Paris"}`; every key but `prompt` is metadata the checks read (trusted: the operator's).
    pub file: PathBuf,
    /// The plugins that check each reply (their file stems). A reply passes when at least one
    /// check scored it above 0 and none below.
    pub checks: Vec<String>,
    /// Only these tenants' candidates are checked on this set; empty: every tenant's.
    #[serde(default)]
    pub tenants: Vec<TenantId>,
    /// A candidate may pass at most this many prompts fewer than the live version.
    #[serde(default)]
    pub max_drop: usize,
    /// ... and at most this many fewer than the base model: the bound that does not creep a
    /// little further with each version. Unset: only the live version is compared.
    #[serde(default)]
    pub max_drop_from_base: Option<usize>,
    /// A drop beyond `max_drop` (or `max_drop_from_base`) holds the candidate back only where
    /// it is also this unlikely for a version no worse: a one-sided sign test on the prompts
    /// where the two disagree (`gate/rule.rs`). Unset: the count alone decides.
    #[serde(default)]
    pub significance: Option<f64>,
}

impl PromptSetConfig {
    /// Whether `tenant`'s candidates are checked on this set.
    pub fn applies_to(&self, tenant: &TenantId) -> bool {
        self.tenants.is_empty() || self.tenants.contains(tenant)
    }
}

impl GateSection {
    /// What is wrong with it, in the key's words.
    pub fn check(&self) -> Result<(), String> {
        if self.filters.dir.is_none() {
            return Err("`gate.filters.dir` must name the check plugins' folder".to_owned());
        }
        if self.sets.is_empty() {
            return Err("`gate.sets` names no prompt set".to_owned());
        }
        if self.max_new_tokens == 0 {
            return Err("`gate.max_new_tokens` must be at least 1".to_owned());
        }
        if let Some(kl) = self.max_kl.filter(|kl| !(kl.is_finite() && *kl >= 0.0)) {
            return Err(format!("`gate.max_kl` {kl} must be a number ≥ 0"));
        }
        for set in &self.sets {
            if set.checks.is_empty() {
                return Err(format!("`gate.sets` {:?} names no check", set.name));
            }
            if let Some(alpha) = set
                .significance
                .filter(|alpha| !(*alpha > 0.0 && *alpha <= 1.0))
            {
                return Err(format!(
                    "`gate.sets` {:?}: `significance` {alpha} must be in (0, 1]",
                    set.name
                ));
            }
        }
        let mut names: Vec<&str> = self.sets.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("`gate.sets` names {:?} twice", twice[0]));
        }
        Ok(())
    }
}
