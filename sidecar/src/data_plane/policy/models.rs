//! Which models a tenant may call, and the `/v1/models` list it is shown.
//!
//! Adapters are published as `<tenant>@v<N>` ([`adapter_owner`] reads the owner back). A call
//! may name its own tenant's adapters, never another tenant's — routing on or off — and with
//! routing on, nothing but those and the base model's names. `/v1/models` is filtered the same
//! way, and the engine's `root` (the folder a model or adapter was loaded from) is left out.

use clawback_datapool::{PolicyRef, TenantId};
use serde_json::Value;

use crate::data_plane::error::ProxyError;

/// The tenant and version of an adapter name in the trainer's `<tenant>@v<N>` form.
pub fn adapter_owner(model: &str) -> Option<(TenantId, u64)> {
    let (tenant, version) = model.rsplit_once("@v")?;
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((TenantId::new(tenant).ok()?, version.parse().ok()?))
}

/// What naming `model` means for a call of `tenant`: its own adapter (the policy that serves
/// it), something else (`None`), or another tenant's adapter (refused as if it did not exist,
/// so the answer does not say whether it does).
pub fn own_adapter(tenant: &TenantId, model: &str) -> Result<Option<PolicyRef>, ProxyError> {
    match adapter_owner(model) {
        Some((owner, version)) if owner == *tenant => Ok(Some(PolicyRef {
            adapter: model.to_owned(),
            version,
        })),
        Some(_) => Err(ProxyError::ModelNotAvailable {
            model: model.to_owned(),
        }),
        None => Ok(None),
    }
}

/// An engine's `/v1/models` answer as `tenant` may see it: entries `visible` accepts, without
/// `root`. `None` when the body is not a model list (it is then passed on as it came).
pub fn filter_list(body: &[u8], visible: impl Fn(&str) -> bool) -> Option<Vec<u8>> {
    let mut list: Value = serde_json::from_slice(body).ok()?;
    let data = list.get_mut("data")?.as_array_mut()?;
    data.retain(|entry| entry["id"].as_str().is_some_and(&visible));
    for entry in data.iter_mut() {
        if let Some(entry) = entry.as_object_mut() {
            entry.remove("root");
        }
    }
    serde_json::to_vec(&list).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[test]
    fn adapter_names_carry_their_owner() {
        assert_eq!(adapter_owner("acme@v17"), Some((tenant("acme"), 17)));
        assert_eq!(adapter_owner("a@b@v2"), None, "not a tenant id");
        for name in ["acme", "acme@v", "acme@vx", "@v1", "Qwen/Qwen3-8B"] {
            assert_eq!(adapter_owner(name), None, "{name}");
        }
    }

    #[test]
    fn another_tenants_adapter_is_refused_and_ones_own_is_its_policy() {
        let acme = tenant("acme");
        assert!(matches!(
            own_adapter(&acme, "bravo@v1"),
            Err(ProxyError::ModelNotAvailable { .. })
        ));
        let own = own_adapter(&acme, "acme@v3").unwrap().unwrap();
        assert_eq!((own.adapter.as_str(), own.version), ("acme@v3", 3));
        assert!(own_adapter(&acme, "Qwen/Qwen3-8B").unwrap().is_none());
    }

    #[test]
    fn the_model_list_loses_other_tenants_and_paths() {
        // vLLM 0.32's /v1/models with two adapters loaded.
        let engine = br#"{"object":"list","data":[
            {"id":"base","object":"model","created":1,"owned_by":"vllm","root":"/models/base","parent":null,"max_model_len":4096,"permission":[]},
            {"id":"acme@v2","object":"model","created":1,"owned_by":"vllm","root":"/adapters/acme@v2","parent":"base","max_model_len":null,"permission":[]},
            {"id":"bravo@v1","object":"model","created":1,"owned_by":"vllm","root":"/adapters/bravo@v1","parent":"base","max_model_len":null,"permission":[]}]}"#;
        let acme = tenant("acme");
        let shown = filter_list(engine, |id| {
            id == "base" || adapter_owner(id).is_some_and(|(t, _)| t == acme)
        })
        .unwrap();
        let shown: Value = serde_json::from_slice(&shown).unwrap();
        let ids: Vec<&str> = shown["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["base", "acme@v2"]);
        assert!(!String::from_utf8_lossy(&serde_json::to_vec(&shown).unwrap()).contains('/'));
        assert!(filter_list(b"not json", |_| true).is_none());
    }
}
