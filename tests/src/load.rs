//! The load generator behind `clawback-bench`.
//!
//! Open-loop phases send at a fixed rate regardless of how fast answers come back, and measure
//! each latency from the moment the request was *due*, not when it was actually sent — so a
//! stalled target shows up as latency instead of quietly lowering the rate (no coordinated
//! omission). Closed-loop phases keep a fixed number of requests in flight to find the maximum
//! throughput. Every phase is bounded in time and count.
//!
//! A unit of load is one call, or the turns of one conversation: each turn is sent once the
//! previous one answered, all under a session id of their own, so that the sidecar records them
//! as one trajectory and each turn gives the step before it its next state (what filter plugins
//! evaluate).

use std::sync::atomic::{AtomicU64, Ordering};
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

/// What one unit of load looks like: the calls it makes, in order.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    /// One call, or the turns of a conversation.
    pub turns: Vec<Turn>,
    /// Send every turn of a unit with a fresh session id in this header (e.g.
    /// `x-clawback-session`), so a conversation's turns form one trajectory.
    pub session_header: Option<&'static str>,
    /// Measure to the first body chunk instead of the whole response.
    pub first_byte: bool,
}

/// One call of a unit.
#[derive(Clone)]
pub struct Turn {
    pub body: Bytes,
    /// Extra request headers (e.g. `x-clawback-done` on the call that ends a trajectory).
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Target {
    /// A target whose unit is a single call.
    pub fn call(url: String, body: Bytes, headers: Vec<(&'static str, &'static str)>) -> Self {
        Self {
            url,
            turns: vec![Turn { body, headers }],
            session_header: None,
            first_byte: false,
        }
    }
}

/// Session ids unique across the phases of a run (and across runs, by the process id).
fn next_session() -> String {
    static SESSIONS: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{}-{}",
        std::process::id(),
        SESSIONS.fetch_add(1, Ordering::Relaxed)
    )
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
    errors: AtomicU64,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            latency: Mutex::new(histogram()),
            errors: AtomicU64::new(0),
        })
    }

    fn record(&self, outcome: Result<Duration, ()>) {
        match outcome {
            Ok(latency) => {
                let mut histogram = self.latency.lock().unwrap_or_else(|p| p.into_inner());
                let _ = histogram.record(micros(latency));
            }
            Err(()) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
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
            errors: self.errors.load(Ordering::Relaxed),
            elapsed,
        }
    }
}

/// The HTTP request of one turn, with its headers and the unit's session id.
fn request(
    target: &Target,
    turn: &Turn,
    session: Option<&str>,
) -> Result<Request<Full<Bytes>>, ()> {
    let mut request = Request::post(target.url.as_str()).header("content-type", "application/json");
    for (name, value) in &turn.headers {
        request = request.header(*name, *value);
    }
    if let (Some(name), Some(session)) = (target.session_header, session) {
        request = request.header(name, session);
    }
    request.body(Full::new(turn.body.clone())).map_err(|_| ())
}

/// One request; the latency counts from `due`.
async fn call(
    client: &HttpClient,
    target: &Target,
    turn: &Turn,
    session: Option<&str>,
    due: Instant,
) -> Result<Duration, ()> {
    let request = request(target, turn, session)?;
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

/// One unit: its turns in order, the first measured from `due`, each later one from when it
/// was sent. A failed turn ends the unit; the turns it did not send count as errors.
async fn unit(client: &HttpClient, target: &Target, recorder: &Recorder, due: Instant) {
    let session = target.session_header.map(|_| next_session());
    let mut due = due;
    for (i, turn) in target.turns.iter().enumerate() {
        let outcome = call(client, target, turn, session.as_deref(), due).await;
        let failed = outcome.is_err();
        recorder.record(outcome);
        if failed {
            let unsent = (target.turns.len() - i - 1) as u64;
            recorder.errors.fetch_add(unsent, Ordering::Relaxed);
            return;
        }
        due = Instant::now();
    }
}

/// Sends `rate` requests per second for `duration`, each unit on its own task (a unit of `n`
/// turns starts every `n / rate` seconds).
pub async fn open_loop(
    client: &HttpClient,
    target: &Target,
    rate: u32,
    duration: Duration,
) -> PhaseResult {
    let recorder = Recorder::new();
    let target = Arc::new(target.clone());
    let turns = target.turns.len().max(1) as u64;
    let units = (u64::from(rate) * duration.as_secs().max(1) / turns).max(1);
    let period = Duration::from_secs_f64(turns as f64 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..units {
        let due = start + period.mul_f64(i as f64);
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        let (client, target, recorder) =
            (client.clone(), Arc::clone(&target), Arc::clone(&recorder));
        tasks.spawn(async move { unit(&client, &target, &recorder, due).await });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    recorder.finish(units * turns, start.elapsed())
}

/// Keeps `concurrency` units in flight for `duration`.
pub async fn closed_loop(
    client: &HttpClient,
    target: &Target,
    concurrency: usize,
    duration: Duration,
) -> PhaseResult {
    let recorder = Recorder::new();
    let target = Arc::new(target.clone());
    let turns = target.turns.len() as u64;
    let start = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, target, recorder, sent) = (
            client.clone(),
            Arc::clone(&target),
            Arc::clone(&recorder),
            Arc::clone(&sent),
        );
        workers.spawn(async move {
            while start.elapsed() < duration {
                sent.fetch_add(turns, Ordering::Relaxed);
                unit(&client, &target, &recorder, Instant::now()).await;
            }
        });
    }
    while workers.join_next().await.is_some() {}
    recorder.finish(sent.load(Ordering::Relaxed), start.elapsed())
}

/// What a phase of streamed calls measured, each in microseconds: time to the first body
/// chunk, the gaps between chunks, and the whole call.
#[derive(Debug)]
pub struct StreamResult {
    pub first_byte: Histogram<u64>,
    pub gap: Histogram<u64>,
    pub total: Histogram<u64>,
    pub completed: u64,
    pub errors: u64,
    pub elapsed: Duration,
}

impl StreamResult {
    pub fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64()
    }
}

/// What a phase of paced streams measured: each event's delay from when the engine sent it
/// to when the client read it, in microseconds, and how many events arrived.
#[derive(Debug)]
pub struct PacedResult {
    pub delay: Histogram<u64>,
    pub events: u64,
    pub completed: u64,
    pub errors: u64,
    pub elapsed: Duration,
}

/// Longest one paced stream may take (hundreds of events tens of ms apart).
const PACED_TIMEOUT: Duration = Duration::from_secs(60);

/// Keeps `concurrency` streamed calls in flight for `duration`, each asking the mock engine
/// for a paced answer ([`crate::mock::PACED_HEADER`]), and measures each event's delay from
/// the engine's stamp ([`crate::mock::SENT_AT_FIELD`]) to the client.
pub async fn paced_streams(
    client: &HttpClient,
    target: &Target,
    concurrency: usize,
    duration: Duration,
) -> PacedResult {
    let mut target = target.clone();
    for turn in &mut target.turns {
        turn.headers.push((crate::mock::PACED_HEADER, "true"));
    }
    let phase: Phase<Delays> = stream_phase(client, target, concurrency, duration).await;
    PacedResult {
        delay: phase.tally.delay,
        events: phase.tally.events,
        completed: phase.completed,
        errors: phase.errors,
        elapsed: phase.elapsed,
    }
}

/// What a worker of the paced phase measured: each event's delay, and how many events.
struct Delays {
    delay: Histogram<u64>,
    events: u64,
}

impl Default for Delays {
    fn default() -> Self {
        Delays {
            delay: histogram(),
            events: 0,
        }
    }
}

impl Tally for Delays {
    async fn call(
        &mut self,
        client: &HttpClient,
        target: &Target,
        session: Option<&str>,
    ) -> Result<(), ()> {
        let call = paced_call(client, target, session, &mut self.delay);
        self.events += tokio::time::timeout(PACED_TIMEOUT, call)
            .await
            .map_err(|_| ())??;
        Ok(())
    }

    fn merge(&mut self, other: Self) {
        let _ = self.delay.add(&other.delay);
        self.events += other.events;
    }
}

/// One paced call: records each stamped event's delay, returns how many there were.
async fn paced_call(
    client: &HttpClient,
    target: &Target,
    session: Option<&str>,
    delay: &mut Histogram<u64>,
) -> Result<u64, ()> {
    let turn = target.turns.first().ok_or(())?;
    let response = client
        .request(request(target, turn, session)?)
        .await
        .map_err(|_| ())?;
    if response.status() != StatusCode::OK {
        return Err(());
    }
    let mut body = response.into_body();
    let mut events = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| ())?.into_data() else {
            continue;
        };
        let now = crate::mock::unix_micros();
        for sent in stamps(&data) {
            events += 1;
            let _ = delay.record(now.saturating_sub(sent).max(1));
        }
    }
    Ok(events)
}

/// The engine's send stamps in a chunk of the stream.
fn stamps(data: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let field = crate::mock::SENT_AT_FIELD.as_bytes();
    let mut rest = data;
    std::iter::from_fn(move || {
        let at = rest.windows(field.len()).position(|w| w == field)?;
        rest = &rest[at + field.len()..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
    })
}

/// A latency histogram in microseconds, 1 µs to 60 s.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// A latency in whole microseconds, at least 1 (the histogram's lower bound).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// One streamed call, timed: first chunk, gaps between chunks, whole call.
async fn stream_call(
    client: &HttpClient,
    target: &Target,
    session: Option<&str>,
) -> Result<(Duration, Vec<Duration>, Duration), ()> {
    let turn = target.turns.first().ok_or(())?;
    let request = request(target, turn, session)?;
    let work = async {
        let start = Instant::now();
        let response = client.request(request).await.map_err(|_| ())?;
        if response.status() != StatusCode::OK {
            return Err(());
        }
        let mut body = response.into_body();
        let (mut first, mut last, mut gaps) = (None, None::<Instant>, Vec::new());
        while let Some(frame) = body.frame().await {
            frame.map_err(|_| ())?;
            let now = Instant::now();
            match last {
                Some(previous) => gaps.push(now - previous),
                None => first = Some(now - start),
            }
            last = Some(now);
        }
        let first = first.ok_or(())?;
        Ok((first, gaps, start.elapsed()))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .map_err(|_| ())?
}

/// Keeps `concurrency` streamed calls (the target's first turn, with `"stream": true` in its
/// body) in flight for `duration`.
pub async fn streams(
    client: &HttpClient,
    target: &Target,
    concurrency: usize,
    duration: Duration,
) -> StreamResult {
    let phase: Phase<Timings> = stream_phase(client, target.clone(), concurrency, duration).await;
    StreamResult {
        first_byte: phase.tally.first_byte,
        gap: phase.tally.gap,
        total: phase.tally.total,
        completed: phase.completed,
        errors: phase.errors,
        elapsed: phase.elapsed,
    }
}

/// What a worker of the streaming sweep measured: first chunks, gaps, whole calls.
struct Timings {
    first_byte: Histogram<u64>,
    gap: Histogram<u64>,
    total: Histogram<u64>,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            first_byte: histogram(),
            gap: histogram(),
            total: histogram(),
        }
    }
}

impl Tally for Timings {
    async fn call(
        &mut self,
        client: &HttpClient,
        target: &Target,
        session: Option<&str>,
    ) -> Result<(), ()> {
        let (first, gaps, whole) = stream_call(client, target, session).await?;
        let _ = self.first_byte.record(micros(first));
        for gap in gaps {
            let _ = self.gap.record(micros(gap));
        }
        let _ = self.total.record(micros(whole));
        Ok(())
    }

    fn merge(&mut self, other: Self) {
        let _ = self.first_byte.add(&other.first_byte);
        let _ = self.gap.add(&other.gap);
        let _ = self.total.add(&other.total);
    }
}

/// What each worker of a stream phase measures, call after call, into a tally of its own; the
/// workers' tallies are merged when the phase ends.
trait Tally: Default + Send + 'static {
    /// One streamed call (the target's first turn), measured; `Err` when it failed.
    fn call(
        &mut self,
        client: &HttpClient,
        target: &Target,
        session: Option<&str>,
    ) -> impl std::future::Future<Output = Result<(), ()>> + Send;

    fn merge(&mut self, other: Self);
}

/// A stream phase's merged tally, its calls that completed and failed, and how long it ran.
struct Phase<T> {
    tally: T,
    completed: u64,
    errors: u64,
    elapsed: Duration,
}

/// Keeps `concurrency` streamed calls of `target` in flight for `duration`, each worker
/// measuring into its own `T`.
async fn stream_phase<T: Tally>(
    client: &HttpClient,
    target: Target,
    concurrency: usize,
    duration: Duration,
) -> Phase<T> {
    let target = Arc::new(target);
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, target) = (client.clone(), Arc::clone(&target));
        workers.spawn(async move {
            let (mut tally, mut completed, mut errors) = (T::default(), 0, 0);
            while start.elapsed() < duration {
                let session = target.session_header.map(|_| next_session());
                match tally.call(&client, &target, session.as_deref()).await {
                    Ok(()) => completed += 1,
                    Err(()) => errors += 1,
                }
            }
            (tally, completed, errors)
        });
    }
    let mut phase = Phase {
        tally: T::default(),
        completed: 0,
        errors: 0,
        elapsed: Duration::ZERO,
    };
    while let Some(worker) = workers.join_next().await {
        if let Ok((tally, completed, errors)) = worker {
            phase.tally.merge(tally);
            phase.completed += completed;
            phase.errors += errors;
        }
    }
    phase.elapsed = start.elapsed();
    phase
}
