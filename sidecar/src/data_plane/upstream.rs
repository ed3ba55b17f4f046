//! The inference backends: their addresses, passive health and the balancer that picks one.
//!
//! Health is passive: a connect failure ejects a backend at once, a run of gateway failures
//! (502/503/504, a connection that broke before or during the answer) ejects it after a
//! threshold; after the ejection period it is simply eligible again and the next real request is
//! its probe. There is no active health checking, so an idle sidecar sends nothing.
//!
//! One tenant must not be able to trip health for all (Envoy's outlier detection makes the same
//! two choices):
//! - answers a request can cause — 4xx, and a plain 500 (vLLM's answer to an input that breaks
//!   it) — never count; only failures of the engine as a service do;
//! - **panic mode**: when every backend is ejected, the ones ejected for failed answers are used
//!   anyway (the balancer ignores their ejection) instead of failing every tenant's calls. Only
//!   backends that refused connections — which no request can cause — are skipped then, and
//!   `/readyz` goes red only when every backend is such a one.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme, Uri};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// What the sidecar forwards to. The kind decides which engine-specific fields later layers may
/// ask for (token ids and logprobs are only requested from vLLM / SGLang).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema,
)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BalancerKind {
    /// Two random healthy upstreams, the one with fewer requests in flight wins.
    PowerOfTwoChoices,
    /// The healthy upstream with the fewest requests in flight (ties: the first).
    LeastOutstanding,
}

/// Session affinity: the calls of one session go to the same upstream while it is healthy and
/// not overloaded, so the engine's prefix cache holds the conversation so far.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    /// Keep a session's calls on one upstream; `false`: every call goes where the balancer picks.
    pub enabled: bool,
    /// An upstream takes a session's call while its calls in flight stay within this many times
    /// the pool's average (consistent hashing with bounded loads); past it, the balancer picks.
    pub load_factor: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Consecutive 5xx answers after which an upstream is ejected (a connect failure ejects at once).
    pub eject_after_5xx: u32,
    /// How long an ejected upstream is skipped before it is tried again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub ejection: Duration,
}

impl Default for Affinity {
    fn default() -> Self {
        Self {
            enabled: true,
            load_factor: 1.25,
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Self {
            eject_after_5xx: 3,
            ejection: Duration::from_secs(10),
        }
    }
}

/// A backend's base address, split so a request path can be appended cheaply.
#[derive(Debug, Clone)]
pub struct UpstreamUrl {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Path prefix without a trailing `/v1` (that comes with every forwarded path).
    pub base_path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamUrlError {
    #[error("{url:?} is not a valid URL: {source}")]
    Unparsable {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("{0:?} must start with http:// or https://")]
    Scheme(String),
    #[error("{0:?} has no host")]
    NoHost(String),
    #[error("{0:?} must not carry a query string")]
    Query(String),
    #[error("{0:?} carries a user or password: set the credential as upstream_api_key (CLAWBACK_UPSTREAM_API_KEY), never in the URL, where logs and metrics would show it")]
    Credentials(String),
}

impl UpstreamUrl {
    pub fn parse(url: &str) -> Result<Self, UpstreamUrlError> {
        let uri: Uri = url.parse().map_err(|source| UpstreamUrlError::Unparsable {
            url: url.to_owned(),
            source,
        })?;
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
            _ => return Err(UpstreamUrlError::Scheme(url.to_owned())),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| UpstreamUrlError::NoHost(url.to_owned()))?;
        if authority.as_str().contains('@') {
            let host = authority.as_str().rsplit('@').next().unwrap_or_default();
            return Err(UpstreamUrlError::Credentials(format!(
                "{scheme}://***@{host}{}",
                uri.path()
            )));
        }
        if uri.query().is_some() {
            return Err(UpstreamUrlError::Query(url.to_owned()));
        }
        let path = uri.path().trim_end_matches('/');
        let base_path = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        Ok(Self {
            scheme,
            authority,
            base_path,
        })
    }

    /// `host:port`: the name logs and metrics show (a URL with credentials is refused).
    pub fn name(&self) -> String {
        match self.authority.port() {
            Some(port) => format!("{}:{port}", self.authority.host()),
            None => self.authority.host().to_owned(),
        }
    }

    /// The URI for `path_and_query`, which starts with `/v1/`.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
    }
}

/// One backend and what the balancer knows about it.
#[derive(Debug)]
pub struct Upstream {
    /// `host:port`, the metric label and log name.
    pub name: Arc<str>,
    pub url: UpstreamUrl,
    in_flight: AtomicUsize,
    consecutive_failures: AtomicU32,
    /// Milliseconds since the pool's epoch until which this backend is skipped; 0 = healthy.
    ejected_until_ms: AtomicU64,
    /// Whether the last ejection was for a refused connection (no panic mode for it).
    refused: AtomicBool,
}

impl Upstream {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Marks one request as outstanding on an upstream until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Upstream>);

impl InFlight {
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why an upstream is being reported unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection was refused or timed out: the engine is not there.
    Connect,
    /// 502/503/504, or the connection broke before or during the answer.
    Gateway,
}

/// What an answer's status says about the engine's health.
pub fn status_health(status: http::StatusCode) -> Option<Failure> {
    match status.as_u16() {
        502..=504 => Some(Failure::Gateway),
        _ => None,
    }
}

/// Something that happened to an upstream's health, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    Unchanged,
    Ejected,
}

#[derive(Debug)]
pub struct Pool {
    upstreams: Vec<Arc<Upstream>>,
    balancer: BalancerKind,
    /// Session affinity's load bound ([`Affinity`]); `None`: off.
    affinity_load: Option<f64>,
    health: Health,
    epoch: Instant,
}

impl Pool {
    pub fn new(
        urls: &[String],
        balancer: BalancerKind,
        health: Health,
    ) -> Result<Self, UpstreamUrlError> {
        let upstreams = urls
            .iter()
            .map(|raw| {
                let url = UpstreamUrl::parse(raw)?;
                Ok(Arc::new(Upstream {
                    name: Arc::from(url.name()),
                    url,
                    in_flight: AtomicUsize::new(0),
                    consecutive_failures: AtomicU32::new(0),
                    ejected_until_ms: AtomicU64::new(0),
                    refused: AtomicBool::new(false),
                }))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            upstreams,
            balancer,
            affinity_load: None,
            health,
            epoch: Instant::now(),
        })
    }

    /// Turns session affinity on, bounded at `load_factor` times the average load.
    pub fn with_affinity(mut self, affinity: Affinity) -> Self {
        self.affinity_load = affinity.enabled.then_some(affinity.load_factor.max(1.0));
        self
    }

    pub fn all(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    pub fn is_healthy(&self, upstream: &Upstream) -> bool {
        upstream.ejected_until_ms.load(Ordering::Relaxed) <= self.now_ms()
    }

    pub fn healthy_count(&self) -> usize {
        self.upstreams.iter().filter(|u| self.is_healthy(u)).count()
    }

    /// Whether calls can be served: some backend is healthy, or panic mode has one to use.
    pub fn can_serve(&self) -> bool {
        self.upstreams
            .iter()
            .any(|u| self.is_healthy(u) || !u.refused.load(Ordering::Relaxed))
    }

    /// Picks a healthy upstream not in `exclude` and marks a request in flight on it; with none
    /// healthy, one ejected for failed answers (panic mode, see the module docs).
    pub fn pick(&self, exclude: &[Arc<str>]) -> Option<InFlight> {
        self.pick_for(exclude, None)
    }

    /// Picks an upstream for a call of session `key` (its name or opening): with affinity on,
    /// the one the key hashes to first (rendezvous hashing: a session moves only when its upstream
    /// leaves) among those whose calls in flight stay within the load bound — Mirrokni et al.'s
    /// consistent hashing with bounded loads — else what the balancer picks.
    pub fn pick_for(&self, exclude: &[Arc<str>], key: Option<u128>) -> Option<InFlight> {
        let eligible = |u: &&Arc<Upstream>| !exclude.contains(&u.name);
        let mut candidates: Vec<&Arc<Upstream>> = self
            .upstreams
            .iter()
            .filter(eligible)
            .filter(|u| self.is_healthy(u))
            .collect();
        if candidates.is_empty() {
            candidates = self
                .upstreams
                .iter()
                .filter(eligible)
                .filter(|u| !u.refused.load(Ordering::Relaxed))
                .collect();
        }
        let affine = match (self.affinity_load, key) {
            (Some(load_factor), Some(key)) if candidates.len() > 1 => {
                bounded_rendezvous(&candidates, key, load_factor)
            }
            _ => None,
        };
        let chosen = match (affine, self.balancer, candidates.len()) {
            (_, _, 0) => return None,
            (Some(upstream), _, _) => upstream,
            (None, _, 1) => candidates[0],
            (None, BalancerKind::PowerOfTwoChoices, n) => {
                let mut rng = rand::rng();
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                if candidates[b].in_flight() < candidates[a].in_flight() {
                    candidates[b]
                } else {
                    candidates[a]
                }
            }
            (None, BalancerKind::LeastOutstanding, _) => candidates
                .iter()
                .min_by_key(|u| u.in_flight())
                .copied()
                .unwrap_or(candidates[0]),
        };
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(InFlight(Arc::clone(chosen)))
    }

    pub fn report_success(&self, upstream: &Upstream) {
        upstream.consecutive_failures.store(0, Ordering::Relaxed);
        upstream.refused.store(false, Ordering::Relaxed);
    }

    pub fn report_failure(&self, upstream: &Upstream, failure: Failure) -> HealthChange {
        let eject = match failure {
            Failure::Connect => true,
            Failure::Gateway => {
                let run = upstream
                    .consecutive_failures
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                run >= self.health.eject_after_5xx
            }
        };
        if !eject {
            return HealthChange::Unchanged;
        }
        upstream.consecutive_failures.store(0, Ordering::Relaxed);
        upstream
            .refused
            .store(failure == Failure::Connect, Ordering::Relaxed);
        let until = self.now_ms() + duration_ms(self.health.ejection);
        upstream.ejected_until_ms.store(until, Ordering::Relaxed);
        HealthChange::Ejected
    }

    fn now_ms(&self) -> u64 {
        // Offset by one so that 0 always means "never ejected".
        duration_ms(self.epoch.elapsed()) + 1
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The first of `candidates` in `key`'s rendezvous order whose calls in flight, with this one,
/// stay within `load_factor` times the average (rounded up); `None` when none does.
fn bounded_rendezvous<'a>(
    candidates: &[&'a Arc<Upstream>],
    key: u128,
    load_factor: f64,
) -> Option<&'a Arc<Upstream>> {
    let total: usize = candidates.iter().map(|u| u.in_flight()).sum::<usize>() + 1;
    let bound = (load_factor * total as f64 / candidates.len() as f64).ceil() as usize;
    let weight = |upstream: &Upstream| {
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        hasher.update(&key.to_le_bytes());
        hasher.update(upstream.name.as_bytes());
        hasher.digest()
    };
    let mut ordered: Vec<(u64, &'a Arc<Upstream>)> =
        candidates.iter().map(|u| (weight(u), *u)).collect();
    ordered.sort_unstable_by_key(|(weight, _)| std::cmp::Reverse(*weight));
    ordered
        .into_iter()
        .map(|(_, upstream)| upstream)
        .find(|upstream| upstream.in_flight() < bound)
}

#[cfg(test)]
mod affinity_tests {
    use super::Affinity;
    use super::*;

    fn pool(n: usize) -> Pool {
        let urls: Vec<String> = (0..n).map(|i| format!("http://10.0.0.{i}:8000")).collect();
        Pool::new(
            &urls,
            BalancerKind::PowerOfTwoChoices,
            Health {
                eject_after_5xx: 3,
                ejection: std::time::Duration::from_secs(30),
            },
        )
        .unwrap()
        .with_affinity(Affinity {
            enabled: true,
            load_factor: 1.25,
        })
    }

    #[test]
    fn a_sessions_calls_go_to_one_upstream_and_sessions_spread_over_all() {
        let pool = pool(4);
        let mut used = std::collections::HashSet::new();
        for key in 0..64u128 {
            let first = pool
                .pick_for(&[], Some(key))
                .unwrap()
                .upstream()
                .name
                .clone();
            for _ in 0..5 {
                let again = pool.pick_for(&[], Some(key)).unwrap();
                assert_eq!(again.upstream().name, first, "session {key} moved");
            }
            used.insert(first);
        }
        assert_eq!(used.len(), 4, "sessions do not spread: {used:?}");
    }

    #[test]
    fn a_loaded_upstream_spills_and_a_gone_one_moves_only_its_sessions() {
        let pool = pool(2);
        let home = pool.pick_for(&[], Some(7)).unwrap().upstream().name.clone();
        // Calls of the session held in flight: past 1.25 × the average the next one spills.
        let held: Vec<InFlight> = (0..4)
            .map(|_| pool.pick_for(&[], Some(7)).unwrap())
            .collect();
        let homes = held.iter().filter(|f| f.upstream().name == home).count();
        assert!(
            homes < 4,
            "the bound did not hold: {homes} of 4 on one upstream"
        );
        drop(held);
        // Excluded (a failed connect), the session goes elsewhere and comes back after.
        let other = pool.pick_for(std::slice::from_ref(&home), Some(7)).unwrap();
        assert_ne!(other.upstream().name, home);
        drop(other);
        assert_eq!(pool.pick_for(&[], Some(7)).unwrap().upstream().name, home);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize, balancer: BalancerKind) -> Pool {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 9000 + i))
            .collect();
        Pool::new(
            &urls,
            balancer,
            Health {
                eject_after_5xx: 2,
                ejection: Duration::from_secs(60),
            },
        )
        .unwrap()
    }

    #[test]
    fn a_v1_suffix_in_the_upstream_url_is_not_doubled() {
        let url = UpstreamUrl::parse("https://api.example.com/v1/").unwrap();
        assert_eq!(
            url.join("/v1/models").unwrap().to_string(),
            "https://api.example.com/v1/models"
        );
        let url = UpstreamUrl::parse("http://10.0.0.1:8000/proxy").unwrap();
        assert_eq!(
            url.join("/v1/models?x=1").unwrap().to_string(),
            "http://10.0.0.1:8000/proxy/v1/models?x=1"
        );
        assert!(UpstreamUrl::parse("ftp://x").is_err());
    }

    #[test]
    fn an_upstream_url_with_credentials_is_refused_without_showing_them() {
        for url in [
            "http://user:s3cret@10.0.0.1:8000/v1",
            "https://:s3cret@api.example.com/proxy",
            "http://s3cret@x:1",
        ] {
            let err = UpstreamUrl::parse(url).unwrap_err();
            assert!(matches!(err, UpstreamUrlError::Credentials(_)), "{url}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        assert_eq!(
            UpstreamUrl::parse("http://10.0.0.1:8000/v1")
                .unwrap()
                .name(),
            "10.0.0.1:8000"
        );
    }

    #[test]
    fn least_outstanding_prefers_the_idle_upstream() {
        let pool = pool(3, BalancerKind::LeastOutstanding);
        let first = pool.pick(&[]).unwrap();
        let second = pool.pick(&[]).unwrap();
        assert_ne!(first.upstream().name, second.upstream().name);
        drop(first);
        let third = pool.pick(&[]).unwrap();
        assert_eq!(third.upstream().in_flight(), 1);
    }

    #[test]
    fn power_of_two_never_picks_the_busier_of_two() {
        let pool = pool(2, BalancerKind::PowerOfTwoChoices);
        let held: Vec<InFlight> = (0..5).map(|_| pool.pick(&[]).unwrap()).collect();
        let loads: Vec<usize> = pool.all().iter().map(|u| u.in_flight()).collect();
        assert!(loads[0].abs_diff(loads[1]) <= 1, "{loads:?}");
        drop(held);
    }

    #[test]
    fn with_every_upstream_ejected_for_failed_answers_panic_mode_still_picks_one() {
        let pool = pool(2, BalancerKind::PowerOfTwoChoices);
        let a = Arc::clone(&pool.all()[0]);
        let b = Arc::clone(&pool.all()[1]);
        for _ in 0..2 {
            pool.report_failure(&a, Failure::Gateway);
        }
        pool.report_failure(&b, Failure::Connect);
        assert_eq!(pool.healthy_count(), 0);
        assert!(pool.can_serve());
        let picked = pool.pick(&[]).unwrap();
        assert_eq!(picked.upstream().name, a.name, "never the one that refused");
        assert!(pool.pick(&[Arc::clone(&a.name)]).is_none());
        for _ in 0..2 {
            pool.report_failure(&a, Failure::Connect);
        }
        assert!(!pool.can_serve());
    }

    #[test]
    fn only_gateway_statuses_count_against_health() {
        for status in [400, 404, 413, 422, 429, 500, 501] {
            let status = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(status_health(status), None, "{status}");
        }
        for status in [502, 503, 504] {
            let status = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(status_health(status), Some(Failure::Gateway), "{status}");
        }
    }

    #[test]
    fn a_connect_failure_ejects_and_5xx_needs_a_run() {
        let pool = pool(2, BalancerKind::PowerOfTwoChoices);
        let a = Arc::clone(&pool.all()[0]);
        let b = Arc::clone(&pool.all()[1]);
        assert_eq!(
            pool.report_failure(&a, Failure::Connect),
            HealthChange::Ejected
        );
        assert_eq!(pool.healthy_count(), 1);
        assert_eq!(
            pool.report_failure(&b, Failure::Gateway),
            HealthChange::Unchanged
        );
        pool.report_success(&b);
        assert_eq!(
            pool.report_failure(&b, Failure::Gateway),
            HealthChange::Unchanged
        );
        assert_eq!(
            pool.report_failure(&b, Failure::Gateway),
            HealthChange::Ejected
        );
        assert_eq!(pool.healthy_count(), 0);
    }
}
