//! clawback's sidecar: an OpenAI-compatible proxy that sits next to an agent, forwards every
//! call to the inference backend and streams the answer straight back.
//!
//! The request path is written down once, in [`app`].

pub mod app;
pub mod body;
pub mod cli;
pub mod config;
pub mod error;
pub mod forward;
pub mod layers;
pub mod metrics;
pub mod relay;
pub mod route;
pub mod server;
pub mod session;
pub mod telemetry;
pub mod upstream;
