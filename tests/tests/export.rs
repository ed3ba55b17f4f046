//! `clawback-sidecar export` end to end: an embedded datapool filled with recorded trajectories
//! (the schema's real example, varied), the real binary, and the rows read back — JSONL with
//! serde_json, Parquet with the parquet crate's Arrow reader (and pyarrow, when the project's
//! Python venv happens to have it).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, UInt32Type};
use arrow_array::{Array, RecordBatch};
use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{
    Complete, CompletionReason, Evaluation, EvaluationId, EvaluationSource, LocalStore, StepId,
    Store, TenantId, Tokens, TrajectoryId, TrajectoryRecord, TrajectoryStatus, UnixMs, Verdict,
};
use clawback_tests::harness::scratch_dir;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

/// The example trajectory under fresh ids, so several can live in one store.
fn recorded(tenant: &TenantId) -> TrajectoryRecord {
    let mut record = tool_use_trajectory(tenant.clone());
    let id = TrajectoryId::new();
    record.trajectory.id = id;
    let mut step_ids = BTreeMap::new();
    for step in &mut record.steps {
        let fresh = StepId::new();
        step_ids.insert(step.id, fresh);
        step.id = fresh;
        step.trajectory = id;
    }
    for e in &mut record.evaluations {
        e.id = EvaluationId::new();
        e.trajectory = id;
        e.step = e.step.map(|s| step_ids[&s]);
    }
    record
}

fn evaluation(
    record: &TrajectoryRecord,
    step: usize,
    source: EvaluationSource,
    reward: f64,
    at: u64,
) -> Evaluation {
    Evaluation {
        id: EvaluationId::new(),
        step: Some(record.steps[step].id),
        source,
        verdict: Verdict::Score {
            reward: Some(reward),
            hint: None,
        },
        created_at: UnixMs(at),
        ..record.evaluations[0].clone()
    }
}

fn plugin(name: &str) -> EvaluationSource {
    EvaluationSource::Plugin {
        name: name.into(),
        content_hash: "sha256:00".into(),
    }
}

async fn store_as(store: &LocalStore, record: &TrajectoryRecord, status: TrajectoryStatus) {
    let mut header = record.trajectory.clone();
    header.status = TrajectoryStatus::Open;
    store.upsert_trajectory(&header).await.unwrap();
    store.append_steps(&record.steps).await.unwrap();
    store.append_evaluations(&record.evaluations).await.unwrap();
    if status != TrajectoryStatus::Open {
        let complete = Complete {
            status,
            ..Complete::now(
                header.tenant.clone(),
                header.id,
                CompletionReason::Handshake,
            )
        };
        store.complete_trajectory(&complete).await.unwrap();
    }
}

/// What the datapool holds: two completed trajectories of `acme` to export, one abandoned, one
/// still open, and one completed trajectory of another tenant.
struct Pool {
    dir: PathBuf,
    /// The example as recorded: a plugin reward on step 0, a hint and the handshake's
    /// trajectory reward for step 1.
    weather: TrajectoryId,
    /// A thumbs-down on step 0 over its plugin's +1, two plugins on a text-only step 1, no
    /// trajectory reward, and a side turn.
    thumbs: TrajectoryId,
    abandoned: TrajectoryId,
    open: TrajectoryId,
    other_tenant: TrajectoryId,
}

async fn pool() -> Pool {
    let dir = scratch_dir("export");
    std::fs::create_dir_all(&dir).unwrap();
    let store =
        LocalStore::open(dir.join(clawback_sidecar::data_plane::store::LOCAL_FILE)).unwrap();
    let acme = tenant("acme");

    let weather = recorded(&acme);
    store_as(&store, &weather, TrajectoryStatus::Completed).await;

    let mut thumbs = recorded(&acme);
    thumbs.evaluations.retain(|e| e.step.is_some());
    let thumb = |reward, at| {
        let source = EvaluationSource::Feedback {
            channel: "ui".into(),
        };
        evaluation(&thumbs, 0, source, reward, at)
    };
    let evaluations = [
        thumb(1.0, 5),
        thumb(-1.0, 10),
        evaluation(&thumbs, 1, plugin("a"), 0.5, 1),
        evaluation(&thumbs, 1, plugin("b"), 0.0, 2),
    ];
    thumbs.evaluations.extend(evaluations);
    thumbs.steps[1].tokens = Tokens::None;
    let mut side = thumbs.steps[1].clone();
    side.id = StepId::new();
    side.index = 2;
    side.trainable = false;
    thumbs.steps.push(side);
    store_as(&store, &thumbs, TrajectoryStatus::Completed).await;

    let abandoned = recorded(&acme);
    store_as(&store, &abandoned, TrajectoryStatus::Abandoned).await;
    let open = recorded(&acme);
    store_as(&store, &open, TrajectoryStatus::Open).await;
    let other = recorded(&tenant("globex"));
    store_as(&store, &other, TrajectoryStatus::Completed).await;

    Pool {
        dir,
        weather: weather.trajectory.id,
        thumbs: thumbs.trajectory.id,
        abandoned: abandoned.trajectory.id,
        open: open.trajectory.id,
        other_tenant: other.trajectory.id,
    }
}

fn export(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .arg("export")
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        // The store comes from the flags alone, whatever the environment running the tests says.
        .env_remove("CLAWBACK_CONFIG")
        .env_remove("CLAWBACK_REDIS")
        .output()
        .unwrap()
}

fn succeeded(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "export failed: {stderr}");
    stderr
}

fn jsonl_rows(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Rows keyed by (trajectory, step index).
fn by_step(rows: &[Value]) -> BTreeMap<(String, u64), &Value> {
    rows.iter()
        .map(|r| {
            let key = (
                r["trajectory_id"].as_str().unwrap().to_owned(),
                r["step_index"].as_u64().unwrap(),
            );
            (key, r)
        })
        .collect()
}

#[tokio::test]
async fn jsonl_holds_one_row_per_trainable_step_of_the_tenants_completed_trajectories() {
    let pool = pool().await;
    let output = export(&pool.dir, &["--tenant", "acme", "--format", "jsonl"]);
    let stderr = succeeded(&output);
    assert!(
        stderr.contains(
            "exported 2 trajectories, 4 steps; skipped 1 abandoned, 1 open trajectories, \
             1 side turns"
        ),
        "{stderr}"
    );
    // Not a terminal: no progress bar, only the summary.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let rows = jsonl_rows(&output);
    assert_eq!(rows.len(), 4);
    let rows = by_step(&rows);
    let (weather, thumbs) = (pool.weather.to_string(), pool.thumbs.to_string());
    let keys: Vec<_> = rows.keys().cloned().collect();
    let mut expected = vec![
        (weather.clone(), 0),
        (weather.clone(), 1),
        (thumbs.clone(), 0),
        (thumbs.clone(), 1),
    ];
    expected.sort();
    assert_eq!(keys, expected);
    for skipped in [pool.abandoned, pool.open, pool.other_tenant] {
        assert!(!rows.keys().any(|(t, _)| *t == skipped.to_string()));
    }

    for row in rows.values() {
        assert_eq!(row["tenant"], json!("acme"));
        assert_eq!(row["prompt"], row["messages"]);
        assert_eq!(row["completion"][0]["role"], json!("assistant"));
        let prompt = row["prompt_token_ids"].as_array().unwrap();
        let completion = row["completion_token_ids"].as_array().unwrap();
        let mask: Vec<u64> = row["loss_mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_u64().unwrap())
            .collect();
        if row["tokens_source"] == json!("engine") {
            assert_eq!(mask.len(), prompt.len() + completion.len());
            assert!(mask[..prompt.len()].iter().all(|&m| m == 0));
            assert!(mask[prompt.len()..].iter().all(|&m| m == 1));
            assert_eq!(
                row["completion_logprobs"].as_array().unwrap().len(),
                completion.len()
            );
        } else {
            assert!(mask.is_empty() && prompt.is_empty() && completion.is_empty());
        }
    }

    let reward = |t: &str, i: u64| {
        let row = rows[&(t.to_owned(), i)];
        (row["reward"].as_f64(), row["reward_source"].as_str())
    };
    assert_eq!(reward(&weather, 0), (Some(1.0), Some("plugin")));
    assert_eq!(reward(&weather, 1), (Some(1.0), Some("trajectory")));
    assert_eq!(reward(&thumbs, 0), (Some(-1.0), Some("feedback")));
    assert_eq!(reward(&thumbs, 1), (Some(0.25), Some("plugin")));
    let hint = rows[&(weather.clone(), 1)]["hint"].as_str().unwrap();
    assert!(hint.contains("umbrella"), "{hint}");
    assert_eq!(rows[&(weather, 0)]["policy_adapter"], json!("acme@v17"));
    assert_eq!(rows[&(thumbs.clone(), 1)]["tokens_source"], json!("none"));
    assert_eq!(rows[&(thumbs, 1)]["next_state"][0]["role"], json!("user"));
}

#[tokio::test]
async fn jsonl_to_a_file_is_the_same_as_to_stdout_and_appears_only_when_whole() {
    let pool = pool().await;
    let out = pool.dir.join("acme.jsonl");
    let to_file = export(
        &pool.dir,
        &["--tenant", "acme", "--out", out.to_str().unwrap()],
    );
    succeeded(&to_file);
    assert!(to_file.stdout.is_empty());
    assert!(!pool.dir.join("acme.jsonl.partial").exists());
    let to_stdout = export(&pool.dir, &["--tenant", "acme"]);
    assert_eq!(std::fs::read(&out).unwrap(), to_stdout.stdout);
}

#[tokio::test]
async fn an_export_never_contains_another_tenants_trajectories() {
    let pool = pool().await;
    let output = export(&pool.dir, &["--tenant", "globex"]);
    succeeded(&output);
    let rows = jsonl_rows(&output);
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row["tenant"], json!("globex"));
        assert_eq!(row["trajectory_id"], json!(pool.other_tenant.to_string()));
    }
    let nobody = export(&pool.dir, &["--tenant", "initech"]);
    succeeded(&nobody);
    assert!(jsonl_rows(&nobody).is_empty());
}

#[tokio::test]
async fn limit_keeps_the_oldest_trajectories_and_since_the_recently_completed() {
    let pool = pool().await;
    let limited = export(&pool.dir, &["--tenant", "acme", "--limit", "1"]);
    succeeded(&limited);
    let rows = jsonl_rows(&limited);
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|r| r["trajectory_id"] == json!(pool.weather.to_string())));

    let recent = export(&pool.dir, &["--tenant", "acme", "--since", "1h"]);
    succeeded(&recent);
    assert_eq!(jsonl_rows(&recent).len(), 4);
    let future = export(
        &pool.dir,
        &["--tenant", "acme", "--since", "2999-01-01T00:00:00Z"],
    );
    succeeded(&future);
    assert!(jsonl_rows(&future).is_empty());
}

/// The Parquet columns of one row, in the JSONL row's shape, for comparing the two.
fn parquet_row(batch: &RecordBatch, i: usize) -> Value {
    let text = |name: &str| {
        let column = batch.column_by_name(name).unwrap().as_string::<i32>();
        if column.is_null(i) {
            Value::Null
        } else {
            json!(column.value(i))
        }
    };
    let parsed = |name: &str| match text(name) {
        Value::String(s) => serde_json::from_str(&s).unwrap(),
        other => other,
    };
    let ints = |name: &str| {
        let list = batch
            .column_by_name(name)
            .unwrap()
            .as_list::<i32>()
            .value(i);
        json!(list.as_primitive::<Int32Type>().values().to_vec())
    };
    let logprobs = batch
        .column_by_name("completion_logprobs")
        .unwrap()
        .as_list::<i32>()
        .value(i);
    let reward = batch
        .column_by_name("reward")
        .unwrap()
        .as_primitive::<Float64Type>();
    json!({
        "tenant": text("tenant"),
        "trajectory_id": text("trajectory_id"),
        "step_index": batch.column_by_name("step_index").unwrap().as_primitive::<UInt32Type>().value(i),
        "prompt": parsed("prompt"),
        "completion": parsed("completion"),
        "messages": parsed("messages"),
        "tools": parsed("tools"),
        "next_state": parsed("next_state"),
        "prompt_token_ids": ints("prompt_token_ids"),
        "completion_token_ids": ints("completion_token_ids"),
        "loss_mask": ints("loss_mask"),
        "completion_logprobs_len": logprobs.as_primitive::<Float32Type>().len(),
        "tokens_source": text("tokens_source"),
        "reward": if reward.is_null(i) { Value::Null } else { json!(reward.value(i)) },
        "reward_source": text("reward_source"),
        "hint": text("hint"),
        "finish_reason": text("finish_reason"),
        "model": text("model"),
    })
}

/// The same fields picked from a JSONL row.
fn jsonl_view(row: &Value) -> Value {
    let mut view = serde_json::Map::new();
    for key in [
        "tenant",
        "trajectory_id",
        "step_index",
        "prompt",
        "completion",
        "messages",
        "tools",
        "next_state",
        "prompt_token_ids",
        "completion_token_ids",
        "loss_mask",
        "tokens_source",
        "reward",
        "reward_source",
        "hint",
        "finish_reason",
        "model",
    ] {
        view.insert(key.into(), row[key].clone());
    }
    let logprobs = row["completion_logprobs"].as_array().map_or(0, Vec::len);
    view.insert("completion_logprobs_len".into(), json!(logprobs));
    Value::Object(view)
}

#[tokio::test]
async fn parquet_holds_the_same_rows_as_jsonl_and_reads_back_with_arrow() {
    let pool = pool().await;
    let out = pool.dir.join("acme.parquet");
    let out_arg = out.to_str().unwrap();
    succeeded(&export(
        &pool.dir,
        &["--tenant", "acme", "--format", "parquet", "--out", out_arg],
    ));
    assert!(!pool.dir.join("acme.parquet.partial").exists());
    let jsonl = jsonl_rows(&export(&pool.dir, &["--tenant", "acme"]));

    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        rows.extend((0..batch.num_rows()).map(|i| parquet_row(&batch, i)));
    }
    let expected: Vec<Value> = jsonl.iter().map(jsonl_view).collect();
    assert_eq!(rows, expected);

    // The Python side of a trainer, when this machine's venv can show it.
    let python = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/clawback/torch-venv/bin/python"));
    let has_pyarrow = python.as_ref().is_some_and(|py| {
        Command::new(py)
            .args(["-c", "import pyarrow"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if let (true, Some(py)) = (has_pyarrow, python) {
        let script = "import json, sys, pyarrow.parquet as pq\n\
                      t = pq.read_table(sys.argv[1]).to_pylist()\n\
                      print(len(t), sum(len(r['loss_mask']) for r in t), \
                      json.loads(t[0]['prompt'])[0]['role'])";
        let output = Command::new(py)
            .args(["-c", script, out_arg])
            .output()
            .unwrap();
        let masks: usize = jsonl
            .iter()
            .map(|r| r["loss_mask"].as_array().unwrap().len())
            .sum();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            format!("4 {masks} system")
        );
    }
}

#[tokio::test]
async fn parquet_without_an_output_file_is_refused_with_the_reason() {
    let pool = pool().await;
    let output = export(&pool.dir, &["--tenant", "acme", "--format", "parquet"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--out"), "{stderr}");
}

#[test]
fn a_data_dir_without_a_datapool_is_an_error_not_an_empty_export() {
    let dir = scratch_dir("export-empty");
    let output = export(&dir, &["--tenant", "acme"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no datapool at"), "{stderr}");
    assert!(!dir.exists(), "the export created {}", dir.display());
}
