//! The task that reads an upstream response body to its end and hands each frame to the client
//! as it arrives.
//!
//! It runs detached from the client's connection on purpose: an agent that disconnects mid-stream
//! must not cancel the upstream call, because the completed call is what gets recorded. Once the
//! client is gone the body is still driven to the end, bounded by `orphan_drain`.
//!
//! A recorded answer's end reaches the agent only once its step is recorded (numbered in the
//! shared session state, in the journal): from the event that tells a client its answer is
//! whole (`[DONE]`, `message_stop`, `response.completed`) on, frames are held until the record
//! is written — and a plain body's last frame with them. So a process killed at any moment loses
//! no answer an agent has, and the agent's next call, on any replica, finds this one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::data_plane::body::RelayItem;
use crate::data_plane::error::error_json;
use crate::data_plane::metrics::{Metrics, UpstreamLabels};
use crate::data_plane::upstream::{Failure, HealthChange, InFlight, Pool};

/// Frames buffered between the upstream and a slow client before the relay waits for the client.
pub const RELAY_CAPACITY: usize = 64;

/// How a relayed body ended; the recorder will use this to decide what a step is worth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEnd {
    Complete,
    UpstreamFailed(String),
    UpstreamIdle,
    AbandonedAfterClientLeft,
    /// The client left while `limits.max_orphaned_calls` orphans were already draining.
    OrphanCut,
}

/// What a tap does with a response once its body has ended; the relay awaits it before the
/// agent sees the end of the answer.
pub type Record = Box<dyn FnOnce(Recorded) -> BoxFuture<'static, ()> + Send + Sync>;

/// The recording side of a relay: the capture that strips what the sidecar injected and
/// assembles the response, and what to do with the result once the body has ended.
pub struct Tap {
    pub capture: crate::data_plane::capture::ResponseCapture,
    /// `None`: the answer is only translated, nothing is recorded.
    pub record: Option<Record>,
}

impl Tap {
    /// A tap that translates the answer and records nothing.
    pub fn translating(capture: crate::data_plane::capture::Capture, is_sse: bool) -> Self {
        Self {
            capture: capture.response(is_sse),
            record: None,
        }
    }
}

/// What a tapped relay hands to its recorder when the body has ended.
pub struct Recorded {
    pub assembled: crate::data_plane::capture::Assembled,
    pub end: RelayEnd,
    /// When the first body bytes arrived from the upstream.
    pub first_byte_at: Option<clawback_datapool::UnixMs>,
    /// The body was larger than the step cap: only its beginning was assembled.
    pub truncated: bool,
}

pub struct Relay<B> {
    pub body: B,
    pub tap: Option<Tap>,
    pub tx: mpsc::Sender<RelayItem>,
    /// Server-sent events get an OpenAI error event when the upstream breaks mid-stream.
    pub is_sse: bool,
    pub idle: Duration,
    /// Longest a client may take to accept the next frame before it counts as gone.
    pub client_write: Duration,
    /// Closes the client's connection when it stops reading.
    pub connection: Option<crate::data_plane::server::Abandon>,
    pub orphan_drain: Duration,
    /// Permits for orphans: a call whose client leaves takes one (and one of its tenant's
    /// share), or is cut off.
    pub orphans: crate::data_plane::forward::Orphans,
    /// The tenant the call is served for, when known.
    pub tenant: Option<clawback_datapool::TenantId>,
    pub in_flight: InFlight,
    pub pool: Arc<Pool>,
    pub metrics: Arc<Metrics>,
    /// Whether what the client got so far ends on an SSE event boundary.
    pub at_event_boundary: bool,
    /// The client's API: the error event of a broken stream is in its shape.
    pub dialect: crate::data_plane::route::Dialect,
}

/// An orphan's place: one of all orphans' permits and one of its tenant's share.
pub struct Orphan {
    _permit: OwnedSemaphorePermit,
    _share: Option<crate::data_plane::share::Share>,
}

impl<B> Relay<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    pub async fn run(mut self) -> RelayEnd {
        let mut client_gone_deadline: Option<Instant> = None;
        let mut orphan_permit = None;
        let mut first_byte_at = None;
        // Frames that wait for the record (see the module docs).
        let mut held: Vec<Frame<Bytes>> = Vec::new();
        // One timer for the whole body, moved only when it fires: a frame costs no timer of
        // its own. It fires at the idle limit after the last frame, or at the orphan's drain
        // limit, whichever comes first.
        let mut last_frame = Instant::now();
        let timer = tokio::time::sleep(self.idle);
        tokio::pin!(timer);
        // A client that leaves while the engine is silent (a long prefill, a slow token) is an
        // orphan from that moment, not from the next frame.
        let client = self.tx.clone();
        let client_left = client.closed();
        tokio::pin!(client_left);
        let end = loop {
            let polled = tokio::select! {
                biased;
                polled = self.body.frame() => polled,
                () = &mut client_left, if client_gone_deadline.is_none() => {
                    match self.orphaned() {
                        Ok(permit) => orphan_permit = Some(permit),
                        Err(end) => break end,
                    }
                    let deadline = Instant::now() + self.orphan_drain;
                    client_gone_deadline = Some(deadline);
                    timer.as_mut().reset(deadline.min(last_frame + self.idle));
                    continue;
                }
                () = &mut timer => {
                    let now = Instant::now();
                    if client_gone_deadline.is_some_and(|d| now >= d) {
                        break RelayEnd::AbandonedAfterClientLeft;
                    }
                    let idle_at = last_frame + self.idle;
                    if now >= idle_at {
                        break RelayEnd::UpstreamIdle;
                    }
                    timer
                        .as_mut()
                        .reset(client_gone_deadline.map_or(idle_at, |d| d.min(idle_at)));
                    continue;
                }
            };
            last_frame = Instant::now();
            let frame = match polled {
                Some(Ok(frame)) => frame,
                None => break RelayEnd::Complete,
                Some(Err(e)) => break RelayEnd::UpstreamFailed(e.to_string()),
            };
            first_byte_at.get_or_insert_with(clawback_datapool::UnixMs::now);
            let Some(frame) = self.pass(frame, &mut held) else {
                continue;
            };
            if let Err(end) = self
                .deliver(frame, &mut client_gone_deadline, &mut orphan_permit)
                .await
            {
                break end;
            }
            // A client found gone here drains as an orphan: the timer keeps its limit too.
            if let Some(deadline) = client_gone_deadline.filter(|d| *d < timer.deadline()) {
                timer.as_mut().reset(deadline);
            }
        };
        if let Some(tap) = self.tap.take() {
            let finished = tap.capture.finish();
            if let Some(record) = tap.record {
                record(Recorded {
                    assembled: finished.assembled,
                    end: end.clone(),
                    first_byte_at,
                    truncated: finished.truncated,
                })
                .await;
            }
            held.extend(finished.tail.map(Frame::data));
            if client_gone_deadline.is_none() {
                for frame in held.drain(..) {
                    let sent =
                        tokio::time::timeout(self.client_write, self.tx.send(Ok(frame))).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        break;
                    }
                }
            }
        }
        self.finish(&end).await;
        drop(orphan_permit);
        end
    }

    /// What of an upstream frame goes to the client now: stripped or translated by the tap,
    /// or `None` when nothing does (all of it stripped, or held for the record).
    fn pass(&mut self, frame: Frame<Bytes>, held: &mut Vec<Frame<Bytes>>) -> Option<Frame<Bytes>> {
        let frame = match (&mut self.tap, frame.into_data()) {
            (Some(tap), Ok(data)) => Frame::data(tap.capture.on_frame(&data).bytes(data)?),
            (None, Ok(data)) => Frame::data(data),
            (_, Err(frame)) => frame,
        };
        self.at_event_boundary = frame.data_ref().is_none_or(|d| d.ends_with(b"\n\n"));
        match self.tap.as_ref().filter(|tap| tap.record.is_some()) {
            // A stream's end, and whatever follows it, waits for the record.
            Some(tap) if self.is_sse && (tap.capture.answered() || !held.is_empty()) => {
                held.push(frame);
                None
            }
            // A plain body goes out one frame behind: its last frame waits for the record.
            Some(_) if !self.is_sse => {
                let previous = held.pop();
                held.push(frame);
                previous
            }
            _ => Some(frame),
        }
    }

    /// Hands a frame to the client's connection. A client that does not take it within
    /// `client_write` (its socket full), or is gone, makes the call an orphan; `Err` when the
    /// relay stops here.
    async fn deliver(
        &mut self,
        frame: Frame<Bytes>,
        client_gone_deadline: &mut Option<Instant>,
        orphan_permit: &mut Option<Orphan>,
    ) -> Result<(), RelayEnd> {
        match client_gone_deadline {
            None => {
                // Most frames find room at once: no timer for those.
                let frame = match self.tx.try_send(Ok(frame)) {
                    Ok(()) => return Ok(()),
                    Err(
                        mpsc::error::TrySendError::Full(item)
                        | mpsc::error::TrySendError::Closed(item),
                    ) => item,
                };
                let delivered = tokio::time::timeout(self.client_write, self.tx.send(frame)).await;
                if delivered.is_err() {
                    if let Some(connection) = &self.connection {
                        connection.abandon();
                    }
                }
                if !matches!(delivered, Ok(Ok(()))) {
                    *orphan_permit = Some(self.orphaned()?);
                    *client_gone_deadline = Some(Instant::now() + self.orphan_drain);
                }
                Ok(())
            }
            Some(deadline) if Instant::now() >= *deadline => {
                Err(RelayEnd::AbandonedAfterClientLeft)
            }
            Some(_) => Ok(()),
        }
    }

    /// The client left: the call drains as an orphan if a permit for one is free, else it is
    /// cut off here.
    fn orphaned(&self) -> Result<Orphan, RelayEnd> {
        let share = match &self.tenant {
            Some(tenant) => match self.orphans.per_tenant.try_take(tenant) {
                Some(share) => Some(share),
                None => {
                    self.metrics.orphans_cut.inc();
                    return Err(RelayEnd::OrphanCut);
                }
            },
            None => None,
        };
        match Arc::clone(&self.orphans.all).try_acquire_owned() {
            Ok(permit) => {
                self.metrics.orphaned_streams.inc();
                Ok(Orphan {
                    _permit: permit,
                    _share: share,
                })
            }
            Err(_) => {
                self.metrics.orphans_cut.inc();
                Err(RelayEnd::OrphanCut)
            }
        }
    }

    async fn finish(&self, end: &RelayEnd) {
        let upstream = self.in_flight.upstream();
        let message = match end {
            RelayEnd::Complete => return,
            RelayEnd::AbandonedAfterClientLeft => {
                tracing::warn!(upstream = %upstream.name, drain = ?self.orphan_drain,
                    "stopped reading an orphaned upstream response at the drain limit");
                return;
            }
            RelayEnd::OrphanCut => {
                tracing::warn!(upstream = %upstream.name,
                    "cut off an upstream call whose client left: limits.max_orphaned_calls are draining");
                return;
            }
            RelayEnd::UpstreamFailed(reason) => {
                if self.pool.report_failure(upstream, Failure::Gateway) == HealthChange::Ejected {
                    self.metrics
                        .ejections
                        .get_or_create(&UpstreamLabels::new(&upstream.name))
                        .inc();
                }
                format!(
                    "upstream {} broke off the response: {reason}",
                    upstream.name
                )
            }
            RelayEnd::UpstreamIdle => format!(
                "upstream {} sent nothing for {:?} mid-response",
                upstream.name, self.idle
            ),
        };
        tracing::warn!(upstream = %upstream.name, "{message}");
        // The head is already sent, so the status can't change. A stream gets a final event
        // in its API's error shape (the SDKs raise it); a plain body is cut so the client sees a
        // transfer error rather than truncated JSON it might accept.
        let item: RelayItem = if self.is_sse {
            // A half-sent event is ended first, so the error arrives as an event of its own.
            let separator = if self.at_event_boundary { "" } else { "\n\n" };
            let event = match self.dialect {
                crate::data_plane::route::Dialect::OpenAi => format!(
                    "{separator}data: {}\n\n",
                    error_json(&message, "upstream_error", "upstream_stream_broken")
                ),
                crate::data_plane::route::Dialect::Anthropic => format!(
                    "{separator}{}",
                    crate::data_plane::anthropic::stream::error_event(&message)
                ),
            };
            Ok(Frame::data(Bytes::from(event)))
        } else {
            Err(message.into())
        };
        let _ = tokio::time::timeout(self.client_write, self.tx.send(item)).await;
    }
}
