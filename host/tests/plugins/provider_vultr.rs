//! The Vultr plugin through the host, against the Vultr emulator: the conformance suite,
//! then Vultr's specifics (marks in tags, the `pending` instance at `0.0.0.0`, base64 user
//! data, cursor paging, labels that are not unique, the 429 rate limit, Vultr's 400 for a
//! locked instance and for the instance limit) and config errors naming field and value.
//!
//! The last test runs the lifecycle against the real API and is ignored unless asked for
//! (see docs/providers/vultr.md, "Testing").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant, RateLimit};
use egress_emulators::framework::Record;
use egress_emulators::vultr::{
    Extra, INSTANCE_LIMIT, PlanOffer, VultrConfig, VultrEmulator, VultrError,
};
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{
    Class, CreateRequest, Placement, Provider, State, name_from_uid,
};
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "vultr-test-token";
const INST: &str = "inst-v";

struct Vu {
    emu: VultrEmulator,
    p: WasmProvider,
    _secrets: tempfile::TempDir,
}

const CONFIG: &str = "regions: [ewr, fra], plans: [vc2-1c-1gb], images: {debian: 2136}";

fn entry(url: &str, token: &Path, config: &str) -> String {
    format!(
        "name: vu\nplugin: vultr.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{token: {}}}\nconfig: {{endpoint: '{url}/v2', {config}}}",
        token.display()
    )
}

async fn setup_with(cfg: VultrConfig) -> Vu {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, format!("{}\n", cfg.token)).unwrap();
    let emu = VultrEmulator::start(cfg);
    let p = support::provider(
        &support::runtime(),
        "vultr.wasm",
        &entry(&emu.url(), &token, CONFIG),
    )
    .await;
    Vu {
        emu,
        p,
        _secrets: secrets,
    }
}

async fn setup() -> Vu {
    setup_with(VultrConfig::new(TOKEN)).await
}

fn placement(region: &str) -> Placement {
    Placement::new(region, "ignored", "vc2-1c-1gb", "debian")
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n".to_vec(),
        ..CreateRequest::new(uid, INST, placement("ewr"))
    }
}

fn key(id: &str) -> &str {
    id.rsplit('/').next().unwrap()
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vultr_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let s = setup().await;
    support::suite::assert_passes(&s.p, &s.emu, placement("ewr")).await;
}

/// Marks in tags, the name as label and hostname, user data base64 on the wire and byte
/// for byte in the guest, the pending window without an address, idempotent create and
/// delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_marks_and_user_data() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let mut req = request("uid-1");
    req.cloud_init = vec![0x1f, 0x8b, 0x00, 0xff, b'\n']; // not UTF-8: still byte for byte
    let id = p.create(&req).await.unwrap();
    assert!(id.starts_with("ewr/"), "{id}");

    let raw = emu.instance(&id).unwrap();
    assert_eq!(
        (raw["status"].as_str(), raw["main_ip"].as_str()),
        (Some("pending"), Some("0.0.0.0"))
    );
    assert_eq!(
        (raw["label"].as_str(), raw["hostname"].as_str()),
        (Some(req.name.as_str()), Some(req.name.as_str()))
    );
    let tags: Vec<&str> = raw["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let want = [
        format!("{MARK_MANAGED}=true"),
        format!("{MARK_UID}=uid-1"),
        format!("{MARK_INSTALLATION}={INST}"),
    ];
    assert_eq!(tags, want.iter().map(String::as_str).collect::<Vec<_>>());
    let dump = emu.dump();
    assert_eq!(
        dump.instances[0].user_data, req.cloud_init,
        "user data byte for byte"
    );
    assert_eq!(label(&dump.instances[0].labels, MARK_UID), Some("uid-1"));

    // Pending at 0.0.0.0: Provisioning, and the address is never reported.
    let first = p.get(&id).await.unwrap();
    assert_eq!(
        (first.state, first.ip.as_str(), first.uid.as_str()),
        (State::Provisioning, "", "uid-1")
    );
    assert!(first.created_at.is_some());
    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(running.ip.starts_with("203.0.113."), "{running:?}");
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by label and uid"
    );
    assert_eq!(emu.dump().instances.len(), 1);

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert!(emu.dump().instances.is_empty());
    let calls = emu.requests();
    assert!(
        calls.iter().any(|c| c.starts_with("POST /v2/instances")),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("GET /v2/instances?label=proxy-")),
        "{calls:?}"
    );
}

/// An active instance whose address is `0.0.0.0`, private or missing is never Running
/// with it; suspended and halted are Stopped; a lock keeps the last state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_and_states_as_vultr_shows_them() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let id = p.create(&request("uid-ip")).await.unwrap();
    p.get(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Running);
    for ip in [
        Some("0.0.0.0"),
        Some("10.8.0.4"),
        Some("172.16.3.3"),
        Some("192.168.1.1"),
        Some("169.254.0.9"),
        None,
    ] {
        emu.set_address(key(&id), ip);
        let i = p.get(&id).await.unwrap();
        assert_eq!(
            (i.state, i.ip.as_str()),
            (State::Provisioning, ""),
            "{ip:?}"
        );
    }
    emu.set_address(key(&id), Some("198.51.100.20"));
    assert_eq!(p.get(&id).await.unwrap().ip, "198.51.100.20");
    emu.set_locked(key(&id), true);
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Running,
        "locked keeps its last state"
    );
    emu.set_locked(key(&id), false);
    for (status, want) in [
        ("suspended", State::Stopped),
        ("resizing", State::Provisioning),
        ("pending", State::Provisioning),
    ] {
        emu.set_backend_state(key(&id), status);
        assert_eq!(p.get(&id).await.unwrap().state, want, "{status}");
    }
}

/// GC's list follows `meta.links.next` over several pages of 500 of every instance and
/// keeps exactly the managed instances of this installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_cursor_pages_and_checks_the_marks() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let plant = |n: usize, managed: bool, inst: &str| {
        emu.plant(Plant {
            name: format!("p-{n}"),
            scope: if n.is_multiple_of(2) {
                "ewr".into()
            } else {
                "fra".into()
            },
            managed,
            uid: Some(format!("u-{n}")),
            installation: Some(inst.into()),
            created_at: Some(1_700_000_000),
        })
    };
    for n in 0..1100 {
        plant(n, true, INST);
    }
    plant(5000, false, INST);
    plant(5001, true, "someone-else");
    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(listed.len(), 1100);
    assert!(
        listed
            .iter()
            .all(|i| i.uid.starts_with("u-") && i.created_at.is_some())
    );
    assert!(
        listed.iter().any(|i| i.id.starts_with("fra/"))
            && listed.iter().any(|i| i.id.starts_with("ewr/"))
    );
    let lists: Vec<String> = emu
        .requests()
        .into_iter()
        .filter(|c| c.starts_with("GET /v2/instances?per_page=500"))
        .collect();
    assert_eq!(lists.len(), 3, "1102 instances, all of them: {lists:?}");
    assert!(
        lists[0].contains("per_page=500") && lists[1].contains("&cursor="),
        "{lists:?}"
    );
    emu.fail_scope("fra", true);
    assert_eq!(
        p.list_by_tag(INST).await.unwrap_err().class,
        Class::Transient,
        "fail-whole"
    );
}

/// `tag` of `GET /v2/instances` is deprecated in Vultr's specification (its list parameters
/// are `per_page`, `cursor`, `tag` (deprecated), `label`, `main_ip` and `region`), and the
/// emulator ignores it: the plugin lists without it and keeps what carries its marks, in
/// GC's list and in the health check's count of managed instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_without_the_deprecated_tag_filter_and_checks_the_marks_itself() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let mut req = request("uid-ours");
    req.placement.region = "fra".into();
    let id = p.create(&req).await.unwrap();
    let plant = |name: &str, managed: bool, installation: &str| {
        emu.plant(Plant {
            name: name.into(),
            scope: "fra".into(),
            managed,
            uid: Some(format!("uid-{name}")),
            installation: Some(installation.into()),
            created_at: Some(1_700_000_000),
        })
    };
    plant("theirs", true, "someone-else");
    plant("unmarked", false, INST);
    let listed: Vec<(String, String)> = p
        .list_by_tag(INST)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.uid))
        .collect();
    assert_eq!(listed, [(id, req.uid.clone())]);
    let counts: Vec<(String, String)> = p
        .check()
        .await
        .unwrap()
        .into_iter()
        .map(|t| {
            let n = t.details.iter().find(|(k, _)| k == "managedInstances");
            (t.target, n.map(|(_, v)| v.clone()).unwrap_or_default())
        })
        .collect();
    assert_eq!(
        counts,
        [("ewr".into(), "0".into()), ("fra".into(), "2".into())],
        "ours and theirs carry the managed mark, the third does not"
    );
    let deprecated: Vec<String> = emu
        .requests()
        .into_iter()
        .filter(|c| c.contains("tag="))
        .collect();
    assert!(deprecated.is_empty(), "{deprecated:?}");
}

/// Vultr labels are not unique: a twin left by a racing or crashed create is removed and
/// the oldest kept; an instance with the label and another UID is never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_are_settled_and_foreign_names_refused() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let req = request("uid-twin");
    let id = p.create(&req).await.unwrap();
    let tags = vec![
        format!("{MARK_MANAGED}=true"),
        format!("{MARK_UID}=uid-twin"),
        format!("{MARK_INSTALLATION}={INST}"),
    ];
    let mut twin = Record::new(
        "ffffffff-0000-4000-8000-00000000ffff".into(),
        req.name.clone(),
        "ewr".into(),
        Extra {
            tags,
            ..Extra::default()
        },
    );
    twin.state = "active".into();
    twin.created_at += 60;
    emu.insert_record(twin);
    assert_eq!(emu.dump().instances.len(), 2);
    assert_eq!(p.create(&req).await.unwrap(), id, "the older one is kept");
    let left: Vec<String> = emu.dump().instances.into_iter().map(|i| i.id).collect();
    assert_eq!(left, [key(&id).to_string()]);

    let race = request("uid-race");
    let (a, b) = tokio::join!(p.create(&race), p.create(&race));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(
        emu.dump()
            .instances
            .iter()
            .filter(|i| i.name == name_from_uid("uid-race"))
            .count(),
        1
    );

    let mut other = request("uid-other");
    other.name = req.name.clone();
    let err = p.create(&other).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("NameTaken")),
        "{err}"
    );
}

/// Faults as Vultr answers them: 429 and the instance limit wait (QuotaExceeded), a 400
/// for a locked instance passes (Transient), 500 is Transient, 401 Permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vultr_errors_get_their_class() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let id = p.create(&request("uid-e")).await.unwrap();

    // Vultr's documented limit answers 429: the operator waits (QuotaExceeded).
    emu.set_rate_limit(Some(RateLimit {
        per_hour: 1,
        burst: 1,
    }));
    p.get(&id).await.unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("HTTP429")),
        "{err}"
    );
    emu.set_rate_limit(None);

    let id = p.create(&request("uid-e2")).await.unwrap();
    emu.inject_error(FaultOp::Create, VultrError::new(400, INSTANCE_LIMIT), 1);
    let err = p.create(&request("uid-e3")).await.unwrap_err();
    assert_eq!(err.class, Class::QuotaExceeded, "{err}");
    assert!(
        err.message.contains("maximum number of active instances"),
        "{err}"
    );
    emu.inject_error(FaultOp::Create, VultrError::new(400, "Invalid plan"), 1);
    assert_eq!(
        p.create(&request("uid-e3")).await.unwrap_err().class,
        Class::Permanent
    );

    emu.set_locked(key(&id), true);
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("Locked")),
        "{err}"
    );
    emu.set_locked(key(&id), false);
    p.delete(&id).await.unwrap();

    for (kind, want) in [
        (FaultKind::ServerError, Class::Transient),
        (FaultKind::Auth, Class::Permanent),
    ] {
        emu.inject(Fault {
            op: FaultOp::Get,
            kind: kind.clone(),
            count: 1,
        });
        assert_eq!(p.get(&id).await.unwrap_err().class, want, "{kind:?}");
    }
    assert_eq!(
        p.get("ewr/00000000-0000-4000-8000-0000000fffff")
            .await
            .unwrap_err()
            .class,
        Class::NotFound
    );
    p.delete("ewr/00000000-0000-4000-8000-0000000fffff")
        .await
        .unwrap();
    for bad in ["", "ewr", "ewr/", "EWR/abc", "ewr/ABC", "ewr/a/b", "../x"] {
        assert_eq!(
            p.get(bad).await.unwrap_err().class,
            Class::Permanent,
            "{bad:?}"
        );
    }
}

/// A placement's price from Vultr's plan catalogue (`GET /v2/plans`, followed over its
/// cursor to the second page): the monthly price over Vultr's 672-hour cap, in US dollars,
/// exactly; none where the plan is not valid for use; a failed catalogue read classified as
/// any other call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_reads_the_plan_catalogue() {
    let _dir = plugins_or_skip!();
    let catalogue = || VultrConfig {
        // 600 plans sort before it: the one asked for is on the second page of 500.
        plans: (0..600)
            .map(|n| PlanOffer::new(&format!("vc2-0{n:03}c-1gb"), 7.0, &["ewr", "fra"]))
            .chain([PlanOffer::new("vc2-1c-1gb", 5.0, &["ewr"])])
            .collect(),
        ..VultrConfig::new(TOKEN)
    };
    let v = setup_with(catalogue()).await;
    let usd = |micros_per_hour| {
        Some(egress_plugin_host::provider::Price {
            currency: "USD".into(),
            micros_per_hour,
        })
    };
    // 5 / 672 dollars an hour: 7,440.476 micros.
    assert_eq!(v.p.quote(&placement("ewr")).await.unwrap(), usd(7_440));
    let plans = v.emu.stats().by_call.get("GET /v2/plans").copied();
    assert_eq!(plans, Some(2), "both pages read");
    assert_eq!(v.p.quote(&placement("fra")).await.unwrap(), None);
    let e = v.p.quote(&placement("sgp")).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e}");
    assert!(e.message.contains("sgp"), "{e}");

    let failing = setup_with(catalogue()).await;
    failing.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::ServerError,
        count: 1,
    });
    let e = failing.p.quote(&placement("ewr")).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Transient, Some("HTTP500")),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_is_refused_before_any_call() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    for (field, value, code) in [
        ("region", "mars", "InvalidRegion"),
        ("machineType", "vc9", "InvalidMachineType"),
        ("image", "2136", "InvalidImage"),
    ] {
        let mut req = request("uid-p");
        match field {
            "region" => req.placement.region = value.into(),
            "machineType" => req.placement.machine_type = value.into(),
            _ => req.placement.image = value.into(),
        }
        let err = vu.p.create(&req).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some(code))
        );
        assert!(
            err.message
                .contains(&format!("placement.{field} {value:?}")),
            "{err}"
        );
    }
    assert!(vu.emu.requests().is_empty(), "{:?}", vu.emu.requests());
}

/// A bad config stops the provider at load, with a message naming the field and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let plugin = support::load(&rt, "vultr.wasm").await;
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let cases = [
        (
            "regions: [EWR], plans: [p], images: {d: 1}",
            "config.regions entry \"EWR\" is invalid",
        ),
        (
            "regions: [], plans: [p], images: {d: 1}",
            "config.regions is empty",
        ),
        (
            "regions: [ewr], plans: [p], images: {d: 0}",
            "config.images.d 0 is invalid",
        ),
        (
            "regions: [ewr], plans: [p], images: {d: debian}",
            "config.images.d",
        ),
        (
            "regions: [ewr], plans: ['a b'], images: {d: 1}",
            "config.plans entry \"a b\" is invalid",
        ),
        (
            "regions: [ewr], plans: [p], images: {d: 1}, firewallGroupId: nope!",
            "config.firewallGroupId \"nope!\" is invalid",
        ),
        (
            "regions: [ewr], plans: [p], images: {d: 1}, size: 3",
            "unknown field `size`",
        ),
    ];
    for (config, want) in cases {
        let yaml = format!(
            "name: vu\nplugin: vultr.wasm\nsecrets: {{token: {}}}\nconfig: {{{config}}}",
            token.display()
        );
        let err = rt
            .provider(plugin.clone(), &support::entry(&yaml))
            .await
            .err()
            .unwrap_or_else(|| panic!("{config} loaded"));
        assert!(format!("{err}").contains(want), "{config}: {err}");
    }
    let yaml = format!(
        "name: vu\nplugin: vultr.wasm\nsecrets: {{token: {}}}\nconfig: {{endpoint: 'https://api.vultr.com', regions: [ewr], plans: [p], images: {{d: 1}}}}",
        token.display()
    );
    let err = rt
        .provider(plugin.clone(), &support::entry(&yaml))
        .await
        .err()
        .unwrap();
    assert!(
        format!("{err}").contains("config.endpoint \"https://api.vultr.com\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_probes_each_region_in_config_order() {
    let _dir = plugins_or_skip!();
    let vu = setup().await;
    let (p, emu) = (&vu.p, &vu.emu);
    let mut req = request("uid-c");
    req.placement.region = "fra".into();
    p.create(&req).await.unwrap();
    let targets = p.check().await.expect("vultr has a check");
    let shown: Vec<(&str, bool, Option<&str>)> = targets
        .iter()
        .map(|t| {
            (
                t.target.as_str(),
                t.ready,
                t.details
                    .iter()
                    .find(|(k, _)| k == "managedInstances")
                    .map(|(_, v)| v.as_str()),
            )
        })
        .collect();
    assert_eq!(shown, [("ewr", true, Some("0")), ("fra", true, Some("1"))]);
    emu.fail_scope("fra", true);
    let ready: Vec<bool> = p.check().await.unwrap().iter().map(|t| t.ready).collect();
    assert_eq!(ready, [true, false]);
    emu.inject(Fault {
        op: FaultOp::List,
        kind: FaultKind::Auth,
        count: 2,
    });
    let targets = p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unauthorized"),
        "{targets:?}"
    );
}

/// A cloud-init sentinel and a token sentinel never reach an error, a log line or a span,
/// and the host had nothing to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-vu-7a1e";
    const TOKEN_SENTINEL: &str = "TOKEN-SENTINEL-vu-33aa";
    let (_guard, captured) = proxy_operator::testing::capture();
    let vu = setup_with(VultrConfig::new(TOKEN_SENTINEL)).await;
    let p = egress_plugin_host::provider::Instrumented::new(vu.p, Default::default());
    let mut req = request("uid-s");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let bad = CreateRequest {
        cloud_init: req.cloud_init.clone(),
        ..request("uid-s2")
    };
    let refuse = || {
        vu.emu.inject_error(
            FaultOp::Create,
            VultrError::new(400, "Invalid user_data"),
            1,
        )
    };
    let seen = support::sentinels::exercise(&p, &vu.emu, &req, &bad, refuse).await;
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, TOKEN_SENTINEL],
        "vultr create",
    );
}

/// The whole lifecycle against the real API (`backend-test=integration-tag`): one
/// instance in `VULTR_REGION` (default ewr) with `VULTR_PLAN` (default vc2-1c-1gb) and
/// `VULTR_OS_ID` (default 2136, Debian 12), for a few minutes (billed), deleted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs VULTR_API_KEY (an API key of an account to create an instance in); run with --ignored"]
async fn real_vultr_lifecycle() {
    let _dir = plugins_or_skip!();
    let Ok(token) = std::env::var("VULTR_API_KEY") else {
        eprintln!("SKIPPING real_vultr_lifecycle: VULTR_API_KEY is not set");
        return;
    };
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
    let (region, plan, os_id) = (
        env("VULTR_REGION", "ewr"),
        env("VULTR_PLAN", "vc2-1c-1gb"),
        env("VULTR_OS_ID", "2136"),
    );
    let secrets = tempfile::tempdir().unwrap();
    let path = secrets.path().join("token");
    std::fs::write(&path, token).unwrap();
    let yaml = format!(
        "name: vu-real\nplugin: vultr.wasm\nsecrets: {{token: {}}}\n\
         config: {{regions: [{region}], plans: [{plan}], images: {{os: {os_id}}}}}",
        path.display()
    );
    let p = support::provider(&support::runtime(), "vultr.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new(&region, "", &plan, "os"),
        installation: support::real_cloud::INSTALLATION.into(),
        ..request(&uid)
    };
    support::real_cloud::lifecycle(
        &p,
        &req,
        support::real_cloud::Pace {
            running_within: Duration::from_secs(600),
            gone_within: Duration::from_secs(300),
            poll: Duration::from_secs(10),
            while_deleting: |i| assert_ne!(i.state, State::Running, "{i:?}"),
        },
    )
    .await;
}
