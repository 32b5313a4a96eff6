//! The one wasmtime `Engine` of the process, and the ticker that drives epoch deadlines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the granularity of wall-clock deadlines and of yielding
/// a busy guest back to the scheduler.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Sizes the engine for the configured providers.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Instances alive at once across all providers (sum of their concurrency, plus load).
    pub max_instances: u32,
    /// The largest per-instance memory cap of any provider.
    pub max_memory_bytes: u64,
    /// Try the pooling allocator; fall back to on-demand when it cannot reserve memory.
    pub pooling: bool,
}

/// A wasip2 component made by Rust holds several core instances (the program, its libc
/// and adapters); these bounds leave room without reserving much.
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 8;

fn base_config() -> Config {
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        // Deep recursion traps here instead of exhausting the host thread's stack.
        .max_wasm_stack(1 << 20);
    cfg
}

/// Builds the engine, preferring the pooling allocator (instances come from pre-reserved
/// slots, so a fresh Store per call costs tens of microseconds); returns whether pooling
/// is in use. Where the address space cannot be reserved (a tight `ulimit -v`, some
/// sandboxes), it falls back to on-demand allocation and says so.
pub fn build(opts: &EngineOptions) -> wasmtime::Result<(Engine, bool)> {
    if opts.pooling {
        let n = opts.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n * CORE_INSTANCES_PER_COMPONENT)
            .total_memories(n * MEMORIES_PER_COMPONENT)
            .total_tables(n * TABLES_PER_COMPONENT)
            .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MEMORIES_PER_COMPONENT)
            .max_tables_per_component(TABLES_PER_COMPONENT)
            .max_memory_size(opts.max_memory_bytes as usize)
            .total_stacks(n);
        let mut cfg = base_config();
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Engine::new(&cfg) {
            Ok(engine) => return Ok((engine, true)),
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable, using on-demand instance allocation")
            }
        }
    }
    Ok((Engine::new(&base_config())?, false))
}

/// Advances the engine's epoch every [`EPOCH_TICK`] on a plain thread (not a tokio task,
/// so a runtime whose workers are all busy running guests still gets its deadlines).
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    pub fn start(engine: &Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawn epoch ticker thread");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
