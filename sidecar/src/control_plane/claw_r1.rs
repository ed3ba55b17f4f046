//! Claw-R1's black-box protocol on the agent port, so rollout code written for Claw-R1's gateway
//! runs unchanged (`claw_r1.enabled`; off by default):
//!
//! - `POST /init_trajectory` → `{trajectory_uid, base_url}`, `base_url` being
//!   `http://host/{trajectory_uid}/1/v1`; the rollout code replaces the `1` (the default
//!   `prompt_uid`) with its task id;
//! - `POST {base_url}/register_trajectory` `{channel?, metadata?}` opens the trajectory in the
//!   group named by the `prompt_uid` (of `claw_r1.group_size` rollouts), with the metadata as
//!   the agent's (`metadata.agent`, never shown to plugins);
//! - `{base_url}/chat/completions` (and the other `/v1` calls): forwarded and recorded as the
//!   trajectory's steps, the group from the path;
//! - `POST {base_url}/complete_trajectory` `{reward?, channel?}` or `POST
//!   {base_url}/trajectory/complete` (the agent's own) completes it, the reward as feedback;
//! - Claw-R1's older top-level forms, `POST /register_trajectory` `{trajectory_uid, ...}` and
//!   `POST /complete_trajectory/{trajectory_uid}`.
//!
//! Every uid was minted here for the caller's tenant (its API key, else the default tenant): an
//! unknown uid, or one minted for another tenant, answers 404 (Claw-R1 accepts any silently).
//! Whoever holds a tenant's key can open its trajectories and post their rewards — meant for
//! rollout fleets, which is why it is off unless configured.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clawback_datapool::{CompletionReason, TenantId, TrajectoryId};
use http::{request, Method, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::control_plane::Handles;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::error_response;
use crate::data_plane::route::{Endpoint, SessionId};

/// `[claw_r1]`: Claw-R1's gateway protocol, for rollout code written for it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClawR1 {
    /// Off by default: on, whoever holds a tenant's key opens trajectories and posts their
    /// rewards — for rollout fleets, not for agents facing users.
    pub enabled: bool,
    /// Rollouts per prompt (Claw-R1's `rollout.n`): each `prompt_uid` names a group of this
    /// many. 0: no groups, each trajectory stands alone.
    pub group_size: u32,
}

/// Trajectories minted and not completed that one sidecar remembers; past it the oldest idle
/// ones (untouched for `recording.idle_timeout`) are forgotten, else init is refused.
pub const MAX_OPEN: usize = 100_000;

/// A Claw-R1 route, decided from the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Init,
    /// `{base_url}/register_trajectory`, or the top-level form with the uid in the body.
    Register(Option<(SessionId, SessionId)>),
    /// `{base_url}/complete_trajectory`, `{base_url}/trajectory/complete`, or
    /// `/complete_trajectory/{uid}` (no prompt uid).
    Complete(SessionId, Option<SessionId>),
    /// A `/v1` call under `{base_url}`.
    Api {
        uid: SessionId,
        prompt: SessionId,
        endpoint: Endpoint,
        /// `/v1/...` plus the query string.
        upstream_path: String,
    },
}

impl Route {
    /// `None` for a path that is not one of Claw-R1's (the sidecar's own `/s/...` form is
    /// never one).
    pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<Self> {
        let post = *method == Method::POST;
        match path {
            "/init_trajectory" if post => return Some(Self::Init),
            "/register_trajectory" if post => return Some(Self::Register(None)),
            _ => {}
        }
        if let Some(uid) = path.strip_prefix("/complete_trajectory/") {
            return SessionId::parse(uid)
                .filter(|_| post)
                .map(|uid| Self::Complete(uid, None));
        }
        let mut parts = path.strip_prefix('/')?.splitn(4, '/');
        let (uid, prompt, v1) = (parts.next()?, parts.next()?, parts.next()?);
        if uid == "s" || v1 != "v1" {
            return None;
        }
        let (uid, prompt) = (SessionId::parse(uid)?, SessionId::parse(prompt)?);
        let rest = parts.next().unwrap_or_default();
        match rest {
            "register_trajectory" if post => Some(Self::Register(Some((uid, prompt)))),
            "complete_trajectory" | "trajectory/complete" if post => {
                Some(Self::Complete(uid, Some(prompt)))
            }
            _ => {
                let api_path = format!("/v1/{rest}");
                let upstream_path = match query {
                    Some(q) => format!("{api_path}?{q}"),
                    None => api_path.clone(),
                };
                Some(Self::Api {
                    endpoint: Endpoint::classify(method, &api_path),
                    uid,
                    prompt,
                    upstream_path,
                })
            }
        }
    }
}

/// What a minted uid is bound to.
#[derive(Debug)]
struct Open {
    tenant: TenantId,
    trajectory: Option<TrajectoryId>,
    touched: Instant,
}

/// The uids this sidecar minted, each bound to its tenant (and, once opened, its trajectory):
/// at most [`MAX_OPEN`] in all, and a tenant's share of them per tenant.
#[derive(Debug)]
pub struct Registry {
    state: Mutex<Minted>,
}

#[derive(Debug)]
struct Minted {
    open: HashMap<String, Open>,
    per_tenant: crate::data_plane::share::Counts,
}

impl Minted {
    /// Forgets the uids idle past `idle`.
    fn forget_idle(&mut self, idle: Duration) {
        let per_tenant = &mut self.per_tenant;
        self.open.retain(|_, o| {
            let keep = o.touched.elapsed() < idle;
            if !keep {
                per_tenant.give_back(&o.tenant);
            }
            keep
        });
    }

    fn remove(&mut self, uid: &str) {
        if let Some(o) = self.open.remove(uid) {
            self.per_tenant.give_back(&o.tenant);
        }
    }
}

impl Registry {
    /// A registry of [`MAX_OPEN`] uids, each tenant its share of them
    /// ([`crate::data_plane::share::Counts::new`]).
    pub fn new(fraction: f64, fair: bool) -> Self {
        Self::sized(MAX_OPEN, fraction, fair)
    }

    fn sized(total: usize, fraction: f64, fair: bool) -> Self {
        Self {
            state: Mutex::new(Minted {
                open: HashMap::new(),
                per_tenant: crate::data_plane::share::Counts::new(total, fraction, fair),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Minted> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mint(&self, tenant: TenantId, idle: Duration) -> Result<String, ClawR1Error> {
        let mut state = self.lock();
        let at_share = !state.per_tenant.may_take(&tenant);
        if state.open.len() >= MAX_OPEN || at_share {
            state.forget_idle(idle);
        }
        if state.open.len() >= MAX_OPEN {
            return Err(ClawR1Error::Full);
        }
        if !state.per_tenant.take(&tenant) {
            return Err(ClawR1Error::TenantFull(state.per_tenant.share_of(&tenant)));
        }
        let uid = TrajectoryId::new().to_string();
        state.open.insert(
            uid.clone(),
            Open {
                tenant,
                trajectory: None,
                touched: Instant::now(),
            },
        );
        Ok(uid)
    }

    /// The trajectory of `uid` for `tenant` (`Some(None)`: minted, not opened yet); `None` when
    /// the uid is unknown or another tenant's.
    fn find(&self, uid: &str, tenant: &TenantId) -> Option<Option<TrajectoryId>> {
        let mut state = self.lock();
        let entry = state.open.get_mut(uid).filter(|o| o.tenant == *tenant)?;
        entry.touched = Instant::now();
        Some(entry.trajectory)
    }

    fn opened(&self, uid: &str, trajectory: TrajectoryId) {
        if let Some(entry) = self.lock().open.get_mut(uid) {
            entry.trajectory = Some(trajectory);
        }
    }

    fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClawR1Error {
    #[error("Claw-R1's protocol is off: set claw_r1.enabled")]
    Disabled,
    #[error("recording is disabled: there are no trajectories")]
    RecordingOff,
    #[error("trajectory {0} was not initialised here (POST /init_trajectory first)")]
    Unknown(String),
    #[error("invalid request body: {0}")]
    BadBody(String),
    #[error("too many open trajectories ({MAX_OPEN}): complete some first")]
    Full,
    #[error("this tenant holds its share of open trajectories ({0}): complete some first")]
    TenantFull(usize),
    #[error(transparent)]
    Sessions(#[from] crate::data_plane::session::shared::Unreachable),
}

impl ClawR1Error {
    pub fn into_response(self) -> Response<ProxyBody> {
        let (status, code) = match &self {
            Self::Disabled => (StatusCode::NOT_FOUND, "not_found"),
            Self::RecordingOff => (StatusCode::CONFLICT, "recording_disabled"),
            Self::Unknown(_) => (StatusCode::NOT_FOUND, "trajectory_not_found"),
            Self::BadBody(_) => (StatusCode::BAD_REQUEST, "invalid_body"),
            Self::Full => (StatusCode::SERVICE_UNAVAILABLE, "too_many_trajectories"),
            Self::TenantFull(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "tenant_too_many_trajectories",
            ),
            Self::Sessions(_) => (StatusCode::SERVICE_UNAVAILABLE, "session_state_unreachable"),
        };
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        error_response(status, &self.to_string(), kind, code)
    }
}

#[derive(Debug, Default, Deserialize)]
struct RegisterBody {
    trajectory_uid: Option<String>,
    channel: Option<String>,
    #[serde(default)]
    metadata: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
struct CompleteBody {
    reward: Option<f64>,
    channel: Option<String>,
}

fn parse<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, ClawR1Error> {
    crate::control_plane::handshake::body_or_default(body)
        .map_err(|e| ClawR1Error::BadBody(e.to_string()))
}

/// The group a `prompt_uid` names, when groups are configured.
fn group(control: &Handles, prompt: &str) -> Option<(String, u32)> {
    let size = control.claw_r1.group_size;
    (size > 0).then(|| (prompt.to_owned(), size))
}

/// The trajectory of a registered or called uid, opened now if it was only minted.
async fn ensure_open(
    control: &Handles,
    tenant: &TenantId,
    uid: &str,
    prompt: &str,
    agent_body: &Value,
) -> Result<TrajectoryId, ClawR1Error> {
    let recorder = control.recorder.as_ref().ok_or(ClawR1Error::RecordingOff)?;
    match control.uids.find(uid, tenant) {
        None => Err(ClawR1Error::Unknown(uid.to_owned())),
        Some(Some(id)) => Ok(id),
        Some(None) => {
            let id = recorder
                .open_named(tenant, uid, group(control, prompt), agent_body)
                .await;
            control.uids.opened(uid, id);
            Ok(id)
        }
    }
}

/// Admits a `/v1` call under a Claw-R1 `base_url`: its session (the uid) once the uid is known
/// to be `tenant`'s and its trajectory is open. The caller has checked that the protocol is on
/// (before reading anything of the request).
pub async fn admit_api(
    control: &Handles,
    tenant: &TenantId,
    uid: &SessionId,
    prompt: &SessionId,
) -> Result<SessionId, ClawR1Error> {
    ensure_open(control, tenant, uid.as_str(), prompt.as_str(), &Value::Null)
        .await
        .map(|_| uid.clone())
}

/// Answers init, register and complete (the protocol is on: the caller checked).
pub async fn control(
    control: &Handles,
    tenant: TenantId,
    route: Route,
    parts: &request::Parts,
    body: Bytes,
) -> Response<ProxyBody> {
    let answer = async {
        match route {
            Route::Init => init(control, tenant, parts),
            Route::Register(at) => register(control, &tenant, at, parse(&body)?).await,
            Route::Complete(uid, _) => complete(control, &tenant, &uid, parse(&body)?).await,
            Route::Api { .. } => Err(ClawR1Error::BadBody("not a control route".into())),
        }
    };
    answer.await.unwrap_or_else(ClawR1Error::into_response)
}

fn ok(body: &Value) -> Result<Response<ProxyBody>, ClawR1Error> {
    Ok(crate::control_plane::handshake::json_response(
        StatusCode::OK,
        body,
    ))
}

fn init(
    control: &Handles,
    tenant: TenantId,
    parts: &request::Parts,
) -> Result<Response<ProxyBody>, ClawR1Error> {
    if control.recorder.is_none() {
        return Err(ClawR1Error::RecordingOff);
    }
    let uid = control.uids.mint(tenant, control.idle_timeout)?;
    let root = crate::control_plane::handshake::public_root(control, parts);
    ok(&json!({"trajectory_uid": uid, "base_url": format!("{root}/{uid}/1/v1")}))
}

/// Claw-R1's channel of validation rollouts: recorded and scored, never trained on.
const VALIDATION_CHANNEL: &str = "val";

async fn register(
    control: &Handles,
    tenant: &TenantId,
    at: Option<(SessionId, SessionId)>,
    body: RegisterBody,
) -> Result<Response<ProxyBody>, ClawR1Error> {
    let (uid, prompt) = match (at, &body.trajectory_uid) {
        (Some((uid, prompt)), _) => (uid.as_str().to_owned(), prompt.as_str().to_owned()),
        (None, Some(uid)) => (uid.clone(), "1".to_owned()),
        (None, None) => return Err(ClawR1Error::BadBody("trajectory_uid is missing".into())),
    };
    let mut metadata = body.metadata;
    let validation = body.channel.as_deref() == Some(VALIDATION_CHANNEL);
    if let Some(channel) = body.channel {
        metadata.insert("channel".to_owned(), json!(channel));
    }
    metadata.insert("prompt_uid".to_owned(), json!(prompt));
    let agent = json!({ "metadata": Value::Object(metadata) });
    let id = ensure_open(control, tenant, &uid, &prompt, &agent).await?;
    if validation {
        if let Some(recorder) = &control.recorder {
            recorder.evaluation_only(tenant, id).await;
        }
    }
    ok(&json!({"status": "ok"}))
}

async fn complete(
    control: &Handles,
    tenant: &TenantId,
    uid: &SessionId,
    body: CompleteBody,
) -> Result<Response<ProxyBody>, ClawR1Error> {
    let recorder = control.recorder.as_ref().ok_or(ClawR1Error::RecordingOff)?;
    let Some(opened) = control.uids.find(uid.as_str(), tenant) else {
        return Err(ClawR1Error::Unknown(uid.as_str().to_owned()));
    };
    if let Some(reward) = body.reward {
        crate::control_plane::handshake::checked_reward(reward).map_err(ClawR1Error::BadBody)?;
    }
    control.uids.forget(uid.as_str());
    // A trajectory that never made a call has nothing to train on: forgetting its uid is all.
    let Some(trajectory) = opened else {
        return ok(&json!({"status": "ok"}));
    };
    if let Some(reward) = body.reward {
        let mut labels = std::collections::BTreeMap::new();
        if let Some(channel) = body.channel {
            labels.insert("channel".to_owned(), channel);
        }
        recorder.enqueue_evaluations(vec![crate::control_plane::handshake::feedback_evaluation(
            tenant,
            trajectory,
            None,
            "claw_r1",
            Some(reward),
            None,
            labels,
        )]);
    }
    recorder
        .complete(tenant, trajectory, CompletionReason::Handshake)
        .await?;
    ok(&json!({"status": "ok"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_share_of_uids_leaves_the_rest_to_others() {
        // Eight uids, a quarter each at most.
        let registry = Registry::sized(8, 0.25, true);
        let idle = Duration::from_secs(600);
        let (alpha, bravo) = (
            TenantId::new("alpha").unwrap(),
            TenantId::new("bravo").unwrap(),
        );
        let first = registry.mint(alpha.clone(), idle).unwrap();
        registry.mint(alpha.clone(), idle).unwrap();
        assert!(matches!(
            registry.mint(alpha.clone(), idle),
            Err(ClawR1Error::TenantFull(2))
        ));
        registry.mint(bravo.clone(), idle).unwrap();
        // A uid completed gives its room back.
        registry.forget(&first);
        registry.mint(alpha.clone(), idle).unwrap();
        // Idle ones too, when the tenant needs the room.
        assert!(registry.mint(alpha.clone(), Duration::ZERO).is_ok());
    }

    fn classify(method: Method, path: &str) -> Option<Route> {
        Route::classify(&method, path, None)
    }

    #[test]
    fn claw_r1_paths_are_recognised_and_the_sidecars_own_forms_are_not() {
        assert_eq!(
            classify(Method::POST, "/init_trajectory"),
            Some(Route::Init)
        );
        assert_eq!(classify(Method::GET, "/init_trajectory"), None);
        let uid = "0193a8f0-0000-7000-8000-000000000001";
        match classify(Method::POST, &format!("/{uid}/task-7/v1/chat/completions")) {
            Some(Route::Api {
                uid: u,
                prompt,
                endpoint,
                upstream_path,
            }) => {
                assert_eq!(u.as_str(), uid);
                assert_eq!(prompt.as_str(), "task-7");
                assert_eq!(endpoint, Endpoint::ChatCompletions);
                assert_eq!(upstream_path, "/v1/chat/completions");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(Method::POST, &format!("/{uid}/7/v1/register_trajectory")),
            Some(Route::Register(Some(_)))
        ));
        for done in ["complete_trajectory", "trajectory/complete"] {
            assert!(matches!(
                classify(Method::POST, &format!("/{uid}/7/v1/{done}")),
                Some(Route::Complete(_, Some(_)))
            ));
        }
        assert!(matches!(
            classify(Method::POST, &format!("/complete_trajectory/{uid}")),
            Some(Route::Complete(_, None))
        ));
        // The sidecar's own session form, plain API paths and odd ids are not Claw-R1's.
        assert_eq!(classify(Method::POST, "/s/sess/v1/chat/completions"), None);
        assert_eq!(classify(Method::POST, "/v1/chat/completions"), None);
        assert_eq!(classify(Method::POST, "/a b/1/v1/chat/completions"), None);
        assert_eq!(classify(Method::POST, "/a/1/v2/chat/completions"), None);
    }
}
