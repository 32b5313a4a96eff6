//! The Linode plugin through the host, against the Linode emulator: the conformance suite,
//! then what is particular to Linode (tags as marks, provisioning -> booting -> running,
//! an `offline` Linode that was just created, user data through Metadata, the root
//! password, the account limit, `Linode busy.`, the dedicated create rate limit) and
//! config errors that name the field and value.
//!
//! The last test runs the lifecycle against the real API and is ignored unless asked for
//! (see docs/providers/linode.md, "Testing against Linode").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use egress_emulators::linode::{LinodeConfig, LinodeEmulator, TypePrice};
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Provider, State};
use std::time::{Duration, SystemTime};

const TOKEN: &str = "ln-test-token";
const INST: &str = "inst-a";

struct Ln {
    emu: LinodeEmulator,
    p: WasmProvider,
    _secrets: tempfile::TempDir,
}

fn entry(url: &str, token: &std::path::Path, extra: &str) -> String {
    format!(
        "name: ln\nplugin: linode.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{token: {token}}}\n\
         config: {{endpoint: '{url}/v4', regions: [us-east, eu-central, us-southeast], \
         types: [g6-nanode-1], images: [linode/debian12]{extra}}}",
        token = token.display()
    )
}

async fn setup_with(cfg: LinodeConfig, extra: &str) -> Ln {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, format!("{}\n", cfg.token)).unwrap();
    let emu = LinodeEmulator::start(cfg);
    let p = support::provider(
        &support::runtime(),
        "linode.wasm",
        &entry(&emu.url(), &token, extra),
    )
    .await;
    Ln {
        emu,
        p,
        _secrets: secrets,
    }
}

async fn setup() -> Ln {
    setup_with(LinodeConfig::new(TOKEN), "").await
}

fn request(uid: &str, region: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\npackages: [tinyproxy]\n".to_vec(),
        port: 8888,
        ..CreateRequest::new(
            uid,
            INST,
            Placement::new(
                region,
                "zones-are-ignored",
                "g6-nanode-1",
                "linode/debian12",
            ),
        )
    }
}

fn backend_id(id: &str) -> &str {
    id.rsplit('/').next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linode_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let ln = setup().await;
    let placement = request("suite", "us-east").placement;
    support::suite::assert_passes(&ln.p, &ln.emu, placement).await;
}

/// Provisioning, then booting (still Provisioning: booting is not stopped), then Running
/// with the IPv4; the marks are tags; user data arrives byte for byte; delete twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_boots_marks_with_tags_and_cleans_up() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    let uid = "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01";
    let req = request(uid, "eu-central");
    let id = p.create(&req).await.unwrap();
    assert!(id.starts_with("eu-central/"), "{id}");
    let lid = backend_id(&id).to_string();
    let statuses = |emu: &LinodeEmulator| {
        emu.linode(&lid).unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut seen = Vec::new();
    let running = loop {
        let before = statuses(&emu);
        let i = p.get(&id).await.unwrap();
        seen.push((before, i.state));
        if i.state == State::Running {
            break i;
        }
        assert!(seen.len() < 5, "{seen:?}");
    };
    assert_eq!(
        seen,
        [
            ("provisioning".to_string(), State::Provisioning),
            ("booting".to_string(), State::Provisioning),
            ("running".to_string(), State::Running)
        ]
    );
    assert!(
        !running.ip.is_empty() && running.uid == uid && running.created_at.is_some(),
        "{running:?}"
    );
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by label"
    );

    let extra = emu.extra(&lid).unwrap();
    assert_eq!(
        extra.tags,
        [
            "egress-managed".to_string(),
            format!("egress-uid:{uid}"),
            format!("egress-inst:{INST}")
        ]
    );
    let dump = emu.dump().instances;
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].user_data, req.cloud_init);
    for (k, v) in [
        (MARK_MANAGED, "true"),
        (MARK_UID, uid),
        (MARK_INSTALLATION, INST),
    ] {
        assert!(
            dump[0].labels.contains(&(k.to_string(), v.to_string())),
            "{:?}",
            dump[0].labels
        );
    }
    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert!(
        p.list_by_tag("another-installation")
            .await
            .unwrap()
            .is_empty()
    );

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert!(emu.dump().instances.is_empty());
}

/// Linode requires `root_pass` with an image: the plugin makes a strong one per create,
/// which goes to Linode and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_create_sends_its_own_strong_root_password() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    let a = p.create(&request("uid-pw-1", "us-east")).await.unwrap();
    let b = p.create(&request("uid-pw-2", "us-east")).await.unwrap();
    let pass = |id: &str| emu.extra(backend_id(id)).unwrap().root_pass;
    let (pa, pb) = (pass(&a), pass(&b));
    assert!(
        pa.len() >= 32 && pb.len() >= 32,
        "{} {}",
        pa.len(),
        pb.len()
    );
    assert_ne!(pa, pb);
    // Not in the instance the operator sees, nor in the IDs.
    let i = p.get(&a).await.unwrap();
    assert!(!format!("{i:?}").contains(&pa) && !a.contains(&pa));
}

/// A Linode that reads `offline` right after creation is on its way up, not stopped; an
/// old one is stopped. Statuses of jobs that end by themselves are Provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_just_created_linode_is_never_stopped() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    let id = p.create(&request("uid-off", "us-east")).await.unwrap();
    for status in [
        "offline",
        "booting",
        "rebooting",
        "busy",
        "migrating",
        "provisioning",
    ] {
        emu.set_backend_state(backend_id(&id), status);
        assert_eq!(
            p.get(&id).await.unwrap().state,
            State::Provisioning,
            "{status}"
        );
    }
    let hour_ago = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    let old = emu.plant(Plant {
        name: "proxy-old".into(),
        scope: "us-east".into(),
        managed: true,
        uid: Some("uid-old".into()),
        installation: Some(INST.into()),
        created_at: Some(hour_ago),
    });
    let old_id = format!("us-east/{old}");
    for (status, want) in [
        ("offline", State::Stopped),
        ("shutting_down", State::Stopped),
        ("deleting", State::Terminated),
    ] {
        emu.set_backend_state(&old, status);
        let i = p.get(&old_id).await.unwrap();
        assert_eq!(
            (i.state, i.created_at),
            (
                want,
                Some(SystemTime::UNIX_EPOCH + Duration::from_secs(hour_ago))
            ),
            "{status}"
        );
    }
}

/// User data travels through Metadata, which only some regions have: elsewhere Linode's
/// refusal is permanent and names the field. Oversized cloud-init never leaves the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_data_needs_a_metadata_region_and_fits_65535_bytes() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    let err = p
        .create(&request("uid-md", "us-southeast"))
        .await
        .unwrap_err();
    assert_eq!(err.class, Class::Permanent, "{err}");
    assert!(err.message.contains("metadata.user_data"), "{err}");
    let mut big = request("uid-big", "us-east");
    big.cloud_init = vec![b'#'; 65_536];
    let err = p.create(&big).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("UserDataTooLarge")),
        "{err}"
    );
    assert!(emu.dump().instances.is_empty());
    // Without cloud-init a region without Metadata is fine.
    let mut plain = request("uid-plain", "us-southeast");
    plain.cloud_init.clear();
    p.create(&plain).await.unwrap();
}

/// Linode's own failures, each with the class the operator needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_limit_busy_and_taken_labels() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    emu.inject(Fault {
        op: FaultOp::Create,
        kind: FaultKind::Quota,
        count: 1,
    });
    let err = p.create(&request("uid-q", "us-east")).await.unwrap_err();
    assert_eq!(err.class, Class::QuotaExceeded, "{err}");
    assert!(err.message.contains("Account Limit reached"), "{err}");

    let id = p.create(&request("uid-b", "us-east")).await.unwrap();
    emu.set_locked(backend_id(&id), true);
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("Linode busy.")),
        "{err}"
    );
    emu.set_locked(backend_id(&id), false);
    p.delete(&id).await.unwrap();

    // The label of this Proxy held by a Linode of another: permanent, never adopted.
    let req = request("uid-t", "us-east");
    emu.plant(Plant {
        name: req.name.clone(),
        scope: "us-east".into(),
        managed: true,
        uid: Some("someone-else".into()),
        installation: Some(INST.into()),
        created_at: None,
    });
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("NameTaken")),
        "{err}"
    );
}

/// The dedicated limit of `POST /linode/instances` (20 per 15 s): the 21st create in a
/// burst is QuotaExceeded, so the operator waits instead of backing off fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_create_rate_limit_is_quota_exceeded() {
    let _dir = plugins_or_skip!();
    let cfg = LinodeConfig {
        create_limit: true,
        ..LinodeConfig::new(TOKEN)
    };
    let Ln { emu, p, _secrets } = setup_with(cfg, "").await;
    for n in 0..20 {
        p.create(&request(&format!("uid-rl-{n}"), "us-east"))
            .await
            .unwrap();
    }
    let err = p
        .create(&request("uid-rl-20", "us-east"))
        .await
        .unwrap_err();
    assert_eq!(err.class, Class::QuotaExceeded, "{err}");
    assert!(err.message.contains("retry after"), "{err}");
    assert_eq!(emu.dump().instances.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_region() {
    let _dir = plugins_or_skip!();
    let Ln { emu, p, _secrets } = setup().await;
    p.create(&request("uid-c", "eu-central")).await.unwrap();
    let targets = p.check().await.unwrap();
    let got: Vec<(&str, bool)> = targets
        .iter()
        .map(|t| (t.target.as_str(), t.ready))
        .collect();
    assert_eq!(
        got,
        [
            ("us-east", true),
            ("eu-central", true),
            ("us-southeast", true)
        ]
    );
    let managed = |t: &str| {
        targets
            .iter()
            .find(|x| x.target == t)
            .unwrap()
            .details
            .clone()
    };
    assert!(
        managed("eu-central").contains(&("managedLinodes".into(), "1".into())),
        "{:?}",
        managed("eu-central")
    );
    emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 3,
    });
    let targets = p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unauthorized"),
        "{targets:?}"
    );
}

/// Bad config is refused at load, with the field and the value in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let base = format!(
        "name: ln\nplugin: linode.wasm\nsecrets: {{token: {}}}\nconfig: ",
        token.display()
    );
    let cases = [
        (
            "{regions: [US-East], types: [g6-nanode-1], images: [linode/debian12]}",
            &["config.regions", "US-East"][..],
        ),
        (
            "{regions: [us-east], types: [g6-nanode-1], images: [linode/debian12], firewallId: 0}",
            &["config.firewallId", "0"],
        ),
        (
            "{regions: [us-east], types: [], images: [linode/debian12]}",
            &["config.types", "empty"],
        ),
        (
            "{endpoint: 'https://api.linode.com/v3', regions: [us-east], types: [g6-nanode-1], images: [x]}",
            &["config.endpoint", "https://api.linode.com/v3"],
        ),
        (
            "{regions: [us-east], types: [g6-nanode-1], images: [linode/debian12], rootPass: hunter2}",
            &["rootPass"],
        ),
        (
            "{regions: [us-east], types: [g6-nanode-1], images: ['has space']}",
            &["config.images", "has space"],
        ),
    ];
    for (config, want) in cases {
        let plugin = support::load(&rt, "linode.wasm").await;
        let err = rt
            .provider(plugin, &support::entry(&format!("{base}{config}")))
            .await
            .err()
            .expect(config)
            .to_string();
        for w in want {
            assert!(err.contains(w), "{config}: {err:?} lacks {w:?}");
        }
    }
}

/// A cloud-init sentinel and a credential sentinel never reach an error, a log line or a
/// span, through success and failure paths alike, and the host had nothing to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-ln-4b7d";
    const TOKEN_SENTINEL: &str = "TOKEN-SENTINEL-ln-e05c";
    let (_guard, captured) = proxy_operator::testing::capture();
    let s = setup_with(LinodeConfig::new(TOKEN_SENTINEL), "").await;
    let p = egress_plugin_host::provider::Instrumented::new(s.p, Default::default());
    let mut req = request("uid-s", "us-east");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let bad = CreateRequest {
        cloud_init: req.cloud_init.clone(),
        ..request("uid-s2", "us-east")
    };
    let refuse = || {
        s.emu.inject(Fault {
            op: FaultOp::Create,
            kind: FaultKind::Quota,
            count: 1,
        })
    };
    let seen = support::sentinels::exercise(&p, &s.emu, &req, &bad, refuse).await;
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, TOKEN_SENTINEL],
        "linode create",
    );
}

/// The whole lifecycle against the real API (`backend-test=integration-tag`). Creates one
/// Nanode for a few minutes in `LINODE_REGION` (default us-east) and deletes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs LINODE_TOKEN (a personal access token with Linodes read/write); creates a billed Linode; run with --ignored"]
async fn real_linode_lifecycle() {
    let _dir = plugins_or_skip!();
    let Ok(token) = std::env::var("LINODE_TOKEN") else {
        eprintln!("SKIPPING real_linode_lifecycle: LINODE_TOKEN is not set");
        return;
    };
    let region = std::env::var("LINODE_REGION").unwrap_or_else(|_| "us-east".into());
    let linode_type = std::env::var("LINODE_TYPE").unwrap_or_else(|_| "g6-nanode-1".into());
    let secrets = tempfile::tempdir().unwrap();
    let path = secrets.path().join("token");
    std::fs::write(&path, token).unwrap();
    let yaml = format!(
        "name: ln-real\nplugin: linode.wasm\nsecrets: {{token: {}}}\n\
         config: {{regions: [{region}], types: [{linode_type}], images: [linode/debian12]}}",
        path.display()
    );
    let p = support::provider(&support::runtime(), "linode.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let mut req = request(&uid, &region);
    req.placement.machine_type = linode_type;
    req.installation = support::real_cloud::INSTALLATION.into();

    support::real_cloud::lifecycle(
        &p,
        &req,
        support::real_cloud::Pace {
            running_within: Duration::from_secs(600),
            gone_within: Duration::from_secs(300),
            ..support::real_cloud::Pace::default()
        },
    )
    .await;
}

/// A placement's price from Linode's public price list: the type's hourly price, or the
/// region's own where Linode prices a region apart, in US dollars. The host asks once per
/// placement (the second quote sends no request); a spot placement is refused by name (the
/// plugin has none), and a type the config does not allow is refused as a create would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_reads_the_type_price_list() {
    let _dir = plugins_or_skip!();
    let cfg = LinodeConfig {
        prices: vec![TypePrice::new(
            "g6-nanode-1",
            0.0075,
            &[("eu-central", 0.0081)],
        )],
        ..LinodeConfig::new(TOKEN)
    };
    let ln = setup_with(cfg, "").await;
    let at = |region: &str| Placement::new(region, "", "g6-nanode-1", "linode/debian12");
    let usd = |micros_per_hour| {
        Some(egress_plugin_host::provider::Price {
            currency: "USD".into(),
            micros_per_hour,
        })
    };
    assert_eq!(ln.p.quote(&at("us-east")).await.unwrap(), usd(7_500));
    assert_eq!(ln.p.quote(&at("eu-central")).await.unwrap(), usd(8_100));
    let types = |s: &egress_emulators::control::RequestStats| {
        s.by_call
            .get("GET /v4/linode/types/{typeId}")
            .copied()
            .unwrap_or(0)
    };
    let before = types(&ln.emu.stats());
    assert_eq!(before, 2);
    assert_eq!(ln.p.quote(&at("us-east")).await.unwrap(), usd(7_500));
    assert_eq!(types(&ln.emu.stats()), before, "kept: no second request");

    let spot = Placement {
        capacity: egress_plugin_host::provider::Capacity::Spot,
        ..at("us-east")
    };
    let e = ln.p.quote(&spot).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Permanent, Some("Unsupported")),
        "{e}"
    );
    assert!(e.message.contains("placement.capacity Spot"), "{e}");
    let other = Placement::new("us-east", "", "g6-dedicated-2", "linode/debian12");
    let e = ln.p.quote(&other).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e}");
    assert!(e.message.contains("g6-dedicated-2"), "{e}");
    // A failure is kept as "no price" for the hour: the plugin is not run again for it.
    assert_eq!(ln.p.quote(&other).await.unwrap(), None);
}
