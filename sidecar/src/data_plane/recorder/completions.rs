//! Reporting completions written: once the store took a trajectory's completion, the session
//! state is told, so no other replica takes it over when its lease runs out
//! ([`clawback_datapool::Sessions::overdue_completions`]). Off the request path, in batches.

use std::collections::BTreeMap;
use std::sync::Arc;

use clawback_datapool::{TenantId, TrajectoryId, WriteOp};
use tokio::sync::mpsc;

use crate::data_plane::session::SessionState;

/// Most completions reported in one round.
const BATCH: usize = 1024;

/// Where the sink reports the completions it journaled.
pub type Reports = mpsc::UnboundedSender<(TenantId, TrajectoryId)>;

/// The completions among `ops`.
pub fn completed(ops: &[WriteOp]) -> impl Iterator<Item = (TenantId, TrajectoryId)> + '_ {
    ops.iter().filter_map(|op| match op {
        WriteOp::CompleteTrajectory { request } => {
            Some((request.tenant.clone(), request.trajectory))
        }
        _ => None,
    })
}

/// Reports what arrives on `rx` to `sessions`, a tenant at a time, until every sender is gone.
pub async fn report(
    sessions: Arc<SessionState>,
    mut rx: mpsc::UnboundedReceiver<(TenantId, TrajectoryId)>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut by_tenant: BTreeMap<TenantId, Vec<TrajectoryId>> = BTreeMap::new();
        for (tenant, trajectory) in batch.drain(..) {
            by_tenant.entry(tenant).or_default().push(trajectory);
        }
        for (tenant, trajectories) in by_tenant {
            sessions.completions_written(&tenant, &trajectories).await;
        }
    }
}
