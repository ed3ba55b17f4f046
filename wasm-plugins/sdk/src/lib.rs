//! The guest side of clawback's filter world (`filters/wit/filter.wit`): a plugin is one small
//! Rust file that implements [`Filter`] and calls [`export_filter!`].
//!
//! ```ignore
//! use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};
//!
//! struct Polite;
//!
//! impl Filter for Polite {
//!     const DESCRIPTION: &'static str = "rewards steps the user thanks for";
//!     fn evaluate_step(_step: Step, next: NextState) -> Evaluation {
//!         match next.user_message {
//!             Some(text) if text.contains("thank") => Evaluation::reward(1.0),
//!             _ => Evaluation::none(),
//!         }
//!     }
//! }
//!
//! export_filter!(Polite);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2`; the host loads the `.wasm` file.
//! Everything here also compiles for the host target, so a plugin's logic is tested with a plain
//! `cargo test` (the host functions — [`log`], [`config`], [`judge`] — only work inside the host).

// The generated bindings name this crate by its public path, inside it too.
extern crate self as clawback_filter_sdk;

pub mod reaction;
pub mod text;
pub mod transcript;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../filters/wit",
        world: "filter",
        pub_export_macro: true,
        export_macro_name: "__export_filter_world",
        default_bindings_module: "::clawback_filter_sdk::bindings",
        runtime_path: "::clawback_filter_sdk::__private::wit_bindgen::rt",
    });
}

#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;
}

pub use bindings::clawback::filter::host::LogLevel;
pub use bindings::clawback::filter::types::{
    Evaluation, Message, MetadataEntry, NextState, PluginInfo, Step, ToolCall, ToolResult,
    Trajectory, Turn,
};

/// A filter plugin. Every function is called with a fresh instance: keep no state between calls.
pub trait Filter {
    /// One line saying what the plugin scores (`clawback-sidecar plugin check` prints it).
    const DESCRIPTION: &'static str;
    /// Whether [`Filter::evaluate_trajectory`] is implemented; the host only keeps finished
    /// trajectories for plugins that say so.
    const EVALUATES_TRAJECTORIES: bool = false;

    /// Scores a step once its next state (tool results, the user's reply) is known.
    fn evaluate_step(step: Step, next: NextState) -> Evaluation;

    /// Scores a finished trajectory (an outcome reward).
    fn evaluate_trajectory(trajectory: Trajectory) -> Evaluation {
        let _ = trajectory;
        Evaluation::none()
    }
}

/// Exports a [`Filter`] as the plugin's component: `export_filter!(MyFilter);`
#[macro_export]
macro_rules! export_filter {
    ($filter:ty) => {
        struct __ClawbackFilterExport;

        impl $crate::bindings::Guest for __ClawbackFilterExport {
            fn describe() -> $crate::PluginInfo {
                $crate::PluginInfo {
                    description: <$filter as $crate::Filter>::DESCRIPTION.to_string(),
                    evaluates_trajectories: <$filter as $crate::Filter>::EVALUATES_TRAJECTORIES,
                }
            }

            fn evaluate_step(step: $crate::Step, next: $crate::NextState) -> $crate::Evaluation {
                <$filter as $crate::Filter>::evaluate_step(step, next)
            }

            fn evaluate_trajectory(trajectory: $crate::Trajectory) -> $crate::Evaluation {
                <$filter as $crate::Filter>::evaluate_trajectory(trajectory)
            }
        }

        $crate::bindings::__export_filter_world!(__ClawbackFilterExport);
    };
}

impl Evaluation {
    /// No opinion: the host stores nothing.
    pub fn none() -> Self {
        Evaluation {
            reward: None,
            hint: None,
            labels: Vec::new(),
        }
    }

    /// An evaluative reward, clamped to [-1, 1].
    pub fn reward(reward: f64) -> Self {
        Evaluation {
            reward: Some(reward.clamp(-1.0, 1.0)),
            ..Evaluation::none()
        }
    }

    /// A directive hint without a reward.
    pub fn hint(hint: impl Into<String>) -> Self {
        Evaluation {
            hint: Some(hint.into()),
            ..Evaluation::none()
        }
    }

    /// The same evaluation with a label added.
    pub fn label(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.labels.push((key.into(), value.to_string()));
        self
    }

    /// Whether this says anything (a reward or a hint).
    pub fn is_opinion(&self) -> bool {
        self.reward.is_some() || self.hint.is_some()
    }
}

impl Step {
    /// The trajectory's metadata value for `key` (JSON strings without their quotes).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        metadata(&self.metadata, key)
    }

    /// The last `user` message of the conversation the model was given.
    pub fn last_user_message(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map(|m| m.content.as_str())
    }
}

impl Trajectory {
    /// The trajectory's metadata value for `key` (JSON strings without their quotes).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        metadata(&self.metadata, key)
    }
}

fn metadata<'a>(entries: &'a [MetadataEntry], key: &str) -> Option<&'a str> {
    entries
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.value.as_str())
}

/// A line in the sidecar's log, tagged with the plugin's name.
pub fn log(level: LogLevel, message: &str) {
    bindings::clawback::filter::host::log(level, message);
}

/// The plugin's configuration value for `key`, parsed; `None` when unset or unparsable.
pub fn config<T: std::str::FromStr>(key: &str) -> Option<T> {
    bindings::clawback::filter::host::config(key)?.parse().ok()
}

/// Asks the configured judge model `n` times concurrently; see the WIT for the rules.
pub fn judge(prompt: &str, n: u32) -> Result<Vec<String>, String> {
    bindings::clawback::filter::host::judge(prompt, n)
}
