//! The crate graph's one rule: the plugin runtime (`egress-plugin-host`) depends on no
//! Kubernetes crate, so it can be embedded, tested and reviewed without the operator; the
//! operator depends on it, never the reverse. And the host names no plugin: what differs
//! between backends is what a plugin declares about itself (`plugin-info`), never a table
//! in the host keyed by a plugin's name (the default budgets were one, until contract 0.2.0).

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

/// The runtime's top-level modules, bottom layer first: each may use only those of lower
/// layers (`crate::<module>` outside comments), so there is no import loop between them.
const RUNTIME_LAYERS: &[&[&str]] = &[
    &["fdlimit", "policy", "redact"],
    &["sensitive"],
    &["provider"],
    &["rate"],
    &["config"],
    &["plugin"],
];

/// The uses of `crate::<module>` in `dir/<module>` (a file or a folder) that break
/// [`RUNTIME_LAYERS`]: (user, used). Test modules may use any layer.
fn layer_violations(src: &std::path::Path) -> Vec<(String, String)> {
    let layer_of = |m: &str| RUNTIME_LAYERS.iter().position(|l| l.contains(&m));
    let mut bad = Vec::new();
    for (layer, modules) in RUNTIME_LAYERS.iter().enumerate() {
        for m in *modules {
            let mut files = Vec::new();
            let file = src.join(format!("{m}.rs"));
            if file.is_file() {
                files.push(file);
            }
            let mut stack = vec![src.join(m)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        files.push(p);
                    }
                }
            }
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                for line in code.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
                    for part in line.split("crate::").skip(1) {
                        let used: String = part
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if used != *m
                            && layer_of(&used).is_some_and(|l| l >= layer)
                            && !bad.contains(&(m.to_string(), used.clone()))
                        {
                            bad.push((m.to_string(), used));
                        }
                    }
                }
            }
        }
    }
    bad
}

/// The type names the shipped plugins declare (`PluginInfo::new("<name>", ...)`).
fn shipped_type_names(root: &std::path::Path) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for lib in glob_libs(&root.join("providers-wasm")) {
        let text = std::fs::read_to_string(&lib).unwrap_or_default();
        for part in text.split("PluginInfo::new(\"").skip(1) {
            if let Some(name) = part.split('"').next() {
                names.insert(name.to_string());
            }
        }
    }
    names.into_iter().collect()
}

fn glob_libs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "lib.rs") {
                out.push(p);
            }
        }
    }
    out
}

/// Where `text` decides something by a plugin's name: a match arm or a comparison on the
/// quoted name (what `shipped_default` was: `"hetzner" => Some(...)`). Test modules are
/// left out: tests name their fixtures.
fn decisions_by_name(text: &str, names: &[String]) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("//") {
            continue;
        }
        for name in names {
            let q = format!("\"{name}\"");
            if line.contains(&format!("{q} =>"))
                || line.contains(&format!("{q} |"))
                || line.contains(&format!("== {q}"))
                || line.contains(&format!("{q} =="))
            {
                found.push(format!("line {}: {line}", n + 1));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_decides_nothing_by_a_plugins_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let names = shipped_type_names(&root);
        assert!(
            names.len() >= 8 && names.iter().any(|n| n == "hetzner"),
            "the shipped plugins' names were not found: {names:?}"
        );
        let mut bad = Vec::new();
        for src in ["plugin-host/src", "host/src"] {
            let mut stack = vec![root.join(src)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        let text = std::fs::read_to_string(&p).unwrap();
                        for f in decisions_by_name(&text, &names) {
                            bad.push(format!("{}: {f}", p.display()));
                        }
                    }
                }
            }
        }
        assert!(
            bad.is_empty(),
            "the host decides by a plugin's name; declare it in plugin-info instead:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn the_runtime_modules_stand_in_layers_without_loops() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-host/src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        for m in RUNTIME_LAYERS.iter().flat_map(|l| l.iter()) {
            assert!(
                lib.contains(&format!("pub mod {m};")),
                "{m} is not a module of lib.rs"
            );
        }
        let bad = layer_violations(&src);
        assert!(
            bad.is_empty(),
            "a runtime module uses one of its own layer or above (user, used): {bad:?}"
        );
    }

    /// The layer check sees a use upward (the loop config -> plugin -> config it replaced).
    #[test]
    fn a_use_upward_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("config")).unwrap();
        std::fs::write(
            dir.path().join("config/fit.rs"),
            "// crate::plugin in a comment is fine\npub const L: u64 = crate::plugin::MAX_LIFT_BYTES as u64;\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("policy.rs"),
            "use crate::sensitive::Full;\n",
        )
        .unwrap();
        assert_eq!(
            layer_violations(dir.path()),
            [
                ("policy".to_string(), "sensitive".to_string()),
                ("config".to_string(), "plugin".to_string())
            ]
        );
    }

    /// Every `pub mod` of every crate's `lib.rs` says in one line what it is: the map a
    /// reader starts from.
    #[test]
    fn every_public_module_of_a_crate_has_a_doc_line() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut missing = Vec::new();
        for e in std::fs::read_dir(&root).unwrap().flatten() {
            let lib = e.path().join("src/lib.rs");
            let Ok(text) = std::fs::read_to_string(&lib) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                if l.starts_with("pub mod ") && l.ends_with(';') {
                    let doc = lines[..i]
                        .iter()
                        .rev()
                        .find(|p| !p.starts_with("#["))
                        .is_some_and(|p| p.starts_with("///"));
                    if !doc {
                        missing.push(format!("{}: {l}", lib.display()));
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "undocumented modules:\n{}",
            missing.join("\n")
        );
    }

    /// The check finds the table it replaced, and passes over tests and comments.
    #[test]
    fn a_table_keyed_by_plugin_names_is_found() {
        let names = ["hetzner".to_string(), "ec2".to_string()];
        let table = "fn shipped_default(t: &str) -> Option<Spec> {\n    match t {\n        \"hetzner\" => Some(a),\n        \"ec2\" | \"gce\" => None,\n        _ if t == \"hetzner\" => None,\n    }\n}\n// \"hetzner\" => a comment\n#[cfg(test)]\nmod tests { \"hetzner\" => 1 }\n";
        let found = decisions_by_name(table, &names);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("line 3:"), "{found:?}");
    }

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
