//! The data plane: the request path every agent call takes, and its recording. Nothing here
//! imports the control plane or the composition root ([`crate::app`], [`crate::config`]).

pub mod agent_json;
pub mod anthropic;
pub mod body;
pub mod bounds;
pub mod capture;
pub mod connections;
pub mod engine_fields;
pub mod error;
pub mod filters;
pub mod forward;
pub mod layers;
pub mod metrics;
pub mod policy;
pub mod recorder;
pub mod relay;
pub mod route;
pub mod server;
pub mod session;
pub mod share;
pub mod store;
pub mod tenant;
pub mod upstream;
