//! Identifiers of the data model. Tenants are validated strings (they become part of Redis keys);
//! trajectories, groups, steps and evaluations are UUIDv7, so ids sort by creation time and a
//! consumer can dedupe what a redelivery hands it twice.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::Error;

/// Who the data belongs to. 1-64 characters of `[A-Za-z0-9._-]`: no `{`, `}` or `:`, so a tenant
/// id can never break out of its Redis hash tag `clawback:{tenant}:...`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId(String);

impl TenantId {
    /// Validates `id` as a tenant id.
    pub fn new(id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        if is_key_safe(&id) {
            Ok(TenantId(id))
        } else {
            Err(Error::InvalidTenant(id))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The character set shared by tenant ids and consumer names: safe inside a Redis key.
pub(crate) fn is_key_safe(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl TryFrom<String> for TenantId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        TenantId::new(s)
    }
}

impl From<TenantId> for String {
    fn from(t: TenantId) -> String {
        t.0
    }
}

impl FromStr for TenantId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        TenantId::new(s)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! uuid_v7_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh UUIDv7: later ids compare greater (within one process, strictly).
            pub fn new() -> Self {
                $name(Uuid::now_v7())
            }

            pub fn from_uuid(id: Uuid) -> Self {
                $name(id)
            }

            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, uuid::Error> {
                Uuid::parse_str(s).map($name)
            }
        }

        impl fmt::Display for $name {
            // Lower-case hyphenated: the form whose lexical order is the UUIDv7 time order, which
            // the stores rely on to list trajectories oldest first.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }
    };
}

uuid_v7_id!(
    /// One trajectory (= session, episode) of a tenant.
    TrajectoryId
);
uuid_v7_id!(
    /// A group of rollouts of the same task (GRPO-style); ready when all its members completed.
    GroupId
);
uuid_v7_id!(
    /// One model call. Unique across tenants; consumers dedupe redelivered steps by it.
    StepId
);
uuid_v7_id!(
    /// One evaluation (reward, hint, feedback or filter error) of a step or trajectory.
    EvaluationId
);

/// Milliseconds since the Unix epoch (UTC). Plain integers keep the stored JSON language-neutral.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct UnixMs(pub u64);

impl UnixMs {
    pub fn now() -> Self {
        // A clock before 1970 is a broken host; 0 is a harmless stand-in.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        UnixMs(ms)
    }

    pub fn saturating_sub(self, d: std::time::Duration) -> Self {
        UnixMs(self.0.saturating_sub(d.as_millis() as u64))
    }

    pub fn saturating_add(self, d: std::time::Duration) -> Self {
        UnixMs(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_that_could_escape_the_hash_tag_are_refused() {
        for bad in ["", "a}b", "{a}", "a:b", "a b", &"x".repeat(65)] {
            assert!(TenantId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TenantId::new("team-a_1.prod").is_ok());
        assert!(serde_json::from_str::<TenantId>("\"a:b\"").is_err());
    }

    #[test]
    fn later_ids_sort_after_earlier_ones_as_strings_too() {
        let a = TrajectoryId::new();
        let b = TrajectoryId::new();
        assert!(a < b);
        assert!(a.to_string() < b.to_string());
    }
}
