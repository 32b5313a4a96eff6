//! Google Compute Engine provider: each egress proxy is a VM instance. Config in [`config`], access tokens in
//! [`auth`] (their JWTs signed by [`rs256`]), the labels and IDs in [`marks`], the API and its one classify function in
//! [`api`]; this file is the
//! contract, operation by operation. docs/providers/gce.md is the user's guide and gives the reason for every choice of
//! the behaviour profile below.
//!
//! Spot (`placement.capacity` spot): a Spot VM that Compute Engine deletes when it preempts it ([`SPOT_SCHEDULING`]).
//! A stockout of a Spot insert is QuotaExceeded with code [`SPOT_CAPACITY_UNAVAILABLE`]; a preempted VM is Stopped and
//! `interrupted` while GCE still shows it, then NotFound with code [`INTERRUPTED`], told by its
//! `compute.instances.preempted` operation ([`preempted`]).

mod api;
mod auth;
mod config;
mod marks;
mod rs256;

use api::{Api, GCE, Operation, Vm, classify};
use egress_guest_sdk::http::{Method, encode_component};
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::paging::Bounds;
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{
    self as sdk, Capacity, CreateRequest, Instance, Level, PluginInfo, Provider, ProviderError, State, TargetStatus,
    export_provider,
};
use marks::Id;
use serde_json::{Value, json};

struct Gce;
export_provider!(Gce);

/// GCE's limit on one metadata value: 256 KiB.
const USER_DATA_MAX: usize = 256 * 1024;

/// The behaviour profile (provider contract section 4); the guide's "Behaviour profile" section gives the reasons.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=name-is-key provisioning-state=native async-ops=task-handle \
    secondary-resources=cascade credentials=mounted-files client-kind=thin-client timeouts=per-call \
    logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Compute Engine's 1,500 requests a minute per project for each rate-quota group
/// (https://cloud.google.com/compute/api-quota): 1,400 a minute plus a burst of 100 keeps even a
/// minute spent in one group under 1,500.
const BUDGET: (u32, u32) = (84_000, 100);

/// 500 instances a page (the API's maximum), at most 100 pages: a page token that never ends fails the list.
const PAGES: Bounds = Bounds { what: "GCE aggregated instance list", max_pages: 100, max_items: 50_000 };

/// How long the name of an insert operation is kept for `get`: far longer than an insert takes, shorter than a token
/// lives (the host cache evicts what expires first).
const OP_TTL: u32 = 30 * 60;

/// The `scheduling` of a Spot insert. DELETE: a preempted VM goes away (a stopped one would keep its disk, billed, for
/// the operator to delete anyway); the Scheduling schema allows a Spot VM no automatic restart and no live migration.
const SPOT_SCHEDULING: &str = r#"{"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
    "automaticRestart": false, "onHostMaintenance": "TERMINATE"}"#;
/// The codes the operator acts on: no spot capacity (fall back to on-demand), and a
/// reclaimed instance the backend has removed.
use egress_guest_sdk::error::code::{INTERRUPTED, SPOT_CAPACITY_UNAVAILABLE};
/// A zone's stockout, in an insert's operation (or its answer): what a Spot insert meets when there is no spot capacity.
const STOCKOUTS: [&str; 2] = ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"];
/// The cache value of a Spot insert's operation starts with this, so `get` reports its stockout as spot capacity.
const SPOT_OP: &str = "spot:";
/// At most this many pages of 500 zone operations are read, newest first, to find one instance's last insert or
/// preemption; an older one is taken as absent (the API keeps operations for a limited time anyway).
const OP_PAGES: usize = 4;

/// A stockout of a Spot insert as the operator wants it: QuotaExceeded, [`SPOT_CAPACITY_UNAVAILABLE`], naming GCE's code.
fn spot_stockout(e: ProviderError) -> ProviderError {
    match e.code.as_deref() {
        Some(code) if STOCKOUTS.contains(&code) => {
            let msg = format!(
                "placement.capacity Spot: Compute Engine has no spot capacity for it now ({code}): {}",
                e.message
            );
            ProviderError::new(sdk::ErrorClass::QuotaExceeded, msg).with_code(SPOT_CAPACITY_UNAVAILABLE)
        }
        _ => e,
    }
}

/// The `insertTime` of the newest zone operation of type `kind` on the instance `id`: `zoneOperations.list` with the
/// AIP-160 filter `operationType = "<kind>"` (the discovery document's `filter`), newest first, matched on the
/// target's path (its host is the API's, not necessarily this plugin's endpoint).
fn newest_op(api: &Api, id: &Id, kind: &str) -> Result<Option<sdk::Datetime>, ProviderError> {
    let filter = encode_component(&format!("operationType = \"{kind}\""));
    let (target, list_path) = (id.path(), format!("/projects/{}/zones/{}/operations", id.project, id.zone));
    let mut token = String::new();
    for _ in 0..OP_PAGES {
        let page = if token.is_empty() { String::new() } else { format!("&pageToken={}", encode_component(&token)) };
        let query = format!("filter={filter}&orderBy=creationTimestamp%20desc&maxResults=500{page}");
        let list: Value = api.call(Method::Get, &format!("{list_path}?{query}"), None)?;
        let ops = list["items"].as_array().map(Vec::as_slice).unwrap_or_default();
        for op in ops.iter().filter_map(|o| serde_json::from_value::<Operation>(o.clone()).ok()) {
            if op.targets(&target) && op.operation_type == kind {
                return Ok(parse_rfc3339(&op.insert_time));
            }
        }
        match list["nextPageToken"].as_str() {
            Some(next) if !next.is_empty() && next != token => token = next.to_string(),
            _ => break,
        }
    }
    Ok(None)
}

/// Whether Compute Engine preempted the instance `id`: a `compute.instances.preempted` operation on it newer than its
/// last insert (a name comes back with the Proxy's replacement; an old preemption is not the new instance's). Unknown
/// (the operations cannot be read) counts as not preempted: the answer is about the cause, never about the existence.
fn preempted(api: &Api, id: &Id) -> bool {
    let key = |t: sdk::Datetime| (t.seconds, t.nanoseconds);
    let ask = || -> Result<bool, ProviderError> {
        let Some(preemption) = newest_op(api, id, "compute.instances.preempted")? else {
            return Ok(false);
        };
        Ok(newest_op(api, id, "insert")?.is_none_or(|insert| key(preemption) > key(insert)))
    };
    ask().unwrap_or_else(|e| {
        sdk::warn!("gce: cannot tell whether {id} was preempted: {}", e.message);
        false
    })
}

/// A Spot VM that stopped or is stopping, the only kind whose preemption `get` and `list-by-tag` ask about (a running
/// one was not preempted, and asking costs a list of operations).
fn may_be_preempted(vm: &Vm) -> bool {
    vm.is_spot() && matches!(vm.status.as_str(), "STOPPING" | "TERMINATED" | "STOPPED")
}

fn cfg() -> Result<config::Config, ProviderError> {
    config::parse(&sdk::config())
}

/// User data travels as the `user-data` metadata value, a JSON string: UTF-8 only, at most 256 KiB.
fn user_data(cloud_init: &[u8]) -> Result<&str, ProviderError> {
    let Ok(text) = std::str::from_utf8(cloud_init) else {
        let msg = format!("cloud-init ({} bytes) is not UTF-8; GCE metadata values are text", cloud_init.len());
        return Err(ProviderError::permanent(msg).with_code("UserDataNotText"));
    };
    match text.len() > USER_DATA_MAX {
        true => Err(ProviderError::user_data_too_large(text.len(), USER_DATA_MAX, "")),
        false => Ok(text),
    }
}

/// The operator's view of an instance. PROVISIONING and STAGING are GCE's "being created", so a new instance is never
/// Stopped; REPAIRING is GCE moving or restarting it after a host failure, which ends by itself, so Provisioning too.
/// Running needs the external IP. STOPPING, SUSPENDING, SUSPENDED, TERMINATED (GCE's "stopped") and anything unknown
/// are Stopped: instances are disposable.
///
/// `interrupted`: Compute Engine preempted it (reported only with Stopped, as the contract allows).
fn to_instance(vm: &Vm, id: String, interrupted: bool) -> Instance {
    let ip = vm.nat_ip().to_string();
    let state = match vm.status.as_str() {
        "PROVISIONING" | "STAGING" | "REPAIRING" => State::Provisioning,
        "RUNNING" if !ip.is_empty() => State::Running,
        "RUNNING" => State::Provisioning,
        _ => State::Stopped,
    };
    Instance {
        id,
        ip,
        interrupted: interrupted && state == State::Stopped,
        state,
        uid: marks::uid(&vm.labels),
        created_at: parse_rfc3339(&vm.creation_timestamp),
        ..Instance::empty()
    }
}

/// The host-cache key of an instance's insert operation.
fn op_key(id: &Id) -> String {
    format!("insert-op:{id}")
}

/// An existing instance of this name is adopted only when it carries this Proxy's UID.
fn adopt(vm: &Vm, req: &CreateRequest, id: &Id) -> Result<(String, String), ProviderError> {
    match marks::uid(&vm.labels) {
        uid if uid == req.uid => Ok((id.to_string(), "adopted the existing instance".into())),
        uid => Err(ProviderError::name_taken(id.name, &format!("instance {id}"), &uid, &req.uid)),
    }
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let (zone, machine, image) = cfg.resolve(&req.placement)?;
    let labels = marks::create_labels(&req.uid, &req.installation)?;
    let user_data = user_data(&req.cloud_init)?;
    // The host's names (`proxy-` + base32) are RFC 1035 already; anything else maps deterministically.
    let name = if config::is_name(&req.name, 63) { req.name.clone() } else { sdk::name_from_uid(&req.uid) };
    let id = Id { project: &cfg.project, zone, name: &name };
    let api = Api::new(&cfg)?;
    // Idempotent by name: a crash after the insert, or a lost status write, lands here again with the same name.
    if let Some(vm) = api.find::<Vm>(&id.path())? {
        return adopt(&vm, req, &id);
    }
    let tags: Vec<&String> = cfg.network_tags.iter().collect();
    let spot = req.placement.capacity == Capacity::Spot;
    let mut body = json!({
        "name": name, "machineType": format!("zones/{zone}/machineTypes/{machine}"), "labels": labels,
        "metadata": {"items": [{"key": "user-data", "value": user_data}]},
        // The boot disk goes with the instance; the external address is ephemeral and released with it.
        "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": image}}],
        "networkInterfaces": [{"network": cfg.network, "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}],
        "tags": {"items": tags},
    });
    if spot {
        body["scheduling"] = serde_json::from_str(SPOT_SCHEDULING).expect("a JSON object");
    }
    let path = format!("/projects/{}/zones/{zone}/instances", cfg.project);
    match api.call::<Operation>(Method::Post, &path, Some(&body)) {
        Ok(op) => {
            let cached = if spot { format!("{SPOT_OP}{}", op.name) } else { op.name.clone() };
            sdk::cache_set(&op_key(&id), cached.as_bytes(), OP_TTL);
            let model = if spot { "Spot, " } else { "" };
            let what = format!(
                "insert accepted ({model}{machine} / {image}, user data {} bytes, {})",
                req.cloud_init.len(),
                op.name
            );
            Ok((id.to_string(), what))
        }
        // Should GCE answer a stockout at once rather than in the operation.
        Err(e) if spot && e.code.as_deref().is_some_and(|c| STOCKOUTS.contains(&c)) => Err(spot_stockout(e)),
        // A concurrent create won the race for the name: adopt it if it is ours.
        Err(e) if e.code.as_deref() == Some("alreadyExists") => match api.find::<Vm>(&id.path())? {
            Some(vm) => adopt(&vm, req, &id),
            None => Err(ProviderError::transient(format!("name {name:?} is taken in {zone}; looking again"))
                .with_code("alreadyExists")),
        },
        Err(e) => Err(e.not_found_is_permanent("check config.project, config.network and the image")),
    }
}

/// What `get` answers for an instance GCE does not show: its insert still running (provisioning), its insert failed
/// (GCE's error, once; a Spot insert's stockout as [`SPOT_CAPACITY_UNAVAILABLE`]), preempted (NotFound, [`INTERRUPTED`]),
/// or gone. The failure is reported by the first `get` that sees it and then forgotten, so the operator's next look
/// finds the name free and creates again (after its quota wait, or once the spec is fixed).
fn missing(api: &Api, id: &Id) -> Result<(Instance, String), ProviderError> {
    let gone = |why: &str| {
        if preempted(api, id) {
            let msg = format!("instance {id} was interrupted: Compute Engine preempted the Spot VM and deleted it");
            return ProviderError::not_found(msg).with_code(INTERRUPTED);
        }
        ProviderError::not_found(format!("instance {id} does not exist{why}")).with_code("notFound")
    };
    let Some(cached) = sdk::cache_get(&op_key(id)).and_then(|v| String::from_utf8(v).ok()) else {
        return Err(gone(""));
    };
    let (spot, op) = match cached.strip_prefix(SPOT_OP) {
        Some(op) => (true, op.to_string()),
        None => (false, cached),
    };
    let path = format!("/projects/{}/zones/{}/operations/{}", id.project, id.zone, encode_component(&op));
    let Some(op) = api.find::<Operation>(&path)? else {
        return Err(gone(" (its insert operation is gone too)"));
    };
    if op.status != "DONE" {
        let (ip, uid, created_at) = (String::new(), String::new(), parse_rfc3339(&op.insert_time));
        let inst =
            Instance { id: id.to_string(), ip, state: State::Provisioning, uid, created_at, ..Instance::empty() };
        return Ok((inst, format!("insert {} is {}", op.name, op.status)));
    }
    sdk::cache_set(&op_key(id), b"", 0);
    match op.failure(&format!("insert of instance {id}")) {
        Some(e) if spot => Err(spot_stockout(e)),
        Some(e) => Err(e),
        None => Err(gone(" (deleted after its insert succeeded)")),
    }
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    let api = Api::new(&cfg)?;
    let Some(vm) = api.find::<Vm>(&id.path())? else {
        return missing(&api, &id);
    };
    let inst = to_instance(&vm, id.to_string(), may_be_preempted(&vm) && preempted(&api, &id));
    if inst.state == State::Running && sdk::cache_get(&op_key(&id)).is_some() {
        sdk::cache_set(&op_key(&id), b"", 0); // it made it: the insert cannot fail any more
    }
    let what = format!("{:?} (status {})", inst.state, vm.status);
    Ok((inst, what))
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    // Returns at once with an operation; a repeat while it runs gets another one or the API's resourceNotReady
    // (transient). The boot disk and the ephemeral address go with the instance.
    let what = match Api::new(&cfg)?.call::<Operation>(Method::Delete, &id.path(), None) {
        Ok(op) => format!("delete accepted ({})", op.name),
        Err(e) if e.class == sdk::ErrorClass::NotFound => "already gone".into(),
        Err(e) => return Err(e),
    };
    Ok(((), what))
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let cfg = cfg()?;
    let api = Api::new(&cfg)?;
    let filter = encode_component(&marks::filter(installation));
    let fetch = |token: &String| {
        let token = if token.is_empty() { String::new() } else { format!("&pageToken={}", encode_component(token)) };
        let query = format!("filter={filter}&maxResults=500&returnPartialSuccess=true{token}");
        let path = format!("/projects/{}/aggregated/instances?{query}", cfg.project);
        let page = api.call(Method::Get, &path, None).map_err(|e| e.not_found_is_permanent("check config.project"))?;
        let (page, down) = api::aggregated_page(page)?;
        if let [first, ..] = &down[..] {
            let msg = format!("GCE could not list every zone ({first} unreachable): refusing a partial list");
            return Err(ProviderError::transient(msg).with_code("Unreachable"));
        }
        Ok(page)
    };
    let out = PAGES.collect(String::new(), fetch, |vm: Vm| {
        if !marks::is_gc_match(&vm.labels, installation) {
            return None;
        }
        match Id::parse(&format!("{}/{}/{}", cfg.project, vm.zone_name(), vm.name)) {
            Ok(id) => Some(to_instance(&vm, id.to_string(), may_be_preempted(&vm) && preempted(&api, &id))),
            // Leaving one out is safe: GC never deletes what it does not see.
            Err(_) => {
                sdk::warn!("gce list: skipping instance {:?} in {:?}: not an ID this plugin writes", vm.name, vm.zone);
                None
            }
        }
    })?;
    let what = format!("{} managed instances", out.len());
    Ok((out, what))
}

/// One cheap authenticated read per configured zone (`zones.get`): a zone GCE reports DOWN fails as `ZoneDown`.
fn probe(api: &Api, zone: &str) -> TargetStatus {
    match api.send::<Value>(Method::Get, &format!("/projects/{}/zones/{zone}", api.cfg.project), None) {
        Err(e) => TargetStatus::failed(zone, "Unauthorized", e.message),
        Ok(Err(e)) => TargetStatus::failed(zone, GCE.reason_of(&e), classify(e).message),
        Ok(Ok(z)) => {
            let [status, region] = ["status", "region"].map(|k| z[k].as_str().unwrap_or("").rsplit('/').next());
            let [status, region] = [status, region].map(|v| v.unwrap_or("").to_string());
            let mut t = match status.as_str() {
                "UP" => TargetStatus::ready(zone, vec![]),
                _ => TargetStatus::failed(zone, "ZoneDown", format!("GCE reports zone {zone} {status:?}")),
            };
            t.details = vec![("status".into(), status), ("region".into(), region)];
            t
        }
    }
}

impl Provider for Gce {
    const OUTCOMES: Outcomes = Outcomes { plugin: "gce", changes: Level::Info, reads: Level::Debug };
    /// Spot VMs, deleted when preempted ([`SPOT_SCHEDULING`]).
    const SPOT: bool = true;

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            // The API and the token endpoint of service-account keys. Never the metadata server: the operator lists
            // http://169.254.169.254:80 in allowedHosts when it wants workload identity.
            default_hosts: vec![
                "https://compute.googleapis.com:443".into(),
                "https://oauth2.googleapis.com:443".into(),
            ],
            ..PluginInfo::new("gce", env!("CARGO_PKG_VERSION")).with_profile(PROFILE).with_budget(BUDGET.0, BUDGET.1)
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

    fn check() -> Vec<TargetStatus> {
        match cfg() {
            Ok(cfg) => sdk::check_each(&cfg.zones, Api::new(&cfg), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
