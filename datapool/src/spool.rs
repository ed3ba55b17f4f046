//! [`SpooledStore`]: Redis, with a local SQLite spool for the recorder's writes while Redis is
//! unreachable.
//!
//! A write goes to Redis; when Redis is unreachable it is journaled in the spool instead, and
//! every later write queues behind it in the spool, so the order the recorder wrote in is the
//! order Redis sees. A background task replays the spool into Redis, oldest first, as soon as
//! Redis answers again; then writes go straight to Redis once more. The spool is a file: a
//! sidecar restarted with a backlog replays it too. When the spool fails as well the write is
//! lost and the caller gets [`Error::SpoolFailed`] to count: the recorder never blocks on it.
//!
//! Delivery into Redis is at-least-once: a write whose reply was lost when Redis died may have
//! landed and is replayed again; steps carry UUIDv7 ids for consumers to dedupe.
//! Reads and the trainer's calls (ready queue, acks, policy) are not spooled: they go to Redis
//! and fail while it is away; so do [`Store::expire_groups`] and [`Store::release_overdue`],
//! sweeps that simply run again, and so do the [`Sessions`] operations: session state is shared
//! or it is nothing, and the recorder decides what a call does while it cannot be reached.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::encoded::EncodedStep;
use crate::error::{Error, Result};
use crate::ids::{GroupId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::local_store::LocalStore;
use crate::redis_store::RedisStore;
use crate::schema::CompletionReason;
use crate::schema::{
    Evaluation, GateDecision, Group, NextState, PolicyVersion, Rollback, Trajectory,
    TrajectoryRecord,
};
use crate::sessions::{
    Finish, Finishing, Join, Joined, KeyedSession, Sessions, StepDone, StepSlot, Timing,
};
use crate::store::{
    Complete, Completed, Consumer, ConsumerGroupLag, ConsumerName, DeadLetter, Delivery,
    DeliveryId, Store,
};
use crate::write_op::WriteOp;

/// How the spool replays.
#[derive(Clone, Copy, Debug)]
pub struct SpoolConfig {
    /// How often the replayer checks whether Redis is back.
    pub replay_interval: Duration,
    /// Operations replayed per round (each round holds new writes back briefly).
    pub replay_batch: usize,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            replay_interval: Duration::from_millis(250),
            replay_batch: 64,
        }
    }
}

/// Counters for the spool's metrics.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Operations written to the spool.
    pub spooled: AtomicU64,
    /// Operations replayed into Redis.
    pub replayed: AtomicU64,
    /// Spooled operations Redis refused on replay for a reason other than being away (logged).
    pub rejected: AtomicU64,
}

struct Shared {
    redis: RedisStore,
    spool: LocalStore,
    /// Held by each write and each replay round: what Redis sees is the order writes came in.
    order: Mutex<()>,
    /// Whether the spool holds operations not yet in Redis (writes must queue behind them).
    backlog: AtomicBool,
    stats: SpoolStats,
    config: SpoolConfig,
}

/// Redis with a local spool; see the module docs.
pub struct SpooledStore {
    shared: Arc<Shared>,
    replayer: JoinHandle<()>,
}

impl Drop for SpooledStore {
    fn drop(&mut self) {
        // The spool is durable: whatever is left is replayed by the next SpooledStore on the file.
        self.replayer.abort();
    }
}

impl SpooledStore {
    /// Wraps `redis` with `spool`, and starts replaying what `spool` already holds. Needs a
    /// tokio runtime.
    pub async fn new(redis: RedisStore, spool: LocalStore, config: SpoolConfig) -> Result<Self> {
        let backlog = spool.spool_len().await? > 0;
        let shared = Arc::new(Shared {
            redis,
            spool,
            order: Mutex::new(()),
            backlog: AtomicBool::new(backlog),
            stats: SpoolStats::default(),
            config,
        });
        let replayer = tokio::spawn(replay_forever(Arc::clone(&shared)));
        Ok(SpooledStore { shared, replayer })
    }

    /// The spool's counters.
    pub fn stats(&self) -> &SpoolStats {
        &self.shared.stats
    }

    /// How many operations wait in the spool.
    pub async fn backlog(&self) -> Result<u64> {
        self.shared.spool.spool_len().await
    }

    /// Writes `op` to Redis, or to the spool while Redis is away or a backlog is being replayed.
    pub async fn write(&self, op: WriteOp) -> Result<Option<Completed>> {
        let s = &self.shared;
        let _order = s.order.lock().await;
        if !s.backlog.load(Ordering::Acquire) {
            match op.apply(&s.redis).await {
                Err(e) if e.is_unavailable() => {
                    warn!(error = %e, "Redis is unreachable: spooling writes locally");
                    self.spool(op, e).await?;
                    return Ok(None);
                }
                other => return other,
            }
        }
        self.spool(op, Error::QueuedBehindSpool).await?;
        Ok(None)
    }

    async fn spool(&self, op: WriteOp, primary: Error) -> Result<()> {
        let s = &self.shared;
        let json = serde_json::to_string(&op).map_err(|e| Error::codec("spooled write", e))?;
        match s.spool.spool_push(vec![json]).await {
            Ok(()) => {
                s.backlog.store(true, Ordering::Release);
                s.stats.spooled.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(spool) => Err(Error::SpoolFailed {
                primary: Box::new(primary),
                spool: Box::new(spool),
            }),
        }
    }

    /// Replays one round now (the background task does this every `replay_interval`). Returns
    /// how many operations reached Redis.
    pub async fn replay_now(&self) -> Result<u64> {
        replay_round(&self.shared).await
    }
}

async fn replay_forever(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.config.replay_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !shared.backlog.load(Ordering::Acquire) {
            continue;
        }
        // Drain round after round while Redis takes them; back to waiting when it does not.
        loop {
            match replay_round(&shared).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, "spool replay failed; retrying");
                    break;
                }
            }
        }
    }
}

/// Replays up to `replay_batch` spooled operations, oldest first, stopping at the first one
/// Redis cannot take because it is away.
async fn replay_round(s: &Shared) -> Result<u64> {
    let _order = s.order.lock().await;
    let batch = s.spool.spool_peek(s.config.replay_batch).await?;
    if batch.is_empty() {
        s.backlog.store(false, Ordering::Release);
        return Ok(0);
    }
    let mut done_through = None;
    let mut replayed = 0u64;
    let mut redis_away = false;
    for (seq, json) in &batch {
        let op: WriteOp = match serde_json::from_str(json) {
            Ok(op) => op,
            Err(e) => {
                warn!(seq, error = %e, "dropping an unreadable spooled write");
                s.stats.rejected.fetch_add(1, Ordering::Relaxed);
                done_through = Some(*seq);
                continue;
            }
        };
        match op.apply(&s.redis).await {
            Ok(_) => {
                replayed += 1;
                s.stats.replayed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_unavailable() => {
                redis_away = true;
                break;
            }
            Err(e) => {
                // Retrying will not help (e.g. a completion of a trajectory trimmed meanwhile).
                warn!(seq, error = %e, "Redis refused a spooled write; dropping it");
                s.stats.rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
        done_through = Some(*seq);
    }
    if let Some(seq) = done_through {
        s.spool.spool_remove_through(seq).await?;
    }
    if !redis_away && batch.len() < s.config.replay_batch {
        s.backlog.store(false, Ordering::Release);
        info!("spool replayed into Redis; writing to Redis directly again");
    }
    Ok(replayed)
}

#[async_trait]
impl Store for SpooledStore {
    async fn upsert_trajectory(&self, trajectory: &Trajectory) -> Result<()> {
        self.write(WriteOp::UpsertTrajectory {
            trajectory: trajectory.clone(),
        })
        .await
        .map(drop)
    }

    async fn append_encoded_steps(&self, steps: &[EncodedStep]) -> Result<()> {
        self.write(WriteOp::AppendSteps {
            steps: steps.to_vec(),
        })
        .await
        .map(drop)
    }

    async fn set_next_state(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        step: &StepId,
        next_state: &NextState,
    ) -> Result<()> {
        self.write(WriteOp::SetNextState {
            tenant: tenant.clone(),
            trajectory: *trajectory,
            step: *step,
            next_state: next_state.clone(),
        })
        .await
        .map(drop)
    }

    async fn append_evaluations(&self, evaluations: &[Evaluation]) -> Result<()> {
        self.write(WriteOp::AppendEvaluations {
            evaluations: evaluations.to_vec(),
        })
        .await
        .map(drop)
    }

    async fn complete_trajectory(&self, request: &Complete) -> Result<Completed> {
        request.finished_status()?;
        let done = self
            .write(WriteOp::CompleteTrajectory {
                request: request.clone(),
            })
            .await?;
        Ok(done.unwrap_or(Completed {
            newly_finished: true,
            enqueued: None,
            deferred: true,
        }))
    }

    async fn expire_groups(
        &self,
        tenant: &TenantId,
        created_before: UnixMs,
    ) -> Result<Vec<GroupId>> {
        self.shared
            .redis
            .expire_groups(tenant, created_before)
            .await
    }

    async fn release_overdue(
        &self,
        tenant: &TenantId,
        completed_before: UnixMs,
    ) -> Result<Vec<TrajectoryId>> {
        self.shared
            .redis
            .release_overdue(tenant, completed_before)
            .await
    }

    async fn read_ready(
        &self,
        tenant: &TenantId,
        consumer: &Consumer,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        self.shared.redis.read_ready(tenant, consumer, count).await
    }

    async fn ack(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        deliveries: &[DeliveryId],
    ) -> Result<()> {
        self.shared
            .redis
            .ack(tenant, consumer_group, deliveries)
            .await
    }

    async fn dead_letters(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        self.shared
            .redis
            .dead_letters(tenant, consumer_group, limit)
            .await
    }

    async fn consumer_lag(&self, tenant: &TenantId) -> Result<Vec<ConsumerGroupLag>> {
        self.shared.redis.consumer_lag(tenant).await
    }

    async fn trajectory(
        &self,
        tenant: &TenantId,
        id: &TrajectoryId,
    ) -> Result<Option<TrajectoryRecord>> {
        self.shared.redis.trajectory(tenant, id).await
    }

    async fn group(&self, tenant: &TenantId, id: &GroupId) -> Result<Option<Group>> {
        self.shared.redis.group(tenant, id).await
    }

    async fn list_trajectories(
        &self,
        tenant: &TenantId,
        after: Option<&TrajectoryId>,
        limit: usize,
    ) -> Result<Vec<Trajectory>> {
        self.shared
            .redis
            .list_trajectories(tenant, after, limit)
            .await
    }

    async fn tenants(&self) -> Result<Vec<TenantId>> {
        self.shared.redis.tenants().await
    }

    async fn policy_version(&self, tenant: &TenantId) -> Result<Option<PolicyVersion>> {
        self.shared.redis.policy_version(tenant).await
    }

    async fn set_policy_version(&self, policy: &PolicyVersion) -> Result<()> {
        self.shared.redis.set_policy_version(policy).await
    }

    async fn order_rollback(&self, order: &Rollback) -> Result<()> {
        self.shared.redis.order_rollback(order).await
    }

    async fn rollback(&self, tenant: &TenantId) -> Result<Option<Rollback>> {
        self.shared.redis.rollback(tenant).await
    }

    async fn settle_rollback(&self, order: &Rollback) -> Result<bool> {
        self.shared.redis.settle_rollback(order).await
    }

    async fn record_gate_decision(&self, decision: &GateDecision) -> Result<()> {
        self.shared.redis.record_gate_decision(decision).await
    }

    async fn gate_decisions(&self, tenant: &TenantId, limit: usize) -> Result<Vec<GateDecision>> {
        self.shared.redis.gate_decisions(tenant, limit).await
    }
}

#[async_trait]
impl Sessions for SpooledStore {
    async fn join(&self, join: &Join, timing: Timing) -> Result<Joined> {
        self.shared.redis.join(join, timing).await
    }

    async fn step_done(&self, done: &StepDone, timing: Timing) -> Result<StepSlot> {
        self.shared.redis.step_done(done, timing).await
    }

    async fn forget_call(
        &self,
        tenant: &TenantId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        self.shared
            .redis
            .forget_call(tenant, call, now, timing)
            .await
    }

    async fn call_abandoned(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        self.shared
            .redis
            .call_abandoned(tenant, trajectory, call, now, timing)
            .await
    }

    async fn finish(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        reason: CompletionReason,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Finish> {
        self.shared
            .redis
            .finish(tenant, trajectory, reason, now, timing)
            .await
    }

    async fn finish_idle(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        self.shared
            .redis
            .finish_idle(tenant, now, timing, limit)
            .await
    }

    async fn overdue_completions(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        self.shared
            .redis
            .overdue_completions(tenant, now, timing, limit)
            .await
    }

    async fn completions_written(
        &self,
        tenant: &TenantId,
        trajectories: &[TrajectoryId],
    ) -> Result<()> {
        self.shared
            .redis
            .completions_written(tenant, trajectories)
            .await
    }

    async fn is_live(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> Result<bool> {
        self.shared.redis.is_live(tenant, trajectory).await
    }

    async fn set_evaluation_only(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool> {
        self.shared
            .redis
            .set_evaluation_only(tenant, trajectory)
            .await
    }

    async fn live_tenants(&self) -> Result<Vec<TenantId>> {
        self.shared.redis.live_tenants().await
    }

    async fn put_session_key(&self, digest: &[u8; 32], session: &KeyedSession) -> Result<()> {
        self.shared.redis.put_session_key(digest, session).await
    }

    async fn session_key(&self, digest: &[u8; 32]) -> Result<Option<KeyedSession>> {
        self.shared.redis.session_key(digest).await
    }
}
