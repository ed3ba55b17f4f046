//! The training loop end to end, with real parts: a tiny random model folder made on the spot,
//! real libtorch, recorded trajectories in the datapool's schema in a real LocalStore (SQLite)
//! or a real Redis, and the real `clawback-trainer` binary killed with SIGKILL and restarted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{
    LocalStore, RedisConfig, RedisStore, StepId, TenantId, Tokens, Trajectory, TrajectoryId,
};
use clawback_model::config::ModelConfig;
use clawback_model::lora::LoraAdapter;
use clawback_trainer::train::{self, RunOptions, TrainConfig};
use common::{checkpoints, fresh_tenant, record, record_served, tiny_model_dir, unacked};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A config over `datapool` for `tenant`, checkpoints and metrics under `dir`.
fn config_text(dir: &Path, model: &Path, datapool: &str, tenant: &TenantId, extra: &str) -> String {
    format!(
        r#"
model = "{model}"
device = "cpu"
threads = 1
datapool = "{datapool}"
tenants = ["{tenant}"]
poll_interval = "50ms"

[consumer]
group = "trainer"
name = "trainer-0"
claim_idle = "1s"
max_deliveries = 100

[lora]
rank = 4
alpha = 8.0

[optimizer]
lr = 1e-2

[schedule]
warmup_steps = 1

[checkpoint]
dir = "{checkpoints}"
keep_last = 0

[metrics]
progress = true
jsonl = "{jsonl}"
{extra}
"#,
        model = model.display(),
        checkpoints = dir.join("checkpoints").display(),
        jsonl = dir.join("metrics.jsonl").display(),
    )
}

/// A temporary folder with a tiny model folder and an embedded datapool in `data/`.
fn local_setup() -> (tempfile::TempDir, PathBuf, PathBuf, LocalStore) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let model = tiny_model_dir(&dir.path().join("model"));
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("{e}"));
    let store =
        LocalStore::open(data.join(train::run::LOCAL_FILE)).unwrap_or_else(|e| panic!("{e}"));
    (dir, model, data, store)
}

/// Runs the loop in-process as a batch job over what is ready (`--exit-when-idle`).
fn train_until_idle(config_text: &str) -> train::Summary {
    let config = TrainConfig::from_toml(config_text).unwrap_or_else(|e| panic!("{e}"));
    let options = RunOptions {
        exit_when_idle: true,
        handle_signals: false,
    };
    train::run(&config, options, Arc::new(AtomicBool::new(false))).unwrap_or_else(|e| panic!("{e}"))
}

fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("metrics line {l:?}: {e}")))
        .collect()
}

/// The optimizer steps' lines of a metrics log (it also has a line per checkpoint and publish).
fn step_lines(path: &Path) -> Vec<serde_json::Value> {
    jsonl(path)
        .into_iter()
        .filter(|line| line.get("step").is_some())
        .collect()
}

/// What every successful run must leave behind: steps taken, a PEFT adapter that loads and was
/// moved off its zero init, every recorded step applied exactly once, every entry acked.
fn assert_trained_everything(
    dir: &Path,
    model: &Path,
    tenant: &TenantId,
    recorded: &common::Recorded,
) -> Vec<(
    std::path::PathBuf,
    clawback_trainer::train::checkpoint::CheckpointState,
)> {
    let saved = checkpoints(&dir.join("checkpoints"), tenant);
    let latest = saved
        .last()
        .unwrap_or_else(|| panic!("no checkpoint written"));
    assert!(latest.1.optimizer_steps >= 2, "{:?}", latest.1);

    let adapter_dir = latest.0.join("adapter");
    assert!(adapter_dir.join("adapter_config.json").is_file());
    assert!(adapter_dir.join("adapter_model.safetensors").is_file());
    let peft: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter_dir.join("adapter_config.json")).unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(peft["peft_type"], "LORA");
    assert_eq!(peft["r"], 4);
    let config = ModelConfig::from_dir(model).unwrap_or_else(|e| panic!("{e}"));
    let adapter = LoraAdapter::load(&adapter_dir, &config, tch::Device::Cpu)
        .unwrap_or_else(|e| panic!("{e}"));
    let moved: f64 = adapter
        .var_store()
        .variables()
        .iter()
        .filter(|(name, _)| name.contains("lora_B"))
        .map(|(_, t)| t.abs().sum(tch::Kind::Double).double_value(&[]))
        .sum();
    assert!(moved > 0.0, "training left every lora_B at its zero init");

    let mut applied: Vec<StepId> = saved
        .iter()
        .flat_map(|(_, s)| s.applied_steps.iter().copied())
        .collect();
    let total = applied.len();
    applied.sort();
    applied.dedup();
    assert_eq!(applied.len(), total, "a step was applied twice");
    let mut expected = recorded.steps.clone();
    expected.sort();
    assert_eq!(applied, expected, "not every recorded step was trained on");
    saved
}

#[test]
fn the_loop_trains_from_a_local_store_checkpoints_in_peft_format_and_acks() {
    let (dir, model, data, store) = local_setup();
    let tenant = fresh_tenant("local");
    let rt = runtime();
    // Two groups of four rollouts and three single sessions: 11 trajectories, 22 steps.
    let recorded = rt.block_on(record(&store, &tenant, 2, 4, 3));

    let text = config_text(
        dir.path(),
        &model,
        &data.display().to_string(),
        &tenant,
        "[batch]\nmax_wait = \"0s\"\nsamples_per_step = 4\nmicro_batch_tokens = 128\nmax_seq_len = 128\n",
    );
    let summary = train_until_idle(&text);

    assert!(summary.optimizer_steps[&tenant] >= 2, "{summary:?}");
    assert_eq!(summary.acked[&tenant], recorded.ready_entries);
    assert_trained_everything(dir.path(), &model, &tenant, &recorded);
    assert_eq!(rt.block_on(unacked(&store, &tenant, "trainer")), 0);

    let lines = step_lines(&dir.path().join("metrics.jsonl"));
    assert_eq!(lines.len() as u64, summary.optimizer_steps[&tenant]);
    let last = &lines[lines.len() - 1];
    for key in [
        "loss",
        "clip_fraction",
        "kl",
        "entropy",
        "tokens_per_second",
        "advantage_std",
    ] {
        assert!(
            last[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {last}"
        );
    }
    // The filter errors were ignored and counted; the hints could not be distilled without a
    // tokenizer in the model folder, and say so.
    assert_eq!(last["dropped"]["filter_errors"], 8);
    assert_eq!(last["dropped"]["hints_no_tokenizer"], 3);
}

#[test]
fn the_loop_trains_from_redis_under_its_own_tenant() {
    let url =
        std::env::var("CLAWBACK_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let model = tiny_model_dir(&dir.path().join("model"));
    let tenant = fresh_tenant("redis");
    let _cleanup = TenantKeys {
        url: url.clone(),
        tenant: tenant.clone(),
    };
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(&RedisConfig::single(url.clone())))
        .unwrap_or_else(|e| panic!("{e}"));
    let recorded = rt.block_on(record(&store, &tenant, 1, 4, 2));

    let text = config_text(
        dir.path(),
        &model,
        &url,
        &tenant,
        "[batch]\nmax_wait = \"0s\"\nsamples_per_step = 2\nmicro_batch_tokens = 256\nmax_seq_len = 128\n",
    );
    let summary = train_until_idle(&text);

    assert!(summary.optimizer_steps[&tenant] >= 2, "{summary:?}");
    assert_eq!(summary.acked[&tenant], recorded.ready_entries);
    assert_trained_everything(dir.path(), &model, &tenant, &recorded);
    assert_eq!(rt.block_on(unacked(&store, &tenant, "trainer")), 0);
}

/// Deletes a tenant's keys from Redis when dropped, also when the test fails.
struct TenantKeys {
    url: String,
    tenant: TenantId,
}

impl Drop for TenantKeys {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("clawback:{{{}}}:*", self.tenant))
            .query(&mut conn)
            .unwrap_or_default();
        for key in keys {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query(&mut conn);
        }
        let _: redis::RedisResult<i64> = redis::cmd("SREM")
            .arg("clawback:tenants")
            .arg(self.tenant.as_str())
            .query(&mut conn);
    }
}

/// Kills the child on drop, so a failing test leaves no trainer behind.
struct Trainer(Child);

impl Drop for Trainer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_trainer(config: &Path, jsonl_name: &str) -> Trainer {
    let child = Command::new(env!("CARGO_BIN_EXE_clawback-trainer"))
        .args(["train", "--config"])
        .arg(config)
        .env("CLAWBACK_TRAINER_METRICS__JSONL", jsonl_name)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the trainer: {e}"));
    Trainer(child)
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_trainer_killed_after_its_first_checkpoint_resumes_losing_nothing_and_repeating_nothing() {
    let (dir, model, data, store) = local_setup();
    let tenant = fresh_tenant("crash");
    let rt = runtime();
    // 24 single sessions: one delivery and one sample each, so with one sample per step every
    // optimizer step trains exactly one trajectory and the final step count is checkable.
    let recorded = rt.block_on(record(&store, &tenant, 0, 0, 24));

    let config_path = dir.path().join("trainer.toml");
    let text = config_text(
        dir.path(),
        &model,
        &data.display().to_string(),
        &tenant,
        "[batch]\nsamples_per_step = 1\nmax_wait = \"0s\"\nmicro_batch_tokens = 256\nmax_seq_len = 128\n",
    );
    let text = text.replace("[checkpoint]\n", "[checkpoint]\nevery = 2\n");
    std::fs::write(&config_path, text).unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().join("checkpoints");

    let first_log = dir.path().join("first.jsonl");
    let mut first = spawn_trainer(&config_path, &first_log.display().to_string());
    wait_for("the first checkpoint", Duration::from_secs(90), || {
        !checkpoints(&root, &tenant).is_empty()
    });
    first.0.kill().unwrap_or_else(|e| panic!("SIGKILL: {e}"));
    let _ = first.0.wait();
    let at_kill = checkpoints(&root, &tenant)
        .last()
        .map_or(0, |(_, s)| s.optimizer_steps);
    let stepped_before_kill = step_lines(&first_log).len();
    println!("killed after {stepped_before_kill} steps, latest checkpoint at step {at_kill}");

    // The restarted trainer takes over the dead one's unacked entries after claim_idle (1 s),
    // then trains until every recorded step is in a checkpoint; SIGTERM stops it gracefully.
    let second_log = dir.path().join("second.jsonl");
    let mut second = spawn_trainer(&config_path, &second_log.display().to_string());
    let mut expected = recorded.steps.clone();
    expected.sort();
    wait_for(
        "every step in a checkpoint",
        Duration::from_secs(90),
        || {
            let mut applied: Vec<StepId> = checkpoints(&root, &tenant)
                .iter()
                .flat_map(|(_, s)| s.applied_steps.iter().copied())
                .collect();
            applied.sort();
            applied.dedup();
            applied == expected
        },
    );
    let pid = second.0.id().to_string();
    let term = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(term.is_ok_and(|s| s.success()), "could not send SIGTERM");
    let status = second.0.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status.success(),
        "the trainer did not stop cleanly on SIGTERM: {status}"
    );

    let saved = assert_trained_everything(dir.path(), &model, &tenant, &recorded);
    // Continuous optimizer steps: the restart continued from the checkpoint it found, and as
    // each step trains one trajectory, the count is the number of trajectories exactly.
    let resumed = step_lines(&second_log);
    if at_kill < 24 {
        assert_eq!(
            resumed.first().and_then(|l| l["step"].as_u64()),
            Some(at_kill + 1)
        );
    }
    let last = saved.last().map_or(0, |(_, s)| s.optimizer_steps);
    assert_eq!(last, 24);
    assert_eq!(at_kill + resumed.len() as u64, 24);
    let numbers: Vec<u64> = saved.iter().map(|(_, s)| s.optimizer_steps).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    assert_eq!(rt.block_on(unacked(&store, &tenant, "trainer")), 0);
}

#[test]
fn text_only_steps_are_re_tokenised_and_hints_distilled_with_the_models_tokenizer() {
    let (dir, model, data, store) = local_setup();
    common::add_tokenizer(&model);
    let tenant = fresh_tenant("text");
    let rt = runtime();
    let mut all_steps = Vec::new();
    for thumb in [1.0, -1.0] {
        let traj = Trajectory::open(tenant.clone(), TrajectoryId::new());
        let mut steps = common::recorded_steps(&tenant, traj.id, 0);
        // The second turn came from an OpenAI upstream: text only, no ids, no logprobs.
        steps[1].tokens = Tokens::None;
        let evaluations = vec![
            common::feedback(&tenant, traj.id, thumb),
            common::plugin_score(
                &tenant,
                traj.id,
                Some(steps[0].id),
                "opd-hint",
                None,
                Some("Mention the umbrella."),
            ),
        ];
        all_steps.extend(steps.iter().map(|s| s.id));
        rt.block_on(common::write_trajectory(
            &store,
            &traj,
            &steps,
            &evaluations,
        ));
    }
    let text = config_text(
        dir.path(),
        &model,
        &data.display().to_string(),
        &tenant,
        "[batch]\nmax_wait = \"0s\"\nsamples_per_step = 8\nmicro_batch_tokens = 512\nmax_seq_len = 256\n",
    );
    let summary = train_until_idle(&text);
    assert_eq!(summary.optimizer_steps[&tenant], 1);

    let lines = step_lines(&dir.path().join("metrics.jsonl"));
    let last = &lines[lines.len() - 1];
    assert_eq!(last["samples_stats"]["text_only"], 2, "{last}");
    assert_eq!(last["dropped"]["text_only_skipped"], 0, "{last}");
    for reason in ["hints_opd_off", "hints_no_tokenizer", "hints_unrenderable"] {
        assert_eq!(last["dropped"][reason], 0, "{last}");
    }
    // Two engine samples and two re-tokenised ones.
    assert_eq!(last["samples"], 4, "{last}");
    // Every span has the thumb's reward; the first turn of each trajectory its hint too, and
    // the teacher scored its tokens.
    assert_eq!(last["signal"]["spans"], 4, "{last}");
    assert_eq!(last["signal"]["rewarded"], 4, "{last}");
    assert_eq!(last["signal"]["hinted"], 2, "{last}");
    assert_eq!(last["signal"]["both"], 2, "{last}");
    assert!(last["opd"]["tokens"].as_u64().unwrap_or(0) > 0, "{last}");
    assert!(
        last["opd"]["std"].as_f64().is_some_and(f64::is_finite),
        "{last}"
    );
    let mut applied: Vec<StepId> = checkpoints(&dir.path().join("checkpoints"), &tenant)
        .iter()
        .flat_map(|(_, s)| s.applied_steps.iter().copied())
        .collect();
    applied.sort();
    all_steps.sort();
    assert_eq!(applied, all_steps);
    assert_eq!(rt.block_on(unacked(&store, &tenant, "trainer")), 0);
}

/// Requests a stand-in vLLM received: (path, JSON body).
type Received = Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>;

/// A vLLM stand-in on loopback that accepts every adapter load and unload, as vLLM answers them.
fn fake_vllm() -> (String, Received) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "http://{}",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    let received: Received = Arc::default();
    let log = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(1000) {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(&stream);
            let mut request_line = String::new();
            let mut length = 0usize;
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            if let Ok(mut log) = log.lock() {
                log.push((path, json));
            }
            let answer = "Success: LoRA adapter loaded.";
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (url, received)
}

#[test]
fn each_checkpoint_is_published_loaded_into_the_backend_and_made_live() {
    let (dir, model, data, store) = local_setup();
    let tenant = fresh_tenant("publish");
    let rt = runtime();
    let recorded = rt.block_on(record(&store, &tenant, 2, 4, 3));
    let (vllm, received) = fake_vllm();
    let adapters = dir.path().join("adapters");
    let text = publishing_config(dir.path(), &model, &data, &tenant, &vllm, "");
    let summary = train_until_idle(&text);
    assert_trained_everything(dir.path(), &model, &tenant, &recorded);

    // The last checkpoint holds every step, so the live version is the final step count.
    let steps = summary.optimizer_steps[&tenant];
    assert!(summary.published[&tenant] >= 1, "{summary:?}");
    let live = rt
        .block_on(clawback_datapool::Store::policy_version(&store, &tenant))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no live policy after publishing"));
    let name = format!("{tenant}@v{steps}");
    assert_eq!(live.version, steps);
    assert_eq!(live.adapter, name);
    let version_dir = adapters.join(&name);
    assert!(version_dir.join("adapter_config.json").is_file());

    // The backend loaded exactly that folder under that name, and unloaded each older version.
    let received = received.lock().map(|r| r.clone()).unwrap_or_default();
    let loads: Vec<&serde_json::Value> = received
        .iter()
        .filter(|(path, _)| path == "/v1/load_lora_adapter")
        .map(|(_, body)| body)
        .collect();
    let unloads = received
        .iter()
        .filter(|(path, _)| path == "/v1/unload_lora_adapter")
        .count();
    assert_eq!(loads.len() as u64, summary.published[&tenant]);
    let last = loads[loads.len() - 1];
    assert_eq!(last["lora_name"], name.as_str());
    assert_eq!(
        last["lora_path"],
        version_dir.display().to_string().as_str()
    );
    assert_eq!(unloads, loads.len() - 1);

    // Each publish is reported in the JSONL log with its timings.
    let published: Vec<serde_json::Value> = jsonl(&dir.path().join("metrics.jsonl"))
        .into_iter()
        .filter_map(|line| line.get("publish").cloned())
        .collect();
    assert_eq!(published.len(), loads.len());
    assert!(
        published.iter().all(|p| p["error"].is_null()),
        "{published:?}"
    );
    assert!(published[0]["load_seconds"].as_f64().is_some());
}

/// A config that trains `tenant` from the embedded store in `data` on every 4 samples and
/// publishes each checkpoint into the stand-in vLLM at `vllm` (adapters under `dir/adapters`);
/// `publish_sections` adds sections such as `[publish.canary]`.
fn publishing_config(
    dir: &Path,
    model: &Path,
    data: &Path,
    tenant: &TenantId,
    vllm: &str,
    publish_sections: &str,
) -> String {
    config_text(
        dir,
        model,
        &data.display().to_string(),
        tenant,
        &format!(
            "[batch]\nmax_wait = \"0s\"\nsamples_per_step = 4\nmicro_batch_tokens = 128\n\
             max_seq_len = 128\n\n[publish]\nadapter_root = \"{}\"\n\n{publish_sections}\n\
             [[publish.backends]]\nkind = \"vllm\"\nurl = \"{vllm}\"\n",
            dir.join("adapters").display()
        ),
    )
}

/// The `lora_name` of every call to `path` the stand-in vLLM received, in order.
fn lora_names(received: &Received, path: &str) -> Vec<String> {
    let calls = received.lock().map(|r| r.clone()).unwrap_or_default();
    calls
        .iter()
        .filter(|(p, _)| p == path)
        .filter_map(|(_, body)| body["lora_name"].as_str().map(str::to_owned))
        .collect()
}

/// The bytes of a published version's adapter weights.
fn weights(adapters: &Path, tenant: &TenantId, version: u64) -> Vec<u8> {
    let file = adapters
        .join(format!("{tenant}@v{version}"))
        .join("adapter_model.safetensors");
    std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn an_operators_rollback_makes_an_earlier_version_live_again_and_training_continues_from_it() {
    use clawback_datapool::{Rollback, RollbackOutcome, Store, UnixMs};
    let (dir, model, data, store) = local_setup();
    let tenant = fresh_tenant("rollback");
    let rt = runtime();
    let (vllm, received) = fake_vllm();
    let adapters = dir.path().join("adapters");
    let text = publishing_config(dir.path(), &model, &data, &tenant, &vllm, "");
    let live = || {
        rt.block_on(store.policy_version(&tenant))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no live policy"))
    };
    let order = |to: u64| {
        let order = Rollback {
            schema_version: 1,
            tenant: tenant.clone(),
            id: format!("order-{to}"),
            to,
            from: live().version,
            ordered_at: UnixMs::now(),
            outcome: None,
        };
        rt.block_on(store.order_rollback(&order))
            .unwrap_or_else(|e| panic!("{e}"));
    };
    let outcome = || {
        rt.block_on(store.rollback(&tenant))
            .unwrap_or_else(|e| panic!("{e}"))
            .and_then(|o| o.outcome)
    };

    // Two rounds of training, two versions live one after the other.
    rt.block_on(record(&store, &tenant, 1, 4, 0));
    train_until_idle(&text);
    let first = live().version;
    rt.block_on(record(&store, &tenant, 1, 4, 0));
    train_until_idle(&text);
    let second = live().version;
    assert!(second > first, "{first} then {second}");
    assert_ne!(
        weights(&adapters, &tenant, first),
        weights(&adapters, &tenant, second)
    );

    // The operator rolls back to the first: its weights go live as a new version.
    order(first);
    train_until_idle(&text);
    let restored = second + 1;
    assert!(
        matches!(outcome(), Some(RollbackOutcome::Done { version, .. }) if version == restored),
        "{:?}",
        outcome()
    );
    assert_eq!(live().version, restored);
    assert_eq!(live().adapter, format!("{tenant}@v{restored}"));
    assert_eq!(
        weights(&adapters, &tenant, restored),
        weights(&adapters, &tenant, first)
    );
    let named = |path: &str| lora_names(&received, path);
    assert_eq!(
        named("/v1/load_lora_adapter").last(),
        Some(&format!("{tenant}@v{restored}"))
    );
    assert_eq!(
        named("/v1/unload_lora_adapter").last(),
        Some(&format!("{tenant}@v{second}"))
    );
    // A restart resumes from the restored weights, not from the versions rolled back.
    let (latest, state) = checkpoints(&dir.path().join("checkpoints"), &tenant)
        .pop()
        .unwrap_or_else(|| panic!("no checkpoint"));
    assert_eq!(
        (state.optimizer_steps, state.moments_from),
        (restored, restored)
    );
    assert_eq!(
        std::fs::read(latest.join("adapter").join("adapter_model.safetensors")).ok(),
        Some(weights(&adapters, &tenant, first))
    );
    let logged: Vec<serde_json::Value> = jsonl(&dir.path().join("metrics.jsonl"))
        .into_iter()
        .filter_map(|line| line.get("rollback").cloned())
        .collect();
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0]["outcome"]["version"], restored);

    // Training goes on from there, and the next version follows the restored one.
    rt.block_on(record(&store, &tenant, 1, 4, 0));
    train_until_idle(&text);
    assert!(live().version > restored, "{}", live().version);

    // An order for a version that is not earlier than the live one changes nothing.
    let now = live();
    order(now.version + 3);
    train_until_idle(&text);
    assert!(
        matches!(outcome(), Some(RollbackOutcome::Failed { .. })),
        "{:?}",
        outcome()
    );
    assert_eq!(live(), now);
}

#[test]
fn a_canary_serves_beside_the_live_version_and_its_users_rewards_promote_or_drop_it() {
    use clawback_datapool::Store;
    let (dir, model, data, store) = local_setup();
    let tenant = fresh_tenant("canary");
    let rt = runtime();
    let (vllm, received) = fake_vllm();
    let adapters = dir.path().join("adapters");
    let canary =
        "[publish.canary]\npercent = 20\nmin_steps = 4\nmax_drop = 0.2\nmax_wait = \"1h\"\n";
    let text = publishing_config(dir.path(), &model, &data, &tenant, &vllm, canary);
    let live = || {
        rt.block_on(store.policy_version(&tenant))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no live policy"))
    };
    let on_trial = || live().canary.map(|c| (c.version, c.percent));
    let calls = |path: &str| lora_names(&received, path);
    let decisions = || -> Vec<serde_json::Value> {
        jsonl(&dir.path().join("metrics.jsonl"))
            .into_iter()
            .filter_map(|line| line.get("canary").cloned())
            .collect()
    };

    // The first version has nothing to be tried beside: it goes live.
    rt.block_on(record(&store, &tenant, 1, 4, 0));
    train_until_idle(&text);
    let first = live().version;
    assert_eq!(on_trial(), None);

    // The next is loaded and serves a fifth of the calls beside it.
    rt.block_on(record(&store, &tenant, 1, 4, 0));
    train_until_idle(&text);
    let (second, percent) = on_trial().unwrap_or_else(|| panic!("no canary: {:?}", live()));
    assert_eq!((live().version, percent), (first, 20));
    assert_eq!(
        calls("/v1/load_lora_adapter").last(),
        Some(&format!("{tenant}@v{second}"))
    );
    assert!(calls("/v1/unload_lora_adapter").is_empty());

    // Its users rate it about as well as the live version's: it replaces it.
    rt.block_on(record_served(&store, &tenant, first, 1.0, 3));
    rt.block_on(record_served(&store, &tenant, second, 0.9, 3));
    train_until_idle(&text);
    assert_eq!(live().version, second);
    assert_eq!(
        calls("/v1/unload_lora_adapter").first(),
        Some(&format!("{tenant}@v{first}"))
    );
    assert_eq!(decisions().len(), 1);
    assert_eq!(decisions()[0]["promoted"], true, "{:?}", decisions());
    // The steps those ratings trained went into the next candidate, on trial now.
    let (third, _) = on_trial().unwrap_or_else(|| panic!("no canary: {:?}", live()));
    assert!(third > second);

    // Its users rate it worse: it is dropped and unloaded, the live version stays.
    rt.block_on(record_served(&store, &tenant, second, 1.0, 3));
    rt.block_on(record_served(&store, &tenant, third, -1.0, 3));
    train_until_idle(&text);
    assert_eq!(live().version, second);
    let last = decisions().pop().unwrap_or_default();
    assert_eq!(
        (last["promoted"].as_bool(), last["version"].as_u64()),
        (Some(false), Some(third))
    );
    assert!(calls("/v1/unload_lora_adapter").contains(&format!("{tenant}@v{third}")));
    assert!(adapters
        .join(format!("{tenant}@v{third}"))
        .join("adapter_config.json")
        .is_file());
}
