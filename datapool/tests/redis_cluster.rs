//! `RedisStore` on a real 3-master Redis Cluster started on loopback ports for this test: the
//! common store behaviour, with tenants spread over the masters, and every key of a tenant on one
//! slot.

mod common;

use std::collections::HashSet;
use std::process::Command;

use clawback_datapool::{RedisConfig, RedisStore, TenantId};
use common::{fresh_tenant, RedisCluster};
use common::{scenarios, sessions};

/// The cluster slot of `key`, asked of the node on `port`.
fn slot(port: u16, key: &str) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "keyslot", key])
        .output()
        .unwrap_or_else(|e| panic!("redis-cli: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every key of `tenant` in the cluster (asked of each master: a key lives on one).
fn keys_of(cluster: &RedisCluster, tenant: &TenantId) -> Vec<(u16, String)> {
    let mut keys = Vec::new();
    for node in &cluster.nodes {
        let out = Command::new("redis-cli")
            .args(["-p", &node.port.to_string(), "--scan", "--pattern"])
            .arg(format!("clawback:{{{tenant}}}:*"))
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}"));
        for key in String::from_utf8_lossy(&out.stdout).lines() {
            keys.push((node.port, key.to_string()));
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_on_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&RedisConfig::cluster(cluster.seeds()))
        .await
        .unwrap_or_else(|e| panic!("connect to the cluster: {e}"));

    let tenants: Vec<TenantId> = (0..9).map(|i| fresh_tenant(&format!("c{i}"))).collect();
    scenarios::a_recorded_trajectory_reads_back_as_written(&store, &tenants[0]).await;
    scenarios::batched_steps_keep_their_order(&store, &tenants[1]).await;
    scenarios::a_dead_consumers_unacked_entries_are_redelivered(&store, &tenants[2]).await;
    scenarios::a_poison_entry_is_dead_lettered(&store, &tenants[3]).await;
    scenarios::a_group_is_ready_when_all_members_finished(&store, &tenants[4]).await;
    scenarios::a_group_past_its_timeout_is_delivered_partial(&store, &tenants[5]).await;
    scenarios::tenants_never_see_each_others_data(&store, &tenants[6], &tenants[7]).await;
    scenarios::the_live_policy_only_moves_forward(&store, &tenants[8]).await;
    scenarios::next_states_attach_to_their_step(&store, &tenants[8]).await;
    scenarios::a_completion_before_its_header_takes_effect_with_the_header(
        &store,
        &fresh_tenant("c-early"),
    )
    .await;
    scenarios::a_completion_before_its_last_steps_waits_for_them(&store, &fresh_tenant("c-short"))
        .await;
    // Shared session state: its scripts find keys of the trajectory they look up, all on the
    // tenant's slot.
    let s: &dyn clawback_datapool::Sessions = &store;
    sessions::a_call_continues_the_trajectory_whose_history_and_reply_it_extends(s, &tenants[1])
        .await;
    sessions::a_key_two_trajectories_hold_is_never_guessed(s, &tenants[2]).await;
    sessions::a_repeated_join_or_step_done_gets_its_first_answer(s, &fresh_tenant("c-repeated"))
        .await;
    sessions::a_call_whose_join_answer_was_lost_is_forgotten_and_frees_its_trajectory(
        s,
        &fresh_tenant("c-lost-join"),
    )
    .await;
    sessions::a_completion_waits_for_the_calls_in_flight_and_is_answered_once(s, &tenants[3]).await;
    sessions::racing_calls_of_one_session_share_a_trajectory_and_number_their_steps_once(
        std::sync::Arc::new(store.clone()),
        &tenants[4],
    )
    .await;
    sessions::the_idle_sweep_finishes_each_trajectory_once_across_replicas(
        std::sync::Arc::new(store.clone()),
        &tenants[5],
    )
    .await;
    sessions::a_completion_nobody_wrote_is_taken_over_once(
        std::sync::Arc::new(store.clone()),
        &fresh_tenant("c-takeover"),
    )
    .await;

    // Each tenant's keys share one slot (so its scripts and pipelines stay on one master), and
    // the tenants are spread over more than one master.
    let mut masters = HashSet::new();
    for tenant in &tenants {
        let keys = keys_of(&cluster, tenant);
        assert!(!keys.is_empty(), "tenant {tenant} has no keys");
        let port = cluster.nodes[0].port;
        let slots: HashSet<String> = keys.iter().map(|(_, k)| slot(port, k)).collect();
        assert_eq!(slots.len(), 1, "tenant {tenant} spans slots {slots:?}");
        let nodes: HashSet<u16> = keys.iter().map(|(p, _)| *p).collect();
        assert_eq!(nodes.len(), 1);
        masters.extend(nodes);
    }
    assert!(masters.len() > 1, "all 9 tenants hashed to one master");
}
