//! A mock inference engine on a loopback port: the one stand-in the tests use, because a GPU
//! engine cannot run here. It answers in vLLM's exact JSON and SSE shapes ([`crate::engine_json`]),
//! records what it received and what it sent, and can misbehave on demand: fail with a status,
//! die mid-stream, be slow to answer or slow between chunks.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;

use crate::engine_json::{self as shapes, Reply};

/// How the mock behaves for the next requests.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Answer every request with this status and vLLM's error body.
    pub fail_with: Option<u16>,
    /// Wait this long before sending the response head.
    pub head_delay: Duration,
    /// Wait this long before each body chunk after the first.
    pub chunk_delay: Duration,
    /// Break the connection after this many body chunks.
    pub die_after_chunks: Option<usize>,
    /// Stop after some body chunks until the test releases the rest.
    pub hold: Option<Hold>,
    /// Answers for chat calls whose `model` is `judge` (a filter plugin's judge), in turn.
    pub judge_answers: Vec<String>,
    /// LoRA adapters `/v1/models` lists beside the base model, as vLLM lists loaded adapters.
    pub loaded_adapters: Vec<String>,
    /// The text every chat answer says instead of the usual one.
    pub answer_text: Option<String>,
    /// Streamed answers to requests that carry [`PACED_HEADER`] send their events this far
    /// apart, as an engine decoding one token at a time, each stamped with when it was sent
    /// ([`SENT_AT_FIELD`]): what the bench's paced phase measures a hop's added delay by.
    pub paced: Option<Duration>,
    /// Labels every answer with this `Content-Encoding` (its body unchanged), as a hop that
    /// compresses whatever the client asked for would.
    pub content_encoding: Option<&'static str>,
}

/// The request header that asks for [`Behaviour::paced`] answers.
pub const PACED_HEADER: &str = "x-mock-paced";

/// The field a paced event's JSON opens with: when the mock sent it, in microseconds since the
/// Unix epoch (one clock for every process on the machine).
pub const SENT_AT_FIELD: &str = "\"sent_us\":";

/// Holds every response body after `after_chunks` chunks until [`Hold::release`]: lets a test
/// see what reached the client while the engine has provably not sent the rest yet.
#[derive(Debug, Clone)]
pub struct Hold {
    after_chunks: usize,
    gate: Arc<Semaphore>,
}

impl Hold {
    pub fn after_chunks(after_chunks: usize) -> Self {
        Self {
            after_chunks,
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    /// Lets every held body (and every later one) go on.
    pub fn release(&self) {
        // A closed semaphore fails every acquire at once: the waiting bodies wake and go on.
        self.gate.close();
    }
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    /// Path and query as they arrived.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct State {
    /// Off for load tests, where keeping every request would grow without bound.
    not_recording: std::sync::atomic::AtomicBool,
    behaviour: Mutex<Behaviour>,
    received: Mutex<Vec<Received>>,
    /// The full bodies the mock sent, in request order.
    sent: Mutex<Vec<Bytes>>,
    next_id: AtomicUsize,
    /// Responses whose body was read to the end by the peer.
    completed: AtomicUsize,
    /// Judge calls answered so far.
    judged: AtomicUsize,
}

pub struct MockUpstream {
    addr: SocketAddr,
    state: Arc<State>,
    stop: watch::Sender<bool>,
}

impl MockUpstream {
    pub async fn start() -> Self {
        Self::start_on(
            "127.0.0.1:0"
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .await
    }

    /// Binds `addr` (port 0 for any). Panics if it cannot: this is test support.
    pub async fn start_on(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("mock upstream binds");
        let addr = listener.local_addr().expect("mock upstream has an address");
        let state = Arc::new(State::default());
        let (stop, mut stopped) = watch::channel(false);
        let serving = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                    _ = stopped.changed() => return,
                };
                let _ = stream.set_nodelay(true);
                let state = Arc::clone(&serving);
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(Arc::clone(&state), request));
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {},
                        _ = stopped.changed() => {},
                    }
                });
            }
        });
        Self { addr, state, stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *lock(&self.state.behaviour) = behaviour;
    }

    /// Stops keeping received requests and sent bodies (for load tests).
    pub fn stop_recording(&self) {
        self.state.not_recording.store(true, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.state.received).clone()
    }

    pub fn sent(&self) -> Vec<Bytes> {
        lock(&self.state.sent).clone()
    }

    /// Judge calls answered from [`Behaviour::judge_answers`].
    pub fn judge_calls(&self) -> usize {
        self.state.judged.load(Ordering::SeqCst)
    }

    pub fn request_count(&self) -> usize {
        lock(&self.state.received).len()
    }

    /// Responses whose whole body was taken by the peer (the sidecar).
    pub fn completed(&self) -> usize {
        self.state.completed.load(Ordering::SeqCst)
    }

    /// Stops accepting and drops every open connection, like a killed engine.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let recording = !state.not_recording.load(Ordering::Relaxed);
    if recording {
        lock(&state.received).push(Received {
            method: parts.method.clone(),
            path,
            headers: parts.headers.clone(),
            body: body.clone(),
        });
    }
    let behaviour = lock(&state.behaviour).clone();
    if !behaviour.head_delay.is_zero() {
        tokio::time::sleep(behaviour.head_delay).await;
    }
    let n = state.next_id.fetch_add(1, Ordering::SeqCst);
    let (status, content_type, chunks) = match judge_answer(&state, &body, &behaviour) {
        Some(text) => {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let id = format!("chatcmpl-judge-{n:032x}");
            let value = shapes::chat_completion(&id, &request, &Reply::Text(text));
            (
                StatusCode::OK,
                "application/json",
                vec![Bytes::from(value.to_string())],
            )
        }
        None => answer(&parts.method, parts.uri.path(), &body, n, &behaviour),
    };
    if recording {
        lock(&state.sent).push(chunks.iter().flat_map(|c| c.iter().copied()).collect());
    }
    let streaming = content_type == "text/event-stream";
    let paced = behaviour
        .paced
        .filter(|_| streaming && parts.headers.contains_key(PACED_HEADER));
    let mut response = Response::new(MockBody {
        chunks: chunks.into(),
        delay: paced.unwrap_or(behaviour.chunk_delay),
        stamp: paced.is_some(),
        sleep: None,
        sent: 0,
        die_after: behaviour.die_after_chunks,
        hold: behaviour.hold,
        held: None,
        completed: Some(state),
    });
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        content_type.parse().expect("static"),
    );
    if let Some(encoding) = behaviour.content_encoding {
        headers.insert(
            http::header::CONTENT_ENCODING,
            http::HeaderValue::from_static(encoding),
        );
    }
    if streaming {
        headers.insert(
            http::header::CACHE_CONTROL,
            "no-cache".parse().expect("static"),
        );
    }
    Ok(response)
}

/// The scripted answer to a judge call (`"model": "judge"`), when answers are scripted.
fn judge_answer(state: &State, body: &[u8], behaviour: &Behaviour) -> Option<String> {
    if behaviour.judge_answers.is_empty() {
        return None;
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    if request["model"] != "judge" {
        return None;
    }
    let n = state.judged.fetch_add(1, Ordering::SeqCst);
    Some(behaviour.judge_answers[n % behaviour.judge_answers.len()].clone())
}

/// Status, content type and body chunks for one request.
fn answer(
    method: &Method,
    path: &str,
    body: &[u8],
    n: usize,
    behaviour: &Behaviour,
) -> (StatusCode, &'static str, Vec<Bytes>) {
    let json_body = |value: Value| vec![Bytes::from(value.to_string())];
    if let Some(code) = behaviour.fail_with {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = format!("mock engine configured to fail with {code}");
        return (
            status,
            "application/json",
            json_body(shapes::error(code, &message)),
        );
    }
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let stream = request["stream"] == true;
    let generates = matches!(path, "/v1/chat/completions" | "/v1/completions");
    let refusal = generates
        .then(|| shapes::validation_error(&request).or_else(|| shapes::max_tokens_error(&request)))
        .flatten();
    if let Some(refusal) = refusal {
        return (
            StatusCode::BAD_REQUEST,
            "application/json",
            json_body(refusal),
        );
    }
    match (method, path) {
        (&Method::GET, "/v1/models") => (
            StatusCode::OK,
            "application/json",
            json_body(shapes::models_with(&behaviour.loaded_adapters)),
        ),
        (&Method::POST, "/v1/chat/completions") if request.is_object() => {
            let id = format!("chatcmpl-{n:032x}");
            let reply = match &behaviour.answer_text {
                Some(text) => Reply::Text(text.clone()),
                None => Reply::for_request(&request),
            };
            if stream {
                let events = shapes::chat_completion_chunks(&id, &request, &reply);
                (StatusCode::OK, "text/event-stream", sse_data(events))
            } else {
                let value = shapes::chat_completion(&id, &request, &reply);
                (StatusCode::OK, "application/json", json_body(value))
            }
        }
        (&Method::POST, "/v1/completions") if request.is_object() => {
            let id = format!("cmpl-{n:032x}");
            if stream {
                (
                    StatusCode::OK,
                    "text/event-stream",
                    sse_data(shapes::completion_chunks(&id, &request)),
                )
            } else {
                (
                    StatusCode::OK,
                    "application/json",
                    json_body(shapes::completion(&id, &request)),
                )
            }
        }
        (&Method::POST, "/v1/responses") if request.is_object() => {
            let id = format!("resp_{n:032x}");
            let reply = Reply::for_request(&request);
            if stream {
                let events = shapes::response_events(&id, &request, &reply)
                    .into_iter()
                    .map(|(name, data)| Bytes::from(format!("event: {name}\ndata: {data}\n\n")))
                    .collect();
                (StatusCode::OK, "text/event-stream", events)
            } else {
                let value = shapes::response(&id, &request, &reply, true);
                (StatusCode::OK, "application/json", json_body(value))
            }
        }
        (_, p)
            if p.starts_with("/v1/")
                && !matches!(
                    p,
                    "/v1/chat/completions" | "/v1/completions" | "/v1/responses"
                ) =>
        {
            // Anything else under /v1 is echoed so tests can see it passed through unchanged.
            let echo = serde_json::json!({"object": "echo", "method": method.as_str(), "path": p,
                                          "body_bytes": body.len()});
            (StatusCode::OK, "application/json", json_body(echo))
        }
        _ => (
            StatusCode::BAD_REQUEST,
            "application/json",
            json_body(shapes::error(400, "mock engine: malformed request")),
        ),
    }
}

fn sse_data(events: Vec<Value>) -> Vec<Bytes> {
    events
        .into_iter()
        .map(|event| Bytes::from(format!("data: {event}\n\n")))
        .chain(std::iter::once(Bytes::from_static(b"data: [DONE]\n\n")))
        .collect()
}

/// Sends its chunks one frame each, pausing between them, optionally breaking off.
struct MockBody {
    chunks: VecDeque<Bytes>,
    delay: Duration,
    /// Stamp each event with when it was sent ([`SENT_AT_FIELD`]).
    stamp: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    sent: usize,
    die_after: Option<usize>,
    hold: Option<Hold>,
    held: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    completed: Option<Arc<State>>,
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.die_after.is_some_and(|n| self.sent >= n) {
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "mock engine died mid-stream",
            ))));
        }
        if let Some(hold) = self.hold.as_ref().filter(|h| h.after_chunks == self.sent) {
            let gate = Arc::clone(&hold.gate);
            let held = self.held.get_or_insert_with(|| {
                Box::pin(async move {
                    // Never granted a permit: this resolves when the gate closes.
                    let _ = gate.acquire().await;
                })
            });
            if held.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.held = None;
            self.hold = None;
        }
        if self.sent > 0 && !self.delay.is_zero() && !self.chunks.is_empty() {
            let delay = self.delay;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        match self.chunks.pop_front() {
            Some(chunk) => {
                self.sent += 1;
                let chunk = if self.stamp { stamped(chunk) } else { chunk };
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            None => {
                if let Some(state) = self.completed.take() {
                    state.completed.fetch_add(1, Ordering::SeqCst);
                }
                Poll::Ready(None)
            }
        }
    }
}

/// `data: {...}` with [`SENT_AT_FIELD`] first in the object; other events as they are.
fn stamped(event: Bytes) -> Bytes {
    const OPEN: &[u8] = b"data: {";
    let Some(rest) = event.strip_prefix(OPEN) else {
        return event;
    };
    let sent_us = unix_micros();
    let mut out = Vec::with_capacity(event.len() + 32);
    out.extend_from_slice(OPEN);
    out.extend_from_slice(format!("{SENT_AT_FIELD}{sent_us},").as_bytes());
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// Now, in microseconds since the Unix epoch: the clock of [`SENT_AT_FIELD`].
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
