//! Nothing an agent was served is lost when the sidecar is SIGKILLed: every call whose answer
//! reached its agent whole is in the datapool once the killed sidecar is started again — also
//! when Redis was stalled at the moment of the kill, with every step of those seconds still on
//! its way, and when a trajectory's completion was still waiting for its plugins. The sidecar is
//! the real binary, killed with SIGKILL (no shutdown, no flush); the engine is the mock,
//! streaming slowly enough that calls are always in flight.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawback_datapool::{RedisConfig, RedisStore, Store, TenantId, TrajectoryStatus};
use clawback_tests::front_door::free_port;
use clawback_tests::harness::repo_root;
use clawback_tests::mock::{Behaviour, MockUpstream};
use clawback_tests::process::SidecarProcess;
use clawback_tests::redis_server::RedisServer;
use futures_util::StreamExt;
use serde_json::json;

const CLIENTS: usize = 16;

fn sidecar_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sidecar"))
}

/// Agents calling the sidecar at `addr` until stopped: each call its own session with one
/// streamed turn (the done header closes it). A call counts as served when its answer arrived
/// whole (`[DONE]` and the end of the body); its session name is kept.
struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<Mutex<Vec<String>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        let clients = (0..CLIENTS)
            .map(|client| {
                let (stop, served, http) = (Arc::clone(&stop), Arc::clone(&served), http.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let session = format!("c{client}-{n}");
                        n += 1;
                        if call(&http, addr, &session).await {
                            served.lock().expect("served").push(session);
                        } else {
                            // The sidecar is down: a real agent backs off too.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            served,
            clients,
        }
    }

    /// Stops the agents; the sessions they were served.
    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            let _ = client.await;
        }
        let served = self.served.lock().expect("served").clone();
        served
    }
}

/// One streamed call; whether its whole answer arrived.
async fn call(http: &reqwest::Client, addr: SocketAddr, session: &str) -> bool {
    let response = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-clawback-session", session)
        .header("x-clawback-done", "true")
        .json(&json!({"model": "mock-llama", "stream": true,
                      "messages": [{"role": "user", "content": format!("hello from {session}")}]}))
        .send()
        .await;
    let Ok(response) = response else {
        return false;
    };
    if response.status() != 200 {
        return false;
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(_) => return false,
        }
    }
    String::from_utf8_lossy(&body).contains("data: [DONE]")
}

/// Steps recorded per session name, once every served session is completed (or `within`
/// passed).
async fn recorded(
    store: &RedisStore,
    served: &[String],
    within: Duration,
) -> HashMap<String, Vec<usize>> {
    let tenant = TenantId::new("default").expect("tenant");
    let deadline = Instant::now() + within;
    loop {
        let mut by_session: HashMap<String, Vec<usize>> = HashMap::new();
        let mut completed = 0;
        for header in store
            .list_trajectories(&tenant, None, 100_000)
            .await
            .unwrap_or_default()
        {
            let Some(session) = header.metadata.get("session").and_then(|s| s.as_str()) else {
                continue;
            };
            let steps = match store.trajectory(&tenant, &header.id).await {
                Ok(Some(record)) => record.steps.len(),
                _ => 0,
            };
            completed += usize::from(header.status == TrajectoryStatus::Completed);
            by_session
                .entry(session.to_owned())
                .or_default()
                .push(steps);
        }
        let all_in = served
            .iter()
            .all(|s| by_session.get(s).is_some_and(|steps| steps == &[1]));
        if (all_in && completed >= served.len()) || Instant::now() >= deadline {
            return by_session;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every served call is one trajectory of one step — nothing lost, nothing written twice.
fn assert_every_served_call_recorded_once(
    served: &[String],
    by_session: &HashMap<String, Vec<usize>>,
    sidecar: &SidecarProcess,
) {
    assert!(
        served.len() > 100,
        "too little load: {} calls",
        served.len()
    );
    let lost: Vec<&String> = served
        .iter()
        .filter(|s| by_session.get(*s).is_none_or(|steps| steps.is_empty()))
        .collect();
    let twice: Vec<(&String, &Vec<usize>)> = by_session
        .iter()
        .filter(|(_, steps)| steps != &&[1])
        .collect();
    assert!(
        lost.is_empty() && twice.is_empty(),
        "{} of {} served calls lost ({:?}…), {} sessions not recorded once ({:?}…)\n{}",
        lost.len(),
        served.len(),
        lost.iter().take(5).collect::<Vec<_>>(),
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>(),
        sidecar.logs()
    );
}

/// A counter of the sidecar's `/metrics`.
async fn metric(sidecar: &SidecarProcess, name: &str) -> f64 {
    let text = reqwest::get(sidecar.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Stops the agents and checks that every call they were served is recorded once.
async fn after_the_load(
    load: Load,
    redis: &RedisServer,
    sidecar: &SidecarProcess,
    within: Duration,
) {
    let served = load.finish().await;
    let store = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .expect("redis");
    let by_session = recorded(&store, &served, within).await;
    let replayed = metric(sidecar, "clawback_records_replayed_total").await;
    eprintln!(
        "{} calls served, {replayed} journal records read back by the restarted sidecar",
        served.len()
    );
    assert_every_served_call_recorded_once(&served, &by_session, sidecar);
}

async fn setup(dir: &Path) -> (RedisServer, MockUpstream, SidecarProcess) {
    setup_with(dir, &["--set", "recording.queue_capacity=64"]).await
}

/// A durable Redis, the mock engine streaming a chunk every 3 ms, and the sidecar binary
/// recording into that Redis, started with `args` besides.
async fn setup_with(dir: &Path, args: &[&str]) -> (RedisServer, MockUpstream, SidecarProcess) {
    std::fs::create_dir_all(dir.join("redis")).expect("redis dir");
    let redis = RedisServer::start_durable(&dir.join("redis"));
    let engine = MockUpstream::start().await;
    engine.stop_recording();
    engine.set_behaviour(Behaviour {
        chunk_delay: Duration::from_millis(3),
        ..Behaviour::default()
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let data_dir = dir.join("sidecar");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let (engine_url, redis_url) = (engine.url(), redis.url());
    let mut all = vec!["--upstream", &engine_url, "--redis", &redis_url];
    all.extend_from_slice(args);
    let sidecar = SidecarProcess::start(sidecar_binary(), addr, &data_dir, &all).await;
    (redis, engine, sidecar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_mid_load_loses_no_served_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (redis, _engine, mut sidecar) = setup(dir.path()).await;
    let load = Load::start(sidecar.addr);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sidecar.kill();
    sidecar.restart().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    after_the_load(load, &redis, &sidecar, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_while_redis_stalls_loses_no_served_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (redis, _engine, mut sidecar) = setup(dir.path()).await;
    let load = Load::start(sidecar.addr);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Redis takes no write for 3 s: session scripts and datapool writes wait.
    let paused = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "CLIENT",
            "PAUSE",
            "3000",
            "WRITE",
        ])
        .output()
        .expect("redis-cli");
    assert!(paused.status.success(), "{paused:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Killed in the middle of the stall: every step of the last 1.5 s is still on its way.
    sidecar.kill();
    sidecar.restart().await;
    // The killed process left records in its journal that Redis never got. (Known before the
    // restarted process listens; how many of them were read back yet is a race with its writer.)
    let left = metric(&sidecar, "clawback_journal_left_at_start_bytes").await;
    assert!(
        left > 0.0,
        "nothing was left to replay: the test tested nothing\n{}",
        sidecar.logs()
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    after_the_load(load, &redis, &sidecar, Duration::from_secs(30)).await;
}

/// A trajectory finished while its plugins still evaluated it (so its completion was not in the
/// journal yet) when the sidecar was killed: the restarted sidecar's sweep completes it once the
/// completion lease ran out, rather than leaving it open forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_waiting_for_its_plugins_survives_a_kill() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A step plugin that spins until the call's wall-clock backstop (its fuel is past what 30 s
    // can burn) holds the completion back that long.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let spinner = repo_root().join("wasm-plugins/target/wasm32-wasip2/release/endless_loop.wasm");
    std::fs::copy(&spinner, plugins.join("endless_loop.wasm")).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/test builds the plugins)",
            spinner.display()
        )
    });
    let filters_dir = format!("filters.dir={:?}", plugins.display().to_string());
    let (redis, _engine, mut sidecar) = setup_with(
        dir.path(),
        &[
            "--set",
            &filters_dir,
            "--set",
            "filters.fuel=1000000000000000",
            "--set",
            "filters.call_timeout=\"30s\"",
            "--set",
            "filters.host_retries=0",
            "--set",
            "recording.completion_lease=\"2s\"",
            "--set",
            "recording.idle_timeout=\"2s\"",
        ],
    )
    .await;
    let addr = sidecar.addr;
    let http = reqwest::Client::new();
    let turn = |messages: serde_json::Value, done: bool| {
        let request = http
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-clawback-session", "spun")
            .json(&json!({"model": "mock-llama", "messages": messages}));
        let request = if done {
            request.header("x-clawback-done", "true")
        } else {
            request
        };
        async move {
            let response = request.send().await.expect("call");
            assert_eq!(response.status(), 200);
            response.json::<serde_json::Value>().await.expect("answer")
        }
    };
    let first = json!([{"role": "user", "content": "hello"}]);
    let answer = turn(first.clone(), false).await;
    let mut second = first.as_array().cloned().unwrap_or_default();
    second.push(answer["choices"][0]["message"].clone());
    second.push(json!({"role": "user", "content": "and now?"}));
    // The second turn brings the first one's next state (the spinner starts on it) and ends the
    // session: its completion waits for the spinner.
    turn(json!(second), true).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    sidecar.kill();
    let store = RedisStore::connect(&RedisConfig::single(redis.url()))
        .await
        .expect("redis");
    let tenant = TenantId::new("default").expect("tenant");
    let status = || async {
        let headers = store
            .list_trajectories(&tenant, None, 10)
            .await
            .expect("trajectories");
        assert_eq!(headers.len(), 1, "one session, one trajectory: {headers:?}");
        headers[0].status
    };
    assert_eq!(
        status().await,
        TrajectoryStatus::Open,
        "the completion was written before the kill: the test tested nothing"
    );
    sidecar.restart().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while status().await != TrajectoryStatus::Completed {
        assert!(
            Instant::now() < deadline,
            "the trajectory was never completed\n{}",
            sidecar.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric(&sidecar, "clawback_completions_taken_over_total").await,
        1.0
    );
}
