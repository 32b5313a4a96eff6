//! `cargo xtask bench`: builds the plugins, runs the plugin runtime benchmark in release,
//! and records its table in its section of docs/benchmarks.md (`cargo xtask scale` owns
//! another).

use anyhow::{Context, Result, bail};

pub fn run() -> Result<()> {
    crate::build_plugins::run(&crate::build_plugins::Args::default())?;
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
    let body = format!(
        "{table}\nWritten by `cargo xtask bench` (release build) {}.\n\nRaw figures: `target/bench-runtime.json`.\n",
        crate::docs::machine()
    );
    let path = ws.root.join("docs/benchmarks.md");
    crate::docs::update_file(&path, crate::docs::TITLE, "runtime", &body)?;
    println!("\nwrote {}", path.display());
    Ok(())
}
