//! The Scaleway Instances API as this plugin uses it: the JSON it reads, the one table
//! that turns failures into error classes, and the requests every operation shares.

use crate::config::Config;
use egress_guest_sdk::ProviderError;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Method, Timeouts, encode_component};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::{Bounds, Page};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// The largest page the API serves.
const PER_PAGE: u64 = 100;
/// 100,000 servers per zone: a listing that never ends fails instead of pinning GC.
const PAGES: Bounds = Bounds { what: "Scaleway server list", max_pages: 1000, max_items: 100_000 };
/// A zone sells about a hundred commercial types; twenty pages leave room and still end a listing that loops.
const PRODUCT_PAGES: Bounds = Bounds { what: "Scaleway server type list", max_pages: 20, max_items: 2_000 };

/// Per request, well inside the host's per-call deadline and the 10 s poll.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(5)),
    first_byte: Some(Duration::from_secs(20)),
    between_bytes: Some(Duration::from_secs(10)),
};

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Server {
    pub id: String,
    pub name: String,
    /// `running`, `stopped`, `stopped in place`, `starting`, `stopping` or `locked`.
    pub state: String,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
    pub creation_date: String,
    #[serde(deserialize_with = "nullable")]
    pub public_ips: Vec<ServerIp>,
    /// Deprecated in favour of `public_ips`; read when an answer has only this.
    pub public_ip: Option<ServerIp>,
    /// `{"0": {"id", "volume_type"}, ...}`.
    pub volumes: Value,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct ServerIp {
    pub id: String,
    pub address: String,
    pub dynamic: bool,
    pub family: String,
}

impl Server {
    fn ips(&self) -> impl Iterator<Item = &ServerIp> {
        let fallback = self.public_ips.is_empty().then_some(self.public_ip.as_ref()).flatten();
        self.public_ips.iter().chain(fallback)
    }

    /// The public IPv4 proxies are reached on.
    pub fn ipv4(&self) -> &str {
        let v4 = |i: &&ServerIp| matches!(i.family.as_str(), "" | "inet") && !i.address.contains(':');
        self.ips().find(v4).map_or("", |i| i.address.as_str())
    }

    /// Flexible IPs: separate resources that outlive the server unless released.
    pub fn flexible_ips(&self) -> Vec<String> {
        self.ips().filter(|i| !i.dynamic && !i.id.is_empty()).map(|i| i.id.clone()).collect()
    }

    /// Local volumes, which a plain `DELETE` of the server keeps.
    pub fn local_volumes(&self) -> Vec<String> {
        let vols = self.volumes.as_object().into_iter().flat_map(|m| m.values());
        vols.filter(|v| v["volume_type"] == "l_ssd").filter_map(|v| Some(v["id"].as_str()?.to_string())).collect()
    }
}

#[derive(Deserialize)]
pub struct ServerEnvelope {
    pub server: Server,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ServerList {
    #[serde(deserialize_with = "nullable")]
    servers: Vec<Server>,
}

/// The classes, from the error types of the API reference and the SDK (`scw/errors.go`).
/// Errors are `{"type": ..., "message": ...}`; the type is more precise than the status (a
/// quota is a 403 like a permission), so types come first, then statuses; a 404 without the
/// envelope (a proxy's page) is not in the table: transient, "cannot tell", never "gone".
#[rustfmt::skip]
pub const SCW: Classifier = Classifier {
    backend: "Scaleway",
    code_at: "/type",
    message_at: "/message",
    rules: &[
        Rule::status_code(404, "not_found", Kind::Gone),
        Rule::status_code(404, "unknown_resource", Kind::Gone),
        Rule::codes(&["quotas_exceeded", "out_of_stock"], Kind::Quota),
        Rule::status(429, Kind::RateLimited),
        // Busy: an action runs, or the server is locked; passes by itself.
        Rule::codes(&["locked", "transient_state", "precondition_failed"], Kind::Conflict),
        Rule::codes(&["internal_error", "service_unavailable"], Kind::Retryable),
        Rule::code("denied_authentication", Kind::Auth),
        Rule::code("permissions_denied", Kind::Forbidden),
        Rule::codes(&["invalid_arguments", "invalid_request_error", "resource_expired"], Kind::Invalid),
        Rule::status(404, Kind::Gone).from_backend(),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::status(409, Kind::Conflict),
        Rule::status(400, Kind::Invalid),
        Rule::statuses(405, 422, Kind::Invalid),
    ],
};

pub fn classify(e: HttpError) -> ProviderError {
    SCW.classify(e)
}

/// For calls where "not found" cannot mean "the instance is gone" (lists, creates): a
/// missing image or zone is permanent. `hint` says what to check.
pub fn not_gone(e: HttpError, hint: &str) -> ProviderError {
    classify(e).not_found_is_permanent(hint)
}

/// A client for the configured endpoint. The secret key is read on every call, so a
/// rotated Secret takes effect at the next call.
pub fn client(cfg: &Config) -> Result<Client, ProviderError> {
    let key = egress_guest_sdk::secret_string("secretKey")?;
    Ok(Client::new(&cfg.endpoint).header("x-auth-token", key).header("accept", "application/json").timeouts(TIMEOUTS))
}

/// `/instance/v1/zones/{zone}{rest}`.
pub fn path(zone: &str, rest: &str) -> String {
    format!("/instance/v1/zones/{zone}{rest}")
}

/// `GET /servers/{id}`; `None` when Scaleway says it does not exist.
pub fn fetch(api: &Client, zone: &str, id: &str) -> Result<Option<Server>, ProviderError> {
    let answer = api.get(&path(zone, &format!("/servers/{id}"))).send_json::<ServerEnvelope>();
    Ok(SCW.found(answer)?.map(|env| env.server))
}

/// The `hourly_price` (euros, a JSON float) of `commercial_type` in `zone`, from the zone's catalogue `GET
/// /products/servers` (the SDK's `ListServersTypes`: `servers` maps each commercial type to its `ServerType`), page
/// by page to `total_count` (the SDK's count; `X-Total-Count` when an answer has none). `None` when the zone does
/// not sell the type or states no price for it.
pub fn hourly_price(api: &Client, zone: &str, commercial_type: &str) -> Result<Option<f64>, ProviderError> {
    let fetch = |page: &u64| {
        let url = path(zone, &format!("/products/servers?per_page={PER_PAGE}&page={page}"));
        let resp = api.get(&url).send_ok().map_err(|e| not_gone(e, "check config.endpoint and config.zones"))?;
        let mut body: Value = resp.json().map_err(classify)?;
        let items: Vec<(String, Value)> = match body["servers"].take() {
            Value::Object(types) => types.into_iter().collect(),
            _ => Vec::new(),
        };
        let total = body["total_count"].as_u64().or_else(|| total_count(&resp));
        let seen = (page - 1) * PER_PAGE + items.len() as u64;
        let more = !items.is_empty() && total.map_or(items.len() as u64 == PER_PAGE, |t| seen < t);
        Ok(Page { items, next: more.then_some(page + 1) })
    };
    let found =
        PRODUCT_PAGES.collect(1, fetch, |(name, t)| (name == commercial_type).then(|| t["hourly_price"].as_f64()));
    Ok(found?.into_iter().flatten().next())
}

fn total_count(resp: &egress_guest_sdk::http::Response) -> Option<u64> {
    resp.header("x-total-count").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
}

/// Every server of `zone` matching `query`, page by page to `X-Total-Count`, each passed
/// through `keep` as its page arrives. Fails whole: GC must not vouch for a partial list.
pub fn list<T>(
    api: &Client,
    zone: &str,
    query: &str,
    keep: impl FnMut(Server) -> Option<T>,
) -> Result<Vec<T>, ProviderError> {
    let fetch = |page: &u64| {
        let url = path(zone, &format!("/servers?{query}&per_page={PER_PAGE}&page={page}"));
        let hint = "no such collection: check config.endpoint and config.zones";
        let resp = api.get(&url).send_ok().map_err(|e| not_gone(e, hint))?;
        let total = total_count(&resp);
        let items = resp.json::<ServerList>().map_err(classify)?.servers;
        let seen = (page - 1) * PER_PAGE + items.len() as u64;
        let more = !items.is_empty() && total.map_or(items.len() as u64 == PER_PAGE, |t| seen < t);
        Ok(Page { items, next: more.then_some(page + 1) })
    };
    PAGES.collect(1, fetch, keep)
}

/// The servers called exactly `name` (the API's filter matches substrings), oldest
/// first: names are not unique, and the oldest is the one every caller agrees on.
pub fn by_name(api: &Client, cfg: &Config, zone: &str, name: &str) -> Result<Vec<Server>, ProviderError> {
    let query = format!("project={}&name={}", cfg.project_id, encode_component(name));
    let mut found = list(api, zone, &query, |s| (s.name == name).then_some(s))?;
    found.sort_by(|a, b| (&a.creation_date, &a.id).cmp(&(&b.creation_date, &b.id)));
    Ok(found)
}

/// A flexible IPv4 for a new server: one this Proxy reserved before and never attached (a
/// create cut off between the two calls) is reused, so retries do not pile up IPs.
pub fn reserve_ip(api: &Client, cfg: &Config, zone: &str, tags: &[String]) -> Result<String, ProviderError> {
    let uid_tag = encode_component(&tags[1]);
    let query = path(zone, &format!("/ips?project={}&tags={uid_tag}&per_page={PER_PAGE}", cfg.project_id));
    let free: Value = api.get_json(&query).map_err(|e| not_gone(e, "check config.zones"))?;
    let ips = free["ips"].as_array().into_iter().flatten();
    if let Some(id) = ips.filter(|ip| ip["server"].is_null()).find_map(|ip| ip["id"].as_str()) {
        return Ok(id.to_string());
    }
    let body = json!({"project": cfg.project_id, "type": "routed_ipv4", "tags": tags});
    let created: Value =
        api.post_json(&path(zone, "/ips"), &body).map_err(|e| not_gone(e, "check config.projectId"))?;
    let id = created["ip"]["id"].as_str().ok_or_else(|| ProviderError::transient("the new IP has no id"))?;
    Ok(id.to_string())
}

/// `DELETE` of `what` (an IP, a volume, a stopped server); already gone counts as done.
pub fn remove(api: &Client, zone: &str, what: &str) -> Result<(), ProviderError> {
    SCW.removed(api.delete(&path(zone, what)).send_ok()).map(drop)
}

/// `POST .../action`; the task it answers is not kept (the server's state says the rest).
pub fn action(api: &Client, zone: &str, id: &str, action: &str) -> Result<(), HttpError> {
    api.post(&path(zone, &format!("/servers/{id}/action"))).json(&json!({ "action": action })).send_ok().map(drop)
}

/// The cloud-init user data, as `text/plain`, byte for byte.
pub fn set_user_data(api: &Client, zone: &str, id: &str, data: &[u8]) -> Result<(), ProviderError> {
    let url = path(zone, &format!("/servers/{id}/user_data/cloud-init"));
    let req = api.request(Method::Patch, &url).header("content-type", "text/plain").body(data.to_vec());
    req.send_ok().map(drop).map_err(classify)
}
