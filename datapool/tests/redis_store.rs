//! `RedisStore` against the shared Redis on 127.0.0.1:6379 (or `CLAWBACK_TEST_REDIS`): the
//! common store behaviour, plus what only Redis does (caps, key layout, policy notifications).

mod common;

use std::time::Duration;

use clawback_datapool::{
    Caps, PolicyVersion, RedisConfig, RedisStore, Store, TenantId, TrajectoryId, UnixMs,
};
use common::scenarios;
use common::{fresh_tenant, open_trajectory, redis_url, step_of, TenantKeys};

async fn store() -> RedisStore {
    RedisStore::connect(&RedisConfig::single(redis_url()))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// A fresh tenant whose keys are deleted when the guard drops.
fn tenant(label: &str) -> (TenantId, TenantKeys) {
    let t = fresh_tenant(label);
    let keys = TenantKeys::new(&redis_url(), &t);
    (t, keys)
}

#[tokio::test]
async fn a_recorded_trajectory_reads_back_as_written() {
    let (t, _keys) = tenant("roundtrip");
    scenarios::a_recorded_trajectory_reads_back_as_written(&store().await, &t).await;
}

#[tokio::test]
async fn batched_steps_keep_their_order() {
    let (t, _keys) = tenant("order");
    scenarios::batched_steps_keep_their_order(&store().await, &t).await;
}

#[tokio::test]
async fn a_dead_consumers_unacked_entries_are_redelivered() {
    let (t, _keys) = tenant("redeliver");
    scenarios::a_dead_consumers_unacked_entries_are_redelivered(&store().await, &t).await;
}

#[tokio::test]
async fn a_poison_entry_is_dead_lettered() {
    let (t, _keys) = tenant("poison");
    scenarios::a_poison_entry_is_dead_lettered(&store().await, &t).await;
}

#[tokio::test]
async fn consumer_lag_counts_what_each_group_has_not_finished() {
    let (t, _keys) = tenant("lag");
    scenarios::consumer_lag_counts_what_each_group_has_not_finished(&store().await, &t).await;
}

#[tokio::test]
async fn a_group_is_ready_when_all_members_finished() {
    let (t, _keys) = tenant("group");
    scenarios::a_group_is_ready_when_all_members_finished(&store().await, &t).await;
}

#[tokio::test]
async fn a_group_past_its_timeout_is_delivered_partial() {
    let (t, _keys) = tenant("partial");
    scenarios::a_group_past_its_timeout_is_delivered_partial(&store().await, &t).await;
}

#[tokio::test]
async fn tenants_never_see_each_others_data() {
    let (a, _ka) = tenant("iso-a");
    let (b, _kb) = tenant("iso-b");
    scenarios::tenants_never_see_each_others_data(&store().await, &a, &b).await;
}

#[tokio::test]
async fn a_rollback_is_settled_only_against_its_own_order() {
    let (t, _keys) = tenant("rollback");
    scenarios::a_rollback_is_settled_only_against_its_own_order(&store().await, &t).await;
}

#[tokio::test]
async fn gate_decisions_keep_the_latest_of_their_tenant() {
    let (t, _keys) = tenant("gate");
    let (other, _other_keys) = tenant("gate-other");
    scenarios::gate_decisions_keep_the_latest_of_their_tenant(&store().await, &t, &other).await;
}

#[tokio::test]
async fn the_live_policy_only_moves_forward() {
    let (t, _keys) = tenant("policy");
    scenarios::the_live_policy_only_moves_forward(&store().await, &t).await;
}

#[tokio::test]
async fn next_states_attach_to_their_step() {
    let (t, _keys) = tenant("next");
    scenarios::next_states_attach_to_their_step(&store().await, &t).await;
}

#[tokio::test]
async fn every_key_of_a_tenant_carries_its_hash_tag() {
    let (t, keys) = tenant("tags");
    let store = store().await;
    scenarios::a_group_is_ready_when_all_members_finished(&store, &t).await;
    scenarios::next_states_attach_to_their_step(&store, &t).await;
    let written = keys.list();
    assert!(written.len() > 5, "{written:?}");
    let prefix = format!("clawback:{{{t}}}:");
    assert!(
        written.iter().all(|k| k.starts_with(&prefix)),
        "{written:?}"
    );
}

#[tokio::test]
async fn a_tenant_over_its_caps_loses_its_oldest_trajectories_first() {
    let (t, _keys) = tenant("caps");
    let config = RedisConfig {
        caps: Caps {
            max_steps_per_tenant: 20,
            max_bytes_per_tenant: 1 << 30,
            ..Caps::default()
        },
        ..RedisConfig::single(redis_url())
    };
    let store = RedisStore::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut ids: Vec<TrajectoryId> = Vec::new();
    for _ in 0..6 {
        let traj = open_trajectory(&t);
        store
            .upsert_trajectory(&traj)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let steps: Vec<_> = (0..5).map(|i| step_of(&t, &traj.id, i, 1024)).collect();
        store
            .append_steps(&steps)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ids.push(traj.id);
    }
    // 30 steps written against a cap of 20: whenever a batch goes over, trimmed back under 18
    // (90%), oldest first.
    let listed = store
        .list_trajectories(&t, None, 100)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let kept: Vec<_> = listed.iter().map(|x| x.id).collect();
    assert!(kept.len() * 5 <= 20, "kept {} trajectories", kept.len());
    assert!(kept.len() < ids.len(), "nothing was trimmed");
    assert!(!kept.is_empty());
    assert_eq!(
        kept,
        ids[ids.len() - kept.len()..].to_vec(),
        "not the newest were kept"
    );
    assert!(store
        .trajectory(&t, &ids[0])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    let newest = store
        .trajectory(&t, &ids[5])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the newest is kept"));
    assert_eq!(newest.steps.len(), 5);
}

/// On Redis, what the tenant's usage counts is what it holds.
#[tokio::test]
async fn headers_and_next_states_count_against_the_tenants_byte_cap() {
    let (t, _keys) = tenant("metadata-cap");
    let (other, _other_keys) = tenant("metadata-cap-other");
    let config = RedisConfig {
        caps: Caps {
            max_bytes_per_tenant: scenarios::BYTE_CAP,
            ..Caps::default()
        },
        ..RedisConfig::single(redis_url())
    };
    let store = RedisStore::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let kept =
        scenarios::headers_and_next_states_count_against_the_byte_cap(&store, &t, &other).await;
    let client = redis::Client::open(redis_url()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let counted: u64 = redis::cmd("HGET")
        .arg(format!("clawback:{{{t}}}:usage"))
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(counted <= scenarios::BYTE_CAP, "{counted} bytes counted");
    assert!(
        counted >= kept.len() as u64 * (25 << 10),
        "{counted} bytes counted"
    );
}

#[tokio::test]
async fn a_policy_switch_is_published_to_the_tenants_channel() {
    let (t, _keys) = tenant("notify");
    let store = store().await;
    let client = redis::Client::open(redis_url()).unwrap_or_else(|e| panic!("{e}"));
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let channel = clawback_datapool::keys::policy_changed(&t);
    pubsub
        .subscribe(&channel)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let policy = PolicyVersion {
        schema_version: 1,
        tenant: t.clone(),
        adapter: format!("{t}@v9"),
        version: 9,
        live_since: UnixMs::now(),
        canary: None,
    };
    store
        .set_policy_version(&policy)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    use futures_util::StreamExt;
    let msg = tokio::time::timeout(Duration::from_secs(10), pubsub.on_message().next())
        .await
        .unwrap_or_else(|_| panic!("no notification within 10s"))
        .unwrap_or_else(|| panic!("pubsub closed"));
    let payload: String = msg.get_payload().unwrap_or_else(|e| panic!("{e}"));
    let got: PolicyVersion = serde_json::from_str(&payload).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, policy);
}

#[tokio::test]
async fn credentials_come_from_the_url() {
    let server = common::RedisServer::start_with_args(&["--requirepass", "s3cret-pass"]);
    let with_password = format!("redis://:s3cret-pass@127.0.0.1:{}", server.port);
    let store = RedisStore::connect(&RedisConfig::single(with_password))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .ping()
        .await
        .unwrap_or_else(|e| panic!("AUTH from the URL failed: {e}"));
    let t = fresh_tenant("auth");
    scenarios::the_live_policy_only_moves_forward(&store, &t).await;

    let wrong = format!("redis://:nope@127.0.0.1:{}", server.port);
    let refused = match RedisStore::connect(&RedisConfig::single(wrong)).await {
        Ok(store) => store.ping().await,
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "a wrong password was accepted");
}

#[tokio::test]
async fn a_rediss_url_is_accepted_for_tls() {
    // Nothing listens there: this checks the TLS scheme is understood (connections are lazy).
    let config = RedisConfig::single(format!("rediss://127.0.0.1:{}", common::free_port()));
    let store = RedisStore::connect(&config).await;
    assert!(
        store.is_ok(),
        "rediss:// refused: {:?}",
        store.err().map(|e| e.to_string())
    );
}

#[tokio::test]
async fn a_step_appended_twice_reads_back_once() {
    let (t, _keys) = tenant("replayed");
    scenarios::a_step_appended_twice_reads_back_once(&store().await, &t).await;
}

#[tokio::test]
async fn a_completion_before_its_last_steps_waits_for_them() {
    let (t, _keys) = tenant("short");
    scenarios::a_completion_before_its_last_steps_waits_for_them(&store().await, &t).await;
}

#[tokio::test]
async fn a_completion_before_its_header_takes_effect_with_the_header() {
    let (t, _keys) = tenant("early-complete");
    scenarios::a_completion_before_its_header_takes_effect_with_the_header(&store().await, &t)
        .await;
}
