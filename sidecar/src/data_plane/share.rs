//! Fair shares: what every tenant draws on (calls in flight, Claw-R1 uids) is bounded per tenant
//! as well as in all, so one tenant at its share is refused while the others are still served.
//!
//! A tenant's share is a fraction of the whole (`limits.tenant_share`, ½ by default); a sidecar
//! that serves one tenant only gives it the whole.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawback_datapool::TenantId;

/// How much of `total` one tenant may hold: `fraction` of it, at least 1.
pub fn of(total: usize, fraction: f64) -> usize {
    ((total as f64 * fraction).ceil() as usize).clamp(1, total.max(1))
}

/// Units held per tenant, each tenant up to `limit`. Tenants holding none take no room.
#[derive(Debug)]
pub struct Counts {
    limit: usize,
    held: HashMap<TenantId, usize>,
}

impl Counts {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            held: HashMap::new(),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes one unit for `tenant`; `false` when it holds its share already.
    pub fn take(&mut self, tenant: &TenantId) -> bool {
        match self.held.get_mut(tenant) {
            Some(n) if *n >= self.limit => false,
            Some(n) => {
                *n += 1;
                true
            }
            None => {
                self.held.insert(tenant.clone(), 1);
                true
            }
        }
    }

    /// Gives one unit of `tenant`'s back.
    pub fn give_back(&mut self, tenant: &TenantId) {
        if let Some(n) = self.held.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(tenant);
            }
        }
    }

    /// Units `tenant` holds.
    pub fn held(&self, tenant: &TenantId) -> usize {
        self.held.get(tenant).copied().unwrap_or(0)
    }
}

/// Per-tenant shares of something held for a while (a call in flight): a [`Share`] is one
/// unit, given back when it drops.
#[derive(Debug)]
pub struct Shares {
    counts: Mutex<Counts>,
}

impl Shares {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            counts: Mutex::new(Counts::new(limit)),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn limit(&self) -> usize {
        self.counts().limit()
    }

    /// One unit for `tenant`, or `None` when it holds its share.
    pub fn try_take(self: &Arc<Self>, tenant: &TenantId) -> Option<Share> {
        self.counts().take(tenant).then(|| Share {
            shares: Arc::clone(self),
            tenant: tenant.clone(),
        })
    }
}

/// One unit of a tenant's share, given back on drop.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    tenant: TenantId,
}

impl Drop for Share {
    fn drop(&mut self) {
        self.shares.counts().give_back(&self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[test]
    fn a_tenant_at_its_share_is_refused_and_others_are_not() {
        let shares = Shares::new(2);
        let (alpha, bravo) = (tenant("alpha"), tenant("bravo"));
        let first = shares.try_take(&alpha).unwrap();
        let _second = shares.try_take(&alpha).unwrap();
        assert!(shares.try_take(&alpha).is_none());
        assert!(shares.try_take(&bravo).is_some());
        drop(first);
        assert!(shares.try_take(&alpha).is_some());
    }

    #[test]
    fn a_share_is_a_fraction_of_the_whole_and_at_least_one() {
        assert_eq!(of(8, 0.5), 4);
        assert_eq!(of(7, 0.5), 4);
        assert_eq!(of(1, 0.5), 1);
        assert_eq!(of(8, 1.0), 8);
        assert_eq!(of(0, 0.5), 1);
    }

    #[test]
    fn tenants_holding_nothing_take_no_room() {
        let mut counts = Counts::new(1);
        for i in 0..100 {
            let t = tenant(&format!("t{i}"));
            assert!(counts.take(&t));
            counts.give_back(&t);
        }
        assert!(counts.held.is_empty());
    }
}
