//! An operator rolls a tenant back to an earlier version of its policy:
//!
//! - `POST /tenants/{tenant}/rollback` `{"to": 4}` → `202` and the order; the trainer, which
//!   owns the engine's adapters, carries it out at its next round: version 4's weights go live
//!   as a new version (versions only grow), each sidecar follows within the same bound as any
//!   switch, and training continues from those weights;
//! - `GET /tenants/{tenant}/rollback` → the latest order and, once carried out, its outcome
//!   (`{"state": "done", "version": 12}` or `{"state": "failed", "reason": "..."}`).
//!
//! Only the global admin token may order one: a tenant token sees and rates its tenant's
//! trajectories but does not decide what serves them.

use clawback_datapool::{Rollback, Store, TenantId, UnixMs, SCHEMA_VERSION};
use http::{Response, StatusCode};
use serde::Deserialize;

use super::{json_response, HandshakeError, Scope};
use crate::control_plane::Handles;
use crate::data_plane::body::ProxyBody;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OrderBody {
    /// The earlier version whose weights go live again.
    to: Option<u64>,
}

/// The tenant named in the path, for the global admin token only.
fn operator_tenant(scope: &Scope, raw: &str) -> Result<TenantId, HandshakeError> {
    if let Scope::Tenant(_) = scope {
        return Err(HandshakeError::OperatorOnly);
    }
    TenantId::new(raw).map_err(|e| HandshakeError::BadBody(e.to_string()))
}

fn store(control: &Handles) -> Result<&dyn Store, HandshakeError> {
    if control.policies.is_none() {
        return Err(HandshakeError::RoutingOff);
    }
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    Ok(recorder.store().as_ref())
}

/// `POST /tenants/{tenant}/rollback`.
pub(super) async fn order(
    control: &Handles,
    scope: &Scope,
    raw: &str,
    body: OrderBody,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let tenant = operator_tenant(scope, raw)?;
    let to = body
        .to
        .ok_or_else(|| HandshakeError::BadBody("`to` names no version".to_owned()))?;
    let store = store(control)?;
    let live = store
        .policy_version(&tenant)
        .await?
        .ok_or_else(|| HandshakeError::RollbackRefused(format!("{tenant} has no live version")))?;
    if to == 0 || to >= live.version {
        return Err(HandshakeError::RollbackRefused(format!(
            "version {to} is not an earlier version of {tenant} (live: {})",
            live.version
        )));
    }
    let order = Rollback {
        schema_version: SCHEMA_VERSION,
        tenant,
        id: uuid::Uuid::new_v4().to_string(),
        to,
        from: live.version,
        ordered_at: UnixMs::now(),
        outcome: None,
    };
    store.order_rollback(&order).await?;
    Ok(json_response(StatusCode::ACCEPTED, &value(&order)?))
}

/// `GET /tenants/{tenant}/rollback`.
pub(super) async fn state(
    control: &Handles,
    scope: &Scope,
    raw: &str,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let tenant = operator_tenant(scope, raw)?;
    let order = store(control)?
        .rollback(&tenant)
        .await?
        .ok_or_else(|| HandshakeError::NoRollback(tenant))?;
    Ok(json_response(StatusCode::OK, &value(&order)?))
}

fn value(order: &Rollback) -> Result<serde_json::Value, HandshakeError> {
    serde_json::to_value(order).map_err(|e| HandshakeError::Encode(e.to_string()))
}
