//! Example provider for the example backend (`egress-emulators`): a complete plugin that
//! follows every rule of the provider contract, written to be copied.
//!
//! Config: `{"endpoint": "http://127.0.0.1:PORT", "regions": ["r1", ...]}`; secret
//! `token` (bearer). Placement zone, machine type and image are passed to the backend
//! unchecked: it accepts any value. Instance IDs are `<region>/<backend id>`.

use data_encoding::BASE64;
use egress_guest_sdk::http::{Client, HttpError, encode_component};
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{self as sdk, *};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;

struct Example;
export_provider!(Example);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    endpoint: String,
    regions: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Wire {
    id: String,
    name: String,
    ip: String,
    status: String,
    region: String,
    labels: BTreeMap<String, String>,
    created_at: String,
}

#[derive(Deserialize)]
struct List {
    instances: Vec<Wire>,
}

fn parse_config(json: &str) -> Result<Config, ProviderError> {
    let cfg: Config = sdk::host::parse_config(json)?;
    if !cfg.endpoint.starts_with("http://") && !cfg.endpoint.starts_with("https://") {
        let msg = format!("config.endpoint {:?} is not an http(s) URL", cfg.endpoint);
        return Err(ProviderError::permanent(msg));
    }
    match cfg.regions.iter().find(|r| !valid_token(r)) {
        Some(r) => Err(ProviderError::permanent(format!("config.regions entry {r:?} is invalid"))),
        None => Ok(cfg),
    }
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A client for the configured endpoint; the token is read on every call so a rotated
/// Secret takes effect at once.
fn client(cfg: &Config) -> Result<Client, ProviderError> {
    Ok(Client::new(&cfg.endpoint).bearer_auth(&secret_string("token")?))
}

fn api() -> Result<Client, ProviderError> {
    client(&parse_config(&config())?)
}

/// The backend's own error code: its errors are `{"error": message, "code": code}`.
fn backend_code(e: &HttpError) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        code: String,
    }
    match e {
        HttpError::Status { body, .. } => serde_json::from_slice::<Body>(body).ok().map(|b| b.code),
        _ => None,
    }
}

/// The one place that turns backend answers into error classes.
fn classify(e: HttpError) -> ProviderError {
    let code = backend_code(&e).unwrap_or_else(|| e.code_name());
    let msg = e.to_string();
    match (e.status(), code.as_str()) {
        (Some(404), "not_found") => ProviderError::not_found(msg), // the backend says: gone
        (Some(429), _) | (_, "quota_exceeded") => ProviderError::quota(msg),
        (Some(408 | 409), _) => ProviderError::transient(msg), // locked or busy: try again
        (Some(400..=499), _) => ProviderError::permanent(msg), // bad request, auth, wrong URL
        _ => ProviderError::transient(msg),                    // 5xx, transport errors
    }
    .with_code(code)
}

/// `<region>/<backend id>`, parsed strictly: a malformed ID is permanent.
fn split_id(id: &str) -> Result<&str, ProviderError> {
    match id.split_once('/') {
        Some((region, key)) if valid_token(region) && valid_token(key) => Ok(key),
        _ => Err(ProviderError::permanent(format!("malformed id {id:?}")).with_code("InvalidId")),
    }
}

fn to_instance(w: Wire) -> Instance {
    let state = match w.status.as_str() {
        "starting" => State::Provisioning,
        "running" if !w.ip.is_empty() => State::Running,
        "running" => State::Provisioning, // never Running without an IP
        "deleting" => State::Terminated,  // still there while a delete runs
        _ => State::Stopped,              // stopping, stopped, and anything unknown
    };
    let uid = w.labels.get(MARK_UID).cloned().unwrap_or_default();
    let created_at = parse_rfc3339(&w.created_at);
    Instance { id: format!("{}/{}", w.region, w.id), ip: w.ip, state, uid, created_at }
}

/// A server-side label filter `k=v`, encoded for the query string.
fn label(key: &str, value: &str) -> String {
    encode_component(&format!("{key}={value}"))
}

fn list(api: &Client, query: &str) -> Result<Vec<Wire>, ProviderError> {
    api.get_json::<List>(&format!("/v1/instances?{query}")).map(|l| l.instances).map_err(classify)
}

/// The instance already called `name`, if it is ours; someone else's is permanent.
fn find_by_name(api: &Client, name: &str, uid: &str) -> Result<Option<String>, ProviderError> {
    match list(api, &format!("name={}", encode_component(name)))?.into_iter().find(|w| w.name == name) {
        None => Ok(None),
        Some(w) if w.labels.get(MARK_UID).is_some_and(|u| u == uid) => Ok(Some(to_instance(w).id)),
        Some(w) => {
            let msg = format!("instance {:?} named {name:?} belongs to another uid", w.id);
            Err(ProviderError::permanent(msg).with_code("NameTaken"))
        }
    }
}

/// Proves reachability and auth per region with a cheap filtered list.
fn probe(api: &Client, region: &str) -> TargetStatus {
    let query = format!("/v1/instances?region={region}&label={}", label(MARK_MANAGED, MARK_MANAGED_YES));
    match api.get_json::<List>(&query) {
        Ok(l) => TargetStatus::ready(region, vec![("managed".into(), l.instances.len().to_string())]),
        Err(e) => TargetStatus::failed(region, e.reason(), e.to_string()),
    }
}

/// The behaviour profile (provider contract section 4), one `axis=code` per word.
const PROFILE: &str = "readiness=immediate create-return=submit delete-return=waits \
    ip-source=assigned-at-create gc-mark=native-labels created-at=backend-timestamp \
    list-partial=fail-whole quota=detected not-found=status-404 primary-key=allocated-id \
    provisioning-state=native async-ops=none secondary-resources=none \
    credentials=mounted-files client-kind=thin-client timeouts=per-call logging=outcome-only \
    child-spans=transport-wrapper backend-test=integration-tag";

impl Provider for Example {
    fn info() -> PluginInfo {
        // No default hosts: the endpoint differs per installation and is listed in the config.
        PluginInfo { has_check: true, ..PluginInfo::new("example", env!("CARGO_PKG_VERSION")).with_profile(PROFILE) }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        parse_config(config).map(drop)
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        let cfg = parse_config(&config())?;
        let (region, p) = (&req.placement.region, &req.placement);
        if !cfg.regions.contains(region) {
            let msg = format!("placement.region {region:?} is not one of {:?}", cfg.regions);
            return Err(ProviderError::permanent(msg).with_code("InvalidRegion"));
        }
        let api = client(&cfg)?;
        if let Some(id) = find_by_name(&api, &req.name, &req.uid)? {
            info!("adopted {id} for {}", req.name);
            return Ok(id);
        }
        let labels = BTreeMap::from([
            (MARK_MANAGED, MARK_MANAGED_YES),
            (MARK_UID, &req.uid),
            (MARK_INSTALLATION, &req.installation),
        ]);
        let body = json!({
            "name": req.name, "labels": labels, "user_data": BASE64.encode(&req.cloud_init),
            "region": region, "zone": p.zone, "machine_type": p.machine_type, "image": p.image,
            "port": req.port,
        });
        match api.post_json::<_, Wire>("/v1/instances", &body) {
            Ok(w) => {
                let id = to_instance(w).id;
                info!("created {id} for {}", req.name);
                Ok(id)
            }
            // A concurrent create won the race for the name: adopt it if it is ours.
            Err(e) if e.status() == Some(409) => find_by_name(&api, &req.name, &req.uid)?
                .ok_or_else(|| ProviderError::transient(format!("name {:?} is taken", req.name))),
            Err(e) => Err(classify(e)),
        }
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        let key = split_id(id)?;
        api()?.get_json::<Wire>(&format!("/v1/instances/{key}")).map(to_instance).map_err(classify)
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        let key = split_id(id)?;
        match api()?.delete(&format!("/v1/instances/{key}")).send().and_then(|r| r.error_for_status()) {
            Ok(_) => Ok(()), // 204 deleted, 202 a delete already in progress
            Err(e) => match classify(e) {
                e if matches!(e.class, ErrorClass::NotFound) => Ok(()), // already gone counts as deleted
                e => Err(e),
            },
        }
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        let (managed, ours) = (label(MARK_MANAGED, MARK_MANAGED_YES), label(MARK_INSTALLATION, installation));
        let found = list(&api()?, &format!("label={managed}&label={ours}"))?;
        // Filtered again here: a backend that ignored a filter must not hand this
        // installation another one's instances to collect.
        let mine = |w: &Wire| w.labels.get(MARK_INSTALLATION).is_some_and(|i| i == installation);
        Ok(found.into_iter().filter(mine).map(to_instance).collect())
    }

    fn check() -> Vec<TargetStatus> {
        let cfg = match parse_config(&config()) {
            Ok(cfg) => cfg,
            Err(e) => return vec![TargetStatus::failed("config", "InvalidConfig", e.message)],
        };
        if cfg.regions.is_empty() {
            return vec![]; // nothing to check: no secret read, no request
        }
        let api = client(&cfg);
        let target = |r: &String| match &api {
            Ok(api) => probe(api, r),
            Err(e) => TargetStatus::failed(r, "Unauthorized", &e.message),
        };
        cfg.regions.iter().map(target).collect()
    }
}

#[cfg(test)]
mod tests;
