//! Sustained step writes into one Redis (`CLAWBACK_BENCH_REDIS`, default 127.0.0.1:6379): the
//! recorder's batch writer appending batches of 128 steps of about 4 kB and 64 kB, spread over 8
//! new trajectories per batch, with the tenant caps trimming as they would in production. The
//! steps come encoded, as the writer gets them (the recorder encodes a step once, when its call
//! ends); `encode_steps` times that encoding apart. Throughput is reported in steps/s. Aim:
//! ≥ 20k steps/s of 4 kB.

use std::time::Duration;

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{
    Caps, EncodedStep, RedisConfig, RedisStore, Step, StepId, Store, TenantId, TrajectoryId,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const BATCH: usize = 128;
const TRAJECTORIES_PER_BATCH: usize = 8;

fn redis_url() -> String {
    std::env::var("CLAWBACK_BENCH_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A step of about `size` bytes of JSON (the example's first step, reasoning padded).
fn template(tenant: &TenantId, size: usize) -> Step {
    let mut step = tool_use_trajectory(tenant.clone()).steps.remove(0);
    step.next_state = None;
    let base = serde_json::to_string(&step).map(|s| s.len()).unwrap_or(0);
    step.output.reasoning_content = Some("x".repeat(size.saturating_sub(base)));
    step
}

/// One batch as the recorder would hand it over: fresh ids, a few trajectories.
fn batch(template: &Step) -> Vec<Step> {
    let trajectories: Vec<TrajectoryId> = (0..TRAJECTORIES_PER_BATCH)
        .map(|_| TrajectoryId::new())
        .collect();
    (0..BATCH)
        .map(|i| {
            let mut s = template.clone();
            s.id = StepId::new();
            s.trajectory = trajectories[i % TRAJECTORIES_PER_BATCH];
            s.index = (i / TRAJECTORIES_PER_BATCH) as u32;
            s
        })
        .collect()
}

/// The steps as the recorder hands them to its writer.
fn encode(steps: &[Step]) -> Vec<EncodedStep> {
    steps
        .iter()
        .map(|s| EncodedStep::encode(s).unwrap_or_else(|e| panic!("encode: {e}")))
        .collect()
}

fn cleanup(tenant: &TenantId) {
    let Ok(client) = redis::Client::open(redis_url()) else {
        return;
    };
    let Ok(mut conn) = client.get_connection() else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("clawback:{{{tenant}}}:*"))
        .query(&mut conn)
        .unwrap_or_default();
    for chunk in keys.chunks(512) {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(chunk).query(&mut conn);
    }
    let _: redis::RedisResult<i64> = redis::cmd("SREM")
        .arg("clawback:tenants")
        .arg(tenant.as_str())
        .query(&mut conn);
}

fn step_writes(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let tenant = TenantId::new(format!("bench-{}", uuid::Uuid::now_v7().simple()))
        .unwrap_or_else(|e| panic!("{e}"));
    let config = RedisConfig {
        // Bounded so the 64 kB run cannot fill a shared Redis: trimming is part of the cost.
        caps: Caps {
            max_steps_per_tenant: 20_000,
            max_bytes_per_tenant: 256 << 20,
            ..Caps::default()
        },
        ..RedisConfig::single(redis_url())
    };
    let store = rt
        .block_on(RedisStore::connect(&config))
        .unwrap_or_else(|e| panic!("connect: {e}"));

    let sizes = [("4kB", 4 << 10), ("64kB", 64 << 10)];
    let mut group = c.benchmark_group("append_steps");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(BATCH as u64));
    for (label, size) in sizes {
        let template = template(&tenant, size);
        group.bench_with_input(BenchmarkId::new("steps", label), &template, |b, t| {
            b.to_async(&rt).iter_batched(
                || encode(&batch(t)),
                |steps| {
                    let store = &store;
                    async move {
                        store
                            .append_encoded_steps(&steps)
                            .await
                            .unwrap_or_else(|e| panic!("append: {e}"))
                    }
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    let mut group = c.benchmark_group("encode_steps");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (label, size) in sizes {
        let template = template(&tenant, size);
        group.bench_with_input(BenchmarkId::new("steps", label), &template, |b, t| {
            b.iter_batched(
                || batch(t),
                |steps| encode(&steps),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    cleanup(&tenant);
}

criterion_group!(benches, step_writes);
criterion_main!(benches);
