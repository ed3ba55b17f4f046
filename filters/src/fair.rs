//! Each tenant's share of the plugin queue and of the plugin calls running at once: one tenant's
//! steps behind a slow plugin (or judge) fill only its own share, and the others' are still
//! admitted and run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use clawback_datapool::TenantId;
use tokio::sync::Semaphore;

/// What one tenant holds.
struct Held {
    queued: usize,
    /// Its jobs running at once; a job waits here before it takes a plugin permit.
    running: Arc<Semaphore>,
}

/// What one tenant may hold of the plugins' work.
#[derive(Debug, Clone, Copy)]
pub struct TenantShare {
    /// Jobs queued (waiting or running), of `queue_capacity`.
    pub queued: usize,
    /// Jobs running at once, of `max_concurrency`.
    pub running: usize,
}

pub(crate) struct Fair {
    queue_share: usize,
    run_share: usize,
    tenants: Mutex<HashMap<TenantId, Held>>,
}

impl Fair {
    pub(crate) fn new(share: TenantShare) -> Self {
        Self {
            queue_share: share.queued.max(1),
            run_share: share.running.max(1),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    fn tenants(&self) -> MutexGuard<'_, HashMap<TenantId, Held>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits one more job of `tenant`: the semaphore it runs under, or `None` when the tenant
    /// has its share queued. Every admitted job is [`Fair::leave`]n once.
    pub(crate) fn admit(&self, tenant: &TenantId) -> Option<Arc<Semaphore>> {
        let mut tenants = self.tenants();
        let held = tenants.entry(tenant.clone()).or_insert_with(|| Held {
            queued: 0,
            running: Arc::new(Semaphore::new(self.run_share)),
        });
        if held.queued >= self.queue_share {
            return None;
        }
        held.queued += 1;
        Some(Arc::clone(&held.running))
    }

    /// One job of `tenant` is done; a tenant with none left takes no room.
    pub(crate) fn leave(&self, tenant: &TenantId) {
        let mut tenants = self.tenants();
        if let Some(held) = tenants.get_mut(tenant) {
            held.queued = held.queued.saturating_sub(1);
            if held.queued == 0 {
                tenants.remove(tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_share_is_refused_and_leaving_frees_it() {
        let fair = Fair::new(TenantShare {
            queued: 2,
            running: 1,
        });
        let (alpha, bravo) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
        assert!(fair.admit(&alpha).is_some());
        assert!(fair.admit(&alpha).is_some());
        assert!(fair.admit(&alpha).is_none());
        assert!(fair.admit(&bravo).is_some());
        fair.leave(&alpha);
        assert!(fair.admit(&alpha).is_some());
        for _ in 0..2 {
            fair.leave(&alpha);
        }
        fair.leave(&bravo);
        assert!(fair.tenants().is_empty());
    }
}
