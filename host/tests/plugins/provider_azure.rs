//! The Azure plugin through the host, against the Azure Resource Manager emulator: the
//! conformance suite, then what is Azure's own: one instance is three tagged parts (public
//! IP, NIC, VM) tied together by `deleteOption`s, so a crash after any step of a create leaves
//! parts that GC finds by tag and deletes; ARM's long-running operations are polled as their
//! `Retry-After` asks; access tokens come from a client secret or a federated token file, are
//! cached and renewed inside the call, and a refused credential is permanent; throttling is
//! QuotaExceeded; Spot capacity refused in each of Azure's three ways is
//! `SpotCapacityUnavailable` and leaves nothing; an evicted Spot VM is interrupted; the
//! resource list pages; quotes come from the Retail Prices API; config errors name the field.
//!
//! The last test runs the lifecycle against a real subscription and is ignored unless asked
//! for (docs/providers/azure.md, "Testing").

use crate::support;

use egress_emulators::azure::{
    AzureConfig, AzureEmulator, ClientSpec, EMULATOR_CLIENT_ID, EMULATOR_CLIENT_SECRET,
    EMULATOR_FEDERATED_CLIENT_ID, EMULATOR_RESOURCE_GROUP, EMULATOR_SUBSCRIPTION, EMULATOR_TENANT,
    ResourceKind, SpotRefusal,
};
use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant, RateLimit};
use egress_emulators::framework::Schedule;
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Capacity, Class, CreateRequest, Placement, Provider, State};
use proxy_operator::gc::{Verdict, verdict};
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

const INST: &str = "inst-a";
const LOCATION: &str = "westeurope";
const SIZE: &str = "Standard_B1s";
/// The emulator's subnets, one per location (a virtual network is regional).
fn subnet(rg: &str, vnet: &str) -> String {
    format!(
        "/subscriptions/{EMULATOR_SUBSCRIPTION}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/default"
    )
}
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEsaFYgsJ8DSVcIXjOuAOfaZ5RgAwVTVBvTdBGf6XuBd egress";

struct Azure {
    emu: AzureEmulator,
    p: WasmProvider,
    secrets: tempfile::TempDir,
}

/// The config block for the emulator at `url`; `extra` adds fields (`, waitSeconds: 5`).
fn config(url: &str, client: &str, extra: &str) -> String {
    format!(
        "{{tenantId: {EMULATOR_TENANT}, clientId: {client}, subscriptionId: {EMULATOR_SUBSCRIPTION}, \
         resourceGroup: {EMULATOR_RESOURCE_GROUP}, \
         locations: {{westeurope: '{}', eastus: '{}'}}, \
         vmSizes: [Standard_B1s, Standard_B2s, Standard_D2s_v5], \
         images: {{ubuntu: 'Canonical:ubuntu-24_04-lts:server:latest'}}, sshPublicKey: '{SSH_KEY}', \
         authorityHost: '{url}', armEndpoint: '{url}', pricesEndpoint: '{url}'{extra}}}",
        subnet(EMULATOR_RESOURCE_GROUP, "egress-vnet"),
        subnet("egress-rg-us", "egress-vnet-us"),
    )
}

fn entry(url: &str, secrets: &Path, config: &str) -> String {
    entry_with(url, secrets, config, "5s")
}

/// [`entry`] with the host's time limit for one call.
fn entry_with(url: &str, secrets: &Path, config: &str, timeout: &str) -> String {
    format!(
        "name: azure\nplugin: azure.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: {timeout}}}\nsecrets: {{clientSecret: {}, federatedToken: {}}}\nconfig: {config}",
        secrets.join("clientSecret").display(),
        secrets.join("federatedToken").display(),
    )
}

/// The emulator and the plugin with `secret` as the client secret and `extra` in the config.
async fn setup_with(cfg: AzureConfig, secret: &str, extra: &str) -> Azure {
    setup_full(cfg, secret, extra, "5s").await
}

async fn setup_full(cfg: AzureConfig, secret: &str, extra: &str, timeout: &str) -> Azure {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("clientSecret"), format!("{secret}\n")).unwrap();
    let emu = AzureEmulator::start(cfg);
    let yaml = entry_with(
        &emu.url(),
        secrets.path(),
        &config(&emu.url(), EMULATOR_CLIENT_ID, extra),
        timeout,
    );
    let p = support::provider(&support::runtime(), "azure.wasm", &yaml).await;
    Azure { emu, p, secrets }
}

/// Operations end at their second poll without waiting: the provisioning window exists, and
/// costs no wall time (the Retry-After waits have a test of their own).
fn quick() -> AzureConfig {
    AzureConfig {
        retry_after: 0,
        ..AzureConfig::default()
    }
}

async fn setup() -> Azure {
    setup_with(quick(), EMULATOR_CLIENT_SECRET, "").await
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n".to_vec(),
        ..CreateRequest::new(uid, INST, Placement::new(LOCATION, "", SIZE, "ubuntu"))
    }
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

fn vm_id(name: &str) -> String {
    format!(
        "/subscriptions/{EMULATOR_SUBSCRIPTION}/resourceGroups/{EMULATOR_RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
}

/// The name of an instance from its provider ID.
fn name_of(id: &str) -> &str {
    id.rsplit('/').next().unwrap()
}

/// Every resource the emulator holds, as `kind name`.
fn held(emu: &AzureEmulator) -> Vec<String> {
    emu.resources()
        .iter()
        .map(|r| format!("{:?} {}", r.kind, r.name))
        .collect()
}

/// Gets until `done` holds, at most 50 times.
async fn get_until(
    p: &WasmProvider,
    id: &str,
    done: impl Fn(
        &Result<egress_plugin_host::provider::Instance, egress_plugin_host::provider::ProviderError>,
    ) -> bool,
) -> Result<egress_plugin_host::provider::Instance, egress_plugin_host::provider::ProviderError> {
    for _ in 0..50 {
        let r = p.get(id).await;
        if done(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("Get({id}) never reached the state asked for");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let placement = Placement::new(LOCATION, "", SIZE, "ubuntu");
    support::suite::assert_passes(&a.p, &a.emu, placement).await;
    assert!(a.emu.resources().is_empty(), "{:?}", held(&a.emu));
}

/// One instance is a Standard static public IP, a NIC using it and a VM, each with the marks
/// as tags, the parts tied to the VM by their deleteOptions; the address is the public IP's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_tags_parts_user_data_and_the_public_ip() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let (p, emu) = (&a.p, &a.emu);
    let req = request("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01");

    let id = p.create(&req).await.unwrap();
    assert_eq!(
        id,
        format!(
            "{EMULATOR_SUBSCRIPTION}/{EMULATOR_RESOURCE_GROUP}/{}",
            req.name
        )
    );
    let first = p.get(&id).await.unwrap();
    assert_eq!((first.state, first.ip.as_str()), (State::Provisioning, ""));
    assert_eq!(p.create(&req).await.unwrap(), id, "idempotent by name");
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    assert_eq!(
        dump.instances[0].user_data, req.cloud_init,
        "customData, byte for byte"
    );
    let mut kinds: Vec<(ResourceKind, String)> = emu
        .resources()
        .into_iter()
        .map(|r| {
            if r.kind != ResourceKind::Disk {
                assert_eq!(r.tags["egress-managed"], "true", "{}", r.name);
                assert_eq!(r.tags["egress-uid"], req.uid, "{}", r.name);
                assert_eq!(r.tags["egress-installation"], INST, "{}", r.name);
            }
            (r.kind, r.name)
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [
            ResourceKind::PublicIp,
            ResourceKind::Nic,
            ResourceKind::Disk,
            ResourceKind::Vm
        ]
    );
    assert_eq!(kinds[0].1, format!("{}-ip", req.name));
    assert_eq!(kinds[1].1, format!("{}-nic", req.name));
    let labels = &dump.instances[0].labels;
    let label = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        (
            label(MARK_MANAGED),
            label(MARK_UID),
            label(MARK_INSTALLATION)
        ),
        (Some("true"), Some(req.uid.as_str()), Some(INST))
    );
    let vm = emu.resource(&vm_id(&req.name)).unwrap();
    let props = &vm["properties"];
    assert_eq!(props["hardwareProfile"]["vmSize"], SIZE);
    assert_eq!(props["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(
        props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
        "Delete"
    );
    assert_eq!(props["osProfile"]["adminUsername"], "azureuser");
    assert!(
        props.get("priority").is_none(),
        "on-demand is Regular: {vm}"
    );
    let ip_path = vm_id(&req.name).replace(
        "Microsoft.Compute/virtualMachines",
        "Microsoft.Network/publicIPAddresses",
    ) + "-ip";
    let ip = emu.resource(&ip_path).unwrap();
    assert_eq!(ip["sku"]["name"], "Standard");
    assert_eq!(ip["properties"]["publicIPAllocationMethod"], "Static");
    assert_eq!(
        ip["properties"]["deleteOption"], "Delete",
        "set through the NIC's IP configuration"
    );

    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(
        running.ip.starts_with("198.51.100."),
        "the public IP's address: {}",
        running.ip
    );
    assert_eq!(running.uid, req.uid);
    assert!(running.created_at.is_some());
    let b = vm_id(&req.name);
    emu.set_address(&b, None);
    let no_ip = p.get(&id).await.unwrap();
    assert_eq!((no_ip.state, no_ip.ip.as_str()), (State::Provisioning, ""));
    emu.set_address(&b, Some("198.51.100.99"));
    for (raw, want) in [
        ("deallocated", State::Stopped),
        ("stopped", State::Stopped),
        ("starting", State::Provisioning),
        ("Creating", State::Provisioning),
        ("Failed", State::Stopped),
        ("running", State::Running),
    ] {
        emu.set_backend_state(&b, raw);
        assert_eq!(p.get(&id).await.unwrap().state, want, "{raw}");
    }

    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.id.as_str(), i.uid.as_str(), i.state, i.ip.as_str()))
            .collect::<Vec<_>>(),
        [(
            id.as_str(),
            req.uid.as_str(),
            State::Running,
            "198.51.100.99"
        )]
    );
    assert!(p.list_by_tag("inst-b").await.unwrap().is_empty());

    // A VM of the name with another Proxy's uid is not adopted.
    let mine = request("uid-mine");
    emu.plant(Plant {
        name: mine.name.clone(),
        scope: EMULATOR_RESOURCE_GROUP.into(),
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
    let deleting = p.get(&id).await.unwrap();
    assert_eq!(
        (deleting.state, deleting.interrupted),
        (State::Terminated, false)
    );
    p.delete(&id).await.unwrap();
    let gone = get_until(p, &id, |r| r.is_err()).await.unwrap_err();
    assert_eq!(
        (gone.class, gone.code.as_deref()),
        (Class::NotFound, Some("ResourceNotFound")),
        "{gone}"
    );
    assert!(
        emu.resources()
            .iter()
            .all(|r| !r.name.starts_with(req.name.as_str())),
        "the disk, NIC and IP went with the VM: {:?}",
        held(emu)
    );
}

/// ARM's writes are long-running operations: the plugin waits for the public IP's and the
/// NIC's before the next part refers to them, polling the `Azure-AsyncOperation` URL after
/// the `Retry-After` each answer names; past `waitSeconds` it stops (transient) and the next
/// create carries on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_running_operations_are_polled_as_retry_after_asks() {
    let _dir = plugins_or_skip!();
    let a = setup_full(
        AzureConfig {
            retry_after: 1,
            ..AzureConfig::default()
        },
        EMULATOR_CLIENT_SECRET,
        "",
        "15s",
    )
    .await;
    let started = Instant::now();
    let id = a.p.create(&request("uid-lro")).await.unwrap();
    let took = started.elapsed();
    // Each of the two operations: 1 s before the first poll (InProgress), 1 s before the second.
    assert!(took >= Duration::from_secs(4), "{took:?}");
    let requests = a.emu.requests();
    let polls: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains("/operations/"))
        .collect();
    assert_eq!(polls.len(), 4, "{requests:#?}");
    assert!(
        polls[..2]
            .iter()
            .all(|r| r.contains("/providers/Microsoft.Network/locations/westeurope/operations/")),
        "{polls:?}"
    );
    let order: Vec<&str> = requests
        .iter()
        .filter(|r| r.starts_with("PUT "))
        .map(|r| r.split('?').next().unwrap().rsplit('/').nth(1).unwrap())
        .collect();
    assert_eq!(
        order,
        ["publicIPAddresses", "networkInterfaces", "virtualMachines"],
        "IP, then the NIC that uses it, then the VM"
    );
    assert!(a.p.get(&id).await.is_ok());

    // An operation that takes longer than this call may wait.
    let slow = setup_full(
        AzureConfig {
            retry_after: 2,
            schedule: Schedule::AfterReads(2),
            ..AzureConfig::default()
        },
        EMULATOR_CLIENT_SECRET,
        ", waitSeconds: 3",
        "15s",
    )
    .await;
    let req = request("uid-slow");
    let err = slow.p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("OperationInProgress")),
        "{err}"
    );
    assert!(
        err.message.contains("public IP") && err.message.contains("waitSeconds"),
        "{err}"
    );
    // Each create takes the operations further (the NIC's may run out of the wait in its
    // turn) until one returns the VM.
    let mut id = None;
    for _ in 0..6 {
        match slow.p.create(&req).await {
            Ok(got) => {
                id = Some(got);
                break;
            }
            Err(e) if e.code.as_deref() == Some("OperationInProgress") => continue,
            Err(e) => panic!("{e}"),
        }
    }
    let id = id.expect("a create returned the VM");
    assert_eq!(name_of(&id), req.name);
    let ips = slow
        .emu
        .resources()
        .iter()
        .filter(|r| r.kind == ResourceKind::PublicIp)
        .count();
    assert_eq!(ips, 1, "a repeated create writes the same parts");
}

/// Tokens are exchanged once and kept in the host cache; one ARM refuses (expired early,
/// revoked) is renewed inside the call, so no call fails for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed_without_a_failed_call() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let (p, emu) = (&a.p, &a.emu);
    let id = p.create(&request("uid-t")).await.unwrap();
    for _ in 0..3 {
        p.get(&id).await.unwrap();
    }
    p.list_by_tag(INST).await.unwrap();
    assert_eq!(emu.token_grants(), 1, "one exchange for all calls");

    emu.expire_tokens();
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Running,
        "renewed inside the call"
    );
    assert_eq!(emu.token_grants(), 2);
    emu.expire_tokens();
    p.list_by_tag(INST).await.unwrap();
    emu.expire_tokens();
    p.delete(&id).await.unwrap();
    assert_eq!(emu.token_grants(), 4);
    let deletes = emu
        .stats()
        .by_call
        .get("DELETE Microsoft.Compute/virtualMachines")
        .copied();
    assert_eq!(
        deletes,
        Some(2),
        "one refused with the old token, one accepted"
    );

    // A token that lives less than the renewal margin is not cached: every call exchanges.
    let short = setup_with(
        AzureConfig {
            token_lifetime: 200,
            ..quick()
        },
        EMULATOR_CLIENT_SECRET,
        "",
    )
    .await;
    let id = short.p.create(&request("uid-short")).await.unwrap();
    short.p.get(&id).await.unwrap();
    assert_eq!(short.emu.token_grants(), 2);
}

/// A credential the token endpoint refuses will not start working by itself: permanent, from
/// every operation and the check, naming the fields and never the secret; no ARM call is made
/// without a token. A missing secret file is transient (the Secret may not be mounted yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_permanent() {
    let _dir = plugins_or_skip!();
    let wrong = "not-the~client~secret";
    let a = setup_with(quick(), wrong, "").await;
    let id = format!("{EMULATOR_SUBSCRIPTION}/{EMULATOR_RESOURCE_GROUP}/proxy-x");
    let errs = [
        a.p.create(&request("uid-k")).await.unwrap_err(),
        a.p.get(&id).await.unwrap_err(),
        a.p.delete(&id).await.unwrap_err(),
        a.p.list_by_tag(INST).await.unwrap_err(),
    ];
    for err in errs {
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some("invalid_client")),
            "{err}"
        );
        assert!(
            err.message.contains("AADSTS7000215")
                && err.message.contains(EMULATOR_CLIENT_ID)
                && err.message.contains("secret \"clientSecret\""),
            "{err}"
        );
        assert!(
            !err.message.contains(wrong) && !err.message.contains("Trace ID"),
            "{err}"
        );
    }
    let targets = a.p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unauthorized"),
        "{targets:?}"
    );
    assert_eq!(a.emu.token_grants(), 0);
    assert!(
        a.emu.requests().is_empty(),
        "no ARM call without a token: {:?}",
        a.emu.requests()
    );

    // Another tenant: refused, naming config.tenantId.
    let rt = support::runtime();
    let other = config(&a.emu.url(), EMULATOR_CLIENT_ID, "")
        .replace(EMULATOR_TENANT, "00000000-0000-4000-8000-000000000000");
    let p = support::provider(
        &rt,
        "azure.wasm",
        &entry(&a.emu.url(), a.secrets.path(), &other),
    )
    .await;
    std::fs::write(
        a.secrets.path().join("clientSecret"),
        EMULATOR_CLIENT_SECRET,
    )
    .unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(err.class, Class::Permanent, "{err}");
    assert!(
        err.message.contains("AADSTS90002")
            && err
                .message
                .contains("config.tenantId \"00000000-0000-4000-8000-000000000000\""),
        "{err}"
    );
    std::fs::remove_file(a.secrets.path().join("clientSecret")).unwrap();
    let err = a.p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("SecretMissing")),
        "{err}"
    );
}

/// Workload identity: the federated token file is sent as the client assertion, read again
/// each time a token is needed (it rotates), so a rotated file takes effect at the next
/// exchange and a refused one is permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_sends_the_federated_token_read_each_time() {
    let _dir = plugins_or_skip!();
    let mut cfg = quick();
    for c in &mut cfg.clients {
        if c.client_id == EMULATOR_FEDERATED_CLIENT_ID {
            *c = ClientSpec {
                client_id: EMULATOR_FEDERATED_CLIENT_ID.into(),
                secret: None,
                federated: Some(vec!["projected-token-1".into(), "projected-token-2".into()]),
            };
        }
    }
    let emu = AzureEmulator::start(cfg);
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("federatedToken");
    std::fs::write(&file, "projected-token-1\n").unwrap();
    let yaml = entry(
        &emu.url(),
        secrets.path(),
        &config(
            &emu.url(),
            EMULATOR_FEDERATED_CLIENT_ID,
            ", credential: workloadIdentity",
        ),
    );
    let p = support::provider(&support::runtime(), "azure.wasm", &yaml).await;
    let id = p.create(&request("uid-wi")).await.unwrap();
    p.get(&id).await.unwrap();
    assert_eq!(emu.token_grants(), 1, "one token, cached");
    assert!(p.check().await.unwrap().iter().all(|t| t.ready));

    // The file rotates: the next exchange reads the new one.
    std::fs::write(&file, "projected-token-2").unwrap();
    emu.expire_tokens();
    assert!(p.get(&id).await.is_ok());
    assert_eq!(emu.token_grants(), 2);
    // A token Entra ID has no federated credential for: permanent, naming the secret.
    std::fs::write(&file, "stale-or-foreign-token").unwrap();
    emu.expire_tokens();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("invalid_client")),
        "{err}"
    );
    assert!(
        err.message.contains("AADSTS700213") && err.message.contains("\"federatedToken\""),
        "{err}"
    );
    assert!(!err.message.contains("stale-or-foreign-token"), "{err}");
    std::fs::write(&file, "").unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(err.code.as_deref(), Some("SecretEmpty"), "{err}");
}

/// ARM's throttling (429 `SubscriptionRequestsThrottled` with `Retry-After`) is QuotaExceeded
/// with ARM's code, and its wait is in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_quota_exceeded_with_retry_after() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let id = a.p.create(&request("uid-r")).await.unwrap();
    a.emu.set_rate_limit(Some(RateLimit {
        per_hour: 60,
        burst: 1,
    }));
    let mut errors = Vec::new();
    for _ in 0..3 {
        if let Err(e) = a.p.get(&id).await {
            errors.push(e);
        }
    }
    let err = errors.first().expect("a throttled get");
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("SubscriptionRequestsThrottled")),
        "{err}"
    );
    assert!(err.message.contains("retry after 60 s"), "{err}");
    assert!(a.emu.stats().rate_limited >= 1);
}

/// A crash after each step of a create (the public IP made, the NIC made, the VM accepted
/// but not yet created) leaves parts that carry the marks: while the Proxy lives GC keeps them
/// and a repeated create reuses them; once it is gone, GC's list names them and its delete
/// removes every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_each_step_of_create_leaves_nothing_after_gc() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let (p, emu) = (&a.p, &a.emu);
    // The GETs a create makes before each step's first poll stalls it: the name lookup, then
    // two polls of the public IP's operation.
    for (step, gets_before, parts) in [
        ("after the public IP", 1, &[ResourceKind::PublicIp][..]),
        (
            "after the NIC",
            3,
            &[ResourceKind::PublicIp, ResourceKind::Nic][..],
        ),
        (
            "after the VM PUT",
            usize::MAX,
            &[
                ResourceKind::PublicIp,
                ResourceKind::Nic,
                ResourceKind::Disk,
                ResourceKind::Vm,
            ][..],
        ),
    ] {
        emu.reset();
        let req = request(&format!("uid-crash-{}", step.len()));
        if gets_before == usize::MAX {
            // The VM is accepted and held in its creation; the operator dies before it
            // records the ID.
            p.create(&req).await.unwrap();
            assert!(emu.hold_provisioning(&vm_id(&req.name), true));
        } else {
            let pass = Fault::slow(FaultOp::Get, Duration::ZERO, gets_before as u32);
            emu.inject(pass);
            emu.inject(Fault::slow(FaultOp::Get, Duration::from_secs(8), 1));
            let cut = tokio::time::timeout(Duration::from_millis(1500), p.create(&req)).await;
            assert!(
                cut.is_err(),
                "{step}: the create should have been cut short"
            );
        }
        let mut kinds: Vec<ResourceKind> = emu.resources().iter().map(|r| r.kind).collect();
        kinds.sort();
        assert_eq!(kinds, parts, "{step}: {:?}", held(emu));

        // GC while the Proxy lives: listed with its uid, kept.
        let listed = p.list_by_tag(INST).await.unwrap();
        assert_eq!(listed.len(), 1, "{step}: {listed:?}");
        let leftover = &listed[0];
        assert_eq!(
            (leftover.id.as_str(), leftover.uid.as_str()),
            (
                format!(
                    "{EMULATOR_SUBSCRIPTION}/{EMULATOR_RESOURCE_GROUP}/{}",
                    req.name
                )
                .as_str(),
                req.uid.as_str()
            ),
            "{step}"
        );
        assert!(leftover.created_at.is_some(), "{step}");
        let live = HashSet::from([req.uid.clone()]);
        let now = SystemTime::now() + Duration::from_secs(3600);
        let min_age = Duration::from_secs(600);
        assert_eq!(
            verdict(leftover, &live, now, min_age),
            Verdict::KeepLive,
            "{step}"
        );
        // GC once the Proxy is gone: every listed instance deleted, then nothing is left.
        for i in &listed {
            assert_eq!(
                verdict(i, &HashSet::new(), now, min_age),
                Verdict::Delete,
                "{step}"
            );
            p.delete(&i.id).await.unwrap();
        }
        emu.finish_deletes();
        let gone = get_until(p, &leftover.id, |r| r.is_err())
            .await
            .unwrap_err();
        assert_eq!(gone.class, Class::NotFound, "{step}: {gone}");
        assert!(emu.resources().is_empty(), "{step}: {:?}", held(emu));
        assert!(p.list_by_tag(INST).await.unwrap().is_empty(), "{step}");
    }

    // A repeated create after a crash reuses the parts the first one made.
    emu.reset();
    let req = request("uid-crash-retry");
    emu.inject(Fault::slow(FaultOp::Get, Duration::ZERO, 3));
    emu.inject(Fault::slow(FaultOp::Get, Duration::from_secs(8), 1));
    let cut = tokio::time::timeout(Duration::from_millis(1500), p.create(&req)).await;
    assert!(cut.is_err());
    let id = p.create(&req).await.unwrap();
    let running = get_until(p, &id, |r| matches!(r, Ok(i) if i.state == State::Running))
        .await
        .unwrap();
    assert!(!running.ip.is_empty());
    let mut kinds: Vec<ResourceKind> = emu.resources().iter().map(|r| r.kind).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ResourceKind::PublicIp,
            ResourceKind::Nic,
            ResourceKind::Disk,
            ResourceKind::Vm
        ],
        "one of each: {:?}",
        held(emu)
    );
    // A delete of leftovers leaves a part that is not the operator's alone.
    p.delete(&id).await.unwrap();
    emu.finish_deletes();
    get_until(p, &id, |r| r.is_err()).await.unwrap_err();
    assert!(emu.resources().is_empty(), "{:?}", held(emu));
}

/// Without Spot capacity Azure refuses in three ways: the PUT itself (`SkuNotAvailable`), or
/// an accepted VM whose creation fails (`OverconstrainedAllocationRequest`,
/// `AllocationFailed`). Each is QuotaExceeded with code SpotCapacityUnavailable naming
/// Azure's code, from the create or from the first get, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spot_capacity_in_each_of_azures_ways_is_quota_and_leaves_nothing() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let (p, emu) = (&a.p, &a.emu);
    for (refusal, code) in [
        (SpotRefusal::SkuNotAvailable, "SkuNotAvailable"),
        (
            SpotRefusal::Overconstrained,
            "OverconstrainedAllocationRequest",
        ),
        (SpotRefusal::AllocationFailed, "AllocationFailed"),
    ] {
        emu.reset();
        emu.refuse_spot(Some(refusal));
        let req = spot(request(&format!("uid-{code}")));
        let err = match p.create(&req).await {
            Err(e) => e,
            Ok(id) => get_until(p, &id, |r| r.is_err()).await.unwrap_err(),
        };
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::QuotaExceeded, Some("SpotCapacityUnavailable")),
            "{code}: {err}"
        );
        assert!(
            err.message.contains(code) && err.message.contains("placement.capacity Spot"),
            "{err}"
        );
        assert!(emu.resources().is_empty(), "{code}: {:?}", held(emu));
        emu.refuse_spot(None);
        let id = p.create(&req).await.unwrap();
        let running = get_until(p, &id, |r| matches!(r, Ok(i) if i.state == State::Running))
            .await
            .unwrap();
        assert!(!running.interrupted);
    }
    // An on-demand create is not affected by the Spot capacity.
    emu.refuse_spot(Some(SpotRefusal::SkuNotAvailable));
    p.create(&request("uid-od")).await.unwrap();
}

/// A Spot VM is Spot, deleted on eviction, at any price. Evicted, it reads `Deleting` while
/// Azure removes it: Terminated and interrupted, then NotFound with code Interrupted. The
/// replacement (same name) is not interrupted, and neither is a VM this plugin deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_spot_vm_is_interrupted_and_its_replacement_is_not() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let (p, emu) = (&a.p, &a.emu);
    let req = spot(request("uid-e"));
    let id = p.create(&req).await.unwrap();
    let vm = emu.resource(&vm_id(&req.name)).unwrap();
    assert_eq!(
        (
            vm["properties"]["priority"].clone(),
            vm["properties"]["evictionPolicy"].clone(),
            vm["properties"]["billingProfile"]["maxPrice"].clone()
        ),
        (
            serde_json::json!("Spot"),
            serde_json::json!("Delete"),
            serde_json::json!(-1.0)
        )
    );
    assert_eq!(emu.spot_instances(), [vm_id(&req.name)]);
    get_until(p, &id, |r| matches!(r, Ok(i) if i.state == State::Running))
        .await
        .unwrap();
    assert!(emu.evict(&vm_id(&req.name)));
    let evicted = p.get(&id).await.unwrap();
    assert_eq!(
        (evicted.state, evicted.interrupted),
        (State::Terminated, true)
    );
    let e = get_until(p, &id, |r| r.is_err()).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("Interrupted")),
        "{e}"
    );
    assert!(e.message.contains("evicted"), "{e}");
    assert!(emu.resources().is_empty(), "{:?}", held(emu));
    p.delete(&id).await.expect("already gone is success");

    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "the replacement, same name"
    );
    let running = get_until(p, &id, |r| matches!(r, Ok(i) if i.state == State::Running))
        .await
        .unwrap();
    assert!(!running.interrupted);
    p.delete(&id).await.unwrap();
    let deleting = p.get(&id).await.unwrap();
    assert_eq!(
        (deleting.state, deleting.interrupted),
        (State::Terminated, false),
        "deleted by the plugin, not evicted"
    );
    let e = get_until(p, &id, |r| r.is_err()).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("ResourceNotFound")),
        "{e}"
    );
}

/// The list follows `nextLink` through the resource list and the typed lists; it filters by
/// the installation tag's name (ARM returns no tags when a value is named too) and checks the
/// value itself; a failing region fails it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_and_checks_the_tags_itself() {
    let _dir = plugins_or_skip!();
    let a = setup_with(
        AzureConfig {
            page_size: 2,
            list_page_size: 2,
            ..quick()
        },
        EMULATOR_CLIENT_SECRET,
        "",
    )
    .await;
    let (p, emu) = (&a.p, &a.emu);
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(p.create(&request(&format!("uid-page-{n}"))).await.unwrap());
    }
    for (name, inst) in [("proxy-planted-a", INST), ("proxy-planted-b", "inst-other")] {
        emu.plant(Plant {
            name: name.into(),
            scope: EMULATOR_RESOURCE_GROUP.into(),
            managed: true,
            uid: Some(format!("uid-{name}")),
            installation: Some(inst.into()),
            created_at: Some(1_700_000_000),
        });
    }
    let listed = p.list_by_tag(INST).await.unwrap();
    let mut got: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    got.sort();
    let mut want: Vec<String> = ids.clone();
    want.push(format!(
        "{EMULATOR_SUBSCRIPTION}/{EMULATOR_RESOURCE_GROUP}/proxy-planted-a"
    ));
    want.sort();
    assert_eq!(got, want);
    let planted = listed
        .iter()
        .find(|i| i.id.ends_with("/proxy-planted-a"))
        .unwrap();
    assert_eq!(
        planted
            .created_at
            .map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()),
        Some(1_700_000_000)
    );
    assert_eq!(
        (planted.state, planted.uid.as_str()),
        (State::Running, "uid-proxy-planted-a")
    );
    let requests = emu.requests();
    let generic: Vec<&String> = requests
        .iter()
        .filter(|r| r.contains("/resources?"))
        .collect();
    assert!(
        generic.len() >= 6 && generic.iter().skip(1).all(|r| r.contains("$skiptoken=")),
        "4 instances of 3 tagged parts and one of another installation, 2 a page: {generic:#?}"
    );
    assert!(
        generic[0].contains("tagName%20eq%20%27egress-installation%27")
            && !generic[0].contains("tagValue"),
        "{generic:?}"
    );
    assert!(
        requests.iter().any(|r| r.contains("virtualMachines?")
            && r.contains("$expand=instanceView")
            && r.contains("$skiptoken=")),
        "{requests:#?}"
    );
    emu.fail_scope(LOCATION, true);
    let err = p.list_by_tag(INST).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("InternalServerError")),
        "{err}"
    );
}

/// Quotes come from the Retail Prices API: the Linux pay-as-you-go or Spot meter of the size
/// in the location, in USD, following `NextPageLink`; a size without a meter has no price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotes_are_the_linux_meters_of_the_retail_prices() {
    let _dir = plugins_or_skip!();
    let a = setup_with(
        AzureConfig {
            prices_page_size: 1,
            ..quick()
        },
        EMULATOR_CLIENT_SECRET,
        "",
    )
    .await;
    let quote = |region: &str, size: &str, capacity: Capacity| {
        let placement = Placement {
            capacity,
            ..Placement::new(region, "", size, "ubuntu")
        };
        let p = &a.p;
        async move { p.quote(&placement).await }
    };
    for (region, size, capacity, micros) in [
        (LOCATION, SIZE, Capacity::OnDemand, 12_400),
        (LOCATION, SIZE, Capacity::Spot, 2_500),
        ("eastus", "Standard_B2s", Capacity::OnDemand, 44_600),
    ] {
        let price = quote(region, size, capacity).await.unwrap().unwrap();
        assert_eq!(
            (price.currency.as_str(), price.micros_per_hour),
            ("USD", micros),
            "{region} {size} {capacity:?}"
        );
    }
    assert!(
        quote(LOCATION, "Standard_D2s_v5", Capacity::OnDemand)
            .await
            .unwrap()
            .is_none(),
        "no meter, no price"
    );
    let err = quote(LOCATION, "Standard_X9", Capacity::OnDemand)
        .await
        .unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("InvalidMachineType")),
        "{err}"
    );
    assert!(
        a.emu.requests().is_empty(),
        "prices need no ARM call: {:?}",
        a.emu.requests()
    );
    assert_eq!(a.emu.token_grants(), 0, "nor a token");
}

/// Bad placements and IDs are refused before any request, naming the field and the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_placements_and_ids_make_no_call() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    for (placement, text) in [
        (
            Placement::new("northeurope", "", SIZE, "ubuntu"),
            "placement.region \"northeurope\"",
        ),
        (
            Placement::new(LOCATION, "7", SIZE, "ubuntu"),
            "placement.zone \"7\"",
        ),
        (
            Placement::new(LOCATION, "", "Standard_X9", "ubuntu"),
            "placement.machineType \"Standard_X9\"",
        ),
        (
            Placement::new(LOCATION, "", SIZE, "debian"),
            "placement.image \"debian\"",
        ),
    ] {
        let req = CreateRequest {
            placement,
            ..request("uid-p")
        };
        let err = a.p.create(&req).await.unwrap_err();
        assert_eq!(err.class, Class::Permanent, "{err}");
        assert!(err.message.contains(text), "{err}");
    }
    let mut big = request("uid-big");
    big.cloud_init = vec![b'#'; 65_536];
    assert_eq!(
        a.p.create(&big).await.unwrap_err().code.as_deref(),
        Some("UserDataTooLarge")
    );
    for bad in [
        "",
        "proxy-x",
        "a/b/c/d",
        "../../etc/passwd",
        "5b0c3f1e/rg/x",
    ] {
        assert_eq!(
            a.p.get(bad).await.unwrap_err().code.as_deref(),
            Some("InvalidId"),
            "{bad:?}"
        );
        assert_eq!(a.p.delete(bad).await.unwrap_err().class, Class::Permanent);
    }
    assert!(a.emu.requests().is_empty(), "{:?}", a.emu.requests());
    assert_eq!(a.emu.token_grants(), 0);
}

/// A config the plugin refuses stops the provider at load, with the field and the value.
#[tokio::test]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let plugin = support::load(&rt, "azure.wasm").await;
    let base = "name: azure\nplugin: azure.wasm\nsecrets: {clientSecret: /nonexistent}\nconfig: ";
    let good = config("https://x.example", EMULATOR_CLIENT_ID, "");
    let cases: Vec<(String, &[&str])> = vec![
        (
            good.replace(EMULATOR_SUBSCRIPTION, "sub-1"),
            &["config.subscriptionId", "\"sub-1\""],
        ),
        (
            good.replace(EMULATOR_CLIENT_ID, "my-app"),
            &["config.clientId", "\"my-app\""],
        ),
        (
            good.replace("resourceGroup: egress-rg", "resourceGroup: 'a/b'"),
            &["config.resourceGroup", "\"a/b\""],
        ),
        (
            good.replace("westeurope:", "'West Europe':"),
            &["config.locations key", "\"West Europe\""],
        ),
        (
            good.replace("subnets/default'", "'"),
            &["config.locations[\"eastus\"]", "virtualNetworks"],
        ),
        (
            good.replace("Standard_B1s", "Standard B1s"),
            &["config.vmSizes", "\"Standard B1s\""],
        ),
        (
            good.replace("Canonical:ubuntu-24_04-lts:server:latest", "ubuntu-24.04"),
            &["config.images[\"ubuntu\"]", "\"ubuntu-24.04\""],
        ),
        (good.replace(SSH_KEY, "hunter2"), &["config.sshPublicKey"]),
        (
            good.replace("sshPublicKey", "adminUsername: root, sshPublicKey"),
            &["config.adminUsername", "\"root\""],
        ),
        (
            good.replace("sshPublicKey", "credential: password, sshPublicKey"),
            &["config.credential", "password"],
        ),
        (
            good.replace("sshPublicKey", "waitSeconds: 0, sshPublicKey"),
            &["config.waitSeconds", "0"],
        ),
        (
            good.replace("armEndpoint: 'https://x.example'", "armEndpoint: 'ftp://x'"),
            &["config.armEndpoint", "ftp://x"],
        ),
        (
            good.replace("sshPublicKey", "colour: blue, sshPublicKey"),
            &["unknown field `colour`"],
        ),
        (
            good.replace("resourceGroup: egress-rg,", ""),
            &["missing field `resourceGroup`"],
        ),
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
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_the_resource_group() {
    let _dir = plugins_or_skip!();
    let a = setup().await;
    let targets = a.p.check().await.expect("azure has a check");
    assert_eq!(targets.len(), 1, "{targets:?}");
    let t = &targets[0];
    assert_eq!(
        (t.target.as_str(), t.ready, t.reason.as_str()),
        (EMULATOR_RESOURCE_GROUP, true, "Reachable")
    );
    assert!(
        t.details.contains(&(
            "subscription".to_string(),
            EMULATOR_SUBSCRIPTION.to_string()
        )) && t.details.iter().any(|(k, _)| k == "remainingReads"),
        "{t:?}"
    );
    a.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 4,
    });
    let t = &a.p.check().await.unwrap()[0];
    assert_eq!(
        (t.ready, t.reason.as_str()),
        (false, "Unauthorized"),
        "{t:?}"
    );
}

/// A cloud-init sentinel and the client secret never reach an error, a log line or a span,
/// and the host had nothing to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-azure-7c2f";
    let (_guard, captured) = proxy_operator::testing::capture();
    let a = setup().await;
    let p = egress_plugin_host::provider::Instrumented::new(a.p, Default::default());
    let mut req = request("uid-s");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let mut bad = spot(request("uid-s2"));
    bad.cloud_init = req.cloud_init.clone();
    let emu = &a.emu;
    let seen = support::sentinels::exercise(&p, emu, &req, &bad, || {
        emu.refuse_spot(Some(SpotRefusal::SkuNotAvailable))
    })
    .await;
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, EMULATOR_CLIENT_SECRET],
        "azure create",
    );
}

/// The whole lifecycle against a real subscription (`backend-test=integration-tag`): one
/// Standard_B1s VM (with its public IP and NIC) for a few minutes, deleted again. The same run
/// as `proxy-operator provider lifecycle --provider azure ...` against a real account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP, AZURE_SUBNET_ID and AZURE_SSH_PUBLIC_KEY (a service principal that may create VMs there); run with --ignored"]
async fn real_azure_lifecycle() {
    let _dir = plugins_or_skip!();
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let needed = [
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_SUBSCRIPTION_ID",
        "AZURE_RESOURCE_GROUP",
        "AZURE_SUBNET_ID",
        "AZURE_SSH_PUBLIC_KEY",
    ];
    let Some(vals) = needed
        .iter()
        .map(|k| var(k))
        .collect::<Option<Vec<String>>>()
    else {
        eprintln!("SKIPPING real_azure_lifecycle: one of {needed:?} is not set");
        return;
    };
    let location = var("AZURE_LOCATION").unwrap_or_else(|| LOCATION.into());
    let size = var("AZURE_VM_SIZE").unwrap_or_else(|| SIZE.into());
    let image =
        var("AZURE_IMAGE").unwrap_or_else(|| "Canonical:ubuntu-24_04-lts:server:latest".into());
    let (_guard, secret) = support::real_cloud::secret_file(&vals[2]);
    let yaml = format!(
        "name: azure-real\nplugin: azure.wasm\nsecrets: {{clientSecret: {}}}\n\
         config: {{tenantId: '{}', clientId: '{}', subscriptionId: '{}', resourceGroup: '{}', \
         locations: {{{location}: '{}'}}, vmSizes: [{size}], images: {{ubuntu: '{image}'}}, \
         sshPublicKey: '{}'}}",
        secret.display(),
        vals[0],
        vals[1],
        vals[3],
        vals[4],
        vals[5],
        vals[6]
    );
    let p = support::provider(&support::runtime(), "azure.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new(&location, "", &size, "ubuntu"),
        installation: support::real_cloud::INSTALLATION.into(),
        ..request(&uid)
    };
    let pace = support::real_cloud::Pace {
        gone_within: Duration::from_secs(600),
        ..Default::default()
    };
    support::real_cloud::lifecycle(&p, &req, pace).await;
}
