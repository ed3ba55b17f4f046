//! One plugin outside the sidecar, for `clawback-sidecar plugin check` and `plugin run`: load
//! it the way the sidecar would, describe it, run it on a recorded step.

use std::path::Path;
use std::sync::Arc;

use clawback_datapool::{NextState as RecordedNext, Step as RecordedStep};

use crate::bindings::WORLD;
use crate::call::{self, Called, Input};
use crate::config::FiltersConfig;
use crate::host::CallHost;
use crate::judge::{Judge, JudgeError};
use crate::metrics::Metrics;
use crate::plugin::{self, LoadError, Plugin};
use crate::sandbox::{Sandbox, SandboxError};
use crate::view;

#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("`filters.judge`: {0}")]
    Judge(#[from] JudgeError),
}

/// A loaded plugin and the sandbox it runs in.
pub struct Standalone {
    sandbox: Sandbox,
    plugin: Arc<Plugin>,
    config: FiltersConfig,
    judge: Option<Arc<Judge>>,
}

impl Standalone {
    /// Loads `path` with the limits and judge of `config`; up to `max_concurrency` calls may run
    /// at once.
    pub async fn load(path: &Path, config: FiltersConfig) -> Result<Self, StandaloneError> {
        let sandbox = Sandbox::new(config.max_concurrency, config.memory_limit, config.fuel)?;
        let linker = plugin::linker(&sandbox)?;
        let plugin = Plugin::load(&sandbox, &linker, path).await?;
        let judge = config
            .judge
            .clone()
            .map(|judge| Judge::new(judge, Metrics::default()).map(Arc::new))
            .transpose()?;
        Ok(Self {
            sandbox,
            plugin,
            config,
            judge,
        })
    }

    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// What `plugin check` prints.
    pub fn report(&self) -> String {
        let plugin = &self.plugin;
        format!(
            "{name}: a filter plugin for {WORLD}\n  hash: {hash}\n  description: {description}\n  exports: describe, evaluate-step, evaluate-trajectory ({trajectories})\n",
            name = plugin.name,
            hash = plugin.content_hash,
            description = plugin.info.description,
            trajectories = if plugin.info.evaluates_trajectories {
                "evaluates trajectories"
            } else {
                "steps only"
            },
        )
    }

    /// Runs `evaluate-step` on `reply` to `question` alone, as `tenant`, with `metadata` as
    /// the trajectory's (a gate's prompt set: `answer`, ...).
    pub async fn run_reply(
        &self,
        tenant: &str,
        question: &str,
        reply: &str,
        metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Called {
        let (step, next) = view::reply(question, reply, view::metadata(metadata));
        self.call(tenant, Input::Step(&step, &next)).await
    }

    /// Runs `evaluate-step` on a recorded step and what followed it, as `tenant`: its
    /// evaluation or why it failed, and the fuel it burnt.
    pub async fn run_step(
        &self,
        tenant: &str,
        step: &RecordedStep,
        next: &RecordedNext,
        metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Called {
        let step_view = view::step(step, view::metadata(metadata));
        let next_view = view::next_state(next, &step_view);
        self.call(tenant, Input::Step(&step_view, &next_view)).await
    }

    async fn call(&self, tenant: &str, input: Input<'_>) -> Called {
        let name = self.plugin.name.to_string();
        let host = CallHost::new(
            self.plugin.name.clone(),
            tenant.to_owned(),
            Arc::new(self.config.plugin(&name)),
            self.judge.clone(),
        );
        call::run(
            &self.sandbox,
            &self.plugin,
            host,
            input,
            self.config.call_timeout,
        )
        .await
    }
}
