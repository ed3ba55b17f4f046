//! Who an admin call acts for: the global admin token sees every tenant; a tenant token
//! (`admin.tenant_tokens`, stored as SHA-256 like API keys) sees and gives feedback to its own
//! tenant's trajectories only — the handshake API, the viewer's views and the export alike.
//!
//! Tokens are compared as digests, so the comparison's time does not depend on where a guess
//! differs from a token.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use clawback_datapool::TenantId;
use http::{header, request};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::HandshakeError;
use crate::data_plane::tenant::{hashed_tenants, TenantError};

/// The handshake API (`/trajectories`), the viewer and `/admin/policies`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Bearer token that sees every tenant. Unset (and no `tenant_tokens`): the API is off.
    pub token: Option<String>,
    /// `"sha256:<hex of the token>" = "tenant"`: tokens that see and give feedback to one
    /// tenant's trajectories only (viewer and export included). Stored hashed, as API keys.
    pub tenant_tokens: BTreeMap<String, String>,
    /// Serve the admin API and the viewer on this address only (not on the agent port), e.g.
    /// a port that only the platform's network reaches. Unset: on the agent port.
    pub listen: Option<SocketAddr>,
}

/// What a caller's token lets it see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The global admin token: every tenant.
    All,
    /// A tenant token: this tenant only.
    Tenant(TenantId),
}

impl Scope {
    /// The tenant a request is about: the one named, else the scope's own, else `default`.
    pub fn tenant(
        &self,
        named: Option<String>,
        default: Option<&str>,
    ) -> Result<TenantId, HandshakeError> {
        let raw = match (self, named) {
            (Self::Tenant(own), Some(named)) if named != own.as_str() => {
                return Err(HandshakeError::OutOfScope(own.clone()))
            }
            (Self::Tenant(own), _) => return Ok(own.clone()),
            (Self::All, Some(named)) => named,
            (Self::All, None) => default.ok_or(HandshakeError::NoTenant)?.to_owned(),
        };
        TenantId::new(raw).map_err(|e| HandshakeError::BadBody(e.to_string()))
    }

    /// Whether trajectories of `tenant` are visible under this scope.
    pub fn sees(&self, tenant: &TenantId) -> bool {
        match self {
            Self::All => true,
            Self::Tenant(own) => own == tenant,
        }
    }
}

/// The admin tokens, as digests.
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    global: Option<[u8; 32]>,
    tenants: HashMap<[u8; 32], TenantId>,
}

impl AdminAuth {
    pub fn new(config: &Admin) -> Result<Self, TenantError> {
        let tenants = hashed_tenants(&config.tenant_tokens)?;
        Ok(Self {
            global: config
                .token
                .as_deref()
                .map(|t| Sha256::digest(t.as_bytes()).into()),
            tenants,
        })
    }

    /// Whether the admin API is on at all.
    pub fn enabled(&self) -> bool {
        self.global.is_some() || !self.tenants.is_empty()
    }

    /// The scope of the call's `Authorization: Bearer <token>`.
    pub fn authorize(&self, parts: &request::Parts) -> Result<Scope, HandshakeError> {
        if !self.enabled() {
            return Err(HandshakeError::Disabled);
        }
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|given| !given.is_empty())
            .ok_or(HandshakeError::Unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        if self.global == Some(digest) {
            return Ok(Scope::All);
        }
        self.tenants
            .get(&digest)
            .map(|tenant| Scope::Tenant(tenant.clone()))
            .ok_or(HandshakeError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::data_plane::tenant::key_hash;

    fn auth() -> AdminAuth {
        let mut tenant_tokens = BTreeMap::new();
        tenant_tokens.insert(key_hash("acme-viewer-token"), "acme".to_owned());
        AdminAuth::new(&Admin {
            token: Some("global-admin-token".to_owned()),
            tenant_tokens,
            listen: None,
        })
        .unwrap()
    }

    fn bearer(value: &str) -> request::Parts {
        let (parts, ()) = http::Request::builder()
            .header(header::AUTHORIZATION, value)
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    #[test]
    fn each_token_has_its_scope_and_nothing_else_passes() {
        let auth = auth();
        assert_eq!(
            auth.authorize(&bearer("Bearer global-admin-token"))
                .unwrap(),
            Scope::All
        );
        assert_eq!(
            auth.authorize(&bearer("Bearer acme-viewer-token")).unwrap(),
            Scope::Tenant(TenantId::new("acme").unwrap())
        );
        for refused in [
            "Bearer ",
            "Bearer  ",
            "Bearer sha256:whatever",
            "global-admin-token",
            "Basic global-admin-token",
        ] {
            assert!(auth.authorize(&bearer(refused)).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn a_tenant_scope_names_only_its_tenant() {
        let acme = Scope::Tenant(TenantId::new("acme").unwrap());
        assert_eq!(acme.tenant(None, Some("default")).unwrap().as_str(), "acme");
        assert_eq!(
            acme.tenant(Some("acme".into()), None).unwrap().as_str(),
            "acme"
        );
        assert!(matches!(
            acme.tenant(Some("bravo".into()), None),
            Err(HandshakeError::OutOfScope(_))
        ));
        assert_eq!(
            Scope::All.tenant(None, Some("default")).unwrap().as_str(),
            "default"
        );
        assert!(!acme.sees(&TenantId::new("bravo").unwrap()));
    }
}
