//! The `/v1` HTTP API: routing, the gate every call passes (request log, faults, bearer
//! token, schedules), and thin handlers over [`Backend`](super::state::Backend).

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;

use super::error::HetznerError;
use super::state::{FaultEffect, Listing, Shared, lock, now_secs};
use crate::control::FaultOp;

/// Hetzner's documented default: 3600 requests per hour per project.
const RATE_LIMIT: u64 = 3600;

pub(crate) fn router(state: Shared) -> Router<Shared> {
    Router::new()
        .route("/servers", get(list_servers).post(create_server))
        .route("/servers/{id}", get(get_server).delete(delete_server))
        .route("/servers/{id}/actions/{action_id}", get(get_server_action))
        .route("/actions/{id}", get(get_action))
        .route("/primary_ips", get(list_primary_ips))
        .route(
            "/primary_ips/{id}",
            get(get_primary_ip).delete(delete_primary_ip),
        )
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state, gate))
}

pub(crate) async fn unknown_route() -> Response {
    HetznerError::new(404, "not_found", "not found").into_response()
}

async fn method_not_allowed() -> Response {
    HetznerError::method_not_allowed().into_response()
}

/// Which shared fault operation a call belongs to (`None`: only `FaultOp::Any` applies).
fn classify(method: &Method, path: &str) -> Option<FaultOp> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segs.as_slice()) {
        ("POST", ["v1", "servers"]) => Some(FaultOp::Create),
        ("GET", ["v1", "servers"]) | ("GET", ["v1", "primary_ips"]) => Some(FaultOp::List),
        ("GET", ["v1", "servers", _])
        | ("GET", ["v1", "servers", _, "actions", _])
        | ("GET", ["v1", "actions", _])
        | ("GET", ["v1", "primary_ips", _]) => Some(FaultOp::Get),
        ("DELETE", ["v1", "servers", _]) | ("DELETE", ["v1", "primary_ips", _]) => {
            Some(FaultOp::Delete)
        }
        _ => None,
    }
}

/// Logs the call, applies an injected fault, checks the token, runs the time-based
/// schedules. A fault stands for a failure in front of the API (load balancer, rate
/// limiter), so it wins over authentication, as with the other emulators.
async fn gate(State(state): State<Shared>, req: Request, next: Next) -> Response {
    // Nesting under `/v1` strips the prefix from `req.uri()`; log and classify the path the
    // client sent.
    let uri = req
        .extensions()
        .get::<OriginalUri>()
        .map(|u| u.0.clone())
        .unwrap_or_else(|| req.uri().clone());
    let path = uri.path().to_string();
    let line = match uri.query() {
        Some(q) => format!("{} {}?{}", req.method(), path, q),
        None => format!("{} {}", req.method(), path),
    };
    let op = classify(req.method(), &path);
    let now = std::time::Instant::now();
    let (fault, authorized, limited) = {
        let mut b = lock(&state);
        b.requests.push(line);
        b.stats
            .record(op, &crate::control::route_of(req.method().as_str(), &path));
        // The rate limit stands in front of everything, authentication included.
        let limited = b
            .limiter
            .as_mut()
            .and_then(|l| (!l.take(now)).then(|| l.spec().per_hour));
        // A limited call never reaches what stands behind the limiter: its faults wait.
        let fault = if limited.is_none() {
            b.take_fault(op)
        } else {
            None
        };
        let want = format!("Bearer {}", b.cfg.token);
        let authorized = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            == Some(want.as_str());
        (fault, authorized, limited)
    };
    let mut resp = match (limited, fault) {
        (Some(per_hour), _) => HetznerError::rate_limited_at(per_hour).into_response(),
        (None, Some(FaultEffect::Fail(e))) => e.into_response(),
        (None, Some(FaultEffect::Delay(d))) => {
            tokio::time::sleep(d).await;
            pass(&state, authorized, req, next).await
        }
        (None, None) => pass(&state, authorized, req, next).await,
    };
    // Read after the call: a slow fault or a long handler has let the bucket refill.
    let mut b = lock(&state);
    if resp.status() == StatusCode::TOO_MANY_REQUESTS {
        b.stats.rate_limited += 1;
    }
    let (limit, remaining, full_in) = match b.limiter.as_mut() {
        Some(l) => {
            let now = std::time::Instant::now();
            (
                u64::from(l.spec().per_hour),
                l.remaining(now),
                l.until_full(now).as_secs(),
            )
        }
        None => (RATE_LIMIT, RATE_LIMIT, 0),
    };
    drop(b);
    let headers = resp.headers_mut();
    headers
        .entry("ratelimit-limit")
        .or_insert(HeaderValue::from(limit));
    headers
        .entry("ratelimit-remaining")
        .or_insert(HeaderValue::from(remaining));
    headers
        .entry("ratelimit-reset")
        .or_insert(HeaderValue::from(now_secs() + full_in));
    resp
}

async fn pass(state: &Shared, authorized: bool, req: Request, next: Next) -> Response {
    if !authorized {
        return HetznerError::unauthorized().into_response();
    }
    lock(state).tick();
    next.run(req).await
}

fn reply(result: Result<Value, HetznerError>, ok: StatusCode) -> Response {
    match result {
        Ok(body) => (ok, Json(body)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn listing(result: Result<Listing, HetznerError>) -> Response {
    match result {
        Ok(l) => {
            let mut resp = Json(l.body).into_response();
            if let Ok(v) = HeaderValue::from_str(&l.link) {
                resp.headers_mut().insert("link", v);
            }
            resp
        }
        Err(e) => e.into_response(),
    }
}

async fn create_server(State(state): State<Shared>, body: Bytes) -> Response {
    reply(lock(&state).create_server(&body), StatusCode::CREATED)
}

async fn list_servers(
    State(state): State<Shared>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    listing(lock(&state).list_servers(&query))
}

async fn get_server(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    reply(lock(&state).get_server(&id), StatusCode::OK)
}

async fn delete_server(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    reply(lock(&state).delete_server(&id), StatusCode::OK)
}

async fn get_action(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    reply(lock(&state).get_action(&id), StatusCode::OK)
}

async fn get_server_action(
    State(state): State<Shared>,
    Path((id, action_id)): Path<(String, String)>,
) -> Response {
    reply(
        lock(&state).get_server_action(&id, &action_id),
        StatusCode::OK,
    )
}

async fn list_primary_ips(
    State(state): State<Shared>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    listing(lock(&state).list_primary_ips(&query))
}

async fn get_primary_ip(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    reply(lock(&state).get_primary_ip(&id), StatusCode::OK)
}

async fn delete_primary_ip(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match lock(&state).delete_primary_ip(&id) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}
