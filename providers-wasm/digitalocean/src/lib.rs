//! DigitalOcean provider: each egress proxy is a Droplet. Config in [`config`], the marks as tags and the IDs in
//! [`marks`], the API and its one classify function in [`api`]; this file is the contract, operation by operation.
//! docs/providers/digitalocean.md is the user's guide and gives the reason for every choice of the behaviour profile
//! below.

mod api;
mod config;
mod marks;

use api::{Droplet, classify, client, fetch};
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{
    self as sdk, CreateRequest, Instance, Level, Placement, PluginInfo, Price, Provider, ProviderError, State,
    TargetStatus, export_provider,
};
use marks::{ID, parse_id};
use serde_json::json;

struct DigitalOcean;
export_provider!(DigitalOcean);

/// DigitalOcean's limit on `user_data`: plain text, at most 64 KiB.
const USER_DATA_MAX: usize = 64 * 1024;

/// The behaviour profile (provider contract section 4), one `axis=code` per word; the guide's "Behaviour profile"
/// section gives the reason for each.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=allocated-id provisioning-state=native \
    async-ops=backend-lock secondary-resources=none credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// DigitalOcean's 5,000 requests an hour per token; a burst of 100 keeps the busiest
/// minute under its 250 a minute.
const BUDGET: (u32, u32) = (5_000, 100);

/// This provider's config block, parsed as `validate-config` parsed it.
fn cfg() -> Result<config::Config, ProviderError> {
    config::parse(&sdk::config())
}

/// DigitalOcean takes user data as plain text (a JSON string) of at most 64 KiB, and its cloud-init datasource hands
/// it to the guest as it is: bytes that are not UTF-8 cannot travel, so they are refused before the call rather than
/// altered.
fn user_data(cloud_init: &[u8]) -> Result<&str, ProviderError> {
    let Ok(text) = std::str::from_utf8(cloud_init) else {
        let msg = format!("cloud-init ({} bytes) is not UTF-8; DigitalOcean takes plain text", cloud_init.len());
        return Err(ProviderError::permanent(msg).with_code("UserDataNotText"));
    };
    match text.len() > USER_DATA_MAX {
        true => Err(ProviderError::user_data_too_large(text.len(), USER_DATA_MAX, "")),
        false => Ok(text),
    }
}

/// The operator's view of a Droplet. `new` is DigitalOcean's own "being created", so a created, not yet started Droplet
/// is never Stopped. Running needs a public IPv4: `active` comes a moment before it, and a private one reaches no
/// client. `archive` (being destroyed) stays visible, so the replacement (same name) waits. `off` and any status this
/// plugin does not know are Stopped: instances are disposable.
fn to_instance(d: &Droplet, id: String) -> Instance {
    let ip = d.public_ipv4().to_string();
    let state = match d.status.as_str() {
        "new" => State::Provisioning,
        "active" if !ip.is_empty() => State::Running,
        "active" => State::Provisioning,
        "archive" => State::Terminated,
        _ => State::Stopped,
    };
    Instance { id, ip, state, uid: marks::uid(&d.tags), created_at: parse_rfc3339(&d.created_at), ..Instance::empty() }
}

fn id_of(d: &Droplet, fallback: &str) -> String {
    ID.format(d.region().unwrap_or(fallback), d.id)
}

/// Among the Droplets called `req.name`, the one this Proxy owns, after removing duplicates. Names are not unique on
/// DigitalOcean, so two creates racing for one name both succeed; every create therefore looks again afterwards,
/// keeps the oldest (lowest ID) of this Proxy's live Droplets and deletes the others. Both racers see the oldest,
/// since it was accepted before either looked, and settle on it.
fn settle(api: &sdk::http::Client, req: &CreateRequest) -> Result<Option<Droplet>, ProviderError> {
    let mut mine = api::by_name(api, &req.name)?;
    if let Some(d) = mine.iter().find(|d| marks::uid(&d.tags) != req.uid) {
        let holder = format!("droplet {}", d.id);
        return Err(ProviderError::name_taken(&req.name, &holder, &marks::uid(&d.tags), &req.uid));
    }
    mine.sort_by_key(|d| d.id);
    let (dying, live): (Vec<Droplet>, Vec<Droplet>) = mine.into_iter().partition(|d| d.status == "archive");
    if let (true, Some(d)) = (live.is_empty(), dying.first()) {
        let msg = format!("droplet {} named {:?} is still being destroyed; retry once it is gone", d.id, req.name);
        return Err(ProviderError::transient(msg).with_code("NameBeingDeleted"));
    }
    for extra in live.iter().skip(1) {
        let outcome = destroy(api, extra.id).map_or_else(|e| e.message, str::to_string);
        sdk::info!("digitalocean create {}: duplicate droplet {}: {outcome}", req.name, extra.id);
    }
    Ok(live.into_iter().next())
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let (region, size, image) = cfg.resolve(&req.placement)?;
    let tags = marks::create_tags(&req.uid, &req.installation, &cfg.tags)?;
    let user_data = user_data(&req.cloud_init)?;
    let api = client(&cfg.endpoint)?;
    // Idempotent by name: a crash after the create call, or a lost status write, lands here again with the same name.
    if let Some(d) = settle(&api, req)? {
        return Ok((id_of(&d, &region), "adopted the existing droplet".into()));
    }
    let mut body = json!({
        "name": req.name, "region": region, "size": size, "image": image, "tags": tags,
        // The egress address is the public IPv4; nothing else is needed on the Droplet.
        "ipv6": false, "monitoring": false, "backups": false, "ssh_keys": cfg.ssh_keys,
    });
    if !user_data.is_empty() {
        body["user_data"] = json!(user_data);
    }
    let created = api::send(api.post("/droplets").json(&body))
        .and_then(|r| r.json::<api::DropletEnvelope>())
        .map_err(|e| api::not_gone(e, "check config.endpoint"))?
        .droplet;
    // Verify: a concurrent create for the same name may have won; settle on the oldest.
    // Not listed yet, or the look failed: the Droplet we were given exists.
    let kept = settle(&api, req).ok().flatten().unwrap_or_else(|| created.clone());
    let id = id_of(&kept, &region);
    let what = match kept.id == created.id {
        true => format!("created {id} ({size} / {image}, user data {} bytes)", req.cloud_init.len()),
        false => format!("adopted {id} of a concurrent create"),
    };
    Ok((id, what))
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let (_, droplet_id) = parse_id(id)?;
    let api = client(&cfg()?.endpoint)?;
    let Some(d) = fetch(&api, droplet_id)? else {
        return Err(ProviderError::not_found(format!("droplet {droplet_id} does not exist")).with_code("not_found"));
    };
    let inst = to_instance(&d, id.to_string());
    let what = format!("{:?} (status {}{})", inst.state, d.status, if d.locked { ", locked" } else { "" });
    Ok((inst, what))
}

/// `DELETE /droplets/{id}`: done (204) or already gone (404).
fn destroy(api: &sdk::http::Client, droplet_id: u64) -> Result<&'static str, ProviderError> {
    match api::send(api.delete(&format!("/droplets/{droplet_id}"))) {
        Ok(_) => Ok("delete accepted"),
        Err(e) if api::DO.is_gone(&e) => Ok("already gone"),
        Err(e) => Err(classify(e)),
    }
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let (_, droplet_id) = parse_id(id)?;
    let api = client(&cfg()?.endpoint)?;
    // Read first: a Droplet being destroyed needs no second request, and a locked one (an action running) would only
    // be refused.
    let what = match fetch(&api, droplet_id)? {
        None => "already gone",
        Some(d) if d.status == "archive" => "already being destroyed",
        Some(d) if d.locked => {
            let msg = format!("droplet {droplet_id} is locked by a running action; deleting it once that ends");
            return Err(ProviderError::transient(msg).with_code("locked"));
        }
        Some(_) => destroy(&api, droplet_id)?,
    };
    Ok(((), what.to_string()))
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let api = client(&cfg()?.endpoint)?;
    let filter = api::tag_filter(&marks::installation_tag(installation));
    let out = api::list(&api, &filter, |d| {
        if !marks::is_gc_match(&d.tags, installation) {
            return None;
        }
        // Leaving one out is safe: GC never deletes what it does not see.
        let Some(region) = d.region() else {
            sdk::warn!("digitalocean list: skipping droplet {} ({:?}): the answer names no region", d.id, d.name);
            return None;
        };
        Some(to_instance(&d, ID.format(region, d.id)))
    })?;
    let what = format!("{} managed droplets", out.len());
    Ok((out, what))
}

/// The hourly price of a placement, from DigitalOcean's size catalogue: checked as a create checks it (a placement
/// create would refuse is refused here the same way), then `GET /v2/sizes`, page by page, for the size's
/// `price_hourly` in US dollars. `None` when the catalogue has no such size, or the size is not available in the
/// region: nothing would be billed there.
fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let (region, size, _) = cfg.resolve(p)?;
    let api = client(&cfg.endpoint)?;
    let price = api::size_price(&api, &size, &region)?;
    let price = price.map(|micros_per_hour| Price { currency: "USD".into(), micros_per_hour });
    let what = match &price {
        Some(pr) => format!("{size} in {region}: {} micro-USD an hour", pr.micros_per_hour),
        None => format!("{size} in {region}: not offered there, no price"),
    };
    Ok((price, what))
}

/// One cheap authenticated read with the token, verb and scope of GC's list: DigitalOcean's API is one global
/// service, so there is one target, `api`.
fn probe(api: &sdk::http::Client) -> TargetStatus {
    let path = format!("/droplets?{}&per_page=1", api::tag_filter(&marks::managed_tag()));
    let result = api::send(api.get(&path)).and_then(|r| Ok((r.json::<api::DropletList>()?, r)));
    match result {
        Ok((list, r)) => {
            let left = r.header("ratelimit-remaining").map(|v| String::from_utf8_lossy(v).into_owned());
            let details =
                [("managedDroplets", list.meta["total"].as_u64().map(|n| n.to_string())), ("rateLimitRemaining", left)];
            TargetStatus::ready("api", details.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))).collect())
        }
        Err(e) => TargetStatus::failed("api", api::DO.reason_of(&e), classify(e).message),
    }
}

impl Provider for DigitalOcean {
    /// Creates and deletes at info (a few per Proxy), the polled get and list at debug; never the request (cloud-init) or
    /// the token.
    const OUTCOMES: Outcomes = Outcomes { plugin: "digitalocean", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            // The public API, the only host a default install may reach.
            default_hosts: vec!["https://api.digitalocean.com:443".into()],
            ..PluginInfo::new("digitalocean", env!("CARGO_PKG_VERSION"))
                .with_profile(PROFILE)
                .with_budget(BUDGET.0, BUDGET.1)
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
            Ok(cfg) => sdk::check_each(&["api"], client(&cfg.endpoint), |api, _| probe(api)),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
