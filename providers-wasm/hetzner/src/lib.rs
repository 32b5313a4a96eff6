//! Hetzner Cloud provider: each egress proxy is a Hetzner Cloud server.
//!
//! Config and placement are in [`config`], identity (labels, selectors, IDs) in [`marks`],
//! the API and the one classify function in [`api`], status mapping in [`state`]. This
//! file is the contract, operation by operation; docs/providers/hetzner.md is the user's
//! guide and explains every choice of the behaviour profile below.

mod api;
mod config;
mod marks;
mod state;

use api::{HZ, Server, classify, client, fetch_server, find_by_name, is_not_found};
use config::Config;
use data_encoding::BASE64;
#[cfg(feature = "export")]
use egress_guest_sdk::export_provider;
use egress_guest_sdk::http::{Client, encode_component};
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::time::{now, parse_rfc3339};
use egress_guest_sdk::{
    self as sdk, CreateRequest, ErrorClass, Instance, Level, MARK_MANAGED, MARK_MANAGED_YES,
    MARK_UID, Placement, PluginInfo, Price, Provider, ProviderError, State, TargetStatus,
};
use marks::{MARK_LOCATION, format_id, parse_id};
use serde_json::json;
use state::StartAction;

/// The provider. Public so that a test plugin can wrap it (see the `export` feature).
pub struct Hetzner;
#[cfg(feature = "export")]
export_provider!(Hetzner);

/// The public API, the only host a default install may reach.
const DEFAULT_HOST: &str = "https://api.hetzner.cloud:443";

/// Hetzner's limit on `user_data` (32 KiB), checked before the call so the user gets a
/// message naming the size instead of an `invalid_input` about a field.
const USER_DATA_MAX: usize = 32 * 1024;

/// How long the `start_server` action ID of a new server is kept. Far longer than any
/// start takes; after it, [`state::off_is_starting`] falls back to the server's age.
const START_ACTION_TTL_SECS: u32 = 3600;

/// The behaviour profile (provider contract section 4), one `axis=code` per word; the
/// guide's "Behaviour profile" section gives the reason for each.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp list-partial=fail-whole \
    quota=detected not-found=status-404 primary-key=allocated-id provisioning-state=native \
    async-ops=backend-lock secondary-resources=cascade credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Hetzner Cloud's documented default of 3,600 requests an hour per project (one a second);
/// a burst of 100 keeps an operator restart from spending more of the project's requests at once.
const BUDGET: (u32, u32) = (3_600, 100);

fn cfg() -> Result<Config, ProviderError> {
    config::parse(&sdk::config())
}

/// Hetzner takes `user_data` as a JSON string, so bytes that are not UTF-8 cannot travel
/// as they are. They are sent base64-encoded instead: cloud-init's Hetzner datasource
/// base64-decodes user data it can decode, so the guest still receives the original
/// bytes. UTF-8 user data is sent untouched.
fn user_data(cloud_init: &[u8]) -> Result<Option<String>, ProviderError> {
    if cloud_init.is_empty() {
        return Ok(None);
    }
    let (text, how) = match std::str::from_utf8(cloud_init) {
        Ok(s) => (s.to_string(), "as is"),
        Err(_) => (
            BASE64.encode(cloud_init),
            "base64-encoded, since it is not UTF-8",
        ),
    };
    if text.len() > USER_DATA_MAX {
        let note = format!(" ({} bytes {how})", text.len());
        let err = ProviderError::user_data_too_large(cloud_init.len(), USER_DATA_MAX, &note);
        return Err(err);
    }
    Ok(Some(text))
}

fn to_instance(s: &Server, id: String) -> Instance {
    let ipv6 = s.ipv6();
    Instance {
        id,
        ip: s.ipv4().to_string(),
        state: state::base_state(&s.status, !s.ipv4().is_empty() || !ipv6.is_empty()),
        ipv6,
        uid: s.labels.get(MARK_UID).cloned().unwrap_or_default(),
        created_at: parse_rfc3339(&s.created),
        ..Instance::empty()
    }
}

/// The location for a server's ID: the one Hetzner reports, else the one asked for.
fn location_of<'a>(s: &'a Server, fallback: &'a str) -> &'a str {
    s.location()
        .filter(|l| config::is_location(l))
        .unwrap_or(fallback)
}

/// The existing server called `req.name`, if it is this Proxy's. Someone else's is
/// permanent: the name is derived from the UID, so a different UID there is a collision
/// the operator cannot resolve by retrying.
fn adopt(s: &Server, req: &CreateRequest, location: &str) -> Result<String, ProviderError> {
    let uid = s
        .labels
        .get(MARK_UID)
        .map(String::as_str)
        .unwrap_or_default();
    if uid != req.uid {
        let holder = format!("server {}", s.id);
        return Err(ProviderError::name_taken(&s.name, &holder, uid, &req.uid));
    }
    if s.status == "deleting" {
        // Adopting a dying server would only make the reconciler wait for it and create
        // again; say so and let it retry once the name is free.
        let msg = format!(
            "server {:?} (id {}) is still being deleted; the name is free once it is gone",
            s.name, s.id
        );
        return Err(ProviderError::transient(msg).with_code("NameBeingDeleted"));
    }
    Ok(format_id(location_of(s, location), s.id))
}

fn start_key(server_id: u64) -> String {
    format!("start-action/{server_id}")
}

/// Keep the `start_server` action where `get` can find it: it is what tells "created, not
/// started yet" from "stopped" while the new server is `off`.
fn remember_start(created: &api::Created) {
    let start = created
        .action
        .iter()
        .chain(&created.next_actions)
        .find(|a| a.command == "start_server");
    if let Some(a) = start {
        sdk::cache_set(
            &start_key(created.server.id),
            a.id.to_string().as_bytes(),
            START_ACTION_TTL_SECS,
        );
    }
}

/// An action of the create answer that has already failed, as an error of the class its
/// code has. Hetzner normally answers with running actions; one that is already `error`
/// will not recover, and reporting it beats waiting for `get` to find out.
fn failed_action(created: &api::Created) -> Option<ProviderError> {
    let a = created
        .action
        .iter()
        .chain(&created.next_actions)
        .find(|a| a.status == "error")?;
    let (code, message) = a
        .error
        .as_ref()
        .map(|e| (e.code.as_str(), e.message.as_str()))
        .unwrap_or(("action_failed", ""));
    // Only the code counts (an action has no status), so never not-found.
    let class = HZ.kind(None, Some(code)).class();
    let msg = format!(
        "Hetzner accepted server {} but its {} action failed: {code}: {message}",
        created.server.id, a.command
    );
    Some(ProviderError::new(class, msg).with_code(code))
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(&req.placement)?;
    let labels = marks::create_labels(&req.uid, &req.installation, place.location)?;
    let user_data = user_data(&req.cloud_init)?;
    let api = client(&cfg.endpoint)?;

    // Idempotent by name, without a lookup first: Hetzner refuses a second server under a
    // name (`uniqueness_error`), and only then is the existing one looked up and adopted
    // below. A crash after the create call, or a lost status write, lands there; the
    // common case costs one request of the budget rather than two (a rollout's floor).
    let mut body = json!({
        "name": req.name,
        "server_type": place.server_type,
        "image": place.image,
        "location": place.location,
        "start_after_create": true,
        "labels": labels,
        // The egress address is the server's public IPv4; IPv6 comes free and is
        // removed with the server like the IPv4.
        "public_net": {"enable_ipv4": true, "enable_ipv6": true},
    });
    if let Some(ud) = &user_data {
        body["user_data"] = json!(ud);
    }
    if !cfg.firewall_ids.is_empty() {
        body["firewalls"] = cfg
            .firewall_ids
            .iter()
            .map(|id| json!({ "firewall": id }))
            .collect();
    }
    if !cfg.network_ids.is_empty() {
        body["networks"] = json!(cfg.network_ids);
    }
    if !cfg.ssh_keys.is_empty() {
        body["ssh_keys"] = json!(cfg.ssh_keys);
    }

    let answer = api
        .post("/servers")
        .json(&body)
        .send_ok()
        .and_then(|r| r.json::<api::Created>());
    match answer {
        Ok(created) => {
            remember_start(&created);
            if let Some(err) = failed_action(&created) {
                return Err(err);
            }
            let id = format_id(
                location_of(&created.server, place.location),
                created.server.id,
            );
            let what = format!(
                "created {id} ({} / {}, user data {} bytes)",
                place.server_type,
                place.image,
                req.cloud_init.len()
            );
            Ok((id, what))
        }
        // The name is taken: an earlier create of ours (a crash or a lost status write
        // since, a retried reconcile, a second replica), or someone else's server. Adopt
        // it if it is ours.
        Err(e) if HZ.has_code(&e, "uniqueness_error") => match find_by_name(&api, &req.name)? {
            Some(s) => {
                adopt(&s, req, place.location).map(|id| (id, "adopted the existing server".into()))
            }
            None => {
                let msg = format!(
                    "name {:?} was taken, but no server has it now; retrying will tell",
                    req.name
                );
                Err(ProviderError::transient(msg).with_code("uniqueness_error"))
            }
        },
        Err(e) => Err(api::not_gone(
            e,
            "check config.endpoint and the firewall, network and SSH key IDs in the config",
        )),
    }
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let (_, server_id) = parse_id(id)?;
    let api = client(&cfg()?.endpoint)?;
    let Some(server) = fetch_server(&api, server_id)? else {
        let msg = format!("server {server_id} does not exist");
        return Err(ProviderError::not_found(msg).with_code("not_found"));
    };
    let mut inst = to_instance(&server, id.to_string());
    if server.status == "off" && off_is_starting(&api, &server) {
        inst.state = State::Provisioning;
    }
    let what = format!(
        "{:?} (status {}{})",
        inst.state,
        server.status,
        if server.locked { ", locked" } else { "" }
    );
    Ok((inst, what))
}

/// See [`state::off_is_starting`]; this gathers its evidence. Failing to read the action
/// is not an error: the age rule still answers.
fn off_is_starting(api: &Client, s: &Server) -> bool {
    let cached = sdk::cache_get(&start_key(s.id))
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|v| v.parse::<u64>().ok());
    let status = cached.and_then(|action| {
        let path = format!("/servers/{}/actions/{action}", s.id);
        api.get_json::<api::ActionEnvelope>(&path)
            .ok()
            .map(|env| env.action.status)
    });
    let start = status
        .as_deref()
        .map_or(StartAction::Unknown, StartAction::Status);
    let age = parse_rfc3339(&s.created).map(|c| now().seconds.saturating_sub(c.seconds));
    state::off_is_starting(s.locked, start, age)
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let (_, server_id) = parse_id(id)?;
    let api = client(&cfg()?.endpoint)?;
    let Some(server) = fetch_server(&api, server_id)? else {
        return Ok(((), "already gone".into()));
    };
    let leftovers = cascade_primary_ips(&api, &server)?;
    let what = if server.status == "deleting" {
        "already being deleted"
    } else {
        delete_server(&api, server_id)?
    };
    release_primary_ips(&api, &leftovers)?;
    Ok(((), what.to_string()))
}

fn delete_server(api: &Client, server_id: u64) -> Result<&'static str, ProviderError> {
    match api.delete(&format!("/servers/{server_id}")).send_ok() {
        Ok(_) => Ok("delete started"),
        Err(e) if is_not_found(&e) => Ok("already gone"),
        // Another delete (GC racing the reconciler) holds the lock with its own action;
        // any other action holding it makes this worth retrying, not giving up.
        Err(e) if HZ.has_code(&e, "locked") => match fetch_server(api, server_id)? {
            None => Ok("already gone"),
            Some(s) if s.status == "deleting" => Ok("already being deleted"),
            Some(_) => Err(classify(e)),
        },
        Err(e) => Err(classify(e)),
    }
}

/// Make sure the server's Primary IPs go with it, returning those that must be deleted
/// explicitly afterwards.
///
/// Hetzner creates them with `auto_delete` on, so this normally costs one read each. One
/// whose flag was switched off is switched back on before the server goes, so the
/// cascade holds however long the delete takes; if that is refused, it is deleted
/// explicitly once the server has let go of it.
fn cascade_primary_ips(api: &Client, s: &Server) -> Result<Vec<u64>, ProviderError> {
    let mut explicit = Vec::new();
    for ip in s.primary_ip_ids() {
        let path = format!("/primary_ips/{ip}");
        let auto_delete = match api.get_json::<api::PrimaryIpEnvelope>(&path) {
            Ok(env) => env.primary_ip.auto_delete,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(classify(e)),
        };
        if auto_delete {
            continue;
        }
        match api.put(&path).json(&json!({"auto_delete": true})).send_ok() {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                sdk::debug!(
                    "hetzner delete: primary IP {ip} refused auto_delete ({}); deleting it explicitly",
                    e.code_name()
                );
                explicit.push(ip);
            }
        }
    }
    Ok(explicit)
}

/// Delete Primary IPs the cascade will not take. Still assigned means the server is not
/// gone yet: transient, so the operator calls delete again.
fn release_primary_ips(api: &Client, ips: &[u64]) -> Result<(), ProviderError> {
    for ip in ips {
        match api.delete(&format!("/primary_ips/{ip}")).send_ok() {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                let err = classify(e);
                sdk::warn!(
                    "hetzner delete: primary IP {ip} not deleted yet: {}",
                    err.message
                );
                let msg = format!(
                    "primary IP {ip} of the server could not be deleted yet: {}",
                    err.message
                );
                return Err(ProviderError {
                    class: ErrorClass::Transient,
                    message: msg,
                    ..err
                });
            }
        }
    }
    Ok(())
}

/// Every managed server of `installation`; with `since` (seconds since the epoch), those
/// created in or after that second and few others (see [`api::list_servers`]).
fn list_by_tag(
    installation: &str,
    since: Option<u64>,
) -> Result<(Vec<Instance>, String), ProviderError> {
    let api = client(&cfg()?.endpoint)?;
    let out = api::list_servers(&api, &marks::gc_selector(installation), since, |s| {
        if !marks::is_gc_match(&s.labels, installation) {
            return None;
        }
        match s.location().filter(|l| config::is_location(l)) {
            Some(location) => Some(to_instance(&s, format_id(location, s.id))),
            // Leaving one out is safe (GC never deletes what it does not see).
            None => {
                sdk::warn!(
                    "hetzner list: skipping server {} ({:?}): the answer names no location",
                    s.id,
                    s.name
                );
                None
            }
        }
    })?;
    let what = format!("{} managed servers", out.len());
    Ok((out, what))
}

/// The hourly price of a placement from Hetzner's catalogue (`GET /server_types?name=`):
/// the net price in the placement's location, in euros (Hetzner prices in EUR). Checked as
/// a create checks it, so a placement create would refuse is refused here the same way.
fn quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = cfg()?;
    let place = cfg.resolve(p)?;
    let api = client(&cfg.endpoint)?;
    let path = format!("/server_types?name={}", encode_component(place.server_type));
    let types: api::ServerTypes = api
        .get(&path)
        .send_ok()
        .and_then(|r| r.json())
        .map_err(classify)?;
    let price = types
        .server_types
        .iter()
        .filter(|t| t.name == place.server_type)
        .flat_map(|t| &t.prices)
        .find(|l| l.location == place.location)
        .and_then(|l| egress_guest_sdk::money::micros_from_decimal(&l.price_hourly.net))
        .map(|micros_per_hour| Price {
            currency: "EUR".into(),
            micros_per_hour,
        });
    let what = match &price {
        Some(pr) => format!(
            "{} in {}: {} micro-EUR an hour",
            place.server_type, place.location, pr.micros_per_hour
        ),
        None => format!(
            "{} in {}: no price listed",
            place.server_type, place.location
        ),
    };
    Ok((price, what))
}

/// One cheap authenticated read per location, with the same token, verb and scope as GC's
/// list; the count of managed servers there is a triage detail.
fn probe(api: &Client, location: &str) -> TargetStatus {
    let selector = marks::selector(&[(MARK_MANAGED, MARK_MANAGED_YES), (MARK_LOCATION, location)]);
    let path = format!(
        "/servers?label_selector={}&per_page=1",
        encode_component(&selector)
    );
    let answer = api.get(&path).send_ok();
    let result = answer.and_then(|r| Ok((r.json::<api::ServerList>()?, r)));
    match result {
        Ok((list, r)) => {
            let mut details = Vec::new();
            if let Some(n) = list
                .meta
                .and_then(|m| m.pagination)
                .and_then(|p| p.total_entries)
            {
                details.push(("managedServers".to_string(), n.to_string()));
            }
            if let Some(left) = r.header("ratelimit-remaining") {
                details.push((
                    "rateLimitRemaining".to_string(),
                    String::from_utf8_lossy(left).into_owned(),
                ));
            }
            TargetStatus::ready(location, details)
        }
        Err(e) => TargetStatus::failed(location, HZ.reason_of(&e), classify(e).message),
    }
}

impl Provider for Hetzner {
    /// One debug line per operation outcome: what happened, never tokens or user data.
    const OUTCOMES: Outcomes = Outcomes {
        plugin: "hetzner",
        changes: Level::Debug,
        reads: Level::Debug,
    };
    /// Every server gets a /64 (`enable_ipv6`), and its IPv4 too: an IPv6 Proxy's
    /// instance still reaches IPv4-only sites.
    const IPV6: bool = true;

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            default_hosts: vec![DEFAULT_HOST.to_string()],
            ..PluginInfo::new("hetzner", env!("CARGO_PKG_VERSION"))
                .with_profile(PROFILE)
                .with_budget(BUDGET.0, BUDGET.1)
        }
    }

    fn quote(placement: Placement) -> Result<Option<Price>, ProviderError> {
        outcome::keep(quote(&placement))
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
        outcome::keep(list_by_tag(installation, None))
    }

    /// Hetzner sorts servers by `created` (to the second), so a list of the newest stops
    /// at the first page that reaches older ones.
    const LISTS_RECENT: bool = true;

    fn list_recent(
        installation: &str,
        since: egress_guest_sdk::Datetime,
    ) -> Result<Vec<Instance>, ProviderError> {
        outcome::keep(list_by_tag(installation, Some(since.seconds)))
    }

    fn check() -> Vec<TargetStatus> {
        match cfg() {
            // No usable token: every location fails the same way, and no request is made.
            Ok(cfg) => sdk::check_each(&cfg.locations, client(&cfg.endpoint), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
