//! Where plugins are compiled to native code: in this process, or in a short-lived child
//! process running this same executable.
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
//! The child builds its engine from the same [`EngineOptions`], so the artifact fits the
//! parent's engine; wasmtime checks that again when the parent loads it, and a child that
//! cannot run or whose artifact does not fit falls back to compiling in process (said in
//! a warning), so a plugin never fails to load for this reason alone.

use super::engine::{self, EngineOptions};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use wasmtime::Engine;

/// Where [`compile`](Compiler::compile) runs.
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process (the library's default: tests and embedders).
    #[default]
    InProcess,
    /// In a child process: `exe compile-plugin` with the options the engine was built
    /// from (and whether it got the pooling allocator), the component on stdin, the
    /// artifact on stdout.
    Child {
        exe: PathBuf,
        opts: EngineOptions,
        pooling: bool,
    },
}

/// The hidden subcommand a [`Compiler::Child`] runs.
pub const SUBCOMMAND: &str = "compile-plugin";

impl Compiler {
    /// The running executable, to be run as `/proc/self/exe`: that still runs this build
    /// when the file on disk was replaced since.
    pub const THIS_EXECUTABLE: &str = "/proc/self/exe";

    /// The serialized artifact of `bytes` for `engine`.
    pub fn compile(&self, engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        if let Compiler::Child { exe, opts, pooling } = self {
            match in_child(exe, opts, *pooling, bytes) {
                Ok(artifact) => return Ok(artifact),
                Err(ChildError::Compile(message)) => return Err(wasmtime::Error::msg(message)),
                Err(ChildError::Spawn(e)) => {
                    tracing::warn!(exe = %exe.display(), error = %e, "cannot compile plugins in a child process; compiling in this one")
                }
            }
        }
        engine.precompile_component(bytes)
    }
}

#[derive(Debug, thiserror::Error)]
enum ChildError {
    /// The plugin does not compile (what the child said).
    #[error("{0}")]
    Compile(String),
    /// The child could not be run or did not answer.
    #[error("{0}")]
    Spawn(std::io::Error),
}

fn in_child(
    exe: &std::path::Path,
    opts: &EngineOptions,
    pooling: bool,
    bytes: &[u8],
) -> Result<Vec<u8>, ChildError> {
    let mut child = Command::new(exe)
        .arg(SUBCOMMAND)
        .args(args(opts, pooling))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ChildError::Spawn)?;
    // Feed stdin from a thread: a child that writes a large artifact before reading all of
    // its input would otherwise deadlock against us.
    let mut stdin = child.stdin.take().expect("piped");
    let input = bytes.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut artifact = Vec::new();
    let read = child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut artifact);
    let status = child.wait().map_err(ChildError::Spawn)?;
    let fed = feeder.join().unwrap_or(Ok(()));
    let errors = errors.join().unwrap_or_default();
    read.map_err(ChildError::Spawn)?;
    if status.code() == Some(COMPILE_FAILED) {
        return Err(ChildError::Compile(errors.trim().to_string()));
    }
    if !status.success() || artifact.is_empty() {
        return Err(ChildError::Spawn(std::io::Error::other(format!(
            "{SUBCOMMAND} exited with {status}: {}",
            errors.trim()
        ))));
    }
    fed.map_err(ChildError::Spawn)?;
    Ok(artifact)
}

/// The engine options on the child's command line.
fn args(opts: &EngineOptions, pooling: bool) -> Vec<String> {
    vec![
        format!("--max-instances={}", opts.max_instances),
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

/// Runs the child's side of [`Compiler::Child`]; the exit code to end with.
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
