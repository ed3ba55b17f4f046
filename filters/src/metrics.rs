//! The filter host's Prometheus metrics, registered into the sidecar's registry. The `plugin`
//! label is a plugin's file name, chosen by the operator: low cardinality.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A plugin's name as a label value, shared rather than copied per call.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub struct PluginName(pub Arc<str>);

impl EncodeLabelValue for PluginName {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, &self.0)
    }
}

impl std::fmt::Display for PluginName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub plugin: PluginName,
    /// `score`, `no_opinion` or `filter_error`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub plugin: PluginName,
    /// `fuel`, `timeout`, `out_of_memory`, `trap`, `judge_budget`, `invalid_output`,
    /// `instantiate`, `sandbox`.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: PluginName,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JudgeLabels {
    pub plugin: PluginName,
    /// `answered`, `timeout`, `unreachable`, `error_status`, `bad_body`, `no_content`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub plugin: PluginName,
    /// `loaded` or `refused`.
    pub result: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn call_buckets() -> Histogram {
    // 10 µs .. ~40 s: a pure heuristic up to a judge vote.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 22))
}

fn fuel_buckets() -> Histogram {
    // 10 thousand .. ~40 billion units: a trivial check up to past any sane budget.
    Histogram::new(exponential_buckets(10_000.0, 4.0, 12))
}

/// Cheap to clone: every family is shared.
#[derive(Clone)]
pub struct Metrics {
    pub calls: Family<CallLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub duration: HistogramFamily<PluginLabels>,
    pub fuel: HistogramFamily<PluginLabels>,
    /// Calls tried again after failing for the host's reasons.
    pub host_retries: Family<PluginLabels, Counter>,
    pub disabled: Family<PluginLabels, Gauge>,
    pub judge_requests: Family<JudgeLabels, Counter>,
    pub reloads: Family<ReloadLabels, Counter>,
    /// Steps or trajectories not evaluated because the filter queue was full.
    pub dropped: Counter,
    /// Trajectories forgotten from memory at `max_live` (read back from the datapool).
    pub forgotten: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(call_buckets),
            fuel: Family::new_with_constructor(fuel_buckets),
            host_retries: Family::default(),
            disabled: Family::default(),
            judge_requests: Family::default(),
            reloads: Family::default(),
            dropped: Counter::default(),
            forgotten: Counter::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under `clawback_filter_*`.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("filter");
        registry.register(
            "calls",
            "Plugin calls, by plugin and outcome",
            self.calls.clone(),
        );
        registry.register(
            "errors",
            "Plugin calls that ended as filter_error, by plugin and reason",
            self.errors.clone(),
        );
        registry.register(
            "call_duration_seconds",
            "Duration of one plugin call, judge calls included",
            self.duration.clone(),
        );
        registry.register(
            "fuel_used",
            "Fuel (units of Wasm work) one plugin call burnt, of its filters.fuel budget",
            self.fuel.clone(),
        );
        registry.register(
            "host_retries",
            "Plugin calls tried again because they failed for the host's reasons (the call_timeout backstop)",
            self.host_retries.clone(),
        );
        registry.register(
            "disabled",
            "1 while a plugin is switched off by its circuit breaker",
            self.disabled.clone(),
        );
        registry.register(
            "judge_requests",
            "Judge requests made for plugins, by outcome",
            self.judge_requests.clone(),
        );
        registry.register(
            "reloads",
            "Plugin files (re)loaded or refused",
            self.reloads.clone(),
        );
        registry.register(
            "dropped",
            "Steps and trajectories left unevaluated because the filter queue was full",
            self.dropped.clone(),
        );
        registry.register(
            "forgotten",
            "Trajectories the host stopped keeping in memory at filters.max_live (read back from the datapool when needed)",
            self.forgotten.clone(),
        );
    }
}
