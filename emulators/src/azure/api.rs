//! The HTTP side: one router for the token endpoint, ARM (`/subscriptions/...`, behind
//! [`gate`]) and the Retail Prices API, ARM paths parsed by hand because ARM matches
//! namespaces, types and `resourceGroups` case-insensitively.

use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::SpotRefusal;
use super::error::ArmError;
use super::model::{Backend, OpStatus, Res, ResourceKind, key};
use crate::control::FaultOp;
use crate::framework::{Effect, Shared};

type S = Shared<Backend>;

/// ARM's documented legacy hourly limits, what the headers say while none is enforced.
const DEFAULT_READS: u64 = 12_000;
const DEFAULT_WRITES: u64 = 1_200;

pub(crate) fn router(state: &S) -> Router<S> {
    let arm = Router::new()
        .route("/subscriptions/{*rest}", any(arm))
        .layer(middleware::from_fn_with_state(state.clone(), gate));
    Router::new()
        .merge(arm)
        .route("/{tenant}/oauth2/v2.0/token", post(super::auth::token))
        .route("/api/retail/prices", get(super::prices::prices))
        .route("/_emulator/spot-refusal", post(spot_control))
        .route("/_emulator/resources", get(resources_control))
        .route(
            "/_emulator/requests",
            get(|State(s): State<S>| async move {
                Json(json!({"requests": s.lock().traffic.requests}))
            }),
        )
        .fallback(|uri: axum::http::Uri| async move {
            let msg = format!("No HTTP resource was found that matches the request URI '{uri}'.");
            ArmError::new(404, "NotFound", msg).into_response()
        })
}

// ---- the gate ---------------------------------------------------------------------------

fn segments(path: &str) -> Vec<String> {
    path.trim_matches('/').split('/').map(|s| super::percent::decode(s, false)).collect()
}

/// The shared operation of a call and its name for the stats (`PUT
/// Microsoft.Compute/virtualMachines`, `GET Microsoft.Resources/resources`).
fn classify(method: &Method, path: &str) -> (Option<FaultOp>, String) {
    let segs = segments(path);
    let low: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
    let rest: Vec<&str> = low.iter().skip(2).map(String::as_str).collect();
    let canon = |ns: &str, ty: &str| {
        ResourceKind::from_path(ns, ty)
            .map(|k| k.full_type())
            .unwrap_or_else(|| format!("{ns}/{ty}"))
    };
    let m = method.as_str();
    let (op, name) = match rest.as_slice() {
        ["resources"] | ["resourcegroups", _, "resources"] => {
            (Some(FaultOp::List), "Microsoft.Resources/resources".to_string())
        }
        ["resourcegroups", _, "providers", ns, ty] | ["providers", ns, ty] => {
            (Some(FaultOp::List), canon(ns, ty))
        }
        ["providers", ns, "locations", _, what, _] => {
            let ns =
                if *ns == "microsoft.network" { "Microsoft.Network" } else { "Microsoft.Compute" };
            (Some(FaultOp::Get), format!("{ns}/{what}"))
        }
        ["resourcegroups", _, "providers", ns, ty, _] => {
            let op = match m {
                "PUT" => Some(FaultOp::Create),
                "GET" => Some(FaultOp::Get),
                "DELETE" => Some(FaultOp::Delete),
                _ => None,
            };
            (op, canon(ns, ty))
        }
        ["resourcegroups", _, "providers", ns, ty, _, sub] => {
            let op = (m == "GET").then_some(FaultOp::Get);
            let sub = segs.get(8).cloned().unwrap_or_else(|| sub.to_string());
            (op, format!("{}/{sub}", canon(ns, ty)))
        }
        _ => (None, path.to_string()),
    };
    (op, format!("{m} {name}"))
}

impl Backend {
    /// ARM's authentication of a call: a `Bearer` token this emulator issued, not expired.
    fn check_auth(&self, headers: &HeaderMap) -> Result<(), ArmError> {
        let authority = self.authority();
        let Some(h) = headers.get("authorization") else {
            return Err(ArmError::auth_missing(&authority));
        };
        let token = h
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let Some(token) = token.map(str::trim).filter(|t| !t.is_empty()) else {
            return Err(ArmError::auth_invalid_header(&authority));
        };
        match self.tokens.get(token) {
            None => Err(ArmError::invalid_token(&authority)),
            Some(exp) if *exp <= crate::time::now_secs() => {
                Err(ArmError::expired_token(&authority, *exp))
            }
            Some(_) => Ok(()),
        }
    }
}

/// What every ARM call passes before its handler, in the order ARM applies it: the
/// throttle (one bucket for reads, one for writes; a throttled call reaches nothing), then
/// injected faults (the path to the API failing), then authentication, then time-based
/// schedules. Every answer gets `x-ms-ratelimit-remaining-subscription-{reads,writes}` and
/// request ids.
async fn gate(State(state): State<S>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let line = match uri.query() {
        Some(q) => format!("{method} {}?{q}", uri.path()),
        None => format!("{method} {}", uri.path()),
    };
    let write = !matches!(method, Method::GET | Method::HEAD);
    let bucket = if write { "writes" } else { "reads" };
    let (limited, fault, auth) = {
        let mut b = state.lock();
        let (op, call) = classify(&method, uri.path());
        b.traffic.record(line, op, &call);
        let limited = b.traffic.limits.take(bucket, Instant::now());
        let fault = if limited.is_none() { b.traffic.take_fault(op, &call) } else { None };
        (limited, fault, b.check_auth(req.headers()))
    };
    let mut resp = match (limited, fault) {
        (Some(limit), _) => {
            let b = state.lock();
            let retry = 3600u64.div_ceil(u64::from(limit.per_hour.max(1))).max(1);
            let kind = if write { "write" } else { "read" };
            ArmError::throttled(kind, &b.cfg.subscription_id, "emulator", retry).into_response()
        }
        (None, Some(Effect { delay, fail })) => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match fail {
                Some(e) => e.into_response(),
                None => pass(&state, auth, req, next).await,
            }
        }
        (None, None) => pass(&state, auth, req, next).await,
    };
    let mut b = state.lock();
    if resp.status() == StatusCode::TOO_MANY_REQUESTS {
        b.traffic.stats.rate_limited += 1;
    }
    let now = Instant::now();
    let remaining = match b.traffic.limits.bucket(bucket, now) {
        Some(l) => l.remaining(now),
        None if write => DEFAULT_WRITES - 1,
        None => DEFAULT_READS - 1,
    };
    let remaining = if resp.status() == StatusCode::TOO_MANY_REQUESTS { 0 } else { remaining };
    let (request_id, correlation) = (b.guid(), b.guid());
    let h = resp.headers_mut();
    h.insert(
        if write {
            "x-ms-ratelimit-remaining-subscription-writes"
        } else {
            "x-ms-ratelimit-remaining-subscription-reads"
        },
        HeaderValue::from(remaining),
    );
    for (name, v) in [("x-ms-request-id", request_id), ("x-ms-correlation-request-id", correlation)]
    {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(name, v);
        }
    }
    h.entry("cache-control").or_insert(HeaderValue::from_static("no-cache"));
    resp
}

async fn pass(state: &S, auth: Result<(), ArmError>, req: Request, next: Next) -> Response {
    if let Err(e) = auth {
        return e.into_response();
    }
    state.lock().tick();
    next.run(req).await
}

// ---- ARM routes -------------------------------------------------------------------------

/// The request as the handlers need it.
struct Call {
    method: Method,
    segs: Vec<String>,
    query: Vec<(String, String)>,
}

impl Call {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str())
    }
}

async fn arm(
    State(state): State<S>,
    method: Method,
    uri: axum::http::Uri,
    Query(query): Query<Vec<(String, String)>>,
    body: Bytes,
) -> Response {
    let call = Call { method, segs: segments(uri.path()), query };
    let mut b = state.lock();
    match dispatch(&mut b, &call, &body) {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// An LRO's headers on the answer that started it: `Azure-AsyncOperation` always,
/// `Location` where the spec's final state is read from it (deletes, actions).
fn lro(b: &Backend, mut resp: Response, op: &str, location: bool) -> Response {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&b.op_url(op)) {
        h.insert("azure-asyncoperation", v);
    }
    if location && let Ok(v) = HeaderValue::from_str(&b.op_result_url(op)) {
        h.insert("location", v);
    }
    if b.ops.get(op).is_some_and(|o| o.running()) {
        h.insert("retry-after", HeaderValue::from(b.cfg.retry_after));
    }
    resp
}

fn dispatch(b: &mut Backend, call: &Call, body: &[u8]) -> Result<Response, ArmError> {
    let Some(version) = call.q("api-version").map(str::to_string) else {
        return Err(ArmError::missing_api_version());
    };
    let segs = &call.segs;
    if !segs.get(1).is_some_and(|s| s.eq_ignore_ascii_case(&b.cfg.subscription_id)) {
        return Err(ArmError::subscription_not_found(
            segs.get(1).map(String::as_str).unwrap_or(""),
        ));
    }
    let rest: Vec<&str> = segs.iter().skip(2).map(String::as_str).collect();
    let low: Vec<String> = rest.iter().map(|s| s.to_ascii_lowercase()).collect();
    let low: Vec<&str> = low.iter().map(String::as_str).collect();
    let m = &call.method;
    match low.as_slice() {
        ["resources"] | ["resourcegroups", _, "resources"] => {
            let rg = (low.len() == 3).then(|| rest[1]);
            if let Some(rg) = rg {
                b.rg(rg)?;
            }
            check_method(m, &[Method::GET])?;
            if !b.cfg.api_versions.resources.contains(&version) {
                return Err(ArmError::invalid_api_version(&version, &b.cfg.api_versions.resources));
            }
            list_resources(b, call, rg, &version)
        }
        ["resourcegroups", _, "providers", _, _] | ["providers", _, _] => {
            let (rg, ns, ty) = match rest.as_slice() {
                [_, rg, _, ns, ty] => (Some(*rg), *ns, *ty),
                [_, ns, ty] => (None, *ns, *ty),
                _ => unreachable!("matched above"),
            };
            if let Some(rg) = rg {
                b.rg(rg)?;
            }
            let kind = ResourceKind::from_path(ns, ty)
                .ok_or_else(|| ArmError::invalid_resource_type(ns, ty, &version))?;
            check_version(b, kind, rg, &version)?;
            check_method(m, &[Method::GET])?;
            list_typed(b, call, kind, rg, &version)
        }
        ["providers", ns, "locations", _, what @ ("operations" | "operationresults"), _] => {
            check_method(m, &[Method::GET])?;
            let family = if *ns == "microsoft.network" {
                &b.cfg.api_versions.network
            } else {
                &b.cfg.api_versions.compute
            };
            let disks = &b.cfg.api_versions.disks;
            let known = family.contains(&version)
                || (*ns == "microsoft.compute" && disks.contains(&version));
            if !known {
                return Err(ArmError::no_registered_provider(
                    "global",
                    &version,
                    "locations/operations",
                    family,
                    &b.cfg.locations,
                ));
            }
            let id = rest[5];
            operation(b, ns, id, *what == "operationresults")
        }
        ["resourcegroups", _, "providers", _, _, _] => {
            let (rg, ns, ty, name) = (rest[1], rest[3], rest[4], rest[5]);
            b.rg(rg)?;
            let kind = ResourceKind::from_path(ns, ty)
                .ok_or_else(|| ArmError::invalid_resource_type(ns, ty, &version))?;
            check_version(b, kind, Some(rg), &version)?;
            resource(b, call, kind, rg, name, body, &version)
        }
        ["resourcegroups", _, "providers", _, _, _, _] => {
            let (rg, ns, ty, name, sub) = (rest[1], rest[3], rest[4], rest[5], rest[6]);
            b.rg(rg)?;
            let kind = ResourceKind::from_path(ns, ty)
                .ok_or_else(|| ArmError::invalid_resource_type(ns, ty, &version))?;
            check_version(b, kind, Some(rg), &version)?;
            if kind != ResourceKind::Vm {
                return Err(ArmError::invalid_resource_type(ns, &format!("{ty}/{sub}"), &version));
            }
            vm_sub(b, m, rg, name, sub, &version)
        }
        _ => Err(ArmError::new(
            404,
            "NotFound",
            format!(
                "No HTTP resource was found that matches the request URI '/{}'.",
                segs.join("/")
            ),
        )),
    }
}

fn check_method(m: &Method, allowed: &[Method]) -> Result<(), ArmError> {
    if allowed.contains(m) {
        Ok(())
    } else {
        Err(ArmError::new(
            405,
            "MethodNotAllowed",
            format!("The requested resource does not support http method '{m}'."),
        ))
    }
}

fn check_version(
    b: &Backend,
    kind: ResourceKind,
    rg: Option<&str>,
    version: &str,
) -> Result<(), ArmError> {
    let v = &b.cfg.api_versions;
    let family = match kind {
        ResourceKind::Vm => &v.compute,
        ResourceKind::Disk => &v.disks,
        ResourceKind::PublicIp | ResourceKind::Nic => &v.network,
    };
    if family.iter().any(|x| x == version) {
        return Ok(());
    }
    let location =
        rg.and_then(|rg| b.rg(rg).ok()).map(|r| r.location).unwrap_or_else(|| "global".into());
    Err(ArmError::no_registered_provider(
        &location,
        version,
        kind.type_name(),
        family,
        &b.cfg.locations,
    ))
}

fn resource(
    b: &mut Backend,
    call: &Call,
    kind: ResourceKind,
    rg: &str,
    name: &str,
    body: &[u8],
    version: &str,
) -> Result<Response, ArmError> {
    match call.method {
        Method::GET => {
            let k = key(&b.get_res(kind, rg, name)?.id);
            let expand = call.q("$expand").unwrap_or("");
            let v = if kind == ResourceKind::Vm {
                b.render_vm_expanded(
                    &k,
                    expand.eq_ignore_ascii_case("instanceView"),
                    expand.eq_ignore_ascii_case("userData"),
                )
            } else {
                b.render(&k)
            };
            b.saw(&k);
            Ok(Json(v).into_response())
        }
        Method::PUT => {
            let body: Value = serde_json::from_slice(body)
                .map_err(|e| ArmError::invalid_request_content(&e.to_string()))?;
            if !body.is_object() {
                return Err(ArmError::invalid_request_content("the body is not a JSON object"));
            }
            let written = match kind {
                ResourceKind::PublicIp => b.put_ip(rg, name, &body, version)?,
                ResourceKind::Nic => b.put_nic(rg, name, &body, version)?,
                ResourceKind::Vm => b.put_vm(rg, name, &body, version)?,
                ResourceKind::Disk => {
                    return Err(ArmError::invalid_parameter(
                        "The emulator makes disks only as the OS disk of a VM.",
                        "disk",
                    ));
                }
            };
            let status = if written.created { StatusCode::CREATED } else { StatusCode::OK };
            let resp = lro(b, (status, Json(written.body)).into_response(), &written.op, false);
            b.settle(&written.op);
            Ok(resp)
        }
        Method::DELETE => match b.delete(kind, rg, name, version)? {
            None => Ok(StatusCode::NO_CONTENT.into_response()),
            Some(op) => {
                let resp = lro(b, StatusCode::ACCEPTED.into_response(), &op, true);
                b.settle(&op);
                Ok(resp)
            }
        },
        _ => Err(ArmError::new(
            405,
            "MethodNotAllowed",
            format!("The requested resource does not support http method '{}'.", call.method),
        )),
    }
}

fn vm_sub(
    b: &mut Backend,
    m: &Method,
    rg: &str,
    name: &str,
    sub: &str,
    version: &str,
) -> Result<Response, ArmError> {
    match (m.as_str(), sub) {
        ("GET", "instanceView") => {
            let k = key(&b.get_res(ResourceKind::Vm, rg, name)?.id);
            let v = b.instance_view(&k);
            b.saw(&k);
            Ok(Json(v).into_response())
        }
        ("POST", "simulateEviction") => {
            let id = b.get_res(ResourceKind::Vm, rg, name)?.id.clone();
            b.evict(&id)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        ("POST", action @ ("start" | "powerOff" | "deallocate" | "restart")) => {
            let op = b.vm_action(rg, name, action, version)?;
            let resp = lro(b, StatusCode::ACCEPTED.into_response(), &op, true);
            b.settle(&op);
            Ok(resp)
        }
        ("GET" | "POST", _) => Err(ArmError::invalid_resource_type(
            "Microsoft.Compute",
            &format!("virtualMachines/{sub}"),
            version,
        )),
        _ => Err(ArmError::new(
            405,
            "MethodNotAllowed",
            format!("The requested resource does not support http method '{m}'."),
        )),
    }
}

/// `GET .../locations/{loc}/operations/{id}` (the status) or `.../operationResults/{id}`
/// (202 while running, then the final answer). Each poll counts as a read.
fn operation(b: &mut Backend, ns: &str, id: &str, result: bool) -> Result<Response, ArmError> {
    let Some(op) = b.ops.get(id).filter(|o| o.kind.namespace().eq_ignore_ascii_case(ns)) else {
        return Err(ArmError::new(
            404,
            "NotFound",
            format!("The operation '{id}' could not be found."),
        ));
    };
    let running = op.running();
    let resp = if !result {
        let mut r = Json(b.render_op(op)).into_response();
        if running {
            r.headers_mut().insert("retry-after", HeaderValue::from(b.cfg.retry_after));
        }
        r
    } else {
        match &op.status {
            OpStatus::InProgress => {
                let mut r = StatusCode::ACCEPTED.into_response();
                if let Ok(v) = HeaderValue::from_str(&b.op_result_url(id)) {
                    r.headers_mut().insert("location", v);
                }
                r.headers_mut().insert("retry-after", HeaderValue::from(b.cfg.retry_after));
                r
            }
            OpStatus::Succeeded if op.kind == ResourceKind::Vm || op.kind == ResourceKind::Disk => {
                StatusCode::OK.into_response()
            }
            OpStatus::Succeeded => StatusCode::NO_CONTENT.into_response(),
            OpStatus::Failed(e) => e.clone().into_response(),
        }
    };
    if running {
        b.advance(id);
    }
    Ok(resp)
}

/// A `$skiptoken` and the offset it stands for.
fn skiptoken(offset: usize) -> String {
    format!("emu{offset:x}")
}

fn parse_skiptoken(call: &Call) -> Result<usize, ArmError> {
    match call.q("$skiptoken") {
        None => Ok(0),
        Some(t) => t
            .strip_prefix("emu")
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| ArmError::invalid_query("$skiptoken", t)),
    }
}

fn parse_top(call: &Call) -> Result<Option<usize>, ArmError> {
    match call.q("$top") {
        None => Ok(None),
        Some(t) => match t.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ArmError::invalid_query("$top", t)),
        },
    }
}

/// The `nextLink` of a list: the same query with the next `$skiptoken`.
fn next_link(b: &Backend, call: &Call, next: usize) -> String {
    let path = format!(
        "/{}",
        call.segs.iter().map(|s| super::percent::encode(s)).collect::<Vec<_>>().join("/")
    );
    let mut url = format!("{}{path}?", b.base_url);
    for (k, v) in &call.query {
        if !k.eq_ignore_ascii_case("$skiptoken") {
            url.push_str(&format!("{k}={}&", super::percent::encode(v)));
        }
    }
    format!("{url}$skiptoken={}", skiptoken(next))
}

/// `GET .../providers/{ns}/{type}` in a resource group or the subscription: the full
/// resources, paged by `list_page_size` with `nextLink`; VMs with their instance view on
/// `$expand=instanceView` (`VirtualMachines_List`'s `ExpandTypeForListVMs`).
fn list_typed(
    b: &mut Backend,
    call: &Call,
    kind: ResourceKind,
    rg: Option<&str>,
    _version: &str,
) -> Result<Response, ArmError> {
    let matched: Vec<String> = b
        .res
        .iter()
        .filter(|(_, r)| r.kind == kind && rg.is_none_or(|g| r.rg.eq_ignore_ascii_case(g)))
        .map(|(k, _)| k.clone())
        .collect();
    if b.failing_scope(matched.iter().filter_map(|k| b.res.get(k))) {
        let tracking = b.guid();
        return Err(ArmError::internal(&b.cfg.subscription_id, &tracking));
    }
    let start = parse_skiptoken(call)?;
    let size = b.cfg.list_page_size.max(1);
    let page: Vec<String> = matched.iter().skip(start).take(size).cloned().collect();
    let view = kind == ResourceKind::Vm
        && call.q("$expand").is_some_and(|e| e.eq_ignore_ascii_case("instanceView"));
    let value: Vec<Value> = page
        .iter()
        .map(|k| if view { b.render_vm_expanded(k, true, false) } else { b.render(k) })
        .collect();
    let mut out = json!({ "value": value });
    if start + size < matched.len() {
        out["nextLink"] = next_link(b, call, start + size).into();
    }
    for k in &page {
        b.saw(k);
    }
    Ok(Json(out).into_response())
}

/// What `$filter` of `Resources_List` asks for.
#[derive(Default)]
struct ResourceFilter {
    tag_name: Option<String>,
    tag_value: Option<String>,
    props: Vec<(String, String)>,
    substrings: Vec<(String, String)>,
}

fn unquote(v: &str) -> Option<String> {
    Some(v.trim().strip_prefix('\'')?.strip_suffix('\'')?.replace("''", "'"))
}

/// The spec's filter grammar: `tagName eq 'k'` (with `and tagValue eq 'v'`) alone, or `eq`
/// on `resourceType`, `name`, `location`, `resourceGroup`, and `substringof('x', name |
/// resourceGroup)`, joined by `and`. A tag filter combined with anything else is ARM's
/// `InvalidFilterInQueryString`, as the live API answers.
fn parse_filter(filter: &str) -> Result<ResourceFilter, ArmError> {
    let invalid = || ArmError::invalid_filter(filter);
    let mut f = ResourceFilter::default();
    for term in super::prices::split_and(filter) {
        let t = term.trim();
        let lower = t.to_ascii_lowercase();
        if let Some(inner) = lower.strip_prefix("substringof(").and_then(|r| r.strip_suffix(')')) {
            let raw = &t["substringof(".len()..t.len() - 1];
            let (v, prop) = raw.rsplit_once(',').ok_or_else(invalid)?;
            let prop = prop.trim().to_ascii_lowercase();
            if !["name", "resourcegroup"].contains(&prop.as_str()) || inner.is_empty() {
                return Err(invalid());
            }
            f.substrings.push((prop, unquote(v).ok_or_else(invalid)?));
            continue;
        }
        let (prop, value) =
            t.split_once(" eq ").or_else(|| t.split_once(" EQ ")).ok_or_else(invalid)?;
        let value = unquote(value).ok_or_else(invalid)?;
        match prop.trim().to_ascii_lowercase().as_str() {
            "tagname" if f.tag_name.is_none() => f.tag_name = Some(value),
            "tagvalue" if f.tag_value.is_none() => f.tag_value = Some(value),
            p @ ("resourcetype" | "name" | "location" | "resourcegroup") => {
                f.props.push((p.to_string(), value))
            }
            _ => return Err(invalid()),
        }
    }
    let tags = f.tag_name.is_some() || f.tag_value.is_some();
    if (tags && (!f.props.is_empty() || !f.substrings.is_empty()))
        || (f.tag_value.is_some() && f.tag_name.is_none())
    {
        return Err(invalid());
    }
    Ok(f)
}

impl ResourceFilter {
    fn matches(&self, r: &Res) -> bool {
        if let Some(name) = &self.tag_name {
            let tag = r.tags.iter().find(|(k, _)| k.eq_ignore_ascii_case(name));
            match (tag, &self.tag_value) {
                (None, _) => return false,
                (Some((_, v)), Some(want)) if v != want => return false,
                _ => {}
            }
        }
        let prop = |p: &str| match p {
            "resourcetype" => r.kind.full_type(),
            "name" => r.name.clone(),
            "location" => r.location.clone(),
            _ => r.rg.clone(),
        };
        self.props.iter().all(|(p, v)| prop(p).eq_ignore_ascii_case(v))
            && self
                .substrings
                .iter()
                .all(|(p, v)| prop(p).to_ascii_lowercase().contains(&v.to_ascii_lowercase()))
    }
}

/// `Resources_List` / `Resources_ListByResourceGroup` (resources.json, 2021-04-01).
fn list_resources(
    b: &mut Backend,
    call: &Call,
    rg: Option<&str>,
    _version: &str,
) -> Result<Response, ArmError> {
    let filter = call.q("$filter").unwrap_or("").to_string();
    let f =
        if filter.trim().is_empty() { ResourceFilter::default() } else { parse_filter(&filter)? };
    let top = parse_top(call)?;
    let start = parse_skiptoken(call)?;
    let expand: Vec<String> = call
        .q("$expand")
        .unwrap_or("")
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let matched: Vec<&Res> = b
        .res
        .values()
        .filter(|r| rg.is_none_or(|g| r.rg.eq_ignore_ascii_case(g)))
        .filter(|r| f.matches(r))
        .collect();
    if b.failing_scope(matched.iter().copied()) {
        let tracking = b.guid();
        return Err(ArmError::internal(&b.cfg.subscription_id, &tracking));
    }
    let size = top.unwrap_or(usize::MAX).min(b.cfg.page_size).max(1);
    let with_tags = !(f.tag_name.is_some() && f.tag_value.is_some());
    let value: Vec<Value> = matched
        .iter()
        .skip(start)
        .take(size)
        .map(|r| b.render_generic(r, with_tags, &expand))
        .collect();
    let mut out = json!({ "value": value });
    if start + size < matched.len() {
        out["nextLink"] = next_link(b, call, start + size).into();
    }
    Ok(Json(out).into_response())
}

// ---- the Azure-only control routes ------------------------------------------------------

#[derive(Deserialize)]
struct SpotBody {
    /// `SkuNotAvailable`, `Overconstrained`, `AllocationFailed`, or `null`.
    refuse: Option<String>,
}

/// `POST /_emulator/spot-refusal {"refuse": ..}`:
/// [`AzureEmulator::refuse_spot`](super::AzureEmulator::refuse_spot),
/// choosing how Azure refuses (the shared `spot-capacity` uses
/// [`AzureConfig::spot_refusal`](super::AzureConfig::spot_refusal)).
async fn spot_control(State(s): State<S>, Json(b): Json<SpotBody>) -> Response {
    let refusal = match b.refuse.as_deref() {
        None => None,
        Some("SkuNotAvailable") => Some(SpotRefusal::SkuNotAvailable),
        Some("Overconstrained" | "OverconstrainedAllocationRequest") => {
            Some(SpotRefusal::Overconstrained)
        }
        Some("AllocationFailed") => Some(SpotRefusal::AllocationFailed),
        Some(other) => {
            let body = json!({"error": format!("unknown refusal {other:?}")});
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    s.lock().spot_refusal = refusal;
    StatusCode::NO_CONTENT.into_response()
}

/// `GET /_emulator/resources`: every resource with its tags and attachment.
async fn resources_control(State(s): State<S>) -> Response {
    let list: Vec<Value> = s
        .lock()
        .resources()
        .into_iter()
        .map(|r| {
            json!({
                "kind": r.kind.full_type(), "id": r.id, "name": r.name,
                "resourceGroup": r.resource_group, "location": r.location, "tags": r.tags,
                "provisioningState": r.provisioning_state, "attachedTo": r.attached_to,
            })
        })
        .collect();
    Json(json!({ "resources": list })).into_response()
}
