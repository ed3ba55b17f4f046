//! What a plugin may ask of the host during one call: a log line, its configuration, the judge.

use std::sync::Arc;

use crate::bindings::clawback::filter::{host, types};
use crate::bindings::LogLevel;
use crate::config::PluginConfig;
use crate::judge::Judge;
use crate::metrics::PluginName;

/// Longest log line kept from a plugin, in bytes.
const LOG_LINE_CAP: usize = 2048;

/// One call's host state.
pub struct CallHost {
    plugin: PluginName,
    tenant: String,
    config: Arc<PluginConfig>,
    judge: Option<Arc<Judge>>,
    /// Judge answers still allowed in this call.
    budget_left: u32,
    /// The plugin was told its budget was spent.
    refused: bool,
    /// Why the host trapped the plugin from an import.
    pub trapped: Option<String>,
}

impl CallHost {
    pub fn new(
        plugin: PluginName,
        tenant: String,
        config: Arc<PluginConfig>,
        judge: Option<Arc<Judge>>,
    ) -> Self {
        let budget_left = judge.as_ref().map_or(0, |j| j.budget_per_evaluation());
        Self {
            plugin,
            tenant,
            config,
            judge,
            budget_left,
            refused: false,
            trapped: None,
        }
    }
}

impl types::Host for CallHost {}

impl host::Host for CallHost {
    fn log(&mut self, level: LogLevel, message: String) {
        let mut end = message.len().min(LOG_LINE_CAP);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let message = &message[..end];
        let plugin = &*self.plugin.0;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn config(&mut self, key: String) -> Option<String> {
        self.config.value(&self.tenant, &key)
    }

    async fn judge(
        &mut self,
        prompt: String,
        n: u32,
    ) -> wasmtime::Result<Result<Vec<String>, String>> {
        let Some(judge) = self.judge.clone() else {
            return Ok(Err(
                "no judge is configured ([filters.judge] in the sidecar config)".to_owned(),
            ));
        };
        let budget = judge.budget_per_evaluation();
        if self.refused {
            let reason = format!(
                "judge budget: kept calling judge after its budget of {budget} answers per evaluation was spent"
            );
            self.trapped = Some(reason.clone());
            return Err(wasmtime::Error::msg(reason));
        }
        if n > self.budget_left {
            self.refused = true;
            return Ok(Err(format!(
                "judge budget spent: asked for {n} answers, {} left of {budget} per evaluation",
                self.budget_left
            )));
        }
        self.budget_left -= n;
        let answers = judge.ask(&self.plugin, &prompt, n).await;
        if answers.is_empty() && n > 0 {
            return Ok(Err(format!("none of the {n} judge requests answered")));
        }
        Ok(Ok(answers))
    }
}
