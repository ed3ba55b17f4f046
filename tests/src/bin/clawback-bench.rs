//! `clawback-bench`: the sidecar's overhead, measured against the same engine reached directly,
//! in one run. Starts the mock engine and the release sidecar as separate processes, then runs
//! the same workload straight to the engine and through the sidecar, phase by phase, and prints
//! a Markdown report.
//!
//! Run it with `scripts/bench` (which builds the release binaries first).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use clawback_tests::load::{closed_loop, http_client, open_loop, HttpClient, PhaseResult, Target};

#[derive(Parser)]
struct Args {
    /// The sidecar binary to measure.
    #[arg(long, default_value = "target/release/clawback-sidecar")]
    sidecar: PathBuf,
    /// The mock engine binary.
    #[arg(long, default_value = "target/release/mock-upstream")]
    engine: PathBuf,
    /// Open-loop rates, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000,5000")]
    rates: Vec<u32>,
    /// Length of each measured phase, in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Requests in flight for the maximum-throughput phase.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Run the sidecar on this CPU only (via `taskset`); pin this process and the engine to
    /// the other CPUs yourself (`taskset -c 0 clawback-bench --sidecar-cpu 1`).
    #[arg(long)]
    sidecar_cpu: Option<u32>,
    /// Also write the report to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A child process killed on drop, so a failed run leaves nothing behind.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(
    binary: &PathBuf,
    args: &[&str],
    banner: &str,
    cpu: Option<u32>,
) -> Result<(Process, String), String> {
    use std::io::{BufRead, BufReader};
    let mut command = match cpu {
        Some(cpu) => {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpu.to_string()).arg(binary);
            taskset
        }
        None => Command::new(binary),
    };
    let mut child = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e} (run scripts/bench)", binary.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let url = line
        .trim()
        .strip_prefix(banner)
        .ok_or_else(|| format!("{} printed {line:?}", binary.display()))?
        .to_owned();
    Ok((Process(child), url))
}

/// Peak resident memory of a process, sampled every 50 ms while a phase runs.
struct RssSampler {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (peak, stopped) = (Arc::clone(&peak_kib), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib(pid) {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { peak_kib, stop }
    }

    fn peak_mib(&self) -> f64 {
        self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn chat_body(stream: bool) -> Bytes {
    let body = serde_json::json!({
        "model": "mock-llama",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather in Paris today?"}
        ],
        "max_completion_tokens": 64,
        "stream": stream
    });
    Bytes::from(body.to_string())
}

/// Runs `run` against every target in turn, each after a short warm-up (connection pools,
/// allocator), so all of them see the same machine state.
async fn each(
    client: &HttpClient,
    targets: &[(&str, Target)],
    run: impl Fn(HttpClient, Target) -> tokio::task::JoinHandle<PhaseResult>,
) -> Vec<PhaseResult> {
    let mut results = Vec::new();
    for (_, target) in targets {
        let _ = open_loop(client, target, 200, Duration::from_secs(1)).await;
        match run(client.clone(), target.clone()).await {
            Ok(result) => results.push(result),
            Err(e) => panic!("a load phase failed: {e}"),
        }
    }
    results
}

fn ms(x: f64) -> String {
    format!("{x:.3}")
}

/// A `redis-server` for the recording sidecar, on a free port, gone when dropped.
fn start_redis() -> Result<(Process, String), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((Process(child), url));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("redis-server did not come up".to_owned())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let phase = Duration::from_secs(args.seconds);
    let (_engine, engine_url) = spawn(
        &args.engine,
        &["--listen", "127.0.0.1:0"],
        "mock-upstream listening on ",
        None,
    )?;
    let serve = |extra: &[&str]| -> Vec<String> {
        let mut argv: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &engine_url,
            "--set",
            "log.filter=warn",
            "--set",
            "limits.max_concurrent_requests=100000",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        argv
    };
    // The proxy alone: an OpenAI-kind upstream, nothing injected, recording off.
    let plain_args = serve(&[
        "--upstream-kind",
        "openai",
        "--set",
        "recording.enabled=false",
    ]);
    let plain_refs: Vec<&str> = plain_args.iter().map(String::as_str).collect();
    let (sidecar, sidecar_url) = spawn(
        &args.sidecar,
        &plain_refs,
        "clawback-sidecar listening on ",
        args.sidecar_cpu,
    )?;
    // Recording into Redis: a vLLM-kind upstream, token ids and logprobs captured and stripped.
    let (_redis, redis_url) = start_redis()?;
    let data_dir = std::env::temp_dir().join(format!("clawback-bench-{}", std::process::id()));
    let data_dir_arg = data_dir.display().to_string();
    let recording_args = serve(&[
        "--upstream-kind",
        "vllm",
        "--redis",
        &redis_url,
        "--data-dir",
        &data_dir_arg,
    ]);
    let recording_refs: Vec<&str> = recording_args.iter().map(String::as_str).collect();
    let (recorder, recorder_url) = spawn(
        &args.sidecar,
        &recording_refs,
        "clawback-sidecar listening on ",
        args.sidecar_cpu,
    )?;
    let rss = RssSampler::start(sidecar.0.id());
    let recorder_rss = RssSampler::start(recorder.0.id());
    let client = http_client();
    let target = |base: &str, stream: bool| Target {
        url: format!("{base}/v1/chat/completions"),
        body: chat_body(stream),
        headers: vec![("x-clawback-done", "true")],
        first_byte: stream,
    };
    let targets = |stream: bool| {
        vec![
            ("direct", target(&engine_url, stream)),
            ("sidecar", target(&sidecar_url, stream)),
            ("recording", target(&recorder_url, stream)),
        ]
    };

    let mut report = String::new();
    if let Some(cpu) = args.sidecar_cpu {
        report.push_str(&format!(
            "Sidecars pinned to CPU {cpu}; load generator and engine on the other CPU(s).\n\n"
        ));
    } else {
        report.push_str("Load generator, engine and sidecars share all CPUs (nothing pinned).\n\n");
    }
    report.push_str(&format!(
        "Non-streaming chat completions, open loop, {}s per phase; latency in ms from the moment \
         each request was due. *direct*: straight to the mock engine; *sidecar*: the proxy alone \
         (recording off); *recording*: the proxy recording every call into Redis, with vLLM token \
         ids and logprobs captured and stripped.\n\n",
        args.seconds
    ));
    report.push_str("| rate (req/s) | direct p50 | p99 | p99.9 | sidecar p50 | p99 | p99.9 | recording p50 | p99 | p99.9 | sidecar added p50 / p99 | recording added p50 / p99 | errors (d/s/r) |\n");
    report.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &rate in &args.rates {
        let r = each(&client, &targets(false), |c, t| {
            tokio::spawn(async move { open_loop(&c, &t, rate, phase).await })
        })
        .await;
        let p = |i: usize, q| r[i].percentile_ms(q);
        report.push_str(&format!(
            "| {rate} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {}/{}/{} |\n",
            ms(p(0, 0.5)), ms(p(0, 0.99)), ms(p(0, 0.999)),
            ms(p(1, 0.5)), ms(p(1, 0.99)), ms(p(1, 0.999)),
            ms(p(2, 0.5)), ms(p(2, 0.99)), ms(p(2, 0.999)),
            ms(p(1, 0.5) - p(0, 0.5)), ms(p(1, 0.99) - p(0, 0.99)),
            ms(p(2, 0.5) - p(0, 0.5)), ms(p(2, 0.99) - p(0, 0.99)),
            r[0].errors, r[1].errors, r[2].errors,
        ));
        eprintln!("rate {rate}: done");
    }

    let concurrency = args.concurrency;
    let r = each(&client, &targets(false), |c, t| {
        tokio::spawn(async move { closed_loop(&c, &t, concurrency, phase).await })
    })
    .await;
    report.push_str(&format!(
        "\nMaximum throughput, closed loop with {concurrency} requests in flight: direct {:.0} req/s; \
         sidecar {:.0} req/s (**{:.0} %** of direct); recording {:.0} req/s (**{:.0} %** of direct); \
         errors {}/{}/{}.\n",
        r[0].throughput(),
        r[1].throughput(),
        100.0 * r[1].throughput() / r[0].throughput(),
        r[2].throughput(),
        100.0 * r[2].throughput() / r[0].throughput(),
        r[0].errors, r[1].errors, r[2].errors,
    ));

    let r = each(&client, &targets(true), |c, t| {
        tokio::spawn(async move { open_loop(&c, &t, 500, phase).await })
    })
    .await;
    report.push_str(&format!(
        "\nStreaming chat completions at 500 req/s, time to first byte (p50 / p99, ms): direct {} / {}; \
         sidecar {} / {}; recording {} / {}; errors {}/{}/{}.\n",
        ms(r[0].percentile_ms(0.5)), ms(r[0].percentile_ms(0.99)),
        ms(r[1].percentile_ms(0.5)), ms(r[1].percentile_ms(0.99)),
        ms(r[2].percentile_ms(0.5)), ms(r[2].percentile_ms(0.99)),
        r[0].errors, r[1].errors, r[2].errors,
    ));
    report.push_str(&format!(
        "\nPeak RSS over the whole run: sidecar {:.1} MiB, recording sidecar {:.1} MiB.\n",
        rss.peak_mib(),
        recorder_rss.peak_mib()
    ));

    println!("{report}");
    let _ = std::fs::remove_dir_all(&data_dir);
    if let Some(out) = args.out {
        std::fs::write(&out, &report).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}
