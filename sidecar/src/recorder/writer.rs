//! The batch writer: the only task that talks to the store on behalf of the request path.
//!
//! Writes arrive in order on a bounded queue; consecutive step appends are coalesced into one
//! batch (one pipelined round trip on Redis). A write that fails is counted and logged and
//! dropped — a `SpooledStore` has already kept it through a Redis outage, so a failure here
//! means both Redis and the spool failed.

use std::sync::Arc;

use clawback_datapool::{Store, WriteOp};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::{Metrics, StoreErrorLabels};

pub enum Message {
    Write(WriteOp),
    /// Everything sent before this is applied; answer, then stop.
    Close(oneshot::Sender<()>),
}

pub async fn run(
    store: Arc<dyn Store>,
    mut queue: mpsc::Receiver<Message>,
    batch_max: usize,
    metrics: Arc<Metrics>,
) {
    let mut held: Option<Message> = None;
    loop {
        let message = match held.take() {
            Some(message) => message,
            None => match queue.recv().await {
                Some(message) => message,
                None => return,
            },
        };
        let op = match message {
            Message::Close(done) => {
                let _ = done.send(());
                return;
            }
            Message::Write(WriteOp::AppendSteps { mut steps }) => {
                while steps.len() < batch_max {
                    match queue.try_recv() {
                        Ok(Message::Write(WriteOp::AppendSteps { steps: more })) => {
                            steps.extend(more)
                        }
                        Ok(other) => {
                            held = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                WriteOp::AppendSteps { steps }
            }
            Message::Write(op) => op,
        };
        metrics.recorder_queue.dec_by(count(&op));
        apply(&*store, op, &metrics).await;
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

async fn apply(store: &dyn Store, op: WriteOp, metrics: &Metrics) {
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
            tracing::error!(op = labels.op, error = %e, "the datapool refused a write; it is lost");
        }
    }
}
