//! Chaos under load: agents hold multi-turn sessions (stitched, no ids) and group rollouts
//! (handshake API) through two sidecar replicas behind a real NGINX, the sidecars record into
//! one Redis, a `user_feedback` plugin and the rollouts' own rewards score them, and the trainer
//! learns from them — while a seeded monkey SIGKILLs and restarts a replica, Redis, the backend
//! (the reference backend, `clawback-serve`) or the trainer, one at a time.
//!
//! At the end, with everything up again, the invariants:
//! - every call an agent got a whole answer for is recorded exactly once (found by the marker in
//!   its last message and the text the agent received), in its session's trajectory, with the
//!   agent's next message as its next state;
//! - a session is one trajectory — one more only where the agent retried a call whose answer it
//!   never got, which the sidecar may have recorded (a retry of an unanswered step branches);
//! - every trajectory completes, and no group waits forever;
//! - no recorded step is trained twice: the checkpoints the trainer's JSONL lists across its
//!   restarts (the adapter's lineage) hold each step once.
//!
//! The short run (here, in the test command) lasts `CLAWBACK_CHAOS_SECONDS` (40) of load with a
//! kill every few seconds; the book (Concepts: A pool of sidecars) documents a 30-minute run of the same test.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawback_datapool::{
    GroupState, RedisConfig, RedisStore, StepId, Store, TenantId, TrajectoryRecord,
    TrajectoryStatus,
};
use clawback_tests::front_door::{free_port, start_nginx};
use clawback_tests::process::SidecarProcess;
use clawback_tests::redis_server::RedisServer;
use futures_util::StreamExt;
use serde_json::{json, Value};

const MODEL: &str = "tiny-chaos";
const ADMIN: &str = "chaos-admin-token";
const AGENTS: usize = 4;

fn trainer_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawback-trainer"))
}

/// A workspace binary built beside the trainer's (`cargo test --workspace` builds them all).
fn beside_trainer(name: &str, package: &str) -> PathBuf {
    let path = trainer_binary().with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: cargo build -p {package} --bin {name}",
        path.display()
    );
    path
}

fn sidecar_binary() -> PathBuf {
    beside_trainer("sidecar", "clawback-tests")
}

fn plugin_dir(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../wasm-plugins/target/wasm32-wasip2/release/user_feedback.wasm");
    assert!(
        source.is_file(),
        "{} is missing: cd wasm-plugins && cargo build --release --target wasm32-wasip2",
        source.display()
    );
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::copy(&source, plugins.join("user_feedback.wasm")).expect("plugin copied");
    plugins
}

/// A child process the monkey can kill and start again with the same command line.
struct Restartable {
    name: &'static str,
    command: Box<dyn Fn() -> Command + Send>,
    child: Option<Child>,
    log: PathBuf,
}

impl Restartable {
    fn start(
        name: &'static str,
        log: PathBuf,
        command: impl Fn() -> Command + Send + 'static,
    ) -> Self {
        let mut process = Restartable {
            name,
            command: Box::new(command),
            child: None,
            log,
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let err = log.try_clone().expect("log");
        let child = (self.command)()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.name));
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
    }
}

fn http_ok(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return false;
    };
    use std::io::{Read, Write};
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && &head[9..12] == b"200"
}

fn wait_for(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What an agent saw of one call.
#[derive(Debug, Clone)]
struct Served {
    /// The session (`s{agent}-{n}`) or rollout (`g{agent}-{n}-{k}`).
    session: String,
    turn: usize,
    /// The marker in the call's last user message.
    marker: String,
    /// The text the agent received.
    content: String,
    /// What the agent sent after this answer (the next turn's new message), if it went on.
    next: Option<Value>,
    /// The handshake trajectory of a rollout.
    trajectory: Option<String>,
    /// When the agent first sent it, and how many attempts it took (ms since the epoch).
    sent_at: u64,
    attempts: usize,
}

#[derive(Default)]
struct Ledger {
    served: Vec<Served>,
    /// Sessions in which a call failed after it may have been recorded, and was retried.
    retried: HashMap<String, usize>,
    groups: usize,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One chat call through the front door, retried until it is answered whole (as an agent
/// retries): the answer's text and how many attempts it took. Counts the failed attempts of
/// `session` in `ledger`.
async fn chat(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
    done: bool,
    session: &str,
    ledger: &Mutex<Ledger>,
) -> Option<(String, usize)> {
    for attempt in 0..60 {
        if attempt > 0 {
            *ledger
                .lock()
                .expect("ledger")
                .retried
                .entry(session.to_owned())
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut request = http.post(format!("{base}{path}")).json(body);
        if done {
            request = request.header("x-clawback-done", "true");
        }
        let Ok(response) = request.send().await else {
            continue;
        };
        if response.status() != 200 {
            continue;
        }
        if body["stream"] == true {
            let mut text = String::new();
            let mut whole = false;
            let mut buffer = String::new();
            let mut stream = response.bytes_stream();
            let mut broken = false;
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(bytes) => buffer.push_str(&String::from_utf8_lossy(&bytes)),
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            if broken {
                continue;
            }
            for event in buffer.split("\n\n") {
                let Some(data) = event.trim().strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    whole = true;
                    continue;
                }
                if let Ok(chunk) = serde_json::from_str::<Value>(data) {
                    if chunk.get("error").is_some() {
                        whole = false;
                        break;
                    }
                    text.push_str(
                        chunk["choices"][0]["delta"]["content"]
                            .as_str()
                            .unwrap_or(""),
                    );
                }
            }
            if whole {
                return Some((text, attempt + 1));
            }
        } else if let Ok(answer) = response.json::<Value>().await {
            if let Some(text) = answer["choices"][0]["message"]["content"].as_str() {
                return Some((text.to_owned(), attempt + 1));
            }
        }
    }
    None
}

/// An admin call, retried until a replica answers it.
async fn admin(http: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    for _ in 0..60 {
        if let Ok(response) = http.post(url).bearer_auth(ADMIN).json(body).send().await {
            if response.status().is_success() {
                return response.json().await.ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// A three-turn session without any id: the user's replies thank or correct (the plugin's
/// rewards), the last turn closes it.
async fn session(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    ledger: &Mutex<Ledger>,
    seed: u64,
) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a terse assistant."}),
        json!({"role": "user", "content": format!("Name a colour. [{name}-t0]")}),
    ];
    let mut served: Vec<Served> = Vec::new();
    for turn in 0..3 {
        let marker = format!("[{name}-t{turn}]");
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 12,
                          "stream": (seed + turn as u64).is_multiple_of(2)});
        let sent_at = now_ms();
        let Some((content, attempts)) = chat(
            http,
            base,
            "/v1/chat/completions",
            &body,
            turn == 2,
            name,
            ledger,
        )
        .await
        else {
            break;
        };
        let reply = json!({"role": "assistant", "content": content});
        let next = if turn < 2 {
            let text = if (seed + turn as u64).is_multiple_of(3) {
                format!("No, that's wrong. Try again. [{name}-t{}]", turn + 1)
            } else {
                format!("Thanks! Now another one. [{name}-t{}]", turn + 1)
            };
            Some(json!({"role": "user", "content": text}))
        } else {
            None
        };
        served.push(Served {
            session: name.to_owned(),
            turn,
            marker,
            content,
            next: next.clone(),
            trajectory: None,
            sent_at,
            attempts,
        });
        messages.push(reply);
        match next {
            Some(next) => messages.push(next),
            None => break,
        }
    }
    ledger.lock().expect("ledger").served.extend(served);
}

/// Two rollouts of one task through the handshake API, each one call, completed with a reward.
async fn rollouts(http: &reqwest::Client, base: &str, name: &str, ledger: &Mutex<Ledger>) {
    for k in 0..2 {
        let rollout = format!("{name}-{k}");
        let Some(opened) = admin(
            http,
            &format!("{base}/trajectories"),
            &json!({"group_id": name, "group_size": 2}),
        )
        .await
        else {
            return;
        };
        let Some(id) = opened["trajectory_id"].as_str().map(str::to_owned) else {
            return;
        };
        let marker = format!("[{rollout}]");
        let body = json!({"model": MODEL, "max_tokens": 12, "messages": [
            {"role": "user", "content": format!("Write a word. {marker}")}]});
        let path = format!("/s/{id}/v1/chat/completions");
        let sent_at = now_ms();
        let Some((content, attempts)) =
            chat(http, base, &path, &body, false, &rollout, ledger).await
        else {
            return;
        };
        let reward = if content.len() % 2 == 0 { 1.0 } else { -1.0 };
        admin(
            http,
            &format!("{base}/trajectories/{id}/complete"),
            &json!({"reward": reward}),
        )
        .await;
        let mut ledger = ledger.lock().expect("ledger");
        ledger.served.push(Served {
            session: rollout,
            turn: 0,
            marker,
            content,
            next: None,
            trajectory: Some(id),
            sent_at,
            attempts,
        });
        if k == 0 {
            ledger.groups += 1;
        }
    }
}

/// A tiny xorshift: the monkey's choices, repeatable from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn trainer_toml(dir: &Path, model: &Path, redis: &str) -> PathBuf {
    let toml = format!(
        r#"model = "{model}"
device = "cpu"
threads = 1
datapool = "{redis}"
tenants = ["default"]
poll_interval = "100ms"

[consumer]
group = "chaos"
name = "trainer-0"
claim_idle = "3s"

[lora]
rank = 4
alpha = 8.0

[optimizer]
lr = 1e-3

[batch]
samples_per_step = 4
max_wait = "1s"

[checkpoint]
dir = "{checkpoints}"
every = 1
keep_last = 2

[metrics]
progress = false
jsonl = "{metrics}"
"#,
        model = model.display(),
        checkpoints = dir.join("checkpoints").display(),
        metrics = dir.join("trainer.jsonl").display(),
    );
    let path = dir.join("trainer.toml");
    std::fs::write(&path, toml).expect("trainer.toml");
    path
}

/// Every step of tenant `default`, by trajectory.
async fn everything(store: &RedisStore) -> Vec<TrajectoryRecord> {
    let tenant = TenantId::new("default").expect("tenant");
    let mut records = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_trajectories(&tenant, after.as_ref(), 500)
            .await
            .expect("list");
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for header in &page {
            if let Some(record) = store.trajectory(&tenant, &header.id).await.expect("read") {
                records.push(record);
            }
        }
    }
    records
}

fn last_user_text(messages: &[Value]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_calls_survive_kills_of_every_part_recorded_once_and_trained_at_most_once() {
    let seconds: u64 = std::env::var("CLAWBACK_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("CLAWBACK_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(17);
    // Kept after the run (logs of every part) under the target folder.
    let run = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).expect("run folder");
    let dir = run.as_path();

    // The model, Redis, the backend.
    let model = dir.join("model");
    clawback_model::tiny_model::TinyModel::default()
        .write(&model)
        .expect("tiny model");
    std::fs::create_dir_all(dir.join("redis")).expect("redis dir");
    let mut redis = RedisServer::start_durable(&dir.join("redis"));
    let backend_port = free_port();
    let backend_url = format!("http://127.0.0.1:{backend_port}");
    let mut backend = {
        let model = model.clone();
        Restartable::start("the backend", dir.join("backend.log"), move || {
            let mut command = Command::new(beside_trainer("clawback-serve", "clawback-serve"));
            command
                .arg("--model")
                .arg(&model)
                .args([
                    "--served-model-name",
                    MODEL,
                    "--port",
                    &backend_port.to_string(),
                ])
                .args(["--device", "cpu", "--threads", "1"]);
            command
        })
    };
    wait_for("the backend", Duration::from_secs(60), || {
        http_ok(&format!("{backend_url}/v1/models"))
    });

    // Two replicas behind NGINX.
    let plugins = plugin_dir(dir);
    let mut sidecars = Vec::new();
    for i in 0..2 {
        let data_dir = dir.join(format!("sidecar-{i}"));
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let plugins = plugins.display().to_string();
        let redis_url = redis.url();
        let sidecar = SidecarProcess::start(
            &sidecar_binary(),
            addr,
            &data_dir,
            &[
                "--upstream",
                &backend_url,
                "--upstream-kind",
                "vllm",
                "--redis",
                &redis_url,
                "--plugins",
                &plugins,
                "--set",
                &format!("admin.token=\"{ADMIN}\""),
                "--set",
                "recording.idle_timeout=\"3s\"",
                "--set",
                "recording.group_timeout=\"20s\"",
                "--set",
                "recording.session_timeout=\"6s\"",
                // A call in flight on a replica the monkey killed holds its trajectory open
                // this long (an hour by default).
                "--set",
                "recording.stale_call=\"15s\"",
                // A completion a killed replica never wrote is taken over this soon (a minute
                // by default).
                "--set",
                "recording.completion_lease=\"10s\"",
                "--set",
                "timeouts.upstream_connect=\"1s\"",
            ],
        )
        .await;
        sidecars.push(sidecar);
    }
    let nginx = start_nginx(&[sidecars[0].addr, sidecars[1].addr]).await;
    let base = format!("http://{}", nginx.addr);

    // The trainer.
    let config = trainer_toml(dir, &model, &redis.url());
    let mut trainer = Restartable::start("the trainer", dir.join("trainer.log"), move || {
        let mut command = Command::new(trainer_binary());
        command.arg("train").arg("--config").arg(&config);
        command
    });

    // The agents.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let agents: Vec<_> = (0..AGENTS)
        .map(|agent| {
            let (ledger, stop, http, base) = (
                Arc::clone(&ledger),
                Arc::clone(&stop),
                http.clone(),
                base.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if n % 4 == 3 {
                        rollouts(&http, &base, &format!("g{agent}-{n}"), &ledger).await;
                    } else {
                        session(&http, &base, &format!("s{agent}-{n}"), &ledger, seed + n).await;
                    }
                    n += 1;
                }
            })
        })
        .collect();

    // The monkey: a kill every 3-6 s, then the part comes back after 0.3-1.3 s.
    let mut rng = Rng(seed.max(1));
    let mut kills: BTreeMap<&'static str, usize> = BTreeMap::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(3000 + rng.below(3000))).await;
        let down = Duration::from_millis(300 + rng.below(1000));
        let target = match rng.below(5) {
            0 => "sidecar 0",
            1 => "sidecar 1",
            2 => "redis",
            3 => "backend",
            _ => "trainer",
        };
        *kills.entry(target).or_default() += 1;
        match target {
            "sidecar 0" | "sidecar 1" => {
                let sidecar = &mut sidecars[usize::from(target == "sidecar 1")];
                sidecar.kill();
                tokio::time::sleep(down).await;
                sidecar.restart().await;
            }
            "redis" => {
                redis.kill();
                tokio::time::sleep(down).await;
                redis.restart();
            }
            "backend" => {
                backend.kill();
                tokio::time::sleep(down).await;
                backend.spawn();
            }
            _ => {
                trainer.kill();
                tokio::time::sleep(down).await;
                trainer.spawn();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for agent in agents {
        let _ = tokio::time::timeout(Duration::from_secs(120), agent).await;
    }
    let ledger = std::mem::take(&mut *ledger.lock().expect("ledger"));
    eprintln!(
        "chaos: {} calls served in {} s, {} groups, kills {kills:?}, sessions with retries {}",
        ledger.served.len(),
        started.elapsed().as_secs(),
        ledger.groups,
        ledger.retried.len()
    );
    assert!(
        ledger.served.len() >= 20,
        "too few calls served: {}",
        ledger.served.len()
    );

    // Everything settles: idle sessions complete, groups are released, the trainer catches up.
    let store = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .expect("redis");
    // Settled: no trajectory open and no group waiting (a group whose last member was
    // completed by another replica's sweep is released by the group timeout's sweep after it).
    let tenant = TenantId::new("default").expect("tenant");
    let deadline = Instant::now() + Duration::from_secs(90);
    let records = loop {
        let records = everything(&store).await;
        let mut open = records
            .iter()
            .filter(|r| r.trajectory.status == TrajectoryStatus::Open)
            .count();
        for group in records.iter().filter_map(|r| r.trajectory.group.as_ref()) {
            let state = store.group(&tenant, &group.id).await.ok().flatten();
            open += usize::from(matches!(
                state.map(|g| g.state),
                Some(GroupState::Open) | None
            ));
        }
        if open == 0 || Instant::now() >= deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // 1. Every served call is recorded once, in its session's trajectory, with its next state.
    let mut by_marker: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
    for (t, record) in records.iter().enumerate() {
        for (s, step) in record.steps.iter().enumerate() {
            let text = last_user_text(&step.request.messages);
            if let Some(start) = text.rfind('[') {
                by_marker
                    .entry(text[start..].to_owned())
                    .or_default()
                    .push((t, s));
            }
        }
    }
    let mut problems = Vec::new();
    let mut trajectories_of: HashMap<&str, HashSet<usize>> = HashMap::new();
    for call in &ledger.served {
        let found: Vec<(usize, usize)> = by_marker
            .get(&call.marker)
            .map(|hits| {
                hits.iter()
                    .copied()
                    .filter(|&(t, s)| {
                        records[t].steps[s].output.content.as_deref().unwrap_or("") == call.content
                    })
                    .collect()
            })
            .unwrap_or_default();
        match found.as_slice() {
            [(t, s)] => {
                trajectories_of.entry(&call.session).or_default().insert(*t);
                let step = &records[*t].steps[*s];
                if let Some(id) = &call.trajectory {
                    if records[*t].trajectory.id.to_string() != *id {
                        problems.push(format!(
                            "{} is recorded outside its trajectory",
                            call.marker
                        ));
                    }
                }
                if let Some(next) = &call.next {
                    let retried = ledger.retried.contains_key(&call.session);
                    let recorded = step.next_state.as_ref().map(|n| n.messages.clone());
                    if !retried && recorded.as_deref() != Some(std::slice::from_ref(next)) {
                        problems.push(format!(
                            "{}: next state {recorded:?}, the agent sent {next}",
                            call.marker
                        ));
                    }
                }
            }
            [] => problems.push(format!("{} was served and not recorded", call.marker)),
            many => problems.push(format!("{} is recorded {} times", call.marker, many.len())),
        }
    }
    // 2. A session is one trajectory (one more per retried call that may have branched it).
    for (session, trajectories) in &trajectories_of {
        let allowed = 1 + ledger.retried.get(*session).copied().unwrap_or(0);
        if trajectories.len() > allowed {
            let timeline: Vec<String> = ledger
                .served
                .iter()
                .filter(|c| c.session == **session)
                .map(|c| {
                    format!(
                        "turn {} sent at {} in {} attempt(s)",
                        c.turn, c.sent_at, c.attempts
                    )
                })
                .collect();
            let steps: Vec<String> = trajectories
                .iter()
                .flat_map(|&t| {
                    let records = &records;
                    records[t].steps.iter().map(move |s| {
                        format!(
                            "trajectory {} step {} started {} finished {}",
                            records[t].trajectory.id,
                            s.index,
                            s.timings.started_at.0,
                            s.timings.finished_at.0
                        )
                    })
                })
                .collect();
            problems.push(format!(
                "session {session} is split over {} trajectories: {timeline:?} {steps:?}",
                trajectories.len()
            ));
        }
    }
    // 3. Everything completed; no group waits.
    for record in &records {
        if record.trajectory.status == TrajectoryStatus::Open {
            problems.push(format!(
                "trajectory {} never completed",
                record.trajectory.id
            ));
        }
        if let Some(group) = &record.trajectory.group {
            let state = store
                .group(&tenant, &group.id)
                .await
                .ok()
                .flatten()
                .map(|g| g.state);
            if matches!(state, Some(GroupState::Open) | None) {
                problems.push(format!("group {} waits: {state:?}", group.id));
            }
        }
    }
    // 4. No step trained twice, across the trainer's restarts: in the adapter's lineage, the
    // checkpoints. (An optimizer step whose checkpoint never landed — the trainer was killed
    // between them — is lost with the process, and its steps are trained again after the
    // restart: its JSONL line lists them, its checkpoint line never came.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = std::fs::read_to_string(dir.join("trainer.jsonl")).unwrap_or_default();
    let mut trained: HashMap<StepId, usize> = HashMap::new();
    let mut optimizer_steps = 0;
    for line in audit.lines() {
        let Ok(report) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if report["trained_steps"].is_array() {
            optimizer_steps += 1;
        }
        let Some(steps) = report["checkpoint"]["applied_steps"].as_array() else {
            continue;
        };
        for step in steps {
            if let Some(id) = step.as_str().and_then(|s| s.parse::<StepId>().ok()) {
                *trained.entry(id).or_default() += 1;
            }
        }
    }
    let twice: Vec<_> = trained.iter().filter(|(_, n)| **n > 1).collect();
    if !twice.is_empty() {
        problems.push(format!("{} steps were trained more than once", twice.len()));
    }
    let steps: usize = records.iter().map(|r| r.steps.len()).sum();
    eprintln!(
        "chaos: {} trajectories, {steps} steps recorded, {} steps trained in {optimizer_steps} \
         optimizer steps",
        records.len(),
        trained.len()
    );
    let _ = std::fs::write(dir.join("nginx.log"), nginx.logs());
    assert!(
        problems.is_empty(),
        "{} problems (every part's log is in {}):\n{}",
        problems.len(),
        dir.display(),
        problems
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert!(
        optimizer_steps > 0,
        "the trainer never stepped:\n{}",
        trainer.logs()
    );
    backend.kill();
}
