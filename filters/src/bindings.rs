//! Host-side bindings of the filter world (`filters/wit/filter.wit`).
//!
//! Exports are called asynchronously (so a call yields as it burns fuel and a timeout can cancel
//! a call waiting on the judge); `judge` is the one async import, and it may trap: calling it
//! again after its budget was refused stops the plugin.

wasmtime::component::bindgen!({
    path: "wit",
    world: "filter",
    imports: {
        "clawback:filter/host.judge": async | trappable,
    },
    exports: { default: async },
});

// The world's `use` already brings `Step`, `NextState`, `Trajectory`, `Evaluation` and
// `PluginInfo` here.
pub use clawback::filter::types::{LogLevel, Message, MetadataEntry, ToolCall, ToolResult, Turn};

/// The world a plugin must be built against, as the refusal message names it.
pub const WORLD: &str = "clawback:filter/filter@0.1.0";
