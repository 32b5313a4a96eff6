//! The Hetzner plugin through the host, against the Hetzner emulator: every contract case
//! of the reference's section 11 that a plugin must meet itself, plus Hetzner specifics
//! (labels, Primary IPs, the `off` of a server being created, lost create races).
//!
//! The last test runs the same lifecycle against the real API and is ignored unless asked
//! for (see docs/providers/hetzner.md, "Testing against Hetzner").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use egress_emulators::hetzner::{
    DeleteSchedule, HetznerConfig, HetznerEmulator, HetznerError, RunSchedule,
};
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Priority, Provider, State};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

const TOKEN: &str = "hz-test-token";
const INST: &str = "inst-a";
const LOCATIONS: [&str; 3] = ["fsn1", "nbg1", "ash"];

struct Hz {
    emu: HetznerEmulator,
    p: WasmProvider,
    secrets: tempfile::TempDir,
}

fn entry(url: &str, token: &Path, extra: &str) -> String {
    format!(
        "name: hz\nplugin: hetzner.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\nsecrets: {{token: {token}}}\n\
         config: {{endpoint: '{url}/v1', locations: [fsn1, nbg1, ash], serverTypes: [cpx11, cx23], \
         images: {{ubuntu: ubuntu-24.04, debian: 114690387}}}}{extra}",
        token = token.display()
    )
}

async fn setup_with(cfg: HetznerConfig, extra: &str) -> Hz {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, format!("{}\n", cfg.token)).unwrap();
    let emu = HetznerEmulator::start(cfg);
    let rt = support::runtime();
    let p = support::provider(&rt, "hetzner.wasm", &entry(&emu.url(), &token, extra)).await;
    Hz { emu, p, secrets }
}

async fn setup() -> Hz {
    setup_with(HetznerConfig::new(TOKEN), "").await
}

fn request(uid: &str, region: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n".to_vec(),
        ..CreateRequest::new(
            uid,
            INST,
            Placement::new(region, "any-zone-is-ignored", "cpx11", "ubuntu"),
        )
    }
}

fn plant(
    emu: &HetznerEmulator,
    name: &str,
    uid: Option<&str>,
    installation: Option<&str>,
) -> String {
    let id = emu.plant(Plant {
        name: name.into(),
        scope: "fsn1".into(),
        managed: true,
        uid: uid.map(Into::into),
        installation: installation.map(Into::into),
        created_at: None,
    });
    format!("fsn1/{id}")
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A raw call to the emulator's API, for what the plugin never does itself (taking a
/// server's address away).
fn raw(emu: &HetznerEmulator, method: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(emu.addr()).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n", emu.addr())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Servers as Hetzner answers them now: a top-level `location`, no `datacenter` (removed
/// after 1 July 2026).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_is_idempotent_and_leaves_nothing_behind() {
    let _dir = plugins_or_skip!();
    lifecycle(false).await;
}

/// Servers as Hetzner answered them before the datacenter phase-out: `datacenter.location`,
/// no top-level `location`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_the_old_datacenter_shape() {
    let _dir = plugins_or_skip!();
    lifecycle(true).await;
}

async fn lifecycle(legacy_datacenter: bool) {
    let cfg = HetznerConfig {
        legacy_datacenter,
        ..HetznerConfig::new(TOKEN)
    };
    let hz = setup_with(cfg, "").await;
    let (p, emu) = (&hz.p, &hz.emu);
    let req = request("uid-1", "nbg1");

    let id = p.create(&req).await.unwrap();
    assert!(id.starts_with("nbg1/"), "{id}");
    // A new server has its address at once but is not running yet. (Read before the
    // repeated create: its name lookup counts as a read in the emulator, too.)
    let first = p.get(&id).await.unwrap();
    assert_eq!(first.state, State::Provisioning);
    assert!(!first.ip.is_empty());
    assert_eq!(first.uid, "uid-1");
    assert!(first.created_at.is_some());
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1, "one server");
    let server = &dump.instances[0];
    assert_eq!(
        (server.name.as_str(), server.scope.as_str()),
        (req.name.as_str(), "nbg1")
    );
    assert_eq!(server.user_data, req.cloud_init, "user data byte for byte");
    assert_eq!(label(&server.labels, MARK_MANAGED), Some("true"));
    assert_eq!(label(&server.labels, MARK_UID), Some("uid-1"));
    assert_eq!(label(&server.labels, MARK_INSTALLATION), Some(INST));
    assert_eq!(
        label(&server.labels, "egress.proxy-operator.dev/location"),
        Some("nbg1")
    );
    let raw_server = emu.server(&id).unwrap();
    assert_eq!(raw_server["server_type"]["name"], "cpx11");
    assert_eq!(
        raw_server["image"]["name"], "ubuntu-24.04",
        "the catalogue key resolved to the image"
    );
    let shape = (
        raw_server["location"]["name"].as_str(),
        raw_server["datacenter"]["location"]["name"].as_str(),
    );
    let want = match legacy_datacenter {
        true => (None, Some("nbg1")),
        false => (Some("nbg1"), None),
    };
    assert_eq!(shape, want, "{raw_server}");

    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert_eq!(running.ip, server.ip);
    assert!(!running.ip.is_empty());

    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert_eq!(listed[0].uid, "uid-1");
    assert!(
        p.list_by_tag("inst-b").await.unwrap().is_empty(),
        "other installations are not listed"
    );

    assert_eq!(emu.dump().secondary.len(), 2, "IPv4 and IPv6 Primary IPs");
    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    let gone = p.get(&id).await.unwrap_err();
    assert_eq!(gone.class, Class::NotFound, "{gone}");
    let dump = emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "nothing left behind: {dump:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_is_rejected_before_any_call() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let cases = [
        ("region", "mars1", "placement.region \"mars1\""),
        ("machine_type", "cx99", "placement.machineType \"cx99\""),
        ("image", "ubuntu-24.04", "placement.image \"ubuntu-24.04\""),
    ];
    for (field, value, text) in cases {
        let mut req = request("uid-p", "fsn1");
        match field {
            "region" => req.placement.region = value.into(),
            "machine_type" => req.placement.machine_type = value.into(),
            _ => req.placement.image = value.into(),
        }
        let err = hz.p.create(&req).await.unwrap_err();
        assert_eq!(err.class, Class::Permanent, "{err}");
        assert!(err.message.contains(text), "{err}");
    }
    let mut req = request("uid-p", "fsn1");
    req.uid = "not/a/label".into();
    let err = hz.p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("InvalidUid"))
    );
    let mut req = request("uid-p", "fsn1");
    req.cloud_init = vec![b'x'; 32 * 1024 + 1];
    let err = hz.p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("UserDataTooLarge"))
    );
    assert!(
        hz.emu.requests().is_empty(),
        "no backend call: {:?}",
        hz.emu.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_ids_are_permanent_from_get_and_delete() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    for bad in [
        "",
        "4200001",
        "fsn1/",
        "fsn1/abc",
        "fsn1/0042",
        "fsn1/1/2",
        "FSN1/1",
    ] {
        let err = hz.p.get(bad).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some("InvalidId")),
            "get {bad:?}"
        );
        let err = hz.p.delete(bad).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some("InvalidId")),
            "delete {bad:?}"
        );
    }
    assert!(hz.emu.requests().is_empty());
    // Well-formed but unknown: gone, and deleting it is done.
    assert_eq!(
        hz.p.get("fsn1/999999").await.unwrap_err().class,
        Class::NotFound
    );
    hz.p.delete("fsn1/999999").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_states_map_as_the_contract_says() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let (p, emu) = (&hz.p, &hz.emu);

    let id = plant(emu, "state-unknown", Some("u"), Some(INST));
    emu.set_backend_state(&id, "exploded");
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Stopped,
        "unknown states are stopped"
    );
    for (status, want) in [
        ("unknown", State::Stopped),
        ("stopping", State::Stopped),
        ("starting", State::Provisioning),
        ("rebuilding", State::Provisioning),
        ("migrating", State::Provisioning),
        ("deleting", State::Terminated),
    ] {
        emu.set_backend_state(&id, status);
        assert_eq!(p.get(&id).await.unwrap().state, want, "{status}");
    }

    // Running needs an address: take the server's IPv4 away (only possible while it is
    // off), then its IPv6. With the /64 left it runs IPv6-only, at the network's `::1`
    // (the operator keeps an IPv4 Proxy of it provisioning); with neither it is not
    // running as far as anyone can reach it.
    let id = p.create(&request("uid-ip", "fsn1")).await.unwrap();
    let server = emu.server(&id).unwrap();
    let ip_id = |family: &str| server["public_net"][family]["id"].as_u64().unwrap();
    let (v4, v6) = (ip_id("ipv4"), ip_id("ipv6"));
    let net = server["public_net"]["ipv6"]["ip"].as_str().unwrap();
    let want_v6 = net.replace("::/64", "::1");
    emu.set_backend_state(&id, "off");
    let answer = raw(emu, "DELETE", &format!("/v1/primary_ips/{v4}"));
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    emu.set_backend_state(&id, "running");
    let v6_only = p.get(&id).await.unwrap();
    assert_eq!(
        (v6_only.state, v6_only.ip.as_str(), v6_only.ipv6.as_str()),
        (State::Running, "", want_v6.as_str()),
        "{net}"
    );
    emu.set_backend_state(&id, "off");
    let answer = raw(emu, "DELETE", &format!("/v1/primary_ips/{v6}"));
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    emu.set_backend_state(&id, "running");
    let no_ip = p.get(&id).await.unwrap();
    assert_eq!(
        (no_ip.state, no_ip.ip.as_str(), no_ip.ipv6.as_str()),
        (State::Provisioning, "", "")
    );
}

/// A created but not yet started server is never Stopped (the reconciler would delete it
/// at once), while one whose start failed, or that was stopped long after, is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_being_created_is_never_stopped() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let (p, emu) = (&hz.p, &hz.emu);

    let id = p.create(&request("uid-held", "fsn1")).await.unwrap();
    emu.hold_provisioning(&id, true);
    for _ in 0..3 {
        let i = p.get(&id).await.unwrap();
        assert_eq!(i.state, State::Provisioning, "held in initializing");
        assert!(!i.ip.is_empty(), "the address exists before the boot");
    }
    emu.hold_provisioning(&id, false);
    p.get(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Running);

    // `off` right after creation: the start action says whether the power-on is pending.
    // Forcing `off` ends the emulator's start action in error, so this one is stopped.
    let failed = p
        .create(&request("uid-start-failed", "fsn1"))
        .await
        .unwrap();
    emu.set_backend_state(&failed, "off");
    assert_eq!(p.get(&failed).await.unwrap().state, State::Stopped);

    // Without the action (made behind the plugin's back): young and off is starting,
    // old and off is stopped; a lock means an action (the power-on) is running.
    let young = plant(emu, "off-young", Some("u1"), Some(INST));
    emu.set_backend_state(&young, "off");
    assert_eq!(p.get(&young).await.unwrap().state, State::Provisioning);
    let old_id = emu.plant(Plant {
        name: "off-old".into(),
        scope: "fsn1".into(),
        managed: true,
        uid: Some("u2".into()),
        installation: Some(INST.into()),
        created_at: Some(1_700_000_000),
    });
    let old = format!("fsn1/{old_id}");
    emu.set_backend_state(&old, "off");
    assert_eq!(p.get(&old).await.unwrap().state, State::Stopped);
    emu.set_locked(&old, true);
    assert_eq!(p.get(&old).await.unwrap().state, State::Provisioning);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_and_created_at_are_read_back_from_the_backend() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let id = hz.emu.plant(Plant {
        name: "planted".into(),
        scope: "ash".into(),
        managed: true,
        uid: Some("planted-uid".into()),
        installation: Some(INST.into()),
        created_at: Some(1_700_000_000),
    });
    let i = hz.p.get(&format!("ash/{id}")).await.unwrap();
    assert_eq!(i.uid, "planted-uid");
    assert_eq!(
        i.created_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    );
    assert_eq!(i.state, State::Running);
    let no_uid = plant(&hz.emu, "planted-no-uid", None, Some(INST));
    assert_eq!(hz.p.get(&no_uid).await.unwrap().uid, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_covers_exactly_this_installation_across_pages() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let (p, emu) = (&hz.p, &hz.emu);

    let with_uid = plant(emu, "with-uid", Some("u-1"), Some(INST));
    let empty_uid = plant(emu, "empty-uid", Some(""), Some(INST));
    let no_uid = plant(emu, "no-uid", None, Some(INST));
    emu.plant(Plant {
        name: "unmarked".into(),
        managed: false,
        installation: Some(INST.into()),
        ..Plant::default()
    });
    plant(emu, "other-install", Some("u-2"), Some("inst-b"));
    plant(emu, "no-install", Some("u-3"), None);

    let mut listed = p.list_by_tag(INST).await.unwrap();
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    let got: Vec<(&str, &str)> = listed
        .iter()
        .map(|i| (i.id.as_str(), i.uid.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (with_uid.as_str(), "u-1"),
            (empty_uid.as_str(), ""),
            (no_uid.as_str(), "")
        ]
    );
    assert!(listed.iter().all(|i| i.created_at.is_some()));
    for i in &listed {
        p.get(&i.id).await.unwrap(); // every listed ID is one get and delete accept
    }

    // An installation identity Hetzner cannot store as a label value is mapped, and the
    // mapping is the same at create and at list.
    let mut req = request("uid-hashed", "fsn1");
    req.installation = "cluster/prod".into();
    let hashed = p.create(&req).await.unwrap();
    let ids: Vec<String> = p
        .list_by_tag("cluster/prod")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, [hashed]);
    assert!(
        !p.list_by_tag(INST)
            .await
            .unwrap()
            .iter()
            .any(|i| i.id == ids[0])
    );

    // Pagination: more than one page of 50.
    for n in 0..57 {
        plant(
            emu,
            &format!("bulk-{n}"),
            Some(&format!("bulk-{n}")),
            Some("inst-bulk"),
        );
    }
    assert_eq!(p.list_by_tag("inst-bulk").await.unwrap().len(), 57);
    assert!(
        emu.requests().iter().any(|r| r.contains("page=2")),
        "followed next_page"
    );

    // A location whose listing fails makes the whole list fail: no partial answer to GC.
    emu.fail_scope("fsn1", true);
    let err = p.list_by_tag(INST).await.unwrap_err();
    assert_eq!(err.class, Class::Transient, "{err}");
    emu.fail_scope("fsn1", false);
    assert_eq!(p.list_by_tag(INST).await.unwrap().len(), 3);
}

/// Contract 0.3.0: the plugin declares `lists-recent`, and a list with `created-since`
/// reads the newest servers first and stops at the first page that reaches older ones: 120
/// servers made an hour ago and 7 made now cost one page instead of three, and each of the
/// 7 is in it. Without a time, the same list is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_recent_servers_reads_only_the_newest_pages() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let (p, emu) = (&hz.p, &hz.emu);
    assert!(p.lists_recent(), "hetzner declares lists-recent");
    let now = std::time::SystemTime::now();
    let secs = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for n in 0..120 {
        emu.plant(Plant {
            name: format!("old-{n}"),
            scope: "fsn1".into(),
            managed: true,
            uid: Some(format!("old-{n}")),
            installation: Some("inst-recent".into()),
            created_at: Some(secs - 3600),
        });
    }
    let mut new = Vec::new();
    for n in 0..7 {
        new.push(plant(
            emu,
            &format!("new-{n}"),
            Some(&format!("new-{n}")),
            Some("inst-recent"),
        ));
    }
    let pages = |emu: &HetznerEmulator| {
        emu.requests()
            .iter()
            .filter(|r| r.contains("/servers?label_selector"))
            .count()
    };
    let before = pages(emu);
    let since = now - std::time::Duration::from_secs(60);
    let recent = p
        .list_recent_at("inst-recent", since, Priority::Transition)
        .await
        .unwrap();
    assert_eq!(pages(emu) - before, 1, "one page: {:?}", emu.requests());
    let ids: std::collections::BTreeSet<&str> = recent.iter().map(|i| i.id.as_str()).collect();
    for id in &new {
        assert!(ids.contains(id.as_str()), "{id} made since is listed");
    }
    assert!(
        emu.requests()
            .iter()
            .any(|r| r.contains("sort=created:desc")),
        "newest first"
    );
    // Without a time: every page, every server.
    let before = pages(emu);
    assert_eq!(p.list_by_tag("inst-recent").await.unwrap().len(), 127);
    assert_eq!(pages(emu) - before, 3);
    // A time before every server: the whole list, in three pages too.
    let all = p
        .list_recent_at(
            "inst-recent",
            now - std::time::Duration::from_secs(7200),
            Priority::Transition,
        )
        .await
        .unwrap();
    assert_eq!(all.len(), 127);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_for_one_name_make_one_server() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let req = request("uid-race", "fsn1");
    let (a, b) = tokio::join!(hz.p.create(&req), hz.p.create(&req));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    assert_eq!(hz.emu.dump().instances.len(), 1);
}

/// The lookup found nothing, then someone else's create took the name before ours: the
/// `uniqueness_error` leads to a second lookup, and adoption only with the same UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_race_adopts_only_its_own_server() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    for (uid, planted_uid, expect_adopt) in [
        ("uid-r1", "uid-r1", true),
        ("uid-r2", "somebody-else", false),
    ] {
        let req = request(uid, "fsn1");
        hz.emu
            .inject(Fault::slow(FaultOp::Create, Duration::from_millis(1500), 1));
        let p = &hz.p;
        let create = p.create(&req);
        let winner = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            plant(&hz.emu, &req.name, Some(planted_uid), Some(INST))
        };
        let (result, planted) = tokio::join!(create, winner);
        if expect_adopt {
            assert_eq!(result.unwrap(), planted);
        } else {
            let err = result.unwrap_err();
            assert_eq!(
                (err.class, err.code.as_deref()),
                (Class::Permanent, Some("NameTaken")),
                "{err}"
            );
        }
    }
    assert_eq!(
        hz.emu.dump().instances.len(),
        2,
        "no server of our own was made"
    );

    // The name was taken but the taker is gone again: retry, do not guess.
    hz.emu.inject_error(
        FaultOp::Create,
        HetznerError::new(409, "uniqueness_error", "server name is already used"),
        1,
    );
    let err = hz.p.create(&request("uid-r3", "fsn1")).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("uniqueness_error"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_by_another_uid_is_permanent() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let req = request("uid-mine", "fsn1");
    plant(&hz.emu, &req.name, Some("uid-theirs"), Some(INST));
    let err = hz.p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("NameTaken"))
    );
    assert!(err.message.contains("uid-theirs"), "{err}");
    assert_eq!(hz.emu.dump().instances.len(), 1);
}

/// A delete in progress keeps the server visible (the replacement has the same name and
/// must wait); a lock keeps the last state and makes delete transient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_in_progress_and_locks() {
    let _dir = plugins_or_skip!();
    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.run_schedule = RunSchedule::AfterReads(0);
    cfg.delete_schedule = DeleteSchedule::Manual;
    let hz = setup_with(cfg, "").await;
    let (p, emu) = (&hz.p, &hz.emu);
    let req = request("uid-del", "fsn1");
    let id = p.create(&req).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Running);

    emu.set_locked(&id, true);
    let locked = p.get(&id).await.unwrap();
    assert_eq!(locked.state, State::Running, "a lock keeps the last state");
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("locked")),
        "{err}"
    );
    emu.set_locked(&id, false);

    p.delete(&id).await.unwrap();
    for _ in 0..3 {
        let dying = p.get(&id).await.unwrap();
        assert_eq!(
            (dying.state, dying.uid.as_str()),
            (State::Terminated, "uid-del")
        );
        p.delete(&id).await.unwrap(); // already deleting: success, cheaply
    }
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("NameBeingDeleted"))
    );
    assert_eq!(emu.dump().instances.len(), 1);

    emu.finish_deletes();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert!(
        emu.dump().secondary.is_empty(),
        "Primary IPs went with the server"
    );
    let replacement = p.create(&req).await.unwrap();
    assert_ne!(replacement, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_kind_gets_its_class() {
    let _dir = plugins_or_skip!();
    let hz = setup_with(
        HetznerConfig::new(TOKEN),
        "\nlimits: {http: {firstByteTimeout: 1s}}",
    )
    .await;
    let (p, emu) = (&hz.p, &hz.emu);
    let id = p.create(&request("uid-f", "fsn1")).await.unwrap();

    let shared = [
        (
            FaultOp::Get,
            FaultKind::ServerError,
            Class::Transient,
            "server_error",
        ),
        (
            FaultOp::Get,
            FaultKind::RateLimit,
            Class::QuotaExceeded,
            "rate_limit_exceeded",
        ),
        (
            FaultOp::Get,
            FaultKind::Auth,
            Class::Permanent,
            "unauthorized",
        ),
        (
            FaultOp::Get,
            FaultKind::Quota,
            Class::QuotaExceeded,
            "resource_limit_exceeded",
        ),
        (
            FaultOp::Get,
            FaultKind::Slow { delay_ms: 3000 },
            Class::Transient,
            "ConnectionReadTimeout",
        ),
    ];
    for (op, kind, class, code) in shared {
        emu.inject(Fault {
            op,
            kind: kind.clone(),
            count: 1,
        });
        let err = p.get(&id).await.unwrap_err();
        assert_eq!(err.class, class, "{kind:?}: {err}");
        assert_eq!(err.code.as_deref(), Some(code), "{kind:?}: {err}");
    }

    let hetzner = [
        (
            HetznerError::new(
                409,
                "conflict",
                "The resource has changed during the request",
            ),
            Class::Transient,
        ),
        (
            HetznerError::new(403, "forbidden", "insufficient permissions"),
            Class::Permanent,
        ),
        (
            HetznerError::new(
                503,
                "unavailable",
                "A service or product is currently not available",
            ),
            Class::Transient,
        ),
        (
            HetznerError::new(
                503,
                "maintenance",
                "Cannot perform operation due to maintenance",
            ),
            Class::Transient,
        ),
        (
            HetznerError::new(423, "locked", "server is locked"),
            Class::Transient,
        ),
    ];
    for (error, class) in hetzner {
        let code = error.code.clone();
        emu.inject_error(FaultOp::Get, error, 1);
        let err = p.get(&id).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (class, Some(code.as_str())),
            "{err}"
        );
    }

    // Create: quota and capacity wait, bad input latches. The name lookup still works.
    let create_cases = [
        (
            HetznerError::new(403, "resource_limit_exceeded", "server limit exceeded"),
            Class::QuotaExceeded,
        ),
        (
            HetznerError::new(412, "resource_unavailable", "server location disabled"),
            Class::QuotaExceeded,
        ),
        (
            HetznerError::new(422, "invalid_input", "unsupported location for server type"),
            Class::Permanent,
        ),
        (
            HetznerError::new(500, "server_error", "Error within the API backend"),
            Class::Transient,
        ),
    ];
    for (error, class) in create_cases {
        let code = error.code.clone();
        emu.inject_error(FaultOp::Create, error, 1);
        let err = p.create(&request("uid-f2", "nbg1")).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (class, Some(code.as_str())),
            "{err}"
        );
    }
    // A real capacity refusal, not an injected one: cx23 is not offered in ash.
    let mut req = request("uid-f3", "ash");
    req.placement.machine_type = "cx23".into();
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("invalid_input")),
        "{err}"
    );

    // Lists and deletes.
    emu.inject(Fault {
        op: FaultOp::List,
        kind: FaultKind::RateLimit,
        count: 1,
    });
    assert_eq!(
        p.list_by_tag(INST).await.unwrap_err().class,
        Class::QuotaExceeded
    );
    emu.inject(Fault {
        op: FaultOp::Delete,
        kind: FaultKind::ServerError,
        count: 1,
    });
    assert_eq!(p.delete(&id).await.unwrap_err().class, Class::Transient);
    p.delete(&id).await.unwrap();
    assert_eq!(emu.dump().instances.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_read_on_every_call() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let token = hz.secrets.path().join("token");
    std::fs::remove_file(&token).unwrap();
    let err = hz.p.get("fsn1/1").await.unwrap_err();
    assert_eq!(
        err.class,
        Class::Transient,
        "a Secret not mounted yet: {err}"
    );
    std::fs::write(&token, "wrong").unwrap();
    let err = hz.p.get("fsn1/1").await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("unauthorized"))
    );
    std::fs::write(&token, TOKEN).unwrap();
    assert_eq!(hz.p.get("fsn1/1").await.unwrap_err().class, Class::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_user_data_travels_base64_for_cloud_init_to_decode() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let mut req = request("uid-bin", "fsn1");
    req.cloud_init = b"\x1f\x8b\x08\x00 gzip \xff\xfe".to_vec();
    hz.p.create(&req).await.unwrap();
    let sent = hz.emu.dump().instances[0].user_data.clone();
    use data_encoding::BASE64;
    assert_eq!(BASE64.decode(&sent).unwrap(), req.cloud_init);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_probes_each_location_in_config_order() {
    let _dir = plugins_or_skip!();
    let hz = setup().await;
    let (p, emu) = (&hz.p, &hz.emu);
    p.create(&request("uid-c", "nbg1")).await.unwrap();

    let targets = p.check().await.expect("hetzner has a check");
    assert_eq!(
        targets
            .iter()
            .map(|t| t.target.as_str())
            .collect::<Vec<_>>(),
        LOCATIONS
    );
    assert!(
        targets.iter().all(|t| t.ready && t.reason == "Reachable"),
        "{targets:?}"
    );
    let count = |t: &egress_plugin_host::provider::TargetStatus| {
        t.details
            .iter()
            .find(|(k, _)| k == "managedServers")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        targets.iter().map(count).collect::<Vec<_>>(),
        [Some("0".into()), Some("1".into()), Some("0".into())]
    );
    assert!(
        targets[0]
            .details
            .iter()
            .any(|(k, _)| k == "rateLimitRemaining")
    );

    emu.inject(Fault {
        op: FaultOp::List,
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

    // A location whose data cannot be read fails alone.
    emu.fail_scope("nbg1", true);
    let targets = p.check().await.unwrap();
    let ready: Vec<bool> = targets.iter().map(|t| t.ready).collect();
    assert_eq!(ready, [true, false, true], "{targets:?}");
    assert_eq!(targets[1].reason, "APIError");
}

/// A cloud-init sentinel and a token sentinel never reach an error, a log line or a span,
/// through success and failure paths alike; and nothing had to be redacted, so the plugin
/// itself never tried to emit them.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-hz-51ab";
    const TOKEN_SENTINEL: &str = "TOKEN-SENTINEL-hz-9c0e";
    let (_guard, captured) = proxy_operator::testing::capture();
    let hz = setup_with(HetznerConfig::new(TOKEN_SENTINEL), "").await;
    let p = egress_plugin_host::provider::Instrumented::new(hz.p, Default::default());
    let mut req = request("uid-s", "fsn1");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    // An image the catalogue does not have: refused before any call.
    let mut bad_image = req.clone();
    bad_image.placement.image = "nope".into();
    let mut seen = format!("{:?}\n", p.create(&bad_image).await);
    let bad = CreateRequest {
        cloud_init: req.cloud_init.clone(),
        ..request("uid-s2", "fsn1")
    };
    let refuse = || {
        let e = HetznerError::new(422, "invalid_input", "invalid input in field 'user_data'");
        hz.emu.inject_error(FaultOp::Create, e, 1)
    };
    seen += &support::sentinels::exercise(&p, &hz.emu, &req, &bad, refuse).await;
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, TOKEN_SENTINEL],
        "hetzner create",
    );
}

/// The whole lifecycle against the real API (`backend-test=integration-tag`). Creates one
/// server for a minute or two in `HETZNER_LOCATION` (default fsn1) with
/// `HETZNER_SERVER_TYPE` (default cx23) and deletes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs HETZNER_TOKEN (a read-write token of a project to create a server in); run with --ignored"]
async fn real_hetzner_lifecycle() {
    let _dir = plugins_or_skip!();
    let Ok(token) = std::env::var("HETZNER_TOKEN") else {
        eprintln!("SKIPPING real_hetzner_lifecycle: HETZNER_TOKEN is not set");
        return;
    };
    let location = std::env::var("HETZNER_LOCATION").unwrap_or_else(|_| "fsn1".into());
    let server_type = std::env::var("HETZNER_SERVER_TYPE").unwrap_or_else(|_| "cx23".into());
    let secrets = tempfile::tempdir().unwrap();
    let path = secrets.path().join("token");
    std::fs::write(&path, token).unwrap();
    let rt = support::runtime();
    let yaml = format!(
        "name: hz-real\nplugin: hetzner.wasm\nsecrets: {{token: {}}}\n\
         config: {{locations: [{location}], serverTypes: [{server_type}], images: [ubuntu-24.04]}}",
        path.display()
    );
    let p = support::provider(&rt, "hetzner.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new(&location, "", &server_type, "ubuntu-24.04"),
        installation: support::real_cloud::INSTALLATION.into(),
        ..request(&uid, &location)
    };

    support::real_cloud::lifecycle(
        &p,
        &req,
        support::real_cloud::Pace {
            while_deleting: |i| assert_eq!(i.state, State::Terminated, "{i:?}"),
            ..support::real_cloud::Pace::default()
        },
    )
    .await;
}

/// A placement's price from Hetzner's catalogue: the server type's net hourly price in the
/// placement's location, in euros; a server type the location does not offer has none
/// listed. The providers file's `prices` win over it, without a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_reads_the_server_type_catalogue() {
    let _dir = plugins_or_skip!();
    let mut cfg = HetznerConfig::new(TOKEN);
    for t in &mut cfg.server_types {
        t.price_hourly_net = match t.name.as_str() {
            "cpx11" => "0.0080000000".into(),
            _ => "0.0120000000".into(),
        };
    }
    let hz = setup_with(cfg, "").await;
    let eur = |micros_per_hour| {
        Some(egress_plugin_host::provider::Price {
            currency: "EUR".into(),
            micros_per_hour,
        })
    };
    let quote = async |location: &str, server_type: &str| {
        let p = Placement::new(location, "", server_type, "ubuntu");
        hz.p.quote(&p).await
    };
    assert_eq!(quote("fsn1", "cpx11").await.unwrap(), eur(8_000));
    assert_eq!(quote("nbg1", "cx23").await.unwrap(), eur(12_000));
    // cx23 is offered in the EU only (see the emulator's catalogue): nothing listed in ash.
    assert_eq!(quote("ash", "cx23").await.unwrap(), None);

    let listed = setup_with(
        HetznerConfig::new(TOKEN),
        "\nprices: [{machineType: cpx11, region: fsn1, currency: EUR, perHour: '0.0065'}]",
    )
    .await;
    let before = listed.emu.stats().total;
    let p = Placement::new("fsn1", "", "cpx11", "ubuntu");
    assert_eq!(listed.p.quote(&p).await.unwrap(), eur(6_500));
    assert_eq!(
        listed.emu.stats().total,
        before,
        "the providers file answers, no request"
    );
}
