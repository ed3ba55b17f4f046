//! The session state the recorder consults on every call: the datapool's shared [`Sessions`]
//! (Redis for a pool, the embedded SQLite file for replicas on one machine), and this replica's
//! own (a SQLite file in its data folder) for when the shared state cannot be reached.
//!
//! A call never fails because of session state. An operation on the shared state is retried
//! until `recording.session_timeout` (a Redis restarting is ridden out; the datapool answers a
//! repeated request as the first, so retrying is safe); past it, the call goes on with the
//! local state and, for a second, so do the calls after it — without waiting — before the shared
//! state is tried again. A trajectory keeps the state it started in: a call that joined the
//! local state is recorded there. While the shared state is away, replicas cannot see each
//! other's sessions, so a session whose calls are spread over replicas may split; a sidecar that
//! serves one agent pod (all its calls) keeps every session whole.
//!
//! An operation that timed out may still have landed: a JOIN that marked its call in flight on
//! a shared trajectory, a STEP_DONE or an abandon that never took the mark away. Such a mark
//! would hold its trajectory open — no completion, no idle sweep — until `stale_call`. The
//! call is remembered as a ghost, and the sweep has the shared state forget it once it answers
//! again ([`Sessions::forget_call`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{
    CompletionReason, Finish, Finishing, Join, Joined, KeyedSession, LocalSessions, Sessions,
    StepDone, StepId, StepSlot, TenantId, Timing, TrajectoryId, UnixMs,
};

use crate::data_plane::metrics::{Metrics, SessionOpLabels};

/// Where a trajectory's session state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Shared,
    /// This process's own: the shared state was unreachable when it started.
    Local,
}

/// How long the local state is used without trying the shared one, after it failed.
const BACKOFF: Duration = Duration::from_secs(1);
/// Between retries of a shared operation.
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// Most ghost calls remembered; past it the oldest are left to `stale_call`.
const GHOSTS_CAP: usize = 65_536;

pub struct SessionState {
    shared: Arc<dyn Sessions>,
    local: LocalSessions,
    timing: Timing,
    /// How long one operation may try the shared state; `None`: as long as it takes (a
    /// SQLite file, which has no network to wait out).
    timeout: Option<Duration>,
    /// Milliseconds since `epoch` until which the shared state is not tried (0: try it).
    skip_until: AtomicU64,
    epoch: Instant,
    metrics: Arc<Metrics>,
    /// Calls whose shared operation timed out and may have left them marked in flight there.
    ghosts: std::sync::Mutex<std::collections::VecDeque<(TenantId, StepId)>>,
}

#[derive(Debug, thiserror::Error)]
#[error("the shared session state is unreachable: {0}")]
pub struct Unreachable(String);

impl SessionState {
    /// `local` is where this process keeps sessions while the shared state is unreachable: a
    /// file in its data folder, so a restarted process finds (and finishes) them.
    pub fn new(
        shared: Arc<dyn Sessions>,
        local: LocalSessions,
        timing: Timing,
        timeout: Option<Duration>,
        metrics: Arc<Metrics>,
    ) -> Self {
        SessionState {
            shared,
            local,
            timing,
            timeout,
            skip_until: AtomicU64::new(0),
            epoch: Instant::now(),
            metrics,
            ghosts: std::sync::Mutex::default(),
        }
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn skipping(&self) -> bool {
        self.now_ms() < self.skip_until.load(Ordering::Relaxed)
    }

    /// Runs `op` on the shared state, retried until the timeout; `None` when it could not.
    async fn on_shared<T, F, Fut>(&self, name: &'static str, op: F) -> Option<T>
    where
        F: Fn(Arc<dyn Sessions>) -> Fut,
        Fut: std::future::Future<Output = clawback_datapool::Result<T>>,
    {
        if self.skipping() {
            self.fell_back(name);
            return None;
        }
        let started = Instant::now();
        let deadline = self.timeout.map(|t| started + t);
        loop {
            let attempt = op(Arc::clone(&self.shared));
            let outcome = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => break,
                },
                None => attempt.await,
            };
            match outcome {
                Ok(value) => {
                    self.metrics
                        .session_state
                        .get_or_create(&SessionOpLabels { op: name })
                        .observe(started.elapsed().as_secs_f64());
                    return Some(value);
                }
                Err(e) if deadline.is_some_and(|d| Instant::now() + RETRY_EVERY < d) => {
                    tracing::debug!(op = name, error = %e, "shared session state failed; retrying");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Err(e) => {
                    tracing::warn!(op = name, error = %e, "the shared session state failed");
                    break;
                }
            }
        }
        let until = self.now_ms() + BACKOFF.as_millis() as u64;
        self.skip_until.store(until, Ordering::Relaxed);
        tracing::warn!(
            op = name,
            timeout = ?self.timeout,
            "the shared session state is unreachable: this replica continues sessions on its own \
             (sessions spread over replicas may split) and tries again in {BACKOFF:?}"
        );
        self.fell_back(name);
        None
    }

    fn fell_back(&self, op: &'static str) {
        self.metrics
            .session_fallbacks
            .get_or_create(&SessionOpLabels { op })
            .inc();
    }

    /// Remembers `call` as one the shared state may still mark in flight.
    fn ghost(&self, tenant: &TenantId, call: StepId) {
        let mut ghosts = self.ghosts.lock().unwrap_or_else(|p| p.into_inner());
        if ghosts.len() == GHOSTS_CAP {
            ghosts.pop_front();
        }
        ghosts.push_back((tenant.clone(), call));
    }

    /// Has the shared state forget the ghost calls, while it answers; what that finished (a
    /// completion that waited for a ghost), for the caller to write.
    pub async fn forget_ghosts(&self) -> Vec<(TenantId, Finishing)> {
        let mut finished = Vec::new();
        let (timing, now) = (self.timing, UnixMs::now());
        loop {
            if self.skipping() {
                return finished;
            }
            let next = self
                .ghosts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            let Some((tenant, call)) = next else {
                return finished;
            };
            let forgotten = self
                .on_shared("forget_call", |s| {
                    let tenant = tenant.clone();
                    async move { s.forget_call(&tenant, &call, now, timing).await }
                })
                .await;
            match forgotten {
                Some(Some(finishing)) => finished.push((tenant, finishing)),
                Some(None) => {}
                None => {
                    // Away again: kept for the next sweep.
                    self.ghosts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_front((tenant, call));
                    return finished;
                }
            }
        }
    }

    /// The trajectory a call joins, and where its state lives.
    pub async fn join(&self, join: &Join) -> (Joined, Held) {
        let timing = self.timing;
        let tried = !self.skipping();
        let shared = self
            .on_shared("join", |s| {
                let join = join.clone();
                async move { s.join(&join, timing).await }
            })
            .await;
        if let Some(joined) = shared {
            return (joined, Held::Shared);
        }
        if let (true, Some(call)) = (tried, join.call) {
            self.ghost(&join.tenant, call);
        }
        match self.local.join(join, timing).await {
            Ok(joined) => (joined, Held::Local),
            Err(e) => {
                // In-memory SQLite failing is out-of-memory territory: record the call on its
                // own rather than fail it.
                tracing::error!(error = %e, "the local session state failed");
                (Joined::alone(join.open), Held::Local)
            }
        }
    }

    /// Numbers a finished call's step; `None` when its state could not be reached.
    pub async fn step_done(&self, held: Held, done: &StepDone) -> Option<StepSlot> {
        let timing = self.timing;
        match held {
            Held::Shared => {
                let slot = self
                    .on_shared("step_done", |s| {
                        let done = done.clone();
                        async move { s.step_done(&done, timing).await }
                    })
                    .await;
                if slot.is_none() {
                    self.ghost(&done.tenant, done.step);
                }
                slot
            }
            Held::Local => self.local.step_done(done, timing).await.ok(),
        }
    }

    /// A call without a step leaves its trajectory; what it finished, if anything.
    pub async fn call_abandoned(
        &self,
        held: Held,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        call: &StepId,
    ) -> Option<Finishing> {
        let (timing, now) = (self.timing, UnixMs::now());
        match held {
            Held::Shared => {
                let abandoned = self
                    .on_shared("call_abandoned", |s| {
                        let (tenant, trajectory, call) = (tenant.clone(), *trajectory, *call);
                        async move {
                            s.call_abandoned(&tenant, &trajectory, &call, now, timing)
                                .await
                        }
                    })
                    .await;
                if abandoned.is_none() {
                    self.ghost(tenant, *call);
                }
                abandoned.flatten()
            }
            Held::Local => self
                .local
                .call_abandoned(tenant, trajectory, call, now, timing)
                .await
                .ok()
                .flatten(),
        }
    }

    /// Finishes a trajectory wherever it is live (the shared state first).
    pub async fn finish(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        reason: CompletionReason,
    ) -> Result<Finish, Unreachable> {
        let (timing, now) = (self.timing, UnixMs::now());
        let shared = self
            .on_shared("finish", |s| {
                let (tenant, trajectory) = (tenant.clone(), *trajectory);
                async move { s.finish(&tenant, &trajectory, reason, now, timing).await }
            })
            .await;
        let local = self
            .local
            .finish(tenant, trajectory, reason, now, timing)
            .await
            .map_err(|e| Unreachable(e.to_string()))?;
        match (shared, local) {
            (Some(Finish::NotLive), local) => Ok(local),
            (Some(shared), _) => Ok(shared),
            (None, Finish::NotLive) => Err(Unreachable(
                "the trajectory is not live here, and the shared state did not answer".into(),
            )),
            (None, local) => Ok(local),
        }
    }

    /// Idle trajectories of `tenant` finished by this sweep, from both states. A trajectory
    /// counts as idle only after the idle time plus the session timeout: a call may have been
    /// waiting that long for the shared state (Redis restarting) to join it.
    pub async fn finish_idle(&self, tenant: &TenantId, limit: usize) -> Vec<Finishing> {
        let now = UnixMs::now();
        let timing = Timing {
            idle: self.timing.idle + self.timeout.unwrap_or_default(),
            ..self.timing
        };
        let mut finished = self
            .on_shared("finish_idle", |s| {
                let tenant = tenant.clone();
                async move { s.finish_idle(&tenant, now, timing, limit).await }
            })
            .await
            .unwrap_or_default();
        match self.local.finish_idle(tenant, now, timing, limit).await {
            Ok(local) => finished.extend(local),
            Err(e) => tracing::error!(error = %e, "the local session state failed"),
        }
        finished
    }

    /// Completions of `tenant` overdue in either state (their replica died before it wrote
    /// them), handed to this sweep to write.
    pub async fn overdue_completions(&self, tenant: &TenantId, limit: usize) -> Vec<Finishing> {
        let (now, timing) = (UnixMs::now(), self.timing);
        let mut overdue = self
            .on_shared("overdue_completions", |s| {
                let tenant = tenant.clone();
                async move { s.overdue_completions(&tenant, now, timing, limit).await }
            })
            .await
            .unwrap_or_default();
        match self
            .local
            .overdue_completions(tenant, now, timing, limit)
            .await
        {
            Ok(local) => overdue.extend(local),
            Err(e) => tracing::error!(error = %e, "the local session state failed"),
        }
        overdue
    }

    /// Reports completions journaled, in whichever state finished them. One left unreported
    /// (the shared state was away) is written again once overdue, which changes nothing.
    pub async fn completions_written(&self, tenant: &TenantId, trajectories: &[TrajectoryId]) {
        if let Err(e) = self.local.completions_written(tenant, trajectories).await {
            tracing::error!(error = %e, "the local session state failed");
        }
        self.on_shared("completions_written", |s| {
            let (tenant, trajectories) = (tenant.clone(), trajectories.to_vec());
            async move { s.completions_written(&tenant, &trajectories).await }
        })
        .await;
    }

    /// Whether `trajectory` is live in either state.
    pub async fn is_live(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool, Unreachable> {
        if self
            .local
            .is_live(tenant, trajectory)
            .await
            .unwrap_or(false)
        {
            return Ok(true);
        }
        self.on_shared("is_live", |s| {
            let (tenant, trajectory) = (tenant.clone(), *trajectory);
            async move { s.is_live(&tenant, &trajectory).await }
        })
        .await
        .ok_or_else(|| Unreachable("is_live".into()))
    }

    /// Marks a live trajectory evaluation-only, wherever it lives.
    pub async fn set_evaluation_only(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> bool {
        if self
            .local
            .set_evaluation_only(tenant, trajectory)
            .await
            .unwrap_or(false)
        {
            return true;
        }
        self.on_shared("set_evaluation_only", |s| {
            let (tenant, trajectory) = (tenant.clone(), *trajectory);
            async move { s.set_evaluation_only(&tenant, &trajectory).await }
        })
        .await
        .unwrap_or(false)
    }

    /// Finishes every trajectory of the local state (at shutdown: nobody else can continue
    /// them).
    pub async fn finish_local(&self) -> Vec<(TenantId, Finishing)> {
        // Far enough ahead that every trajectory is idle and every call stale.
        let later = UnixMs::now().0 + (self.timing.retention() * 4).as_millis() as u64;
        let mut finished = Vec::new();
        for tenant in self.local.live_tenants().await.unwrap_or_default() {
            let all = self
                .local
                .finish_idle(&tenant, UnixMs(later), self.timing, i64::MAX as usize)
                .await
                .unwrap_or_default();
            finished.extend(all.into_iter().map(|f| (tenant.clone(), f)));
        }
        finished
    }

    /// Keeps a minted session key where every replica finds it (this replica's own state
    /// while the shared one is away).
    pub async fn put_session_key(&self, digest: &[u8; 32], session: &KeyedSession) {
        let shared = self
            .on_shared("put_session_key", |s| {
                let session = session.clone();
                let digest = *digest;
                async move { s.put_session_key(&digest, &session).await }
            })
            .await;
        if shared.is_none() {
            if let Err(e) = self.local.put_session_key(digest, session).await {
                tracing::error!(error = %e, "a session key could not be kept: calls with it will be refused");
            }
        }
    }

    /// What a session key stands for, wherever it was kept.
    pub async fn session_key(&self, digest: &[u8; 32]) -> Option<KeyedSession> {
        let digest = *digest;
        if let Some(Some(found)) = self
            .on_shared(
                "session_key",
                |s| async move { s.session_key(&digest).await },
            )
            .await
        {
            return Some(found);
        }
        self.local.session_key(&digest).await.ok().flatten()
    }

    /// Tenants whose trajectories the idle sweep looks at.
    pub async fn live_tenants(&self) -> Vec<TenantId> {
        let mut tenants = self
            .on_shared("live_tenants", |s| async move { s.live_tenants().await })
            .await
            .unwrap_or_default();
        tenants.extend(self.local.live_tenants().await.unwrap_or_default());
        tenants.sort();
        tenants.dedup();
        tenants
    }
}
