//! `SpooledStore`: Redis going away mid-load and coming back loses nothing and keeps the order;
//! a spool left by a previous run is replayed; when the spool fails too, the caller gets an error
//! it can count.

mod common;

use std::time::{Duration, Instant};

use clawback_datapool::{
    Error, LocalStore, RedisConfig, RedisStore, SpoolConfig, SpooledStore, Store, TenantId,
    TrajectoryId,
};
use common::{fresh_tenant, open_trajectory, step_of, RedisServer};

async fn redis_at(url: String) -> RedisStore {
    let config = RedisConfig {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_secs(2),
        ..RedisConfig::single(url)
    };
    RedisStore::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

fn quick_replay() -> SpoolConfig {
    SpoolConfig {
        replay_interval: Duration::from_millis(100),
        ..SpoolConfig::default()
    }
}

async fn wait_for_empty_spool(store: &SpooledStore) {
    let start = Instant::now();
    while store.backlog().await.unwrap_or_else(|e| panic!("{e}")) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the spool was not replayed within 90s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The indices of a trajectory's steps in Redis, duplicates (at-least-once replay) removed.
async fn recorded_indices(store: &dyn Store, tenant: &TenantId, id: &TrajectoryId) -> Vec<u32> {
    let record = store
        .trajectory(tenant, id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the trajectory reached Redis"));
    let mut seen = std::collections::HashSet::new();
    record
        .steps
        .iter()
        .filter(|s| seen.insert(s.id))
        .map(|s| s.index)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_and_restarted_loses_no_step_and_keeps_order() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut server = RedisServer::start_durable(dir.path());
    let spool = LocalStore::open(dir.path().join("spool.sqlite")).unwrap_or_else(|e| panic!("{e}"));
    let store = SpooledStore::new(redis_at(server.url()).await, spool, quick_replay())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tenant = fresh_tenant("spool");
    let traj = open_trajectory(&tenant);
    store
        .upsert_trajectory(&traj)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let (batches, per_batch) = (60u32, 10u32);
    for batch in 0..batches {
        if batch == 20 {
            server.kill();
        }
        if batch == 40 {
            server.restart();
        }
        let steps: Vec<_> = (0..per_batch)
            .map(|i| step_of(&tenant, &traj.id, batch * per_batch + i, 4096))
            .collect();
        // The recorder never sees an error while the spool takes the writes.
        store
            .append_steps(&steps)
            .await
            .unwrap_or_else(|e| panic!("batch {batch}: {e}"));
    }
    wait_for_empty_spool(&store).await;
    let stats = store.stats();
    assert!(
        stats.spooled.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "nothing was spooled"
    );
    assert_eq!(stats.rejected.load(std::sync::atomic::Ordering::Relaxed), 0);
    let indices = recorded_indices(&store, &tenant, &traj.id).await;
    assert_eq!(indices, (0..batches * per_batch).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_left_by_an_earlier_run_is_replayed_when_redis_is_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut server = RedisServer::not_started(dir.path());
    let spool_path = dir.path().join("spool.sqlite");
    let tenant = fresh_tenant("respool");
    let traj = open_trajectory(&tenant);
    {
        let spool = LocalStore::open(&spool_path).unwrap_or_else(|e| panic!("{e}"));
        let store = SpooledStore::new(redis_at(server.url()).await, spool, quick_replay())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store
            .upsert_trajectory(&traj)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let steps: Vec<_> = (0..5)
            .map(|i| step_of(&tenant, &traj.id, i, 1024))
            .collect();
        store
            .append_steps(&steps)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.backlog().await.unwrap_or_else(|e| panic!("{e}")), 2);
    } // the sidecar stops with Redis still away

    server.restart();
    let spool = LocalStore::open(&spool_path).unwrap_or_else(|e| panic!("{e}"));
    let store = SpooledStore::new(redis_at(server.url()).await, spool, quick_replay())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for_empty_spool(&store).await;
    assert_eq!(
        recorded_indices(&store, &tenant, &traj.id).await,
        vec![0, 1, 2, 3, 4]
    );
}

#[tokio::test]
async fn when_redis_and_the_spool_both_fail_the_caller_gets_a_countable_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = RedisServer::not_started(dir.path());
    let spool_path = dir.path().join("spool.sqlite");
    let spool = LocalStore::open(&spool_path).unwrap_or_else(|e| panic!("{e}"));
    let store = SpooledStore::new(redis_at(server.url()).await, spool, quick_replay())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Break the spool behind the store's back (as root, file permissions cannot do it).
    rusqlite::Connection::open(&spool_path)
        .and_then(|c| c.execute_batch("DROP TABLE spool"))
        .unwrap_or_else(|e| panic!("{e}"));
    let tenant = fresh_tenant("nospool");
    let err = match store.upsert_trajectory(&open_trajectory(&tenant)).await {
        Err(e) => e,
        Ok(()) => panic!("a write with Redis and the spool down succeeded"),
    };
    let Error::SpoolFailed { primary, .. } = &err else {
        panic!("expected SpoolFailed, got {err:?}")
    };
    assert!(primary.is_unavailable(), "{primary:?}");
    assert_eq!(err.label(), "spool_failed");
}
