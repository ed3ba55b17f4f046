//! Prometheus metrics of the proxy, rendered as text on `GET /metrics`.
//!
//! Labels are kept low-cardinality: a route name, a status code, an upstream `host:port`, an
//! error code — never a path, a session or a tenant-provided string.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use clawback_datapool::ConsumerGroupLag;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// An upstream's `host:port` as a label value, shared rather than copied per request.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub struct UpstreamName(pub Arc<str>);

impl EncodeLabelValue for UpstreamName {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        encoder.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
    pub upstream: UpstreamName,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub upstream: UpstreamName,
}

impl UpstreamLabels {
    pub fn new(name: &Arc<str>) -> Self {
        Self {
            upstream: UpstreamName(Arc::clone(name)),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    pub op: &'static str,
    pub error: &'static str,
}

/// A trainer deployment's consumer group: names chosen by the operator, a handful per datapool.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerGroupLabels {
    pub consumer_group: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionOpLabels {
    pub op: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    pub level: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    pub finding: &'static str,
}

/// What a trainer must know about the steps it is given, counted as they are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// A trainable step without a logprob per sampled token: its behaviour policy must be
    /// scored by the trainer, so its importance ratio is 1 by construction.
    TrainableWithoutLogprobs,
    /// The engine returned logprobs whose tokens are strings, not ids.
    LogprobsWithoutIds,
    /// A trajectory completed after one model call: a whole task done in one call has no next
    /// state to learn from, and usually means the calls of a session are not being tied together.
    SingleCallTask,
}

impl Finding {
    pub const ALL: [Finding; 3] = [
        Finding::TrainableWithoutLogprobs,
        Finding::LogprobsWithoutIds,
        Finding::SingleCallTask,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TrainableWithoutLogprobs => "trainable_without_logprobs",
            Self::LogprobsWithoutIds => "logprobs_without_ids",
            Self::SingleCallTask => "single_call_task",
        }
    }
}

/// Only tenants that have a published policy, which the trainer (not a client) creates.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

impl TenantLabels {
    pub fn new(tenant: &clawback_datapool::TenantId) -> Self {
        Self {
            tenant: tenant.to_string(),
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub duration: HistogramFamily<RouteLabels>,
    pub added_latency: HistogramFamily<RouteLabels>,
    pub upstream_first_byte: HistogramFamily<UpstreamLabels>,
    pub in_flight: Gauge,
    pub errors: Family<ErrorLabels, Counter>,
    pub ejections: Family<UpstreamLabels, Counter>,
    pub upstream_healthy: Family<UpstreamLabels, Gauge>,
    pub orphaned_streams: Counter,
    pub orphans_cut: Counter,
    pub steps_recorded: Counter,
    pub steps_stored: Counter,
    pub steps_captured: Family<LevelLabels, Counter>,
    pub capture_findings: Family<FindingLabels, Counter>,
    pub records_dropped: Family<ReasonLabels, Counter>,
    pub records_spilled: Counter,
    pub records_replayed: Counter,
    pub journal_left_at_start: Gauge,
    pub completions_taken_over: Counter,
    pub completions_short: Counter,
    pub connections_reclaimed: Counter,
    pub recorder_queue: Gauge,
    pub journal_append: Histogram,
    pub end_of_response_wait: Histogram,
    pub session_state: HistogramFamily<SessionOpLabels>,
    pub session_fallbacks: Family<SessionOpLabels, Counter>,
    pub store_errors: Family<StoreErrorLabels, Counter>,
    pub store_writes_lost: Family<StoreErrorLabels, Counter>,
    pub trajectories_started: Counter,
    pub trajectories_completed: Family<ReasonLabels, Counter>,
    pub policy_switches: Family<TenantLabels, Counter>,
    pub policy_version: Family<TenantLabels, Gauge>,
    pub datapool_lag: Family<ConsumerGroupLabels, Gauge>,
    pub datapool_pending: Family<ConsumerGroupLabels, Gauge>,
    /// The filter host's own metrics (`clawback_filter_*`).
    pub filters: clawback_filters::Metrics,
}

fn request_buckets() -> Histogram {
    // 1 ms .. ~130 s: whole LLM calls.
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

fn overhead_buckets() -> Histogram {
    // 10 µs .. ~0.3 s: the sidecar's own share.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 16))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("clawback");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by route, status and upstream",
            requests.clone(),
        );
        let duration: HistogramFamily<RouteLabels> = Family::new_with_constructor(request_buckets);
        registry.register(
            "request_duration_seconds",
            "From the request's arrival to the last byte handed to the client",
            duration.clone(),
        );
        let added_latency: HistogramFamily<RouteLabels> =
            Family::new_with_constructor(overhead_buckets);
        registry.register(
            "added_latency_seconds",
            "Time to the response head spent in the sidecar itself (total minus waiting on the upstream)",
            added_latency.clone(),
        );
        let upstream_first_byte: HistogramFamily<UpstreamLabels> =
            Family::new_with_constructor(request_buckets);
        registry.register(
            "upstream_first_byte_seconds",
            "From sending a request upstream to its response head",
            upstream_first_byte.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "in_flight_requests",
            "Requests being served right now",
            in_flight.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "errors",
            "Requests the sidecar answered with its own error, by code",
            errors.clone(),
        );
        let ejections = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "upstream_ejections",
            "Times an upstream was taken out of rotation after failures",
            ejections.clone(),
        );
        let upstream_healthy = Family::<UpstreamLabels, Gauge>::default();
        registry.register(
            "upstream_healthy",
            "1 while an upstream is in rotation, 0 while ejected (as of the last scrape)",
            upstream_healthy.clone(),
        );
        let orphaned_streams = Counter::default();
        registry.register(
            "orphaned_streams",
            "Upstream responses read to the end after their client went away",
            orphaned_streams.clone(),
        );
        let orphans_cut = Counter::default();
        registry.register(
            "orphans_cut",
            "Upstream calls cut off when their client left because `limits.max_orphaned_calls` were already draining",
            orphans_cut.clone(),
        );
        let steps_recorded = Counter::default();
        registry.register(
            "steps_recorded",
            "Model calls turned into trajectory steps and queued for the datapool",
            steps_recorded.clone(),
        );
        let steps_captured = Family::<LevelLabels, Counter>::default();
        registry.register(
            "steps_captured",
            "Steps recorded, by what the engine gave of its sampling: tokens (ids and logprobs), logprobs (without ids) or text",
            steps_captured.clone(),
        );
        let capture_findings = Family::<FindingLabels, Counter>::default();
        registry.register(
            "capture_findings",
            "What a trainer must know about recorded steps: trainable steps without logprobs, logprobs without ids, trajectories of a single call",
            capture_findings.clone(),
        );
        let steps_stored = Counter::default();
        registry.register(
            "steps_stored",
            "Steps the datapool accepted (Redis, its spool, or the embedded store)",
            steps_stored.clone(),
        );
        let records_spilled = Counter::default();
        registry.register(
            "records_spilled",
            "Recorder writes the writer's queue had no room for: only in the journal, read back from it (none lost)",
            records_spilled.clone(),
        );
        let completions_taken_over = Counter::default();
        registry.register(
            "completions_taken_over",
            "Completions this replica wrote for trajectories another process had finished and died before writing (recording.completion_lease)",
            completions_taken_over.clone(),
        );
        let completions_short = Counter::default();
        registry.register(
            "completions_short",
            "Completions enqueued before every step they counted arrived: those steps' replica died before writing them (after recording.completion_lease)",
            completions_short.clone(),
        );
        let connections_reclaimed = Counter::default();
        registry.register(
            "connections_reclaimed",
            "Idle client connections closed at limits.max_connections to make room for a new one",
            connections_reclaimed.clone(),
        );
        let records_replayed = Counter::default();
        registry.register(
            "records_replayed",
            "Journal records the writer read back from the file: spilled ones, and a killed process's unfinished work",
            records_replayed.clone(),
        );
        let journal_left_at_start = Gauge::default();
        registry.register(
            "journal_left_at_start_bytes",
            "Journal bytes a stopped predecessor left unapplied, found when this process took its journal (applied before anything new)",
            journal_left_at_start.clone(),
        );
        let journal_append = overhead_buckets();
        registry.register(
            "journal_append_seconds",
            "Appending one call's writes to the journal (page cache, or disk with journal_fsync)",
            journal_append.clone(),
        );
        let end_of_response_wait = overhead_buckets();
        registry.register(
            "end_of_response_wait_seconds",
            "How long the end of a recorded response waited for its step to be numbered in the session state and journaled",
            end_of_response_wait.clone(),
        );
        let session_state: HistogramFamily<SessionOpLabels> =
            Family::new_with_constructor(overhead_buckets);
        registry.register(
            "session_state_seconds",
            "Operations on the shared session state (a Redis script, or a SQLite transaction), by operation",
            session_state.clone(),
        );
        let session_fallbacks = Family::<SessionOpLabels, Counter>::default();
        registry.register(
            "session_fallbacks",
            "Session operations that went to this replica's own state because the shared one did not answer in time",
            session_fallbacks.clone(),
        );
        let records_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "records_dropped",
            "Recording work dropped instead of delaying an agent, by reason",
            records_dropped.clone(),
        );
        let recorder_queue = Gauge::default();
        registry.register(
            "recorder_queue",
            "Writes waiting for the datapool writer",
            recorder_queue.clone(),
        );
        let store_errors = Family::<StoreErrorLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Datapool write attempts that failed, by operation and error (retried while the error is transient)",
            store_errors.clone(),
        );
        let store_writes_lost = Family::<StoreErrorLabels, Counter>::default();
        registry.register(
            "store_writes_lost",
            "Datapool writes refused for good and dropped, by operation and error",
            store_writes_lost.clone(),
        );
        let trajectories_started = Counter::default();
        registry.register(
            "trajectories_started",
            "Trajectories opened by calls or the handshake API",
            trajectories_started.clone(),
        );
        let trajectories_completed = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "trajectories_completed",
            "Trajectories completed, by reason",
            trajectories_completed.clone(),
        );
        let policy_switches = Family::<TenantLabels, Counter>::default();
        registry.register(
            "policy_switches",
            "Times a tenant's calls were switched to a newly published policy",
            policy_switches.clone(),
        );
        let policy_version = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "policy_live_version",
            "The version of the policy that serves each tenant's calls",
            policy_version.clone(),
        );
        let datapool_lag = Family::<ConsumerGroupLabels, Gauge>::default();
        registry.register(
            "datapool_lag",
            "Ready trajectories/groups no member of the consumer group was handed yet, all tenants (as of the last scrape)",
            datapool_lag.clone(),
        );
        let datapool_pending = Family::<ConsumerGroupLabels, Gauge>::default();
        registry.register(
            "datapool_pending",
            "Ready entries handed to a member of the consumer group and not acked yet, all tenants (as of the last scrape)",
            datapool_pending.clone(),
        );
        let filters = clawback_filters::Metrics::default();
        filters.register(&mut registry);
        Self {
            registry,
            filters,
            requests,
            duration,
            added_latency,
            upstream_first_byte,
            in_flight,
            errors,
            ejections,
            upstream_healthy,
            orphaned_streams,
            orphans_cut,
            steps_recorded,
            steps_captured,
            capture_findings,
            steps_stored,
            records_dropped,
            records_spilled,
            records_replayed,
            journal_left_at_start,
            completions_taken_over,
            completions_short,
            connections_reclaimed,
            journal_append,
            end_of_response_wait,
            session_state,
            session_fallbacks,
            recorder_queue,
            store_errors,
            store_writes_lost,
            trajectories_started,
            trajectories_completed,
            policy_switches,
            policy_version,
            datapool_lag,
            datapool_pending,
        }
    }

    /// Sets the lag gauges from every tenant's [`ConsumerGroupLag`]s, summed per group. A group
    /// whose lag the store cannot tell keeps its last value.
    pub fn set_datapool_lag<'a>(&self, lags: impl IntoIterator<Item = &'a ConsumerGroupLag>) {
        let mut per_group: HashMap<&str, (Option<u64>, u64)> = HashMap::new();
        for lag in lags {
            let entry = per_group.entry(lag.group.as_str()).or_insert((Some(0), 0));
            entry.0 = entry.0.zip(lag.undelivered).map(|(a, b)| a + b);
            entry.1 += lag.pending;
        }
        for (group, (undelivered, pending)) in per_group {
            let labels = ConsumerGroupLabels {
                consumer_group: group.to_owned(),
            };
            if let Some(undelivered) = undelivered {
                self.datapool_lag
                    .get_or_create(&labels)
                    .set(i64::try_from(undelivered).unwrap_or(i64::MAX));
            }
            self.datapool_pending
                .get_or_create(&labels)
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
    }

    /// Counts a recorded step's capture level and what it means for training.
    pub fn captured(
        &self,
        capture: clawback_datapool::Capture,
        trainable: bool,
        tokens: &clawback_datapool::Tokens,
    ) {
        self.steps_captured
            .get_or_create(&LevelLabels {
                level: capture.as_str(),
            })
            .inc();
        let has_logprobs = matches!(tokens, clawback_datapool::Tokens::Engine(t)
            if !t.completion_logprobs.is_empty());
        if trainable && !has_logprobs {
            self.finding(Finding::TrainableWithoutLogprobs);
        }
        if capture == clawback_datapool::Capture::Logprobs {
            self.finding(Finding::LogprobsWithoutIds);
        }
    }

    pub fn finding(&self, finding: Finding) {
        self.capture_findings
            .get_or_create(&FindingLabels {
                finding: finding.as_str(),
            })
            .inc();
    }

    /// Steps by capture level and the findings so far, for `/readyz`.
    pub fn capture_summary(&self) -> serde_json::Value {
        use clawback_datapool::Capture;
        let mut steps = serde_json::Map::new();
        for level in [Capture::Tokens, Capture::Logprobs, Capture::Text] {
            let count = self
                .steps_captured
                .get_or_create(&LevelLabels {
                    level: level.as_str(),
                })
                .get();
            steps.insert(level.as_str().to_owned(), count.into());
        }
        let mut findings = serde_json::Map::new();
        for finding in Finding::ALL {
            let count = self
                .capture_findings
                .get_or_create(&FindingLabels {
                    finding: finding.as_str(),
                })
                .get();
            findings.insert(finding.as_str().to_owned(), count.into());
        }
        serde_json::json!({"steps": steps, "findings": findings})
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawback_datapool::ConsumerName;

    fn lag(group: &str, undelivered: Option<u64>, pending: u64) -> ConsumerGroupLag {
        ConsumerGroupLag {
            group: ConsumerName::new(group).expect("valid name"),
            undelivered,
            pending,
        }
    }

    fn line(metrics: &Metrics, prefix: &str) -> Option<String> {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_owned)
    }

    #[test]
    fn lag_is_summed_over_tenants_per_consumer_group() {
        let metrics = Metrics::new();
        metrics.set_datapool_lag(&[lag("trainers", Some(2), 1), lag("trainers", Some(3), 0)]);
        assert_eq!(
            line(&metrics, "clawback_datapool_lag{").as_deref(),
            Some("clawback_datapool_lag{consumer_group=\"trainers\"} 5")
        );
        assert_eq!(
            line(&metrics, "clawback_datapool_pending{").as_deref(),
            Some("clawback_datapool_pending{consumer_group=\"trainers\"} 1")
        );
    }

    #[test]
    fn a_lag_the_store_cannot_tell_keeps_the_last_value() {
        let metrics = Metrics::new();
        metrics.set_datapool_lag(&[lag("trainers", Some(4), 0)]);
        metrics.set_datapool_lag(&[lag("trainers", Some(1), 0), lag("trainers", None, 2)]);
        assert_eq!(
            line(&metrics, "clawback_datapool_lag{").as_deref(),
            Some("clawback_datapool_lag{consumer_group=\"trainers\"} 4")
        );
        assert_eq!(
            line(&metrics, "clawback_datapool_pending{").as_deref(),
            Some("clawback_datapool_pending{consumer_group=\"trainers\"} 2")
        );
    }
}
