//! The example plugins, built as components, run by the host on the example trajectory: each
//! scores what it should, and every evaluation names the plugin and the hash of its build.

mod support;

use std::time::Duration;

use clawback_datapool::{Evaluation, EvaluationSource, StepId, TenantId, TrajectoryId, Verdict};
use serde_json::json;

use support::{
    fixture, host, host_sharing, judge_config, next_of, scripted_judge, scripted_judge_after,
    scripted_judge_with, tool_result, Host,
};

fn reward(evaluation: &Evaluation) -> Option<f64> {
    match &evaluation.verdict {
        Verdict::Score { reward, .. } => *reward,
        Verdict::FilterError { reason } => panic!("unexpected filter_error: {reason}"),
    }
}

fn only(evaluations: &[Evaluation], plugin: &str) -> Evaluation {
    let found: Vec<&Evaluation> = evaluations
        .iter()
        .filter(|e| matches!(&e.source, EvaluationSource::Plugin { name, .. } if name == plugin))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one evaluation from {plugin}: {evaluations:#?}"
    );
    found[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_outcome_scores_a_clean_result_up_and_an_error_down() {
    let mut host = host(&["tool_outcome"], |_| {}).await;
    let (trajectory, steps) = fixture();
    let clean = host
        .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
        .await;
    let clean = only(&clean, "tool_outcome");
    assert_eq!(reward(&clean), Some(1.0));
    assert_eq!(clean.step, Some(steps[0].id));
    let EvaluationSource::Plugin { content_hash, .. } = &clean.source else {
        panic!("a plugin source");
    };
    assert!(
        content_hash.starts_with("sha256:") && content_hash.len() == 71,
        "{content_hash}"
    );

    let failed = tool_result(
        "Traceback (most recent call last):\n  File \"/srv/tools/weather.py\", line 41, in fetch\n    resp.raise_for_status()\nrequests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: https://api.weather.example/v1/current?city=Paris",
    );
    let failed = host.evaluate(&trajectory, &steps[0], &failed).await;
    let failed = only(&failed, "tool_outcome");
    assert_eq!(reward(&failed), Some(-1.0));
    assert_eq!(
        failed.labels.get("first_error").map(String::as_str),
        Some("exception")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn user_feedback_scores_the_users_reply() {
    let mut host = host(&["user_feedback"], |_| {}).await;
    let (trajectory, steps) = fixture();
    // "Thanks! Do I need an umbrella?"
    let thanked = host
        .evaluate(&trajectory, &steps[1], &next_of(&steps[1]))
        .await;
    assert_eq!(reward(&only(&thanked, "user_feedback")), Some(1.0));

    let mut corrected = next_of(&steps[1]);
    corrected.messages = vec![
        json!({"role": "user", "content": "No, I asked for Celsius AND the forecast for tonight."}),
    ];
    let corrected = host.evaluate(&trajectory, &steps[1], &corrected).await;
    let corrected = only(&corrected, "user_feedback");
    assert_eq!(reward(&corrected), Some(-1.0));
    assert_eq!(
        corrected.labels.get("reaction").map(String::as_str),
        Some("corrects")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn judge_vote_takes_the_majority_of_the_judges_answers() {
    let judge = scripted_judge(vec![
        "The weather tool was the right call and returned data. \\boxed{1}".to_owned(),
        "Reasonable. \\boxed{1}".to_owned(),
        "It should have asked which unit first. \\boxed{-1}".to_owned(),
    ])
    .await;
    let mut host = host(&["judge_vote"], |config| {
        config.judge = Some(judge_config(&judge.url));
    })
    .await;
    let (trajectory, steps) = fixture();
    let evaluations = host
        .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
        .await;
    let vote = only(&evaluations, "judge_vote");
    assert_eq!(reward(&vote), Some(1.0));
    let votes = vote.labels.get("judge_votes").cloned().unwrap_or_default();
    assert_eq!(votes.matches("+1").count(), 2, "{votes}");
    assert_eq!(judge.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A call stopped by the wall-clock backstop failed for the host's reasons (here a judge that
/// did not answer in time; a busy host alike), not the plugin's: it is tried again, and the
/// step gets its reward instead of a `filter_error`.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_ran_out_of_wall_clock_time_is_tried_again_not_lost() {
    // The first call's three votes are held far past the backstop; the next call's are not.
    let judge = scripted_judge_with(vec!["\\boxed{1}".to_owned()], |n| {
        if n < 3 {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        }
    })
    .await;
    let mut host = host(&["judge_vote"], |config| {
        config.judge = Some(judge_config(&judge.url));
        config.call_timeout = Duration::from_secs(2);
        config.host_retries = 3;
    })
    .await;
    let (trajectory, steps) = fixture();
    let evaluations = host
        .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
        .await;
    assert_eq!(reward(&only(&evaluations, "judge_vote")), Some(1.0));
    let retries = host
        .metrics
        .host_retries
        .get_or_create(&clawback_filters::metrics::PluginLabels {
            plugin: clawback_filters::metrics::PluginName("judge_vote".into()),
        })
        .get();
    assert!(retries >= 1, "the first call was tried again ({retries})");
}

/// One tenant's steps behind a slow judge fill its own share of the plugin queue only: another
/// tenant's steps are still admitted and scored.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_behind_a_slow_judge_fills_only_its_share_of_the_queue() {
    let judge =
        scripted_judge_after(vec!["\\boxed{1}".to_owned()], Duration::from_millis(300)).await;
    let mut host = host_sharing(&["judge_vote"], 0.5, |config| {
        config.judge = Some(judge_config(&judge.url));
        config.queue_capacity = 4;
        config.max_concurrency = 2;
        config.plugins.insert(
            "judge_vote".to_owned(),
            serde_json::from_value(json!({"config": {"votes": 1}})).expect("plugin config"),
        );
    })
    .await;
    let (trajectory, steps) = fixture();
    let next = next_of(&steps[0]);
    let submit = |host: &Host, tenant: &str| {
        let mut t = trajectory.clone();
        t.id = TrajectoryId::new();
        t.tenant = TenantId::new(tenant).expect("tenant");
        let mut step = steps[0].clone();
        step.id = StepId::new();
        step.tenant = t.tenant.clone();
        step.trajectory = t.id;
        host.filters.opened(&t);
        host.filters.step_recorded(&step);
        host.filters.next_state(&t.tenant, t.id, step.id, &next);
    };
    for _ in 0..10 {
        submit(&host, "alpha");
    }
    for _ in 0..2 {
        submit(&host, "bravo");
    }
    let (mut alpha, mut bravo) = (0, 0);
    while alpha + bravo < 4 {
        for evaluation in host.next_batch().await {
            match evaluation.tenant.as_str() {
                "bravo" => bravo += 1,
                _ => alpha += 1,
            }
        }
    }
    // Alpha's share (2 of 4) was admitted, its other 8 dropped; bravo's 2 were scored.
    assert_eq!((alpha, bravo), (2, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn judge_vote_ties_score_zero_and_the_vote_count_is_per_tenant_config() {
    let judge = scripted_judge(vec!["\\boxed{1}".to_owned(), "\\boxed{-1}".to_owned()]).await;
    let mut host = host(&["judge_vote"], |config| {
        config.judge = Some(judge_config(&judge.url));
        config.plugins.insert(
            "judge_vote".to_owned(),
            serde_json::from_value(
                json!({"config": {"votes": 3}, "tenant_config": {"acme": {"votes": 2}}}),
            )
            .expect("plugin config"),
        );
    })
    .await;
    let (trajectory, steps) = fixture();
    let evaluations = host
        .evaluate(&trajectory, &steps[0], &next_of(&steps[0]))
        .await;
    assert_eq!(reward(&only(&evaluations, "judge_vote")), Some(0.0));
    assert_eq!(judge.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn hint_extractor_keeps_the_longest_hint_of_a_positive_vote() {
    let judge = scripted_judge(vec![
        "\\boxed{1} [HINT_START]Give the temperature with its unit.[HINT_END]".to_owned(),
        "The user asked for Celsius. \\boxed{1}\n[HINT_START]State the temperature in Celsius and mention the rain, since the user will ask about an umbrella next.[HINT_END]".to_owned(),
        "\\boxed{-1}".to_owned(),
    ])
    .await;
    let mut host = host(&["hint_extractor"], |config| {
        config.judge = Some(judge_config(&judge.url));
    })
    .await;
    let (trajectory, steps) = fixture();
    let evaluations = host
        .evaluate(&trajectory, &steps[1], &next_of(&steps[1]))
        .await;
    let hint = only(&evaluations, "hint_extractor");
    match &hint.verdict {
        Verdict::Score { reward, hint } => {
            assert_eq!(*reward, None);
            assert!(
                hint.as_deref()
                    .is_some_and(|h| h.starts_with("State the temperature in Celsius")),
                "{hint:?}"
            );
        }
        other => panic!("a score, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn correction_hint_turns_what_a_correction_asks_for_into_a_hint() {
    let mut host = host(&["correction_hint"], |_| {}).await;
    let (trajectory, steps) = fixture();
    let mut corrected = next_of(&steps[1]);
    corrected.messages = vec![json!({"role": "user", "content":
        "No, please give the temperature in Celsius. Do I need an umbrella tonight?"})];
    let corrected = host.evaluate(&trajectory, &steps[1], &corrected).await;
    match &only(&corrected, "correction_hint").verdict {
        Verdict::Score { reward, hint } => {
            assert_eq!(*reward, None);
            assert_eq!(hint.as_deref(), Some("Give the temperature in Celsius."));
        }
        other => panic!("a score, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_answer_checks_the_final_answer_when_the_trajectory_completes() {
    let mut host = host(&["exact_answer"], |_| {}).await;
    for (expected, want) in [("11.5", 1.0), ("12", -1.0)] {
        let (mut trajectory, steps) = fixture();
        trajectory.id = clawback_datapool::TrajectoryId::new();
        trajectory
            .metadata
            .insert("answer".to_owned(), json!(expected));
        let mut steps = steps;
        for step in &mut steps {
            step.trajectory = trajectory.id;
        }
        host.filters.opened(&trajectory);
        host.filters.step_recorded(&steps[0]);
        host.filters.next_state(
            &trajectory.tenant,
            trajectory.id,
            steps[0].id,
            &next_of(&steps[0]),
        );
        host.filters.step_recorded(&steps[1]);
        let (settled, settled_rx) = std::sync::mpsc::channel();
        host.filters.completed(
            &trajectory.tenant,
            trajectory.id,
            clawback_datapool::CompletionReason::DoneHeader,
            2,
            Box::new(move || {
                let _ = settled.send(());
            }),
        );
        // What waits for the trajectory's evaluations runs once they are delivered ...
        settled_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the completion callback runs");
        // ... so the trajectory's evaluation is already there (step evaluations say nothing).
        let evaluations = host.next_batch().await;
        let outcome = only(&evaluations, "exact_answer");
        assert_eq!(outcome.step, None);
        assert_eq!(reward(&outcome), Some(want), "answer {expected}");
    }
}

/// However many trajectories agents open, the host keeps `max_live` of them in memory; one it
/// forgot still has its steps evaluated, read back from the datapool.
#[tokio::test(flavor = "multi_thread")]
async fn past_max_live_the_idlest_trajectory_is_forgotten_and_its_step_read_back() {
    use clawback_datapool::{LocalStore, Store, TrajectoryId};
    use std::sync::Arc;

    let mut host = host(&["tool_outcome"], |config| config.max_live = 2).await;
    let store = Arc::new(LocalStore::open(host.dir.path().join("store.sqlite")).expect("a store"));
    let (trajectory, steps) = fixture();
    store.upsert_trajectory(&trajectory).await.expect("written");
    store.append_steps(&steps[..1]).await.expect("written");
    let reader = Arc::clone(&store);
    host.filters.load_with(Arc::new(move |tenant, id, _| {
        let reader = Arc::clone(&reader);
        Box::pin(async move { reader.trajectory(&tenant, &id).await.ok().flatten() })
    }));

    host.filters.opened(&trajectory);
    host.filters.step_recorded(&steps[0]);
    for _ in 0..5 {
        let mut other = trajectory.clone();
        other.id = TrajectoryId::new();
        host.filters.opened(&other);
    }
    assert_eq!(host.metrics.forgotten.get(), 4);
    host.filters.next_state(
        &trajectory.tenant,
        trajectory.id,
        steps[0].id,
        &next_of(&steps[0]),
    );
    let evaluations = host.next_batch().await;
    assert_eq!(reward(&only(&evaluations, "tool_outcome")), Some(1.0));
}

/// The default fuel is a budget the shipped plugins never come near: at the view's caps — a
/// step of 200 kB of conversation, a reply of 13 kB — each step plugin burns under a fiftieth
/// of it (fuel is counted, not timed: the same on any host). Measured 2026-12-07: at most 0.12
/// million on the step, 5.3 million on the reply (`restates_question`, word by word).
#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_plugins_burn_a_small_share_of_the_default_fuel() {
    use clawback_filters::config::DEFAULT_FUEL;
    use clawback_filters::standalone::Standalone;
    use clawback_filters::FiltersConfig;

    let (_, steps) = fixture();
    let mut step = steps[0].clone();
    let turn =
        "Earlier in this session the user asked about the build; the assistant ran the tests. "
            .repeat(12);
    while serde_json::to_vec(&step.request.messages).map_or(0, |v| v.len()) < 200_000 {
        step.request
            .messages
            .insert(1, json!({"role": "user", "content": turn.clone()}));
    }
    let long_reply =
        "The capital of France is Paris, and it has been for a long time. ".repeat(200);
    let metadata = serde_json::Map::from_iter([("answer".to_owned(), json!("Paris"))]);
    for name in [
        "tool_outcome",
        "user_feedback",
        "correction_hint",
        "knows_answer",
        "restates_question",
        "reply_form",
    ] {
        let plugin = Standalone::load(&support::plugin_file(name), FiltersConfig::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let on_step = plugin
            .run_step("acme", &step, &next_of(&step), &metadata)
            .await;
        let on_reply = plugin
            .run_reply(
                "acme",
                "What is the capital of France?",
                &long_reply,
                &metadata,
            )
            .await;
        for (what, called) in [("a 200 kB step", on_step), ("a 13 kB reply", on_reply)] {
            assert!(
                called.result.is_ok(),
                "{name} on {what}: {:?}",
                called.result.err()
            );
            eprintln!("{name} on {what}: {} fuel", called.fuel_used);
            assert!(
                called.fuel_used > 0 && called.fuel_used * 50 < DEFAULT_FUEL,
                "{name} on {what} burnt {} of {DEFAULT_FUEL}",
                called.fuel_used
            );
        }
    }
}
