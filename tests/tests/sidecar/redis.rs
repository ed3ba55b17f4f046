//! Recording into Redis: an outage mid-load loses no served step and costs agents nothing; nor
//! does a Redis that stays up and refuses writes (out of memory, a read-only replica); a Redis
//! Cluster works the same; no API key ever reaches Redis.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clawback_datapool::{RedisConfig, RedisStore, Store, TenantId, TrajectoryStatus};
use clawback_sidecar::data_plane::tenant::key_hash;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::MockUpstream;
use clawback_tests::redis_server::{RedisCluster, RedisServer};
use serde_json::json;

use crate::support::client;

/// Completed one-step trajectories of `tenant` in `store`, polled until `want` or ten seconds.
async fn completed_count(store: &RedisStore, tenant: &TenantId, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut done = 0;
        for header in store
            .list_trajectories(tenant, None, 10_000)
            .await
            .unwrap_or_default()
        {
            if header.status != TrajectoryStatus::Completed {
                continue;
            }
            if let Ok(Some(record)) = store.trajectory(tenant, &header.id).await {
                done += usize::from(record.steps.len() == 1);
            }
        }
        if done >= want || Instant::now() >= deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The trajectories of `tenant` that are not one completed step, for a failure's message.
async fn odd(store: &RedisStore, tenant: &TenantId) -> String {
    let mut odd = Vec::new();
    let listed = store
        .list_trajectories(tenant, None, 10_000)
        .await
        .unwrap_or_default();
    for header in &listed {
        let steps = match store.trajectory(tenant, &header.id).await {
            Ok(Some(record)) => record.steps.len(),
            _ => 0,
        };
        if steps != 1 || header.status != TrajectoryStatus::Completed {
            odd.push(format!(
                "{} {:?} with {steps} steps",
                header.id, header.status
            ));
        }
    }
    format!("{} listed; not one completed step: {odd:?}", listed.len())
}

async fn one_turn(sidecar: &Sidecar, session: &str, key: &str) -> u16 {
    client()
        .post(sidecar.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-clawback-session", session)
        .header("x-clawback-done", "true")
        .json(&json!({"model": "mock-llama", "messages": [{"role": "user", "content": format!("turn of {session}")}]}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test]
async fn redis_going_away_mid_load_loses_no_served_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start_durable(dir.path());
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(redis.url());
    let sidecar = Sidecar::start(config).await;

    let calls = 90;
    for i in 0..calls {
        if i == 30 {
            redis.kill();
        }
        if i == 60 {
            redis.restart();
        }
        assert_eq!(
            one_turn(&sidecar, &format!("load-{i}"), "sk-any").await,
            200,
            "call {i}"
        );
    }

    let reader = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap();
    let tenant = TenantId::new("default").unwrap();
    let done = completed_count(&reader, &tenant, calls).await;
    assert_eq!(done, calls, "{}", odd(&reader, &tenant).await);
}

/// Sets `redis`'s configuration through a connection of the test's own.
async fn redis_admin(url: &str, command: &[&str]) {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the test reaches Redis");
    let mut cmd = redis::cmd(command[0]);
    for arg in &command[1..] {
        cmd.arg(*arg);
    }
    let () = cmd
        .query_async(&mut conn)
        .await
        .expect("Redis takes the command");
}

#[tokio::test]
async fn redis_refusing_writes_when_full_or_read_only_loses_no_served_step_and_records_each_once() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(redis.url());
    let sidecar = Sidecar::start(config).await;
    let url = redis.url();
    let mut calls = 0;
    let mut turns = |sidecar: &'static Sidecar, n: usize| {
        let first = calls;
        calls += n;
        async move {
            for i in first..first + n {
                assert_eq!(
                    one_turn(sidecar, &format!("refused-{i}"), "sk-any").await,
                    200,
                    "call {i}"
                );
            }
        }
    };
    let sidecar: &'static Sidecar = Box::leak(Box::new(sidecar));
    turns(sidecar, 5).await;

    // Full: under `noeviction`, every write is refused with OOM.
    redis_admin(&url, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    redis_admin(&url, &["CONFIG", "SET", "maxmemory", "1"]).await;
    turns(sidecar, 10).await;
    redis_admin(&url, &["CONFIG", "SET", "maxmemory", "0"]).await;
    turns(sidecar, 5).await;

    // Read-only: the primary became a replica (of a primary that is not there).
    let nowhere = clawback_tests::redis_server::free_port().to_string();
    redis_admin(&url, &["REPLICAOF", "127.0.0.1", &nowhere]).await;
    turns(sidecar, 10).await;
    redis_admin(&url, &["REPLICAOF", "NO", "ONE"]).await;
    turns(sidecar, 5).await;

    let reader = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap();
    let tenant = TenantId::new("default").unwrap();
    // Each call one completed trajectory of exactly one step: none lost, none twice.
    let done = completed_count(&reader, &tenant, calls).await;
    assert_eq!(done, calls, "{}", odd(&reader, &tenant).await);
    let listed = reader
        .list_trajectories(&tenant, None, 10_000)
        .await
        .unwrap();
    assert_eq!(listed.len(), calls);
}

#[tokio::test]
async fn a_redis_cluster_records_and_no_api_key_reaches_it() {
    let cluster = RedisCluster::start();
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(cluster.seeds().join(","));
    config.redis_cluster = true;
    config.tenants.keys = BTreeMap::from([(key_hash("sk-cluster-secret-42"), "crew".to_owned())]);
    let sidecar = Sidecar::start(config).await;

    for i in 0..5 {
        assert_eq!(
            one_turn(&sidecar, &format!("c-{i}"), "sk-cluster-secret-42").await,
            200
        );
    }
    let reader = RedisStore::connect(&RedisConfig::cluster(cluster.seeds()))
        .await
        .unwrap();
    let tenant = TenantId::new("crew").unwrap();
    assert_eq!(completed_count(&reader, &tenant, 5).await, 5);

    // Dump every key of every node: the agent's key is nowhere.
    for node in &cluster.nodes {
        let client = redis::Client::open(node.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        for key in keys {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&key)
                .query(&mut conn)
                .unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&dump).contains("sk-cluster-secret"),
                "{key}"
            );
        }
    }
}

/// A session key minted through one replica of a pool puts the calls another replica serves in
/// its trajectory and tenant; an unknown one is refused there too, even with a default tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_key_minted_on_one_replica_works_on_another() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let replica = || {
        let mut config = test_config(&[engine.url()]);
        config.redis = Some(redis.url());
        config.admin.token = Some("admin-secret".to_owned());
        config
    };
    let (minter, server) = (
        Sidecar::start(replica()).await,
        Sidecar::start(replica()).await,
    );
    let created: serde_json::Value = client()
        .post(minter.url("/trajectories"))
        .bearer_auth("admin-secret")
        .json(&json!({"tenant": "acme", "session_key": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["api_key"].as_str().unwrap().to_owned();
    let trajectory: clawback_datapool::TrajectoryId =
        created["trajectory_id"].as_str().unwrap().parse().unwrap();
    for (key, status) in [(key.clone(), 200), (format!("{key}0"), 401)] {
        let answer = client()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({"model": "mock-llama",
                          "messages": [{"role": "user", "content": "a question"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), status);
        answer.bytes().await.unwrap();
    }
    let reader = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap();
    let tenant = TenantId::new("acme").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let steps = reader
            .trajectory(&tenant, &trajectory)
            .await
            .ok()
            .flatten()
            .map_or(0, |r| r.steps.len());
        if steps == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the call is not in the key's trajectory"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The session state is asked which trajectory a call joins while the call is forwarded, not
/// before: with Redis taking no writes (so the join cannot be answered), a streamed answer's
/// first chunks still reach the agent; only its end waits for the step to be numbered and
/// journaled, and the call is recorded once Redis answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_is_forwarded_while_the_session_state_answers_its_join() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(redis.url());
    // Long enough that the join waits for Redis rather than falling back to local state.
    config.recording.session_timeout = Duration::from_secs(60);
    let sidecar = Sidecar::start(config).await;
    let redis_client = redis::Client::open(redis.url()).unwrap();
    let mut control = redis_client
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query_async(&mut control)
        .await
        .unwrap();

    let mut response = client()
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-session", "joined-later")
        .json(&json!({"model": "mock-llama", "stream": true,
                      "messages": [{"role": "user", "content": "Tell me about Paris."}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(20), response.chunk())
        .await
        .expect("the first chunk while Redis takes no writes (the call waited for its join)")
        .unwrap()
        .expect("a chunk");
    assert!(
        String::from_utf8_lossy(&first).contains("data: "),
        "{first:?}"
    );

    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut control)
        .await
        .unwrap();
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");

    let store = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap();
    let tenant = TenantId::new("default").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let headers = store.list_trajectories(&tenant, None, 10).await.unwrap();
        let steps = match headers.first() {
            Some(header) => store
                .trajectory(&tenant, &header.id)
                .await
                .unwrap()
                .map_or(0, |r| r.steps.len()),
            None => 0,
        };
        if steps == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the call was never recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A JOIN that timed out may still land: Redis paused past `session_timeout` takes the call's
/// join once it resumes, marking the call in flight on the session's trajectory — while the
/// call itself went on with the replica's own state. That ghost must not hold the trajectory
/// open: the sweep has Redis forget it, and the trajectory completes once idle.
#[tokio::test(flavor = "multi_thread")]
async fn a_join_that_timed_out_and_landed_later_leaves_no_ghost_holding_its_trajectory() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.redis = Some(redis.url());
    config.recording.session_timeout = Duration::from_millis(200);
    config.recording.idle_timeout = Duration::from_millis(500);
    let sidecar = Sidecar::start(config).await;
    let turn = |content: &'static str| {
        client()
            .post(sidecar.url("/v1/chat/completions"))
            .header("x-clawback-session", "ghosted")
            .json(&json!({"model": "mock-llama",
                          "messages": [{"role": "user", "content": content}]}))
            .send()
    };
    assert_eq!(turn("first").await.unwrap().status(), 200);
    let reader = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap();
    let tenant = TenantId::new("default").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader
        .list_trajectories(&tenant, None, 10)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the first call recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    redis_admin(&redis.url(), &["CLIENT", "PAUSE", "1500", "WRITE"]).await;
    assert_eq!(turn("second").await.unwrap().status(), 200);

    // Every trajectory completes once idle: none is held by the late join's mark.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = reader
            .list_trajectories(&tenant, None, 10)
            .await
            .unwrap_or_default();
        if !listed.is_empty()
            && listed
                .iter()
                .all(|h| h.status == TrajectoryStatus::Completed)
        {
            break;
        }
        assert!(Instant::now() < deadline, "still open: {listed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
