//! The HTTP face of the fake: routing, query parameters, content negotiation and watch
//! streams. One handler serves both the in-process client and the TCP listener, so
//! kube-rs and kubectl see the same behaviour.

use crate::error::{ApiError, ApiResult};
use crate::managed::Scope;
use crate::registry::{ResourceType, Storage};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{
    Change, ChangeKind, DeleteOpts, Deleted, FieldValidation, PatchType, Propagation, Store,
    WriteCtx,
};
use crate::{FakeApi, RequestRecord};
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use k8s_openapi::jiff;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;

const MAX_BODY: usize = 16 * 1024 * 1024;

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response<Body> {
    let mut r = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .expect("valid response");
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "'"))) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status(), &[])
}

/// How the client asked to see objects (`Accept: application/json;as=...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    Full,
    Table,
    Metadata,
}

fn view_of(headers: &HeaderMap) -> View {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The first acceptable alternative wins; we can serve all three.
    for alt in accept.split(',') {
        let alt = alt.replace(' ', "");
        if alt.contains("as=Table") {
            return View::Table;
        }
        if alt.contains("as=PartialObjectMetadata") {
            return View::Metadata;
        }
        if alt.starts_with("application/json") || alt.starts_with("*/*") {
            return View::Full;
        }
    }
    View::Full
}

struct ResPath {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    subresource: Option<String>,
}

enum Route {
    Discovery(Value),
    NotFound,
    Resource(ResPath),
    Text(&'static str),
}

fn route(api: &FakeApi, path: &str, host: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let store = api.store();
    let reg = &store.registry;
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => {
            return Route::Discovery(json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake-kube", "gitCommit": "fake",
                "gitTreeState": "clean", "buildDate": "2025-08-27T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64",
            }));
        }
        ["healthz"] | ["livez"] | ["readyz"] => return Route::Text("ok"),
        ["openapi", "v3"] => return Route::Discovery(reg.openapi_v3_root()),
        ["openapi", "v3", "api", v] => {
            return reg
                .openapi_v3_group_version("", v)
                .map_or(Route::NotFound, Route::Discovery);
        }
        ["openapi", "v3", "apis", g, v] => {
            return reg
                .openapi_v3_group_version(g, v)
                .map_or(Route::NotFound, Route::Discovery);
        }
        ["api"] => return Route::Discovery(reg.api_versions(host)),
        ["apis"] => return Route::Discovery(reg.api_group_list()),
        ["apis", g] => return reg.api_group(g).map_or(Route::NotFound, Route::Discovery),
        ["api", v] => {
            return reg
                .resource_list("", v)
                .map_or(Route::NotFound, Route::Discovery);
        }
        ["apis", g, v] => {
            return reg
                .resource_list(g, v)
                .map_or(Route::NotFound, Route::Discovery);
        }
        ["api", v, rest @ ..] => ("", v, rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Route::NotFound,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => (
            Some(ns.to_string()),
            std::iter::once(*plural)
                .chain(tail.iter().copied())
                .collect::<Vec<_>>(),
        ),
        other => (None, other.to_vec()),
    };
    let (plural, name, subresource) = match rest.as_slice() {
        [p] => (p, None, None),
        [p, n] => (p, Some(n.to_string()), None),
        [p, n, s] => (p, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::NotFound,
    };
    Route::Resource(ResPath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        plural: plural.to_string(),
        name,
        subresource,
    })
}

fn manager_from_user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let prefix = ua.split('/').next().unwrap_or("").trim();
    if prefix.is_empty() {
        "unknown".into()
    } else {
        prefix.to_string()
    }
}

pub async fn handle(api: FakeApi, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query_string = parts.uri.query().unwrap_or("").to_string();
    let q = parse_query(parts.uri.query());
    let headers = parts.headers;
    let method = parts.method;
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let user = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| api.auth().tokens.get(t.trim()).map(|u| u.username.clone()));
    let mut record = RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: query_string,
        verb: method.as_str().to_lowercase(),
        group: None,
        version: None,
        resource: None,
        subresource: None,
        namespace: None,
        name: None,
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        field_manager: q.get("fieldManager").cloned(),
        user,
        code: 200,
        metadata_only: view_of(&headers) == View::Metadata,
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            let resp = error_response(&ApiError::bad_request(format!("reading the body: {e}")));
            record.code = resp.status().as_u16();
            api.record(record);
            return resp;
        }
    };
    let resp = match route(&api, &path, &host) {
        Route::Text(t) => Response::builder()
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from(t))
            .expect("valid response"),
        Route::Discovery(doc) if method == Method::GET => json_response(200, &doc, &[]),
        Route::Discovery(_) => error_response(&ApiError::method_not_allowed(format!(
            "{method} is not supported on {path}"
        ))),
        Route::NotFound => error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
        Route::Resource(rp) => {
            record.group = Some(rp.group.clone());
            record.version = Some(rp.version.clone());
            record.resource = Some(rp.plural.clone());
            record.subresource = rp.subresource.clone();
            record.namespace = rp.namespace.clone();
            record.name = rp.name.clone();
            match resource_request(&api, &method, &rp, &q, &headers, body, &mut record.verb).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
    };
    record.code = resp.status().as_u16();
    api.record(record);
    resp
}

fn verb_for(method: &Method, rp: &ResPath, q: &HashMap<String, String>) -> &'static str {
    let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    match (method.as_str(), rp.name.is_some()) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn write_ctx(q: &HashMap<String, String>, headers: &HeaderMap, version: &str) -> WriteCtx {
    WriteCtx {
        field_manager: q.get("fieldManager").filter(|s| !s.is_empty()).cloned(),
        default_manager: manager_from_user_agent(headers),
        dry_run: q.get("dryRun").is_some_and(|v| v == "All"),
        force: q.get("force").is_some_and(|v| v == "true"),
        field_validation: match q.get("fieldValidation").map(String::as_str) {
            Some("Strict") => FieldValidation::Strict,
            Some("Warn") => FieldValidation::Warn,
            _ => FieldValidation::Ignore,
        },
        version: version.to_string(),
        warnings: Vec::new(),
    }
}

fn parse_body(body: &Bytes, headers: &HeaderMap) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/vnd.kubernetes.protobuf") {
        return crate::protobuf::decode(body);
    }
    serde_json::from_slice(body)
        .or_else(|_| serde_yaml::from_slice(body))
        .map_err(|e| ApiError::bad_request(format!("the body is neither JSON nor YAML: {e}")))
}

async fn resource_request(
    api: &FakeApi,
    method: &Method,
    rp: &ResPath,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
    verb_out: &mut String,
) -> ApiResult<Response<Body>> {
    let verb = verb_for(method, rp, q);
    *verb_out = verb.to_string();
    let rt = api
        .store()
        .registry
        .lookup(&rp.group, &rp.version, &rp.plural)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
    if rp.namespace.is_some() && !rt.namespaced {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    if rt.namespaced && rp.namespace.is_none() && !matches!(verb, "list" | "watch") {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let scope = match rp.subresource.as_deref() {
        None => Scope::Main {
            exclude_status: rt.status_subresource,
        },
        Some("status") if rt.status_subresource => Scope::Status,
        Some("scale") if rt.scale(&rp.version).is_some() => Scope::Scale,
        Some(_) => {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    };
    if let Some(d) = api.delay_for(verb, &rt) {
        tokio::time::sleep(d).await;
    }
    if let Some(e) = api.take_injection(verb, &rt, rp.name.as_deref()) {
        return Err(e);
    }
    if scope == Scope::Scale {
        return scale_request(api, &rt, rp, verb, q, headers, &body);
    }
    let ns = rp.namespace.as_deref();
    let view = view_of(headers);
    if rt.storage == Storage::Review {
        if verb != "create" {
            return Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported on {}",
                rt.plural
            )));
        }
        let mut review = parse_body(&body, headers)?;
        review["apiVersion"] = json!(rt.api_version(&rp.version));
        review["kind"] = json!(rt.kind);
        let auth = api.auth();
        let answer = if rt.plural == "tokenreviews" {
            auth.token_review(review)
        } else {
            auth.subject_access_review(review)
        };
        return Ok(json_response(201, &answer, &[]));
    }
    match verb {
        "get" => {
            let store = api.store();
            let obj = store.get(&rt, ns, rp.name.as_deref().unwrap_or(""))?;
            let shown = store.present(&rt, &obj, &rp.version);
            Ok(json_response(
                200,
                &render_one(&rt, &rp.version, shown, view, q, store.resource_version()),
                &[],
            ))
        }
        "list" => list(api, &rt, rp, q, view),
        "watch" => watch(api, &rt, rp, q, view),
        "create" => {
            let obj = parse_body(&body, headers)?;
            let mut ctx = write_ctx(q, headers, &rp.version);
            let mut store = api.store();
            let created = store.create(&rt, ns, obj, &mut ctx)?;
            let shown = store.present(&rt, &created, &rp.version);
            Ok(json_response(201, &shown, &ctx.warnings))
        }
        "update" => {
            let obj = parse_body(&body, headers)?;
            let mut ctx = write_ctx(q, headers, &rp.version);
            let mut store = api.store();
            let updated = store.update(
                &rt,
                ns,
                rp.name.as_deref().unwrap_or(""),
                obj,
                scope,
                &mut ctx,
            )?;
            let shown = store.present(&rt, &updated, &rp.version);
            Ok(json_response(200, &shown, &ctx.warnings))
        }
        "patch" => {
            let ptype = patch_type(headers)?;
            let mut ctx = write_ctx(q, headers, &rp.version);
            let mut store = api.store();
            let (obj, created) = store.patch(
                &rt,
                ns,
                rp.name.as_deref().unwrap_or(""),
                ptype,
                &body,
                scope,
                &mut ctx,
            )?;
            let shown = store.present(&rt, &obj, &rp.version);
            Ok(json_response(
                if created { 201 } else { 200 },
                &shown,
                &ctx.warnings,
            ))
        }
        "delete" => {
            let opts = delete_opts(q, &body)?;
            let mut store = api.store();
            let name = rp.name.as_deref().unwrap_or("");
            match store.delete(&rt, ns, name, &opts)? {
                Deleted::Pending(obj) => Ok(json_response(
                    200,
                    &store.present(&rt, &obj, &rp.version),
                    &[],
                )),
                Deleted::Gone(obj) if rt.return_deleted_object => Ok(json_response(
                    200,
                    &store.present(&rt, &obj, &rp.version),
                    &[],
                )),
                Deleted::Gone(obj) => Ok(json_response(
                    200,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                    "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)},
                    }),
                    &[],
                )),
            }
        }
        "deletecollection" => {
            let opts = delete_opts(q, &body)?;
            let labels =
                crate::selector::parse_labels(q.get("labelSelector").map_or("", String::as_str))
                    .map_err(|e| {
                        ApiError::bad_request(format!("unable to parse requirement: {e}"))
                    })?;
            let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?;
            let mut store = api.store();
            let (items, _, _) = store.list(&rt, ns, (&labels, &fields), None, None);
            let mut deleted = Vec::new();
            for ((item_ns, name), _) in items {
                let item_ns = (!item_ns.is_empty()).then_some(item_ns);
                match store.delete(&rt, item_ns.as_deref(), &name, &opts) {
                    Ok(Deleted::Pending(o) | Deleted::Gone(o)) => {
                        deleted.push(store.present(&rt, &o, &rp.version))
                    }
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = store.resource_version();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(&rp.version),
                        "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
                &[],
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            rt.plural
        ))),
    }
}

fn patch_type(headers: &HeaderMap) -> ApiResult<PatchType> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    PatchType::from_content_type(ct).ok_or_else(|| {
        ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct:?})"
        ))
    })
}

/// `/scale` of a custom resource: get, update and patch of an `autoscaling/v1` Scale
/// (what `kubectl scale` and kube's `Api::{get,patch,replace}_scale` use).
fn scale_request(
    api: &FakeApi,
    rt: &ResourceType,
    rp: &ResPath,
    verb: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response<Body>> {
    let paths = rt
        .scale(&rp.version)
        .cloned()
        .expect("the caller routes only declared scale subresources here");
    let ns = rp.namespace.as_deref();
    let name = rp.name.as_deref().unwrap_or("");
    let mut ctx = write_ctx(q, headers, &rp.version);
    let scale = match verb {
        "get" => {
            let store = api.store();
            let scale = store.get_scale(rt, ns, name, &paths)?;
            if view_of(headers) == View::Table {
                let doc = scale_table(rt, &rp.version, scale, q, store.resource_version());
                return Ok(json_response(200, &doc, &[]));
            }
            scale
        }
        "update" => {
            let obj = parse_body(body, headers)?;
            api.store()
                .update_scale(rt, ns, name, &paths, obj, &mut ctx)?
        }
        "patch" => {
            let ptype = patch_type(headers)?;
            api.store()
                .patch_scale(rt, ns, name, &paths, ptype, body, &mut ctx)?
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported on {}/scale",
                rt.plural
            )));
        }
    };
    Ok(json_response(200, &scale, &ctx.warnings))
}

/// `kubectl get --subresource=scale`: the Scale as a Table with the columns the real
/// server's scale table convertor has, instead of the parent's printer columns.
fn scale_table(
    rt: &ResourceType,
    version: &str,
    scale: Value,
    q: &HashMap<String, String>,
    rv: u64,
) -> Value {
    let mut scale_rt = rt.clone();
    scale_rt.printer_columns =
        std::collections::BTreeMap::from([(version.to_string(), crate::scale::table_columns())]);
    table(&scale_rt, version, &[scale], q, rv)
}

fn delete_opts(q: &HashMap<String, String>, body: &Bytes) -> ApiResult<DeleteOpts> {
    let b: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let policy = b
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| q.get("propagationPolicy").cloned());
    let propagation = match policy.as_deref() {
        Some("Foreground") => Some(Propagation::Foreground),
        Some("Orphan") => Some(Propagation::Orphan),
        Some("Background") => Some(Propagation::Background),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid propagationPolicy {other:?}"
            )));
        }
        None if b.get("orphanDependents").and_then(Value::as_bool) == Some(true) => {
            Some(Propagation::Orphan)
        }
        None => None,
    };
    let dry_run = b
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || q.get("dryRun").is_some_and(|v| v == "All");
    Ok(DeleteOpts {
        propagation,
        precondition_uid: b
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        precondition_rv: b
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        dry_run,
    })
}

fn selectors(q: &HashMap<String, String>) -> ApiResult<(LabelSelector, FieldSelector)> {
    let labels = crate::selector::parse_labels(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn hex_encode(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn list(
    api: &FakeApi,
    rt: &ResourceType,
    rp: &ResPath,
    q: &HashMap<String, String>,
    view: View,
) -> ApiResult<Response<Body>> {
    let (labels, fields) = selectors(q)?;
    let after = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let decoded =
                hex_decode(token).ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            let (ns, name) = decoded
                .split_once('\0')
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            Some((ns.to_string(), name.to_string()))
        }
        None => None,
    };
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let store = api.store();
    let (items, remaining, rv) = store.list(
        rt,
        rp.namespace.as_deref(),
        (&labels, &fields),
        after.as_ref(),
        limit,
    );
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if remaining > 0
        && let Some(last) = items.last()
    {
        let last = &last.0;
        meta["continue"] = json!(hex_encode(&format!("{}\0{}", last.0, last.1)));
        meta["remainingItemCount"] = json!(remaining);
    }
    let objs: Vec<Value> = items
        .into_iter()
        .map(|(_, o)| store.present(rt, &o, &rp.version))
        .collect();
    let doc = match view {
        View::Table => table(rt, &rp.version, &objs, q, rv),
        View::Metadata => json!({
            "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "items": objs.iter().map(partial_metadata).collect::<Vec<_>>(),
        }),
        View::Full => json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(&rp.version),
            "metadata": meta,
            "items": objs,
        }),
    };
    Ok(json_response(200, &doc, &[]))
}

fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

fn render_one(
    rt: &ResourceType,
    version: &str,
    obj: Value,
    view: View,
    q: &HashMap<String, String>,
    rv: u64,
) -> Value {
    match view {
        View::Full => obj,
        View::Metadata => partial_metadata(&obj),
        View::Table => table(rt, version, &[obj], q, rv),
    }
}

fn age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|t| t.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Evaluates the JSONPath forms printer columns use: fields (`.spec.a.b`), indexes
/// (`.items[0].x`) and equality filters, which pick the first matching element as kubectl
/// shows it (`.status.conditions[?(@.type=="Ready")].status`).
fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path_segments(path.trim_start_matches('.')) {
        let (field, bracket) = match seg.split_once('[') {
            Some((f, rest)) => (f, Some(rest.strip_suffix(']').unwrap_or(rest))),
            None => (seg, None),
        };
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        match bracket {
            None => {}
            Some(b) => match b.parse::<usize>() {
                Ok(i) => cur = cur.get(i)?,
                Err(_) => {
                    let (key, want) = parse_filter(b)?;
                    cur = cur
                        .as_array()?
                        .iter()
                        .find(|item| item.get(key).and_then(Value::as_str) == Some(want))?;
                }
            },
        }
    }
    Some(cur)
}

/// Splits at the dots outside brackets: `a.b[?(@.c=="d")].e` is `a`, `b[?(@.c=="d")]`, `e`.
fn path_segments(path: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in path.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            '.' if depth == 0 => {
                out.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&path[start..]);
    out.retain(|s| !s.is_empty());
    out
}

/// `?(@.key=="value")` (or single quotes) -> (key, value).
fn parse_filter(b: &str) -> Option<(&str, &str)> {
    let inner = b.strip_prefix("?(@.")?.strip_suffix(')')?;
    let (key, value) = inner.split_once("==")?;
    let value = value.trim();
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))?;
    Some((key.trim(), value))
}

fn cell(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => json!("<none>"),
        Some(Value::String(s)) => json!(s),
        Some(other) => other.clone(),
    }
}

/// A `meta.k8s.io/v1` Table, which `kubectl get` asks for and prints as columns.
fn table(
    rt: &ResourceType,
    version: &str,
    objs: &[Value],
    q: &HashMap<String, String>,
    rv: u64,
) -> Value {
    type Col = (String, String, Box<dyn Fn(&Value) -> Value>);
    let created = |o: &Value| {
        json!(age(o
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)))
    };
    let mut cols: Vec<Col> = vec![(
        "Name".into(),
        "string".into(),
        Box::new(|o: &Value| cell(o.pointer("/metadata/name"))),
    )];
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "namespaces") => cols.push((
            "Status".into(),
            "string".into(),
            Box::new(|o| cell(o.pointer("/status/phase"))),
        )),
        ("", "secrets") => {
            cols.push((
                "Type".into(),
                "string".into(),
                Box::new(|o| cell(o.get("type"))),
            ));
            cols.push((
                "Data".into(),
                "integer".into(),
                Box::new(|o| {
                    json!(
                        o.get("data")
                            .and_then(Value::as_object)
                            .map_or(0, |m| m.len())
                    )
                }),
            ));
        }
        ("", "configmaps") => cols.push((
            "Data".into(),
            "integer".into(),
            Box::new(|o| {
                let n = |k: &str| o.get(k).and_then(Value::as_object).map_or(0, |m| m.len());
                json!(n("data") + n("binaryData"))
            }),
        )),
        ("coordination.k8s.io", "leases") => cols.push((
            "Holder".into(),
            "string".into(),
            Box::new(|o| cell(o.pointer("/spec/holderIdentity"))),
        )),
        _ => {}
    }
    let printer = rt.printer_columns.get(version).cloned().unwrap_or_default();
    let mut has_age = false;
    for c in printer {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let ty = c
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("string")
            .to_string();
        let path = c
            .get("jsonPath")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if path == ".metadata.creationTimestamp" {
            has_age = true;
        }
        let is_date = ty == "date";
        cols.push((
            name,
            if is_date { "string".into() } else { ty },
            Box::new(move |o| {
                let v = json_path(o, &path);
                if is_date {
                    v.and_then(Value::as_str)
                        .map_or(json!("<unknown>"), |s| json!(age(Some(s))))
                } else {
                    cell(v)
                }
            }),
        ));
    }
    if !has_age {
        cols.push(("Age".into(), "string".into(), Box::new(created)));
    }
    let include = q
        .get("includeObject")
        .map_or("PartialObjectMetadata", String::as_str);
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cols.iter().map(|(_, _, f)| f(o)).collect::<Vec<_>>()});
            match include {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => row["object"] = partial_metadata(o),
            }
            row
        })
        .collect();
    let defs: Vec<Value> = cols
        .iter()
        .enumerate()
        .map(|(i, (name, ty, _))| {
            json!({"name": name, "type": ty, "format": if i == 0 { "name" } else { "" },
                   "description": name, "priority": 0})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": defs,
        "rows": rows,
    })
}

struct WatchFilter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns))
            && crate::selector::selects(&self.labels, obj)
            && self.fields.matches_object(obj)
    }

    /// The event type this watch reports for a change, if any: objects entering or leaving
    /// the selection appear as ADDED or DELETED, as on a real server.
    fn event_type(&self, c: &Change) -> Option<&'static str> {
        let now = self.matches(&c.obj);
        match c.kind {
            ChangeKind::Added => now.then_some("ADDED"),
            ChangeKind::Deleted => now.then_some("DELETED"),
            ChangeKind::Modified => {
                let before = c.old.as_ref().is_some_and(|o| self.matches(o));
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        }
    }
}

fn watch(
    api: &FakeApi,
    rt: &ResourceType,
    rp: &ResPath,
    q: &HashMap<String, String>,
    view: View,
) -> ApiResult<Response<Body>> {
    let (labels, fields) = selectors(q)?;
    let filter = WatchFilter {
        namespace: rp.namespace.clone(),
        labels,
        fields,
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let send_initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let start = api.store().watch(
        rt,
        rp.namespace.as_deref(),
        q.get("resourceVersion").map(String::as_str),
        send_initial,
    );
    let ctx = StreamCtx {
        api: api.clone(),
        rt: rt.clone(),
        version: rp.version.clone(),
        view,
        query: q.clone(),
        filter,
        bookmarks,
        tx,
    };
    match start {
        Ok(start) => {
            let interval = api.bookmark_interval();
            tokio::spawn(ctx.run(start, timeout, interval));
        }
        Err(e) => {
            // Like a real server: the watch is accepted, then ends with an ERROR event.
            tokio::spawn(async move {
                let line = json!({"type": "ERROR", "object": e.to_status()});
                let _ = ctx.tx.send(line_bytes(&line)).await;
            });
        }
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .expect("valid response"))
}

fn line_bytes(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

struct StreamCtx {
    api: FakeApi,
    rt: ResourceType,
    version: String,
    view: View,
    query: HashMap<String, String>,
    filter: WatchFilter,
    bookmarks: bool,
    tx: mpsc::Sender<Bytes>,
}

impl StreamCtx {
    async fn send_change(&self, c: &Change) -> bool {
        let Some(ty) = self.filter.event_type(c) else {
            return true;
        };
        if let Some(lag) = self.api.delay_for("watch-event", &self.rt) {
            tokio::time::sleep(lag).await;
        }
        let mut obj = c.obj.clone();
        obj["apiVersion"] = json!(self.rt.api_version(&self.version));
        obj["kind"] = json!(self.rt.kind);
        let obj = render_one(&self.rt, &self.version, obj, self.view, &self.query, c.rv);
        self.tx
            .send(line_bytes(&json!({"type": ty, "object": obj})))
            .await
            .is_ok()
    }

    async fn send_bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        // A metadata-only watch gets its bookmarks as PartialObjectMetadata too, as from
        // a real server.
        let obj = match self.view {
            View::Metadata => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            }
            _ => {
                json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(&self.version), "metadata": meta})
            }
        };
        self.tx
            .send(line_bytes(&json!({"type": "BOOKMARK", "object": obj})))
            .await
            .is_ok()
    }

    async fn run(
        self,
        start: crate::store::WatchStart,
        timeout: Option<Duration>,
        bookmark_every: Duration,
    ) {
        let mut rx = start.rx;
        for c in &start.initial {
            if !self.send_change(c).await {
                return;
            }
        }
        if let Some(rv) = start.initial_end_rv
            && !self.send_bookmark(rv, true).await
        {
            return;
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        loop {
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => if !self.send_change(&c).await { return },
                    None => return,
                },
                _ = ticker.tick(), if self.bookmarks => {
                    let rv = self.api.store().resource_version();
                    // Everything up to `rv` was queued for us under the store lock; send it first.
                    while let Ok(c) = rx.try_recv() {
                        if !self.send_change(&c).await { return }
                    }
                    if !self.send_bookmark(rv, false).await { return }
                }
                _ = sleep => return,
                _ = self.tx.closed() => return,
            }
        }
    }
}

/// Used by test hooks to show objects the way a GET would.
pub fn present_all(store: &Store, rt: &ResourceType) -> Vec<Value> {
    store
        .snapshot(&rt.key())
        .iter()
        .map(|o| store.present(rt, o, &rt.versions[0]))
        .collect()
}

#[cfg(test)]
mod json_path_tests {
    use super::*;

    #[test]
    fn printer_column_paths() {
        let obj = json!({
            "spec": {"provider": "ec2", "ports": [80, 443]},
            "status": {"conditions": [
                {"type": "Provisioned", "status": "True"},
                {"type": "Ready", "status": "False"},
            ]},
        });
        let cases = [
            (".spec.provider", Some(json!("ec2"))),
            (".spec.ports[1]", Some(json!(443))),
            (
                r#".status.conditions[?(@.type=="Ready")].status"#,
                Some(json!("False")),
            ),
            (
                ".status.conditions[?(@.type=='Provisioned')].status",
                Some(json!("True")),
            ),
            (r#".status.conditions[?(@.type=="Healthy")].status"#, None),
            (".spec.missing", None),
        ];
        for (path, want) in cases {
            assert_eq!(json_path(&obj, path).cloned(), want, "{path}");
        }
    }
}
