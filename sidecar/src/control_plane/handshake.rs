//! The handshake API, for rollout orchestrators and UIs (Claw-R1-compatible in spirit):
//!
//! - `POST /trajectories` `{tenant?, group_id?, group_size?, metadata?, session_key?}` →
//!   `{trajectory_id, tenant, base_url, api_key?}`; the agent then uses `base_url` (the
//!   `/s/{id}/v1` form), or, with `session_key: true`, its usual base URL and `api_key` as its key;
//! - `POST /trajectories/{id}/complete` `{tenant?, reward?, metadata?}`;
//! - `POST /trajectories/{id}/feedback` `{tenant?, step?, reward?, hint?, label?}` (a thumb up or
//!   down from a UI; `step` is a step id or a 0-based index);
//! - `GET /trajectories/{id}?tenant=T`;
//! - read-only views for the trajectory viewer ([`crate::control_plane::ui`]), in [`listing`]: `GET /tenants`
//!   (with each tenant's live policy), `GET /trajectories?tenant=T&limit=N` (newest first),
//!   `GET /tenants/{tenant}/rewards?limit=N` (rewards over time), `GET /tenants/{tenant}/gate?limit=N`
//!   (the trainer's gate decisions on the tenant's candidate versions, newest first);
//! - an operator's rollback of a tenant's policy, in [`rollback`]: `POST /tenants/{tenant}/rollback`
//!   `{to}` and `GET /tenants/{tenant}/rollback` (the global token only).
//!
//! Every route needs `Authorization: Bearer <admin.token>`; without a configured token the API is
//! off. The caller is trusted across tenants, but ids are still looked up inside one tenant (the
//! live trajectory's, the one named, or the default) — never guessed across tenants. Unknown ids
//! get 404, never silent creation.

use std::collections::BTreeMap;

use bytes::Bytes;
use clawback_datapool::{
    CompletionReason, Evaluation, EvaluationId, EvaluationSource, StepId, TenantId, TrajectoryId,
    TrajectoryRecord, UnixMs, Verdict, SCHEMA_VERSION,
};
use http::{header, request, Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::control_plane::Handles;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::error_response;

pub mod auth;
mod listing;
mod rollback;
mod summary;

use auth::Scope;

/// The handshake routes, decided from the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Create,
    Get(String),
    Complete(String),
    Feedback(String),
    /// `GET /trajectories`: a tenant's newest trajectories.
    List,
    /// `GET /tenants`: every tenant with data, and its live policy.
    Tenants,
    /// `GET /tenants/{tenant}/rewards`: a tenant's rewards over time.
    Rewards(String),
    /// `GET /tenants/{tenant}/export`: a tenant's completed trajectories as training rows.
    Export(String),
    /// `GET /tenants/{tenant}/gate`: what the trainer's gate decided about the tenant's
    /// candidate versions, and why.
    Gate(String),
    /// `POST /tenants/{tenant}/rollback`: an operator's order to make an earlier version live.
    Rollback(String),
    /// `GET /tenants/{tenant}/rollback`: the latest order and its outcome.
    RollbackState(String),
}

impl Route {
    /// `None` when the path is not under `/trajectories` or `/tenants`.
    pub fn classify(method: &Method, path: &str) -> Option<Result<Self, ()>> {
        if let Some(rest) = path.strip_prefix("/tenants") {
            let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
            return Some(match (method, parts.as_slice()) {
                (&Method::GET, []) => Ok(Self::Tenants),
                (&Method::GET, [tenant, "rewards"]) => Ok(Self::Rewards((*tenant).to_owned())),
                (&Method::GET, [tenant, "export"]) => Ok(Self::Export((*tenant).to_owned())),
                (&Method::GET, [tenant, "gate"]) => Ok(Self::Gate((*tenant).to_owned())),
                (&Method::POST, [tenant, "rollback"]) => Ok(Self::Rollback((*tenant).to_owned())),
                (&Method::GET, [tenant, "rollback"]) => {
                    Ok(Self::RollbackState((*tenant).to_owned()))
                }
                _ => Err(()),
            });
        }
        let rest = path.strip_prefix("/trajectories")?;
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        Some(match (method, parts.as_slice()) {
            (&Method::POST, []) => Ok(Self::Create),
            (&Method::GET, []) => Ok(Self::List),
            (&Method::GET, [id]) => Ok(Self::Get((*id).to_owned())),
            (&Method::POST, [id, "complete"]) => Ok(Self::Complete((*id).to_owned())),
            (&Method::POST, [id, "feedback"]) => Ok(Self::Feedback((*id).to_owned())),
            _ => Err(()),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the handshake API is off: set admin.token to enable it")]
    Disabled,
    #[error("the handshake API needs `Authorization: Bearer <admin token>`")]
    Unauthorized,
    #[error("no such handshake route: {0}")]
    NoRoute(String),
    #[error("invalid request body: {0}")]
    BadBody(String),
    #[error("{0:?} is not a trajectory id")]
    BadId(String),
    #[error("no tenant given and no default tenant is configured")]
    NoTenant,
    #[error("this token is for tenant {0} only")]
    OutOfScope(TenantId),
    #[error("trajectory {0} not found")]
    NotFound(String),
    #[error("step {0} not found in the trajectory")]
    StepNotFound(String),
    #[error("recording is disabled: there are no trajectories")]
    RecordingOff,
    #[error("the datapool failed: {0}")]
    Store(#[from] clawback_datapool::Error),
    #[error(transparent)]
    Sessions(#[from] crate::data_plane::session::shared::Unreachable),
    #[error("the export failed: {0}")]
    Export(String),
    #[error("only the global admin token may change what serves a tenant")]
    OperatorOnly,
    #[error("policy routing is off (set routing.base_model): there are no versions to roll back")]
    RoutingOff,
    #[error("rollback refused: {0}")]
    RollbackRefused(String),
    #[error("no rollback was ever ordered for {0}")]
    NoRollback(TenantId),
    #[error("cannot encode the answer: {0}")]
    Encode(String),
}

impl HandshakeError {
    fn status(&self) -> StatusCode {
        match self {
            Self::Disabled
            | Self::NoRoute(_)
            | Self::NotFound(_)
            | Self::StepNotFound(_)
            | Self::NoRollback(_) => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::OutOfScope(_) | Self::OperatorOnly => StatusCode::FORBIDDEN,
            Self::BadBody(_) | Self::BadId(_) | Self::NoTenant => StatusCode::BAD_REQUEST,
            Self::RecordingOff | Self::RoutingOff | Self::RollbackRefused(_) => {
                StatusCode::CONFLICT
            }
            Self::Store(_) | Self::Sessions(_) | Self::Export(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Disabled => "handshake_disabled",
            Self::Unauthorized => "invalid_admin_token",
            Self::NoRoute(_) => "not_found",
            Self::BadBody(_) => "invalid_body",
            Self::BadId(_) => "invalid_id",
            Self::NoTenant => "no_tenant",
            Self::OutOfScope(_) => "tenant_out_of_scope",
            Self::NotFound(_) => "trajectory_not_found",
            Self::StepNotFound(_) => "step_not_found",
            Self::RecordingOff => "recording_disabled",
            Self::Store(_) => "datapool_unavailable",
            Self::Sessions(_) => "session_state_unreachable",
            Self::Export(_) => "export_failed",
            Self::OperatorOnly => "operator_only",
            Self::RoutingOff => "routing_disabled",
            Self::RollbackRefused(_) => "rollback_refused",
            Self::NoRollback(_) => "no_rollback",
            Self::Encode(_) => "internal_error",
        }
    }

    pub fn into_response(self) -> Response<ProxyBody> {
        let kind = if self.status().is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        error_response(self.status(), &self.to_string(), kind, self.code())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    tenant: Option<String>,
    group_id: Option<String>,
    group_size: Option<u32>,
    #[serde(default)]
    metadata: Map<String, Value>,
    /// Mint an API key that stands for this trajectory ([`crate::data_plane::session::keys`]).
    #[serde(default)]
    session_key: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    tenant: Option<String>,
    reward: Option<f64>,
    #[serde(default)]
    metadata: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedbackBody {
    tenant: Option<String>,
    step: Option<Value>,
    reward: Option<f64>,
    hint: Option<String>,
    label: Option<String>,
}

/// Answers a handshake API call of the caller `scope` ([`auth::AdminAuth::authorize`] decided it).
pub async fn handle(
    control: &Handles,
    scope: &Scope,
    route: Result<Route, ()>,
    parts: &request::Parts,
    body: Bytes,
) -> Response<ProxyBody> {
    let answer = async {
        let route = route.map_err(|()| HandshakeError::NoRoute(parts.uri.path().to_owned()))?;
        match route {
            Route::Create => create(control, scope, parts, parse(&body)?).await,
            Route::Get(id) => get(control, scope, &id, query_param(parts, "tenant")).await,
            Route::List => listing::trajectories(control, scope, parts).await,
            Route::Tenants => listing::tenants(control, scope).await,
            Route::Rewards(tenant) => listing::rewards(control, scope, &tenant, parts).await,
            Route::Export(tenant) => listing::export(control, scope, &tenant, parts).await,
            Route::Gate(tenant) => listing::gate(control, scope, &tenant, parts).await,
            Route::Rollback(tenant) => {
                rollback::order(control, scope, &tenant, parse(&body)?).await
            }
            Route::RollbackState(tenant) => rollback::state(control, scope, &tenant).await,
            Route::Complete(id) => complete(control, scope, &id, parse(&body)?).await,
            Route::Feedback(id) => feedback(control, scope, &id, parse(&body)?).await,
        }
    };
    answer.await.unwrap_or_else(HandshakeError::into_response)
}

fn parse<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, HandshakeError> {
    body_or_default(body).map_err(|e| HandshakeError::BadBody(e.to_string()))
}

/// A control body as `T`; an empty (or blank) body is `T::default()`.
pub(crate) fn body_or_default<T: for<'de> Deserialize<'de> + Default>(
    body: &[u8],
) -> Result<T, serde_json::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
}

/// A query parameter's value, percent- and `+`-decoded as a browser's form encodes it.
fn query_param(parts: &request::Parts, name: &str) -> Option<String> {
    parts.uri.query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    })
}

fn trajectory_id(raw: &str) -> Result<TrajectoryId, HandshakeError> {
    raw.parse()
        .map_err(|_| HandshakeError::BadId(raw.to_owned()))
}

/// The tenant a request is about: the one named (within the caller's scope), else the scope's
/// own, else the configured default.
fn named_tenant(
    control: &Handles,
    scope: &Scope,
    named: Option<String>,
) -> Result<TenantId, HandshakeError> {
    scope.tenant(
        named,
        control.tenants.default_tenant().map(TenantId::as_str),
    )
}

/// The tenant of trajectory `id`: the live trajectory's own, else the one named (or default).
/// A trajectory outside the caller's scope is not found.
async fn tenant_for(
    control: &Handles,
    scope: &Scope,
    id: &TrajectoryId,
    named: Option<String>,
) -> Result<TenantId, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    // Where a live trajectory may be: the tenant named, the caller's own, those configured and
    // those with data.
    let mut candidates: Vec<TenantId> = named
        .as_deref()
        .and_then(|n| TenantId::new(n).ok())
        .into_iter()
        .collect();
    match scope {
        Scope::Tenant(own) => candidates.push(own.clone()),
        Scope::All => {
            candidates.extend(control.tenants.known());
            candidates.extend(recorder.tenants().await);
        }
    }
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|t| seen.insert(t.clone()));
    match (recorder.tenant_of(id, candidates).await?, named) {
        (Some(live), Some(named)) if live.as_str() != named => {
            Err(HandshakeError::NotFound(id.to_string()))
        }
        (Some(live), _) if !scope.sees(&live) => Err(HandshakeError::NotFound(id.to_string())),
        (Some(live), _) => Ok(live),
        (None, named) => named_tenant(control, scope, named),
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    // Admin answers hold recorded conversations: no browser or proxy keeps a copy.
    headers.insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    response
}

async fn create(
    control: &Handles,
    scope: &Scope,
    parts: &request::Parts,
    body: CreateBody,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let tenant = named_tenant(control, scope, body.tenant)?;
    let group = match (body.group_id, body.group_size) {
        (Some(group), Some(size)) if (1..=4096).contains(&size) => Some((group, size)),
        (None, None) => None,
        _ => {
            return Err(HandshakeError::BadBody(
                "group_id and group_size (1-4096) go together".to_owned(),
            ))
        }
    };
    let id = recorder.create(tenant.clone(), group, body.metadata).await;
    let root = public_root(control, parts);
    let mut created = json!({
        "trajectory_id": id.to_string(),
        "tenant": tenant.as_str(),
        "base_url": format!("{root}/s/{id}/v1"),
    });
    if body.session_key {
        created["api_key"] = recorder.mint_session_key(tenant, id).await.into();
    }
    Ok(json_response(StatusCode::CREATED, &created))
}

/// `scheme://host` as the caller reached this sidecar (its `Host`, `https` when a front door
/// says so), for the base URLs handed out.
pub(crate) fn public_root(control: &Handles, parts: &request::Parts) -> String {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| control.listen.to_string(), str::to_owned);
    let scheme = parts
        .headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

async fn stored(
    control: &Handles,
    tenant: &TenantId,
    id: &TrajectoryId,
) -> Result<Option<TrajectoryRecord>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    Ok(recorder.store().trajectory(tenant, id).await?)
}

async fn get(
    control: &Handles,
    scope: &Scope,
    raw: &str,
    tenant: Option<String>,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let id = trajectory_id(raw)?;
    let tenant = tenant_for(control, scope, &id, tenant).await?;
    let record = stored(control, &tenant, &id)
        .await?
        .ok_or_else(|| HandshakeError::NotFound(raw.to_owned()))?;
    let value =
        serde_json::to_value(&record).map_err(|e| HandshakeError::BadBody(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &value))
}

/// The range a reward sent to the sidecar (the handshake API, Claw-R1's completion) must be in:
/// a thumb up is 1, down -1, a task's success 1 or 0. Plugins' rewards are the plugins' own.
pub(crate) const REWARD_RANGE: std::ops::RangeInclusive<f64> = -1.0..=1.0;

/// `reward`, if it is within [`REWARD_RANGE`]; else what is wrong with it.
pub(crate) fn checked_reward(reward: f64) -> Result<f64, String> {
    if REWARD_RANGE.contains(&reward) {
        Ok(reward)
    } else {
        Err(format!(
            "reward {reward} is not within [{}, {}]",
            REWARD_RANGE.start(),
            REWARD_RANGE.end()
        ))
    }
}

pub(crate) fn feedback_evaluation(
    tenant: &TenantId,
    trajectory: TrajectoryId,
    step: Option<StepId>,
    channel: &str,
    reward: Option<f64>,
    hint: Option<String>,
    labels: BTreeMap<String, String>,
) -> Evaluation {
    Evaluation {
        schema_version: SCHEMA_VERSION,
        id: EvaluationId::new(),
        tenant: tenant.clone(),
        trajectory,
        step,
        source: EvaluationSource::Feedback {
            channel: channel.to_owned(),
        },
        verdict: Verdict::Score { reward, hint },
        labels,
        created_at: UnixMs::now(),
    }
}

async fn complete(
    control: &Handles,
    scope: &Scope,
    raw: &str,
    body: CompleteBody,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let id = trajectory_id(raw)?;
    let tenant = tenant_for(control, scope, &id, body.tenant).await?;
    if let Some(reward) = body.reward {
        checked_reward(reward).map_err(HandshakeError::BadBody)?;
    }
    let live = recorder.is_live(&tenant, &id).await?;
    if !live && stored(control, &tenant, &id).await?.is_none() {
        return Err(HandshakeError::NotFound(raw.to_owned()));
    }
    if !body.metadata.is_empty() {
        if let Some(mut record) = stored(control, &tenant, &id).await? {
            record.trajectory.metadata.extend(body.metadata);
            recorder
                .store()
                .upsert_trajectory(&record.trajectory)
                .await?;
        }
    }
    if let Some(reward) = body.reward {
        let evaluation = feedback_evaluation(
            &tenant,
            id,
            None,
            "handshake",
            Some(reward),
            None,
            BTreeMap::new(),
        );
        recorder.enqueue_evaluations(vec![evaluation]);
    }
    let status = if live {
        recorder
            .complete(&tenant, id, CompletionReason::Handshake)
            .await?;
        "completing"
    } else {
        "already_completed"
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"trajectory_id": raw, "status": status}),
    ))
}

async fn feedback(
    control: &Handles,
    scope: &Scope,
    raw: &str,
    body: FeedbackBody,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let id = trajectory_id(raw)?;
    let tenant = tenant_for(control, scope, &id, body.tenant).await?;
    if body.reward.is_none() && body.hint.is_none() && body.label.is_none() {
        return Err(HandshakeError::BadBody(
            "give at least one of reward, hint, label".to_owned(),
        ));
    }
    if let Some(reward) = body.reward {
        checked_reward(reward).map_err(HandshakeError::BadBody)?;
    }
    let step = match body.step {
        None => None,
        Some(step) => {
            let record = stored(control, &tenant, &id)
                .await?
                .ok_or_else(|| HandshakeError::NotFound(raw.to_owned()))?;
            let found = match &step {
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|i| record.steps.iter().find(|s| u64::from(s.index) == i)),
                Value::String(s) => s
                    .parse::<StepId>()
                    .ok()
                    .and_then(|sid| record.steps.iter().find(|st| st.id == sid)),
                _ => None,
            };
            Some(
                found
                    .map(|s| s.id)
                    .ok_or_else(|| HandshakeError::StepNotFound(step.to_string()))?,
            )
        }
    };
    if step.is_none()
        && !recorder.is_live(&tenant, &id).await?
        && stored(control, &tenant, &id).await?.is_none()
    {
        return Err(HandshakeError::NotFound(raw.to_owned()));
    }
    let labels: BTreeMap<String, String> = body
        .label
        .into_iter()
        .map(|l| ("label".to_owned(), l))
        .collect();
    let evaluation = feedback_evaluation(
        &tenant,
        id,
        step,
        "feedback",
        body.reward,
        body.hint,
        labels,
    );
    let evaluation_id = evaluation.id.to_string();
    recorder.enqueue_evaluations(vec![evaluation]);
    Ok(json_response(
        StatusCode::ACCEPTED,
        &json!({"trajectory_id": raw, "evaluation_id": evaluation_id}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_paths_are_recognised() {
        assert_eq!(
            Route::classify(&Method::POST, "/trajectories"),
            Some(Ok(Route::Create))
        );
        assert_eq!(
            Route::classify(&Method::POST, "/trajectories/abc/complete"),
            Some(Ok(Route::Complete("abc".to_owned())))
        );
        assert_eq!(
            Route::classify(&Method::DELETE, "/trajectories/abc"),
            Some(Err(()))
        );
        assert_eq!(Route::classify(&Method::GET, "/v1/models"), None);
    }

    #[test]
    fn the_viewers_read_routes_are_recognised() {
        assert_eq!(
            Route::classify(&Method::GET, "/trajectories"),
            Some(Ok(Route::List))
        );
        assert_eq!(
            Route::classify(&Method::GET, "/tenants"),
            Some(Ok(Route::Tenants))
        );
        assert_eq!(
            Route::classify(&Method::GET, "/tenants/acme/rewards"),
            Some(Ok(Route::Rewards("acme".to_owned())))
        );
        assert_eq!(
            Route::classify(&Method::GET, "/tenants/acme/gate"),
            Some(Ok(Route::Gate("acme".to_owned())))
        );
        assert_eq!(Route::classify(&Method::POST, "/tenants"), Some(Err(())));
        assert_eq!(
            Route::classify(&Method::GET, "/tenants/acme"),
            Some(Err(()))
        );
    }
}
