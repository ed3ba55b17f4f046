//! Allocates until memory runs out: the host must stop it at its memory limit.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

struct MemoryBomb;

impl Filter for MemoryBomb {
    const DESCRIPTION: &'static str = "allocates without bound";

    fn evaluate_step(_step: Step, _next: NextState) -> Evaluation {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![0xAB; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

export_filter!(MemoryBomb);
