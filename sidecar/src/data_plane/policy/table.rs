//! The tenant → live policy table: read on every model call without a lock, written only by the
//! syncer when the datapool reports a switch.
//!
//! Each live policy carries the count of calls in flight on it. A call takes a [`Lease`], which
//! holds the count up until the call's response has ended; a replaced policy stays visible (as
//! "retired") for as long as a lease on it lives, so the publisher can wait for its count to reach
//! zero before unloading the adapter from the backends.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arc_swap::ArcSwap;
use clawback_datapool::{PolicyRef, PolicyVersion, TenantId};
use tokio::sync::Notify;

use crate::data_plane::metrics::{Metrics, TenantLabels};

/// A live (or retired) policy and the calls in flight on it.
#[derive(Debug)]
pub struct LivePolicy {
    pub policy: PolicyVersion,
    in_flight: AtomicU64,
}

/// One call's hold on the policy that serves it; the in-flight count drops when it does.
#[derive(Debug)]
pub struct Lease {
    live: Arc<LivePolicy>,
}

impl Lease {
    pub fn policy(&self) -> &PolicyVersion {
        &self.live.policy
    }

    /// What the recorded step carries.
    pub fn policy_ref(&self) -> PolicyRef {
        self.live.policy.policy_ref()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.live.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the table knows of a tenant.
#[derive(Debug)]
pub enum Lookup {
    /// No live policy: the base model serves it.
    Base,
    Live(Lease),
}

/// `None`: the datapool was asked and the tenant has no policy.
type Slot = Option<Arc<LivePolicy>>;

/// What [`PolicyTable::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The tenant now routes to the new version.
    Switched,
    /// Nothing changed: the same version, or the tenant still has none.
    Unchanged,
    /// The version is older than the live one and was ignored: routing never goes back.
    Stale,
}

pub struct PolicyTable {
    live: ArcSwap<HashMap<TenantId, Slot>>,
    /// Serialises writers; readers never take it.
    writing: Mutex<()>,
    /// Replaced policies; weak, so one disappears when its last lease ends.
    retired: Mutex<Vec<Weak<LivePolicy>>>,
    /// Tenants a call asked about before the table knew them; the syncer loads them.
    unknown: Mutex<HashSet<TenantId>>,
    pub(crate) wake: Notify,
    metrics: Arc<Metrics>,
}

/// What `GET /admin/policies` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    /// Every tenant's live policy, by tenant.
    pub policies: Vec<PolicyVersion>,
    /// Calls in flight per adapter name, live ones and replaced ones that still have calls. An
    /// adapter that is not listed has none.
    pub in_flight: BTreeMap<String, u64>,
}

/// A call retries its lease this often when switches race it, then takes the one it holds.
const LEASE_ATTEMPTS: usize = 4;

impl PolicyTable {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            live: ArcSwap::from_pointee(HashMap::new()),
            writing: Mutex::new(()),
            retired: Mutex::new(Vec::new()),
            unknown: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            metrics,
        }
    }

    /// The policy that serves a call of `tenant` now, held until the lease drops.
    ///
    /// The count is raised before the table is read a second time: a call that raced a switch
    /// either shows in the old policy's count (which the publisher then waits for) or moves to
    /// the new policy — it never runs on an adapter the publisher already saw drained.
    pub fn lease(&self, tenant: &TenantId) -> Lookup {
        let mut held = None;
        for _ in 0..LEASE_ATTEMPTS {
            let Some(live) = self.current(tenant) else {
                return Lookup::Base;
            };
            live.in_flight.fetch_add(1, Ordering::SeqCst);
            let lease = Lease { live };
            let still_live = self
                .current(tenant)
                .is_some_and(|now| Arc::ptr_eq(&now, &lease.live));
            if still_live {
                return Lookup::Live(lease);
            }
            held = Some(lease);
        }
        held.map_or(Lookup::Base, Lookup::Live)
    }

    /// The live policy of `tenant`; asks the syncer to load a tenant the table has not seen.
    pub fn current(&self, tenant: &TenantId) -> Option<Arc<LivePolicy>> {
        match self.live.load().get(tenant) {
            Some(slot) => slot.clone(),
            None => {
                if lock(&self.unknown).insert(tenant.clone()) {
                    self.wake.notify_one();
                }
                None
            }
        }
    }

    /// Makes what the datapool reports for `tenant` live, unless the table already has it or a
    /// newer version. `None` (the datapool has no policy) never replaces a live policy: a tenant
    /// does not fall back to the base model because its key went missing.
    pub fn apply(&self, tenant: &TenantId, reported: Option<PolicyVersion>) -> Applied {
        let _writer = lock(&self.writing);
        let map = self.live.load_full();
        let current = map.get(tenant);
        let Some(reported) = reported else {
            if current.is_some() {
                return Applied::Unchanged;
            }
            let mut next = HashMap::clone(&map);
            next.insert(tenant.clone(), None);
            self.live.store(Arc::new(next));
            lock(&self.unknown).remove(tenant);
            return Applied::Unchanged;
        };
        if let Some(Some(live)) = current {
            if reported.version < live.policy.version {
                return Applied::Stale;
            }
            if reported.version == live.policy.version {
                return Applied::Unchanged;
            }
        }
        let version = reported.version;
        let fresh = Arc::new(LivePolicy {
            policy: reported,
            in_flight: AtomicU64::new(0),
        });
        let mut next = HashMap::clone(&map);
        let replaced = next.insert(tenant.clone(), Some(fresh)).flatten();
        self.live.store(Arc::new(next));
        lock(&self.unknown).remove(tenant);
        if let Some(old) = replaced {
            let mut retired = lock(&self.retired);
            retired.retain(|weak| weak.strong_count() > 0);
            retired.push(Arc::downgrade(&old));
        }
        let labels = TenantLabels::new(tenant);
        self.metrics.policy_switches.get_or_create(&labels).inc();
        self.metrics
            .policy_version
            .get_or_create(&labels)
            .set(i64::try_from(version).unwrap_or(i64::MAX));
        Applied::Switched
    }

    /// Tenants the table knows, with or without a policy.
    pub fn known(&self) -> Vec<TenantId> {
        self.live.load().keys().cloned().collect()
    }

    /// Tenants calls asked about that the table does not know yet.
    pub fn unknown(&self) -> Vec<TenantId> {
        lock(&self.unknown).iter().cloned().collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        let map = self.live.load_full();
        let mut policies: Vec<PolicyVersion> = map
            .values()
            .flatten()
            .map(|live| live.policy.clone())
            .collect();
        policies.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        let mut in_flight = BTreeMap::new();
        let retired: Vec<Arc<LivePolicy>> = lock(&self.retired)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for live in map.values().flatten().chain(retired.iter()) {
            *in_flight.entry(live.policy.adapter.clone()).or_insert(0) +=
                live.in_flight.load(Ordering::SeqCst);
        }
        Snapshot {
            policies,
            in_flight,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawback_datapool::{UnixMs, SCHEMA_VERSION};

    fn tenant() -> TenantId {
        TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"))
    }

    fn version(n: u64) -> PolicyVersion {
        PolicyVersion {
            schema_version: SCHEMA_VERSION,
            tenant: tenant(),
            adapter: format!("acme@v{n}"),
            version: n,
            live_since: UnixMs::now(),
        }
    }

    fn table() -> PolicyTable {
        PolicyTable::new(Arc::new(Metrics::new()))
    }

    fn leased_adapter(table: &PolicyTable) -> Option<String> {
        match table.lease(&tenant()) {
            Lookup::Base => None,
            Lookup::Live(lease) => Some(lease.policy().adapter.clone()),
        }
    }

    #[test]
    fn an_unknown_tenant_is_served_by_the_base_and_queued_for_loading() {
        let table = table();
        assert_eq!(leased_adapter(&table), None);
        assert_eq!(table.unknown(), vec![tenant()]);
        table.apply(&tenant(), None);
        assert!(table.unknown().is_empty());
        assert_eq!(table.known(), vec![tenant()]);
    }

    #[test]
    fn versions_only_move_forward() {
        let table = table();
        assert_eq!(table.apply(&tenant(), Some(version(2))), Applied::Switched);
        assert_eq!(table.apply(&tenant(), Some(version(1))), Applied::Stale);
        assert_eq!(table.apply(&tenant(), Some(version(2))), Applied::Unchanged);
        assert_eq!(table.apply(&tenant(), None), Applied::Unchanged);
        assert_eq!(leased_adapter(&table).as_deref(), Some("acme@v2"));
        assert_eq!(table.apply(&tenant(), Some(version(3))), Applied::Switched);
        assert_eq!(leased_adapter(&table).as_deref(), Some("acme@v3"));
    }

    #[test]
    fn a_replaced_adapter_shows_its_calls_until_they_end() {
        let table = table();
        table.apply(&tenant(), Some(version(1)));
        let Lookup::Live(lease) = table.lease(&tenant()) else {
            panic!("v1 is live");
        };
        table.apply(&tenant(), Some(version(2)));
        let snapshot = table.snapshot();
        assert_eq!(snapshot.in_flight.get("acme@v1"), Some(&1));
        assert_eq!(snapshot.in_flight.get("acme@v2"), Some(&0));
        let live: Vec<&str> = snapshot
            .policies
            .iter()
            .map(|p| p.adapter.as_str())
            .collect();
        assert_eq!(live, ["acme@v2"]);
        drop(lease);
        let snapshot = table.snapshot();
        assert_eq!(snapshot.in_flight.get("acme@v1"), None);
    }
}
