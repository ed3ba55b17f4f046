//! Classifies the route, opens the request's tracing span, and records its metrics when the
//! client has the whole response — or went away.
//!
//! The sidecar's own added latency is measured to the response head: the time before the
//! request was sent upstream plus the time between the upstream's head and ours. Streaming time
//! after that belongs to the upstream's generation, not to us.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::{Layer, Service};
use tracing::Instrument;

use super::request_id::RequestId;
use super::ResponseFuture;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::ErrorCode;
use crate::data_plane::forward::UpstreamTiming;
use crate::data_plane::metrics::{ErrorLabels, Metrics, RequestLabels, RouteLabels, UpstreamName};
use crate::data_plane::route::Classify;

#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Arc<Metrics>,
    classify: Classify,
}

impl ObserveLayer {
    /// `classify` decides each request's route: the app's, which knows both planes' routes.
    pub fn new(metrics: Arc<Metrics>, classify: Classify) -> Self {
        Self { metrics, classify }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Observe {
            inner,
            metrics: Arc::clone(&self.metrics),
            classify: self.classify,
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
    classify: Classify,
}

impl<S, B> Service<Request<B>> for Observe<S>
where
    S: Service<
        Request<B>,
        Response = Response<ProxyBody>,
        Error = Infallible,
        Future = ResponseFuture,
    >,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> ResponseFuture {
        let received = Instant::now();
        let route = (self.classify)(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let label = route.label();
        let span = tracing::info_span!(
            "request",
            id = request.extensions().get::<RequestId>().map(RequestId::as_str).unwrap_or_default(),
            method = %request.method(),
            route = label,
        );
        request.extensions_mut().insert(route);
        let in_flight = InFlightGauge::enter(&self.metrics);
        let metrics = Arc::clone(&self.metrics);
        let response = self.inner.call(request);
        Box::pin(
            async move {
                let mut response = response.await?;
                let responded = Instant::now();
                let timing = response.extensions().get::<UpstreamTiming>().cloned();
                if let Some(timing) = &timing {
                    let added = (timing.sent_at - received) + (responded - timing.head_at);
                    metrics
                        .added_latency
                        .get_or_create(&RouteLabels { route: label })
                        .observe(added.as_secs_f64());
                }
                if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
                    metrics.errors.get_or_create(&ErrorLabels { code }).inc();
                }
                let done = Completion {
                    metrics,
                    labels: RequestLabels {
                        route: label,
                        status: response.status().as_u16(),
                        upstream: UpstreamName(
                            timing.map_or_else(|| Arc::from("none"), |t| t.upstream),
                        ),
                    },
                    received,
                    span: tracing::Span::current(),
                    _in_flight: in_flight,
                };
                response.body_mut().attach(done);
                Ok(response)
            }
            .instrument(span),
        )
    }
}

/// Dropped with the response body: when the client has it all, or left.
struct Completion {
    metrics: Arc<Metrics>,
    labels: RequestLabels,
    received: Instant,
    span: tracing::Span,
    _in_flight: InFlightGauge,
}

/// Counts a request in flight from its arrival until its response body is done; also when the
/// client leaves before the head and the future is dropped.
struct InFlightGauge(prometheus_client::metrics::gauge::Gauge);

impl InFlightGauge {
    fn enter(metrics: &Metrics) -> Self {
        metrics.in_flight.inc();
        Self(metrics.in_flight.clone())
    }
}

impl Drop for InFlightGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        let elapsed = self.received.elapsed();
        self.metrics.requests.get_or_create(&self.labels).inc();
        self.metrics
            .duration
            .get_or_create(&RouteLabels {
                route: self.labels.route,
            })
            .observe(elapsed.as_secs_f64());
        self.span.in_scope(|| {
            tracing::info!(
                status = self.labels.status,
                upstream = %self.labels.upstream.0,
                ?elapsed,
                "request finished"
            );
        });
    }
}
