//! Calls `judge` 10,000 times, ignoring refusals: the host must hold it to its budget.

use clawback_filter_sdk::{export_filter, judge, Evaluation, Filter, NextState, Step};

struct JudgeFlood;

impl Filter for JudgeFlood {
    const DESCRIPTION: &'static str = "asks the judge 10,000 times";

    fn evaluate_step(_step: Step, _next: NextState) -> Evaluation {
        let mut answers = 0usize;
        for _ in 0..10_000 {
            if let Ok(got) = judge("Is this step good? Answer \\boxed{1} or \\boxed{-1}.", 1) {
                answers += got.len();
            }
        }
        Evaluation::reward(1.0).label("answers", answers)
    }
}

export_filter!(JudgeFlood);
