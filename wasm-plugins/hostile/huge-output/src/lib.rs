//! Answers with a hint of 8 MiB: the host must refuse it instead of storing it.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

struct HugeOutput;

impl Filter for HugeOutput {
    const DESCRIPTION: &'static str = "returns an 8 MiB hint";

    fn evaluate_step(_step: Step, _next: NextState) -> Evaluation {
        Evaluation::hint("x".repeat(8 << 20)).label("size", "8MiB")
    }
}

export_filter!(HugeOutput);
