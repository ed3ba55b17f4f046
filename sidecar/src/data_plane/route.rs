//! Which of the sidecar's routes a request is for, decided once from its path and carried in the
//! request's extensions so every later layer reads the same answer.
//!
//! Agents call `/v1/...` or the session path form `/s/{session}/v1/...`; the prefix is removed
//! before forwarding, and the session id travels with the request.

use std::fmt;

use http::Method;

use crate::data_plane::server::Port;

/// The OpenAI endpoint a forwarded call is for. Also the `route` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Responses,
    /// `GET /v1/responses/{id}`: a stored response, served only to the tenant that made it.
    StoredResponse,
    /// Anthropic's Messages API ([`crate::data_plane::anthropic`]).
    Messages,
    /// Anthropic's `count_tokens`: answered by the engine, never recorded.
    CountTokens,
    Models,
    /// Any other `/v1/*` path: forwarded unchanged.
    Other,
}

/// Whose API a route speaks, and so the shape its errors take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    #[default]
    OpenAi,
    Anthropic,
}

impl Endpoint {
    pub fn label(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat_completions",
            Self::Completions => "completions",
            Self::Responses => "responses",
            Self::StoredResponse => "stored_response",
            Self::Messages => "messages",
            Self::CountTokens => "count_tokens",
            Self::Models => "models",
            Self::Other => "other_v1",
        }
    }

    pub(crate) fn classify(method: &Method, path: &str) -> Self {
        match (method, path) {
            (&Method::POST, "/v1/chat/completions") => Self::ChatCompletions,
            (&Method::POST, "/v1/completions") => Self::Completions,
            (&Method::POST, "/v1/responses") => Self::Responses,
            (&Method::GET, path) if path.starts_with("/v1/responses/") => Self::StoredResponse,
            (&Method::POST, "/v1/messages") => Self::Messages,
            (&Method::POST, "/v1/messages/count_tokens") => Self::CountTokens,
            (&Method::GET, "/v1/models") => Self::Models,
            _ => Self::Other,
        }
    }

    pub fn dialect(self) -> Dialect {
        match self {
            Self::Messages | Self::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }
}

/// An agent-chosen session id from the path form. Bounded and restricted to URL-safe characters
/// so it can be a storage key and a log field as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionId(String);

impl SessionId {
    pub const MAX_LEN: usize = 128;

    pub fn parse(raw: &str) -> Option<Self> {
        let ok = !raw.is_empty()
            && raw.len() <= Self::MAX_LEN
            && raw.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@')
            });
        ok.then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a request is, decided once from its request line (the observe layer puts it in the
/// request's extensions). The data plane tells its own routes apart; the control plane's are
/// classified by it ([`crate::control_plane::Route`]) and reach the layers as
/// [`Route::Control`] and [`Route::ClawR1Api`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Healthz,
    Readyz,
    Metrics,
    Api {
        endpoint: Endpoint,
        session: Option<SessionId>,
        /// What the upstream gets: `/v1/...` plus the original query string.
        upstream_path: String,
    },
    /// A model call under a Claw-R1 base URL (`/{uid}/{prompt_uid}/v1/...`): forwarded as the
    /// uid's session once the uid is known to be the caller's tenant's.
    ClawR1Api {
        uid: SessionId,
        prompt: SessionId,
        endpoint: Endpoint,
        /// `/v1/...` plus the query string.
        upstream_path: String,
    },
    /// A route the control plane answers.
    Control(Control),
    NotFound,
}

/// A control-plane route as the data plane's layers see it: what to call it in metrics and
/// which listener serves it (with `admin.listen` set, the admin API lives on the admin port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// The `route` metric label.
    pub label: &'static str,
    pub home: Port,
}

/// Decides a request's [`Route`] from its method, path and query.
pub type Classify = fn(&Method, &str, Option<&str>) -> Route;

impl Route {
    /// The data plane's own routes; every other path is [`Route::NotFound`] here.
    pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Self {
        match path {
            "/healthz" => return Self::Healthz,
            "/readyz" => return Self::Readyz,
            "/metrics" => return Self::Metrics,
            _ => {}
        }
        let (session, api_path) = match path.strip_prefix("/s/") {
            Some(rest) => {
                let Some((id, _)) = rest.split_once('/') else {
                    return Self::NotFound;
                };
                let Some(session) = SessionId::parse(id) else {
                    return Self::NotFound;
                };
                (Some(session), &rest[id.len()..])
            }
            None => (None, path),
        };
        if api_path != "/v1" && !api_path.starts_with("/v1/") {
            return Self::NotFound;
        }
        let upstream_path = match query {
            Some(q) => format!("{api_path}?{q}"),
            None => api_path.to_owned(),
        };
        Self::Api {
            endpoint: Endpoint::classify(method, api_path),
            session,
            upstream_path,
        }
    }

    /// An API call's path towards the upstream; `None` for every other route.
    pub fn upstream_path(&self) -> Option<&str> {
        match self {
            Self::Api { upstream_path, .. } | Self::ClawR1Api { upstream_path, .. } => {
                Some(upstream_path)
            }
            _ => None,
        }
    }

    /// The API the caller speaks: its errors are answered in that API's shape.
    pub fn dialect(&self) -> Dialect {
        match self {
            Self::Api { endpoint, .. } | Self::ClawR1Api { endpoint, .. } => endpoint.dialect(),
            _ => Dialect::OpenAi,
        }
    }

    /// The `route` metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Readyz => "readyz",
            Self::Metrics => "metrics",
            Self::Api { endpoint, .. } | Self::ClawR1Api { endpoint, .. } => endpoint.label(),
            Self::Control(control) => control.label,
            Self::NotFound => "not_found",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_prefix_is_stripped_and_kept() {
        let route = Route::classify(&Method::POST, "/s/sess-42/v1/chat/completions", None);
        assert_eq!(
            route,
            Route::Api {
                endpoint: Endpoint::ChatCompletions,
                session: SessionId::parse("sess-42"),
                upstream_path: "/v1/chat/completions".to_owned(),
            }
        );
    }

    #[test]
    fn other_v1_paths_pass_with_their_query() {
        let route = Route::classify(&Method::GET, "/v1/files/abc", Some("limit=2"));
        assert_eq!(
            route,
            Route::Api {
                endpoint: Endpoint::Other,
                session: None,
                upstream_path: "/v1/files/abc?limit=2".to_owned(),
            }
        );
    }

    #[test]
    fn paths_outside_the_api_are_not_found() {
        for path in [
            "/",
            "/v2/models",
            "/s/",
            "/s/x",
            "/s/bad id/v1/models",
            "/v1x/models",
        ] {
            assert_eq!(
                Route::classify(&Method::GET, path, None),
                Route::NotFound,
                "{path}"
            );
        }
    }
}
