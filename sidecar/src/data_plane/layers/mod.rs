//! The tower layers a request passes through, one concern each. Their order is written down
//! once, in [`crate::app::build`].

pub mod agent_api;
pub mod dialect;
pub mod load_shed;
pub mod observe;
pub mod request_id;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use http::Response;

use crate::data_plane::body::ProxyBody;

/// Every layer's future: the stack never fails at the service level, errors are responses.
pub type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;
