//! clawback's sidecar: an OpenAI-compatible proxy that sits next to an agent, forwards every
//! call to the inference backend and streams the answer straight back.
//!
//! Two planes, one way:
//! - [`data_plane`]: what every agent call goes through — the listener, the layers, reading and
//!   routing the body, forwarding and relaying, capturing the engine's tokens, joining the call
//!   to its trajectory and recording it. It imports nothing of the control plane nor of the
//!   composition root.
//! - [`control_plane`]: what operators and rollout code call — the handshake/admin API and its
//!   viewer, the policy listing, the export, Claw-R1's trajectory routes. It reads the data
//!   plane through narrow handles ([`control_plane::Handles`]: the recorder, the tenants, the
//!   policy router), never through the whole [`app::App`].
//!
//! The composition root puts them together: [`config`] (the file's schema, each section owned
//! by the part that reads it), [`app`] (the request path assembled, written down once) and
//! [`cli`]. `tests/planes.rs` holds the rule.

pub mod app;
pub mod cli;
pub mod config;
pub mod control_plane;
pub mod data_plane;
pub mod telemetry;
