//! The trajectory schema: the one serde definition of what clawback records, shared by the
//! sidecar (writes it), the filters (score it) and the trainer (learns from it).
//! `datapool/SCHEMA.md` documents it with a full example that a test keeps in sync.
//!
//! Every top-level record carries `schema_version`; readers refuse versions newer than
//! [`SCHEMA_VERSION`] instead of silently dropping fields they do not know.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::ids::{EvaluationId, GroupId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::logprobs::CompletionLogprobs;
use crate::packed;

/// The schema version this build writes and the newest it reads. 2: stored steps keep their
/// token ids and logprobs packed ([`crate::packed`]), which a reader of version 1 cannot read.
pub const SCHEMA_VERSION: u32 = 2;

fn schema_version() -> u32 {
    SCHEMA_VERSION
}

/// Refuses a record written by a newer schema.
pub(crate) fn check_version(what: &'static str, found: u32) -> Result<(), Error> {
    if found > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            what,
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// A trajectory (= session, episode) without its steps: the header the stores keep per trajectory.
/// Its `status` and `completed_at` are owned by the store ([`crate::Store::complete_trajectory`]);
/// an upsert never changes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub id: TrajectoryId,
    pub tenant: TenantId,
    /// Set when the trajectory is one rollout of a group; fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupMembership>,
    /// Free-form metadata. Top-level keys come from trusted sides only (the handshake API, the
    /// sidecar itself); what an agent's request body says is kept apart under
    /// [`AGENT_METADATA_KEY`], which reward plugins never see.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    pub status: TrajectoryStatus,
    pub created_at: UnixMs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<CompletionReason>,
}

/// The metadata key under which the `metadata` of an agent's request is kept. The agent is the
/// policy being trained: whatever it says about itself (a ground-truth `answer`, a reward) must
/// not decide its reward, so plugins are shown the trajectory's metadata without this key.
pub const AGENT_METADATA_KEY: &str = "agent";

impl Trajectory {
    /// A new, open trajectory created now.
    pub fn open(tenant: TenantId, id: TrajectoryId) -> Self {
        Trajectory {
            schema_version: SCHEMA_VERSION,
            id,
            tenant,
            group: None,
            metadata: Map::new(),
            status: TrajectoryStatus::Open,
            created_at: UnixMs::now(),
            completed_at: None,
            completion: None,
        }
    }

    /// The same trajectory as one rollout of `group` of `size` rollouts.
    pub fn in_group(mut self, group: GroupId, size: u32) -> Self {
        self.group = Some(GroupMembership { id: group, size });
        self
    }
}

/// Which group a trajectory belongs to and how many rollouts that group expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMembership {
    pub id: GroupId,
    pub size: u32,
}

/// Where a trajectory is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrajectoryStatus {
    /// Steps may still be appended.
    Open,
    /// Finished and trainable: enqueued as ready (alone, or with its group).
    Completed,
    /// Finished but not to be trained on alone (the client gave up, an error ended it). Counts as
    /// finished for its group's readiness; never enqueued on its own.
    Abandoned,
}

impl TrajectoryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TrajectoryStatus::Open => "open",
            TrajectoryStatus::Completed => "completed",
            TrajectoryStatus::Abandoned => "abandoned",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "open" => Some(TrajectoryStatus::Open),
            "completed" => Some(TrajectoryStatus::Completed),
            "abandoned" => Some(TrajectoryStatus::Abandoned),
            _ => None,
        }
    }
}

/// Why a trajectory was completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionReason {
    /// `POST /trajectories/{id}/complete` on the handshake API.
    Handshake,
    /// The last call carried `X-Clawback-Done: true` (or OpenClaw-RL's `X-Session-Done`).
    DoneHeader,
    /// No call for the configured idle time: the last turn is kept and trained too.
    IdleTimeout,
}

impl CompletionReason {
    /// The serialized name (`handshake`, `done_header`, `idle_timeout`): a metrics label too.
    pub fn as_str(self) -> &'static str {
        match self {
            CompletionReason::Handshake => "handshake",
            CompletionReason::DoneHeader => "done_header",
            CompletionReason::IdleTimeout => "idle_timeout",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "handshake" => Some(CompletionReason::Handshake),
            "done_header" => Some(CompletionReason::DoneHeader),
            "idle_timeout" => Some(CompletionReason::IdleTimeout),
            _ => None,
        }
    }
}

/// One model call: what was asked, what the model answered, the tokens it sampled and with which
/// policy, and, once the next call arrived, what followed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub id: StepId,
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
    /// 0-based position of the call within its trajectory.
    pub index: u32,
    /// `false` for calls that are recorded but must not be trained on (OpenClaw-RL `side` turns).
    #[serde(default = "yes")]
    pub trainable: bool,
    pub endpoint: Endpoint,
    pub request: StepRequest,
    pub output: AssistantOutput,
    /// Whether token ids came from the engine, and if so the ids and logprobs it returned.
    #[serde(flatten)]
    pub tokens: Tokens,
    /// The policy (adapter or weights version) that served the call; `None` for the base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
    pub upstream: UpstreamRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub timings: Timings,
    /// What followed this call: filled in by [`crate::Store::set_next_state`] when the next call
    /// of the trajectory arrives; `None` for the last step or until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_state: Option<NextState>,
    /// W3C `traceparent` of the agent's request, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The answer was larger than the recorder's step cap (`recording.max_step_bytes`): the
    /// agent got it whole, the step holds only its beginning (no engine tokens) and is not
    /// trainable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// What the engine gave of its sampling, as the sidecar saw it; see [`Step::capture`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<Capture>,
}

/// How much of its sampling the engine gave for a step — what a trainer can do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capture {
    /// The engine's token ids (and, unless they did not line up, a logprob per sampled token):
    /// trainable as served.
    Tokens,
    /// Logprobs whose tokens came as strings, without ids (a streamed SGLang call): the text
    /// must be re-tokenised and the logprobs cannot be trusted to line up.
    Logprobs,
    /// Text only (an OpenAI upstream, the Responses API, a redacted or truncated step).
    Text,
}

impl Capture {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Logprobs => "logprobs",
            Self::Text => "text",
        }
    }
}

impl Step {
    /// The step's capture level; for a step recorded before the field existed, what its tokens
    /// say.
    pub fn capture(&self) -> Capture {
        self.capture.unwrap_or(match &self.tokens {
            Tokens::Engine(_) => Capture::Tokens,
            Tokens::None => Capture::Text,
        })
    }
}

fn yes() -> bool {
    true
}

/// Which OpenAI-compatible endpoint the call went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    ChatCompletions,
    Responses,
    Completions,
    /// Anthropic's Messages API passed to an upstream that speaks it: the request is recorded as
    /// the chat messages it stands for, the answer text only.
    Messages,
}

/// The request as the agent sent it, minus credentials and the fields the sidecar injected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRequest {
    /// `messages` (chat), `input` items (responses) or a single prompt message (completions),
    /// verbatim OpenAI JSON.
    pub messages: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub sampling: SamplingParams,
}

/// The sampling parameters in effect for the call (as sent upstream).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Any other sampling field the request carried (`min_p`, `repetition_penalty`, ...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// What the assistant answered (choice 0), assembled whole even when it was streamed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Thinking text of reasoning models (vLLM/SGLang `reasoning_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// OpenAI `tool_calls` entries, verbatim: `{id, type: "function", function: {name, arguments}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
}

/// Whether the step carries the engine's own token ids. Flattened into [`Step`]: the JSON has a
/// `tokens` marker (`"engine"` or `"none"`) beside the id fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tokens", rename_all = "snake_case")]
pub enum Tokens {
    /// Ids and logprobs exactly as a vLLM/SGLang engine returned them: never re-tokenised.
    Engine(EngineTokens),
    /// Text only (an OpenAI upstream): the trainer re-tokenises, knowingly.
    None,
}

/// Token ids and logprobs as the engine sampled them. The stores keep them packed
/// ([`crate::packed`]); every reader takes either form.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineTokens {
    /// vLLM's top-level `prompt_token_ids` (the chat template applied by the engine).
    #[serde(
        serialize_with = "packed::write_ids",
        deserialize_with = "packed::read_ids"
    )]
    pub prompt_token_ids: Vec<u32>,
    /// vLLM's `choices[0].token_ids`, EOS included when the engine sampled it.
    #[serde(
        serialize_with = "packed::write_ids",
        deserialize_with = "packed::read_ids"
    )]
    pub completion_token_ids: Vec<u32>,
    /// `choices[0].logprobs.content`, one entry per completion token; empty when the engine
    /// returned none. Raw (pre-temperature) unless the engine ran `processed_logprobs`.
    #[serde(default, skip_serializing_if = "CompletionLogprobs::is_empty")]
    pub completion_logprobs: CompletionLogprobs,
}

/// One entry of OpenAI's `logprobs.content`, owned (a step holds them as
/// [`CompletionLogprobs`]' columns).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative in `top_logprobs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
}

/// The policy that served a step: the adapter (or weights) name and its version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PolicyRef {
    pub adapter: String,
    pub version: u64,
}

/// Which upstream served the call and under which model name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpstreamRef {
    /// The upstream's name in the sidecar config.
    pub name: String,
    pub kind: UpstreamKind,
    /// The `model` sent upstream: a base model or a versioned adapter (`tenant-a@v17`).
    pub model: String,
}

/// The kind of inference backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamKind {
    Vllm,
    Sglang,
    Openai,
    /// A server of Anthropic's Messages API (Anthropic's, or an engine's own `/v1/messages`).
    Anthropic,
}

/// OpenAI `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

/// When the call happened, as seen by the sidecar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// The request arrived at the sidecar.
    pub started_at: UnixMs,
    /// The first response byte (or SSE chunk) arrived from upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_at: Option<UnixMs>,
    /// The upstream response was complete.
    pub finished_at: UnixMs,
}

/// The messages the next call of the trajectory added after this step's assistant reply: tool
/// results, the user's answer. What the filters score the step on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NextState {
    pub messages: Vec<Value>,
    pub observed_at: UnixMs,
}

/// A judgement of a step or a whole trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub id: EvaluationId,
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
    /// The step judged; `None` for a trajectory-level evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepId>,
    pub source: EvaluationSource,
    /// A score, or the filter's failure to produce one.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Free-form labels (`"judge_votes": "+1,+1,-1"`, `"rubric": "tool-use"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub created_at: UnixMs,
}

/// Who produced an evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EvaluationSource {
    /// A Wasm filter plugin, identified by name and the hash of its component bytes, so a reward
    /// can be traced to the exact plugin build that gave it.
    Plugin { name: String, content_hash: String },
    /// Explicit feedback from a person or a client (handshake `complete`/`feedback`, a UI thumb).
    Feedback { channel: String },
}

/// What an evaluation says. Flattened into [`Evaluation`] under a `kind` tag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// An evaluative reward and/or a directive hint (OPD).
    Score {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reward: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
    /// The filter failed (trap, timeout, bad output); the step keeps no score from it.
    FilterError { reason: String },
}

/// A group of rollouts of the same task, as the store tracks it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: GroupId,
    pub tenant: TenantId,
    pub size: u32,
    /// Every trajectory that joined, oldest first.
    pub members: Vec<TrajectoryId>,
    /// The members that finished (completed or abandoned).
    pub finished: Vec<TrajectoryId>,
    pub state: GroupState,
    pub created_at: UnixMs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<UnixMs>,
}

/// Whether a group can be trained on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// Waiting for members to finish.
    Open,
    /// All `size` members finished: enqueued as ready.
    Ready,
    /// The group timeout passed first: enqueued with the members that finished.
    Partial,
}

impl GroupState {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Open => "open",
            GroupState::Ready => "ready",
            GroupState::Partial => "partial",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "open" => Some(GroupState::Open),
            "ready" => Some(GroupState::Ready),
            "partial" => Some(GroupState::Partial),
            _ => None,
        }
    }
}

/// The live policy of a tenant: which adapter (or weights) the sidecar routes its calls to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyVersion {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub tenant: TenantId,
    /// The name the backend serves it under (`tenant-a@v17`).
    pub adapter: String,
    /// Monotonic per tenant: a store refuses to go back to an older version.
    pub version: u64,
    pub live_since: UnixMs,
    /// A candidate serving a share of the tenant's calls before it may replace this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
}

/// A candidate version on trial: it serves `percent` of its tenant's calls (each call drawn on
/// its own), and its online rewards are compared with the live version's before it is promoted
/// or dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Canary {
    /// The name the backend serves it under.
    pub adapter: String,
    /// Newer than the live version.
    pub version: u64,
    /// Of the tenant's calls, 1-99.
    pub percent: u8,
    pub since: UnixMs,
}

impl PolicyVersion {
    /// The same version, with `canary` on trial (or none).
    pub fn with_canary(&self, canary: Option<Canary>) -> Self {
        Self {
            canary,
            ..self.clone()
        }
    }

    /// The reference a step records when this policy served it.
    pub fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            adapter: self.adapter.clone(),
            version: self.version,
        }
    }
}

/// An operator's order to make an earlier version of a tenant's policy live again, and what came
/// of it. The trainer, which owns the engine's adapters, carries it out: version `to`'s weights
/// go live as a new version (versions only grow), and training continues from them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub tenant: TenantId,
    /// Names this order: a later order replaces it, and the trainer's outcome is recorded only
    /// against the order it carried out.
    pub id: String,
    /// The version whose weights go live again.
    pub to: u64,
    /// The live version when it was ordered.
    pub from: u64,
    pub ordered_at: UnixMs,
    /// `None` until the trainer carried it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<RollbackOutcome>,
}

/// What came of a [`Rollback`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RollbackOutcome {
    /// Version `to`'s weights are live as `version`.
    Done { at: UnixMs, version: u64 },
    /// Nothing changed: the live version stays.
    Failed { at: UnixMs, reason: String },
}

/// The most gate decisions kept per tenant ([`crate::Store::record_gate_decision`]); older ones
/// are dropped as new ones come.
pub const GATE_DECISIONS_KEPT: usize = 50;

/// What the trainer's gate decided about one candidate version of a tenant's policy, and why:
/// kept for the operator (the viewer, `GET /tenants/{tenant}/gate`), the latest
/// [`GATE_DECISIONS_KEPT`] per tenant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateDecision {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub tenant: TenantId,
    /// The candidate's version number.
    pub version: u64,
    /// The live version it was compared with; `None`: the base.
    pub live: Option<u64>,
    /// Whether it went on (to the canary, or live); else it was held back.
    pub promoted: bool,
    /// Why it was held back (empty when promoted).
    pub reasons: Vec<String>,
    /// Each prompt set's counts.
    pub sets: Vec<GateSetScore>,
    /// Mean per-token KL(candidate ‖ base) over the base's replies, in nats.
    pub kl: f64,
    /// How long the decision took.
    pub seconds: f64,
    pub decided_at: UnixMs,
}

/// Prompts of one set that each version passed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateSetScore {
    pub name: String,
    pub prompts: u32,
    pub candidate: u32,
    /// The version it would replace (the base before the first).
    pub live: u32,
    pub base: u32,
}

/// A trajectory with everything recorded about it: what [`crate::Store::trajectory`] returns and
/// what the trainer learns from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub trajectory: Trajectory,
    /// In the order they were appended, each with its `next_state` when known.
    pub steps: Vec<Step>,
    pub evaluations: Vec<Evaluation>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::example::tool_use_trajectory;

    fn acme() -> TenantId {
        TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_text_only_step_says_tokens_none_and_carries_no_ids() {
        let mut step = tool_use_trajectory(acme()).steps.remove(1);
        step.tokens = Tokens::None;
        let v = serde_json::to_value(&step).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["tokens"], json!("none"));
        assert!(v.get("prompt_token_ids").is_none());
        assert!(v.get("completion_logprobs").is_none());
        let back: Step = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, step);
    }

    #[test]
    fn a_filter_error_is_an_evaluation_of_kind_filter_error_with_its_reason() {
        let mut e = tool_use_trajectory(acme()).evaluations.remove(0);
        e.verdict = Verdict::FilterError {
            reason: "plugin trapped: fuel exhausted".into(),
        };
        let v = serde_json::to_value(&e).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["kind"], json!("filter_error"));
        assert_eq!(v["reason"], json!("plugin trapped: fuel exhausted"));
        assert!(v.get("reward").is_none());
        assert_eq!(v["source"]["type"], json!("plugin"));
        let back: Evaluation = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, e);
    }

    #[test]
    fn a_side_turn_is_recorded_but_not_trainable_and_old_records_default_to_trainable() {
        let mut step = tool_use_trajectory(acme()).steps.remove(0);
        step.trainable = false;
        let mut v = serde_json::to_value(&step).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["trainable"], json!(false));
        if let Some(map) = v.as_object_mut() {
            map.remove("trainable");
        }
        let back: Step = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        assert!(back.trainable);
    }

    #[test]
    fn records_of_a_newer_schema_are_refused() {
        assert!(check_version("step", SCHEMA_VERSION).is_ok());
        let err = check_version("step", SCHEMA_VERSION + 1);
        assert!(
            matches!(err, Err(Error::UnsupportedSchema { .. })),
            "{err:?}"
        );
    }
}
