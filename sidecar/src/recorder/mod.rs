//! The recorder: turns served model calls into trajectory steps, off the request path.
//!
//! A call meets it twice. [`Recorder::begin`], before forwarding, decides the trajectory (the
//! call's own session hints, or a new one) and records what the call adds after the previous
//! reply as that previous step's next state. [`Recorder::finish`], once the upstream response
//! was read to its end — also when the agent left — builds the [`Step`] and queues it.
//!
//! Nothing here waits on storage: writes go to a bounded queue drained by [`writer`]; when the
//! queue is full the write is dropped and counted, never waited for. Live trajectories are kept
//! in memory (a few hundred bytes each) until they complete — by the done header, the handshake
//! API, or [`Recording::idle_timeout`](crate::config::Recording) without a call.

pub mod overflow;
pub mod redact;
pub mod request;
pub mod throttle;
pub mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use clawback_datapool::{
    AssistantOutput, Capture, Complete, CompletionReason, Endpoint, GroupId, GroupMembership,
    NextState, PolicyRef, Step, StepId, StepRequest, Store, TenantId, Timings, Tokens, Trajectory,
    TrajectoryId, UnixMs, UpstreamRef, Usage, WriteOp, AGENT_METADATA_KEY, SCHEMA_VERSION,
};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::capture::Ending;
use crate::config::Recording;
use crate::metrics::{Metrics, ReasonLabels};
use crate::relay::{Recorded, RelayEnd, Tap};
use crate::session::explicit::Hints;
use crate::session::{CallKeys, Lookup, RequestKeys, StitchConfig, Stitcher};
use redact::Redactor;
use writer::Message;

/// A model call on its way through the sidecar, as far as the recorder is concerned.
#[derive(Debug, Clone)]
pub struct Call {
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
    pub endpoint: Endpoint,
    pub request: StepRequest,
    /// The conversation as the agent sent it, kept only when redaction changed what is stored:
    /// the agent's next call repeats the unredacted text, so stitching keys are made of it.
    pub unredacted: Option<Vec<Value>>,
    pub trainable: bool,
    pub done: bool,
    pub started_at: UnixMs,
    pub traceparent: Option<String>,
    /// The adapter the call was routed to; `None`: the base model.
    pub policy: Option<PolicyRef>,
    /// A redaction rule matched the request: the step keeps no engine tokens (they would
    /// spell what was redacted).
    pub redacted: bool,
    /// A Responses call: what its response id will stand for.
    pub responses: Option<crate::session::responses::Turn>,
}

/// What the upstream answered, assembled whole.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub output: AssistantOutput,
    pub tokens: Tokens,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub upstream: UpstreamRef,
    pub first_token_at: Option<UnixMs>,
    pub finished_at: UnixMs,
    /// A Responses API response's id.
    pub response_id: Option<String>,
    /// The engine gave logprobs without token ids (their tokens as strings).
    pub logprobs_without_ids: bool,
    /// The response arrived whole (`[DONE]`, `response.completed`, a full body).
    pub complete: bool,
    /// Larger than `recording.max_step_bytes`: only its beginning was assembled.
    pub truncated: bool,
}

/// A call being forwarded with recording on: what [`Recorder::finish`] needs once its response
/// has ended, and the capture that rewrote its request.
pub struct Pending {
    pub recorder: Arc<Recorder>,
    pub call: Call,
    pub capture: crate::capture::Capture,
    /// The `model` sent upstream.
    pub model: String,
}

impl Pending {
    /// The call got no step (no upstream answered, or it answered an error).
    pub fn abandon(self) {
        self.recorder.abandon(&self.call);
    }

    /// The relay's tap: strips and assembles the response, then records the step.
    pub fn into_tap(self, upstream: &str, kind: crate::config::UpstreamKind, is_sse: bool) -> Tap {
        let Pending {
            recorder,
            call,
            capture,
            model,
        } = self;
        let upstream = UpstreamRef {
            name: upstream.to_owned(),
            kind: kind.into(),
            model,
        };
        Tap {
            capture: capture
                .response(is_sse)
                .with_limit(recorder.config.max_step_bytes),
            record: Box::new(move |recorded: Recorded| {
                let assembled = recorded.assembled;
                let complete = recorded.end == RelayEnd::Complete
                    && assembled.ending == Ending::Complete
                    && !recorded.truncated;
                let outcome = Outcome {
                    output: assembled.output,
                    tokens: assembled.engine.map_or(Tokens::None, Tokens::Engine),
                    finish_reason: assembled.finish_reason,
                    usage: assembled.usage,
                    upstream,
                    first_token_at: recorded.first_byte_at,
                    finished_at: UnixMs::now(),
                    response_id: assembled.response_id,
                    logprobs_without_ids: !assembled.logprobs_without_ids.is_empty(),
                    complete,
                    truncated: recorded.truncated,
                };
                recorder.finish(call, outcome);
            }),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("`recording.redact`: {0}")]
    Redact(#[from] regex::Error),
    #[error(transparent)]
    Overflow(#[from] overflow::OverflowError),
}

/// A trajectory that may still get calls.
#[derive(Debug)]
struct Live {
    tenant: TenantId,
    /// The agent's name for it (path, header or body session id), if it gave one.
    name: Option<String>,
    next_index: u32,
    last_step: Option<StepId>,
    /// Messages of the last call plus its reply: what the next call repeats as history.
    covered: usize,
    last_seen: Instant,
    in_flight: u32,
    /// A completion asked for while calls were in flight; runs when the last one is recorded.
    complete_after: Option<CompletionReason>,
    /// Its calls are recorded and never trained on (a Claw-R1 validation rollout).
    evaluation_only: bool,
}

#[derive(Debug, Default)]
struct Sessions {
    live: HashMap<TrajectoryId, Live>,
    by_name: HashMap<(TenantId, String), TrajectoryId>,
    /// Tenants with groups, whose group timeouts the sweeper checks.
    tenants_with_groups: HashSet<TenantId>,
}

pub struct Recorder {
    config: Recording,
    drop_log: Arc<throttle::LogThrottle>,
    stitcher: Mutex<Stitcher>,
    queue: mpsc::Sender<Message>,
    /// Where writes go past a full queue ([`overflow`]).
    overflow: Arc<overflow::Overflow>,
    sessions: Mutex<Sessions>,
    redactor: Redactor,
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    /// The filter host, told about trajectories, steps and next states when plugins run.
    filters: OnceLock<Arc<clawback_filters::Filters>>,
    /// The Responses calls' conversations, by response id.
    responses: crate::session::responses::StoredResponses,
}

/// Why a trajectory ends, as the store records it.
fn reason_label(reason: CompletionReason) -> &'static str {
    match reason {
        CompletionReason::Handshake => "handshake",
        CompletionReason::DoneHeader => "done_header",
        CompletionReason::IdleTimeout => "idle_timeout",
    }
}

impl Recorder {
    /// Starts the writer; [`Recorder::close`] stops it once everything queued is written.
    pub fn start(
        config: Recording,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        data_dir: &std::path::Path,
    ) -> Result<Arc<Self>, StartError> {
        let (queue, rx) = mpsc::channel(config.queue_capacity.max(1));
        let overflow = Arc::new(overflow::Overflow::open(data_dir)?);
        tokio::spawn(writer::run(
            Arc::clone(&store),
            rx,
            Arc::clone(&overflow),
            config.batch_max.max(1),
            Arc::clone(&metrics),
        ));
        let config_responses_max_bytes = config.responses_max_bytes;
        let stitcher = Stitcher::new(StitchConfig {
            max_entries: config.stitch_max_entries.max(1),
            ttl: config.idle_timeout,
        });
        let recorder = Arc::new(Self {
            stitcher: Mutex::new(stitcher),
            drop_log: Arc::new(throttle::LogThrottle::new(Duration::from_secs(5))),
            redactor: Redactor::new(&config.redact)?,
            config,
            queue,
            overflow,
            sessions: Mutex::new(Sessions::default()),
            metrics,
            store,
            filters: OnceLock::new(),
            responses: crate::session::responses::StoredResponses::new(config_responses_max_bytes),
        });
        Ok(recorder)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The responses relayed lately (stateful Responses calls resolve through it).
    pub fn responses(&self) -> &crate::session::responses::StoredResponses {
        &self.responses
    }

    /// Lets the filter host follow what is recorded (once, at start).
    pub fn attach_filters(&self, filters: Arc<clawback_filters::Filters>) {
        let _ = self.filters.set(filters);
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stitcher(&self) -> MutexGuard<'_, Stitcher> {
        self.stitcher.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a write without waiting; a full queue drops it (counted).
    fn enqueue(&self, op: WriteOp) {
        send(
            &self.queue,
            &self.overflow,
            &self.metrics,
            &self.drop_log,
            op,
        );
    }

    /// Queues evaluations (explicit feedback now; the filters' scores later).
    pub fn enqueue_evaluations(&self, evaluations: Vec<clawback_datapool::Evaluation>) {
        self.enqueue(WriteOp::AppendEvaluations { evaluations });
    }

    fn dropped(&self, reason: &'static str) {
        count_drop(&self.metrics, reason);
    }

    /// Decides the call's trajectory and records the previous step's next state.
    pub fn begin(
        &self,
        tenant: TenantId,
        hints: &Hints,
        endpoint: Endpoint,
        body: &Value,
        traceparent: Option<String>,
    ) -> Call {
        let recorded = request::recorded(endpoint, body);
        let history = request::messages(endpoint, &recorded);
        // A call that names no session may continue one by its history. Hashing happens before
        // any lock is taken.
        let stitched = match (&hints.session, &hints.continues) {
            (Some(_), _) | (_, Some(_)) => None,
            (None, None) => {
                let keys = RequestKeys::of(&tenant, &history);
                match self.stitcher().lookup_keys(&keys) {
                    Lookup::Continues(continuation) => Some(continuation),
                    Lookup::New | Lookup::Ambiguous => None,
                }
            }
        };
        let unredacted = (!self.redactor.is_empty()).then(|| history.clone());
        let mut request = request::step_request(history, &recorded);
        let redacted = self.redactor.request(&mut request);
        let history = unredacted.as_deref().unwrap_or(&request.messages);
        let mut sessions = self.sessions();
        let known = match (&hints.session, &stitched) {
            (Some((name, _)), _) => sessions
                .by_name
                .get(&(tenant.clone(), name.clone()))
                .copied(),
            (None, Some(continuation)) => Some(continuation.trajectory),
            (None, None) => hints.continues.as_ref().map(|c| c.trajectory),
        }
        .filter(|id| {
            sessions
                .live
                .get(id)
                .is_some_and(|live| live.tenant == tenant)
        });
        let trajectory = match known {
            Some(id) => id,
            None => self.open(&mut sessions, &tenant, hints, MetadataOrigin::Agent(body)),
        };
        let mut next_state = None;
        let mut evaluation_only = false;
        if let Some(live) = sessions.live.get_mut(&trajectory) {
            evaluation_only = live.evaluation_only;
            live.last_seen = Instant::now();
            live.in_flight += 1;
            if let Some(step) = live.last_step {
                let added = match (&stitched, &hints.continues) {
                    (_, Some(continues)) if known.is_some() => {
                        let mut added = continues.next_state.clone();
                        added.iter_mut().for_each(|m| {
                            self.redactor.value(m);
                        });
                        added
                    }
                    (Some(continuation), _) if known.is_some() => {
                        let mut added = continuation.next_state(history).to_vec();
                        added.iter_mut().for_each(|m| {
                            self.redactor.value(m);
                        });
                        added
                    }
                    _ => added_messages(&request.messages, live.covered),
                };
                next_state = Some((step, added));
            }
        }
        drop(sessions);
        if let Some((step, messages)) = next_state {
            let next_state = NextState {
                messages,
                observed_at: UnixMs::now(),
            };
            if let Some(filters) = self.filters.get() {
                filters.next_state(trajectory, step, &next_state);
            }
            self.enqueue(WriteOp::SetNextState {
                tenant: tenant.clone(),
                trajectory,
                step,
                next_state,
            });
        }
        Call {
            tenant,
            trajectory,
            endpoint,
            request,
            unredacted,
            trainable: !hints.side_turn && !evaluation_only,
            done: hints.done,
            started_at: UnixMs::now(),
            traceparent,
            policy: None,
            redacted,
            responses: None,
        }
    }

    /// Opens a new trajectory for a call (and its group, on first sight).
    fn open(
        &self,
        sessions: &mut Sessions,
        tenant: &TenantId,
        hints: &Hints,
        origin: MetadataOrigin<'_>,
    ) -> TrajectoryId {
        // Always a fresh id: a session name that was a trajectory id (the handshake's base_url,
        // used again after completion) must not append to a finished trajectory.
        let id = TrajectoryId::new();
        let mut trajectory = Trajectory::open(tenant.clone(), id);
        if let Some((name, source)) = &hints.session {
            trajectory
                .metadata
                .insert("session".to_owned(), json!(name));
            trajectory
                .metadata
                .insert("session_source".to_owned(), json!(source.as_str()));
            sessions.by_name.insert((tenant.clone(), name.clone()), id);
        }
        match origin {
            MetadataOrigin::Trusted(metadata) => {
                let mut metadata = Value::Object(metadata.clone());
                self.redactor.value(&mut metadata);
                if let Value::Object(metadata) = &metadata {
                    merge_metadata(&mut trajectory.metadata, metadata);
                }
            }
            MetadataOrigin::Agent(body) => {
                if let Some(metadata @ Value::Object(_)) = body.get("metadata") {
                    let mut metadata = metadata.clone();
                    self.redactor.value(&mut metadata);
                    trajectory
                        .metadata
                        .insert(AGENT_METADATA_KEY.to_owned(), metadata);
                }
            }
        }
        if let Some((group, size)) = &hints.group {
            let group_id = named_group(tenant, group);
            sessions.tenants_with_groups.insert(tenant.clone());
            trajectory.metadata.insert("group".to_owned(), json!(group));
            trajectory.group = Some(GroupMembership {
                id: group_id,
                size: *size,
            });
        }
        sessions.live.insert(
            id,
            Live {
                tenant: tenant.clone(),
                name: hints.session.as_ref().map(|(name, _)| name.clone()),
                next_index: 0,
                last_step: None,
                covered: 0,
                last_seen: Instant::now(),
                in_flight: 0,
                complete_after: None,
                evaluation_only: false,
            },
        );
        self.metrics.trajectories_started.inc();
        if let Some(filters) = self.filters.get() {
            filters.opened(&trajectory);
        }
        self.enqueue(WriteOp::UpsertTrajectory { trajectory });
        id
    }

    /// Opens a trajectory from the handshake API; calls name it by its id.
    pub fn create(
        &self,
        tenant: TenantId,
        group: Option<(String, u32)>,
        metadata: Map<String, Value>,
    ) -> TrajectoryId {
        let hints = Hints {
            group,
            ..Hints::default()
        };
        let mut sessions = self.sessions();
        let id = self.open(
            &mut sessions,
            &tenant,
            &hints,
            MetadataOrigin::Trusted(&metadata),
        );
        sessions.by_name.insert((tenant, id.to_string()), id);
        id
    }

    /// The live trajectory `tenant`'s calls name `name` (a path-form session), opened with
    /// `group` and the agent's `body["metadata"]` when there is none yet. What a Claw-R1
    /// black-box session registers before its first call ([`crate::claw_r1`]).
    pub fn open_named(
        &self,
        tenant: &TenantId,
        name: &str,
        group: Option<(String, u32)>,
        body: &Value,
    ) -> TrajectoryId {
        let mut sessions = self.sessions();
        let key = (tenant.clone(), name.to_owned());
        let live = sessions
            .by_name
            .get(&key)
            .copied()
            .filter(|id| sessions.live.get(id).is_some_and(|l| l.tenant == *tenant));
        if let Some(id) = live {
            return id;
        }
        let hints = Hints {
            session: Some((name.to_owned(), crate::session::explicit::Source::Path)),
            group,
            ..Hints::default()
        };
        self.open(&mut sessions, tenant, &hints, MetadataOrigin::Agent(body))
    }

    /// Marks live `trajectory` as one whose calls are recorded and never trained on.
    pub fn evaluation_only(&self, trajectory: TrajectoryId) {
        if let Some(live) = self.sessions().live.get_mut(&trajectory) {
            live.evaluation_only = true;
        }
    }

    /// Records the step of a call whose response was read to its end.
    pub fn finish(&self, call: Call, outcome: Outcome) {
        if outcome.complete {
            // What the agent will send back as this turn: the reply as the engine gave it.
            let reply = json!({
                "role": "assistant",
                "content": outcome.output.content,
                "tool_calls": outcome.output.tool_calls,
            });
            let history = call.unredacted.as_deref().unwrap_or(&call.request.messages);
            let keys = CallKeys::of(&call.tenant, history, &reply);
            self.stitcher().remember_keys(call.trajectory, keys);
            if let (Some(turn), Some(id)) = (&call.responses, &outcome.response_id) {
                let mut items = turn.new_items.clone();
                items.extend(crate::session::responses::reply_items(&outcome.output));
                self.responses.remember(
                    &call.tenant,
                    id.clone(),
                    call.trajectory,
                    turn.previous.clone(),
                    items,
                );
            }
        }
        let mut output = outcome.output;
        let mut tokens = outcome.tokens;
        // A truncated answer's tokens would describe only part of it (and tokens spell what
        // redaction removed from the text).
        if self.redactor.output(&mut output) || call.redacted || outcome.truncated {
            tokens = Tokens::None;
        }
        let capture = match (&tokens, outcome.logprobs_without_ids) {
            (Tokens::Engine(_), _) => Capture::Tokens,
            (Tokens::None, true) => Capture::Logprobs,
            (Tokens::None, false) => Capture::Text,
        };
        let trainable = call.trainable && outcome.complete;
        self.metrics.captured(capture, trainable, &tokens);
        let covered = call.request.messages.len() + 1;
        let (index, step_id) = {
            let mut sessions = self.sessions();
            let Some(live) = sessions.live.get_mut(&call.trajectory) else {
                // Completions wait for calls in flight, so this is a call that raced one.
                drop(sessions);
                self.dropped("trajectory_not_live");
                return;
            };
            let index = live.next_index;
            let step_id = StepId::new();
            live.next_index += 1;
            live.last_step = Some(step_id);
            live.covered = covered;
            live.last_seen = Instant::now();
            live.in_flight = live.in_flight.saturating_sub(1);
            (index, step_id)
        };
        let step = Step {
            schema_version: SCHEMA_VERSION,
            id: step_id,
            tenant: call.tenant.clone(),
            trajectory: call.trajectory,
            index,
            trainable,
            endpoint: call.endpoint,
            request: call.request,
            output,
            tokens,
            policy: call.policy,
            upstream: outcome.upstream,
            finish_reason: outcome.finish_reason,
            usage: outcome.usage,
            timings: Timings {
                started_at: call.started_at,
                first_token_at: outcome.first_token_at,
                finished_at: outcome.finished_at,
            },
            next_state: None,
            traceparent: call.traceparent,
            truncated: outcome.truncated,
            capture: Some(capture),
        };
        self.metrics.steps_recorded.inc();
        if let Some(filters) = self.filters.get() {
            filters.step_recorded(&step);
        }
        self.enqueue(WriteOp::AppendSteps { steps: vec![step] });
        if call.done {
            self.complete(&call.tenant, call.trajectory, CompletionReason::DoneHeader);
        } else {
            self.complete_if_pending(call.trajectory);
        }
    }

    /// Runs a completion that waited for the trajectory's calls in flight.
    fn complete_if_pending(&self, trajectory: TrajectoryId) {
        let pending = self
            .sessions()
            .live
            .get(&trajectory)
            .filter(|live| live.in_flight == 0)
            .and_then(|live| {
                live.complete_after
                    .map(|reason| (live.tenant.clone(), reason))
            });
        if let Some((tenant, reason)) = pending {
            self.complete(&tenant, trajectory, reason);
        }
    }

    /// A call that produced no step (the upstream refused it): only its in-flight mark goes.
    pub fn abandon(&self, call: &Call) {
        if let Some(live) = self.sessions().live.get_mut(&call.trajectory) {
            live.in_flight = live.in_flight.saturating_sub(1);
            live.last_seen = Instant::now();
        }
        self.complete_if_pending(call.trajectory);
    }

    /// Completes a live trajectory of `tenant` — once its calls in flight are recorded, so the
    /// last turn is never cut off. `false` if `tenant` has no live trajectory with that id.
    pub fn complete(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        reason: CompletionReason,
    ) -> bool {
        {
            let mut sessions = self.sessions();
            match sessions.live.get_mut(&trajectory) {
                Some(live) if live.tenant == *tenant && live.in_flight > 0 => {
                    live.complete_after = Some(reason);
                    return true;
                }
                Some(live) if live.tenant == *tenant => {}
                _ => return false,
            }
            if let Some(live) = sessions.live.remove(&trajectory) {
                if live.next_index == 1 {
                    self.metrics
                        .finding(crate::metrics::Finding::SingleCallTask);
                }
                if let Some(name) = live.name {
                    let key = (live.tenant, name);
                    if sessions.by_name.get(&key) == Some(&trajectory) {
                        sessions.by_name.remove(&key);
                    }
                }
            }
            let handshake_key = (tenant.clone(), trajectory.to_string());
            sessions.by_name.remove(&handshake_key);
        }
        self.stitcher().forget(tenant, &trajectory);
        self.metrics
            .trajectories_completed
            .get_or_create(&ReasonLabels {
                reason: reason_label(reason),
            })
            .inc();
        let op = WriteOp::CompleteTrajectory {
            request: Complete::now(tenant.clone(), trajectory, reason),
        };
        match self.filters.get() {
            // The completion (which makes the trajectory ready for the trainer) is written
            // after the plugins' evaluations of it, so the trainer finds its rewards with it.
            Some(filters) => {
                let (queue, overflow, metrics, drop_log) = (
                    self.queue.clone(),
                    Arc::clone(&self.overflow),
                    Arc::clone(&self.metrics),
                    Arc::clone(&self.drop_log),
                );
                filters.completed(
                    trajectory,
                    reason,
                    Box::new(move || send(&queue, &overflow, &metrics, &drop_log, op)),
                );
            }
            None => self.enqueue(op),
        }
        true
    }

    /// Whether `trajectory` is live for `tenant`.
    pub fn is_live(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> bool {
        self.sessions()
            .live
            .get(trajectory)
            .is_some_and(|live| live.tenant == *tenant)
    }

    /// The tenant a live trajectory belongs to.
    pub fn tenant_of(&self, trajectory: &TrajectoryId) -> Option<TenantId> {
        self.sessions()
            .live
            .get(trajectory)
            .map(|live| live.tenant.clone())
    }

    /// Completes trajectories idle past the timeout, and releases groups past theirs.
    pub async fn sweep(&self) {
        let idle = self.config.idle_timeout;
        let expired: Vec<(TenantId, TrajectoryId)> = self
            .sessions()
            .live
            .iter()
            .filter(|(_, live)| live.in_flight == 0 && live.last_seen.elapsed() >= idle)
            .map(|(id, live)| (live.tenant.clone(), *id))
            .collect();
        for (tenant, id) in expired {
            self.complete(&tenant, id, CompletionReason::IdleTimeout);
        }
        let tenants: Vec<TenantId> = self
            .sessions()
            .tenants_with_groups
            .iter()
            .cloned()
            .collect();
        let cutoff = UnixMs::now().saturating_sub(self.config.group_timeout);
        for tenant in tenants {
            match self.store.expire_groups(&tenant, cutoff).await {
                Ok(groups) if !groups.is_empty() => {
                    tracing::info!(tenant = %tenant.as_str(), groups = groups.len(), "groups released as partial after their timeout");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(tenant = %tenant.as_str(), error = %e, "could not expire groups")
                }
            }
        }
    }

    /// Runs [`Recorder::sweep`] periodically until `stop` resolves.
    pub async fn sweep_until(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let tick =
            (self.config.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => self.sweep().await,
                () = &mut stop => return,
            }
        }
    }

    /// Completes every live trajectory (at shutdown: their sessions cannot continue in a new
    /// process, which starts from an empty session table).
    pub fn complete_all(&self) {
        let live: Vec<(TenantId, TrajectoryId)> = self
            .sessions()
            .live
            .iter()
            .map(|(id, live)| (live.tenant.clone(), *id))
            .collect();
        for (tenant, id) in live {
            self.complete(&tenant, id, CompletionReason::IdleTimeout);
        }
    }

    /// Applies every write queued so far, then stops the writer.
    pub async fn close(&self) {
        let (done, applied) = oneshot::channel();
        if self.queue.send(Message::Close(done)).await.is_ok() {
            let _ = applied.await;
        }
    }
}

/// What a call added after the previous call's messages and reply. If the history shrank (the
/// agent compacted it), what follows the last assistant message is taken instead.
fn added_messages(messages: &[Value], covered: usize) -> Vec<Value> {
    if messages.len() > covered && covered > 0 {
        return messages[covered..].to_vec();
    }
    let after_last_reply = messages
        .iter()
        .rposition(|m| m["role"] == "assistant" || m["type"] == "function_call")
        .map_or(0, |i| i + 1);
    messages[after_last_reply..].to_vec()
}

/// Where a new trajectory's metadata comes from: the handshake API (trusted, top-level keys) or
/// an agent's request body (kept under [`AGENT_METADATA_KEY`], never shown to plugins).
enum MetadataOrigin<'a> {
    Trusted(&'a Map<String, Value>),
    Agent(&'a Value),
}

/// Copies trusted `metadata` onto the trajectory, leaving the sidecar's own keys.
fn merge_metadata(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (key, value) in from {
        into.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

/// The id of the group a client names: the same on every sidecar replica (a UUIDv8 of the
/// SHA-256 of tenant and name), so the rollouts of one group, spread over replicas behind a
/// load balancer, complete one group in the datapool rather than one per replica.
fn named_group(tenant: &TenantId, name: &str) -> GroupId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(tenant.as_str())
        .chain_update([0])
        .chain_update(name)
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    GroupId::from_uuid(uuid::Uuid::new_v8(bytes))
}

/// Queues a write for the batch writer; a full queue drops it (counted, and logged at most
/// every few seconds) rather than make a request wait.
/// Queues `op` for the writer; past a full queue (or while earlier writes wait there) into the
/// overflow journal, in order. A write is dropped only when the journal cannot be written.
fn send(
    queue: &mpsc::Sender<Message>,
    overflow: &overflow::Overflow,
    metrics: &Metrics,
    drop_log: &throttle::LogThrottle,
    op: WriteOp,
) {
    let entries = writer::count(&op);
    let op = if overflow.is_spilling() {
        op
    } else {
        match queue.try_send(Message::Write(op)) {
            Ok(()) => {
                metrics.recorder_queue.inc_by(entries);
                return;
            }
            Err(mpsc::error::TrySendError::Full(Message::Write(op))) => op,
            Err(mpsc::error::TrySendError::Full(_)) => return,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                count_drop(metrics, "shutting_down");
                return;
            }
        }
    };
    match overflow.spill(&op) {
        Ok(()) => {
            metrics.records_spilled.inc_by(entries.unsigned_abs());
        }
        Err(e) => {
            count_drop(metrics, "overflow_failed");
            if let Some(count) = drop_log.event() {
                tracing::error!(dropped = count, error = %e,
                    "the recorder queue is full and its overflow journal cannot be written: \
                     writes are being dropped (see clawback_records_dropped_total)");
            }
        }
    }
}

fn count_drop(metrics: &Metrics, reason: &'static str) {
    metrics
        .records_dropped
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_group_has_one_id_on_every_replica_and_per_tenant() {
        let (a, b) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
        assert_eq!(named_group(&a, "task-7"), named_group(&a, "task-7"));
        assert_ne!(named_group(&a, "task-7"), named_group(&a, "task-8"));
        assert_ne!(named_group(&a, "task-7"), named_group(&b, "task-7"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        let ab = TenantId::new("ab").unwrap();
        assert_ne!(named_group(&ab, "c"), named_group(&a, "bc"));
    }

    #[test]
    fn the_next_state_is_what_follows_the_previous_reply() {
        let history = vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "tool_calls": [{"id": "c1"}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        ];
        assert_eq!(added_messages(&history, 2), vec![history[2].clone()]);
        // A compacted history: whatever follows the last reply.
        assert_eq!(added_messages(&history[1..], 5), vec![history[2].clone()]);
    }
}
