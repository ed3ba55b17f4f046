//! The [`Store`] trait: what the recorder writes and what the trainer reads, the same for Redis
//! ([`crate::RedisStore`]), SQLite ([`crate::LocalStore`]) and Redis-with-a-spool
//! ([`crate::SpooledStore`]).
//!
//! Every call names its tenant, and every id is looked up inside that tenant only: a caller that
//! knows another tenant's trajectory id still cannot read it through its own tenant.
//!
//! ## The ready queue
//! Completing a trajectory that is not in a group enqueues it; completing the last member of a
//! group (or [`Store::expire_groups`] passing its timeout) enqueues the group. Trainers read the
//! queue as members of a named consumer group ([`Consumer`]): each entry goes to one member, stays
//! pending until [`Store::ack`], is handed to another member once it sat unacked for
//! `claim_idle` (its reader died mid-batch), and is moved to the dead letters instead once it was
//! delivered `max_deliveries` times. Delivery is at-least-once: dedupe by the item's id.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::encoded::EncodedStep;
use crate::error::{Error, Result};
use crate::ids::{is_key_safe, GroupId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::schema::{
    CompletionReason, Evaluation, GateDecision, Group, NextState, PolicyVersion, Rollback, Step,
    Trajectory, TrajectoryRecord, TrajectoryStatus,
};

/// Storage of trajectories, shared by the recorder (writes) and the trainer (reads, acks).
#[async_trait]
pub trait Store: Send + Sync {
    /// Creates the trajectory, or updates its metadata. Status, completion and group membership
    /// are kept as stored: a trajectory joins a group only at creation.
    async fn upsert_trajectory(&self, trajectory: &Trajectory) -> Result<()>;

    /// Appends steps, in order, to their trajectories (which may be many, of many tenants): the
    /// recorder's batch writer hands over one batch per round, of steps it serialised once.
    /// Steps of unknown trajectories are stored, but such a trajectory shows up only once it is
    /// upserted.
    async fn append_encoded_steps(&self, steps: &[EncodedStep]) -> Result<()>;

    /// [`Store::append_encoded_steps`] for steps not serialised yet.
    async fn append_steps(&self, steps: &[Step]) -> Result<()> {
        let encoded = steps
            .iter()
            .map(EncodedStep::encode)
            .collect::<Result<Vec<_>>>()?;
        self.append_encoded_steps(&encoded).await
    }

    /// Records what followed `step`: the messages the next call added.
    async fn set_next_state(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        step: &StepId,
        next_state: &NextState,
    ) -> Result<()>;

    /// Appends evaluations (rewards, hints, feedback, filter errors) to their trajectories.
    async fn append_evaluations(&self, evaluations: &[Evaluation]) -> Result<()>;

    /// Finishes an open trajectory as `Completed` or `Abandoned` and enqueues what became ready.
    /// Finishing one that is already finished changes nothing. Replicas' writes land in any
    /// order, so a completion may arrive before what it completes: one whose trajectory's header
    /// is not written yet, or that holds fewer steps than [`Complete::steps`] (another replica's
    /// last step still on its way), is finished now but enqueued once the header and the steps
    /// arrived ([`Completed::deferred`]) — or by [`Store::release_overdue`].
    async fn complete_trajectory(&self, request: &Complete) -> Result<Completed>;

    /// Enqueues the completions of `tenant` finished before `completed_before` that still wait
    /// for steps (their replica died before it wrote them, or the store refused them for good):
    /// the trajectory is trained with the steps it has. One whose header never arrived stays
    /// waiting for it. Returns the trajectories released.
    async fn release_overdue(
        &self,
        tenant: &TenantId,
        completed_before: UnixMs,
    ) -> Result<Vec<TrajectoryId>>;

    /// Enqueues every open group of `tenant` created before `created_before` as `Partial`: an
    /// abandoned rollout never blocks its group forever. Returns the groups it settled.
    async fn expire_groups(
        &self,
        tenant: &TenantId,
        created_before: UnixMs,
    ) -> Result<Vec<GroupId>>;

    /// Reads up to `count` ready entries for `consumer`: first entries other members left unacked
    /// for `claim_idle`, then new ones. Never blocks; an empty answer means nothing is ready.
    async fn read_ready(
        &self,
        tenant: &TenantId,
        consumer: &Consumer,
        count: usize,
    ) -> Result<Vec<Delivery>>;

    /// Acknowledges deliveries: they are never handed out again to this consumer group.
    async fn ack(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        deliveries: &[DeliveryId],
    ) -> Result<()>;

    /// The entries of `consumer_group` that were dead-lettered, oldest first.
    async fn dead_letters(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        limit: usize,
    ) -> Result<Vec<DeadLetter>>;

    /// The consumer groups reading `tenant`'s ready queue, and how far behind each is. Read-only:
    /// for metrics and dashboards.
    async fn consumer_lag(&self, tenant: &TenantId) -> Result<Vec<ConsumerGroupLag>>;

    /// One trajectory with its steps (each with its `next_state`) and evaluations.
    async fn trajectory(
        &self,
        tenant: &TenantId,
        id: &TrajectoryId,
    ) -> Result<Option<TrajectoryRecord>>;

    /// One group with its members and state.
    async fn group(&self, tenant: &TenantId, id: &GroupId) -> Result<Option<Group>>;

    /// Trajectory headers of `tenant`, oldest first, starting after `after` (a page cursor).
    async fn list_trajectories(
        &self,
        tenant: &TenantId,
        after: Option<&TrajectoryId>,
        limit: usize,
    ) -> Result<Vec<Trajectory>>;

    /// Every tenant that has data.
    async fn tenants(&self) -> Result<Vec<TenantId>>;

    /// The tenant's live policy, if one was ever set.
    async fn policy_version(&self, tenant: &TenantId) -> Result<Option<PolicyVersion>>;

    /// Makes `policy` the tenant's live policy and notifies the routers. A version older than
    /// the live one is refused with [`Error::StalePolicyVersion`]; the same version replaces the
    /// record only where it differs (a canary started or ended), else it is a no-op.
    async fn set_policy_version(&self, policy: &PolicyVersion) -> Result<()>;

    /// Places an operator's rollback order; it replaces the tenant's last order, carried out
    /// or not.
    async fn order_rollback(&self, order: &Rollback) -> Result<()>;

    /// The tenant's latest rollback order, with its outcome once carried out.
    async fn rollback(&self, tenant: &TenantId) -> Result<Option<Rollback>>;

    /// Records `order`'s outcome (set in it) unless a newer order replaced it meanwhile; returns
    /// whether it was recorded.
    async fn settle_rollback(&self, order: &Rollback) -> Result<bool>;

    /// Keeps what the trainer's gate decided about a candidate; the tenant's oldest beyond
    /// [`crate::GATE_DECISIONS_KEPT`] are dropped.
    async fn record_gate_decision(&self, decision: &GateDecision) -> Result<()>;

    /// The tenant's latest gate decisions, newest first, at most `limit` (and at most
    /// [`crate::GATE_DECISIONS_KEPT`]).
    async fn gate_decisions(&self, tenant: &TenantId, limit: usize) -> Result<Vec<GateDecision>>;
}

/// Most waiting completions one [`Store::release_overdue`] looks at; the next sweep takes the
/// rest.
pub(crate) const OVERDUE_PER_SWEEP: usize = 256;

/// A request to finish a trajectory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Complete {
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
    /// `Completed` or `Abandoned`; `Open` is refused.
    pub status: TrajectoryStatus,
    pub reason: CompletionReason,
    pub at: UnixMs,
    /// How many steps the trajectory holds once every call it served is written, when the
    /// finisher knows (the session state numbers them); it is enqueued when they are all in.
    /// `None`: when it is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
}

impl Complete {
    /// Complete `trajectory` now, trainable, for `reason`.
    pub fn now(tenant: TenantId, trajectory: TrajectoryId, reason: CompletionReason) -> Self {
        Complete {
            tenant,
            trajectory,
            status: TrajectoryStatus::Completed,
            reason,
            at: UnixMs::now(),
            steps: None,
        }
    }

    /// This completion, enqueued once the trajectory holds `steps` steps.
    pub fn after_steps(self, steps: u32) -> Self {
        Complete {
            steps: Some(steps),
            ..self
        }
    }

    pub(crate) fn finished_status(&self) -> Result<TrajectoryStatus> {
        match self.status {
            TrajectoryStatus::Open => Err(Error::InvalidRequest(
                "a trajectory cannot be completed as open",
            )),
            s => Ok(s),
        }
    }
}

/// What [`Store::complete_trajectory`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// `false` when the trajectory was already finished (a repeated done signal).
    pub newly_finished: bool,
    /// What was enqueued as ready because of it, if anything.
    pub enqueued: Option<ReadyItem>,
    /// `true` when the completion waits: spooled ([`crate::SpooledStore`] while Redis is away),
    /// or for the trajectory's header to be written. It takes effect then, and what it enqueues
    /// is not known yet.
    pub deferred: bool,
}

/// A unit of ready work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum ReadyItem {
    /// A completed trajectory outside any group (single sessions, binary RL / OPD).
    Trajectory(TrajectoryId),
    /// A group whose members all finished ([`crate::GroupState::Ready`]) or whose timeout passed
    /// ([`crate::GroupState::Partial`]).
    Group(GroupId),
}

impl ReadyItem {
    /// `"trajectory"` or `"group"`: the stored kind, and a metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            ReadyItem::Trajectory(_) => "trajectory",
            ReadyItem::Group(_) => "group",
        }
    }

    /// The id as text, whichever kind it is.
    pub fn id_string(&self) -> String {
        match self {
            ReadyItem::Trajectory(id) => id.to_string(),
            ReadyItem::Group(id) => id.to_string(),
        }
    }

    pub(crate) fn parse(kind: &str, id: &str) -> Result<Self> {
        let bad = |detail: String| Error::UnexpectedReply {
            what: "ready entry",
            detail,
        };
        match kind {
            "trajectory" => id
                .parse()
                .map(ReadyItem::Trajectory)
                .map_err(|e| bad(format!("trajectory id {id:?}: {e}"))),
            "group" => id
                .parse()
                .map(ReadyItem::Group)
                .map_err(|e| bad(format!("group id {id:?}: {e}"))),
            other => Err(bad(format!("kind {other:?}"))),
        }
    }
}

/// A consumer-group or consumer name: 1-64 characters of `[A-Za-z0-9._-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConsumerName(String);

impl ConsumerName {
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if is_key_safe(&name) {
            Ok(ConsumerName(name))
        } else {
            Err(Error::InvalidConsumerName(name))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ConsumerName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        ConsumerName::new(s)
    }
}

impl From<ConsumerName> for String {
    fn from(c: ConsumerName) -> String {
        c.0
    }
}

impl std::fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One reader of the ready queue: a member (`name`) of a consumer group (`group`, e.g. one per
/// trainer deployment), with its redelivery policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub group: ConsumerName,
    pub name: ConsumerName,
    /// How long an entry may stay unacked before another member takes it over.
    pub claim_idle: Duration,
    /// After this many deliveries an unacked entry goes to the dead letters instead.
    pub max_deliveries: u32,
}

impl Consumer {
    /// A consumer with the defaults: take over after 5 minutes unacked, dead-letter after 5
    /// deliveries (a batch that crashed the trainer five times is poison, not bad luck).
    pub fn new(group: ConsumerName, name: ConsumerName) -> Self {
        Consumer {
            group,
            name,
            claim_idle: Duration::from_secs(300),
            max_deliveries: 5,
        }
    }
}

/// The id of one delivery of the ready queue, to ack it with. Opaque: a Redis stream id or a
/// SQLite sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeliveryId(pub String);

/// A ready entry handed to a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: DeliveryId,
    pub item: ReadyItem,
    /// 1 the first time; more when it was taken over from a consumer that did not ack.
    pub deliveries: u32,
}

/// How far one consumer group is behind on a tenant's ready queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupLag {
    pub group: ConsumerName,
    /// Ready entries no member has been handed yet; `None` when the store cannot tell (Redis
    /// after the queue was trimmed past entries the group never read).
    pub undelivered: Option<u64>,
    /// Entries handed to a member and not acked yet.
    pub pending: u64,
}

/// A ready entry that was delivered too often without an ack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The id the entry had in the ready queue.
    pub id: DeliveryId,
    pub item: ReadyItem,
    pub deliveries: u32,
    /// The consumer that held it last.
    pub last_consumer: String,
    pub dead_at: UnixMs,
}
