//! Sends a buffered request to a balanced upstream and returns its response as a relayed stream.
//!
//! Failover is deliberately narrow: only a connect failure (the request never left the sidecar)
//! moves on to another upstream. Anything later — a reset, a timeout, a 5xx — may have started
//! work on the backend (a generation, a tool side effect), so it is never replayed.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{request, Request, Response};
use http_body_util::Full;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::task::TaskTracker;

use crate::data_plane::body::ProxyBody;
use crate::data_plane::bounds::Timeouts;
use crate::data_plane::capture::{Answer, Capture, Endpoint};
use crate::data_plane::connections::{Connections, SendError, UpstreamBody};
use crate::data_plane::error::ProxyError;
use crate::data_plane::layers::request_id::{RequestId, HEADER as REQUEST_ID_HEADER};
use crate::data_plane::metrics::{Metrics, UpstreamLabels};
use crate::data_plane::policy::Lease;
use crate::data_plane::recorder::Pending;
use crate::data_plane::relay::{Relay, Tap, RELAY_CAPACITY};
use crate::data_plane::upstream::UpstreamKind;
use crate::data_plane::upstream::{status_health, Failure, HealthChange, InFlight, Pool, Upstream};

/// When and where a response came from; the observe layer turns it into the added-latency metric.
#[derive(Debug, Clone)]
pub struct UpstreamTiming {
    pub upstream: Arc<str>,
    pub sent_at: Instant,
    pub head_at: Instant,
}

pub struct Forwarder {
    connections: Arc<Connections>,
    pool: Arc<Pool>,
    /// The upstream key's header (`Authorization: Bearer <key>`, or `x-api-key` for Anthropic's
    /// API), replacing the client's key, when configured.
    upstream_auth: Option<(HeaderName, HeaderValue)>,
    timeouts: Timeouts,
    kind: UpstreamKind,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    /// Calls whose client left and whose upstream answer is still read (`max_orphaned_calls`).
    orphans: Orphans,
}

/// The places for orphans: `max_orphaned_calls` in all, each tenant its share of them.
#[derive(Clone)]
pub struct Orphans {
    pub all: Arc<Semaphore>,
    pub per_tenant: Arc<crate::data_plane::share::Shares>,
}

impl Orphans {
    /// `max` places, each tenant its share of them ([`crate::data_plane::share::Counts::new`]).
    pub fn new(max: usize, fraction: f64, fair: bool) -> Self {
        Self {
            all: Arc::new(Semaphore::new(max)),
            per_tenant: crate::data_plane::share::Shares::new(max, fraction, fair),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the upstream API key is not a valid header value")]
pub struct InvalidApiKey;

impl Forwarder {
    pub fn new(
        pool: Arc<Pool>,
        upstream_api_key: Option<&str>,
        kind: UpstreamKind,
        timeouts: Timeouts,
        orphans: Orphans,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
    ) -> Result<Self, InvalidApiKey> {
        let connections = Connections::new(
            timeouts.upstream_connect,
            crate::data_plane::connections::IDLE_REUSE,
            1024,
        );
        let upstream_auth = upstream_api_key
            .map(|key| {
                // Anthropic's API takes its key as `x-api-key`; the rest as a bearer token.
                let (name, value) = match kind {
                    UpstreamKind::Anthropic => {
                        (HeaderName::from_static("x-api-key"), key.to_owned())
                    }
                    _ => (header::AUTHORIZATION, format!("Bearer {key}")),
                };
                let mut value = HeaderValue::try_from(value).map_err(|_| InvalidApiKey)?;
                value.set_sensitive(true);
                Ok((name, value))
            })
            .transpose()?;
        Ok(Self {
            connections,
            pool,
            upstream_auth,
            timeouts,
            kind,
            metrics,
            tasks,
            orphans,
        })
    }

    /// Forwards in a task of its own and returns the response head as soon as it is there.
    ///
    /// The task outlives this future: a client that leaves before the head (a non-streaming
    /// call is all "before the head") or mid-stream does not cancel the upstream call, whose
    /// response is still read to the end. `lease` (the adapter serving the call) is held until
    /// then, so the adapter counts the call as in flight until its response has ended.
    pub async fn call(
        self: &Arc<Self>,
        parts: request::Parts,
        body: Bytes,
        upstream_path: String,
        recording: Option<Pending>,
        lease: Option<Lease>,
        answer: Answer,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (head_tx, head_rx) = oneshot::channel();
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            match this
                .forward(&parts, body, &upstream_path, recording, answer)
                .await
            {
                Ok((response, relay)) => {
                    // If the client is gone, the response and its receiver drop here and the
                    // relay reads on as an orphan.
                    let _ = head_tx.send(Ok(response));
                    relay.run().await;
                }
                Err(e) => {
                    let _ = head_tx.send(Err(e));
                }
            }
            drop(lease);
        });
        head_rx.await.unwrap_or_else(|_| {
            Err(ProxyError::Internal(
                "the forwarding task ended without an answer".to_owned(),
            ))
        })
    }

    async fn forward(
        &self,
        parts: &request::Parts,
        body: Bytes,
        upstream_path: &str,
        recording: Option<Pending>,
        answer: Answer,
    ) -> Result<(Response<ProxyBody>, Relay<UpstreamBody>), ProxyError> {
        // A recorded call's trajectory is its session: its calls go where its prefix is cached.
        let affinity = recording.as_ref().map(|pending| pending.call.affinity);
        let result = self.send(parts, body, upstream_path, affinity).await;
        match result {
            Ok((response, in_flight, timing)) => {
                let status = response.status();
                let is_sse = !matches!(answer, Answer::Messages if !status.is_success())
                    && is_event_stream(response.headers());
                let tap = match (recording, answer) {
                    (Some(pending), _) if status.is_success() => {
                        Some(pending.into_tap(&timing.upstream, self.kind, is_sse))
                    }
                    (recording, Answer::Messages) => {
                        // Not recorded (an error, or recording off), and still translated.
                        if let Some(pending) = recording {
                            pending.abandon().await;
                        }
                        let answer = if status.is_success() {
                            Answer::Messages
                        } else {
                            Answer::MessagesError(status)
                        };
                        Some(Tap::translating(
                            Capture::untouched(Endpoint::ChatCompletions).answering(answer),
                            is_sse,
                        ))
                    }
                    (Some(pending), _) => {
                        pending.abandon().await;
                        None
                    }
                    (None, _) => None,
                };
                let connection = parts.extensions.get::<crate::data_plane::server::Abandon>();
                let tenant = parts
                    .extensions
                    .get::<crate::data_plane::tenant::CallTenant>()
                    .map(|t| t.0.clone());
                Ok(self.relay(
                    response, in_flight, timing, tap, is_sse, answer, connection, tenant,
                ))
            }
            Err(e) => {
                if let Some(pending) = recording {
                    pending.abandon().await;
                }
                Err(e)
            }
        }
    }

    /// Sends to a balanced upstream, failing over only on connect errors.
    async fn send(
        &self,
        parts: &request::Parts,
        body: Bytes,
        upstream_path: &str,
        affinity: Option<u128>,
    ) -> Result<(Response<UpstreamBody>, InFlight, UpstreamTiming), ProxyError> {
        let mut tried: Vec<Arc<str>> = Vec::new();
        loop {
            let Some(in_flight) = self.pool.pick_for(&tried, affinity) else {
                return Err(if tried.is_empty() {
                    ProxyError::NoHealthyUpstream {
                        count: self.pool.all().len(),
                    }
                } else {
                    ProxyError::ConnectFailed {
                        tried: tried.join(", "),
                    }
                });
            };
            let upstream = Arc::clone(in_flight.upstream());
            let request = self.upstream_request(&upstream, parts, body.clone(), upstream_path)?;
            let sent_at = Instant::now();
            let response = tokio::time::timeout(
                self.timeouts.upstream_first_byte,
                self.connections.send(request),
            )
            .await;
            let response = match response {
                Ok(Ok(response)) => response,
                Ok(Err(e @ SendError::Connect(_))) => {
                    tracing::warn!(upstream = %upstream.name, error = %e, "upstream refused the connection; trying another");
                    self.report(&upstream, Failure::Connect);
                    tried.push(Arc::clone(&upstream.name));
                    continue;
                }
                Ok(Err(source)) => {
                    self.report(&upstream, Failure::Gateway);
                    return Err(ProxyError::Upstream {
                        upstream: Arc::clone(&upstream.name),
                        source,
                    });
                }
                Err(_) => {
                    return Err(ProxyError::FirstByteTimeout {
                        upstream: Arc::clone(&upstream.name),
                        timeout: self.timeouts.upstream_first_byte,
                    })
                }
            };
            if let Some(encoding) = encoded(response.headers()) {
                // Asked for identity and sent something else (a compressing hop between):
                // nothing of it could be filtered or recorded, so nothing of it is passed on.
                return Err(ProxyError::EncodedAnswer {
                    upstream: Arc::clone(&upstream.name),
                    encoding,
                });
            }
            let head_at = Instant::now();
            self.metrics
                .upstream_first_byte
                .get_or_create(&UpstreamLabels::new(&upstream.name))
                .observe((head_at - sent_at).as_secs_f64());
            match status_health(response.status()) {
                Some(failure) => self.report(&upstream, failure),
                // A plain 500 is how vLLM answers an input that breaks it: the request's fault,
                // not the engine's health (see crate::data_plane::upstream).
                None if response.status().is_server_error() => {}
                None => self.pool.report_success(&upstream),
            }
            let timing = UpstreamTiming {
                upstream: Arc::clone(&upstream.name),
                sent_at,
                head_at,
            };
            return Ok((response, in_flight, timing));
        }
    }

    fn report(&self, upstream: &Upstream, failure: Failure) {
        if self.pool.report_failure(upstream, failure) == HealthChange::Ejected {
            tracing::warn!(upstream = %upstream.name, ?failure, "upstream ejected");
            self.metrics
                .ejections
                .get_or_create(&UpstreamLabels::new(&upstream.name))
                .inc();
        }
    }

    fn upstream_request(
        &self,
        upstream: &Upstream,
        parts: &request::Parts,
        body: Bytes,
        upstream_path: &str,
    ) -> Result<Request<Full<Bytes>>, ProxyError> {
        let uri = upstream
            .url
            .join(upstream_path)
            .map_err(ProxyError::BadUpstreamRequest)?;
        let mut request = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(ProxyError::BadUpstreamRequest)?;
        let headers = request.headers_mut();
        copy_end_to_end(&parts.headers, headers);
        // The body may be rewritten by later layers: hyper sets the length from the body.
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::HOST);
        // The engine can use it as its own request id (vLLM: --enable-request-id-headers).
        if let Some(id) = parts.extensions.get::<RequestId>() {
            headers.insert(REQUEST_ID_HEADER, id.upstream());
        }
        // What the sidecar reads of an answer (the step it records, the ids it strips, the
        // model list it filters) it must be able to read: the agent's `Accept-Encoding` is
        // not the engine's business.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        if let Some((name, value)) = &self.upstream_auth {
            // The tenant's key, in whichever header it came, stays here.
            headers.remove(header::AUTHORIZATION);
            for key_header in crate::data_plane::tenant::API_KEY_HEADERS {
                headers.remove(key_header);
            }
            headers.insert(name.clone(), value.clone());
        }
        Ok(request)
    }

    #[allow(clippy::too_many_arguments)]
    fn relay(
        &self,
        response: Response<UpstreamBody>,
        in_flight: InFlight,
        timing: UpstreamTiming,
        tap: Option<Tap>,
        is_sse: bool,
        answer: Answer,
        connection: Option<&crate::data_plane::server::Abandon>,
        tenant: Option<clawback_datapool::TenantId>,
    ) -> (Response<ProxyBody>, Relay<UpstreamBody>) {
        let (mut parts, body) = response.into_parts();
        if tap
            .as_ref()
            .is_some_and(|tap| tap.capture.rewrites_response())
        {
            // Stripping what the sidecar injected, or translating, changes the body's length.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        if matches!(answer, Answer::Messages) && !is_sse {
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let (tx, rx) = mpsc::channel(RELAY_CAPACITY);
        let relay = Relay {
            body,
            tap,
            at_event_boundary: true,
            tx,
            is_sse,
            idle: self.timeouts.upstream_idle,
            client_write: self.timeouts.client_write,
            connection: connection.cloned(),
            orphan_drain: self.timeouts.orphan_drain,
            orphans: self.orphans.clone(),
            tenant,
            in_flight,
            pool: Arc::clone(&self.pool),
            metrics: Arc::clone(&self.metrics),
            dialect: answer.dialect(),
        };
        let mut response = Response::new(ProxyBody::relay(rx));
        *response.status_mut() = parts.status;
        copy_end_to_end(&parts.headers, response.headers_mut());
        response.extensions_mut().insert(timing);
        (response, relay)
    }
}

/// The answer's `Content-Encoding` when it is anything but identity.
fn encoded(headers: &HeaderMap) -> Option<String> {
    let encoding = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("identity"))
        .collect::<Vec<_>>()
        .join(", ");
    (!encoding.is_empty()).then_some(encoding)
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Headers that describe one connection, not the message, and so are never forwarded
/// (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let named_in_connection: Vec<&str> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for (name, value) in from {
        let hop = HOP_BY_HOP.contains(name)
            || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
            || named_in_connection
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_str()));
        if !hop {
            to.append(name.clone(), value.clone());
        }
    }
}
