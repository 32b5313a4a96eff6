//! Native tests of the pure parts: config errors, placement, states, tags, IDs, the classify tables, long-running
//! operation headers, the request bodies, token helpers, price meters and the grouping of listed parts.

use super::*;
use crate::api::{Poll, finished, op_failure, pause_of, poll_of};
use egress_guest_sdk::http::{HttpError, Response};
use serde_json::Value;
use std::time::Duration;

const SUB: &str = "5b0c3f1e-0000-4000-8000-00000000a2e1";
const SUBNET: &str = "/subscriptions/5b0c3f1e-0000-4000-8000-00000000a2e1/resourceGroups/egress-rg/providers/Microsoft.Network/virtualNetworks/egress-vnet/subnets/default";
const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEsaFYgsJ8DSVcIXjOuAOfaZ5RgAwVTVBvTdBGf6XuBd egress";

fn min() -> Value {
    json!({
        "tenantId": "7a1c0e5d-0000-4000-8000-00000000a2e1", "clientId": "0c1d2e3f-0000-4000-8000-00000000a2e1",
        "subscriptionId": SUB, "resourceGroup": "egress-rg", "locations": {"westeurope": SUBNET},
        "vmSizes": ["Standard_B1s"], "images": {"ubuntu": "Canonical:ubuntu-24_04-lts:server:latest"},
        "sshPublicKey": KEY,
    })
}

fn with(patch: Value) -> String {
    let mut v = min();
    for (k, val) in patch.as_object().unwrap() {
        v[k] = val.clone();
    }
    v.to_string()
}

#[test]
fn config_defaults() {
    let c = config::parse(&min().to_string()).unwrap();
    assert_eq!(
        (c.authority_host.as_str(), c.arm_endpoint.as_str(), c.prices_endpoint.as_str()),
        (config::DEFAULT_AUTHORITY, config::DEFAULT_ARM, config::DEFAULT_PRICES)
    );
    assert_eq!((c.admin_username.as_str(), c.os_disk_type.as_str(), c.wait()), ("azureuser", "StandardSSD_LRS", 30));
    assert_eq!(c.credential, config::Credential::ClientSecret);
    let c = config::parse(&with(json!({"credential": "workloadIdentity", "armEndpoint": "http://127.0.0.1:9/",
        "tenantId": "contoso.onmicrosoft.com", "waitSeconds": 5})))
    .unwrap();
    assert_eq!(c.credential, config::Credential::WorkloadIdentity);
    assert_eq!(
        (c.arm_endpoint.as_str(), c.tenant_id.as_str(), c.wait()),
        ("http://127.0.0.1:9", "contoso.onmicrosoft.com", 5)
    );
}

/// Every rejected config names the field and the offending value (the SSH key only by name).
#[test]
fn config_errors_name_field_and_value() {
    let cases: Vec<(Value, &[&str])> = vec![
        (json!({"tenantId": "not a tenant"}), &["config.tenantId", "\"not a tenant\""]),
        (json!({"clientId": "app"}), &["config.clientId", "\"app\""]),
        (json!({"subscriptionId": "5b0c3f1e"}), &["config.subscriptionId", "\"5b0c3f1e\""]),
        (json!({"resourceGroup": "rg/x"}), &["config.resourceGroup", "\"rg/x\""]),
        (json!({"resourceGroup": "rg."}), &["config.resourceGroup", "\"rg.\""]),
        (json!({"locations": {}}), &["config.locations", "empty"]),
        (json!({"locations": {"West Europe": SUBNET}}), &["config.locations key", "\"West Europe\""]),
        (
            json!({"locations": {"westeurope": "/subscriptions/x/subnets/y"}}),
            &["config.locations[\"westeurope\"]", "\"/subscriptions/x/subnets/y\""],
        ),
        (json!({"vmSizes": []}), &["config.vmSizes", "empty"]),
        (json!({"vmSizes": ["Standard B1s"]}), &["config.vmSizes", "\"Standard B1s\""]),
        (json!({"vmSizes": ["Standard_B1s", "Standard_B1s"]}), &["config.vmSizes", "twice"]),
        (json!({"images": {}}), &["config.images", "empty"]),
        (json!({"images": {"u b": "Canonical:o:s:latest"}}), &["config.images key", "\"u b\""]),
        (json!({"images": {"u": "Canonical:ubuntu"}}), &["config.images[\"u\"]", "\"Canonical:ubuntu\""]),
        (json!({"images": {"u": "/images/x"}}), &["config.images[\"u\"]", "\"/images/x\""]),
        (json!({"sshPublicKey": "-----BEGIN OPENSSH PRIVATE KEY-----"}), &["config.sshPublicKey"]),
        (json!({"adminUsername": "root"}), &["config.adminUsername", "\"root\""]),
        (json!({"adminUsername": "Azure User"}), &["config.adminUsername", "\"Azure User\""]),
        (json!({"networkSecurityGroupId": "my-nsg"}), &["config.networkSecurityGroupId", "\"my-nsg\""]),
        (json!({"osDiskType": "Ultra"}), &["config.osDiskType", "\"Ultra\""]),
        (json!({"waitSeconds": 0}), &["config.waitSeconds", "0"]),
        (json!({"credential": "password"}), &["config.credential", "password"]),
        (json!({"armEndpoint": "ftp://x"}), &["config.armEndpoint", "ftp://x"]),
        (json!({"authorityHost": "https://login.microsoftonline.com?x"}), &["config.authorityHost"]),
        (json!({"pricesEndpoint": "prices.azure.com"}), &["config.pricesEndpoint", "prices.azure.com"]),
        (json!({"extra": 1}), &["unknown field `extra`"]),
    ];
    for (patch, want) in cases {
        let e = config::parse(&with(patch.clone())).err().unwrap_or_else(|| panic!("{patch} accepted"));
        assert_eq!(e.code.as_deref(), Some("InvalidConfig"), "{patch}");
        for w in want {
            assert!(e.message.contains(w), "{patch}: {:?} lacks {w:?}", e.message);
        }
    }
    let e = config::parse(&with(json!({"sshPublicKey": "ssh-rsa SECRETISH"}))).unwrap_err();
    assert!(!e.message.contains("SECRETISH"), "{}", e.message);
    let mut no_group = min();
    no_group.as_object_mut().unwrap().remove("resourceGroup");
    assert!(config::parse(&no_group.to_string()).unwrap_err().message.contains("resourceGroup"));
}

#[test]
fn images_and_ids() {
    let cases = [
        (
            "Canonical:ubuntu-24_04-lts:server:latest",
            Some(json!({"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"})),
        ),
        (
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/gal/images/img/versions/1.0.0",
            Some(
                json!({"id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/gal/images/img/versions/1.0.0"}),
            ),
        ),
        (
            "/CommunityGalleries/pub-1/Images/ubuntu/Versions/latest",
            Some(json!({"communityGalleryImageId": "/CommunityGalleries/pub-1/Images/ubuntu/Versions/latest"})),
        ),
        ("/sharedGalleries/g/images/i", Some(json!({"sharedGalleryImageId": "/sharedGalleries/g/images/i"}))),
        ("a:b:c", None),
        ("a:b:c:d e", None),
        ("/elsewhere/x", None),
        ("/subscriptions//x", None),
    ];
    for (s, want) in cases {
        assert_eq!(config::image_reference(s), want, "{s}");
    }
    assert!(config::is_subnet(SUBNET));
    assert!(config::is_subnet(&SUBNET.to_lowercase()), "ARM matches its fixed segments without regard to case");
    assert!(!config::is_subnet(&SUBNET.replace("/subnets/default", "")));
    assert!(!config::is_subnet(&SUBNET.replace("virtualNetworks", "networkSecurityGroups")));
}

#[test]
fn placement_is_checked_against_the_catalogue() {
    let c = config::parse(&with(
        json!({"locations": {"westeurope": SUBNET, "eastus": SUBNET.replace("egress-vnet", "us")}}),
    ))
    .unwrap();
    let r = c.resolve(&Placement::new("eastus", "2", "Standard_B1s", "ubuntu")).unwrap();
    assert_eq!((r.location, r.zone, r.size, r.image_key), ("eastus", Some("2"), "Standard_B1s", "ubuntu"));
    assert!(r.subnet.contains("/us/"));
    assert_eq!(r.image["publisher"], "Canonical");
    assert_eq!(c.resolve(&Placement::new("westeurope", "", "Standard_B1s", "ubuntu")).unwrap().zone, None);
    for (p, code, text) in [
        (
            Placement::new("northeurope", "", "Standard_B1s", "ubuntu"),
            "InvalidRegion",
            "placement.region \"northeurope\"",
        ),
        (Placement::new("westeurope", "4", "Standard_B1s", "ubuntu"), "InvalidZone", "placement.zone \"4\""),
        (Placement::new("westeurope", "", "Standard_D2s_v5", "ubuntu"), "InvalidMachineType", "placement.machineType"),
        (Placement::new("westeurope", "", "Standard_B1s", "debian"), "InvalidImage", "placement.image \"debian\""),
    ] {
        let e = c.resolve(&p).unwrap_err();
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some(code)));
        assert!(e.message.contains(text), "{}", e.message);
    }
}

/// provisioningState and PowerState -> state; Running only with the public IP's address.
#[test]
fn state_mapping() {
    let cases = [
        ("Creating", Some("starting"), true, State::Provisioning),
        ("Creating", None, false, State::Provisioning),
        ("Succeeded", Some("running"), true, State::Running),
        ("Succeeded", Some("running"), false, State::Provisioning),
        ("Updating", Some("running"), true, State::Running),
        ("Succeeded", Some("starting"), false, State::Provisioning),
        ("Succeeded", None, false, State::Provisioning),
        ("Succeeded", Some("stopping"), true, State::Stopped),
        ("Succeeded", Some("stopped"), false, State::Stopped),
        ("Succeeded", Some("deallocating"), false, State::Stopped),
        ("Succeeded", Some("deallocated"), false, State::Stopped),
        ("Succeeded", Some("exploded"), true, State::Stopped),
        ("Deleting", Some("deallocating"), false, State::Terminated),
        ("Deleting", Some("running"), true, State::Terminated),
        ("Failed", Some("deallocated"), false, State::Stopped),
        ("Failed", Some("running"), true, State::Stopped),
        ("Canceled", None, false, State::Stopped),
        ("Upgrading", Some("running"), true, State::Stopped),
    ];
    for (prov, power, ip, want) in cases {
        assert_eq!(state_of(prov, power, ip), want, "{prov} {power:?} ip={ip}");
    }
}

fn vm(prov: &str, power: &str, priority: &str) -> Vm {
    api::Res(json!({
        "name": "proxy-x", "location": "westeurope", "tags": {"egress-managed": "true", "Egress-Uid": "u-1"},
        "properties": {"provisioningState": prov, "timeCreated": "2025-01-02T03:04:05.1234567+00:00",
            "priority": priority, "hardwareProfile": {"vmSize": "Standard_B1s"},
            "instanceView": {"statuses": [
                {"code": format!("ProvisioningState/{}", prov.to_lowercase())},
                {"code": format!("PowerState/{power}")}]}},
    }))
}

#[test]
fn instances_read_uid_created_at_and_eviction() {
    let id = Id::parse(&format!("{SUB}/egress-rg/proxy-x")).unwrap();
    let i = to_instance(&id, &vm("Succeeded", "running", "Regular"), "198.51.100.10", false);
    assert_eq!((i.state, i.ip.as_str(), i.uid.as_str()), (State::Running, "198.51.100.10", "u-1"));
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_735_787_045));
    assert_eq!(i.id, format!("{SUB}/egress-rg/proxy-x"));
    // An eviction: a Spot VM being deleted that this plugin did not delete.
    let cases = [
        ("Deleting", "Spot", false, true),
        ("Deleting", "Low", false, true),
        ("Deleting", "Spot", true, false),
        ("Deleting", "Regular", false, false),
        ("Succeeded", "Spot", false, false),
    ];
    for (prov, priority, ours, want) in cases {
        let i = to_instance(&id, &vm(prov, "deallocating", priority), "", ours);
        assert_eq!(i.interrupted, want, "{prov} {priority} deleted by us: {ours}");
        assert!(!i.interrupted || i.state == State::Terminated);
    }
    let failed = api::Res(json!({"properties": {"provisioningState": "Failed", "instanceView": {"statuses": [
        {"code": "ProvisioningState/failed/OverconstrainedAllocationRequest", "message": "Allocation failed."},
        {"code": "PowerState/deallocated"}]}}}));
    assert_eq!(failed.failure(), Some(("OverconstrainedAllocationRequest", "Allocation failed.")));
    assert_eq!(failed.power(), Some("deallocated"));
    assert_eq!(Vm::default().power(), None);
    let v = vm("Succeeded", "running", "Spot");
    assert_eq!((v.name(), v.location(), v.size(), v.is_spot()), ("proxy-x", "westeurope", "Standard_B1s", true));
    assert_eq!(v.tags().len(), 2);
    let ip = api::Res(json!({"name": "proxy-x-ip", "tags": null, "properties": {"ipAddress": "198.51.100.7"}}));
    assert_eq!((ip.address(), ip.tags().len()), ("198.51.100.7", 0));
    assert_eq!(api::Res::default().address(), "");
}

/// The marks as tags, as the emulator's `tags.rs` writes them: a fixed vector for the hash, since a change of the
/// mapping would orphan every instance made under it.
#[test]
fn tag_encoding() {
    let tags = marks::create_tags("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01", "cluster/Prod").unwrap();
    assert_eq!(
        tags,
        BTreeMap::from([
            ("egress-managed", "true".to_string()),
            ("egress-uid", "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01".to_string()),
            ("egress-installation", "cluster/Prod".to_string()),
        ])
    );
    assert_eq!(marks::value(&"x".repeat(256)), "x".repeat(256));
    assert_eq!(marks::value(&"x".repeat(300)), "__bvhczkpjzphnpj5fhahlfhq2g6b3tnwq");
    assert_eq!(
        marks::create_tags("u", &"x".repeat(300)).unwrap()["egress-installation"],
        "__bvhczkpjzphnpj5fhahlfhq2g6b3tnwq"
    );
    let e = marks::create_tags(&"u".repeat(257), "i").unwrap_err();
    assert_eq!(e.code.as_deref(), Some("InvalidUid"));
    let read =
        |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
    let mine = read(&[("egress-managed", "true"), ("EGRESS-INSTALLATION", "i1"), ("egress-uid", "u")]);
    assert!(marks::is_ours(&mine, "i1") && !marks::is_ours(&mine, "i2"));
    assert!(!marks::is_ours(&read(&[("egress-installation", "i1")]), "i1"), "the managed mark is required");
    assert!(!marks::is_ours(&read(&[("egress-managed", "false"), ("egress-installation", "i1")]), "i1"));
    let long = read(&[("egress-managed", "true"), ("egress-installation", "__bvhczkpjzphnpj5fhahlfhq2g6b3tnwq")]);
    assert!(marks::is_ours(&long, &"x".repeat(300)));
    assert_eq!(marks::uid(&mine), "u");
    assert_eq!(marks::uid(&read(&[])), "");
}

#[test]
fn ids_are_parsed_strictly() {
    let id = Id::parse(&format!("{SUB}/Egress-RG_(1)/proxy-abc")).unwrap();
    assert_eq!((id.group.as_str(), id.name.as_str()), ("Egress-RG_(1)", "proxy-abc"));
    assert_eq!(
        id.path(Part::Nic),
        format!(
            "/subscriptions/{SUB}/resourceGroups/Egress-RG_(1)/providers/Microsoft.Network/networkInterfaces/proxy-abc-nic"
        )
    );
    assert!(id.path(Part::Ip).ends_with("/Microsoft.Network/publicIPAddresses/proxy-abc-ip"));
    assert!(id.path(Part::Vm).ends_with("/Microsoft.Compute/virtualMachines/proxy-abc"));
    for bad in [
        String::new(),
        "not-an-id".into(),
        "/".into(),
        "a/b/c/d".into(),
        "../../etc/passwd".into(),
        format!("{SUB}/rg/proxy-x/more"),
        format!("{SUB}/rg/-x"),
        format!("{SUB}/rg./x"),
        format!("{SUB}/rg/x?api-version=1"),
        format!("{SUB}/r g/x"),
        format!("{}/rg/x", &SUB[..35]),
        "id\nwith\0controls".into(),
    ] {
        let e = Id::parse(&bad).unwrap_err();
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("InvalidId")), "{bad:?}");
    }
    assert_eq!(Part::of("Microsoft.Network/networkInterfaces", "proxy-a-nic"), Some((Part::Nic, "proxy-a")));
    assert_eq!(Part::of("microsoft.network/publicipaddresses", "proxy-a-ip"), Some((Part::Ip, "proxy-a")));
    assert_eq!(Part::of("Microsoft.Compute/virtualMachines", "proxy-a"), Some((Part::Vm, "proxy-a")));
    assert_eq!(Part::of("Microsoft.Network/networkInterfaces", "other"), None);
    assert_eq!(Part::of("Microsoft.Compute/disks", "proxy-a_OsDisk_1_x"), None);
}

fn answer(status: u16, code: &str, retry_after: Option<u64>) -> HttpError {
    let body = json!({"error": {"code": code, "message": format!("{code} happened")}});
    HttpError::Status { status, body: body.to_string().into_bytes(), retry_after }
}

/// Answers as ARM sends them (codes from the specs and captured answers), and transport failures.
#[test]
fn classify_table() {
    use ErrorClass::*;
    let cases: Vec<(HttpError, ErrorClass, &str)> = vec![
        (answer(404, "ResourceNotFound", None), NotFound, "ResourceNotFound"),
        (answer(404, "ResourceGroupNotFound", None), Permanent, "ResourceGroupNotFound"),
        (answer(404, "NotFound", None), Permanent, "NotFound"),
        (HttpError::Status { status: 404, body: b"<html>".to_vec(), retry_after: None }, Permanent, "HTTP404"),
        (answer(429, "SubscriptionRequestsThrottled", Some(17)), QuotaExceeded, "SubscriptionRequestsThrottled"),
        (answer(409, "OperationNotAllowed", None), QuotaExceeded, "OperationNotAllowed"),
        (answer(409, "SkuNotAvailable", None), QuotaExceeded, "SkuNotAvailable"),
        (answer(401, "ExpiredAuthenticationToken", None), Permanent, "ExpiredAuthenticationToken"),
        (answer(401, "InvalidAuthenticationToken", None), Permanent, "InvalidAuthenticationToken"),
        (answer(403, "AuthorizationFailed", None), Permanent, "AuthorizationFailed"),
        (answer(409, "AnotherOperationInProgress", None), Transient, "AnotherOperationInProgress"),
        (answer(400, "NicInUse", None), Transient, "NicInUse"),
        (answer(400, "PublicIPAddressCannotBeDeleted", None), Transient, "PublicIPAddressCannotBeDeleted"),
        (answer(400, "InvalidParameter", None), Permanent, "InvalidParameter"),
        (answer(400, "InvalidTagNameCharacters", None), Permanent, "InvalidTagNameCharacters"),
        (answer(400, "SomethingNew", None), Permanent, "SomethingNew"),
        (answer(409, "SomethingNew", None), Transient, "SomethingNew"),
        (answer(500, "InternalExecutionError", None), Transient, "InternalExecutionError"),
        (HttpError::Status { status: 502, body: Vec::new(), retry_after: None }, Transient, "HTTP502"),
        (HttpError::Transport(egress_guest_sdk::http::ErrorCode::ConnectionRefused), Transient, "ConnectionRefused"),
    ];
    for (e, class, code) in cases {
        let shown = e.to_string();
        let err = classify(e);
        assert_eq!((err.class, err.code.as_deref()), (class, Some(code)), "{shown}");
    }
    let throttled = classify(answer(429, "SubscriptionRequestsThrottled", Some(17)));
    assert!(throttled.message.contains("retry after 17 s"), "{}", throttled.message);
    // Operation errors carry no status: classified by their code.
    for (code, class) in [
        ("OverconstrainedAllocationRequest", QuotaExceeded),
        ("AllocationFailed", QuotaExceeded),
        ("InvalidParameter", Permanent),
        ("OperationPreempted", Transient),
        ("InternalExecutionError", Transient),
        ("Unknown", Transient),
    ] {
        let e = op_failure("creation of VM x", &json!({"code": code, "message": "m"}));
        assert_eq!((e.class, e.code.as_deref()), (class, Some(code)));
        assert_eq!(e.message, format!("creation of VM x failed: {code}: m"));
    }
}

fn resp(status: u16, headers: &[(&str, &str)]) -> Response {
    Response {
        status,
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect(),
        body: vec![],
    }
}

/// Where an answer says its operation is, and how long it asks to wait.
#[test]
fn long_running_operation_headers() {
    let op = "https://management.azure.com/subscriptions/s/providers/Microsoft.Network/locations/westeurope/operations/1?api-version=2024-05-01";
    let res = "https://management.azure.com/subscriptions/s/providers/Microsoft.Compute/locations/westeurope/operationResults/1?api-version=2024-07-01";
    let cases = [
        (resp(201, &[("Azure-AsyncOperation", op), ("Retry-After", "10")]), Some(Poll::Status(op.into()))),
        (resp(202, &[("azure-asyncoperation", op), ("location", res)]), Some(Poll::Status(op.into()))),
        (resp(202, &[("Location", res)]), Some(Poll::Location(res.into()))),
        (resp(201, &[("Location", res)]), Some(Poll::Location(res.into()))),
        // A 200 with a Location is a finished answer (Location is then just where the resource is).
        (resp(200, &[("Location", res)]), None),
        (resp(200, &[]), None),
        (resp(204, &[]), None),
        (resp(201, &[("Azure-AsyncOperation", " ")]), None),
    ];
    for (r, want) in cases {
        assert_eq!(poll_of(&r), want, "{:?}", r.headers);
    }
    for (value, want) in [
        (Some("10"), Duration::from_secs(10)),
        (Some(" 3 "), Duration::from_secs(3)),
        (Some("0"), Duration::from_millis(50)),
        (Some("3600"), api::MAX_PAUSE),
        (Some("Wed, 21 Oct 2015 07:28:00 GMT"), api::DEFAULT_PAUSE),
        (None, api::DEFAULT_PAUSE),
    ] {
        let r = match value {
            Some(v) => resp(202, &[("Retry-After", v)]),
            None => resp(202, &[]),
        };
        assert_eq!(pause_of(&r), want, "{value:?}");
    }
    for (s, done) in [
        ("InProgress", false),
        ("Accepted", false),
        ("Succeeded", true),
        ("Failed", true),
        ("Canceled", true),
        ("", false),
    ] {
        assert_eq!(finished(s), done, "{s}");
    }
}

fn place<'a>(c: &'a Config, zone: &str) -> Resolved<'a> {
    c.resolve(&Placement::new("westeurope", zone, "Standard_B1s", "ubuntu")).unwrap()
}

/// The parts go with the VM, the user data is base64 byte for byte, Spot is Spot deleted on eviction.
#[test]
fn request_bodies() {
    let c = config::parse(&with(json!({"networkSecurityGroupId": "/subscriptions/5b0c3f1e-0000-4000-8000-00000000a2e1/resourceGroups/egress-rg/providers/Microsoft.Network/networkSecurityGroups/proxies"}))).unwrap();
    let tags = marks::create_tags("u-1", "inst").unwrap();
    let id = Id::parse(&format!("{SUB}/egress-rg/proxy-x")).unwrap();
    let ip = ip_body(&place(&c, "2"), &tags);
    assert_eq!(ip["sku"], json!({"name": "Standard", "tier": "Regional"}));
    assert_eq!(ip["properties"]["publicIPAllocationMethod"], "Static");
    assert_eq!((ip["zones"].clone(), ip["tags"]["egress-uid"].clone()), (json!(["2"]), json!("u-1")));
    let nic = nic_body(&c, &place(&c, ""), &tags, &id.path(Part::Ip));
    let cfg0 = &nic["properties"]["ipConfigurations"][0]["properties"];
    assert_eq!(cfg0["publicIPAddress"], json!({"id": id.path(Part::Ip), "properties": {"deleteOption": "Delete"}}));
    assert_eq!(cfg0["subnet"]["id"], SUBNET);
    assert!(nic["properties"]["networkSecurityGroup"]["id"].as_str().unwrap().ends_with("/proxies"));
    let data = custom_data(b"#cloud-config\n\x00\xff").unwrap();
    assert_eq!(BASE64.decode(data.as_bytes()).unwrap(), b"#cloud-config\n\x00\xff");
    let od = vm_body(&c, &place(&c, ""), &tags, &id, &id.path(Part::Nic), &data, false);
    let p = &od["properties"];
    assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"], "Delete");
    assert_eq!(p["osProfile"]["customData"], data);
    assert_eq!(
        p["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"],
        "/home/azureuser/.ssh/authorized_keys"
    );
    assert_eq!(p["storageProfile"]["imageReference"]["offer"], "ubuntu-24_04-lts");
    assert!(p.get("priority").is_none() && od.get("zones").is_none());
    let sp = vm_body(&c, &place(&c, "1"), &tags, &id, &id.path(Part::Nic), &data, true);
    assert_eq!(
        (
            sp["properties"]["priority"].clone(),
            sp["properties"]["evictionPolicy"].clone(),
            sp["properties"]["billingProfile"].clone()
        ),
        (json!("Spot"), json!("Delete"), json!({"maxPrice": -1}))
    );
    assert_eq!(sp["zones"], json!(["1"]));
    assert!(custom_data(&vec![b'a'; USER_DATA_MAX]).is_ok());
    let e = custom_data(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!(e.code.as_deref(), Some("UserDataTooLarge"));
    assert!(e.message.contains("87384 base64 characters"), "{}", e.message);
}

/// Which VM PUT failures remove the parts, and which Spot failures are no Spot capacity.
#[test]
fn refusals_roll_back_and_spot_capacity_is_quota() {
    let e = |status, code| classify(answer(status, code, None));
    for (err, roll) in [
        (e(409, "SkuNotAvailable"), true),
        (e(409, "OperationNotAllowed"), true),
        (e(400, "InvalidParameter"), true),
        (HttpError::Status { status: 400, body: b"bad".to_vec(), retry_after: None }.into(), true),
        (e(429, "SubscriptionRequestsThrottled"), false),
        (e(500, "InternalExecutionError"), false),
        (e(409, "AnotherOperationInProgress"), false),
        (e(403, "AuthorizationFailed"), false),
    ] {
        assert_eq!(refused_for_good(&err), roll, "{}", err.message);
    }
    for code in CAPACITY {
        let s = spot_capacity(e(409, code), "Standard_B1s in westeurope");
        assert_eq!((s.class, s.code.as_deref()), (ErrorClass::QuotaExceeded, Some(SPOT_CAPACITY_UNAVAILABLE)));
        assert!(s.message.contains(code) && s.message.contains("placement.capacity Spot"), "{}", s.message);
    }
    let quota = spot_capacity(e(409, "OperationNotAllowed"), "x");
    assert_eq!(quota.code.as_deref(), Some("OperationNotAllowed"), "a core quota is no Spot matter");
}

#[test]
fn token_helpers() {
    assert_eq!(auth::sensitive_part("aGVhZGVy.Y2xhaW1z.c2lnbmF0dXJl"), Some("c2lnbmF0dXJl"));
    assert_eq!(auth::sensitive_part("opaque-token-value"), Some("opaque-token-value"));
    assert_eq!(auth::sensitive_part("short"), None);
    let long = format!("h.c.{}", "s".repeat(300));
    assert_eq!(
        auth::sensitive_part(&format!("{}{long}", "x".repeat(4000))).map(str::len),
        Some(300),
        "a long JWT's signature"
    );
    assert_eq!(auth::sensitive_part(&"x".repeat(3000)), None);
    for (v, want) in [(json!(3599), 3599), (json!("3599"), 3599), (json!(null), 0), (json!("soon"), 0)] {
        assert_eq!(auth::lifetime(&v), want, "{v}");
    }
    assert_eq!((auth::cache_ttl(3599), auth::cache_ttl(200), auth::cache_ttl(0)), (3299, 0, 0));
    assert_eq!(
        auth::first_line("AADSTS7000215: Invalid client secret.\r\nTrace ID: x\r\n"),
        "AADSTS7000215: Invalid client secret."
    );
    use ErrorClass::*;
    let token = |status: u16, error: &str| {
        let body = json!({"error": error, "error_description": format!("AADSTS1: {error}\r\nTrace ID: t")});
        HttpError::Status { status, body: body.to_string().into_bytes(), retry_after: None }
    };
    for (e, class) in [
        (token(401, "invalid_client"), Permanent),
        (token(400, "unauthorized_client"), Permanent),
        (token(400, "invalid_request"), Permanent),
        (token(400, "invalid_scope"), Permanent),
        (token(503, "temporarily_unavailable"), Transient),
        (HttpError::Status { status: 429, body: vec![], retry_after: Some(3) }, QuotaExceeded),
        (HttpError::Status { status: 502, body: vec![], retry_after: None }, Transient),
    ] {
        assert_eq!(auth::TOKEN.classify(e).class, class);
    }
    let c = config::parse(&min().to_string()).unwrap();
    let e = auth::refused(&c, auth::CLIENT_SECRET, token(401, "invalid_client"));
    assert_eq!((e.class, e.code.as_deref()), (Permanent, Some("invalid_client")));
    assert!(e.message.contains("config.clientId \"0c1d2e3f-0000-4000-8000-00000000a2e1\""), "{}", e.message);
    assert!(
        e.message.contains("secret \"clientSecret\"") && e.message.ends_with("invalid_client: AADSTS1: invalid_client"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("Trace ID"), "{}", e.message);
}

fn meter(sku: &str, product: &str, price: f64) -> Meter {
    Meter {
        currency_code: "USD".into(),
        retail_price: price,
        unit_of_measure: "1 Hour".into(),
        product_name: product.into(),
        sku_name: sku.into(),
    }
}

#[test]
fn prices_pick_the_linux_meter() {
    let meters = vec![
        meter("B1s", "Virtual Machines BS Series Windows", 0.0186),
        meter("B1s", "Virtual Machines BS Series", 0.0124),
        meter("B1s Spot", "Virtual Machines BS Series", 0.0025),
        meter("B1s Spot", "Virtual Machines BS Series Windows", 0.004),
        meter("B1s Low Priority", "Virtual Machines BS Series", 0.002),
    ];
    let micros = |spot| pick(&meters, spot).map(|p| (p.currency, p.micros_per_hour));
    assert_eq!(micros(false), Some(("USD".to_string(), 12_400)));
    assert_eq!(micros(true), Some(("USD".to_string(), 2_500)));
    assert!(pick(&meters[..1], false).is_none(), "Windows only: no Linux price");
    let mut eur = meter("B1s", "Virtual Machines BS Series", 0.01);
    eur.currency_code = "EUR".into();
    let mut monthly = meter("B1s", "Virtual Machines BS Series", 9.0);
    monthly.unit_of_measure = "1/Month".into();
    assert!(pick(&[eur, monthly, meter("B1s", "Virtual Machines BS Series", 0.0)], false).is_none());
    assert!(pick(&[], true).is_none());
}

#[test]
fn listed_parts_group_by_instance() {
    let t = |s: u64| Some(Datetime { seconds: s, nanoseconds: 0 });
    let parts = vec![
        (Part::Ip, "proxy-a".to_string(), "u-a".to_string(), t(100)),
        (Part::Nic, "proxy-a".to_string(), "u-a".to_string(), t(110)),
        (Part::Vm, "proxy-a".to_string(), "u-a".to_string(), t(120)),
        (Part::Ip, "proxy-b".to_string(), "".to_string(), t(300)),
        (Part::Nic, "proxy-b".to_string(), "u-b".to_string(), None),
    ];
    let g = group_parts(parts);
    let a = &g["proxy-a"];
    assert_eq!((a.vm, a.uid.as_str(), a.created_at.map(|t| t.seconds)), (true, "u-a", Some(100)));
    let b = &g["proxy-b"];
    assert_eq!((b.vm, b.uid.as_str(), b.created_at.map(|t| t.seconds)), (false, "u-b", Some(300)));
    assert_eq!(g.len(), 2);
}

#[test]
fn info_names_the_type_hosts_check_and_budget() {
    let info = <Azure as Provider>::info();
    assert_eq!(info.type_name, "azure");
    assert!(info.has_check);
    assert_eq!(
        info.default_hosts,
        ["https://login.microsoftonline.com:443", "https://management.azure.com:443", "https://prices.azure.com:443"]
    );
    assert_eq!(info.profile.len(), 19);
    assert_eq!(info.default_budget.map(|b| (b.requests_per_hour, b.burst)), Some(BUDGET));
    const { assert!(<Azure as Provider>::SPOT && !<Azure as Provider>::IPV6) };
}
