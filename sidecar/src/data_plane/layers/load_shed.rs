//! Caps the API requests served at once. Past the cap a request is refused straight away with
//! 503 and `Retry-After` instead of queueing: an agent retries, a queue would only add latency to
//! everyone. Health and metrics endpoints are never shed.
//!
//! A call's permit is held until the client has its whole response *and* the upstream call has
//! ended: a client that disconnects leaves an orphan that still reads its upstream response (so
//! the step is recorded), and that orphan keeps counting against the cap — else bursts of
//! resets would open upstream calls without limit while the gauge showed none.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::ProxyError;
use crate::data_plane::route::Route;

/// A call's share of the concurrency cap; the permit returns when the last copy drops.
#[derive(Debug, Clone)]
pub struct HeldPermit {
    _permit: Arc<tokio::sync::OwnedSemaphorePermit>,
}

#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    permits: Arc<Semaphore>,
    limit: usize,
    retry_after_secs: u32,
}

impl LoadShedLayer {
    pub fn new(limit: usize, retry_after_secs: u32) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            retry_after_secs,
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LoadShed {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    layer: LoadShedLayer,
}

impl<S, B> Service<Request<B>> for LoadShed<S>
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

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        // Model calls, whichever form their path takes (Claw-R1's base_url included).
        let is_api = request
            .extensions()
            .get::<Route>()
            .is_some_and(|route| route.upstream_path().is_some());
        if !is_api {
            return self.inner.call(request);
        }
        let Ok(permit) = Arc::clone(&self.layer.permits).try_acquire_owned() else {
            let refused = ProxyError::Overloaded {
                limit: self.layer.limit,
                retry_after_secs: self.layer.retry_after_secs,
            };
            return Box::pin(async move { Ok(refused.into_response()) });
        };
        let permit = HeldPermit {
            _permit: Arc::new(permit),
        };
        let mut request = request;
        // The forwarding task takes this copy and holds it until the upstream call has ended.
        request.extensions_mut().insert(permit.clone());
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // Held until the client has the whole body (or leaves), not just the head.
            response.body_mut().attach(permit);
            Ok(response)
        })
    }
}
