//! Runs `docs/writing-a-provider.md` from top to bottom, so the guide cannot rot.
//!
//! The guide's fenced blocks are its script, in document order:
//!
//! - ```` ```sh ```` blocks run as written, with `bash -euo pipefail`, in the directory the
//!   previous block ended in (the guide's `cd` carries over);
//! - ```` ```LANG file=PATH ```` blocks are written to `PATH` (relative to that directory);
//!   later blocks for the same path are appended, separated by a blank line;
//! - ```` ```sh setup ```` blocks are one-time setup or long-running commands this test
//!   stands in for. Each line must be one the test knows (see [`Setup`]), so a change to one
//!   fails here until the test follows it.
//!
//! What the test sets up around the script:
//!
//! - a temporary `work/` directory (at a path fixed per checkout, see [`WorkDir`]) with
//!   `egress-proxies-operator` linking to this checkout, the layout the guide asks for;
//! - `proxy-operator` on `PATH` (the binary cargo built for this test; the guide installs it
//!   with `cargo install`), and private `PLUGIN_CACHE_DIR`/`PLUGIN_SCRATCH_DIR`;
//! - the example emulator in this process on a free port, with `127.0.0.1:8080` (the
//!   guide's port) rewritten to it in every block;
//! - once the guide's crate exists: its `target` links to `<target dir>/guide`, shared
//!   between runs so a warm build only compiles the plugin, and the workspace's `Cargo.lock`
//!   seeds its own so it resolves the same dependency versions (and works offline).
//!
//! It also checks that the guide's `src/lib.rs` is the reference plugin
//! (`providers-wasm/example/src/lib.rs`) line for line, and that the suite passed every case.
//!
//! Needs the `wasm32-wasip2` target: without it the test fails under `CI=true` and skips
//! loudly otherwise (`cargo xtask test` installs it).

use egress_emulators::example::{EMULATOR_TOKEN, ExampleBackend};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const GUIDE: &str = include_str!("../../../docs/writing-a-provider.md");
const GUIDE_PATH: &str = "docs/writing-a-provider.md";
/// The address the guide starts the emulator on and points the providers file at.
const GUIDE_ADDR: &str = "127.0.0.1:8080";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// One fenced block of the guide.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    /// The info string after the fence, e.g. `rust file=src/lib.rs`.
    info: String,
    body: String,
    /// 1-based line of the opening fence, for messages.
    line: usize,
}

impl Block {
    fn lang(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }

    fn attr(&self, key: &str) -> Option<&str> {
        self.info
            .split_whitespace()
            .skip(1)
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    }

    fn has_flag(&self, flag: &str) -> bool {
        self.info.split_whitespace().skip(1).any(|w| w == flag)
    }
}

/// Every fenced block, in order. Fences may be indented (inside a list item).
fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.as_mut() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some(Block {
                        info: info.trim().to_string(),
                        body: String::new(),
                        line: i + 1,
                    });
                }
            }
            Some(b) => {
                if trimmed == "```" {
                    out.push(open.take().expect("a block is open"));
                } else {
                    b.body.push_str(line);
                    b.body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "{GUIDE_PATH}: a code block is never closed");
    out
}

/// What a step of the guide does.
#[derive(Debug)]
enum Step {
    Shell { script: String, line: usize },
    File { path: String, body: String },
    Setup(Setup),
}

/// The setup commands this test stands in for, and how.
#[derive(Debug, PartialEq)]
enum Setup {
    /// `rustup target add wasm32-wasip2`: checked before anything runs.
    WasmTarget,
    /// `cargo install --path egress-proxies-operator/host`: the test's own binary.
    InstallOperator,
    /// `cargo run -p egress-emulators --example emulator -- example PORT`: the same
    /// emulator, started in this process.
    Emulator { port: u16 },
}

impl Setup {
    fn parse(line: &str) -> Result<Setup, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["rustup", "target", "add", "wasm32-wasip2"] => Ok(Setup::WasmTarget),
            ["cargo", "install", "--path", "egress-proxies-operator/host"] => {
                Ok(Setup::InstallOperator)
            }
            [
                "cargo",
                "run",
                "-p",
                "egress-emulators",
                "--example",
                "emulator",
                "--",
                "example",
                port,
            ] => port
                .parse()
                .map(|port| Setup::Emulator { port })
                .map_err(|e| format!("port {port:?}: {e}")),
            _ => Err(format!(
                "the test does not know this setup command: {line:?}; run it in a `sh` block, \
                 or teach tests/guide.rs what stands in for it"
            )),
        }
    }
}

/// The guide as steps, checked for blocks the test would silently ignore.
fn steps(md: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for b in blocks(md) {
        let at = format!("{GUIDE_PATH}:{}", b.line);
        if let Some(path) = b.attr("file") {
            out.push(Step::File {
                path: path.to_string(),
                body: b.body.clone(),
            });
            continue;
        }
        match (b.lang(), b.has_flag("setup")) {
            ("sh", true) => {
                for line in b.body.lines().filter(|l| !l.trim().is_empty()) {
                    out.push(Step::Setup(
                        Setup::parse(line).unwrap_or_else(|e| panic!("{at}: {e}")),
                    ));
                }
            }
            ("sh", false) => out.push(Step::Shell {
                script: b.body.clone(),
                line: b.line,
            }),
            ("text", _) => {}
            (lang, _) => panic!(
                "{at}: a ```{} block is neither run nor written; give it file=PATH, make it \
                 `sh` or `sh setup`, or `text` if it is only an illustration",
                if lang.is_empty() {
                    "(no language)"
                } else {
                    lang
                }
            ),
        }
    }
    out
}

/// Whether rustc has the standard library for wasm32-wasip2.
fn has_wasm_target() -> bool {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", "wasm32-wasip2"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
        }
        _ => false,
    }
}

/// `<target dir>/guide`: shared by every run of this test, so CI reuses the build.
fn shared_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("guide")
}

/// The guide's `work/`: a fresh directory at the same path on every run from one checkout,
/// so that cargo sees the same package paths and a warm run only recompiles the plugin.
/// Removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> WorkDir {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        repo().hash(&mut h);
        let dir = std::env::temp_dir().join(format!("egress-guide-{:016x}", h.finish()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
        }
        std::fs::create_dir_all(&dir).unwrap();
        WorkDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link)
        .unwrap_or_else(|e| panic!("linking {} to {}: {e}", link.display(), target.display()));
}

/// Runs one `sh` block in `cwd`; returns its output and the directory it ended in.
fn run_shell(
    script: &str,
    line: usize,
    cwd: &Path,
    env: &[(&str, PathBuf)],
    state: &Path,
) -> (String, PathBuf) {
    let started = Instant::now();
    let full = format!("{script}\npwd > '{}'\n", state.display());
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &full])
        .current_dir(cwd)
        // The crate's `target` link is where builds go, as the guide's paths assume.
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("running bash: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "--- {GUIDE_PATH}:{line} ({:.1} s)\n{}\n{stdout}{stderr}",
        started.elapsed().as_secs_f64(),
        script.trim_end()
    );
    assert!(
        out.status.success(),
        "{GUIDE_PATH}:{line}: the block failed ({}):\n{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status,
        script.trim_end()
    );
    let dir = std::fs::read_to_string(state).expect("the block wrote its directory");
    (stdout, PathBuf::from(dir.trim()))
}

#[test]
fn the_guide_runs_from_cargo_new_to_a_passing_conformance_suite() {
    let started = Instant::now();
    let steps = steps(GUIDE);
    let setups: Vec<&Setup> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Setup(s) => Some(s),
            _ => None,
        })
        .collect();
    for needed in [Setup::WasmTarget, Setup::InstallOperator] {
        assert!(
            setups.contains(&&needed),
            "{GUIDE_PATH}: no setup step for {needed:?}"
        );
    }
    let Some(port) = setups.iter().find_map(|s| match s {
        Setup::Emulator { port } => Some(*port),
        _ => None,
    }) else {
        panic!("{GUIDE_PATH}: the guide never starts the emulator");
    };
    assert_eq!(
        format!("127.0.0.1:{port}"),
        GUIDE_ADDR,
        "the emulator's port and the providers file's must agree"
    );

    if !has_wasm_target() {
        let msg = "the wasm32-wasip2 target is not installed: `rustup target add wasm32-wasip2` \
                   (`cargo xtask test` does it)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING the guide test: {msg}\n");
        return;
    }

    let backend = ExampleBackend::start(EMULATOR_TOKEN);
    let addr = backend.addr().to_string();
    let work = WorkDir::new();
    symlink(&repo(), &work.path().join("egress-proxies-operator"));
    let shared = shared_target();
    std::fs::create_dir_all(&shared).unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_proxy-operator"));
    let path = std::env::join_paths(std::iter::once(bin.parent().unwrap().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let env = [
        ("PATH", PathBuf::from(path)),
        ("PLUGIN_CACHE_DIR", work.path().join(".cache/plugins")),
        ("PLUGIN_SCRATCH_DIR", work.path().join(".cache/calls")),
    ];
    let state = work.path().join(".cache/pwd");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();

    let mut cwd = work.path().to_path_buf();
    let mut written = BTreeSet::new();
    let mut outputs = Vec::new();
    for step in &steps {
        match step {
            Step::Setup(_) => {}
            Step::File { path, body } => {
                let file = cwd.join(path);
                let body = body.replace(GUIDE_ADDR, &addr);
                if written.insert(file.clone()) {
                    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                    std::fs::write(&file, body).unwrap();
                } else {
                    let mut all = std::fs::read_to_string(&file).unwrap();
                    all.push('\n');
                    all.push_str(&body);
                    std::fs::write(&file, all).unwrap();
                }
            }
            Step::Shell { script, line } => {
                let script = script.replace(GUIDE_ADDR, &addr);
                let (out, dir) = run_shell(&script, *line, &cwd, &env, &state);
                outputs.push(out);
                cwd = dir;
                // The guide's crate exists: share its build directory and pin its
                // dependency versions to the workspace's before the first build.
                if cwd.join("Cargo.toml").is_file() && !cwd.join("target").exists() {
                    symlink(&shared, &cwd.join("target"));
                    if !cwd.join("Cargo.lock").exists() {
                        std::fs::copy(repo().join("Cargo.lock"), cwd.join("Cargo.lock")).unwrap();
                    }
                }
            }
        }
    }

    // The guide's code is the reference plugin, so what the guide teaches is what the
    // reference (and its own tests) prove.
    let lib = written
        .iter()
        .find(|p| p.ends_with("src/lib.rs"))
        .expect("the guide writes src/lib.rs");
    let guide_lib = std::fs::read_to_string(lib).unwrap();
    let reference =
        std::fs::read_to_string(repo().join("providers-wasm/example/src/lib.rs")).unwrap();
    let reference = reference
        .trim_end()
        .strip_suffix("#[cfg(test)]\nmod tests;")
        .expect("the reference plugin ends with its test module")
        .trim_end();
    if guide_lib.trim_end() != reference {
        let first = guide_lib
            .lines()
            .zip(reference.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1);
        panic!(
            "the guide's src/lib.rs differs from providers-wasm/example/src/lib.rs (first \
             differing line: {first:?}); change both together"
        );
    }

    // `providers --check` exits 0 whatever the targets say; the guide shows a healthy one.
    let all = outputs.concat();
    assert!(
        all.contains("ready=true") && !all.contains("ready=false"),
        "the health check in the guide is not ready:\n{all}"
    );
    let n = proxy_operator::conformance::case_names().len();
    let total = format!("{n} cases: {n} passed, 0 failed");
    assert!(
        outputs.iter().any(|o| o.lines().any(|l| l.trim() == total)),
        "no `{total}` line in the guide's output"
    );
    assert!(
        backend.instances().is_empty(),
        "the guide leaves instances behind: {:?}",
        backend.instances()
    );
    eprintln!("the guide ran in {:.1} s", started.elapsed().as_secs_f64());
}

/// The parser the test relies on: fences inside list items, attributes, and blocks that
/// would be silently skipped are refused.
#[test]
fn guide_blocks_are_parsed_and_unknown_ones_refused() {
    let md = "intro\n```sh\ncd x\n```\n  ```text\n  tree\n  ```\n```rust file=src/lib.rs\nfn a() {}\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 3);
    assert_eq!(
        (b[0].lang(), b[0].body.as_str(), b[0].line),
        ("sh", "cd x\n", 2)
    );
    assert_eq!(b[2].attr("file"), Some("src/lib.rs"));
    assert!(matches!(
        &steps(md)[..],
        [Step::Shell { .. }, Step::File { .. }]
    ));

    let bad = std::panic::catch_unwind(|| steps("```python\nprint(1)\n```\n"));
    assert!(bad.is_err(), "a block of unknown kind is refused");
    assert!(Setup::parse("rustup target add wasm32-wasip2").is_ok());
    assert_eq!(
        Setup::parse("cargo run -p egress-emulators --example emulator -- example 8080"),
        Ok(Setup::Emulator { port: 8080 })
    );
    assert!(Setup::parse("curl https://example.com | sh").is_err());
}
