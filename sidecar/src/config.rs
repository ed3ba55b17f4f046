//! The sidecar's configuration: one typed struct, loaded from a TOML file, then `CLAWBACK_*`
//! environment variables, then command-line flags — later sources win.
//!
//! Unknown keys are refused (`deny_unknown_fields`) so a typo fails at start with the key's name
//! instead of silently running with a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// What the sidecar forwards to. The kind decides which engine-specific fields later layers may
/// ask for (token ids and logprobs are only requested from vLLM / SGLang).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    Openai,
    Vllm,
    Sglang,
}

/// The datapool's name for the same kind (it records which kind served a step); the config
/// keeps its own enum only because the CLI parses it.
impl From<UpstreamKind> for clawback_datapool::UpstreamKind {
    fn from(kind: UpstreamKind) -> Self {
        match kind {
            UpstreamKind::Openai => Self::Openai,
            UpstreamKind::Vllm => Self::Vllm,
            UpstreamKind::Sglang => Self::Sglang,
        }
    }
}

/// How a request picks among several healthy upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerKind {
    /// Two random healthy upstreams, the one with fewer requests in flight wins.
    PowerOfTwoChoices,
    /// The healthy upstream with the fewest requests in flight (ties: the first).
    LeastOutstanding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the agent-facing listener binds to.
    pub listen: SocketAddr,
    /// Base URLs of the inference backends (`http://host:port` or `http://host:port/v1`).
    pub upstreams: Vec<String>,
    pub upstream_kind: UpstreamKind,
    /// When set, replaces the client's `Authorization` with `Bearer <key>` towards the upstream.
    /// When unset, the client's header is passed through.
    pub upstream_api_key: Option<String>,
    pub balancer: BalancerKind,
    /// Redis (`redis://`, `rediss://`, AUTH in the URL) for recorded trajectories. Unset: the
    /// embedded SQLite store in `data_dir`.
    pub redis: Option<String>,
    /// `redis` is a Redis Cluster: a comma-separated list of seed node URLs.
    pub redis_cluster: bool,
    /// The embedded store, and the spool that keeps steps while Redis is unreachable.
    pub data_dir: PathBuf,
    pub timeouts: Timeouts,
    pub limits: Limits,
    pub health: Health,
    pub tenants: Tenants,
    pub recording: Recording,
    pub admin: Admin,
    /// Per-tenant adapter routing ([`crate::policy`]).
    pub routing: crate::policy::Routing,
    pub log: Log,
    /// Wasm filter plugins that score recorded steps (`--plugins DIR`).
    #[serde(default)]
    pub filters: clawback_filters::FiltersConfig,
}

/// Whose data a call is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenants {
    /// Tenant of calls whose API key is not in `keys`. Unset: such calls get 401.
    pub default: Option<String>,
    /// Take the tenant from `X-Clawback-Tenant` — only when a trusted gateway in front of the
    /// sidecar sets (and strips from clients) that header.
    pub trusted_header: bool,
    /// `"sha256:<hex of the API key>" = "tenant"`: keys are stored hashed, never in clear.
    pub keys: BTreeMap<String, String>,
}

/// How calls are recorded as trajectory steps.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    pub enabled: bool,
    /// A trajectory with no call for this long is completed; its last turn is kept.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A group whose rollouts have not all completed after this long is released as partial.
    #[serde(with = "humantime_serde")]
    pub group_timeout: Duration,
    /// Records waiting for the writer; when full, new ones are dropped and counted, never waited on.
    pub queue_capacity: usize,
    /// Most steps written to the store in one batch.
    pub batch_max: usize,
    /// Live trajectories remembered for stitching calls that carry no session id.
    pub stitch_max_entries: usize,
    /// Applied, in order, to every text of a step before it is stored.
    pub redact: Vec<Redaction>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redaction {
    /// A regular expression (Rust `regex` syntax).
    pub pattern: String,
    pub replacement: String,
}

/// The handshake API (`/trajectories`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Bearer token the handshake API requires. Unset: the handshake API is off.
    pub token: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Time a client has to send its request head.
    #[serde(with = "humantime_serde")]
    pub header_read: Duration,
    /// Time a client has to send its whole request body.
    #[serde(with = "humantime_serde")]
    pub body_read: Duration,
    /// TCP (and TLS) connect to an upstream.
    #[serde(with = "humantime_serde")]
    pub upstream_connect: Duration,
    /// From sending the request to the upstream's response head (prefill of long prompts lives here).
    #[serde(with = "humantime_serde")]
    pub upstream_first_byte: Duration,
    /// Longest gap between two body chunks of an upstream response.
    #[serde(with = "humantime_serde")]
    pub upstream_idle: Duration,
    /// How long an upstream response is still read after its client went away.
    #[serde(with = "humantime_serde")]
    pub orphan_drain: Duration,
    /// After SIGTERM/SIGINT: how long in-flight requests may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Requests served at once; the next one gets 503 with `Retry-After`.
    pub max_concurrent_requests: usize,
    /// Seconds sent in `Retry-After` when shedding load.
    pub retry_after_secs: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Consecutive 5xx answers after which an upstream is ejected (a connect failure ejects at once).
    pub eject_after_5xx: u32,
    /// How long an ejected upstream is skipped before it is tried again.
    #[serde(with = "humantime_serde")]
    pub ejection: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `clawback_sidecar=debug,info`.
    pub filter: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8100)),
            upstreams: vec!["http://127.0.0.1:8000".to_owned()],
            upstream_kind: UpstreamKind::Vllm,
            upstream_api_key: None,
            balancer: BalancerKind::PowerOfTwoChoices,
            redis: None,
            redis_cluster: false,
            data_dir: PathBuf::from("clawback-data"),
            timeouts: Timeouts {
                header_read: Duration::from_secs(10),
                body_read: Duration::from_secs(30),
                upstream_connect: Duration::from_secs(2),
                upstream_first_byte: Duration::from_secs(600),
                upstream_idle: Duration::from_secs(120),
                orphan_drain: Duration::from_secs(600),
                shutdown_grace: Duration::from_secs(30),
            },
            limits: Limits {
                max_body_bytes: 16 * 1024 * 1024,
                max_concurrent_requests: 4096,
                retry_after_secs: 1,
            },
            health: Health {
                eject_after_5xx: 3,
                ejection: Duration::from_secs(10),
            },
            tenants: Tenants {
                default: Some("default".to_owned()),
                trusted_header: false,
                keys: BTreeMap::new(),
            },
            recording: Recording {
                enabled: true,
                idle_timeout: Duration::from_secs(600),
                group_timeout: Duration::from_secs(1800),
                queue_capacity: 8192,
                batch_max: 256,
                stitch_max_entries: 100_000,
                redact: Vec::new(),
            },
            admin: Admin { token: None },
            routing: crate::policy::Routing::default(),
            log: Log {
                format: LogFormat::Text,
                filter: "info".to_owned(),
            },
            filters: clawback_filters::FiltersConfig::default(),
        }
    }
}

/// Values given on the command line (or by their `CLAWBACK_*` variables through clap).
/// Only the ones present override the file.
#[derive(Debug, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstreams: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_kind: Option<UpstreamKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filters: Option<FilterOverrides>,
    /// `key.path=value` pairs, the value in TOML syntax (a bare word is taken as a string).
    #[serde(skip)]
    pub set: Vec<String>,
}

/// `--plugins DIR`: the one filters field with its own flag.
#[derive(Debug, Serialize)]
pub struct FilterOverrides {
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(#[from] Box<figment::Error>),
    #[error("invalid --set {0:?}: expected KEY=VALUE, e.g. limits.max_body_bytes=1048576")]
    BadSet(String),
    #[error("invalid configuration: {0}")]
    Semantic(String),
}

/// Top-level keys that `CLAWBACK_<KEY>` (and `CLAWBACK_<SECTION>__<KEY>`) may set. Other
/// `CLAWBACK_*` variables belong to other clawback processes and are left alone.
const ENV_KEYS: &[&str] = &[
    "listen",
    "upstream_kind",
    "upstream_api_key",
    "balancer",
    "redis",
    "redis_cluster",
    "data_dir",
    "timeouts",
    "limits",
    "health",
    "tenants",
    "recording",
    "admin",
    "routing",
    "log",
    "filters",
];

impl Config {
    /// Defaults, then the file (if any), then the environment, then the overrides.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment = figment.merge(Env::prefixed("CLAWBACK_").split("__").filter(|key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            ENV_KEYS.contains(&top)
        }));
        figment = figment.merge(Serialized::defaults(overrides));
        for pair in &overrides.set {
            figment = figment.merge(Toml::string(&set_to_toml(pair)?));
        }
        let config: Config = figment.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.upstreams.is_empty() {
            return Err(ConfigError::Semantic(
                "`upstreams` is empty: give at least one --upstream URL".to_owned(),
            ));
        }
        for url in &self.upstreams {
            crate::upstream::UpstreamUrl::parse(url)
                .map_err(|e| ConfigError::Semantic(format!("`upstreams`: {e}")))?;
        }
        crate::tenant::TenantResolver::new(&self.tenants)
            .map_err(|e| ConfigError::Semantic(format!("`tenants`: {e}")))?;
        for (i, rule) in self.recording.redact.iter().enumerate() {
            regex::Regex::new(&rule.pattern).map_err(|e| {
                ConfigError::Semantic(format!("`recording.redact[{i}].pattern`: {e}"))
            })?;
        }
        self.routing.check().map_err(ConfigError::Semantic)?;
        if self.filters.dir.is_some() && !self.recording.enabled {
            return Err(ConfigError::Semantic(
                "`filters.dir` is set but `recording.enabled` is off: filters score recorded steps"
                    .to_owned(),
            ));
        }
        if self.limits.max_concurrent_requests == 0 {
            return Err(ConfigError::Semantic(
                "`limits.max_concurrent_requests` must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Turns `limits.max_body_bytes=1024` into a TOML line; a value that is not valid TOML by itself
/// (`log.format=json`) is quoted as a string.
fn set_to_toml(pair: &str) -> Result<String, ConfigError> {
    let (key, value) = pair
        .split_once('=')
        .ok_or_else(|| ConfigError::BadSet(pair.to_owned()))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(ConfigError::BadSet(pair.to_owned()));
    }
    let value = value.trim();
    let line = format!("{key} = {value}");
    if toml_parses(&line) {
        return Ok(line);
    }
    let quoted = format!("{key} = {}", toml_string(value));
    if toml_parses(&quoted) {
        Ok(quoted)
    } else {
        Err(ConfigError::BadSet(pair.to_owned()))
    }
}

fn toml_parses(doc: &str) -> bool {
    Figment::from(Toml::string(doc))
        .extract::<figment::value::Dict>()
        .is_ok()
}

fn toml_string(value: &str) -> String {
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_pair_accepts_numbers_and_bare_words() {
        assert_eq!(
            set_to_toml("limits.max_body_bytes=10").unwrap(),
            "limits.max_body_bytes = 10"
        );
        assert_eq!(
            set_to_toml("log.format=json").unwrap(),
            "log.format = \"json\""
        );
        assert!(set_to_toml("no-equals-sign").is_err());
    }

    #[test]
    fn an_unknown_key_is_named_in_the_error() {
        let overrides = Overrides {
            set: vec!["limits.max_body_byte=10".to_owned()],
            ..Overrides::default()
        };
        let err = Config::load(None, &overrides).unwrap_err().to_string();
        assert!(err.contains("max_body_byte"), "{err}");
    }
}
