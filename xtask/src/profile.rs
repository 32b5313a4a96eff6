//! The dev profile's per-crate optimisation levels, checked against the dependency graph.
//!
//! Dependencies build at `opt-level = 1` (fast enough for the operator, the emulators and
//! the tests, and much cheaper to compile than 3), with two kinds of exception named under
//! `[profile.dev.package]` in the root Cargo.toml: `opt-level = 3` for the plugin
//! compiler's hot path (cranelift's code generator and register allocator: at 0, a plugin
//! compile in the tests took seconds instead of half of one), and `opt-level = 0` for proc
//! macros and what only they use (they expand in milliseconds either way). The lists name
//! crates, so they can go wrong as dependencies move: a name that matches nothing any more
//! (a cold build slower again, or a compile slower, silently), an unoptimised crate that
//! some binary now links (slower at run time), an optimised one no binary links (build
//! time for nothing). [`check`] catches all three.

use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, BTreeSet};

/// The `[profile.dev.package]` exceptions to the dependencies' `"*"` level, by name or
/// `name@version`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Exceptions {
    /// `opt-level = 0`: crates that only run inside the compiler.
    pub unoptimised: Vec<String>,
    /// `opt-level = 3`: the plugin compiler's hot path.
    pub optimised: Vec<String>,
}

/// Reads the exceptions from the root manifest; any other kind of entry is an error, so
/// that nothing escapes the check.
pub fn exceptions(manifest: &str) -> Result<Exceptions> {
    let mut in_table = false;
    let mut found = Exceptions::default();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_table = line == "[profile.dev.package]";
            continue;
        }
        if !in_table || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("[profile.dev.package]: cannot read {line:?}");
        };
        let key = key.trim().trim_matches('"');
        if key == "*" {
            continue;
        }
        match value.replace(' ', "").as_str() {
            "{opt-level=0}" => found.unoptimised.push(key.to_string()),
            "{opt-level=3}" => found.optimised.push(key.to_string()),
            _ => bail!(
                "[profile.dev.package]: {key:?} = {}: only `{{ opt-level = 0 }}` and `{{ opt-level = 3 }}` exceptions are expected here",
                value.trim()
            ),
        }
    }
    Ok(found)
}

/// A package of the resolved graph, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// Splits `cargo metadata` (with dependencies, one platform) into the packages some
/// workspace binary or test links, and all the others (only ever run by the compiler).
pub fn linked_and_compile_time(
    meta: &serde_json::Value,
) -> Result<(BTreeSet<Package>, BTreeSet<Package>)> {
    let packages: BTreeMap<&str, Package> = meta["packages"]
        .as_array()
        .context("metadata.packages")?
        .iter()
        .filter_map(|p| {
            let package = Package {
                name: p["name"].as_str()?.into(),
                version: p["version"].as_str()?.into(),
            };
            Some((p["id"].as_str()?, package))
        })
        .collect();
    let proc_macros: BTreeSet<&str> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["targets"].as_array().into_iter().flatten().any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "proc-macro"))
            })
        })
        .filter_map(|p| p["id"].as_str())
        .collect();
    let nodes: BTreeMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .context("metadata.resolve.nodes: run cargo metadata without --no-deps")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .context("metadata.workspace_members")?
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    // Linked: reached from a member through normal or dev dependencies, never through a
    // build dependency or into a proc macro.
    let mut linked = BTreeSet::new();
    let mut todo: Vec<&str> = members
        .iter()
        .copied()
        .filter(|m| !proc_macros.contains(m))
        .collect();
    while let Some(id) = todo.pop() {
        if !linked.insert(id) {
            continue;
        }
        for dep in nodes
            .get(id)
            .and_then(|n| n["deps"].as_array())
            .into_iter()
            .flatten()
        {
            let runtime = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null() || k["kind"] == "dev");
            if let Some(pkg) = dep["pkg"].as_str()
                && runtime
                && !proc_macros.contains(pkg)
            {
                todo.push(pkg);
            }
        }
    }
    let mut linked_set = BTreeSet::new();
    let mut compile_time = BTreeSet::new();
    for (id, package) in &packages {
        if !nodes.contains_key(id) || members.contains(id) {
            continue;
        }
        if linked.contains(id) {
            linked_set.insert(package.clone());
        } else {
            compile_time.insert(package.clone());
        }
    }
    Ok((linked_set, compile_time))
}

fn matches(spec: &str, p: &Package) -> bool {
    match spec.split_once('@') {
        Some((name, version)) => p.name == name && p.version == version,
        None => p.name == spec,
    }
}

/// Every unoptimised spec matches a compile-time package and no linked one; every
/// optimised spec matches a linked package (optimising what no binary runs only costs
/// build time).
pub fn check(
    exceptions: &Exceptions,
    linked: &BTreeSet<Package>,
    compile_time: &BTreeSet<Package>,
) -> Result<()> {
    let mut problems = Vec::new();
    for spec in &exceptions.unoptimised {
        let slow: Vec<String> = linked
            .iter()
            .filter(|p| matches(spec, p))
            .map(|p| format!("{}@{}", p.name, p.version))
            .collect();
        if !slow.is_empty() {
            problems.push(format!(
                "{spec:?} is unoptimised but linked into a binary ({}): remove it from the list, or name only the compile-time version (name@version)",
                slow.join(", ")
            ));
        } else if !compile_time.iter().any(|p| matches(spec, p)) {
            problems.push(format!(
                "{spec:?} matches no package of the build any more: remove it from the list"
            ));
        }
    }
    for spec in &exceptions.optimised {
        if !linked.iter().any(|p| matches(spec, p)) {
            problems.push(format!(
                "{spec:?} is optimised but matches no package a binary links: remove it from the list"
            ));
        }
    }
    if !problems.is_empty() {
        bail!(
            "[profile.dev.package] in the root Cargo.toml:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn package(name: &str, version: &str) -> Package {
        Package {
            name: name.into(),
            version: version.into(),
        }
    }

    fn specs(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    /// The real manifest against the real graph: what keeps the lists honest as
    /// dependencies move.
    #[test]
    fn the_exceptions_match_what_the_binaries_link() {
        let ws = crate::workspace().unwrap();
        let manifest = std::fs::read_to_string(ws.root.join("Cargo.toml")).unwrap();
        let exceptions = exceptions(&manifest).unwrap();
        assert!(
            exceptions.unoptimised.iter().any(|s| s == "syn"),
            "the list is read: {exceptions:?}"
        );
        // At the dependencies' level 1, a plugin compile in the tests takes several times
        // as long: cranelift's code generator and register allocator must stay at 3.
        for hot in [
            "cranelift-codegen",
            "regalloc2",
            "wasmtime-internal-cranelift",
        ] {
            assert!(
                exceptions.optimised.iter().any(|s| s == hot),
                "{hot} is optimised: {exceptions:?}"
            );
        }
        let out =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .current_dir(&ws.root)
                .args(["metadata", "--format-version", "1"])
                .output()
                .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (linked, compile_time) = linked_and_compile_time(&meta).unwrap();
        assert!(
            linked.iter().any(|p| p.name == "wasmtime"),
            "the graph is read"
        );
        check(&exceptions, &linked, &compile_time).unwrap();
    }

    #[test]
    fn a_linked_vanished_or_unlinked_crate_is_named() {
        let linked = BTreeSet::from([package("serde", "1.0.0"), package("wasmparser", "0.254.2")]);
        let compile_time =
            BTreeSet::from([package("syn", "2.0.1"), package("wasmparser", "0.262.0")]);
        let good = Exceptions {
            unoptimised: specs(&["syn", "wasmparser@0.262.0"]),
            optimised: specs(&["wasmparser@0.254.2"]),
        };
        assert!(check(&good, &linked, &compile_time).is_ok());
        let bad = Exceptions {
            unoptimised: specs(&["serde", "wasmparser", "gone"]),
            optimised: specs(&["syn", "also-gone"]),
        };
        let err = check(&bad, &linked, &compile_time).unwrap_err().to_string();
        assert!(
            err.contains("\"serde\" is unoptimised but linked into a binary (serde@1.0.0)"),
            "{err}"
        );
        assert!(
            err.contains(
                "\"wasmparser\" is unoptimised but linked into a binary (wasmparser@0.254.2)"
            ),
            "{err}"
        );
        assert!(err.contains("\"gone\" matches no package"), "{err}");
        assert!(
            err.contains("\"syn\" is optimised but matches no package a binary links"),
            "{err}"
        );
        assert!(err.contains("\"also-gone\" is optimised"), "{err}");
    }

    #[test]
    fn reads_only_the_dev_package_table() {
        let manifest = "[profile.dev]\ndebug = 1\n[profile.dev.package]\n\"*\" = { opt-level = 1 }\n# c\nsyn = { opt-level = 0 }\n\"wit-parser@0.262.0\" = {opt-level=0}\nregalloc2 = { opt-level = 3 }\n[profile.plugin]\nx = 1\n";
        assert_eq!(
            exceptions(manifest).unwrap(),
            Exceptions {
                unoptimised: specs(&["syn", "wit-parser@0.262.0"]),
                optimised: specs(&["regalloc2"]),
            }
        );
        let err = exceptions("[profile.dev.package]\nsyn = { opt-level = 1 }\n").unwrap_err();
        assert!(
            err.to_string().contains("\"syn\" = { opt-level = 1 }"),
            "{err}"
        );
    }

    #[test]
    fn the_graph_split_follows_dependency_kinds() {
        let pkg = |id: &str, kind: &str| json!({"id": id, "name": id, "version": "1.0.0", "targets": [{"kind": [kind]}]});
        let dep =
            |id: &str, kind: serde_json::Value| json!({"pkg": id, "dep_kinds": [{"kind": kind}]});
        let meta = json!({
            "workspace_members": ["app"],
            "packages": [pkg("app", "bin"), pkg("lib", "lib"), pkg("derive", "proc-macro"), pkg("syn", "lib"), pkg("gen", "lib"), pkg("testlib", "lib")],
            "resolve": {"nodes": [
                {"id": "app", "deps": [dep("lib", serde_json::Value::Null), dep("derive", serde_json::Value::Null), dep("gen", json!("build")), dep("testlib", json!("dev"))]},
                {"id": "lib", "deps": []},
                {"id": "derive", "deps": [dep("syn", serde_json::Value::Null)]},
                {"id": "syn", "deps": []},
                {"id": "gen", "deps": []},
                {"id": "testlib", "deps": []},
            ]},
        });
        let (linked, compile_time) = linked_and_compile_time(&meta).unwrap();
        let names = |s: &BTreeSet<Package>| s.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&linked), ["lib", "testlib"]);
        assert_eq!(names(&compile_time), ["derive", "gen", "syn"]);
    }
}
