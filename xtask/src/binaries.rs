//! The operator and the demo driver, built once as the tests build them: the demo runs
//! them, and `build-plugins --push` runs the operator's `plugin push`.

use anyhow::{Context, Result, bail};

/// The binaries the demo runs. The operator gets `test-support` through `egress-demo`'s
/// dependency on it, exactly as in `cargo test --workspace`, so both builds share it.
const BUILD_ARGS: &[&str] = &[
    "build",
    "--quiet",
    "-p",
    "proxy-operator",
    "-p",
    "egress-demo",
    "--bin",
    "proxy-operator",
    "--bin",
    "egress-demo",
];

/// Builds the operator and the demo driver as the tests do (same features, so the same
/// artifacts); the directory holding them.
pub fn build(ws: &crate::Workspace) -> Result<std::path::PathBuf> {
    println!("building the operator and the demo driver (debug profile)");
    let status = crate::cargo()
        .current_dir(&ws.root)
        .args(BUILD_ARGS)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building the binaries failed ({status})");
    }
    Ok(ws.target_dir.join("debug"))
}
