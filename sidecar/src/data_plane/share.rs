//! Fair shares: what every tenant draws on (calls in flight, body bytes, orphans, Claw-R1 uids,
//! the plugins' queue) is bounded
//! per tenant as well as in all, so tenants at their share are refused while the others are
//! still served — however many tenants push at once, the default tenant one among them.
//!
//! A tenant's share is not a fixed fraction: it is its part of the whole among the tenants that
//! hold some of it now, with room kept for one more. With `k` tenants active (this one
//! counted), a tenant may hold `total / (k + 1)` — and never more than `cap`
//! (`limits.tenant_share` of the whole, ½ by default) — and beyond its first unit it takes one
//! only while more than its share is still free. Units held are not taken back (a call in
//! flight runs to its end), so the rule is about what is *taken*:
//! - a tenant holding nothing gets a unit whenever one is free, however many others push;
//! - tenants that came first keep at most what their share was when they took it, and as their
//!   units come back they take again only up to the share of the tenants active then; two
//!   colluding keys and the default tenant, arriving first at a whole of 64, hold 32, 11 and 5,
//!   and leave 16 to the next tenants, each of whom gets one at once;
//! - a tenant alone holds up to half the whole (`cap`), so the next one always finds room.
//!
//! A sidecar that serves one tenant gives it the whole (`cap = total`, no sharing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawback_datapool::TenantId;

/// How much of `total` one tenant may hold: `fraction` of it, at least 1.
pub fn of(total: usize, fraction: f64) -> usize {
    ((total as f64 * fraction).ceil() as usize).clamp(1, total.max(1))
}

/// Units of a whole of `total` held per tenant, shared fairly among the tenants active (see the
/// module docs). Tenants holding none take no room.
#[derive(Debug)]
pub struct Counts {
    total: usize,
    /// The most one tenant may hold, even alone.
    cap: usize,
    /// Whether the share shrinks with the tenants active (a sidecar of several tenants).
    fair: bool,
    held: HashMap<TenantId, usize>,
    /// Units held by all tenants.
    in_use: usize,
}

impl Counts {
    /// A whole of `total`, one tenant holding at most `fraction` of it; `fair`: shared among
    /// the tenants active as well.
    pub fn new(total: usize, fraction: f64, fair: bool) -> Self {
        Self {
            total,
            cap: of(total, fraction),
            fair,
            held: HashMap::new(),
            in_use: 0,
        }
    }

    /// The most `tenant` may hold now (what a refusal tells it).
    pub fn share_of(&self, tenant: &TenantId) -> usize {
        if !self.fair {
            return self.cap;
        }
        let active = self.held.len() + usize::from(!self.held.contains_key(tenant));
        (self.total / (active + 1)).clamp(1, self.cap)
    }

    /// Units free in the whole.
    pub fn free(&self) -> usize {
        self.total.saturating_sub(self.in_use)
    }

    /// Whether `tenant` may take one more unit now.
    pub fn may_take(&self, tenant: &TenantId) -> bool {
        self.may_take_n(tenant, 1)
    }

    /// Whether `tenant` may take `n` more units now: a tenant holding nothing whenever they are
    /// free; beyond, up to its share, leaving the next tenant to come its share free.
    pub fn may_take_n(&self, tenant: &TenantId, n: usize) -> bool {
        let held = self.held(tenant);
        let free = self.free();
        if n > free {
            return false;
        }
        if held == 0 && self.fair {
            return true;
        }
        let share = self.share_of(tenant);
        held + n <= share && (!self.fair || free - n >= share)
    }

    /// Takes one unit for `tenant`; `false` when it may not ([`Self::may_take`]).
    pub fn take(&mut self, tenant: &TenantId) -> bool {
        self.take_n(tenant, 1)
    }

    /// Takes `n` units for `tenant`; `false` when it may not ([`Self::may_take_n`]).
    pub fn take_n(&mut self, tenant: &TenantId, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        if !self.may_take_n(tenant, n) {
            return false;
        }
        *self.held.entry(tenant.clone()).or_insert(0) += n;
        self.in_use += n;
        true
    }

    /// Gives one unit of `tenant`'s back.
    pub fn give_back(&mut self, tenant: &TenantId) {
        self.give_back_n(tenant, 1);
    }

    /// Gives `n` units of `tenant`'s back.
    pub fn give_back_n(&mut self, tenant: &TenantId, n: usize) {
        if let Some(held) = self.held.get_mut(tenant) {
            let n = n.min(*held);
            *held -= n;
            self.in_use -= n;
            if *held == 0 {
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
    /// Shares of a whole of `total` ([`Counts::new`]).
    pub fn new(total: usize, fraction: f64, fair: bool) -> Arc<Self> {
        Arc::new(Self {
            counts: Mutex::new(Counts::new(total, fraction, fair)),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most `tenant` may hold now.
    pub fn share_of(&self, tenant: &TenantId) -> usize {
        self.counts().share_of(tenant)
    }

    /// Units `tenant` holds now.
    pub fn held(&self, tenant: &TenantId) -> usize {
        self.counts().held(tenant)
    }

    /// One unit for `tenant`, or `None` when it holds its share.
    pub fn try_take(self: &Arc<Self>, tenant: &TenantId) -> Option<Share> {
        self.try_take_n(tenant, 1).ok()
    }

    /// `n` units for `tenant`, or why not: [`Refusal::Whole`] when the whole has not `n` free,
    /// else [`Refusal::Share`].
    pub fn try_take_n(self: &Arc<Self>, tenant: &TenantId, n: usize) -> Result<Share, Refusal> {
        let mut counts = self.counts();
        if counts.take_n(tenant, n) {
            return Ok(Share {
                shares: Arc::clone(self),
                tenant: tenant.clone(),
                units: n,
            });
        }
        Err(match n > counts.free() {
            true => Refusal::Whole,
            false => Refusal::Share(counts.share_of(tenant)),
        })
    }
}

/// The plugins' queue shared like the rest: a tenant queues a job while it may take a unit.
impl clawback_filters::fair::QueueShares for Shares {
    fn take(&self, tenant: &TenantId) -> bool {
        self.counts().take(tenant)
    }

    fn give_back(&self, tenant: &TenantId) {
        self.counts().give_back(tenant);
    }
}

/// Why units were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The whole has not that many free.
    Whole,
    /// The tenant is at its share (what it may hold now).
    Share(usize),
}

/// Units of a tenant's share, given back on drop.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    tenant: TenantId,
    units: usize,
}

impl Share {
    /// Gives back all but `units` of what this holds (a reservation larger than what it was
    /// for).
    pub fn shrink_to(&mut self, units: usize) {
        if units < self.units {
            self.shares
                .counts()
                .give_back_n(&self.tenant, self.units - units);
            self.units = units;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.shares.counts().give_back_n(&self.tenant, self.units);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    /// Takes units for `who` until it is refused; how many it got.
    fn take_all(counts: &mut Counts, who: &TenantId) -> usize {
        let mut n = 0;
        while counts.take(who) {
            n += 1;
        }
        n
    }

    #[test]
    fn a_tenant_at_its_share_is_refused_and_others_are_not() {
        let shares = Shares::new(4, 0.5, true);
        let (alpha, bravo) = (tenant("alpha"), tenant("bravo"));
        let first = shares.try_take(&alpha).unwrap();
        let _second = shares.try_take(&alpha).unwrap();
        assert!(shares.try_take(&alpha).is_none());
        let of_bravo = shares.try_take(&bravo);
        assert!(of_bravo.is_some());
        // With bravo active, alpha's share is a third of the whole: it holds it already.
        drop(first);
        assert!(shares.try_take(&alpha).is_none());
        drop(of_bravo);
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
        let mut counts = Counts::new(1, 0.5, true);
        for i in 0..100 {
            let t = tenant(&format!("t{i}"));
            assert!(counts.take(&t));
            counts.give_back(&t);
        }
        assert!(counts.held.is_empty());
        assert_eq!(counts.in_use, 0);
    }

    #[test]
    fn colluding_tenants_that_come_first_leave_every_later_tenant_a_unit() {
        // Two keys and the default tenant fill what they can, then eight more tenants come.
        let mut counts = Counts::new(64, 0.5, true);
        let took: Vec<usize> = ["eve", "mallory", "default"]
            .iter()
            .map(|name| take_all(&mut counts, &tenant(name)))
            .collect();
        assert_eq!(took, [32, 11, 5]);
        for i in 0..8 {
            let honest = tenant(&format!("honest-{i}"));
            assert!(counts.take(&honest), "honest-{i} got nothing");
        }
        // The first ones cannot grow back past the share of the eleven tenants now active.
        for name in ["eve", "mallory", "default"] {
            assert!(!counts.take(&tenant(name)), "{name}");
        }
        assert_eq!(counts.share_of(&tenant("eve")), 64 / 12);
    }

    #[test]
    fn as_the_first_tenants_units_come_back_they_take_again_only_their_fair_share() {
        let mut counts = Counts::new(64, 0.5, true);
        let eve = tenant("eve");
        assert_eq!(take_all(&mut counts, &eve), 32);
        let others: Vec<TenantId> = (0..10).map(|i| tenant(&format!("t{i}"))).collect();
        for other in &others {
            assert!(counts.take(other));
        }
        // All of eve's calls end; with eleven tenants active, she gets back at most 64 / 12.
        for _ in 0..32 {
            counts.give_back(&eve);
        }
        assert_eq!(take_all(&mut counts, &eve), 64 / 12);
    }

    #[test]
    fn the_plugin_queue_is_shared_like_calls() {
        use clawback_filters::fair::QueueShares;
        let queue = Shares::new(64, 0.5, true);
        let mut places = Vec::new();
        for name in ["eve", "mallory", "default"] {
            let mut n = 0;
            while queue.take(&tenant(name)) {
                n += 1;
            }
            places.push(n);
        }
        assert_eq!(places, [32, 11, 5]);
        assert!(queue.take(&tenant("honest")));
        queue.give_back(&tenant("eve"));
        assert_eq!(queue.held(&tenant("eve")), 31);
    }

    #[test]
    fn bytes_are_shared_like_calls_and_a_first_body_needs_only_room() {
        // 4 MiB of bodies, uploads of 256 KiB each, in the order of the colluding test.
        let (whole, body) = (4 << 20, 256 << 10);
        let shares = Shares::new(whole, 0.5, true);
        let mut held = Vec::new();
        let mut counts = Vec::new();
        for name in ["eve", "mallory", "default"] {
            let mut n = 0;
            while let Ok(share) = shares.try_take_n(&tenant(name), body) {
                held.push(share);
                n += 1;
            }
            counts.push(n);
        }
        assert_eq!(counts, [8, 2, 2]);
        // A quarter of the whole is left: a newcomer's first body fits whatever its share.
        let mut honest = shares.try_take_n(&tenant("honest"), 1 << 20).unwrap();
        assert_eq!(
            shares.try_take_n(&tenant("late"), 1).unwrap_err(),
            Refusal::Whole
        );
        honest.shrink_to(1000);
        assert!(shares.try_take_n(&tenant("late"), 1000).is_ok());
        drop(held);
        drop(honest);
        assert_eq!(shares.counts().in_use, 0);
    }

    #[test]
    fn one_tenant_alone_has_its_cap_and_without_sharing_the_whole() {
        let mut shared = Counts::new(8, 0.5, true);
        assert_eq!(take_all(&mut shared, &tenant("alpha")), 4);
        let mut alone = Counts::new(8, 1.0, false);
        assert_eq!(take_all(&mut alone, &tenant("alpha")), 8);
    }
}
