//! The routes of `/v4/linode/instances`, the Linode wire form and the `X-Filter` rules.

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use data_encoding::BASE64;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::{Backend, Extra, LinodeError, USER_DATA_MAX, tag_marks, valid_label};
use crate::framework::{Adapter, Deletion, Record, Shared};

type St = State<Shared<Backend>>;

pub(super) fn routes() -> Router<Shared<Backend>> {
    Router::new()
        .route("/v4/linode/instances", get(list).post(create))
        .route("/v4/linode/instances/{id}", get(read).delete(delete))
        .route("/v4/linode/types/{id}", get(linode_type))
}

/// `GET /v4/linode/types/{typeId}`: the type's prices (the fields of the spec's
/// `LinodeType` a price reader uses, with the addon and sizes left at plausible values).
async fn linode_type(State(s): St, Path(id): Path<String>) -> Response {
    let b = s.lock();
    let Some(price) = b.backend.cfg.prices.iter().find(|t| t.linode_type == id) else {
        return LinodeError::not_found().into_response();
    };
    let (hourly, regions) = (&price.hourly, &price.regions);
    let monthly = |h: f64| (h * 730.0 * 100.0).round() / 100.0;
    let region_prices: Vec<Value> = regions
        .iter()
        .map(|(r, h)| json!({"id": r, "hourly": h, "monthly": monthly(*h)}))
        .collect();
    Json(json!({
        "id": id, "label": id, "class": "standard", "disk": 25600, "memory": 1024, "vcpus": 1,
        "gpus": 0, "network_out": 1000, "transfer": 1000, "successor": null,
        "price": {"hourly": hourly, "monthly": monthly(*hourly)},
        "region_prices": region_prices,
        "addons": {"backups": {"price": {"hourly": 0.003, "monthly": 2.0}, "region_prices": []}},
    }))
    .into_response()
}

/// Linode's times: UTC, no offset.
fn time(secs: u64) -> String {
    crate::time::rfc3339(secs).trim_end_matches('Z').to_string()
}

/// The status a read shows: a provisioning Linode already seen once is `booting`.
fn status(r: &Record<Extra>) -> &str {
    match r.state.as_str() {
        "provisioning" if r.extra.booting => "booting",
        s => s,
    }
}

/// A Linode as the API renders it (the fields the spec lists that matter here).
pub(super) fn render(r: &Record<Extra>) -> Value {
    let id: u64 = r.id.parse().unwrap_or_default();
    json!({
        "id": id, "label": r.name, "region": r.scope, "type": r.extra.linode_type,
        "image": r.extra.image, "status": status(r), "ipv4": r.ip.iter().collect::<Vec<_>>(),
        "ipv6": null, "created": time(r.created_at), "updated": time(r.created_at),
        "tags": r.extra.tags, "has_user_data": !r.user_data.is_empty(), "hypervisor": "kvm",
        "group": "", "watchdog_enabled": true, "capabilities": [],
        "backups": {"enabled": false, "available": false, "last_successful": null},
    })
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    user_data: Option<String>,
}

#[derive(Deserialize)]
struct CreateBody {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default, rename = "type")]
    linode_type: Option<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    root_pass: Option<String>,
    #[serde(default)]
    booted: Option<bool>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    authorized_keys: Vec<String>,
    #[serde(default)]
    firewall_id: Option<u64>,
}

/// Linode scores passwords itself; this stands in for it: short or one class is weak.
fn weak(pass: &str) -> bool {
    let classes = [
        pass.bytes().any(|b| b.is_ascii_lowercase()),
        pass.bytes().any(|b| b.is_ascii_uppercase()),
        pass.bytes().any(|b| b.is_ascii_digit()),
        pass.bytes().any(|b| !b.is_ascii_alphanumeric()),
    ];
    pass.len() < 11 || classes.iter().filter(|c| **c).count() < 2
}

/// The checks of a create, in the order the fields come; the first failure answers.
fn check(b: &Backend, body: &CreateBody) -> Result<Vec<u8>, LinodeError> {
    let cfg = &b.backend.cfg;
    let bad = |field: &str, reason: &str| Err(LinodeError::field(400, field, reason));
    let region = body.region.as_deref().unwrap_or_default();
    if region.is_empty() {
        return bad("region", "region is required");
    }
    if !cfg.regions.iter().any(|r| r == region) {
        return bad("region", "region is not valid");
    }
    match body.linode_type.as_deref() {
        None | Some("") => return bad("type", "type is required"),
        Some(t) if !cfg.types.iter().any(|x| x == t) => return bad("type", "type is not valid"),
        Some(_) => {}
    }
    if body.label.as_deref().is_some_and(|l| !valid_label(l)) {
        return bad(
            "label",
            "Label must begin with a letter and contain only letters, digits, '-', '_' or '.'",
        );
    }
    if body.image.is_some() {
        match body.root_pass.as_deref() {
            None | Some("") => return bad("root_pass", "root_pass is required"),
            Some(p) if !(7..=128).contains(&p.len()) => {
                return bad("root_pass", "root_pass must be between 7 and 128 characters");
            }
            Some(p) if weak(p) => {
                return bad("root_pass", "Password does not meet strength requirement");
            }
            Some(_) => {}
        }
    }
    if body.tags.iter().any(|t| !(3..=50).contains(&t.len())) {
        return bad("tags", "Length must be 3-50 characters");
    }
    let Some(encoded) = body.metadata.as_ref().and_then(|m| m.user_data.as_deref()) else {
        return Ok(Vec::new());
    };
    let Ok(data) = BASE64.decode(encoded.as_bytes()) else {
        return bad("metadata.user_data", "user_data must be base64-encoded");
    };
    if data.len() > USER_DATA_MAX {
        return bad("metadata.user_data", "user_data must not exceed 65535 bytes before encoding");
    }
    if !cfg.metadata_regions.iter().any(|r| r == region) {
        return bad("metadata.user_data", "Metadata is not supported in this region");
    }
    Ok(data)
}

async fn create(State(state): St, body: Result<Json<CreateBody>, JsonRejection>) -> Response {
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => {
            return LinodeError::new(400, format!("Invalid JSON: {}", e.body_text()))
                .into_response();
        }
    };
    let mut b = state.lock();
    if let Err(e) = b.backend.take_create() {
        let mut resp = e.into_response();
        b.backend.create_headers(&mut resp);
        return resp;
    }
    let user_data = match check(&b, &body) {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let id = b.new_id();
    let label = body.label.unwrap_or_else(|| format!("linode{id}"));
    if b.fleet.name_taken(&label) {
        return b.backend.name_taken().into_response();
    }
    let extra = Extra {
        linode_type: body.linode_type.unwrap_or_default(),
        image: body.image.unwrap_or_default(),
        tags: body.tags,
        root_pass: body.root_pass.unwrap_or_default(),
        authorized_keys: body.authorized_keys,
        firewall_id: body.firewall_id,
        booting: false,
    };
    let mut record = Record::new(id, label, body.region.unwrap_or_default(), extra);
    record.labels = tag_marks(&record.extra.tags).into_iter().collect();
    record.user_data = user_data;
    let mut record = b.create(record);
    if body.booted == Some(false) {
        // Not booted: stays offline (the plugin always boots).
        if let Some(r) = b.fleet.get_mut(&record.id) {
            r.state = "offline".into();
            record.state = r.state.clone();
        }
    }
    let mut resp = Json(render(&record)).into_response();
    b.backend.create_headers(&mut resp);
    resp
}

async fn read(State(state): St, Path(id): Path<String>) -> Response {
    let mut b = state.lock();
    let Some(r) = b.fleet.get_mut(&id) else {
        return LinodeError::not_found().into_response();
    };
    let answer = render(r);
    if r.state == "provisioning" && !r.held && !r.deleting {
        r.extra.booting = true;
    }
    let id = r.id.clone();
    b.saw(&id);
    Json(answer).into_response()
}

async fn delete(State(state): St, Path(id): Path<String>) -> Response {
    match state.lock().fleet.delete(&id) {
        Deletion::NotFound => LinodeError::not_found().into_response(),
        Deletion::Locked => LinodeError::new(400, "Linode busy.").into_response(),
        Deletion::InProgress(_) | Deletion::Done(_) => Json(json!({})).into_response(),
    }
}

/// Whether a field's value matches a filter value: equal, or `+contains` / `+neq`.
fn value_matches(want: &Value, actual: &str) -> Result<bool, String> {
    match want {
        Value::String(s) => Ok(s == actual),
        Value::Number(n) => Ok(n.to_string() == actual),
        Value::Object(op) if op.len() == 1 => match op.iter().next() {
            Some((k, Value::String(s))) if k == "+contains" => Ok(actual.contains(s.as_str())),
            Some((k, Value::String(s))) if k == "+neq" => Ok(actual != s),
            _ => Err(format!("unsupported operator in {want}")),
        },
        other => Err(format!("invalid filter value {other}")),
    }
}

/// Whether a Linode matches an `X-Filter` object: every key must hold.
fn matches(filter: &Value, r: &Record<Extra>) -> Result<bool, String> {
    let Value::Object(keys) = filter else {
        return Err("X-Filter must be a JSON object".into());
    };
    for (k, v) in keys {
        let each = |v: &Value| -> Result<Vec<bool>, String> {
            let items = v.as_array().ok_or(format!("{k} must be an array"))?;
            items.iter().map(|f| matches(f, r)).collect()
        };
        let ok = match k.as_str() {
            "+and" => each(v)?.iter().all(|b| *b),
            "+or" => each(v)?.iter().any(|b| *b),
            "+order_by" | "+order" => true,
            "label" => value_matches(v, &r.name)?,
            "region" => value_matches(v, &r.scope)?,
            "id" => value_matches(v, &r.id)?,
            "tags" => {
                let mut any = false;
                for t in &r.extra.tags {
                    any |= value_matches(v, t)?;
                }
                any
            }
            other => return Err(format!("Cannot filter on {other}")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn list(
    State(state): St,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let bad = |field: &str, reason: &str| LinodeError::field(400, field, reason).into_response();
    let num = |k: &str, default: u64| q.get(k).map_or(Some(default), |v| v.parse::<u64>().ok());
    let (Some(page), Some(size)) = (num("page", 1), num("page_size", 100)) else {
        return bad("page", "page and page_size must be integers");
    };
    if page < 1 {
        return bad("page", "page must be at least 1");
    }
    if !(25..=500).contains(&size) {
        return bad("page_size", "page_size must be between 25 and 500");
    }
    let filter =
        match headers.get("x-filter").map(|v| serde_json::from_slice::<Value>(v.as_bytes())) {
            None => json!({}),
            Some(Ok(f)) => f,
            Some(Err(_)) => return bad("X-Filter", "X-Filter is not valid JSON"),
        };
    let b = state.lock();
    let mut matched = Vec::new();
    for r in b.fleet.iter() {
        match matches(&filter, r) {
            Ok(true) => matched.push(r),
            Ok(false) => {}
            Err(why) => return bad("X-Filter", &why),
        }
    }
    if b.fleet.failing_scope(matched.iter().map(|r| r.scope.as_str())).is_some() {
        return LinodeError::new(500, "Internal server error").into_response();
    }
    let results = matched.len() as u64;
    let pages = results.div_ceil(size).max(1);
    let skip = ((page - 1) * size) as usize;
    let data: Vec<Value> = matched.into_iter().skip(skip).take(size as usize).map(render).collect();
    Json(json!({"data": data, "page": page, "pages": pages, "results": results})).into_response()
}
