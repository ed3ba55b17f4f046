//! Hot reload: a plugin file replaced while steps are being evaluated is swapped in atomically.
//! No step loses its evaluation, and each evaluation names the build that gave it.

mod support;

use std::collections::HashSet;

use clawback_datapool::{EvaluationSource, StepId};
use serde_json::json;

use support::{fixture, host, plugin_file};

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_swapped_under_load_loses_no_evaluation() {
    // One plugin file, "scorer", first tool_outcome's build, then user_feedback's.
    let mut host = host(&[], |_| {}).await;
    let scorer = host.dir.path().join("scorer.wasm");
    std::fs::copy(plugin_file("tool_outcome"), &scorer).expect("first build in place");
    host.filters.rescan().await;
    let first_hash = host.filters.plugins()[0].1.clone();

    let (trajectory, steps) = fixture();
    let step = &steps[0];
    // A next state both builds have an opinion on: a clean tool result and a thankful user.
    let mut next = step.next_state.clone().expect("fixture next state");
    next.messages
        .push(json!({"role": "user", "content": "Thanks, perfect."}));
    host.filters.opened(&trajectory);

    const STEPS: usize = 200;
    let mut sent = HashSet::new();
    for i in 0..STEPS {
        let mut step = step.clone();
        step.id = StepId::new();
        step.index = i as u32;
        host.filters.step_recorded(&step);
        host.filters
            .next_state(&trajectory.tenant, trajectory.id, step.id, &next);
        sent.insert(step.id);
        if i == STEPS / 2 {
            // Written beside and renamed over, as a deploy would.
            let staged = host.dir.path().join("scorer.wasm.new");
            std::fs::copy(plugin_file("user_feedback"), &staged).expect("second build staged");
            std::fs::rename(&staged, &scorer).expect("second build in place");
            host.filters.rescan().await;
        }
    }
    let second_hash = host.filters.plugins()[0].1.clone();
    assert_ne!(first_hash, second_hash, "the second build is in service");

    let mut seen = HashSet::new();
    let mut hashes = HashSet::new();
    while seen.len() < STEPS {
        for evaluation in host.next_batch().await {
            let EvaluationSource::Plugin { name, content_hash } = &evaluation.source else {
                panic!("a plugin source");
            };
            assert_eq!(name, "scorer");
            hashes.insert(content_hash.clone());
            let step = evaluation.step.expect("a step evaluation");
            assert!(seen.insert(step), "one evaluation per step");
        }
    }
    assert_eq!(seen, sent, "every step was evaluated");
    assert_eq!(hashes, HashSet::from([first_hash, second_hash]));
}
