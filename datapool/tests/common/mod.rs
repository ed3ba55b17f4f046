//! Test harness: fresh tenants, Redis servers and clusters started on free loopback ports and
//! killed when their guard drops (also when a test panics), and step fixtures.
#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod scenarios;
pub mod sessions;

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{Step, StepId, TenantId, Trajectory, TrajectoryId};

/// The shared Redis the tests run against (CI starts one on the default port).
pub fn redis_url() -> String {
    std::env::var("CLAWBACK_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A tenant no other test (or earlier run) uses.
pub fn fresh_tenant(label: &str) -> TenantId {
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    TenantId::new(format!("test-{label}-{}", &suffix[suffix.len() - 12..]))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Deletes every key of a tenant from a Redis when dropped.
pub struct TenantKeys {
    pub url: String,
    pub tenant: TenantId,
}

impl TenantKeys {
    pub fn new(url: &str, tenant: &TenantId) -> Self {
        TenantKeys {
            url: url.into(),
            tenant: tenant.clone(),
        }
    }

    /// The tenant's keys now.
    pub fn list(&self) -> Vec<String> {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return Vec::new();
        };
        let Ok(mut conn) = client.get_connection() else {
            return Vec::new();
        };
        let pattern = format!("clawback:{{{}}}:*", self.tenant);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut conn)
            .unwrap_or_default();
        keys
    }
}

impl Drop for TenantKeys {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        for key in self.list() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query(&mut conn);
        }
        let _: redis::RedisResult<i64> = redis::cmd("SREM")
            .arg("clawback:tenants")
            .arg(self.tenant.as_str())
            .query(&mut conn);
    }
}

// The loopback Redis servers and clusters are shared with the workspace's whole-system tests;
// one source file, no dependency between the crates.
#[path = "../../../tests/src/redis_server.rs"]
mod redis_server;
#[allow(unused_imports)] // each test binary uses a different part
pub use redis_server::{free_port, wait_until, RedisCluster, RedisServer};

/// A new open trajectory of `tenant`.
pub fn open_trajectory(tenant: &TenantId) -> Trajectory {
    Trajectory::open(tenant.clone(), TrajectoryId::new())
}

/// Step `index` of `trajectory`: the example's first step, with fresh ids and its reasoning
/// padded so the serialized step is about `size` bytes.
pub fn step_of(tenant: &TenantId, trajectory: &TrajectoryId, index: u32, size: usize) -> Step {
    let mut step = tool_use_trajectory(tenant.clone()).steps.remove(0);
    step.id = StepId::new();
    step.trajectory = *trajectory;
    step.index = index;
    step.next_state = None;
    let base = serde_json::to_string(&step).map(|s| s.len()).unwrap_or(0);
    if size > base {
        step.output.reasoning_content = Some("x".repeat(size - base));
    }
    step
}
