//! Panics (a trap in Wasm): the host must record why and keep serving.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

struct Trap;

impl Filter for Trap {
    const DESCRIPTION: &'static str = "panics on every step";

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        panic!("trap plugin refuses step {}", step.index);
    }
}

export_filter!(Trap);
