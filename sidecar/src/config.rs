//! The sidecar's configuration: one typed struct, loaded from a TOML file, then `CLAWBACK_*`
//! environment variables, then command-line flags — later sources win.
//!
//! Unknown keys are refused (`deny_unknown_fields`) so a typo fails at start with the key's name
//! instead of silently running with a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use crate::control_plane::claw_r1::ClawR1;
pub use crate::control_plane::handshake::auth::Admin;
pub use crate::data_plane::bounds::{Limits, Timeouts};
pub use crate::data_plane::recorder::settings::{Recording, Redaction};
pub use crate::data_plane::tenant::Tenants;
pub use crate::data_plane::upstream::{Affinity, BalancerKind, Health, UpstreamKind};
pub use crate::telemetry::{Log, LogFormat};

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Which API calls the agent port forwards ([`crate::data_plane::layers::agent_api`]).
    pub agent_api: crate::data_plane::layers::agent_api::AgentApiConfig,
    /// Per-tenant adapter routing ([`crate::data_plane::policy`]).
    pub routing: crate::data_plane::policy::Routing,
    /// Which body fields reach the engine ([`crate::data_plane::engine_fields`]).
    pub forwarding: crate::data_plane::engine_fields::Forwarding,
    pub log: Log,
    /// Wasm filter plugins that score recorded steps (`--plugins DIR`).
    #[serde(default)]
    pub filters: clawback_filters::FiltersConfig,
    /// Claw-R1's black-box protocol on the agent port ([`crate::control_plane::claw_r1`]).
    #[serde(default)]
    pub claw_r1: ClawR1,
}

/// The configuration file's JSON Schema: every key, its type and its doc comment (what
/// `clawback-sidecar config-schema` prints and the book's reference is rendered from).
pub fn schema() -> schemars::Schema {
    schemars::schema_for!(Config)
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8100)),
            upstreams: vec!["http://127.0.0.1:8000".to_owned()],
            upstream_kind: UpstreamKind::Vllm,
            upstream_api_key: None,
            balancer: BalancerKind::PowerOfTwoChoices,
            affinity: Affinity::default(),
            redis: None,
            redis_cluster: false,
            data_dir: PathBuf::from("clawback-data"),
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            health: Health::default(),
            tenants: Tenants::default(),
            recording: Recording::default(),
            admin: Admin::default(),
            agent_api: crate::data_plane::layers::agent_api::AgentApiConfig::default(),
            routing: crate::data_plane::policy::Routing::default(),
            forwarding: crate::data_plane::engine_fields::Forwarding::default(),
            log: Log::default(),
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
    "forwarding",
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
    /// Where the datapool is.
    pub fn store(&self) -> crate::data_plane::store::Location<'_> {
        crate::data_plane::store::Location {
            redis: self.redis.as_deref(),
            redis_cluster: self.redis_cluster,
            data_dir: &self.data_dir,
        }
    }

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
            crate::data_plane::upstream::UpstreamUrl::parse(url)
                .map_err(|e| ConfigError::Semantic(format!("`upstreams`: {e}")))?;
        }
        crate::data_plane::tenant::TenantResolver::new(&self.tenants)
            .map_err(|e| ConfigError::Semantic(format!("`tenants`: {e}")))?;
        for (i, rule) in self.recording.redact.iter().enumerate() {
            regex::Regex::new(&rule.pattern).map_err(|e| {
                ConfigError::Semantic(format!("`recording.redact[{i}].pattern`: {e}"))
            })?;
        }
        self.routing.check().map_err(ConfigError::Semantic)?;
        self.forwarding.check().map_err(ConfigError::Semantic)?;
        crate::data_plane::layers::agent_api::AllowList::new(&self.agent_api)
            .map_err(|e| ConfigError::Semantic(e.to_string()))?;
        if self.filters.dir.is_some() && !self.recording.enabled {
            return Err(ConfigError::Semantic(
                "`filters.dir` is set but `recording.enabled` is off: filters score recorded steps"
                    .to_owned(),
            ));
        }
        crate::control_plane::handshake::auth::AdminAuth::new(&self.admin)
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
    use std::time::Duration;

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
