//! `cargo xtask demo [-- DEMO ARGS]`: the README's first command.
//!
//! Builds the plugins and the binaries the demo runs, then replaces itself with the demo
//! driver (`egress-demo`, crate `demo/`), so Ctrl-C and the exit status are the driver's
//! own. Only the two binaries the demo runs are built (debug profile, the operator with the
//! features the demo driver's dependency turns on, as in the test build): on a fresh
//! machine the first demo does not wait for the test binaries, and `cargo xtask test`
//! afterwards reuses every dependency but the few its dev-dependencies change.

use anyhow::{Context, Result, bail};
use std::os::unix::process::CommandExt;

#[derive(clap::Args)]
pub struct Args {
    /// Arguments for the demo driver, e.g. `--keep-running` or `--builtin-proxy`
    /// (`cargo xtask demo --help-demo` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub demo_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    // The plugins as they ship, `wasm-opt -Oz` on each provider (13 to 14% smaller), as
    // `cargo xtask test` builds them; without binaryen (not root, no apt) the demo still
    // runs, with larger plugins, and says so.
    crate::test::ensure_package(
        "wasm-opt",
        "binaryen",
        "the plugins at their shipped size",
        false,
    )?;
    crate::build_plugins::run(&crate::build_plugins::Args::default())?;
    let ws = crate::workspace()?;
    let bin = crate::binaries::build(&ws)?;
    let (operator, demo) = (bin.join("proxy-operator"), bin.join("egress-demo"));
    for b in [&operator, &demo] {
        if !b.is_file() {
            bail!("{} was not built", b.display());
        }
    }
    let mut driver_args: Vec<String> = args.demo_args.clone();
    if let Some(i) = driver_args.iter().position(|a| a == "--help-demo") {
        driver_args[i] = "--help".into();
    }
    let err = std::process::Command::new(&demo)
        .current_dir(&ws.root)
        .arg("--operator-bin")
        .arg(&operator)
        .arg("--plugin-dir")
        .arg(ws.target_dir.join("plugins"))
        .arg("--samples")
        .arg(ws.root.join("config/samples/demo"))
        .arg("--crds")
        .arg(ws.root.join("config/crd"))
        .arg("--workdir")
        .arg(ws.target_dir.join("demo"))
        .args(&driver_args)
        .exec();
    Err(err).with_context(|| format!("starting {}", demo.display()))
}
