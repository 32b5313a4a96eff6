//! What the tests that run the whole stack share.

use std::path::PathBuf;

/// Skips a test with a message; under `CI=true` a skip is a failure.
pub fn skip(msg: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPING: {msg}\n");
}

/// The plugin directory (`EGRESS_PLUGIN_DIR`, set by `cargo xtask test`), the driver
/// (`demo`, the test's `CARGO_BIN_EXE_egress-demo`) and the operator binary next to it
/// (built by the same `cargo test --workspace`); `None` after skipping without them.
pub fn binaries(demo: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
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
    Some((plugins, demo, operator))
}
