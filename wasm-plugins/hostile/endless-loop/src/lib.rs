//! Never returns: the host must stop it at its deadline.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

struct EndlessLoop;

impl Filter for EndlessLoop {
    const DESCRIPTION: &'static str = "loops forever";

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let mut spins = u64::from(step.index);
        loop {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
    }
}

export_filter!(EndlessLoop);
