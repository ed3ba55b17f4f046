//! The Redis key layout, in one place. Every key of a tenant starts with `clawback:{tenant}:`: the
//! braces are a Redis Cluster hash tag, so all of a tenant's keys live on one slot and the
//! multi-key scripts (completion, trimming, policy switch) run atomically there.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `clawback:tenants` | set | every tenant that has data (a key without a tenant tag) |
//! | `clawback:session-key:{sha256}` | string | `{tenant}\|{trajectory}` a handshake session key stands for (untagged: the call presenting it has no tenant yet) |
//! | `clawback:{t}:trajs` | zset (score 0, lex order = UUIDv7 time order) | trajectory ids, oldest first |
//! | `clawback:{t}:traj:{id}` | hash | `json` header, `status`, `completed_at`, `group`, `group_size`, `steps`, `bytes`; `pending`, `expect` while its completion waits |
//! | `clawback:{t}:traj:{id}:steps` | stream | one entry per step: `id`, `json` (`XADD MAXLEN ~`) |
//! | `clawback:{t}:traj:{id}:next` | hash | step id → `next_state` JSON |
//! | `clawback:{t}:traj:{id}:evals` | stream | one entry per evaluation: `json` |
//! | `clawback:{t}:group:{id}` | hash | `size`, `state`, `created_at`, `settled_at` |
//! | `clawback:{t}:group:{id}:members` | zset (lex) | member trajectory ids |
//! | `clawback:{t}:group:{id}:finished` | set | members that finished |
//! | `clawback:{t}:completions:waiting` | zset (score = completed ms) | finished trajectories whose completion waits for their header or steps (`pending`, `expect` in the hash), for the overdue sweep |
//! | `clawback:{t}:groups:open` | zset (score = created ms) | open groups, for the group timeout sweep |
//! | `clawback:{t}:usage` | hash | `steps`, `bytes`: what the tenant's caps are checked against |
//! | `clawback:{t}:ready` | stream | ready work: `kind` (`trajectory`/`group`), `id`; read by consumer groups |
//! | `clawback:{t}:dead:{consumer group}` | stream | ready entries dead-lettered after too many deliveries |
//! | `clawback:{t}:policy` | hash | live policy: `version`, `json` |
//! | `clawback:{t}:rollback` | string | the operator's latest rollback order and its outcome (JSON) |
//! | `clawback:{t}:gate` | list | the trainer's gate decisions (JSON), newest first, the latest 50 |
//! | `clawback:{t}:policy:changed` | pub/sub channel | the new policy JSON, published on every switch |
//! | `clawback:{t}:live` | zset (score = last call ms) | live trajectories, for the idle sweep ([`crate::Sessions`]) |
//! | `clawback:{t}:live:{id}` | hash | a live trajectory's session state: `next`, `last`, `covered`, `eval`, `after`, `name`, `keys`, `c:{step}` per call in flight |
//! | `clawback:{t}:name:{name}` | string | the live trajectory an agent's session name stands for |
//! | `clawback:{t}:stitch:{hash}` | string | the live trajectory (or `*{n}`: several) a stitching key continues |
//! | `clawback:{t}:finished:{id}` | string | `{reason}\|{steps}\|{last step}` of a trajectory finished lately: repeated requests get the same answer |
//! | `clawback:{t}:completing` | zset (score = due ms) | finished trajectories whose completion is not reported written yet; another replica's sweep takes over those past due |
//! | `clawback:{t}:completing:why` | hash | trajectory → `{reason}\|{steps}` of each in `completing` |

use crate::ids::{GroupId, TenantId, TrajectoryId};

/// The set of tenants with data. Not tenant-tagged: it is the index across tenants.
pub const TENANTS: &str = "clawback:tenants";

/// What a session key (by its SHA-256, hex) stands for.
pub fn session_key(digest_hex: &str) -> String {
    format!("clawback:session-key:{digest_hex}")
}

/// The key prefix of one tenant, hash tag included.
pub fn tenant_prefix(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:")
}

pub fn trajectories(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:trajs")
}

pub fn trajectory(tenant: &TenantId, id: &TrajectoryId) -> String {
    format!("clawback:{{{tenant}}}:traj:{id}")
}

pub fn steps(tenant: &TenantId, id: &TrajectoryId) -> String {
    format!("clawback:{{{tenant}}}:traj:{id}:steps")
}

pub fn next_states(tenant: &TenantId, id: &TrajectoryId) -> String {
    format!("clawback:{{{tenant}}}:traj:{id}:next")
}

pub fn evaluations(tenant: &TenantId, id: &TrajectoryId) -> String {
    format!("clawback:{{{tenant}}}:traj:{id}:evals")
}

pub fn group(tenant: &TenantId, id: &GroupId) -> String {
    format!("clawback:{{{tenant}}}:group:{id}")
}

pub fn group_members(tenant: &TenantId, id: &GroupId) -> String {
    format!("clawback:{{{tenant}}}:group:{id}:members")
}

pub fn group_finished(tenant: &TenantId, id: &GroupId) -> String {
    format!("clawback:{{{tenant}}}:group:{id}:finished")
}

pub fn open_groups(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:groups:open")
}

pub fn waiting_completions(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:completions:waiting")
}

pub fn usage(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:usage")
}

pub fn ready(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:ready")
}

pub fn dead_letters(tenant: &TenantId, consumer_group: &str) -> String {
    format!("clawback:{{{tenant}}}:dead:{consumer_group}")
}

pub fn policy(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:policy")
}

/// The tenant's live trajectories, scored by their last call.
pub fn live(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:live")
}

/// One live trajectory's session state.
pub fn live_trajectory(tenant: &TenantId, id: &TrajectoryId) -> String {
    format!("clawback:{{{tenant}}}:live:{id}")
}

/// The operator's latest rollback order of the tenant.
pub fn rollback(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:rollback")
}

/// The trainer's latest gate decisions for the tenant, newest first.
pub fn gate(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:gate")
}

/// The pub/sub channel the sidecars listen on to switch a tenant's routing to a new adapter.
pub fn policy_changed(tenant: &TenantId) -> String {
    format!("clawback:{{{tenant}}}:policy:changed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tenant_key_carries_the_tenant_hash_tag() {
        let t = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let tr = TrajectoryId::new();
        let g = GroupId::new();
        for key in [
            trajectories(&t),
            trajectory(&t, &tr),
            steps(&t, &tr),
            next_states(&t, &tr),
            evaluations(&t, &tr),
            group(&t, &g),
            group_members(&t, &g),
            group_finished(&t, &g),
            open_groups(&t),
            usage(&t),
            ready(&t),
            dead_letters(&t, "trainers"),
            policy(&t),
            policy_changed(&t),
            live(&t),
            live_trajectory(&t, &tr),
        ] {
            assert!(key.starts_with(&tenant_prefix(&t)), "{key}");
            assert!(key.starts_with("clawback:{acme}:"), "{key}");
        }
    }
}
