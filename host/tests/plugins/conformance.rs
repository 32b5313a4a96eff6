//! The conformance suite against every provider plugin and its emulator, and against a
//! deliberately broken plugin, which it must fail: a suite that passes everything proves
//! nothing. Also the two command-line entry points (`conformance`, `provider lifecycle`),
//! run as the real binary against an emulator in this process.

use crate::support;

use egress_emulators::control::Emulator;
use egress_emulators::ec2::{EXAMPLE_ACCESS_KEY, EXAMPLE_SECRET_KEY, Ec2Config, Ec2Emulator};
use egress_emulators::example::ExampleBackend;
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Placement, Provider};
use proxy_operator::conformance::{self, Control, Options, Outcome, Report, Subject};
use std::path::Path;
use std::process::Command;

const HZ_TOKEN: &str = "hz-conformance-token";

fn placement(region: &str, zone: &str, machine_type: &str, image: &str) -> Placement {
    Placement::new(region, zone, machine_type, image)
}

/// A 3 s limit keeps the slow-answer cases short; every other call takes milliseconds.
const LIMITS: &str = "limits: {timeout: 3s}";

fn ec2_entry(url: &str, secrets: &Path) -> String {
    let s = |k: &str| secrets.join(k).display().to_string();
    format!(
        "name: aws\nplugin: ec2.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n{LIMITS}\n\
         secrets: {{accessKeyId: {}, secretAccessKey: {}}}\n\
         config:\n  regions:\n    eu-west-1:\n      endpoint: '{url}'\n      zones: {{eu-west-1a: {{}}}}\n\
         \x20     images: {{debian: ami-0fedcba9876543210}}\n  instanceTypes: [t3.micro]",
        s("accessKeyId"),
        s("secretAccessKey"),
    )
}

fn hetzner_entry(name: &str, plugin: &str, url: &str, token: &Path) -> String {
    format!(
        "name: {name}\nplugin: {plugin}\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n{LIMITS}\n\
         secrets: {{token: {}}}\n\
         config: {{endpoint: '{url}/v1', locations: [fsn1, nbg1], serverTypes: [cpx11], \
         images: {{ubuntu: ubuntu-24.04}}}}",
        token.display()
    )
}

struct Setup {
    emu: Box<dyn Emulator>,
    p: WasmProvider,
    placement: Placement,
    _secrets: tempfile::TempDir,
    entry: String,
}

async fn ec2() -> Setup {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("accessKeyId"), EXAMPLE_ACCESS_KEY).unwrap();
    std::fs::write(secrets.path().join("secretAccessKey"), EXAMPLE_SECRET_KEY).unwrap();
    let entry = ec2_entry(&emu.url(), secrets.path());
    let p = support::provider(&support::runtime(), "ec2.wasm", &entry).await;
    Setup {
        emu: Box::new(emu),
        p,
        placement: placement("eu-west-1", "eu-west-1a", "t3.micro", "debian"),
        _secrets: secrets,
        entry,
    }
}

async fn hetzner(plugin: &str) -> Setup {
    let emu = HetznerEmulator::start(HetznerConfig::new(HZ_TOKEN));
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, HZ_TOKEN).unwrap();
    let entry = hetzner_entry("hz", plugin, &emu.url(), &token);
    let p = support::provider(&support::runtime(), plugin, &entry).await;
    Setup {
        emu: Box::new(emu),
        p,
        placement: placement("fsn1", "", "cpx11", "ubuntu"),
        _secrets: secrets,
        entry,
    }
}

/// The example plugin against the example backend: the plugin `docs/writing-a-provider.md`
/// builds, line for line.
async fn example() -> Setup {
    example_from("example.wasm").await
}

async fn example_from(plugin: &str) -> Setup {
    let emu = ExampleBackend::start("ex-conformance-token");
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "ex-conformance-token").unwrap();
    let entry = format!(
        "name: ex\nplugin: example.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n{LIMITS}\n\
         secrets: {{token: {}}}\nconfig: {{endpoint: '{url}', regions: [r1, r2]}}",
        token.display(),
        url = emu.url(),
    );
    let p = support::provider(&support::runtime(), plugin, &entry).await;
    Setup {
        emu: Box::new(emu),
        p,
        placement: placement("r1", "a", "small", "debian"),
        _secrets: secrets,
        entry,
    }
}

async fn run_suite(s: &Setup) -> Report {
    let control = Control::new(&s.emu.url()).unwrap();
    let opts = Options::new(s.placement.clone());
    let report =
        conformance::run(&Subject::wasm(&s.p), &control, &opts, |r| eprintln!("{r}")).await;
    eprintln!("{}", report.total());
    report
}

fn assert_all_pass(report: &Report) {
    assert_eq!(
        report.results.len(),
        conformance::case_names().len(),
        "every case ran"
    );
    let failed: Vec<String> = report.failed().iter().map(|r| r.to_string()).collect();
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = ec2().await;
    assert_all_pass(&run_suite(&s).await);
    assert!(s.emu.dump().instances.is_empty(), "the suite cleans up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hetzner_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = hetzner("hetzner.wasm").await;
    assert_all_pass(&run_suite(&s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = example().await;
    assert_all_pass(&run_suite(&s).await);
    assert!(s.emu.dump().instances.is_empty(), "the suite cleans up");
}

/// The guest SDK builds for either contract: the same example source, built with the SDK's
/// `contract-v0-1` feature, is a 0.1.0 plugin that passes the same suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_built_by_the_sdk_for_0_1_0_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = example_from("example-v0.1.0.wasm").await;
    assert_eq!(s.p.plugin().version().as_str(), "0.1.0");
    assert_all_pass(&run_suite(&s).await);
    assert!(s.emu.dump().instances.is_empty(), "the suite cleans up");
}

/// The same with the SDK's `contract-v0-2` feature: a 0.2.0 plugin, never asked for lists
/// of recent instances (0.2.0 has no place for `created-since`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_built_by_the_sdk_for_0_2_0_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = example_from("example-v0.2.0.wasm").await;
    assert_eq!(s.p.plugin().version().as_str(), "0.2.0");
    assert!(!s.p.lists_recent());
    assert_all_pass(&run_suite(&s).await);
    assert!(s.emu.dump().instances.is_empty(), "the suite cleans up");
}

/// `broken.wasm` is the Hetzner plugin with three bugs: Create makes a new server on every
/// call, Get answers NotFound for a server that is not running, and its list of recent
/// servers shows the older ones instead. Exactly the cases that
/// observe those behaviours must fail, each saying what it saw; the rest must still pass,
/// or the suite would be failing for reasons of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_fails_a_broken_plugin_where_it_is_broken() {
    let _dir = plugins_or_skip!();
    let s = hetzner("broken.wasm").await;
    let report = run_suite(&s).await;
    assert!(!report.passed());
    let failed = |name: &str| match &report
        .results
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
        .outcome
    {
        Outcome::Passed => None,
        Outcome::Failed(why) => Some(why.clone()),
    };
    for (case, says) in [
        ("create-is-idempotent", "a repeat Create returned"),
        (
            "unknown-state-is-stopped",
            "want Stopped, Get answers NotFound",
        ),
        (
            "get-during-delete-returns-the-instance",
            "want the instance, Get answers NotFound",
        ),
        (
            "list-recent-shows-every-instance-made-since",
            "made just now",
        ),
    ] {
        let why = failed(case).unwrap_or_else(|| panic!("{case} passed a broken plugin"));
        assert!(why.contains(says), "{case}: {why}");
    }
    for case in [
        "profile-answers-every-axis",
        "running-has-an-ip",
        "malformed-id-is-permanent",
        "fault-auth-is-permanent",
        "list-excludes-unmarked-keeps-empty-uid",
        "uid-and-created-at-come-from-the-backend",
        "not-started-is-never-stopped",
        "locked-instance-keeps-its-state",
    ] {
        assert_eq!(failed(case), None, "{case} fails for a reason of its own");
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
}

/// Writes the providers file and a private cache dir for the binary.
fn cli_files(s: &Setup) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("providers.yaml");
    std::fs::write(
        &file,
        format!("providers:\n- {}", s.entry.replace('\n', "\n  ")),
    )
    .unwrap();
    (dir, file.display().to_string())
}

fn run_cli(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

/// `provider lifecycle` for one provider of `file`, with the plugin and cache arguments.
fn lifecycle(file: &str, provider: &str, dir: &Path, tmp: &Path, placement: &str) -> Command {
    let mut cmd = bin();
    cmd.args([
        "provider",
        "lifecycle",
        "--config",
        file,
        "--provider",
        provider,
    ]);
    common_args(&mut cmd, dir, tmp, placement);
    cmd
}

fn common_args(cmd: &mut Command, plugin_dir: &Path, tmp: &Path, placement: &str) {
    cmd.arg("--plugin-dir")
        .arg(plugin_dir)
        .arg("--plugin-cache-dir")
        .arg(tmp.join("cache"))
        .arg("--plugin-scratch-dir")
        .arg(tmp.join("calls"))
        .args(["--placement", placement]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_command_prints_a_line_per_case_and_fails_on_failure() {
    let dir = plugins_or_skip!();
    for (plugin, ok) in [("hetzner.wasm", true), ("broken.wasm", false)] {
        let s = hetzner(plugin).await;
        let (tmp, file) = cli_files(&s);
        let plugin_dir = if ok { dir.clone() } else { dir.join("testing") };
        let mut cmd = bin();
        cmd.args(["conformance", "--providers", &file, "--provider", "hz"])
            .args(["--emulator", &s.emu.url()])
            .args(["--only", "create-is-idempotent", "--only", "malformed"]);
        common_args(&mut cmd, &plugin_dir, tmp.path(), "fsn1//cpx11/ubuntu");
        let (success, out) = run_cli(&mut cmd);
        assert_eq!(success, ok, "{plugin}: {out}");
        let lines: Vec<&str> = out.lines().collect();
        let first = if ok {
            "ok    create-is-idempotent"
        } else {
            "FAIL  create-is-idempotent"
        };
        assert!(lines.iter().any(|l| l.starts_with(first)), "{out}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ok    malformed-id-is-permanent")),
            "{out}"
        );
        let total = if ok {
            "2 cases: 2 passed, 0 failed"
        } else {
            "2 cases: 1 passed, 1 failed"
        };
        assert_eq!(lines.last(), Some(&total), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_command_runs_against_an_emulator_and_cleans_up() {
    let dir = plugins_or_skip!();
    let s = ec2().await;
    let (tmp, file) = cli_files(&s);
    let mut cmd = lifecycle(
        &file,
        "aws",
        &dir,
        tmp.path(),
        "eu-west-1/eu-west-1a/t3.micro/debian",
    );
    cmd.args([
        "--emulator",
        &s.emu.url(),
        "--poll",
        "50ms",
        "--wait",
        "20s",
    ]);
    let (success, out) = run_cli(&mut cmd);
    assert!(success, "{out}");
    for step in [
        "create",
        "create again",
        "wait for running",
        "list",
        "delete",
        "delete again",
        "wait for not found",
        "left behind",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("ok    {step:<22}"))),
            "no line for {step}: {out}"
        );
    }
    assert!(out.contains("ok    emulator holds nothing"), "{out}");
    assert!(s.emu.dump().instances.is_empty());

    // A placement the plugin refuses fails at the first step, leaving nothing behind.
    let mut cmd = lifecycle(
        &file,
        "aws",
        &dir,
        tmp.path(),
        "eu-west-1/eu-west-1a/t9.huge/debian",
    );
    cmd.args(["--poll", "50ms"]);
    let (success, out) = run_cli(&mut cmd);
    assert!(!success, "{out}");
    assert!(
        out.contains("FAIL  create:") && out.contains("t9.huge"),
        "{out}"
    );
    assert!(s.emu.dump().instances.is_empty());

    // Bad input names the flag and the value.
    let mut cmd = lifecycle(&file, "nope", &dir, tmp.path(), "eu-west-1/t3.micro");
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("\"eu-west-1/t3.micro\" has 2 part(s)"),
        "{err}"
    );
    let mut cmd = lifecycle(
        &file,
        "nope",
        &dir,
        tmp.path(),
        "eu-west-1/eu-west-1a/t3.micro/debian",
    );
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--provider \"nope\" is not in") && err.contains("it has: aws"),
        "{err}"
    );
}

/// `proxy-operator provider call`: one operation at a time through the sandbox, answers as
/// JSON, errors with their class and a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_call_command_makes_one_call_at_a_time() {
    let dir = plugins_or_skip!();
    let s = ec2().await;
    let (tmp, file) = cli_files(&s);
    let run = |op: &[&str]| {
        let mut cmd = bin();
        cmd.args(["provider", "call", "--config", &file, "--provider", "aws"])
            .arg("--plugin-dir")
            .arg(&dir)
            .arg("--plugin-cache-dir")
            .arg(tmp.path().join("cache"))
            .arg("--plugin-scratch-dir")
            .arg(tmp.path().join("calls"))
            .args(op);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let v: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.success(), v)
    };
    let placement = "eu-west-1/eu-west-1a/t3.micro/debian";
    let create = ["create", "--placement", placement, "--uid", "cli-uid-1"];
    let (ok, created) = run(&create);
    assert!(ok, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let (_, again) = run(&create);
    assert_eq!(again["id"], created["id"], "same uid, same instance");
    assert_eq!(s.emu.dump().instances.len(), 1);

    let (ok, got) = run(&["get", &id]);
    assert!(ok && got["uid"] == "cli-uid-1", "{got}");
    let (ok, listed) = run(&["list", "--installation", "egress-cli"]);
    assert!(ok && listed.as_array().unwrap().len() == 1, "{listed}");
    let (ok, check) = run(&["check"]);
    assert!(ok && check["supported"] == true, "{check}");
    let (ok, _) = run(&["delete", &id]);
    assert!(ok);

    let (ok, err) = run(&["get", "not-an-id"]);
    assert!(!ok);
    assert_eq!(err["error"]["class"], "Permanent", "{err}");

    // `--ipv6` asks as an IPv6 Proxy does; the EC2 plugin cannot give one and says so.
    let v6 = [
        "create",
        "--placement",
        placement,
        "--uid",
        "cli-uid-6",
        "--ipv6",
    ];
    let (ok, err) = run(&v6);
    assert!(!ok);
    assert_eq!(err["error"]["code"], "Unsupported", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ipFamily IPv6")),
        "{err}"
    );
    assert_eq!(
        got["ipv6"], "",
        "the instance JSON names its IPv6 address: {got}"
    );
}
