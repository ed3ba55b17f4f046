//! The response body the sidecar hands to hyper: either a small body it made itself, or the
//! frames the upstream relay task passes along, as they arrive.
//!
//! Frames the relay has already handed over when the connection asks for the next one go out
//! together, copied into one chunk (at most [`MERGE_BYTES`]): a streamed answer arrives as
//! hundreds of small frames, and one chunk for those that are ready costs the agent and the
//! connection one write and one read instead of one per frame — what NGINX does too. Nothing
//! waits to be merged: a frame that is there goes out with the next write, and the bytes, and
//! so the SSE events, are the engine's.
//!
//! Layers attach guards (a concurrency permit, a metrics recorder) that are dropped when the
//! client has the whole body or goes away — whichever comes first.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the relay task sends: a frame, or the reason the stream broke.
pub type RelayItem = Result<Frame<Bytes>, BoxError>;

/// The most bytes of ready frames merged into one chunk.
pub const MERGE_BYTES: usize = 64 * 1024;

pub struct ProxyBody {
    kind: Kind,
    guards: Vec<Box<dyn Any + Send + Sync>>,
}

enum Kind {
    Full(Option<Bytes>),
    Relay {
        rx: mpsc::Receiver<RelayItem>,
        /// What was taken from the channel while merging and goes out next: a frame that is
        /// not data, an error, or data that did not fit.
        next: Option<RelayItem>,
    },
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
            kind: Kind::Relay { rx, next: None },
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

/// `item` and the data frames already waiting behind it, as one frame; what cannot join them
/// is left in `next`.
fn merge_ready(
    item: RelayItem,
    rx: &mut mpsc::Receiver<RelayItem>,
    next: &mut Option<RelayItem>,
) -> RelayItem {
    let mut merged = match item.map(Frame::into_data) {
        Ok(Ok(data)) => Merged::from(data),
        Ok(Err(frame)) => return Ok(frame),
        Err(e) => return Err(e),
    };
    while !merged.is_full() {
        match rx.try_recv() {
            Ok(Ok(frame)) => match frame.into_data() {
                Ok(data) => merged.push(data),
                Err(frame) => {
                    *next = Some(Ok(frame));
                    break;
                }
            },
            Ok(Err(e)) => {
                *next = Some(Err(e));
                break;
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
        }
    }
    Ok(Frame::data(merged.take().unwrap_or_default()))
}

/// Data frames joined into one chunk of at most about [`MERGE_BYTES`]: the first kept as it
/// is, copied only once a second one joins it.
#[derive(Default)]
struct Merged {
    first: Option<Bytes>,
    joined: Option<BytesMut>,
}

impl From<Bytes> for Merged {
    fn from(data: Bytes) -> Self {
        Self {
            first: Some(data),
            joined: None,
        }
    }
}

impl Merged {
    fn push(&mut self, data: Bytes) {
        if let Some(joined) = &mut self.joined {
            joined.extend_from_slice(&data);
            return;
        }
        match self.first.take() {
            None => self.first = Some(data),
            Some(first) => {
                let mut joined = BytesMut::with_capacity((first.len() + data.len()) * 4);
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                self.joined = Some(joined);
            }
        }
    }

    fn len(&self) -> usize {
        self.joined
            .as_ref()
            .map_or_else(|| self.first.as_ref().map_or(0, Bytes::len), BytesMut::len)
    }

    /// Whether no more should join before it goes out.
    fn is_full(&self) -> bool {
        self.len() >= MERGE_BYTES
    }

    /// The chunk, if any data joined; empty again after.
    fn take(&mut self) -> Option<Bytes> {
        match self.joined.take() {
            Some(joined) => Some(joined.freeze()),
            None => self.first.take(),
        }
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
            Kind::Relay { rx, next } => match next.take() {
                Some(item) => Poll::Ready(Some(item)),
                None => rx
                    .poll_recv(cx)
                    .map(|item| item.map(|item| merge_ready(item, rx, next))),
            },
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
            Kind::Relay { .. } => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn data(text: &'static str) -> RelayItem {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    async fn next(body: &mut ProxyBody) -> Option<Result<Frame<Bytes>, BoxError>> {
        body.frame().await
    }

    #[tokio::test]
    async fn frames_already_relayed_go_out_as_one_chunk_of_the_same_bytes() {
        let (tx, rx) = mpsc::channel(8);
        let mut body = ProxyBody::relay(rx);
        for event in ["data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"] {
            tx.send(data(event)).await.expect("open");
        }
        let chunk = next(&mut body).await.expect("a frame").expect("data");
        assert_eq!(
            chunk.into_data().expect("data"),
            Bytes::from_static(b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n")
        );
        drop(tx);
        assert!(next(&mut body).await.is_none());
    }

    #[tokio::test]
    async fn a_frame_goes_out_without_waiting_for_the_next() {
        let (tx, rx) = mpsc::channel(8);
        let mut body = ProxyBody::relay(rx);
        tx.send(data("data: 1\n\n")).await.expect("open");
        let chunk = next(&mut body).await.expect("a frame").expect("data");
        assert_eq!(chunk.into_data().expect("data"), "data: 1\n\n");
        // Nothing more has come: the body waits, with the sender still open.
        let polled = tokio::time::timeout(std::time::Duration::from_millis(20), next(&mut body));
        assert!(polled.await.is_err());
        tx.send(data("data: 2\n\n")).await.expect("open");
        let chunk = next(&mut body).await.expect("a frame").expect("data");
        assert_eq!(chunk.into_data().expect("data"), "data: 2\n\n");
    }

    #[tokio::test]
    async fn an_error_behind_merged_frames_comes_after_them() {
        let (tx, rx) = mpsc::channel(8);
        let mut body = ProxyBody::relay(rx);
        tx.send(data("data: 1\n\n")).await.expect("open");
        tx.send(data("data: 2\n\n")).await.expect("open");
        tx.send(Err("upstream broke".into())).await.expect("open");
        let chunk = next(&mut body).await.expect("a frame").expect("data");
        assert_eq!(chunk.into_data().expect("data"), "data: 1\n\ndata: 2\n\n");
        let error = next(&mut body)
            .await
            .expect("an item")
            .expect_err("the error");
        assert_eq!(error.to_string(), "upstream broke");
    }

    #[tokio::test]
    async fn a_merged_chunk_stops_growing_at_the_cap() {
        let (tx, rx) = mpsc::channel(64);
        let mut body = ProxyBody::relay(rx);
        let event = Bytes::from(vec![b'x'; 16 * 1024]);
        for _ in 0..8 {
            tx.send(Ok(Frame::data(event.clone()))).await.expect("open");
        }
        drop(tx);
        let mut sizes = Vec::new();
        while let Some(frame) = next(&mut body).await {
            sizes.push(frame.expect("data").into_data().expect("data").len());
        }
        assert_eq!(sizes.iter().sum::<usize>(), 8 * event.len());
        assert!(sizes.iter().all(|&n| n <= MERGE_BYTES), "{sizes:?}");
        assert_eq!(sizes.len(), 2, "{sizes:?}");
    }
}
