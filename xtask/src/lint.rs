//! The feedback loop before any test: formatting and clippy over the whole workspace, so an
//! unformatted file or a clippy warning fails `cargo xtask test` (and so `.ci/run`) at once.

use anyhow::{Context, Result, bail};
use std::path::Path;

/// The checks, each a cargo command run at the workspace root: (what, arguments).
/// Clippy covers every target, the test-support feature included, as a developer runs it.
pub const CHECKS: &[(&str, &[&str])] = &[
    ("formatting", &["fmt", "--all", "--check"]),
    (
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            "proxy-operator/test-support",
            "--",
            "-D",
            "warnings",
        ],
    ),
];

/// Runs every check at `root`; the first that fails is the error, naming how to fix it.
pub fn run(root: &Path) -> Result<()> {
    ensure_components()?;
    for (what, args) in CHECKS {
        run_one(root, what, args, None)?;
    }
    Ok(())
}

/// Installs rustfmt and clippy with rustup when cargo lacks them (a minimal toolchain has
/// neither); without rustup, cargo's own error says what is missing.
fn ensure_components() -> Result<()> {
    let has = |sub: &str| {
        crate::cargo()
            .args([sub, "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has("fmt") && has("clippy") {
        return Ok(());
    }
    println!("installing rustfmt and clippy with rustup");
    crate::build_plugins::run_checked(std::process::Command::new("rustup").args([
        "component",
        "add",
        "rustfmt",
        "clippy",
    ]))
}

/// Runs one check; `target` overrides the target directory (the test's throwaway crates).
fn run_one(root: &Path, what: &str, args: &[&str], target: Option<&Path>) -> Result<()> {
    println!("running: cargo {}", args.join(" "));
    let mut cmd = crate::cargo();
    cmd.current_dir(root).args(args);
    if let Some(t) = target {
        cmd.env("CARGO_TARGET_DIR", t);
    }
    let status = cmd
        .status()
        .with_context(|| format!("running cargo {}", args[0]))?;
    if !status.success() {
        let fix = match args[0] {
            "fmt" => "run `cargo fmt --all`",
            _ => "fix the warnings above",
        };
        bail!("{what} check failed ({status}): {fix}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A throwaway crate with one file.
    fn crate_with(dir: &Path, lib: &str) {
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(
            dir.join("Cargo.toml"),
            "[package]\nname = \"lintcheck\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(dir.join("src/lib.rs"), lib).unwrap();
    }

    /// The same commands `cargo xtask test` runs fail on an unformatted file and on a
    /// clippy warning, and pass on clean code: the loop really stops a bad change.
    #[test]
    fn the_checks_fail_on_unformatted_code_and_on_a_clippy_warning() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        let clippy: &[&str] = &["clippy", "--all-targets", "--", "-D", "warnings"];
        let fmt = CHECKS[0].1;
        // (what, source, fmt passes, clippy passes)
        let cases = [
            (
                "clean",
                "pub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n",
                true,
                true,
            ),
            (
                "unformatted",
                "pub fn add(a:u32,b:u32)->u32{a+b}\n",
                false,
                true,
            ),
            (
                "clippy warning",
                "pub fn is_empty(v: &Vec<u32>) -> bool {\n    v.len() == 0\n}\n",
                true,
                false,
            ),
        ];
        for (what, src, fmt_ok, clippy_ok) in cases {
            let dir = tmp.path().join(what.replace(' ', "-"));
            crate_with(&dir, src);
            let got = run_one(&dir, "formatting", fmt, None);
            assert_eq!(got.is_ok(), fmt_ok, "{what}: fmt gave {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("cargo fmt --all"), "{what}: {e}");
            }
            let got = run_one(&dir, "clippy", clippy, Some(&target));
            assert_eq!(got.is_ok(), clippy_ok, "{what}: clippy gave {got:?}");
        }
    }
}
