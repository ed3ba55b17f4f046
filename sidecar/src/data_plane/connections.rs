//! The HTTP/1 connections to the upstreams, each driven by the task that reads its answer.
//!
//! hyper's pooled client runs every connection in a task of its own, and its response body
//! hands the reader one chunk at a time: each event of a streamed answer woke the connection's
//! task, then the relay's, and the relay's read woke the connection's again. Here the forwarding
//! task drives its connection itself — [`UpstreamBody`] polls it before each read of the body —
//! so an event is read from the engine's socket, decoded and relayed in one task. hyper's parts
//! still wake their reader through channels when the same task writes to them; [`Inline`] turns
//! such a wake-up during the task's own poll into polling again at once.
//!
//! A connection whose answer was read to its end waits in a stack per upstream (the most
//! recently used is taken first; those idle past `idle_timeout` — [`IDLE_REUSE`], under the
//! engine's keep-alive — are closed, at most `max_idle_per_upstream` kept). An idle connection
//! is polled by no one, so it is checked when it is taken (the engine may have closed it: vLLM
//! closes idle connections after 5 s), and a request that never left on a reused connection is
//! sent again on a new one — what hyper's pooled client did (`retry_canceled_requests`). Every
//! [`SWEEP`] the idle connections are looked at once, so those the engine closed or that idled
//! too long are closed on our side too.

use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{header, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::ServiceExt;

type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

/// How often idle connections are checked for having closed or idled too long.
const SWEEP: Duration = Duration::from_secs(5);

/// How long a connection may idle and still be reused: under the engines' own keep-alive
/// (vLLM's and SGLang's uvicorn close a connection idle for 5 s). A request written into a
/// connection the engine is closing at that moment has left, so it is not sent again: the
/// engine resets it and the call fails with 502 (one retention probe of 40, a CI run of
/// 2026-12-07, with connections kept 90 s).
pub const IDLE_REUSE: Duration = Duration::from_secs(4);
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no answer head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The request never left the sidecar: another upstream may take it.
    #[error("could not connect: {0}")]
    Connect(#[source] BoxError),
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The forwarder built a request without an upstream in its URI (a bug, not the engine).
    #[error("{0} is not an absolute URI")]
    NotAbsolute(Uri),
}

/// Where a connection goes: an upstream's scheme and authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

/// An established connection: the half that sends requests, and the driver that does the I/O.
struct Link {
    key: Key,
    sender: http1::SendRequest<Full<Bytes>>,
    /// `None` once it has ended: the connection is closed, and what was queued on it or waits
    /// for its answer has been told so.
    driver: Option<http1::Connection<Io, Full<Bytes>>>,
}

impl Link {
    fn is_open(&self) -> bool {
        self.driver.is_some() && !self.sender.is_closed()
    }

    /// Reads and decodes what the upstream sent, writes what is to be sent; ready once the
    /// connection has closed.
    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(driver) = &mut self.driver else {
            return Poll::Ready(());
        };
        match Pin::new(driver).poll(cx) {
            Poll::Ready(result) => {
                // Dropped, it hands a request it never sent back, and fails one it did.
                self.driver = None;
                if let Err(e) = result {
                    tracing::debug!(upstream = %self.key.authority, error = %e,
                        "the connection to the upstream ended");
                }
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

struct Idle {
    link: Link,
    since: Instant,
}

impl Idle {
    /// Whether it may take a request: not idle too long, not closed by the upstream (polled
    /// once to see: a connection the engine closed ends here).
    fn usable(&mut self, now: Instant, idle_timeout: Duration) -> bool {
        now.duration_since(self.since) < idle_timeout
            && self.link.is_open()
            && self
                .link
                .poll_drive(&mut Context::from_waker(Waker::noop()))
                .is_pending()
    }
}

/// The sidecar's connections to its upstreams.
pub struct Connections {
    connector: HttpsConnector<HttpConnector>,
    idle: Mutex<HashMap<Key, VecDeque<Idle>>>,
    idle_timeout: Duration,
    max_idle_per_upstream: usize,
}

impl Connections {
    pub fn new(
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle_per_upstream: usize,
    ) -> Arc<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let connections = Arc::new(Self {
            connector,
            idle: Mutex::new(HashMap::new()),
            idle_timeout,
            max_idle_per_upstream,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let connections = Arc::downgrade(&connections);
            runtime.spawn(async move {
                let mut sweeps = tokio::time::interval(SWEEP);
                sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                sweeps.tick().await;
                loop {
                    sweeps.tick().await;
                    let Some(connections) = connections.upgrade() else {
                        return;
                    };
                    connections.sweep();
                }
            });
        }
        connections
    }

    /// Sends `request` (its URI absolute: the upstream's) on an idle connection to its upstream,
    /// or on a new one, and returns the answer's head. Its body drives the connection.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let key = match (request.uri().scheme(), request.uri().authority()) {
            (Some(scheme), Some(authority)) => Key {
                scheme: scheme.clone(),
                authority: authority.clone(),
            },
            _ => return Err(SendError::NotAbsolute(request.uri().clone())),
        };
        let uri = request.uri().clone();
        to_origin_form(&mut request, &key);
        loop {
            let (mut conn, reused) = match self.checkout(&key) {
                Some(conn) => (conn, true),
                None => (self.connect(key.clone(), &uri).await?, false),
            };
            match conn.exchange(request).await {
                Ok(response) => return Ok(response.map(|body| UpstreamBody::new(body, conn))),
                Err(Unsent::Again(again, e)) if reused => {
                    tracing::debug!(upstream = %key.authority, error = %e,
                        "an idle connection to the upstream had closed; sending on another");
                    request = *again;
                }
                Err(Unsent::Again(_, e) | Unsent::Failed(e)) => return Err(SendError::Http(e)),
            }
        }
    }

    async fn connect(self: &Arc<Self>, key: Key, uri: &Uri) -> Result<Conn, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(uri.clone())
            .await
            .map_err(SendError::Connect)?;
        let (sender, driver) = http1::Builder::new().handshake(io).await?;
        let link = Link {
            key,
            sender,
            driver: Some(driver),
        };
        Ok(Conn::new(link, Arc::clone(self)))
    }

    /// The most recently used idle connection to `key` that is still open.
    fn checkout(self: &Arc<Self>, key: &Key) -> Option<Conn> {
        loop {
            let mut idle = self.lock().get_mut(key)?.pop_back()?;
            if idle.usable(Instant::now(), self.idle_timeout) {
                return Some(Conn::new(idle.link, Arc::clone(self)));
            }
        }
    }

    /// Closes the idle connections that the upstream closed or that idled too long.
    fn sweep(&self) {
        let now = Instant::now();
        let mut idle = self.lock();
        for stack in idle.values_mut() {
            stack.retain_mut(|i| i.usable(now, self.idle_timeout));
        }
        idle.retain(|_, stack| !stack.is_empty());
    }

    fn checkin(&self, link: Link) {
        let now = Instant::now();
        let mut idle = self.lock();
        let stack = idle.entry(link.key.clone()).or_default();
        // Oldest first: those idle too long are at the front.
        let expired = stack.partition_point(|i| now.duration_since(i.since) >= self.idle_timeout);
        stack.drain(..expired);
        if stack.len() >= self.max_idle_per_upstream {
            stack.pop_front();
        }
        stack.push_back(Idle { link, since: now });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, VecDeque<Idle>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What hyper's pooled client did for an HTTP/1 upstream: a `Host` header from the URI (its
/// port only when not the scheme's default) and the request line in origin form.
fn to_origin_form(request: &mut Request<Full<Bytes>>, key: &Key) {
    if !request.headers().contains_key(header::HOST) {
        let default_port = if key.scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match key.authority.port_u16() {
            Some(port) if port != default_port => key.authority.as_str(),
            _ => key.authority.host(),
        };
        // An authority's characters are all valid in a header value.
        if let Ok(host) = HeaderValue::from_str(host) {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    let path = request
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *request.uri_mut() = Uri::from(path);
}

/// A request that got no answer on a connection: whether it left.
enum Unsent {
    /// It never left: it may be sent on another connection.
    Again(Box<Request<Full<Bytes>>>, hyper::Error),
    Failed(hyper::Error),
}

/// A connection in use, driven by the task that reads its answer.
struct Conn {
    link: Link,
    connections: Arc<Connections>,
    inline: Arc<Inline>,
    /// The waker the connection's parts get: `inline`'s.
    waker: Waker,
}

impl Conn {
    fn new(link: Link, connections: Arc<Connections>) -> Self {
        let inline = Arc::new(Inline::default());
        Self {
            link,
            connections,
            waker: Waker::from(Arc::clone(&inline)),
            inline,
        }
    }

    async fn exchange(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, Unsent> {
        let ready = poll_fn(|cx| {
            self.poll_inline(cx, |link, cx| {
                let _ = link.poll_drive(cx);
                link.sender.poll_ready(cx)
            })
        })
        .await;
        if let Err(e) = ready {
            return Err(Unsent::Again(Box::new(request), e));
        }
        // Handing the request over wakes the driver, which is polled next anyway.
        let sender = &mut self.link.sender;
        let sent = self.inline.within(|| sender.try_send_request(request));
        tokio::pin!(sent);
        poll_fn(|cx| {
            self.poll_inline(cx, |link, cx| {
                let _ = link.poll_drive(cx);
                sent.as_mut().poll(cx)
            })
        })
        .await
        .map_err(|mut e| match e.take_message() {
            Some(request) => Unsent::Again(Box::new(request), e.into_error()),
            None => Unsent::Failed(e.into_error()),
        })
    }

    /// Polls `f` with the connection's own waker (see [`Inline`]).
    fn poll_inline<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&mut Link, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let link = &mut self.link;
        self.inline.poll(cx, &self.waker, |cx| f(link, cx))
    }

    /// The answer was read to its end: the connection waits for the next request.
    fn release(self) {
        if self.link.is_open() {
            self.connections.checkin(self.link);
        }
    }
}

/// A task's waker for the parts of its connection (hyper's driver, the request's and the body's
/// channels), which wake their reader when the same task writes to them: a wake-up while the
/// task is polling them is noted and answered by polling again at once, instead of scheduling
/// the task anew (which, on tokio's multi-threaded runtime, also unparks an idle worker to steal
/// it). A wake-up at any other time wakes the task.
#[derive(Default)]
struct Inline {
    state: AtomicU8,
    task: AtomicWaker,
}

/// [`Inline`]'s states: the task is not polling the parts; it is; it is and was woken meanwhile.
const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

impl Inline {
    fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        waker: &Waker,
        mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.task.register(cx.waker());
        let mut inner = Context::from_waker(waker);
        loop {
            self.state.store(POLLING, Ordering::Release);
            let polled = f(&mut inner);
            // Ready: the caller polls again when it wants more, and only it drives the parts.
            if self.state.swap(IDLE, Ordering::AcqRel) != WOKEN || polled.is_ready() {
                return polled;
            }
        }
    }

    /// Runs `f`, which wakes the parts, as if polling them: they are polled next anyway.
    fn within<T>(&self, f: impl FnOnce() -> T) -> T {
        self.state.store(POLLING, Ordering::Release);
        let result = f();
        self.state.store(IDLE, Ordering::Release);
        result
    }
}

impl Wake for Inline {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let noted =
            self.state
                .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire);
        if noted == Err(IDLE) {
            self.task.wake();
        }
    }
}

/// An upstream's answer body, which drives its connection while it is read. Read to its end,
/// it gives the connection back for the next request; dropped before, it closes it.
pub struct UpstreamBody {
    body: Incoming,
    conn: Option<Conn>,
}

impl UpstreamBody {
    fn new(body: Incoming, conn: Conn) -> Self {
        Self {
            body,
            conn: Some(conn),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let body = &mut this.body;
        let polled = match &mut this.conn {
            Some(conn) => conn.poll_inline(cx, |link, cx| {
                // A closed connection has told the body how it ended.
                let _ = link.poll_drive(cx);
                Pin::new(&mut *body).poll_frame(cx)
            }),
            None => Pin::new(body).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(None) => {
                if let Some(conn) = this.conn.take() {
                    conn.release();
                }
            }
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// How the test server ends an answer.
    #[derive(Clone, Copy)]
    enum Then {
        KeepOpen,
        /// Closes the socket after the answer, saying nothing (as an engine whose idle
        /// timeout passed does).
        Close,
    }

    /// An HTTP/1.1 server that answers every request with a chunked body of three chunks,
    /// counts the connections it accepted and keeps the requests' heads.
    async fn server(then: Then) -> (Uri, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (counted, kept) = (Arc::clone(&accepted), Arc::clone(&heads));
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.expect("accept");
                counted.fetch_add(1, Ordering::SeqCst);
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    let mut read = Vec::new();
                    loop {
                        let Ok(n) = socket.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        read.extend_from_slice(&buf[..n]);
                        let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&read[..end]).into_owned();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |n| n.parse::<usize>().expect("a length"));
                        if read.len() < end + 4 + length {
                            continue;
                        }
                        kept.lock().expect("heads").push(head);
                        read.drain(..end + 4 + length);
                        let answer = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                                      3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        if let Then::Close = then {
                            return;
                        }
                    }
                });
            }
        });
        (
            format!("http://{addr}/v1/chat/completions")
                .parse()
                .expect("uri"),
            accepted,
            heads,
        )
    }

    fn connections() -> Arc<Connections> {
        Connections::new(Duration::from_secs(5), Duration::from_secs(90), 8)
    }

    async fn call(connections: &Arc<Connections>, uri: &Uri) -> Bytes {
        let request = Request::post(uri.clone())
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        let response = connections.send(request).await.expect("an answer");
        response
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes()
    }

    #[tokio::test]
    async fn answers_read_to_their_end_leave_the_connection_for_the_next_call() {
        let (uri, accepted, heads) = server(Then::KeepOpen).await;
        let connections = connections();
        for _ in 0..3 {
            assert_eq!(call(&connections, &uri).await, "onetwothree");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let authority = uri.authority().expect("authority").as_str().to_owned();
        for head in heads.lock().expect("heads").iter() {
            assert!(
                head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
                "{head}"
            );
            assert!(head.contains(&format!("host: {authority}\r\n")), "{head}");
        }
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
        let (uri, accepted, _) = server(Then::Close).await;
        let connections = connections();
        for _ in 0..3 {
            assert_eq!(call(&connections, &uri).await, "onetwothree");
            // The upstream's close has arrived before the next call takes the connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_sweep_closes_the_idle_connections_the_upstream_closed() {
        let (open, _, _) = server(Then::KeepOpen).await;
        let (closing, _, _) = server(Then::Close).await;
        let connections = connections();
        call(&connections, &open).await;
        call(&connections, &closing).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        connections.sweep();
        let idle = connections.lock();
        let left: Vec<_> = idle.keys().map(|k| k.authority.clone()).collect();
        assert_eq!(left, [open.authority().expect("authority").clone()]);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (uri, accepted, _) = server(Then::KeepOpen).await;
        let connections = connections();
        let request = Request::post(uri.clone())
            .body(Full::new(Bytes::new()))
            .expect("request");
        drop(connections.send(request).await.expect("an answer"));
        assert_eq!(call(&connections, &uri).await, "onetwothree");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let request = Request::post(format!("http://{addr}/v1/models"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let sent = connections().send(request).await;
        assert!(
            matches!(sent, Err(SendError::Connect(_))),
            "{:?}",
            sent.err()
        );
    }
}
