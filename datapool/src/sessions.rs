//! [`Sessions`]: the state that decides which trajectory a model call joins, shared by every
//! sidecar replica of a pool so that any replica continues any session.
//!
//! What the recorder used to keep in each process — which trajectories are live, their names,
//! their stitching keys, their last step and how much of the conversation it covered, the calls
//! in flight on them, a completion waiting for those calls — lives here, per tenant. Every
//! transition is one atomic operation (a Lua script on Redis, an immediate transaction on
//! SQLite), so two replicas racing on one session never fork it or give two steps one index,
//! and a trajectory is finished by exactly one caller: the one the operation answers
//! [`Finishing`] to, who then writes the datapool's completion.
//!
//! Every operation answers a repeat as it answered the first time — a step already numbered
//! keeps its number, a trajectory finished lately is reported finished (with its reason) to
//! whoever asks — so a caller whose reply was lost to a broken connection may simply ask again:
//! nothing is numbered twice, and no completion is lost (writing one twice changes nothing).
//!
//! Stitching keys are the 128-bit hashes of canonical histories (the sidecar's
//! `session::canonical`): a call's [`Prefix`]es are the hashes of its history up to each
//! assistant turn; a recorded call leaves [`StitchKey`]s, the hashes of its history plus its
//! reply. A call continues the trajectory holding its longest matching prefix — unless several
//! live trajectories hold that key (identical rollouts that answered alike), then it starts a
//! new one: the store never guesses.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::ids::{StepId, TenantId, TrajectoryId, UnixMs};
use crate::schema::CompletionReason;

/// The hash of a call's history up to the end of an assistant turn, and how many items of the
/// history as sent that prefix spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub hash: u128,
    pub end: u32,
}

/// A key under which a recorded call can be continued: its history plus its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StitchKey {
    pub hash: u128,
    /// The key leaves out the call's trailing context message, which the client rebuilds on
    /// every call.
    pub context_rebuilt: bool,
}

/// What a call says about the trajectory it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// A session name the agent gave (path, header, body), or a handshake trajectory's id.
    Name(String),
    /// A trajectory the sidecar already knows the call continues (a Responses call's
    /// `previous_response_id`).
    Trajectory(TrajectoryId),
    /// Stitching: the call's history prefixes, shortest first.
    Prefixes(Vec<Prefix>),
    /// Nothing: a new trajectory.
    New,
}

/// A call (or a handshake) asking which live trajectory it belongs to.
#[derive(Clone, Debug)]
pub struct Join {
    pub tenant: TenantId,
    pub anchor: Anchor,
    /// The call's step id, marked in flight on the trajectory until [`Sessions::step_done`] or
    /// [`Sessions::call_abandoned`]; `None` for a join that makes no call (handshake, register).
    pub call: Option<StepId>,
    /// The id a new trajectory gets when nothing live matches.
    pub open: TrajectoryId,
    pub now: UnixMs,
}

/// The trajectory a [`Join`] belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    pub trajectory: TrajectoryId,
    /// A new trajectory was opened (it is [`Join::open`]); its header is the caller's to write.
    pub opened: bool,
    /// The stitching match was ambiguous, so a new trajectory was opened.
    pub ambiguous: bool,
    /// The trajectory's last recorded step, whose next state this call brings.
    pub previous: Option<Previous>,
    /// The prefix that matched, when the call was stitched.
    pub matched: Option<Matched>,
    /// The trajectory's calls are recorded and never trained on.
    pub evaluation_only: bool,
    /// The index the trajectory's next step gets if no other call finishes first: what a step
    /// is numbered when [`Sessions::step_done`] cannot be reached.
    pub next_index: u32,
}

impl Joined {
    /// A call recorded on its own, in the new trajectory `open`: what a caller falls back to
    /// when the session state cannot answer.
    pub fn alone(open: TrajectoryId) -> Joined {
        Joined {
            trajectory: open,
            opened: true,
            ambiguous: false,
            previous: None,
            matched: None,
            evaluation_only: false,
            next_index: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Previous {
    pub step: StepId,
    /// Items of the previous call's history plus its reply: what the next call repeats.
    pub covered: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matched {
    /// Items of this call's history covered by the previous call's history and reply.
    pub end: u32,
    pub context_rebuilt: bool,
}

/// A call whose response ended and whose step is being recorded.
#[derive(Clone, Debug)]
pub struct StepDone {
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
    pub step: StepId,
    /// Items of the call's history plus its reply.
    pub covered: u32,
    /// The answer reached its end (the engine did not break off): the conversation goes on
    /// from this step. An unanswered step is numbered and kept, but the trajectory goes on
    /// from the step before it — the agent's retry of the call continues it, and brings the
    /// next state of that earlier step.
    pub answered: bool,
    /// The keys the next call may continue it by (when answered).
    pub keys: Vec<StitchKey>,
    /// The call was the trajectory's last (a done header): finish once no call is in flight.
    pub finish: Option<CompletionReason>,
    pub now: UnixMs,
}

/// What [`Sessions::step_done`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSlot {
    /// The step's index in its trajectory; `None` when the trajectory was no longer live (it
    /// was finished while the call ran past the stale-call bound).
    pub index: Option<u32>,
    /// The trajectory was finished by this call: the caller writes its completion.
    pub finishing: Option<Finishing>,
}

/// A trajectory the caller finished and must now complete in the datapool, for `reason`, and
/// then report written ([`Sessions::completions_written`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finishing {
    pub trajectory: TrajectoryId,
    pub reason: CompletionReason,
    /// Steps recorded in it.
    pub steps: u32,
}

/// What [`Sessions::finish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Finished now: the caller writes the completion.
    Now(Finishing),
    /// Calls are in flight: it finishes when the last one is recorded (that call's caller
    /// writes the completion).
    Deferred,
    /// No such live trajectory (never opened, or finished long ago; one finished lately is
    /// reported [`Finish::Now`] again).
    NotLive,
}

/// How long session state stays joinable, and when calls in flight stop counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A trajectory without a call for this long is finished by the sweep, and a call no longer
    /// joins it.
    pub idle: Duration,
    /// A call in flight for longer than this is taken for one whose replica died: it no longer
    /// holds its trajectory open.
    pub stale_call: Duration,
    /// A finished trajectory whose completion its finisher has not reported written
    /// ([`Sessions::completions_written`]) this long after is taken for one whose replica died
    /// before it wrote it: the next sweep of any replica completes it
    /// ([`Sessions::overdue_completions`]). Longer than trajectory plugins may take.
    pub completion_lease: Duration,
}

impl Timing {
    /// How long a store keeps a trajectory's state without being touched (Redis TTLs): past the
    /// point where the sweep has finished it, so the TTL only ever cleans up after a pool that
    /// was down as a whole.
    pub fn retention(&self) -> Duration {
        self.idle * 2 + self.stale_call
    }

    /// When a completion finished at `now` is overdue, unless reported written.
    pub fn completion_due(&self, now: UnixMs) -> UnixMs {
        now.saturating_add(self.completion_lease)
    }
}

/// Shared session state; see the module docs.
#[async_trait]
pub trait Sessions: Send + Sync {
    /// The live trajectory `join` belongs to — by name, by id or by the longest stitching
    /// prefix, among trajectories with a call within `timing.idle` — or a new one
    /// ([`Join::open`]). Marks the call in flight on it.
    async fn join(&self, join: &Join, timing: Timing) -> Result<Joined>;

    /// Records that `done.step` ended: numbers it, makes its keys the trajectory's (dropping the
    /// previous call's), and finishes the trajectory when a completion was waiting for it.
    async fn step_done(&self, done: &StepDone, timing: Timing) -> Result<StepSlot>;

    /// A call that produced no step: it is no longer in flight. Finishes the trajectory when a
    /// completion was waiting for it.
    async fn call_abandoned(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>>;

    /// A call whose operation's answer was lost (the caller went on without the shared state):
    /// wherever it is marked in flight, it no longer is — as [`Sessions::call_abandoned`] on
    /// the trajectory it joined, which the caller never learnt. Nothing when it holds none.
    async fn forget_call(
        &self,
        tenant: &TenantId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>>;

    /// Finishes a live trajectory for `reason` now, or once its calls in flight are recorded.
    async fn finish(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        reason: CompletionReason,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Finish>;

    /// Finishes up to `limit` of `tenant`'s trajectories that had no call for `timing.idle` and
    /// no call in flight (stale ones aside); each is answered to exactly one caller, whichever
    /// replica sweeps first. A completion that waited for a call that went stale finishes with
    /// its own reason, the others as [`CompletionReason::IdleTimeout`].
    async fn finish_idle(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>>;

    /// Up to `limit` of `tenant`'s finished trajectories whose completion is overdue at `now`:
    /// their finisher did not report it written within `timing.completion_lease` (it died
    /// before the completion reached its journal). Each is handed to one caller, which writes
    /// the completion and reports it; one still unreported a lease later is handed out again.
    async fn overdue_completions(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>>;

    /// The completions of `trajectories` are written where they survive the writer (its
    /// journal): no replica need take them over.
    async fn completions_written(
        &self,
        tenant: &TenantId,
        trajectories: &[TrajectoryId],
    ) -> Result<()>;

    /// Whether `trajectory` is live for `tenant`.
    async fn is_live(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> Result<bool>;

    /// Marks a live trajectory's calls as recorded and never trained on (a Claw-R1 validation
    /// rollout). `false` when it is not live.
    async fn set_evaluation_only(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool>;

    /// Tenants that may have live trajectories, for the idle sweep (a store may answer more).
    async fn live_tenants(&self) -> Result<Vec<TenantId>>;

    /// Keeps what a session key stands for (the handshake minted it), by the key's SHA-256, for
    /// [`SESSION_KEY_TTL`] after its last use.
    async fn put_session_key(&self, digest: &[u8; 32], session: &KeyedSession) -> Result<()>;

    /// What the session key with this digest stands for, if any; a use keeps it another
    /// [`SESSION_KEY_TTL`].
    async fn session_key(&self, digest: &[u8; 32]) -> Result<Option<KeyedSession>>;
}

/// How long a session key is kept after its last use.
pub const SESSION_KEY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The trajectory (and its tenant) a session key puts calls in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedSession {
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
}

/// A session key's digest as stored: 64 lower-case hex digits.
pub(crate) fn digest_hex(digest: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    digest.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A stitching hash as stored: 32 lower-case hex digits.
pub(crate) fn hash_hex(hash: u128) -> String {
    format!("{hash:032x}")
}
