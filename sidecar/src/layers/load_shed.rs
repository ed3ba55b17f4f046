//! Caps the API requests served at once. Past the cap a request is refused straight away with
//! 503 and `Retry-After` instead of queueing: an agent retries, a queue would only add latency to
//! everyone. Health and metrics endpoints are never shed.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::route::Route;

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
        let is_api = matches!(request.extensions().get::<Route>(), Some(Route::Api { .. }));
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
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // Held until the client has the whole body (or leaves), not just the head.
            response.body_mut().attach(permit);
            Ok(response)
        })
    }
}
