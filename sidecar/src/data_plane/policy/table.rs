//! The tenant → live policy table: read on every model call without a lock, written only by the
//! syncer when the datapool reports a switch.
//!
//! Each live policy carries the count of calls in flight on it. A call takes a [`Lease`], which
//! holds the count up until the call's response has ended; a replaced policy stays visible (as
//! "retired") for as long as a lease on it lives, so the publisher can wait for its count to reach
//! zero before unloading the adapter from the backends.
//!
//! A policy with a canary on trial sends exactly `percent` of every hundred calls to the
//! canary's adapter, in turn (call n goes to the canary when ⌊(n+1)·p/100⌋ > ⌊n·p/100⌋); the
//! canary's calls are counted in flight on its own adapter.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arc_swap::ArcSwap;
use clawback_datapool::{Canary, PolicyRef, PolicyVersion, TenantId};
use tokio::sync::Notify;

use crate::data_plane::metrics::{Metrics, TenantLabels};

/// A live (or retired) policy and the calls in flight on it.
#[derive(Debug)]
pub struct LivePolicy {
    pub policy: PolicyVersion,
    in_flight: AtomicU64,
    /// Calls in flight on the canary's adapter.
    canary_in_flight: AtomicU64,
    /// Calls leased so far: which of them go to the canary.
    drawn: AtomicU64,
}

impl LivePolicy {
    fn new(policy: PolicyVersion) -> Self {
        Self {
            policy,
            in_flight: AtomicU64::new(0),
            canary_in_flight: AtomicU64::new(0),
            drawn: AtomicU64::new(0),
        }
    }

    /// The canary, if the next call is its.
    fn draw(&self) -> Option<&Canary> {
        let canary = self.policy.canary.as_ref()?;
        let n = self.drawn.fetch_add(1, Ordering::Relaxed);
        let percent = u64::from(canary.percent.min(100));
        ((n + 1) * percent / 100 > n * percent / 100).then_some(canary)
    }

    fn count(&self, canary: bool) -> &AtomicU64 {
        if canary {
            &self.canary_in_flight
        } else {
            &self.in_flight
        }
    }
}

/// One call's hold on the policy that serves it; the in-flight count drops when it does.
#[derive(Debug)]
pub struct Lease {
    live: Arc<LivePolicy>,
    /// The call runs on the canary.
    canary: bool,
}

impl Lease {
    fn take(live: Arc<LivePolicy>, canary: bool) -> Self {
        live.count(canary).fetch_add(1, Ordering::SeqCst);
        Self { live, canary }
    }

    /// The tenant's policy (with its canary, if one is on trial).
    pub fn policy(&self) -> &PolicyVersion {
        &self.live.policy
    }

    /// The adapter the call runs on: the live version's, or the canary's.
    pub fn adapter(&self) -> &str {
        self.canary_policy()
            .map_or(&self.live.policy.adapter, |c| &c.adapter)
    }

    fn canary_policy(&self) -> Option<&Canary> {
        self.live.policy.canary.as_ref().filter(|_| self.canary)
    }

    /// What the recorded step carries.
    pub fn policy_ref(&self) -> PolicyRef {
        match self.canary_policy() {
            Some(canary) => PolicyRef {
                adapter: canary.adapter.clone(),
                version: canary.version,
            },
            None => self.live.policy.policy_ref(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.live.count(self.canary).fetch_sub(1, Ordering::SeqCst);
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
    /// The same version, with a canary started or ended.
    Trial,
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
        self.lease_where(tenant, |live| live.draw().is_some())
    }

    /// A lease on `adapter` for a call that named it: the live version's or the canary's;
    /// `None` when it is neither (an older version still loaded, say).
    pub fn lease_named(&self, tenant: &TenantId, adapter: &str) -> Option<Lease> {
        let canary = |live: &LivePolicy| {
            live.policy
                .canary
                .as_ref()
                .is_some_and(|c| c.adapter == adapter)
        };
        match self.lease_where(tenant, canary) {
            Lookup::Live(lease) if lease.adapter() == adapter => Some(lease),
            _ => None,
        }
    }

    fn lease_where(&self, tenant: &TenantId, canary: impl Fn(&LivePolicy) -> bool) -> Lookup {
        let mut held = None;
        for _ in 0..LEASE_ATTEMPTS {
            let Some(live) = self.current(tenant) else {
                return Lookup::Base;
            };
            let on_canary = canary(&live);
            let lease = Lease::take(live, on_canary);
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
        let mut trial = false;
        if let Some(Some(live)) = current {
            if reported.version < live.policy.version {
                return Applied::Stale;
            }
            if reported.version == live.policy.version {
                if reported.canary == live.policy.canary {
                    return Applied::Unchanged;
                }
                trial = true;
            }
        }
        let version = reported.version;
        let fresh = Arc::new(LivePolicy::new(reported));
        let mut next = HashMap::clone(&map);
        let replaced = next.insert(tenant.clone(), Some(fresh)).flatten();
        self.live.store(Arc::new(next));
        lock(&self.unknown).remove(tenant);
        if let Some(old) = replaced {
            let mut retired = lock(&self.retired);
            retired.retain(|weak| weak.strong_count() > 0);
            retired.push(Arc::downgrade(&old));
        }
        if trial {
            return Applied::Trial;
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
            if let Some(canary) = &live.policy.canary {
                *in_flight.entry(canary.adapter.clone()).or_insert(0) +=
                    live.canary_in_flight.load(Ordering::SeqCst);
            }
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
            canary: None,
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

    #[test]
    fn a_canary_serves_exactly_its_percent_and_counts_its_own_calls() {
        let table = table();
        table.apply(&tenant(), Some(version(3)));
        let trial = version(3).with_canary(Some(Canary {
            adapter: "acme@v4".to_owned(),
            version: 4,
            percent: 25,
            since: UnixMs::now(),
        }));
        assert_eq!(table.apply(&tenant(), Some(trial.clone())), Applied::Trial);
        assert_eq!(table.apply(&tenant(), Some(trial)), Applied::Unchanged);
        let leases: Vec<Lease> = (0..200)
            .map(|_| match table.lease(&tenant()) {
                Lookup::Live(lease) => lease,
                Lookup::Base => panic!("v3 is live"),
            })
            .collect();
        let on_canary: Vec<&Lease> = leases.iter().filter(|l| l.adapter() == "acme@v4").collect();
        assert_eq!(on_canary.len(), 50);
        assert_eq!(on_canary[0].policy_ref().version, 4);
        // Every fourth call, not a run of them.
        assert!(leases.chunks(4).all(|four| four
            .iter()
            .filter(|l| l.adapter() == "acme@v4")
            .count()
            == 1));
        let snapshot = table.snapshot();
        assert_eq!(snapshot.in_flight.get("acme@v4"), Some(&50));
        assert_eq!(snapshot.in_flight.get("acme@v3"), Some(&150));
        // A call naming the canary holds it too; the trial ends and its calls still count.
        let named = table
            .lease_named(&tenant(), "acme@v4")
            .map(|l| l.policy_ref().version);
        assert_eq!(named, Some(4));
        assert_eq!(table.apply(&tenant(), Some(version(3))), Applied::Trial);
        assert!(table.lease_named(&tenant(), "acme@v4").is_none());
        assert_eq!(table.snapshot().in_flight.get("acme@v4"), Some(&50));
        drop(leases);
        assert_eq!(table.snapshot().in_flight.get("acme@v4"), None);
        assert_eq!(leased_adapter(&table).as_deref(), Some("acme@v3"));
    }
}
