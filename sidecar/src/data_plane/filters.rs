//! Wires the filter host ([`clawback_filters::Filters`]) to the recorder: the recorder tells it
//! about trajectories, steps and next states; its evaluations come back to the recorder's
//! journal; what another replica of a pool recorded it reads from the datapool. Started only
//! when `filters.dir` (`--plugins DIR`) is set and recording is on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{Evaluation, Store};
use clawback_filters::dispatch::{Load, Until};
use clawback_filters::{Deliver, Filters, FiltersError};

use crate::data_plane::metrics::Metrics;
use crate::data_plane::recorder::Recorder;

/// Loads the plugins and attaches them to `recorder`; `None` when no plugin directory is set.
/// A tenant holds its fair share of the plugins' queue ([`crate::data_plane::share`]: at most
/// `tenant_share` of it, less as more tenants are active; `fair` off: `tenant_share`) and at most
/// `tenant_share` of their calls at once.
pub async fn start(
    config: &clawback_filters::FiltersConfig,
    recorder: &Arc<Recorder>,
    metrics: &Metrics,
    (tenant_share, fair): (f64, bool),
) -> Result<Option<Arc<Filters>>, FiltersError> {
    if config.dir.is_none() {
        return Ok(None);
    }
    let weak = Arc::downgrade(recorder);
    let deliver: Deliver = Arc::new(move |evaluations: Vec<Evaluation>| {
        if let Some(recorder) = weak.upgrade() {
            recorder.enqueue_evaluations(evaluations);
        }
    });
    let share = clawback_filters::fair::TenantShare {
        queued: crate::data_plane::share::Shares::new(config.queue_capacity, tenant_share, fair),
        running: crate::data_plane::share::of(config.max_concurrency, tenant_share),
    };
    let filters =
        Arc::new(Filters::start(config.clone(), share, metrics.filters.clone(), deliver).await?);
    for (name, hash, description) in filters.plugins() {
        tracing::info!(plugin = %name, %hash, %description, "filter plugin in service");
    }
    filters.load_with(loader(Arc::clone(recorder.store())));
    recorder.attach_filters(Arc::clone(&filters));
    Ok(Some(filters))
}

/// How long a replica waits for another one's write to reach the datapool before it gives the
/// evaluation up (counted as a dropped filter job). Writes land within milliseconds unless the
/// datapool is away.
const LOAD_WITHIN: Duration = Duration::from_secs(10);

/// Reads a trajectory from the datapool, polling until it holds what is asked.
fn loader(store: Arc<dyn Store>) -> Load {
    Arc::new(move |tenant, trajectory, until: Until| {
        let store = Arc::clone(&store);
        Box::pin(async move {
            let deadline = Instant::now() + LOAD_WITHIN;
            loop {
                if let Ok(Some(record)) = store.trajectory(&tenant, &trajectory).await {
                    if until.met_by(&record) {
                        return Some(record);
                    }
                }
                if Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    })
}
