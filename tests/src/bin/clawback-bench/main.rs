//! `clawback-bench`: what one proxy hop costs — clawback's and its peers' — measured in one run
//! against the same engine with the same workload.
//!
//! Starts the mock engine, then one proxy at a time in front of it — none (*direct*), NGINX as
//! a plain reverse proxy, clawback with recording off, recording into its embedded store and
//! into Redis, and the LiteLLM proxy — and measures each the same way: the maximum throughput
//! (closed loop), latency at fixed rates (open loop, timed from each request's due time), CPU
//! per 1,000 calls over the proxy's whole process tree (Redis's shown apart), peak RSS, and
//! streams under a concurrency sweep (time to first byte, gap between chunks, total). For the
//! recording sidecars it counts, from the sidecar's own metrics, how many of the calls it
//! served were stored, and reports the throughput at which everything was. With `--plugin
//! FILE.wasm` it also measures recording with that one filter plugin against recording
//! without it. Last, two tenants on one sidecar, one abusive: the other's latency and success
//! rate beside the abuser against its own load alone, with fair shares and without.
//!
//! Run it with `scripts/bench` (which builds the release binaries, the plugins and installs
//! LiteLLM first).

mod counts;
mod plugin;
mod procs;
mod tenants;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use clawback_tests::load::{
    closed_loop, http_client, open_loop, paced_streams, streams, HttpClient, PacedResult,
    PhaseResult, StreamResult, Target, Turn,
};

use counts::Counts;
use procs::{Process, RssSampler};

#[derive(Parser)]
struct Args {
    /// The sidecar binary to measure.
    #[arg(long, default_value = "target/release/clawback-sidecar")]
    sidecar: PathBuf,
    /// The mock engine binary.
    #[arg(long, default_value = "target/release/mock-upstream")]
    engine: PathBuf,
    /// The LiteLLM proxy's `litellm` command (`scripts/bench` installs it); without it LiteLLM
    /// is not measured.
    #[arg(long, env = "CLAWBACK_LITELLM")]
    litellm: Option<PathBuf>,
    /// Open-loop rates, requests per second. A rate above 80 % of a proxy's maximum is not run
    /// on that proxy.
    #[arg(long, value_delimiter = ',', default_value = "25,250,1000,2000")]
    rates: Vec<u32>,
    /// Length of each measured phase, in seconds.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Requests in flight for the maximum-throughput phase.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Concurrent streams of the streaming sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    streams: Vec<usize>,
    /// Length of each streaming phase, in seconds.
    #[arg(long, default_value_t = 4)]
    stream_seconds: u64,
    /// Concurrent streams of the paced phase: the engine sends each answer's events
    /// `--paced-gap-ms` apart, as it decodes; 0 skips the phase.
    #[arg(long, default_value_t = 256)]
    paced_streams: usize,
    /// The engine's gap between two events of a paced stream, in ms.
    #[arg(long, default_value_t = 25)]
    paced_gap_ms: u64,
    /// Length of the paced phase, in seconds (streams started in it run to their end).
    #[arg(long, default_value_t = 8)]
    paced_seconds: u64,
    /// Run the proxies on this CPU only (via `taskset`); pin this process and the engine to
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
    /// Measure only these (comma-separated: direct, nginx, off, embedded, redis, litellm);
    /// the first is the baseline the others are compared with.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,nginx,off,embedded,redis,litellm"
    )]
    only: Vec<String>,
    /// Also write the report to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Calls per second of the well-behaved tenant in the two-tenant comparison; 0 skips it.
    #[arg(long, default_value_t = 100)]
    tenant_rate: u32,
}

/// How long a recording sidecar may take, after a phase, to store what it served.
const STORE_WITHIN: Duration = Duration::from_secs(120);
/// The rate whose latency the summary quotes, and the one whose CPU it quotes beside the
/// maximum.
const SUMMARY_RATE: u32 = 1000;
const CPU_RATE: u32 = 250;
/// The rate at which the summary quotes peak RSS.
const RSS_RATE: u32 = 2000;
/// The streaming concurrency whose throughput the summary and the aims quote.
const STREAMS_AIM_AT: usize = 32;

/// One thing measured: the engine itself, or a proxy in front of it.
struct Proxy {
    name: &'static str,
    url: String,
    /// The proxy's process (its tree is what CPU and RSS count); none for the engine.
    process: Option<Process>,
    /// A clawback sidecar's base URL, whose `/metrics` count what it stored.
    metrics: Option<String>,
    /// The Redis it records into, whose CPU is shown apart.
    redis: Option<u32>,
    /// Passes the client's headers on to the engine, so the paced phase can ask for pacing
    /// (LiteLLM makes a request of its own).
    passes_headers: bool,
}

/// CPU time used over a phase, in ms: the proxy's tree, and Redis's.
struct Cpu {
    proxy: f64,
    redis: f64,
}

impl Cpu {
    fn start(proxy: &Proxy) -> Self {
        Self {
            proxy: proxy
                .process
                .as_ref()
                .map_or(0.0, |p| procs::cpu_ms(p.pid())),
            redis: proxy.redis.map_or(0.0, procs::cpu_ms),
        }
    }

    fn since(proxy: &Proxy, start: &Self) -> Self {
        let now = Self::start(proxy);
        Self {
            proxy: now.proxy - start.proxy,
            redis: now.redis - start.redis,
        }
    }

    /// Per 1,000 calls.
    fn per_1000(&self, calls: u64) -> Self {
        let k = 1000.0 / calls.max(1) as f64;
        Self {
            proxy: self.proxy * k,
            redis: self.redis * k,
        }
    }
}

/// What a recording sidecar stored of the calls it served in a phase.
struct Stored {
    served: u64,
    stored: f64,
    dropped: f64,
    /// From the phase's end until everything served was stored (or `STORE_WITHIN` passed).
    drain: Duration,
    /// Stored calls per second, over the phase and its drain.
    throughput: f64,
}

struct Rate {
    rate: u32,
    result: PhaseResult,
    cpu: Cpu,
    rss_mib: f64,
}

struct Measured {
    name: &'static str,
    has_process: bool,
    records: bool,
    max: PhaseResult,
    max_cpu: Cpu,
    stored: Option<Stored>,
    /// `None`: the rate is above what this proxy can serve.
    rates: Vec<(u32, Option<Rate>)>,
    streams: Vec<(usize, StreamResult)>,
    /// The paced phase and its CPU per 1,000 events; `None` when not run.
    paced: Option<(PacedResult, Cpu)>,
    peak_rss_mib: f64,
}

impl Measured {
    fn rate(&self, rate: u32) -> Option<&Rate> {
        self.rates
            .iter()
            .find(|(r, _)| *r == rate)
            .and_then(|(_, m)| m.as_ref())
    }

    fn streams(&self, concurrency: usize) -> Option<&StreamResult> {
        self.streams
            .iter()
            .find(|(c, _)| *c == concurrency)
            .map(|(_, s)| s)
    }

    /// The throughput the summary reports: for a recorder, the rate at which it stored
    /// everything it served.
    fn max_throughput(&self) -> f64 {
        match &self.stored {
            Some(stored) => stored.throughput.min(self.max.throughput()),
            None => self.max.throughput(),
        }
    }
}

fn target(url: &str, stream: bool) -> Target {
    Target {
        url: format!("{url}/v1/chat/completions"),
        turns: vec![Turn {
            body: workload::agent_request(stream),
            // LiteLLM checks its master key; the others pass the header on.
            headers: vec![
                ("x-clawback-done", "true"),
                ("authorization", procs::LITELLM_BEARER),
            ],
        }],
        // Each call is its own trajectory, finished by its `x-clawback-done`.
        session_header: Some("x-clawback-session"),
        first_byte: false,
    }
}

/// A short warm-up (connection pools, allocator, a JIT-less Python's first imports) before a
/// measured phase.
pub(crate) async fn warm_up(client: &HttpClient, target: &Target) {
    let _ = closed_loop(client, target, 8, Duration::from_secs(1)).await;
}

pub(crate) fn ms(x: f64) -> String {
    format!("{x:.3}")
}

/// A difference in ms, with its sign.
fn added_ms(x: f64) -> String {
    format!("{x:+.3}")
}

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Waits until a recording sidecar's recorder has stored what it recorded so far.
async fn settle(client: &HttpClient, proxy: &Proxy) -> Result<Option<Counts>, String> {
    match &proxy.metrics {
        Some(base) => Ok(Some(Counts::settled(client, base, STORE_WITHIN).await?.0)),
        None => Ok(None),
    }
}

/// After a phase that served `served` calls: waits until the sidecar stored them all (or
/// stopped making progress, or `STORE_WITHIN` passed).
async fn stored_after(
    client: &HttpClient,
    base: &str,
    before: Counts,
    served: u64,
    elapsed: Duration,
) -> Result<Stored, String> {
    let ended = Instant::now();
    let (mut last, mut progress) = (Counts::scrape(client, base).await?.since(before), ended);
    while last.stored < served as f64
        && ended.elapsed() < STORE_WITHIN
        && progress.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Counts::scrape(client, base).await?.since(before);
        if now.stored > last.stored {
            progress = Instant::now();
        }
        last = now;
    }
    let drain = ended.elapsed();
    Ok(Stored {
        served,
        stored: last.stored,
        dropped: last.records_dropped,
        drain,
        throughput: last.stored / (elapsed + drain).as_secs_f64(),
    })
}

async fn measure(client: &HttpClient, proxy: &Proxy, args: &Args) -> Result<Measured, String> {
    let phase = Duration::from_secs(args.seconds);
    let plain = target(&proxy.url, false);
    let rss = proxy.process.as_ref().map(|p| RssSampler::start(p.pid()));

    warm_up(client, &plain).await;
    let before = settle(client, proxy).await?;
    let cpu = Cpu::start(proxy);
    let max = closed_loop(client, &plain, args.concurrency, phase).await;
    let served = max.sent - max.errors;
    let stored = match (&proxy.metrics, before) {
        (Some(base), Some(before)) => {
            Some(stored_after(client, base, before, served, max.elapsed).await?)
        }
        _ => None,
    };
    let max_cpu = Cpu::since(proxy, &cpu).per_1000(served);
    eprintln!("{}: maximum {:.0} req/s", proxy.name, max.throughput());

    let mut rates = Vec::new();
    for &rate in &args.rates {
        if f64::from(rate) > 0.8 * max.throughput() {
            rates.push((rate, None));
            continue;
        }
        warm_up(client, &plain).await;
        settle(client, proxy).await?;
        let sampler = proxy.process.as_ref().map(|p| RssSampler::start(p.pid()));
        let cpu = Cpu::start(proxy);
        let result = open_loop(client, &plain, rate, phase).await;
        // What the recorder does after the phase for the phase's calls counts too.
        settle(client, proxy).await?;
        let cpu = Cpu::since(proxy, &cpu).per_1000(result.sent - result.errors);
        let rss_mib = sampler.map_or(0.0, |s| s.peak_mib());
        rates.push((
            rate,
            Some(Rate {
                rate,
                result,
                cpu,
                rss_mib,
            }),
        ));
        eprintln!("{}: {rate} req/s done", proxy.name);
    }

    let streamed = target(&proxy.url, true);
    let mut sweep = Vec::new();
    for &concurrency in &args.streams {
        warm_up(client, &streamed).await;
        let result = streams(
            client,
            &streamed,
            concurrency,
            Duration::from_secs(args.stream_seconds),
        )
        .await;
        sweep.push((concurrency, result));
    }
    eprintln!("{}: streams done", proxy.name);

    let paced = if args.paced_streams > 0 && proxy.passes_headers {
        warm_up(client, &streamed).await;
        settle(client, proxy).await?;
        let cpu = Cpu::start(proxy);
        let result = paced_streams(
            client,
            &streamed,
            args.paced_streams,
            Duration::from_secs(args.paced_seconds),
        )
        .await;
        settle(client, proxy).await?;
        let cpu = Cpu::since(proxy, &cpu).per_1000(result.events);
        eprintln!("{}: paced streams done", proxy.name);
        Some((result, cpu))
    } else {
        None
    };

    Ok(Measured {
        name: proxy.name,
        has_process: proxy.process.is_some(),
        records: proxy.metrics.is_some(),
        max,
        max_cpu,
        stored,
        rates,
        streams: sweep,
        paced,
        peak_rss_mib: rss.map_or(0.0, |s| s.peak_mib()),
    })
}

/// The proxies a run measures, in order.
#[derive(Clone, Copy)]
enum Kind {
    Direct,
    Nginx,
    ClawbackOff,
    ClawbackEmbedded,
    ClawbackRedis,
    LiteLlm,
}

impl Kind {
    fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "direct" => Self::Direct,
            "nginx" => Self::Nginx,
            "off" => Self::ClawbackOff,
            "embedded" => Self::ClawbackEmbedded,
            "redis" => Self::ClawbackRedis,
            "litellm" => Self::LiteLlm,
            other => {
                return Err(format!(
                    "--only: unknown {other:?} (direct, nginx, off, embedded, redis, litellm)"
                ))
            }
        })
    }
}

struct Run<'a> {
    args: &'a Args,
    engine_url: String,
    redis_url: String,
    redis_pid: u32,
    scratch: PathBuf,
}

impl Run<'_> {
    fn sidecar(&self, extra: &[&str]) -> Result<(Process, String), String> {
        let mut argv = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &self.engine_url,
            "--set",
            "log.filter=warn",
            "--set",
            "limits.max_concurrent_requests=100000",
        ];
        argv.extend_from_slice(extra);
        procs::spawn(
            &self.args.sidecar,
            &argv,
            "clawback-sidecar listening on ",
            self.args.sidecar_cpu,
        )
    }

    /// Starts `kind`; `None` when it cannot be measured here (LiteLLM not installed).
    fn start(&self, kind: Kind) -> Result<Option<Proxy>, String> {
        let cpu = self.args.sidecar_cpu;
        let proxy = |name, (process, url): (Process, String), recording: Option<bool>| Proxy {
            name,
            metrics: recording.map(|_| url.clone()),
            redis: recording.filter(|redis| *redis).map(|_| self.redis_pid),
            url,
            process: Some(process),
            passes_headers: true,
        };
        Ok(Some(match kind {
            Kind::Direct => Proxy {
                name: "direct (the engine)",
                url: self.engine_url.clone(),
                process: None,
                metrics: None,
                redis: None,
                passes_headers: true,
            },
            Kind::Nginx => proxy(
                "NGINX, plain reverse proxy",
                procs::start_nginx(&self.engine_url, &self.scratch.join("nginx"), cpu)?,
                None,
            ),
            Kind::ClawbackOff => proxy(
                "clawback, recording off",
                self.sidecar(&[
                    "--upstream-kind",
                    "openai",
                    "--set",
                    "recording.enabled=false",
                ])?,
                None,
            ),
            Kind::ClawbackEmbedded => {
                let dir = self.scratch.join("embedded").display().to_string();
                proxy(
                    "clawback, recording into its embedded store (SQLite)",
                    self.sidecar(&["--upstream-kind", "vllm", "--data-dir", &dir])?,
                    Some(false),
                )
            }
            Kind::ClawbackRedis => {
                let dir = self.scratch.join("redis").display().to_string();
                proxy(
                    "clawback, recording into Redis",
                    self.sidecar(&[
                        "--upstream-kind",
                        "vllm",
                        "--redis",
                        &self.redis_url,
                        "--data-dir",
                        &dir,
                    ])?,
                    Some(true),
                )
            }
            Kind::LiteLlm => match &self.args.litellm {
                Some(litellm) => Proxy {
                    passes_headers: false,
                    ..proxy(
                        "LiteLLM proxy (1 worker, no database)",
                        procs::start_litellm(
                            litellm,
                            &self.engine_url,
                            workload::MODEL,
                            &self.scratch.join("litellm"),
                            cpu,
                        )?,
                        None,
                    )
                },
                None => return Ok(None),
            },
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let answer_bytes = workload::ANSWER_BYTES.to_string();
    let paced_gap = args.paced_gap_ms.to_string();
    let (_engine, engine_url) = procs::spawn(
        &args.engine,
        &[
            "--listen",
            "127.0.0.1:0",
            "--answer-bytes",
            &answer_bytes,
            "--paced-gap-ms",
            &paced_gap,
        ],
        "mock-upstream listening on ",
        None,
    )?;
    let (redis, redis_url) = procs::start_redis()?;
    let scratch = std::env::temp_dir().join(format!("clawback-bench-{}", std::process::id()));
    let run = Run {
        args: &args,
        engine_url,
        redis_url,
        redis_pid: redis.pid(),
        scratch: scratch.clone(),
    };
    let client = http_client();
    let mut measured = Vec::new();
    let kinds = args
        .only
        .iter()
        .map(|name| Kind::parse(name))
        .collect::<Result<Vec<_>, _>>()?;
    for kind in kinds {
        let Some(proxy) = run.start(kind)? else {
            eprintln!("LiteLLM is not measured: no --litellm (scripts/bench installs it)");
            continue;
        };
        measured.push(measure(&client, &proxy, &args).await?);
    }

    let mut report = report(&args, &measured);
    if let Some(plugin) = &args.plugin {
        report.push_str(&plugin_section(&args, &run, plugin, &client).await?);
    }
    if args.tenant_rate > 0 {
        report.push_str(
            &tenants::two_tenants(&client, &run, &args.engine, args.tenant_rate, args.seconds)
                .await?,
        );
    }
    println!("{report}");
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(out) = &args.out {
        std::fs::write(out, &report).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// Recording with the plugin against recording without it, on an engine of the usual replies
/// (the conversations need its tool calls).
async fn plugin_section(
    args: &Args,
    run: &Run<'_>,
    plugin: &Path,
    client: &HttpClient,
) -> Result<String, String> {
    let (_engine, engine_url) = procs::spawn(
        &args.engine,
        &["--listen", "127.0.0.1:0"],
        "mock-upstream listening on ",
        None,
    )?;
    let run = Run {
        engine_url,
        scratch: run.scratch.join("plugin"),
        redis_url: run.redis_url.clone(),
        ..*run
    };
    let plugin_dir = run.scratch.join("plugins");
    std::fs::create_dir_all(&plugin_dir).map_err(|e| format!("{}: {e}", plugin_dir.display()))?;
    let file_name = plugin.file_name().ok_or("--plugin names no file")?;
    std::fs::copy(plugin, plugin_dir.join(file_name))
        .map_err(|e| format!("{}: {e}", plugin.display()))?;
    let recording = |dir: &str, more: &[&str]| {
        let data_dir = run.scratch.join(dir).display().to_string();
        let mut extra = vec![
            "--upstream-kind",
            "vllm",
            "--redis",
            &run.redis_url,
            "--data-dir",
            &data_dir,
        ];
        extra.extend_from_slice(more);
        run.sidecar(&extra)
    };
    let (_plain, plain_url) = recording("without", &[])?;
    let plugin_dir_arg = plugin_dir.display().to_string();
    let (filtered, filtered_url) = recording("with", &["--plugins", &plugin_dir_arg])?;
    let filtered_rss = RssSampler::start(filtered.pid());
    let name = plugin
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut section = plugin::with_plugin(
        client,
        &plugin::Sidecars {
            recording: &plain_url,
            filtered: &filtered_url,
        },
        &name,
        args.plugin_rate,
        args.concurrency,
        args.seconds,
    )
    .await?;
    section.push_str(&format!(
        "\nPeak RSS of the sidecar with the plugin: {:.1} MiB.\n",
        filtered_rss.peak_mib()
    ));
    Ok(section)
}

/// The Markdown report of a run.
fn report(args: &Args, measured: &[Measured]) -> String {
    let mut out = String::new();
    match args.sidecar_cpu {
        Some(cpu) => out.push_str(&format!(
            "Proxies pinned to CPU {cpu}; load generator, engine and Redis on the other CPU(s).\n\n"
        )),
        None => out.push_str(
            "Load generator, engine, Redis and the proxy share all CPUs (nothing pinned).\n\n",
        ),
    }
    out.push_str(&format!(
        "Workload: one agent call — a {} B chat request (system prompt, 3 tools, the user's ask, \
         a tool call and its result) answered by the zero-delay mock engine with a {} B text \
         (one token per word, with token ids and logprobs when the sidecar asks for them) — each \
         call its own trajectory (a session id of its own, `x-clawback-done`). Maximum: closed \
         loop, {} calls in flight, {} s. Rates: open loop, {} s each, latency from each \
         request's due time. CPU: user + system time of the proxy's whole process tree from \
         `/proc` (for a recorder, until it stored the phase's calls), per 1,000 calls; Redis's \
         apart. RSS: the tree's peak.\n\n",
        workload::agent_request(false).len(),
        workload::ANSWER_BYTES,
        args.concurrency,
        args.seconds,
        args.seconds,
    ));
    let direct = measured.first();
    let direct_max = direct.map_or(1.0, |d| d.max.throughput());
    let direct_rate = |rate| direct.and_then(|d| d.rate(rate));
    let streams_at = STREAMS_AIM_AT;
    let direct_streams = direct.and_then(|d| d.streams(streams_at));

    out.push_str(&format!(
        "| target | max req/s | % of direct | stored at max | CPU ms / 1,000 calls at max / at {CPU_RATE} req/s | Redis CPU ms / 1,000 (max / {CPU_RATE}) | added p50 / p99 at {SUMMARY_RATE} req/s (ms) | peak RSS (MiB), at {RSS_RATE} req/s | streams/s at {streams_at}, % of direct |\n\
         |---|---:|---:|---|---:|---:|---:|---:|---:|\n"
    ));
    for m in measured {
        let stored = match &m.stored {
            Some(s) => format!(
                "{:.0} of {} ({:.1} %) within {:.1} s after; dropped {:.0}",
                s.stored,
                s.served,
                100.0 * s.stored / s.served.max(1) as f64,
                s.drain.as_secs_f64(),
                s.dropped
            ),
            None => "—".to_owned(),
        };
        // CPU per 1,000 calls at the maximum / at CPU_RATE.
        let at_max_and_rate = |pick: fn(&Cpu) -> f64| {
            format!(
                "{:.0} / {}",
                pick(&m.max_cpu),
                m.rate(CPU_RATE)
                    .map_or("—".to_owned(), |r| format!("{:.0}", pick(&r.cpu)))
            )
        };
        let cpu = if m.has_process {
            at_max_and_rate(|c| c.proxy)
        } else {
            "—".to_owned()
        };
        let redis_cpu = if m.records && m.max_cpu.redis > 0.0 {
            at_max_and_rate(|c| c.redis)
        } else {
            "—".to_owned()
        };
        let added = match (m.rate(SUMMARY_RATE), direct_rate(SUMMARY_RATE)) {
            (Some(r), Some(d)) if m.has_process => format!(
                "{} / {}",
                added_ms(r.result.percentile_ms(0.5) - d.result.percentile_ms(0.5)),
                added_ms(r.result.percentile_ms(0.99) - d.result.percentile_ms(0.99))
            ),
            _ => "—".to_owned(),
        };
        let rss = if m.has_process {
            format!(
                "{:.1}, {}",
                m.peak_rss_mib,
                m.rate(RSS_RATE)
                    .map_or("—".to_owned(), |r| format!("{:.1}", r.rss_mib))
            )
        } else {
            "—".to_owned()
        };
        let streamed = match (m.streams(streams_at), direct_streams) {
            (Some(s), Some(d)) => format!(
                "{:.0}, {:.0} %",
                s.throughput(),
                100.0 * s.throughput() / d.throughput().max(f64::MIN_POSITIVE)
            ),
            _ => "—".to_owned(),
        };
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} % | {stored} | {cpu} | {redis_cpu} | {added} | {rss} | {streamed} |\n",
            m.name,
            m.max_throughput(),
            100.0 * m.max_throughput() / direct_max,
        ));
    }
    out.push_str(
        "\nFor a recorder, *max req/s* is the rate at which it stored everything it served: the \
         calls stored over the phase and the time it took to store them.\n",
    );

    out.push_str("\n#### Latency at fixed rates (ms, from each request's due time)\n\n");
    out.push_str("| target | rate | p50 | p90 | p99 | added p50 / p90 / p99 | CPU ms / 1,000 | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in measured {
        for (rate, r) in &m.rates {
            let Some(r) = r else {
                out.push_str(&format!(
                    "| {} | {rate} | over its maximum: not run | | | | | |\n",
                    m.name
                ));
                continue;
            };
            let p = |q| r.result.percentile_ms(q);
            let added = match direct_rate(r.rate) {
                Some(d) if m.has_process => {
                    let dp = |q| d.result.percentile_ms(q);
                    format!(
                        "{} / {} / {}",
                        added_ms(p(0.5) - dp(0.5)),
                        added_ms(p(0.9) - dp(0.9)),
                        added_ms(p(0.99) - dp(0.99))
                    )
                }
                _ => "—".to_owned(),
            };
            let cpu = if m.has_process {
                format!("{:.0}", r.cpu.proxy)
            } else {
                "—".to_owned()
            };
            out.push_str(&format!(
                "| {} | {rate} | {} | {} | {} | {added} | {cpu} | {} |\n",
                m.name,
                ms(p(0.5)),
                ms(p(0.9)),
                ms(p(0.99)),
                r.result.errors
            ));
        }
    }

    out.push_str(&format!(
        "\n#### Streams (ms): concurrent streamed calls, closed loop, {} s each; the gap is \
         between body chunks as the client reads them\n\n",
        args.stream_seconds
    ));
    out.push_str("| target | streams | first byte p50 / p99 | gap p50 / p99 | total p50 / p99 | streams/s | errors |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for m in measured {
        for (concurrency, s) in &m.streams {
            let q = |h: &hdrhistogram::Histogram<u64>, q| ms(us_to_ms(h.value_at_quantile(q)));
            out.push_str(&format!(
                "| {} | {concurrency} | {} / {} | {} / {} | {} / {} | {:.0} | {} |\n",
                m.name,
                q(&s.first_byte, 0.5),
                q(&s.first_byte, 0.99),
                q(&s.gap, 0.5),
                q(&s.gap, 0.99),
                q(&s.total, 0.5),
                q(&s.total, 0.99),
                s.throughput(),
                s.errors
            ));
        }
    }
    out.push_str(&paced_section(args, measured));
    out.push_str(&aims(measured));
    out
}

/// The paced phase: many streams at an engine's decoding pace; CPU per event and the delay
/// the hop adds to each.
fn paced_section(args: &Args, measured: &[Measured]) -> String {
    let Some(direct) = measured.first().and_then(|m| m.paced.as_ref()) else {
        return String::new();
    };
    let mut out = format!(
        "\n#### Paced streams: {} at once, the engine's events {} ms apart (the same {} B \
         answer, one event per token), {} s\n\n\
         Each event carries when the engine sent it; its *delay* is until the client read it. \
         CPU is the proxy's per 1,000 events (for a recorder, until it stored the phase's \
         calls). LiteLLM is not run: it does not pass the request's headers on, so its engine \
         would not pace.\n\n\
         | target | streams done | events/s | CPU ms / 1,000 events | Redis CPU ms / 1,000 events | delay p50 / p99 / p99.9 (ms) | added p50 / p99 / p99.9 (ms) | errors |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        args.paced_streams,
        args.paced_gap_ms,
        workload::ANSWER_BYTES,
        args.paced_seconds
    );
    let delay = |p: &PacedResult, q| us_to_ms(p.delay.value_at_quantile(q));
    for m in measured {
        let Some((p, cpu)) = &m.paced else { continue };
        let (proxy_cpu, redis_cpu, added) = if m.has_process {
            (
                format!("{:.1}", cpu.proxy),
                if m.records && cpu.redis > 0.0 {
                    format!("{:.1}", cpu.redis)
                } else {
                    "—".to_owned()
                },
                [0.5, 0.99, 0.999]
                    .map(|q| added_ms(delay(p, q) - delay(&direct.0, q)))
                    .join(" / "),
            )
        } else {
            ("—".to_owned(), "—".to_owned(), "—".to_owned())
        };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {proxy_cpu} | {redis_cpu} | {} / {} / {} | {added} | {} |\n",
            m.name,
            p.completed,
            p.events as f64 / p.elapsed.as_secs_f64(),
            ms(delay(p, 0.5)),
            ms(delay(p, 0.99)),
            ms(delay(p, 0.999)),
            p.errors
        ));
    }
    out
}

/// The aims, against NGINX and direct in the same run.
fn aims(measured: &[Measured]) -> String {
    let find = |prefix: &str| measured.iter().find(|m| m.name.starts_with(prefix));
    let (Some(direct), Some(nginx), Some(off)) = (
        find("direct"),
        find("NGINX"),
        find("clawback, recording off"),
    ) else {
        return String::new();
    };
    let redis = find("clawback, recording into Redis");
    let mut out = String::from("\n#### Against the aims\n\n");
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let times = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}×", ratio(a, b)),
        _ => "—".to_owned(),
    };
    let streams_at = STREAMS_AIM_AT;
    let streamed = |m: &Measured| m.streams(streams_at).map(StreamResult::throughput);
    for (m, aim) in [(Some(off), 90), (redis, 60)] {
        let Some(m) = m else { continue };
        if let (Some(a), Some(b)) = (streamed(m), streamed(nginx)) {
            out.push_str(&format!(
                "- Streams/s at {streams_at}, {}: {:.0} % of NGINX's (aim ≥ {aim} %).\n",
                m.name,
                100.0 * ratio(a, b)
            ));
        }
    }
    let at = |m: &Measured, with_redis: bool| {
        m.rate(CPU_RATE)
            .map(|r| r.cpu.proxy + if with_redis { r.cpu.redis } else { 0.0 })
    };
    out.push_str(&format!(
        "- CPU per call, recording off, vs NGINX: {:.2}× at the maximum, {} at {CPU_RATE} req/s (aim ≤ 1.5×).\n",
        ratio(off.max_cpu.proxy, nginx.max_cpu.proxy),
        times(at(off, false), at(nginx, false)),
    ));
    if let Some(redis) = redis {
        out.push_str(&format!(
            "- CPU per call, recording into Redis, Redis's own included, vs NGINX: {:.2}× at the maximum, {} at {CPU_RATE} req/s (aim ≤ 5×).\n",
            ratio(redis.max_cpu.proxy + redis.max_cpu.redis, nginx.max_cpu.proxy),
            times(at(redis, true), at(nginx, false)),
        ));
    }
    for m in measured.iter().filter(|m| m.records) {
        out.push_str(&format!(
            "- Peak RSS, {}: {:.1} MiB (aim ≤ 64 MiB).\n",
            m.name, m.peak_rss_mib
        ));
        if let Some(stored) = &m.stored {
            out.push_str(&format!(
                "- Served calls stored at the maximum, {}: {:.0} of {} (aim: all).\n",
                m.name, stored.stored, stored.served
            ));
        }
    }
    if let (Some((n, n_cpu)), Some((d, _))) = (&nginx.paced, &direct.paced) {
        let p99 = |p: &PacedResult| us_to_ms(p.delay.value_at_quantile(0.99));
        for m in [Some(off), redis].into_iter().flatten() {
            if let Some((p, cpu)) = &m.paced {
                out.push_str(&format!(
                    "- Paced streams, {}: CPU per event {:.2}× NGINX's; added p99 delay {} ms (NGINX {} ms).\n",
                    m.name,
                    ratio(cpu.proxy + cpu.redis, n_cpu.proxy),
                    added_ms(p99(p) - p99(d)),
                    added_ms(p99(n) - p99(d)),
                ));
            }
        }
    }
    let added_p99 = |m: &Measured| {
        Some(
            m.rate(SUMMARY_RATE)?.result.percentile_ms(0.99)
                - direct.rate(SUMMARY_RATE)?.result.percentile_ms(0.99),
        )
    };
    for m in [Some(off), redis].into_iter().flatten() {
        if let Some(added) = added_p99(m) {
            out.push_str(&format!(
                "- Added p99 at {SUMMARY_RATE} req/s, {}: {} ms (an earlier aim: ≤ 0.3 ms).\n",
                m.name,
                added_ms(added)
            ));
        }
    }
    let first_byte = |m: &Measured, c| {
        m.streams(c)
            .map(|s| us_to_ms(s.first_byte.value_at_quantile(0.5)))
    };
    for m in [Some(off), redis].into_iter().flatten() {
        if let (Some(a), Some(d)) = (first_byte(m, 1), first_byte(direct, 1)) {
            out.push_str(&format!(
                "- Added time to first byte, one stream at a time, p50, {}: {} ms (an earlier aim: ≤ 0.2 ms).\n",
                m.name,
                added_ms(a - d)
            ));
        }
    }
    out
}
