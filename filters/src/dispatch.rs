//! [`Filters`]: what the sidecar's recorder talks to. It follows each live trajectory just
//! enough to give plugins what they need — the last step until its next state arrives, and,
//! for plugins that evaluate trajectories, the last turns — and runs the plugins off the
//! request path: on their own runtime, concurrently, bounded, with a queue that drops (and
//! counts) instead of waiting — each tenant holding at most its share of the queue and of the
//! calls running at once ([`crate::fair`]). Each evaluation goes to the `deliver` callback.
//!
//! In a pool of sidecars a session's calls land on any replica, so the step a next state
//! follows, or some turns of a finished trajectory, may have been recorded by another one. Then
//! the host reads them from the datapool through the [`Load`] callback (waiting, bounded, for
//! the other replica's write to land) and evaluates them all the same.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clawback_datapool::{
    CompletionReason, Evaluation, EvaluationId, EvaluationSource, NextState as RecordedNext,
    Step as RecordedStep, StepId, TenantId, Trajectory as RecordedTrajectory, TrajectoryId,
    TrajectoryRecord, UnixMs, Verdict, SCHEMA_VERSION,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bindings::{self, MetadataEntry, Turn};
use crate::breaker::Change;
use crate::call::{self, Failure, Input};
use crate::config::{FiltersConfig, PluginConfig};
use crate::fair::{Fair, TenantShare};
use crate::host::CallHost;
use crate::judge::{Judge, JudgeError};
use crate::metrics::{CallLabels, ErrorLabels, Metrics, PluginLabels};
use crate::registry::{Loaded, Registry, RegistryError};
use crate::sandbox::{Sandbox, SandboxError};
use crate::view;

/// Where evaluations go (the recorder's write queue).
pub type Deliver = Arc<dyn Fn(Vec<Evaluation>) + Send + Sync>;

/// What waits for a trajectory's evaluations (the recorder's completion write).
pub type Then = Box<dyn FnOnce() + Send>;

/// Reads a trajectory from the datapool once it holds what [`Until`] asks for (another replica
/// recorded it; its write may still be on its way); `None` when it did not within the loader's
/// own bound.
pub type Load = Arc<
    dyn Fn(
            TenantId,
            TrajectoryId,
            Until,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<TrajectoryRecord>> + Send>>
        + Send
        + Sync,
>;

/// What a loaded trajectory must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// This step.
    Step(StepId),
    /// At least this many steps.
    Steps(u32),
}

impl Until {
    /// Whether `record` holds what is asked.
    pub fn met_by(self, record: &TrajectoryRecord) -> bool {
        match self {
            Until::Step(step) => record.steps.iter().any(|s| s.id == step),
            Until::Steps(n) => record.steps.len() >= n as usize,
        }
    }
}

/// A trajectory's evaluations not yet delivered, and what waits for them.
#[derive(Default)]
struct Settling {
    jobs: usize,
    then: Vec<Then>,
}

#[derive(Debug, thiserror::Error)]
pub enum FiltersError {
    #[error("`filters.dir` is not set")]
    NoDir,
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("`filters.judge`: {0}")]
    Judge(#[from] JudgeError),
    #[error("cannot start the filters' runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// What the host keeps of a live trajectory.
struct Live {
    tenant: TenantId,
    metadata: Vec<MetadataEntry>,
    /// The last step, until its next state arrives.
    awaiting: Option<(StepId, bindings::Step)>,
    /// The last turns, for plugins that evaluate trajectories.
    turns: VecDeque<Turn>,
    /// Steps this process recorded (a pool's other replicas record the rest).
    recorded: u32,
    touched: Instant,
}

impl Live {
    fn new(tenant: TenantId, metadata: Vec<MetadataEntry>) -> Self {
        Live {
            tenant,
            metadata,
            awaiting: None,
            turns: VecDeque::new(),
            recorded: 0,
            touched: Instant::now(),
        }
    }
}

/// What a job evaluates. One per step, behind an `Arc`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Job {
    Step {
        step: StepId,
        view: bindings::Step,
        next: bindings::NextState,
    },
    Trajectory {
        view: bindings::Trajectory,
    },
}

struct Inner {
    registry: Registry,
    sandbox: Arc<Sandbox>,
    config: FiltersConfig,
    plugin_configs: HashMap<String, Arc<PluginConfig>>,
    judge: Option<Arc<Judge>>,
    metrics: Metrics,
    permits: Semaphore,
    queued: AtomicUsize,
    /// Each tenant's share of the queue and the permits.
    fair: Fair,
    deliver: Deliver,
    live: Mutex<HashMap<TrajectoryId, Live>>,
    settling: Mutex<HashMap<TrajectoryId, Settling>>,
    /// Reads what another replica recorded ([`Filters::load_with`]).
    load: std::sync::OnceLock<Load>,
}

pub struct Filters {
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Filters {
    /// Loads the plugins of `config.dir` and starts the filters' runtime and hot reload.
    pub async fn start(
        config: FiltersConfig,
        share: TenantShare,
        metrics: Metrics,
        deliver: Deliver,
    ) -> Result<Self, FiltersError> {
        let dir = config.dir.clone().ok_or(FiltersError::NoDir)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads.max(1))
            .thread_name("clawback-filter")
            .enable_all()
            .build()
            .map_err(FiltersError::Runtime)?;
        let sandbox = Arc::new(Sandbox::new(
            config.max_concurrency,
            config.memory_limit,
            config.fuel,
        )?);
        // Compiling the plugins happens on the filters' own threads.
        let registry = runtime
            .spawn(Registry::open(
                dir,
                Arc::clone(&sandbox),
                config.breaker.clone(),
                metrics.clone(),
            ))
            .await
            .map_err(|e| FiltersError::Runtime(std::io::Error::other(e)))??;
        let judge = config
            .judge
            .clone()
            .map(|judge| Judge::new(judge, metrics.clone()).map(Arc::new))
            .transpose()?;
        let plugin_configs = config
            .plugins
            .iter()
            .map(|(name, plugin)| (name.clone(), Arc::new(plugin.clone())))
            .collect();
        let inner = Arc::new(Inner {
            registry,
            sandbox,
            permits: Semaphore::new(config.max_concurrency.max(1)),
            plugin_configs,
            judge,
            metrics,
            queued: AtomicUsize::new(0),
            fair: Fair::new(share),
            deliver,
            live: Mutex::new(HashMap::new()),
            settling: Mutex::new(HashMap::new()),
            load: std::sync::OnceLock::new(),
            config,
        });
        let stop = CancellationToken::new();
        if !inner.config.reload_interval.is_zero() {
            let inner = Arc::clone(&inner);
            let stop = stop.clone();
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(inner.config.reload_interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => inner.registry.rescan().await,
                        () = stop.cancelled() => return,
                    }
                }
            });
        }
        Ok(Self {
            inner,
            runtime: Some(runtime),
            tasks: TaskTracker::new(),
            stop,
        })
    }

    /// The plugins in service: name, content hash, description.
    pub fn plugins(&self) -> Vec<(String, String, String)> {
        self.inner
            .registry
            .snapshot()
            .iter()
            .map(|loaded| {
                (
                    loaded.plugin.name.to_string(),
                    loaded.plugin.content_hash.clone(),
                    loaded.plugin.info.description.clone(),
                )
            })
            .collect()
    }

    /// Checks the plugin directory for changes now (hot reload does it every `reload_interval`).
    pub async fn rescan(&self) {
        let inner = Arc::clone(&self.inner);
        if let Some(runtime) = &self.runtime {
            let _ = runtime
                .spawn(async move { inner.registry.rescan().await })
                .await;
        }
    }

    fn live(&self) -> MutexGuard<'_, HashMap<TrajectoryId, Live>> {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets the host read from the datapool what other replicas of a pool recorded (once).
    pub fn load_with(&self, load: Load) {
        let _ = self.inner.load.set(load);
    }

    /// A trajectory opened: its metadata is what plugins will see.
    pub fn opened(&self, trajectory: &RecordedTrajectory) {
        let mut live = self.live();
        self.make_room(&mut live, trajectory.id);
        live.insert(
            trajectory.id,
            Live::new(
                trajectory.tenant.clone(),
                view::metadata(&trajectory.metadata),
            ),
        );
    }

    /// Forgets the trajectory idle longest when `id` would be one past `max_live`: whatever
    /// agents open, the host's memory stays bounded, and a forgotten trajectory's steps are
    /// read back from the datapool when a plugin needs them.
    fn make_room(&self, live: &mut HashMap<TrajectoryId, Live>, id: TrajectoryId) {
        if live.len() < self.inner.config.max_live.max(1) || live.contains_key(&id) {
            return;
        }
        let idlest = live
            .iter()
            .min_by_key(|(_, entry)| entry.touched)
            .map(|(id, _)| *id);
        if let Some(idlest) = idlest {
            live.remove(&idlest);
            self.inner.metrics.forgotten.inc();
        }
    }

    /// A step was recorded: it waits for its next state.
    pub fn step_recorded(&self, step: &RecordedStep) {
        let keep_turns = self.wants_trajectories();
        let mut live = self.live();
        self.make_room(&mut live, step.trajectory);
        let entry = live
            .entry(step.trajectory)
            .or_insert_with(|| Live::new(step.tenant.clone(), Vec::new()));
        let view = view::step(step, entry.metadata.clone());
        if keep_turns {
            if entry.turns.len() == view::TURNS_CAP {
                entry.turns.pop_front();
            }
            entry.turns.push_back(Turn {
                step: view.clone(),
                next: None,
            });
        }
        entry.recorded += 1;
        entry.touched = Instant::now();
        entry.awaiting = Some((step.id, view));
    }

    /// The next call of the trajectory arrived: the step it follows is evaluated — read from
    /// the datapool when another replica recorded it.
    pub fn next_state(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        step: StepId,
        next: &RecordedNext,
    ) {
        let local = {
            let mut live = self.live();
            match live.get_mut(&trajectory) {
                Some(entry) if entry.awaiting.as_ref().is_some_and(|(id, _)| *id == step) => {
                    entry.touched = Instant::now();
                    entry.awaiting.take().map(|(_, view)| {
                        let next = view::next_state(next, &view);
                        if let Some(turn) = entry
                            .turns
                            .iter_mut()
                            .rev()
                            .find(|turn| turn.step.index == view.index)
                        {
                            turn.next = Some(next.clone());
                        }
                        (view, next)
                    })
                }
                _ => None,
            }
        };
        if let Some((view, next)) = local {
            self.submit(tenant.clone(), trajectory, Job::Step { step, view, next });
            return;
        }
        let next = next.clone();
        self.submit_loaded(tenant, trajectory, Until::Step(step), move |record| {
            let recorded = record.steps.iter().find(|s| s.id == step)?;
            let view = view::step(recorded, view::metadata(&record.trajectory.metadata));
            let next = view::next_state(&next, &view);
            Some(Job::Step { step, view, next })
        });
    }

    /// The trajectory finished, with `steps` steps: plugins that evaluate trajectories get it
    /// whole — read from the datapool when other replicas recorded some of its steps. `then`
    /// runs once every evaluation of the trajectory (its steps' and its own) has been
    /// delivered — the recorder writes the completion there, so a trainer that reads a ready
    /// trajectory finds its rewards with it.
    pub fn completed(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        reason: CompletionReason,
        steps: u32,
        then: Then,
    ) {
        self.evaluate_trajectory(tenant, trajectory, reason, steps);
        self.inner.after_jobs(trajectory, then);
    }

    fn evaluate_trajectory(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        reason: CompletionReason,
        steps: u32,
    ) {
        let entry = self.live().remove(&trajectory);
        if !self.wants_trajectories() {
            return;
        }
        let completion = reason.as_str().to_owned();
        if let Some(entry) = entry.filter(|e| e.recorded >= steps) {
            if entry.turns.is_empty() {
                return;
            }
            let view = bindings::Trajectory {
                turns: entry.turns.into_iter().collect(),
                metadata: entry.metadata,
                completion,
            };
            self.submit(entry.tenant, trajectory, Job::Trajectory { view });
            return;
        }
        if steps == 0 {
            return;
        }
        self.submit_loaded(tenant, trajectory, Until::Steps(steps), move |record| {
            let metadata = view::metadata(&record.trajectory.metadata);
            let skip = record.steps.len().saturating_sub(view::TURNS_CAP);
            let turns = record.steps[skip..]
                .iter()
                .map(|recorded| {
                    let step = view::step(recorded, metadata.clone());
                    let next = recorded
                        .next_state
                        .as_ref()
                        .map(|n| view::next_state(n, &step));
                    Turn { step, next }
                })
                .collect();
            Some(Job::Trajectory {
                view: bindings::Trajectory {
                    turns,
                    metadata,
                    completion,
                },
            })
        });
    }

    /// Reads the trajectory from the datapool (another replica recorded what is needed), then
    /// submits the job `make` builds from it. Counts as a job of the trajectory meanwhile, so
    /// its completion waits.
    fn submit_loaded(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        until: Until,
        make: impl FnOnce(&TrajectoryRecord) -> Option<Job> + Send + 'static,
    ) {
        let (Some(load), Some(runtime)) = (self.inner.load.get().cloned(), &self.runtime) else {
            return;
        };
        self.inner.settling().entry(trajectory).or_default().jobs += 1;
        let inner = Arc::clone(&self.inner);
        let submitter = Submitter {
            inner: Arc::clone(&self.inner),
            tasks: self.tasks.clone(),
            handle: runtime.handle().clone(),
        };
        let tenant = tenant.clone();
        self.tasks.spawn_on(
            async move {
                match load(tenant.clone(), trajectory, until).await {
                    Some(record) => match make(&record) {
                        Some(job) => submitter.submit(tenant, trajectory, job),
                        None => {
                            inner.metrics.dropped.inc();
                        }
                    },
                    None => {
                        tracing::warn!(%trajectory, ?until,
                            "a step recorded by another replica did not reach the datapool in time: not evaluated");
                        inner.metrics.dropped.inc();
                    }
                }
                inner.job_done(trajectory);
            },
            runtime.handle(),
        );
    }

    /// Forgets trajectories nothing happened to for `idle`: a pool's other replica finished
    /// them (or the sweep did, elsewhere).
    pub fn forget_idle(&self, idle: Duration) {
        self.live()
            .retain(|_, entry| entry.touched.elapsed() < idle);
    }

    /// Whether any plugin in service evaluates whole trajectories.
    pub fn wants_trajectories(&self) -> bool {
        self.inner
            .registry
            .snapshot()
            .iter()
            .any(|loaded| loaded.plugin.info.evaluates_trajectories)
    }

    fn submit(&self, tenant: TenantId, trajectory: TrajectoryId, job: Job) {
        let Some(runtime) = &self.runtime else { return };
        Submitter {
            inner: Arc::clone(&self.inner),
            tasks: self.tasks.clone(),
            handle: runtime.handle().clone(),
        }
        .submit(tenant, trajectory, job);
    }

    /// Waits (at most `grace`) for the evaluations in flight to be delivered, then stops.
    pub async fn close(&self, grace: Duration) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.tasks.len(),
                "filters still running at shutdown; their evaluations are lost"
            );
        }
        self.inner.release_all();
    }
}

/// What submitting a job takes, apart from the [`Filters`] (a task that loaded a trajectory
/// submits from the filters' runtime).
struct Submitter {
    inner: Arc<Inner>,
    tasks: TaskTracker,
    handle: tokio::runtime::Handle,
}

impl Submitter {
    fn submit(self, tenant: TenantId, trajectory: TrajectoryId, job: Job) {
        let inner = self.inner;
        let Some(running) = inner.fair.admit(&tenant) else {
            // The tenant has its share queued: its own job is dropped, no one else's.
            inner.metrics.dropped.inc();
            return;
        };
        if inner.queued.fetch_add(1, Ordering::AcqRel) >= inner.config.queue_capacity.max(1) {
            inner.queued.fetch_sub(1, Ordering::AcqRel);
            inner.fair.leave(&tenant);
            inner.metrics.dropped.inc();
            return;
        }
        let job = Arc::new(job);
        inner.settling().entry(trajectory).or_default().jobs += 1;
        self.tasks.spawn_on(
            async move {
                // The tenant's turn first, then (per plugin call) a permit of the whole.
                let evaluations = match running.acquire().await {
                    Ok(_turn) => inner.evaluate(&tenant, trajectory, job).await,
                    Err(_) => Vec::new(),
                };
                inner.fair.leave(&tenant);
                inner.queued.fetch_sub(1, Ordering::AcqRel);
                if !evaluations.is_empty() {
                    (inner.deliver)(evaluations);
                }
                inner.job_done(trajectory);
            },
            &self.handle,
        );
    }
}

impl Drop for Filters {
    fn drop(&mut self) {
        self.inner.release_all();
        self.stop.cancel();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Inner {
    fn settling(&self) -> MutexGuard<'_, HashMap<TrajectoryId, Settling>> {
        self.settling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `then` now if `trajectory` has no evaluation in flight, else after the last one.
    fn after_jobs(&self, trajectory: TrajectoryId, then: Then) {
        let mut settling = self.settling();
        match settling.get_mut(&trajectory) {
            Some(entry) if entry.jobs > 0 => entry.then.push(then),
            _ => {
                settling.remove(&trajectory);
                drop(settling);
                then();
            }
        }
    }

    fn job_done(&self, trajectory: TrajectoryId) {
        let ready = {
            let mut settling = self.settling();
            let Some(entry) = settling.get_mut(&trajectory) else {
                return;
            };
            entry.jobs = entry.jobs.saturating_sub(1);
            if entry.jobs > 0 {
                return;
            }
            settling
                .remove(&trajectory)
                .map(|e| e.then)
                .unwrap_or_default()
        };
        ready.into_iter().for_each(|then| then());
    }

    /// At shutdown: whatever waits runs now, evaluations or not — a completion is never lost.
    fn release_all(&self) {
        let waiting: Vec<Then> = self
            .settling()
            .drain()
            .flat_map(|(_, entry)| entry.then)
            .collect();
        waiting.into_iter().for_each(|then| then());
    }

    /// Every plugin that applies, concurrently; the evaluations that said something.
    async fn evaluate(
        self: &Arc<Self>,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        job: Arc<Job>,
    ) -> Vec<Evaluation> {
        let mut calls = JoinSet::new();
        for loaded in self.registry.snapshot() {
            let name = &*loaded.plugin.name.0;
            let config = self.plugin_configs.get(name).cloned().unwrap_or_default();
            if !config.applies_to(tenant.as_str()) {
                continue;
            }
            if matches!(*job, Job::Trajectory { .. }) && !loaded.plugin.info.evaluates_trajectories
            {
                continue;
            }
            if !loaded.breaker.allow() {
                continue;
            }
            let inner = Arc::clone(self);
            let job = Arc::clone(&job);
            let tenant = tenant.clone();
            calls
                .spawn(async move { inner.call(&loaded, config, &tenant, trajectory, &job).await });
        }
        let mut evaluations = Vec::new();
        while let Some(joined) = calls.join_next().await {
            if let Ok(Some(evaluation)) = joined {
                evaluations.push(evaluation);
            }
        }
        evaluations
    }

    /// One plugin on one job: its evaluation, a `filter_error`, or nothing (no opinion).
    async fn call(
        &self,
        loaded: &Arc<Loaded>,
        config: Arc<PluginConfig>,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        job: &Job,
    ) -> Option<Evaluation> {
        let Ok(_permit) = self.permits.acquire().await else {
            return None;
        };
        let plugin = &loaded.plugin;
        let input = match job {
            Job::Step { view, next, .. } => Input::Step(view, next),
            Job::Trajectory { view } => Input::Trajectory(view),
        };
        let labels = PluginLabels {
            plugin: plugin.name.clone(),
        };
        let mut tries = 0;
        let result = loop {
            let host = CallHost::new(
                plugin.name.clone(),
                tenant.as_str().to_owned(),
                Arc::clone(&config),
                self.judge.clone(),
            );
            let started = Instant::now();
            let called =
                call::run(&self.sandbox, plugin, host, input, self.config.call_timeout).await;
            self.metrics
                .duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .fuel
                .get_or_create(&labels)
                .observe(called.fuel_used as f64);
            match called.result {
                // The host's reasons, not the plugin's: its reward is not lost to them.
                Err(failure) if failure.is_the_hosts() && tries < self.config.host_retries => {
                    tries += 1;
                    tracing::info!(plugin = %plugin.name, reason = %failure.reason, "filter call failed for the host's reasons: trying again");
                    self.metrics.host_retries.get_or_create(&labels).inc();
                }
                result => break result,
            }
        };
        let change = loaded.breaker.record(result.is_ok());
        self.breaker_changed(loaded, change, result.as_ref().err());
        let (verdict, labels, outcome) = match result {
            Ok(evaluation) if evaluation.reward.is_none() && evaluation.hint.is_none() => {
                self.count(plugin, "no_opinion");
                return None;
            }
            Ok(evaluation) => (
                Verdict::Score {
                    reward: evaluation.reward,
                    hint: evaluation.hint,
                },
                evaluation.labels.into_iter().collect::<BTreeMap<_, _>>(),
                "score",
            ),
            Err(failure) => {
                tracing::warn!(plugin = %plugin.name, reason = %failure.reason, "filter call failed");
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels {
                        plugin: plugin.name.clone(),
                        reason: failure.kind,
                    })
                    .inc();
                (
                    Verdict::FilterError {
                        reason: failure.reason,
                    },
                    BTreeMap::new(),
                    "filter_error",
                )
            }
        };
        self.count(plugin, outcome);
        Some(Evaluation {
            schema_version: SCHEMA_VERSION,
            id: EvaluationId::new(),
            tenant: tenant.clone(),
            trajectory,
            step: match job {
                Job::Step { step, .. } => Some(*step),
                Job::Trajectory { .. } => None,
            },
            source: EvaluationSource::Plugin {
                name: plugin.name.to_string(),
                content_hash: plugin.content_hash.clone(),
            },
            verdict,
            labels,
            created_at: UnixMs::now(),
        })
    }

    fn count(&self, plugin: &crate::plugin::Plugin, outcome: &'static str) {
        self.metrics
            .calls
            .get_or_create(&CallLabels {
                plugin: plugin.name.clone(),
                outcome,
            })
            .inc();
    }

    fn breaker_changed(&self, loaded: &Loaded, change: Change, failure: Option<&Failure>) {
        let name = &loaded.plugin.name;
        let gauge = self.metrics.disabled.get_or_create(&PluginLabels {
            plugin: name.clone(),
        });
        match change {
            Change::Opened => {
                gauge.set(1);
                tracing::error!(
                    plugin = %name,
                    cooldown = ?loaded.breaker.cooldown(),
                    last_error = failure.map(|f| f.reason.as_str()).unwrap_or_default(),
                    "filter plugin disabled: it keeps failing (circuit breaker open)"
                );
            }
            Change::Closed => {
                gauge.set(0);
                tracing::info!(plugin = %name, "filter plugin enabled again: a trial call succeeded");
            }
            Change::None => {}
        }
    }
}
