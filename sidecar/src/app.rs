//! The sidecar's request path, assembled: the composition root, the one module that sees both
//! planes ([`crate::data_plane`], [`crate::control_plane`]).
//!
//! A request meets, outer to inner:
//! 1. **request id** ([`request_id`](crate::data_plane::layers::request_id)) — the client's
//!    `X-Request-Id` or a fresh one, echoed on the response;
//! 2. **observe** ([`observe`](crate::data_plane::layers::observe)) — decides the [`Route`] once
//!    ([`classify`]: the control plane's routes, else the data plane's), opens the request's
//!    span, and records metrics when the response body is done;
//! 3. **dialect** ([`dialect`](crate::data_plane::layers::dialect)) — errors the sidecar makes
//!    answer in the caller's API's shape (Anthropic's for `/v1/messages`);
//! 4. **load shed** ([`load_shed`](crate::data_plane::layers::load_shed)) — API calls beyond
//!    `max_concurrent_requests` get 503 with `Retry-After` at once;
//! 5. **agent API** ([`agent_api`](crate::data_plane::layers::agent_api)) — only the routes of
//!    `agent_api.allow` are forwarded; engine control routes (adapter load/unload, weight
//!    updates, pause, ...) never;
//! 6. **handle** ([`Handler`]) — health, readiness and metrics are answered here; a control
//!    route goes to the control plane with its [`Handles`] (who asks is checked before a control
//!    body is read); an API call's tenant is resolved from its key and takes one of its
//!    tenant's share of the calls at once ([`share`]; 429 past it), then has its body read
//!    within the size and time limits and parsed strictly, within a budget of JSON values
//!    ([`agent_json`](crate::data_plane::agent_json)); a call with a body is routed to its
//!    tenant's live adapter ([`policy`](crate::data_plane::policy)) and, for a model call with
//!    recording on, joins its trajectory; then it is forwarded to a balanced upstream
//!    ([`Forwarder`]) and its response relayed back as it arrives (the frames already relayed
//!    go out together: [`crate::data_plane::body`]).
//!
//! The rule every step keeps: **what the sidecar cannot parse, classify or authorize is
//! refused, never passed through.** A route not on the allow-list, a body that does not read
//! strictly, a model name that is no tenant's own, a key nobody minted: each is answered here
//! in the caller's API shape, and the engine never sees it. A new route or field follows it:
//! decide on what was read, forward what was decided on.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio_util::task::TaskTracker;
use tower::{Layer, Service};

use crate::config::Config;
use crate::control_plane::{self, claw_r1, Handles};
use crate::data_plane::body::{BoxError, ProxyBody};
use crate::data_plane::capture::{Answer, Capture};
use crate::data_plane::error::ProxyError;
use crate::data_plane::forward::Forwarder;
use crate::data_plane::layers::agent_api::{AgentApi, AgentApiLayer, AllowList};
use crate::data_plane::layers::dialect::{DialectErrors, DialectLayer};
use crate::data_plane::layers::load_shed::{LoadShed, LoadShedLayer};
use crate::data_plane::layers::observe::{Observe, ObserveLayer};
use crate::data_plane::layers::request_id::{RequestIdLayer, RequestIdService};
use crate::data_plane::layers::ResponseFuture;
use crate::data_plane::metrics::{Metrics, UpstreamLabels};
use crate::data_plane::policy::models::own_adapter;
use crate::data_plane::policy::{Routed, Router};
use crate::data_plane::recorder::{request, Pending, Recorder};
use crate::data_plane::route::{Endpoint, Route, SessionId};
use crate::data_plane::server::{self, Port, Serving};
use crate::data_plane::session::explicit::Hints;
use crate::data_plane::share::{Refusal, Share};
use crate::data_plane::tenant::{TenantResolver, Unresolved};
use crate::data_plane::upstream::{Pool, UpstreamUrlError};
use clawback_datapool::TenantId;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What every request shares.
pub struct App {
    pub config: Config,
    pub pool: Arc<Pool>,
    pub forwarder: Arc<Forwarder>,
    pub metrics: Arc<Metrics>,
    pub tenants: TenantResolver,
    /// The routes the agent port forwards.
    pub agent_api: AllowList,
    /// `None` when `recording.enabled` is off.
    pub recorder: Option<Arc<Recorder>>,
    /// `None` when routing is off (`routing.base_model` unset).
    pub router: Option<Router>,
    /// What the control plane reads of the data plane ([`crate::control_plane`]).
    pub control: Handles,
    /// Each tenant's share of `limits.max_concurrent_requests` ([`crate::data_plane::share`]).
    pub calls: Arc<crate::data_plane::share::Shares>,
    /// Each tenant's share of `limits.max_buffered_bytes`: the bytes of request bodies held.
    pub bytes: Arc<crate::data_plane::share::Shares>,
    /// Agent connections held at once (`limits.max_connections`, lowered to fit `ulimit -n`).
    pub connections: usize,
    /// The filter plugins scoring recorded steps; `None` without `filters.dir`.
    pub filters: Option<Arc<clawback_filters::Filters>>,
    /// Forwarding and relay tasks; shutdown waits for them.
    pub tasks: TaskTracker,
    /// Stops the background work (the recorder's sweeper) at shutdown.
    pub background: CancellationToken,
    /// When `/metrics` last read the datapool's lag ([`LAG_REFRESH`]).
    lag_read_at: tokio::sync::Mutex<Option<std::time::Instant>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("invalid upstream: {0}")]
    Upstream(#[from] UpstreamUrlError),
    #[error(transparent)]
    ApiKey(#[from] crate::data_plane::forward::InvalidApiKey),
    #[error("`tenants`: {0}")]
    Tenants(#[from] crate::data_plane::tenant::TenantError),
    #[error(transparent)]
    Store(#[from] crate::data_plane::store::OpenError),
    #[error(transparent)]
    Recorder(#[from] crate::data_plane::recorder::StartError),
    #[error(transparent)]
    AgentApi(#[from] crate::data_plane::layers::agent_api::AgentApiError),
    #[error("filters: {0}")]
    Filters(#[from] clawback_filters::FiltersError),
}

impl App {
    /// Opens the datapool (when recording) and starts the background tasks.
    pub async fn new(config: Config) -> Result<Arc<Self>, AppError> {
        let metrics = Arc::new(Metrics::new());
        let pool = Arc::new(
            Pool::new(&config.upstreams, config.balancer, config.health.clone())?
                .with_affinity(config.affinity),
        );
        let tasks = TaskTracker::new();
        let tenants = TenantResolver::new(&config.tenants)?;
        // A sidecar that serves one tenant gives it the whole of every bound; `tenant_share = 1`
        // turns fair shares off.
        let fair = tenants.is_shared() && config.limits.tenant_share < 1.0;
        let fraction = match tenants.is_shared() {
            true => config.limits.tenant_share,
            false => 1.0,
        };
        let max_orphans = config.limits.max_orphaned_calls;
        let forwarder = Arc::new(Forwarder::new(
            Arc::clone(&pool),
            config.upstream_api_key.as_deref(),
            config.upstream_kind,
            config.timeouts.clone(),
            crate::data_plane::forward::Orphans::new(max_orphans, fraction, fair),
            Arc::clone(&metrics),
            tasks.clone(),
        )?);
        let agent_api = AllowList::new(&config.agent_api)?;
        let admin = crate::control_plane::handshake::auth::AdminAuth::new(&config.admin)?;
        let background = CancellationToken::new();
        let datapool = if config.recording.enabled || config.routing.enabled() {
            Some(crate::data_plane::store::open(config.store()).await?)
        } else {
            None
        };
        let mut filters = None;
        let recorder = match &datapool {
            Some(datapool) if config.recording.enabled => {
                let recorder = Recorder::start(
                    config.recording.clone(),
                    datapool.clone(),
                    Arc::clone(&metrics),
                    &config.data_dir,
                    fraction,
                )?;
                filters = crate::data_plane::filters::start(
                    &config.filters,
                    &recorder,
                    &metrics,
                    (fraction, fair),
                )
                .await?;
                let stop = background.clone();
                tokio::spawn(
                    Arc::clone(&recorder).sweep_until(async move { stop.cancelled().await }),
                );
                Some(recorder)
            }
            _ => None,
        };
        let router = match datapool.map(|d| d.store) {
            Some(store) => {
                crate::data_plane::policy::start(
                    &config.routing,
                    &config.tenants,
                    config.redis.as_deref(),
                    store,
                    Arc::clone(&metrics),
                    background.clone(),
                )
                .await
            }
            None => None,
        };
        // A tenant's calls in flight bound the agent connections it holds busy (one call each
        // over HTTP/1.1): shared out of no more than the connections there are, a tenant's
        // slow calls cannot hold them all when `ulimit -n` lowered the cap.
        let connections = server::connection_cap(config.limits.max_connections);
        let calls = crate::data_plane::share::Shares::new(
            config.limits.max_concurrent_requests.min(connections),
            fraction,
            fair,
        );
        let bytes =
            crate::data_plane::share::Shares::new(config.limits.max_buffered_bytes, fraction, fair);
        let control = Handles {
            recorder: recorder.clone(),
            policies: router.as_ref().map(|router| Arc::clone(router.table())),
            tenants: tenants.clone(),
            admin,
            listen: config.listen,
            claw_r1: config.claw_r1.clone(),
            uids: claw_r1::Registry::new(fraction, fair),
            idle_timeout: config.recording.idle_timeout,
        };
        Ok(Arc::new(Self {
            config,
            pool,
            forwarder,
            metrics,
            tenants,
            agent_api,
            recorder,
            router,
            control,
            calls,
            bytes,
            connections,
            filters,
            tasks,
            background,
            lag_read_at: tokio::sync::Mutex::new(None),
        }))
    }

    /// Whether `route` is answered on `port`: with `admin.listen` set, the admin API, the
    /// viewer and `/metrics` live on the admin port only and the agent API on the agent port
    /// only; health and readiness on both.
    fn serves_on(&self, port: Port, route: &Route) -> bool {
        if self.config.admin.listen.is_none() {
            return true;
        }
        match route {
            Route::Control(control) => control.home == port,
            Route::Api { .. } | Route::ClawR1Api { .. } => port == Port::Agent,
            // Metrics name tenants and their adapters: not for the agents' port.
            Route::Metrics => port == Port::Admin,
            Route::Healthz | Route::Readyz | Route::NotFound => true,
        }
    }

    /// After the last request: completes live trajectories (their last turn is trained too) and
    /// writes everything the recorder still holds.
    pub async fn close(&self) {
        self.background.cancel();
        if let Some(recorder) = &self.recorder {
            recorder.complete_local().await;
            // The last evaluations (trajectory outcomes among them) go out with the rest.
            if let Some(filters) = &self.filters {
                filters.close(self.config.timeouts.shutdown_grace).await;
            }
            // Bounded: a datapool that hangs must not hang the process's exit.
            if tokio::time::timeout(self.config.timeouts.shutdown_grace, recorder.close())
                .await
                .is_err()
            {
                tracing::error!("the recorder could not write everything before exiting");
            }
        }
    }
}

/// Serves `app` on every listener until `shutdown` resolves, drains, then closes the app (its
/// live trajectories completed, everything recorded written).
pub async fn serve_on(
    listeners: Vec<(tokio::net::TcpListener, Port)>,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let serving = Serving {
        timeouts: &app.config.timeouts,
        connections: app.connections,
        metrics: Arc::clone(&app.metrics),
        tasks: &app.tasks,
    };
    server::serve_on(listeners, build(Arc::clone(&app)), serving, shutdown).await;
    app.close().await;
    tracing::info!("shutdown complete");
}

pub type Stack = RequestIdService<Observe<DialectErrors<LoadShed<AgentApi<Handler>>>>>;

/// The whole stack over one [`App`], in the order the module doc gives.
pub fn build(app: Arc<App>) -> Stack {
    let limits = &app.config.limits;
    let load_shed = LoadShedLayer::new(limits.max_concurrent_requests, limits.retry_after_secs);
    let observe = ObserveLayer::new(Arc::clone(&app.metrics), classify);
    let agent_api = AgentApiLayer::new(app.agent_api.clone());
    let handler = agent_api.layer(Handler { app });
    RequestIdLayer.layer(observe.layer(DialectLayer.layer(load_shed.layer(handler))))
}

/// The innermost service: answers local endpoints, forwards API calls.
#[derive(Clone)]
pub struct Handler {
    app: Arc<App>,
}

impl<B> Service<Request<B>> for Handler
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        let app = Arc::clone(&self.app);
        let route = request
            .extensions()
            .get::<Route>()
            .cloned()
            .unwrap_or_else(|| {
                classify(
                    request.method(),
                    request.uri().path(),
                    request.uri().query(),
                )
            });
        let port = request
            .extensions()
            .get::<Port>()
            .copied()
            .unwrap_or(Port::Agent);
        Box::pin(async move {
            if !app.serves_on(port, &route) {
                return Ok(ProxyError::NotFound {
                    method: request.method().to_string(),
                    path: request.uri().path().to_owned(),
                }
                .into_response());
            }
            let response = match route {
                Route::Healthz => json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned()),
                Route::Readyz => readiness(&app),
                Route::Metrics => metrics(&app).await,
                Route::NotFound => ProxyError::NotFound {
                    method: request.method().to_string(),
                    path: request.uri().path().to_owned(),
                }
                .into_response(),
                Route::Api {
                    endpoint,
                    session,
                    upstream_path,
                } => forward(app, request, endpoint, session, upstream_path)
                    .await
                    .unwrap_or_else(ProxyError::into_response),
                Route::ClawR1Api {
                    uid,
                    prompt,
                    endpoint,
                    upstream_path,
                } => claw_r1_api(app, request, &uid, &prompt, endpoint, upstream_path).await,
                Route::Control(_) => control(app, request).await,
            };
            Ok(response)
        })
    }
}

/// Decides a request's route: the control plane's own, else the data plane's.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> Route {
    match control_plane::Route::classify(method, path, query) {
        Some(control) => control.for_data_plane(),
        None => Route::classify(method, path, query),
    }
}

/// A control-plane route: who asks is checked before a byte of a control body is read, and
/// the control plane answers with the [`Handles`] it was given.
async fn control<B>(app: Arc<App>, request: Request<B>) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (method, uri) = (request.method(), request.uri());
    let Some(route) = control_plane::Route::classify(method, uri.path(), uri.query()) else {
        return ProxyError::NotFound {
            method: method.to_string(),
            path: uri.path().to_owned(),
        }
        .into_response();
    };
    let control = &app.control;
    let timeout = app.config.timeouts.body_read;
    match route {
        control_plane::Route::Policies => {
            control_plane::policies::handle(control, &request.into_parts().0)
        }
        control_plane::Route::Ui(asset) if control.admin.enabled() => {
            control_plane::ui::serve(asset)
        }
        control_plane::Route::Ui(_) => {
            control_plane::handshake::HandshakeError::Disabled.into_response()
        }
        control_plane::Route::Handshake(route) => {
            let (parts, body) = request.into_parts();
            let scope = match control.admin.authorize(&parts) {
                Ok(scope) => scope,
                Err(refused) => return refused.into_response(),
            };
            // A tenant token's uploads hold its tenant's shares, as its agents' calls do.
            let _held = match &scope {
                control_plane::handshake::auth::Scope::Tenant(tenant) => {
                    match take_control(&app, tenant, &parts.headers) {
                        Ok(held) => Some(held),
                        Err(refused) => return refused.into_response(),
                    }
                }
                control_plane::handshake::auth::Scope::All => None,
            };
            match read_body(CONTROL_BODY_LIMIT, timeout, &parts.headers, body).await {
                Ok(body) => {
                    control_plane::handshake::handle(control, &scope, route, &parts, body).await
                }
                Err(e) => e.into_response(),
            }
        }
        control_plane::Route::ClawR1(route) => {
            let tenant = match claw_r1_caller(&app, request.headers()).await {
                Ok(tenant) => tenant,
                Err(refusal) => return refusal,
            };
            let (parts, body) = request.into_parts();
            let _held = match take_control(&app, &tenant, &parts.headers) {
                Ok(held) => held,
                Err(refused) => return refused.into_response(),
            };
            match read_body(CONTROL_BODY_LIMIT, timeout, &parts.headers, body).await {
                Ok(body) => claw_r1::control(control, tenant, route, &parts, body).await,
                Err(e) => e.into_response(),
            }
        }
    }
}

/// What a control call of `tenant` holds while its body is read and answered: a unit of the
/// tenant's share of the calls in flight and its bytes, so its slow uploads hold its own share
/// only, not every connection.
fn take_control(
    app: &App,
    tenant: &TenantId,
    headers: &http::HeaderMap,
) -> Result<(Share, Share), ProxyError> {
    Ok((
        take_call(app, tenant)?,
        take_bytes(app, tenant, headers, CONTROL_BODY_LIMIT)?,
    ))
}

/// The tenant a Claw-R1 call acts for; refused when `claw_r1.enabled` is off, before its key is
/// looked at.
async fn claw_r1_caller(
    app: &App,
    headers: &http::HeaderMap,
) -> Result<TenantId, Response<ProxyBody>> {
    if !app.control.claw_r1.enabled {
        return Err(claw_r1::ClawR1Error::Disabled.into_response());
    }
    caller_tenant(app, headers)
        .await
        .map_err(ProxyError::into_response)
}

/// A `/v1` call under a Claw-R1 `base_url`: forwarded as the uid's session once the uid is
/// known to be the caller's tenant's.
async fn claw_r1_api<B>(
    app: Arc<App>,
    request: Request<B>,
    uid: &SessionId,
    prompt: &SessionId,
    endpoint: Endpoint,
    upstream_path: String,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let tenant = match claw_r1_caller(&app, request.headers()).await {
        Ok(tenant) => tenant,
        Err(refusal) => return refusal,
    };
    let session = match claw_r1::admit_api(&app.control, &tenant, uid, prompt).await {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    forward(app, request, endpoint, Some(session), upstream_path)
        .await
        .unwrap_or_else(ProxyError::into_response)
}

async fn forward<B>(
    app: Arc<App>,
    request: Request<B>,
    endpoint: Endpoint,
    session: Option<SessionId>,
    upstream_path: String,
) -> Result<Response<ProxyBody>, ProxyError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let (tenant, session) = match session_key(&app, &mut parts.headers).await? {
        Some(key) => (key.tenant, SessionId::parse(&key.trajectory.to_string())),
        None => (resolve_tenant(&app, &parts.headers)?, session),
    };
    // The tenant's share of the calls in flight, taken before its body is read: a tenant's slow
    // uploads hold its own share only. Held, like the whole's permit, by the forwarding task
    // until the upstream call ends and by the answer until the client has it.
    let share = take_call(&app, &tenant)?;
    let share = HeldShare {
        _share: Arc::new(share),
    };
    parts.extensions.insert(share.clone());
    parts
        .extensions
        .insert(crate::data_plane::tenant::CallTenant(tenant.clone()));
    let mut response = serve(app, parts, body, tenant, session, endpoint, upstream_path).await?;
    response.body_mut().attach(share);
    Ok(response)
}

/// A unit of `tenant`'s share of the calls in flight; 429 past it.
fn take_call(app: &App, tenant: &TenantId) -> Result<Share, ProxyError> {
    app.calls
        .try_take(tenant)
        .ok_or(ProxyError::TenantOverloaded {
            share: app.calls.share_of(tenant),
            retry_after_secs: app.config.limits.retry_after_secs,
        })
}

/// `tenant`'s share of the buffered bodies' bytes for a body of at most `limit` bytes, taken
/// before it is read: what `headers` declare, or `limit` while a body of unknown length
/// arrives. 429 past the tenant's share, 503 past the whole.
fn take_bytes(
    app: &App,
    tenant: &TenantId,
    headers: &http::HeaderMap,
    limit: usize,
) -> Result<Share, ProxyError> {
    let reserved = declared_length(headers).map_or(limit, |len| len.min(limit));
    let retry_after_secs = app.config.limits.retry_after_secs;
    app.bytes
        .try_take_n(tenant, reserved)
        .map_err(|refusal| match refusal {
            Refusal::Whole => ProxyError::BuffersFull {
                limit: app.config.limits.max_buffered_bytes,
                retry_after_secs,
            },
            Refusal::Share(share) => ProxyError::TenantBuffersFull {
                share,
                retry_after_secs,
            },
        })
}

/// A call's bytes of its tenant's share of the buffered bodies, in the request's extensions
/// (which the forwarding task holds until the upstream call ends).
#[derive(Clone)]
struct HeldBytes {
    _bytes: Arc<Share>,
}

/// A call's unit of its tenant's share, in the request's extensions and on its answer.
#[derive(Clone)]
struct HeldShare {
    _share: Arc<Share>,
}

/// Reads, checks, routes and forwards one call of `tenant`.
async fn serve<B>(
    app: Arc<App>,
    mut parts: http::request::Parts,
    body: B,
    tenant: TenantId,
    session: Option<SessionId>,
    endpoint: Endpoint,
    upstream_path: String,
) -> Result<Response<ProxyBody>, ProxyError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let limit = app.config.limits.max_body_bytes;
    // Held, with the body, until the upstream call ends.
    let mut bytes = take_bytes(&app, &tenant, &parts.headers, limit)?;
    let body = read_body(limit, app.config.timeouts.body_read, &parts.headers, body).await?;
    bytes.shrink_to(body.len());
    parts.extensions.insert(HeldBytes {
        _bytes: Arc::new(bytes),
    });
    // What the engine gets is what the sidecar read: a body it cannot read is refused here.
    let json = crate::data_plane::agent_json::read(
        &parts.method,
        &body,
        app.config.limits.max_body_values,
    )?;
    if let Some(json) = &json {
        crate::data_plane::engine_fields::check(
            &app.config.forwarding,
            app.config.upstream_kind,
            &tenant,
            endpoint,
            &upstream_path,
            json,
        )?;
    }
    let (body, json, endpoint, upstream_path, answer) = match (endpoint, json) {
        (Endpoint::Models, _) => {
            let response = app
                .forwarder
                .call(parts, body, upstream_path, None, None, Answer::AsSent)
                .await?;
            return Ok(models_for(&app, &tenant, response).await);
        }
        (Endpoint::StoredResponse, _) => {
            let id = upstream_path
                .trim_start_matches("/v1/responses/")
                .split(['/', '?'])
                .next()
                .unwrap_or_default();
            if !may_name_response(&app, &tenant, id) {
                return Err(ProxyError::StoredResponseNotFound { id: id.to_owned() });
            }
            (body, None, endpoint, upstream_path, Answer::AsSent)
        }
        (_, None) => (body, None, endpoint, upstream_path, Answer::AsSent),
        (Endpoint::Responses, Some(json)) if app.recorder.is_none() => {
            // Not resolved here (nothing is kept): the engine's own store answers, for a
            // sidecar that serves one tenant only.
            if let Some(id) = json["previous_response_id"].as_str() {
                if app.tenants.is_shared() {
                    return Err(ProxyError::ResponseNotFound { id: id.to_owned() });
                }
            }
            (body, Some(json), endpoint, upstream_path, Answer::AsSent)
        }
        (Endpoint::Messages, Some(json))
            if app.config.upstream_kind == crate::config::UpstreamKind::Anthropic =>
        {
            (
                body,
                Some(json),
                endpoint,
                upstream_path,
                Answer::MessagesAsSent,
            )
        }
        (Endpoint::Messages, Some(json)) => {
            let (chat, json) = crate::data_plane::anthropic::to_chat_body(&json)?;
            let path = crate::data_plane::anthropic::CHAT_PATH.to_owned();
            let endpoint = Endpoint::ChatCompletions;
            (chat, Some(json), endpoint, path, Answer::Messages)
        }
        (_, json) => (body, json, endpoint, upstream_path, Answer::AsSent),
    };
    let Some(json) = json else {
        return app
            .forwarder
            .call(parts, body, upstream_path, None, None, answer)
            .await;
    };
    let (body, mut recording, routed) =
        prepare_call(&app, &parts, endpoint, session.as_ref(), tenant, body, json).await?;
    if let Some(pending) = &mut recording {
        pending.capture = pending.capture.answering(answer);
    }
    app.forwarder
        .call(parts, body, upstream_path, recording, routed.lease, answer)
        .await
}

/// The tenant of a call's API key (or the default tenant, or the trusted header's).
fn resolve_tenant(app: &App, headers: &http::HeaderMap) -> Result<TenantId, ProxyError> {
    app.tenants.resolve(headers).map_err(|e| match e {
        Unresolved::UnknownKey => ProxyError::UnknownApiKey,
        Unresolved::BadHeader => ProxyError::BadTenantHeader,
    })
}

/// The tenant a call acts for, its headers left as they are: its session key's (a key nobody
/// minted is refused, never taken for the default tenant), else [`resolve_tenant`]'s.
async fn caller_tenant(app: &App, headers: &http::HeaderMap) -> Result<TenantId, ProxyError> {
    match crate::data_plane::tenant::presented_key(headers)
        .filter(|key| key.starts_with(crate::data_plane::session::keys::PREFIX))
    {
        Some(key) => minted(app, key).await.map(|session| session.tenant),
        None => resolve_tenant(app, headers),
    }
}

/// The session `key` was minted for; [`ProxyError::UnknownApiKey`] when it stands for nothing.
/// A key lives as long as its trajectory: once that completed (the agent's done signal, the
/// admin API's `complete` — how a key is revoked — or the idle sweep) it is refused.
async fn minted(app: &App, key: &str) -> Result<clawback_datapool::KeyedSession, ProxyError> {
    let recorder = app.recorder.as_ref().ok_or(ProxyError::UnknownApiKey)?;
    let session = recorder
        .session_key(key)
        .await
        .ok_or(ProxyError::UnknownApiKey)?;
    match recorder.is_live(&session.tenant, &session.trajectory).await {
        Ok(true) => Ok(session),
        // Not known live (or not known now): not authorized.
        Ok(false) | Err(_) => Err(ProxyError::SessionKeyEnded),
    }
}

/// The session a call's key was minted for, if it presents one; the key is taken out of the
/// headers then, so the engine never sees it. A session key wins over every other session hint,
/// and one that stands for nothing (never minted, or forgotten) is refused: it is never taken
/// for a tenant's key.
async fn session_key(
    app: &App,
    headers: &mut http::HeaderMap,
) -> Result<Option<clawback_datapool::KeyedSession>, ProxyError> {
    let presented = crate::data_plane::tenant::presented_key(headers);
    let Some(key) =
        presented.filter(|key| key.starts_with(crate::data_plane::session::keys::PREFIX))
    else {
        // A tenant's key (or none) decides the call; a session key beside it goes nowhere.
        crate::data_plane::session::keys::strip(headers);
        return Ok(None);
    };
    let session = minted(app, key).await?;
    headers.remove(header::AUTHORIZATION);
    for name in crate::data_plane::tenant::API_KEY_HEADERS {
        headers.remove(name);
    }
    Ok(Some(session))
}

/// Whether `tenant` may name the stored response `id`: one it made, when the sidecar keeps them
/// (recording on); without, only a sidecar that serves one tenant passes the id on.
fn may_name_response(app: &App, tenant: &TenantId, id: &str) -> bool {
    match &app.recorder {
        Some(recorder) => recorder.responses().owns(tenant, id),
        None => !app.tenants.is_shared(),
    }
}

/// Routes a model call (and `count_tokens`) to `tenant`'s live adapter, rewriting its `model`;
/// without routing, and for any other call with a body (embeddings), only checks that it names
/// no other tenant's adapter.
fn route_call(
    app: &App,
    tenant: &TenantId,
    endpoint: Endpoint,
    json: &mut Value,
) -> Result<Routed, ProxyError> {
    Ok(match &app.router {
        Some(router) if endpoint != Endpoint::Other => router.route(tenant, json)?,
        _ => Routed {
            policy: match json["model"].as_str() {
                Some(model) => own_adapter(tenant, model)?,
                None => None,
            },
            ..Routed::default()
        },
    })
}

/// Largest `/v1/models` answer the sidecar filters; a larger one is refused, not passed on
/// unfiltered.
const MODEL_LIST_LIMIT: usize = 4 << 20;

/// The engine's model list as `tenant` may see it ([`crate::data_plane::policy::models`]).
async fn models_for(
    app: &App,
    tenant: &TenantId,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    if !response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let collected = match Limited::new(body, MODEL_LIST_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return ProxyError::Internal(format!("the engine's model list could not be read: {e}"))
                .into_response()
        }
    };
    let visible = |id: &str| match &app.router {
        Some(router) => router.visible(tenant, id),
        None => own_adapter(tenant, id).is_ok(),
    };
    let body = match crate::data_plane::policy::models::filter_list(&collected, visible) {
        Some(filtered) => Bytes::from(filtered),
        None => collected,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, ProxyBody::full(body))
}

/// For a call that carries a body: routes it to the tenant's live adapter (or refuses another
/// tenant's) and, for a model call with recording on, decides its trajectory and asks the engine
/// for what the step records (token ids, logprobs). Other calls with a body (`count_tokens`,
/// embeddings) are routed the same way and neither recorded nor asked for anything.
async fn prepare_call(
    app: &App,
    parts: &http::request::Parts,
    endpoint: Endpoint,
    session: Option<&SessionId>,
    tenant: TenantId,
    body: Bytes,
    mut json: Value,
) -> Result<(Bytes, Option<Pending>, Routed), ProxyError> {
    let routed = route_call(app, &tenant, endpoint, &mut json)?;
    // What the sidecar sets for the engine itself, after the step recorded what the agent sent.
    let set = |json: &mut Value| {
        crate::data_plane::engine_fields::set(
            &app.config.forwarding,
            app.config.upstream_kind,
            &tenant,
            endpoint,
            json,
        )
    };
    let (Some(recorder), Some(step_endpoint)) = (&app.recorder, request::endpoint(endpoint)) else {
        let decided = set(&mut json);
        return Ok((
            reencode_if(decided || routed.rewritten, &json, body)?,
            None,
            routed,
        ));
    };
    let mut hints = Hints::read(session, &parts.headers, Some(&json))?;
    let responses_turn = match step_endpoint {
        clawback_datapool::Endpoint::Responses => {
            let (turn, continues) = crate::data_plane::session::responses::resolve(
                recorder.responses(),
                &tenant,
                &mut json,
                app.config.limits.max_body_bytes,
            )?;
            hints.continues = continues;
            Some(turn)
        }
        _ => None,
    };
    let resolved = responses_turn
        .as_ref()
        .is_some_and(|turn| turn.previous.is_some());
    let traceparent = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut call = recorder.begin(tenant.clone(), &hints, step_endpoint, &json, traceparent);
    let decided = set(&mut json);
    call.policy = routed.policy.clone();
    call.responses = responses_turn;
    let model = json["model"].as_str().unwrap_or_default().to_owned();
    let capture = Capture::for_request(app.config.upstream_kind, step_endpoint, &mut json);
    let body = reencode_if(
        decided || routed.rewritten || resolved || !capture.injected().is_empty(),
        &json,
        body,
    )?;
    let pending = Pending {
        recorder: Arc::clone(recorder),
        call,
        capture,
        model,
    };
    Ok((body, Some(pending), routed))
}

/// `json` as the new body when it was changed, else the body as it came (which means the same:
/// it was read strictly).
fn reencode_if(changed: bool, json: &Value, body: Bytes) -> Result<Bytes, ProxyError> {
    if !changed {
        return Ok(body);
    }
    serde_json::to_vec(json)
        .map(Bytes::from)
        .map_err(|e| ProxyError::Internal(format!("the rewritten body could not be written: {e}")))
}

/// Largest body of a control call (the handshake API, Claw-R1's init, register and complete):
/// they carry ids, rewards and a little metadata, never a conversation.
const CONTROL_BODY_LIMIT: usize = 1 << 20;

/// The request body, refused past `limit` bytes (declared or read) or `timeout`.
async fn read_body<B>(
    limit: usize,
    timeout: std::time::Duration,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if declared_length(headers).is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(ProxyError::BodyTimeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Ok(Err(e)) => Err(ProxyError::BodyRead(e)),
    }
}

/// The body length a request declares (`Content-Length`), saturated at `usize::MAX`.
fn declared_length(headers: &http::HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|len| usize::try_from(len).unwrap_or(usize::MAX))
}

fn readiness(app: &App) -> Response<ProxyBody> {
    let healthy = app.pool.healthy_count();
    let total = app.pool.all().len();
    let (status, state) = match (healthy, app.pool.can_serve()) {
        (0, true) => (StatusCode::OK, "panic_mode"),
        (0, false) => (StatusCode::SERVICE_UNAVAILABLE, "no_healthy_upstream"),
        _ => (StatusCode::OK, "ready"),
    };
    let mut body = serde_json::json!({
        "status": state,
        "healthy_upstreams": healthy,
        "upstreams": total,
    });
    if app.recorder.is_some() {
        let mut capture = app.metrics.capture_summary();
        capture["expected"] = expected_capture(app.config.upstream_kind).into();
        body["capture"] = capture;
    }
    json(status, body.to_string())
}

/// What the sidecar can capture from `kind`'s engine ([`crate::data_plane::capture::request`]).
fn expected_capture(kind: crate::config::UpstreamKind) -> &'static str {
    use crate::config::UpstreamKind;
    match kind {
        UpstreamKind::Vllm => "tokens",
        UpstreamKind::Sglang => "tokens; logprobs without ids when streaming",
        UpstreamKind::Openai | UpstreamKind::Anthropic => "text",
    }
}

/// The datapool's lag is read at most this often, however often `/metrics` is asked: a read
/// costs one store query per tenant, and whoever reaches the port may ask.
const LAG_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

async fn metrics(app: &App) -> Response<ProxyBody> {
    if let Some(recorder) = &app.recorder {
        // One read at a time: a scrape that finds one under way, or a recent one, answers with
        // the gauges as they are.
        if let Ok(mut read_at) = app.lag_read_at.try_lock() {
            if read_at.is_none_or(|at| at.elapsed() >= LAG_REFRESH) {
                datapool_lag(recorder.store().as_ref(), &app.metrics).await;
                *read_at = Some(std::time::Instant::now());
            }
        }
    }
    for upstream in app.pool.all() {
        app.metrics
            .upstream_healthy
            .get_or_create(&UpstreamLabels::new(&upstream.name))
            .set(i64::from(app.pool.is_healthy(upstream)));
    }
    let mut response = Response::new(ProxyBody::full(app.metrics.render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// Refreshes the consumer groups' lag from the datapool, within a bound so that a slow or absent
/// Redis never stalls a scrape (the gauges then keep their last values).
async fn datapool_lag(store: &dyn clawback_datapool::Store, metrics: &Metrics) {
    let read = async {
        let mut lags = Vec::new();
        for tenant in store.tenants().await? {
            lags.extend(store.consumer_lag(&tenant).await?);
        }
        Ok::<_, clawback_datapool::Error>(lags)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), read).await {
        Ok(Ok(lags)) => metrics.set_datapool_lag(&lags),
        Ok(Err(e)) => tracing::debug!(error = %e, "datapool lag not refreshed"),
        Err(_) => tracing::debug!("datapool lag not refreshed: the datapool took over 2s"),
    }
}

fn json(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
