//! The response body the sidecar hands to hyper: either a small body it made itself, or the
//! frames the upstream relay task passes along one by one, as they arrive.
//!
//! Layers attach guards (a concurrency permit, a metrics recorder) that are dropped when the
//! client has the whole body or goes away — whichever comes first.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the relay task sends: a frame, or the reason the stream broke.
pub type RelayItem = Result<Frame<Bytes>, BoxError>;

pub struct ProxyBody {
    kind: Kind,
    guards: Vec<Box<dyn Any + Send + Sync>>,
}

enum Kind {
    Full(Option<Bytes>),
    Relay(mpsc::Receiver<RelayItem>),
}

impl ProxyBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full(Some(bytes.into())),
            guards: Vec::new(),
        }
    }

    pub fn empty() -> Self {
        Self {
            kind: Kind::Full(None),
            guards: Vec::new(),
        }
    }

    pub fn relay(rx: mpsc::Receiver<RelayItem>) -> Self {
        Self {
            kind: Kind::Relay(rx),
            guards: Vec::new(),
        }
    }

    /// Keeps `guard` alive until this body is finished or dropped.
    pub fn attach(&mut self, guard: impl Any + Send + Sync) {
        self.guards.push(Box::new(guard));
    }

    fn finish(&mut self) {
        self.guards.clear();
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = match &mut this.kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Relay(rx) => rx.poll_recv(cx),
        };
        if let Poll::Ready(None) = polled {
            this.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Relay(_) => SizeHint::default(),
        }
    }
}
