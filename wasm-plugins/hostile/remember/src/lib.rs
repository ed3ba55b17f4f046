//! Tries to carry data from one call to the next — a global counter, the previous caller's
//! secret, memory it wrote — and reports what it finds: the host must give every call a fresh
//! instance, however it recycles the memory behind it.

use std::sync::Mutex;

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

/// Everything the plugin saw before this call, if anything survived.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Remember;

impl Filter for Remember {
    const DESCRIPTION: &'static str = "reports whatever an earlier call left behind";

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let secret = step.metadata("secret").unwrap_or_default().to_owned();
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let earlier = seen.join(",");
        seen.push(secret.clone());
        let dirty = scribble(secret.bytes().next().unwrap_or(1));
        Evaluation::reward(0.0)
            .label("calls", seen.len())
            .label("earlier", earlier)
            .label("dirty_bytes", dirty)
    }
}

/// Grows linear memory by 4 MiB past everything the allocator holds, counts the bytes
/// there that are not zero (the Wasm spec says grown memory is zeroed: a memory slot reused
/// without being reset would show the last call's `marker`), then fills it with `marker`.
#[cfg(target_arch = "wasm32")]
fn scribble(marker: u8) -> usize {
    const PAGE: usize = 65536;
    const PAGES: usize = 64;
    let start = core::arch::wasm32::memory_grow(0, PAGES);
    if start == usize::MAX {
        return usize::MAX;
    }
    // SAFETY: the pages were just added to linear memory and nothing else knows of them.
    let fresh = unsafe { std::slice::from_raw_parts_mut((start * PAGE) as *mut u8, PAGES * PAGE) };
    let dirty = fresh.iter().filter(|&&b| b != 0).count();
    fresh.fill(marker);
    dirty
}

/// On the host target (the workspace's `cargo test`) there is no linear memory to grow.
#[cfg(not(target_arch = "wasm32"))]
fn scribble(_marker: u8) -> usize {
    0
}

export_filter!(Remember);
