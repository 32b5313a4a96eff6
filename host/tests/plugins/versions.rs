//! Contract versions side by side: plugins built for `egress:provider@0.1.0` and `@0.2.0`
//! before the next version existed (`tests/fixtures/v0.1.0/`, `v0.2.0/`, never rebuilt)
//! load, run and pass the conformance suite in the same run as the plugins built for 0.3.0
//! today; a 0.1.0 plugin is refused what 0.1.0 cannot carry, by name, before anything
//! reaches its backend; the default request budget comes from what a 0.2.0 or later plugin
//! declares, not from a table of names in the host; and only a 0.3.0 plugin that declares
//! `lists-recent` is asked for lists of recent instances.

use crate::support;

use egress_emulators::control::Emulator;
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_plugin_host::plugin::{LoadedPlugin, Runtime, RuntimeOptions, WasmProvider};
use egress_plugin_host::provider::{Capacity, Class, CreateRequest, IpFamily, Placement, Provider};
use egress_plugin_host::rate::Spec;
use proxy_operator::conformance::{self, Control, Options};
use std::path::PathBuf;
use std::sync::Arc;

const TOKEN: &str = "hz-versions-token";

/// The Hetzner plugin as shipped for contract 0.1.0 (see the README next to it).
fn v0_1_0_hetzner() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/hetzner.wasm")
}

/// The Hetzner plugin as shipped for contract 0.2.0 (see the README next to it).
fn v0_2_0_hetzner() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.2.0/hetzner.wasm")
}

async fn load_path(rt: &Arc<Runtime>, path: &std::path::Path) -> Arc<LoadedPlugin> {
    rt.load_plugin(path).await.unwrap_or_else(|e| panic!("{e}"))
}

struct Hz {
    emu: HetznerEmulator,
    p: WasmProvider,
    _secrets: tempfile::TempDir,
}

async fn hetzner(rt: &Arc<Runtime>, plugin: Arc<LoadedPlugin>, extra: &str) -> Hz {
    let emu = HetznerEmulator::start(HetznerConfig::new(TOKEN));
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let entry = format!(
        "name: hz\nplugin: hetzner.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{token: {}}}\n\
         config: {{endpoint: '{url}/v1', locations: [fsn1, nbg1], serverTypes: [cpx11], \
         images: {{ubuntu: ubuntu-24.04}}}}{extra}",
        token.display(),
        url = emu.url(),
    );
    let p = rt
        .provider(plugin, &support::entry(&entry))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Hz {
        emu,
        p,
        _secrets: secrets,
    }
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\n".to_vec(),
        ip_family: IpFamily::V4,
        ..CreateRequest::new(
            uid,
            "versions",
            Placement::new("fsn1", "", "cpx11", "ubuntu"),
        )
    }
}

/// The acceptance of contracts 0.2.0 and 0.3.0: the plugins compiled for 0.1.0 and 0.2.0
/// and the one built from today's sources, for 0.3.0, each pass every case of the suite
/// against the emulator (the 0.3.0 one with its lists of recent instances).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_of_each_contract_passes_the_suite_in_one_run() {
    let dir = plugins_or_skip!();
    let rt = support::runtime();
    for (path, version, lists_recent) in [
        (v0_1_0_hetzner(), "0.1.0", false),
        (v0_2_0_hetzner(), "0.2.0", false),
        (dir.join("hetzner.wasm"), "0.3.0", true),
    ] {
        let plugin = load_path(&rt, &path).await;
        assert_eq!(plugin.version().as_str(), version, "{}", path.display());
        assert_eq!(plugin.info.type_name, "hetzner");
        assert_eq!(plugin.info.lists_recent, lists_recent, "{version}");
        let hz = hetzner(&rt, plugin, "").await;
        let control = Control::new(&hz.emu.url()).unwrap();
        let opts = Options::new(Placement::new("fsn1", "", "cpx11", "ubuntu"));
        let report = conformance::run(&conformance::Subject::wasm(&hz.p), &control, &opts, |r| {
            eprintln!("{version}: {r}")
        })
        .await;
        assert_eq!(report.results.len(), conformance::case_names().len());
        let failed: Vec<String> = report.failed().iter().map(|r| r.to_string()).collect();
        assert!(
            failed.is_empty(),
            "{version}: failed cases:\n{}",
            failed.join("\n")
        );
        assert!(
            hz.emu.dump().instances.is_empty(),
            "{version}: the suite cleans up"
        );
    }
}

/// What 0.1.0 has no field for is refused by name, Permanent (a spec change is needed),
/// before the plugin runs: nothing reaches the backend, and what 0.1.0 can carry still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_plugin_is_refused_what_0_1_0_cannot_carry() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let hz = hetzner(&rt, load_path(&rt, &v0_1_0_hetzner()).await, "").await;
    let spot = CreateRequest {
        placement: Placement {
            capacity: Capacity::Spot,
            ..Placement::new("fsn1", "", "cpx11", "ubuntu")
        },
        ..request("uid-spot")
    };
    let v6 = CreateRequest {
        ip_family: IpFamily::V6,
        ..request("uid-v6")
    };
    let cases = [
        (
            "spot",
            hz.p.create(&spot).await.map(drop),
            "no capacity (spot placements)",
        ),
        (
            "IPv6",
            hz.p.create(&v6).await.map(drop),
            "no IPv6 (ipFamily: IPv6)",
        ),
        (
            "quote",
            hz.p.quote(&spot.placement).await.map(drop),
            "no quote (hourly prices)",
        ),
    ];
    for (what, result, has) in cases {
        let e = result.expect_err(what);
        assert_eq!(e.class, Class::Permanent, "{what}: {e}");
        assert_eq!(
            e.message,
            format!(
                "plugin hetzner.wasm implements egress:provider@0.1.0, which has {has}; upgrade the plugin"
            ),
            "{what}"
        );
    }
    assert!(hz.emu.dump().instances.is_empty(), "nothing was created");
    let id =
        hz.p.create(&request("uid-plain"))
            .await
            .expect("on-demand IPv4 works");
    assert_eq!(hz.p.get(&id).await.unwrap().uid, "uid-plain");
    hz.p.delete(&id).await.unwrap();
}

/// The budget a provider gets when its entry sets none is the one its plugin declares
/// (Hetzner's 3,600 an hour, burst 100); a 0.1.0 plugin declares none, and gets none; the
/// providers file's `budget` overrides either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_budget_is_what_the_plugin_declares() {
    let dir = plugins_or_skip!();
    let mut opts = RuntimeOptions::for_providers(
        &egress_plugin_host::config::ProvidersFile::default(),
        Some(support::cache_dir()),
        std::env::temp_dir().join("egress-test-scratch"),
    );
    opts.engine.max_instances = 16;
    opts.default_budgets = true;
    let rt = Runtime::new(opts).unwrap();
    let hetzner_spec = Spec {
        per_hour: 3600,
        burst: 100,
    };
    let today = load_path(&rt, &dir.join("hetzner.wasm")).await;
    let v0_2 = load_path(&rt, &v0_2_0_hetzner()).await;
    assert_eq!(v0_2.info.default_budget, Some(hetzner_spec));
    assert_eq!(today.info.default_budget, Some(hetzner_spec));
    let old = load_path(&rt, &v0_1_0_hetzner()).await;
    assert_eq!(old.info.default_budget, None);
    let cases = [
        (
            "0.3.0, no budget in the entry",
            today.clone(),
            "",
            Some(hetzner_spec),
        ),
        (
            "0.2.0, no budget in the entry",
            v0_2,
            "",
            Some(hetzner_spec),
        ),
        ("0.1.0, no budget in the entry", old.clone(), "", None),
        (
            "0.3.0, the entry's budget",
            today,
            "\nbudget: {requestsPerHour: 60, burst: 2}",
            Some(Spec {
                per_hour: 60,
                burst: 2,
            }),
        ),
        (
            "0.1.0, the entry's budget",
            old,
            "\nbudget: {requestsPerHour: 60, burst: 2}",
            Some(Spec {
                per_hour: 60,
                burst: 2,
            }),
        ),
    ];
    for (what, plugin, extra, want) in cases {
        let hz = hetzner(&rt, plugin, extra).await;
        assert_eq!(hz.p.budget_spec(), want, "{what}");
    }
}

/// `plugin inspect` says which contract a plugin implements and the default budget its
/// providers get, for review before installing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_inspect_shows_the_contract_version_and_the_default_budget() {
    let dir = plugins_or_skip!();
    let hetzner_budget = serde_json::json!({
        "requestsPerHour": 3600,
        "burst": 100,
        "declared": {"requestsPerHour": 3600, "burst": 100},
    });
    for (path, world, budget, lists_recent) in [
        (
            v0_1_0_hetzner(),
            "egress:provider@0.1.0",
            serde_json::Value::Null,
            false,
        ),
        (
            v0_2_0_hetzner(),
            "egress:provider@0.2.0",
            hetzner_budget.clone(),
            false,
        ),
        (
            dir.join("hetzner.wasm"),
            "egress:provider@0.3.0",
            hetzner_budget,
            true,
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
            .args(["plugin", "inspect"])
            .arg(&path)
            .arg("--plugin-cache-dir")
            .arg(support::cache_dir())
            .arg("--plugin-scratch-dir")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["world"], world, "{v}");
        assert_eq!(v["type"], "hetzner");
        assert_eq!(v["defaultBudget"], budget, "{world}");
        assert_eq!(v["listsRecent"], lists_recent, "{world}");
    }
}
