//! clawback's sidecar: an OpenAI-compatible proxy that sits next to an agent, forwards every
//! call to the inference backend and streams the answer straight back.
//!
//! The request path is written down once, in [`app`].

pub mod agent_json;
pub mod anthropic;
pub mod app;
pub mod body;
pub mod capture;
pub mod claw_r1;
pub mod cli;
pub mod config;
pub mod error;
pub mod export;
pub mod filters;
pub mod forward;
pub mod handshake;
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
pub mod telemetry;
pub mod tenant;
pub mod ui;
pub mod upstream;
