//! Errors the sidecar makes itself reach the caller in its own API's shape: an Anthropic SDK
//! raises its typed error (`RateLimitError`, `NotFoundError`, ...) with the sidecar's message,
//! instead of failing to read an OpenAI error body.
//!
//! Every error response the sidecar builds carries its message ([`ErrorMessage`]); for a route of
//! the Anthropic dialect that response's body is written again in Anthropic's shape, status and
//! headers (`Retry-After`) kept. Errors the engine answers are translated where they are read
//! ([`crate::data_plane::anthropic`]).

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response};
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::ErrorMessage;
use crate::data_plane::route::{Dialect, Route};

#[derive(Debug, Clone, Copy, Default)]
pub struct DialectLayer;

impl<S> Layer<S> for DialectLayer {
    type Service = DialectErrors<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DialectErrors { inner }
    }
}

#[derive(Debug, Clone)]
pub struct DialectErrors<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for DialectErrors<S>
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
        let dialect = request
            .extensions()
            .get::<Route>()
            .map(Route::dialect)
            .unwrap_or_default();
        let response = self.inner.call(request);
        if dialect == Dialect::OpenAi {
            return response;
        }
        Box::pin(async move {
            let response = response.await?;
            let Some(ErrorMessage(message)) = response.extensions().get::<ErrorMessage>().cloned()
            else {
                return Ok(response);
            };
            let (mut parts, _) = response.into_parts();
            let body = crate::data_plane::anthropic::response::error_json(parts.status, &message);
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok(Response::from_parts(parts, ProxyBody::full(body)))
        })
    }
}
