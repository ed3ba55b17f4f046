//! Per-tenant policy routing: a call of a tenant that has a live adapter is served by that
//! adapter, every other call by the base model.
//!
//! The trainer publishes a tenant's new adapter (`tenant-a@v17`) by loading it into every backend
//! and then switching the tenant's live [`PolicyVersion`](clawback_datapool::PolicyVersion) in the
//! datapool. Every sidecar replica keeps a [`PolicyTable`] of the live versions current
//! ([`sync`]: Redis pub/sub, or polling the embedded store) and reads it lock-free on the request
//! path ([`rewrite`]). Calls are counted per adapter while they are in flight, so the publisher
//! can unload the previous adapter once nothing runs on it any more (the control plane's
//! `GET /admin/policies`).
//!
//! **The rewrite rule**: a model call (chat completions, completions, responses) whose `model`
//! is `routing.base_model` or one of `routing.aliases` gets the tenant's live adapter as its
//! `model`, or `base_model` when the tenant has none. A call that names one of its own tenant's
//! adapters (`tenant-a@v12`) is forwarded as it came and recorded as served by that version.
//! Any other name — another tenant's adapter, a model the sidecar does not route — gets 404
//! ([`models`]): a tenant is served only its own adapters and the base. Routing is off while
//! `base_model` is unset; another tenant's adapter is refused then too.

pub mod models;
pub mod rewrite;
pub mod sync;
pub mod table;

use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::data_plane::metrics::Metrics;
use crate::data_plane::tenant::Tenants;
pub use rewrite::{Routed, Router};
pub use table::{Lease, PolicyTable};

/// The `[routing]` section of the sidecar's configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// The name the backends serve the base model under. Unset: routing is off and `model` is
    /// never rewritten.
    pub base_model: Option<String>,
    /// Other names agents use for the base model (`"default"`, a hosted model's name the agent
    /// was written against); such calls are routed like `base_model`.
    pub aliases: Vec<String>,
    /// Without pub/sub (the embedded store): how often the live versions are read again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub poll_interval: Duration,
    /// With Redis: how often every tenant's version is read again besides the notifications, in
    /// case one was missed (a connection that died silently).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub resync_interval: Duration,
}

impl Default for Routing {
    fn default() -> Self {
        Self {
            base_model: None,
            aliases: Vec::new(),
            poll_interval: Duration::from_millis(500),
            resync_interval: Duration::from_secs(30),
        }
    }
}

impl Routing {
    pub fn enabled(&self) -> bool {
        self.base_model.is_some()
    }

    /// What is wrong with the section, in the config's words.
    pub fn check(&self) -> Result<(), String> {
        if self.base_model.as_deref().is_some_and(str::is_empty) {
            return Err(
                "`routing.base_model` is empty: name the base model or remove the key".to_owned(),
            );
        }
        for (key, value) in [
            ("poll_interval", self.poll_interval),
            ("resync_interval", self.resync_interval),
        ] {
            if value.is_zero() {
                return Err(format!("`routing.{key}` must be longer than zero"));
            }
        }
        Ok(())
    }
}

/// The router of `routing`, its table loaded and kept current until `stop` (policy switches
/// heard on `redis`, the config's URL, when set); `None` when routing is off.
pub async fn start(
    routing: &Routing,
    tenants: &Tenants,
    redis: Option<&str>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Option<Router> {
    let base_model = routing.base_model.clone()?;
    let table = Arc::new(PolicyTable::new(metrics));
    let configured = tenants
        .keys
        .values()
        .chain(tenants.default.as_ref())
        .filter_map(|t| TenantId::new(t.as_str()).ok())
        .collect();
    // A cluster's seeds are a list; a publish reaches subscribers on every node, so any will do.
    let redis_url = redis
        .and_then(|urls| urls.split(',').map(str::trim).find(|u| !u.is_empty()))
        .map(str::to_owned);
    sync::Syncer {
        table: Arc::clone(&table),
        store,
        config: routing.clone(),
        redis_url,
        configured,
    }
    .start(stop)
    .await;
    Some(Router::new(table, base_model, &routing.aliases))
}
