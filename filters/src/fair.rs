//! Each tenant's share of the plugin queue and of the plugin calls running at once: one tenant's
//! steps behind a slow plugin (or judge) fill only its own share, and the others' are still
//! admitted and run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use clawback_datapool::TenantId;
use tokio::sync::Semaphore;

/// Places in the plugins' queue, per tenant: who may queue one more job. The host's own
/// [`FixedShare`] gives each tenant a fixed number; the sidecar's shares shrink as more tenants
/// are active.
pub trait QueueShares: Send + Sync {
    /// Takes a place for `tenant`; `false` when it may not have one more now.
    fn take(&self, tenant: &TenantId) -> bool;
    /// Gives one of `tenant`'s places back.
    fn give_back(&self, tenant: &TenantId);
}

/// At most `places` queued per tenant, whatever the others hold.
pub struct FixedShare {
    places: usize,
    held: Mutex<HashMap<TenantId, usize>>,
}

impl FixedShare {
    pub fn new(places: usize) -> Arc<Self> {
        Arc::new(Self {
            places: places.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<TenantId, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl QueueShares for FixedShare {
    fn take(&self, tenant: &TenantId) -> bool {
        let mut held = self.held();
        let n = held.entry(tenant.clone()).or_insert(0);
        if *n >= self.places {
            return false;
        }
        *n += 1;
        true
    }

    fn give_back(&self, tenant: &TenantId) {
        let mut held = self.held();
        if let Some(n) = held.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(tenant);
            }
        }
    }
}

/// What one tenant may hold of the plugins' work.
#[derive(Clone)]
pub struct TenantShare {
    /// Jobs queued (waiting or running), of `queue_capacity`.
    pub queued: Arc<dyn QueueShares>,
    /// Jobs running at once, of `max_concurrency`.
    pub running: usize,
}

/// The jobs one tenant has queued, and the semaphore they run under.
struct Held {
    queued: usize,
    /// Its jobs running at once; a job waits here before it takes a plugin permit.
    running: Arc<Semaphore>,
}

pub(crate) struct Fair {
    queue: Arc<dyn QueueShares>,
    run_share: usize,
    tenants: Mutex<HashMap<TenantId, Held>>,
}

impl Fair {
    pub(crate) fn new(share: TenantShare) -> Self {
        Self {
            queue: share.queued,
            run_share: share.running.max(1),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    fn tenants(&self) -> MutexGuard<'_, HashMap<TenantId, Held>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits one more job of `tenant`: the semaphore it runs under, or `None` when the tenant
    /// may not queue one more now. Every admitted job is [`Fair::leave`]n once.
    pub(crate) fn admit(&self, tenant: &TenantId) -> Option<Arc<Semaphore>> {
        let mut tenants = self.tenants();
        if !self.queue.take(tenant) {
            return None;
        }
        let held = tenants.entry(tenant.clone()).or_insert_with(|| Held {
            queued: 0,
            running: Arc::new(Semaphore::new(self.run_share)),
        });
        held.queued += 1;
        Some(Arc::clone(&held.running))
    }

    /// One job of `tenant` is done; a tenant with none left takes no room.
    pub(crate) fn leave(&self, tenant: &TenantId) {
        let mut tenants = self.tenants();
        if let Some(held) = tenants.get_mut(tenant) {
            self.queue.give_back(tenant);
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
            queued: FixedShare::new(2),
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
