//! Per-call latency of `evaluate-step` (the `tool_outcome` plugin, no judge) for steps of 2 kB,
//! 20 kB and 200 kB of conversation: the view is built, a fresh store instantiated from the
//! pre-instantiated component, the call made and its answer checked. Aim: ≤ 50 µs at 20 kB.
//! Needs the built plugins (`cd wasm-plugins && cargo build --release --target wasm32-wasip2`).

use std::path::Path;

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::TenantId;
use clawback_filters::standalone::Standalone;
use clawback_filters::FiltersConfig;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;

fn evaluate_step(c: &mut Criterion) {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../wasm-plugins/target/wasm32-wasip2/release/tool_outcome.wasm");
    assert!(
        plugin.is_file(),
        "{} is missing: build the plugins first",
        plugin.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let standalone = runtime
        .block_on(Standalone::load(&plugin, FiltersConfig::default()))
        .expect("plugin loads");
    let record = tool_use_trajectory(TenantId::new("bench").expect("tenant"));
    let metadata = serde_json::Map::new();

    let mut group = c.benchmark_group("evaluate_step");
    for kb in [2usize, 20, 200] {
        let mut step = record.steps[0].clone();
        // Earlier turns of a conversation, 1 kB each, up to the size.
        let turn =
            "Earlier in this session the user asked about the build; the assistant ran the tests. "
                .repeat(12);
        while serde_json::to_vec(&step.request.messages).map_or(0, |v| v.len()) < kb * 1000 {
            step.request
                .messages
                .insert(1, json!({"role": "user", "content": turn.clone()}));
        }
        let next = step.next_state.clone().expect("fixture next state");
        group.throughput(Throughput::Bytes((kb * 1000) as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}kB")),
            &step,
            |b, step| {
                b.to_async(&runtime).iter(|| async {
                    standalone
                        .run_step("bench", step, &next, &metadata)
                        .await
                        .expect("tool_outcome scores")
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, evaluate_step);
criterion_main!(benches);
