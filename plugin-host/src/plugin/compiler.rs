//! Where plugins are compiled to native code: in a short-lived child process running this
//! same executable, within limits, or (tests and embedders) in this process.
//!
//! Compiling a plugin runs cranelift on a thread pool for about half a second per plugin,
//! and what that leaves behind in a long-running process outlives the compile: the heap
//! that cranelift grew on its worker threads stays fragmented (heaptrack, 2,500 Proxies:
//! the operator's heap peak was cranelift's, at start), and the pages of cranelift's own
//! code stay mapped. The operator compiles at every start (the compile cache lives in an
//! `emptyDir`) and at every reload that brings a new plugin, then runs for weeks under a
//! memory limit; so `proxy-operator` compiles in a child (`compile-plugin`, hidden) that
//! exits when done, and keeps only the artifact, which it maps from the cache file.
//!
//! A compile is also an attack surface: its cost grows with the square of some code's size
//! (a function of 20,000 `call_indirect`s whose results all stay live, 160 KiB, took more
//! than 280 s of CPU and 8.5 GiB, still going; see `tests/support/bomb.rs`). So the child
//! runs within [`CompileLimits`], set in the child before it executes: CPU time
//! (`RLIMIT_CPU`), private writable memory (`RLIMIT_DATA`), no core dump, and the OOM
//! killer's first choice in the pod (`oom_score_adj` 1000, so a pod that runs out of memory
//! loses the compile, never the operator); a wall-time deadline kills it by PID. The wait is asynchronous (the child is
//! driven from tokio's blocking pool), and compiles run one at a time. A child ended by a
//! limit fails that plugin with a message naming the limit and its flag, and is never
//! retried in this process: only a child that cannot be started at all (no such
//! executable, not executable) falls back to compiling in process, said in a warning.
//!
//! The child builds its engine from the same [`EngineOptions`], so the artifact fits the
//! parent's engine; wasmtime checks that again when the parent loads it.

use super::engine::{self, EngineOptions};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::Engine;

const MIB: u64 = 1 << 20;

/// What one compile child may use.
///
/// Measured for every shipped plugin (`compile-plugin` of the release build, as shipped,
/// with the Deployment's `MALLOC_ARENA_MAX=2`; 2-core machine): CPU time 0.45-0.87 s
/// (example.wasm, 197 KB, the smallest; gce.wasm, 390 KB, the largest), wall time
/// 0.24-0.47 s, peak RSS 30-47 MiB, and the least `RLIMIT_DATA` each compiles under
/// 47-64 MiB (gce.wasm 64, proxmox.wasm 61, ec2.wasm 59; 70 for gce.wasm without the
/// arena setting, and in the dev-profile build, whose compiler crates are optimised as in
/// release: 1.05 s of CPU, 59 MiB RSS). The build refuses a provider of 512 KiB or more
/// (`cargo xtask build-plugins`), which by the same slope needs about 85 MiB. Hence the
/// defaults: 20 s of CPU (more than 20 times the largest), 128 MiB (1.8 times the largest,
/// above the largest a provider may be), and a wall time of twice the CPU time (a single
/// huge function compiles on one thread, so CPU time passes no faster than wall time; the
/// rest is for a node short of CPU).
///
/// `RLIMIT_DATA` and not `RLIMIT_AS`: the child's engine reserves the pooling allocator's
/// address space (about 65 GB, `PROT_NONE`) as the parent's does, which no address-space
/// limit allows, and even without pooling a compile needing 59 MiB of RSS failed under
/// 256 MiB of address space (thread stacks and malloc arenas are reserved whole).
/// `RLIMIT_DATA` counts only private writable mappings (the heap, thread stacks), which
/// is what a compile bomb grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// CPU time, all threads together (`RLIMIT_CPU`, whole seconds, rounded up).
    pub cpu: Duration,
    /// Private writable memory (`RLIMIT_DATA`).
    pub memory_bytes: u64,
    /// Wall time from the start of the child; then it is killed.
    pub wall: Duration,
}

impl CompileLimits {
    pub const DEFAULT_CPU: Duration = Duration::from_secs(20);
    pub const DEFAULT_MEMORY_BYTES: u64 = 128 * MIB;
    pub const DEFAULT_WALL: Duration = Duration::from_secs(40);

    /// The CPU limit as `RLIMIT_CPU` takes it: whole seconds, at least 1.
    fn cpu_secs(&self) -> u64 {
        let s = self.cpu.as_secs() + u64::from(self.cpu.subsec_nanos() > 0);
        s.max(1)
    }
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            cpu: Self::DEFAULT_CPU,
            memory_bytes: Self::DEFAULT_MEMORY_BYTES,
            wall: Self::DEFAULT_WALL,
        }
    }
}

/// Native code is about 4 times the component (measured: 3.7-3.9 for the shipped
/// plugins); a child that writes more than this many times the component (and at least
/// [`MIN_ARTIFACT_BYTES`]) is stopped, so the artifact read into this process stays small.
pub const MAX_ARTIFACT_RATIO: u64 = 16;
pub const MIN_ARTIFACT_BYTES: u64 = 16 * MIB;

/// Where [`compile`](Compiler::compile) runs.
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process (the library's default: tests and embedders), on tokio's blocking
    /// pool, without limits.
    #[default]
    InProcess,
    /// In a child process: `exe compile-plugin` with the options the engine was built
    /// from (and whether it got the pooling allocator), the component on stdin, the
    /// artifact on stdout; within `limits`, one at a time.
    Child {
        exe: PathBuf,
        opts: EngineOptions,
        pooling: bool,
        limits: CompileLimits,
        /// One compile at a time: the pod's memory holds one child, whatever runs the
        /// loads (reloads of several providers may run at once).
        one_at_a_time: Arc<tokio::sync::Semaphore>,
    },
}

/// The hidden subcommand a [`Compiler::Child`] runs.
pub const SUBCOMMAND: &str = "compile-plugin";

/// What a compile in a child used (from `wait4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileStats {
    /// User and system CPU time, all threads.
    pub cpu: Duration,
    /// Peak resident memory.
    pub max_rss_bytes: u64,
    pub wall: Duration,
}

/// A limit a compile child reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileLimit {
    #[error("compile exceeded its CPU-time limit of {} (--plugin-compile-cpu)", secs(*.0))]
    Cpu(Duration),
    #[error("compile exceeded its memory limit of {} MiB (--plugin-compile-memory)", .0 / MIB)]
    Memory(u64),
    #[error("compile exceeded its wall-time limit of {} (--plugin-compile-timeout)", secs(*.0))]
    Wall(Duration),
    #[error(
        "compile was killed (SIGKILL) within its CPU-time limit, by the out-of-memory killer: the pod ran out of memory while it compiled (its own limit is {} MiB, --plugin-compile-memory; raise the pod's memory limit)",
        .0 / MIB
    )]
    OomKilled(u64),
    #[error(
        "compile produced more than {} MiB of native code ({MAX_ARTIFACT_RATIO} times the component's size)",
        .0 / MIB
    )]
    Artifact(u64),
}

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs().max(1))).to_string()
}

/// Why a compile did not produce an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The plugin does not compile (what wasmtime said).
    #[error("{0}")]
    Invalid(String),
    /// The child reached a limit: the plugin is refused.
    #[error("{0}")]
    Limit(CompileLimit),
    /// The child failed some other way (it crashed, or could not be waited for).
    #[error("{0}")]
    Failed(String),
}

impl Compiler {
    /// The running executable, to be run as `/proc/self/exe`: that still runs this build
    /// when the file on disk was replaced since.
    pub const THIS_EXECUTABLE: &str = "/proc/self/exe";

    /// Compiles in a child running `exe`, within `limits`.
    pub fn child(exe: PathBuf, opts: EngineOptions, pooling: bool, limits: CompileLimits) -> Self {
        Compiler::Child {
            exe,
            opts,
            pooling,
            limits,
            one_at_a_time: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The serialized artifact of `bytes` for `engine`, and what the child used (`None`
    /// when compiled in this process). Never blocks the calling task's thread.
    pub async fn compile(
        &self,
        engine: &Engine,
        bytes: Arc<[u8]>,
    ) -> Result<(Vec<u8>, Option<CompileStats>), CompileError> {
        if let Compiler::Child {
            exe,
            opts,
            pooling,
            limits,
            one_at_a_time,
        } = self
        {
            let _turn = one_at_a_time
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let mut cmd = Command::new(exe);
            cmd.arg(SUBCOMMAND).args(args(opts, *pooling));
            match in_child(cmd, limits, bytes.clone()).await {
                Ok((artifact, stats)) => return Ok((artifact, Some(stats))),
                Err(ChildError::Compile(e)) => return Err(e),
                Err(ChildError::CannotStart(e)) => {
                    tracing::warn!(exe = %exe.display(), error = %e, "cannot start the plugin compiler's child process; compiling in this one, without compile limits")
                }
            }
        }
        let engine = engine.clone();
        tokio::task::spawn_blocking(move || engine.precompile_component(&bytes))
            .await
            .map_err(|e| CompileError::Failed(format!("the compile thread failed: {e}")))?
            .map(|artifact| (artifact, None))
            .map_err(|e| CompileError::Invalid(format!("{e:#}")))
    }
}

#[derive(Debug)]
enum ChildError {
    /// The child ran, and this is the outcome.
    Compile(CompileError),
    /// The executable could not be started at all: the only case that falls back.
    CannotStart(std::io::Error),
}

/// Spawn errors that mean "this executable cannot run here", as opposed to a machine
/// short of processes or memory (those fail the plugin: compiling in process then would
/// run without limits exactly when resources are short).
fn cannot_start(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC | libc::ENOTDIR | libc::ELOOP)
    )
}

/// The end of a child, as `wait4` reported it.
#[derive(Debug, Clone, Copy)]
struct Exit {
    status: ExitStatus,
    cpu: Duration,
    max_rss_bytes: u64,
}

/// What the blocking side saw.
struct Talk {
    exit: std::io::Result<Exit>,
    artifact: Vec<u8>,
    /// The artifact went past its cap (the child was killed).
    oversized: bool,
    stderr: String,
}

/// A child between its start and its reap, shared by the thread that talks to it and
/// the task that awaits it. The reap happens under the lock after `reaped` is set, and a
/// kill by PID happens under the same lock only while it is unset: a kill never reaches
/// another process that got the number since.
#[derive(Default)]
struct ChildState {
    pid: Option<libc::pid_t>,
    reaped: bool,
    /// The compile was abandoned (its task dropped): a child started after that is
    /// killed at once.
    abandoned: bool,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<ChildState>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, ChildState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn kill(&self) {
        kill_locked(&self.lock());
    }
}

fn kill_locked(state: &ChildState) {
    if let (Some(pid), false) = (state.pid, state.reaped) {
        // SAFETY: kill(2) of our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Kills the child when the compile is abandoned (the load's task dropped, e.g. by a
/// reload timeout): its thread on the blocking pool then reaps it.
struct KillOnDrop(Option<Shared>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            let mut state = shared.lock();
            state.abandoned = true;
            kill_locked(&state);
        }
    }
}

async fn in_child(
    mut cmd: Command,
    limits: &CompileLimits,
    bytes: Arc<[u8]>,
) -> Result<(Vec<u8>, CompileStats), ChildError> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A child that runs out of memory while printing a backtrace deadlocks in the
        // standard library's allocation-error hook (seen under RLIMIT_DATA with
        // RUST_BACKTRACE=1); the wall-time limit would end it, but later.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    limit_child(&mut cmd, limits);
    let cap = (bytes.len() as u64)
        .saturating_mul(MAX_ARTIFACT_RATIO)
        .max(MIN_ARTIFACT_BYTES);
    let shared = Shared::default();
    // Armed before the child exists: dropped at any await below, the child dies.
    let mut guard = KillOnDrop(Some(shared.clone()));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let started = Instant::now();
    let mut worker =
        tokio::task::spawn_blocking(move || talk(cmd, &bytes, cap, started_tx, &shared));
    match started_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if cannot_start(&e) => return Err(ChildError::CannotStart(e)),
        Ok(Err(e)) => {
            return Err(ChildError::Compile(CompileError::Failed(format!(
                "cannot start {SUBCOMMAND}: {e}"
            ))));
        }
        Err(_) => {
            return Err(ChildError::Compile(CompileError::Failed(format!(
                "{SUBCOMMAND}: its thread ended before starting it"
            ))));
        }
    }
    let (joined, timed_out) = match tokio::time::timeout(limits.wall, &mut worker).await {
        Ok(joined) => (joined, false),
        Err(_) => {
            if let Some(shared) = &guard.0 {
                shared.kill();
            }
            (worker.await, true)
        }
    };
    guard.0 = None;
    let wall = started.elapsed();
    let talk = joined.map_err(|e| {
        ChildError::Compile(CompileError::Failed(format!(
            "{SUBCOMMAND}: its thread failed: {e}"
        )))
    })?;
    let exit = talk.exit.map_err(|e| {
        ChildError::Compile(CompileError::Failed(format!(
            "{SUBCOMMAND}: waiting for it: {e}"
        )))
    })?;
    let stats = CompileStats {
        cpu: exit.cpu,
        max_rss_bytes: exit.max_rss_bytes,
        wall,
    };
    let verdict = if talk.oversized {
        Err(CompileError::Limit(CompileLimit::Artifact(cap)))
    } else {
        classify(exit.status, exit.cpu, &talk.stderr, limits, timed_out)
    };
    match verdict {
        Ok(()) if talk.artifact.is_empty() => Err(ChildError::Compile(CompileError::Failed(
            format!("{SUBCOMMAND} wrote no artifact: {}", talk.stderr.trim()),
        ))),
        Ok(()) => Ok((talk.artifact, stats)),
        Err(e) => {
            tracing::warn!(
                error = %e,
                status = %exit.status,
                cpu_ms = exit.cpu.as_millis() as u64,
                max_rss_mib = exit.max_rss_bytes / MIB,
                wall_ms = wall.as_millis() as u64,
                "plugin compile child failed"
            );
            Err(ChildError::Compile(e))
        }
    }
}

/// The blocking side: starts the child (reporting its PID or the spawn error on
/// `started`), feeds it, reads its output and reaps it.
fn talk(
    mut cmd: Command,
    input: &Arc<[u8]>,
    cap: u64,
    started: tokio::sync::oneshot::Sender<std::io::Result<()>>,
    shared: &Shared,
) -> Talk {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = started.send(Err(e));
            return Talk {
                exit: Err(std::io::Error::other("not started")),
                artifact: Vec::new(),
                oversized: false,
                stderr: String::new(),
            };
        }
    };
    let pid = child.id() as libc::pid_t;
    {
        let mut state = shared.lock();
        state.pid = Some(pid);
        if state.abandoned {
            kill_locked(&state);
        }
    }
    let _ = started.send(Ok(()));
    // Fed from a thread: a child that writes a large artifact before reading all of its
    // input would otherwise deadlock against us. A child that dies early closes the pipe
    // (the write then fails; its exit says why).
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.clone();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        // Keep the first 64 KiB; read the rest only so that the child never blocks on it.
        let mut text = Vec::new();
        let _ = (&mut stderr).take(64 << 10).read_to_end(&mut text);
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        String::from_utf8_lossy(&text).into_owned()
    });
    let mut artifact = Vec::new();
    let read = child
        .stdout
        .take()
        .expect("piped")
        .take(cap.saturating_add(1))
        .read_to_end(&mut artifact);
    let oversized = artifact.len() as u64 > cap;
    if oversized || read.is_err() {
        shared.kill();
        artifact.clear();
    }
    let exit = reap(pid, shared);
    let _ = feeder.join();
    let stderr = errors.join().unwrap_or_default();
    Talk {
        exit,
        artifact,
        oversized,
        stderr,
    }
}

/// Waits for the child to end, then reaps it with `wait4` (its CPU time and peak RSS).
fn reap(pid: libc::pid_t, shared: &Shared) -> std::io::Result<Exit> {
    // Wait without reaping first: the PID stays the child's until `reaped` is set.
    loop {
        // SAFETY: waitid(2) on our own child into a zeroed siginfo_t.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let mut state = shared.lock();
    state.reaped = true;
    let mut status = 0;
    // SAFETY: wait4(2) on our own exited child into a zeroed rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Ok(Exit {
        status: ExitStatus::from_raw(status),
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        // Linux reports it in KiB.
        max_rss_bytes: (usage.ru_maxrss as u64) << 10,
    })
}

/// Sets the child's limits between fork and exec.
fn limit_child(cmd: &mut Command, limits: &CompileLimits) {
    let cpu = limits.cpu_secs();
    let data = limits.memory_bytes;
    let oom_score_adj = c"/proc/self/oom_score_adj";
    // SAFETY: between fork and exec only async-signal-safe calls (getrlimit, setrlimit,
    // open, write, close) on data made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            set_rlimit(libc::RLIMIT_CORE, 0, 0)?;
            // SIGXCPU at the soft limit; SIGKILL a second later if that was survived.
            set_rlimit(libc::RLIMIT_CPU, cpu, cpu + 1)?;
            set_rlimit(libc::RLIMIT_DATA, data, data)?;
            // The OOM killer's first choice: when the pod runs out of memory during a
            // compile, the compile dies, not the operator. Best effort (no /proc: the
            // limits above still hold).
            let fd = libc::open(oom_score_adj.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            Ok(())
        });
    }
}

/// Lowers one resource limit to `soft`/`hard`, never above the hard limit the process
/// has (raising that needs privileges).
fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> std::io::Result<()> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with valid pointers.
    if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let hard = hard.min(current.rlim_max);
    let new = libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a child's error output says it ran out of memory: Rust's allocation-failure
/// message (then SIGABRT), or an OS error for memory (a thread or mapping refused).
fn out_of_memory(stderr: &str) -> bool {
    [
        "memory allocation of",
        "Cannot allocate memory",
        "os error 12",
        "out of memory",
    ]
    .iter()
    .any(|needle| stderr.contains(needle))
}

/// What a child's end means. `timed_out`: the deadline killed it.
fn classify(
    status: ExitStatus,
    cpu: Duration,
    stderr: &str,
    limits: &CompileLimits,
    timed_out: bool,
) -> Result<(), CompileError> {
    let limit = |hit| Err(CompileError::Limit(hit));
    if timed_out {
        return limit(CompileLimit::Wall(limits.wall));
    }
    let stderr_text = stderr.trim();
    if let Some(signal) = status.signal() {
        return match signal {
            libc::SIGXCPU => limit(CompileLimit::Cpu(limits.cpu)),
            // At the hard CPU limit the kernel sends SIGKILL; otherwise only the OOM
            // killer sends it (the deadline is `timed_out`).
            libc::SIGKILL if cpu >= Duration::from_secs(limits.cpu_secs()) => {
                limit(CompileLimit::Cpu(limits.cpu))
            }
            libc::SIGKILL => limit(CompileLimit::OomKilled(limits.memory_bytes)),
            _ if out_of_memory(stderr) => limit(CompileLimit::Memory(limits.memory_bytes)),
            _ => Err(CompileError::Failed(format!(
                "{SUBCOMMAND} was killed by signal {signal}: {stderr_text}"
            ))),
        };
    }
    match status.code() {
        Some(0) => Ok(()),
        Some(COMPILE_FAILED) => Err(CompileError::Invalid(stderr_text.to_string())),
        _ if out_of_memory(stderr) => limit(CompileLimit::Memory(limits.memory_bytes)),
        _ => Err(CompileError::Failed(format!(
            "{SUBCOMMAND} exited with {status}: {stderr_text}"
        ))),
    }
}

/// The engine options on the child's command line. One instance slot: how many the
/// parent's pool has does not change the code compiled (its memory settings do), and a
/// child under `RLIMIT_DATA` cannot reserve the whole pool (with the reload headroom,
/// `POOL_HEADROOM_INSTANCES`, it failed to).
fn args(opts: &EngineOptions, pooling: bool) -> Vec<String> {
    vec![
        "--max-instances=1".to_string(),
        format!("--max-memory-bytes={}", opts.max_memory_bytes),
        format!("--pooling={pooling}"),
    ]
}

/// The child's exit code when the plugin itself does not compile (its error on stderr).
pub const COMPILE_FAILED: i32 = 3;

/// The child's side: the engine options as given, the component on stdin, the artifact on
/// stdout. Returns the exit code.
#[derive(clap::Args, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    max_instances: u32,
    #[arg(long)]
    max_memory_bytes: u64,
    #[arg(long, action = clap::ArgAction::Set)]
    pooling: bool,
}

/// Runs the child's side of [`Compiler::Child`]; the exit code to end with. Called before
/// any runtime or logging is set up: the child's memory is the compile's.
pub fn child_main(args: &ChildArgs) -> i32 {
    let opts = EngineOptions {
        max_instances: args.max_instances,
        max_memory_bytes: args.max_memory_bytes,
        pooling: args.pooling,
    };
    let engine = match engine::build(&opts) {
        Ok((engine, pooling)) if pooling == args.pooling => engine,
        Ok(_) => {
            eprintln!("the child's engine could not match the parent's allocator");
            return 1;
        }
        Err(e) => {
            eprintln!("wasm engine: {e:#}");
            return 1;
        }
    };
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("reading the component: {e}");
        return 1;
    }
    match engine.precompile_component(&bytes) {
        Ok(artifact) => match std::io::stdout().lock().write_all(&artifact) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("writing the artifact: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("{e:#}");
            COMPILE_FAILED
        }
    }
}

/// A compiler that runs `exe` (tests: a script standing in for the child).
#[cfg(test)]
fn script_compiler(exe: &std::path::Path, limits: CompileLimits) -> Compiler {
    Compiler::child(
        exe.to_path_buf(),
        EngineOptions {
            max_instances: 4,
            max_memory_bytes: 1 << 20,
            pooling: false,
        },
        false,
        limits,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const LIMITS: CompileLimits = CompileLimits {
        cpu: Duration::from_secs(20),
        memory_bytes: 128 * MIB,
        wall: Duration::from_secs(40),
    };

    fn signalled(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn each_end_of_a_child_names_its_limit() {
        let secs = Duration::from_secs;
        let cpu = CompileLimit::Cpu(LIMITS.cpu);
        let memory = CompileLimit::Memory(LIMITS.memory_bytes);
        let oom = CompileLimit::OomKilled(LIMITS.memory_bytes);
        let alloc = "memory allocation of 786432 bytes failed\n";
        type Case<'a> = (
            &'a str,
            ExitStatus,
            Duration,
            &'a str,
            bool,
            Result<(), CompileError>,
        );
        let cases: Vec<Case> = vec![
            ("success", exited(0), secs(1), "", false, Ok(())),
            (
                "SIGXCPU at the soft limit",
                signalled(libc::SIGXCPU),
                secs(20),
                "",
                false,
                Err(CompileError::Limit(cpu.clone())),
            ),
            (
                "SIGKILL at the hard limit",
                signalled(libc::SIGKILL),
                secs(21),
                "",
                false,
                Err(CompileError::Limit(cpu.clone())),
            ),
            (
                "SIGKILL well within the CPU limit: the OOM killer",
                signalled(libc::SIGKILL),
                secs(3),
                "",
                false,
                Err(CompileError::Limit(oom)),
            ),
            (
                "the deadline's kill",
                signalled(libc::SIGKILL),
                secs(3),
                "",
                true,
                Err(CompileError::Limit(CompileLimit::Wall(LIMITS.wall))),
            ),
            (
                "allocation failure, then abort",
                signalled(libc::SIGABRT),
                secs(2),
                alloc,
                false,
                Err(CompileError::Limit(memory.clone())),
            ),
            (
                "a thread refused for memory",
                exited(101),
                secs(0),
                "failed to spawn thread: Os { code: 12, kind: OutOfMemory, message: \"Cannot allocate memory\" }",
                false,
                Err(CompileError::Limit(memory)),
            ),
            (
                "the plugin does not compile",
                exited(COMPILE_FAILED),
                secs(0),
                "bad type\n",
                false,
                Err(CompileError::Invalid("bad type".into())),
            ),
            (
                "a crash",
                signalled(libc::SIGSEGV),
                secs(0),
                "",
                false,
                Err(CompileError::Failed(format!(
                    "{SUBCOMMAND} was killed by signal 11: "
                ))),
            ),
            (
                "another exit",
                exited(1),
                secs(0),
                "wasm engine: nope",
                false,
                Err(CompileError::Failed(format!(
                    "{SUBCOMMAND} exited with exit status: 1: wasm engine: nope"
                ))),
            ),
        ];
        for (name, status, cpu, stderr, timed_out, want) in cases {
            assert_eq!(
                classify(status, cpu, stderr, &LIMITS, timed_out),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn messages_name_the_limit_and_its_flag() {
        for (hit, want) in [
            (
                CompileLimit::Cpu(Duration::from_secs(20)),
                "compile exceeded its CPU-time limit of 20s (--plugin-compile-cpu)",
            ),
            (
                CompileLimit::Memory(128 * MIB),
                "compile exceeded its memory limit of 128 MiB (--plugin-compile-memory)",
            ),
            (
                CompileLimit::Wall(Duration::from_secs(40)),
                "compile exceeded its wall-time limit of 40s (--plugin-compile-timeout)",
            ),
        ] {
            assert_eq!(hit.to_string(), want);
        }
        assert!(
            CompileLimit::OomKilled(128 * MIB)
                .to_string()
                .contains("out-of-memory killer")
        );
    }

    #[test]
    fn cpu_limit_rounds_up_to_whole_seconds() {
        let at = |ms| {
            CompileLimits {
                cpu: Duration::from_millis(ms),
                ..LIMITS
            }
            .cpu_secs()
        };
        assert_eq!((at(0), at(1), at(1000), at(1500)), (1, 1, 1, 2));
    }

    /// A stand-in for the child: a shell script, run with the real limits.
    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("child.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The limits reach the child, each end is classified, and only a child that cannot
    /// be started falls back to compiling in this process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_child_that_cannot_start_falls_back() {
        let engine = Engine::default();
        let d = tempfile::tempdir().unwrap();
        // The smallest component: header only. Compiles in process (and is no plugin).
        let component: Arc<[u8]> = Arc::from(&b"\0asm\x0d\0\x01\0"[..]);
        let compile = |exe: &Path, limits| {
            let compiler = script_compiler(exe, limits);
            let engine = engine.clone();
            let component = component.clone();
            async move { compiler.compile(&engine, component).await }
        };

        // No such executable, and one that is not executable: compiled here.
        let (artifact, stats) = compile(&d.path().join("nope"), LIMITS).await.unwrap();
        assert!(!artifact.is_empty() && stats.is_none());
        let not_executable = d.path().join("plain");
        std::fs::write(&not_executable, "").unwrap();
        assert!(compile(&not_executable, LIMITS).await.unwrap().1.is_none());

        // Killed by the CPU limit: burns CPU until RLIMIT_CPU (1 s) ends it.
        let short = CompileLimits {
            cpu: Duration::from_millis(500),
            wall: Duration::from_secs(30),
            ..LIMITS
        };
        let spin = script(d.path(), "while :; do :; done");
        let e = compile(&spin, short).await.unwrap_err();
        assert_eq!(e, CompileError::Limit(CompileLimit::Cpu(short.cpu)), "{e}");

        // The wall-time deadline: a child that sleeps is killed, and reaped.
        let quick = CompileLimits {
            wall: Duration::from_millis(300),
            ..LIMITS
        };
        let sleeper = script(d.path(), "exec sleep 30");
        let started = Instant::now();
        let e = compile(&sleeper, quick).await.unwrap_err();
        assert_eq!(
            e,
            CompileError::Limit(CompileLimit::Wall(quick.wall)),
            "{e}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );

        // Killed by someone else's SIGKILL, well within its CPU time: the OOM killer.
        let killed = script(d.path(), "kill -KILL $$");
        let e = compile(&killed, LIMITS).await.unwrap_err();
        assert_eq!(
            e,
            CompileError::Limit(CompileLimit::OomKilled(LIMITS.memory_bytes)),
            "{e}"
        );

        // Any other failure fails the plugin too, without a compile here.
        let crashed = script(d.path(), "echo boom >&2; exit 1");
        let e = compile(&crashed, LIMITS).await.unwrap_err();
        assert!(
            matches!(&e, CompileError::Failed(m) if m.contains("boom")),
            "{e}"
        );

        // The plugin's own compile error is passed on as it is.
        let invalid = script(
            d.path(),
            &format!("cat >/dev/null; echo 'no such type' >&2; exit {COMPILE_FAILED}"),
        );
        let e = compile(&invalid, LIMITS).await.unwrap_err();
        assert_eq!(e, CompileError::Invalid("no such type".into()));

        // An artifact past its cap (16 MiB for so small a component) stops the child.
        let flood = script(d.path(), "cat >/dev/null; exec head -c 20000000 /dev/zero");
        let e = compile(&flood, LIMITS).await.unwrap_err();
        assert_eq!(
            e,
            CompileError::Limit(CompileLimit::Artifact(MIN_ARTIFACT_BYTES)),
            "{e}"
        );

        // The limits are in force in the child.
        let report = script(
            d.path(),
            "cat >/dev/null; { ulimit -t; ulimit -d; ulimit -c; cat /proc/self/oom_score_adj; } >&2; exit 1",
        );
        let e = compile(&report, LIMITS).await.unwrap_err().to_string();
        assert!(e.ends_with(": 20\n131072\n0\n1000"), "{e}");
    }

    /// An abandoned compile (its task dropped) kills its child.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_compile_kills_its_child() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        let exe = script(
            d.path(),
            &format!("echo $$ > {}; exec sleep 30", pid_file.display()),
        );
        let compiler = script_compiler(&exe, LIMITS);
        let engine = Engine::default();
        let task =
            tokio::spawn(async move { compiler.compile(&engine, Arc::from(&b"\0asm"[..])).await });
        let pid: i32 = loop {
            if let Some(p) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        task.abort();
        let gone = async {
            // Reaped: no such process any more (not even a zombie).
            while std::fs::metadata(format!("/proc/{pid}")).is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .expect("the child outlived its abandoned compile");
    }
}
