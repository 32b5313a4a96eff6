//! Vultr provider: each egress proxy is a Vultr cloud compute instance (API v2).
//!
//! Config and placement are in [`config`], the API (wire types, the one classify function,
//! marks in tags, paging) in [`api`]; this file is the contract, operation by operation.
//! docs/providers/vultr.md is the user's guide and explains every choice of the behaviour
//! profile below.

mod api;
mod config;

use api::{VULTR, Wire, classify, client, fetch};
use data_encoding::BASE64;
use egress_guest_sdk::http::{Client, encode_component};
use egress_guest_sdk::id::IdFormat;
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{self as sdk, *};
use serde_json::json;
use std::time::Duration;

struct Vultr;
export_provider!(Vultr);

/// The public API, the only host a default install may reach.
const DEFAULT_HOST: &str = "https://api.vultr.com:443";

/// The behaviour profile (provider contract section 4), one `axis=code` per word.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=allocated-id provisioning-state=native \
    async-ops=backend-lock secondary-resources=none credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Vultr's 30 requests a second per source IP, a second's worth as burst.
const BUDGET: (u32, u32) = (108_000, 30);

/// `<region>/<instance id>`. Vultr instance IDs are global: get and delete use the key only.
const ID: IdFormat = IdFormat {
    shape: "<region>/<instance id>, e.g. ewr/cb676a46-66fd-4dfb-b839-443f2e6c0b60",
    scope: config::is_region,
    key: config::is_vultr_id,
};

/// How long a create waits after its `POST` before it looks for twins. Vultr labels are
/// not unique, so two concurrent creates for one name both succeed; after the pause each
/// lists the label and all agree on the oldest as the one to keep (see [`settle`]).
const SETTLE: Duration = Duration::from_millis(1000);

fn cfg() -> Result<config::Config, ProviderError> {
    config::parse(&sdk::config())
}

fn tag(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// The operator's state for a Vultr instance. The reconciler deletes whatever is Stopped,
/// so the mapping leans to Provisioning wherever the instance is still on its way up.
fn state(w: &Wire) -> State {
    match (w.status.as_str(), w.power_status.as_str(), w.server_status.as_str()) {
        // Being created (main_ip 0.0.0.0), or resized: comes back by itself.
        ("pending" | "resizing", _, _) => State::Provisioning,
        // Powered on but the OS is still being installed or booted the first time.
        ("active", "running", "none" | "installing" | "booting" | "installingbooting") => State::Provisioning,
        // `ok`, or `locked` by an operation on a running instance (its last state).
        ("active", "running", _) if w.public_ip().is_some() => State::Running,
        ("active", "running", _) => State::Provisioning,
        // Halted, suspended (billing, abuse) and anything unknown: will not recover by itself.
        _ => State::Stopped,
    }
}

fn to_instance(w: &Wire, id: String) -> Instance {
    let ip = match state(w) {
        State::Running => w.public_ip().unwrap_or_default(),
        _ => String::new(),
    };
    let uid = w.mark(MARK_UID).unwrap_or_default().to_string();
    Instance { id, ip, state: state(w), uid, created_at: parse_rfc3339(&w.date_created), ..Instance::empty() }
}

/// The order in which twins are kept: oldest first, then by ID, the same for every caller.
fn age_key(w: &Wire) -> (Option<(u64, u32)>, String) {
    (parse_rfc3339(&w.date_created).map(|d| (d.seconds, d.nanoseconds)), w.id.clone())
}

/// The instance called `req.name` that is this Proxy's, if any, after removing its twins.
///
/// Vultr labels are not unique, so a crashed create retried, or two creates racing, can
/// leave several of ours with one label. All callers keep the oldest (then lowest ID) and
/// delete the rest, `mine` (the instance this call just made) included when it is not
/// kept. An instance with the label and another UID is someone else's: permanent.
fn settle(api: &Client, req: &CreateRequest, mine: Option<&str>) -> Result<Option<String>, ProviderError> {
    let filter = format!("label={}", encode_component(&req.name));
    // Only IDs this plugin can write go on: an odd one never reaches a URL or an ID.
    let named = api::list(api, &filter, |w| (w.label == req.name && config::is_vultr_id(&w.id)).then_some(w))?;
    let (ours, foreign): (Vec<Wire>, Vec<Wire>) = named.into_iter().partition(|w| w.mark(MARK_UID) == Some(&req.uid));
    let Some(keep) = ours.iter().min_by_key(|w| age_key(w)) else {
        return match foreign.first() {
            Some(f) => Err(ProviderError::name_taken(
                &req.name,
                &format!("instance {}", f.id),
                f.mark(MARK_UID).unwrap_or_default(),
                &req.uid,
            )),
            None => Ok(None),
        };
    };
    let twins = ours.iter().filter(|w| w.id != keep.id).map(|w| w.id.as_str());
    let mine_too = mine.filter(|m| *m != keep.id && !ours.iter().any(|w| w.id == *m));
    for twin in twins.chain(mine_too) {
        match api.delete(&format!("/instances/{twin}")).send_ok() {
            Ok(_) => sdk::info!("vultr create {}: deleted twin instance {twin}, keeping {}", req.name, keep.id),
            Err(e) if VULTR.is_gone(&e) => {}
            Err(e) => {
                let err = classify(e);
                let msg = format!(
                    "instance {twin} is a twin of {} for {:?} and could not be deleted yet: {}",
                    keep.id, req.name, err.message
                );
                return Err(ProviderError::transient(msg).with_code("TwinNotDeleted"));
            }
        }
    }
    let region = if config::is_region(&keep.region) { keep.region.as_str() } else { req.placement.region.as_str() };
    Ok(Some(ID.format(region, &keep.id)))
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(&req.placement)?;
    let api = client(&cfg.endpoint)?;
    // Idempotent by name: a crash after the create call, or a lost status write, lands
    // here again with the same name.
    if let Some(id) = settle(&api, req, None)? {
        return Ok((id, "adopted the existing instance".into()));
    }
    let mut body = json!({
        "region": place.region,
        "plan": place.plan,
        "os_id": place.os_id,
        "label": req.name,
        "hostname": req.name,
        // The marks, in the create call itself: GC finds instances only through them.
        "tags": [
            tag(MARK_MANAGED, MARK_MANAGED_YES),
            tag(MARK_UID, &req.uid),
            tag(MARK_INSTALLATION, &req.installation),
        ],
        "backups": "disabled",
        "activation_email": false,
        "enable_ipv6": cfg.enable_ipv6,
    });
    // Vultr takes user data base64-encoded; the guest gets the bytes as they were.
    if !req.cloud_init.is_empty() {
        body["user_data"] = json!(BASE64.encode(&req.cloud_init));
    }
    if !cfg.ssh_key_ids.is_empty() {
        body["sshkey_id"] = json!(cfg.ssh_key_ids);
    }
    if let Some(fw) = &cfg.firewall_group_id {
        body["firewall_group_id"] = json!(fw);
    }
    let created = api
        .post("/instances")
        .json(&body)
        .send_json::<api::One>()
        .map_err(|e| classify(e).not_found_is_permanent("check config.endpoint, sshKeyIds and firewallGroupId"))?;
    let mine = created.instance.id;
    if !config::is_vultr_id(&mine) {
        let msg = format!("Vultr accepted the instance but answered the id {mine:?}, which is not a UUID");
        return Err(ProviderError::transient(msg).with_code("BadInstanceId"));
    }
    // A concurrent create for the same name may have made a twin: agree on one.
    std::thread::sleep(SETTLE);
    let id = settle(&api, req, Some(&mine))?.unwrap_or_else(|| ID.format(place.region, &mine));
    let what = format!("created {id} ({} / os {}, user data {} bytes)", place.plan, place.os_id, req.cloud_init.len());
    Ok((id, what))
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let (_, key) = ID.parse(id)?;
    let api = client(&cfg()?.endpoint)?;
    let Some(w) = fetch(&api, key)? else {
        return Err(ProviderError::not_found(format!("instance {key} does not exist")).with_code("HTTP404"));
    };
    let inst = to_instance(&w, id.to_string());
    let what = format!(
        "{:?}, {} (status {}, power {}, server {})",
        inst.state,
        if inst.ip.is_empty() { "no IP" } else { &inst.ip },
        w.status,
        w.power_status,
        w.server_status
    );
    Ok((inst, what))
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let (_, key) = ID.parse(id)?;
    let api = client(&cfg()?.endpoint)?;
    match api.delete(&format!("/instances/{key}")).send_ok() {
        Ok(_) => Ok(((), "delete accepted".into())),
        Err(e) if VULTR.is_gone(&e) => Ok(((), "already gone".into())),
        // Vultr refuses to destroy an instance an operation holds: a 400 like any other
        // refusal. Locked passes by itself, so read the instance before giving up on it.
        Err(e) if e.status() == Some(400) => match fetch(&api, key)? {
            None => Ok(((), "already gone".into())),
            Some(w) if w.server_status == "locked" => {
                let msg = format!(
                    "instance {key} is locked by an operation; deleting it once that ends: {}",
                    classify(e).message
                );
                Err(ProviderError::transient(msg).with_code("Locked"))
            }
            Some(_) => Err(classify(e)),
        },
        Err(e) => Err(classify(e)),
    }
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let api = client(&cfg()?.endpoint)?;
    // Every instance of the account: Vultr's reference marks the `tag` filter deprecated and
    // offers none on `tags`, so the marks are matched here, and only here.
    let out = api::list(&api, "", |w| {
        if !managed_by(&w, Some(installation)) {
            return None;
        }
        if !config::is_region(&w.region) || !config::is_vultr_id(&w.id) {
            // Leaving one out is safe: GC never deletes what it does not see.
            sdk::warn!(
                "vultr list: skipping instance {:?} in region {:?}: not an ID this plugin can write",
                w.id,
                w.region
            );
            return None;
        }
        Some(to_instance(&w, ID.format(&w.region, &w.id)))
    })?;
    let what = format!("{} managed instances", out.len());
    Ok((out, what))
}

/// The hourly price of a placement, from Vultr's plan catalogue: checked as a create checks it (a placement create
/// would refuse is refused here the same way), then `GET /v2/plans` for the plan's monthly price in the region,
/// converted to Vultr's hourly rate. `None` when the catalogue has no such plan, or the plan is not valid for use in
/// the region.
fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(p)?;
    let api = client(&cfg.endpoint)?;
    let price = api::plan_price(&api, place.plan, place.region)?;
    let price = price.map(|micros_per_hour| Price { currency: "USD".into(), micros_per_hour });
    let (plan, region) = (place.plan, place.region);
    let what = match &price {
        Some(pr) => format!("{plan} in {region}: {} micro-USD an hour", pr.micros_per_hour),
        None => format!("{plan} in {region}: not offered there, no price"),
    };
    Ok((price, what))
}

/// Whether an instance carries this plugin's managed mark and, when asked, the
/// installation's mark. The marks are the only test: no list filter is trusted with it.
fn managed_by(w: &Wire, installation: Option<&str>) -> bool {
    w.mark(MARK_MANAGED) == Some(MARK_MANAGED_YES) && installation.is_none_or(|i| w.mark(MARK_INSTALLATION) == Some(i))
}

/// An authenticated list of the region (`region` is a filter the reference documents), with
/// the same token, verb and scope as GC's list; the number of instances there carrying the
/// managed mark, counted here, is a triage detail. One page for up to 500 instances.
fn probe(api: &Client, region: &str) -> TargetStatus {
    let filter = format!("region={}", encode_component(region));
    match api::list_reason(api, &filter, |w| managed_by(&w, None).then_some(())) {
        Ok(managed) => TargetStatus::ready(region, vec![("managedInstances".into(), managed.len().to_string())]),
        Err((reason, e)) => TargetStatus::failed(region, reason, e.message),
    }
}

impl Provider for Vultr {
    /// Creates and deletes at info (a few per Proxy), the polled reads at debug.
    const OUTCOMES: Outcomes = Outcomes { plugin: "vultr", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            default_hosts: vec![DEFAULT_HOST.to_string()],
            ..PluginInfo::new("vultr", env!("CARGO_PKG_VERSION")).with_profile(PROFILE).with_budget(BUDGET.0, BUDGET.1)
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
            Ok(cfg) => sdk::check_each(&cfg.regions, client(&cfg.endpoint), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
