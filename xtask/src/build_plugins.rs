//! `cargo xtask build-plugins [--configmap FILE]`
//!
//! Builds every crate under `providers-wasm/` for wasm32-wasip2 with the `plugin`
//! profile, and lays the components out the way the host loads them: real providers in
//! `<target>/plugins/`, testing plugins in `<target>/plugins/testing/`. The size limits
//! exist because plugins ship in a ConfigMap (1 MiB in total) and are compiled at every
//! operator start: a provider that outgrows 512 KiB has pulled in something it should
//! not have.

use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "plugin";
/// A real provider at or above this size fails the build.
pub const MAX_PLUGIN_BYTES: u64 = 512 * 1024;
/// Kubernetes' limit on the data of one ConfigMap (keys plus values).
pub const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024;
pub const CONFIGMAP_NAME: &str = "proxy-operator-plugins";

#[derive(clap::Args)]
pub struct Args {
    /// Also write a ConfigMap manifest holding every real provider (not the testing ones),
    /// e.g. `config/release/plugins.yaml`, which `kubectl apply --server-side -k
    /// config/release` deploys in place of the empty placeholder.
    #[arg(long, value_name = "FILE")]
    pub configmap: Option<PathBuf>,
}

/// One plugin crate found in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    /// The package name, also the output file stem (`future-version.wasm`).
    pub name: String,
    /// The cdylib target name, which is what rustc names the artifact.
    pub lib_name: String,
    pub testing: bool,
}

pub fn run(args: &Args) -> Result<()> {
    ensure_target()?;
    let ws = crate::workspace()?;
    let plugins = find_plugins(&ws.root, &ws.packages);
    ensure!(
        !plugins.is_empty(),
        "no plugin crates under providers-wasm/"
    );

    let out_dir = ws.target_dir.join("plugins");
    let testing_dir = out_dir.join("testing");
    std::fs::create_dir_all(&testing_dir)
        .with_context(|| format!("creating {}", testing_dir.display()))?;
    // A plugin whose crate was removed must not linger where the host loads plugins.
    remove_wasm_files(&out_dir)?;
    remove_wasm_files(&testing_dir)?;

    // One cargo invocation per plugin, each copied out before the next starts: in a shared
    // invocation cargo unifies the features of every package it builds, so a plugin that
    // wraps another with its export turned off (testing/broken) would turn it back on for
    // both; and building the wrapper rewrites the wrapped crate's own artifact.
    let artifacts = ws.target_dir.join(TARGET).join(PROFILE);
    let mut built = Vec::new();
    for p in &plugins {
        // `rustc --crate-type cdylib`: a plugin crate that is also an rlib (hetzner, which
        // testing/broken wraps) would otherwise be built without LTO, ~20% larger.
        run_checked(crate::cargo().current_dir(&ws.root).args([
            "rustc",
            "--target",
            TARGET,
            "--profile",
            PROFILE,
            "-p",
            &p.name,
            "--crate-type",
            "cdylib",
        ]))?;
        let src = artifacts.join(format!("{}.wasm", p.lib_name));
        let dst = if p.testing { &testing_dir } else { &out_dir }.join(format!("{}.wasm", p.name));
        std::fs::copy(&src, &dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        let size = std::fs::metadata(&dst)?.len();
        println!(
            "{:<40} {:>9.1} KiB ({size} bytes){}",
            dst.strip_prefix(&ws.target_dir).unwrap_or(&dst).display(),
            size as f64 / 1024.0,
            if p.testing { "  [testing]" } else { "" }
        );
        built.push((p.clone(), dst));
    }

    let sizes: Vec<(&Plugin, u64)> = built
        .iter()
        .map(|(p, path)| Ok((p, std::fs::metadata(path)?.len())))
        .collect::<Result<_>>()?;
    check_sizes(&sizes)?;

    if let Some(file) = &args.configmap {
        let mut entries = Vec::new();
        for (p, path) in built.iter().filter(|(p, _)| !p.testing) {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            entries.push((format!("{}.wasm", p.name), bytes));
        }
        let manifest = configmap_yaml(&entries)?;
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(file, manifest).with_context(|| format!("writing {}", file.display()))?;
        let total: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        println!(
            "wrote ConfigMap {CONFIGMAP_NAME} to {} ({} plugins, {total} of {MAX_CONFIGMAP_BYTES} bytes); \
             deploy it with `kubectl apply --server-side` (client-side apply would copy it \
             into an annotation, which is limited to 256 KiB)",
            file.display(),
            entries.len()
        );
    }
    Ok(())
}

/// Plugin crates are the cdylib packages under `providers-wasm/`, and library packages
/// there marked `[package.metadata.egress] plugin = true`; those under
/// `providers-wasm/testing/` are testing plugins. Sorted by name for stable output.
pub fn find_plugins(root: &Path, packages: &[serde_json::Value]) -> Vec<Plugin> {
    let providers = root.join("providers-wasm");
    let testing = providers.join("testing");
    let mut plugins: Vec<Plugin> = packages
        .iter()
        .filter_map(|pkg| {
            let manifest = Path::new(pkg["manifest_path"].as_str()?);
            if !manifest.starts_with(&providers) {
                return None;
            }
            // A cdylib, or a library that says it is a plugin (one other plugins wrap).
            let marked = pkg["metadata"]["egress"]["plugin"] == true;
            let lib = pkg["targets"].as_array()?.iter().find(|t| {
                t["kind"].as_array().is_some_and(|k| {
                    k.iter()
                        .any(|k| k == "cdylib" || (marked && (k == "lib" || k == "rlib")))
                })
            })?;
            Some(Plugin {
                name: pkg["name"].as_str()?.to_string(),
                lib_name: lib["name"].as_str()?.replace('-', "_"),
                testing: manifest.starts_with(&testing),
            })
        })
        .collect();
    plugins.sort_by(|a, b| (a.testing, &a.name).cmp(&(b.testing, &b.name)));
    plugins
}

/// Fails when a real provider is at or over [`MAX_PLUGIN_BYTES`], naming each one.
/// Testing plugins are exempt: some are deliberately odd.
pub fn check_sizes(sizes: &[(&Plugin, u64)]) -> Result<()> {
    let too_big: Vec<String> = sizes
        .iter()
        .filter(|(p, size)| !p.testing && *size >= MAX_PLUGIN_BYTES)
        .map(|(p, size)| format!("{}.wasm is {size} bytes", p.name))
        .collect();
    if !too_big.is_empty() {
        bail!(
            "provider plugins must stay under {MAX_PLUGIN_BYTES} bytes (512 KiB): {}",
            too_big.join(", ")
        );
    }
    Ok(())
}

/// A ConfigMap manifest carrying each `(file name, bytes)` as base64 `binaryData`.
///
/// Refuses when keys plus decoded values exceed [`MAX_CONFIGMAP_BYTES`], the limit the
/// API server applies, so the failure shows at build time instead of at `kubectl apply`.
pub fn configmap_yaml(entries: &[(String, Vec<u8>)]) -> Result<String> {
    let total: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_CONFIGMAP_BYTES {
        let parts: Vec<String> = entries
            .iter()
            .map(|(k, v)| format!("{k}: {} bytes", v.len()))
            .collect();
        bail!(
            "ConfigMap {CONFIGMAP_NAME} would hold {total} bytes ({}), over the \
             {MAX_CONFIGMAP_BYTES}-byte (1 MiB) ConfigMap limit; ship some providers \
             in a second ConfigMap or an image volume",
            parts.join(", ")
        );
    }
    let mut sorted: Vec<&(String, Vec<u8>)> = entries.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    out.push_str("# Generated by `cargo xtask build-plugins --configmap`; do not edit.\n");
    out.push_str("# Apply with `kubectl apply --server-side` (too big for client-side apply).\n");
    out.push_str("apiVersion: v1\nkind: ConfigMap\nmetadata:\n");
    out.push_str(&format!("  name: {CONFIGMAP_NAME}\n"));
    out.push_str("  labels:\n    app.kubernetes.io/name: proxy-operator\n");
    if sorted.is_empty() {
        out.push_str("binaryData: {}\n");
    } else {
        out.push_str("binaryData:\n");
        for (name, bytes) in sorted {
            ensure!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')),
                "{name:?} is not a valid ConfigMap key"
            );
            out.push_str(&format!(
                "  {name}: {}\n",
                data_encoding::BASE64.encode(bytes)
            ));
        }
    }
    Ok(out)
}

fn ensure_target() -> Result<()> {
    let listed = match Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        // Without rustup the toolchain was set up some other way; let cargo report a
        // missing target itself.
        _ => {
            eprintln!("rustup not available; assuming {TARGET} is installed");
            return Ok(());
        }
    };
    if listed.lines().any(|l| l.trim() == TARGET) {
        return Ok(());
    }
    println!("installing the {TARGET} target with rustup");
    run_checked(Command::new("rustup").args(["target", "add", TARGET]))
}

fn remove_wasm_files(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "wasm") {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed with {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plugin(name: &str, testing: bool) -> Plugin {
        Plugin {
            name: name.into(),
            lib_name: name.replace('-', "_"),
            testing,
        }
    }

    #[test]
    fn configmap_holds_base64_of_each_entry() {
        let entries = vec![
            ("zeta.wasm".to_string(), b"\0asm-zeta".to_vec()),
            (
                "example.wasm".to_string(),
                vec![0, 97, 115, 109, 1, 0, 0, 0],
            ),
        ];
        let yaml = configmap_yaml(&entries).unwrap();
        assert!(yaml.contains("kind: ConfigMap\n"));
        assert!(yaml.contains("  name: proxy-operator-plugins\n"));
        let lines: Vec<&str> = yaml
            .lines()
            .skip_while(|l| *l != "binaryData:")
            .skip(1)
            .collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("  example.wasm: "),
            "sorted: {lines:?}"
        );
        for (line, (name, bytes)) in lines.iter().zip([&entries[1], &entries[0]]) {
            let (key, value) = line.trim().split_once(": ").unwrap();
            assert_eq!(key, name);
            assert_eq!(
                &data_encoding::BASE64.decode(value.as_bytes()).unwrap(),
                bytes
            );
        }
    }

    /// Where the release overlay expects the generated ConfigMap (git-ignored).
    const RELEASE_CONFIGMAP: &str = "config/release/plugins.yaml";

    /// Copies the directory tree `from` into `to` (files only, no links).
    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let dst = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &dst);
            } else {
                std::fs::copy(entry.path(), dst).unwrap();
            }
        }
    }

    /// The generated ConfigMap, written where the release overlay expects it, renders in
    /// place of the default overlay's empty placeholder, in the operator's namespace.
    #[test]
    fn release_overlay_renders_the_generated_configmap() {
        let kubectl = Command::new("kubectl")
            .args(["version", "--client"])
            .output();
        if kubectl.is_err() {
            let msg = "kubectl is not installed; it renders config/release in this test";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("\n!!! SKIPPING: {msg}\n");
            return;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let tmp = std::env::temp_dir().join(format!("xtask-release-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        copy_tree(&root.join("config"), &tmp.join("config"));
        let entries = vec![
            ("hetzner.wasm".to_string(), b"\0asm-hetzner".to_vec()),
            ("ec2.wasm".to_string(), b"\0asm-ec2".to_vec()),
        ];
        let cm = tmp.join(RELEASE_CONFIGMAP);
        std::fs::write(&cm, configmap_yaml(&entries).unwrap()).unwrap();
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(tmp.join("config/release"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            out.status.success(),
            "kubectl kustomize config/release: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<&str> = text
            .split("\n---\n")
            .filter(|d| {
                d.contains(&format!("name: {CONFIGMAP_NAME}\n")) && d.contains("kind: ConfigMap")
            })
            .collect();
        assert_eq!(docs.len(), 1, "one plugins ConfigMap: {text}");
        let doc = docs[0];
        assert!(doc.contains("namespace: egress-system"), "{doc}");
        for (name, bytes) in &entries {
            let line = format!("  {name}: {}", data_encoding::BASE64.encode(bytes));
            assert!(doc.contains(&line), "{line} missing from {doc}");
        }
    }

    #[test]
    fn configmap_refuses_over_one_mebibyte() {
        // Exactly at the limit (keys count too) is accepted.
        let key = "a.wasm".to_string();
        let fits = vec![(key.clone(), vec![0u8; MAX_CONFIGMAP_BYTES - key.len()])];
        assert!(configmap_yaml(&fits).is_ok());

        let over = vec![
            (key, vec![0u8; 600 * 1024]),
            ("b.wasm".to_string(), vec![0u8; 500 * 1024]),
        ];
        let err = configmap_yaml(&over).unwrap_err().to_string();
        let total = 600 * 1024 + 500 * 1024 + 12;
        assert!(err.contains(&format!("{total} bytes")), "{err}");
        assert!(err.contains("1048576"), "{err}");
    }

    #[test]
    fn configmap_rejects_bad_keys() {
        let entries = vec![("../x.wasm".to_string(), vec![1])];
        assert!(configmap_yaml(&entries).is_err());
    }

    #[test]
    fn size_check_applies_to_real_providers_only() {
        let (real, testing) = (plugin("example", false), plugin("hostile", true));
        assert!(check_sizes(&[(&real, MAX_PLUGIN_BYTES - 1), (&testing, 10 << 20)]).is_ok());
        let err = check_sizes(&[(&real, MAX_PLUGIN_BYTES)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("example.wasm is 524288 bytes"), "{err}");
    }

    #[test]
    fn finds_plugins_by_location_and_kind() {
        let root = Path::new("/ws");
        let pkg = |name: &str, dir: &str, kind: &str| {
            json!({
                "name": name,
                "manifest_path": format!("/ws/{dir}/Cargo.toml"),
                "targets": [{"name": name.replace('-', "_"), "kind": [kind]}],
            })
        };
        let packages = vec![
            pkg("proxy-operator", "host", "lib"),
            pkg("hostile", "providers-wasm/testing/hostile", "cdylib"),
            pkg("example", "providers-wasm/example", "cdylib"),
            pkg(
                "future-version",
                "providers-wasm/testing/future-version",
                "cdylib",
            ),
            pkg("helper", "providers-wasm/helper", "lib"),
            {
                let mut p = pkg("wrapped", "providers-wasm/wrapped", "lib");
                p["metadata"] = json!({"egress": {"plugin": true}});
                p
            },
        ];
        assert_eq!(
            find_plugins(root, &packages),
            vec![
                plugin("example", false),
                plugin("wrapped", false),
                plugin("future-version", true),
                plugin("hostile", true),
            ]
        );
    }
}
