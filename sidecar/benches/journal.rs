//! What the journal adds to the end of a recorded response: the call's step serialised (once: the
//! datapool stores the same bytes), its record put together and appended (page cache, no fsync)
//! before the relay lets the agent see the end of its answer —
//! for the load harness's call (a 4 kB request with 3 tools, a 1 kB answer of 256 engine token
//! ids with a logprob each, the previous step's next state) and for a long agent session
//! (40 kB of history). Criterion's mean, and p50 / p99 / max over 20 000 appends printed beside
//! it (the aim: under 0.1 ms at p99 for the former).

use std::hint::black_box;
use std::time::Instant;

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{EncodedStep, Step, TenantId, WriteOp};
use clawback_sidecar::data_plane::recorder::journal::{self, Journal};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;

/// One call's writes: the previous step's next state and the step, its history padded to about
/// `history` bytes.
fn call(history: usize) -> (WriteOp, Step) {
    let tenant = TenantId::new("bench").unwrap_or_else(|e| panic!("{e}"));
    let example = tool_use_trajectory(tenant.clone());
    let mut step = example.steps[0].clone();
    step.request.tools = (0..3)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": "Reads a file of the repository and returns its lines.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                "limit": {"type": "integer"}}, "required": ["path"]}}})
        })
        .collect();
    let mut i = 0;
    while serde_json::to_vec(&step.request).map_or(0, |v| v.len()) < history {
        step.request.messages.push(json!({"role": "user", "content":
            format!("Step {i}: look at src/module_{i}.rs and tell me what parse() returns.")}));
        i += 1;
    }
    step.output.content = Some("The parser returns a Node tree; ".repeat(32));
    if let clawback_datapool::Tokens::Engine(tokens) = &mut step.tokens {
        let n = 256;
        tokens.completion_token_ids = (0..n).map(|i| 1000 + i).collect();
        tokens.completion_logprobs = (0..n)
            .map(|i| clawback_datapool::TokenLogprob {
                token: format!("tok{i}"),
                logprob: -0.01 * f64::from(i),
                bytes: Some(format!("tok{i}").into_bytes()),
                top_logprobs: Vec::new(),
            })
            .collect();
    }
    let next_state = clawback_datapool::NextState {
        messages: vec![json!({"role": "tool", "tool_call_id": "call_1", "content": "18 C"})],
        observed_at: clawback_datapool::UnixMs::now(),
    };
    let next_state = WriteOp::SetNextState {
        tenant,
        trajectory: step.trajectory,
        step: step.id,
        next_state,
    };
    (next_state, step)
}

/// The call's record as the recorder journals it, its step serialised.
fn record(next_state: &WriteOp, step: &Step) -> Vec<WriteOp> {
    let step = EncodedStep::encode(step).unwrap_or_else(|e| panic!("{e}"));
    vec![
        next_state.clone(),
        WriteOp::AppendSteps { steps: vec![step] },
    ]
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let journal = Journal::open(dir.path(), false).unwrap_or_else(|e| panic!("{e}"));
    // The writer empties an applied journal past its size; here, outside the timed part.
    let rotate = |journal: &Journal| {
        let end = journal.end();
        if end.end >= journal::ROTATE_BYTES {
            let _ = journal.rotate_if_applied(end.epoch, end.end);
        }
    };
    let mut group = c.benchmark_group("journal: one call's record, appended");
    for (name, history) in [("4 kB request", 4 << 10), ("40 kB history", 40 << 10)] {
        let (next_state, step) = call(history);
        let bytes = journal::encode(&record(&next_state, &step)).map_or(0, |v| v.len());
        let label = format!("{name} ({} kB record)", bytes / 1024);
        group.bench_function(label.as_str(), |b| {
            b.iter_custom(|iterations| {
                let mut spent = std::time::Duration::ZERO;
                for _ in 0..iterations {
                    let started = Instant::now();
                    let ops = record(&next_state, black_box(&step));
                    let _ = black_box(journal.append(&ops));
                    spent += started.elapsed();
                    rotate(&journal);
                }
                spent
            })
        });
        group.bench_function(format!("{name}: serialise only").as_str(), |b| {
            b.iter(|| journal::encode(&record(&next_state, black_box(&step))))
        });
        let mut times: Vec<u64> = (0..20_000)
            .map(|_| {
                let started = Instant::now();
                let _ = black_box(journal.append(&record(&next_state, &step)));
                let spent = started.elapsed().as_nanos() as u64;
                rotate(&journal);
                spent
            })
            .collect();
        times.sort_unstable();
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
        println!(
            "journal append, {label}, over {} calls: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            times.len(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
