//! Everything that can go wrong while serving a request, and the one place where it becomes an
//! OpenAI-style error response (`{"error":{"message","type","code"}}`) the SDKs understand.

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};

use crate::data_plane::body::ProxyBody;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    #[error("reading the request body failed: {0}")]
    BodyRead(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("no route for {method} {path}: the sidecar serves /v1/* and /s/{{session}}/v1/*")]
    NotFound { method: String, path: String },
    #[error(
        "{method} {path} is not part of the agent API this sidecar serves (see `agent_api.allow`)"
    )]
    NotAgentApi { method: String, path: String },
    #[error("{path} is an engine control route; it is never forwarded from the agent port")]
    EngineControlRoute { path: String },
    #[error("the model `{model}` does not exist or is not available to this tenant")]
    ModelNotAvailable { model: String },
    #[error("the sidecar is serving its limit of {limit} concurrent requests; retry shortly")]
    Overloaded { limit: usize, retry_after_secs: u32 },
    #[error("the conversation through previous_response_id exceeds the request limit of {limit} bytes: send a shorter one")]
    ConversationTooLarge { limit: usize },
    #[error("this session key's trajectory has completed: the key no longer works")]
    SessionKeyEnded,
    #[error("this tenant is serving its share of {share} concurrent requests; retry shortly")]
    TenantOverloaded { share: usize, retry_after_secs: u32 },
    #[error("the sidecar holds its limit of {limit} bytes of request bodies; retry shortly")]
    BuffersFull { limit: usize, retry_after_secs: u32 },
    #[error("this tenant holds its share of {share} bytes of request bodies; retry shortly")]
    TenantBuffersFull { share: usize, retry_after_secs: u32 },
    #[error("no healthy upstream: all {count} are ejected after failures")]
    NoHealthyUpstream { count: usize },
    #[error("could not connect to any upstream (tried {tried})")]
    ConnectFailed { tried: String },
    #[error("upstream {upstream} sent no response within {timeout:?}")]
    FirstByteTimeout {
        upstream: std::sync::Arc<str>,
        timeout: Duration,
    },
    #[error("upstream {upstream} failed before responding: {source}")]
    Upstream {
        upstream: std::sync::Arc<str>,
        #[source]
        source: crate::data_plane::connections::SendError,
    },
    #[error("upstream {upstream} answered with Content-Encoding `{encoding}` although the sidecar asked for identity; it cannot check or record such an answer, so it does not pass it on")]
    EncodedAnswer {
        upstream: std::sync::Arc<str>,
        encoding: String,
    },
    #[error("could not build the upstream request: {0}")]
    BadUpstreamRequest(#[source] http::Error),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("unknown API key: this sidecar has no tenant for it")]
    UnknownApiKey,
    #[error("the X-Clawback-Tenant header names no valid tenant")]
    BadTenantHeader,
    #[error("{0}")]
    BadSessionHint(#[from] crate::data_plane::session::explicit::HintError),
    #[error("{0}")]
    BadMessagesRequest(#[from] crate::data_plane::anthropic::request::Invalid),
    /// A body the sidecar cannot read strictly ([`crate::data_plane::agent_json`]): refused, never forwarded.
    #[error("{0}")]
    UnreadableBody(#[from] crate::data_plane::agent_json::Unreadable),
    /// A body with a field the sidecar does not forward ([`crate::data_plane::engine_fields`]).
    #[error("{0}")]
    NotForwarded(crate::data_plane::engine_fields::Refused),
    /// A `previous_response_id` or `GET /v1/responses/{id}` that is not one of this tenant's
    /// responses (unknown, forgotten, or another tenant's: the answer does not say which).
    #[error("Previous response with id '{id}' not found.")]
    ResponseNotFound { id: String },
    #[error("Response with id '{id}' not found.")]
    StoredResponseNotFound { id: String },
}

impl From<crate::data_plane::engine_fields::Refused> for ProxyError {
    fn from(refused: crate::data_plane::engine_fields::Refused) -> Self {
        use crate::data_plane::engine_fields::Refused;
        match refused {
            // Answered as any model the tenant may not call, so it does not say which exist.
            Refused::Model(model) => Self::ModelNotAvailable { model },
            other => Self::NotForwarded(other),
        }
    }
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BodyTooLarge { .. } | Self::ConversationTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BodyRead(_)
            | Self::BadTenantHeader
            | Self::BadSessionHint(_)
            | Self::BadMessagesRequest(_)
            | Self::UnreadableBody(_)
            | Self::NotForwarded(_) => StatusCode::BAD_REQUEST,
            Self::UnknownApiKey | Self::SessionKeyEnded => StatusCode::UNAUTHORIZED,
            Self::NotFound { .. }
            | Self::NotAgentApi { .. }
            | Self::ModelNotAvailable { .. }
            | Self::ResponseNotFound { .. }
            | Self::StoredResponseNotFound { .. } => StatusCode::NOT_FOUND,
            Self::EngineControlRoute { .. } => StatusCode::FORBIDDEN,
            Self::TenantOverloaded { .. } | Self::TenantBuffersFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Overloaded { .. } | Self::BuffersFull { .. } | Self::NoHealthyUpstream { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::ConnectFailed { .. } | Self::Upstream { .. } | Self::EncodedAnswer { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Self::FirstByteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BadUpstreamRequest(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI `error.type`: client mistakes are `invalid_request_error`, the rest is ours.
    fn error_type(&self) -> &'static str {
        match self {
            Self::BodyTooLarge { .. }
            | Self::ConversationTooLarge { .. }
            | Self::BodyTimeout(_)
            | Self::BodyRead(_)
            | Self::NotFound { .. }
            | Self::NotAgentApi { .. }
            | Self::EngineControlRoute { .. }
            | Self::ModelNotAvailable { .. }
            | Self::UnknownApiKey
            | Self::SessionKeyEnded
            | Self::BadTenantHeader
            | Self::BadSessionHint(_)
            | Self::BadMessagesRequest(_)
            | Self::UnreadableBody(_)
            | Self::NotForwarded(_)
            | Self::ResponseNotFound { .. }
            | Self::StoredResponseNotFound { .. } => "invalid_request_error",
            Self::Overloaded { .. } | Self::BuffersFull { .. } => "overloaded_error",
            Self::TenantOverloaded { .. } | Self::TenantBuffersFull { .. } => "rate_limit_error",
            _ => "upstream_error",
        }
    }

    /// A stable, low-cardinality name: the OpenAI `error.code` and the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::ConversationTooLarge { .. } => "conversation_too_large",
            Self::BodyTimeout(_) => "body_timeout",
            Self::BodyRead(_) => "body_read_failed",
            Self::NotFound { .. } => "not_found",
            Self::NotAgentApi { .. } => "not_agent_api",
            Self::EngineControlRoute { .. } => "engine_control_route",
            Self::ModelNotAvailable { .. } => "model_not_found",
            Self::UnknownApiKey => "invalid_api_key",
            Self::SessionKeyEnded => "session_key_ended",
            Self::BadTenantHeader => "invalid_tenant",
            Self::BadSessionHint(_) => "invalid_session_header",
            Self::BadMessagesRequest(_) => "invalid_request",
            Self::UnreadableBody(_) => "invalid_body",
            Self::NotForwarded(_) => "not_forwarded",
            Self::ResponseNotFound { .. } => "previous_response_not_found",
            Self::StoredResponseNotFound { .. } => "response_not_found",
            Self::Overloaded { .. } => "overloaded",
            Self::TenantOverloaded { .. } => "tenant_overloaded",
            Self::BuffersFull { .. } => "buffers_full",
            Self::TenantBuffersFull { .. } => "tenant_buffers_full",
            Self::NoHealthyUpstream { .. } => "no_healthy_upstream",
            Self::ConnectFailed { .. } => "upstream_connect_failed",
            Self::FirstByteTimeout { .. } => "upstream_timeout",
            Self::Upstream { .. } => "upstream_failed",
            Self::EncodedAnswer { .. } => "upstream_encoded",
            Self::BadUpstreamRequest(_) | Self::Internal(_) => "internal_error",
        }
    }

    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let mut response =
            error_response(status, &self.to_string(), self.error_type(), self.code());
        response.extensions_mut().insert(ErrorCode(self.code()));
        if let Self::Overloaded {
            retry_after_secs, ..
        }
        | Self::TenantOverloaded {
            retry_after_secs, ..
        }
        | Self::BuffersFull {
            retry_after_secs, ..
        }
        | Self::TenantBuffersFull {
            retry_after_secs, ..
        } = self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}

/// Marks a response the sidecar made itself from a [`ProxyError`], for the error metric.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// The message of an error response the sidecar made itself: what
/// [`crate::data_plane::layers::dialect`] answers in another API's shape.
#[derive(Debug, Clone)]
pub struct ErrorMessage(pub std::sync::Arc<str>);

/// The JSON body OpenAI's API and SDKs use for errors.
pub fn error_json(message: &str, error_type: &str, code: &str) -> String {
    serde_json::json!({
        "error": { "message": message, "type": error_type, "param": null, "code": code }
    })
    .to_string()
}

pub fn error_response(
    status: StatusCode,
    message: &str,
    error_type: &str,
    code: &str,
) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(error_json(message, error_type, code)));
    *response.status_mut() = status;
    response
        .extensions_mut()
        .insert(ErrorMessage(std::sync::Arc::from(message)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
