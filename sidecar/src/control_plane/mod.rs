//! The control plane: the routes operators and rollout code call. It reads the data plane
//! through [`Handles`], never the composition root.

pub mod claw_r1;
pub mod export;
pub mod handshake;
pub mod policies;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::data_plane::policy::PolicyTable;
use crate::data_plane::recorder::Recorder;
use crate::data_plane::tenant::TenantResolver;

/// What the control plane reads of the data plane, handed to it once by the app: the recorder
/// (and through it the store and the session state), the live policy table and the tenants —
/// never the forwarder, the upstream pool or the request path's state.
pub struct Handles {
    /// `None` when `recording.enabled` is off.
    pub recorder: Option<Arc<Recorder>>,
    /// Every tenant's live policy; `None` when routing is off.
    pub policies: Option<Arc<PolicyTable>>,
    /// The tenants the sidecar's keys name, and the default tenant.
    pub tenants: TenantResolver,
    /// The admin API's tokens and their scopes.
    pub admin: handshake::auth::AdminAuth,
    /// The agent port's address: the root of the URLs handed out when a call names no `Host`.
    pub listen: SocketAddr,
    /// `[claw_r1]`.
    pub claw_r1: claw_r1::ClawR1,
    /// The uids Claw-R1's `init_trajectory` minted here.
    pub uids: claw_r1::Registry,
    /// `recording.idle_timeout`: how long a minted uid no call used is kept.
    pub idle_timeout: Duration,
}

/// A route the control plane answers, decided from the request line alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /admin/policies`: live policies and calls in flight per adapter.
    Policies,
    /// The handshake API (`/trajectories...`, `/tenants...`); `Err` for a path under it that
    /// is no route.
    Handshake(Result<handshake::Route, ()>),
    /// The trajectory viewer's page and files (`/ui`).
    Ui(ui::Asset),
    /// Claw-R1's black-box protocol ([`claw_r1`]): its trajectory routes, and the model calls
    /// under its base URLs (which the data plane forwards once the uid is admitted).
    ClawR1(claw_r1::Route),
}

impl Route {
    /// `None` for a path the control plane does not own.
    pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> Option<Self> {
        if path == policies::PATH && *method == http::Method::GET {
            return Some(Self::Policies);
        }
        if let Some(handshake) = handshake::Route::classify(method, path) {
            return Some(Self::Handshake(handshake));
        }
        if let Some(asset) = ui::Asset::classify(method, path) {
            return Some(Self::Ui(asset));
        }
        claw_r1::Route::classify(method, path, query).map(Self::ClawR1)
    }

    /// The route as the data plane's layers see it: a model call under Claw-R1's base URL is
    /// an API call; the rest are the control plane's, each with the port it is served on.
    pub fn for_data_plane(&self) -> crate::data_plane::route::Route {
        use crate::data_plane::route::{Control, Route as Data};
        use crate::data_plane::server::Port;
        let (label, home) = match self {
            Self::ClawR1(claw_r1::Route::Api {
                uid,
                prompt,
                endpoint,
                upstream_path,
            }) => {
                return Data::ClawR1Api {
                    uid: uid.clone(),
                    prompt: prompt.clone(),
                    endpoint: *endpoint,
                    upstream_path: upstream_path.clone(),
                }
            }
            Self::Policies => ("admin_policies", Port::Admin),
            Self::Handshake(_) => ("handshake", Port::Admin),
            Self::Ui(_) => ("ui", Port::Admin),
            Self::ClawR1(_) => ("claw_r1", Port::Agent),
        };
        Data::Control(Control { label, home })
    }
}
