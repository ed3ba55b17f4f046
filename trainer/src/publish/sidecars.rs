//! Asks the sidecars (`GET /admin/policies`) whether they route a tenant to the new version yet,
//! and whether calls still run on the previous adapter.

use std::collections::BTreeMap;
use std::time::Duration;

use clawback_datapool::{PolicyVersion, TenantId};
use serde::Deserialize;
use tokio::time::Instant;

use super::config::Sidecar;

/// The part of the sidecar's answer the publisher reads.
#[derive(Debug, Deserialize)]
struct Policies {
    policies: Vec<PolicyVersion>,
    /// An adapter that is missing has no call in flight.
    in_flight: BTreeMap<String, u64>,
}

pub struct Sidecars {
    http: reqwest::Client,
    list: Vec<Sidecar>,
    poll: Duration,
}

impl Sidecars {
    pub fn new(http: reqwest::Client, list: Vec<Sidecar>, poll: Duration) -> Self {
        Self { http, list, poll }
    }

    /// Waits until every sidecar routes `tenant` to `version` or a later one; returns the ones
    /// that did not within `limit` (they still will: the datapool holds the switch).
    pub async fn wait_live(&self, tenant: &TenantId, version: u64, limit: Duration) -> Vec<String> {
        self.wait_all(limit, |answer| {
            answer
                .policies
                .iter()
                .any(|p| &p.tenant == tenant && p.version >= version)
        })
        .await
    }

    /// Waits until every sidecar has `tenant`'s canary at `version` on trial (`None`: no canary);
    /// returns the ones that did not within `limit`.
    pub async fn wait_canary(
        &self,
        tenant: &TenantId,
        version: Option<u64>,
        limit: Duration,
    ) -> Vec<String> {
        self.wait_all(limit, |answer| {
            answer
                .policies
                .iter()
                .find(|p| &p.tenant == tenant)
                .is_some_and(|p| p.canary.as_ref().map(|c| c.version) == version)
        })
        .await
    }

    /// Waits until no sidecar has a call in flight on `adapter`; returns the ones where calls
    /// were still running (or that did not answer) after `limit`.
    pub async fn wait_drained(&self, adapter: &str, limit: Duration) -> Vec<String> {
        self.wait_all(limit, |answer| {
            answer.in_flight.get(adapter).copied().unwrap_or(0) == 0
        })
        .await
    }

    /// Asks every sidecar until `done` holds for each; returns the URLs of those it did not hold
    /// for by `limit`.
    async fn wait_all(&self, limit: Duration, done: impl Fn(&Policies) -> bool) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut pending: Vec<&Sidecar> = self.list.iter().collect();
        loop {
            let mut still = Vec::new();
            for sidecar in pending {
                if !self.ask(sidecar).await.is_some_and(|answer| done(&answer)) {
                    still.push(sidecar);
                }
            }
            if still.is_empty() || Instant::now() >= deadline {
                return still.iter().map(|s| s.url.clone()).collect();
            }
            pending = still;
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn ask(&self, sidecar: &Sidecar) -> Option<Policies> {
        let url = format!("{}/admin/policies", sidecar.url.trim_end_matches('/'));
        let response = self
            .http
            .get(&url)
            .bearer_auth(&sidecar.admin_token)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }
}
