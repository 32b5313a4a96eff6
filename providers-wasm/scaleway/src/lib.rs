//! Scaleway provider: each egress proxy is a Scaleway Instance with a flexible IPv4.
//!
//! Config, placement and tags are in [`config`], the API and its classification table in
//! [`api`]; this file is the contract, operation by operation (docs/providers/scaleway.md
//! gives the reason for every choice of the behaviour profile). Two things make Scaleway
//! different. The public IPv4 is a resource of its own: reserved before the server, attached
//! in the create call, released before the server goes and when the create fails. And a
//! server is created stopped: create sets the user data and powers it on before returning.

mod api;
mod config;

use api::{SCW, Server, classify};
use config::{Config, mark};
use egress_guest_sdk::id::IdFormat;
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::time::{now, parse_rfc3339};
use egress_guest_sdk::{self as sdk, *};
use serde_json::json;

struct Scaleway;
export_provider!(Scaleway);

/// The behaviour profile (provider contract section 4); the guide says why for each.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=allocated-id provisioning-state=create-blocks \
    async-ops=backend-lock secondary-resources=explicit credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Scaleway publishes no limit for the Instances API: Hetzner's figure, this project's choice.
const BUDGET: (u32, u32) = (3_600, 100);

/// `<zone>/<server id>`, parsed strictly: anything else is permanent and never reaches a URL.
const ID: IdFormat = IdFormat {
    shape: "<zone>/<server id>, e.g. fr-par-1/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9",
    scope: config::is_zone,
    key: config::is_uuid,
};

/// How long after creation a `stopped` server still counts as being started: create powers
/// it on before it returns, so this only covers a power-on accepted but not yet shown.
const START_GRACE_SECS: u64 = 180;

fn cfg() -> Result<Config, ProviderError> {
    config::parse(&sdk::config())
}

/// Server state -> operator state. Leans to provisioning while the server is on its way
/// up, to stopped only for servers that will not come back by themselves.
fn state_of(s: &Server, now_secs: u64) -> State {
    let young = parse_rfc3339(&s.creation_date).is_some_and(|c| now_secs.saturating_sub(c.seconds) < START_GRACE_SECS);
    match s.state.as_str() {
        "running" if !s.ipv4().is_empty() => State::Running,
        "running" | "starting" => State::Provisioning,
        "stopped" | "stopped in place" if young => State::Provisioning,
        // stopped, stopping (a poweroff or a terminate), and anything this plugin does not know.
        _ => State::Stopped,
    }
}

fn to_instance(zone: &str, s: &Server) -> Instance {
    Instance {
        id: ID.format(zone, &s.id),
        ip: s.ipv4().to_string(),
        state: state_of(s, now().seconds),
        uid: mark(&s.tags, MARK_UID).unwrap_or_default().to_string(),
        created_at: parse_rfc3339(&s.creation_date),
        ..Instance::empty()
    }
}

/// Scaleway locks a server during some operations (and for abuse handling); its state is
/// unknown meanwhile, so get and delete wait instead of guessing.
fn locked(s: &Server) -> Result<(), ProviderError> {
    let msg = format!("server {} is locked by Scaleway", s.id);
    if s.state == "locked" { Err(ProviderError::transient(msg).with_code("locked")) } else { Ok(()) }
}

/// Set the user data and power on, unless it is already on its way: what turns a created
/// (stopped) server into a starting one.
fn start(api: &http::Client, zone: &str, s: &Server, cloud_init: &[u8]) -> Result<(), ProviderError> {
    if !matches!(s.state.as_str(), "stopped" | "stopped in place") {
        return Ok(());
    }
    if !cloud_init.is_empty() {
        api::set_user_data(api, zone, &s.id, cloud_init)?;
    }
    match api::action(api, zone, &s.id, "poweron") {
        // 412 "server should be stopped": a concurrent create powered it on first.
        Err(e) if !SCW.has_code(&e, "precondition_failed") => Err(classify(e)),
        _ => Ok(()),
    }
}

/// The existing server called `req.name`, if this Proxy's: started if it never was, and
/// its ID returned. Another Proxy's is permanent: the name derives from the UID.
fn adopt(api: &http::Client, zone: &str, s: &Server, req: &CreateRequest) -> Result<String, ProviderError> {
    let uid = mark(&s.tags, MARK_UID).unwrap_or_default();
    if uid != req.uid {
        return Err(ProviderError::name_taken(&s.name, &format!("server {}", s.id), uid, &req.uid));
    }
    locked(s)?;
    start(api, zone, s, &req.cloud_init)?;
    Ok(ID.format(zone, &s.id))
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let (zone, kind, image) = cfg.resolve(&req.placement)?;
    let tags = config::create_tags(&req.uid, &req.installation)?;
    let api = api::client(&cfg)?;
    // Idempotent by name: a crash after the create call lands here again with the same name.
    if let Some(s) = api::by_name(&api, &cfg, zone, &req.name)?.first() {
        return Ok((adopt(&api, zone, s, req)?, "adopted the existing server".into()));
    }
    let ip = api::reserve_ip(&api, &cfg, zone, &tags)?;
    let mut body = json!({
        "name": req.name, "project": cfg.project_id, "commercial_type": kind,
        "image": image, "tags": tags, "public_ips": [ip], "dynamic_ip_required": false,
        "routed_ip_enabled": true,
    });
    if let Some(sg) = &cfg.security_group_id {
        body["security_group"] = json!(sg);
    }
    let created = api.post(&api::path(zone, "/servers")).json(&body).send_json::<api::ServerEnvelope>();
    let server = match created {
        Ok(env) => env.server,
        Err(e) => {
            // The server may exist after all (an answer lost on its way back): adopt it.
            // Otherwise the IP must not outlive the failed create.
            if let Some(s) = api::by_name(&api, &cfg, zone, &req.name).ok().and_then(|f| f.into_iter().next()) {
                return Ok((adopt(&api, zone, &s, req)?, "adopted the server of a failed answer".into()));
            }
            if let Err(left) = api::remove(&api, zone, &format!("/ips/{ip}")) {
                sdk::warn!("scaleway create: IP {ip} of a failed create not released: {}", left.message);
            }
            return Err(api::not_gone(e, "check config.images, config.commercialTypes and config.securityGroupId"));
        }
    };
    // Names are not unique: a concurrent create for the same Proxy may have made one too.
    // Every caller keeps the oldest; a newer one is removed by the call that made it.
    let oldest = api::by_name(&api, &cfg, zone, &req.name)?.into_iter().next();
    if let Some(first) = oldest.filter(|f| f.id != server.id) {
        teardown(&api, zone, &server)?;
        return Ok((adopt(&api, zone, &first, req)?, "adopted the server of a concurrent create".into()));
    }
    start(&api, zone, &server, &req.cloud_init)?;
    let id = ID.format(zone, &server.id);
    let n = req.cloud_init.len();
    Ok((id.clone(), format!("created {id} ({kind} / {image}, IP {ip}, user data {n} bytes)")))
}

/// Remove a server and what it holds: its flexible IPs first (they outlive it otherwise),
/// then the server: `terminate` for a running one (local volumes go with it), `DELETE` for
/// a stopped one, then its local volumes (which that keeps). A server that is stopping is
/// left for a later call, which finds it stopped or gone.
fn teardown(api: &http::Client, zone: &str, s: &Server) -> Result<&'static str, ProviderError> {
    for ip in s.flexible_ips() {
        api::remove(api, zone, &format!("/ips/{ip}"))?;
    }
    match s.state.as_str() {
        "running" | "starting" => SCW.removed(api::action(api, zone, &s.id, "terminate")).map(|_| "terminate started"),
        "stopped" | "stopped in place" => {
            api::remove(api, zone, &format!("/servers/{}", s.id))?;
            for v in s.local_volumes() {
                api::remove(api, zone, &format!("/volumes/{v}"))?;
            }
            Ok("deleted with its volumes")
        }
        _ => Ok("still stopping; deleted by a later call"),
    }
}

/// The hourly price of a placement, from the zone's catalogue: checked as a create checks it (a placement create
/// would refuse is refused here the same way), then the commercial type's `hourly_price` in euros. `None` when the
/// zone does not sell the type.
fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let (zone, commercial_type, _) = cfg.resolve(p)?;
    let price = api::hourly_price(&api::client(&cfg)?, zone, commercial_type)?
        .and_then(egress_guest_sdk::money::micros_from_float);
    let price = price.map(|micros_per_hour| Price { currency: "EUR".into(), micros_per_hour });
    let what = match &price {
        Some(pr) => format!("{commercial_type} in {zone}: {} micro-EUR an hour", pr.micros_per_hour),
        None => format!("{commercial_type} in {zone}: not sold there, no price"),
    };
    Ok((price, what))
}

/// One cheap authenticated read per zone, with the key, verb and scope GC uses.
fn probe(api: &http::Client, cfg: &Config, zone: &str) -> TargetStatus {
    let managed = http::encode_component(&config::tag(MARK_MANAGED, MARK_MANAGED_YES));
    let url = api::path(zone, &format!("/servers?project={}&tags={managed}&per_page=1", cfg.project_id));
    match api.get(&url).send_ok() {
        Ok(r) => {
            let total = r.header("x-total-count").map(|v| String::from_utf8_lossy(v).into_owned());
            TargetStatus::ready(zone, total.map(|t| ("managedServers".to_string(), t)).into_iter().collect())
        }
        Err(e) => TargetStatus::failed(zone, SCW.reason_of(&e), classify(e).message),
    }
}

impl Provider for Scaleway {
    /// Create and delete at info (a few per Proxy), the polled get and list at debug.
    const OUTCOMES: Outcomes = Outcomes { plugin: "scaleway", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            default_hosts: vec!["https://api.scaleway.com:443".to_string()],
            ..PluginInfo::new("scaleway", env!("CARGO_PKG_VERSION"))
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
        outcome::run(|| {
            let (zone, key) = ID.parse(id)?;
            let Some(s) = api::fetch(&api::client(&cfg()?)?, zone, key)? else {
                return Err(ProviderError::not_found(format!("server {key} does not exist")).with_code("not_found"));
            };
            locked(&s)?;
            let inst = to_instance(zone, &s);
            Ok((inst.clone(), format!("{:?} (state {})", inst.state, s.state)))
        })
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        outcome::run(|| {
            let (zone, key) = ID.parse(id)?;
            let api = api::client(&cfg()?)?;
            let Some(s) = api::fetch(&api, zone, key)? else { return Ok(((), "already gone".into())) };
            locked(&s)?;
            Ok(((), teardown(&api, zone, &s)?.to_string()))
        })
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        outcome::run(|| {
            let cfg = cfg()?;
            let api = api::client(&cfg)?;
            let (managed, ours) = (config::tag(MARK_MANAGED, MARK_MANAGED_YES), config::installation_tag(installation));
            let query =
                format!("project={}&tags={}", cfg.project_id, http::encode_component(&format!("{managed},{ours}")));
            let mut out = Vec::new();
            for zone in &cfg.zones {
                // Filtered again: a backend that ignored the filter must not hand this
                // installation another one's servers to collect.
                let mine =
                    |s: Server| (s.tags.contains(&managed) && s.tags.contains(&ours)).then(|| to_instance(zone, &s));
                out.extend(api::list(&api, zone, &query, mine)?);
            }
            let what = format!("{} managed servers", out.len());
            Ok((out, what))
        })
    }

    fn quote(placement: Placement) -> Result<Option<Price>, ProviderError> {
        outcome::keep(quote(&placement))
    }

    fn check() -> Vec<TargetStatus> {
        match cfg() {
            Ok(cfg) => check_each(&cfg.zones, api::client(&cfg), |api, zone| probe(api, &cfg, zone)),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
