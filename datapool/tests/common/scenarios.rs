//! Behaviour every [`Store`] must show, written once and run against each store: one Redis, a
//! Redis Cluster, SQLite. Each scenario gets its own tenant(s).

use std::time::{Duration, Instant};

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{
    Canary, Complete, CompletionReason, Consumer, ConsumerName, Delivery, Error, GateDecision,
    GateSetScore, GroupId, GroupState, NextState, PolicyVersion, ReadyItem, Rollback,
    RollbackOutcome, Store, TenantId, TrajectoryId, TrajectoryStatus, UnixMs, GATE_DECISIONS_KEPT,
};

use super::{open_trajectory, step_of};

fn name(s: &str) -> ConsumerName {
    ConsumerName::new(s).unwrap_or_else(|e| panic!("{e}"))
}

/// A consumer of the `trainers` group that takes over entries idle for `claim_idle`.
pub fn consumer(member: &str, claim_idle: Duration, max_deliveries: u32) -> Consumer {
    Consumer {
        claim_idle,
        max_deliveries,
        ..Consumer::new(name("trainers"), name(member))
    }
}

/// Reads until at least `n` deliveries came or `within` passed (redelivery waits on idle time,
/// so tests poll with a generous bound instead of sleeping a tight margin).
pub async fn read_at_least(
    store: &dyn Store,
    tenant: &TenantId,
    consumer: &Consumer,
    n: usize,
    within: Duration,
) -> Vec<Delivery> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        let batch = store
            .read_ready(tenant, consumer, n - got.len())
            .await
            .unwrap_or_else(|e| panic!("read_ready: {e}"));
        got.extend(batch);
        if got.len() >= n {
            break;
        }
        assert!(
            start.elapsed() < within,
            "only {} of {n} deliveries within {within:?}",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    got
}

async fn complete(
    store: &dyn Store,
    tenant: &TenantId,
    id: TrajectoryId,
) -> clawback_datapool::Completed {
    store
        .complete_trajectory(&Complete::now(
            tenant.clone(),
            id,
            CompletionReason::Handshake,
        ))
        .await
        .unwrap_or_else(|e| panic!("complete: {e}"))
}

/// The SCHEMA.md example, written piece by piece as the recorder would, reads back equal.
pub async fn a_recorded_trajectory_reads_back_as_written(store: &dyn Store, tenant: &TenantId) {
    let expected = tool_use_trajectory(tenant.clone());
    let mut header = expected.trajectory.clone();
    header.status = TrajectoryStatus::Open;
    header.completed_at = None;
    header.completion = None;
    store
        .upsert_trajectory(&header)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));

    let mut steps = expected.steps.clone();
    let next_states: Vec<_> = steps.iter_mut().map(|s| s.next_state.take()).collect();
    store
        .append_steps(&steps)
        .await
        .unwrap_or_else(|e| panic!("append: {e}"));
    for (step, next) in steps.iter().zip(next_states) {
        let next = next.unwrap_or_else(|| panic!("the example has next states"));
        store
            .set_next_state(tenant, &header.id, &step.id, &next)
            .await
            .unwrap_or_else(|e| panic!("next state: {e}"));
    }
    store
        .append_evaluations(&expected.evaluations)
        .await
        .unwrap_or_else(|e| panic!("evaluations: {e}"));
    let done = store
        .complete_trajectory(&Complete {
            tenant: tenant.clone(),
            trajectory: header.id,
            status: TrajectoryStatus::Completed,
            reason: CompletionReason::Handshake,
            at: expected.trajectory.completed_at.unwrap_or_default(),
            steps: None,
        })
        .await
        .unwrap_or_else(|e| panic!("complete: {e}"));
    assert!(done.newly_finished);
    assert_eq!(done.enqueued, Some(ReadyItem::Trajectory(header.id)));

    let got = store
        .trajectory(tenant, &header.id)
        .await
        .unwrap_or_else(|e| panic!("fetch: {e}"))
        .unwrap_or_else(|| panic!("the trajectory is there"));
    assert_eq!(got, expected);

    // A second done signal changes nothing and enqueues nothing.
    let again = complete(store, tenant, header.id).await;
    assert!(!again.newly_finished);
    assert_eq!(again.enqueued, None);
    assert!(store.tenants().await.unwrap_or_default().contains(tenant));
}

/// Steps appended in batches over several trajectories keep their order per trajectory.
pub async fn batched_steps_keep_their_order(store: &dyn Store, tenant: &TenantId) {
    let a = open_trajectory(tenant);
    let b = open_trajectory(tenant);
    for t in [&a, &b] {
        store
            .upsert_trajectory(t)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
    }
    for batch in 0..4u32 {
        let steps: Vec<_> = (0..5u32)
            .flat_map(|i| {
                let index = batch * 5 + i;
                [
                    step_of(tenant, &a.id, index, 512),
                    step_of(tenant, &b.id, index, 512),
                ]
            })
            .collect();
        store
            .append_steps(&steps)
            .await
            .unwrap_or_else(|e| panic!("append: {e}"));
    }
    for t in [&a, &b] {
        let got = store
            .trajectory(tenant, &t.id)
            .await
            .unwrap_or_else(|e| panic!("fetch: {e}"))
            .unwrap_or_else(|| panic!("present"));
        let indices: Vec<u32> = got.steps.iter().map(|s| s.index).collect();
        assert_eq!(indices, (0..20).collect::<Vec<_>>());
        assert!(got.steps.windows(2).all(|w| w[0].id < w[1].id));
    }
    let listed = store
        .list_trajectories(tenant, None, 10)
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(
        listed.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![a.id, b.id]
    );
    let after_a = store
        .list_trajectories(tenant, Some(&a.id), 10)
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(after_a.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b.id]);
}

/// A consumer reads a batch and dies before acking part of it: after the idle time another
/// member of the group gets exactly the unacked entries, marked as redelivered.
pub async fn a_dead_consumers_unacked_entries_are_redelivered(
    store: &dyn Store,
    tenant: &TenantId,
) {
    let idle = Duration::from_millis(300);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let t = open_trajectory(tenant);
        store
            .upsert_trajectory(&t)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
        complete(store, tenant, t.id).await;
        ids.push(t.id);
    }
    let alice = consumer("alice", idle, 5);
    let bob = consumer("bob", idle, 5);
    let first = read_at_least(store, tenant, &alice, 3, Duration::from_secs(10)).await;
    assert_eq!(
        first.iter().map(|d| d.item).collect::<Vec<_>>(),
        ids.iter()
            .map(|id| ReadyItem::Trajectory(*id))
            .collect::<Vec<_>>()
    );
    assert!(first.iter().all(|d| d.deliveries == 1));
    store
        .ack(tenant, &alice.group, &[first[0].id.clone()])
        .await
        .unwrap_or_else(|e| panic!("ack: {e}"));
    // alice dies here. Before the idle time nothing is handed to bob (checked at once: the bound
    // is the idle time, and we are well inside it only if the machine is not stalled; so only a
    // non-empty answer made of new entries would be wrong, and there are none).
    let redelivered = read_at_least(store, tenant, &bob, 2, Duration::from_secs(30)).await;
    let mut items: Vec<_> = redelivered.iter().map(|d| d.item).collect();
    items.sort_by_key(|i| format!("{i:?}"));
    let mut want = vec![ReadyItem::Trajectory(ids[1]), ReadyItem::Trajectory(ids[2])];
    want.sort_by_key(|i| format!("{i:?}"));
    assert_eq!(items, want);
    assert!(
        redelivered.iter().all(|d| d.deliveries == 2),
        "{redelivered:?}"
    );
    let ids_to_ack: Vec<_> = redelivered.iter().map(|d| d.id.clone()).collect();
    store
        .ack(tenant, &bob.group, &ids_to_ack)
        .await
        .unwrap_or_else(|e| panic!("ack: {e}"));
    tokio::time::sleep(idle * 2).await;
    let nothing = store
        .read_ready(tenant, &bob, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(nothing.is_empty(), "acked entries came back: {nothing:?}");
    // Another consumer group reads the queue independently, from the start.
    let exporter = Consumer::new(name("exporters"), name("x1"));
    let all = read_at_least(store, tenant, &exporter, 3, Duration::from_secs(10)).await;
    assert_eq!(all.len(), 3);
}

/// An entry that was delivered `max_deliveries` times without an ack is dead-lettered, not
/// handed out again.
pub async fn a_poison_entry_is_dead_lettered(store: &dyn Store, tenant: &TenantId) {
    let idle = Duration::from_millis(200);
    let t = open_trajectory(tenant);
    store
        .upsert_trajectory(&t)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    complete(store, tenant, t.id).await;
    let c1 = consumer("c1", idle, 2);
    let c2 = consumer("c2", idle, 2);
    let first = read_at_least(store, tenant, &c1, 1, Duration::from_secs(10)).await;
    let second = read_at_least(store, tenant, &c2, 1, Duration::from_secs(30)).await;
    assert_eq!(second[0].item, first[0].item);
    assert_eq!(second[0].deliveries, 2);
    // Delivered twice, never acked: the next take-over dead-letters it instead.
    let start = Instant::now();
    let dead = loop {
        let got = store
            .read_ready(tenant, &c1, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            got.is_empty(),
            "a poison entry was delivered a third time: {got:?}"
        );
        let dead = store
            .dead_letters(tenant, &c1.group, 10)
            .await
            .unwrap_or_else(|e| panic!("dead letters: {e}"));
        if !dead.is_empty() {
            break dead;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].item, ReadyItem::Trajectory(t.id));
    assert_eq!(dead[0].id, first[0].id);
    assert_eq!(dead[0].deliveries, 2);
    assert_eq!(dead[0].last_consumer, "c2");
}

/// A group is ready only when all its members finished, and is delivered as one item.
pub async fn a_group_is_ready_when_all_members_finished(store: &dyn Store, tenant: &TenantId) {
    let group = GroupId::new();
    let members: Vec<_> = (0..3)
        .map(|_| open_trajectory(tenant).in_group(group, 3))
        .collect();
    for m in &members {
        store
            .upsert_trajectory(m)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
    }
    let trainer = consumer("t1", Duration::from_secs(60), 5);
    assert_eq!(complete(store, tenant, members[0].id).await.enqueued, None);
    let abandoned = store
        .complete_trajectory(&Complete {
            status: TrajectoryStatus::Abandoned,
            ..Complete::now(tenant.clone(), members[1].id, CompletionReason::IdleTimeout)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(abandoned.enqueued, None);
    assert!(store
        .read_ready(tenant, &trainer, 10)
        .await
        .unwrap_or_default()
        .is_empty());
    let g = store
        .group(tenant, &group)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.map(|g| g.state), Some(GroupState::Open));

    let last = complete(store, tenant, members[2].id).await;
    assert_eq!(last.enqueued, Some(ReadyItem::Group(group)));
    let got = read_at_least(store, tenant, &trainer, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].item, ReadyItem::Group(group));
    let g = store
        .group(tenant, &group)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("group present"));
    assert_eq!(g.state, GroupState::Ready);
    assert_eq!(g.size, 3);
    assert_eq!(g.members, members.iter().map(|m| m.id).collect::<Vec<_>>());
    assert_eq!(g.finished, members.iter().map(|m| m.id).collect::<Vec<_>>());
    let member = store
        .trajectory(tenant, &members[1].id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("present"));
    assert_eq!(member.trajectory.status, TrajectoryStatus::Abandoned);
    assert_eq!(member.trajectory.group.map(|g| g.id), Some(group));
    // Expiry leaves settled groups alone.
    let expired = store
        .expire_groups(tenant, UnixMs(UnixMs::now().0 + 60_000))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(expired.is_empty());
}

/// A group whose timeout passed is delivered as partial with the members that finished, and a
/// straggler finishing later does not enqueue it again.
pub async fn a_group_past_its_timeout_is_delivered_partial(store: &dyn Store, tenant: &TenantId) {
    let group = GroupId::new();
    let members: Vec<_> = (0..3)
        .map(|_| open_trajectory(tenant).in_group(group, 3))
        .collect();
    for m in &members {
        store
            .upsert_trajectory(m)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
    }
    complete(store, tenant, members[0].id).await;
    // Not yet due: created after the cut-off.
    let early = store
        .expire_groups(tenant, UnixMs(members[0].created_at.0.saturating_sub(1)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(early.is_empty());
    let expired = store
        .expire_groups(tenant, UnixMs(UnixMs::now().0 + 1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(expired, vec![group]);
    let g = store
        .group(tenant, &group)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("present"));
    assert_eq!(g.state, GroupState::Partial);
    assert_eq!(g.finished, vec![members[0].id]);
    assert!(g.settled_at.is_some());
    complete(store, tenant, members[1].id).await;
    complete(store, tenant, members[2].id).await;
    let trainer = consumer("t1", Duration::from_secs(60), 5);
    let got = read_at_least(store, tenant, &trainer, 1, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let more = store
        .read_ready(tenant, &trainer, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.len() + more.len(), 1, "the group was enqueued twice");
    assert_eq!(got[0].item, ReadyItem::Group(group));
}

/// Tenant `b` sees nothing of tenant `a`, even knowing `a`'s ids.
pub async fn tenants_never_see_each_others_data(store: &dyn Store, a: &TenantId, b: &TenantId) {
    let t = open_trajectory(a);
    store
        .upsert_trajectory(&t)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    store
        .append_steps(&[step_of(a, &t.id, 0, 1024)])
        .await
        .unwrap_or_else(|e| panic!("append: {e}"));
    complete(store, a, t.id).await;
    store
        .set_policy_version(&PolicyVersion {
            schema_version: 1,
            tenant: a.clone(),
            adapter: format!("{a}@v1"),
            version: 1,
            live_since: UnixMs::now(),
            canary: None,
        })
        .await
        .unwrap_or_else(|e| panic!("policy: {e}"));

    assert!(store
        .trajectory(b, &t.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    assert!(store
        .list_trajectories(b, None, 100)
        .await
        .unwrap_or_default()
        .is_empty());
    assert!(store
        .policy_version(b)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    let reader = consumer("r", Duration::from_millis(1), 5);
    assert!(store
        .read_ready(b, &reader, 10)
        .await
        .unwrap_or_default()
        .is_empty());
    // Completing `a`'s id as `b` only waits for a header of `b`'s that never comes: `b` still
    // sees nothing, and `a`'s trajectory is untouched.
    let done = store
        .complete_trajectory(&Complete::now(b.clone(), t.id, CompletionReason::Handshake))
        .await
        .unwrap_or_else(|e| panic!("complete as b: {e}"));
    assert!(done.deferred && done.enqueued.is_none(), "{done:?}");
    assert!(store
        .trajectory(b, &t.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    assert!(store
        .list_trajectories(b, None, 100)
        .await
        .unwrap_or_default()
        .is_empty());
    assert!(store
        .read_ready(b, &reader, 10)
        .await
        .unwrap_or_default()
        .is_empty());
    // And `a` does see its own.
    assert!(store
        .trajectory(a, &t.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_some());
    assert_eq!(
        read_at_least(store, a, &reader, 1, Duration::from_secs(10))
            .await
            .len(),
        1
    );
}

/// The live policy moves forward only; the same version again is a no-op.
pub async fn the_live_policy_only_moves_forward(store: &dyn Store, tenant: &TenantId) {
    assert_eq!(
        store
            .policy_version(tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        None
    );
    let v = |version: u64| PolicyVersion {
        schema_version: 1,
        tenant: tenant.clone(),
        adapter: format!("{tenant}@v{version}"),
        version,
        live_since: UnixMs(1_733_140_800_000 + version),
        canary: None,
    };
    store
        .set_policy_version(&v(3))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .set_policy_version(&v(3))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stale = store.set_policy_version(&v(2)).await;
    assert!(
        matches!(
            stale,
            Err(Error::StalePolicyVersion {
                attempted: 2,
                live: 3,
                ..
            })
        ),
        "{stale:?}"
    );
    store
        .set_policy_version(&v(4))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let live = || async {
        store
            .policy_version(tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(live().await, Some(v(4)));
    // The same version with a canary on trial, and again without: each replaces the record.
    let trial = v(4).with_canary(Some(Canary {
        adapter: format!("{tenant}@v5"),
        version: 5,
        percent: 10,
        since: UnixMs(1_733_140_900_000),
    }));
    store
        .set_policy_version(&trial)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(live().await, Some(trial));
    store
        .set_policy_version(&v(4))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(live().await, Some(v(4)));
}

/// A rollback order is read back as placed; the trainer's outcome is recorded against the order
/// it carried out, never over a newer one; a new order replaces a settled one.
pub async fn a_rollback_is_settled_only_against_its_own_order(
    store: &dyn Store,
    tenant: &TenantId,
) {
    let read = || async {
        store
            .rollback(tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(read().await, None);
    let order = |id: &str, to: u64| Rollback {
        schema_version: 1,
        tenant: tenant.clone(),
        id: id.to_owned(),
        to,
        from: 9,
        ordered_at: UnixMs(1_733_140_800_000),
        outcome: None,
    };
    let first = order("first", 3);
    store
        .order_rollback(&first)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read().await, Some(first.clone()));
    // The operator changed their mind before the trainer got to it.
    let second = order("second", 5);
    store
        .order_rollback(&second)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stale = Rollback {
        outcome: Some(RollbackOutcome::Done {
            at: UnixMs(1_733_140_801_000),
            version: 10,
        }),
        ..first
    };
    assert!(!store
        .settle_rollback(&stale)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(read().await, Some(second.clone()));
    let settled = Rollback {
        outcome: Some(RollbackOutcome::Failed {
            at: UnixMs(1_733_140_802_000),
            reason: "version 5 is not on disk".to_owned(),
        }),
        ..second
    };
    assert!(store
        .settle_rollback(&settled)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(read().await, Some(settled));
    let third = order("third", 2);
    store
        .order_rollback(&third)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read().await, Some(third));
}

/// Gate decisions are read back newest first, at most the limit, the latest
/// `GATE_DECISIONS_KEPT` kept; another tenant's are not among them.
pub async fn gate_decisions_keep_the_latest_of_their_tenant(
    store: &dyn Store,
    tenant: &TenantId,
    other: &TenantId,
) {
    let decision = |tenant: &TenantId, version: u64| GateDecision {
        schema_version: 1,
        tenant: tenant.clone(),
        version,
        live: version.checked_sub(1).filter(|v| *v > 0),
        promoted: version.is_multiple_of(2),
        reasons: if version.is_multiple_of(2) {
            Vec::new()
        } else {
            vec![format!("retention: {version} fewer")]
        },
        sets: vec![GateSetScore {
            name: "retention".to_owned(),
            prompts: 40,
            candidate: 20,
            live: 22,
            base: 23,
        }],
        kl: 0.01 * version as f64,
        seconds: 1.5,
        decided_at: UnixMs(1_733_140_800_000 + version),
    };
    let read = |tenant: &TenantId, limit: usize| {
        let tenant = tenant.clone();
        async move {
            store
                .gate_decisions(&tenant, limit)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    assert_eq!(read(tenant, 10).await, Vec::new());
    let kept = GATE_DECISIONS_KEPT as u64;
    for version in 1..=kept + 3 {
        store
            .record_gate_decision(&decision(tenant, version))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    store
        .record_gate_decision(&decision(other, 1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let latest = read(tenant, 3).await;
    assert_eq!(
        latest,
        vec![
            decision(tenant, kept + 3),
            decision(tenant, kept + 2),
            decision(tenant, kept + 1)
        ]
    );
    let all = read(tenant, usize::MAX).await;
    assert_eq!(all.len(), GATE_DECISIONS_KEPT);
    assert_eq!(all.last(), Some(&decision(tenant, 4)));
    assert_eq!(read(other, 10).await, vec![decision(other, 1)]);
    assert_eq!(read(tenant, 0).await, Vec::new());
}

/// Next states and evaluations attach to the right steps.
pub async fn next_states_attach_to_their_step(store: &dyn Store, tenant: &TenantId) {
    let t = open_trajectory(tenant);
    store
        .upsert_trajectory(&t)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    let steps = vec![
        step_of(tenant, &t.id, 0, 256),
        step_of(tenant, &t.id, 1, 256),
    ];
    store
        .append_steps(&steps)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let next = NextState {
        messages: vec![serde_json::json!({"role": "user", "content": "and tomorrow?"})],
        observed_at: UnixMs::now(),
    };
    store
        .set_next_state(tenant, &t.id, &steps[0].id, &next)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let got = store
        .trajectory(tenant, &t.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("present"));
    assert_eq!(got.steps[0].next_state.as_ref(), Some(&next));
    assert_eq!(got.steps[1].next_state, None);
    assert_eq!(got.trajectory.status, TrajectoryStatus::Open);
}

/// Each consumer group's lag: entries no member was handed yet, and entries handed but unacked.
pub async fn consumer_lag_counts_what_each_group_has_not_finished(
    store: &dyn Store,
    tenant: &TenantId,
) {
    let lags = || async {
        store
            .consumer_lag(tenant)
            .await
            .unwrap_or_else(|e| panic!("consumer_lag: {e}"))
    };
    assert!(lags().await.is_empty(), "no group reads yet");
    for _ in 0..3 {
        let t = open_trajectory(tenant);
        store
            .upsert_trajectory(&t)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
        complete(store, tenant, t.id).await;
    }
    let trainer = consumer("t1", Duration::from_secs(60), 5);
    let taken = read_at_least(store, tenant, &trainer, 2, Duration::from_secs(10)).await;
    store
        .ack(tenant, &trainer.group, &[taken[0].id.clone()])
        .await
        .unwrap_or_else(|e| panic!("ack: {e}"));
    let evaluator = Consumer::new(name("evaluators"), name("e1"));
    read_at_least(store, tenant, &evaluator, 1, Duration::from_secs(10)).await;

    let mut now = lags().await;
    now.sort_by(|a, b| a.group.cmp(&b.group));
    let seen: Vec<(&str, Option<u64>, u64)> = now
        .iter()
        .map(|l| (l.group.as_str(), l.undelivered, l.pending))
        .collect();
    assert_eq!(
        seen,
        [("evaluators", Some(2), 1), ("trainers", Some(1), 1)],
        "(group, undelivered, pending)"
    );
}

/// A write replayed after its reply was lost (the spool replays at least once) is the same
/// write: the step appended twice reads back once, in its place.
pub async fn a_step_appended_twice_reads_back_once(store: &dyn Store, tenant: &TenantId) {
    let t = open_trajectory(tenant);
    store
        .upsert_trajectory(&t)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    let first = step_of(tenant, &t.id, 0, 64);
    let second = step_of(tenant, &t.id, 1, 64);
    for batch in [
        vec![first.clone()],
        vec![first.clone()],
        vec![second.clone()],
    ] {
        store
            .append_steps(&batch)
            .await
            .unwrap_or_else(|e| panic!("append: {e}"));
    }
    let got = store
        .trajectory(tenant, &t.id)
        .await
        .unwrap_or_else(|e| panic!("fetch: {e}"))
        .unwrap_or_else(|| panic!("present"));
    assert_eq!(
        got.steps.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![first.id, second.id]
    );
}

/// Replicas' writes land in any order: a completion written before the trajectory's header
/// (another replica's write still on its way) takes effect when the header arrives — for a
/// single trajectory and for the last member of a group.
pub async fn a_completion_before_its_header_takes_effect_with_the_header(
    store: &dyn Store,
    tenant: &TenantId,
) {
    let single = open_trajectory(tenant);
    let done = complete(store, tenant, single.id).await;
    assert!(done.deferred && done.enqueued.is_none(), "{done:?}");
    assert!(store
        .trajectory(tenant, &single.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    // A second completion of it changes nothing.
    assert!(!complete(store, tenant, single.id).await.newly_finished);
    store
        .upsert_trajectory(&single)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    let record = store
        .trajectory(tenant, &single.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the header arrived"));
    assert_eq!(record.trajectory.status, TrajectoryStatus::Completed);
    assert_eq!(
        record.trajectory.completion,
        Some(CompletionReason::Handshake)
    );
    let reader = consumer("r", Duration::from_secs(60), 5);
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Trajectory(single.id));

    let group = GroupId::new();
    let members: Vec<_> = (0..2)
        .map(|_| {
            let mut t = open_trajectory(tenant);
            t.group = Some(clawback_datapool::GroupMembership { id: group, size: 2 });
            t
        })
        .collect();
    store
        .upsert_trajectory(&members[0])
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    complete(store, tenant, members[0].id).await;
    assert!(complete(store, tenant, members[1].id).await.deferred);
    store
        .upsert_trajectory(&members[1])
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Group(group));
}

/// In a pool a completion may land before another replica's last steps: it is enqueued once the
/// steps it counted are in, so the trainer never gets the trajectory short of them — or, when
/// they never come (their replica died first), by the overdue sweep with the steps there are.
pub async fn a_completion_before_its_last_steps_waits_for_them(
    store: &dyn Store,
    tenant: &TenantId,
) {
    let reader = consumer("r", Duration::from_secs(60), 5);
    let append = |t: TrajectoryId, index: u32| async move {
        store
            .append_steps(&[step_of(tenant, &t, index, 64)])
            .await
            .unwrap_or_else(|e| panic!("append: {e}"));
    };
    let complete_after = |t: TrajectoryId, steps: u32| async move {
        store
            .complete_trajectory(
                &Complete::now(tenant.clone(), t, CompletionReason::Handshake).after_steps(steps),
            )
            .await
            .unwrap_or_else(|e| panic!("complete: {e}"))
    };
    let release = |before: UnixMs| async move {
        store
            .release_overdue(tenant, before)
            .await
            .unwrap_or_else(|e| panic!("release_overdue: {e}"))
    };
    let nothing_ready = || async {
        let ready = store
            .read_ready(tenant, &reader, 10)
            .await
            .unwrap_or_else(|e| panic!("read_ready: {e}"));
        assert!(ready.is_empty(), "enqueued short of its steps: {ready:?}");
    };
    let later = UnixMs(UnixMs::now().0 + 3_600_000);

    // Three steps counted, one written: it waits; a second completion changes nothing.
    let t = open_trajectory(tenant);
    store
        .upsert_trajectory(&t)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    append(t.id, 0).await;
    let done = complete_after(t.id, 3).await;
    assert!(
        done.newly_finished && done.deferred && done.enqueued.is_none(),
        "{done:?}"
    );
    assert!(!complete(store, tenant, t.id).await.newly_finished);
    append(t.id, 1).await;
    nothing_ready().await;
    // Not overdue yet: the sweep leaves it.
    assert!(release(UnixMs(1)).await.is_empty());
    append(t.id, 2).await;
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Trajectory(t.id));
    let record = store
        .trajectory(tenant, &t.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("present"));
    assert_eq!(record.steps.len(), 3);
    assert_eq!(record.trajectory.status, TrajectoryStatus::Completed);

    // Its last step never comes: the overdue sweep enqueues it with what it has, once.
    let lost = open_trajectory(tenant);
    store
        .upsert_trajectory(&lost)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    append(lost.id, 0).await;
    assert!(complete_after(lost.id, 2).await.deferred);
    nothing_ready().await;
    assert_eq!(release(later).await, vec![lost.id]);
    assert!(release(later).await.is_empty());
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Trajectory(lost.id));

    // Neither header nor step written yet: the sweep cannot release what has no header; the
    // header alone is not enough; the step makes it ready.
    let late = open_trajectory(tenant);
    assert!(complete_after(late.id, 1).await.deferred);
    assert!(release(later).await.is_empty());
    store
        .upsert_trajectory(&late)
        .await
        .unwrap_or_else(|e| panic!("upsert: {e}"));
    nothing_ready().await;
    append(late.id, 0).await;
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Trajectory(late.id));

    // A group's last member counts as finished only with its steps.
    let group = GroupId::new();
    let members: Vec<_> = (0..2)
        .map(|_| {
            let mut t = open_trajectory(tenant);
            t.group = Some(clawback_datapool::GroupMembership { id: group, size: 2 });
            t
        })
        .collect();
    for m in &members {
        store
            .upsert_trajectory(m)
            .await
            .unwrap_or_else(|e| panic!("upsert: {e}"));
        append(m.id, 0).await;
    }
    complete_after(members[0].id, 1).await;
    assert!(complete_after(members[1].id, 2).await.deferred);
    nothing_ready().await;
    append(members[1].id, 1).await;
    let ready = read_at_least(store, tenant, &reader, 1, Duration::from_secs(10)).await;
    assert_eq!(ready[0].item, ReadyItem::Group(group));
}

/// The byte cap [`headers_and_next_states_count_against_the_byte_cap`] runs under.
pub const BYTE_CAP: u64 = 64 << 10;

/// What an agent sends besides its steps counts too: its request's `metadata`, copied into
/// each trajectory header, and the next states (tool results, the user's replies). Eight
/// trajectories of a 16 KiB header, a 1 KiB step and an 8 KiB next state against a cap of
/// [`BYTE_CAP`] (the store is opened with it) keep the newest one or two, where the steps alone
/// (8 KiB) would never reach it; `other`, a tenant under its cap, keeps all it wrote. The
/// trajectories kept.
pub async fn headers_and_next_states_count_against_the_byte_cap(
    store: &dyn Store,
    tenant: &TenantId,
    other: &TenantId,
) -> Vec<TrajectoryId> {
    let others = open_trajectory(other);
    store
        .upsert_trajectory(&others)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut ids: Vec<TrajectoryId> = Vec::new();
    for _ in 0..8 {
        let mut traj = open_trajectory(tenant);
        traj.metadata.insert(
            clawback_datapool::AGENT_METADATA_KEY.to_owned(),
            serde_json::json!({"blob": "m".repeat(16 << 10)}),
        );
        store
            .upsert_trajectory(&traj)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let step = step_of(tenant, &traj.id, 0, 1024);
        store
            .append_steps(std::slice::from_ref(&step))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let next = NextState {
            messages: vec![serde_json::json!({"role": "tool", "content": "r".repeat(8 << 10)})],
            observed_at: UnixMs::now(),
        };
        store
            .set_next_state(tenant, &traj.id, &step.id, &next)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ids.push(traj.id);
    }
    let kept: Vec<TrajectoryId> = store
        .list_trajectories(tenant, None, 100)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|x| x.id)
        .collect();
    assert!(
        (1..=2).contains(&kept.len()),
        "kept {} of 8 trajectories of 25 KiB each under a cap of 64 KiB",
        kept.len()
    );
    let mut newest = ids[ids.len() - kept.len()..].to_vec();
    let mut sorted = kept.clone();
    newest.sort();
    sorted.sort();
    assert_eq!(sorted, newest, "not the newest were kept");
    let last = store
        .trajectory(tenant, &ids[7])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the newest is kept"));
    assert_eq!(last.steps.len(), 1);
    assert!(store
        .trajectory(tenant, &ids[0])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    assert!(store
        .trajectory(other, &others.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_some());
    kept
}
