//! Project automation, run as `cargo xtask <command>` (an alias in .cargo/config.toml), so
//! that CI and developers run the same steps without a Makefile or shell scripts. Each
//! command lives in its own module.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::Command;

mod bench;
mod binaries;
mod build_plugins;
mod configmaps;
mod demo;
mod docs;
mod e2e;
mod image;
// A check of the crate graph (the plugin runtime knows no Kubernetes), run by the tests only.
#[cfg(test)]
mod layering;
mod lint;
mod moto;
// A check of the root manifest, run by the tests only.
#[cfg(test)]
mod profile;
mod scale;
mod test;
mod wasm_opt;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "egress-proxies-operator project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build every provider plugin under providers-wasm/ to <target>/plugins/.
    BuildPlugins(build_plugins::Args),
    /// The local demo: plugins, operator, in-memory Kubernetes API and emulators whose
    /// instances are real proxies on 127.0.0.1; the whole story, then exit (README's first
    /// command). `cargo xtask demo --keep-running` stays up until Ctrl-C.
    Demo(demo::Args),
    /// Install test prerequisites, build the plugins, run every test (what CI runs).
    Test(test::Args),
    /// Run the operator against the current kube context (kind or k3d) with the Hetzner
    /// emulator: create, Ready, discovery API, replace, GC, delete. Skips (successfully,
    /// with a message) when no cluster is reachable.
    E2e(e2e::Args),
    /// The operator's container image, from scratch: the release binary, the libraries it
    /// links, CA roots and a nonroot user (podman).
    Image(image::Args),
    /// Run the plugin runtime benchmark (release) and write its section of
    /// docs/benchmarks.md.
    Bench,
    /// The operator at scale (release): N Proxies against the in-memory API and the
    /// emulators with their rate limits on, time-compressed; time to Running, steady-state
    /// backend and API requests, drift latency, RSS, reconcile p99, the sandbox's price.
    /// Writes its section of docs/benchmarks.md.
    Scale(scale::Args),
    /// Start a moto EC2 server as `cargo xtask test` does, print its env vars, run until
    /// Ctrl-C (for running the moto test on its own).
    Moto(moto::Args),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::BuildPlugins(args) => build_plugins::run(&args),
        Cmd::Demo(args) => demo::run(&args),
        Cmd::Test(args) => test::run(&args),
        Cmd::E2e(args) => e2e::run(&args),
        Cmd::Image(args) => image::run(&args),
        Cmd::Bench => bench::run(),
        Cmd::Scale(args) => scale::run(&args),
        Cmd::Moto(args) => moto::run(&args),
    }
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), so nested builds use the same
/// toolchain.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// What `cargo metadata` says about the workspace: the root, the target directory (which
/// honours `CARGO_TARGET_DIR` and cargo config) and the member packages.
pub struct Workspace {
    pub root: PathBuf,
    pub target_dir: PathBuf,
    pub packages: Vec<serde_json::Value>,
}

pub fn workspace() -> Result<Workspace> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let path = |key: &str| -> Result<PathBuf> {
        meta[key]
            .as_str()
            .map(PathBuf::from)
            .with_context(|| format!("cargo metadata has no {key}"))
    };
    Ok(Workspace {
        root: path("workspace_root")?,
        target_dir: path("target_directory")?,
        packages: meta["packages"].as_array().cloned().unwrap_or_default(),
    })
}
