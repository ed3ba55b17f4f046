//! `[timeouts]` and `[limits]`: the request path's bounds in time and in size, read by the
//! listener ([`super::server`]), the layers, the body reader and the forwarder.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long each part of a call may take.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Time a client has to send its request head.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub header_read: Duration,
    /// Time a client has to send its whole request body.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub body_read: Duration,
    /// TCP (and TLS) connect to an upstream.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub upstream_connect: Duration,
    /// From sending the request to the upstream's response head (prefill of long prompts lives here).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub upstream_first_byte: Duration,
    /// Longest gap between two body chunks of an upstream response.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub upstream_idle: Duration,
    /// Longest a client may take to accept the next chunk of its response; past it the call is
    /// treated as orphaned (its answer is still read and recorded, not sent).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub client_write: Duration,
    /// A client connection with no request in flight is closed after this long.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub idle_connection: Duration,
    /// How long an upstream response is still read after its client went away.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub orphan_drain: Duration,
    /// After SIGTERM/SIGINT: how long in-flight requests may take to finish.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub shutdown_grace: Duration,
}

/// How much a call, and a tenant, may hold.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at once, as read (what a call declares, or
    /// `max_body_bytes` while a body of unknown length arrives), until its upstream call ends;
    /// each tenant draws on it like on `max_concurrent_requests`, and past it a call gets 503 (429
    /// past the tenant's share) with `Retry-After`. The parsed and re-encoded forms of a body
    /// take a few times its bytes: size this at a fraction of the memory the sidecar may use.
    pub max_buffered_bytes: usize,
    /// Most JSON values (messages, content blocks, each key's value, each item) a request body
    /// may hold: what it expands to in memory is bounded, not only its bytes. More get 400.
    pub max_body_values: usize,
    /// Requests served at once — orphans (calls whose client left while their upstream answer
    /// is still read, so it is recorded) included; the next one gets 503 with `Retry-After`.
    pub max_concurrent_requests: usize,
    /// Agent connections open at once (lowered to fit the descriptor limit, `ulimit -n`); the
    /// admin port (`admin.listen`) has a pool of its own. Tenants' calls are shared out of no
    /// more than this many, so slow calls hold their tenant's share of the connections only.
    pub max_connections: usize,
    /// Orphans at once; a call whose client leaves beyond this has its upstream call cut off
    /// (and is not recorded).
    pub max_orphaned_calls: usize,
    /// Seconds sent in `Retry-After` when shedding load.
    pub retry_after_secs: u32,
    /// The most of each bound every tenant draws on (`max_concurrent_requests`,
    /// `max_buffered_bytes`, orphans, Claw-R1's open trajectories) one tenant may hold even alone, as a fraction; with others
    /// active its share shrinks to its part among them ([`crate::data_plane::share`]). Past it
    /// the tenant gets 429 while the others are served. 1 turns fair shares off; a sidecar with
    /// one tenant gives it the whole.
    pub tenant_share: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(30),
            upstream_connect: Duration::from_secs(2),
            upstream_first_byte: Duration::from_secs(600),
            upstream_idle: Duration::from_secs(120),
            idle_connection: Duration::from_secs(60),
            client_write: Duration::from_secs(60),
            orphan_drain: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 * 1024 * 1024,
            max_buffered_bytes: 1 << 30,
            max_body_values: 1 << 18,
            max_concurrent_requests: 4096,
            max_orphaned_calls: 256,
            max_connections: 16_384,
            retry_after_secs: 1,
            tenant_share: 0.5,
        }
    }
}
