//! The sandbox every plugin call runs in: one [`Engine`] (pooling allocator, fuel, async calls)
//! and a fresh [`Store`] per call with a memory limit, a budget of work (fuel) and a WASI
//! context that grants nothing (no files, no sockets, frozen clocks, no environment).
//!
//! A call's budget is work done, not time: wasmtime's fuel, about one unit per Wasm instruction.
//! A wall-clock deadline stopped calls a quiet host finishes whenever the cores were busy (a
//! reward lost to the host's load, not the plugin's); fuel stops the same call at the same
//! instruction on any host.

use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
    Store,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::host::CallHost;

/// What a call may write to stderr (a panic message) and the host keeps for the reason.
const STDERR_CAP: usize = 4096;

/// Fuel between a call's yields to the runtime's other calls (about a millisecond of work).
const YIELD_EVERY: u64 = 1_000_000;

/// The pages of a memory slot a call wrote that stay mapped for the next call, reset by copying
/// instead of being handed back to the kernel. Handing them back (`madvise`, a TLB shootdown)
/// and faulting them in again on the next call was a third of a call's time. Only written
/// pages count, found with Linux's `PAGEMAP_SCAN` (6.7+); without it every call would pay a
/// `memset` of the whole amount, so the kernel path stays.
const MEMORY_KEEP_RESIDENT: usize = 8 << 20;
const TABLE_KEEP_RESIDENT: usize = 1 << 20;

/// Why the host stopped a call on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The call's fuel (this much) ran out.
    OutOfFuel(u64),
    OutOfMemory(usize),
}

/// Caps the instance's memories and tables; remembers when a memory hit the limit, so the
/// abort that follows reads as "out of memory" instead of a bare trap.
pub struct Limits {
    memory: usize,
    pub hit_memory_limit: bool,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            self.hit_memory_limit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// What a call's store holds.
pub struct CallState {
    pub host: CallHost,
    pub limits: Limits,
    wasi: WasiCtx,
    table: ResourceTable,
    fuel: u64,
    stderr: MemoryOutputPipe,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A clock that always reads the same time: plugins get no clock from the host.
struct Frozen;

impl HostWallClock for Frozen {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for Frozen {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Whether calls keep their written pages between calls ([`MEMORY_KEEP_RESIDENT`]): the
/// kernel has `PAGEMAP_SCAN`.
pub fn keeps_written_pages() -> bool {
    PoolingAllocationConfig::is_pagemap_scan_available()
}

/// The shared engine.
pub struct Sandbox {
    engine: Engine,
    memory_limit: usize,
    fuel: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot set up the Wasm engine: {0}")]
pub struct SandboxError(String);

impl Sandbox {
    /// An engine for up to `max_concurrency` calls at once, each limited to `memory_limit` bytes
    /// of linear memory and `fuel` units of work.
    pub fn new(
        max_concurrency: usize,
        memory_limit: usize,
        fuel: u64,
    ) -> Result<Self, SandboxError> {
        // Two more than the calls at once: loading a plugin instantiates it once (`describe`),
        // also while calls run.
        let slots = u32::try_from(max_concurrency.max(1) + 2).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::default();
        // A Rust wasip2 component instantiates a handful of core modules (its own, the
        // adapters' shims); memories and tables likewise.
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(16))
            .total_memories(slots.saturating_mul(4))
            .total_tables(slots.saturating_mul(16))
            .total_stacks(slots)
            .max_memory_size(memory_limit);
        if keeps_written_pages() {
            pool.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT.min(memory_limit))
                .table_keep_resident(TABLE_KEEP_RESIDENT);
        } else {
            tracing::info!(
                "this kernel has no PAGEMAP_SCAN (Linux 6.7+): plugin memory is handed back \
                 to the kernel after each call, which makes calls slower"
            );
        }
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| SandboxError(format!("{e:#}")))?;
        Ok(Self {
            engine,
            memory_limit,
            fuel,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The fuel each call starts with.
    pub fn fuel(&self) -> u64 {
        self.fuel
    }

    /// A fresh store for one call.
    pub fn store(&self, host: CallHost) -> Result<Store<CallState>, SandboxError> {
        let stderr = MemoryOutputPipe::new(STDERR_CAP);
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(Frozen)
            .monotonic_clock(Frozen)
            .build();
        let state = CallState {
            host,
            limits: Limits {
                memory: self.memory_limit,
                hit_memory_limit: false,
            },
            wasi,
            table: ResourceTable::new(),
            fuel: self.fuel,
            stderr,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        let fuelled = store
            .set_fuel(self.fuel)
            // Let the runtime's other calls in between.
            .and_then(|()| store.fuel_async_yield_interval(Some(YIELD_EVERY)));
        fuelled.map_err(|e| SandboxError(format!("cannot fuel a call's store: {e:#}")))?;
        Ok(store)
    }
}

impl CallState {
    /// Why the host stopped the call that failed with `error`, if it did.
    pub fn stop_reason(&self, error: &wasmtime::Error) -> Option<Stopped> {
        if self.limits.hit_memory_limit {
            return Some(Stopped::OutOfMemory(self.limits.memory));
        }
        (error.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel))
            .then_some(Stopped::OutOfFuel(self.fuel))
    }

    /// What the plugin wrote to stderr on one line (a Rust panic message lands here), without
    /// the backtrace note.
    pub fn stderr_text(&self) -> Option<String> {
        let contents = self.stderr.contents();
        let text = String::from_utf8_lossy(&contents);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with("note: run with"))
            .collect();
        (!lines.is_empty()).then(|| lines.join(" "))
    }
}
