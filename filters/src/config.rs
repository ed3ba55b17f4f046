//! The filter host's configuration: the `[filters]` section of the sidecar's TOML.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The default fuel of a call: 500 million units — a tight loop burns it in about 50 ms on one
/// core here (`endless_loop`, 2026-12-07) — and over 90 times what any shipped plugin burns at
/// the view's caps: at most 0.12 million on a step of 200 kB of conversation, 5.3 million on a
/// reply at the 16 KiB cap (`restates_question`; filters/tests/plugins.rs).
pub const DEFAULT_FUEL: u64 = 500_000_000;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FiltersConfig {
    /// Directory of plugin components (`*.wasm`, the file stem is the plugin's name). Unset: no
    /// filters run.
    pub dir: Option<PathBuf>,
    /// Work one call may do, in wasmtime fuel (about one unit per Wasm instruction; waiting on
    /// the judge burns none). A budget of work, not time: a busy host does not stop a call that
    /// a quiet one finishes. `clawback-sidecar plugin run` prints what a call burnt.
    pub fuel: u64,
    /// Wall-clock backstop for a whole call, judge calls included. A call stopped by it failed
    /// for the host's reasons (a busy host, a slow judge) and is tried again, up to
    /// `host_retries` times, before its `filter_error` is recorded.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub call_timeout: Duration,
    /// Tries again of a call that failed for the host's reasons (see `call_timeout`).
    pub host_retries: u32,
    /// Linear memory one plugin instance may grow to, in bytes.
    pub memory_limit: usize,
    /// Plugin calls running at once, across plugins.
    pub max_concurrency: usize,
    /// Steps and trajectories waiting for their filters; past it new ones are dropped (counted),
    /// never waited for.
    pub queue_capacity: usize,
    /// Threads of the filters' own runtime: plugins never run on the proxy's threads.
    pub threads: usize,
    /// Trajectories whose steps the host keeps in memory for plugins; past it the one idle
    /// longest is forgotten (counted), and what plugins need of it is read back from the
    /// datapool instead.
    pub max_live: usize,
    /// How often the directory is checked for changed plugins; `0s` turns hot reload off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub reload_interval: Duration,
    pub breaker: BreakerConfig,
    /// The judge model plugins may call (`judge` import). Unset: `judge` answers an error.
    pub judge: Option<JudgeConfig>,
    /// Per-plugin settings, by plugin name (the file stem).
    pub plugins: BTreeMap<String, PluginConfig>,
}

/// When a failing plugin is switched off.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failed calls after which the plugin is disabled.
    pub failures: u32,
    /// How long it stays disabled before one call tries it again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub cooldown: Duration,
}

/// An OpenAI-compatible chat completions endpoint used as the judge.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// Base URL, `http://host:port/v1` (`/chat/completions` is appended).
    pub url: String,
    /// The model name sent in each judge request.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>`.
    #[serde(default)]
    pub api_key: Option<String>,
    /// One judge request.
    #[serde(default = "default_judge_timeout", with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub timeout: Duration,
    /// Judge requests one plugin may have in flight at once.
    #[serde(default = "default_judge_concurrency")]
    pub max_concurrency: usize,
    /// Judge answers one plugin may ask for in one evaluation (the sum of its `n`s).
    #[serde(default = "default_judge_budget")]
    pub budget_per_evaluation: u32,
    /// Sampling temperature of the judge's answers.
    #[serde(default = "default_judge_temperature")]
    pub temperature: f64,
    /// The most tokens one judge answer may have.
    #[serde(default = "default_judge_max_tokens")]
    pub max_tokens: u32,
}

fn default_judge_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_judge_concurrency() -> usize {
    8
}
fn default_judge_budget() -> u32 {
    16
}
fn default_judge_temperature() -> f64 {
    0.6
}
fn default_judge_max_tokens() -> u32 {
    1024
}

/// One plugin's settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginConfig {
    /// `false` keeps the plugin loaded but never called.
    pub disabled: bool,
    /// Only these tenants' steps are scored by it; empty: every tenant's.
    pub tenants: Vec<String>,
    /// What the plugin's `config(key)` answers.
    pub config: BTreeMap<String, Value>,
    /// Per-tenant values that replace keys of `config` for that tenant's calls.
    pub tenant_config: BTreeMap<String, BTreeMap<String, Value>>,
}

impl PluginConfig {
    /// Whether this plugin scores `tenant`'s calls.
    pub fn applies_to(&self, tenant: &str) -> bool {
        !self.disabled && (self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant))
    }

    /// The value of `key` for `tenant`: a string as is, anything else as JSON text.
    pub fn value(&self, tenant: &str, key: &str) -> Option<String> {
        let value = self
            .tenant_config
            .get(tenant)
            .and_then(|values| values.get(key))
            .or_else(|| self.config.get(key))?;
        Some(match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

impl Default for FiltersConfig {
    fn default() -> Self {
        Self {
            dir: None,
            fuel: DEFAULT_FUEL,
            call_timeout: Duration::from_secs(120),
            host_retries: 2,
            memory_limit: 64 << 20,
            max_concurrency: 16,
            queue_capacity: 4096,
            threads: 2,
            max_live: 65_536,
            reload_interval: Duration::from_secs(2),
            breaker: BreakerConfig::default(),
            judge: None,
            plugins: BTreeMap::new(),
        }
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: Duration::from_secs(60),
        }
    }
}

impl FiltersConfig {
    /// The settings of plugin `name` (defaults when it has none).
    pub fn plugin(&self, name: &str) -> PluginConfig {
        self.plugins.get(name).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_value_replaces_the_plugin_value() {
        let plugin: PluginConfig = serde_json::from_value(serde_json::json!({
            "config": {"votes": 3, "rubric": "tool-use"},
            "tenant_config": {"acme": {"votes": 7}}
        }))
        .unwrap();
        assert_eq!(plugin.value("acme", "votes").as_deref(), Some("7"));
        assert_eq!(plugin.value("other", "votes").as_deref(), Some("3"));
        assert_eq!(plugin.value("acme", "rubric").as_deref(), Some("tool-use"));
        assert_eq!(plugin.value("acme", "missing"), None);
    }
}
