//! Hostile plugins, each next to a well-behaved one: whatever a plugin does — loop forever,
//! allocate without bound, trap, answer 8 MiB, call the judge 10,000 times — it is stopped,
//! its evaluation says why, and the other plugin's score still arrives. A plugin that keeps
//! failing is switched off. A plugin built against another world is refused at load. A plugin
//! that tries to keep data from one call for the next finds nothing.

mod support;

use std::time::Duration;

use clawback_datapool::{Evaluation, EvaluationSource, Verdict};
use clawback_filters::standalone::Standalone;
use clawback_filters::{FiltersConfig, LoadError};

use support::{fixture, host, judge_config, next_of, plugin_file, scripted_judge};

fn by(evaluations: &[Evaluation], plugin: &str) -> Verdict {
    evaluations
        .iter()
        .find(|e| matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == plugin))
        .map(|e| e.verdict.clone())
        .unwrap_or_else(|| panic!("an evaluation from {plugin}: {evaluations:#?}"))
}

/// Runs `hostile` beside `tool_outcome` on the first example step; returns the hostile one's
/// failure reason.
async fn failure_of(hostile: &str, tweak: impl FnOnce(&mut FiltersConfig)) -> String {
    let mut host = host(&[hostile, "tool_outcome"], tweak).await;
    let (trajectory, steps) = fixture();
    let evaluations = host
        .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
        .await;
    assert_eq!(
        by(&evaluations, "tool_outcome"),
        Verdict::Score {
            reward: Some(1.0),
            hint: None
        },
        "the well-behaved plugin is unaffected"
    );
    match by(&evaluations, hostile) {
        Verdict::FilterError { reason } => reason,
        other => panic!("{hostile} should fail, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_loop_is_stopped_when_its_fuel_runs_out() {
    let reason = failure_of("endless_loop", |c| c.fuel = 10_000_000).await;
    assert!(reason.starts_with("fuel:"), "{reason}");
    assert!(reason.contains("10000000 units"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_is_stopped_at_its_limit() {
    let reason = failure_of("memory_bomb", |c| c.memory_limit = 16 << 20).await;
    assert!(reason.starts_with("out of memory:"), "{reason}");
    assert!(reason.contains("16 MiB"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trap_is_recorded_with_the_plugins_panic_message() {
    let reason = failure_of("trap", |_| {}).await;
    assert!(reason.starts_with("trap:"), "{reason}");
    assert!(reason.contains("trap plugin refuses step 0"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_output_is_refused_not_stored() {
    let reason = failure_of("huge_output", |_| {}).await;
    assert!(reason.starts_with("invalid output:"), "{reason}");
    assert!(reason.contains("8388608 bytes"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_calling_the_judge_ten_thousand_times_is_held_to_its_budget() {
    let judge = scripted_judge(vec!["\\boxed{1}".to_owned()]).await;
    let reason = failure_of("judge_flood", |c| c.judge = Some(judge_config(&judge.url))).await;
    assert!(reason.starts_with("judge budget:"), "{reason}");
    // The budget (8 answers per evaluation) is all the judge ever saw.
    assert_eq!(judge.requests.load(std::sync::atomic::Ordering::SeqCst), 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_that_keeps_failing_is_switched_off() {
    let mut host = host(&["trap", "tool_outcome"], |c| {
        c.breaker.failures = 2;
        c.breaker.cooldown = Duration::from_secs(3600);
    })
    .await;
    let (trajectory, steps) = fixture();
    let mut trap_evaluations = 0;
    for _ in 0..4 {
        let evaluations = host
            .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
            .await;
        trap_evaluations += evaluations
            .iter()
            .filter(
                |e| matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == "trap"),
            )
            .count();
    }
    assert_eq!(
        trap_evaluations, 2,
        "two failures, then the breaker holds it off"
    );
    let mut registry = prometheus_client::registry::Registry::default();
    host.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("metrics encode");
    assert!(
        text.contains("filter_disabled{plugin=\"trap\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_built_against_another_world_is_refused_with_a_clear_message() {
    let result = Standalone::load(&plugin_file("other_world"), FiltersConfig::default()).await;
    let Err(clawback_filters::standalone::StandaloneError::Load(error)) = result else {
        panic!("the other world's plugin must be refused");
    };
    assert!(matches!(error, LoadError::WrongWorld { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("was built against a different world than clawback:filter/filter@0.1.0"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_a_call_leaves_behind_reaches_the_next_one() {
    // The pool recycles memory slots and keeps written pages mapped between calls; every call,
    // also four at once, must still start from the plugin's initial state.
    let plugin = std::sync::Arc::new(
        Standalone::load(&plugin_file("remember"), FiltersConfig::default())
            .await
            .expect("the remember plugin loads"),
    );
    let (_, steps) = fixture();
    for round in 0..20 {
        let calls: Vec<_> = (0..4)
            .map(|i| {
                let (plugin, step) = (std::sync::Arc::clone(&plugin), steps[0].clone());
                let metadata = serde_json::Map::from_iter([(
                    "secret".to_owned(),
                    serde_json::Value::String(format!("tenant-{round}-{i}")),
                )]);
                tokio::spawn(async move {
                    plugin
                        .run_step("acme", &step, &next_of(&step), &metadata)
                        .await
                        .result
                })
            })
            .collect();
        for call in calls {
            let evaluation = call
                .await
                .expect("the call's task")
                .expect("the remember plugin answers");
            let label = |key: &str| {
                evaluation
                    .labels
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| panic!("label {key}: {:?}", evaluation.labels))
            };
            assert_eq!(label("calls"), "1", "round {round}");
            assert_eq!(
                label("earlier"),
                "",
                "round {round}: an earlier secret leaked"
            );
            assert_eq!(
                label("dirty_bytes"),
                "0",
                "round {round}: a dirty heap leaked"
            );
        }
    }
}
