//! `proxy-operator provider lifecycle` when its first create fails after the backend made
//! the instance (its answer lost to a gateway's 5xx or a timeout): the cleanup finds the
//! instance by its uid through ListByTag and deletes it, instead of reporting "nothing to
//! clean up" and leaving it billed. And `--uid` repeats a run with the same UID. Run as the
//! real binary against a Vultr emulator in this process (`fail_creates_after_making`).

use crate::support;

use egress_emulators::control::Emulator;
use egress_emulators::vultr::{VultrConfig, VultrEmulator};
use egress_plugin_host::provider::name_from_uid;
use std::path::Path;
use std::process::Command;

const TOKEN: &str = "vultr-lifecycle-token";

/// The providers file and the scratch directories, in one temporary directory.
fn files(url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let file = format!(
        "providers:\n- name: vu\n  plugin: vultr.wasm\n  additionalHosts: ['{url}']\n  \
         allowPrivateAddresses: true\n  limits: {{timeout: 5s}}\n  secrets: {{token: {}}}\n  \
         config: {{endpoint: '{url}/v2', regions: [ewr], plans: [vc2-1c-1gb], images: {{debian: 2136}}}}\n",
        token.display()
    );
    std::fs::write(dir.path().join("providers.yaml"), file).unwrap();
    dir
}

fn lifecycle(plugins: &Path, tmp: &Path, url: &str, more: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["provider", "lifecycle", "--provider", "vu", "--config"])
        .arg(tmp.join("providers.yaml"))
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("--plugin-cache-dir")
        .arg(tmp.join("cache"))
        .arg("--plugin-scratch-dir")
        .arg(tmp.join("calls"))
        .args(["--placement", "ewr//vc2-1c-1gb/debian", "--emulator", url])
        .args(["--poll", "50ms", "--wait", "20s"])
        .args(more)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_failed_after_the_backend_made_the_instance_is_cleaned_up() {
    let plugins = plugins_or_skip!();
    let emu = VultrEmulator::start(VultrConfig::new(TOKEN));
    let tmp = files(&emu.url());

    emu.fail_creates_after_making(1);
    let (ok, out) = lifecycle(&plugins, tmp.path(), &emu.url(), &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL  create:") && out.contains("HTTP500"),
        "{out}"
    );
    let cleanup = out
        .lines()
        .find(|l| l.trim_start().starts_with("cleanup:"))
        .unwrap_or_default();
    assert!(
        cleanup.contains("found by its uid") && cleanup.contains("deleted ewr/"),
        "{out}"
    );
    assert!(emu.dump().instances.is_empty(), "{:?}", emu.dump());

    // The same UID again: the instance gets the name that UID gives, and the run passes.
    let uid = "lifecycle-cleanup-repeat";
    emu.fail_creates_after_making(1);
    let (ok, out) = lifecycle(&plugins, tmp.path(), &emu.url(), &["--uid", uid]);
    assert!(!ok && out.contains(&format!("uid {uid}")), "{out}");
    assert!(emu.dump().instances.is_empty(), "{:?}", emu.dump());
    let (ok, out) = lifecycle(&plugins, tmp.path(), &emu.url(), &["--uid", uid]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("(name {})", name_from_uid(uid))),
        "{out}"
    );
    assert!(out.contains("ok    emulator holds nothing"), "{out}");
}
