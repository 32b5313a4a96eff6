//! An emulator of the Vultr API v2 instances endpoints, as the published reference
//! (`https://www.vultr.com/api/`, the OpenAPI document Vultr's generated clients ship)
//! describes them, for the `vultr` plugin and the conformance suite.
//!
//! API, under `/v2`, every call with `Authorization: Bearer <token>`:
//! - `POST /v2/instances` `{region, plan, os_id | iso_id | snapshot_id | app_id | image_id,
//!   label, hostname, tags, user_data (base64), ...}` -> `202 {"instance": ...}`, `pending`
//!   with `main_ip` `0.0.0.0`. Labels are **not** unique: Vultr accepts any number of
//!   instances with one label, and so does this emulator.
//! - `GET /v2/instances?per_page=&cursor=&label=&region=&main_ip=` -> `{"instances":
//!   [...], "meta": {"total", "links": {"next", "prev"}}}`, cursor paging: `per_page`
//!   defaults to 100, at most 500; `next` is an opaque cursor, `""` on the last page. Every
//!   filter must match. `tag` is `deprecated: true` in the reference (its list parameters
//!   are `per_page`, `cursor`, `tag`, `label`, `main_ip`, `region`; the instance's `tag`
//!   field says "Use `tags` instead", and no `tags` filter exists): the emulator ignores it,
//!   as it ignores any parameter the reference does not list, so a client that relies on it
//!   is shown every instance. A list touching a failing region answers 500.
//! - `GET /v2/instances/{id}` -> `{"instance": ...}`; `GET /v2/instances/{id}/user-data`
//!   -> `{"user_data": {"data": base64}}`.
//! - `DELETE /v2/instances/{id}` -> `204`; `400` while the instance is locked; `404` when
//!   it is unknown.
//! - `GET /v2/plans?type=&per_page=&cursor=` -> `{"plans": [...], "meta": {"total",
//!   "links": {"next", "prev"}}}`: the plans of [`VultrConfig::plans`] in ID order, each with
//!   the `plans` schema's fields (`id`, `vcpu_count`, `ram`, `disk`, `disk_count`,
//!   `bandwidth`, `monthly_cost`, `type`, `locations`), paged with the same cursors as the
//!   instance list. `type` keeps one plan type (`all`, or absent, keeps every one; the
//!   reference's `voc` group is not modelled); `os` is accepted and ignored. The reference
//!   (the OpenAPI document in github.com/vultr/vultr-python-client at 8cd1eaf3,
//!   `openapi-client/swagger.json`, `/plans` and `components/schemas/plans`; Vultr's Go
//!   client, github.com/vultr/govultr at 9ee451b0, `plans.go`, agrees) has **no hourly
//!   price**: `monthly_cost` (US dollars; `integer` in the reference, `float32` in govultr)
//!   is the only one, and
//!   Vultr's billing documentation makes the hourly rate the monthly price over 672 hours
//!   (730 for Cloud GPU). The reference marks `/plans` `security: []` (no token needed);
//!   the emulator, whose gate sees no path, still wants the token every client here sends.
//!
//! Errors are Vultr's envelope, `{"error": message, "status": code}`; Vultr has no error
//! codes. Unknown instance: `404 "instance not found"`. Rate limit: the reference documents
//! 30 requests a second per source IP, answered `429` (older Vultr docs said 503; the
//! current reference and its docs page say 429), and no rate-limit headers; enforced only
//! when set through the control surface. Faults: `server-error` 500, `quota` 400 with
//! Vultr's instance-limit message, `rate-limit` 429, `auth` 401.
//!
//! States (`status`): `pending` (no address: `main_ip` `0.0.0.0`, `server_status` `none`),
//! then `active` with `power_status` `running`, `server_status` `ok` and an address from
//! 203.0.113.0/24; a lock shows `server_status` `locked`. Vultr documents no deleting state
//! (its delete answers 204 and the instance goes): a slow delete from the control surface
//! shows the instance halted (`power_status` `stopped`, `server_status` `locked`) until it
//! goes. Built on [`crate::framework::Cloud`]: the control surface is the framework's.

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use data_encoding::{BASE64, BASE64URL_NOPAD};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

use crate::control::{FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{
    Adapter, Cloud, Deletion, Fleet, Record, Schedule, Served, Shared, States, marks,
};
use crate::real_proxy::RealProxies;

/// The regions a default emulator knows (a few of Vultr's region IDs).
pub const REGIONS: [&str; 4] = ["ewr", "fra", "ams", "sgp"];
/// Vultr's quota answer: a create over the account's instance limit.
pub const INSTANCE_LIMIT: &str =
    "Server add failed: You have reached the maximum number of active instances for this account.";

/// How the emulator is set up.
pub struct VultrConfig {
    pub token: String,
    pub regions: Vec<String>,
    /// When a `pending` instance becomes `active` (default: after one read).
    pub schedule: Schedule,
    /// Creates beyond this many instances answer 400 with [`INSTANCE_LIMIT`].
    pub instance_limit: Option<usize>,
    pub real_proxies: Option<Arc<RealProxies>>,
    pub rate_limit: Option<RateLimit>,
    /// `GET /v2/plans`: the catalogue, with the prices a test asserts.
    pub plans: Vec<PlanOffer>,
}

/// A plan of the catalogue: its ID, type, monthly price and where it is valid for use.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOffer {
    pub id: String,
    /// `vc2`, `vhf`, `vdc`, `vcg`, ...
    pub kind: String,
    /// US dollars a month, sent as a JSON number (an integer when it is whole).
    pub monthly_cost: f64,
    pub locations: Vec<String>,
}

impl PlanOffer {
    /// A plan whose type is the ID's first part (`vc2-1c-1gb` is a `vc2`).
    pub fn new(id: &str, monthly_cost: f64, locations: &[&str]) -> Self {
        PlanOffer {
            id: id.into(),
            kind: id.split('-').next().unwrap_or_default().into(),
            monthly_cost,
            locations: locations.iter().map(|l| l.to_string()).collect(),
        }
    }
}

impl VultrConfig {
    pub fn new(token: impl Into<String>) -> Self {
        VultrConfig {
            token: token.into(),
            regions: REGIONS.iter().map(|r| r.to_string()).collect(),
            schedule: Schedule::AfterReads(1),
            instance_limit: None,
            real_proxies: None,
            rate_limit: None,
            // Vultr's published monthly prices for these plans; the high-frequency one is not
            // sold in sgp, so a test has a plan without a price in a known region.
            plans: vec![
                PlanOffer::new("vc2-1c-1gb", 5.0, &REGIONS),
                PlanOffer::new("vc2-1c-2gb", 10.0, &REGIONS),
                PlanOffer::new("vhf-1c-1gb", 6.0, &["ewr", "fra", "ams"]),
            ],
        }
    }
}

/// What an instance holds beyond the framework's fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extra {
    pub plan: String,
    pub os_id: u64,
    pub hostname: String,
    /// The tags as Vultr keeps them (plain strings); the marks are `key=value` tags.
    pub tags: Vec<String>,
    pub firewall_group_id: String,
}

/// Vultr's error answer: `{"error": message, "status": code}`.
#[derive(Debug, Clone)]
pub struct VultrError {
    pub status: u16,
    pub message: String,
}

impl VultrError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        VultrError { status, message: message.into() }
    }

    fn body(&self) -> Value {
        json!({"error": self.message, "status": self.status})
    }
}

impl IntoResponse for VultrError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

impl From<VultrError> for Refusal {
    fn from(e: VultrError) -> Refusal {
        Refusal { status: e.status, body: e.body() }
    }
}

fn not_found() -> VultrError {
    VultrError::new(404, "instance not found")
}

fn bad_request(message: impl Into<String>) -> VultrError {
    VultrError::new(400, message)
}

/// The Vultr side of the framework.
pub struct Vultr {
    token: String,
    regions: Vec<String>,
    instance_limit: Option<usize>,
    /// Creates left that make their instance and then answer 500.
    fail_after_making: u32,
    plans: Vec<PlanOffer>,
}

impl Adapter for Vultr {
    type Extra = Extra;
    type Error = VultrError;
    const STATES: States =
        States { provisioning: "pending", running: "active", deleting: "active" };

    /// UUID-shaped, like Vultr's, counting up so a test can predict them.
    fn id(&self, n: u64) -> String {
        format!("{:08x}-0000-4000-8000-{n:012x}", n >> 16)
    }

    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", (n - 1) % 254 + 1)
    }

    fn default_scope(&self) -> String {
        self.regions.first().cloned().unwrap_or_else(|| "ewr".into())
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Extra, VultrError> {
        if !self.regions.iter().any(|r| r == scope) {
            return Err(bad_request(format!("Invalid region: {scope}")));
        }
        let tags = marks(plant).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        Ok(Extra {
            plan: "vc2-1c-1gb".into(),
            os_id: 2136,
            hostname: plant.name.clone(),
            tags,
            ..Extra::default()
        })
    }

    /// Only for plants: Vultr's own labels are not unique, but the conformance suite
    /// plants one instance per name.
    fn name_taken(&self) -> VultrError {
        bad_request("an instance with this label exists")
    }

    fn fault(&self, kind: &FaultKind) -> VultrError {
        match kind {
            FaultKind::Quota => bad_request(INSTANCE_LIMIT),
            FaultKind::RateLimit => VultrError::new(429, "Rate limit exceeded"),
            FaultKind::Auth => VultrError::new(401, "Invalid API token."),
            FaultKind::ServerError | FaultKind::Slow { .. } => {
                VultrError::new(500, "Internal server error")
            }
        }
    }

    /// `GET /v2/plans` is no instance operation: only `any` faults reach it.
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let rest = path.strip_prefix("/v2/instances");
        let one =
            rest.and_then(|r| r.strip_prefix('/')).filter(|r| !r.is_empty() && !r.contains('/'));
        let op = match (method.as_str(), rest, one) {
            ("POST", Some(""), _) => Some(FaultOp::Create),
            ("GET", Some(""), _) => Some(FaultOp::List),
            ("GET", _, Some(_)) => Some(FaultOp::Get),
            ("DELETE", _, Some(_)) => Some(FaultOp::Delete),
            _ => None,
        };
        let route = match rest.and_then(|r| r.strip_prefix('/')) {
            Some(r) => match r.split_once('/') {
                Some((_, sub)) => format!("/v2/instances/{{id}}/{sub}"),
                None => "/v2/instances/{id}".into(),
            },
            None => path.to_string(),
        };
        (op, format!("{method} {route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("Bearer {}", self.token);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> VultrError {
        VultrError::new(401, "Invalid API token.")
    }

    fn rate_limited(&self, _limit: RateLimit) -> VultrError {
        VultrError::new(429, "Rate limit exceeded")
    }

    fn reset(&mut self) {
        self.fail_after_making = 0;
    }
}

type Backend = Cloud<Vultr>;

/// A running Vultr emulator. Stops (closing every connection) when dropped.
pub type VultrEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on 127.0.0.1 with an OS-chosen port; the API is under `/v2`.
    pub fn start(cfg: VultrConfig) -> VultrEmulator {
        Self::start_on_port(cfg, 0).expect("bind 127.0.0.1:0")
    }

    /// Start on `127.0.0.1:port` (0: OS-chosen).
    pub fn start_on_port(cfg: VultrConfig, port: u16) -> std::io::Result<VultrEmulator> {
        let (listener, _) = crate::framework::bind(port)?;
        let fleet = Fleet::new(Vultr::STATES, cfg.schedule, cfg.real_proxies);
        let adapter = Vultr {
            token: cfg.token,
            regions: cfg.regions,
            instance_limit: cfg.instance_limit,
            fail_after_making: 0,
            plans: cfg.plans,
        };
        let state = Shared::new(Cloud::new(adapter, fleet, cfg.rate_limit));
        let api = Router::new()
            .route("/v2/instances", get(list_instances).post(create_instance))
            .route("/v2/instances/{id}", get(get_instance).delete(delete_instance))
            .route("/v2/instances/{id}/user-data", get(get_user_data))
            .route("/v2/plans", get(list_plans));
        let app = crate::framework::gated(api, &state);
        Ok(Served::serve("vultr-emulator", listener, state, app))
    }

    /// The instance as the API shows it (`None` when unknown).
    pub fn instance(&self, id: &str) -> Option<Value> {
        self.lock().fleet.get(id).map(render)
    }

    /// The next `count` calls of `op` answer `error`.
    pub fn inject_error(&self, op: FaultOp, error: VultrError, count: u32) {
        self.lock().traffic.faults.push(op, crate::framework::Effect::fail(error), count);
    }

    /// The next `count` creates make their instance, then answer `500 Internal server
    /// error`: a create whose answer is lost after the backend acted (a gateway's 5xx, a
    /// timeout), which the shared faults, answered before the API, cannot show.
    pub fn fail_creates_after_making(&self, count: u32) {
        self.lock().backend.fail_after_making = count;
    }
}

/// `2020-10-10T01:56:20+00:00`, as Vultr writes `date_created`.
fn vultr_time(secs: u64) -> String {
    crate::time::rfc3339(secs).replace('Z', "+00:00")
}

/// An instance as the API renders it, every documented field present.
pub fn render(r: &Record<Extra>) -> Value {
    let pending = r.state == Vultr::STATES.provisioning;
    let server_status = if r.deleting || r.locked {
        "locked"
    } else if pending {
        "none"
    } else {
        "ok"
    };
    let ip = r.ip.clone().unwrap_or_else(|| "0.0.0.0".into());
    let gateway = match ip.rsplit_once('.') {
        Some((net, _)) if ip != "0.0.0.0" => format!("{net}.1"),
        _ => "0.0.0.0".into(),
    };
    json!({
        "id": r.id, "os": "Debian 12 x64 (bookworm)", "ram": 1024, "disk": 25,
        "main_ip": ip, "vcpu_count": 1, "region": r.scope, "plan": r.extra.plan,
        "date_created": vultr_time(r.created_at), "status": r.state,
        "allowed_bandwidth": 1000, "netmask_v4": if r.ip.is_some() { "255.255.254.0" } else { "" },
        "gateway_v4": gateway, "power_status": if r.deleting { "stopped" } else { "running" },
        "server_status": server_status, "v6_network": "", "v6_main_ip": "", "v6_network_size": 0,
        "label": r.name, "internal_ip": "", "kvm": "", "hostname": r.extra.hostname,
        "os_id": r.extra.os_id, "app_id": 0, "image_id": "", "firewall_group_id": r.extra.firewall_group_id,
        "features": [], "tags": r.extra.tags, "user_scheme": "root",
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CreateBody {
    region: String,
    plan: String,
    os_id: Option<u64>,
    iso_id: Option<String>,
    snapshot_id: Option<String>,
    app_id: Option<u64>,
    image_id: Option<String>,
    label: String,
    hostname: String,
    tags: Vec<String>,
    user_data: Option<String>,
    firewall_group_id: String,
}

async fn create_instance(
    State(state): State<Shared<Backend>>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Response {
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return bad_request(format!("Invalid JSON: {}", e.body_text())).into_response(),
    };
    let mut b = state.lock();
    if !b.backend.regions.contains(&body.region) {
        return bad_request(format!("Invalid region: {:?}", body.region)).into_response();
    }
    if body.plan.is_empty() {
        return bad_request("Invalid plan").into_response();
    }
    let sources = [body.os_id.is_some(), body.iso_id.is_some(), body.snapshot_id.is_some()];
    if !sources.into_iter().chain([body.app_id.is_some(), body.image_id.is_some()]).any(|s| s) {
        return bad_request("You must choose an os_id, iso_id, snapshot_id, app_id or image_id")
            .into_response();
    }
    let user_data = match body.user_data.as_deref().map(|u| BASE64.decode(u.as_bytes())) {
        None => Vec::new(),
        Some(Ok(bytes)) => bytes,
        Some(Err(_)) => return bad_request("Invalid user_data: not base64").into_response(),
    };
    if b.backend.instance_limit.is_some_and(|max| b.fleet.iter().count() >= max) {
        return bad_request(INSTANCE_LIMIT).into_response();
    }
    let extra = Extra {
        plan: body.plan,
        os_id: body.os_id.unwrap_or_default(),
        hostname: body.hostname,
        tags: body.tags,
        firewall_group_id: body.firewall_group_id,
    };
    let mut record = Record::new(b.new_id(), body.label, body.region, extra);
    // The dump shows the marks as key/value pairs, as every emulator's does.
    record.labels = record
        .extra
        .tags
        .iter()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    record.user_data = user_data;
    let record = b.create(record);
    if b.backend.fail_after_making > 0 {
        b.backend.fail_after_making -= 1;
        return VultrError::new(500, "Internal server error").into_response();
    }
    (StatusCode::ACCEPTED, Json(json!({"instance": render(&record)}))).into_response()
}

/// A page cursor: the id the next page starts at, opaque to the client as Vultr's are.
fn cursor_of(id: &str) -> String {
    BASE64URL_NOPAD.encode(format!("next__{id}").as_bytes())
}

fn id_of(cursor: &str) -> Option<String> {
    let raw = BASE64URL_NOPAD.decode(cursor.as_bytes()).ok()?;
    String::from_utf8(raw).ok()?.strip_prefix("next__").map(str::to_string)
}

async fn list_instances(
    State(state): State<Shared<Backend>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let (mut per_page, mut start) = (100usize, None);
    let mut filters: Vec<(String, String)> = Vec::new();
    for (k, v) in query {
        match k.as_str() {
            "per_page" => match v.parse::<usize>() {
                Ok(n) if n > 0 => per_page = n.min(500),
                _ => return bad_request(format!("Invalid per_page: {v:?}")).into_response(),
            },
            "cursor" if v.is_empty() => {}
            "cursor" => match id_of(&v) {
                Some(id) => start = Some(id),
                None => return bad_request("Invalid cursor").into_response(),
            },
            "label" | "region" | "main_ip" => filters.push((k, v)),
            // Vultr ignores query parameters it does not know; `tag` is deprecated.
            _ => {}
        }
    }
    let b = state.lock();
    let matches = |r: &Record<Extra>| {
        filters.iter().all(|(k, v)| match k.as_str() {
            "label" => &r.name == v,
            "region" => &r.scope == v,
            _ => r.ip.as_deref() == Some(v.as_str()),
        })
    };
    let matched: Vec<&Record<Extra>> = b.fleet.iter().filter(|r| matches(r)).collect();
    if b.fleet.failing_scope(matched.iter().map(|r| r.scope.as_str())).is_some() {
        return VultrError::new(500, "Internal server error").into_response();
    }
    let total = matched.len();
    let from = start.map_or(0, |s| matched.iter().position(|r| r.id >= s).unwrap_or(total));
    let page = &matched[from..(from + per_page).min(total)];
    let next = matched.get(from + per_page).map_or(String::new(), |r| cursor_of(&r.id));
    let prev = if from == 0 {
        String::new()
    } else {
        cursor_of(&matched[from.saturating_sub(per_page)].id)
    };
    let instances: Vec<Value> = page.iter().map(|r| render(r)).collect();
    Json(json!({"instances": instances, "meta": {"total": total, "links": {"next": next, "prev": prev}}})).into_response()
}

/// `GET /v2/plans`: the catalogue in ID order, filtered by `type`, cursor-paged as the
/// instance list.
async fn list_plans(
    State(state): State<Shared<Backend>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let (mut per_page, mut start, mut kind) = (100usize, None, None);
    for (k, v) in query {
        match k.as_str() {
            "per_page" => match v.parse::<usize>() {
                Ok(n) if n > 0 => per_page = n.min(500),
                _ => return bad_request(format!("Invalid per_page: {v:?}")).into_response(),
            },
            "cursor" if v.is_empty() => {}
            "cursor" => match id_of(&v) {
                Some(id) => start = Some(id),
                None => return bad_request("Invalid cursor").into_response(),
            },
            "type" if v != "all" => kind = Some(v),
            _ => {}
        }
    }
    let b = state.lock();
    let mut plans: Vec<&PlanOffer> =
        b.backend.plans.iter().filter(|p| kind.as_ref().is_none_or(|k| &p.kind == k)).collect();
    plans.sort_by(|a, b| a.id.cmp(&b.id));
    let total = plans.len();
    let from = start.map_or(0, |s| plans.iter().position(|p| p.id >= s).unwrap_or(total));
    let next = plans.get(from + per_page).map_or(String::new(), |p| cursor_of(&p.id));
    let prev =
        if from == 0 { String::new() } else { cursor_of(&plans[from.saturating_sub(per_page)].id) };
    let page: Vec<Value> =
        plans[from..(from + per_page).min(total)].iter().map(|p| render_plan(p)).collect();
    Json(json!({"plans": page, "meta": {"total": total, "links": {"next": next, "prev": prev}}}))
        .into_response()
}

/// A plan as the reference's `plans` schema has it; the figures follow the ID's `<n>c` and
/// `<n>gb` parts, a whole monthly price goes out as an integer (the reference's type).
fn render_plan(p: &PlanOffer) -> Value {
    let part = |suffix: &str| {
        p.id.split('-').find_map(|s| s.strip_suffix(suffix)?.parse::<u64>().ok()).unwrap_or(1)
    };
    let monthly = if p.monthly_cost.fract() == 0.0 && p.monthly_cost.abs() < 1e15 {
        json!(p.monthly_cost as i64)
    } else {
        json!(p.monthly_cost)
    };
    json!({"id": p.id, "vcpu_count": part("c"), "ram": part("gb") * 1024, "disk": 25 * part("gb"),
           "disk_count": 1, "bandwidth": 1024 * part("gb"), "monthly_cost": monthly, "type": p.kind,
           "locations": p.locations})
}

async fn get_instance(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    let mut b = state.lock();
    let Some(instance) = b.fleet.get(&id).map(render) else {
        return not_found().into_response();
    };
    // The first read shows `pending`; a later one finds it active, like a fast cloud.
    b.saw(&id);
    Json(json!({ "instance": instance })).into_response()
}

async fn get_user_data(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    match state.lock().fleet.get(&id) {
        Some(r) => {
            Json(json!({"user_data": {"data": BASE64.encode(&r.user_data)}})).into_response()
        }
        None => not_found().into_response(),
    }
}

async fn delete_instance(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    match state.lock().fleet.delete(&id) {
        Deletion::NotFound => not_found().into_response(),
        Deletion::Locked => {
            bad_request("Unable to destroy server: Server is currently locked").into_response()
        }
        Deletion::InProgress(_) | Deletion::Done(_) => StatusCode::NO_CONTENT.into_response(),
    }
}

#[cfg(test)]
mod tests;
