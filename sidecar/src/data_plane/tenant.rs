//! Whose data a call is: the tenant comes from the call's API key (looked up by its SHA-256, so
//! the config never holds a key in clear), or from `X-Clawback-Tenant` when the sidecar sits
//! behind a trusted gateway. A client can only ever act as the tenant its key maps to.

use std::collections::HashMap;

use clawback_datapool::TenantId;
use http::{header, HeaderMap};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Whose data a call is.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tenants {
    /// Tenant of calls whose API key is not in `keys`; `false`: such calls get 401. (TOML has
    /// no null, and a key removed from the file would fall back to the built-in default.)
    #[serde(with = "default_tenant")]
    #[schemars(with = "default_tenant::Raw")]
    pub default: Option<String>,
    /// Take the tenant from `X-Clawback-Tenant` — only when a trusted gateway in front of the
    /// sidecar sets (and strips from clients) that header.
    pub trusted_header: bool,
    /// `"sha256:<hex of the API key>" = "tenant"`: keys are stored hashed, never in clear.
    pub keys: std::collections::BTreeMap<String, String>,
}

/// `tenants.default`: a tenant name, or `false` for none.
mod default_tenant {
    use serde::{Deserialize, Deserializer, Serializer};

    /// A tenant name, or `false`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(untagged)]
    pub(super) enum Raw {
        Off(bool),
        Tenant(String),
    }

    pub fn serialize<S: Serializer>(value: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(tenant) => s.serialize_str(tenant),
            None => s.serialize_bool(false),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Off(false) => Ok(None),
            Raw::Tenant(tenant) if !tenant.is_empty() => Ok(Some(tenant)),
            Raw::Off(true) | Raw::Tenant(_) => Err(serde::de::Error::custom(
                "`tenants.default` is a tenant name, or false to answer unknown keys with 401",
            )),
        }
    }
}

impl Default for Tenants {
    fn default() -> Self {
        Self {
            default: Some("default".to_owned()),
            trusted_header: false,
            keys: std::collections::BTreeMap::new(),
        }
    }
}

pub const TENANT_HEADER: &str = "x-clawback-tenant";

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "key {key:?} must be \"sha256:\" followed by 64 hex digits (the SHA-256 of the API key)"
    )]
    BadKeyHash { key: String },
    #[error("tenant {tenant:?} is not a valid tenant id: {reason}")]
    BadTenant { tenant: String, reason: String },
}

/// Why a call has no tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// The key is unknown and there is no default tenant.
    UnknownKey,
    /// The trusted header names an invalid tenant id.
    BadHeader,
}

#[derive(Debug, Clone)]
pub struct TenantResolver {
    by_key_hash: HashMap<[u8; 32], TenantId>,
    default: Option<TenantId>,
    trusted_header: bool,
}

fn tenant_id(raw: &str) -> Result<TenantId, TenantError> {
    TenantId::new(raw).map_err(|e| TenantError::BadTenant {
        tenant: raw.to_owned(),
        reason: e.to_string(),
    })
}

/// `"sha256:<hex>" = "tenant"` entries (API keys, tenant tokens) by their digest.
pub(crate) fn hashed_tenants(
    entries: &std::collections::BTreeMap<String, String>,
) -> Result<HashMap<[u8; 32], TenantId>, TenantError> {
    entries
        .iter()
        .map(|(key, tenant)| {
            let hash =
                parse_key_hash(key).ok_or_else(|| TenantError::BadKeyHash { key: key.clone() })?;
            Ok((hash, tenant_id(tenant)?))
        })
        .collect()
}

impl TenantResolver {
    pub fn new(config: &Tenants) -> Result<Self, TenantError> {
        let by_key_hash = hashed_tenants(&config.keys)?;
        let default = config.default.as_deref().map(tenant_id).transpose()?;
        Ok(Self {
            by_key_hash,
            default,
            trusted_header: config.trusted_header,
        })
    }

    /// The tenant of calls whose key is not configured (`tenants.default`), if any.
    pub fn default_tenant(&self) -> Option<&TenantId> {
        self.default.as_ref()
    }

    /// The tenants this configuration names (the default and those of API keys).
    pub fn known(&self) -> Vec<TenantId> {
        let mut known: Vec<TenantId> = self
            .default
            .iter()
            .chain(self.by_key_hash.values())
            .cloned()
            .collect();
        known.sort();
        known.dedup();
        known
    }

    /// Whether calls may belong to more than one tenant (API keys or a trusted tenant header):
    /// then what the engine keeps for one tenant (stored responses) must not be named by another.
    pub fn is_shared(&self) -> bool {
        !self.by_key_hash.is_empty() || self.trusted_header
    }

    pub fn resolve(&self, headers: &HeaderMap) -> Result<TenantId, Unresolved> {
        if self.trusted_header {
            if let Some(value) = headers.get(TENANT_HEADER) {
                return value
                    .to_str()
                    .ok()
                    .and_then(|v| TenantId::new(v).ok())
                    .ok_or(Unresolved::BadHeader);
            }
        }
        let known = presented_key(headers)
            .map(|key| Sha256::digest(key.as_bytes()).into())
            .and_then(|hash: [u8; 32]| self.by_key_hash.get(&hash));
        match (known, &self.default) {
            (Some(tenant), _) | (None, Some(tenant)) => Ok(tenant.clone()),
            (None, None) => Err(Unresolved::UnknownKey),
        }
    }
}

/// The tenant a call is served for, in its request's extensions once it is known.
#[derive(Debug, Clone)]
pub struct CallTenant(pub TenantId);

/// The API key of `Authorization: Bearer <key>` (OpenAI SDKs, and Anthropic's with an auth
/// token), `x-api-key: <key>` (Anthropic SDKs) or `api-key: <key>` (Azure style), in that order.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let (scheme, key) = auth.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| key.trim());
    }
    API_KEY_HEADERS
        .iter()
        .find_map(|name| headers.get(*name))
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Headers that carry an API key besides `Authorization`; the forwarder removes them when it
/// puts its own upstream key in place.
pub const API_KEY_HEADERS: [&str; 2] = ["x-api-key", "api-key"];

fn parse_key_hash(key: &str) -> Option<[u8; 32]> {
    let hex = key.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// `sha256:<hex>` of an API key, the form the config stores (`clawback-sidecar hash-key`).
pub fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn resolver(default: Option<&str>, trusted_header: bool) -> TenantResolver {
        let mut keys = BTreeMap::new();
        keys.insert(key_hash("sk-alpha"), "alpha".to_owned());
        keys.insert(key_hash("sk-beta"), "beta".to_owned());
        TenantResolver::new(&Tenants {
            default: default.map(str::to_owned),
            trusted_header,
            keys,
        })
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_known_key_maps_to_its_tenant() {
        let r = resolver(None, false);
        let t = r
            .resolve(&headers(&[("authorization", "Bearer sk-beta")]))
            .unwrap();
        assert_eq!(t.as_str(), "beta");
    }

    #[test]
    fn an_anthropic_sdks_x_api_key_maps_to_its_tenant_and_authorization_wins() {
        let r = resolver(None, false);
        let t = r.resolve(&headers(&[("x-api-key", "sk-alpha")])).unwrap();
        assert_eq!(t.as_str(), "alpha");
        let both = headers(&[
            ("authorization", "Bearer sk-beta"),
            ("x-api-key", "sk-alpha"),
        ]);
        assert_eq!(r.resolve(&both).unwrap().as_str(), "beta");
    }

    #[test]
    fn an_unknown_key_goes_to_the_default_or_is_refused() {
        let h = headers(&[("authorization", "Bearer sk-nobody")]);
        assert_eq!(
            resolver(Some("public"), false)
                .resolve(&h)
                .unwrap()
                .as_str(),
            "public"
        );
        assert_eq!(
            resolver(None, false).resolve(&h),
            Err(Unresolved::UnknownKey)
        );
        assert_eq!(
            resolver(None, false).resolve(&HeaderMap::new()),
            Err(Unresolved::UnknownKey)
        );
    }

    #[test]
    fn the_tenant_header_is_ignored_unless_trusted() {
        let h = headers(&[
            ("authorization", "Bearer sk-alpha"),
            (TENANT_HEADER, "beta"),
        ]);
        assert_eq!(resolver(None, false).resolve(&h).unwrap().as_str(), "alpha");
        assert_eq!(resolver(None, true).resolve(&h).unwrap().as_str(), "beta");
        let bad = headers(&[(TENANT_HEADER, "no/such{tenant}")]);
        assert_eq!(
            resolver(None, true).resolve(&bad),
            Err(Unresolved::BadHeader)
        );
    }

    #[test]
    fn keys_in_clear_are_refused_in_the_config() {
        let mut keys = BTreeMap::new();
        keys.insert("sk-alpha".to_owned(), "alpha".to_owned());
        let config = Tenants {
            default: None,
            trusted_header: false,
            keys,
        };
        assert!(matches!(
            TenantResolver::new(&config),
            Err(TenantError::BadKeyHash { .. })
        ));
    }
}
