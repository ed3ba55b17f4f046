//! The batch writer: the only task that talks to the store on behalf of the request path.
//!
//! Writes arrive in order on a bounded queue; what is queued at once is taken as one round, and
//! the steps of all its calls go to the store as one batch (one pipelined round trip on Redis). A write that fails is counted and logged and
//! dropped — a `SpooledStore` has already kept it through a Redis outage, so a failure here
//! means both Redis and the spool failed.

use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, WriteOp};
use tokio::sync::{mpsc, oneshot};

use super::overflow::Overflow;
use super::throttle::LogThrottle;
use crate::metrics::{Metrics, StoreErrorLabels};

pub enum Message {
    Write(WriteOp),
    /// Everything sent before this is applied; answer, then stop.
    Close(oneshot::Sender<()>),
}

pub async fn run(
    store: Arc<dyn Store>,
    mut queue: mpsc::Receiver<Message>,
    overflow: Arc<Overflow>,
    batch_max: usize,
    metrics: Arc<Metrics>,
) {
    let errors = LogThrottle::new(Duration::from_secs(5));
    loop {
        // The journal's writes are newer than every queued one and older than any queued after
        // it is taken: it is applied once the queue is empty.
        if queue.is_empty() && overflow.is_spilling() {
            drain_overflow(&*store, &overflow, &metrics, &errors).await;
        }
        let Some(first) = queue.recv().await else {
            break;
        };
        // Take what else is already queued, up to a batch, stopping at a close.
        let mut batch = Batch::default();
        let mut close = None;
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(message) = next.take() {
            match message {
                Message::Close(done) => {
                    close = Some(done);
                    break;
                }
                Message::Write(op) => batch.add(op),
            }
            taken += 1;
            if taken < batch_max {
                next = queue.try_recv().ok();
            }
        }
        for op in batch.in_order() {
            metrics.recorder_queue.dec_by(count(&op));
            apply(&*store, op, &metrics, &errors).await;
        }
        if let Some(done) = close {
            drain_overflow(&*store, &overflow, &metrics, &errors).await;
            let _ = done.send(());
            return;
        }
    }
}

async fn drain_overflow(
    store: &dyn Store,
    overflow: &Overflow,
    metrics: &Metrics,
    errors: &LogThrottle,
) {
    match overflow.drain() {
        Ok((ops, unreadable)) => {
            if unreadable > 0 {
                tracing::error!(
                    unreadable,
                    "lines of the recorder's overflow journal could not be read (a process killed mid-write)"
                );
                for _ in 0..unreadable {
                    metrics
                        .records_dropped
                        .get_or_create(&crate::metrics::ReasonLabels {
                            reason: "overflow_unreadable",
                        })
                        .inc();
                }
            }
            // Regrouped into batches as the queue's writes are, a batch at a time.
            let mut batch = Batch::default();
            for op in ops {
                batch.add(op);
            }
            for op in batch.in_order() {
                apply(store, op, metrics, errors).await;
            }
        }
        Err(e) => {
            if let Some(count) = errors.event() {
                tracing::error!(error = %e, failed = count, "the recorder's overflow journal cannot be read");
            }
        }
    }
}

/// One round of writes, regrouped so steps of many calls go to the store as one batch.
///
/// Regrouping by kind keeps every dependency the queue order had: a trajectory is created
/// before its steps, a step exists before its next state is set, and a trajectory completes
/// after its steps — within a round (creations, then steps, then next states, evaluations and
/// completions) and across rounds (a round is applied whole before the next one is taken).
#[derive(Default)]
struct Batch {
    upserts: Vec<WriteOp>,
    steps: Vec<clawback_datapool::Step>,
    next_states: Vec<WriteOp>,
    evaluations: Vec<clawback_datapool::Evaluation>,
    completions: Vec<WriteOp>,
}

impl Batch {
    fn add(&mut self, op: WriteOp) {
        match op {
            WriteOp::UpsertTrajectory { .. } => self.upserts.push(op),
            WriteOp::AppendSteps { steps } => self.steps.extend(steps),
            WriteOp::SetNextState { .. } => self.next_states.push(op),
            WriteOp::AppendEvaluations { evaluations } => self.evaluations.extend(evaluations),
            WriteOp::CompleteTrajectory { .. } => self.completions.push(op),
        }
    }

    fn in_order(self) -> Vec<WriteOp> {
        let mut ops = self.upserts;
        if !self.steps.is_empty() {
            ops.push(WriteOp::AppendSteps { steps: self.steps });
        }
        ops.extend(self.next_states);
        if !self.evaluations.is_empty() {
            ops.push(WriteOp::AppendEvaluations {
                evaluations: self.evaluations,
            });
        }
        ops.extend(self.completions);
        ops
    }
}

/// Queue entries an op stands for (a coalesced batch stands for each of its steps).
pub fn count(op: &WriteOp) -> i64 {
    match op {
        WriteOp::AppendSteps { steps } => i64::try_from(steps.len()).unwrap_or(i64::MAX),
        _ => 1,
    }
}

fn op_name(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::UpsertTrajectory { .. } => "upsert_trajectory",
        WriteOp::AppendSteps { .. } => "append_steps",
        WriteOp::SetNextState { .. } => "set_next_state",
        WriteOp::AppendEvaluations { .. } => "append_evaluations",
        WriteOp::CompleteTrajectory { .. } => "complete_trajectory",
    }
}

async fn apply(store: &dyn Store, op: WriteOp, metrics: &Metrics, errors: &LogThrottle) {
    match op.apply(store).await {
        Ok(_) => {
            if let WriteOp::AppendSteps { steps } = &op {
                metrics.steps_stored.inc_by(steps.len() as u64);
            }
        }
        Err(e) => {
            let labels = StoreErrorLabels {
                op: op_name(&op),
                error: e.label(),
            };
            metrics.store_errors.get_or_create(&labels).inc();
            if let Some(count) = errors.event() {
                tracing::error!(op = labels.op, error = %e, failed = count,
                    "the datapool refuses writes; they are lost (see clawback_store_errors_total)");
            }
        }
    }
}
