//! The agent port speaks only the agent API: an allow-list of `METHOD /path` patterns decides
//! which API calls are forwarded, and the engines' control routes are refused whatever the list
//! says.
//!
//! Engines serve their control plane on the same port as the model API (vLLM's
//! `/v1/load_lora_adapter`, SGLang's `/update_weights_from_disk`, ...). Forwarding "any `/v1/*`"
//! let one tenant's agent unload or replace another tenant's adapter, with the sidecar's own
//! upstream credential. An allow-list fails closed: a route an engine adds next release is not
//! reachable until someone lists it. The deny-list of control words is a second fence, for a
//! list that was widened carelessly (`POST /v1/*`); a config that names a control route is
//! refused at start.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use serde::{Deserialize, Serialize};
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::ProxyError;
use crate::data_plane::route::Route;

/// The `[agent_api]` section of the sidecar's configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentApiConfig {
    /// `"METHOD /path"` entries; a path segment `*` matches one plain segment (letters, digits,
    /// `-_.:@`). Paths are the agent's, without the `/s/{session}` prefix.
    pub allow: Vec<String>,
}

impl Default for AgentApiConfig {
    fn default() -> Self {
        let allow = [
            "POST /v1/chat/completions",
            "POST /v1/completions",
            "POST /v1/responses",
            "GET /v1/responses/*",
            "GET /v1/models",
            "POST /v1/embeddings",
            "POST /v1/messages",
            "POST /v1/messages/count_tokens",
        ];
        Self {
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// Words that name an engine's control plane in vLLM's and SGLang's routes. A path with one of
/// them as a segment (or a segment's `_`-separated part, so `load_lora_adapter` and
/// `update_weights_from_disk` count) is never forwarded from the agent port.
const CONTROL_WORDS: &[&str] = &[
    "lora",
    "adapter",
    "weights",
    "weight",
    "pause",
    "resume",
    "sleep",
    "wake",
    "reset",
    "flush",
    "profile",
    "rpc",
    "abort",
    "memory",
    "scale",
    "shutdown",
    "configure",
    "expert",
    "slow",
];

/// True when `path` reaches an engine's control plane.
pub fn is_engine_control(path: &str) -> bool {
    path.split('/')
        .flat_map(|segment| segment.split(['_', '-']))
        .any(|word| CONTROL_WORDS.iter().any(|c| word.eq_ignore_ascii_case(c)))
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    method: Method,
    segments: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentApiError {
    #[error("`agent_api.allow` entry {0:?} must be \"METHOD /path\", e.g. \"POST /v1/chat/completions\"")]
    Malformed(String),
    #[error("`agent_api.allow` entry {0:?} names an engine control route; those are never forwarded from the agent port")]
    ControlRoute(String),
}

/// The compiled allow-list.
#[derive(Debug, Clone)]
pub struct AllowList {
    patterns: Vec<Pattern>,
}

impl AllowList {
    pub fn new(config: &AgentApiConfig) -> Result<Self, AgentApiError> {
        let patterns = config
            .allow
            .iter()
            .map(|entry| {
                let malformed = || AgentApiError::Malformed(entry.clone());
                let (method, path) = entry.trim().split_once(' ').ok_or_else(malformed)?;
                let method = Method::from_bytes(method.as_bytes()).map_err(|_| malformed())?;
                let path = path.trim();
                if !path.starts_with("/v1/") {
                    return Err(malformed());
                }
                if is_engine_control(path) {
                    return Err(AgentApiError::ControlRoute(entry.clone()));
                }
                let segments = path[1..].split('/').map(str::to_owned).collect();
                Ok(Pattern { method, segments })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { patterns })
    }

    /// Whether `method path` (no query) may be forwarded.
    pub fn allows(&self, method: &Method, path: &str) -> bool {
        if is_engine_control(path) {
            return false;
        }
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        let segments: Vec<&str> = path.split('/').collect();
        self.patterns.iter().any(|p| {
            p.method == *method
                && p.segments.len() == segments.len()
                && p.segments
                    .iter()
                    .zip(&segments)
                    .all(|(want, got)| segment_matches(want, got))
        })
    }
}

fn segment_matches(want: &str, got: &str) -> bool {
    if want != "*" {
        return want == got;
    }
    // A wildcard takes a plain id only: no percent-escapes an engine would decode into a
    // different route, no dot segments it might resolve.
    !got.is_empty()
        && got != "."
        && got != ".."
        && got
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@'))
}

#[derive(Debug, Clone)]
pub struct AgentApiLayer {
    allow: Arc<AllowList>,
}

impl AgentApiLayer {
    pub fn new(allow: AllowList) -> Self {
        Self {
            allow: Arc::new(allow),
        }
    }
}

impl<S> Layer<S> for AgentApiLayer {
    type Service = AgentApi<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AgentApi {
            inner,
            allow: Arc::clone(&self.allow),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AgentApi<S> {
    inner: S,
    allow: Arc<AllowList>,
}

impl<S, B> Service<Request<B>> for AgentApi<S>
where
    S: Service<
        Request<B>,
        Response = Response<ProxyBody>,
        Error = Infallible,
        Future = ResponseFuture,
    >,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        // The `/v1` calls under a Claw-R1 base_url go to the engine too: the same list applies.
        let Some(upstream_path) = request
            .extensions()
            .get::<Route>()
            .and_then(Route::upstream_path)
        else {
            return self.inner.call(request);
        };
        let path = upstream_path
            .split_once('?')
            .map_or(upstream_path, |(path, _)| path);
        if self.allow.allows(request.method(), path) {
            return self.inner.call(request);
        }
        let refused = if is_engine_control(path) {
            ProxyError::EngineControlRoute {
                path: path.to_owned(),
            }
        } else {
            ProxyError::NotAgentApi {
                method: request.method().to_string(),
                path: path.to_owned(),
            }
        };
        Box::pin(async move { Ok(refused.into_response()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_list() -> AllowList {
        AllowList::new(&AgentApiConfig::default()).unwrap()
    }

    #[test]
    fn the_model_api_is_allowed() {
        let list = default_list();
        assert!(list.allows(&Method::POST, "/v1/chat/completions"));
        assert!(list.allows(&Method::GET, "/v1/models"));
        assert!(list.allows(&Method::GET, "/v1/responses/resp_123"));
        assert!(!list.allows(&Method::GET, "/v1/chat/completions"));
        assert!(!list.allows(&Method::DELETE, "/v1/responses/resp_123"));
    }

    #[test]
    fn engine_control_routes_are_never_allowed() {
        let list = default_list();
        for path in [
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/v1/update_weights_from_disk",
            "/v1/pause",
            "/v1/resume",
            "/v1/sleep",
            "/v1/wake_up",
            "/v1/reset_prefix_cache",
            "/v1/start_profile",
            "/v1/collective_rpc",
            "/v1/LOAD_LORA_ADAPTER",
        ] {
            assert!(is_engine_control(path), "{path}");
            assert!(!list.allows(&Method::POST, path), "{path}");
        }
    }

    #[test]
    fn a_wildcard_takes_no_escapes_or_dot_segments() {
        let list = default_list();
        for id in ["..", ".", "a%2Fb", "", "x%5Flora"] {
            assert!(
                !list.allows(&Method::GET, &format!("/v1/responses/{id}")),
                "{id}"
            );
        }
        assert!(!list.allows(&Method::POST, "/v1/chat%2Fcompletions"));
        assert!(!list.allows(&Method::POST, "/v1/chat/completions/"));
    }

    #[test]
    fn a_config_that_lists_a_control_route_is_refused() {
        for entry in ["POST /v1/load_lora_adapter", "POST /v1/update_weights"] {
            let config = AgentApiConfig {
                allow: vec![entry.to_owned()],
            };
            assert!(matches!(
                AllowList::new(&config),
                Err(AgentApiError::ControlRoute(_))
            ));
        }
        for entry in ["/v1/models", "GET v1/models", "G@T /v1/models"] {
            let config = AgentApiConfig {
                allow: vec![entry.to_owned()],
            };
            assert!(matches!(
                AllowList::new(&config),
                Err(AgentApiError::Malformed(_))
            ));
        }
    }
}
