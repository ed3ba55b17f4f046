//! Wires the filter host ([`clawback_filters::Filters`]) to the recorder: the recorder tells it
//! about trajectories, steps and next states; its evaluations come back to the recorder's write
//! queue. Started only when `filters.dir` (`--plugins DIR`) is set and recording is on.

use std::sync::Arc;

use clawback_datapool::Evaluation;
use clawback_filters::{Deliver, Filters, FiltersError};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::recorder::Recorder;

/// Loads the plugins and attaches them to `recorder`; `None` when no plugin directory is set.
pub async fn start(
    config: &Config,
    recorder: &Arc<Recorder>,
    metrics: &Metrics,
) -> Result<Option<Arc<Filters>>, FiltersError> {
    if config.filters.dir.is_none() {
        return Ok(None);
    }
    let weak = Arc::downgrade(recorder);
    let deliver: Deliver = Arc::new(move |evaluations: Vec<Evaluation>| {
        if let Some(recorder) = weak.upgrade() {
            recorder.enqueue_evaluations(evaluations);
        }
    });
    let filters =
        Arc::new(Filters::start(config.filters.clone(), metrics.filters.clone(), deliver).await?);
    for (name, hash, description) in filters.plugins() {
        tracing::info!(plugin = %name, %hash, %description, "filter plugin in service");
    }
    recorder.attach_filters(Arc::clone(&filters));
    Ok(Some(filters))
}
