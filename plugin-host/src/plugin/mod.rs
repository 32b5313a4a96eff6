//! The plugin runtime: loads provider components and runs each call in a fresh sandbox.
//!
//! One [`Runtime`] per process holds the wasmtime engine, the linker (which decides what a
//! plugin can import at all) and the compile cache. Each plugin file becomes a
//! [`LoadedPlugin`] (compiled once, pre-linked); each configured provider becomes a
//! [`WasmProvider`] that runs every call in a new Store with its own limits, `/tmp`, HTTP
//! policy and redaction. A trap or limit in one call ends that call only.

pub mod abi;
mod adapter;
mod artifact_cache;
pub mod clock;
pub mod compiler;
mod engine;
mod fs;
mod guest;
mod h2;
pub mod headroom;
mod host_services;
mod http;
mod interfaces;
pub mod limits;
mod load;
mod metrics;
mod output;
mod pool;
mod precheck;
mod quotes;
mod reply;
mod sandbox;
mod scratch;
mod slots;

pub use artifact_cache::CacheOutcome;
pub use engine::EngineOptions;
/// TLS client configuration (system roots, a CA file, or insecure), also used by health probes.
pub use http::tls_config;
pub use load::{LoadError, LoadReport, LoadedPlugin, ProviderLoadError};
pub use metrics::{PluginMetrics, TrapKind};
pub use reply::MAX_LIFT_BYTES;
/// The calls a request budget keeps busy; what a provider borrows slots up to.
pub use slots::budget_slots;

use crate::config::{Limits, ProviderEntry, ProvidersFile};
use crate::provider::{Class, Op, Priority, ProviderError};
use crate::rate;
pub use abi::WorldVersion;
pub(crate) use guest::{GuestCall, GuestReply};
use limits::{LimitHit, Tripwire};
use sandbox::{CallState, MemoryLimiter, ProviderShared};
use slots::Slots;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// Where the runtime keeps its files and how big it may get.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub engine: EngineOptions,
    /// Compiled-plugin cache; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Parent of the per-call `/tmp` directories (the pod's `/tmp` emptyDir).
    pub scratch_dir: PathBuf,
    /// Largest plugin file loaded; a larger one is refused before it is read.
    pub max_plugin_bytes: u64,
    /// Whether a provider entry without `budget` gets the default its plugin declares
    /// ([`rate::cap_default`]). On, except where a plugin is driven against an
    /// emulator far faster than any real backend allows (the conformance suite, tests).
    pub default_budgets: bool,
    /// An executable (this one, `/proc/self/exe`) whose hidden `compile-plugin` subcommand
    /// compiles plugins in a child process, so that cranelift's memory and code never
    /// stay in this one (see `compiler.rs`); `None` compiles in this process.
    pub compile_in: Option<PathBuf>,
    /// What that child may use (CPU time, memory, wall time); not applied in process.
    pub compile_limits: compiler::CompileLimits,
    /// What all providers' sensitive values (Proxies' cloud-init and credentials) may cost
    /// the redactor together (see [`sensitive`]).
    pub redaction_memory_bytes: usize,
}

/// Default of [`RuntimeOptions::max_plugin_bytes`]: the shipped plugins are 200-340 KiB and
/// a ConfigMap holds at most 1 MiB, but a plugin may come from a volume.
pub const DEFAULT_MAX_PLUGIN_BYTES: u64 = 8 << 20;

/// Instance slots the pool gets beyond what the providers file at start needs, so that a
/// reload may add providers or raise `limits.concurrency`: a slot costs address space, not
/// memory, until a call uses it.
pub const POOL_HEADROOM_INSTANCES: u32 = 32;

/// Instance slots a providers file needs: one per concurrent call of every provider, plus
/// the load slots and a few for a reload's generations overlapping.
pub fn pool_instances_needed(file: &ProvidersFile) -> u32 {
    file.providers
        .iter()
        .map(|p| p.limits.concurrency)
        .fold(0u32, u32::saturating_add)
        .saturating_add(4)
}

/// Why a providers file cannot run on a pool sized at start (`instances` slots, memories of
/// at most `max_memory_bytes`), naming what it needs; the pool is sized once, so a reload
/// that needs more is refused and the running providers keep serving.
pub fn pool_problem(file: &ProvidersFile, instances: u32, max_memory_bytes: u64) -> Option<String> {
    let need = pool_instances_needed(file);
    if need > instances {
        return Some(format!(
            "the providers need {need} wasm instance slots (the sum of limits.concurrency, plus 4) but the pool made when the operator started has {instances}; restart the operator to apply this file"
        ));
    }
    if let Some(p) = file
        .providers
        .iter()
        .find(|p| u64::from(p.limits.memory_mib) << 20 > max_memory_bytes)
    {
        return Some(format!(
            "provider {:?}: limits.memoryMib {} is more than the {} MiB per memory of the pool made when the operator started; restart the operator to apply this file",
            p.name,
            p.limits.memory_mib,
            max_memory_bytes >> 20
        ));
    }
    None
}

impl RuntimeOptions {
    /// Sized for a providers file: one pool slot per concurrent call of every provider,
    /// plus a few for loading, plus [`POOL_HEADROOM_INSTANCES`] for reloads.
    pub fn for_providers(
        file: &ProvidersFile,
        cache_dir: Option<PathBuf>,
        scratch_dir: PathBuf,
    ) -> Self {
        let max_instances = pool_instances_needed(file).saturating_add(POOL_HEADROOM_INSTANCES);
        let max_memory_mib = file
            .providers
            .iter()
            .map(|p| p.limits.memory_mib)
            .max()
            .unwrap_or(Limits::default().memory_mib)
            .max(Limits::default().memory_mib);
        RuntimeOptions {
            engine: EngineOptions {
                max_instances,
                max_memory_bytes: u64::from(max_memory_mib) << 20,
                pooling: true,
            },
            cache_dir,
            scratch_dir,
            max_plugin_bytes: DEFAULT_MAX_PLUGIN_BYTES,
            default_budgets: true,
            compile_in: None,
            compile_limits: compiler::CompileLimits::default(),
            redaction_memory_bytes: crate::sensitive::DEFAULT_LIMIT_BYTES,
        }
    }
}

/// What sizes a provider's call slots; a change makes new ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotsKey {
    own: u32,
    most: u32,
    cost: headroom::Cost,
}

impl SlotsKey {
    fn of(limits: &Limits) -> Self {
        SlotsKey {
            own: limits.concurrency,
            most: limits.most_calls(),
            cost: headroom::Cost {
                memory: limits.memory_bytes_per_call(),
                scratch: limits.tmp_bytes_per_call(),
                descriptors: crate::config::descriptors::descriptors_per_call(limits),
            },
        }
    }
}

/// The process-wide plugin runtime.
pub struct Runtime {
    engine: Engine,
    linker: Linker<CallState>,
    cache: artifact_cache::ArtifactCache,
    compiler: compiler::Compiler,
    pooling: bool,
    max_instances: u32,
    max_memory_bytes: u64,
    scratch_dir: PathBuf,
    max_plugin_bytes: u64,
    default_budgets: bool,
    metrics: std::sync::OnceLock<PluginMetrics>,
    /// What is sensitive for each provider name; outlives reloads of the provider.
    sensitive: crate::sensitive::SensitiveByProvider,
    /// Each provider name's call slots, kept across reloads so that calls still running on
    /// the previous generation of a provider count against the same `limits.concurrency`
    /// (what the pod's memory fit assumes). A change of what sizes them ([`SlotsKey`])
    /// gets new slots.
    permits: Mutex<std::collections::BTreeMap<String, (SlotsKey, Arc<Slots>)>>,
    /// What the pod's fit leaves over, lent to providers for calls beyond their own slots.
    headroom: Arc<headroom::Headroom>,
    /// The slot every load-time call (`info`, `validate-config`) runs on, whichever provider
    /// it is for: never a provider's own call slots, which calls waiting on a slow backend
    /// may hold for their whole `limits.timeout` (a reload would wait behind them, at
    /// background priority, for as long as they keep coming). As many as the pod's fit
    /// reserves for load-time calls ([`crate::config::fit::LOAD_SLOTS`]); each call holds
    /// one for at most [`LOAD_CALL_TIMEOUT`], so a wait for one is bounded too.
    load_slots: Arc<Slots>,
    /// Each provider name's request budget, kept across reloads like `permits`: a reload
    /// neither refills the bucket nor forgets what the backend said. A new spec gets a new
    /// bucket.
    budgets: Mutex<std::collections::BTreeMap<String, Arc<rate::Budget>>>,
    /// Cancelled at the end of the shutdown grace period: calls in flight stop, new ones
    /// are refused.
    calls_cancelled: tokio_util::sync::CancellationToken,
    _ticker: engine::EpochTicker,
}

impl Runtime {
    pub fn new(opts: RuntimeOptions) -> anyhow::Result<Arc<Self>> {
        let (engine, pooling) =
            engine::build(&opts.engine).map_err(|e| anyhow::anyhow!("wasm engine: {e:#}"))?;
        let cache = artifact_cache::ArtifactCache::open(&engine, opts.cache_dir.as_deref())?;
        std::fs::create_dir_all(&opts.scratch_dir).map_err(|e| {
            anyhow::anyhow!("scratch directory {}: {e}", opts.scratch_dir.display())
        })?;
        let linker = linker(&engine).map_err(|e| anyhow::anyhow!("plugin linker: {e:#}"))?;
        let ticker = engine::EpochTicker::start(&engine);
        let compiler = match opts.compile_in {
            Some(exe) => {
                compiler::Compiler::child(exe, opts.engine.clone(), pooling, opts.compile_limits)
            }
            None => compiler::Compiler::InProcess,
        };
        Ok(Arc::new(Runtime {
            engine,
            linker,
            cache,
            compiler,
            pooling,
            max_instances: opts.engine.max_instances,
            max_memory_bytes: opts.engine.max_memory_bytes,
            scratch_dir: opts.scratch_dir,
            max_plugin_bytes: opts.max_plugin_bytes,
            default_budgets: opts.default_budgets,
            metrics: std::sync::OnceLock::new(),
            sensitive: crate::sensitive::SensitiveByProvider::new(opts.redaction_memory_bytes),
            permits: Mutex::default(),
            headroom: Arc::default(),
            load_slots: Slots::new(crate::config::fit::LOAD_SLOTS as usize),
            budgets: Mutex::default(),
            calls_cancelled: tokio_util::sync::CancellationToken::new(),
            _ticker: ticker,
        }))
    }

    /// The call slots of provider `name` at `limits`, shared with its earlier generations
    /// while the limits that size them stay the same: its own slots, and the calls it may
    /// borrow from the pod's left-over room, each at its worst case.
    fn permits(&self, name: &str, limits: &Limits) -> Arc<Slots> {
        let key = SlotsKey::of(limits);
        let mut all = self.permits.lock().unwrap_or_else(|e| e.into_inner());
        match all.get(name) {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let s = Slots::lending(
                    limits.concurrency as usize,
                    slots::Lender {
                        headroom: self.headroom.clone(),
                        cost: key.cost,
                        most: key.most as usize,
                    },
                );
                all.insert(name.to_string(), (key, s.clone()));
                s
            }
        }
    }

    /// Sets the room providers borrow calls from, for a providers file that fits: what
    /// the fit leaves over (`left`), and the pool's instance slots that the file's own
    /// calls do not reserve. Call it at start and on every reload that applies a file.
    pub fn set_room(&self, file: &ProvidersFile, left: crate::config::fit::LeftOver) {
        let room = headroom::Room {
            memory: left.memory,
            scratch: left.scratch,
            descriptors: left.descriptors,
            instances: u64::from(
                self.max_instances
                    .saturating_sub(pool_instances_needed(file)),
            ),
        };
        let mib = |b: Option<u64>| {
            b.map_or_else(
                || "unbounded".into(),
                |m| crate::config::fit::Mib(m).to_string(),
            )
        };
        tracing::info!(
            memory = %mib(left.memory),
            tmp = %mib(left.scratch),
            descriptors = ?left.descriptors,
            instances = room.instances,
            "room left over for calls beyond the providers' own slots"
        );
        self.headroom.set_room(room);
    }

    /// The request budget of provider `name` at `spec`, shared with its earlier
    /// generations while the spec stays the same.
    fn budget(&self, name: &str, spec: rate::Spec) -> Arc<rate::Budget> {
        let mut all = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        match all.get(name) {
            Some(b) if b.spec() == spec => b.clone(),
            _ => {
                let b = Arc::new(rate::Budget::new(spec));
                all.insert(name.to_string(), b.clone());
                b
            }
        }
    }

    /// Whether instances come from the pooling allocator.
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The largest plugin file this runtime loads (`RuntimeOptions::max_plugin_bytes`).
    pub fn max_plugin_bytes(&self) -> u64 {
        self.max_plugin_bytes
    }

    /// Why `file` cannot run on this runtime's instance pool ([`pool_problem`]); `None`
    /// without pooling (instances are then allocated on demand).
    pub fn pool_problem(&self, file: &ProvidersFile) -> Option<String> {
        self.pooling
            .then(|| pool_problem(file, self.max_instances, self.max_memory_bytes))
            .flatten()
    }

    /// Feeds `metrics` from every later call of every provider of this runtime. Set once;
    /// a second call is ignored.
    pub fn set_metrics(&self, metrics: PluginMetrics) {
        let _ = self.metrics.set(metrics);
    }

    /// Ends every plugin call in flight (each fails Transient, saying the operator is
    /// shutting down) and refuses new ones. Called when the shutdown grace period is over:
    /// a reconcile waiting on a slow backend then finishes at once instead of holding the
    /// pod past its termination grace period.
    pub fn cancel_calls(&self) {
        self.calls_cancelled.cancel();
    }
}

/// The imports a plugin may have. Anything not added here (notably `wasi:sockets`) makes a
/// component fail to load with an error naming the import.
fn linker(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
    use wasmtime_wasi::cli::WasiCli;
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::filesystem::WasiFilesystem;
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::{
        WasiView, cli::WasiCliView, clocks::WasiClocksView, filesystem::WasiFilesystemView,
    };
    use wasmtime_wasi_io::bindings::wasi::io;

    struct HasIo;
    impl wasmtime::component::HasData for HasIo {
        type Data<'a> = &'a mut ResourceTable;
    }

    let mut l = Linker::<CallState>::new(engine);
    io::error::add_to_linker::<CallState, HasIo>(&mut l, |t| &mut t.table)?;
    io::poll::add_to_linker::<CallState, HasIo>(&mut l, |t| &mut t.table)?;
    io::streams::add_to_linker::<CallState, HasIo>(&mut l, |t| &mut t.table)?;
    clocks::wall_clock::add_to_linker::<_, WasiClocks>(&mut l, CallState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<_, WasiClocks>(&mut l, CallState::clocks)?;
    random::random::add_to_linker::<_, WasiRandom>(&mut l, |t| t.ctx().ctx.random())?;
    random::insecure::add_to_linker::<_, WasiRandom>(&mut l, |t| t.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<_, WasiRandom>(&mut l, |t| t.ctx().ctx.random())?;
    cli::exit::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::environment::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::stdin::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::stdout::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::stderr::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_input::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_output::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stdin::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stdout::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stderr::add_to_linker::<_, WasiCli>(&mut l, CallState::cli)?;
    filesystem::preopens::add_to_linker::<_, WasiFilesystem>(&mut l, CallState::filesystem)?;
    // Counted: the /tmp quota and the open-file cap (plugin/fs.rs).
    filesystem::types::add_to_linker::<_, fs::CountedFs>(&mut l, CallState::counted_fs)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut l)?;
    abi::add_to_linker(&mut l)?;
    Ok(l)
}

/// A configured provider backed by a plugin. Cheap to clone; calls may run concurrently up
/// to `limits.concurrency`, further calls wait for a slot.
#[derive(Clone)]
pub struct WasmProvider {
    runtime: Arc<Runtime>,
    plugin: Arc<LoadedPlugin>,
    shared: Arc<ProviderShared>,
    http: Arc<http::HttpPolicy>,
    permits: Arc<Slots>,
    /// Its calls' `/tmp` directories.
    scratch: Arc<scratch::ScratchPool>,
    /// Requests the last successful list-by-tag sent (0: none yet), for [`Pacing`].
    last_list_requests: Arc<std::sync::atomic::AtomicU32>,
    /// The same for the last list of recent instances (`created-since` set).
    last_recent_requests: Arc<std::sync::atomic::AtomicU32>,
    /// Seconds a request of its calls takes, budget waits left out (a moving average),
    /// from which its slots follow the budget ([`slots::budget_slots`]).
    per_request: Arc<Mutex<slots::Average>>,
}

/// A Proxy's cloud-init a call hands the plugin, and whose it is (the Proxy's UID).
#[derive(Debug, Clone, Copy)]
pub struct Document<'a> {
    pub owner: &'a str,
    pub cloud_init: &'a [u8],
}

/// What a finished call reports besides its reply, for metrics and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct CallStats {
    pub fuel_used: u64,
    pub duration: Duration,
    /// Backend requests the call sent (past the allow-list and the budget).
    pub requests: u32,
    /// Linear memory the call's instance grew to (memories only grow: its peak).
    pub memory_bytes: usize,
}

impl WasmProvider {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn plugin(&self) -> &LoadedPlugin {
        &self.plugin
    }

    pub fn info(&self) -> &load::PluginInfo {
        &self.plugin.info
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Makes `doc` (the cloud-init of the Proxy `owner`, its UID) sensitive for every later
    /// call of this provider, whichever Proxy the call is for, until the Proxy is forgotten
    /// (see [`sensitive`]). The reconciler calls it for every Proxy it sees; refused when
    /// the redactor has no room left, and the Proxy is then not created.
    pub fn remember_cloud_init(
        &self,
        owner: &str,
        doc: &[u8],
    ) -> Result<(), crate::sensitive::Full> {
        self.shared.sensitive.hold_cloud_init(owner, doc).map(drop)
    }

    /// Makes a Proxy's username and password sensitive for every later call of this
    /// provider, each as a whole value in every encoding (see [`redact`]). The reconciler
    /// calls it for every Proxy as soon as it has read the Proxy's credentials.
    pub fn remember_credentials(
        &self,
        owner: &str,
        username: &str,
        password: &str,
    ) -> Result<(), crate::sensitive::Full> {
        self.shared
            .sensitive
            .hold_credentials(owner, username.as_bytes(), password.as_bytes())
            .map(drop)
    }

    /// Releases what the Proxy `owner` made sensitive (it is gone): kept a while, then
    /// dropped when room is needed (see [`sensitive`]).
    pub fn forget(&self, owner: &str) {
        self.shared.sensitive.forget(owner);
    }

    /// Whether instance addresses may be internal (loopback, private, link-local): from the
    /// provider entry's `allowPrivateAddresses`, for labs, emulators and private clouds.
    pub fn private_addresses_allowed(&self) -> bool {
        self.shared.reply_rules.allow_private_addresses
    }

    /// The allow-list in force, as `scheme://host:port` strings.
    pub fn allowed_hosts(&self) -> Vec<String> {
        self.http
            .allow
            .rules()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Runs one call in a fresh sandbox and turns every failure (guest error, trap, limit)
    /// into a classified, scrubbed [`ProviderError`].
    pub(crate) async fn invoke(
        &self,
        op: Op,
        id: &str,
        document: Option<Document<'_>>,
        deny_http: bool,
        call: GuestCall<'_>,
        priority: Priority,
    ) -> Result<(GuestReply, CallStats), ProviderError> {
        let limits = &self.shared.limits;
        // Load-time calls do no I/O: they get a short budget of their own.
        let timeout = if op == Op::Load {
            limits.timeout.min(LOAD_CALL_TIMEOUT)
        } else {
            limits.timeout
        };
        let fail = |class, msg: String| ProviderError::new(class, op, &self.shared.name, id, msg);
        let cancelled = &self.runtime.calls_cancelled;
        if cancelled.is_cancelled() {
            return Err(fail(Class::Transient, SHUTDOWN_REFUSED.into()));
        }
        let version = self.plugin.pre.version();
        if let Some(what) = abi::unsupported(version, &call) {
            return Err(fail(
                Class::Permanent,
                format!(
                    "plugin {} implements egress:provider@{version}, which has {what}; upgrade the plugin",
                    self.plugin.file_name()
                ),
            ));
        }
        // Known before the guest runs, so that whatever it does with the document in this
        // call or any later one is scrubbed.
        // A document the redactor has no room for is never handed to a plugin.
        if let Some(d) = document {
            self.shared
                .sensitive
                .hold_cloud_init(d.owner, d.cloud_init)
                .map_err(|e| fail(Class::Transient, e.to_string()))?;
        }
        // The same priority orders the wait for a call slot and for the request budget.
        // A load-time call takes the runtime's load slot, not one of the provider's: those
        // may all be held by calls hanging on the backend (and an older generation's
        // calls share them). It sends no request, so it never meets the budget either.
        let slots = if op == Op::Load {
            &self.runtime.load_slots
        } else {
            &self.permits
        };
        let asked = Instant::now();
        let _permit = slots.acquire(priority).await;
        let started = Instant::now();
        if op != Op::Load
            && let Some(m) = self.runtime.metrics.get()
        {
            m.slot_waited(&self.shared.name, priority.as_str(), started - asked);
        }
        let allowance = if op == Op::Load {
            Duration::ZERO
        } else {
            clock::budget_wait_allowance(timeout)
        };
        let clock = Arc::new(clock::CallClock::new(started, timeout, allowance));
        let mut tmp = self.scratch.take().map_err(|e| {
            fail(
                Class::Transient,
                format!("cannot create the call's /tmp: {e}"),
            )
        })?;
        let mut store = self
            .new_store(tmp.path(), deny_http, clock.clone(), priority)
            .map_err(|e| fail(Class::Transient, format!("cannot set up the sandbox: {e}")))?;
        let stop = store.data().stop.clone();

        // Dropping the call's future drops its guest mid-call: the Store and /tmp go with
        // it. A limit tripped outside the guest's own code (an HTTP future, a host call the
        // guest is blocked in) ends the call at once.
        // `Err(())`: out of time (see `CallClock`: budget waits do not count).
        let outcome: Option<Result<wasmtime::Result<GuestReply>, ()>> = {
            let run = abi::dispatch(&self.plugin.pre, &mut store, call);
            tokio::pin!(run);
            loop {
                let deadline = tokio::time::Instant::from_std(clock.deadline(Instant::now()));
                tokio::select! {
                    r = &mut run => break Some(Ok(r)),
                    () = tokio::time::sleep_until(deadline) => {
                        if clock.expired(Instant::now()) {
                            break Some(Err(()));
                        }
                    }
                    () = stop.tripped() => break Some(Ok(Err(wasmtime::format_err!("stopped by a limit")))),
                    () = cancelled.cancelled() => break None,
                }
            }
        };

        let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        let state = store.data_mut();
        let stats = CallStats {
            fuel_used,
            duration: started.elapsed(),
            requests: state.hooks.budget.sent(),
            memory_bytes: state.limiter.total,
        };
        if op != Op::Load {
            self.follow_budget(&stats, clock.waited(Instant::now()));
        }
        // The first limit that tripped is the one reported, whatever the guest did after
        // (a refused request it ignored still ends the call). The error is built before
        // the output is flushed: a panic message is read from the captured stderr.
        let (result, trap) = match outcome {
            None => (
                Err(fail(Class::Transient, SHUTDOWN_CANCELLED.into())),
                Some(TrapKind::Shutdown),
            ),
            Some(outcome) => {
                if let Some(Err(trap)) = outcome.as_ref().ok()
                    && let Some(hit) = LimitHit::of_trap(trap)
                {
                    stop.trip(hit);
                }
                if outcome.is_err() {
                    // Out of time while a request waited for a token: the budget's doing.
                    stop.trip(if clock.is_waiting() {
                        LimitHit::Budget
                    } else {
                        LimitHit::Deadline
                    });
                }
                match (stop.hit(), outcome) {
                    (Some(hit), _) => {
                        let context = limits::Context {
                            limits,
                            timeout,
                            budget: self.budget_spec(),
                        };
                        (
                            Err(fail(Class::Transient, hit.message(&context))),
                            Some(TrapKind::Limit(hit)),
                        )
                    }
                    (None, Ok(Err(trap))) => {
                        let (kind, message) = trap_message(&trap, state);
                        (Err(fail(Class::Transient, message)), kind)
                    }
                    (None, Ok(Ok(reply))) => {
                        match reply::check(reply, &self.shared.reply_rules, &state.redactor) {
                            Ok(reply) => {
                                self.heed_rate_limit(&reply);
                                (Ok((reply, stats)), None)
                            }
                            Err(problem) => (
                                Err(fail(
                                    Class::Transient,
                                    format!("plugin reply rejected: {problem}"),
                                )),
                                None,
                            ),
                        }
                    }
                    (None, Err(_elapsed)) => unreachable!("a deadline trips the tripwire"),
                }
            }
        };
        if let Some(m) = self.runtime.metrics.get() {
            m.observe(
                &self.shared.name,
                op.as_str(),
                stats.duration,
                fuel_used,
                stats.memory_bytes,
                trap,
            );
        }
        state.flush_output();
        if let Err(e) = &result {
            tracing::debug!(provider = %self.shared.name, op = %op, fuel_used, error = %e.message, "plugin call failed");
        }
        // Close the guest's files before its /tmp goes back or is removed (off the call's
        // path: ScratchDir's drop).
        let quota = store.data().fs.quota.clone();
        drop(store);
        if quota.used() == 0 {
            tmp.untouched();
        }
        drop(tmp);
        result
    }

    /// A plugin that read a rate limit from its backend's answer (`retry-after-ms`,
    /// contract 0.2.0) pauses its provider's budget as a 429 with `Retry-After` would: the
    /// plugin can only slow its own provider down, never anyone else's.
    fn heed_rate_limit(&self, reply: &GuestReply) {
        let (Some(budget), Some(ms)) = (&self.http.budget, reply.retry_after_ms()) else {
            return;
        };
        budget.observe(&rate::Feedback {
            status: 429,
            retry_after: Some(Duration::from_millis(ms.into())),
            limit: None,
            remaining: None,
        });
    }

    /// Sets how many slots the provider's calls want, from what a request of this call
    /// took without its budget waits: as many as keep the budget's rate busy
    /// ([`slots::budget_slots`]). Without a budget there is no rate to follow, and the
    /// provider keeps to its own slots.
    fn follow_budget(&self, stats: &CallStats, budget_waited: Duration) {
        let Some(budget) = self.http.budget.as_ref() else {
            return;
        };
        if stats.requests == 0 {
            return;
        }
        let own = stats.duration.saturating_sub(budget_waited).as_secs_f64();
        let per_request = self
            .per_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(own / f64::from(stats.requests));
        let wanted = self.permits.set_want(slots::budget_slots(
            budget.rate_per_hour() / 3600.0,
            per_request,
        ));
        if let Some(m) = self.runtime.metrics.get() {
            m.slots(&self.shared.name, wanted, self.permits.held().1);
        }
    }

    /// Its call slots held now, and of those borrowed from the pod's left-over room.
    pub fn slots_held(&self) -> (usize, usize) {
        self.permits.held()
    }

    /// The request budget in force, if any.
    pub fn budget_spec(&self) -> Option<rate::Spec> {
        self.http.budget.as_ref().map(|b| b.spec())
    }

    /// Remembers what a successful list (of the `recent` instances, or of all) cost, for
    /// [`WasmProvider::pacing`].
    pub(crate) fn record_list_cost(&self, stats: &CallStats, recent: bool) {
        let last = if recent {
            &self.last_recent_requests
        } else {
            &self.last_list_requests
        };
        last.store(stats.requests, std::sync::atomic::Ordering::Relaxed);
    }

    /// The request rate in force and the last list's cost; `None` without a budget.
    pub fn pacing(&self) -> Option<crate::provider::Pacing> {
        let budget = self.http.budget.as_ref()?;
        let known = |a: &std::sync::atomic::AtomicU32| {
            let n = a.load(std::sync::atomic::Ordering::Relaxed);
            (n > 0).then_some(n)
        };
        Some(crate::provider::Pacing {
            requests_per_hour: budget.rate_per_hour(),
            last_list_requests: known(&self.last_list_requests),
            last_recent_requests: known(&self.last_recent_requests),
            contended: budget.above_background_waiting() || self.permits.above_background_waiting(),
        })
    }

    fn new_store(
        &self,
        tmp: &Path,
        deny_http: bool,
        clock: Arc<clock::CallClock>,
        priority: rate::Priority,
    ) -> wasmtime::Result<Store<CallState>> {
        let limits = &self.shared.limits;
        let out_cap = (limits.log_lines as usize) * (limits.log_line_bytes as usize);
        let stdout = output::CapturedOutput::new(out_cap);
        let stderr = output::CapturedOutput::new(out_cap);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .preopened_dir(tmp, "/tmp", FsPerms::ReadWrite)?;
        let stop = Arc::new(Tripwire::default());
        // Every host object the guest holds (fields, requests, bodies, streams, pollables,
        // files) is an entry of this table: its cap bounds them all.
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.handles as usize);
        // Each `fields` holds at most this much: with the table cap, fields hold at most
        // handles x maxHeaderBytes of host memory.
        let mut http_ctx = wasmtime_wasi_http::WasiHttpCtx::new();
        http_ctx.set_field_size_limit(limits.http.max_header_bytes as usize);
        let state = CallState {
            wasi: wasi.build(),
            http_ctx,
            table,
            hooks: http::HttpHooks::new(
                self.http.clone(),
                deny_http,
                tracing::Span::current(),
                stop.clone(),
                http::CallBudget::new(priority, clock.clone(), self.runtime.metrics.get().cloned()),
            ),
            limiter: MemoryLimiter::new(
                (u64::from(limits.memory_mib) << 20).min(self.runtime.max_memory_bytes) as usize,
                stop.clone(),
            ),
            redactor: self.shared.sensitive.redactor(),
            shared: self.shared.clone(),
            log_lines: 0,
            log_dropped: 0,
            clock,
            fs: fs::FsLimits::new(
                u64::from(limits.tmp_mib) << 20,
                limits.open_files as usize,
                stop.clone(),
            ),
            stop,
            stdout,
            stderr,
        };
        let mut store = Store::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel)?;
        // Bounds what the guest can make the host copy out of it at once: a reply, or
        // one host call's arguments (see `reply::MAX_LIFT_BYTES`).
        store.set_hostcall_fuel(reply::MAX_LIFT_BYTES);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| ctx.data_mut().on_tick());
        Ok(store)
    }
}

const SHUTDOWN_REFUSED: &str =
    "the operator is shutting down and its grace period is over: call not started";
const SHUTDOWN_CANCELLED: &str =
    "call cancelled: the operator is shutting down and its grace period is over";

/// Budget of the load-time calls (`info`, `validate-config`), which must not do I/O. They
/// run on the runtime's load slot (see `Runtime::load_slots`), HTTP denied, with the
/// entry's fuel, memory, `/tmp` and handle limits.
pub const LOAD_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Says what the trap was, and its kind for the traps metric (`None`: the guest failed
/// without trapping, e.g. a host call error), when no limit stopped the call. Always
/// Transient: the next call gets a fresh instance.
fn trap_message(err: &wasmtime::Error, state: &CallState) -> (Option<TrapKind>, String) {
    if past_lift_bound(err) {
        return (
            None,
            format!(
                "plugin handed the host more data at once than it copies out of a sandbox (MAX_LIFT_BYTES = {} MiB, counted as string bytes plus the host size of each list element, for one reply or one host call's arguments) and was stopped",
                reply::MAX_LIFT_BYTES as f64 / (1 << 20) as f64
            ),
        );
    }
    let (kind, message) = match err.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => (TrapKind::Stack, "plugin overflowed its stack (runaway recursion) and was stopped".to_string()),
        // A Rust guest keeps its stack in linear memory: overflowing it shows up as an
        // access below address zero rather than as a native stack overflow.
        Some(Trap::MemoryOutOfBounds) => (TrapKind::Stack,
            "plugin made an out-of-bounds memory access (typically a stack overflow from runaway recursion) and was stopped".to_string()
        ),
        Some(Trap::UnreachableCodeReached) => {
            let tail = state.stderr_tail();
            (TrapKind::Panic, if tail.is_empty() {
                "plugin panicked (trap: unreachable)".to_string()
            } else {
                format!("plugin panicked: {tail}")
            })
        }
        Some(trap) => (TrapKind::Other, format!("plugin trapped: {trap}")),
        None => {
            return (
                None,
                reply::text(&format!("plugin failed: {err:#}"), reply::MAX_TEXT, &state.redactor),
            );
        }
    };
    (Some(kind), message)
}

/// Whether wasmtime refused to copy a reply or a host call's arguments out of the guest
/// because they cost more than the Store's hostcall fuel ([`reply::MAX_LIFT_BYTES`]).
/// wasmtime's error type for it is private; its message is matched, and the hostile
/// tests fail if it changes.
fn past_lift_bound(err: &wasmtime::Error) -> bool {
    const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";
    err.chain()
        .any(|e| e.to_string().contains(HOSTCALL_FUEL_EXHAUSTED))
}

/// Builds the shared state of a provider. Used for real providers and for the anonymous
/// sandbox that reads a plugin's `info` at load.
fn provider_shared(
    name: &str,
    limits: Limits,
    entry: Option<&ProviderEntry>,
    sensitive: Arc<crate::sensitive::Sensitive>,
) -> ProviderShared {
    ProviderShared {
        name: name.to_string(),
        config_json: entry.map_or_else(|| "{}".to_string(), |e| e.config.to_string()),
        secrets: entry.map(|e| e.secrets.clone()).unwrap_or_default(),
        limits,
        cache: Mutex::new(sandbox::KvCache::new()),
        sensitive,
        reply_rules: reply::Rules {
            allow_private_addresses: entry.is_some_and(|e| e.allow_private_addresses),
        },
        prices: entry.map(|e| e.prices.clone()).unwrap_or_default(),
        quotes: Mutex::new(quotes::QuoteCache::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[(&str, u32, u32)]) -> ProvidersFile {
        let mut text = String::from("providers:\n");
        for (name, concurrency, memory) in entries {
            text.push_str(&format!(
                "  - name: {name}\n    plugin: {name}.wasm\n    limits: {{concurrency: {concurrency}, memoryMib: {memory}}}\n"
            ));
        }
        ProvidersFile::parse(&text).unwrap()
    }

    /// The pool is sized once, with headroom: a reload within it runs, one beyond it is
    /// refused naming what it needs and what the pool has.
    #[test]
    fn a_reload_must_fit_the_pool_made_at_start() {
        let start = file(&[("a", 2, 64), ("b", 2, 64)]);
        let opts = RuntimeOptions::for_providers(&start, None, "/tmp".into());
        let (n, mem) = (opts.engine.max_instances, opts.engine.max_memory_bytes);
        assert_eq!(n, 2 + 2 + 4 + POOL_HEADROOM_INSTANCES);
        // (what, providers (name, concurrency, memoryMib), what the refusal says)
        type Case<'a> = (&'a str, Vec<(&'a str, u32, u32)>, Option<&'a str>);
        let cases: [Case; 4] = [
            ("the same file", vec![("a", 2, 64), ("b", 2, 64)], None),
            (
                "a provider added within the headroom",
                vec![("a", 2, 64), ("b", 2, 64), ("c", 16, 64)],
                None,
            ),
            (
                "concurrency beyond the pool",
                vec![("a", 2, 64), ("b", 2, 64), ("c", 64, 64)],
                Some(
                    "need 72 wasm instance slots (the sum of limits.concurrency, plus 4) but the pool made when the operator started has 40",
                ),
            ),
            (
                "a larger memory than the pool's",
                vec![("a", 2, 64), ("b", 2, 128)],
                Some("provider \"b\": limits.memoryMib 128 is more than the 64 MiB per memory"),
            ),
        ];
        for (what, entries, want) in cases {
            let got = pool_problem(&file(&entries), n, mem);
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(
                    g.contains(w) && g.contains("restart the operator"),
                    "{what}: {g}"
                ),
                _ => panic!("{what}: want {want:?}, got {got:?}"),
            }
        }
    }
}
