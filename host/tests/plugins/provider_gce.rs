//! The GCE plugin through the host, against the GCE emulator: the conformance suite, then
//! what is GCE's own: service-account JWTs and the token cache (a refused key is permanent,
//! an expired token is renewed inside the call), workload identity through the metadata
//! server only when the operator lists it, insert operations that fail after the insert
//! (reported with GCE's code and class, never as not-found), labels, the external address,
//! the aggregated list's pages and unreachable zones, config errors that name the field.
//!
//! The last test runs the lifecycle against the real API and is ignored unless asked for
//! (docs/providers/gce.md, "Testing").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use egress_emulators::gce::test_keys::{TEST_CLIENT_EMAIL, TEST_KEY_PEM, WRONG_KEY_PEM};
use egress_emulators::gce::{GceConfig, GceEmulator};
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Capacity, Class, CreateRequest, Placement, Provider, State};
use std::path::Path;
use std::time::Duration;

const INST: &str = "inst-a";
const ZONE: &str = "europe-west1-b";

struct Gce {
    emu: GceEmulator,
    p: WasmProvider,
    secrets: tempfile::TempDir,
}

fn entry(url: &str, key: &Path, extra: &str) -> String {
    format!(
        "name: gce\nplugin: gce.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{serviceAccountKey: {key}}}\n\
         config: {{project: emulator-project, zones: [europe-west1-b, us-central1-a], \
         machineTypes: [e2-micro], endpoint: '{url}/compute/v1', networkTags: [egress-proxy], \
         images: {{debian: projects/debian-cloud/global/images/family/debian-12, \
         broken: projects/debian-cloud/global/images/family/debian-99}}}}{extra}",
        key = key.display()
    )
}

/// The emulator and the plugin with the key file holding `key(emu)`.
async fn setup_with(cfg: GceConfig, key: impl Fn(&GceEmulator) -> String) -> Gce {
    let secrets = tempfile::tempdir().unwrap();
    let emu = GceEmulator::start(cfg);
    let path = secrets.path().join("key.json");
    std::fs::write(&path, key(&emu)).unwrap();
    let yaml = entry(&emu.url(), &path, "");
    let p = support::provider(&support::runtime(), "gce.wasm", &yaml).await;
    Gce { emu, p, secrets }
}

async fn setup() -> Gce {
    setup_with(GceConfig::default(), |e| e.test_key_json()).await
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n".to_vec(),
        ..CreateRequest::new(uid, INST, Placement::new("", ZONE, "e2-micro", "debian"))
    }
}

/// The emulator's own id of the instance called `name` (what its control surface takes).
fn bid(emu: &GceEmulator, name: &str) -> String {
    emu.dump()
        .instances
        .into_iter()
        .find(|i| i.name == name)
        .expect("instance")
        .id
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gce_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let placement = Placement::new("europe-west1", ZONE, "e2-micro", "debian");
    support::suite::assert_passes(&g.p, &g.emu, placement).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_labels_user_data_and_the_nat_ip() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let req = request("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01");

    let id = p.create(&req).await.unwrap();
    assert_eq!(id, format!("emulator-project/{ZONE}/{}", req.name));
    let first = p.get(&id).await.unwrap();
    assert_eq!((first.state, first.ip.as_str()), (State::Provisioning, ""));
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    let vm = &dump.instances[0];
    assert_eq!(
        vm.user_data, req.cloud_init,
        "user-data metadata, byte for byte"
    );
    assert_eq!(label(&vm.labels, MARK_MANAGED), Some("true"));
    assert_eq!(label(&vm.labels, MARK_UID), Some(req.uid.as_str()));
    assert_eq!(label(&vm.labels, MARK_INSTALLATION), Some(INST));
    let raw = emu.instance(&id).unwrap();
    assert_eq!(
        raw["labels"],
        serde_json::json!({"egress-managed": "true", "egress-uid": req.uid, "egress-installation": INST})
    );
    assert_eq!(raw["tags"]["items"], serde_json::json!(["egress-proxy"]));
    assert_eq!(
        raw["disks"][0]["autoDelete"], true,
        "the boot disk goes with it"
    );
    assert!(
        raw["machineType"]
            .as_str()
            .unwrap()
            .ends_with("/zones/europe-west1-b/machineTypes/e2-micro")
    );

    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(
        running.ip.starts_with("203.0.113."),
        "natIP, never the internal address: {}",
        running.ip
    );
    assert_eq!(running.uid, req.uid);
    assert!(running.created_at.is_some());
    let b = bid(emu, &req.name);
    emu.set_address(&b, None);
    let no_ip = p.get(&id).await.unwrap();
    assert_eq!((no_ip.state, no_ip.ip.as_str()), (State::Provisioning, ""));
    emu.set_address(&b, Some("203.0.113.99"));
    for (status, want) in [
        ("TERMINATED", State::Stopped),
        ("REPAIRING", State::Provisioning),
        ("SUSPENDED", State::Stopped),
    ] {
        emu.set_backend_state(&b, status);
        assert_eq!(p.get(&id).await.unwrap().state, want, "{status}");
    }
    emu.set_backend_state(&b, "RUNNING");

    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.id.as_str(), i.uid.as_str()))
            .collect::<Vec<_>>(),
        [(id.as_str(), req.uid.as_str())]
    );
    assert!(p.list_by_tag("inst-b").await.unwrap().is_empty());

    // An instance of the name with another Proxy's uid is not adopted.
    let mine = request("uid-mine");
    emu.plant(Plant {
        name: mine.name.clone(),
        scope: ZONE.into(),
        managed: true,
        uid: Some("uid-theirs".into()),
        installation: Some(INST.into()),
        created_at: None,
    });
    let err = p.create(&mine).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("NameTaken")),
        "{err}"
    );

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
}

/// GCE accepts an insert and reports capacity or a bad image in the operation later. `get`
/// answers provisioning while the operation runs, then GCE's error with its class (once),
/// never not-found; after that the name reads as free and a new create works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_insert_operations_are_reported_with_their_class() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let msg = "The zone 'projects/emulator-project/zones/europe-west1-b' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.";
    for (code, class) in [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", Class::QuotaExceeded),
        (
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            Class::QuotaExceeded,
        ),
        ("QUOTA_EXCEEDED", Class::QuotaExceeded),
        ("INVALID_FIELD_VALUE", Class::Permanent),
    ] {
        let req = request(&format!("uid-{}", code.to_lowercase().replace('_', "-")));
        emu.fail_next_insert(code, msg, 1);
        let id = p.create(&req).await.unwrap();
        let pending = p.get(&id).await.unwrap();
        assert_eq!(
            (pending.state, pending.ip.as_str()),
            (State::Provisioning, ""),
            "{code}: operation still running"
        );
        let err = p.get(&id).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (class, Some(code)),
            "{err}"
        );
        assert!(
            err.message.contains("enough resources") && err.message.contains("operation-"),
            "{err}"
        );
        assert_eq!(
            p.get(&id).await.unwrap_err().class,
            Class::NotFound,
            "{code}: reported once, then the name is free"
        );
        assert_eq!(p.create(&req).await.unwrap(), id);
        assert_eq!(
            p.get(&id).await.unwrap().state,
            State::Provisioning,
            "created on the second try"
        );
    }
    // An image GCE does not have: the operation fails with RESOURCE_NOT_FOUND, permanent.
    let mut req = request("uid-bad-image");
    req.placement.image = "broken".into();
    let id = p.create(&req).await.unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("RESOURCE_NOT_FOUND")),
        "{err}"
    );
    assert!(err.message.contains("debian-99"), "{err}");
    assert!(emu.dump().instances.iter().all(|i| i.name != req.name));
}

/// A key the token endpoint refuses will not start working by itself: permanent, from every
/// operation and the check. A key file that is not a key is permanent too, without quoting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_token_endpoint_refuses_is_permanent() {
    let _dir = plugins_or_skip!();
    let g = setup_with(GceConfig::default(), |e| {
        e.key_json(TEST_CLIENT_EMAIL, WRONG_KEY_PEM)
    })
    .await;
    let id = format!("emulator-project/{ZONE}/proxy-x");
    let errs = [
        g.p.create(&request("uid-k")).await.unwrap_err(),
        g.p.get(&id).await.unwrap_err(),
        g.p.delete(&id).await.unwrap_err(),
        g.p.list_by_tag(INST).await.unwrap_err(),
    ];
    for err in errs {
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some("invalid_grant")),
            "{err}"
        );
        assert!(err.message.contains("Invalid JWT Signature"), "{err}");
    }
    let targets = g.p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unauthorized"),
        "{targets:?}"
    );
    assert_eq!(g.emu.grants(), 0);
    assert!(
        g.emu.requests().is_empty(),
        "no API call without a token: {:?}",
        g.emu.requests()
    );

    std::fs::write(
        g.secrets.path().join("key.json"),
        "{\"type\":\"service_account\",\"private_key\":\"SECRET\"}",
    )
    .unwrap();
    let err = g.p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("InvalidKey")),
        "{err}"
    );
    // An old key's token endpoint, not on the allow-list: refused by the host, permanent.
    let old = g.emu.test_key_json().replace(
        &format!("{}/token", g.emu.url()),
        "https://accounts.google.com/o/oauth2/token",
    );
    std::fs::write(g.secrets.path().join("key.json"), old).unwrap();
    let err = g.p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("TokenUriNotAllowed")),
        "{err}"
    );
    assert!(err.message.contains("accounts.google.com"), "{err}");
    std::fs::remove_file(g.secrets.path().join("key.json")).unwrap();
    let err = g.p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("SecretMissing")),
        "{err}"
    );
}

/// Tokens are exchanged once and kept in the host cache; one the API refuses (expired early,
/// revoked) is renewed inside the call, so no call fails for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed_without_a_failed_call() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let id = p.create(&request("uid-t")).await.unwrap();
    for _ in 0..3 {
        p.get(&id).await.unwrap();
    }
    p.list_by_tag(INST).await.unwrap();
    assert_eq!(emu.grants(), 1, "one exchange for all calls");

    emu.expire_tokens();
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Running,
        "renewed inside the call"
    );
    assert_eq!(emu.grants(), 2);
    emu.expire_tokens();
    p.list_by_tag(INST).await.unwrap();
    emu.expire_tokens();
    p.delete(&id).await.unwrap();
    assert_eq!(emu.grants(), 4);
    let refused = emu.stats().by_call.get("DELETE instances.delete").copied();
    assert_eq!(
        refused,
        Some(2),
        "one refused with the old token, one accepted"
    );

    // A token that lives barely a minute is not cached past its life: every call exchanges.
    let short = setup_with(
        GceConfig {
            token_lifetime: 30,
            ..GceConfig::default()
        },
        |e| e.test_key_json(),
    )
    .await;
    let id = short.p.create(&request("uid-short")).await.unwrap();
    short.p.get(&id).await.unwrap();
    assert_eq!(short.emu.grants(), 2);
}

/// `tokenSource: metadata` asks the metadata server, which the operator must list itself:
/// the plugin's defaults never include it, and without it the call is refused, permanently
/// and with a message that says what to list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_uses_the_metadata_server_only_when_listed() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let emu = GceEmulator::start(GceConfig::default());
    let url = emu.url();
    let listed = format!(
        "name: gce-wi\nplugin: gce.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         config: {{project: emulator-project, zones: [europe-west1-b], machineTypes: [e2-micro], \
         endpoint: '{url}/compute/v1', metadataEndpoint: '{url}', tokenSource: metadata, \
         images: {{debian: projects/debian-cloud/global/images/family/debian-12}}}}"
    );
    let p = support::provider(&rt, "gce.wasm", &listed).await;
    let id = p.create(&request("uid-wi")).await.unwrap();
    p.get(&id).await.unwrap();
    assert_eq!(emu.grants(), 1, "one metadata token, cached");
    assert!(p.check().await.unwrap().iter().all(|t| t.ready));

    // The real metadata address, not listed: refused by the host before any packet.
    let unlisted = format!(
        "name: gce-wi2\nplugin: gce.wasm\nadditionalHosts: ['{url}']\n\
         config: {{project: emulator-project, zones: [europe-west1-b], machineTypes: [e2-micro], \
         endpoint: '{url}/compute/v1', tokenSource: metadata, \
         images: {{debian: projects/debian-cloud/global/images/family/debian-12}}}}"
    );
    let p = support::provider(&rt, "gce.wasm", &unlisted).await;
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("MetadataNotAllowed")),
        "{err}"
    );
    assert!(err.message.contains("allowedHosts"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_pages_and_fails_whole() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    for n in 0..505 {
        emu.plant(Plant {
            name: format!("bulk-{n}"),
            scope: if n % 2 == 0 { ZONE } else { "us-central1-a" }.into(),
            managed: true,
            uid: Some(format!("bulk-{n}")),
            installation: Some("inst-bulk".into()),
            created_at: None,
        });
    }
    for (name, uid, inst, managed) in [
        ("no-uid", None, "inst-bulk", true),
        ("other", Some("x"), "inst-other", true),
        ("unmanaged", Some("y"), "inst-bulk", false),
    ] {
        emu.plant(Plant {
            name: name.into(),
            scope: ZONE.into(),
            managed,
            uid: uid.map(Into::into),
            installation: Some(inst.into()),
            created_at: None,
        });
    }
    let listed = p.list_by_tag("inst-bulk").await.unwrap();
    assert_eq!(listed.len(), 506);
    assert_eq!(listed.iter().filter(|i| i.uid.is_empty()).count(), 1);
    assert!(
        listed
            .iter()
            .any(|i| i.id == "emulator-project/us-central1-a/bulk-1")
    );
    let requests = emu.requests();
    assert!(
        requests.iter().any(|r| r.contains("pageToken=")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.contains("labels.egress-installation%20%3D%20%22inst-bulk%22")),
        "{requests:?}"
    );

    emu.fail_scope("us-central1-a", true);
    let err = p.list_by_tag("inst-bulk").await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("Unreachable")),
        "{err}"
    );
    assert!(err.message.contains("zones/us-central1-a"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_get_their_class_and_bad_requests_make_no_call() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let cases: [(&str, &str, &str); 3] = [
        ("zone", "mars-west1-a", "placement.zone \"mars-west1-a\""),
        (
            "machineType",
            "e2-huge",
            "placement.machineType \"e2-huge\"",
        ),
        ("image", "ubuntu", "placement.image \"ubuntu\""),
    ];
    for (field, value, text) in cases {
        let mut req = request("uid-p");
        match field {
            "zone" => req.placement.zone = value.into(),
            "machineType" => req.placement.machine_type = value.into(),
            _ => req.placement.image = value.into(),
        }
        let err = p.create(&req).await.unwrap_err();
        assert_eq!(err.class, Class::Permanent, "{err}");
        assert!(err.message.contains(text), "{err}");
    }
    let mut req = request("uid-u");
    req.cloud_init = b"\x1f\x8b\x08\x00\xff".to_vec();
    assert_eq!(
        p.create(&req).await.unwrap_err().code.as_deref(),
        Some("UserDataNotText")
    );
    for bad in [
        "",
        "proxy-x",
        "emulator-project/europe-west1/x",
        "emulator-project/europe-west1-b/X",
        "a/b/c/d",
    ] {
        assert_eq!(
            p.get(bad).await.unwrap_err().code.as_deref(),
            Some("InvalidId"),
            "{bad:?}"
        );
        assert_eq!(
            p.delete(bad).await.unwrap_err().class,
            Class::Permanent,
            "{bad:?}"
        );
    }
    assert!(emu.requests().is_empty(), "{:?}", emu.requests());

    let req = request("uid-c");
    let id = p.create(&req).await.unwrap();
    emu.inject(Fault {
        op: FaultOp::Create,
        kind: FaultKind::Quota,
        count: 1,
    });
    let err = p.create(&request("uid-c2")).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("quotaExceeded")),
        "{err}"
    );
    emu.inject(Fault {
        op: FaultOp::Get,
        kind: FaultKind::RateLimit,
        count: 1,
    });
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("rateLimitExceeded")),
        "{err}"
    );
    emu.set_locked(&bid(emu, &req.name), true);
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("resourceNotReady")),
        "{err}"
    );
}

/// A config the plugin refuses stops the provider at load, with the field and the value.
#[tokio::test]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let plugin = support::load(&rt, "gce.wasm").await;
    let base = "name: gce\nplugin: gce.wasm\nsecrets: {serviceAccountKey: /nonexistent}\nconfig: ";
    let ok = "machineTypes: [e2-micro], images: {d: projects/debian-cloud/global/images/family/debian-12}";
    let cases: Vec<(String, &[&str])> = vec![
        (format!("{{project: My_Project, zones: [europe-west1-b], {ok}}}"), &["config.project", "\"My_Project\""]),
        (format!("{{project: my-project, zones: [europe-west1], {ok}}}"), &["config.zones", "\"europe-west1\""]),
        ("{project: my-project, zones: [europe-west1-b], machineTypes: [e2-micro], images: {d: 'x y'}}".into(), &["config.images[\"d\"]", "\"x y\""]),
        (format!("{{project: my-project, zones: [europe-west1-b], network: 'a b', {ok}}}"), &["config.network", "\"a b\""]),
        (format!("{{project: my-project, zones: [europe-west1-b], tokenSource: env, {ok}}}"), &["config.tokenSource", "env"]),
        (format!("{{project: my-project, zones: [europe-west1-b], credentialsSecret: 'a/b', {ok}}}"), &["config.credentialsSecret", "\"a/b\""]),
        (format!("{{project: my-project, zones: [europe-west1-b], endpoint: 'https://compute.googleapis.com', {ok}}}"), &["config.endpoint", "/compute/v1"]),
        (format!("{{zones: [europe-west1-b], {ok}}}"), &["missing field `project`"]),
    ];
    for (config, want) in cases {
        let err = match rt
            .provider(plugin.clone(), &support::entry(&format!("{base}{config}")))
            .await
        {
            Ok(_) => panic!("{config} was accepted"),
            Err(e) => e.to_string(),
        };
        for w in want {
            assert!(err.contains(w), "{config}: {err:?} lacks {w:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_zone() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let targets = g.p.check().await.expect("gce has a check");
    let got: Vec<(&str, bool, &str)> = targets
        .iter()
        .map(|t| (t.target.as_str(), t.ready, t.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (ZONE, true, "Reachable"),
            ("us-central1-a", true, "Reachable")
        ]
    );
    assert!(
        targets[0]
            .details
            .contains(&("region".to_string(), "europe-west1".to_string())),
        "{targets:?}"
    );
    g.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 4,
    });
    let t = &g.p.check().await.unwrap()[0];
    assert_eq!(
        (t.ready, t.reason.as_str()),
        (false, "Unauthorized"),
        "{t:?}"
    );
}

/// A cloud-init sentinel, the service-account private key and the access tokens never reach
/// an error, a log line or a span, and the host had nothing to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-gce-5d1e";
    let (_guard, captured) = proxy_operator::testing::capture();
    let g = setup().await;
    let p = egress_plugin_host::provider::Instrumented::new(g.p, Default::default());
    let mut req = request("uid-s");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let id = p.create(&req).await.unwrap();
    assert_eq!(
        g.emu.dump().instances[0].user_data,
        req.cloud_init,
        "the sentinel reached the backend"
    );
    let mut seen = format!("{:?}\n{:?}\n", p.get(&id).await, p.list_by_tag(INST).await);
    let mut bad = request("uid-s2");
    bad.cloud_init = req.cloud_init.clone();
    g.emu
        .fail_next_insert("ZONE_RESOURCE_POOL_EXHAUSTED", "no capacity", 0);
    let bad_id = p.create(&bad).await.unwrap();
    seen.push_str(&format!("{:?}\n", p.get(&bad_id).await));
    g.emu.expire_tokens();
    g.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 20,
    });
    seen.push_str(&format!(
        "{:?}\n{:?}\n{:?}\n",
        p.create(&bad).await,
        p.get(&id).await,
        p.check().await
    ));
    g.emu.reset();
    std::fs::write(
        g.secrets.path().join("key.json"),
        g.emu.key_json(TEST_CLIENT_EMAIL, WRONG_KEY_PEM),
    )
    .unwrap();
    g.emu.expire_tokens();
    seen.push_str(&format!("{:?}\n", p.delete(&id).await));
    let key_lines = TEST_KEY_PEM
        .lines()
        .chain(WRONG_KEY_PEM.lines())
        .filter(|l| !l.starts_with("-----"));
    let sentinels: Vec<String> = key_lines
        .map(str::to_string)
        .chain([CI_SENTINEL.to_string()])
        .chain(g.emu.issued_tokens())
        .collect();
    let sentinels: Vec<&str> = sentinels.iter().map(String::as_str).collect();
    support::sentinels::assert_nothing_leaked(&seen, &captured, &sentinels, "gce create");
}

/// The whole lifecycle against the real API (`backend-test=integration-tag`): one e2-micro
/// instance for a minute or two in `GCE_ZONE` (default europe-west1-b) of `GCE_PROJECT`,
/// image `GCE_IMAGE` (default Ubuntu 24.04 LTS), deleted again. The same run as
/// `proxy-operator provider lifecycle --provider gce ...` against a real account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs GCE_PROJECT and GOOGLE_APPLICATION_CREDENTIALS (a service-account key that may create instances); run with --ignored"]
async fn real_gce_lifecycle() {
    let _dir = plugins_or_skip!();
    let (Ok(project), Ok(key)) = (
        std::env::var("GCE_PROJECT"),
        std::env::var("GOOGLE_APPLICATION_CREDENTIALS"),
    ) else {
        eprintln!(
            "SKIPPING real_gce_lifecycle: GCE_PROJECT or GOOGLE_APPLICATION_CREDENTIALS is not set"
        );
        return;
    };
    let zone = std::env::var("GCE_ZONE").unwrap_or_else(|_| ZONE.into());
    let image = std::env::var("GCE_IMAGE").unwrap_or_else(|_| {
        "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into()
    });
    let yaml = format!(
        "name: gce-real\nplugin: gce.wasm\nsecrets: {{serviceAccountKey: {key}}}\n\
         config: {{project: {project}, zones: [{zone}], machineTypes: [e2-micro], images: {{ubuntu: '{image}'}}}}"
    );
    let p = support::provider(&support::runtime(), "gce.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new("", &zone, "e2-micro", "ubuntu"),
        installation: support::real_cloud::INSTALLATION.into(),
        ..request(&uid)
    };
    let pace = support::real_cloud::Pace {
        gone_within: Duration::from_secs(300),
        ..Default::default()
    };
    support::real_cloud::lifecycle(&p, &req, pace).await;
}

fn spot(req: CreateRequest) -> CreateRequest {
    CreateRequest {
        placement: Placement {
            capacity: Capacity::Spot,
            ..req.placement
        },
        ..req
    }
}

/// A spot create inserts a Spot VM deleted on preemption, with what the Scheduling schema
/// requires of one; an on-demand create sends no scheduling (the VM is STANDARD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_inserts_a_spot_vm_and_on_demand_does_not() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let on_demand = p.create(&request("uid-od")).await.unwrap();
    let raw = emu.instance(&on_demand).unwrap();
    assert_eq!(raw["scheduling"]["provisioningModel"], "STANDARD", "{raw}");
    assert!(emu.spot_instances().is_empty());
    let id = p.create(&spot(request("uid-spot"))).await.unwrap();
    let raw = emu.instance(&id).unwrap();
    assert_eq!(
        raw["scheduling"],
        serde_json::json!({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
            "automaticRestart": false, "onHostMaintenance": "TERMINATE", "preemptible": false})
    );
    let name = id.rsplit('/').next().unwrap();
    assert_eq!(emu.spot_instances(), [bid(emu, name)]);
    p.get(&id).await.unwrap();
    let running = p.get(&id).await.unwrap();
    assert_eq!(
        (running.state, running.interrupted),
        (State::Running, false)
    );
}

/// GCE preempts the Spot VM and deletes it: Get answers NotFound with code Interrupted,
/// told by the `compute.instances.preempted` operation. The Proxy's replacement gets the same
/// name; once it is deleted by the operator, its NotFound is a plain one (the old preemption
/// is older than the new insert).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_spot_vm_is_not_found_interrupted_and_its_replacement_is_not() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let req = spot(request("uid-p"));
    let id = p.create(&req).await.unwrap();
    p.get(&id).await.unwrap();
    let name = id.rsplit('/').next().unwrap();
    assert_eq!(emu.reclaim(&bid(emu, name)), Ok(true));
    let e = p.get(&id).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("Interrupted")),
        "{e}"
    );
    assert!(e.message.contains("preempted"), "{e}");
    assert!(p.list_by_tag(INST).await.unwrap().is_empty());
    p.delete(&id).await.expect("already gone is success");

    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "the replacement, same name"
    );
    let running = p.get(&id).await.unwrap();
    assert!(!running.interrupted);
    p.delete(&id).await.unwrap();
    let e = p.get(&id).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("notFound")),
        "deleted, not preempted: {e}"
    );
    // An on-demand VM's NotFound is plain too.
    let od = p.create(&request("uid-od2")).await.unwrap();
    p.delete(&od).await.unwrap();
    let e = p.get(&od).await.unwrap_err();
    assert_eq!(e.code.as_deref(), Some("notFound"), "{e}");
}

/// No spot capacity: the insert is accepted and its operation fails with GCE's stockout,
/// which the first Get reports as QuotaExceeded with code SpotCapacityUnavailable; nothing
/// is left, the name is free again, and a standard insert's stockout keeps GCE's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spot_capacity_is_quota_exceeded_and_leaves_nothing() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    assert!(emu.set_spot_capacity(false));
    let req = spot(request("uid-c"));
    let id = p.create(&req).await.unwrap();
    let e = p.get(&id).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::QuotaExceeded, Some("SpotCapacityUnavailable")),
        "{e}"
    );
    assert!(e.message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"), "{e}");
    assert!(emu.dump().instances.is_empty());
    let e = p.get(&id).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("notFound")),
        "reported once: {e}"
    );
    let standard = request("uid-c2");
    emu.fail_next_insert("ZONE_RESOURCE_POOL_EXHAUSTED", "stockout", 0);
    let sid = p.create(&standard).await.unwrap();
    let e = p.get(&sid).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::QuotaExceeded, Some("ZONE_RESOURCE_POOL_EXHAUSTED")),
        "a standard insert's stockout is no spot matter: {e}"
    );
    emu.set_spot_capacity(true);
    p.create(&req).await.unwrap();
    assert_eq!(emu.spot_instances().len(), 1);
}
