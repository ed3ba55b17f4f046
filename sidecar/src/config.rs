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
    /// Speaks Anthropic's Messages API itself: `/v1/messages` passes through unchanged
    /// (recorded text only) and `upstream_api_key` goes as `x-api-key`.
    Anthropic,
}

/// The datapool's name for the same kind (it records which kind served a step); the config
/// keeps its own enum only because the CLI parses it.
impl From<UpstreamKind> for clawback_datapool::UpstreamKind {
    fn from(kind: UpstreamKind) -> Self {
        match kind {
            UpstreamKind::Openai => Self::Openai,
            UpstreamKind::Vllm => Self::Vllm,
            UpstreamKind::Sglang => Self::Sglang,
            UpstreamKind::Anthropic => Self::Anthropic,
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
    pub affinity: Affinity,
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
    /// Which API calls the agent port forwards ([`crate::layers::agent_api`]).
    pub agent_api: crate::layers::agent_api::AgentApiConfig,
    /// Per-tenant adapter routing ([`crate::policy`]).
    pub routing: crate::policy::Routing,
    pub log: Log,
    /// Wasm filter plugins that score recorded steps (`--plugins DIR`).
    #[serde(default)]
    pub filters: clawback_filters::FiltersConfig,
    /// Claw-R1's black-box protocol on the agent port ([`crate::claw_r1`]).
    #[serde(default)]
    pub claw_r1: ClawR1,
}

/// `[claw_r1]`: Claw-R1's gateway protocol, for rollout code written for it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClawR1 {
    /// Off by default: on, whoever holds a tenant's key opens trajectories and posts their
    /// rewards — for rollout fleets, not for agents facing users.
    pub enabled: bool,
    /// Rollouts per prompt (Claw-R1's `rollout.n`): each `prompt_uid` names a group of this
    /// many. 0: no groups, each trajectory stands alone.
    pub group_size: u32,
}

/// Whose data a call is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenants {
    /// Tenant of calls whose API key is not in `keys`; `false`: such calls get 401. (TOML has
    /// no null, and a key removed from the file would fall back to the built-in default.)
    #[serde(with = "default_tenant")]
    pub default: Option<String>,
    /// Take the tenant from `X-Clawback-Tenant` — only when a trusted gateway in front of the
    /// sidecar sets (and strips from clients) that header.
    pub trusted_header: bool,
    /// `"sha256:<hex of the API key>" = "tenant"`: keys are stored hashed, never in clear.
    pub keys: BTreeMap<String, String>,
}

/// `tenants.default`: a tenant name, or `false` for none.
mod default_tenant {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Off(bool),
        Tenant(String),
    }

    pub fn serialize<S: Serializer>(value: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(tenant) => s.serialize_str(tenant),
            None => s.serialize_bool(false),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Off(false) => Ok(None),
            Raw::Tenant(tenant) if !tenant.is_empty() => Ok(Some(tenant)),
            Raw::Off(true) | Raw::Tenant(_) => Err(serde::de::Error::custom(
                "`tenants.default` is a tenant name, or false to answer unknown keys with 401",
            )),
        }
    }
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
    /// A call in flight for this long is taken for one whose replica died: it no longer holds
    /// its trajectory open. Longer than any call (prefill, generation, `orphan_drain`).
    #[serde(with = "humantime_serde")]
    pub stale_call: Duration,
    /// A trajectory's completion not written this long after it finished is taken for one whose
    /// replica died first: the next sweep of any replica writes it (with its trajectory plugins
    /// run again). Likewise a completion that waited this long for steps another replica
    /// numbered but never wrote is enqueued with the steps it has. Longer than the trajectory
    /// plugins take.
    #[serde(with = "humantime_serde")]
    pub completion_lease: Duration,
    /// How long a call waits for the shared session state (Redis) before it goes on with this
    /// replica's own; 0: as long as it takes. Retried meanwhile, so a restarting Redis is
    /// ridden out ([`crate::session::shared`]).
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// Records the writer holds parsed in memory; every record is in the journal
    /// ([`crate::recorder::journal`]) anyway, so past this the writer reads it back from there.
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
    /// first out ([`crate::session::responses`]).
    pub responses_max_bytes: usize,
    /// Largest answer kept as a step, in body bytes; a larger one reaches the agent whole and
    /// is stored truncated (its beginning, no engine tokens, `truncated: true`, not trainable).
    pub max_step_bytes: usize,
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

/// The handshake API (`/trajectories`), the viewer and `/admin/policies`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Bearer token that sees every tenant. Unset (and no `tenant_tokens`): the API is off.
    pub token: Option<String>,
    /// `"sha256:<hex of the token>" = "tenant"`: tokens that see and give feedback to one
    /// tenant's trajectories only (viewer and export included). Stored hashed, as API keys.
    pub tenant_tokens: BTreeMap<String, String>,
    /// Serve the admin API and the viewer on this address only (not on the agent port), e.g.
    /// a port that only the platform's network reaches. Unset: on the agent port.
    pub listen: Option<SocketAddr>,
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
    /// Longest a client may take to accept the next chunk of its response; past it the call is
    /// treated as orphaned (its answer is still read and recorded, not sent).
    #[serde(with = "humantime_serde")]
    pub client_write: Duration,
    /// A client connection with no request in flight is closed after this long.
    #[serde(with = "humantime_serde")]
    pub idle_connection: Duration,
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
    /// Most JSON values (messages, content blocks, each key's value, each item) a request body
    /// may hold: what it expands to in memory is bounded, not only its bytes. More get 400.
    pub max_body_values: usize,
    /// Requests served at once — orphans (calls whose client left while their upstream answer
    /// is still read, so it is recorded) included; the next one gets 503 with `Retry-After`.
    pub max_concurrent_requests: usize,
    /// Client connections open at once (lowered to fit the descriptor limit, `ulimit -n`).
    pub max_connections: usize,
    /// Orphans at once; a call whose client leaves beyond this has its upstream call cut off
    /// (and is not recorded).
    pub max_orphaned_calls: usize,
    /// Seconds sent in `Retry-After` when shedding load.
    pub retry_after_secs: u32,
    /// The most of each bound every tenant draws on (`max_concurrent_requests`, Claw-R1's open
    /// trajectories) one tenant may hold, as a fraction: past it the tenant gets 429 while the
    /// others are served. 1 turns fair shares off; a sidecar with one tenant gives it the whole.
    pub tenant_share: f64,
}

/// Session affinity: the calls of one session go to the same upstream while it is healthy and
/// not overloaded, so the engine's prefix cache holds the conversation so far.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    pub enabled: bool,
    /// An upstream takes a session's call while its calls in flight stay within this many times
    /// the pool's average (consistent hashing with bounded loads); past it, the balancer picks.
    pub load_factor: f64,
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
            affinity: Affinity {
                enabled: true,
                load_factor: 1.25,
            },
            redis: None,
            redis_cluster: false,
            data_dir: PathBuf::from("clawback-data"),
            timeouts: Timeouts {
                header_read: Duration::from_secs(10),
                body_read: Duration::from_secs(30),
                upstream_connect: Duration::from_secs(2),
                upstream_first_byte: Duration::from_secs(600),
                upstream_idle: Duration::from_secs(120),
                idle_connection: Duration::from_secs(60),
                client_write: Duration::from_secs(60),
                orphan_drain: Duration::from_secs(600),
                shutdown_grace: Duration::from_secs(30),
            },
            limits: Limits {
                max_body_bytes: 16 * 1024 * 1024,
                max_body_values: 1 << 18,
                max_concurrent_requests: 4096,
                max_orphaned_calls: 256,
                max_connections: 16_384,
                retry_after_secs: 1,
                tenant_share: 0.5,
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
                stale_call: Duration::from_secs(3600),
                completion_lease: Duration::from_secs(60),
                session_timeout: Duration::from_millis(500),
                queue_capacity: 8192,
                queue_bytes: 4 << 20,
                batch_max: 256,
                journal_fsync: false,
                responses_max_bytes: 64 << 20,
                max_step_bytes: 8 << 20,
                redact: Vec::new(),
            },
            admin: Admin {
                token: None,
                tenant_tokens: BTreeMap::new(),
                listen: None,
            },
            agent_api: crate::layers::agent_api::AgentApiConfig::default(),
            routing: crate::policy::Routing::default(),
            log: Log {
                format: LogFormat::Text,
                filter: "info".to_owned(),
            },
            filters: clawback_filters::FiltersConfig::default(),
            claw_r1: ClawR1::default(),
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
/// `CLAWBACK_*` variables belong to other clawback processes and are left alone. A unit test
/// checks that every field of [`Config`] is here.
const ENV_KEYS: &[&str] = &[
    "listen",
    "upstreams",
    "upstream_kind",
    "upstream_api_key",
    "balancer",
    "affinity",
    "redis",
    "redis_cluster",
    "data_dir",
    "timeouts",
    "limits",
    "health",
    "tenants",
    "recording",
    "admin",
    "agent_api",
    "routing",
    "log",
    "filters",
    "claw_r1",
];

/// Whether the environment key (prefix stripped, `__` already turned into `.`) is one of ours.
/// Environment keys keep the case they were written in (`LIMITS.MAX_BODY_BYTES`): the match is
/// on the lower-cased first part, as figment lower-cases the key itself.
fn is_env_key(key: &str) -> bool {
    let top = key.split('.').next().unwrap_or_default();
    ENV_KEYS.iter().any(|k| k.eq_ignore_ascii_case(top))
}

impl Config {
    /// Defaults, then the file (if any), then the environment, then the overrides.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment = figment.merge(
            Env::prefixed("CLAWBACK_")
                .split("__")
                .filter(|key| is_env_key(key.as_str())),
        );
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
        crate::layers::agent_api::AllowList::new(&self.agent_api)
            .map_err(|e| ConfigError::Semantic(e.to_string()))?;
        if self.filters.dir.is_some() && !self.recording.enabled {
            return Err(ConfigError::Semantic(
                "`filters.dir` is set but `recording.enabled` is off: filters score recorded steps"
                    .to_owned(),
            ));
        }
        crate::handshake::auth::AdminAuth::new(&self.admin)
            .map_err(|e| ConfigError::Semantic(format!("`admin.tenant_tokens`: {e}")))?;
        if let Some(token) = &self.admin.token {
            if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ConfigError::Semantic(
                    "`admin.token` is empty or holds white space: set a long random token, or leave it unset to keep the API off".to_owned(),
                ));
            }
        }
        if !(self.limits.tenant_share > 0.0 && self.limits.tenant_share <= 1.0) {
            return Err(ConfigError::Semantic(format!(
                "`limits.tenant_share` must be in (0, 1], not {}",
                self.limits.tenant_share
            )));
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
        jailed(|_| {
            let err = Config::load(None, &overrides).unwrap_err().to_string();
            assert!(err.contains("max_body_byte"), "{err}");
        });
    }

    /// Runs `f` with the process environment to itself: tests that set `CLAWBACK_*` variables
    /// and tests that load a config must not see each other's.
    // figment's own signature: its error is large.
    #[allow(clippy::result_large_err)]
    fn jailed(f: impl FnOnce(&mut figment::Jail)) {
        figment::Jail::expect_with(|jail| {
            f(jail);
            Ok(())
        });
    }

    fn example_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/clawback.example.toml")
    }

    /// Every leaf of the example config, `section.key` → value, plus the keys the example only
    /// shows in comments (they have no default).
    fn documented_settings() -> Vec<(String, figment::value::Value)> {
        use figment::value::Value;
        fn walk(prefix: &str, dict: &figment::value::Dict, out: &mut Vec<(String, Value)>) {
            for (key, value) in dict {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match value {
                    Value::Dict(_, inner) if !inner.is_empty() => walk(&path, inner, out),
                    Value::Dict(..) => {}
                    _ => out.push((path, value.clone())),
                }
            }
        }
        let example: figment::value::Dict = Figment::from(Toml::file_exact(example_path()))
            .extract()
            .expect("the example config parses");
        let mut out = Vec::new();
        walk("", &example, &mut out);
        for (key, value) in [
            ("upstream_api_key", "sk-upstream-test"),
            ("redis", "redis://127.0.0.1:1"),
            ("admin.token", "admin-token-0123456789"),
            ("routing.base_model", "Qwen/Qwen3-8B"),
            ("filters.dir", "/tmp/clawback-plugins"),
        ] {
            out.push((key.to_owned(), Value::from(value)));
        }
        out
    }

    /// A value for `key` that differs from the example's, so that a setting that is ignored
    /// shows: flipped, one more, or another valid word.
    fn another(key: &str, value: &figment::value::Value) -> figment::value::Value {
        use figment::value::{Num, Value};
        let word = match key {
            "listen" => Some("127.0.0.1:8199"),
            "upstream_kind" => Some("sglang"),
            "balancer" => Some("least_outstanding"),
            "data_dir" => Some("/tmp/clawback-elsewhere"),
            "tenants.default" => Some("someone-else"),
            "log.format" => Some("json"),
            "log.filter" => Some("debug"),
            _ => None,
        };
        if let Some(word) = word {
            return Value::from(word);
        }
        match value {
            Value::Bool(tag, b) => Value::Bool(*tag, !b),
            // A fraction stays one.
            Value::Num(tag, Num::F64(f)) if key == "limits.tenant_share" => {
                Value::Num(*tag, Num::F64(f / 2.0))
            }
            Value::Num(tag, Num::F64(f)) => Value::Num(*tag, Num::F64(f + 1.0)),
            Value::Num(tag, n) => Value::Num(*tag, Num::from(n.to_u128().unwrap_or(0) as u64 + 1)),
            Value::String(_, s) => match humantime::parse_duration(s) {
                Ok(d) => {
                    Value::from(humantime::format_duration(d + Duration::from_secs(1)).to_string())
                }
                Err(_) => Value::from(format!("{s}-x")),
            },
            Value::Array(_, items) if key == "recording.redact" && items.is_empty() => {
                let mut rule = figment::value::Dict::new();
                rule.insert("pattern".to_owned(), Value::from("sk-[a-z]+"));
                rule.insert("replacement".to_owned(), Value::from("[key]"));
                Value::from(vec![Value::from(rule)])
            }
            Value::Array(_, items) if key == "upstreams" || items.is_empty() => {
                let item = if key == "upstreams" {
                    "http://127.0.0.1:9"
                } else {
                    "other-name"
                };
                Value::from(vec![Value::from(item)])
            }
            Value::Array(_, items) => Value::from(items[..1].to_vec()),
            other => other.clone(),
        }
    }

    /// `value` as the environment or `--set` writes it (TOML syntax).
    fn written(value: &figment::value::Value) -> String {
        use figment::value::Value;
        match value {
            Value::String(_, s) => toml_string(s),
            Value::Array(_, items) => {
                let items: Vec<String> = items.iter().map(written).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Bool(_, b) => b.to_string(),
            Value::Num(_, figment::value::Num::F64(f)) => format!("{f:?}"),
            Value::Num(_, n) => n
                .to_u128()
                .map_or_else(|| format!("{n:?}"), |n| n.to_string()),
            Value::Dict(_, dict) => {
                let entries: Vec<String> = dict
                    .iter()
                    .map(|(k, v)| format!("{k}={}", written(v)))
                    .collect();
                format!("{{{}}}", entries.join(","))
            }
            other => panic!("no written form for {other:?}"),
        }
    }

    /// The loaded config's value at `key`, with durations as `Duration`s.
    fn loaded_at(config: &Config, key: &str) -> String {
        let value = Figment::from(Serialized::defaults(config))
            .find_value(key)
            .unwrap_or_else(|e| panic!("{key} is not in the loaded config: {e}"));
        normalise(&value)
    }

    fn normalise(value: &figment::value::Value) -> String {
        match value {
            figment::value::Value::String(_, s) => match humantime::parse_duration(s) {
                Ok(d) => format!("{d:?}"),
                Err(_) => s.clone(),
            },
            other => written(other),
        }
    }

    #[test]
    fn every_documented_setting_is_settable_by_environment_and_by_set() {
        let settings = documented_settings();
        assert!(
            settings.len() > 30,
            "the example lists {} keys",
            settings.len()
        );
        for (key, value) in &settings {
            let want = another(key, value);
            let env_name = format!("CLAWBACK_{}", key.replace('.', "__").to_uppercase());
            jailed(|jail| {
                let overrides = Overrides {
                    set: vec![format!("{key}={}", written(&want))],
                    ..Overrides::default()
                };
                let config = Config::load(None, &overrides)
                    .unwrap_or_else(|e| panic!("--set {key}={}: {e}", written(&want)));
                assert_eq!(loaded_at(&config, key), normalise(&want), "--set {key}");
                jail.set_env(&env_name, written(&want));
                let config = Config::load(None, &Overrides::default())
                    .unwrap_or_else(|e| panic!("{env_name}={}: {e}", written(&want)));
                assert_eq!(loaded_at(&config, key), normalise(&want), "{env_name}");
            });
        }
    }

    #[test]
    fn every_field_of_the_config_is_an_environment_key() {
        let config = Config {
            upstream_api_key: Some("k".to_owned()),
            redis: Some("redis://x".to_owned()),
            ..Config::default()
        };
        let fields: figment::value::Dict = Figment::from(Serialized::defaults(&config))
            .extract()
            .unwrap();
        for field in fields.keys() {
            assert!(
                is_env_key(field),
                "CLAWBACK_{} is not read",
                field.to_uppercase()
            );
        }
        assert!(!is_env_key("config") && !is_env_key("plugins"));
    }

    #[test]
    fn the_default_tenant_can_be_switched_off() {
        jailed(|jail| {
            let overrides = Overrides {
                set: vec!["tenants.default=false".to_owned()],
                ..Overrides::default()
            };
            let config = Config::load(None, &overrides).unwrap();
            assert_eq!(config.tenants.default, None);
            for bad in ["tenants.default=true", "tenants.default=\"\""] {
                let overrides = Overrides {
                    set: vec![bad.to_owned()],
                    ..Overrides::default()
                };
                assert!(Config::load(None, &overrides).is_err(), "{bad}");
            }
            jail.set_env("CLAWBACK_TENANTS__DEFAULT", "false");
            let config = Config::load(None, &Overrides::default()).unwrap();
            assert_eq!(config.tenants.default, None);
        });
    }

    #[test]
    fn an_empty_or_blank_admin_token_refuses_to_start() {
        for token in ["\"\"", "\" \"", "\"tok en\"", "\"token \""] {
            let overrides = Overrides {
                set: vec![format!("admin.token={token}")],
                ..Overrides::default()
            };
            jailed(|_| {
                let err = Config::load(None, &overrides).unwrap_err().to_string();
                assert!(err.contains("admin.token"), "{token}: {err}");
            });
        }
    }
}
