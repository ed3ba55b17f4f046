//! Session stitching on the request path: hashing a 40 kB OpenClaw-like tool session (12 tools)
//! for a lookup, the keys a recorded call leaves, and what the shared session state costs a call
//! — its two operations (join before forwarding, step_done before the end of the answer) among
//! 10k live trajectories, on the embedded SQLite file and on Redis (127.0.0.1:6379, or
//! `CLAWBACK_BENCH_REDIS`; skipped when none answers) — and, for scale, parsing the same messages
//! from JSON. Hashing runs on every call without a session id, so it must stay well under 50 µs.

use std::hint::black_box;

use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{
    Anchor, Join, LocalSessions, RedisConfig, RedisStore, Sessions, StepDone, StepId, TenantId,
    Timing, TrajectoryId, UnixMs,
};
use clawback_sidecar::data_plane::session::{CallKeys, Continuation, RequestKeys};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

/// The recorded OpenClaw session the tests use: its system prompt and first turns open the history.
const OPENCLAW_CHAT: &str = include_str!("../src/data_plane/session/testdata/openclaw_chat.json");

const TOOLS: [&str; 12] = [
    "read",
    "write",
    "edit",
    "exec",
    "process",
    "web_search",
    "web_fetch",
    "browser",
    "memory_search",
    "memory_get",
    "sessions_send",
    "image",
];

/// A tool loop of about `bytes` of JSON: the fixture's opening, then rounds of one assistant call
/// to each of the 12 tools in turn (vLLM ids, reasoning, JSON arguments) and its result.
fn history(bytes: usize) -> Vec<Value> {
    let mut history: Vec<Value> = serde_json::from_str(OPENCLAW_CHAT).unwrap_or_default();
    let mut size: usize = history.iter().map(|m| m.to_string().len()).sum();
    let mut n = 0;
    while size < bytes {
        let tool = TOOLS[n % TOOLS.len()];
        let id = format!("chatcmpl-tool-{n:08x}9b1d0e7c55aa4f02");
        let arguments = json!({
            "path": format!("src/module_{n}.rs"),
            "command": format!("cargo test -p tinyparse module_{n} -- --nocapture"),
            "limit": 200,
            "query": "where is the nested list parser \u{2192} stack",
        });
        let call = json!({
            "role": "assistant",
            "content": null,
            "reasoning_content": format!("Next I use {tool} to check module {n}."),
            "tool_calls": [{"id": id, "type": "function",
                            "function": {"name": tool, "arguments": arguments.to_string()}}],
        });
        let result = json!({
            "role": "tool",
            "tool_call_id": id,
            "content": format!("{tool} ok: module_{n}\n{}", "fn parse(input: &str) -> Node { todo!() }\n".repeat(4)),
        });
        size += call.to_string().len() + result.to_string().len();
        history.extend([call, result]);
        n += 1;
    }
    history
}

const TIMING: Timing = Timing {
    idle: Duration::from_secs(600),
    stale_call: Duration::from_secs(3600),
    completion_lease: Duration::from_secs(60),
};

/// One call of a session through `sessions`: join by its prefixes, then its step done with
/// its keys. Returns the trajectory it joined.
async fn one_call(
    sessions: &dyn Sessions,
    tenant: &TenantId,
    request: &RequestKeys,
    keys: &CallKeys,
) -> TrajectoryId {
    let step = StepId::new();
    let join = Join {
        tenant: tenant.clone(),
        anchor: Anchor::Prefixes(request.prefixes()),
        call: Some(step),
        open: TrajectoryId::new(),
        now: UnixMs::now(),
    };
    let joined = sessions
        .join(&join, TIMING)
        .await
        .unwrap_or_else(|e| panic!("join: {e}"));
    let done = StepDone {
        tenant: tenant.clone(),
        answered: true,
        trajectory: joined.trajectory,
        step,
        covered: 1,
        keys: keys.stitch_keys(),
        finish: None,
        now: UnixMs::now(),
    };
    sessions
        .step_done(&done, TIMING)
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    joined.trajectory
}

/// `sessions` with 10k live one-call trajectories, and one that the bench's call continues.
fn loaded(
    runtime: &tokio::runtime::Runtime,
    sessions: &dyn Sessions,
    tenant: &TenantId,
    request: &RequestKeys,
    keys: &CallKeys,
) {
    runtime.block_on(async {
        for i in 0..10_000 {
            let other = [json!({"role": "user", "content": format!("task {i}")})];
            let keys = CallKeys::of(tenant, &other, &json!({"content": "ok"}));
            one_call(sessions, tenant, &RequestKeys::of(tenant, &[]), &keys).await;
        }
        let first = one_call(sessions, tenant, &RequestKeys::of(tenant, &[]), keys).await;
        let next = Join {
            tenant: tenant.clone(),
            anchor: Anchor::Prefixes(request.prefixes()),
            call: None,
            open: TrajectoryId::new(),
            now: UnixMs::now(),
        };
        let joined = sessions
            .join(&next, TIMING)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            Continuation::of(&joined).is_some_and(|c| c.trajectory == first),
            "the bench's call continues its session"
        );
    });
}

fn bench(c: &mut Criterion) {
    let history = history(40 * 1024);
    let size: usize = history.iter().map(|m| m.to_string().len()).sum();
    let tenant = TenantId::new("bench").unwrap_or_else(|e| panic!("{e}"));
    let (request, reply) = history.split_at(history.len() - 2);
    let (request, reply) = (request.to_vec(), reply[0].clone());
    let mut continuation = request.clone();
    continuation.extend_from_slice(&history[history.len() - 2..]);
    let request_keys = RequestKeys::of(&tenant, &continuation);
    let call_keys = CallKeys::of(&tenant, &request, &reply);

    let mut group = c.benchmark_group(format!(
        "stitch {} messages {} kB",
        continuation.len(),
        size / 1024
    ));
    group.bench_function("hash request prefixes", |b| {
        b.iter(|| RequestKeys::of(black_box(&tenant), black_box(&continuation)))
    });
    group.bench_function("keys of a recorded call", |b| {
        b.iter(|| CallKeys::of(black_box(&tenant), black_box(&request), black_box(&reply)))
    });
    // For scale: what the sidecar pays anyway to parse the same messages out of the request body.
    let body = serde_json::to_string(&continuation).unwrap_or_default();
    group.bench_function("reference: parse the messages from JSON", |b| {
        b.iter(|| serde_json::from_str::<Vec<Value>>(black_box(&body)).map(|m| m.len()))
    });
    group.finish();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut stores: Vec<(&str, Arc<dyn Sessions>)> = vec![(
        "sqlite file",
        Arc::new(
            LocalSessions::open(dir.path().join("sessions.sqlite3"))
                .unwrap_or_else(|e| panic!("{e}")),
        ),
    )];
    let url = std::env::var("CLAWBACK_BENCH_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = runtime.block_on(async {
        let store = RedisStore::connect(&RedisConfig::single(url)).await.ok()?;
        store.ping().await.ok().map(|()| store)
    });
    match redis {
        Some(redis) => stores.push(("redis", Arc::new(redis))),
        None => eprintln!("no Redis answers: its session state is not measured"),
    }
    let mut group = c.benchmark_group("session state per call (join + step_done, 10k live)");
    for (name, sessions) in stores {
        let tenant = TenantId::new(format!("bench-{}", uuid::Uuid::now_v7().simple()))
            .unwrap_or_else(|e| panic!("{e}"));
        let request_keys = RequestKeys::of(&tenant, &continuation);
        let call_keys = CallKeys::of(&tenant, &request, &reply);
        loaded(&runtime, &*sessions, &tenant, &request_keys, &call_keys);
        group.bench_function(name, |b| {
            b.to_async(&runtime)
                .iter(|| one_call(&*sessions, &tenant, &request_keys, &call_keys))
        });
    }
    group.finish();
    let _ = (request_keys, call_keys);
}

criterion_group!(benches, bench);
criterion_main!(benches);
