//! The rewrite of a model call's `model` to the tenant's live adapter (the rule is in the
//! [module docs](super)).

use std::collections::HashSet;
use std::sync::Arc;

use clawback_datapool::{PolicyRef, TenantId};
use serde_json::Value;

use super::models::own_adapter;
use super::table::{Lease, Lookup, PolicyTable};
use crate::data_plane::error::ProxyError;

/// Decides which model serves a tenant's call.
pub struct Router {
    table: Arc<PolicyTable>,
    base_model: String,
    /// `base_model` and its aliases: the names a call may be rerouted from.
    routable: HashSet<String>,
}

/// What routing did to one call.
#[derive(Debug, Default)]
pub struct Routed {
    /// `model` was changed: the body must be serialised again.
    pub rewritten: bool,
    /// The live adapter serving the call, held until its response ends; `None` for the base
    /// model or a call that named an adapter version itself.
    pub lease: Option<Lease>,
    /// The policy that serves the call, as the step records it: the live adapter's, or the one
    /// the call named itself; `None` for the base model.
    pub policy: Option<PolicyRef>,
}

impl Router {
    pub fn new(table: Arc<PolicyTable>, base_model: String, aliases: &[String]) -> Self {
        let routable = aliases
            .iter()
            .cloned()
            .chain(std::iter::once(base_model.clone()))
            .collect();
        Self {
            table,
            base_model,
            routable,
        }
    }

    pub fn table(&self) -> &Arc<PolicyTable> {
        &self.table
    }

    /// Whether `tenant` may see (and call) `model`: the base model's names and its own
    /// adapters.
    pub fn visible(&self, tenant: &TenantId, model: &str) -> bool {
        self.routable.contains(model) || matches!(own_adapter(tenant, model), Ok(Some(_)))
    }

    /// Rewrites `body["model"]` of a call of `tenant` per the rule; a model the tenant may not
    /// call is refused.
    pub fn route(&self, tenant: &TenantId, body: &mut Value) -> Result<Routed, ProxyError> {
        let Some(asked) = body.get("model").and_then(Value::as_str) else {
            return Ok(Routed::default());
        };
        if !self.routable.contains(asked) {
            let Some(named) = own_adapter(tenant, asked)? else {
                return Err(ProxyError::ModelNotAvailable {
                    model: asked.to_owned(),
                });
            };
            // The live version named by its own name still counts as in flight on it, so the
            // publisher does not unload it under the call.
            let lease = self.table.lease_named(tenant, asked);
            return Ok(Routed {
                rewritten: false,
                lease,
                policy: Some(named),
            });
        }
        let (model, lease) = match self.table.lease(tenant) {
            Lookup::Base => (self.base_model.clone(), None),
            Lookup::Live(lease) => (lease.adapter().to_owned(), Some(lease)),
        };
        let rewritten = asked != model;
        if rewritten {
            body["model"] = Value::String(model);
        }
        let policy = lease.as_ref().map(Lease::policy_ref);
        Ok(Routed {
            rewritten,
            lease,
            policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data_plane::metrics::Metrics;
    use clawback_datapool::{PolicyVersion, UnixMs, SCHEMA_VERSION};
    use serde_json::json;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn router() -> Router {
        let table = Arc::new(PolicyTable::new(Arc::new(Metrics::new())));
        table.apply(
            &tenant("acme"),
            Some(PolicyVersion {
                schema_version: SCHEMA_VERSION,
                tenant: tenant("acme"),
                adapter: "acme@v3".to_owned(),
                version: 3,
                live_since: UnixMs::now(),
                canary: None,
            }),
        );
        table.apply(&tenant("plain"), None);
        Router::new(table, "Qwen/Qwen3-8B".to_owned(), &["default".to_owned()])
    }

    #[test]
    fn the_base_name_and_its_aliases_go_to_the_tenants_adapter() {
        let router = router();
        for asked in ["Qwen/Qwen3-8B", "default"] {
            let mut body = json!({"model": asked, "messages": []});
            let routed = router.route(&tenant("acme"), &mut body).unwrap();
            assert!(routed.rewritten);
            assert_eq!(body["model"], "acme@v3");
            let policy = routed.lease.map(|l| l.policy_ref());
            assert_eq!(policy.map(|p| p.version), Some(3));
        }
    }

    #[test]
    fn a_tenant_without_an_adapter_gets_the_base_under_its_real_name() {
        let router = router();
        let mut body = json!({"model": "default"});
        let routed = router.route(&tenant("plain"), &mut body).unwrap();
        assert!(routed.rewritten && routed.lease.is_none());
        assert_eq!(body["model"], "Qwen/Qwen3-8B");

        let mut body = json!({"model": "Qwen/Qwen3-8B"});
        let routed = router.route(&tenant("plain"), &mut body).unwrap();
        assert!(!routed.rewritten && routed.lease.is_none());
    }

    #[test]
    fn a_call_that_names_its_own_adapter_is_left_alone_and_records_it() {
        let router = router();
        for (asked, leased) in [("acme@v3", true), ("acme@v1", false)] {
            let mut body = json!({"model": asked});
            let routed = router.route(&tenant("acme"), &mut body).unwrap();
            assert!(!routed.rewritten);
            assert_eq!(routed.lease.is_some(), leased, "{asked}");
            assert_eq!(routed.policy.map(|p| p.adapter).as_deref(), Some(asked));
            assert_eq!(body["model"], asked);
        }
        for mut body in [json!({"messages": []}), json!({"model": 7})] {
            let before = body.clone();
            let routed = router.route(&tenant("acme"), &mut body).unwrap();
            assert!(!routed.rewritten && routed.policy.is_none());
            assert_eq!(body, before);
        }
    }

    #[test]
    fn another_tenants_adapter_or_an_unknown_model_is_refused() {
        let router = router();
        for asked in ["acme@v3", "gpt-4o", "plain@v1"] {
            let mut body = json!({"model": asked});
            let refused = router.route(&tenant("bravo"), &mut body);
            assert!(
                matches!(refused, Err(ProxyError::ModelNotAvailable { .. })),
                "{asked}"
            );
        }
        assert!(router.visible(&tenant("acme"), "acme@v1"));
        assert!(router.visible(&tenant("acme"), "default"));
        assert!(!router.visible(&tenant("bravo"), "acme@v3"));
    }
}
