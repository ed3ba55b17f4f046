//! Session stitching on the request path: hashing a 40 kB OpenClaw-like tool session (12 tools)
//! for a lookup, the lookup itself among 10k live trajectories, the keys a recorded call leaves,
//! and, for scale, parsing the same messages from JSON. Stitching runs on every call without a
//! session id, so it must stay well under 50 µs.

use std::hint::black_box;

use clawback_datapool::{TenantId, TrajectoryId};
use clawback_sidecar::session::{CallKeys, Lookup, RequestKeys, StitchConfig, Stitcher};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

/// The recorded OpenClaw session the tests use: its system prompt and first turns open the history.
const OPENCLAW_CHAT: &str = include_str!("../src/session/testdata/openclaw_chat.json");

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

fn bench(c: &mut Criterion) {
    let history = history(40 * 1024);
    let size: usize = history.iter().map(|m| m.to_string().len()).sum();
    let tenant = TenantId::new("bench").unwrap_or_else(|e| panic!("{e}"));
    let (request, reply) = history.split_at(history.len() - 2);
    let (request, reply) = (request.to_vec(), reply[0].clone());
    let mut continuation = request.clone();
    continuation.extend_from_slice(&history[history.len() - 2..]);

    let mut stitcher = Stitcher::new(StitchConfig::default());
    for i in 0..10_000 {
        let other = [json!({"role": "user", "content": format!("task {i}")})];
        stitcher.remember(
            &tenant,
            &TrajectoryId::new(),
            &other,
            &json!({"content": "ok"}),
        );
    }
    let trajectory = TrajectoryId::new();
    stitcher.remember(&tenant, &trajectory, &request, &reply);
    assert!(matches!(
        stitcher.lookup(&tenant, &continuation),
        Lookup::Continues(c) if c.trajectory == trajectory
    ));

    let mut group = c.benchmark_group(format!(
        "stitch {} messages {} kB",
        continuation.len(),
        size / 1024
    ));
    group.bench_function("hash request prefixes", |b| {
        b.iter(|| RequestKeys::of(black_box(&tenant), black_box(&continuation)))
    });
    group.bench_function("lookup (hash + map)", |b| {
        b.iter(|| stitcher.lookup(black_box(&tenant), black_box(&continuation)))
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
