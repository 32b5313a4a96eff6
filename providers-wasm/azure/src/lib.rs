//! Azure provider: each egress proxy is an Azure VM made of three tagged parts in one resource group, a Standard
//! static public IP `<name>-ip`, a NIC `<name>-nic` using it, and the VM `<name>`, through Azure Resource Manager.
//! Config in [`config`], access tokens in [`auth`], tags and IDs in [`marks`], ARM itself (classification,
//! long-running operations, paging) in [`api`]; this file is the contract, operation by operation.
//! docs/providers/azure.md is the user's guide and gives the reason for every choice of the behaviour profile below.
//!
//! Parts go with the VM: the NIC is attached with `deleteOption: Delete`, the public IP with `deleteOption: Delete`
//! through the NIC's IP configuration, and the OS disk with `deleteOption: Delete`, so deleting the VM deletes them
//! all. A create that stops between parts (a crash, a refused VM) leaves parts without a VM: they carry the marks,
//! `list-by-tag` reports them as a terminated instance of their name, and `delete` of that ID removes them.
//!
//! Spot (`placement.capacity` spot): `priority: Spot` with `evictionPolicy: Delete`. No Spot capacity is QuotaExceeded
//! with code [`SPOT_CAPACITY_UNAVAILABLE`], from the VM PUT or from the first `get` of a VM whose creation failed for
//! it (which deletes that VM); an evicted VM reads `Deleting` while Azure removes it, and is Terminated and
//! `interrupted` unless this plugin deleted it, then NotFound with code [`INTERRUPTED`].

mod api;
mod auth;
mod config;
mod marks;

use api::{ARM, Arm, CAPACITY, COMPUTE, Generic, NETWORK, PublicIp, RESOURCES, Vm, classify, not_gone};
use config::{Config, Resolved};
use data_encoding::BASE64;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::error::code::{INTERRUPTED, SPOT_CAPACITY_UNAVAILABLE};
use egress_guest_sdk::http::{Method, Request, encode_component};
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::paging::{Bounds, Page};
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{
    self as sdk, Capacity, CreateRequest, Datetime, ErrorClass, Instance, Level, Placement, PluginInfo, Price,
    Provider, ProviderError, State, TargetStatus, export_provider,
};
use marks::{Id, Part};
use serde_json::{Value, json};
use std::collections::BTreeMap;

struct Azure;
export_provider!(Azure);

/// The behaviour profile (provider contract section 4); the guide's "Behaviour profile" section gives the reasons.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=error-code primary-key=name-is-key provisioning-state=native async-ops=task-handle \
    secondary-resources=cascade credentials=mounted-files client-kind=thin-client timeouts=per-call \
    logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst): ARM's documented hourly
/// limit of 12,000 reads per subscription and principal, with a tenth left to the subscription's other tools (writes,
/// limited to 1,200 an hour, are three per create and one per delete).
const BUDGET: (u32, u32) = (10_800, 100);

/// Azure's limit on `customData`: 87,380 base64 characters, 65,535 bytes before encoding.
const USER_DATA_MAX: usize = 65_535;

/// The generic resource list: ARM's pages hold 1,000; three parts an instance.
const PARTS: Bounds = Bounds { what: "ARM resource list", max_pages: 200, max_items: 100_000 };
/// The typed lists of VMs and public IPs of the resource group.
const TYPED: Bounds = Bounds { what: "ARM typed list", max_pages: 2_000, max_items: 100_000 };
/// The Retail Prices API answers 100 meters a page; one size in one region has a handful.
const PRICE_PAGES: Bounds = Bounds { what: "Azure retail price list", max_pages: 10, max_items: 1_000 };
/// The Retail Prices API's version whose filters compare case-sensitively (its documented current one).
const PRICES_VERSION: &str = "2023-01-01-preview";

/// How long the host cache remembers that this plugin deleted a VM, or saw one evicted: far longer than a delete takes.
const MARK_TTL: u32 = 3600;

fn cfg() -> Result<Config, ProviderError> {
    config::parse(&sdk::config())
}

/// The host-cache key that says this plugin deleted the VM `id` (so its `Deleting` is no eviction).
fn deleting_key(id: &Id) -> String {
    format!("deleting:{id}")
}

/// The host-cache key that says `get` or `list` saw the Spot VM `id` evicted (so its NotFound is an interruption).
fn evicted_key(id: &Id) -> String {
    format!("evicted:{id}")
}

fn marked(key: &str) -> bool {
    sdk::cache_get(key).is_some_and(|v| v == b"1")
}

/// `customData` is base64 of the cloud-init, byte for byte, at most 65,535 bytes before encoding.
fn custom_data(cloud_init: &[u8]) -> Result<String, ProviderError> {
    if cloud_init.len() > USER_DATA_MAX {
        let encoded = cloud_init.len().div_ceil(3) * 4;
        return Err(ProviderError::user_data_too_large(
            cloud_init.len(),
            USER_DATA_MAX,
            &format!(" ({encoded} base64 characters)"),
        ));
    }
    Ok(BASE64.encode(cloud_init))
}

/// The operator's view of a VM from its `provisioningState` and the `PowerState/` of its instance view. `Creating` is
/// Provisioning, so a new VM is never Stopped; `Deleting` is Terminated (a delete, or an eviction, in progress).
/// Provisioned (`Succeeded`, or `Updating` while something changes it): running with the public IP's address is
/// Running, without it or while starting (or before Azure shows a power state) Provisioning, stopped, deallocated or
/// anything unknown Stopped. `Failed`, `Canceled` and unknown provisioning states are Stopped: instances are
/// disposable.
pub fn state_of(provisioning: &str, power: Option<&str>, has_ip: bool) -> State {
    match (provisioning, power) {
        ("Creating", _) => State::Provisioning,
        ("Deleting", _) => State::Terminated,
        ("Succeeded" | "Updating" | "Migrating", Some("running")) if has_ip => State::Running,
        ("Succeeded" | "Updating" | "Migrating", Some("running" | "starting") | None) => State::Provisioning,
        _ => State::Stopped,
    }
}

/// Whether the VM's public IP is worth reading: only a running VM can be Running.
fn may_run(vm: &Vm) -> bool {
    vm.power() == Some("running") && state_of(vm.provisioning_state(), Some("running"), true) == State::Running
}

/// `interrupted`: a Spot VM being deleted that this plugin did not delete, which is what an eviction with
/// `evictionPolicy: Delete` looks like; reported only with Terminated, as the contract allows.
fn to_instance(id: &Id, vm: &Vm, ip: &str, deleted_by_us: bool) -> Instance {
    let state = state_of(vm.provisioning_state(), vm.power(), !ip.is_empty());
    Instance {
        id: id.to_string(),
        ip: ip.to_string(),
        interrupted: state == State::Terminated && vm.is_spot() && !deleted_by_us,
        state,
        uid: marks::uid(&vm.tags()),
        created_at: parse_rfc3339(vm.time_created()),
        ..Instance::empty()
    }
}

fn ip_body(place: &Resolved, tags: &BTreeMap<&str, String>) -> Value {
    let mut body = json!({
        "location": place.location, "tags": tags, "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
    });
    if let Some(z) = place.zone {
        body["zones"] = json!([z]);
    }
    body
}

fn nic_body(cfg: &Config, place: &Resolved, tags: &BTreeMap<&str, String>, ip_id: &str) -> Value {
    let mut body = json!({
        "location": place.location, "tags": tags,
        "properties": {"ipConfigurations": [{"name": "ipconfig1", "properties": {
            "primary": true, "subnet": {"id": place.subnet}, "privateIPAllocationMethod": "Dynamic",
            // The public IP goes with the NIC, and the NIC with the VM.
            "publicIPAddress": {"id": ip_id, "properties": {"deleteOption": "Delete"}},
        }}]},
    });
    if !cfg.network_security_group_id.is_empty() {
        body["properties"]["networkSecurityGroup"] = json!({"id": cfg.network_security_group_id});
    }
    body
}

/// The VM: the image, the NIC, cloud-init as `customData`, the OS disk and the NIC deleted with it, Spot when asked.
fn vm_body(
    cfg: &Config,
    place: &Resolved,
    tags: &BTreeMap<&str, String>,
    id: &Id,
    nic_id: &str,
    data: &str,
    spot: bool,
) -> Value {
    let user = &cfg.admin_username;
    let mut body = json!({
        "location": place.location, "tags": tags,
        "properties": {
            "hardwareProfile": {"vmSize": place.size},
            "storageProfile": {
                "imageReference": place.image,
                "osDisk": {"createOption": "FromImage", "deleteOption": "Delete", "caching": "ReadWrite",
                    "managedDisk": {"storageAccountType": cfg.os_disk_type}},
            },
            "osProfile": {
                "computerName": id.name, "adminUsername": user, "customData": data,
                "linuxConfiguration": {"disablePasswordAuthentication": true, "provisionVMAgent": true,
                    "ssh": {"publicKeys": [{"path": format!("/home/{user}/.ssh/authorized_keys"), "keyData": cfg.ssh_public_key}]}},
            },
            "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": true, "deleteOption": "Delete"}}]},
        },
    });
    if let Some(z) = place.zone {
        body["zones"] = json!([z]);
    }
    if spot {
        // Delete on eviction: a deallocated Spot VM keeps its disk and IP, billed, for the operator to delete anyway.
        // A max price of -1 evicts for capacity only, never for price.
        let p = &mut body["properties"];
        p["priority"] = json!("Spot");
        p["evictionPolicy"] = json!("Delete");
        p["billingProfile"] = json!({"maxPrice": -1});
    }
    body
}

/// An existing VM of this name is adopted only when it carries this Proxy's UID.
fn adopt(vm: &Vm, req: &CreateRequest, id: &Id) -> Result<(String, String), ProviderError> {
    match marks::uid(&vm.tags()) {
        uid if uid == req.uid => Ok((id.to_string(), "adopted the existing VM".into())),
        uid => Err(ProviderError::name_taken(&id.name, &format!("VM {id}"), &uid, &req.uid)),
    }
}

/// A create refused in a way retrying the same request cannot change soon (no capacity, a quota, a bad request): the
/// parts made for it are removed. A throttle, a conflict or a server error leave them for the next create, which
/// writes them again (a PUT is an upsert).
fn refused_for_good(e: &ProviderError) -> bool {
    e.code.as_deref().is_some_and(|c| matches!(ARM.kind(None, Some(c)), Kind::Quota | Kind::Invalid))
        || matches!(e.class, ErrorClass::Permanent if e.code.as_deref().is_some_and(|c| c.starts_with("HTTP4")))
}

/// A capacity refusal of a Spot create as the operator wants it: QuotaExceeded, [`SPOT_CAPACITY_UNAVAILABLE`], naming
/// Azure's code; any other error unchanged.
fn spot_capacity(e: ProviderError, place: &str) -> ProviderError {
    match e.code.as_deref() {
        Some(code) if CAPACITY.contains(&code) => {
            let msg =
                format!("placement.capacity Spot: Azure has no Spot capacity for {place} now ({code}): {}", e.message);
            ProviderError::quota(msg).with_code(SPOT_CAPACITY_UNAVAILABLE)
        }
        _ => e,
    }
}

/// Remove the NIC and the public IP a refused create made, NIC first (an IP is not deleted while a NIC uses it).
/// Best effort: what is left carries the marks, and the next create or GC finds it.
fn roll_back(arm: &Arm, id: &Id) {
    for (part, what) in [(Part::Nic, "NIC"), (Part::Ip, "public IP")] {
        let url = arm.url(&id.path(part), NETWORK, "");
        if let Err(e) = arm.delete_wait(&url, &format!("delete of the {what} of {id}")) {
            sdk::warn!("azure create: the {what} of {id} is left for the next create or GC: {}", e.message);
            return;
        }
    }
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(&req.placement)?;
    let tags = marks::create_tags(&req.uid, &req.installation)?;
    let data = custom_data(&req.cloud_init)?;
    // The host's names (`proxy-` + base32) are valid VM names already; anything else maps deterministically.
    let name = if config::is_vm_name(&req.name) { req.name.clone() } else { sdk::name_from_uid(&req.uid) };
    let id = Id { subscription: cfg.subscription_id.clone(), group: cfg.resource_group.clone(), name };
    let arm = Arm::new(&cfg)?;
    let hint = "check config.subscriptionId and config.resourceGroup";
    let vm_url = arm.url(&id.path(Part::Vm), COMPUTE, "");
    // Idempotent by name: a crash after the VM PUT, or a lost status write, lands here again with the same name.
    if let Some(vm) = arm.find(&vm_url).map_err(|e| not_gone(e, hint))? {
        return adopt(&vm, req, &id);
    }
    // A new VM of this name: what was remembered about an earlier one no longer holds.
    sdk::cache_set(&deleting_key(&id), b"", 0);
    sdk::cache_set(&evicted_key(&id), b"", 0);
    let spot = req.placement.capacity == Capacity::Spot;
    let hint = "check config.locations (the subnet) and config.networkSecurityGroupId";
    let ip_url = arm.url(&id.path(Part::Ip), NETWORK, "");
    arm.put(&ip_url, &ip_body(&place, &tags), &format!("public IP {}{}", id.name, marks::IP_SUFFIX))
        .map_err(|e| not_gone(e, hint))?;
    let nic = nic_body(&cfg, &place, &tags, &id.path(Part::Ip));
    arm.put(&arm.url(&id.path(Part::Nic), NETWORK, ""), &nic, &format!("NIC {}{}", id.name, marks::NIC_SUFFIX))
        .map_err(|e| not_gone(e, hint))?;
    let body = vm_body(&cfg, &place, &tags, &id, &id.path(Part::Nic), &data, spot);
    match arm.call(Method::Put, &vm_url, Some(&body)) {
        Ok(_) => {
            let kind = if spot { "Spot, " } else { "" };
            let what = format!(
                "VM PUT accepted ({kind}{} / {} in {}, user data {} bytes)",
                place.size,
                place.image_key,
                place.location,
                req.cloud_init.len()
            );
            Ok((id.to_string(), what))
        }
        Err(e) => {
            let e = not_gone(e, "check config.images and config.vmSizes");
            if refused_for_good(&e) {
                roll_back(&arm, &id);
            }
            Err(if spot { spot_capacity(e, &format!("{} in {}", place.size, place.location)) } else { e })
        }
    }
}

/// What `get` answers for a VM Azure does not show: NotFound, with code [`INTERRUPTED`] when this plugin saw it
/// evicted.
fn gone(id: &Id) -> ProviderError {
    if marked(&evicted_key(id)) {
        let msg = format!("VM {id} was interrupted: Azure evicted the Spot VM and deleted it");
        return ProviderError::not_found(msg).with_code(INTERRUPTED);
    }
    ProviderError::not_found(format!("VM {id} does not exist")).with_code("ResourceNotFound")
}

/// A VM whose creation failed for want of capacity: Azure keeps it, `Failed`, until deleted. It is deleted here (its
/// disk, NIC and IP with it), so nothing is left, and the failure is answered once: QuotaExceeded, for a Spot VM with
/// code [`SPOT_CAPACITY_UNAVAILABLE`]. The next `get` finds the VM being deleted or gone.
fn failed_for_capacity(arm: &Arm, id: &Id, vm: &Vm, code: &str, message: &str) -> ProviderError {
    sdk::cache_set(&deleting_key(id), b"1", MARK_TTL);
    if let Err(e) = arm.delete_wait(&arm.url(&id.path(Part::Vm), COMPUTE, ""), &format!("delete of the failed VM {id}"))
    {
        sdk::warn!("azure get: the failed VM {id} is not deleted yet: {}", e.message);
    }
    let err = api::op_failure(&format!("creation of VM {id}"), &json!({"code": code, "message": message}));
    match vm.is_spot() {
        true => spot_capacity(err, &format!("{} in {}", vm.size(), vm.location())),
        false => err,
    }
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    let arm = Arm::new(&cfg)?;
    let Some(vm) = arm.find(&arm.url(&id.path(Part::Vm), COMPUTE, "&$expand=instanceView"))? else {
        return Err(gone(&id));
    };
    if vm.provisioning_state() == "Failed"
        && let Some((code, message)) = vm.failure()
        && CAPACITY.contains(&code)
    {
        return Err(failed_for_capacity(&arm, &id, &vm, code, message));
    }
    let ip = match may_run(&vm) {
        true => arm.find(&arm.url(&id.path(Part::Ip), NETWORK, ""))?.map(|p| p.address().to_string()),
        false => None,
    };
    let inst = to_instance(&id, &vm, ip.as_deref().unwrap_or_default(), marked(&deleting_key(&id)));
    if inst.interrupted {
        sdk::cache_set(&evicted_key(&id), b"1", MARK_TTL);
    }
    let what = format!(
        "{:?} (provisioning {}, power {}){}",
        inst.state,
        vm.provisioning_state(),
        vm.power().unwrap_or("-"),
        if inst.interrupted { ", evicted" } else { "" }
    );
    Ok((inst, what))
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    let arm = Arm::new(&cfg)?;
    sdk::cache_set(&deleting_key(&id), b"1", MARK_TTL);
    // Returns with the operation; the OS disk, the NIC and the public IP go with the VM (their deleteOption).
    if arm.delete(&arm.url(&id.path(Part::Vm), COMPUTE, ""))?.is_some() {
        return Ok(((), "delete accepted; the OS disk, NIC and public IP go with the VM".into()));
    }
    // No VM: the parts a create left before it made one, found by name and removed only when they carry the managed
    // mark, the NIC first (a public IP is not deleted while a NIC uses it).
    let mut removed = Vec::new();
    for (part, what) in [(Part::Nic, "NIC"), (Part::Ip, "public IP")] {
        let url = arm.url(&id.path(part), NETWORK, "");
        let Some(found) = arm.find(&url)? else { continue };
        if marks::tag(&found.tags(), marks::MANAGED) != Some("true") {
            sdk::warn!("azure delete {id}: {what} {} carries no managed mark; left alone", found.name());
            continue;
        }
        arm.delete_wait(&url, &format!("delete of the {what} of {id}"))?;
        removed.push(what);
    }
    let what = match removed.as_slice() {
        [] => "already gone".to_string(),
        parts => format!("no VM; removed its leftover {}", parts.join(" and ")),
    };
    Ok(((), what))
}

/// What one instance name stands for in a list: its VM, if one is listed, and what its parts say.
#[derive(Default)]
struct Found {
    vm: bool,
    uid: String,
    created_at: Option<Datetime>,
}

fn earliest(a: Option<Datetime>, b: Option<Datetime>) -> Option<Datetime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if (a.seconds, a.nanoseconds) <= (b.seconds, b.nanoseconds) { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Groups the listed parts of this installation by instance name.
fn group_parts(parts: Vec<(Part, String, String, Option<Datetime>)>) -> BTreeMap<String, Found> {
    let mut out: BTreeMap<String, Found> = BTreeMap::new();
    for (part, name, uid, created) in parts {
        let f = out.entry(name).or_default();
        if part == Part::Vm {
            f.vm = true;
            f.uid = uid;
        } else if f.uid.is_empty() {
            f.uid = uid;
        }
        f.created_at = earliest(f.created_at, created);
    }
    out
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let cfg = cfg()?;
    let arm = Arm::new(&cfg)?;
    let group = format!("/subscriptions/{}/resourceGroups/{}", cfg.subscription_id, cfg.resource_group);
    let hint = "check config.subscriptionId and config.resourceGroup";
    // Filtered by the tag's name only: ARM leaves out the tags when a filter names a value too, and the tags are what
    // tells this installation's parts (checked again here) and their UID.
    let filter = encode_component(&format!("tagName eq '{}'", marks::INSTALLATION));
    let url = arm.url(&format!("{group}/resources"), RESOURCES, &format!("&$filter={filter}&$expand=createdTime"));
    let parts = arm
        .list(url, PARTS, |g: Generic| {
            let tags = g.tags();
            if !marks::is_ours(&tags, installation) {
                return None;
            }
            let (part, name) = Part::of(g.kind(), g.name())?;
            Some((part, name.to_string(), marks::uid(&tags), parse_rfc3339(g.created_time())))
        })
        .map_err(|e| not_gone(e, hint))?;
    let found = group_parts(parts);
    let wanted = |name: &str| found.get(name).is_some_and(|f| f.vm);
    let (mut vms, mut ips) = (BTreeMap::new(), BTreeMap::new());
    if found.values().any(|f| f.vm) {
        let url =
            arm.url(&format!("{group}/providers/Microsoft.Compute/virtualMachines"), COMPUTE, "&$expand=instanceView");
        vms = arm
            .list(url, TYPED, |vm: Vm| wanted(vm.name()).then(|| (vm.name().to_string(), vm)))?
            .into_iter()
            .collect();
        let url = arm.url(&format!("{group}/providers/Microsoft.Network/publicIPAddresses"), NETWORK, "");
        let of_vm = |ip: &PublicIp| ip.name().strip_suffix(marks::IP_SUFFIX).filter(|n| wanted(n)).map(str::to_string);
        ips = arm
            .list(url, TYPED, |ip: PublicIp| of_vm(&ip).map(|n| (n, ip.address().to_string())))?
            .into_iter()
            .collect();
    }
    let (mut out, mut leftovers) = (Vec::new(), 0);
    for (name, f) in found {
        let id = Id { subscription: cfg.subscription_id.clone(), group: cfg.resource_group.clone(), name };
        match vms.get(&id.name) {
            Some(vm) => {
                let ip = if may_run(vm) { ips.get(&id.name).map(String::as_str).unwrap_or_default() } else { "" };
                let inst = to_instance(&id, vm, ip, marked(&deleting_key(&id)));
                if inst.interrupted {
                    sdk::cache_set(&evicted_key(&id), b"1", MARK_TTL);
                }
                out.push(inst);
            }
            // Parts without a VM (a create that stopped between them, or a VM deleted since the first list): GC
            // deletes them through this ID once no Proxy owns the UID; Terminated, as what is left of an instance.
            None => {
                leftovers += 1;
                let (uid, created_at) = (f.uid, f.created_at);
                out.push(Instance {
                    id: id.to_string(),
                    state: State::Terminated,
                    uid,
                    created_at,
                    ..Instance::empty()
                });
            }
        }
    }
    let what = format!("{} managed instances, {leftovers} of them parts without a VM", out.len());
    Ok((out, what))
}

/// The Retail Prices API's errors: `{"Error": {"Code", "Message"}}`.
#[rustfmt::skip]
const PRICES: Classifier = Classifier {
    backend: "Azure Retail Prices",
    code_at: "/Error/Code",
    message_at: "/Error/Message",
    rules: &[
        Rule::status(429, Kind::RateLimited),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

/// One meter of the Retail Prices API, as far as the plugin reads it.
#[derive(Default, Debug, Clone)]
pub struct Meter {
    pub currency_code: String,
    pub retail_price: f64,
    pub unit_of_measure: String,
    pub product_name: String,
    pub sku_name: String,
}

impl Meter {
    fn read(v: &Value) -> Meter {
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        Meter {
            currency_code: text("currencyCode"),
            retail_price: v["retailPrice"].as_f64().unwrap_or_default(),
            unit_of_measure: text("unitOfMeasure"),
            product_name: text("productName"),
            sku_name: text("skuName"),
        }
    }
}

/// The hourly price of a Linux VM from its size's meters: the Spot meter (`<sku> Spot`) or the pay-as-you-go one (not
/// Spot, not Low Priority), never Windows (`... Windows` products), per hour, in USD; the lowest when several match.
pub fn pick(meters: &[Meter], spot: bool) -> Option<Price> {
    meters
        .iter()
        .filter(|m| m.currency_code == "USD" && m.unit_of_measure == "1 Hour" && !m.product_name.ends_with(" Windows"))
        .filter(|m| m.sku_name.ends_with(" Spot") == spot && !m.sku_name.ends_with(" Low Priority"))
        .filter(|m| m.retail_price > 0.0)
        .filter_map(|m| egress_guest_sdk::money::micros_from_float(m.retail_price))
        .min()
        .map(|micros_per_hour| Price { currency: "USD".into(), micros_per_hour })
}

fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(p)?;
    let spot = p.capacity == Capacity::Spot;
    let filter = format!(
        "serviceName eq 'Virtual Machines' and armRegionName eq '{}' and armSkuName eq '{}' and priceType eq 'Consumption'",
        place.location, place.size
    );
    let first = format!(
        "{}/api/retail/prices?api-version={PRICES_VERSION}&currencyCode=%27USD%27&$filter={}",
        cfg.prices_endpoint,
        encode_component(&filter)
    );
    let base = format!("{}/", cfg.prices_endpoint);
    let fetch = |cursor: &String| {
        let url = if cursor.is_empty() { first.clone() } else { cursor.clone() };
        if !url.starts_with(&base) {
            let msg = format!("the price list's next page {url:?} is not under config.pricesEndpoint: not followed");
            return Err(ProviderError::transient(msg).with_code("ForeignUrl"));
        }
        let page: Value = Request::get(&url).send_json().map_err(|e| PRICES.classify(e))?;
        let items = page["Items"].as_array().map(|i| i.iter().map(Meter::read).collect()).unwrap_or_default();
        Ok(Page { items, next: page["NextPageLink"].as_str().filter(|n| !n.is_empty()).map(str::to_string) })
    };
    let meters = PRICE_PAGES.collect(String::new(), fetch, Some)?;
    let price = pick(&meters, spot);
    let kind = if spot { "Spot" } else { "pay-as-you-go" };
    let what = match &price {
        Some(pr) => format!("{} {kind} in {}: {} micro-USD an hour", place.size, place.location, pr.micros_per_hour),
        None => format!("{} {kind} in {}: no Linux hourly price published", place.size, place.location),
    };
    Ok((price, what))
}

/// The health check's one target: the resource group, or `resourceGroup` when its name is not a valid target name.
fn target(cfg: &Config) -> String {
    let g = &cfg.resource_group;
    let ok = g.len() <= 63 && g.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok { g.clone() } else { "resourceGroup".into() }
}

/// One cheap authenticated read with the token, scope and verb GC uses: the first managed resource of the group. The
/// subscription and ARM's remaining reads are triage details.
fn probe(arm: &Arm, target: &str) -> TargetStatus {
    let cfg = arm.cfg;
    let filter = encode_component(&format!("tagName eq '{}'", marks::MANAGED));
    let path = format!("/subscriptions/{}/resourceGroups/{}/resources", cfg.subscription_id, cfg.resource_group);
    match arm.send(Method::Get, &arm.url(&path, RESOURCES, &format!("&$filter={filter}&$top=1")), None) {
        Err(e) => TargetStatus::failed(target, "Unauthorized", e.message),
        Ok(Err(e)) => TargetStatus::failed(target, ARM.reason_of(&e), classify(e).message),
        Ok(Ok(r)) => {
            let mut details = vec![("subscription".to_string(), cfg.subscription_id.clone())];
            if let Some(left) = r.header("x-ms-ratelimit-remaining-subscription-reads") {
                details.push(("remainingReads".into(), String::from_utf8_lossy(left).into_owned()));
            }
            TargetStatus::ready(target, details)
        }
    }
}

impl Provider for Azure {
    const OUTCOMES: Outcomes = Outcomes { plugin: "azure", changes: Level::Info, reads: Level::Debug };
    /// Spot VMs, deleted when evicted.
    const SPOT: bool = true;

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            // The token endpoint, ARM and the Retail Prices API of Azure's public cloud.
            default_hosts: vec![
                "https://login.microsoftonline.com:443".into(),
                "https://management.azure.com:443".into(),
                "https://prices.azure.com:443".into(),
            ],
            ..PluginInfo::new("azure", env!("CARGO_PKG_VERSION")).with_profile(PROFILE).with_budget(BUDGET.0, BUDGET.1)
        }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        config::parse(config).map(drop)
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        outcome::keep(create(&req))
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        outcome::keep(get(id))
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        outcome::keep(delete(id))
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        outcome::keep(list_by_tag(installation))
    }

    fn quote(placement: Placement) -> Result<Option<Price>, ProviderError> {
        outcome::keep(quote(&placement))
    }

    fn check() -> Vec<TargetStatus> {
        match cfg() {
            Ok(cfg) => sdk::check_each(&[target(&cfg)], Arm::new(&cfg), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
