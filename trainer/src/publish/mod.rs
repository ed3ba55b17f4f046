//! Publishing a tenant's new policy version to the running backends, without a restart and
//! without a failed call:
//!
//! 1. **save** — the caller writes the version (a PEFT adapter directory, or full safetensors
//!    weights) into a scratch directory that is renamed to `<adapter_root>/<tenant>@v<N>` once
//!    whole, so no backend ever reads half an adapter;
//! 2. **load** — into every backend at once; all must succeed. A failed call is retried with
//!    backoff; a backend that still fails aborts the publish: the new adapter is unloaded where
//!    it did load, and the previous version stays live;
//! 3. **switch** — [`Store::set_policy_version`] makes the version live in the datapool, which
//!    notifies every sidecar; the publisher waits (bounded) until each configured sidecar
//!    reports it;
//! 4. **drain** — once no sidecar has a call in flight on the previous adapter (bounded by
//!    `drain_timeout`), it is unloaded from every backend. Versioned names (`acme@v17`, never
//!    reloading one name) side-step vLLM's stale-cache bugs.
//!
//! Full-weight mode reloads the model in place (`update_weights_from_disk`) instead of loading
//! an adapter; a backend that fails is rolled back to the previous version's weights where
//! others already took the new ones. There is nothing to drain: the name stays the same.
//!
//! Each step's duration is returned ([`PublishTimings`]) for the trainer's metrics.
//!
//! A **canary** ([`Publisher::start_canary`]) is saved and loaded the same way, but the switch
//! puts it on trial beside the live version (`PolicyVersion::canary`: the sidecars send it a
//! share of the tenant's calls); [`Publisher::promote`] then makes it the live version (switch,
//! drain and unload of the one it replaces), or [`Publisher::drop_canary`] ends the trial
//! (switch back, drain and unload of the canary, whose folder stays on disk).
//!
//! A **rollback** ([`Publisher::restore`]) is a publish too: an earlier version's folder (every
//! version made live keeps its folder under `adapter_root`) is copied to a new version, which
//! goes through the same load, switch and drain. Versions only grow, so a sidecar never has to
//! tell a rollback from a stale write.

pub mod backend;
pub mod config;
pub mod sidecars;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{Canary, PolicyVersion, Store, TenantId, UnixMs, SCHEMA_VERSION};
use futures_util::future::join_all;

pub use backend::{BackendClient, BackendError};
pub use config::{Backend, BackendKind, CanaryConfig, Mode, PublishConfig, Retry, Sidecar};
use sidecars::Sidecars;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("invalid publish configuration: {0}")]
    Config(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("version {attempted} of tenant {tenant} is not newer than the live version {live}")]
    NotNewer {
        tenant: TenantId,
        attempted: u64,
        live: u64,
    },
    #[error("cannot write version {dir}: {source}")]
    Save {
        dir: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(
        "{what} failed on {} of {total} backends ({}); the previous version stays live{}",
        failures.len(),
        failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; "),
        rolled_back_note(rollback_failures)
    )]
    Load {
        what: String,
        total: usize,
        failures: Vec<LoadFailure>,
        /// Backends where undoing the partial load failed too.
        rollback_failures: Vec<String>,
    },
    #[error(
        "switching the live version failed: {source}; the previous version stays live{}",
        rolled_back_note(rollback_failures)
    )]
    Switch {
        #[source]
        source: clawback_datapool::Error,
        rollback_failures: Vec<String>,
    },
    #[error("the datapool: {0}")]
    Store(#[from] clawback_datapool::Error),
    #[error("tenant {tenant} has {what}")]
    NoTrial {
        tenant: TenantId,
        what: &'static str,
    },
    #[error("version {version} of tenant {tenant} is not on disk (no whole version in {dir})")]
    NoVersion {
        tenant: TenantId,
        version: u64,
        dir: PathBuf,
    },
}

fn rolled_back_note(failures: &[String]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(" (undoing the load failed on: {})", failures.join("; "))
    }
}

/// One backend that would not take the new version.
#[derive(Debug, thiserror::Error)]
#[error("{backend} after {attempts} tries: {error}")]
pub struct LoadFailure {
    pub backend: String,
    pub attempts: u32,
    #[source]
    pub error: BackendError,
}

/// How long each step of one publish took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishTimings {
    /// Writing the version to disk.
    pub save: Duration,
    /// Loading it into every backend, retries included.
    pub load: Duration,
    /// The datapool write until every sidecar routed to it.
    pub switch: Duration,
    /// Waiting for the previous adapter's calls, and unloading it.
    pub drain: Duration,
}

/// What a publish did.
#[derive(Debug, Clone)]
pub struct Published {
    /// The policy now live.
    pub policy: PolicyVersion,
    /// The one it replaced.
    pub previous: Option<PolicyVersion>,
    pub timings: PublishTimings,
    /// Load calls it took, over all backends (more than the backend count: retries happened).
    pub load_attempts: u32,
    /// Sidecars that had not reported the switch within `switch_timeout` (they follow the
    /// datapool later).
    pub not_switched: Vec<String>,
    /// Sidecars that still had calls on the previous adapter (or did not answer) at
    /// `drain_timeout`; the adapter was unloaded anyway.
    pub not_drained: Vec<String>,
    /// Backends that did not unload the previous adapter: it stays loaded there.
    pub unload_failures: Vec<String>,
}

pub struct Publisher {
    config: PublishConfig,
    store: Arc<dyn Store>,
    backends: Vec<BackendClient>,
    sidecars: Sidecars,
}

impl Publisher {
    pub fn new(config: PublishConfig, store: Arc<dyn Store>) -> Result<Self, PublishError> {
        config.check().map_err(PublishError::Config)?;
        let http = backend::http_client(config.request_timeout).map_err(PublishError::Client)?;
        let backends = config
            .backends
            .iter()
            .map(|b| BackendClient::new(b, http.clone()))
            .collect();
        let sidecars = Sidecars::new(http, config.sidecars.clone(), config.poll_interval);
        Ok(Self {
            config,
            store,
            backends,
            sidecars,
        })
    }

    pub fn config(&self) -> &PublishConfig {
        &self.config
    }

    /// The name a version is loaded and routed under: `<tenant>@v<N>`.
    pub fn adapter_name(tenant: &TenantId, version: u64) -> String {
        format!("{tenant}@v{version}")
    }

    /// Where a version is written.
    pub fn version_dir(&self, tenant: &TenantId, version: u64) -> PathBuf {
        self.config
            .adapter_root
            .join(Self::adapter_name(tenant, version))
    }

    /// Publishes `version` of `tenant`'s policy; `write` fills the directory it is given (e.g.
    /// `|dir| adapter.save(dir, Some(base))`). Returns once the version is live and the previous
    /// one is unloaded; on an error the previous version is still live.
    pub async fn publish<W, E>(
        &self,
        tenant: &TenantId,
        version: u64,
        write: W,
    ) -> Result<Published, PublishError>
    where
        W: FnOnce(&Path) -> Result<(), E>,
        E: Into<BoxError>,
    {
        let previous = self.store.policy_version(tenant).await?;
        let (name, mut timings, load_attempts) = self
            .prepare(tenant, version, previous.as_ref(), write)
            .await?;
        let policy = PolicyVersion {
            schema_version: SCHEMA_VERSION,
            tenant: tenant.clone(),
            adapter: self.served_name(&name).to_owned(),
            version,
            live_since: UnixMs::now(),
            canary: None,
        };
        self.make_live(policy, previous, Some(&name), load_attempts, &mut timings)
            .await
    }

    /// Puts `version` on trial beside the live version: saved and loaded as any version, then
    /// `percent` of the tenant's calls go to it once every sidecar reports the trial. The
    /// tenant must have a live version (the first version has nothing to be compared with).
    pub async fn start_canary<W, E>(
        &self,
        tenant: &TenantId,
        version: u64,
        percent: u8,
        write: W,
    ) -> Result<Published, PublishError>
    where
        W: FnOnce(&Path) -> Result<(), E>,
        E: Into<BoxError>,
    {
        let live =
            self.store
                .policy_version(tenant)
                .await?
                .ok_or_else(|| PublishError::NoTrial {
                    tenant: tenant.clone(),
                    what: "no live version to try a canary beside",
                })?;
        let (name, mut timings, load_attempts) =
            self.prepare(tenant, version, Some(&live), write).await?;
        let started = Instant::now();
        let policy = live.with_canary(Some(Canary {
            adapter: name.clone(),
            version,
            percent,
            since: UnixMs::now(),
        }));
        self.switch(&policy, Some(&name), Some(&live)).await?;
        let not_switched = self
            .sidecars
            .wait_canary(tenant, Some(version), self.config.switch_timeout)
            .await;
        timings.switch = started.elapsed();
        Ok(Published {
            policy,
            previous: Some(live),
            timings,
            load_attempts,
            not_switched,
            not_drained: Vec::new(),
            unload_failures: Vec::new(),
        })
    }

    /// Makes the tenant's canary its live version: switch, drain and unload of the version it
    /// replaces, as a publish.
    pub async fn promote(&self, tenant: &TenantId) -> Result<Published, PublishError> {
        let (live, canary) = self.trial(tenant).await?;
        let policy = PolicyVersion {
            schema_version: SCHEMA_VERSION,
            tenant: tenant.clone(),
            adapter: canary.adapter.clone(),
            version: canary.version,
            live_since: UnixMs::now(),
            canary: None,
        };
        let mut timings = PublishTimings::default();
        // A failed switch leaves the canary on trial: it stays loaded.
        self.make_live(policy, Some(live), None, 0, &mut timings)
            .await
    }

    /// Ends the tenant's trial: every call goes to the live version again, and once the
    /// canary's calls drained it is unloaded (its folder stays on disk).
    pub async fn drop_canary(&self, tenant: &TenantId) -> Result<Published, PublishError> {
        let (live, canary) = self.trial(tenant).await?;
        let started = Instant::now();
        let policy = live.with_canary(None);
        self.switch(&policy, None, None).await?;
        let not_switched = self
            .sidecars
            .wait_canary(tenant, None, self.config.switch_timeout)
            .await;
        let switch = started.elapsed();
        let started = Instant::now();
        let not_drained = self
            .sidecars
            .wait_drained(&canary.adapter, self.config.drain_timeout)
            .await;
        let unload_failures = self.unload_everywhere(&canary.adapter).await;
        Ok(Published {
            policy,
            previous: Some(live),
            timings: PublishTimings {
                switch,
                drain: started.elapsed(),
                ..PublishTimings::default()
            },
            load_attempts: 0,
            not_switched,
            not_drained,
            unload_failures,
        })
    }

    /// The tenant's live version and the canary on trial beside it.
    async fn trial(&self, tenant: &TenantId) -> Result<(PolicyVersion, Canary), PublishError> {
        let live = self.store.policy_version(tenant).await?;
        match live.and_then(|live| Some((live.with_canary(None), live.canary?))) {
            Some(trial) => Ok(trial),
            None => Err(PublishError::NoTrial {
                tenant: tenant.clone(),
                what: "no canary on trial",
            }),
        }
    }

    /// Checks that `version` is newer than the live one, saves it and loads it into every
    /// backend: the steps before a switch. Returns its name, the timings so far and the load
    /// calls made.
    async fn prepare<W, E>(
        &self,
        tenant: &TenantId,
        version: u64,
        previous: Option<&PolicyVersion>,
        write: W,
    ) -> Result<(String, PublishTimings, u32), PublishError>
    where
        W: FnOnce(&Path) -> Result<(), E>,
        E: Into<BoxError>,
    {
        if let Some(live) = previous.filter(|p| p.version >= version) {
            return Err(PublishError::NotNewer {
                tenant: tenant.clone(),
                attempted: version,
                live: live.version,
            });
        }
        let name = Self::adapter_name(tenant, version);
        let dir = self.version_dir(tenant, version);

        let started = Instant::now();
        save(&dir, write)?;
        let save = started.elapsed();

        let started = Instant::now();
        let load_attempts = self.load(tenant, &name, &dir, version, previous).await?;
        let timings = PublishTimings {
            save,
            load: started.elapsed(),
            ..PublishTimings::default()
        };
        Ok((name, timings, load_attempts))
    }

    /// Switches the tenant to `policy` (its adapter loaded), waits for the sidecars, drains and
    /// unloads the version it replaces. A failed switch unloads `loaded` (the adapter loaded for
    /// this switch) again.
    async fn make_live(
        &self,
        policy: PolicyVersion,
        previous: Option<PolicyVersion>,
        loaded: Option<&str>,
        load_attempts: u32,
        timings: &mut PublishTimings,
    ) -> Result<Published, PublishError> {
        let tenant = &policy.tenant;
        let started = Instant::now();
        self.switch(&policy, loaded, previous.as_ref()).await?;
        let not_switched = self
            .sidecars
            .wait_live(tenant, policy.version, self.config.switch_timeout)
            .await;
        timings.switch = started.elapsed();

        let started = Instant::now();
        let (not_drained, unload_failures) = match (&self.config.mode, &previous) {
            (Mode::Lora, Some(old)) => {
                let not_drained = self
                    .sidecars
                    .wait_drained(&old.adapter, self.config.drain_timeout)
                    .await;
                (not_drained, self.unload_everywhere(&old.adapter).await)
            }
            _ => (Vec::new(), Vec::new()),
        };
        timings.drain = started.elapsed();

        Ok(Published {
            policy,
            previous,
            timings: *timings,
            load_attempts,
            not_switched,
            not_drained,
            unload_failures,
        })
    }

    /// Makes version `to`'s weights live again as `version`: `to`'s folder is copied to
    /// `version`'s and published as any version is (load, switch, drain). `to`'s folder must be
    /// whole.
    pub async fn restore(
        &self,
        tenant: &TenantId,
        to: u64,
        version: u64,
    ) -> Result<Published, PublishError> {
        let source = self.version_dir(tenant, to);
        let whole = match self.config.mode {
            Mode::Lora => source.join("adapter_config.json").is_file(),
            Mode::FullWeights { .. } => source.is_dir(),
        };
        if !whole {
            return Err(PublishError::NoVersion {
                tenant: tenant.clone(),
                version: to,
                dir: source,
            });
        }
        self.publish(tenant, version, |dir| copy_tree(&source, dir))
            .await
    }

    /// The model name the policy routes to: the adapter's, or the served model's in
    /// full-weight mode.
    fn served_name<'a>(&'a self, adapter: &'a str) -> &'a str {
        match &self.config.mode {
            Mode::Lora => adapter,
            Mode::FullWeights { served_model } => served_model,
        }
    }

    /// Loads into every backend concurrently; on any failure rolls back where it loaded.
    /// Returns the number of calls made.
    async fn load(
        &self,
        tenant: &TenantId,
        name: &str,
        dir: &Path,
        version: u64,
        previous: Option<&PolicyVersion>,
    ) -> Result<u32, PublishError> {
        let outcomes = join_all(self.backends.iter().map(|backend| async move {
            let outcome = self
                .with_retry(|| async {
                    match &self.config.mode {
                        Mode::Lora => backend.load_adapter(name, dir).await,
                        Mode::FullWeights { .. } => backend.update_weights(dir, version).await,
                    }
                })
                .await;
            (backend, outcome)
        }))
        .await;
        let attempts = outcomes.iter().map(|(_, (_, n))| n).sum();
        let mut loaded = Vec::new();
        let mut failures = Vec::new();
        for (backend, (outcome, n)) in outcomes {
            match outcome {
                Ok(()) => loaded.push(backend.clone()),
                Err(error) => failures.push(LoadFailure {
                    backend: backend.url().to_owned(),
                    attempts: n,
                    error,
                }),
            }
        }
        if failures.is_empty() {
            return Ok(attempts);
        }
        let rollback_failures = self.roll_back(tenant, name, previous, &loaded).await;
        Err(PublishError::Load {
            what: match self.config.mode {
                Mode::Lora => format!("loading adapter {name}"),
                Mode::FullWeights { .. } => format!("reloading weights v{version}"),
            },
            total: self.backends.len(),
            failures,
            rollback_failures,
        })
    }

    /// Writes `policy` to the datapool: the switch every sidecar follows. When that fails,
    /// `loaded` (the adapter loaded for this switch) is undone on every backend, back to
    /// `previous`.
    async fn switch(
        &self,
        policy: &PolicyVersion,
        loaded: Option<&str>,
        previous: Option<&PolicyVersion>,
    ) -> Result<(), PublishError> {
        let Err(source) = self.store.set_policy_version(policy).await else {
            return Ok(());
        };
        let rollback_failures = match loaded {
            Some(name) => {
                self.roll_back(&policy.tenant, name, previous, &self.backends)
                    .await
            }
            None => Vec::new(),
        };
        Err(PublishError::Switch {
            source,
            rollback_failures,
        })
    }

    /// Undoes a load on `backends`: unloads the new adapter, or reloads the previous weights.
    /// Returns the backends where that failed.
    async fn roll_back(
        &self,
        tenant: &TenantId,
        name: &str,
        previous: Option<&PolicyVersion>,
        backends: &[BackendClient],
    ) -> Vec<String> {
        let outcomes = join_all(backends.iter().map(|backend| async move {
            let outcome = match (&self.config.mode, previous) {
                (Mode::Lora, _) => self.with_retry(|| backend.unload_adapter(name)).await.0,
                (Mode::FullWeights { .. }, Some(old)) => {
                    let dir = self.version_dir(tenant, old.version);
                    self.with_retry(|| backend.update_weights(&dir, old.version))
                        .await
                        .0
                }
                // No earlier version on disk to go back to: the backend keeps the new weights,
                // though the policy (and so the recorded version) stays the old one.
                (Mode::FullWeights { .. }, None) => Ok(()),
            };
            outcome.map_err(|e| format!("{}: {e}", backend.url()))
        }))
        .await;
        outcomes.into_iter().filter_map(Result::err).collect()
    }

    /// Unloads `name` from every backend; returns the backends that would not.
    async fn unload_everywhere(&self, name: &str) -> Vec<String> {
        let outcomes = join_all(self.backends.iter().map(|backend| async move {
            let (outcome, _) = self.with_retry(|| backend.unload_adapter(name)).await;
            outcome.map_err(|e| format!("{}: {e}", backend.url()))
        }))
        .await;
        outcomes.into_iter().filter_map(Result::err).collect()
    }

    /// Runs `call` until it succeeds or `retry.attempts` tries were made, waiting with a
    /// doubling backoff between tries. Returns the last outcome and the tries made.
    async fn with_retry<F, Fut>(&self, mut call: F) -> (Result<(), BackendError>, u32)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), BackendError>>,
    {
        let retry = &self.config.retry;
        let mut backoff = retry.backoff;
        let mut tries = 0;
        loop {
            tries += 1;
            let outcome = call().await;
            if outcome.is_ok() || tries >= retry.attempts {
                return (outcome, tries);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(retry.max_backoff);
        }
    }
}

/// Copies the files under `from` into `to` (which exists), folders included.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Has `write` fill a scratch directory next to `dir`, then renames it to `dir`.
fn save<W, E>(dir: &Path, write: W) -> Result<(), PublishError>
where
    W: FnOnce(&Path) -> Result<(), E>,
    E: Into<BoxError>,
{
    let failed = |source: BoxError| PublishError::Save {
        dir: dir.to_owned(),
        source,
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch = dir.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(|e| failed(e.into()))?;
    }
    std::fs::create_dir_all(&scratch).map_err(|e| failed(e.into()))?;
    if let Err(e) = write(&scratch) {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(failed(e.into()));
    }
    // A version that was saved before but never went live (its load failed) is replaced.
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| failed(e.into()))?;
    }
    std::fs::rename(&scratch, dir).map_err(|e| failed(e.into()))
}
