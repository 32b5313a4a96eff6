//! Logging setup shared by the binary and the tests.
//!
//! The wasmtime crates log guest I/O at debug and trace level — including the bytes a plugin
//! writes to stdout and the arguments of host calls. Those bytes can hold a plugin's secrets
//! or a Proxy's cloud-init before our redaction sees them, so their levels are capped here
//! whatever `RUST_LOG` asks for. The sentinel tests run with this same filter.

use tracing_subscriber::EnvFilter;

/// Crates whose debug/trace output can carry guest data.
const CAPPED: &[&str] = &[
    "wasmtime",
    "wasmtime_wasi",
    "wasmtime_wasi_http",
    "wasmtime_wasi_io",
    "cranelift",
    "wasmtime_internal",
];

/// Builds the log filter from a `RUST_LOG`-style string, dropping any directive that would
/// open the capped crates and capping them at `warn`.
pub fn env_filter(spec: &str) -> EnvFilter {
    let kept: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !CAPPED.iter().any(|c| d.starts_with(c)))
        .collect();
    let mut directives = kept.join(",");
    for c in CAPPED {
        if !directives.is_empty() {
            directives.push(',');
        }
        directives.push_str(c);
        directives.push_str("=warn");
    }
    EnvFilter::new(directives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_wasmtime_whatever_the_user_asks() {
        let f = env_filter("debug,wasmtime_wasi=trace,proxy_operator=trace").to_string();
        assert!(!f.contains("wasmtime_wasi=trace"), "{f}");
        assert!(
            f.contains("wasmtime_wasi=warn")
                && f.contains("proxy_operator=trace")
                && f.contains("debug"),
            "{f}"
        );
    }
}
