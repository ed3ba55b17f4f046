//! The publisher's configuration: where adapters are written, which backends load them, which
//! sidecars route to them, and how long each step may take.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a backend is; decides the endpoints the publisher calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`; no reload of full weights.
    Vllm,
    /// `POST /load_lora_adapter`, `/unload_lora_adapter`, `/update_weights_from_disk`.
    Sglang,
    /// `clawback-serve`: vLLM's LoRA endpoints, SGLang's weight reload.
    Reference,
}

/// One inference backend; every published version is loaded into each.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub kind: BackendKind,
    /// Root URL (`http://host:8000`); a trailing `/v1` is ignored.
    pub url: String,
    /// Sent as `Authorization: Bearer` when set.
    #[serde(default)]
    pub api_key: Option<String>,
}

/// A sidecar whose in-flight calls the publisher waits on before it unloads an adapter.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sidecar {
    /// The sidecar's listener (`http://host:8100`); `GET /admin/policies` is asked there.
    pub url: String,
    /// Its `admin.token`.
    pub admin_token: String,
}

/// What a published version is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Mode {
    /// A PEFT adapter directory per version, loaded next to the base model under its own name.
    Lora,
    /// The whole model's safetensors, reloaded in place (`update_weights_from_disk`). The
    /// backends keep serving it as `served_model`, which is what the tenant's policy names.
    FullWeights { served_model: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Tries per backend call, the first included.
    pub attempts: u32,
    /// Wait before the second try; doubled for each further one, up to `max_backoff`.
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishConfig {
    #[serde(default = "defaults::mode")]
    pub mode: Mode,
    /// Versions are written to `<adapter_root>/<tenant>@v<N>`; the backends read them there, so
    /// it must be the same path for them (a shared volume).
    pub adapter_root: PathBuf,
    pub backends: Vec<Backend>,
    /// Sidecars to wait on for the switch and the drain; none: the switch is only the datapool
    /// write and the previous adapter is unloaded at once.
    #[serde(default)]
    pub sidecars: Vec<Sidecar>,
    #[serde(default = "defaults::retry")]
    pub retry: Retry,
    /// Bound on one backend or sidecar HTTP call.
    #[serde(default = "defaults::request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long every sidecar may take to report the new version live.
    #[serde(default = "defaults::switch_timeout", with = "humantime_serde")]
    pub switch_timeout: Duration,
    /// How long calls still running on the previous adapter may take before it is unloaded
    /// anyway.
    #[serde(default = "defaults::drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How often the sidecars are asked while waiting for the switch or the drain.
    #[serde(default = "defaults::poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// A new version serves a share of its tenant's calls first, and replaces the live version
    /// only if its users' rewards hold up. Unset: a version goes live for all calls at once.
    #[serde(default)]
    pub canary: Option<CanaryConfig>,
}

/// `[publish.canary]`: the trial a new version stands before it replaces the live one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryConfig {
    /// Of the tenant's calls the candidate serves meanwhile, 1-99.
    pub percent: u8,
    /// Rewarded steps each side (the candidate's, the live version's, counted from the trial's
    /// start) before it is judged.
    pub min_steps: usize,
    /// The candidate's mean reward may be at most this far below the live version's.
    pub max_drop: f64,
    /// A candidate not judged by then (too few rewarded calls) is dropped.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
}

impl PublishConfig {
    /// A LoRA publisher into `adapter_root` for `backends`, with the default bounds: 4 tries per
    /// call from 200 ms backoff, 30 s per call, 10 s for the switch, 5 min for the drain.
    pub fn lora(adapter_root: impl Into<PathBuf>, backends: Vec<Backend>) -> Self {
        Self {
            mode: defaults::mode(),
            adapter_root: adapter_root.into(),
            backends,
            sidecars: Vec::new(),
            retry: defaults::retry(),
            request_timeout: defaults::request_timeout(),
            switch_timeout: defaults::switch_timeout(),
            drain_timeout: defaults::drain_timeout(),
            poll_interval: defaults::poll_interval(),
            canary: None,
        }
    }

    /// What is wrong with the configuration, in its own words.
    pub fn check(&self) -> Result<(), String> {
        if self.backends.is_empty() {
            return Err("`backends` is empty: name at least one backend to load into".to_owned());
        }
        if self.retry.attempts == 0 {
            return Err("`retry.attempts` must be at least 1".to_owned());
        }
        if self.poll_interval.is_zero() {
            return Err("`poll_interval` must be longer than zero".to_owned());
        }
        if let Some(canary) = &self.canary {
            if !(1..=99).contains(&canary.percent) {
                return Err(format!("`canary.percent` {} must be 1-99", canary.percent));
            }
            if canary.min_steps == 0 {
                return Err("`canary.min_steps` must be at least 1".to_owned());
            }
            if !(canary.max_drop.is_finite() && canary.max_drop >= 0.0) {
                return Err(format!(
                    "`canary.max_drop` {} must be a number ≥ 0",
                    canary.max_drop
                ));
            }
            if self.mode != Mode::Lora {
                return Err(
                    "a canary needs `mode = lora`: full weights serve one version at a time"
                        .to_owned(),
                );
            }
        }
        if let Mode::FullWeights { served_model } = &self.mode {
            if served_model.is_empty() {
                return Err("`mode.served_model` is empty".to_owned());
            }
            if let Some(vllm) = self.backends.iter().find(|b| b.kind == BackendKind::Vllm) {
                return Err(format!(
                    "backend {} is vLLM, which has no reload of full weights from disk: use `mode = lora` or SGLang",
                    vllm.url
                ));
            }
        }
        Ok(())
    }
}

/// The values a configuration file may leave out.
mod defaults {
    use std::time::Duration;

    use super::{Mode, Retry};

    pub fn mode() -> Mode {
        Mode::Lora
    }
    pub fn retry() -> Retry {
        Retry {
            attempts: 4,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
    pub fn request_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn switch_timeout() -> Duration {
        Duration::from_secs(10)
    }
    pub fn drain_timeout() -> Duration {
        Duration::from_secs(300)
    }
    pub fn poll_interval() -> Duration {
        Duration::from_millis(100)
    }
}
