//! Session stitching: which trajectory a call without an explicit session id continues. A call
//! whose messages extend an earlier call's messages plus that call's assistant reply joins the
//! earlier call's trajectory; any other call starts a new one.
//!
//! Stitching keeps no messages. After each recorded call the session state remembers, for its
//! trajectory, the hash of the canonical history "request + reply" ([`super::canonical`]) — and,
//! when the request ended with a context message the client rebuilds on every call, also the
//! hash without that message ([`CallKeys`]). A new call hashes every canonical prefix of its
//! history in one pass ([`RequestKeys`]), and the session state looks them up, longest first.
//! The hashes are made here, outside any lock; the lookup and the bookkeeping live in the
//! datapool's shared session state ([`clawback_datapool::Sessions`]), so every replica of a pool
//! stitches against the same trajectories.
//!
//! Wrong joins are worse than missed ones, so the rules lean towards "new":
//! - Only the longest matching prefix decides. A shorter match belongs to a history that the
//!   longer one already extends; joining it would skip the more specific evidence.
//! - When a trajectory is extended, its previous keys are dropped: a call that branches from an
//!   older point of the trajectory (an edited or replayed history) starts a new one.
//! - **Ambiguity policy**: when two live trajectories remembered the same key — identical
//!   histories and identical replies, as in N rollouts of one task that happen to answer alike —
//!   the key stays marked as shared until every trajectory holding it has moved on or finished,
//!   and a call matching it starts a new trajectory. Nothing is guessed by recency: rollouts run
//!   concurrently, so "most recent" is a coin toss. Tool-call ids take part in the key, so
//!   rollouts whose replies carry engine-issued ids stay distinguishable even when their text is
//!   the same.
//! - The tenant is hashed into every key, and the session state keeps each tenant's keys apart:
//!   tenants never join each other.

use clawback_datapool::{Joined, Prefix, StitchKey, TenantId, TrajectoryId};
use serde_json::Value;

use super::canonical::{ends_with_context, Boundary, HistoryHasher};

/// A call that continues a trajectory by stitching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continuation {
    pub trajectory: TrajectoryId,
    /// Items of the call covered by the previous call's history and its reply; the rest is new.
    pub previous_len: usize,
    /// The match left out the previous call's trailing context message: the client rebuilds one
    /// on every call (see [`Continuation::next_state`]).
    pub context_rebuilt: bool,
}

impl Continuation {
    /// The continuation a stitched join found, if it found one.
    pub fn of(joined: &Joined) -> Option<Self> {
        let matched = joined.matched.filter(|_| !joined.opened)?;
        Some(Continuation {
            trajectory: joined.trajectory,
            previous_len: matched.end as usize,
            context_rebuilt: matched.context_rebuilt,
        })
    }

    /// The previous step's next state: what this call added after the previous reply (tool
    /// results, the user's answer). When the client rebuilds a trailing context message on every
    /// call ([`Continuation::context_rebuilt`]), this call's own trailing context message is left
    /// out: it is the context of the next model call, not a consequence of the previous reply.
    /// The previous call's context message never appears here: the client dropped it.
    pub fn next_state<'a>(&self, request: &'a [Value]) -> &'a [Value] {
        let added = request.get(self.previous_len..).unwrap_or(&[]);
        match added {
            [state @ .., _] if self.context_rebuilt && ends_with_context(added) => state,
            _ => added,
        }
    }
}

/// The hash of every canonical prefix of a call's history that ends after an assistant turn,
/// computed once per call (outside any lock).
#[derive(Clone, Debug)]
pub struct RequestKeys {
    boundaries: Vec<Boundary>,
    /// [`HistoryHasher::opening`].
    pub opening: u128,
}

impl RequestKeys {
    /// `history`: the request's `messages` (chat) or `input` items (Responses).
    pub fn of(tenant: &TenantId, history: &[Value]) -> Self {
        let mut hasher = HistoryHasher::new(tenant);
        history.iter().for_each(|item| hasher.push(item));
        let opening = hasher.opening();
        RequestKeys {
            boundaries: hasher.finish(),
            opening,
        }
    }

    /// No assistant turn in the history: the call cannot continue anything.
    pub fn is_empty(&self) -> bool {
        self.boundaries.is_empty()
    }

    /// The prefixes to look up, shortest first: the longest [`MAX_PREFIXES`] of them. A call
    /// continues one of the last turns of its history, and the session state's work (one lookup
    /// per prefix, in a Redis script) stays bounded however many turns a client sends.
    pub fn prefixes(&self) -> Vec<Prefix> {
        let skip = self.boundaries.len().saturating_sub(MAX_PREFIXES);
        self.boundaries[skip..]
            .iter()
            .map(|b| Prefix {
                hash: b.hash,
                end: u32::try_from(b.end).unwrap_or(u32::MAX),
            })
            .collect()
    }
}

/// Most history prefixes a call is looked up by ([`RequestKeys::prefixes`]).
pub const MAX_PREFIXES: usize = 64;

/// The keys under which a recorded call can be continued, computed outside any lock.
#[derive(Clone, Debug)]
pub struct CallKeys {
    /// History + reply.
    full: u128,
    /// History without its trailing context message + reply, when it had one.
    without_context: Option<u128>,
}

impl CallKeys {
    /// `request`: the call's messages or input items; `reply`: the assistant message as recorded
    /// (`content`, `tool_calls`; `role` and reasoning optional) or the Responses `output` items.
    pub fn of(tenant: &TenantId, request: &[Value], reply: &Value) -> Self {
        let mut hasher = HistoryHasher::new(tenant);
        let (kept, context) = match request {
            [kept @ .., context] if ends_with_context(request) => (kept, Some(context)),
            _ => (request, None),
        };
        kept.iter().for_each(|item| hasher.push(item));
        let without_context = context.map(|_| {
            let mut hasher = hasher.clone();
            hasher.push_reply(reply);
            last_hash(hasher)
        });
        if let Some(context) = context {
            hasher.push(context);
        }
        hasher.push_reply(reply);
        CallKeys {
            full: last_hash(hasher),
            without_context,
        }
    }

    /// The keys as the session state keeps them.
    pub fn stitch_keys(&self) -> Vec<StitchKey> {
        std::iter::once(StitchKey {
            hash: self.full,
            context_rebuilt: false,
        })
        .chain(self.without_context.map(|hash| StitchKey {
            hash,
            context_rebuilt: true,
        }))
        .collect()
    }
}

fn last_hash(hasher: HistoryHasher) -> u128 {
    // A reply always ends with an assistant turn, so there is always a last boundary, and it
    // covers the reply; 0 stands in for the impossible and no history hashes to it in practice.
    hasher.finish().last().map_or(0, |b| b.hash)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clawback_datapool::{
        Anchor, CompletionReason, Join, LocalSessions, Sessions, StepDone, StepId, Timing, UnixMs,
    };
    use serde_json::{json, Map};

    use super::*;

    /// What a lookup found.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Lookup {
        Continues(Continuation),
        New,
        Ambiguous,
    }

    const TIMING: Timing = Timing {
        idle: Duration::from_secs(60),
        stale_call: Duration::from_secs(600),
        completion_lease: Duration::from_secs(60),
    };

    /// Stitching as the recorder drives it — this module's keys over the session state a
    /// sidecar keeps (SQLite in memory here; Redis and the shared file behave the same, as
    /// `datapool/tests/sessions.rs` shows) — with a clock the test moves.
    struct Stitcher {
        sessions: LocalSessions,
        runtime: tokio::runtime::Runtime,
        now: UnixMs,
    }

    impl Stitcher {
        fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
            self.runtime.block_on(f)
        }

        fn lookup(&self, tenant: &TenantId, history: &[Value]) -> Lookup {
            let keys = RequestKeys::of(tenant, history);
            let join = Join {
                tenant: tenant.clone(),
                anchor: Anchor::Prefixes(keys.prefixes()),
                call: None,
                open: TrajectoryId::new(),
                now: self.now,
            };
            let joined = self.run(self.sessions.join(&join, TIMING)).unwrap();
            match Continuation::of(&joined) {
                Some(c) => Lookup::Continues(c),
                None if joined.ambiguous => Lookup::Ambiguous,
                None => Lookup::New,
            }
        }

        fn remember(
            &mut self,
            tenant: &TenantId,
            t: &TrajectoryId,
            request: &[Value],
            reply: &Value,
        ) {
            let step = StepId::new();
            let join = Join {
                tenant: tenant.clone(),
                anchor: Anchor::Trajectory(*t),
                call: Some(step),
                open: *t,
                now: self.now,
            };
            self.run(self.sessions.join(&join, TIMING)).unwrap();
            let done = StepDone {
                tenant: tenant.clone(),
                answered: true,
                trajectory: *t,
                step,
                covered: request.len() as u32 + 1,
                keys: CallKeys::of(tenant, request, reply).stitch_keys(),
                finish: None,
                now: self.now,
            };
            self.run(self.sessions.step_done(&done, TIMING)).unwrap();
        }

        fn forget(&mut self, tenant: &TenantId, t: &TrajectoryId) {
            let now = self.now;
            self.run(
                self.sessions
                    .finish(tenant, t, CompletionReason::Handshake, now, TIMING),
            )
            .unwrap();
        }
    }

    /// An OpenClaw session against vLLM (reasoning, parallel tool calls, `chatcmpl-tool-` ids).
    const OPENCLAW_CHAT: &str = include_str!("testdata/openclaw_chat.json");
    /// A Responses-API agent's `input` (reasoning, function_call, function_call_output items).
    const RESPONSES_INPUT: &str = include_str!("testdata/responses_input.json");

    fn fixture(text: &str) -> Vec<Value> {
        serde_json::from_str(text).unwrap()
    }

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    fn stitcher() -> Stitcher {
        Stitcher {
            sessions: LocalSessions::in_memory().unwrap(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            now: UnixMs::now(),
        }
    }

    fn assistant_side(item: &Value) -> bool {
        item["role"] == "assistant"
            || matches!(item["type"].as_str(), Some("function_call" | "reasoning"))
    }

    /// The model calls of a finished history: `(start, end)` of each reply, so the call sent
    /// `history[..start]` and got `history[start..end]` back.
    fn calls(history: &[Value]) -> Vec<(usize, usize)> {
        let mut calls = Vec::new();
        let mut i = 0;
        while i < history.len() {
            if assistant_side(&history[i]) {
                let start = i;
                while i < history.len() && assistant_side(&history[i]) {
                    i += 1;
                }
                calls.push((start, i));
            } else {
                i += 1;
            }
        }
        calls
    }

    /// The reply as the recorder stores it: a chat reply as `AssistantOutput` (no role, reasoning
    /// kept), a Responses reply as its output items.
    fn recorded(reply: &[Value]) -> Value {
        match reply {
            [message] if message.get("type").is_none() => {
                let mut out = Map::new();
                for field in ["content", "reasoning_content", "tool_calls"] {
                    if let Some(value) = message.get(field) {
                        out.insert(field.into(), value.clone());
                    }
                }
                Value::Object(out)
            }
            items => Value::Array(items.to_vec()),
        }
    }

    /// One call of a played session.
    struct Played {
        lookup: Lookup,
        trajectory: TrajectoryId,
        request: Vec<Value>,
    }

    /// Plays a session call by call: `client` builds what the client sends for call `k` from the
    /// history so far (re-serialising it its own way); the stitcher looks the call up, the call
    /// joins the trajectory found or a new one, and the engine's reply is remembered.
    fn play(
        stitcher: &mut Stitcher,
        tenant: &TenantId,
        history: &[Value],
        client: impl Fn(usize, &[Value]) -> Vec<Value>,
    ) -> Vec<Played> {
        calls(history)
            .into_iter()
            .enumerate()
            .map(|(k, (start, end))| {
                let request = client(k, &history[..start]);
                let lookup = stitcher.lookup(tenant, &request);
                let trajectory = match &lookup {
                    Lookup::Continues(c) => c.trajectory,
                    Lookup::New | Lookup::Ambiguous => TrajectoryId::new(),
                };
                stitcher.remember(
                    tenant,
                    &trajectory,
                    &request,
                    &recorded(&history[start..end]),
                );
                Played {
                    lookup,
                    trajectory,
                    request,
                }
            })
            .collect()
    }

    /// Every call after the first continued the first call's trajectory, each right after the
    /// previous reply, with the messages in between as the next state.
    fn assert_one_trajectory(history: &[Value], played: &[Played]) {
        let calls = calls(history);
        assert!(calls.len() > 2, "the fixture has several calls");
        assert_eq!(played[0].lookup, Lookup::New);
        for (k, call) in played.iter().enumerate().skip(1) {
            let Lookup::Continues(c) = &call.lookup else {
                panic!("call {k} did not continue: {:?}", call.lookup);
            };
            assert_eq!(c.trajectory, played[0].trajectory, "call {k}");
            let (previous_end, start) = (calls[k - 1].1, calls[k].0);
            assert_eq!(c.previous_len, previous_end, "call {k}");
            assert_eq!(
                c.next_state(&call.request),
                &call.request[previous_end..start]
            );
        }
    }

    fn map_items(history: &[Value], f: impl Fn(&mut Map<String, Value>)) -> Vec<Value> {
        let mut history = history.to_vec();
        for item in &mut history {
            if let Value::Object(fields) = item {
                f(fields);
            }
        }
        history
    }

    /// JSON as Python's `json.dumps` writes it: `\u` escapes, spaces after separators; and the
    /// keys in reverse order, as a client that rebuilds objects might.
    fn python_dumps(value: &Value) -> String {
        match value {
            Value::Object(fields) => {
                let entries: Vec<String> = fields
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{}: {}", python_dumps(&json!(k)), python_dumps(v)))
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(python_dumps).collect();
                format!("[{}]", items.join(", "))
            }
            Value::String(s) => {
                let escaped = serde_json::to_string(s).unwrap();
                escaped
                    .chars()
                    .map(|c| {
                        if c.is_ascii() {
                            c.to_string()
                        } else {
                            format!("\\u{:04x}", c as u32)
                        }
                    })
                    .collect()
            }
            other => other.to_string(),
        }
    }

    fn reencode(arguments: &mut Value) {
        let parsed: Value = serde_json::from_str(arguments.as_str().unwrap()).unwrap();
        *arguments = json!(format!(" {} ", python_dumps(&parsed)));
    }

    fn reencode_arguments(history: &[Value]) -> Vec<Value> {
        map_items(history, |item| {
            if let Some(Value::Array(calls)) = item.get_mut("tool_calls") {
                for call in calls {
                    reencode(&mut call["function"]["arguments"]);
                }
            }
            if let Some(arguments) = item.get_mut("arguments") {
                reencode(arguments);
            }
        })
    }

    fn strip_ids(id: &mut Value) {
        let stripped: String = id
            .as_str()
            .unwrap()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        *id = json!(stripped);
    }

    fn normalise_ids(history: &[Value]) -> Vec<Value> {
        map_items(history, |item| {
            if let Some(Value::Array(calls)) = item.get_mut("tool_calls") {
                calls.iter_mut().for_each(|call| strip_ids(&mut call["id"]));
            }
            for field in ["tool_call_id", "call_id"] {
                if let Some(id) = item.get_mut(field) {
                    strip_ids(id);
                }
            }
        })
    }

    fn content_as_parts(history: &[Value]) -> Vec<Value> {
        map_items(history, |item| {
            if let Some(Value::String(text)) = item.get("content") {
                if !text.is_empty() {
                    let parts = json!([{"type": "text", "text": text}]);
                    item.insert("content".into(), parts);
                }
            }
        })
    }

    /// What SDKs do to assistant messages: `content: null` dropped or sent as `""`, `refusal`,
    /// `tool_calls: []` and `name: null` added, reasoning dropped.
    fn sdk_nulls(history: &[Value]) -> Vec<Value> {
        map_items(history, |item| {
            if item["role"] == "assistant" {
                match item.get("content") {
                    Some(Value::Null) => {
                        item.remove("content");
                    }
                    Some(Value::String(s)) if s.is_empty() => {
                        item.insert("content".into(), Value::Null);
                    }
                    _ => {}
                }
                item.insert("refusal".into(), Value::Null);
                item.entry("tool_calls").or_insert(json!([]));
                item.remove("reasoning_content");
            }
            item.insert("name".into(), Value::Null);
        })
    }

    fn reminder(k: usize) -> Value {
        json!({"role": "user", "content": format!(
            "<system-reminder>Current time: 2026-11-28 10:0{k} UTC. Open files: src/parser.rs</system-reminder>"
        )})
    }

    #[test]
    fn a_history_of_many_turns_is_looked_up_by_its_last_ones_only() {
        let history: Vec<Value> = (0..10_000)
            .flat_map(|i| {
                [
                    json!({"role": "user", "content": format!("q{i}")}),
                    json!({"role": "assistant", "content": format!("a{i}")}),
                ]
            })
            .collect();
        let keys = RequestKeys::of(&tenant("a"), &history);
        let prefixes = keys.prefixes();
        assert_eq!(prefixes.len(), MAX_PREFIXES);
        // The longest last, ending at the history's end.
        assert_eq!(prefixes.last().map(|p| p.end), Some(20_000));
        assert!(prefixes.windows(2).all(|w| w[0].end < w[1].end));
    }

    #[test]
    fn a_tool_session_sent_verbatim_is_one_trajectory() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| h.to_vec());
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn re_encoded_tool_call_arguments_still_join() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| {
            reencode_arguments(h)
        });
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn normalised_tool_call_ids_still_join() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| {
            normalise_ids(h)
        });
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn content_sent_back_as_text_parts_still_joins() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| {
            content_as_parts(h)
        });
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn null_empty_and_absent_fields_and_dropped_reasoning_still_join() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| sdk_nulls(h));
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn every_re_serialisation_at_once_still_joins() {
        let history = fixture(OPENCLAW_CHAT);
        let client =
            |_, h: &[Value]| sdk_nulls(&content_as_parts(&normalise_ids(&reencode_arguments(h))));
        let played = play(&mut stitcher(), &tenant("a"), &history, client);
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn a_context_message_rebuilt_after_every_turn_joins_and_stays_out_of_the_next_state() {
        let history = fixture(OPENCLAW_CHAT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |k, h| {
            let mut request = h.to_vec();
            request.push(reminder(k));
            request
        });
        assert_one_trajectory(&history, &played);
        // The second call: [system, user, R, tool, reminder'] continues after R; the next state is
        // the tool result alone.
        let Lookup::Continues(c) = &played[1].lookup else {
            panic!("{:?}", played[1].lookup)
        };
        assert!(c.context_rebuilt);
        assert_eq!(c.next_state(&played[1].request), &history[3..4]);
    }

    #[test]
    fn a_context_message_kept_in_the_history_joins_too() {
        let history = fixture(OPENCLAW_CHAT);
        // This client keeps every reminder: history so far with each call's reminder in place.
        let mut sent: Vec<Value> = Vec::new();
        let mut stitcher = stitcher();
        let mut trajectory = None;
        for (k, (start, end)) in calls(&history).into_iter().enumerate() {
            let previous_end = if k == 0 { 0 } else { calls(&history)[k - 1].1 };
            sent.extend_from_slice(&history[previous_end..start]);
            sent.push(reminder(k));
            let lookup = stitcher.lookup(&tenant("a"), &sent);
            let t = match (k, lookup) {
                (0, Lookup::New) => TrajectoryId::new(),
                (_, Lookup::Continues(c)) => {
                    assert_eq!(Some(c.trajectory), trajectory);
                    assert!(!c.context_rebuilt);
                    c.trajectory
                }
                (k, other) => panic!("call {k}: {other:?}"),
            };
            trajectory = Some(t);
            stitcher.remember(&tenant("a"), &t, &sent, &recorded(&history[start..end]));
            sent.extend_from_slice(&history[start..end]);
        }
    }

    #[test]
    fn a_rebuilt_context_message_is_left_out_of_the_next_state_only_when_there_is_one() {
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        let (system, question) = (
            json!({"role": "system", "content": "You are terse."}),
            json!({"role": "user", "content": "Name a prime."}),
        );
        let answer = json!({"role": "assistant", "content": "7"});
        let follow_up = json!({"role": "user", "content": "A bigger one?"});
        stitcher.remember(
            &tenant("a"),
            &t,
            &[system.clone(), question.clone(), reminder(0)],
            &answer,
        );
        let with_context = [
            system.clone(),
            question.clone(),
            answer.clone(),
            follow_up.clone(),
            reminder(1),
        ];
        let without = [system, question, answer, follow_up.clone()];
        for request in [&with_context[..], &without[..]] {
            let Lookup::Continues(c) = stitcher.lookup(&tenant("a"), request) else {
                panic!("not joined: {request:?}")
            };
            assert_eq!(
                (c.trajectory, c.previous_len, c.context_rebuilt),
                (t, 3, true)
            );
            assert_eq!(c.next_state(request), std::slice::from_ref(&follow_up));
        }
    }

    #[test]
    fn an_empty_reply_is_remembered_as_an_empty_assistant_turn_not_as_the_request() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        stitcher.remember(&tenant("a"), &t, &history[..4], &json!([]));
        // Without the empty turn, the key would be history[..3], matched by any continuation.
        assert_eq!(stitcher.lookup(&tenant("a"), &history[..6]), Lookup::New);
        let mut next = history[..4].to_vec();
        next.extend([
            json!({"role": "assistant", "content": ""}),
            json!({"role": "user", "content": "?"}),
        ]);
        assert!(
            matches!(stitcher.lookup(&tenant("a"), &next), Lookup::Continues(c) if c.trajectory == t)
        );
    }

    #[test]
    fn the_longest_matching_history_decides_between_two_trajectories() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let (short, long) = (TrajectoryId::new(), TrajectoryId::new());
        // `long` went on from where `short` stopped (say it was opened with an explicit id).
        stitcher.remember(
            &tenant("a"),
            &short,
            &history[..2],
            &recorded(&history[2..3]),
        );
        stitcher.remember(
            &tenant("a"),
            &long,
            &history[..4],
            &recorded(&history[4..5]),
        );
        let Lookup::Continues(c) = stitcher.lookup(&tenant("a"), &history[..6]) else {
            panic!("not joined")
        };
        assert_eq!((c.trajectory, c.previous_len), (long, 5));
    }

    #[test]
    fn a_responses_api_history_is_one_trajectory_even_re_encoded() {
        let history = fixture(RESPONSES_INPUT);
        let played = play(&mut stitcher(), &tenant("a"), &history, |_, h| h.to_vec());
        assert_one_trajectory(&history, &played);
        let client = |_, h: &[Value]| normalise_ids(&reencode_arguments(h));
        let played = play(&mut stitcher(), &tenant("a"), &history, client);
        assert_one_trajectory(&history, &played);
    }

    #[test]
    fn a_responses_reply_continues_when_the_client_replays_it_as_chat_messages() {
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        let request = [json!({"type": "message", "role": "user", "content": "How many files?"})];
        let reply = json!([
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a1", "name": "shell",
             "arguments": "{\"command\":[\"ls\"]}"}
        ]);
        stitcher.remember(&tenant("a"), &t, &request, &reply);
        let next = [
            json!({"role": "user", "content": "How many files?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_a1", "type": "function",
                   "function": {"name": "shell", "arguments": "{\"command\": [\"ls\"]}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_a1", "content": "a b c"}),
        ];
        let Lookup::Continues(c) = stitcher.lookup(&tenant("a"), &next) else {
            panic!("not joined")
        };
        assert_eq!((c.trajectory, c.previous_len), (t, 2));
    }

    /// A second rollout of the OpenClaw task: same system prompt and first user message, its own
    /// engine-issued tool-call ids and a different first tool call.
    fn look_alike(history: &[Value]) -> Vec<Value> {
        let reissue = |id: &mut Value| *id = json!(format!("b-{}", id.as_str().unwrap()));
        let mut other = map_items(history, |item| {
            if let Some(Value::Array(calls)) = item.get_mut("tool_calls") {
                calls.iter_mut().for_each(|call| reissue(&mut call["id"]));
            }
            if let Some(id) = item.get_mut("tool_call_id") {
                reissue(id);
            }
        });
        other[2]["tool_calls"][0]["function"]["arguments"] = json!("{\"path\": \"src/lib.rs\"}");
        other
    }

    #[test]
    fn look_alike_sessions_played_side_by_side_never_join_each_other() {
        let a = fixture(OPENCLAW_CHAT);
        let b = look_alike(&a);
        assert_eq!(a[..2], b[..2]);
        let mut stitcher = stitcher();
        let sessions = [(&a, calls(&a)), (&b, calls(&b))];
        let mut trajectories: [Option<TrajectoryId>; 2] = [None, None];
        for k in 0..sessions[0].1.len() {
            for (me, (history, calls)) in sessions.iter().enumerate() {
                let (start, end) = calls[k];
                let request = &history[..start];
                let t = match stitcher.lookup(&tenant("a"), request) {
                    Lookup::Continues(c) => {
                        assert_eq!(Some(c.trajectory), trajectories[me], "call {k} of {me}");
                        assert_ne!(Some(c.trajectory), trajectories[1 - me]);
                        c.trajectory
                    }
                    other => {
                        assert_eq!((k, &other), (0, &Lookup::New));
                        TrajectoryId::new()
                    }
                };
                trajectories[me] = Some(t);
                stitcher.remember(&tenant("a"), &t, request, &recorded(&history[start..end]));
            }
        }
    }

    #[test]
    fn sessions_that_share_replies_but_differ_in_a_later_turn_never_join_each_other() {
        let a = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let played_a = play(&mut stitcher, &tenant("a"), &a, |_, h| h.to_vec());
        // B asked something else after the fix: history up to the first answer, then its own turn.
        let mut b = a[..12].to_vec();
        b.push(json!({"role": "user", "content": "Now also handle unbalanced brackets."}));
        let lookup = stitcher.lookup(&tenant("a"), &b);
        assert_eq!(
            lookup,
            Lookup::New,
            "A moved on from that reply, B must not join A"
        );
        assert!(played_a
            .iter()
            .all(|p| p.trajectory == played_a[0].trajectory));
    }

    #[test]
    fn a_history_that_matches_only_a_strict_prefix_does_not_join() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        // Call 2 of the session sent [..4] and got history[4] back.
        stitcher.remember(&tenant("a"), &t, &history[..4], &recorded(&history[4..5]));
        let lookup = |request: &[Value]| stitcher.lookup(&tenant("a"), request);
        // The same call again (a retry): it does not contain the reply.
        assert_eq!(lookup(&history[..4]), Lookup::New);
        // The previous messages without the reply, plus something else.
        let mut no_reply = history[..4].to_vec();
        no_reply.push(json!({"role": "user", "content": "continue"}));
        assert_eq!(lookup(&no_reply), Lookup::New);
        // A different reply in its place.
        let mut other_reply = history[..6].to_vec();
        other_reply[4]["tool_calls"][0]["function"]["arguments"] =
            json!("{\"command\": \"cargo test\"}");
        assert_eq!(lookup(&other_reply), Lookup::New);
        // A message missing before the reply.
        let mut gap = history[..6].to_vec();
        gap.remove(3);
        assert_eq!(lookup(&gap), Lookup::New);
        // The real continuation joins.
        assert!(matches!(lookup(&history[..6]), Lookup::Continues(c) if c.trajectory == t));
    }

    #[test]
    fn a_history_that_branches_from_an_older_reply_starts_a_new_trajectory() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        play(&mut stitcher, &tenant("a"), &history[..8], |_, h| {
            h.to_vec()
        });
        // The trajectory moved past reply 2 (history[4]); an edited history that goes on from
        // reply 2 differently is another trajectory.
        let mut branch = history[..5].to_vec();
        branch.push(
            json!({"role": "tool", "tool_call_id": "chatcmpl-tool-9b1d0e7c55aa4f02b3d4",
                           "content": "error: could not compile `tinyparse`"}),
        );
        assert_eq!(stitcher.lookup(&tenant("a"), &branch), Lookup::New);
    }

    #[test]
    fn a_new_session_that_starts_like_another_sessions_reply_does_not_join_it() {
        let mut stitcher = stitcher();
        let system = json!({"role": "system", "content": "You are a helpful assistant."});
        let greeting = json!({"role": "assistant", "content": "Hello! How can I help you today?"});
        let t = TrajectoryId::new();
        stitcher.remember(
            &tenant("a"),
            &t,
            &[system.clone(), json!({"role": "user", "content": "hi"})],
            &greeting,
        );
        // An app that seeds its conversations with the same greeting.
        let seeded = [
            system,
            greeting,
            json!({"role": "user", "content": "Book a flight to Oslo."}),
        ];
        assert_eq!(stitcher.lookup(&tenant("a"), &seeded), Lookup::New);
    }

    #[test]
    fn another_tenants_continuation_never_joins() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        stitcher.remember(&tenant("a"), &t, &history[..2], &recorded(&history[2..3]));
        assert_eq!(stitcher.lookup(&tenant("b"), &history[..4]), Lookup::New);
        // Nor can another tenant make it forget.
        stitcher.forget(&tenant("b"), &t);
        assert!(
            matches!(stitcher.lookup(&tenant("a"), &history[..4]), Lookup::Continues(c) if c.trajectory == t)
        );
        stitcher.forget(&tenant("a"), &t);
        assert_eq!(stitcher.lookup(&tenant("a"), &history[..4]), Lookup::New);
    }

    #[test]
    fn identical_rollouts_are_ambiguous_until_they_diverge() {
        let mut stitcher = stitcher();
        let request = [
            json!({"role": "system", "content": "Solve the puzzle. Answer with one word."}),
            json!({"role": "user", "content": "What has keys but opens no locks?"}),
        ];
        let reply = json!({"role": "assistant", "content": "A piano."});
        let rollouts: Vec<TrajectoryId> = (0..3).map(|_| TrajectoryId::new()).collect();
        for t in &rollouts {
            assert_eq!(stitcher.lookup(&tenant("a"), &request), Lookup::New);
            stitcher.remember(&tenant("a"), t, &request, &reply);
        }
        let mut next = request.to_vec();
        next.push(reply.clone());
        next.push(json!({"role": "user", "content": "Correct. Another one?"}));
        assert_eq!(stitcher.lookup(&tenant("a"), &next), Lookup::Ambiguous);
        // Two rollouts move on (as new trajectories) and the last one stays: still ambiguous,
        // since which one is left is not kept.
        stitcher.forget(&tenant("a"), &rollouts[0]);
        stitcher.forget(&tenant("a"), &rollouts[1]);
        assert_eq!(stitcher.lookup(&tenant("a"), &next), Lookup::Ambiguous);
        stitcher.forget(&tenant("a"), &rollouts[2]);
        assert_eq!(stitcher.lookup(&tenant("a"), &next), Lookup::New);
    }

    #[test]
    fn rollouts_whose_replies_differ_only_in_tool_call_ids_each_join_their_own() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let reply = |id: &str| {
            let mut reply = recorded(&history[2..3]);
            reply["tool_calls"][0]["id"] = json!(id);
            reply
        };
        let (a, b) = (TrajectoryId::new(), TrajectoryId::new());
        stitcher.remember(&tenant("a"), &a, &history[..2], &reply("chatcmpl-tool-aaa"));
        stitcher.remember(&tenant("a"), &b, &history[..2], &reply("chatcmpl-tool-bbb"));
        for (t, id) in [(a, "chatcmpl-tool-aaa"), (b, "chatcmpl-tool-bbb")] {
            let mut next = history[..4].to_vec();
            next[2]["tool_calls"][0]["id"] = json!(id);
            next[3]["tool_call_id"] = json!(id);
            assert!(
                matches!(stitcher.lookup(&tenant("a"), &next), Lookup::Continues(c) if c.trajectory == t)
            );
        }
    }

    #[test]
    fn a_trajectory_idle_for_the_ttl_can_no_longer_be_joined() {
        let history = fixture(OPENCLAW_CHAT);
        let mut stitcher = stitcher();
        let t = TrajectoryId::new();
        stitcher.remember(&tenant("a"), &t, &history[..2], &recorded(&history[2..3]));
        let idle = TIMING.idle.as_millis() as u64;
        // Just within the idle time: joined (and the call counts as activity).
        stitcher.now = UnixMs(stitcher.now.0 + idle);
        assert!(matches!(
            stitcher.lookup(&tenant("a"), &history[..4]),
            Lookup::Continues(_)
        ));
        stitcher.now = UnixMs(stitcher.now.0 + idle + 1);
        assert_eq!(stitcher.lookup(&tenant("a"), &history[..4]), Lookup::New);
    }
}
