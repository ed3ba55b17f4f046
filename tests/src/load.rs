//! The load generator behind `clawback-bench`.
//!
//! Open-loop phases send at a fixed rate regardless of how fast answers come back, and measure
//! each latency from the moment the request was *due*, not when it was actually sent — so a
//! stalled target shows up as latency instead of quietly lowering the rate (no coordinated
//! omission). Closed-loop phases keep a fixed number of requests in flight to find the maximum
//! throughput. Every phase is bounded in time and count.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Longest any single request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(connector)
}

/// What one request to measure looks like.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    pub body: Bytes,
    /// Extra request headers (e.g. `x-clawback-done` so each call is a whole trajectory).
    pub headers: Vec<(&'static str, &'static str)>,
    /// Measure to the first body chunk instead of the whole response.
    pub first_byte: bool,
}

#[derive(Debug)]
pub struct PhaseResult {
    /// Latencies in microseconds.
    pub latency: Histogram<u64>,
    pub sent: u64,
    pub errors: u64,
    pub elapsed: Duration,
}

impl PhaseResult {
    pub fn throughput(&self) -> f64 {
        (self.sent - self.errors) as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile_ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }
}

struct Recorder {
    latency: Mutex<Histogram<u64>>,
    errors: std::sync::atomic::AtomicU64,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            latency: Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds"),
            ),
            errors: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn record(&self, outcome: Result<Duration, ()>) {
        match outcome {
            Ok(latency) => {
                let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                let mut histogram = self.latency.lock().unwrap_or_else(|p| p.into_inner());
                let _ = histogram.record(micros.max(1));
            }
            Err(()) => {
                self.errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    fn finish(&self, sent: u64, elapsed: Duration) -> PhaseResult {
        PhaseResult {
            latency: self
                .latency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            sent,
            errors: self.errors.load(std::sync::atomic::Ordering::Relaxed),
            elapsed,
        }
    }
}

/// One request; the latency counts from `due`.
async fn call(client: &HttpClient, target: &Target, due: Instant) -> Result<Duration, ()> {
    let mut request = Request::post(target.url.as_str()).header("content-type", "application/json");
    for (name, value) in &target.headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(target.body.clone()))
        .map_err(|_| ())?;
    let work = async {
        let response = client.request(request).await.map_err(|_| ())?;
        if response.status() != StatusCode::OK {
            return Err(());
        }
        let mut body = response.into_body();
        let mut first = None;
        while let Some(frame) = body.frame().await {
            frame.map_err(|_| ())?;
            if first.is_none() {
                first = Some(due.elapsed());
            }
        }
        let whole = due.elapsed();
        Ok(if target.first_byte {
            first.unwrap_or(whole)
        } else {
            whole
        })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .map_err(|_| ())?
}

/// Sends `rate` requests per second for `duration`, each on its own task.
pub async fn open_loop(
    client: &HttpClient,
    target: &Target,
    rate: u32,
    duration: Duration,
) -> PhaseResult {
    let recorder = Recorder::new();
    let total = u64::from(rate) * duration.as_secs().max(1);
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + period.mul_f64(i as f64);
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        let (client, target, recorder) = (client.clone(), target.clone(), Arc::clone(&recorder));
        tasks.spawn(async move {
            recorder.record(call(&client, &target, due).await);
        });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    recorder.finish(total, start.elapsed())
}

/// Keeps `concurrency` requests in flight for `duration`.
pub async fn closed_loop(
    client: &HttpClient,
    target: &Target,
    concurrency: usize,
    duration: Duration,
) -> PhaseResult {
    let recorder = Recorder::new();
    let start = Instant::now();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, target, recorder, sent) = (
            client.clone(),
            target.clone(),
            Arc::clone(&recorder),
            Arc::clone(&sent),
        );
        workers.spawn(async move {
            while start.elapsed() < duration {
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                recorder.record(call(&client, &target, Instant::now()).await);
            }
        });
    }
    while workers.join_next().await.is_some() {}
    recorder.finish(
        sent.load(std::sync::atomic::Ordering::Relaxed),
        start.elapsed(),
    )
}
