//! clawback's filter host: Wasm plugins that score recorded steps with an evaluative reward
//! and/or a directive hint, from what followed them (tool results, the user's reply).
//!
//! The contract is the WIT world in `filters/wit/filter.wit`; plugins are components built for
//! `wasm32-wasip2` with `wasm-plugins/sdk`. The parts, in the order a step meets them:
//! - [`dispatch`] — [`Filters`], what the recorder calls: keeps each live trajectory's last
//!   step, queues a job when its next state arrives, runs every plugin on it concurrently;
//! - [`view`] — the typed, size-capped views a plugin is given;
//! - [`registry`] — the plugins of a directory, hot-reloaded, each with a [`breaker`];
//! - [`call`] — one call in a fresh [`sandbox`] store, every failure turned into a reason;
//! - [`host`] and [`judge`] — what a plugin may ask of the host.

pub mod bindings;
pub mod breaker;
pub mod call;
pub mod config;
pub mod dispatch;
pub mod fair;
pub mod host;
pub mod judge;
pub mod metrics;
pub mod plugin;
pub mod registry;
pub mod sandbox;
pub mod standalone;
pub mod view;

pub use config::{FiltersConfig, JudgeConfig, PluginConfig};
pub use dispatch::{Deliver, Filters, FiltersError};
pub use metrics::Metrics;
pub use plugin::{LoadError, Plugin};
