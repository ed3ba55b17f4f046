//! The rewrite of a model call's `model` to the tenant's live adapter (the rule is in the
//! [module docs](super)).

use std::collections::HashSet;
use std::sync::Arc;

use clawback_datapool::TenantId;
use serde_json::Value;

use super::table::{Lease, Lookup, PolicyTable};

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
    /// The adapter serving the call, held until its response ends; `None` for the base model or
    /// a call that named its own model.
    pub lease: Option<Lease>,
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

    /// Rewrites `body["model"]` of a call of `tenant` per the rule.
    pub fn route(&self, tenant: &TenantId, body: &mut Value) -> Routed {
        let Some(asked) = body.get("model").and_then(Value::as_str) else {
            return Routed::default();
        };
        if !self.routable.contains(asked) {
            return Routed::default();
        }
        let (model, lease) = match self.table.lease(tenant) {
            Lookup::Base => (self.base_model.clone(), None),
            Lookup::Live(lease) => (lease.policy().adapter.clone(), Some(lease)),
        };
        let rewritten = asked != model;
        if rewritten {
            body["model"] = Value::String(model);
        }
        Routed { rewritten, lease }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
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
            let routed = router.route(&tenant("acme"), &mut body);
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
        let routed = router.route(&tenant("plain"), &mut body);
        assert!(routed.rewritten && routed.lease.is_none());
        assert_eq!(body["model"], "Qwen/Qwen3-8B");

        let mut body = json!({"model": "Qwen/Qwen3-8B"});
        let routed = router.route(&tenant("plain"), &mut body);
        assert!(!routed.rewritten && routed.lease.is_none());
    }

    #[test]
    fn a_call_that_names_another_model_is_left_alone() {
        let router = router();
        for mut body in [
            json!({"model": "acme@v1"}),
            json!({"model": "gpt-4o"}),
            json!({"messages": []}),
            json!({"model": 7}),
        ] {
            let before = body.clone();
            let routed = router.route(&tenant("acme"), &mut body);
            assert!(!routed.rewritten && routed.lease.is_none());
            assert_eq!(body, before);
        }
    }
}
