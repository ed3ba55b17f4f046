//! `GET /admin/policies` (admin token): every tenant's live policy and the calls in flight per
//! adapter — what the trainer's publisher waits on before it unloads a replaced adapter.
//!
//! ```json
//! {"policies": [{"schema_version": 1, "tenant": "acme", "adapter": "acme@v3", "version": 3,
//!                "live_since": 1764400000000}],
//!  "in_flight": {"acme@v2": 1, "acme@v3": 4}}
//! ```
//!
//! An adapter missing from `in_flight` has no call in flight on this sidecar.

use http::{header, request, HeaderValue, Response, StatusCode};

use crate::control_plane::Handles;
use crate::data_plane::body::ProxyBody;
use crate::data_plane::error::{error_response, ProxyError};

pub const PATH: &str = "/admin/policies";

pub fn handle(control: &Handles, parts: &request::Parts) -> Response<ProxyBody> {
    // The publisher's view across tenants: the global token only.
    match control.admin.authorize(parts) {
        Ok(crate::control_plane::handshake::auth::Scope::All) => {}
        Ok(crate::control_plane::handshake::auth::Scope::Tenant(own)) => {
            return crate::control_plane::handshake::HandshakeError::OutOfScope(own).into_response()
        }
        Err(e) => return e.into_response(),
    }
    let Some(policies) = &control.policies else {
        return error_response(
            StatusCode::NOT_FOUND,
            "policy routing is off: set routing.base_model to enable it",
            "invalid_request_error",
            "routing_disabled",
        );
    };
    let body = match serde_json::to_string(&policies.snapshot()) {
        Ok(body) => body,
        Err(e) => {
            return ProxyError::Internal(format!("cannot encode the policy table: {e}"))
                .into_response()
        }
    };
    let mut response = Response::new(ProxyBody::full(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
