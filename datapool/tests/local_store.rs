//! `LocalStore` on SQLite: the common store behaviour, and a trainer in a second process reading
//! the ready queue of the same file.

mod common;

use std::process::Command;
use std::time::Duration;

use clawback_datapool::{
    Complete, CompletionReason, LocalStore, ReadyItem, Store, TenantId, TrajectoryId,
};
use common::scenarios::{self, consumer, read_at_least};
use common::{fresh_tenant, open_trajectory, step_of};

fn store() -> (LocalStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let store = LocalStore::open(dir.path().join("datapool.sqlite"))
        .unwrap_or_else(|e| panic!("open: {e}"));
    (store, dir)
}

#[tokio::test]
async fn a_recorded_trajectory_reads_back_as_written() {
    let (s, _dir) = store();
    scenarios::a_recorded_trajectory_reads_back_as_written(&s, &fresh_tenant("rt")).await;
}

#[tokio::test]
async fn batched_steps_keep_their_order() {
    let (s, _dir) = store();
    scenarios::batched_steps_keep_their_order(&s, &fresh_tenant("order")).await;
}

#[tokio::test]
async fn a_dead_consumers_unacked_entries_are_redelivered() {
    let (s, _dir) = store();
    scenarios::a_dead_consumers_unacked_entries_are_redelivered(&s, &fresh_tenant("redeliver"))
        .await;
}

#[tokio::test]
async fn a_poison_entry_is_dead_lettered() {
    let (s, _dir) = store();
    scenarios::a_poison_entry_is_dead_lettered(&s, &fresh_tenant("poison")).await;
}

#[tokio::test]
async fn consumer_lag_counts_what_each_group_has_not_finished() {
    let (s, _dir) = store();
    scenarios::consumer_lag_counts_what_each_group_has_not_finished(&s, &fresh_tenant("lag")).await;
}

#[tokio::test]
async fn a_group_is_ready_when_all_members_finished() {
    let (s, _dir) = store();
    scenarios::a_group_is_ready_when_all_members_finished(&s, &fresh_tenant("group")).await;
}

#[tokio::test]
async fn a_group_past_its_timeout_is_delivered_partial() {
    let (s, _dir) = store();
    scenarios::a_group_past_its_timeout_is_delivered_partial(&s, &fresh_tenant("partial")).await;
}

#[tokio::test]
async fn tenants_never_see_each_others_data() {
    let (s, _dir) = store();
    scenarios::tenants_never_see_each_others_data(&s, &fresh_tenant("a"), &fresh_tenant("b")).await;
}

#[tokio::test]
async fn a_rollback_is_settled_only_against_its_own_order() {
    let (s, _dir) = store();
    scenarios::a_rollback_is_settled_only_against_its_own_order(&s, &fresh_tenant("rollback"))
        .await;
}

#[tokio::test]
async fn gate_decisions_keep_the_latest_of_their_tenant() {
    let (s, _dir) = store();
    scenarios::gate_decisions_keep_the_latest_of_their_tenant(
        &s,
        &fresh_tenant("gate"),
        &fresh_tenant("gate-other"),
    )
    .await;
}

#[tokio::test]
async fn the_live_policy_only_moves_forward() {
    let (s, _dir) = store();
    scenarios::the_live_policy_only_moves_forward(&s, &fresh_tenant("policy")).await;
}

#[tokio::test]
async fn next_states_attach_to_their_step() {
    let (s, _dir) = store();
    scenarios::next_states_attach_to_their_step(&s, &fresh_tenant("next")).await;
}

#[tokio::test]
async fn headers_and_next_states_count_against_the_tenants_byte_cap() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = LocalStore::open(dir.path().join("datapool.sqlite"))
        .unwrap_or_else(|e| panic!("{e}"))
        .with_caps(clawback_datapool::Caps {
            max_bytes_per_tenant: scenarios::BYTE_CAP,
            ..clawback_datapool::Caps::default()
        });
    let (t, other) = (fresh_tenant("cap"), fresh_tenant("cap-other"));
    scenarios::headers_and_next_states_count_against_the_byte_cap(&store, &t, &other).await;
}

/// The text after `marker` on a line of the child's output (libtest may print its own
/// `test ... ` prefix on the same line).
fn after_marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.split_once(marker).map(|(_, rest)| rest.trim())
}

const CHILD_DB: &str = "CLAWBACK_TEST_CHILD_DB";
const CHILD_TENANT: &str = "CLAWBACK_TEST_CHILD_TENANT";

/// The second process of `a_trainer_process_shares_the_file_with_the_recorder`: a trainer that
/// reads four ready trajectories, checks it can fetch them, acks two and dies. Does nothing when
/// run as an ordinary test.
#[test]
fn trainer_child_process() {
    let (Ok(db), Ok(tenant)) = (std::env::var(CHILD_DB), std::env::var(CHILD_TENANT)) else {
        return;
    };
    let tenant = TenantId::new(tenant).unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        let store = LocalStore::open(&db).unwrap_or_else(|e| panic!("child open: {e}"));
        // A long idle time: the child must not take back its own unacked entries while it reads.
        let me = consumer("child", Duration::from_secs(600), 5);
        let got = read_at_least(&store, &tenant, &me, 4, Duration::from_secs(30)).await;
        for d in &got {
            let ReadyItem::Trajectory(id) = d.item else {
                panic!("only trajectories were enqueued")
            };
            let record = store
                .trajectory(&tenant, &id)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("the child sees the parent's trajectory"));
            assert_eq!(record.steps.len(), 3);
            println!("CHILD-GOT {id}");
        }
        let acked: Vec<_> = got[..2].iter().map(|d| d.id.clone()).collect();
        store
            .ack(&tenant, &me.group, &acked)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for d in &got[..2] {
            if let ReadyItem::Trajectory(id) = d.item {
                println!("CHILD-ACKED {id}");
            }
        }
    });
}

/// The recorder writes into the file while a trainer in another process reads the ready queue
/// from it; the trainer dies with half its batch unacked, and that half comes back to a trainer
/// in this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_process_shares_the_file_with_the_recorder() {
    let (store, dir) = store();
    let tenant = fresh_tenant("twoproc");
    let mut ids: Vec<TrajectoryId> = Vec::new();
    for _ in 0..4 {
        let t = open_trajectory(&tenant);
        store
            .upsert_trajectory(&t)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let steps: Vec<_> = (0..3).map(|i| step_of(&tenant, &t.id, i, 2048)).collect();
        store
            .append_steps(&steps)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ids.push(t.id);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut child = tokio::process::Command::from(Command::new(exe))
        .args([
            "--exact",
            "trainer_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, dir.path().join("datapool.sqlite"))
        .env(CHILD_TENANT, tenant.as_str())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn child: {e}"));
    // Complete while the child is already polling: the two processes write and read at once.
    let child_out = child.stdout.take();
    for id in &ids {
        store
            .complete_trajectory(&Complete::now(
                tenant.clone(),
                *id,
                CompletionReason::DoneHeader,
            ))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .unwrap_or_else(|_| panic!("the child trainer did not finish in 120s"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = String::new();
    if let Some(mut pipe) = child_out {
        use tokio::io::AsyncReadExt;
        pipe.read_to_string(&mut out)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(status.success(), "child failed:\n{out}");
    let got: Vec<String> = out
        .lines()
        .filter_map(|l| after_marker(l, "CHILD-GOT "))
        .map(String::from)
        .collect();
    let acked: Vec<String> = out
        .lines()
        .filter_map(|l| after_marker(l, "CHILD-ACKED "))
        .map(String::from)
        .collect();
    assert_eq!(got, ids.iter().map(ToString::to_string).collect::<Vec<_>>());
    assert_eq!(acked.len(), 2);

    let me = consumer("parent", Duration::from_millis(300), 5);
    let back = read_at_least(&store, &tenant, &me, 2, Duration::from_secs(30)).await;
    let mut back: Vec<String> = back
        .iter()
        .map(|d| match d.item {
            ReadyItem::Trajectory(id) => id.to_string(),
            ReadyItem::Group(id) => id.to_string(),
        })
        .collect();
    back.sort();
    let mut unacked: Vec<String> = got.into_iter().filter(|g| !acked.contains(g)).collect();
    unacked.sort();
    assert_eq!(back, unacked);
}

/// Two connections to one file (as two trainer processes would have) reading the ready queue at
/// the same time never get the same entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_reading_at_once_share_the_queue_without_duplicates() {
    let (writer, dir) = store();
    let tenant = fresh_tenant("race");
    let mut enqueued = Vec::new();
    for _ in 0..40 {
        let t = open_trajectory(&tenant);
        writer
            .upsert_trajectory(&t)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        writer
            .complete_trajectory(&Complete::now(
                tenant.clone(),
                t.id,
                CompletionReason::Handshake,
            ))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        enqueued.push(t.id);
    }
    let reader = |name: &'static str| {
        let store = LocalStore::open(dir.path().join("datapool.sqlite"))
            .unwrap_or_else(|e| panic!("second connection: {e}"));
        let tenant = tenant.clone();
        tokio::spawn(async move {
            let me = consumer(name, Duration::from_secs(600), 5);
            let mut got = Vec::new();
            loop {
                let batch = store
                    .read_ready(&tenant, &me, 3)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                if batch.is_empty() {
                    return got;
                }
                let ids: Vec<_> = batch.iter().map(|d| d.id.clone()).collect();
                store
                    .ack(&tenant, &me.group, &ids)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                got.extend(batch.into_iter().map(|d| d.item));
            }
        })
    };
    let (a, b) = (reader("a"), reader("b"));
    let mut all = a.await.unwrap_or_else(|e| panic!("{e}"));
    all.extend(b.await.unwrap_or_else(|e| panic!("{e}")));
    let mut all: Vec<String> = all.iter().map(|i| format!("{i:?}")).collect();
    all.sort();
    let mut want: Vec<String> = enqueued
        .iter()
        .map(|id| format!("{:?}", ReadyItem::Trajectory(*id)))
        .collect();
    want.sort();
    assert_eq!(all, want);
}

#[tokio::test]
async fn a_step_appended_twice_reads_back_once() {
    let (s, _dir) = store();
    scenarios::a_step_appended_twice_reads_back_once(&s, &fresh_tenant("replayed")).await;
}

#[tokio::test]
async fn a_completion_before_its_last_steps_waits_for_them() {
    let (s, _dir) = store();
    scenarios::a_completion_before_its_last_steps_waits_for_them(&s, &fresh_tenant("short")).await;
}

#[tokio::test]
async fn a_completion_before_its_header_takes_effect_with_the_header() {
    let (s, _dir) = store();
    scenarios::a_completion_before_its_header_takes_effect_with_the_header(
        &s,
        &fresh_tenant("early-complete"),
    )
    .await;
}
