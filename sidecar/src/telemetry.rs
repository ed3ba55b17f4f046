//! Logging setup. Logs go to stderr as text or JSON lines; request and response bodies and
//! `Authorization` values are never logged.

use tracing_subscriber::EnvFilter;

use crate::config::{Log, LogFormat};

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
