//! Gives every request an id — the client's `X-Request-Id` when it sent a sane one — and returns
//! it on the response, so an agent's log line, the sidecar's and the recorded step can be joined.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::data_plane::body::ProxyBody;

pub const HEADER: &str = "x-request-id";
const MAX_LEN: usize = 128;

/// The request's id, in its extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub HeaderValue);

/// A fresh random id (32 hex digits).
fn generated() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl RequestId {
    fn from_request<B>(request: &Request<B>) -> Self {
        let given = request
            .headers()
            .get(HEADER)
            .filter(|v| !v.is_empty() && v.len() <= MAX_LEN && v.to_str().is_ok());
        match given {
            Some(value) => Self(value.clone()),
            // A hex string is always a valid header value.
            None => Self(
                HeaderValue::from_str(&generated()).unwrap_or(HeaderValue::from_static("invalid")),
            ),
        }
    }

    /// The id the engine gets (vLLM takes it as its own request id): this one with a random
    /// suffix, so that it is unique whatever the client sent — two clients (two tenants) that
    /// send the same id would otherwise collide in the engine, which refuses the second — and
    /// still starts with the id the agent's and the sidecar's logs carry.
    pub fn upstream(&self) -> HeaderValue {
        let id = format!("{}-{}", self.as_str(), generated());
        HeaderValue::from_str(&id).unwrap_or_else(|_| self.0.clone())
    }

    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for RequestIdService<S>
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
        let id = RequestId::from_request(&request);
        let header = id.0.clone();
        request.extensions_mut().insert(id);
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            response.headers_mut().insert(HEADER, header);
            Ok(response)
        })
    }
}
