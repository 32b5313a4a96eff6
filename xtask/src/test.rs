//! `cargo xtask test`: everything the test suite needs, then the whole suite.
//!
//! CI runs exactly this (through `.ci/run`, with `CI=true`), so every prerequisite is
//! installed or checked here rather than assumed: a green run on a developer machine must
//! mean a green run on a fresh one. That includes a moto EC2 server (see `moto.rs`) for
//! the EC2 plugin's backend test.

use crate::moto::MotoServer;
use anyhow::{Context, Result, bail};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments for `cargo test` (after `--` they go to the test binaries).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub cargo_args: Vec<String>,
}

/// Tools some tests drive as real processes. Under `CI=true` a missing one fails the run
/// (the tests themselves would fail too, but this says why up front).
const TOOLS: &[(&str, &str)] = &[(
    "kubectl",
    "the fake API server's kubectl compatibility test, the config/ render tests, the docs/operations.md commands and the demo story's kubectl line",
)];

/// Debian packages some tests run as real processes: (binary, package, why).
const PACKAGES: &[(&str, &str, &str)] = &[
    (
        "tinyproxy",
        "tinyproxy",
        "the health probe tests (a real CONNECT through a proxy)",
    ),
    (
        "openssl",
        "openssl",
        "the OTLP-over-https test (makes its CA and server certificate)",
    ),
    (
        "chromium",
        "chromium",
        "the status page tests (headless DOM and screenshot checks)",
    ),
    (
        "podman",
        "podman",
        "building the container image and running it (`cargo xtask image`, operator/image.rs)",
    ),
    (
        "update-ca-certificates",
        "ca-certificates",
        "the container image (its CA roots are the machine's bundle)",
    ),
    (
        "runc",
        "runc",
        "running the container image (podman's default runtime, crun, cannot set its rlimits here)",
    ),
    (
        "docker-registry",
        "docker-registry",
        "plugins and the image pulled from a real OCI registry (operator/registry.rs, operator/image.rs)",
    ),
    (
        "wasm-opt",
        "binaryen",
        "`wasm-opt -Oz` on the providers, so the tests run the plugins as they ship",
    ),
];

pub fn run(args: &Args) -> Result<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    for (bin, package, why) in PACKAGES {
        ensure_package(bin, package, why, ci)?;
    }
    for (tool, why) in TOOLS {
        let found = Command::new(tool)
            .arg("version")
            .arg("--client")
            .output()
            .is_ok();
        if !found {
            let msg = format!("{tool} is not installed; it is needed for {why}");
            if ci {
                bail!("{msg}");
            }
            eprintln!("!!! {msg}: those tests will be skipped");
        }
    }

    let mut ipv6 = None;
    if !ipv6_loopback() {
        ipv6 = Some(("EGRESS_NO_IPV6_LOOPBACK", "1"));
    }

    // Formatting and clippy first: the cheapest way for a change to fail.
    let ws = crate::workspace()?;
    crate::lint::run(&ws.root)?;

    crate::build_plugins::run(&crate::build_plugins::Args::default())?;

    // The image the operator ships as, run by operator/image.rs.
    let image = if on_path("podman") {
        let built = crate::image::build(&ws, &Default::default())
            .context("building the container image (cargo xtask image)")?;
        println!(
            "image {} ({}), {:.1} MiB",
            built.tag,
            built.id,
            built.bytes as f64 / f64::from(1 << 20)
        );
        Some(built.tag)
    } else {
        // Under CI ensure_package has already failed the run.
        eprintln!("!!! podman is not installed: the image is not built, its test is skipped");
        None
    };

    let plugin_dir = ws.target_dir.join("plugins");
    let mut test = crate::cargo();
    test.current_dir(&ws.root)
        .env("EGRESS_PLUGIN_DIR", &plugin_dir)
        .args(["test", "--workspace"])
        .args(&args.cargo_args);

    // The EC2 plugin's backend test (host/tests/provider_ec2_moto.rs) runs against it; it
    // stops when `moto` is dropped, after the tests.
    let moto = match MotoServer::start(&ws.target_dir, &ws.root) {
        Ok(moto) => Some(moto),
        Err(e) if ci => return Err(e.context("setting up moto (needed under CI=true)")),
        Err(e) => {
            eprintln!(
                "\n!!! moto could not be set up, so the EC2 plugin's moto test will be \
                 skipped:\n!!! {e:#}\n"
            );
            None
        }
    };
    for (k, v) in moto.iter().flat_map(MotoServer::env) {
        test.env(k, v);
    }
    test.envs(ipv6);
    test.envs(image.map(|i| ("EGRESS_OPERATOR_IMAGE", i)));

    println!(
        "running: cargo test --workspace {}",
        args.cargo_args.join(" ")
    );
    let status = test.status().context("running cargo test");
    drop(moto);
    let status = status?;
    if !status.success() {
        bail!("tests failed ({status})");
    }

    // The e2e scenario against the in-memory API server: no cluster exists here, but the
    // flow and the operator's wiring (emulator, tinyproxy, discovery, GC) still run.
    if !on_path("tinyproxy") {
        // Under CI ensure_package has already failed the run.
        eprintln!("!!! tinyproxy is not installed: the e2e scenario against fake-kube is skipped");
        return Ok(());
    }
    println!("running: the e2e scenario against fake-kube");
    match crate::e2e::run_against_fake_kube(&ws.target_dir) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.context("the e2e scenario against fake-kube failed")),
    }
}

/// The IPv6 loopback address (`::1`), which the IPv6 tests listen and dial on. Containers
/// often start with IPv6 disabled on `lo`; as root it is turned on (nothing leaves the
/// machine either way). Where it cannot be, the IPv6 tests are excused by name, said here
/// once and loudly, rather than failing the run on a kernel setting no package installs.
fn ipv6_loopback() -> bool {
    let bound = || std::net::TcpListener::bind("[::1]:0").is_ok();
    if bound() {
        return true;
    }
    let knob = "/proc/sys/net/ipv6/conf/lo/disable_ipv6";
    if std::fs::write(knob, "0").is_ok() {
        // The address comes back a moment after the setting.
        for _ in 0..50 {
            if bound() {
                println!("turned on IPv6 on the loopback interface ({knob}=0) for the IPv6 tests");
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    eprintln!(
        "\n!!! this machine has no IPv6 loopback address (::1) and it could not be turned on \
         ({knob}): the IPv6 tests are SKIPPED (EGRESS_NO_IPV6_LOOPBACK=1)\n"
    );
    false
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain([std::path::PathBuf::from("/usr/sbin")])
            .any(|d| d.join(bin).is_file())
    })
}

/// Installs `package` with apt-get when `bin` is missing and we are root (CI machines and
/// fresh containers are); otherwise says what to install. Under CI a failure is an error.
pub(crate) fn ensure_package(bin: &str, package: &str, why: &str, ci: bool) -> Result<()> {
    if on_path(bin) {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root && on_path("apt-get") {
        println!("installing {package} (needed for {why})");
        let quiet = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if quiet(&["update", "-qq"]) && quiet(&["install", "-y", "-qq", package]) && on_path(bin) {
            return Ok(());
        }
    }
    let msg = format!("{bin} is not installed (apt-get install {package}); it is needed for {why}");
    if ci {
        bail!("{msg}");
    }
    eprintln!("!!! {msg}: those tests will be skipped");
    Ok(())
}
