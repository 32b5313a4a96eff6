//! What the tests that run the whole stack share.

use std::path::PathBuf;
use std::process::Command;

/// Skips a test with a message; under `CI=true` a skip is a failure.
pub fn skip(msg: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPING: {msg}\n");
}

/// The driver (`demo`, the test's `CARGO_BIN_EXE_egress-demo`) set up to run the operator
/// binary next to it (built by the same `cargo test --workspace`) with the plugins of
/// `EGRESS_PLUGIN_DIR` (set by `cargo xtask test`), from the workspace root, working in a
/// fresh temp directory named after `label` (also returned). `None` after skipping
/// without them.
pub fn driver(demo: &str, label: &str) -> Option<(Command, PathBuf)> {
    let Some(plugins) = std::env::var_os("EGRESS_PLUGIN_DIR").map(PathBuf::from) else {
        skip("EGRESS_PLUGIN_DIR is not set (cargo xtask test sets it)");
        return None;
    };
    let demo = PathBuf::from(demo);
    let operator = demo.with_file_name("proxy-operator");
    if !operator.is_file() {
        skip(&format!("{} is not built", operator.display()));
        return None;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let work = std::env::temp_dir().join(format!("{label}-{}", std::process::id()));
    let mut cmd = Command::new(&demo);
    cmd.current_dir(&root)
        .arg("--operator-bin")
        .arg(&operator)
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--workdir")
        .arg(&work);
    Some((cmd, work))
}
