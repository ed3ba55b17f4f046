//! The sandbox every plugin call runs in: one [`Engine`] (pooling allocator, epoch
//! interruption, async calls), a ticker thread that advances the epoch, and a fresh [`Store`]
//! per call with a memory limit, an execution deadline and a WASI context that grants nothing
//! (no files, no sockets, frozen clocks, no environment).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
    Store, UpdateDeadline,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::host::CallHost;

/// What a call may write to stderr (a panic message) and the host keeps for the reason.
const STDERR_CAP: usize = 4096;

/// How often the epoch advances: the granularity of the execution deadline.
const TICK: Duration = Duration::from_millis(2);

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
    Deadline(Duration),
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
    started: Instant,
    deadline: Duration,
    pub stopped: Option<Stopped>,
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

/// The shared engine and its epoch ticker.
pub struct Sandbox {
    engine: Engine,
    memory_limit: usize,
    deadline: Duration,
    ticking: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot set up the Wasm engine: {0}")]
pub struct SandboxError(String);

impl Sandbox {
    /// An engine for up to `max_concurrency` calls at once, each limited to `memory_limit` bytes
    /// of linear memory and `deadline` of execution.
    pub fn new(
        max_concurrency: usize,
        memory_limit: usize,
        deadline: Duration,
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
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| SandboxError(format!("{e:#}")))?;
        let ticking = Arc::new(AtomicBool::new(true));
        let ticker = {
            let engine = engine.clone();
            let ticking = Arc::clone(&ticking);
            std::thread::Builder::new()
                .name("clawback-filter-epoch".to_owned())
                .spawn(move || {
                    while ticking.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| SandboxError(format!("cannot start the epoch ticker: {e}")))?
        };
        Ok(Self {
            engine,
            memory_limit,
            deadline,
            ticking,
            ticker: Some(ticker),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A fresh store for one call.
    pub fn store(&self, host: CallHost) -> Store<CallState> {
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
            started: Instant::now(),
            deadline: self.deadline,
            stopped: None,
            stderr,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut store| {
            let state = store.data_mut();
            // Time spent waiting on the judge is not the plugin's execution.
            let running = state
                .started
                .elapsed()
                .saturating_sub(state.host.judge_wait());
            if running > state.deadline {
                state.stopped = Some(Stopped::Deadline(state.deadline));
                return Ok(UpdateDeadline::Interrupt);
            }
            // Let the runtime's other calls in between.
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.ticking.store(false, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

impl CallState {
    /// Why the host stopped the call, if it did.
    pub fn stop_reason(&self) -> Option<Stopped> {
        if self.limits.hit_memory_limit {
            return Some(Stopped::OutOfMemory(self.limits.memory));
        }
        self.stopped.clone()
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
