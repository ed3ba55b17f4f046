//! Behaviour every [`Sessions`] must show, written once and run against each: SQLite in memory
//! and in a file, one Redis, a Redis Cluster. Each scenario gets its own tenant; times are
//! given, not slept.

use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{
    Anchor, CompletionReason, Finish, Join, Joined, Prefix, Sessions, StepDone, StepId, StitchKey,
    TenantId, Timing, TrajectoryId, UnixMs,
};

pub const TIMING: Timing = Timing {
    idle: Duration::from_secs(60),
    stale_call: Duration::from_secs(600),
    completion_lease: Duration::from_secs(60),
};

fn t0() -> UnixMs {
    UnixMs::now()
}

fn later(at: UnixMs, by: Duration) -> UnixMs {
    UnixMs(at.0 + by.as_millis() as u64)
}

fn key() -> u128 {
    uuid::Uuid::now_v7().as_u128() ^ 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834
}

fn join_as(tenant: &TenantId, anchor: Anchor, now: UnixMs) -> (Join, StepId) {
    let call = StepId::new();
    let join = Join {
        tenant: tenant.clone(),
        anchor,
        call: Some(call),
        open: TrajectoryId::new(),
        now,
    };
    (join, call)
}

async fn join(sessions: &dyn Sessions, join: &Join) -> Joined {
    sessions
        .join(join, TIMING)
        .await
        .unwrap_or_else(|e| panic!("join: {e}"))
}

/// Records the call `step` of `joined` as done, leaving `keys`; its index.
async fn done(
    sessions: &dyn Sessions,
    tenant: &TenantId,
    joined: &Joined,
    step: StepId,
    keys: &[u128],
    now: UnixMs,
) -> Option<u32> {
    let slot = sessions
        .step_done(
            &StepDone {
                tenant: tenant.clone(),
                answered: true,
                trajectory: joined.trajectory,
                step,
                covered: 3,
                keys: keys
                    .iter()
                    .map(|&hash| StitchKey {
                        hash,
                        context_rebuilt: false,
                    })
                    .collect(),
                finish: None,
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    assert!(slot.finishing.is_none(), "{slot:?}");
    slot.index
}

fn prefixes(hashes: &[(u128, u32)]) -> Anchor {
    Anchor::Prefixes(
        hashes
            .iter()
            .map(|&(hash, end)| Prefix { hash, end })
            .collect(),
    )
}

/// A call whose history extends a recorded call's history and reply continues its trajectory,
/// and learns the previous step and where the new part of the history starts.
pub async fn a_call_continues_the_trajectory_whose_history_and_reply_it_extends(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (first, call) = join_as(tenant, Anchor::New, now);
    let opened = join(sessions, &first).await;
    assert!(opened.opened && opened.previous.is_none());
    assert_eq!(opened.trajectory, first.open);
    let k1 = key();
    assert_eq!(
        done(sessions, tenant, &opened, call, &[k1], now).await,
        Some(0)
    );

    // Asked again (a lost reply), the step keeps its number.
    assert_eq!(
        done(sessions, tenant, &opened, call, &[k1], now).await,
        Some(0)
    );

    let (second, call2) = join_as(
        tenant,
        prefixes(&[(k1, 3)]),
        later(now, Duration::from_secs(1)),
    );
    let continued = join(sessions, &second).await;
    assert!(!continued.opened, "{continued:?}");
    assert_eq!(continued.trajectory, opened.trajectory);
    assert_eq!(
        continued.previous.map(|p| (p.step, p.covered)),
        Some((call, 3))
    );
    assert_eq!(continued.matched.map(|m| m.end), Some(3));
    assert_eq!(continued.next_index, 1);
    assert_eq!(
        done(sessions, tenant, &continued, call2, &[key()], now).await,
        Some(1)
    );
}

/// Only the longest matching prefix decides, and a trajectory's older keys give way to its
/// newest: a call that branches from an older point starts a new trajectory.
pub async fn only_the_newest_and_longest_match_continues(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (first, call) = join_as(tenant, Anchor::New, now);
    let t = join(sessions, &first).await;
    let (k1, k2) = (key(), key());
    done(sessions, tenant, &t, call, &[k1], now).await;
    let (second, call2) = join_as(tenant, prefixes(&[(k1, 3)]), now);
    let t2 = join(sessions, &second).await;
    assert_eq!(t2.trajectory, t.trajectory);
    done(sessions, tenant, &t2, call2, &[k2], now).await;

    // The whole history: continues at the newest turn.
    let (whole, _) = join_as(tenant, prefixes(&[(k1, 3), (k2, 5)]), now);
    let joined = join(sessions, &whole).await;
    assert_eq!(joined.trajectory, t.trajectory);
    assert_eq!(joined.matched.map(|m| m.end), Some(5));
    assert_eq!(joined.previous.map(|p| p.step), Some(call2));

    // A branch from the first turn (an edited history): new.
    let (branch, _) = join_as(tenant, prefixes(&[(k1, 3), (key(), 5)]), now);
    let joined = join(sessions, &branch).await;
    assert!(joined.opened && !joined.ambiguous, "{joined:?}");
}

/// Two live trajectories that left the same key (identical rollouts that answered alike): a
/// call matching it starts a new trajectory, until neither holds it any more.
pub async fn a_key_two_trajectories_hold_is_never_guessed(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let shared = key();
    let mut rollouts = Vec::new();
    for _ in 0..2 {
        let (j, call) = join_as(tenant, Anchor::New, now);
        let t = join(sessions, &j).await;
        done(sessions, tenant, &t, call, &[shared], now).await;
        rollouts.push(t.trajectory);
    }
    let (j, _) = join_as(tenant, prefixes(&[(shared, 3)]), now);
    let joined = join(sessions, &j).await;
    assert!(joined.opened && joined.ambiguous, "{joined:?}");

    // One rollout finishes: which one still holds the key is not kept, so still no guess.
    let finished = sessions
        .finish(
            tenant,
            &rollouts[0],
            CompletionReason::Handshake,
            now,
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    assert!(matches!(finished, Finish::Now(_)), "{finished:?}");
    let (j, _) = join_as(tenant, prefixes(&[(shared, 3)]), now);
    assert!(join(sessions, &j).await.ambiguous);

    // Both finished: the key is gone, a plain new trajectory.
    sessions
        .finish(
            tenant,
            &rollouts[1],
            CompletionReason::Handshake,
            now,
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    let (j, _) = join_as(tenant, prefixes(&[(shared, 3)]), now);
    let joined = join(sessions, &j).await;
    assert!(joined.opened && !joined.ambiguous, "{joined:?}");
}

/// Calls of one named session racing from many replicas join one trajectory and get distinct,
/// consecutive step indexes.
pub async fn racing_calls_of_one_session_share_a_trajectory_and_number_their_steps_once(
    sessions: Arc<dyn Sessions>,
    tenant: &TenantId,
) {
    let now = t0();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let sessions = Arc::clone(&sessions);
        let tenant = tenant.clone();
        tasks.spawn(async move {
            let (j, call) = join_as(&tenant, Anchor::Name("agent-7".into()), now);
            let joined = join(&*sessions, &j).await;
            let index = done(&*sessions, &tenant, &joined, call, &[key()], now).await;
            (joined.trajectory, index)
        });
    }
    let mut trajectories = Vec::new();
    let mut indexes = Vec::new();
    while let Some(result) = tasks.join_next().await {
        let (trajectory, index) = result.unwrap_or_else(|e| panic!("task: {e}"));
        trajectories.push(trajectory);
        indexes.push(index.unwrap_or_else(|| panic!("a step without an index")));
    }
    trajectories.dedup();
    assert_eq!(trajectories.len(), 1, "one session, one trajectory");
    indexes.sort_unstable();
    assert_eq!(indexes, (0..8).collect::<Vec<u32>>());
}

/// A completion asked for while a call is in flight waits for it, and whoever records that
/// call is told to write it — once.
pub async fn a_completion_waits_for_the_calls_in_flight_and_is_answered_once(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, call) = join_as(tenant, Anchor::Name("s".into()), now);
    let t = join(sessions, &j).await;
    for _ in 0..2 {
        let finished = sessions
            .finish(
                tenant,
                &t.trajectory,
                CompletionReason::Handshake,
                now,
                TIMING,
            )
            .await
            .unwrap_or_else(|e| panic!("finish: {e}"));
        assert_eq!(finished, Finish::Deferred);
    }
    let slot = sessions
        .step_done(
            &StepDone {
                tenant: tenant.clone(),
                answered: true,
                trajectory: t.trajectory,
                step: call,
                covered: 2,
                keys: vec![StitchKey {
                    hash: key(),
                    context_rebuilt: true,
                }],
                finish: None,
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    assert_eq!(slot.index, Some(0));
    let finishing = slot.finishing.unwrap_or_else(|| panic!("not finished"));
    assert_eq!(finishing.trajectory, t.trajectory);
    assert_eq!(finishing.reason, CompletionReason::Handshake);
    assert_eq!(finishing.steps, 1);
    // A repeat (a caller whose reply was lost) gets the same answers.
    let repeat = sessions
        .step_done(
            &StepDone {
                tenant: tenant.clone(),
                answered: true,
                trajectory: t.trajectory,
                step: call,
                covered: 2,
                keys: vec![],
                finish: None,
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    assert_eq!(repeat, slot);
    let again = sessions
        .finish(
            tenant,
            &t.trajectory,
            CompletionReason::Handshake,
            now,
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    assert_eq!(again, Finish::Now(finishing));
    assert!(!sessions
        .is_live(tenant, &t.trajectory)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    // The name is free again: the next call opens a new trajectory.
    let (j, _) = join_as(tenant, Anchor::Name("s".into()), now);
    assert!(join(sessions, &j).await.opened);
}

/// The last call of a session (a done header) finishes it once it is recorded; a call that
/// produced no step only leaves the in-flight set.
pub async fn a_last_call_finishes_its_trajectory_and_an_abandoned_call_leaves_it_open(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, call) = join_as(tenant, Anchor::New, now);
    let t = join(sessions, &j).await;
    let gone = sessions
        .call_abandoned(tenant, &t.trajectory, &call, now, TIMING)
        .await
        .unwrap_or_else(|e| panic!("abandon: {e}"));
    assert_eq!(gone, None);
    assert!(sessions
        .is_live(tenant, &t.trajectory)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    let (j, call) = join_as(tenant, Anchor::Trajectory(t.trajectory), now);
    let t = join(sessions, &j).await;
    assert!(!t.opened);
    let slot = sessions
        .step_done(
            &StepDone {
                tenant: tenant.clone(),
                answered: true,
                trajectory: t.trajectory,
                step: call,
                covered: 2,
                keys: vec![],
                finish: Some(CompletionReason::DoneHeader),
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    assert_eq!(slot.index, Some(0));
    assert_eq!(
        slot.finishing.map(|f| f.reason),
        Some(CompletionReason::DoneHeader)
    );
}

/// Sweeps racing on one tenant finish each idle trajectory exactly once; a trajectory with a
/// call in flight is not idle, unless that call went stale (its replica died).
pub async fn the_idle_sweep_finishes_each_trajectory_once_across_replicas(
    sessions: Arc<dyn Sessions>,
    tenant: &TenantId,
) {
    let now = t0();
    let mut idle = Vec::new();
    for _ in 0..5 {
        let (j, call) = join_as(tenant, Anchor::New, now);
        let t = join(&*sessions, &j).await;
        done(&*sessions, tenant, &t, call, &[key()], now).await;
        idle.push(t.trajectory);
    }
    // One whose replica died mid-call, and which a handshake completion waited for.
    let (j, _) = join_as(tenant, Anchor::New, now);
    let dead = join(&*sessions, &j).await;
    let waiting = sessions
        .finish(
            tenant,
            &dead.trajectory,
            CompletionReason::Handshake,
            now,
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    assert_eq!(waiting, Finish::Deferred);

    let sweep_at = later(now, TIMING.idle + Duration::from_secs(1));
    let mut sweeps = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let sessions = Arc::clone(&sessions);
        let tenant = tenant.clone();
        sweeps.spawn(async move {
            sessions
                .finish_idle(&tenant, sweep_at, TIMING, 100)
                .await
                .unwrap_or_else(|e| panic!("finish_idle: {e}"))
        });
    }
    let mut finished = Vec::new();
    while let Some(result) = sweeps.join_next().await {
        finished.extend(result.unwrap_or_else(|e| panic!("task: {e}")));
    }
    let mut ids: Vec<TrajectoryId> = finished.iter().map(|f| f.trajectory).collect();
    ids.sort();
    idle.sort();
    assert_eq!(ids, idle, "each idle trajectory once, the busy one not");
    assert!(finished
        .iter()
        .all(|f| f.reason == CompletionReason::IdleTimeout && f.steps == 1));

    let stale_at = later(now, TIMING.stale_call + Duration::from_secs(1));
    let finished = sessions
        .finish_idle(tenant, stale_at, TIMING, 100)
        .await
        .unwrap_or_else(|e| panic!("finish_idle: {e}"));
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].trajectory, dead.trajectory);
    assert_eq!(finished[0].reason, CompletionReason::Handshake);
}

/// A trajectory idle past the timeout is no longer stitched to (the sweep will finish it); a
/// named one is found until it is finished.
pub async fn an_idle_trajectory_is_not_continued_by_stitching(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, call) = join_as(tenant, Anchor::New, now);
    let t = join(sessions, &j).await;
    let k = key();
    done(sessions, tenant, &t, call, &[k], now).await;
    let after_idle = later(now, TIMING.idle + Duration::from_secs(1));
    let (j, _) = join_as(tenant, prefixes(&[(k, 3)]), after_idle);
    let joined = join(sessions, &j).await;
    assert!(joined.opened, "{joined:?}");
    assert_ne!(joined.trajectory, t.trajectory);
}

/// Keys, names and ids of one tenant mean nothing to another.
pub async fn tenants_never_join_each_other(sessions: &dyn Sessions, a: &TenantId, b: &TenantId) {
    let now = t0();
    let (j, call) = join_as(a, Anchor::Name("shared-name".into()), now);
    let t = join(sessions, &j).await;
    let k = key();
    done(sessions, a, &t, call, &[k], now).await;
    for anchor in [
        prefixes(&[(k, 3)]),
        Anchor::Name("shared-name".into()),
        Anchor::Trajectory(t.trajectory),
    ] {
        let (j, _) = join_as(b, anchor, now);
        let joined = join(sessions, &j).await;
        assert!(joined.opened, "{joined:?}");
        assert_ne!(joined.trajectory, t.trajectory);
    }
    assert!(!sessions
        .is_live(b, &t.trajectory)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    let finished = sessions
        .finish(b, &t.trajectory, CompletionReason::Handshake, now, TIMING)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished, Finish::NotLive);
    assert!(!sessions
        .set_evaluation_only(b, &t.trajectory)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    assert!(sessions
        .is_live(a, &t.trajectory)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
}

/// A trajectory marked evaluation-only says so to every call that joins it.
pub async fn an_evaluation_only_trajectory_says_so_to_its_calls(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let id = TrajectoryId::new();
    let opened = sessions
        .join(
            &Join {
                tenant: tenant.clone(),
                anchor: Anchor::Name("uid-1".into()),
                call: None,
                open: id,
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(opened.trajectory, id);
    assert!(sessions
        .set_evaluation_only(tenant, &id)
        .await
        .unwrap_or_else(|e| panic!("{e}")));
    let (j, _) = join_as(tenant, Anchor::Name("uid-1".into()), now);
    let joined = join(sessions, &j).await;
    assert_eq!(joined.trajectory, id);
    assert!(joined.evaluation_only);
}

/// Two replicas (two connections): a session recorded through one is continued through the
/// other, and the sweep of either finishes it once.
pub async fn a_call_continues_across_replicas(
    a: &dyn Sessions,
    b: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, call) = join_as(tenant, Anchor::New, now);
    let t = join(a, &j).await;
    let k1 = key();
    done(a, tenant, &t, call, &[k1], now).await;
    let (j, call) = join_as(tenant, prefixes(&[(k1, 3)]), now);
    let t2 = join(b, &j).await;
    assert_eq!(t2.trajectory, t.trajectory);
    let k2 = key();
    assert_eq!(done(b, tenant, &t2, call, &[k2], now).await, Some(1));
    let (j, _) = join_as(tenant, prefixes(&[(k1, 3), (k2, 5)]), now);
    assert_eq!(join(a, &j).await.trajectory, t.trajectory);
    let sweep_at = later(now, TIMING.stale_call + Duration::from_secs(1));
    let (x, y) = tokio::join!(
        a.finish_idle(tenant, sweep_at, TIMING, 10),
        b.finish_idle(tenant, sweep_at, TIMING, 10)
    );
    let finished: Vec<_> = x
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .chain(y.unwrap_or_else(|e| panic!("{e}")))
        .filter(|f| f.trajectory == t.trajectory)
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
}

/// A call whose answer broke off (the engine died mid-stream) is numbered and kept, but the
/// conversation goes on from the step before it: the agent's retry continues the trajectory.
pub async fn a_retry_after_a_broken_answer_continues_the_trajectory(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, call) = join_as(tenant, Anchor::New, now);
    let t = join(sessions, &j).await;
    let k1 = key();
    done(sessions, tenant, &t, call, &[k1], now).await;
    let (j, broken) = join_as(tenant, prefixes(&[(k1, 3)]), now);
    let attempt = join(sessions, &j).await;
    let slot = sessions
        .step_done(
            &StepDone {
                tenant: tenant.clone(),
                trajectory: attempt.trajectory,
                step: broken,
                covered: 5,
                answered: false,
                keys: vec![],
                finish: None,
                now,
            },
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("step_done: {e}"));
    assert_eq!(slot.index, Some(1));
    let (j, _) = join_as(tenant, prefixes(&[(k1, 3)]), now);
    let retry = join(sessions, &j).await;
    assert_eq!(retry.trajectory, t.trajectory, "{retry:?}");
    assert_eq!(retry.previous.map(|p| p.step), Some(call));
    assert_eq!(retry.next_index, 2);
}

/// A session key minted through one replica resolves through another, and nothing else does.
pub async fn a_session_key_resolves_on_every_replica(
    a: &dyn Sessions,
    b: &dyn Sessions,
    tenant: &TenantId,
) {
    let digest: [u8; 32] = uuid::Uuid::now_v7()
        .as_u128()
        .to_le_bytes()
        .iter()
        .chain(uuid::Uuid::now_v7().as_u128().to_be_bytes().iter())
        .copied()
        .collect::<Vec<u8>>()
        .try_into()
        .unwrap_or_else(|_| panic!("32 bytes"));
    let session = clawback_datapool::KeyedSession {
        tenant: tenant.clone(),
        trajectory: TrajectoryId::new(),
    };
    a.put_session_key(&digest, &session)
        .await
        .unwrap_or_else(|e| panic!("put: {e}"));
    let found = b
        .session_key(&digest)
        .await
        .unwrap_or_else(|e| panic!("get: {e}"));
    assert_eq!(found, Some(session));
    let mut other = digest;
    other[0] ^= 1;
    assert_eq!(
        b.session_key(&other)
            .await
            .unwrap_or_else(|e| panic!("get: {e}")),
        None
    );
}

/// A finished trajectory's completion stays due until its finisher reports it written; one
/// nobody reported (the finisher died before writing it) is handed to exactly one sweeping
/// replica once its lease ran out, and again a lease later while still unreported.
pub async fn a_completion_nobody_wrote_is_taken_over_once(
    sessions: Arc<dyn Sessions>,
    tenant: &TenantId,
) {
    let now = t0();
    let mut finished = Vec::new();
    for reason in [CompletionReason::Handshake, CompletionReason::DoneHeader] {
        let (j, call) = join_as(tenant, Anchor::New, now);
        let t = join(&*sessions, &j).await;
        done(&*sessions, tenant, &t, call, &[key()], now).await;
        let finish = sessions
            .finish(tenant, &t.trajectory, reason, now, TIMING)
            .await
            .unwrap_or_else(|e| panic!("finish: {e}"));
        assert!(matches!(finish, Finish::Now(_)), "{finish:?}");
        finished.push(t.trajectory);
    }
    let (written, lost) = (finished[0], finished[1]);
    sessions
        .completions_written(tenant, &[written])
        .await
        .unwrap_or_else(|e| panic!("completions_written: {e}"));
    let overdue = |at: UnixMs| {
        let sessions = Arc::clone(&sessions);
        let tenant = tenant.clone();
        async move {
            sessions
                .overdue_completions(&tenant, at, TIMING, 100)
                .await
                .unwrap_or_else(|e| panic!("overdue_completions: {e}"))
        }
    };
    let within = later(now, TIMING.completion_lease - Duration::from_secs(1));
    assert!(overdue(within).await.is_empty(), "still within its lease");

    let past = later(now, TIMING.completion_lease + Duration::from_secs(1));
    let mut sweeps = tokio::task::JoinSet::new();
    for _ in 0..4 {
        sweeps.spawn(overdue(past));
    }
    let mut handed = Vec::new();
    while let Some(result) = sweeps.join_next().await {
        handed.extend(result.unwrap_or_else(|e| panic!("task: {e}")));
    }
    assert_eq!(handed.len(), 1, "one sweep takes it over: {handed:?}");
    assert_eq!(handed[0].trajectory, lost);
    assert_eq!(handed[0].reason, CompletionReason::DoneHeader);
    assert_eq!(handed[0].steps, 1);

    // The taker died too: a lease later it is handed out again, until someone reports it.
    let again = later(past, TIMING.completion_lease + Duration::from_secs(1));
    assert_eq!(overdue(again).await.len(), 1);
    sessions
        .completions_written(tenant, &[lost])
        .await
        .unwrap_or_else(|e| panic!("completions_written: {e}"));
    let much_later = later(again, TIMING.completion_lease * 10);
    assert!(overdue(much_later).await.is_empty());
}

/// A JOIN or a STEP_DONE asked again because its first answer was lost (the shared state timed
/// out, the connection dropped) gets the first answer again: the trajectory it opened is still
/// opened (its header is the caller's to write), and a step keeps its index, answered or not.
pub async fn a_repeated_join_or_step_done_gets_its_first_answer(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    for anchor in [Anchor::Name("repeated".into()), Anchor::New] {
        let (j, call) = join_as(tenant, anchor, now);
        let first = join(sessions, &j).await;
        let again = join(sessions, &j).await;
        assert!(first.opened && again.opened, "{first:?} then {again:?}");
        assert_eq!(again.trajectory, first.trajectory);
        let step_done = |step: StepId, answered: bool| StepDone {
            tenant: tenant.clone(),
            trajectory: first.trajectory,
            step,
            covered: 1,
            answered,
            keys: vec![],
            finish: None,
            now,
        };
        let mut indices = Vec::new();
        for (step, answered) in [(call, false), (StepId::new(), true)] {
            for _ in 0..2 {
                let slot = sessions
                    .step_done(&step_done(step, answered), TIMING)
                    .await
                    .unwrap_or_else(|e| panic!("step_done: {e}"));
                indices.push(slot.index);
            }
        }
        assert_eq!(indices, [Some(0), Some(0), Some(1), Some(1)]);
        // Another call's join of the same trajectory opens nothing.
        if let Anchor::Name(_) = &j.anchor {
            let (other, _) = join_as(tenant, j.anchor.clone(), now);
            let joined = join(sessions, &other).await;
            assert_eq!(joined.trajectory, first.trajectory);
            assert!(!joined.opened);
        }
    }
}

/// A call whose JOIN answer was lost — its caller went on without the shared state — is
/// forgotten by its id: the trajectory it was marked on no longer waits for it, and a
/// completion deferred for it is answered then, once.
pub async fn a_call_whose_join_answer_was_lost_is_forgotten_and_frees_its_trajectory(
    sessions: &dyn Sessions,
    tenant: &TenantId,
) {
    let now = t0();
    let (j, ghost) = join_as(tenant, Anchor::Name("lost".into()), now);
    let t = join(sessions, &j).await;
    let finished = sessions
        .finish(
            tenant,
            &t.trajectory,
            CompletionReason::Handshake,
            now,
            TIMING,
        )
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    assert_eq!(finished, Finish::Deferred, "the ghost holds it");
    let forgotten = sessions
        .forget_call(tenant, &ghost, now, TIMING)
        .await
        .unwrap_or_else(|e| panic!("forget_call: {e}"));
    let finishing = forgotten.unwrap_or_else(|| panic!("the deferred completion is due"));
    assert_eq!(finishing.trajectory, t.trajectory);
    assert_eq!(finishing.reason, CompletionReason::Handshake);
    for call in [ghost, StepId::new()] {
        let again = sessions
            .forget_call(tenant, &call, now, TIMING)
            .await
            .unwrap_or_else(|e| panic!("forget_call: {e}"));
        assert!(again.is_none(), "{again:?}");
    }
}
