//! The routes of the emulated Instances API and the JSON they answer.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Backend, ScwError, Server, error};
use crate::framework::{Deletion, Record, Shared};

type St = State<Shared<Backend>>;

pub fn router(state: &Shared<Backend>) -> Router<Shared<Backend>> {
    let api = Router::new()
        .route("/servers", get(list_servers).post(create_server))
        .route("/servers/{id}", get(get_server).delete(delete_server))
        .route("/servers/{id}/action", post(action))
        .route(
            "/servers/{id}/user_data/{key}",
            get(get_user_data).patch(set_user_data).put(set_user_data),
        )
        .route("/ips", get(list_ips).post(create_ip))
        .route("/ips/{id}", delete(delete_ip))
        .route("/volumes/{id}", delete(delete_volume))
        .route("/products/servers", get(list_server_types));
    let api = crate::framework::gated(api, state);
    Router::new().nest("/instance/v1/zones/{zone}", api)
}

fn date(secs: u64) -> String {
    // Scaleway writes microseconds and an offset: 2026-02-24T11:29:06.723007+00:00.
    format!("{}.000000+00:00", crate::time::rfc3339(secs).trim_end_matches('Z'))
}

fn tags(r: &Record<Server>) -> Vec<String> {
    let marks = r.labels.iter().map(|(k, v)| format!("{k}={v}"));
    marks.chain(r.extra.bare_tags.iter().cloned()).collect()
}

/// A server as the API shows it (the fields the SDK's `Server` has that matter here).
pub fn render(r: &Record<Server>) -> Value {
    let state = if r.locked { "locked" } else { r.state.as_str() };
    let public_ips: Vec<Value> = r
        .ip
        .iter()
        .map(|address| {
            let id = r.extra.ip_id.clone().unwrap_or_else(|| format!("dyn-{}", r.id));
            json!({"id": id, "address": address, "dynamic": r.extra.ip_id.is_none(), "family": "inet",
                   "provisioning_mode": "dhcp", "state": "attached", "tags": []})
        })
        .collect();
    let volumes = match &r.extra.volume_id {
        Some(v) => {
            json!({"0": {"id": v, "volume_type": "l_ssd", "boot": false, "state": "available"}})
        }
        None => json!({}),
    };
    let allowed: &[&str] = match state {
        "running" => &["poweroff", "terminate", "reboot", "stop_in_place", "backup"],
        "stopped" | "stopped in place" => &["poweron", "backup"],
        _ => &[],
    };
    json!({
        "id": r.id, "name": r.name, "project": r.extra.project, "organization": r.extra.project,
        "commercial_type": r.extra.commercial_type, "tags": tags(r), "state": state,
        "state_detail": if state == "running" { "booted" } else { "" },
        "creation_date": date(r.created_at), "modification_date": date(r.created_at),
        "image": {"id": r.extra.image, "name": r.extra.image},
        "public_ip": public_ips.first(), "public_ips": public_ips, "dynamic_ip_required": false,
        "routed_ip_enabled": true, "volumes": volumes, "allowed_actions": allowed,
        "zone": r.scope, "protected": false, "hostname": r.name,
        "dns": format!("{}.pub.instance.scw.eu", r.id),
    })
}

fn render_ip(b: &Backend, ip: &super::FlexIp) -> Value {
    let server = ip
        .server
        .as_ref()
        .and_then(|s| b.fleet.get(s))
        .map(|r| json!({"id": r.id, "name": r.name}));
    json!({"id": ip.id, "address": ip.address, "zone": ip.zone, "project": ip.project,
           "organization": ip.project, "tags": ip.tags, "type": "routed_ipv4",
           "state": if server.is_some() { "attached" } else { "detached" }, "server": server})
}

fn known_zone(b: &Backend, zone: &str) -> Result<(), ScwError> {
    let known = b.backend.config.zones.iter().any(|z| z == zone);
    known
        .then_some(())
        .ok_or_else(|| error::invalid_argument("zone", &format!("unknown zone {zone:?}")))
}

/// The server `id` in `zone`, or the API's 404.
fn find<'a>(b: &'a Backend, zone: &str, id: &str) -> Result<&'a Record<Server>, ScwError> {
    b.fleet
        .get(id)
        .filter(|r| r.scope == zone && r.id == id)
        .ok_or_else(|| error::not_found("instance_server", id))
}

#[derive(Deserialize, Default)]
struct ListQuery {
    page: Option<String>,
    per_page: Option<String>,
    name: Option<String>,
    tags: Option<String>,
    project: Option<String>,
}

/// `page` and `per_page` as the API checks them: page from 1, per_page 1 to 100.
fn paging(q: &ListQuery) -> Result<(usize, usize), ScwError> {
    let num = |v: &Option<String>, name: &str, default: usize, max: usize| match v {
        None => Ok(default),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(error::invalid_argument(name, &format!("must be between 1 and {max}"))),
        },
    };
    Ok((num(&q.page, "page", 1, usize::MAX)?, num(&q.per_page, "per_page", 50, 100)?))
}

/// One page of `items` with `X-Total-Count` and a `Link` header, as the API pages.
fn page_of(key: &str, items: Vec<Value>, page: usize, per_page: usize, path: &str) -> Response {
    let total = items.len();
    let slice: Vec<Value> = items.into_iter().skip((page - 1) * per_page).take(per_page).collect();
    paged(json!({key: slice, "total_count": total}), total, page, per_page, path)
}

/// `body`, a page of a list of `total`, with `X-Total-Count` and a `Link` header.
fn paged(body: Value, total: usize, page: usize, per_page: usize, path: &str) -> Response {
    let last = total.div_ceil(per_page).max(1);
    let mut links = Vec::new();
    if page < last {
        links.push(format!("<{path}?page={}&per_page={per_page}>; rel=\"next\"", page + 1));
    }
    links.push(format!("<{path}?page={last}&per_page={per_page}>; rel=\"last\""));
    let mut resp = Json(body).into_response();
    let h = resp.headers_mut();
    h.insert("x-total-count", HeaderValue::from(total as u64));
    if let Ok(v) = HeaderValue::from_str(&links.join(", ")) {
        h.insert("link", v);
    }
    resp
}

/// `GET /products/servers`: the zone's commercial types in name order, a page of them as the
/// `servers` map (see the module documentation).
async fn list_server_types(
    State(s): St,
    Path(zone): Path<String>,
    Query(q): Query<ListQuery>,
) -> Answer {
    let b = s.lock();
    known_zone(&b, &zone)?;
    let (page, per_page) = paging(&q)?;
    let mut sold: Vec<&super::ServerTypeOffer> =
        b.backend.config.catalogue.iter().filter(|o| o.zones.contains(&zone)).collect();
    sold.sort_by(|a, b| a.commercial_type.cmp(&b.commercial_type));
    let servers: serde_json::Map<String, Value> = sold
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|o| (o.commercial_type.clone(), server_type(o)))
        .collect();
    let body = json!({"servers": servers, "total_count": sold.len()});
    Ok(paged(body, sold.len(), page, per_page, "/products/servers"))
}

/// A `ServerType` as the SDK has it: the catalogue's price, illustrative figures.
fn server_type(o: &super::ServerTypeOffer) -> Value {
    let gib: u64 = 1 << 30;
    json!({"hourly_price": o.hourly_price, "monthly_price": o.hourly_price * 730.0, "alt_names": [],
           "ncpus": 2, "gpu": 0, "ram": 2 * gib, "gpu_info": null, "arch": "x86_64",
           "volumes_constraint": {"min_size": 0, "max_size": 20_000_000_000u64},
           "per_volume_constraint": {"l_ssd": {"min_size": 1_000_000_000, "max_size": 20_000_000_000u64}},
           "capabilities": {"block_storage": true, "boot_types": ["local", "rescue"]},
           "network": {"sum_internal_bandwidth": 300_000_000, "sum_internet_bandwidth": 300_000_000,
                       "ipv6_support": true, "interfaces": []},
           "scratch_storage_max_size": null, "block_bandwidth": 104_857_600, "end_of_service": false})
}

fn wanted_tags(q: &ListQuery) -> Vec<String> {
    let tags = q.tags.as_deref().unwrap_or_default();
    tags.split(',').filter(|t| !t.is_empty()).map(str::to_string).collect()
}

async fn list_servers(
    State(s): St,
    Path(zone): Path<String>,
    Query(q): Query<ListQuery>,
) -> Answer {
    let b = s.lock();
    known_zone(&b, &zone)?;
    let (page, per_page) = paging(&q)?;
    if b.fleet.failing_scope(std::iter::once(zone.as_str())).is_some() {
        return Err(error::new(503, "service_unavailable", "zone is unavailable"));
    }
    let want = wanted_tags(&q);
    let items: Vec<Value> = b
        .fleet
        .iter()
        .filter(|r| r.scope == zone)
        .filter(|r| q.name.as_ref().is_none_or(|n| r.name.contains(n.as_str())))
        .filter(|r| q.project.as_ref().is_none_or(|p| &r.extra.project == p))
        .filter(|r| {
            let have = tags(r);
            want.iter().all(|t| have.contains(t))
        })
        .map(render)
        .collect();
    Ok(page_of("servers", items, page, per_page, "/servers"))
}

#[derive(Deserialize)]
struct CreateServer {
    name: String,
    commercial_type: String,
    image: String,
    project: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    public_ips: Vec<String>,
    #[serde(default)]
    dynamic_ip_required: Option<bool>,
}

async fn create_server(
    State(s): St,
    Path(zone): Path<String>,
    body: Result<Json<CreateServer>, JsonRejection>,
) -> Answer {
    let mut b = s.lock();
    known_zone(&b, &zone)?;
    let Json(body) = body.map_err(|e| error::invalid_request(&e.body_text()))?;
    let cfg = &b.backend.config;
    if body.project.as_deref() != Some(cfg.project.as_str()) {
        return Err(error::new(403, "permissions_denied", "insufficient permissions")
            .with("details", json!([{"resource": "instance_server", "action": "create"}])));
    }
    if !cfg.commercial_types.contains(&body.commercial_type) {
        return Err(error::invalid_argument("commercial_type", "unknown commercial type"));
    }
    if !cfg.images.contains(&body.image) {
        return Err(error::not_found("image", &body.image));
    }
    let ip_id = match body.public_ips.as_slice() {
        [] => None,
        [one] => match b.backend.ips.get(one) {
            Some(ip) if ip.zone == zone && ip.server.is_none() => Some(one.clone()),
            Some(_) => {
                return Err(error::invalid_request("ip is already attached or in another zone"));
            }
            None => return Err(error::not_found("instance_ip", one)),
        },
        _ => {
            return Err(error::invalid_argument("public_ips", "at most one IPv4 in this emulator"));
        }
    };
    let (mut labels, mut bare) = (std::collections::BTreeMap::new(), Vec::new());
    for t in body.tags {
        match t.split_once('=') {
            Some((k, v)) => drop(labels.insert(k.to_string(), v.to_string())),
            None => bare.push(t),
        }
    }
    let volume = b.backend.new_id(2);
    let extra = Server {
        commercial_type: body.commercial_type,
        image: body.image,
        project: body.project.unwrap_or_default(),
        bare_tags: bare,
        ip_id: ip_id.clone(),
        volume_id: Some(volume.clone()),
    };
    let id = b.new_id();
    let mut record = Record::new(id.clone(), body.name, zone.clone(), extra);
    record.labels = labels;
    b.create(record);
    let dynamic = body.dynamic_ip_required.unwrap_or(true) && ip_id.is_none();
    let address = match &ip_id {
        Some(ip) => b.backend.ips.get_mut(ip).map(|ip| {
            ip.server = Some(id.clone());
            ip.address.clone()
        }),
        None if dynamic => Some(b.next_address()),
        None => None,
    };
    b.backend.volumes.insert(volume, (zone.clone(), Some(id.clone())));
    if let Some(r) = b.fleet.get_mut(&id) {
        // Created, not started: powered off, its address already known.
        r.state = "stopped".into();
        r.ip = address;
    }
    let r = b.fleet.get(&id).expect("just created");
    Ok((StatusCode::CREATED, Json(json!({"server": render(r)}))).into_response())
}

type Answer = Result<Response, ScwError>;

async fn get_server(State(s): St, Path((zone, id)): Path<(String, String)>) -> Answer {
    let mut b = s.lock();
    let server = render(find(&b, &zone, &id)?);
    b.saw(&id);
    Ok(Json(json!({"server": server})).into_response())
}

/// Drops what goes with a server that is gone: its volume (a terminate deletes local
/// volumes) or not (a plain delete keeps it, detached); its IP is always kept, detached.
fn forget(b: &mut Backend, id: &str, keep_volume: bool) {
    let held = |holder: &Option<String>| holder.as_deref() == Some(id);
    b.backend.ips.values_mut().filter(|ip| held(&ip.server)).for_each(|ip| ip.server = None);
    match keep_volume {
        true => b.backend.volumes.values_mut().filter(|v| held(&v.1)).for_each(|v| v.1 = None),
        false => b.backend.volumes.retain(|_, v| !held(&v.1)),
    }
}

fn powered_off(state: &str) -> bool {
    state == "stopped" || state == "stopped in place"
}

async fn delete_server(State(s): St, Path((zone, id)): Path<(String, String)>) -> Answer {
    let mut b = s.lock();
    let r = find(&b, &zone, &id)?;
    if r.locked {
        return Err(error::locked(&id));
    }
    if !powered_off(&r.state) {
        return Err(error::invalid_request("instance should be powered off"));
    }
    match b.fleet.delete(&id) {
        Deletion::Done(_) => {
            forget(&mut b, &id, true);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Deletion::Locked => Err(error::locked(&id)),
        Deletion::InProgress(_) | Deletion::NotFound => {
            Err(error::not_found("instance_server", &id))
        }
    }
}

#[derive(Deserialize)]
struct ActionBody {
    #[serde(default)]
    action: Option<String>,
}

fn task(id: &str, description: &str) -> Answer {
    let body = json!({"task": {"id": format!("task-{id}"), "description": description, "status": "pending",
                               "href_from": format!("/servers/{id}/action"), "progress": 0}});
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

async fn action(
    State(s): St,
    Path((zone, id)): Path<(String, String)>,
    body: Result<Json<ActionBody>, JsonRejection>,
) -> Answer {
    let mut b = s.lock();
    let r = find(&b, &zone, &id)?;
    let (state, is_locked) = (r.state.clone(), r.locked);
    let Ok(Json(body)) = body else {
        return Err(error::invalid_request("invalid JSON body"));
    };
    if is_locked {
        return Err(error::locked(&id));
    }
    // The API's default action is poweron.
    match body.action.as_deref().unwrap_or("poweron") {
        "poweron" if !powered_off(&state) => {
            Err(error::new(412, "precondition_failed", "server should be stopped"))
        }
        "poweron" => {
            if let Some(r) = b.fleet.get_mut(&id) {
                r.state = "starting".into();
            }
            task(&id, "server_batch_poweron")
        }
        "terminate" if state == "running" || state == "starting" => match b.fleet.delete(&id) {
            Deletion::Done(_) => {
                forget(&mut b, &id, false);
                task(&id, "server_terminate")
            }
            Deletion::Locked => Err(error::locked(&id)),
            _ => Err(error::invalid_request("server is already being terminated")),
        },
        "terminate" => Err(error::invalid_request("server should be running")),
        other => Err(error::invalid_argument(
            "action",
            &format!("action {other:?} is not supported here"),
        )),
    }
}

async fn set_user_data(
    State(s): St,
    Path((zone, id, key)): Path<(String, String, String)>,
    body: Bytes,
) -> Answer {
    let mut b = s.lock();
    find(&b, &zone, &id)?;
    if key != "cloud-init" {
        // Other keys exist on Scaleway; this emulator keeps only the one cloud-init reads.
        return Err(error::invalid_argument("key", "only cloud-init is kept by this emulator"));
    }
    if let Some(r) = b.fleet.get_mut(&id) {
        r.user_data = body.to_vec();
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn get_user_data(
    State(s): St,
    Path((zone, id, key)): Path<(String, String, String)>,
) -> Answer {
    let b = s.lock();
    match find(&b, &zone, &id)? {
        r if key == "cloud-init" && !r.user_data.is_empty() => {
            Ok(([("content-type", "text/plain")], r.user_data.clone()).into_response())
        }
        _ => Err(error::not_found("instance_user_data", &key)),
    }
}

#[derive(Deserialize)]
struct CreateIp {
    project: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

async fn create_ip(
    State(s): St,
    Path(zone): Path<String>,
    body: Result<Json<CreateIp>, JsonRejection>,
) -> Answer {
    let mut b = s.lock();
    known_zone(&b, &zone)?;
    let Json(body) = body.map_err(|e| error::invalid_request(&e.body_text()))?;
    if body.project.as_deref() != Some(b.backend.config.project.as_str()) {
        return Err(error::new(403, "permissions_denied", "insufficient permissions"));
    }
    if body.kind.as_deref().is_some_and(|k| k != "routed_ipv4") {
        return Err(error::invalid_argument("type", "only routed_ipv4 in this emulator"));
    }
    let project = b.backend.config.project.clone();
    let ip = b.backend.new_ip(&zone, &project, body.tags);
    Ok((StatusCode::CREATED, Json(json!({"ip": render_ip(&b, &ip)}))).into_response())
}

async fn list_ips(State(s): St, Path(zone): Path<String>, Query(q): Query<ListQuery>) -> Answer {
    let b = s.lock();
    known_zone(&b, &zone)?;
    let (page, per_page) = paging(&q)?;
    let want = wanted_tags(&q);
    let items: Vec<Value> = b
        .backend
        .ips
        .values()
        .filter(|ip| ip.zone == zone && q.project.as_ref().is_none_or(|p| &ip.project == p))
        .filter(|ip| want.iter().all(|t| ip.tags.contains(t)))
        .map(|ip| render_ip(&b, ip))
        .collect();
    Ok(page_of("ips", items, page, per_page, "/ips"))
}

/// Releases the IP, detaching it first if a server holds it.
async fn delete_ip(State(s): St, Path((zone, id)): Path<(String, String)>) -> Answer {
    let mut b = s.lock();
    if b.backend.ips.get(&id).is_none_or(|ip| ip.zone != zone) {
        return Err(error::not_found("instance_ip", &id));
    }
    let ip = b.backend.ips.remove(&id).expect("just found");
    if let Some(r) = ip.server.and_then(|h| b.fleet.get_mut(&h)) {
        r.ip = None;
        r.extra.ip_id = None;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete_volume(State(s): St, Path((zone, id)): Path<(String, String)>) -> Answer {
    let mut b = s.lock();
    let attached = match b.backend.volumes.get(&id) {
        Some((z, server)) if *z == zone => server.clone().filter(|s| b.fleet.get(s).is_some()),
        _ => return Err(error::not_found("instance_volume", &id)),
    };
    if attached.is_some() {
        return Err(error::invalid_request("volume is attached to a server"));
    }
    b.backend.volumes.remove(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}
