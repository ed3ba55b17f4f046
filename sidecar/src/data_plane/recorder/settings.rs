//! `[recording]`: how calls are recorded as trajectory steps.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use super::redact::Redaction;

/// How calls are recorded as trajectory steps.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    /// Record calls as trajectory steps; `false`: the sidecar only forwards (no datapool, no
    /// plugins, no handshake API).
    pub enabled: bool,
    /// A trajectory with no call for this long is completed; its last turn is kept.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub idle_timeout: Duration,
    /// A group whose rollouts have not all completed after this long is released as partial.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub group_timeout: Duration,
    /// A call in flight for this long is taken for one whose replica died: it no longer holds
    /// its trajectory open. Longer than any call (prefill, generation, `orphan_drain`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub stale_call: Duration,
    /// A trajectory's completion not written this long after it finished is taken for one whose
    /// replica died first: the next sweep of any replica writes it (with its trajectory plugins
    /// run again). Likewise a completion that waited this long for steps another replica
    /// numbered but never wrote is enqueued with the steps it has. Longer than the trajectory
    /// plugins take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub completion_lease: Duration,
    /// How long a call waits for the shared session state (Redis) before it goes on with this
    /// replica's own; 0: as long as it takes. Retried meanwhile, so a restarting Redis is
    /// ridden out ([`crate::data_plane::session::shared`]).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub session_timeout: Duration,
    /// Records the writer holds parsed in memory; every record is in the journal
    /// ([`crate::data_plane::recorder::journal`]) anyway, so past this the writer reads it back from there.
    pub queue_capacity: usize,
    /// Journal bytes of the records the writer's queue holds parsed in memory, all together:
    /// past it, as past `queue_capacity`, the writer reads records back from the journal (this
    /// much at a time). Bounds the recorder's memory when the datapool is slower than the
    /// traffic.
    pub queue_bytes: u64,
    /// Most records written to the store in one batch.
    pub batch_max: usize,
    /// Each record reaches the disk before the agent sees the end of its answer (survives a
    /// machine crash; the page cache already survives a process crash).
    pub journal_fsync: bool,
    /// Bytes of conversation kept for stateful Responses calls (`previous_response_id`), oldest
    /// first out ([`crate::data_plane::session::responses`]).
    pub responses_max_bytes: usize,
    /// Largest answer kept as a step, in body bytes; a larger one reaches the agent whole and
    /// is stored truncated (its beginning, no engine tokens, `truncated: true`, not trainable).
    pub max_step_bytes: usize,
    /// Applied, in order, to every text of a step before it is stored.
    pub redact: Vec<Redaction>,
}

impl Default for Recording {
    fn default() -> Self {
        Self {
            enabled: true,
            idle_timeout: Duration::from_secs(600),
            group_timeout: Duration::from_secs(1800),
            stale_call: Duration::from_secs(3600),
            completion_lease: Duration::from_secs(60),
            session_timeout: Duration::from_millis(500),
            queue_capacity: 8192,
            queue_bytes: 1 << 20,
            batch_max: 64,
            journal_fsync: false,
            responses_max_bytes: 64 << 20,
            max_step_bytes: 8 << 20,
            redact: Vec::new(),
        }
    }
}
