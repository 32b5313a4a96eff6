//! The crate graph's one rule: the plugin runtime (`egress-plugin-host`) depends on no
//! Kubernetes crate, so it can be embedded, tested and reviewed without the operator; the
//! operator depends on it, never the reverse.

use anyhow::{Context, Result, bail};

/// Crates the runtime must never link, directly or through another dependency.
const FORBIDDEN: &[&str] = &[
    "kube",
    "kube-client",
    "kube-runtime",
    "kube-core",
    "k8s-openapi",
];

/// The runtime's normal dependencies, one crate name per line (`cargo tree`).
fn runtime_dependencies() -> Result<Vec<String>> {
    let out = crate::cargo()
        .args([
            "tree",
            "-p",
            "egress-plugin-host",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"])
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// The forbidden crates among `deps`, and whether the operator appears (a reversed edge).
fn violations(deps: &[String]) -> Vec<String> {
    deps.iter()
        .filter(|d| FORBIDDEN.contains(&d.as_str()) || d.as_str() == "proxy-operator")
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_runtime_depends_on_no_kubernetes_crate_nor_on_the_operator() {
        let deps = runtime_dependencies().unwrap();
        assert!(
            deps.iter().any(|d| d == "wasmtime"),
            "cargo tree did not list the runtime's dependencies: {deps:?}"
        );
        let bad = violations(&deps);
        assert!(
            bad.is_empty(),
            "egress-plugin-host must not depend on {bad:?}: move the code that needs them to the operator"
        );
    }

    #[test]
    fn the_rule_names_each_forbidden_crate() {
        let deps: Vec<String> = [
            "tokio",
            "kube-runtime",
            "k8s-openapi",
            "proxy-operator",
            "kube-runtime",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            violations(&deps),
            ["k8s-openapi", "kube-runtime", "proxy-operator"]
        );
    }
}
