//! The Proxmox VE plugin through the host, against the Proxmox emulator: the conformance suite, then what is
//! Proxmox's own: the seed ISO (read back by the emulator's own ISO 9660 reader, so the user data is proven byte for
//! byte) and its removal with the VM, clone tasks that fail (reported with their exit status and class), a VM
//! defined but never started (never Stopped) and a create that resumes it, a failed start, locks, VMIDs derived
//! from the name (one VM for concurrent creates, also with PVE 8's message-less errors; a VMID held by another VM
//! is skipped), the guest agent's address, nodes that do not report, tags and the description as marks, config
//! errors that name the field.
//!
//! The last test runs the lifecycle against a real Proxmox VE host and is ignored unless asked for
//! (docs/providers/proxmox.md, "Testing").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use egress_emulators::proxmox::{EMULATOR_TOKEN_SECRET, ProxmoxConfig, ProxmoxEmulator};
use egress_emulators::tls::TestCa;
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Provider, State};
use std::time::Duration;

const INST: &str = "inst-a";

struct Pve {
    emu: ProxmoxEmulator,
    p: WasmProvider,
    _secrets: tempfile::TempDir,
}

fn entry(url: &str, secret: &std::path::Path, extra: &str) -> String {
    format!(
        "name: proxmox\nplugin: proxmox.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{tokenSecret: {secret}}}\n\
         config: {{endpoint: '{url}', tokenId: 'egress@pve!operator', nodes: [pve1, pve2], waitSeconds: 2, \
         templates: {{debian: 9000, gone: 9999}}, machineTypes: {{small: {{cores: 2, memoryMiB: 2048}}}}{extra}}}",
        secret = secret.display()
    )
}

async fn setup_with(cfg: ProxmoxConfig, extra: &str) -> Pve {
    let secrets = tempfile::tempdir().unwrap();
    let path = secrets.path().join("tokenSecret");
    std::fs::write(&path, format!("{}\n", cfg.token_secret)).unwrap();
    let emu = ProxmoxEmulator::start(cfg);
    let p = support::provider(
        &support::runtime(),
        "proxmox.wasm",
        &entry(&emu.url(), &path, extra),
    )
    .await;
    Pve {
        emu,
        p,
        _secrets: secrets,
    }
}

async fn setup() -> Pve {
    setup_with(ProxmoxConfig::default(), "").await
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n# \xff\x00 not text\n".to_vec(),
        ..CreateRequest::new(uid, INST, Placement::new("", "pve2", "small", "debian"))
    }
}

/// The VMID of a provider ID (`<vmid>/<name>`).
fn vmid(id: &str) -> &str {
    id.split('/').next().unwrap()
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let placement = Placement::new("", "pve2", "", "debian");
    support::suite::assert_passes(&g.p, &g.emu, placement).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_the_seed_iso_tags_and_the_agent_address() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let req = request("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01");

    let id = p.create(&req).await.unwrap();
    let (vm, name) = id.split_once('/').unwrap();
    assert_eq!(name, req.name);
    assert!(
        (900_000..=999_999).contains(&vm.parse::<u32>().unwrap()),
        "{id}"
    );
    let first = p.get(&id).await.unwrap();
    assert_eq!(
        (first.state, first.ip.as_str()),
        (State::Provisioning, ""),
        "starting: stopped to Proxmox, never Stopped"
    );
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    let inst = &dump.instances[0];
    assert_eq!(
        inst.scope, "pve2",
        "cloned from pve1 onto the placement's node"
    );
    assert_eq!(
        inst.user_data, req.cloud_init,
        "the seed ISO's user-data, read by the emulator, byte for byte"
    );
    assert_eq!(label(&inst.labels, MARK_MANAGED), Some("true"));
    assert_eq!(label(&inst.labels, MARK_UID), Some(req.uid.as_str()));
    assert_eq!(label(&inst.labels, MARK_INSTALLATION), Some(INST));
    let seed = emu.seed(vm).unwrap().unwrap();
    assert_eq!((seed.label.as_str(), seed.joliet), ("cidata", true));
    assert_eq!(
        seed.files.keys().collect::<Vec<_>>(),
        ["meta-data", "user-data"]
    );
    let meta = String::from_utf8(seed.files["meta-data"].clone()).unwrap();
    assert_eq!(
        meta,
        format!("instance-id: {name}-{vm}\nlocal-hostname: {name}\n")
    );
    let conf = emu.config(vm).unwrap();
    assert_eq!(
        conf["ide2"],
        format!("local:iso/{name}-cidata.iso,media=cdrom")
    );
    assert!(
        conf.get("ide0").is_none(),
        "the template's Cloud-Init drive is removed: {conf}"
    );
    assert_eq!(
        (
            conf["cores"].as_str(),
            conf["memory"].as_str(),
            conf["agent"].as_str()
        ),
        (Some("2"), Some("2048"), Some("1"))
    );
    let tags = conf["tags"].as_str().unwrap();
    assert!(
        tags.starts_with(&format!(
            "egress.managed;egress.uid.{};egress.inst.inst-a;egress.created.",
            req.uid
        )),
        "{tags}"
    );
    let description = conf["description"].as_str().unwrap();
    for line in [
        format!("egress.proxy-operator.dev/uid={}", req.uid),
        "egress.proxy-operator.dev/installation=inst-a".into(),
    ] {
        assert!(description.contains(&line), "{description}");
    }
    assert!(
        description.contains("egress.proxy-operator.dev/start-task=UPID:pve2:"),
        "{description}"
    );
    assert_eq!(emu.isos(), [format!("pve2/local:iso/{name}-cidata.iso")]);

    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(
        running.ip.starts_with("10.20."),
        "the guest agent's eth0 address: {}",
        running.ip
    );
    assert_eq!(running.uid, req.uid);
    assert!(running.created_at.is_some());
    emu.set_agent(vm, false);
    let no_agent = p.get(&id).await.unwrap();
    assert_eq!(
        (no_agent.state, no_agent.ip.as_str()),
        (State::Provisioning, ""),
        "the agent not running is no error"
    );
    emu.set_agent(vm, true);
    emu.set_backend_state(vm, "stopped");
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Stopped,
        "it ran, then stopped"
    );
    emu.set_backend_state(vm, "running");

    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.id.as_str(), i.uid.as_str()))
            .collect::<Vec<_>>(),
        [(id.as_str(), req.uid.as_str())]
    );
    assert!(p.list_by_tag("inst-b").await.unwrap().is_empty());

    // A VM of the name with another Proxy's uid is not adopted.
    let mine = request("uid-mine");
    emu.plant(Plant {
        name: mine.name.clone(),
        scope: "pve1".into(),
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
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert!(emu.isos().is_empty(), "the seed went with the VM");
    p.delete(&id).await.unwrap();
}

/// Proxmox accepts a clone and reports a failure in the task: create waits for it and reports the exit status, with
/// the class the failure calls for; no VM and no seed are left, and the next create starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_task_that_fails_is_reported_with_its_exit_status() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let req = request("uid-clone");
    for (exit, class) in [
        (
            "clone failed: lvcreate 'pve/vm-900100-disk-0' error:   Volume group \"pve\" has insufficient free space",
            Class::Transient,
        ),
        (
            "clone failed: Linked clone feature is not supported for 'local:9000/base-9000-disk-0.raw' (scsi0)",
            Class::Permanent,
        ),
    ] {
        emu.fail_next_clone(exit);
        let err = p.create(&req).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (class, Some("TaskFailed")),
            "{err}"
        );
        assert!(
            err.message.contains(exit) && err.message.contains(":qmclone:9000:"),
            "{err}"
        );
        let dump = emu.dump();
        assert!(
            dump.instances.is_empty() && dump.secondary.is_empty(),
            "{dump:?}"
        );
    }
    let id = p.create(&req).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Provisioning);
    // A template that is not there: permanent, before any clone.
    let mut gone = request("uid-gone");
    gone.placement.image = "gone".into();
    let err = p.create(&gone).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("InvalidImage")),
        "{err}"
    );
    assert!(err.message.contains("9999"), "{err}");
}

/// A VM cloned and configured but never started (the create stopped before the start) looks stopped to Proxmox;
/// the plugin answers Provisioning on every get, and the next create resumes it. A start that fails is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_defined_but_never_started_is_never_stopped() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let req = request("uid-never");
    emu.fail_calls("POST /nodes/{node}/qemu/{vmid}/status/start", 1);
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(err.class, Class::Transient, "{err}");
    let inst = emu.dump().instances.remove(0);
    assert_eq!(inst.state, "stopped");
    let id = format!("{}/{}", inst.id, req.name);
    for _ in 0..3 {
        let i = p.get(&id).await.unwrap();
        assert_eq!(
            (i.state, i.uid.as_str()),
            (State::Provisioning, req.uid.as_str()),
            "defined, never started"
        );
    }
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "the next create resumes it"
    );
    let uploads = emu
        .tasks()
        .into_iter()
        .filter(|(upid, _)| upid.contains(":imgcopy:"))
        .count();
    assert_eq!(uploads, 1, "the seed was uploaded once, and not again");
    p.get(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Running);

    let req = request("uid-failed-start");
    emu.fail_next_start("start failed: QEMU exited with code 1");
    let id = p.create(&req).await.unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("TaskFailed")),
        "{err}"
    );
    assert!(
        err.message.contains("QEMU exited with code 1") && err.message.contains(":qmstart:"),
        "{err}"
    );
}

/// PVE's `vm_start` holds the VM's config lock until its task ends, and a config write waits for that lock at most
/// 10 s (here 0.5 s), then fails `can't lock file '/var/lock/qemu-server/lock-N.conf' - got timeout`. A start slower
/// than that must not fail the create: the start marker is written once the start task has ended. A start longer
/// than `waitSeconds` (2 s here) is a transient `TaskRunning`, and the next create records it without a second
/// start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_start_holds_the_config_lock_and_create_waits_for_it() {
    let _dir = plugins_or_skip!();
    let slow = ProxmoxConfig {
        start_time: Duration::from_millis(1500),
        config_lock_wait: Duration::from_millis(500),
        ..ProxmoxConfig::default()
    };
    let g = setup_with(slow, "").await;
    let (p, emu) = (&g.p, &g.emu);
    let starts = |vm: &str| {
        let mine = format!(":qmstart:{vm}:");
        let all = emu.tasks().into_iter().filter(|(u, _)| u.contains(&mine));
        all.map(|(_, exit)| exit).collect::<Vec<_>>()
    };
    let req = request("uid-slow-start");
    let id = p.create(&req).await.unwrap();
    let description = emu.config(vmid(&id)).unwrap()["description"].clone();
    assert!(
        description
            .as_str()
            .unwrap()
            .contains("/start-task=UPID:pve2:"),
        "{description}"
    );
    assert_eq!(starts(vmid(&id)), [Some("OK".to_string())]);
    let mut states = Vec::new();
    for _ in 0..3 {
        states.push(p.get(&id).await.unwrap().state);
    }
    assert_eq!(
        states,
        [State::Provisioning, State::Running, State::Running],
        "booting, then up"
    );

    emu.set_start_time(Duration::from_secs(3));
    let req = request("uid-slower-start");
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("TaskRunning")),
        "{err}"
    );
    assert!(err.message.contains(":qmstart:"), "{err}");
    let vm = emu
        .dump()
        .instances
        .into_iter()
        .find(|i| i.name == req.name)
        .unwrap()
        .id;
    let id = format!("{vm}/{}", req.name);
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Provisioning,
        "starting, its start not recorded yet"
    );
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "the next create records it"
    );
    assert_eq!(starts(&vm), [Some("OK".to_string())], "one start, not two");
    let description = emu.config(&vm).unwrap()["description"].clone();
    assert!(
        description
            .as_str()
            .unwrap()
            .contains("/start-task=UPID:pve2:"),
        "{description}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_deletes() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let id = p.create(&request("uid-lock")).await.unwrap();
    p.get(&id).await.unwrap();
    emu.set_locked(vmid(&id), true);
    let i = p.get(&id).await.unwrap();
    assert_eq!(
        i.state,
        State::Running,
        "a backup lock leaves a running VM running"
    );
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("VmLocked")),
        "{err}"
    );
    assert!(err.message.contains("backup"), "{err}");
    assert_eq!(emu.dump().instances.len(), 1, "nothing was touched");
    emu.set_locked(vmid(&id), false);
    emu.start_slow_delete(vmid(&id));
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Terminated,
        "lock: destroyed"
    );
    p.delete(&id).await.unwrap();
    assert!(
        emu.isos().is_empty(),
        "a destroy in progress still gets its seed removed"
    );
    emu.finish_deletes();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);

    // Gone behind the operator's back: the seed it left is swept from every node.
    let id = p.create(&request("uid-behind")).await.unwrap();
    emu.start_slow_delete(vmid(&id));
    emu.finish_deletes();
    assert_eq!((emu.dump().instances.len(), emu.isos().len()), (0, 1));
    p.delete(&id).await.unwrap();
    assert!(emu.isos().is_empty(), "{:?}", emu.isos());
}

/// The VMID derives from the name: two creates for one Proxy meet at one VMID, and the clone that comes second
/// finds the first one's VM, also on PVE 8, whose errors carry no message. A VMID held by another VM is skipped;
/// when every candidate is taken the create says so instead of adopting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmids_derive_from_the_name() {
    let _dir = plugins_or_skip!();
    let pve8 = ProxmoxConfig {
        messages_in_body: false,
        clone_time: Duration::from_millis(300),
        ..ProxmoxConfig::default()
    };
    let g = setup_with(pve8, "").await;
    let req = request("uid-race");
    let (a, b) = tokio::join!(g.p.create(&req), g.p.create(&req));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(g.emu.dump().instances.len(), 1);

    let g = setup_with(ProxmoxConfig::default(), ", vmidRange: [900000, 900001]").await;
    let one = g.p.create(&request("uid-one")).await.unwrap();
    let two = g.p.create(&request("uid-two")).await.unwrap();
    assert_ne!(vmid(&one), vmid(&two));
    let err = g.p.create(&request("uid-three")).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("NoFreeVmid")),
        "{err}"
    );
    assert_eq!(g.emu.dump().instances.len(), 2);
}

/// A node that stops reporting leaves its VMs out of the list (logged), and a clone whose create stopped before
/// the tags were written is still found, through its description.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_leaves_out_silent_nodes_and_finds_untagged_clones() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    let id = p.create(&request("uid-l1")).await.unwrap();
    emu.fail_calls("PUT /nodes/{node}/qemu/{vmid}/config", 1);
    let half = request("uid-l2");
    assert_eq!(p.create(&half).await.unwrap_err().class, Class::Transient);
    let untagged = emu
        .dump()
        .instances
        .into_iter()
        .find(|i| i.name == half.name)
        .unwrap();
    assert!(
        untagged.labels.is_empty(),
        "no tags yet: {:?}",
        untagged.labels
    );
    let mut listed: Vec<(String, String)> = p
        .list_by_tag(INST)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.uid))
        .collect();
    listed.sort();
    let mut want = vec![
        (id.clone(), "uid-l1".to_string()),
        (format!("{}/{}", untagged.id, half.name), "uid-l2".into()),
    ];
    want.sort();
    assert_eq!(listed, want);
    emu.fail_scope("pve2", true);
    assert!(
        p.list_by_tag(INST).await.unwrap().is_empty(),
        "pve2 does not report"
    );
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("NodeUnreachable")),
        "{err}"
    );
    let targets = p.check().await.unwrap();
    let got: Vec<(&str, bool, &str)> = targets
        .iter()
        .map(|t| (t.target.as_str(), t.ready, t.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [("pve1", true, "Reachable"), ("pve2", false, "Unreachable")]
    );
    assert!(
        targets[0]
            .details
            .contains(&("memoryFreeMiB".into(), "57344".into())),
        "{targets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_make_no_call_and_answers_get_their_class() {
    let _dir = plugins_or_skip!();
    let g = setup().await;
    let (p, emu) = (&g.p, &g.emu);
    for (field, value, text) in [
        ("zone", "pve9", "placement.zone \"pve9\""),
        ("machineType", "huge", "placement.machineType \"huge\""),
        ("image", "ubuntu", "placement.image \"ubuntu\""),
    ] {
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
    for bad in [
        "",
        "proxy-x",
        "99/proxy-x",
        "900000/",
        "900000/a b",
        "1/2/3",
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
    emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 1,
    });
    let err = p.list_by_tag(INST).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("Unauthorized")),
        "{err}"
    );
}

/// A Proxmox host serves its API with a certificate of its cluster's CA: the plugin reaches it over HTTPS when the
/// provider entry trusts that CA (`tls.caFile`), the seed upload included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_clusters_ca() {
    let _dir = plugins_or_skip!();
    let ca = TestCa::new();
    let emu = ProxmoxEmulator::start_tls(ProxmoxConfig::default(), &ca);
    assert!(emu.url().starts_with("https://127.0.0.1:"), "{}", emu.url());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("tokenSecret");
    std::fs::write(&secret, EMULATOR_TOKEN_SECRET).unwrap();
    let tls = format!(
        "tls: {{caFile: {}}}\nlimits:",
        ca.write_ca_file(dir.path()).unwrap().display()
    );
    let yaml = entry(&emu.url(), &secret, "").replace("limits:", &tls);
    let p = support::provider(&support::runtime(), "proxmox.wasm", &yaml).await;
    let req = request("uid-https");
    let id = p.create(&req).await.unwrap();
    assert_eq!(
        emu.dump().instances[0].user_data,
        req.cloud_init,
        "the seed went up over HTTPS"
    );
    p.get(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().state, State::Running);
    assert!(p.check().await.unwrap().iter().all(|t| t.ready));
    p.delete(&id).await.unwrap();
    let dump = emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "{dump:?}"
    );
}

/// Without the cluster's CA the handshake fails before any request: every operation is transient (a certificate is
/// fixed in the providers file, not in the Proxy), and the error and the health check say what to configure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_without_the_ca_fails_and_says_why() {
    let _dir = plugins_or_skip!();
    let emu = ProxmoxEmulator::start_tls(ProxmoxConfig::default(), &TestCa::new());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("tokenSecret");
    std::fs::write(&secret, EMULATOR_TOKEN_SECRET).unwrap();
    let p = support::provider(
        &support::runtime(),
        "proxmox.wasm",
        &entry(&emu.url(), &secret, ""),
    )
    .await;
    let errs = [
        p.create(&request("uid-untrusted")).await.unwrap_err(),
        p.get("912345/proxy-x").await.unwrap_err(),
    ];
    for err in errs {
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Transient, Some("TlsProtocolError")),
            "{err}"
        );
        assert!(
            err.message.contains("tls.caFile") && err.message.contains("pve-root-ca.pem"),
            "{err}"
        );
    }
    let targets = p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unreachable" && t.message.contains("tls.caFile")),
        "{targets:?}"
    );
    assert!(
        emu.requests().is_empty(),
        "no request got through: {:?}",
        emu.requests()
    );
}

/// A config the plugin refuses stops the provider at load, with the field and the value.
#[tokio::test]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let plugin = support::load(&rt, "proxmox.wasm").await;
    let base =
        "name: proxmox\nplugin: proxmox.wasm\nsecrets: {tokenSecret: /nonexistent}\nconfig: ";
    let ok = "endpoint: 'https://pve.lan:8006', tokenId: 'a@pve!b', templates: {debian: 9000}";
    let cases: Vec<(String, &[&str])> = vec![
        (format!("{{{ok}, nodes: ['pve 1']}}"), &["config.nodes", "\"pve 1\""]),
        (format!("{{{ok}, nodes: [pve1], vmidRange: [5, 9]}}"), &["config.vmidRange", "[5, 9]"]),
        ("{endpoint: 'https://pve.lan:8006', tokenId: 'root@pam', nodes: [pve1], templates: {debian: 9000}}".into(), &["config.tokenId", "\"root@pam\""]),
        (format!("{{{ok}, nodes: [pve1], insecure: true}}"), &["insecure"]),
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

/// A cloud-init sentinel and the token secret never reach an error, a log line or a span, and the host had nothing
/// to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-pve-91c3";
    const TOKEN_SENTINEL: &str = "TOKEN-SENTINEL-pve-2d7a";
    let (_guard, captured) = proxy_operator::testing::capture();
    let s = setup_with(
        ProxmoxConfig {
            token_secret: TOKEN_SENTINEL.into(),
            ..ProxmoxConfig::default()
        },
        "",
    )
    .await;
    let p = egress_plugin_host::provider::Instrumented::new(s.p, Default::default());
    let mut req = request("uid-s");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let bad = CreateRequest {
        cloud_init: req.cloud_init.clone(),
        ..request("uid-s2")
    };
    let refuse = || {
        s.emu
            .fail_next_clone("clone failed: Linked clone feature is not supported")
    };
    let seen = support::sentinels::exercise(&p, &s.emu, &req, &bad, refuse).await;
    assert_ne!(EMULATOR_TOKEN_SECRET, TOKEN_SENTINEL);
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, TOKEN_SENTINEL],
        "proxmox create",
    );
}

/// The whole lifecycle against a real Proxmox VE host (`backend-test=integration-tag`): one VM cloned from
/// `PVE_TEMPLATE` on `PVE_NODE`, started, found by its guest agent's address, deleted with its seed image. The same
/// run as `proxy-operator provider lifecycle --provider proxmox ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PVE_ENDPOINT, PVE_TOKEN_ID, PVE_TOKEN_SECRET, PVE_NODE and PVE_TEMPLATE (a template with cloud-init and the QEMU guest agent); run with --ignored"]
async fn real_proxmox_lifecycle() {
    let _dir = plugins_or_skip!();
    let vars = [
        "PVE_ENDPOINT",
        "PVE_TOKEN_ID",
        "PVE_TOKEN_SECRET",
        "PVE_NODE",
        "PVE_TEMPLATE",
    ]
    .map(std::env::var);
    let [
        Ok(endpoint),
        Ok(token_id),
        Ok(secret),
        Ok(node),
        Ok(template),
    ] = vars
    else {
        eprintln!(
            "SKIPPING real_proxmox_lifecycle: PVE_ENDPOINT, PVE_TOKEN_ID, PVE_TOKEN_SECRET, PVE_NODE or PVE_TEMPLATE is not set"
        );
        return;
    };
    let (_secret_dir, path) = support::real_cloud::secret_file(&secret);
    let tls = match std::env::var("PVE_CA_FILE") {
        Ok(ca) => format!("tls: {{caFile: '{ca}'}}\n"),
        Err(_) => String::new(),
    };
    let host = endpoint.trim_end_matches('/');
    let yaml = format!(
        "name: proxmox-real\nplugin: proxmox.wasm\nadditionalHosts: ['{host}']\nallowPrivateAddresses: true\n{tls}\
         secrets: {{tokenSecret: {}}}\n\
         config: {{endpoint: '{host}', tokenId: '{token_id}', nodes: [{node}], templates: {{test: {template}}}, \
         isoStorage: {}}}",
        path.display(),
        std::env::var("PVE_ISO_STORAGE").unwrap_or_else(|_| "local".into())
    );
    let p = support::provider(&support::runtime(), "proxmox.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new("", &node, "", "test"),
        installation: support::real_cloud::INSTALLATION.into(),
        cloud_init: b"#cloud-config\npackages: [qemu-guest-agent]\nruncmd: [[systemctl, start, qemu-guest-agent]]\n".to_vec(),
        ..request(&uid)
    };
    let pace = support::real_cloud::Pace {
        running_within: Duration::from_secs(600),
        ..Default::default()
    };
    support::real_cloud::lifecycle(&p, &req, pace).await;
}
