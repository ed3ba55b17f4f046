//! The batch writer: the only task that talks to the store on behalf of the request path.
//!
//! Every record is in the [`Journal`] before it is queued here; the queue only spares the writer
//! reading it back. The writer applies records in journal order: a record that arrives after a
//! gap (records the full queue could not take, or a predecessor's unfinished work) is applied
//! after the gap is read from the file, and a record it already read from the file is skipped.
//! What is queued at once is taken as one round, and the steps of all its calls go to the store
//! as one batch (one pipelined round trip on Redis). After each round the journal's checkpoint
//! moves: a process killed now resumes there.
//!
//! A write the store cannot take now (Redis out of memory or read-only with its spool failing
//! too, SQLite busy, locked or full) is retried, with a growing pause, until it is taken; the
//! checkpoint does not move past it meanwhile, so a process stopped while it waits applies it
//! again on restart. The queue fills behind it and records go to the journal only: the request
//! path never waits. A write refused for good (one that will fail the same way every time) is
//! counted and dropped — alone: a batch of several calls' steps is split and applied step by
//! step, so one bad step costs no other call's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId, WriteOp};
use tokio::sync::{mpsc, oneshot, Notify};

use super::completions::{self, Reports};
use super::journal::{Journal, Position, Record};
use super::throttle::LogThrottle;
use crate::data_plane::metrics::{Metrics, StoreErrorLabels};

pub enum Message {
    /// A record and where it lies in the journal.
    Record(Vec<WriteOp>, Position),
    /// Everything journaled before this is applied; answer, then stop.
    Close(oneshot::Sender<()>),
}

/// The writer's side of the journal: how far it has applied.
struct Applied {
    epoch: u64,
    end: u64,
}

pub struct Writer {
    pub store: Arc<dyn Store>,
    pub journal: Arc<Journal>,
    /// Rung when a record went to the journal only (the queue was full).
    pub spilled: Arc<Notify>,
    pub batch_max: usize,
    pub metrics: Arc<Metrics>,
    /// Journal bytes of the queued records ([`super::sink::Sink::write`] adds them).
    pub queued_bytes: Arc<AtomicU64>,
    /// Most journal bytes read back (and held parsed) at once.
    pub queue_bytes: u64,
    /// Told of each completion the store took, so no other replica takes it over.
    pub completions: Reports,
}

impl Writer {
    pub async fn run(self, mut queue: mpsc::Receiver<Message>) {
        let errors = LogThrottle::new(Duration::from_secs(5));
        let from = self.journal.recovered_from();
        let mut applied = Applied {
            epoch: from.epoch,
            end: from.end,
        };
        // A predecessor's unfinished work first.
        self.catch_up(&mut applied, self.journal.end(), &errors)
            .await;
        loop {
            let first = tokio::select! {
                biased;
                message = queue.recv() => match message {
                    Some(message) => message,
                    None => break,
                },
                () = self.spilled.notified() => {
                    // Records only the journal holds, with nothing queued behind them.
                    if queue.is_empty() {
                        self.catch_up(&mut applied, self.journal.end(), &errors).await;
                    }
                    continue;
                }
            };
            // Take what else is already queued, up to a batch, stopping at a close.
            let mut round = Vec::new();
            let mut close = None;
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Close(done) => {
                        close = Some(done);
                        break;
                    }
                    Message::Record(ops, at) => {
                        self.queued_bytes.fetch_sub(at.bytes(), Ordering::AcqRel);
                        round.push((ops, at));
                    }
                }
                if round.len() < self.batch_max {
                    next = queue.try_recv().ok();
                }
            }
            round.sort_by_key(|(_, at)| (at.epoch, at.start));
            let mut batch = Batch::default();
            for (ops, at) in round {
                self.metrics.recorder_queue.dec_by(count(&ops));
                if at.epoch == super::sink::UNJOURNALED {
                    ops.into_iter().for_each(|op| batch.add(op));
                    continue;
                }
                if at.epoch != applied.epoch || at.end <= applied.end {
                    // Read from the journal already, or of an epoch that was applied whole.
                    continue;
                }
                if at.start > applied.end {
                    // A gap: what the queue did not carry is applied first, in order.
                    self.apply(std::mem::take(&mut batch), &errors).await;
                    self.catch_up(&mut applied, at, &errors).await;
                    if at.end <= applied.end || at.epoch != applied.epoch {
                        continue;
                    }
                }
                ops.into_iter().for_each(|op| batch.add(op));
                applied.end = at.end;
            }
            self.apply(batch, &errors).await;
            self.settle(&mut applied).await;
            if let Some(done) = close {
                self.catch_up(&mut applied, self.journal.end(), &errors)
                    .await;
                let _ = done.send(());
                return;
            }
        }
    }

    /// Applies what the journal holds from `applied` up to `to.start` (or the end, when `to` is
    /// the journal's end), `queue_bytes` of it at a time, recording the progress after each.
    async fn catch_up(&self, applied: &mut Applied, to: Position, errors: &LogThrottle) {
        while to.epoch == applied.epoch && applied.end < to.start {
            let journal = Arc::clone(&self.journal);
            let (epoch, from, max) = (applied.epoch, applied.end, self.queue_bytes);
            // File reads on the blocking pool: the runtime's workers serve requests.
            let read =
                tokio::task::spawn_blocking(move || journal.read(epoch, from, to.start, max))
                    .await
                    .unwrap_or_else(|e| Err(self.journal.failed_task(e)));
            match read {
                Ok(Some((records, reached))) => {
                    if reached <= applied.end {
                        return;
                    }
                    let mut batch = Batch::default();
                    for Record { ops } in records {
                        self.metrics.records_replayed.inc();
                        ops.into_iter().for_each(|op| batch.add(op));
                    }
                    self.apply(batch, errors).await;
                    applied.end = reached;
                    self.settle(applied).await;
                }
                Ok(None) => return,
                Err(e) => {
                    if let Some(count) = errors.event() {
                        tracing::error!(error = %e, failed = count, "the recorder's journal cannot be read");
                    }
                    return;
                }
            }
        }
    }

    /// Persists the progress; empties the journal when all of it is applied and it is large.
    /// On the blocking pool: with `fsync` each checkpoint waits for the disk.
    async fn settle(&self, applied: &mut Applied) {
        let journal = Arc::clone(&self.journal);
        let (epoch, end) = (applied.epoch, applied.end);
        let (checkpointed, rotated) = tokio::task::spawn_blocking(move || {
            (
                journal.checkpoint(end),
                journal.rotate_if_applied(epoch, end),
            )
        })
        .await
        .unwrap_or_else(|e| (Err(self.journal.failed_task(e)), Ok(None)));
        if let Err(e) = checkpointed {
            tracing::error!(error = %e, "the journal's checkpoint cannot be written: a restart would apply records again");
        }
        match rotated {
            Ok(Some(epoch)) => {
                applied.epoch = epoch;
                applied.end = 0;
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "the journal could not be emptied"),
        }
    }

    async fn apply(&self, batch: Batch, errors: &LogThrottle) {
        for op in batch.in_order() {
            let completed = completions::completed(std::slice::from_ref(&op)).next();
            self.apply_op(op, errors).await;
            if let Some(written) = completed {
                // Gone only at shutdown: the completion is then due again, harmlessly.
                let _ = self.completions.send(written);
            }
        }
    }

    /// Applies `op`, retrying while the store cannot take it now; a batch refused for good is
    /// applied one element at a time, and only what is refused alone is dropped.
    async fn apply_op(&self, op: WriteOp, errors: &LogThrottle) {
        let mut pause = RETRY_FIRST;
        loop {
            let error = match op.apply(&*self.store).await {
                Ok(_) => {
                    if let WriteOp::AppendSteps { steps } = &op {
                        self.metrics.steps_stored.inc_by(steps.len() as u64);
                    }
                    return;
                }
                Err(e) => e,
            };
            let labels = StoreErrorLabels {
                op: op_name(&op),
                error: error.label(),
            };
            self.metrics.store_errors.get_or_create(&labels).inc();
            if error.is_transient() {
                if let Some(count) = errors.event() {
                    tracing::warn!(op = labels.op, error = %error, failed = count, retry_in = ?pause,
                        "the datapool cannot take writes now; retrying (records wait in the journal)");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
                continue;
            }
            if let Some(parts) = split(&op) {
                for part in parts {
                    Box::pin(self.apply_op(part, errors)).await;
                }
                return;
            }
            self.metrics.store_writes_lost.get_or_create(&labels).inc();
            if let Some(count) = errors.event() {
                tracing::error!(op = labels.op, error = %error, failed = count,
                    "the datapool refuses a write for good; it is dropped (see clawback_store_writes_lost_total)");
            }
            return;
        }
    }
}

/// The first pause before a write the store could not take is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A batch of several steps or evaluations as one write per element; `None` for one write.
fn split(op: &WriteOp) -> Option<Vec<WriteOp>> {
    match op {
        WriteOp::AppendSteps { steps } if steps.len() > 1 => Some(
            steps
                .iter()
                .map(|step| WriteOp::AppendSteps {
                    steps: vec![step.clone()],
                })
                .collect(),
        ),
        WriteOp::AppendEvaluations { evaluations } if evaluations.len() > 1 => Some(
            evaluations
                .iter()
                .map(|evaluation| WriteOp::AppendEvaluations {
                    evaluations: vec![evaluation.clone()],
                })
                .collect(),
        ),
        _ => None,
    }
}

/// One round of writes, regrouped so steps of many calls go to the store as one batch.
///
/// Regrouping by kind keeps every dependency the journal order had: a trajectory is created
/// before its steps, a step exists before its next state is set, and a trajectory completes
/// after its steps — within a round (creations, then steps, then next states, evaluations and
/// completions) and across rounds (a round is applied whole before the next one is taken).
#[derive(Default)]
struct Batch {
    upserts: Vec<WriteOp>,
    steps: Vec<clawback_datapool::EncodedStep>,
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

    /// The round's writes in dependency order; steps and evaluations one write per tenant, so
    /// a write that is retried is one the store takes whole or not at all.
    fn in_order(self) -> Vec<WriteOp> {
        let mut ops = self.upserts;
        ops.extend(
            per_tenant(self.steps, |s| s.tenant())
                .into_iter()
                .map(|steps| WriteOp::AppendSteps { steps }),
        );
        ops.extend(self.next_states);
        ops.extend(
            per_tenant(self.evaluations, |e| &e.tenant)
                .into_iter()
                .map(|evaluations| WriteOp::AppendEvaluations { evaluations }),
        );
        ops.extend(self.completions);
        ops
    }
}

/// `items` grouped by tenant, each group in the order the items came.
fn per_tenant<T>(items: Vec<T>, tenant: impl Fn(&T) -> &TenantId) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    for item in items {
        match groups.iter_mut().find(|g| tenant(&g[0]) == tenant(&item)) {
            Some(group) => group.push(item),
            None => groups.push(vec![item]),
        }
    }
    groups
}

/// Queue entries a record stands for (a coalesced batch stands for each of its steps).
pub fn count(ops: &[WriteOp]) -> i64 {
    ops.iter()
        .map(|op| match op {
            WriteOp::AppendSteps { steps } => i64::try_from(steps.len()).unwrap_or(i64::MAX),
            _ => 1,
        })
        .sum()
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
