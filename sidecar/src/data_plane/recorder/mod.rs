//! The recorder: turns served model calls into trajectory steps, off the request path.
//!
//! A call meets it twice. [`Recorder::begin`], before forwarding, asks the session state which
//! trajectory the call joins (its own session hints, stitching, or a new one) — and does not
//! wait for the answer: the question travels while the engine generates. [`Recorder::finish`],
//! once the upstream response was read to its end — also when the agent left — takes that
//! answer, notes what the call added after the previous reply (that previous step's next
//! state), numbers the [`Step`] in the session state and journals it with the rest of the
//! call's writes, before the relay lets the agent see the end of its answer. So a call waits
//! for one session operation, at its end, unless the engine answers faster than the session
//! state does.
//!
//! Session state is shared by every replica of a pool ([`crate::data_plane::session::shared`]): any replica
//! continues any session, a completion is written by exactly one of them, and the idle sweep of
//! every replica finishes each idle trajectory once. Writes go to the [`journal`] and from there
//! to the datapool through the [`writer`]; nothing waits on the datapool, and nothing a served
//! call wrote is lost when the process is killed. A completion that waits for the trajectory
//! plugins is not in the journal yet: the session state holds it as due until it is
//! ([`completions`]), and a sweep of any replica writes it once overdue.

pub mod completions;
pub mod journal;
pub mod redact;
pub mod request;
pub mod settings;
pub mod sink;
pub mod throttle;
pub mod writer;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clawback_datapool::{
    Anchor, AssistantOutput, Capture, Complete, CompletionReason, EncodedStep, Endpoint, Finish,
    Finishing, GroupId, GroupMembership, Join, Joined, KeyedSession, NextState, PolicyRef, Step,
    StepDone, StepId, StepRequest, Store, TenantId, Timings, Tokens, Trajectory, TrajectoryId,
    UnixMs, UpstreamRef, Usage, WriteOp, AGENT_METADATA_KEY, SCHEMA_VERSION,
};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::data_plane::capture::Ending;
use crate::data_plane::metrics::{Metrics, ReasonLabels};
use crate::data_plane::recorder::settings::Recording;
use crate::data_plane::relay::{Recorded, RelayEnd, Tap};
use crate::data_plane::session::explicit::Hints;
use crate::data_plane::session::shared::Unreachable;
use crate::data_plane::session::{CallKeys, Continuation, Held, RequestKeys, SessionState};
use redact::Redactor;
use sink::Sink;
use writer::Message;

/// A model call on its way through the sidecar, as far as the recorder is concerned.
#[derive(Debug)]
pub struct Call {
    pub tenant: TenantId,
    /// The id its step gets; the call is in flight on its trajectory under it.
    pub step: StepId,
    pub endpoint: Endpoint,
    pub request: StepRequest,
    /// The conversation as the agent sent it, kept only when redaction changed what is stored:
    /// the agent's next call repeats the unredacted text, so stitching keys are made of it.
    pub unredacted: Option<Vec<Value>>,
    /// What the call says about its session: the header of a trajectory it opens, whether it
    /// is the last or a side turn, what a Responses call continues.
    hints: Hints,
    /// The agent's own `metadata`, kept (apart) in the header of a trajectory it opens.
    agent_metadata: Option<Value>,
    pub started_at: UnixMs,
    pub traceparent: Option<String>,
    /// The adapter the call was routed to; `None`: the base model.
    pub policy: Option<PolicyRef>,
    /// A redaction rule matched the request: the step keeps no engine tokens (they would
    /// spell what was redacted).
    pub redacted: bool,
    /// A Responses call: what its response id will stand for.
    pub responses: Option<crate::data_plane::session::responses::Turn>,
    /// What picks the backend that keeps its conversation's prefix cache (session affinity):
    /// the same for every call of a session, known before the session state answers — the
    /// session's name, else its opening (what came before the first reply).
    pub affinity: u128,
    /// The trajectory a new one would get.
    opens: TrajectoryId,
    /// The session state's answer to the call's join, asked while the call is forwarded.
    joining: tokio::task::JoinHandle<(Joined, Held)>,
}

/// Where a call's step goes, once the session state answered its join.
struct Placed {
    trajectory: TrajectoryId,
    held: Held,
    evaluation_only: bool,
    /// The step's index should the session state not answer at the end.
    index_guess: u32,
    /// Writes that land with the call's step: its trajectory's header when the call opened it,
    /// the previous step's next state.
    leading: Vec<WriteOp>,
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
    pub capture: crate::data_plane::capture::Capture,
    /// The `model` sent upstream.
    pub model: String,
}

impl Pending {
    /// The call got no step (no upstream answered, or it answered an error).
    pub async fn abandon(self) {
        self.recorder.abandon(self.call).await;
    }

    /// The relay's tap: strips and assembles the response, then records the step.
    pub fn into_tap(
        self,
        upstream: &str,
        kind: crate::data_plane::upstream::UpstreamKind,
        is_sse: bool,
    ) -> Tap {
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
            record: Some(Box::new(move |recorded: Recorded| {
                Box::pin(async move {
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
                    recorder.finish(call, outcome).await;
                })
            })),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("`recording.redact`: {0}")]
    Redact(#[from] regex::Error),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("the replica's own session state (data_dir/{FALLBACK_SESSIONS}): {0}")]
    Sessions(#[from] clawback_datapool::Error),
}

pub struct Recorder {
    config: Recording,
    sessions: Arc<SessionState>,
    sink: Sink,
    redactor: Redactor,
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    /// The filter host, told about trajectories, steps and next states when plugins run.
    filters: OnceLock<Arc<clawback_filters::Filters>>,
    /// The Responses calls' conversations, by response id.
    responses: crate::data_plane::session::responses::StoredResponses,
}

/// The file in `data_dir` of the sessions this replica keeps while the shared state is away.
pub const FALLBACK_SESSIONS: &str = "fallback-sessions.sqlite3";

/// Trajectories one sweep finishes per tenant at most (the next sweep takes the rest).
const SWEEP_LIMIT: usize = 1000;
/// How long [`Recorder::complete`] waits for the plugins to evaluate a trajectory before its
/// completion is journaled (they read from the datapool for up to 10 s when other replicas
/// recorded its steps).
const COMPLETION_WAIT: Duration = Duration::from_secs(30);

impl Recorder {
    /// Takes a journal in `data_dir` and starts the writer, which first applies whatever a
    /// killed predecessor left in it; [`Recorder::close`] stops it once everything is written.
    /// `tenant_share`: the fraction of the stored Responses' budget one tenant may hold.
    pub fn start(
        config: Recording,
        datapool: crate::data_plane::store::Datapool,
        metrics: Arc<Metrics>,
        data_dir: &std::path::Path,
        tenant_share: f64,
    ) -> Result<Arc<Self>, StartError> {
        let crate::data_plane::store::Datapool {
            store,
            sessions,
            remote_sessions,
        } = datapool;
        let (queue, rx) = mpsc::channel(config.queue_capacity.max(1));
        let journal = Arc::new(journal::Journal::open(data_dir, config.journal_fsync)?);
        metrics
            .journal_left_at_start
            .set(i64::try_from(journal.left_at_open()).unwrap_or(i64::MAX));
        let spilled = Arc::new(Notify::new());
        let queued_bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (reports, reported) = mpsc::unbounded_channel();
        tokio::spawn(
            writer::Writer {
                store: Arc::clone(&store),
                journal: Arc::clone(&journal),
                spilled: Arc::clone(&spilled),
                batch_max: config.batch_max.max(1),
                metrics: Arc::clone(&metrics),
                queued_bytes: Arc::clone(&queued_bytes),
                queue_bytes: config.queue_bytes,
                completions: reports,
            }
            .run(rx),
        );
        let timing = clawback_datapool::Timing {
            idle: config.idle_timeout,
            stale_call: config.stale_call,
            completion_lease: config.completion_lease,
        };
        // A SQLite file has no network to wait out: its operations run to their end.
        let timeout = (remote_sessions && !config.session_timeout.is_zero())
            .then_some(config.session_timeout);
        let local = clawback_datapool::LocalSessions::open(data_dir.join(FALLBACK_SESSIONS))?;
        let sessions = Arc::new(SessionState::new(
            sessions,
            local,
            timing,
            timeout,
            Arc::clone(&metrics),
        ));
        tokio::spawn(completions::report(Arc::clone(&sessions), reported));
        let config_responses_max_bytes = config.responses_max_bytes;
        let recorder = Arc::new(Self {
            sink: Sink {
                journal,
                queue,
                spilled,
                metrics: Arc::clone(&metrics),
                errors: Arc::new(throttle::LogThrottle::new(Duration::from_secs(5))),
                queued_bytes,
                queue_bytes: config.queue_bytes,
            },
            redactor: Redactor::new(&config.redact)?,
            config,
            sessions,
            metrics,
            store,
            filters: OnceLock::new(),
            responses: crate::data_plane::session::responses::StoredResponses::new(
                config_responses_max_bytes,
                crate::data_plane::share::of(config_responses_max_bytes, tenant_share),
            ),
        });
        Ok(recorder)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The responses relayed lately (stateful Responses calls resolve through it).
    pub fn responses(&self) -> &crate::data_plane::session::responses::StoredResponses {
        &self.responses
    }

    /// Lets the filter host follow what is recorded (once, at start).
    pub fn attach_filters(&self, filters: Arc<clawback_filters::Filters>) {
        let _ = self.filters.set(filters);
    }

    /// Records evaluations (explicit feedback now; the filters' scores later).
    pub fn enqueue_evaluations(&self, evaluations: Vec<clawback_datapool::Evaluation>) {
        self.sink
            .write(vec![WriteOp::AppendEvaluations { evaluations }]);
    }

    /// Asks the session state which trajectory the call joins, and goes on without waiting for
    /// the answer ([`Recorder::finish`] takes it).
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
        // Hashing happens before any lock or round trip.
        let (anchor, affinity) = match (&hints.session, &hints.continues) {
            (Some((name, _)), _) => (
                Anchor::Name(name.clone()),
                xxhash_rust::xxh3::xxh3_128(format!("{}\0{name}", tenant.as_str()).as_bytes()),
            ),
            (None, continues) => {
                let keys = RequestKeys::of(&tenant, &history);
                let anchor = match continues {
                    Some(continues) => Anchor::Trajectory(continues.trajectory),
                    None if keys.is_empty() => Anchor::New,
                    None => Anchor::Prefixes(keys.prefixes()),
                };
                (anchor, keys.opening)
            }
        };
        let unredacted = (!self.redactor.is_empty()).then(|| history.clone());
        let mut request = request::step_request(history, &recorded);
        let redacted = self.redactor.request(&mut request);
        let step = StepId::new();
        let join = Join {
            tenant: tenant.clone(),
            anchor,
            call: Some(step),
            open: TrajectoryId::new(),
            now: UnixMs::now(),
        };
        let opens = join.open;
        let sessions = Arc::clone(&self.sessions);
        let joining = tokio::spawn(async move { sessions.join(&join).await });
        Call {
            tenant,
            step,
            endpoint,
            request,
            unredacted,
            hints: hints.clone(),
            agent_metadata: body.get("metadata").cloned(),
            started_at: UnixMs::now(),
            traceparent,
            policy: None,
            redacted,
            responses: None,
            affinity,
            opens,
            joining,
        }
    }

    /// Where `call` goes: the session state's answer to its join, with the writes it brings
    /// (the header of a trajectory it opened, the previous step's next state — which the
    /// plugins now score).
    async fn placed(&self, call: &mut Call) -> Placed {
        let (joined, held) = match (&mut call.joining).await {
            Ok(answer) => answer,
            Err(e) => {
                // The join's task cannot fail short of a panic: record the call on its own.
                tracing::error!(error = %e, "a call's session join failed");
                (Joined::alone(call.opens), Held::Local)
            }
        };
        let tenant = &call.tenant;
        let mut leading = Vec::new();
        if joined.opened {
            let origin = MetadataOrigin::Agent(call.agent_metadata.as_ref());
            let trajectory = self.opened(tenant, joined.trajectory, &call.hints, origin);
            leading.push(WriteOp::UpsertTrajectory { trajectory });
        }
        if let Some(previous) = joined.previous {
            let history = call.unredacted.as_deref().unwrap_or(&call.request.messages);
            let mut added = match (Continuation::of(&joined), &call.hints.continues) {
                (_, Some(continues)) if continues.trajectory == joined.trajectory => {
                    continues.next_state.clone()
                }
                (Some(continuation), _) => continuation.next_state(history).to_vec(),
                _ => added_messages(&call.request.messages, previous.covered as usize),
            };
            added.iter_mut().for_each(|m| {
                self.redactor.value(m);
            });
            let next_state = NextState {
                messages: added,
                observed_at: UnixMs::now(),
            };
            if let Some(filters) = self.filters.get() {
                filters.next_state(tenant, joined.trajectory, previous.step, &next_state);
            }
            leading.push(WriteOp::SetNextState {
                tenant: tenant.clone(),
                trajectory: joined.trajectory,
                step: previous.step,
                next_state,
            });
        }
        Placed {
            trajectory: joined.trajectory,
            held,
            evaluation_only: joined.evaluation_only,
            index_guess: joined.next_index,
            leading,
        }
    }

    /// The header of a trajectory just opened (and its group, on first sight).
    fn opened(
        &self,
        tenant: &TenantId,
        id: TrajectoryId,
        hints: &Hints,
        origin: MetadataOrigin<'_>,
    ) -> Trajectory {
        let mut trajectory = Trajectory::open(tenant.clone(), id);
        if let Some((name, source)) = &hints.session {
            trajectory
                .metadata
                .insert("session".to_owned(), json!(name));
            trajectory
                .metadata
                .insert("session_source".to_owned(), json!(source.as_str()));
        }
        match origin {
            MetadataOrigin::Trusted(metadata) => {
                let mut metadata = Value::Object(metadata.clone());
                self.redactor.value(&mut metadata);
                if let Value::Object(metadata) = &metadata {
                    merge_metadata(&mut trajectory.metadata, metadata);
                }
            }
            MetadataOrigin::Agent(metadata) => {
                if let Some(metadata @ Value::Object(_)) = metadata {
                    let mut metadata = metadata.clone();
                    self.redactor.value(&mut metadata);
                    trajectory
                        .metadata
                        .insert(AGENT_METADATA_KEY.to_owned(), metadata);
                }
            }
        }
        if let Some((group, size)) = &hints.group {
            trajectory.metadata.insert("group".to_owned(), json!(group));
            trajectory.group = Some(GroupMembership {
                id: named_group(tenant, group),
                size: *size,
            });
        }
        self.metrics.trajectories_started.inc();
        if let Some(filters) = self.filters.get() {
            filters.opened(&trajectory);
        }
        trajectory
    }

    /// Opens a trajectory from the handshake API; calls name it by its id.
    pub async fn create(
        &self,
        tenant: TenantId,
        group: Option<(String, u32)>,
        metadata: Map<String, Value>,
    ) -> TrajectoryId {
        let id = TrajectoryId::new();
        let join = Join {
            tenant: tenant.clone(),
            anchor: Anchor::Name(id.to_string()),
            call: None,
            open: id,
            now: UnixMs::now(),
        };
        self.sessions.join(&join).await;
        let hints = Hints {
            group,
            ..Hints::default()
        };
        let trajectory = self.opened(&tenant, id, &hints, MetadataOrigin::Trusted(&metadata));
        self.sink
            .write(vec![WriteOp::UpsertTrajectory { trajectory }]);
        id
    }

    /// The live trajectory `tenant`'s calls name `name` (a path-form session), opened with
    /// `group` and the agent's `body["metadata"]` when there is none yet. What a Claw-R1
    /// black-box session registers before its first call ([`crate::control_plane::claw_r1`]).
    pub async fn open_named(
        &self,
        tenant: &TenantId,
        name: &str,
        group: Option<(String, u32)>,
        body: &Value,
    ) -> TrajectoryId {
        let join = Join {
            tenant: tenant.clone(),
            anchor: Anchor::Name(name.to_owned()),
            call: None,
            open: TrajectoryId::new(),
            now: UnixMs::now(),
        };
        let (joined, _) = self.sessions.join(&join).await;
        if joined.opened {
            let hints = Hints {
                session: Some((
                    name.to_owned(),
                    crate::data_plane::session::explicit::Source::Path,
                )),
                group,
                ..Hints::default()
            };
            let trajectory = self.opened(
                tenant,
                joined.trajectory,
                &hints,
                MetadataOrigin::Agent(body.get("metadata")),
            );
            self.sink
                .write(vec![WriteOp::UpsertTrajectory { trajectory }]);
        }
        joined.trajectory
    }

    /// A new session key for `trajectory` of `tenant` ([`crate::data_plane::session::keys`]), kept in the
    /// shared session state.
    pub async fn mint_session_key(&self, tenant: TenantId, trajectory: TrajectoryId) -> String {
        let (key, digest) = crate::data_plane::session::keys::mint();
        self.sessions
            .put_session_key(&digest, &KeyedSession { tenant, trajectory })
            .await;
        key
    }

    /// The session a presented session key stands for; `None` for a key that is not one, or
    /// that nobody minted.
    pub async fn session_key(&self, key: &str) -> Option<KeyedSession> {
        let digest = crate::data_plane::session::keys::digest(key)?;
        self.sessions.session_key(&digest).await
    }

    /// Marks live `trajectory` as one whose calls are recorded and never trained on.
    pub async fn evaluation_only(&self, tenant: &TenantId, trajectory: TrajectoryId) {
        self.sessions.set_evaluation_only(tenant, &trajectory).await;
    }

    /// Records the step of a call whose response was read to its end. Returns once the step is
    /// journaled: the relay holds the end of the answer back until then.
    pub async fn finish(&self, mut call: Call, outcome: Outcome) {
        let waited = Instant::now();
        let mut keys = Vec::new();
        if outcome.complete {
            // What the agent will send back as this turn: the reply as the engine gave it.
            let reply = json!({
                "role": "assistant",
                "content": outcome.output.content,
                "tool_calls": outcome.output.tool_calls,
            });
            let history = call.unredacted.as_deref().unwrap_or(&call.request.messages);
            keys = CallKeys::of(&call.tenant, history, &reply).stitch_keys();
        }
        let placed = self.placed(&mut call).await;
        if let (true, Some(turn), Some(id)) =
            (outcome.complete, &call.responses, &outcome.response_id)
        {
            let mut items = turn.new_items.clone();
            items.extend(crate::data_plane::session::responses::reply_items(
                &outcome.output,
            ));
            self.responses.remember(
                &call.tenant,
                id.clone(),
                placed.trajectory,
                turn.previous.clone(),
                items,
            );
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
        let trainable = !call.hints.side_turn && !placed.evaluation_only && outcome.complete;
        self.metrics.captured(capture, trainable, &tokens);
        let covered = call.request.messages.len() + 1;
        let done = StepDone {
            tenant: call.tenant.clone(),
            trajectory: placed.trajectory,
            step: call.step,
            covered: u32::try_from(covered).unwrap_or(u32::MAX),
            answered: outcome.complete,
            keys,
            finish: call.hints.done.then_some(CompletionReason::DoneHeader),
            now: UnixMs::now(),
        };
        let slot = self.sessions.step_done(placed.held, &done).await;
        let index = match slot.and_then(|slot| slot.index) {
            Some(index) => index,
            None => {
                self.sink.dropped("step_numbered_without_session_state");
                placed.index_guess
            }
        };
        let step = Step {
            schema_version: SCHEMA_VERSION,
            id: call.step,
            tenant: call.tenant.clone(),
            trajectory: placed.trajectory,
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
        let finishing = match slot {
            Some(slot) => slot.finishing,
            // The session state is out of reach: the agent said this was the last call, and a
            // completion written twice (once more by the sweep, later) changes nothing.
            None if call.hints.done => Some(Finishing {
                trajectory: placed.trajectory,
                reason: CompletionReason::DoneHeader,
                steps: index + 1,
            }),
            None => None,
        };
        let mut ops = placed.leading;
        // Serialised once, here: the journal writes these bytes and the datapool stores them.
        match EncodedStep::encode(&step) {
            Ok(step) => ops.push(WriteOp::AppendSteps { steps: vec![step] }),
            Err(e) => {
                tracing::error!(error = %e, step = %step.id, "a step could not be serialised; it is not recorded");
                self.sink.dropped("step_not_serialisable");
            }
        }
        if let Some(finishing) = finishing {
            ops.extend(self.completion(&call.tenant, finishing));
        }
        self.sink.write(ops);
        self.metrics
            .end_of_response_wait
            .observe(waited.elapsed().as_secs_f64());
    }

    /// A call that produced no step (the upstream refused it): its in-flight mark goes, and
    /// what it brought (a new trajectory, the previous step's next state) is recorded.
    pub async fn abandon(&self, mut call: Call) {
        let placed = self.placed(&mut call).await;
        let finishing = self
            .sessions
            .call_abandoned(placed.held, &call.tenant, &placed.trajectory, &call.step)
            .await;
        let mut ops = placed.leading;
        if let Some(finishing) = finishing {
            ops.extend(self.completion(&call.tenant, finishing));
        }
        self.sink.write(ops);
    }

    /// The datapool's completion of a trajectory this process finished, if it may be written
    /// now; with trajectory plugins it is written once their evaluations are (so the trainer
    /// finds its rewards with it), and `None` is returned.
    fn completion(&self, tenant: &TenantId, finishing: Finishing) -> Option<WriteOp> {
        self.completion_then(tenant, finishing, None)
    }

    /// [`Recorder::completion`], and when it is written later (after the plugins), `written`
    /// is told once it is in the journal.
    fn completion_then(
        &self,
        tenant: &TenantId,
        finishing: Finishing,
        written: Option<oneshot::Sender<()>>,
    ) -> Option<WriteOp> {
        if finishing.steps == 1 {
            self.metrics
                .finding(crate::data_plane::metrics::Finding::SingleCallTask);
        }
        self.metrics
            .trajectories_completed
            .get_or_create(&ReasonLabels {
                reason: finishing.reason.as_str(),
            })
            .inc();
        let op = WriteOp::CompleteTrajectory {
            // Enqueued once every step it numbered is in the store: another replica's last
            // step may land after this completion.
            request: Complete::now(tenant.clone(), finishing.trajectory, finishing.reason)
                .after_steps(finishing.steps),
        };
        match self.filters.get() {
            Some(filters) => {
                let sink = self.sink.clone();
                filters.completed(
                    tenant,
                    finishing.trajectory,
                    finishing.reason,
                    finishing.steps,
                    Box::new(move || {
                        sink.write(vec![op]);
                        if let Some(written) = written {
                            let _ = written.send(());
                        }
                    }),
                );
                None
            }
            None => Some(op),
        }
    }

    /// Completes a live trajectory of `tenant` — once its calls in flight are recorded, so the
    /// last turn is never cut off. `false` if `tenant` has no live trajectory with that id.
    ///
    /// Returns once the completion is in the journal: when plugins evaluate the trajectory
    /// first, that is after them (at most [`COMPLETION_WAIT`]). An agent told the trajectory is
    /// complete can rely on it across a crash; one whose call failed asks again, and a
    /// trajectory finished lately is finished again (the session state remembers it).
    pub async fn complete(
        &self,
        tenant: &TenantId,
        trajectory: TrajectoryId,
        reason: CompletionReason,
    ) -> Result<bool, Unreachable> {
        match self.sessions.finish(tenant, &trajectory, reason).await? {
            Finish::Now(finishing) => {
                let (written, journaled) = oneshot::channel();
                match self.completion_then(tenant, finishing, Some(written)) {
                    Some(op) => self.sink.write(vec![op]),
                    None => {
                        if tokio::time::timeout(COMPLETION_WAIT, journaled)
                            .await
                            .is_err()
                        {
                            tracing::warn!(%trajectory, wait = ?COMPLETION_WAIT,
                                "a completion still waits for its plugins: answered before it was journaled");
                        }
                    }
                }
                Ok(true)
            }
            Finish::Deferred => Ok(true),
            Finish::NotLive => Ok(false),
        }
    }

    /// Whether `trajectory` is live for `tenant`.
    pub async fn is_live(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool, Unreachable> {
        self.sessions.is_live(tenant, trajectory).await
    }

    /// The tenant a live trajectory belongs to, among `candidates`.
    pub async fn tenant_of(
        &self,
        trajectory: &TrajectoryId,
        candidates: impl IntoIterator<Item = TenantId>,
    ) -> Result<Option<TenantId>, Unreachable> {
        for tenant in candidates {
            if self.sessions.is_live(&tenant, trajectory).await? {
                return Ok(Some(tenant));
            }
        }
        Ok(None)
    }

    /// Tenants that may have live trajectories or open groups.
    pub async fn tenants(&self) -> Vec<TenantId> {
        let mut tenants = self.sessions.live_tenants().await;
        if let Ok(with_data) = self.store.tenants().await {
            tenants.extend(with_data);
        }
        tenants.sort();
        tenants.dedup();
        tenants
    }

    /// Completes trajectories idle past the timeout (whichever replica sweeps first), releases
    /// groups past theirs, and completions that waited `completion_lease` for steps that never
    /// came.
    pub async fn sweep(&self) {
        if let Some(filters) = self.filters.get() {
            filters.forget_idle(self.config.idle_timeout);
        }
        for (tenant, finishing) in self.sessions.forget_ghosts().await {
            let op = self.completion(&tenant, finishing);
            self.sink.write(op.into_iter().collect());
        }
        let tenants = self.tenants().await;
        let cutoff = UnixMs::now().saturating_sub(self.config.group_timeout);
        let overdue_cutoff = UnixMs::now().saturating_sub(self.config.completion_lease);
        for tenant in tenants {
            let mut finished = self.sessions.finish_idle(&tenant, SWEEP_LIMIT).await;
            let overdue = self
                .sessions
                .overdue_completions(&tenant, SWEEP_LIMIT)
                .await;
            if !overdue.is_empty() {
                self.metrics
                    .completions_taken_over
                    .inc_by(overdue.len() as u64);
                tracing::warn!(tenant = %tenant.as_str(), trajectories = overdue.len(),
                    "completions their replica never wrote (it died first): written now");
            }
            finished.extend(overdue);
            let ops: Vec<WriteOp> = finished
                .into_iter()
                .filter_map(|finishing| self.completion(&tenant, finishing))
                .collect();
            self.sink.write(ops);
            match self.store.expire_groups(&tenant, cutoff).await {
                Ok(groups) if !groups.is_empty() => {
                    tracing::info!(tenant = %tenant.as_str(), groups = groups.len(), "groups released as partial after their timeout");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(tenant = %tenant.as_str(), error = %e, "could not expire groups")
                }
            }
            match self.store.release_overdue(&tenant, overdue_cutoff).await {
                Ok(released) if !released.is_empty() => {
                    self.metrics.completions_short.inc_by(released.len() as u64);
                    tracing::warn!(tenant = %tenant.as_str(), trajectories = released.len(),
                        "completions whose steps never all arrived (their replica died first): enqueued with the steps they have");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(tenant = %tenant.as_str(), error = %e, "could not release overdue completions")
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

    /// At shutdown: completes the trajectories only this replica knows (opened while the
    /// shared session state was unreachable). Shared ones stay live: another replica, or this
    /// one restarted, continues them.
    pub async fn complete_local(&self) {
        for (tenant, finishing) in self.sessions.finish_local().await {
            let op = self.completion(&tenant, finishing);
            self.sink.write(op.into_iter().collect());
        }
    }

    /// Applies every write journaled so far, then stops the writer.
    pub async fn close(&self) {
        let (done, applied) = oneshot::channel();
        if self.sink.queue.send(Message::Close(done)).await.is_ok() {
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
/// an agent's request body's `metadata` (kept under [`AGENT_METADATA_KEY`], never shown to
/// plugins).
enum MetadataOrigin<'a> {
    Trusted(&'a Map<String, Value>),
    Agent(Option<&'a Value>),
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
