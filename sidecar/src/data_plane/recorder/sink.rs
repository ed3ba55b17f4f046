//! Where the recorder puts a record: the journal first (so it survives the process), then the
//! writer's queue (so the writer need not read it back). Never waits: a full queue leaves the
//! record to the journal alone, and the writer is told to read it from there — and so does a
//! queue that holds `queue_bytes` of journal lines already, so the parsed backlog's memory is
//! bounded however far the datapool falls behind. The completions of a journaled record are
//! reported written ([`super::completions`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clawback_datapool::WriteOp;
use tokio::sync::{mpsc, Notify};

use super::journal::{Journal, Position};
use super::throttle::LogThrottle;
use super::writer::{count, Message};
use crate::data_plane::metrics::{Metrics, ReasonLabels};

/// The epoch of a record the journal could not take (its disk failed): the writer applies such
/// records as they come, outside the journal's order.
pub const UNJOURNALED: u64 = u64::MAX;

#[derive(Clone)]
pub struct Sink {
    pub journal: Arc<Journal>,
    pub queue: mpsc::Sender<Message>,
    pub spilled: Arc<Notify>,
    pub metrics: Arc<Metrics>,
    pub errors: Arc<LogThrottle>,
    /// Journal bytes of the records in the queue (the writer takes them off as it receives).
    pub queued_bytes: Arc<AtomicU64>,
    /// Most journal bytes the queue holds; past it a record is left to the journal.
    pub queue_bytes: u64,
}

impl Sink {
    /// Records `ops` as one record: in the journal when this returns (unless its disk fails).
    pub fn write(&self, ops: Vec<WriteOp>) {
        if ops.is_empty() {
            return;
        }
        let started = Instant::now();
        let at = match self.journal.append(&ops) {
            Ok(at) => {
                self.metrics
                    .journal_append
                    .observe(started.elapsed().as_secs_f64());
                at
            }
            Err(e) => {
                if let Some(failed) = self.errors.event() {
                    tracing::error!(error = %e, failed,
                        "the recorder's journal cannot be written: records wait in memory only");
                }
                Position {
                    epoch: UNJOURNALED,
                    start: 0,
                    end: 0,
                }
            }
        };
        let entries = count(&ops);
        // An unjournaled record takes no bytes: it always has room (it exists nowhere else).
        let bytes = at.bytes();
        let message = Message::Record(ops, at);
        let sent = if self.reserve(bytes) {
            self.queue.try_send(message).inspect_err(|_| {
                self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            })
        } else {
            Err(mpsc::error::TrySendError::Full(message))
        };
        match sent {
            Ok(()) => {
                self.metrics.recorder_queue.inc_by(entries);
            }
            Err(mpsc::error::TrySendError::Full(_)) if at.epoch != UNJOURNALED => {
                self.metrics.records_spilled.inc();
                self.spilled.notify_one();
            }
            // Closed: the writer stopped (shutdown); a journaled record waits for the next
            // process on this journal.
            Err(mpsc::error::TrySendError::Closed(_)) if at.epoch != UNJOURNALED => {}
            Err(_) => self.dropped("journal_and_queue_failed"),
        }
    }

    /// Takes `bytes` of the queue's `queue_bytes`; `false` (taking none) when they do not fit.
    fn reserve(&self, bytes: u64) -> bool {
        let before = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.queue_bytes && bytes > 0 {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub fn dropped(&self, reason: &'static str) {
        self.metrics
            .records_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}
