//! [`RedisStore`]: the production store on Redis Streams, on one Redis or a Redis Cluster.
//! The key layout is in [`crate::keys`]; the multi-key transitions are Lua scripts in
//! `redis_scripts.rs`.
//!
//! ## Caps
//! A tenant's data is bounded three ways ([`Caps`]):
//! - each trajectory's step stream is written with `XADD ... MAXLEN ~ max_steps_per_trajectory`,
//!   so a runaway session cannot grow without bound (Redis trims its oldest steps);
//! - the tenant's total steps and bytes (each step's stored JSON, each trajectory's header with
//!   the agent's `metadata`, each next state and each evaluation) are counted in
//!   `clawback:{t}:usage`; when a batch takes either over its cap, whole trajectories are deleted,
//!   oldest first, until the tenant is back under 90% of both caps. Whole trajectories, because
//!   half a trajectory is no use to the trainer; 90%, so a tenant at its cap does not trim on
//!   every batch. A trajectory trimmed while queued as ready is gone when the trainer fetches it
//!   ([`crate::Store::trajectory`] answers `None`): size the caps so trainers keep up;
//! - the ready stream is written with `MAXLEN ~ max_ready_entries`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::streams::{
    StreamAutoClaimReply, StreamId, StreamInfoGroupsReply, StreamRangeReply, StreamReadReply,
};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tracing::{debug, warn};

use crate::codec::{decode, decode_gate_decision, encode, parse_stored};
use crate::encoded::EncodedStep;
use crate::error::{Error, Result};
use crate::ids::{GroupId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::keys;
use crate::redis_scripts::{
    COMPLETE, DEAD_LETTER, EXPIRE_GROUP, PUT_COUNTED, SETTLE_PENDING, SETTLE_ROLLBACK, SET_POLICY,
    TRIM_TRAJECTORY,
};
use crate::schema::{
    check_version, CompletionReason, Evaluation, GateDecision, Group, GroupMembership, GroupState,
    NextState, PolicyVersion, Rollback, Step, Trajectory, TrajectoryRecord, TrajectoryStatus,
    GATE_DECISIONS_KEPT,
};
use crate::store::{
    Complete, Completed, Consumer, ConsumerGroupLag, ConsumerName, DeadLetter, Delivery,
    DeliveryId, ReadyItem, Store, OVERDUE_PER_SWEEP,
};

/// How to reach Redis and how much a tenant may keep there.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` or `rediss://...` for TLS. For a cluster, one or
    /// more seed nodes.
    pub urls: Vec<String>,
    /// Connect as a Redis Cluster client (slot routing, MOVED/ASK handling).
    pub cluster: bool,
    pub caps: Caps,
    /// Bound on connecting; past it the store reports Redis unavailable.
    pub connect_timeout: Duration,
    /// Bound on one command or pipeline.
    pub response_timeout: Duration,
}

impl RedisConfig {
    /// One Redis at `url`, default caps and timeouts.
    pub fn single(url: impl Into<String>) -> Self {
        RedisConfig {
            urls: vec![url.into()],
            cluster: false,
            caps: Caps::default(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
        }
    }

    /// A Redis Cluster reached through `seeds`, default caps and timeouts.
    pub fn cluster(seeds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        RedisConfig {
            urls: seeds.into_iter().map(Into::into).collect(),
            cluster: true,
            ..RedisConfig::single("")
        }
    }
}

/// Per-tenant bounds; see the module docs for how each is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// `MAXLEN ~` of each trajectory's step stream.
    pub max_steps_per_trajectory: u64,
    /// Total steps a tenant keeps before its oldest trajectories are deleted.
    pub max_steps_per_tenant: u64,
    /// Total bytes a tenant keeps before its oldest trajectories are deleted: its steps,
    /// headers (the agent's `metadata` included), next states and evaluations as stored, token
    /// ids and logprobs packed (schema version 2): a completion's logprobs take
    /// about a quarter of their plain JSON's bytes, token ids about nine tenths, so a cap holds
    /// more steps than it did with version 1's arrays.
    pub max_bytes_per_tenant: u64,
    /// `MAXLEN ~` of a tenant's ready stream.
    pub max_ready_entries: u64,
}

impl Caps {
    /// Whether a tenant holding `steps` and `bytes` is over a cap.
    pub(crate) fn exceeded(&self, steps: u64, bytes: u64) -> bool {
        steps > self.max_steps_per_tenant || bytes > self.max_bytes_per_tenant
    }

    /// What a tenant over a cap is trimmed down to: 90% of both, so a tenant at its cap does
    /// not trim on every write.
    pub(crate) fn trim_target(&self) -> (u64, u64) {
        (
            self.max_steps_per_tenant / 10 * 9,
            self.max_bytes_per_tenant / 10 * 9,
        )
    }
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_steps_per_trajectory: 10_000,
            max_steps_per_tenant: 1_000_000,
            max_bytes_per_tenant: 4 << 30,
            max_ready_entries: 100_000,
        }
    }
}

/// A connection to one Redis or to a cluster; both are cheap to clone and multiplex commands.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The datapool on Redis Streams. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    caps: Caps,
    /// Tenants this process already added to `clawback:tenants`.
    known_tenants: Arc<Mutex<HashSet<TenantId>>>,
}

impl RedisStore {
    /// Connects per `config`. A single Redis is connected lazily (the store can be built while
    /// Redis is down, and reconnects by itself); a cluster needs a seed node up to learn its slots.
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        let conn = if config.cluster {
            let client = ClusterClientBuilder::new(config.urls.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.response_timeout)
                .retries(2)
                .build()
                .map_err(Error::InvalidRedisUrl)?;
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let url = config.urls.first().map(String::as_str).unwrap_or_default();
            let client = redis::Client::open(url).map_err(Error::InvalidRedisUrl)?;
            // Few, quick reconnect attempts: while Redis is down a write should fail fast and go
            // to the spool rather than wait out a long backoff.
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            Conn::Single(
                ConnectionManager::new_lazy_with_config(client, manager_config)
                    .map_err(Error::InvalidRedisUrl)?,
            )
        };
        Ok(RedisStore {
            conn,
            caps: config.caps,
            known_tenants: Arc::default(),
        })
    }

    /// Round-trips a PING: whether Redis is reachable now.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        Ok(())
    }

    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Appends one tenant's steps in one transaction, then enforces the tenant's caps.
    ///
    /// MULTI/EXEC makes the append all or nothing when Redis refuses writes (out of memory, a
    /// read-only replica): it refuses them as they are queued and discards the transaction, so a
    /// write retried later lands once. Once it landed, a failure to trim is logged, not returned:
    /// the append is done, and the next one trims again.
    async fn append_tenant_steps(&self, tenant: &TenantId, steps: &[&EncodedStep]) -> Result<()> {
        // Per-trajectory totals, so the counters are bumped once per batch, not once per step.
        let mut per_traj: Vec<(TrajectoryId, i64, i64)> = Vec::new();
        let (mut total_steps, mut total_bytes) = (0i64, 0i64);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for step in steps {
            let json = step.json();
            let len = json.len() as i64;
            pipe.cmd("XADD")
                .arg(keys::steps(tenant, &step.trajectory()))
                .arg("MAXLEN")
                .arg("~")
                .arg(self.caps.max_steps_per_trajectory)
                .arg("*")
                .arg("id")
                .arg(step.id().to_string())
                .arg("json")
                .arg(json)
                .ignore();
            match per_traj
                .iter_mut()
                .find(|(t, _, _)| *t == step.trajectory())
            {
                Some((_, n, b)) => (*n, *b) = (*n + 1, *b + len),
                None => per_traj.push((step.trajectory(), 1, len)),
            }
            (total_steps, total_bytes) = (total_steps + 1, total_bytes + len);
        }
        for (traj, n, b) in &per_traj {
            let key = keys::trajectory(tenant, traj);
            pipe.hincr(&key, "steps", *n).ignore();
            pipe.hincr(&key, "bytes", *b).ignore();
            pipe.zadd_nx_member(keys::trajectories(tenant), traj.to_string());
            // Whether a completion waits for these steps, and the trajectory's group.
            pipe.cmd("HMGET").arg(&key).arg("pending").arg("group");
        }
        pipe.hincr(keys::usage(tenant), "steps", total_steps);
        pipe.hincr(keys::usage(tenant), "bytes", total_bytes);
        // The transaction's replies: each trajectory's `pending` and `group`, then the totals.
        let mut waiting: Vec<redis::Value> = pipe.query_async(&mut self.conn()).await?;
        let totals = waiting.split_off(per_traj.len().min(waiting.len()));
        let (steps_now, bytes_now): (i64, i64) =
            redis::from_redis_value(redis::Value::Array(totals))
                .map_err(redis::RedisError::from)?;
        for ((traj, _, _), reply) in per_traj.iter().zip(waiting) {
            let (pending, group): (Option<String>, Option<String>) =
                redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
            if pending.is_some() {
                let group = group
                    .map(|g| parse_stored("trajectory group", &g))
                    .transpose()?;
                self.settle_pending(tenant, traj, group, false).await?;
            }
        }
        self.enforce_caps(tenant, (steps_now, bytes_now)).await;
        Ok(())
    }

    /// Trims `tenant` back under its caps if its `(steps, bytes)` are over them. The write that
    /// counted them is done: a failure here is logged, and the next write trims again.
    async fn enforce_caps(&self, tenant: &TenantId, (steps, bytes): (i64, i64)) {
        if let Err(e) = self.tenant_usage_over_cap(tenant, steps, bytes).await {
            warn!(%tenant, error = %e, "the tenant's caps could not be enforced now; the next write tries again");
        }
    }

    /// Writes `field` of the hash `key` (`trajectory`'s header or one of its next states) and
    /// counts the change in its bytes against the trajectory and `tenant`; the tenant's
    /// `(steps, bytes)` after.
    async fn put_counted(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        key: &str,
        field: &str,
        value: String,
    ) -> Result<(i64, i64)> {
        Ok(PUT_COUNTED
            .key(key)
            .key(keys::trajectory(tenant, trajectory))
            .key(keys::usage(tenant))
            .arg(field)
            .arg(value)
            .invoke_async(&mut self.conn())
            .await?)
    }

    /// Enqueues `traj`'s pending completion if what it waits for arrived (`overdue`: if its
    /// header did). Returns [`SETTLE_PENDING`]'s answer.
    async fn settle_pending(
        &self,
        tenant: &TenantId,
        traj: &TrajectoryId,
        group: Option<GroupId>,
        overdue: bool,
    ) -> Result<i64> {
        // Without a group the group keys are unused, but a script declares a fixed set of keys;
        // the trajectory's own tag keeps them on its slot.
        let gid = group.unwrap_or_else(|| GroupId::from_uuid(*traj.as_uuid()));
        Ok(SETTLE_PENDING
            .key(keys::trajectory(tenant, traj))
            .key(keys::ready(tenant))
            .key(keys::group(tenant, &gid))
            .key(keys::group_finished(tenant, &gid))
            .key(keys::open_groups(tenant))
            .key(keys::waiting_completions(tenant))
            .arg(traj.to_string())
            .arg(group.map(|g| g.to_string()).unwrap_or_default())
            .arg(self.caps.max_ready_entries)
            .arg(if overdue { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await?)
    }

    /// The members of the time-scored `index` scored before `before`, oldest first, at most
    /// `limit` of them.
    async fn due(&self, index: &str, before: UnixMs, limit: Option<usize>) -> Result<Vec<String>> {
        let mut query = redis::cmd("ZRANGEBYSCORE");
        query.arg(index).arg("-inf").arg(format!("({}", before.0));
        if let Some(limit) = limit {
            query.arg("LIMIT").arg(0).arg(limit);
        }
        Ok(query.query_async(&mut self.conn()).await?)
    }

    /// Adds `tenant` to the index of tenants, once per process and tenant.
    async fn register_tenant(&self, tenant: &TenantId) -> Result<()> {
        let known = self
            .known_tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(tenant);
        if !known {
            // Its own command: the index is not on the tenant's slot.
            let _: i64 = redis::cmd("SADD")
                .arg(keys::TENANTS)
                .arg(tenant.as_str())
                .query_async(&mut self.conn())
                .await?;
            self.known_tenants
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(tenant.clone());
        }
        Ok(())
    }

    async fn tenant_usage_over_cap(&self, tenant: &TenantId, steps: i64, bytes: i64) -> Result<()> {
        let (mut steps, mut bytes) = (steps.max(0) as u64, bytes.max(0) as u64);
        if !self.caps.exceeded(steps, bytes) {
            return Ok(());
        }
        let (target_steps, target_bytes) = self.caps.trim_target();
        let mut trimmed = 0usize;
        while steps > target_steps || bytes > target_bytes {
            let oldest: Vec<String> = redis::cmd("ZRANGE")
                .arg(keys::trajectories(tenant))
                .arg(0)
                .arg(15)
                .query_async(&mut self.conn())
                .await?;
            if oldest.is_empty() {
                break;
            }
            for id in oldest {
                let Ok(traj) = id.parse::<TrajectoryId>() else {
                    warn!(%tenant, id, "a non-UUID member in the trajectory index; removing it");
                    let _: i64 = redis::cmd("ZREM")
                        .arg(keys::trajectories(tenant))
                        .arg(&id)
                        .query_async(&mut self.conn())
                        .await?;
                    continue;
                };
                let (s, b): (i64, i64) = TRIM_TRAJECTORY
                    .key(keys::trajectory(tenant, &traj))
                    .key(keys::steps(tenant, &traj))
                    .key(keys::next_states(tenant, &traj))
                    .key(keys::evaluations(tenant, &traj))
                    .key(keys::usage(tenant))
                    .key(keys::trajectories(tenant))
                    .arg(&id)
                    .invoke_async(&mut self.conn())
                    .await?;
                (steps, bytes) = (s.max(0) as u64, b.max(0) as u64);
                trimmed += 1;
                if steps <= target_steps && bytes <= target_bytes {
                    break;
                }
            }
        }
        debug!(%tenant, trimmed, steps, bytes, "trimmed the tenant's oldest trajectories to its caps");
        Ok(())
    }

    /// The ids of pending entries idle for at least `idle`, with their last consumer and count.
    async fn idle_pending(
        &self,
        tenant: &TenantId,
        consumer: &Consumer,
        count: usize,
    ) -> Result<Vec<(String, String, u64, u64)>> {
        let reply = redis::cmd("XPENDING")
            .arg(keys::ready(tenant))
            .arg(consumer.group.as_str())
            .arg("IDLE")
            .arg(consumer.claim_idle.as_millis() as u64)
            .arg("-")
            .arg("+")
            .arg(count)
            .query_async(&mut self.conn())
            .await;
        match reply {
            Ok(v) => Ok(v),
            Err(e) if e.code() == Some("NOGROUP") => {
                self.create_consumer_group(tenant, &consumer.group).await?;
                Ok(Vec::new())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn create_consumer_group(&self, tenant: &TenantId, group: &ConsumerName) -> Result<()> {
        // From id 0: a trainer that joins late still gets everything that became ready before.
        let reply: redis::RedisResult<String> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(keys::ready(tenant))
            .arg(group.as_str())
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match reply {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A stream entry's `field` as a string.
fn field(entry: &StreamId, name: &str) -> Result<String> {
    entry
        .get::<String>(name)
        .ok_or_else(|| Error::UnexpectedReply {
            what: "stream entry",
            detail: format!("entry {} has no field {name:?}", entry.id),
        })
}

fn ready_item(entry: &StreamId) -> Result<ReadyItem> {
    ReadyItem::parse(&field(entry, "kind")?, &field(entry, "id")?)
}

/// A trajectory header from its hash: the stored JSON with the store-owned fields laid over it.
/// `None` for a missing hash, or one that only has counters (steps of a trajectory never upserted,
/// or appended after a trim).
fn trajectory_from_hash(
    tenant: &TenantId,
    fields: &HashMap<String, String>,
) -> Result<Option<Trajectory>> {
    let Some(json) = fields.get("json") else {
        return Ok(None);
    };
    let mut t: Trajectory = decode("trajectory", json)?;
    check_version("trajectory", t.schema_version)?;
    if &t.tenant != tenant {
        // Cannot happen through this API (keys are per tenant); refuse rather than leak.
        return Err(Error::TenantMismatch {
            what: "trajectory",
            expected: tenant.to_string(),
            found: t.tenant.to_string(),
        });
    }
    if let Some(status) = fields
        .get("status")
        .and_then(|s| TrajectoryStatus::parse(s))
    {
        t.status = status;
    }
    t.completed_at = fields
        .get("completed_at")
        .and_then(|s| s.parse().ok())
        .map(UnixMs);
    t.completion = match fields.get("completion") {
        Some(c) => Some(decode::<CompletionReason>("completion reason", c)?),
        None => None,
    };
    t.group = match (fields.get("group"), fields.get("group_size")) {
        (Some(g), Some(size)) => Some(GroupMembership {
            id: parse_stored("trajectory group", g)?,
            size: size.parse().unwrap_or(0),
        }),
        _ => None,
    };
    Ok(Some(t))
}

#[async_trait]
impl Store for RedisStore {
    async fn upsert_trajectory(&self, t: &Trajectory) -> Result<()> {
        let tenant = &t.tenant;
        let key = keys::trajectory(tenant, &t.id);
        // The header first, counted (the agent's metadata can be as large as a request): the
        // trajectory is in the index, where trimming finds it, only once it is counted.
        let usage = self
            .put_counted(tenant, &t.id, &key, "json", encode("trajectory", t)?)
            .await?;
        let mut pipe = redis::pipe();
        pipe.hset_nx(&key, "status", TrajectoryStatus::Open.as_str())
            .ignore();
        pipe.zadd_nx_member(keys::trajectories(tenant), t.id.to_string());
        if let Some(g) = &t.group {
            pipe.hset_nx(&key, "group", g.id.to_string()).ignore();
            pipe.hset_nx(&key, "group_size", g.size).ignore();
            let gkey = keys::group(tenant, &g.id);
            pipe.hset_nx(&gkey, "size", g.size).ignore();
            pipe.hset_nx(&gkey, "state", GroupState::Open.as_str())
                .ignore();
            pipe.hset_nx(&gkey, "created_at", t.created_at.0).ignore();
            pipe.zadd_nx_member(keys::group_members(tenant, &g.id), t.id.to_string());
            // Scored by the trajectory's creation: the group timeout counts from the first member.
            pipe.cmd("ZADD")
                .arg(keys::open_groups(tenant))
                .arg("NX")
                .arg(t.created_at.0)
                .arg(g.id.to_string())
                .ignore();
        }
        // Whether a completion arrived first (another replica's, or this one's ahead of the
        // writer): read after the header is written, so one that comes later finds the header
        // and settles itself. Most headers have none waiting; running the settling script to
        // find that out was one of the five scripts Redis ran per recorded call.
        pipe.hget(&key, "pending");
        let (pending,): (Option<String>,) = pipe.query_async(&mut self.conn()).await?;
        if pending.is_some() {
            self.settle_pending(tenant, &t.id, t.group.map(|g| g.id), false)
                .await?;
        }
        self.enforce_caps(tenant, usage).await;
        self.register_tenant(tenant).await
    }

    async fn append_encoded_steps(&self, steps: &[EncodedStep]) -> Result<()> {
        // One pipeline per tenant: a cluster pipeline must stay on one slot.
        for (tenant, steps) in by_tenant(steps, EncodedStep::tenant) {
            self.append_tenant_steps(tenant, &steps).await?;
        }
        Ok(())
    }

    async fn set_next_state(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        step: &StepId,
        next_state: &NextState,
    ) -> Result<()> {
        let usage = self
            .put_counted(
                tenant,
                trajectory,
                &keys::next_states(tenant, trajectory),
                &step.to_string(),
                encode("next state", next_state)?,
            )
            .await?;
        self.enforce_caps(tenant, usage).await;
        Ok(())
    }

    async fn append_evaluations(&self, evaluations: &[Evaluation]) -> Result<()> {
        for (tenant, evaluations) in by_tenant(evaluations, |e| &e.tenant) {
            let mut pipe = redis::pipe();
            // All or nothing, as the steps' append (a retried write lands once).
            pipe.atomic();
            for e in evaluations {
                let json = encode("evaluation", e)?;
                let len = json.len() as i64;
                pipe.cmd("XADD")
                    .arg(keys::evaluations(&e.tenant, &e.trajectory))
                    .arg("*")
                    .arg("json")
                    .arg(json)
                    .ignore();
                pipe.hincr(keys::trajectory(tenant, &e.trajectory), "bytes", len)
                    .ignore();
                pipe.hincr(keys::usage(tenant), "bytes", len).ignore();
            }
            pipe.cmd("HMGET")
                .arg(keys::usage(tenant))
                .arg("steps")
                .arg("bytes");
            let ((steps, bytes),): ((Option<i64>, Option<i64>),) =
                pipe.query_async(&mut self.conn()).await?;
            self.enforce_caps(tenant, (steps.unwrap_or(0), bytes.unwrap_or(0)))
                .await;
        }
        Ok(())
    }

    async fn complete_trajectory(&self, c: &Complete) -> Result<Completed> {
        let status = c.finished_status()?;
        let (tenant, traj) = (&c.tenant, &c.trajectory);
        let group: Option<String> = redis::cmd("HGET")
            .arg(keys::trajectory(tenant, traj))
            .arg("group")
            .query_async(&mut self.conn())
            .await?;
        let group_id: Option<GroupId> = match &group {
            Some(g) => Some(parse_stored("trajectory group", g)?),
            None => None,
        };
        // Without a group the group keys are unused, but a script declares a fixed set of keys;
        // the trajectory's own tag keeps them on its slot.
        let gid = group_id.unwrap_or_else(|| GroupId::from_uuid(*traj.as_uuid()));
        let outcome: i64 = COMPLETE
            .key(keys::trajectory(tenant, traj))
            .key(keys::ready(tenant))
            .key(keys::group(tenant, &gid))
            .key(keys::group_finished(tenant, &gid))
            .key(keys::open_groups(tenant))
            .key(keys::waiting_completions(tenant))
            .arg(traj.to_string())
            .arg(status.as_str())
            .arg(c.at.0)
            .arg(encode("completion reason", &c.reason)?)
            .arg(group.unwrap_or_default())
            .arg(self.caps.max_ready_entries)
            .arg(c.steps.unwrap_or(0))
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match outcome {
            0 => Completed {
                newly_finished: false,
                enqueued: None,
                deferred: false,
            },
            2 => Completed {
                newly_finished: true,
                enqueued: Some(ReadyItem::Trajectory(*traj)),
                deferred: false,
            },
            3 => Completed {
                newly_finished: true,
                enqueued: Some(ReadyItem::Group(gid)),
                deferred: false,
            },
            4 => Completed {
                newly_finished: true,
                enqueued: None,
                deferred: true,
            },
            _ => Completed {
                newly_finished: true,
                enqueued: None,
                deferred: false,
            },
        })
    }

    async fn expire_groups(
        &self,
        tenant: &TenantId,
        created_before: UnixMs,
    ) -> Result<Vec<GroupId>> {
        let due = self
            .due(&keys::open_groups(tenant), created_before, None)
            .await?;
        let now = UnixMs::now();
        let mut settled = Vec::new();
        for id in due {
            let Ok(group) = id.parse::<GroupId>() else {
                warn!(%tenant, id, "a non-UUID member in the open-groups index; skipping it");
                continue;
            };
            let done: i64 = EXPIRE_GROUP
                .key(keys::group(tenant, &group))
                .key(keys::open_groups(tenant))
                .key(keys::ready(tenant))
                .arg(&id)
                .arg(now.0)
                .arg(self.caps.max_ready_entries)
                .invoke_async(&mut self.conn())
                .await?;
            if done == 1 {
                settled.push(group);
            }
        }
        Ok(settled)
    }

    async fn release_overdue(
        &self,
        tenant: &TenantId,
        completed_before: UnixMs,
    ) -> Result<Vec<TrajectoryId>> {
        let due = self
            .due(
                &keys::waiting_completions(tenant),
                completed_before,
                Some(OVERDUE_PER_SWEEP),
            )
            .await?;
        let mut released = Vec::new();
        for id in due {
            let Ok(traj) = id.parse::<TrajectoryId>() else {
                warn!(%tenant, id, "a non-UUID member in the waiting-completions index; removing it");
                let _: i64 = redis::cmd("ZREM")
                    .arg(keys::waiting_completions(tenant))
                    .arg(&id)
                    .query_async(&mut self.conn())
                    .await?;
                continue;
            };
            let group: Option<String> = redis::cmd("HGET")
                .arg(keys::trajectory(tenant, &traj))
                .arg("group")
                .query_async(&mut self.conn())
                .await?;
            let group = group
                .map(|g| parse_stored("trajectory group", &g))
                .transpose()?;
            if self.settle_pending(tenant, &traj, group, true).await? != 0 {
                released.push(traj);
            }
        }
        Ok(released)
    }

    async fn read_ready(
        &self,
        tenant: &TenantId,
        consumer: &Consumer,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let ready = keys::ready(tenant);
        let group = consumer.group.as_str();
        let now = UnixMs::now();

        // 1. Entries idle too long: dead-letter the ones delivered too often, take over the rest.
        let idle = self.idle_pending(tenant, consumer, count).await?;
        let mut counts: HashMap<String, u32> = HashMap::new();
        let mut to_claim = 0usize;
        for (id, last_consumer, _idle_ms, deliveries) in idle {
            if deliveries >= u64::from(consumer.max_deliveries) {
                let _: i64 = DEAD_LETTER
                    .key(&ready)
                    .key(keys::dead_letters(tenant, group))
                    .arg(group)
                    .arg(&id)
                    .arg(&last_consumer)
                    .arg(deliveries)
                    .arg(now.0)
                    .invoke_async(&mut self.conn())
                    .await?;
                warn!(%tenant, consumer_group = group, id, deliveries, "dead-lettered a ready entry");
            } else {
                counts.insert(id, deliveries as u32);
                to_claim += 1;
            }
        }
        let mut out = Vec::new();
        if to_claim > 0 {
            let claimed: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&ready)
                .arg(group)
                .arg(consumer.name.as_str())
                .arg(consumer.claim_idle.as_millis() as u64)
                .arg("0-0")
                .arg("COUNT")
                .arg(to_claim)
                .query_async(&mut self.conn())
                .await?;
            for entry in &claimed.claimed {
                let deliveries = counts.get(&entry.id).copied().unwrap_or(1) + 1;
                out.push(Delivery {
                    id: DeliveryId(entry.id.clone()),
                    item: ready_item(entry)?,
                    deliveries,
                });
            }
        }

        // 2. New entries.
        let remaining = count.saturating_sub(out.len());
        if remaining > 0 {
            let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(group)
                .arg(consumer.name.as_str())
                .arg("COUNT")
                .arg(remaining)
                .arg("STREAMS")
                .arg(&ready)
                .arg(">")
                .query_async(&mut self.conn())
                .await?;
            for key in reply.map(|r| r.keys).unwrap_or_default() {
                for entry in &key.ids {
                    out.push(Delivery {
                        id: DeliveryId(entry.id.clone()),
                        item: ready_item(entry)?,
                        deliveries: 1,
                    });
                }
            }
        }
        Ok(out)
    }

    async fn ack(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        deliveries: &[DeliveryId],
    ) -> Result<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let _: i64 = redis::cmd("XACK")
            .arg(keys::ready(tenant))
            .arg(consumer_group.as_str())
            .arg(deliveries.iter().map(|d| d.0.as_str()).collect::<Vec<_>>())
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn dead_letters(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(keys::dead_letters(tenant, consumer_group.as_str()))
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut self.conn())
            .await?;
        reply
            .ids
            .iter()
            .map(|e| {
                Ok(DeadLetter {
                    id: DeliveryId(field(e, "ready_id")?),
                    item: ready_item(e)?,
                    deliveries: field(e, "deliveries")?.parse().unwrap_or(0),
                    last_consumer: field(e, "consumer")?,
                    dead_at: UnixMs(field(e, "dead_at")?.parse().unwrap_or(0)),
                })
            })
            .collect()
    }

    async fn consumer_lag(&self, tenant: &TenantId) -> Result<Vec<ConsumerGroupLag>> {
        let reply: redis::RedisResult<StreamInfoGroupsReply> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(keys::ready(tenant))
            .query_async(&mut self.conn())
            .await;
        let groups = match reply {
            Ok(reply) => reply.groups,
            // No ready queue yet: nothing has ever been ready, so no group reads it.
            Err(e) if e.detail() == Some("no such key") => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        groups
            .into_iter()
            .map(|g| {
                Ok(ConsumerGroupLag {
                    group: ConsumerName::new(g.name)?,
                    undelivered: g.lag.map(|n| n as u64),
                    pending: g.pending as u64,
                })
            })
            .collect()
    }

    async fn trajectory(
        &self,
        tenant: &TenantId,
        id: &TrajectoryId,
    ) -> Result<Option<TrajectoryRecord>> {
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(keys::trajectory(tenant, id));
        pipe.cmd("XRANGE")
            .arg(keys::steps(tenant, id))
            .arg("-")
            .arg("+");
        pipe.cmd("HGETALL").arg(keys::next_states(tenant, id));
        pipe.cmd("XRANGE")
            .arg(keys::evaluations(tenant, id))
            .arg("-")
            .arg("+");
        let (header, steps, next, evals): (
            HashMap<String, String>,
            StreamRangeReply,
            HashMap<String, String>,
            StreamRangeReply,
        ) = pipe.query_async(&mut self.conn()).await?;
        let Some(trajectory) = trajectory_from_hash(tenant, &header)? else {
            return Ok(None);
        };
        // Writes are replayed at least once (the spool, after a connection that died between
        // Redis applying a write and its reply): a step or an evaluation appended again is the
        // same one, and is read once, where it first landed.
        let mut seen_steps = std::collections::HashSet::new();
        let mut out_steps = Vec::with_capacity(steps.ids.len());
        for entry in &steps.ids {
            let mut step: Step = decode("step", &field(entry, "json")?)?;
            check_version("step", step.schema_version)?;
            if !seen_steps.insert(step.id) {
                continue;
            }
            if let Some(n) = next.get(&step.id.to_string()) {
                step.next_state = Some(decode("next state", n)?);
            }
            out_steps.push(step);
        }
        let mut seen_evaluations = std::collections::HashSet::new();
        let mut evaluations = Vec::with_capacity(evals.ids.len());
        for entry in &evals.ids {
            let e: Evaluation = decode("evaluation", &field(entry, "json")?)?;
            check_version("evaluation", e.schema_version)?;
            if seen_evaluations.insert(e.id) {
                evaluations.push(e);
            }
        }
        Ok(Some(TrajectoryRecord {
            trajectory,
            steps: out_steps,
            evaluations,
        }))
    }

    async fn group(&self, tenant: &TenantId, id: &GroupId) -> Result<Option<Group>> {
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(keys::group(tenant, id));
        pipe.cmd("ZRANGE")
            .arg(keys::group_members(tenant, id))
            .arg(0)
            .arg(-1);
        pipe.cmd("SMEMBERS").arg(keys::group_finished(tenant, id));
        let (fields, members, finished): (HashMap<String, String>, Vec<String>, Vec<String>) =
            pipe.query_async(&mut self.conn()).await?;
        let (Some(size), Some(state)) = (fields.get("size"), fields.get("state")) else {
            return Ok(None);
        };
        let parse_ids = |ids: Vec<String>| -> Result<Vec<TrajectoryId>> {
            ids.iter()
                .map(|s| parse_stored("group member", s))
                .collect()
        };
        let mut finished = parse_ids(finished)?;
        finished.sort();
        Ok(Some(Group {
            id: *id,
            tenant: tenant.clone(),
            size: size.parse().unwrap_or(0),
            members: parse_ids(members)?,
            finished,
            state: GroupState::parse(state).ok_or_else(|| Error::UnexpectedReply {
                what: "group state",
                detail: state.clone(),
            })?,
            created_at: UnixMs(
                fields
                    .get("created_at")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
            ),
            settled_at: fields
                .get("settled_at")
                .and_then(|s| s.parse().ok())
                .map(UnixMs),
        }))
    }

    async fn list_trajectories(
        &self,
        tenant: &TenantId,
        after: Option<&TrajectoryId>,
        limit: usize,
    ) -> Result<Vec<Trajectory>> {
        let mut out = Vec::new();
        let mut cursor = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
        while out.len() < limit {
            let page: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(keys::trajectories(tenant))
                .arg(&cursor)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(limit - out.len())
                .query_async(&mut self.conn())
                .await?;
            let Some(last) = page.last() else { break };
            cursor = format!("({last}");
            let mut pipe = redis::pipe();
            let mut ids = Vec::new();
            for id in &page {
                if let Ok(t) = id.parse::<TrajectoryId>() {
                    pipe.cmd("HGETALL").arg(keys::trajectory(tenant, &t));
                    ids.push(t);
                }
            }
            let headers: Vec<HashMap<String, String>> = pipe.query_async(&mut self.conn()).await?;
            for fields in &headers {
                // Counter-only hashes (steps without a header) are skipped, not listed.
                if let Some(t) = trajectory_from_hash(tenant, fields)? {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    async fn tenants(&self) -> Result<Vec<TenantId>> {
        let names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(keys::TENANTS)
            .query_async(&mut self.conn())
            .await?;
        let mut tenants: Vec<TenantId> = names
            .into_iter()
            .filter_map(|n| TenantId::new(n).ok())
            .collect();
        tenants.sort();
        Ok(tenants)
    }

    async fn policy_version(&self, tenant: &TenantId) -> Result<Option<PolicyVersion>> {
        let json: Option<String> = redis::cmd("HGET")
            .arg(keys::policy(tenant))
            .arg("json")
            .query_async(&mut self.conn())
            .await?;
        match json {
            Some(j) => {
                let p: PolicyVersion = decode("policy version", &j)?;
                check_version("policy version", p.schema_version)?;
                Ok(Some(p))
            }
            None => Ok(None),
        }
    }

    async fn set_policy_version(&self, policy: &PolicyVersion) -> Result<()> {
        let tenant = &policy.tenant;
        let outcome: i64 = SET_POLICY
            .key(keys::policy(tenant))
            .arg(policy.version)
            .arg(encode("policy version", policy)?)
            .arg(keys::policy_changed(tenant))
            .invoke_async(&mut self.conn())
            .await?;
        if outcome >= 0 {
            return Err(Error::StalePolicyVersion {
                tenant: tenant.to_string(),
                attempted: policy.version,
                live: outcome as u64,
            });
        }
        Ok(())
    }

    async fn order_rollback(&self, order: &Rollback) -> Result<()> {
        redis::cmd("SET")
            .arg(keys::rollback(&order.tenant))
            .arg(encode("rollback order", order)?)
            .query_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn rollback(&self, tenant: &TenantId) -> Result<Option<Rollback>> {
        let json: Option<String> = redis::cmd("GET")
            .arg(keys::rollback(tenant))
            .query_async(&mut self.conn())
            .await?;
        json.map(|j| {
            let order: Rollback = decode("rollback order", &j)?;
            check_version("rollback order", order.schema_version)?;
            Ok(order)
        })
        .transpose()
    }

    async fn settle_rollback(&self, order: &Rollback) -> Result<bool> {
        let written: i64 = SETTLE_ROLLBACK
            .key(keys::rollback(&order.tenant))
            .arg(&order.id)
            .arg(encode("rollback order", order)?)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(written == 1)
    }

    async fn record_gate_decision(&self, decision: &GateDecision) -> Result<()> {
        let key = keys::gate(&decision.tenant);
        redis::pipe()
            .atomic()
            .cmd("LPUSH")
            .arg(&key)
            .arg(encode("gate decision", decision)?)
            .ignore()
            .cmd("LTRIM")
            .arg(&key)
            .arg(0)
            .arg(GATE_DECISIONS_KEPT - 1)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn gate_decisions(&self, tenant: &TenantId, limit: usize) -> Result<Vec<GateDecision>> {
        let limit = limit.min(GATE_DECISIONS_KEPT);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let json: Vec<String> = redis::cmd("LRANGE")
            .arg(keys::gate(tenant))
            .arg(0)
            .arg(limit - 1)
            .query_async(&mut self.conn())
            .await?;
        json.iter().map(|j| decode_gate_decision(j)).collect()
    }
}

/// `items` grouped by tenant, tenants in first-seen order, items in their order.
fn by_tenant<T>(items: &[T], tenant_of: impl Fn(&T) -> &TenantId) -> Vec<(&TenantId, Vec<&T>)> {
    let mut groups: Vec<(&TenantId, Vec<&T>)> = Vec::new();
    for item in items {
        let tenant = tenant_of(item);
        match groups.iter_mut().find(|(t, _)| *t == tenant) {
            Some((_, v)) => v.push(item),
            None => groups.push((tenant, vec![item])),
        }
    }
    groups
}

/// Small pipeline helpers the redis crate has no typed form for.
trait PipelineExt {
    fn zadd_nx_member(&mut self, key: String, member: String) -> &mut Self;
}

impl PipelineExt for Pipeline {
    fn zadd_nx_member(&mut self, key: String, member: String) -> &mut Self {
        // Score 0 for all: members then order lexically, and UUIDv7 text order is time order.
        self.cmd("ZADD")
            .arg(key)
            .arg("NX")
            .arg(0)
            .arg(member)
            .ignore()
    }
}
