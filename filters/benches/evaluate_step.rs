//! Per-call latency of `evaluate-step` (the `tool_outcome` plugin, no judge) for steps of 2 kB,
//! 20 kB and 200 kB of conversation: the view is built, a fresh store instantiated from the
//! pre-instantiated component, the call made. Aim: ≤ 50 µs at 20 kB.
//! Needs the built plugins (`cd wasm-plugins && cargo build --release --target wasm32-wasip2`).
//!
//! A call that fails is counted and reported at the end instead of ending the run (its fuel is
//! counted in work, so none should: a failure here is the plugin's or the host's setup).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    eprintln!(
        "written pages kept between calls (PAGEMAP_SCAN): {}",
        clawback_filters::sandbox::keeps_written_pages()
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

    let mut failures = Vec::new();
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
        let (calls, failed, reason) = (AtomicU64::new(0), AtomicU64::new(0), Mutex::new(None));
        group.throughput(Throughput::Bytes((kb * 1000) as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}kB")),
            &step,
            |b, step| {
                b.to_async(&runtime).iter(|| async {
                    calls.fetch_add(1, Ordering::Relaxed);
                    let result = standalone
                        .run_step("bench", step, &next, &metadata)
                        .await
                        .result;
                    if let Err(failure) = &result {
                        failed.fetch_add(1, Ordering::Relaxed);
                        let mut reason = reason.lock().unwrap_or_else(|p| p.into_inner());
                        reason.get_or_insert_with(|| failure.reason.clone());
                    }
                    result.ok()
                });
            },
        );
        let failed = failed.into_inner();
        if failed > 0 {
            failures.push(format!(
                "{kb}kB: {failed} of {} calls failed (first: {})",
                calls.into_inner(),
                reason
                    .into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or_default()
            ));
        }
    }
    group.finish();
    for failure in failures {
        eprintln!("evaluate_step/{failure}");
    }
}

criterion_group!(benches, evaluate_step);
criterion_main!(benches);
