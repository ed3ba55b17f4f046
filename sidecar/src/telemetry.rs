//! Logging setup. Logs go to stderr as text or JSON lines; request and response bodies and
//! `Authorization` values are never logged.

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `clawback_sidecar=debug,info`.
    pub filter: String,
}

impl Default for Log {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?}: {source}")]
pub struct LogFilterError {
    filter: String,
    #[source]
    source: tracing_subscriber::filter::ParseError,
}

pub fn init(log: &Log) -> Result<(), LogFilterError> {
    let filter = EnvFilter::try_new(&log.filter).map_err(|source| LogFilterError {
        filter: log.filter.clone(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests running several sidecars in one process) keeps the first.
    let _ = match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}
