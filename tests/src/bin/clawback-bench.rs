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

async fn pair(
    client: &HttpClient,
    direct: &Target,
    via: &Target,
    run: impl Fn(HttpClient, Target) -> tokio::task::JoinHandle<PhaseResult>,
) -> (PhaseResult, PhaseResult) {
    // Warm both paths (connection pools, allocator) before measuring.
    let _ = open_loop(client, direct, 200, Duration::from_secs(1)).await;
    let _ = open_loop(client, via, 200, Duration::from_secs(1)).await;
    let d = run(client.clone(), direct.clone()).await;
    let v = run(client.clone(), via.clone()).await;
    match (d, v) {
        (Ok(d), Ok(v)) => (d, v),
        _ => panic!("a load phase panicked"),
    }
}

fn ms(x: f64) -> String {
    format!("{x:.3}")
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
    let (sidecar, sidecar_url) = spawn(
        &args.sidecar,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &engine_url,
            "--set",
            "log.filter=warn",
            "--set",
            "limits.max_concurrent_requests=100000",
        ],
        "clawback-sidecar listening on ",
        args.sidecar_cpu,
    )?;
    let rss = RssSampler::start(sidecar.0.id());
    let client = http_client();
    let target = |base: &str, stream: bool| Target {
        url: format!("{base}/v1/chat/completions"),
        body: chat_body(stream),
        first_byte: stream,
    };
    let (direct, via) = (target(&engine_url, false), target(&sidecar_url, false));

    let mut report = String::new();
    if let Some(cpu) = args.sidecar_cpu {
        report.push_str(&format!(
            "Sidecar pinned to CPU {cpu}; load generator and engine on the other CPU(s).\n\n"
        ));
    } else {
        report.push_str("Load generator, engine and sidecar share all CPUs (nothing pinned).\n\n");
    }
    report.push_str(&format!(
        "Non-streaming chat completions, open loop, {}s per phase; latency in ms from the \
         moment each request was due.\n\n",
        args.seconds
    ));
    report.push_str("| rate (req/s) | direct p50 | p90 | p99 | p99.9 | sidecar p50 | p90 | p99 | p99.9 | added p50 | added p99 | errors (direct/sidecar) |\n");
    report.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &rate in &args.rates {
        let (d, v) = pair(&client, &direct, &via, |c, t| {
            tokio::spawn(async move { open_loop(&c, &t, rate, phase).await })
        })
        .await;
        let p = |r: &PhaseResult, q| r.percentile_ms(q);
        report.push_str(&format!(
            "| {rate} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |\n",
            ms(p(&d, 0.5)),
            ms(p(&d, 0.9)),
            ms(p(&d, 0.99)),
            ms(p(&d, 0.999)),
            ms(p(&v, 0.5)),
            ms(p(&v, 0.9)),
            ms(p(&v, 0.99)),
            ms(p(&v, 0.999)),
            ms(p(&v, 0.5) - p(&d, 0.5)),
            ms(p(&v, 0.99) - p(&d, 0.99)),
            d.errors,
            v.errors,
        ));
        eprintln!("rate {rate}: done");
    }

    let concurrency = args.concurrency;
    let (d, v) = pair(&client, &direct, &via, |c, t| {
        tokio::spawn(async move { closed_loop(&c, &t, concurrency, phase).await })
    })
    .await;
    report.push_str(&format!(
        "\nMaximum throughput, closed loop with {concurrency} requests in flight: direct \
         {:.0} req/s, through the sidecar {:.0} req/s (**{:.0} %** of direct); errors {}/{}.\n",
        d.throughput(),
        v.throughput(),
        100.0 * v.throughput() / d.throughput(),
        d.errors,
        v.errors,
    ));

    let (direct_stream, via_stream) = (target(&engine_url, true), target(&sidecar_url, true));
    let (d, v) = pair(&client, &direct_stream, &via_stream, |c, t| {
        tokio::spawn(async move { open_loop(&c, &t, 500, phase).await })
    })
    .await;
    report.push_str(&format!(
        "\nStreaming chat completions at 500 req/s, time to first byte: direct p50 {} / p99 {} ms, \
         through the sidecar p50 {} / p99 {} ms — added p50 {} / p99 {} ms; errors {}/{}.\n",
        ms(d.percentile_ms(0.5)),
        ms(d.percentile_ms(0.99)),
        ms(v.percentile_ms(0.5)),
        ms(v.percentile_ms(0.99)),
        ms(v.percentile_ms(0.5) - d.percentile_ms(0.5)),
        ms(v.percentile_ms(0.99) - d.percentile_ms(0.99)),
        d.errors,
        v.errors,
    ));
    report.push_str(&format!(
        "\nSidecar peak RSS during the whole run: {:.1} MiB.\n",
        rss.peak_mib()
    ));

    println!("{report}");
    if let Some(out) = args.out {
        std::fs::write(&out, &report).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}
