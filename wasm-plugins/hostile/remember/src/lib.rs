//! Tries to carry data from one call to the next — a global counter, the previous caller's
//! secret, a dirtied heap — and reports what it finds: the host must give every call a fresh
//! instance, however it recycles the memory behind it.

use std::sync::Mutex;

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

/// Everything the plugin saw before this call, if anything survived.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// A heap buffer kept across calls: 4 MiB written with the last secret's first byte.
static SCRIBBLE: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Remember;

impl Filter for Remember {
    const DESCRIPTION: &'static str = "reports whatever an earlier call left behind";

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let secret = step.metadata("secret").unwrap_or_default().to_owned();
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let mut scribble = SCRIBBLE.lock().unwrap_or_else(|p| p.into_inner());
        let earlier = seen.join(",");
        let dirty = scribble.iter().filter(|&&b| b != 0).count();
        seen.push(secret.clone());
        scribble.resize(4 << 20, 0);
        scribble.fill(secret.bytes().next().unwrap_or(1));
        Evaluation::reward(0.0)
            .label("calls", seen.len())
            .label("earlier", earlier)
            .label("dirty_bytes", dirty)
    }
}

export_filter!(Remember);
