//! Per-session API keys, for agents that take a key but not a per-session URL: the handshake API
//! mints one with a trajectory (`"session_key": true`), and a call that presents it — as
//! `Authorization: Bearer`, `x-api-key` or `api-key`, wherever the agent puts its key — belongs to
//! that trajectory and its tenant, whatever its path, headers or body say.
//!
//! Keys are 256 random bits, kept only as SHA-256 digests (like tenant keys), and never forwarded
//! to the engine. Up to [`MAX_KEYS`] are kept, oldest first out.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use clawback_datapool::{TenantId, TrajectoryId};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Session keys kept at most; past it the oldest is forgotten (its calls then resolve as an
/// unknown key would).
pub const MAX_KEYS: usize = 100_000;

/// What a session key stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey {
    pub tenant: TenantId,
    pub trajectory: TrajectoryId,
}

#[derive(Debug, Default)]
struct State {
    by_digest: HashMap<[u8; 32], SessionKey>,
    order: VecDeque<[u8; 32]>,
}

#[derive(Debug, Default)]
pub struct SessionKeys {
    state: Mutex<State>,
}

/// Session keys start with this, so a leaked one is recognisable (secret scanners, logs).
pub const PREFIX: &str = "cbsk-";

impl SessionKeys {
    /// A new key for `trajectory` of `tenant`.
    pub fn mint(&self, tenant: TenantId, trajectory: TrajectoryId) -> String {
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let key = format!("{PREFIX}{}", hex(&secret));
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .by_digest
            .insert(digest, SessionKey { tenant, trajectory });
        state.order.push_back(digest);
        while state.order.len() > MAX_KEYS {
            if let Some(oldest) = state.order.pop_front() {
                state.by_digest.remove(&oldest);
            }
        }
        key
    }

    /// The session `key` stands for, if it is one.
    pub fn resolve(&self, key: &str) -> Option<SessionKey> {
        if !key.starts_with(PREFIX) {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.by_digest.get(&digest).cloned()
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
    fn a_minted_key_resolves_to_its_session_and_nothing_else_does() {
        let keys = SessionKeys::default();
        let tenant = TenantId::new("acme").unwrap();
        let trajectory = TrajectoryId::new();
        let key = keys.mint(tenant.clone(), trajectory);
        assert!(key.starts_with(PREFIX) && key.len() == PREFIX.len() + 64);
        assert_eq!(keys.resolve(&key), Some(SessionKey { tenant, trajectory }));
        assert_eq!(keys.resolve(&format!("{key}0")), None);
        assert_eq!(keys.resolve("sk-acme"), None);
        assert_ne!(keys.mint(TenantId::new("acme").unwrap(), trajectory), key);
    }
}
