//! `clawback-bench`: the sidecar's overhead, measured against the same engine reached directly,
//! in one run. Starts the mock engine and the release sidecar as separate processes, then runs
//! the same workload straight to the engine and through the sidecar, phase by phase, and prints
//! a Markdown report. With `--plugin FILE.wasm` it also measures recording with that one filter
//! plugin loaded against recording without it, on two-turn conversations whose first step the
//! plugin evaluates, and counts the evaluations from the sidecar's own metrics.
//!
//! Run it with `scripts/bench` (which builds the release binaries and the plugins first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use clawback_tests::engine_json::{self, Reply};
use clawback_tests::load::{
    closed_loop, http_client, open_loop, HttpClient, PhaseResult, Target, Turn,
};
use http_body_util::{BodyExt, Full};
use serde_json::json;

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
    /// Also measure recording with this one filter plugin loaded (e.g. the built
    /// `tool_outcome.wasm`) against recording without it.
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// Open-loop rate of the plugin comparison, requests per second.
    #[arg(long, default_value_t = 1000)]
    plugin_rate: u32,
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

/// A two-turn tool-using conversation as an agent sends it: the model calls a tool; the second
/// turn repeats the first with the engine's reply and the tool's result appended, and ends the
/// trajectory. The second turn is the first step's next state, so a filter plugin evaluates it.
fn conversation() -> Vec<Turn> {
    let first = json!({
        "model": "mock-llama",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Use tools when they help."},
            {"role": "user", "content": "What's the temperature in Paris in Celsius?"}
        ],
        "tools": [{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            }
        }],
        "max_completion_tokens": 64
    });
    // What the mock engine answers to the first turn, exactly as it sends it.
    let reply = Reply::for_request(&first);
    let call_id = match &reply {
        Reply::ToolCall { id, .. } => id.clone(),
        Reply::Text(_) => "call_0".to_owned(),
    };
    let answer = engine_json::chat_completion("chatcmpl-bench", &first, &reply);
    let mut second = first.clone();
    if let Some(messages) = second["messages"].as_array_mut() {
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "tool", "tool_call_id": call_id,
                             "content": "{\"city\":\"Paris\",\"temperature\":21,\"unit\":\"celsius\"}"}));
    }
    vec![
        Turn {
            body: Bytes::from(first.to_string()),
            headers: Vec::new(),
        },
        Turn {
            body: Bytes::from(second.to_string()),
            headers: vec![("x-clawback-done", "true")],
        },
    ]
}

/// What a sidecar's `/metrics` says about its filters and its recorder.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counts {
    /// Plugin calls by outcome.
    scored: f64,
    no_opinion: f64,
    filter_error: f64,
    /// Steps not evaluated because the filter queue was full.
    filter_dropped: f64,
    /// Writes the recorder dropped (any reason).
    records_dropped: f64,
}

impl Counts {
    async fn scrape(client: &HttpClient, base: &str) -> Result<Self, String> {
        let request = http::Request::get(format!("{base}/metrics"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{base}/metrics: {e}"))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{base}/metrics: {e}"))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        Ok(Self {
            scored: sum(&text, "clawback_filter_calls_total", "outcome=\"score\""),
            no_opinion: sum(
                &text,
                "clawback_filter_calls_total",
                "outcome=\"no_opinion\"",
            ),
            filter_error: sum(
                &text,
                "clawback_filter_calls_total",
                "outcome=\"filter_error\"",
            ),
            filter_dropped: sum(&text, "clawback_filter_dropped_total", ""),
            records_dropped: sum(&text, "clawback_records_dropped_total", ""),
        })
    }

    fn since(self, before: Self) -> Self {
        Self {
            scored: self.scored - before.scored,
            no_opinion: self.no_opinion - before.no_opinion,
            filter_error: self.filter_error - before.filter_error,
            filter_dropped: self.filter_dropped - before.filter_dropped,
            records_dropped: self.records_dropped - before.records_dropped,
        }
    }

    /// Scrapes until two scrapes 200 ms apart agree (the filter queue drained), at most 10 s;
    /// the counts and how long it took.
    async fn settled(client: &HttpClient, base: &str) -> Result<(Self, Duration), String> {
        let started = std::time::Instant::now();
        let mut last = Self::scrape(client, base).await?;
        while started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = Self::scrape(client, base).await?;
            if now == last {
                break;
            }
            last = now;
        }
        Ok((last, started.elapsed()))
    }
}

/// The sum of a Prometheus text exposition's samples of `name` whose labels contain `label`.
fn sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(['{', ' ']) && rest.contains(label))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A short warm-up (connection pools, allocator) before a measured phase.
async fn warm_up(client: &HttpClient, target: &Target) {
    let _ = open_loop(client, target, 200, Duration::from_secs(1)).await;
}

/// Runs `run` against every target in turn, each after a warm-up, so all of them see the same
/// machine state.
async fn each(
    client: &HttpClient,
    targets: &[(&str, Target)],
    run: impl Fn(HttpClient, Target) -> tokio::task::JoinHandle<PhaseResult>,
) -> Vec<PhaseResult> {
    let mut results = Vec::new();
    for (_, target) in targets {
        warm_up(client, target).await;
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
    let serve = |extra: &[&str]| {
        let mut argv = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &engine_url,
            "--set",
            "log.filter=warn",
            "--set",
            "limits.max_concurrent_requests=100000",
        ];
        argv.extend_from_slice(extra);
        spawn(
            &args.sidecar,
            &argv,
            "clawback-sidecar listening on ",
            args.sidecar_cpu,
        )
    };
    // The proxy alone: an OpenAI-kind upstream, nothing injected, recording off.
    let (sidecar, sidecar_url) = serve(&[
        "--upstream-kind",
        "openai",
        "--set",
        "recording.enabled=false",
    ])?;
    // Recording into Redis: a vLLM-kind upstream, token ids and logprobs captured and stripped.
    let (_redis, redis_url) = start_redis()?;
    let data_dir = std::env::temp_dir().join(format!("clawback-bench-{}", std::process::id()));
    let recording = |data_dir: &Path, more: &[&str]| {
        let data_dir = data_dir.display().to_string();
        let mut extra = vec![
            "--upstream-kind",
            "vllm",
            "--redis",
            &redis_url,
            "--data-dir",
            &data_dir,
        ];
        extra.extend_from_slice(more);
        serve(&extra)
    };
    let (recorder, recorder_url) = recording(&data_dir, &[])?;
    let rss = RssSampler::start(sidecar.0.id());
    let recorder_rss = RssSampler::start(recorder.0.id());
    let client = http_client();
    let target = |base: &str, stream: bool| Target {
        first_byte: stream,
        ..Target::call(
            format!("{base}/v1/chat/completions"),
            chat_body(stream),
            vec![("x-clawback-done", "true")],
        )
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

    if let Some(plugin) = &args.plugin {
        // The recording sidecar again, with a plugin directory holding only this plugin.
        let plugin_dir = data_dir.join("plugins");
        std::fs::create_dir_all(&plugin_dir)
            .map_err(|e| format!("{}: {e}", plugin_dir.display()))?;
        let file_name = plugin.file_name().ok_or("--plugin names no file")?;
        std::fs::copy(plugin, plugin_dir.join(file_name))
            .map_err(|e| format!("{}: {e}", plugin.display()))?;
        let plugin_dir_arg = plugin_dir.display().to_string();
        let (filtered, filtered_url) = recording(
            &data_dir.join("with-plugin"),
            &["--plugins", &plugin_dir_arg],
        )?;
        let filtered_rss = RssSampler::start(filtered.0.id());
        let name = plugin
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let section = with_plugin(
            &client,
            &Sidecars {
                recording: &recorder_url,
                filtered: &filtered_url,
            },
            &name,
            &args,
        )
        .await?;
        report.push_str(&section);
        report.push_str(&format!(
            "\nPeak RSS of the sidecar with the plugin: {:.1} MiB.\n",
            filtered_rss.peak_mib()
        ));
    }

    println!("{report}");
    let _ = std::fs::remove_dir_all(&data_dir);
    if let Some(out) = args.out {
        std::fs::write(&out, &report).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// The two sidecars the plugin comparison measures: both record into the same Redis.
struct Sidecars<'a> {
    recording: &'a str,
    filtered: &'a str,
}

/// One phase of the plugin comparison, on both sidecars.
struct Compared {
    without: PhaseResult,
    with: PhaseResult,
    /// The plugin sidecar's counts over its phase, when the phase ended.
    at_end: Counts,
    /// The same once its filter queue drained, `waited` after the phase ended.
    drained: Counts,
    waited: Duration,
    /// Writes the sidecar without the plugin dropped in its phase.
    plain_dropped: f64,
}

impl Compared {
    /// What the plugin did in the phase, in words.
    fn evaluations(&self) -> String {
        let (at_end, drained) = (self.at_end, self.drained);
        format!(
            "conversations answered {:.0}; plugin calls by the phase's end: {:.0} scored, {:.0} no \
             opinion, {:.0} filter_error; once the filter queue drained ({} ms later): {:.0} \
             scored; steps dropped by the full filter queue: {:.0}; recorder writes dropped \
             (full queue: the datapool is slower than the traffic) without / with the plugin: \
             {:.0} / {:.0}",
            (self.with.sent - self.with.errors) as f64 / 2.0,
            at_end.scored,
            at_end.no_opinion,
            at_end.filter_error,
            self.waited.as_millis(),
            drained.scored,
            drained.filter_dropped,
            self.plain_dropped,
            drained.records_dropped,
        )
    }
}

/// One phase of the plugin comparison: the sidecar without the plugin, then the one with it,
/// each after a warm-up; the plugin sidecar's counts are taken after its warm-up, when its
/// phase ends, and once its filter queue drained.
async fn compare(
    client: &HttpClient,
    (plain, plain_base): (&Target, &str),
    (filtered, base): (&Target, &str),
    run: impl Fn(HttpClient, Target) -> tokio::task::JoinHandle<PhaseResult>,
) -> Result<Compared, String> {
    warm_up(client, plain).await;
    let plain_before = Counts::scrape(client, plain_base).await?;
    let without = run(client.clone(), plain.clone())
        .await
        .map_err(|e| format!("a load phase failed: {e}"))?;
    let plain_after = Counts::scrape(client, plain_base).await?;
    warm_up(client, filtered).await;
    let (before, _) = Counts::settled(client, base).await?;
    let with = run(client.clone(), filtered.clone())
        .await
        .map_err(|e| format!("a load phase failed: {e}"))?;
    let at_end = Counts::scrape(client, base).await?.since(before);
    let (drained, waited) = Counts::settled(client, base).await?;
    Ok(Compared {
        without,
        with,
        at_end,
        drained: drained.since(before),
        waited,
        plain_dropped: plain_after.since(plain_before).records_dropped,
    })
}

/// Recording with one plugin loaded against recording without it, on the same two-turn
/// conversations: one open-loop rate and the closed-loop maximum; each phase reports the
/// evaluations the plugin sidecar counted (during the phase, and once its filter queue drained).
async fn with_plugin(
    client: &HttpClient,
    sidecars: &Sidecars<'_>,
    plugin: &str,
    args: &Args,
) -> Result<String, String> {
    let phase = Duration::from_secs(args.seconds);
    let target = |base: &str| Target {
        url: format!("{base}/v1/chat/completions"),
        turns: conversation(),
        session_header: Some("x-clawback-session"),
        first_byte: false,
    };
    let (plain, filtered) = (target(sidecars.recording), target(sidecars.filtered));
    let mut report = format!(
        "\n#### Recording + one filter plugin (`{plugin}`)\n\n\
         Two-turn tool-using conversations, each in its own session (`x-clawback-session`): the \
         model calls a tool, the second turn sends the tool's result and ends the trajectory, so \
         every conversation gives one step with a next state for the plugin. *recording*: the \
         recording sidecar above; *+ plugin*: the same with `--plugins` holding only \
         `{plugin}.wasm` (filters at their defaults). Latency per call in ms, {}s per phase.\n\n",
        args.seconds
    );
    let rate = args.plugin_rate;
    let c = compare(
        client,
        (&plain, sidecars.recording),
        (&filtered, sidecars.filtered),
        |c, t| tokio::spawn(async move { open_loop(&c, &t, rate, phase).await }),
    )
    .await?;
    let (without, with) = (&c.without, &c.with);
    let p = |r: &PhaseResult, q| r.percentile_ms(q);
    report.push_str(&format!(
        "Open loop at {rate} req/s: recording p50 / p99 / p99.9 {} / {} / {}; + plugin {} / {} / {} \
         (added p50 / p99 {} / {}); errors {}/{}; {}.\n",
        ms(p(without, 0.5)), ms(p(without, 0.99)), ms(p(without, 0.999)),
        ms(p(with, 0.5)), ms(p(with, 0.99)), ms(p(with, 0.999)),
        ms(p(with, 0.5) - p(without, 0.5)), ms(p(with, 0.99) - p(without, 0.99)),
        without.errors, with.errors,
        c.evaluations(),
    ));
    eprintln!("plugin, rate {rate}: done");

    let concurrency = args.concurrency;
    let c = compare(
        client,
        (&plain, sidecars.recording),
        (&filtered, sidecars.filtered),
        |c, t| tokio::spawn(async move { closed_loop(&c, &t, concurrency, phase).await }),
    )
    .await?;
    report.push_str(&format!(
        "\nMaximum throughput, closed loop with {concurrency} conversations in flight: recording \
         {:.0} req/s; + plugin {:.0} req/s (**{:.0} %** of recording); errors {}/{}; {}.\n",
        c.without.throughput(),
        c.with.throughput(),
        100.0 * c.with.throughput() / c.without.throughput(),
        c.without.errors,
        c.with.errors,
        c.evaluations(),
    ));
    eprintln!("plugin, closed loop: done");
    Ok(report)
}
