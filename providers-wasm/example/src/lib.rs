//! Example provider for the example backend (`egress-emulators`): a complete plugin that
//! follows every rule of the provider contract, written to be copied.
//!
//! Config: `{"endpoint": "http://127.0.0.1:PORT", "regions": ["r1", ...]}`; secret
//! `token` (bearer). Placement zone, machine type and image are passed to the backend
//! unchecked: it accepts any value. Instance IDs are `<region>/<backend id>`.

use data_encoding::BASE64;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, encode_component};
use egress_guest_sdk::id::{IdFormat, is_word};
use egress_guest_sdk::outcome::{self, Outcomes};
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
    let mut cfg: Config = sdk::config::parse(json)?;
    cfg.endpoint = sdk::config::endpoint("endpoint", &cfg.endpoint, "")?;
    sdk::config::each("regions", &cfg.regions, |r| valid_token(r), "want 1-64 letters, digits or '-'")?;
    Ok(cfg)
}

fn valid_token(s: &str) -> bool {
    is_word(s, 64, b"-")
}

/// A client for the configured endpoint; the token is read on every call so a rotated
/// Secret takes effect at once.
fn client(cfg: &Config) -> Result<Client, ProviderError> {
    Ok(Client::new(&cfg.endpoint).bearer_auth(&secret_string("token")?))
}

fn api() -> Result<Client, ProviderError> {
    client(&parse_config(&config())?)
}

/// The one place that turns backend answers into error classes. The backend's errors are
/// `{"error": message, "code": code}`; first match wins, anything else is transient.
const CLASSIFIER: Classifier = Classifier {
    backend: "example",
    code_at: "/code",
    message_at: "/error",
    rules: &[
        Rule::status_code(404, "not_found", Kind::Gone), // the backend says: gone
        Rule::status(429, Kind::RateLimited),
        Rule::code("quota_exceeded", Kind::Quota),
        Rule::status(408, Kind::Retryable),
        Rule::status(409, Kind::Conflict), // locked or busy: try again
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::statuses(400, 499, Kind::Invalid), // bad request, wrong URL
    ],
};

fn classify(e: HttpError) -> ProviderError {
    CLASSIFIER.classify(e)
}

/// `<region>/<backend id>`, parsed strictly: a malformed ID is permanent.
const ID: IdFormat =
    IdFormat { shape: "<region>/<instance id>, e.g. r1/i-00000001", scope: valid_token, key: valid_token };

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
    Instance { id: ID.format(&w.region, &w.id), ip: w.ip, state, uid, created_at, ..Instance::empty() }
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
            let found = w.labels.get(MARK_UID).map_or("", String::as_str);
            Err(ProviderError::name_taken(name, &format!("instance {}", w.id), found, uid))
        }
    }
}

/// Proves reachability and auth per region with a cheap filtered list.
fn probe(api: &Client, region: &str) -> TargetStatus {
    let query = format!("/v1/instances?region={region}&label={}", label(MARK_MANAGED, MARK_MANAGED_YES));
    match api.get_json::<List>(&query) {
        Ok(l) => TargetStatus::ready(region, vec![("managed".into(), l.instances.len().to_string())]),
        Err(e) => TargetStatus::failed(region, CLASSIFIER.reason_of(&e), e.to_string()),
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
    /// One line per operation outcome, never the request (cloud-init) or the token: create and
    /// delete at info (a few per Proxy), the polled get and list at debug.
    const OUTCOMES: Outcomes = Outcomes { plugin: "example", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        // No default hosts: the endpoint differs per installation and is listed in the config.
        PluginInfo { has_check: true, ..PluginInfo::new("example", env!("CARGO_PKG_VERSION")).with_profile(PROFILE) }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        parse_config(config).map(drop)
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        outcome::run(|| {
            let cfg = parse_config(&config())?;
            let p = &req.placement;
            let region = sdk::config::one_of(PlacementField::Region, &p.region, &cfg.regions, "regions")?;
            let api = client(&cfg)?;
            if let Some(id) = find_by_name(&api, &req.name, &req.uid)? {
                return Ok((id, "adopted".to_string()));
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
                Ok(w) => Ok((to_instance(w).id, "created".to_string())),
                // A concurrent create won the race for the name: adopt it if it is ours.
                Err(e) if e.status() == Some(409) => match find_by_name(&api, &req.name, &req.uid)? {
                    Some(id) => Ok((id, "adopted after a concurrent create".to_string())),
                    None => Err(ProviderError::transient(format!("name {:?} is taken", req.name))),
                },
                Err(e) => Err(classify(e)),
            }
        })
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        outcome::run(|| {
            let (_, key) = ID.parse(id)?;
            api()?.get_json::<Wire>(&format!("/v1/instances/{key}")).map(to_instance).map_err(classify)
        })
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        outcome::run(|| {
            let (_, key) = ID.parse(id)?;
            match api()?.delete(&format!("/v1/instances/{key}")).send_ok() {
                Ok(_) => Ok(((), "deleting".into())), // 204 deleted, 202 a delete already in progress
                Err(e) if CLASSIFIER.is_gone(&e) => Ok(((), "already gone".into())), // counts as deleted
                Err(e) => Err(classify(e)),
            }
        })
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        outcome::run(|| {
            let (managed, ours) = (label(MARK_MANAGED, MARK_MANAGED_YES), label(MARK_INSTALLATION, installation));
            let found = list(&api()?, &format!("label={managed}&label={ours}"))?;
            // Filtered again here: a backend that ignored a filter must not hand this
            // installation another one's instances to collect.
            let mine = |w: &Wire| w.labels.get(MARK_INSTALLATION).is_some_and(|i| i == installation);
            Ok(found.into_iter().filter(mine).map(to_instance).collect::<Vec<_>>())
        })
    }

    fn check() -> Vec<TargetStatus> {
        match parse_config(&config()) {
            // No regions: nothing to check, so no secret read and no request.
            Ok(cfg) if cfg.regions.is_empty() => vec![],
            Ok(cfg) => check_each(&cfg.regions, client(&cfg), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
