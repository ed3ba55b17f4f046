//! Keeps the [`PolicyTable`] equal to the datapool's live versions.
//!
//! At start every tenant the sidecar knows of (configured, in the datapool's tenant index) is
//! read once, before the first call is served. Then:
//! - with Redis, the syncer subscribes to every tenant's policy channel (`PSUBSCRIBE`: a tenant
//!   that gets its first adapter later is covered too) and reads a tenant again on each message,
//!   so every replica switches within a round trip; after a reconnect, and every
//!   `resync_interval` in case a message was missed, it reads every tenant again;
//! - with the embedded store, which has no pub/sub, it reads every tenant every `poll_interval`.
//!
//! A tenant the table has not seen (its first call) is read at once. A datapool that does not
//! answer leaves the table as it is: calls keep going where they went.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{Store, TenantId};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::table::{Applied, PolicyTable};
use super::Routing;

/// The channels [`clawback_datapool::keys::policy_changed`] names, for every tenant. Braces are
/// not special in Redis glob patterns.
const CHANNEL_PATTERN: &str = "clawback:{*}:policy:changed";

/// The initial read may not hold the sidecar's start longer than this (a datapool that is down).
const INITIAL_LOAD_LIMIT: Duration = Duration::from_secs(5);

/// Backoff between attempts to (re)subscribe.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

pub struct Syncer {
    pub table: Arc<PolicyTable>,
    pub store: Arc<dyn Store>,
    pub config: Routing,
    /// Where to subscribe; `None` for the embedded store (poll).
    pub redis_url: Option<String>,
    /// Tenants of the configuration (the default tenant, the API keys' tenants).
    pub configured: Vec<TenantId>,
}

impl Syncer {
    /// Reads every known tenant once (bounded), then keeps the table current until `stop`.
    pub async fn start(self, stop: CancellationToken) {
        if tokio::time::timeout(INITIAL_LOAD_LIMIT, self.resync())
            .await
            .is_err()
        {
            tracing::warn!(
                "the datapool did not answer within {INITIAL_LOAD_LIMIT:?}: calls go to the base model until it does"
            );
        }
        tokio::spawn(async move {
            match self.redis_url.clone() {
                Some(url) => self.subscribe(&url, stop).await,
                None => self.poll(stop).await,
            }
        });
    }

    async fn poll(&self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.config.poll_interval) => self.resync().await,
                () = self.table.wake.notified() => self.load_unknown().await,
            }
        }
    }

    /// Subscribes, and subscribes again whenever the connection ends, until `stop`.
    async fn subscribe(&self, url: &str, stop: CancellationToken) {
        let mut backoff = RECONNECT_MIN;
        loop {
            let subscribed = async {
                let client = redis::Client::open(url)?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.psubscribe(CHANNEL_PATTERN).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let mut pubsub = tokio::select! {
                () = stop.cancelled() => return,
                subscribed = subscribed => match subscribed {
                    Ok(pubsub) => pubsub,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot subscribe to policy switches; retrying in {backoff:?}");
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                        continue;
                    }
                },
            };
            backoff = RECONNECT_MIN;
            // What switched while no subscription was listening.
            self.resync().await;
            let mut messages = pubsub.on_message();
            let mut resync = tokio::time::interval(self.config.resync_interval);
            resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            resync.tick().await; // the first tick is immediate: that resync just ran
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    message = messages.next() => match message {
                        Some(message) => match tenant_of_channel(message.get_channel_name()) {
                            Some(tenant) => self.load(&tenant).await,
                            None => tracing::warn!(channel = message.get_channel_name(), "policy switch on an unexpected channel"),
                        },
                        None => {
                            tracing::warn!("the policy subscription ended; subscribing again");
                            break;
                        }
                    },
                    _ = resync.tick() => self.resync().await,
                    () = self.table.wake.notified() => self.load_unknown().await,
                }
            }
        }
    }

    /// Reads every tenant the sidecar knows of.
    async fn resync(&self) {
        let mut tenants: BTreeSet<TenantId> = self.configured.iter().cloned().collect();
        tenants.extend(self.table.known());
        tenants.extend(self.table.unknown());
        match self.store.tenants().await {
            Ok(indexed) => tenants.extend(indexed),
            Err(e) => tracing::warn!(error = %e, "cannot list the datapool's tenants"),
        }
        for tenant in &tenants {
            self.load(tenant).await;
        }
    }

    async fn load_unknown(&self) {
        for tenant in self.table.unknown() {
            self.load(&tenant).await;
        }
    }

    async fn load(&self, tenant: &TenantId) {
        match self.store.policy_version(tenant).await {
            Ok(reported) => {
                let adapter = reported.as_ref().map(|p| p.adapter.clone());
                let canary = reported
                    .as_ref()
                    .and_then(|p| p.canary.as_ref())
                    .map(|c| (c.adapter.clone(), c.percent));
                match self.table.apply(tenant, reported) {
                    Applied::Switched => {
                        tracing::info!(%tenant, adapter = adapter.as_deref().unwrap_or_default(), "policy switched");
                    }
                    Applied::Stale => {
                        tracing::warn!(%tenant, adapter = adapter.as_deref().unwrap_or_default(), "the datapool reported an older policy than the live one; ignored");
                    }
                    Applied::Trial => match canary {
                        Some((canary, percent)) => {
                            tracing::info!(%tenant, %canary, percent, "canary on trial");
                        }
                        None => tracing::info!(%tenant, "canary ended"),
                    },
                    Applied::Unchanged => {}
                }
            }
            Err(e) => tracing::warn!(%tenant, error = %e, "cannot read the tenant's policy"),
        }
    }
}

/// `clawback:{acme}:policy:changed` → `acme`.
fn tenant_of_channel(channel: &str) -> Option<TenantId> {
    let tag = channel
        .strip_prefix("clawback:{")?
        .strip_suffix("}:policy:changed")?;
    TenantId::new(tag).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_and_the_channel_parser_agree_with_the_datapools_key_layout() {
        let tenant = TenantId::new("team-7").unwrap_or_else(|e| panic!("{e}"));
        let channel = clawback_datapool::keys::policy_changed(&tenant);
        assert_eq!(tenant_of_channel(&channel), Some(tenant));
        let (prefix, suffix) = CHANNEL_PATTERN
            .split_once('*')
            .unwrap_or_else(|| panic!("a pattern"));
        assert!(channel.starts_with(prefix) && channel.ends_with(suffix));
        assert_eq!(tenant_of_channel("clawback:{x}:policy"), None);
    }
}
