//! Linode (Akamai) provider: each egress proxy is a Linode compute instance, through the
//! Linode API v4.
//!
//! Config and placement are in [`config`], tags and IDs in [`marks`], the API and the one
//! classify function in [`api`]. This file is the contract, operation by operation;
//! docs/providers/linode.md is the user's guide and explains every choice of the profile.

mod api;
mod config;
mod marks;

use api::{LN, Linode, classify, client, created_rfc3339, fetch, find_by_label, label_taken, not_gone};
use config::Config;
use data_encoding::{BASE64, BASE64URL_NOPAD};
use egress_guest_sdk::http::Client;
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::time::{now, parse_rfc3339};
use egress_guest_sdk::{
    self as sdk, CreateRequest, Instance, Level, Placement, PluginInfo, Price, Provider, ProviderError, State,
    TargetStatus, export_provider,
};
use marks::{ID, parse_id};
use serde_json::json;

struct Linodes;
export_provider!(Linodes);

/// The public API, the only host a default install may reach.
const DEFAULT_HOST: &str = "https://api.linode.com:443";

/// Linode's limit on `metadata.user_data`: 65,535 bytes before base64 encoding.
const USER_DATA_MAX: usize = 65_535;

/// How long after creation an `offline` Linode counts as not started yet. A Linode
/// created from an image with `booted: true` goes provisioning -> booting -> running, but
/// a status read between two jobs can say `offline`; the reconciler deletes stopped
/// instances, so a young one gets this grace before it counts as stopped.
const START_GRACE_SECS: u64 = 300;

/// The behaviour profile (provider contract section 4); the guide says why for each.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=allocated-id provisioning-state=native \
    async-ops=backend-lock secondary-resources=none credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Linode's 200 a minute for paginated GETs (every list), the tightest limit steady traffic
/// meets; a burst of the create limit's 20 per 15 s.
const BUDGET: (u32, u32) = (12_000, 20);

fn cfg() -> Result<Config, ProviderError> {
    config::parse(&sdk::config())
}

/// Linode status -> operator state. Leans towards provisioning wherever the Linode is on
/// its way up or in a job that ends by itself, and towards stopped only for a Linode that
/// will not come back by itself (and for statuses this plugin does not know).
fn state_of(status: &str, has_ip: bool, age_secs: Option<u64>) -> State {
    match status {
        // Being created, booted, or in a job that ends with the Linode back up.
        "provisioning" | "booting" | "rebooting" | "busy" | "migrating" | "rebuilding" | "cloning" | "restoring" => {
            State::Provisioning
        }
        "running" if has_ip => State::Running,
        "running" => State::Provisioning,
        // Still there while the delete runs: the label stays taken until it is gone.
        "deleting" => State::Terminated,
        // Never report a just-created Linode as stopped (see START_GRACE_SECS).
        "offline" if age_secs.is_some_and(|a| a < START_GRACE_SECS) => State::Provisioning,
        // offline, shutting_down, stopped, billing_suspension and anything unknown.
        _ => State::Stopped,
    }
}

fn to_instance(l: &Linode, id: String) -> Instance {
    let created_at = parse_rfc3339(&created_rfc3339(&l.created));
    let age = created_at.map(|c| now().seconds.saturating_sub(c.seconds));
    let ip = l.public_ipv4().to_string();
    let state = state_of(&l.status, !ip.is_empty(), age);
    Instance { id, ip, state, uid: marks::uid_of(&l.tags).to_string(), created_at, ..Instance::empty() }
}

/// Base64 of the cloud-init for `metadata.user_data`, byte for byte, or `None` when there
/// is none. Over Linode's limit is refused here, naming the sizes.
fn user_data(cloud_init: &[u8]) -> Result<Option<String>, ProviderError> {
    if cloud_init.len() > USER_DATA_MAX {
        return Err(ProviderError::user_data_too_large(cloud_init.len(), USER_DATA_MAX, ""));
    }
    Ok((!cloud_init.is_empty()).then(|| BASE64.encode(cloud_init)))
}

/// A fresh root password for one Linode: 240 random bits as 40 URL-safe base64
/// characters. Linode requires `root_pass` when deploying an image; nobody needs it (the
/// proxy is configured by cloud-init, SSH by `authorizedKeys`), so it is never stored,
/// logged or returned: it goes into the create request and nowhere else.
fn root_pass() -> String {
    BASE64URL_NOPAD.encode(&sdk::random::random_bytes(30))
}

/// The region for a Linode's ID: the one Linode reports, else the one asked for.
fn region_of<'a>(l: &'a Linode, fallback: &'a str) -> &'a str {
    if config::is_region(&l.region) { &l.region } else { fallback }
}

/// The existing Linode labelled `req.name`, if it is this Proxy's. Someone else's is
/// permanent: the name derives from the UID, so retrying cannot free it.
fn adopt(l: &Linode, req: &CreateRequest, region: &str) -> Result<String, ProviderError> {
    let uid = marks::uid_of(&l.tags);
    if uid != req.uid {
        return Err(ProviderError::name_taken(&l.label, &format!("linode {}", l.id), uid, &req.uid));
    }
    if l.status == "deleting" {
        let msg =
            format!("linode {:?} (id {}) is still being deleted; the label is free once it is gone", l.label, l.id);
        return Err(ProviderError::transient(msg).with_code("NameBeingDeleted"));
    }
    Ok(ID.format(region_of(l, region), l.id))
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(&req.placement)?;
    let tags = marks::create_tags(&req.uid, &req.installation)?;
    let user_data = user_data(&req.cloud_init)?;
    let api = client(&cfg.endpoint)?;
    // Idempotent by label: a crash after the create call lands here again.
    if let Some(l) = find_by_label(&api, &req.name)? {
        return adopt(&l, req, place.region).map(|id| (id.clone(), format!("adopted the existing linode {id}")));
    }
    let mut body = json!({
        "label": req.name, "region": place.region, "type": place.linode_type, "image": place.image,
        "root_pass": root_pass(), "booted": true, "tags": tags,
    });
    if let Some(ud) = user_data {
        body["metadata"] = json!({ "user_data": ud });
    }
    if !cfg.authorized_keys.is_empty() {
        body["authorized_keys"] = json!(cfg.authorized_keys);
    }
    if let Some(fw) = cfg.firewall_id {
        body["firewall_id"] = json!(fw);
    }
    match api.post("/linode/instances").json(&body).send_ok().and_then(|r| r.json::<Linode>()) {
        Ok(l) => {
            let id = ID.format(region_of(&l, place.region), l.id);
            let (t, img, n) = (place.linode_type, place.image, req.cloud_init.len());
            Ok((id.clone(), format!("created {id} ({t} / {img}, user data {n} bytes)")))
        }
        // A concurrent create won the race for the label: adopt its Linode if it is ours.
        Err(e) if label_taken(&e) => match find_by_label(&api, &req.name)? {
            Some(l) => adopt(&l, req, place.region).map(|id| (id, "adopted the linode of a concurrent create".into())),
            None => Err(ProviderError::transient(format!("label {:?} was taken, but no linode has it now", req.name))
                .with_code("LabelTaken")),
        },
        Err(e) => Err(not_gone(e, "check config.endpoint and config.firewallId")),
    }
}

fn get(id: &str) -> Result<Instance, ProviderError> {
    let (_, linode_id) = parse_id(id)?;
    match fetch(&client(&cfg()?.endpoint)?, linode_id)? {
        Some(l) => Ok(to_instance(&l, id.to_string())),
        None => Err(ProviderError::not_found(format!("linode {linode_id} does not exist")).with_code("NotFound")),
    }
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let (_, linode_id) = parse_id(id)?;
    let api = client(&cfg()?.endpoint)?;
    // Disks, configs and IP addresses belong to the Linode and go with it: one call.
    match api.delete(&format!("/linode/instances/{linode_id}")).send_ok() {
        Ok(_) => Ok(((), "delete started".into())),
        Err(e) if LN.is_gone(&e) => Ok(((), "already gone".into())),
        // `Linode busy.`: a job holds it; transient, the reconciler calls again.
        Err(e) => Err(classify(e)),
    }
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let api = client(&cfg()?.endpoint)?;
    let out = api::list(&api, &marks::gc_filter(installation), |l| {
        if !marks::is_gc_match(&l.tags, installation) {
            return None;
        }
        if !config::is_region(&l.region) {
            // Leaving one out is safe: GC never deletes what it does not see.
            sdk::warn!("linode list: skipping linode {}: region {:?} cannot be in an ID", l.id, l.region);
            return None;
        }
        Some(to_instance(&l, ID.format(&l.region, l.id)))
    })?;
    let what = format!("{} managed linodes", out.len());
    Ok((out, what))
}

/// The hourly price of a placement, from the type's public price list: checked as a create
/// checks it (a placement create would refuse is refused here the same way), then
/// `GET /linode/types/{typeId}`.
fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(p)?;
    let api = client(&cfg.endpoint)?;
    let t: api::LinodeType = api
        .get(&format!("/linode/types/{}", place.linode_type))
        .send_ok()
        .and_then(|r| r.json())
        .map_err(|e| not_gone(e, "check config.types against GET /linode/types"))?;
    let price = t.hourly_micros(place.region).map(|micros_per_hour| Price { currency: "USD".into(), micros_per_hour });
    let what = match &price {
        Some(pr) => format!("{} in {}: {} micro-USD an hour", t.id, place.region, pr.micros_per_hour),
        None => format!("{} in {}: no hourly price published", t.id, place.region),
    };
    Ok((price, what))
}

/// One cheap authenticated read per region, with the same token, verb and scope as GC's
/// list; the count of managed Linodes there and the rate limit left are triage details.
fn probe(api: &Client, region: &str) -> TargetStatus {
    let filter = json!({"+and": [{"tags": marks::TAG_MANAGED}, {"region": region}]}).to_string();
    let path = "/linode/instances?page=1&page_size=25";
    match api.get(path).header("x-filter", &filter).send_ok().and_then(|r| Ok((r.json::<api::Paged>()?, r))) {
        Ok((p, r)) => {
            let mut details = vec![("managedLinodes".to_string(), p.results.to_string())];
            if let Some(left) = r.header("x-ratelimit-remaining") {
                details.push(("rateLimitRemaining".into(), String::from_utf8_lossy(left).into_owned()));
            }
            TargetStatus::ready(region, details)
        }
        Err(e) => TargetStatus::failed(region, LN.reason_of(&e), classify(e).message),
    }
}

impl Provider for Linodes {
    /// One line per outcome, never the request (cloud-init, root password) or the token.
    const OUTCOMES: Outcomes = Outcomes { plugin: "linode", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            default_hosts: vec![DEFAULT_HOST.to_string()],
            ..PluginInfo::new("linode", env!("CARGO_PKG_VERSION")).with_profile(PROFILE).with_budget(BUDGET.0, BUDGET.1)
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
            // No usable token: every region fails the same way, and no request is made.
            Ok(cfg) => sdk::check_each(&cfg.regions, client(&cfg.endpoint), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
