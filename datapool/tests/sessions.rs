//! Shared session state ([`Sessions`]) on every store that keeps it: SQLite in memory (one
//! process's own), SQLite in a file (replicas on one machine), and the shared Redis on
//! 127.0.0.1:6379 (or `CLAWBACK_TEST_REDIS`). The Redis Cluster runs the same scenarios in
//! `redis_cluster.rs`.

mod common;

use std::sync::Arc;

use clawback_datapool::{LocalSessions, RedisConfig, RedisStore, Sessions, TenantId};
use common::sessions as scenarios;
use common::{fresh_tenant, redis_url, TenantKeys};

/// Runs every scenario against `sessions`, each with fresh tenants (and their Redis keys
/// deleted afterwards when `redis` is set).
async fn every_scenario(sessions: Arc<dyn Sessions>, redis: bool) {
    let tenant = |label: &str| {
        let t = fresh_tenant(label);
        let guard = redis.then(|| TenantKeys::new(&redis_url(), &t));
        (t, guard)
    };
    let s = &*sessions;
    let (t, _g) = tenant("continue");
    scenarios::a_call_continues_the_trajectory_whose_history_and_reply_it_extends(s, &t).await;
    let (t, _g) = tenant("newest");
    scenarios::only_the_newest_and_longest_match_continues(s, &t).await;
    let (t, _g) = tenant("shared-key");
    scenarios::a_key_two_trajectories_hold_is_never_guessed(s, &t).await;
    let (t, _g) = tenant("race");
    scenarios::racing_calls_of_one_session_share_a_trajectory_and_number_their_steps_once(
        Arc::clone(&sessions),
        &t,
    )
    .await;
    let (t, _g) = tenant("deferred");
    scenarios::a_completion_waits_for_the_calls_in_flight_and_is_answered_once(s, &t).await;
    let (t, _g) = tenant("last-call");
    scenarios::a_last_call_finishes_its_trajectory_and_an_abandoned_call_leaves_it_open(s, &t)
        .await;
    let (t, _g) = tenant("sweep");
    scenarios::the_idle_sweep_finishes_each_trajectory_once_across_replicas(
        Arc::clone(&sessions),
        &t,
    )
    .await;
    let (t, _g) = tenant("takeover");
    scenarios::a_completion_nobody_wrote_is_taken_over_once(Arc::clone(&sessions), &t).await;
    let (t, _g) = tenant("idle");
    scenarios::an_idle_trajectory_is_not_continued_by_stitching(s, &t).await;
    let ((a, _ga), (b, _gb)) = (tenant("tenant-a"), tenant("tenant-b"));
    scenarios::tenants_never_join_each_other(s, &a, &b).await;
    let (t, _g) = tenant("retry");
    scenarios::a_retry_after_a_broken_answer_continues_the_trajectory(s, &t).await;
    let (t, _g) = tenant("repeated");
    scenarios::a_repeated_join_or_step_done_gets_its_first_answer(s, &t).await;
    let (t, _g) = tenant("lost-join");
    scenarios::a_call_whose_join_answer_was_lost_is_forgotten_and_frees_its_trajectory(s, &t).await;
    let (t, _g) = tenant("eval-only");
    scenarios::an_evaluation_only_trajectory_says_so_to_its_calls(s, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_in_sqlite_memory() {
    let sessions = LocalSessions::in_memory().unwrap_or_else(|e| panic!("{e}"));
    every_scenario(Arc::new(sessions), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_in_a_sqlite_file_shared_by_two_processes_worth_of_connections() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("sessions.sqlite3");
    every_scenario(
        Arc::new(LocalSessions::open(&path).unwrap_or_else(|e| panic!("{e}"))),
        false,
    )
    .await;
    // Two replicas on one machine: two connections to the file see one state.
    let a = LocalSessions::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let b = LocalSessions::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let tenant: TenantId = fresh_tenant("two-files");
    scenarios::a_call_continues_across_replicas(&a, &b, &tenant).await;
    scenarios::a_session_key_resolves_on_every_replica(&a, &b, &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_in_redis() {
    let store = RedisStore::connect(&RedisConfig::single(redis_url()))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    every_scenario(Arc::new(store.clone()), true).await;
    let other = RedisStore::connect(&RedisConfig::single(redis_url()))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let tenant = fresh_tenant("two-replicas");
    let _keys = TenantKeys::new(&redis_url(), &tenant);
    scenarios::a_call_continues_across_replicas(&store, &other, &tenant).await;
    scenarios::a_session_key_resolves_on_every_replica(&store, &other, &tenant).await;
}
