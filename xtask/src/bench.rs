//! `cargo xtask bench`: builds the plugins, runs the plugin runtime benchmark in release,
//! and records its table in docs/benchmarks.md.

use anyhow::{Context, Result, bail};

pub fn run() -> Result<()> {
    crate::build_plugins::run(&crate::build_plugins::Args { configmap: None })?;
    let ws = crate::workspace()?;
    let json = ws.target_dir.join("bench-runtime.json");
    let out = crate::cargo()
        .current_dir(&ws.root)
        .env("EGRESS_PLUGIN_DIR", ws.target_dir.join("plugins"))
        .args(["bench", "-p", "proxy-operator", "--bench", "runtime", "--"])
        .arg("--json")
        .arg(&json)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the benchmark")?;
    if !out.status.success() {
        bail!("benchmark failed ({})", out.status);
    }
    let table = String::from_utf8_lossy(&out.stdout);
    print!("{table}");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let doc = format!(
        "# Benchmarks\n\nWritten by `cargo xtask bench` (release build) on a {cores}-core machine, load average at the end: {}. \
Absolute figures move with machine load; compare the columns of one run, not runs.\n\n{table}\nRaw figures: `target/bench-runtime.json`.\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let path = ws.root.join("docs/benchmarks.md");
    std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
    println!("\nwrote {}", path.display());
    Ok(())
}
