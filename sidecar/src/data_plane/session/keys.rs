//! Per-session API keys, for agents that take a key but not a per-session URL: the handshake API
//! mints one with a trajectory (`"session_key": true`), and a call that presents it — as
//! `Authorization: Bearer`, `x-api-key` or `api-key`, wherever the agent puts its key — belongs to
//! that trajectory and its tenant, whatever its path, headers or body say.
//!
//! Keys are 256 random bits, kept only as SHA-256 digests (like tenant keys) in the shared
//! session state — so a key minted through one replica of a pool works on all of them — and
//! never forwarded to the engine.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Session keys start with this, so a leaked one is recognisable (secret scanners, logs), and
/// a key with it is never taken for a tenant's API key.
pub const PREFIX: &str = "cbsk-";

/// A new session key and its digest.
pub fn mint() -> (String, [u8; 32]) {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let key = format!("{PREFIX}{}", hex(&secret));
    let digest = Sha256::digest(key.as_bytes()).into();
    (key, digest)
}

/// The digest `key` is looked up by, if it is a session key.
pub fn digest(key: &str) -> Option<[u8; 32]> {
    key.starts_with(PREFIX)
        .then(|| Sha256::digest(key.as_bytes()).into())
}

/// Takes out every API key header that carries a session key: one an agent sends beside its
/// tenant's key (which then decides the call) is never forwarded either.
pub fn strip(headers: &mut http::HeaderMap) {
    let carries = |value: &http::HeaderValue| {
        value.to_str().is_ok_and(|v| {
            let v = v.trim();
            // `Bearer <key>` or the bare key.
            let key = v.split_once(' ').map_or(v, |(_, key)| key.trim());
            key.starts_with(PREFIX)
        })
    };
    let names = std::iter::once(http::header::AUTHORIZATION.as_str())
        .chain(crate::data_plane::tenant::API_KEY_HEADERS);
    for name in names {
        if headers.get_all(name).iter().any(carries) {
            headers.remove(name);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_key_is_recognised_by_its_digest_and_nothing_else_is() {
        let (key, minted) = mint();
        assert!(key.starts_with(PREFIX) && key.len() == PREFIX.len() + 64);
        assert_eq!(digest(&key), Some(minted));
        assert_ne!(digest(&format!("{key}0")), Some(minted));
        assert_eq!(digest("sk-acme"), None);
        assert_ne!(mint().0, key);
    }
}
