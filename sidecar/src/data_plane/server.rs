//! The agent-facing listener: a bounded accept loop serving HTTP/1.1 and h2c on every
//! connection, and graceful shutdown.
//!
//! Every connection has a watchdog ([`Watchdog`]): one that has not sent a whole request head
//! within `timeouts.header_read` of being accepted (nothing at all, or only an h2 preface), or
//! that sits idle with no request in flight for `timeouts.idle_connection`, is closed — so
//! silent connections cannot hold descriptors until the sidecar can accept nothing else, health
//! checks included. The number of connections is capped below the process's descriptor limit,
//! and at the cap the connection idle longest is closed to make room for the next one.
//!
//! On shutdown the listener closes first (new connections are refused), idle keep-alive
//! connections are closed, and in-flight requests — streams included — get `shutdown_grace` to
//! finish. Forwarding tasks whose client already left are waited for within the same deadline,
//! because their completion is what gets recorded.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use tokio_util::task::TaskTracker;

use crate::data_plane::body::ProxyBody;
use crate::data_plane::bounds::Timeouts;
use crate::data_plane::layers::ResponseFuture;
use crate::data_plane::metrics::Metrics;

/// Descriptors kept free of agent connections: upstream connections, the store, plugins, logs.
const RESERVED_DESCRIPTORS: u64 = 64;

/// Connections the admin port (`admin.listen`) holds at once: a pool of its own, so agents
/// holding every agent connection cannot lock operators and scrapers out.
pub const ADMIN_CONNECTIONS: usize = 64;

/// Agent connections held open at once; past this the accept loop waits for one to close. At
/// most `limits.max_connections`, and never more than the descriptor limit leaves room for
/// beside the admin pool (else `accept` fails with EMFILE and nothing, `/healthz` included, is
/// answered).
pub fn connection_cap(configured: usize) -> usize {
    let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let reserved = RESERVED_DESCRIPTORS + ADMIN_CONNECTIONS as u64;
    let room = descriptors.saturating_sub(reserved).max(1) / 2 + 1;
    let cap = configured.min(usize::try_from(room).unwrap_or(usize::MAX));
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            descriptors,
            "limits.max_connections lowered to fit the descriptor limit (ulimit -n)"
        );
    }
    cap
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Which listener a request came in on (`admin.listen` splits the admin API off the agent
/// port); the handler answers only its own port's routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Agent,
    Admin,
}

/// The service every connection serves: the app's layered stack over its handler.
pub trait Stack:
    tower::Service<
        http::Request<hyper::body::Incoming>,
        Response = http::Response<ProxyBody>,
        Error = std::convert::Infallible,
        Future = ResponseFuture,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Stack for S where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<ProxyBody>,
            Error = std::convert::Infallible,
            Future = ResponseFuture,
        > + Clone
        + Send
        + 'static
{
}

/// What the listener is bounded by, and the tasks it waits for when it drains.
pub struct Serving<'a> {
    pub timeouts: &'a Timeouts,
    /// Agent connections held at once ([`connection_cap`]).
    pub connections: usize,
    pub metrics: Arc<Metrics>,
    /// Forwarding tasks whose client may have left: their completion is what gets recorded.
    pub tasks: &'a TaskTracker,
}

/// Serves every listener with `stack` until `shutdown` resolves, then drains them together:
/// connections (streams included) and then the forwarding tasks, within `shutdown_grace`.
pub async fn serve_on<S: Stack>(
    listeners: Vec<(TcpListener, Port)>,
    stack: S,
    serving: Serving<'_>,
    shutdown: impl Future<Output = ()>,
) {
    let Serving {
        timeouts,
        connections,
        metrics,
        tasks,
    } = serving;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true)
        // A streamed answer arrives as many small frames: copied into one buffer, the frames
        // that are ready go out in one write, instead of a vectored write per 16 of them.
        .writev(false);
    builder.http2().timer(TokioTimer::new());
    let server = Accepting {
        stack,
        builder,
        graceful: GracefulShutdown::new(),
        agent: Connections::new(connections),
        admin: Connections::new(ADMIN_CONNECTIONS),
        metrics,
        header_read: timeouts.header_read,
        idle: timeouts.idle_connection,
        stop: tokio_util::sync::CancellationToken::new(),
    };
    let stopping = async {
        shutdown.await;
        server.stop.cancel();
    };
    let loops = futures_util::future::join_all(
        listeners
            .into_iter()
            .map(|(listener, port)| server.accept_loop(listener, port)),
    );
    tokio::join!(stopping, loops);
    let graceful = server.graceful;

    let grace = timeouts.shutdown_grace;
    let deadline = Instant::now() + grace;
    tracing::info!(?grace, "shutting down: draining in-flight requests");
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace ran out with connections still open");
    }
    tasks.close();
    if tokio::time::timeout_at(deadline, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            tasks = tasks.len(),
            "shutdown grace ran out with upstream responses still being read"
        );
    }
}

/// What a connection's watchdog knows: whether a request came, how many are in flight, and when
/// the last one ended.
pub struct Watchdog {
    accepted: Instant,
    header_read: Duration,
    idle: Duration,
    started: AtomicBool,
    active: AtomicUsize,
    /// Milliseconds after `accepted` when the connection last went idle.
    idle_since_ms: AtomicU64,
    /// A response on this connection gave up on its client (it stopped reading).
    abandoned: AtomicBool,
    /// Closed while idle to make room for a new connection at the cap.
    reclaimed: AtomicBool,
    wake: tokio::sync::Notify,
}

/// Lets a response close its connection when the client stops reading it: a stalled (or
/// vanished, half-open) peer would otherwise keep the response body, and the concurrency permit
/// it holds, forever. With h2 the whole connection goes, every stream on it.
#[derive(Clone)]
pub struct Abandon(Arc<Watchdog>);

impl Abandon {
    pub fn abandon(&self) {
        self.0.abandoned.store(true, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

impl Watchdog {
    fn new(header_read: Duration, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            accepted: Instant::now(),
            header_read,
            idle,
            started: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            abandoned: AtomicBool::new(false),
            reclaimed: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Since when the connection has had no request in flight; `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = match self.started.load(Ordering::Relaxed) {
            true => self.idle_since_ms.load(Ordering::Relaxed),
            false => 0,
        };
        Some(self.accepted + Duration::from_millis(since))
    }

    /// Closes the connection if it is still idle.
    fn reclaim(&self) {
        if self.active.load(Ordering::SeqCst) == 0 {
            self.reclaimed.store(true, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    fn request_began(self: &Arc<Self>) -> RequestGuard {
        self.started.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::SeqCst);
        RequestGuard(Arc::clone(self))
    }

    /// Resolves when the connection should be closed, saying why.
    async fn expired(&self) -> &'static str {
        loop {
            if self.abandoned.load(Ordering::SeqCst) {
                return "the client stopped reading its answer (timeouts.client_write)";
            }
            // Unless a request began meanwhile.
            if self.reclaimed.load(Ordering::SeqCst) && self.active.load(Ordering::SeqCst) == 0 {
                return "idle at limits.max_connections: closed to make room for a new one";
            }
            let now = Instant::now();
            let deadline = if !self.started.load(Ordering::Relaxed) {
                self.accepted + self.header_read
            } else if self.active.load(Ordering::SeqCst) > 0 {
                now + self.idle
            } else {
                let since = self.idle_since_ms.load(Ordering::Relaxed);
                self.accepted + Duration::from_millis(since) + self.idle
            };
            if now >= deadline {
                return if self.started.load(Ordering::Relaxed) {
                    "idle past timeouts.idle_connection"
                } else {
                    "no request head within timeouts.header_read"
                };
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline.max(now + Duration::from_millis(10))) => {}
                () = self.wake.notified() => {}
            }
        }
    }
}

/// One request on a watched connection; dropped with its response body.
struct RequestGuard(Arc<Watchdog>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let elapsed = u64::try_from(self.0.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.idle_since_ms.store(elapsed, Ordering::Relaxed);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The stack, telling the connection's watchdog when requests begin and end, and marking each
/// request with the port it came in on.
#[derive(Clone)]
struct Watched<S> {
    inner: S,
    watchdog: Arc<Watchdog>,
    port: Port,
}

impl<S, B> tower::Service<http::Request<B>> for Watched<S>
where
    S: tower::Service<
        http::Request<B>,
        Response = http::Response<ProxyBody>,
        Error = std::convert::Infallible,
        Future = ResponseFuture,
    >,
{
    type Response = http::Response<ProxyBody>;
    type Error = std::convert::Infallible;
    type Future = ResponseFuture;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.port);
        request
            .extensions_mut()
            .insert(Abandon(Arc::clone(&self.watchdog)));
        let guard = self.watchdog.request_began();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            response.body_mut().attach(guard);
            Ok(response)
        })
    }
}

/// The connections open now, by a serial number: at the cap, the idlest makes room.
#[derive(Default)]
struct Open {
    next: AtomicU64,
    watchdogs: std::sync::Mutex<std::collections::HashMap<u64, Arc<Watchdog>>>,
}

impl Open {
    fn watchdogs(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Watchdog>>> {
        self.watchdogs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, watchdog: &Arc<Watchdog>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.watchdogs().insert(id, Arc::clone(watchdog));
        id
    }

    fn remove(&self, id: u64) {
        self.watchdogs().remove(&id);
    }

    /// Closes the connection idle longest (no request in flight: never made one, or between
    /// keep-alive requests); whether there was one.
    fn reclaim_idlest(&self) -> bool {
        let idlest = self
            .watchdogs()
            .values()
            .filter_map(|w| w.idle_since().map(|since| (since, Arc::clone(w))))
            .min_by_key(|(since, _)| *since);
        match idlest {
            Some((_, watchdog)) => {
                watchdog.reclaim();
                true
            }
            None => false,
        }
    }
}

/// The connections of one port's pool: its permits and the watchdogs of those open.
struct Connections {
    permits: Arc<Semaphore>,
    open: Arc<Open>,
}

impl Connections {
    fn new(cap: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(cap)),
            open: Arc::default(),
        }
    }
}

/// What the accept loops of all listeners share.
struct Accepting<S> {
    stack: S,
    builder: auto::Builder<TokioExecutor>,
    graceful: GracefulShutdown,
    /// The agent port's connections, and the admin port's apart.
    agent: Connections,
    admin: Connections,
    metrics: Arc<Metrics>,
    header_read: Duration,
    idle: Duration,
    stop: tokio_util::sync::CancellationToken,
}

impl<S: Stack> Accepting<S> {
    /// Accepts on `listener` until the stop signal, each connection with its watchdog.
    async fn accept_loop(&self, listener: TcpListener, port: Port) {
        let Connections { permits, open } = match port {
            Port::Agent => &self.agent,
            Port::Admin => &self.admin,
        };
        loop {
            let free = Arc::clone(permits).try_acquire_owned().ok();
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Usually EMFILE: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = self.stop.cancelled() => break,
            };
            // A permit freed while this waited to accept is taken before anyone is closed.
            let free = free.or_else(|| Arc::clone(permits).try_acquire_owned().ok());
            let permit = match free {
                Some(permit) => permit,
                None => {
                    // At the cap, with a connection waiting, an idle one (that sent nothing
                    // yet, or sits between keep-alive requests) makes room: sockets opened and
                    // left idle cannot lock everyone else out, health checks included, until
                    // `header_read` runs out. None is closed while nobody waits.
                    if open.reclaim_idlest() {
                        self.metrics.connections_reclaimed.inc();
                    }
                    tokio::select! {
                        permit = Arc::clone(permits).acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => break,
                        },
                        () = self.stop.cancelled() => break,
                    }
                }
            };
            let _ = stream.set_nodelay(true);
            let watchdog = Watchdog::new(self.header_read, self.idle);
            let service = TowerToHyperService::new(Watched {
                inner: self.stack.clone(),
                watchdog: Arc::clone(&watchdog),
                port,
            });
            let connection = self
                .builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            let connection = self.graceful.watch(connection);
            let open = Arc::clone(open);
            let id = open.add(&watchdog);
            tokio::spawn(async move {
                tokio::select! {
                    ended = connection => if let Err(e) = ended {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    },
                    why = watchdog.expired() => tracing::debug!(%peer, why, "connection closed"),
                }
                open.remove(id);
                drop(permit);
            });
        }
    }
}
