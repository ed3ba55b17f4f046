//! Per-tenant policy routing: a tenant's calls go to its live adapter as soon as the trainer
//! switches it in the datapool — on every replica — the recorded steps say which policy served
//! them, and the admin endpoint shows what is still in flight on a replaced adapter.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{
    Error as DatapoolError, PolicyRef, PolicyVersion, RedisConfig, RedisStore, Store, TenantId,
    UnixMs, SCHEMA_VERSION,
};
use clawback_sidecar::config::Config;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use clawback_tests::redis_server::RedisServer;
use serde_json::{json, Value};

use crate::support::client;

const BASE: &str = "mock-llama";
const ADMIN: &str = "routing-admin-token";

fn tenant() -> TenantId {
    TenantId::new("default").unwrap()
}

fn policy(version: u64) -> PolicyVersion {
    PolicyVersion {
        schema_version: SCHEMA_VERSION,
        tenant: tenant(),
        adapter: format!("default@v{version}"),
        version,
        live_since: UnixMs::now(),
        canary: None,
    }
}

/// Routing on, `mock-llama` the base model and `default-model` its alias.
fn routing_config(engine: &MockUpstream, redis: Option<&RedisServer>) -> Config {
    let mut config = test_config(&[engine.url()]);
    config.redis = redis.map(RedisServer::url);
    config.routing.base_model = Some(BASE.to_owned());
    config.routing.aliases = vec!["default-model".to_owned()];
    config.routing.poll_interval = Duration::from_millis(50);
    config.admin.token = Some(ADMIN.to_owned());
    config
}

async fn redis_store(redis: &RedisServer) -> RedisStore {
    RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .unwrap()
}

/// Polls `attempt` until it yields a value; panics naming `what` after ten seconds.
async fn poll<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The version `sidecar` routes the default tenant to, as its admin endpoint shows it.
async fn live_version(sidecar: &Sidecar) -> Option<u64> {
    let policies = admin_policies(sidecar).await;
    policies["policies"]
        .as_array()?
        .iter()
        .find(|p| p["tenant"] == "default")
        .and_then(|p| p["version"].as_u64())
}

async fn admin_policies(sidecar: &Sidecar) -> Value {
    let response = client()
        .get(sidecar.url("/admin/policies"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn wait_for_version(sidecar: &Sidecar, version: u64) {
    poll(&format!("the switch to v{version}"), || async {
        (live_version(sidecar).await == Some(version)).then_some(())
    })
    .await;
}

/// One finished chat call asking for `model`; returns the `model` the engine was asked for.
async fn call(sidecar: &Sidecar, engine: &MockUpstream, model: &str) -> String {
    let before = engine.request_count();
    let response = client()
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-done", "true")
        .json(&json!({"model": model, "messages": [{"role": "user", "content": format!("hello {before}")}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.bytes().await.unwrap();
    let received = engine.received();
    let body: Value = serde_json::from_slice(&received[before].body).unwrap();
    body["model"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_tenant_without_a_policy_is_served_by_the_base_model() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;

    assert_eq!(call(&sidecar, &engine, BASE).await, BASE);
    // An alias is sent under the base model's real name.
    assert_eq!(call(&sidecar, &engine, "default-model").await, BASE);
    assert_eq!(admin_policies(&sidecar).await["policies"], json!([]));
}

#[tokio::test]
async fn a_switch_in_redis_moves_the_next_calls_to_the_adapter_but_not_calls_naming_a_version() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let trainer = redis_store(&redis).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, BASE);

    trainer.set_policy_version(&policy(1)).await.unwrap();
    wait_for_version(&sidecar, 1).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v1");
    assert_eq!(call(&sidecar, &engine, "default-model").await, "default@v1");
    // A call that names one of its tenant's versions gets that version.
    assert_eq!(call(&sidecar, &engine, "default@v1").await, "default@v1");

    trainer.set_policy_version(&policy(2)).await.unwrap();
    wait_for_version(&sidecar, 2).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v2");
    assert_eq!(call(&sidecar, &engine, "default@v1").await, "default@v1");
    let metrics = client()
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"clawback_policy_live_version{tenant="default"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"clawback_policy_switches_total{tenant="default"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn two_replicas_on_one_redis_both_switch() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let a = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let b = Sidecar::start(routing_config(&engine, Some(&redis))).await;

    redis_store(&redis)
        .await
        .set_policy_version(&policy(7))
        .await
        .unwrap();
    wait_for_version(&a, 7).await;
    wait_for_version(&b, 7).await;
    assert_eq!(call(&a, &engine, BASE).await, "default@v7");
    assert_eq!(call(&b, &engine, BASE).await, "default@v7");
}

#[tokio::test]
async fn a_policy_set_before_the_sidecar_started_is_live_from_its_first_call() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    redis_store(&redis)
        .await
        .set_policy_version(&policy(3))
        .await
        .unwrap();
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v3");
}

#[tokio::test]
async fn a_switch_made_while_the_subscription_was_down_is_picked_up_after_it_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start_durable(dir.path());
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let trainer = redis_store(&redis).await;
    trainer.set_policy_version(&policy(1)).await.unwrap();
    wait_for_version(&sidecar, 1).await;

    // The subscription dies with the server; v2 is set before any subscriber is back.
    redis.kill();
    redis.restart();
    poll("the trainer reaching the restarted Redis", || async {
        trainer.set_policy_version(&policy(2)).await.ok()
    })
    .await;
    wait_for_version(&sidecar, 2).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v2");
}

#[tokio::test]
async fn the_embedded_store_is_polled() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, None)).await;
    let store: Arc<dyn Store> = Arc::clone(sidecar.app.recorder.as_ref().unwrap().store());
    assert_eq!(call(&sidecar, &engine, BASE).await, BASE);

    store.set_policy_version(&policy(4)).await.unwrap();
    wait_for_version(&sidecar, 4).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v4");
}

#[tokio::test]
async fn recorded_steps_carry_the_policy_that_served_them() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let trainer = redis_store(&redis).await;

    call(&sidecar, &engine, BASE).await;
    trainer.set_policy_version(&policy(5)).await.unwrap();
    wait_for_version(&sidecar, 5).await;
    call(&sidecar, &engine, BASE).await;

    let policies = poll("both steps stored", || async {
        let mut policies = Vec::new();
        for header in trainer.list_trajectories(&tenant(), None, 100).await.ok()? {
            let record = trainer.trajectory(&tenant(), &header.id).await.ok()??;
            for step in record.steps {
                policies.push((step.timings.started_at, step.policy, step.upstream.model));
            }
        }
        (policies.len() == 2).then_some(policies)
    })
    .await;
    let mut policies = policies;
    policies.sort_by_key(|(at, _, _)| *at);
    assert_eq!(policies[0].1, None);
    assert_eq!(policies[0].2, BASE);
    assert_eq!(
        policies[1].1,
        Some(PolicyRef {
            adapter: "default@v5".to_owned(),
            version: 5
        })
    );
    assert_eq!(policies[1].2, "default@v5");
}

#[tokio::test]
async fn a_stale_version_is_refused_and_routing_stays_on_the_newer_one() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let trainer = redis_store(&redis).await;
    trainer.set_policy_version(&policy(9)).await.unwrap();
    wait_for_version(&sidecar, 9).await;

    let refused = trainer.set_policy_version(&policy(8)).await;
    assert!(
        matches!(
            refused,
            Err(DatapoolError::StalePolicyVersion {
                live: 9,
                attempted: 8,
                ..
            })
        ),
        "{refused:?}"
    );
    // Even an older version published by hand is not taken.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let channel = clawback_datapool::keys::policy_changed(&tenant());
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(serde_json::to_string(&policy(8)).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
    // A later switch still arrives, so the hand-made message was handled before it.
    trainer.set_policy_version(&policy(10)).await.unwrap();
    wait_for_version(&sidecar, 10).await;
    assert_eq!(call(&sidecar, &engine, BASE).await, "default@v10");
}

#[tokio::test]
async fn a_replaced_adapter_counts_its_calls_in_flight_until_they_end() {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, Some(&redis))).await;
    let trainer = redis_store(&redis).await;
    trainer.set_policy_version(&policy(1)).await.unwrap();
    wait_for_version(&sidecar, 1).await;

    // A streamed call on v1 that takes a while between chunks.
    engine.set_behaviour(Behaviour {
        chunk_delay: Duration::from_millis(400),
        ..Behaviour::default()
    });
    let response = client()
        .post(sidecar.url("/v1/chat/completions"))
        .json(&json!({"model": BASE, "stream": true, "messages": [{"role": "user", "content": "slow"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let policies = admin_policies(&sidecar).await;
    assert_eq!(policies["in_flight"]["default@v1"], 1, "{policies}");

    trainer.set_policy_version(&policy(2)).await.unwrap();
    wait_for_version(&sidecar, 2).await;
    let policies = admin_policies(&sidecar).await;
    assert_eq!(policies["in_flight"]["default@v1"], 1, "{policies}");
    assert_eq!(policies["in_flight"]["default@v2"], 0, "{policies}");

    let _ = response.bytes().await.unwrap();
    poll("the v1 call to drain", || async {
        let policies = admin_policies(&sidecar).await;
        policies["in_flight"]
            .get("default@v1")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_admin_endpoint_needs_the_admin_token() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(routing_config(&engine, None)).await;
    let response = client()
        .get(sidecar.url("/admin/policies"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let response = client()
        .get(sidecar.url("/admin/policies"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

/// `POST /tenants/{tenant}/rollback` as `token` with `body`; the status and the JSON answer.
async fn order_rollback(sidecar: &Sidecar, token: &str, body: Value) -> (u16, Value) {
    let response = client()
        .post(sidecar.url("/tenants/default/rollback"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_operator_orders_a_rollback_to_an_earlier_version_and_reads_its_outcome() {
    let engine = MockUpstream::start().await;
    let mut config = routing_config(&engine, None);
    let viewer = "routing-viewer-token";
    config.admin.tenant_tokens.insert(
        clawback_sidecar::data_plane::tenant::key_hash(viewer),
        tenant().as_str().to_owned(),
    );
    let sidecar = Sidecar::start(config).await;
    let store: Arc<dyn Store> = Arc::clone(sidecar.app.recorder.as_ref().unwrap().store());

    // Nothing live yet: nothing to roll back from.
    let (status, answer) = order_rollback(&sidecar, ADMIN, json!({"to": 1})).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &json!("rollback_refused"))
    );
    store.set_policy_version(&policy(5)).await.unwrap();

    // Not an earlier version, or no version at all, or a body that says something else.
    for body in [json!({"to": 5}), json!({"to": 9}), json!({"to": 0})] {
        let (status, answer) = order_rollback(&sidecar, ADMIN, body.clone()).await;
        assert_eq!(status, 409, "{body}: {answer}");
    }
    for body in [
        json!({}),
        json!({"to": "3"}),
        json!({"to": 3, "force": true}),
    ] {
        let (status, _) = order_rollback(&sidecar, ADMIN, body.clone()).await;
        assert_eq!(status, 400, "{body}");
    }
    // A tenant's own token rates its trajectories but does not decide what serves them.
    let (status, answer) = order_rollback(&sidecar, viewer, json!({"to": 3})).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("operator_only"))
    );
    assert_eq!(store.rollback(&tenant()).await.unwrap(), None);

    let (status, order) = order_rollback(&sidecar, ADMIN, json!({"to": 3})).await;
    assert_eq!(status, 202, "{order}");
    assert_eq!(
        (order["to"].as_u64(), order["from"].as_u64()),
        (Some(3), Some(5))
    );
    assert!(order.get("outcome").is_none(), "{order}");
    let stored = store.rollback(&tenant()).await.unwrap().unwrap();
    assert_eq!(stored.id, order["id"].as_str().unwrap());

    // What the trainer records once it carried the order out is what the operator reads.
    let settled = clawback_datapool::Rollback {
        outcome: Some(clawback_datapool::RollbackOutcome::Done {
            at: UnixMs::now(),
            version: 6,
        }),
        ..stored
    };
    assert!(store.settle_rollback(&settled).await.unwrap());
    let response = client()
        .get(sidecar.url("/tenants/default/rollback"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let state: Value = response.json().await.unwrap();
    assert_eq!(
        state["outcome"],
        json!({"state": "done", "at": state["outcome"]["at"], "version": 6})
    );
}
