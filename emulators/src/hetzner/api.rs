//! The `/v1` HTTP API: routing, what the framework's gate needs to know about Hetzner
//! ([`Api`]: classification, bearer token, rate-limit answers and headers, schedules), thin
//! handlers over [`Backend`], and the Hetzner-only control routes.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::HetznerError;
use super::state::{Backend, Listing, now_secs};
use crate::control::{FaultOp, RateLimit};
use crate::framework::{Api, Shared, Traffic};

type Shared_ = Shared<Backend>;

/// Hetzner's documented default: 3600 requests per hour per project.
const RATE_LIMIT: u64 = 3600;

pub(crate) fn router() -> Router<Shared_> {
    Router::new()
        .route("/servers", get(list_servers).post(create_server))
        .route("/servers/{id}", get(get_server).delete(delete_server))
        .route("/servers/{id}/actions/{action_id}", get(get_server_action))
        .route("/actions/{id}", get(get_action))
        .route("/primary_ips", get(list_primary_ips))
        .route("/primary_ips/{id}", get(get_primary_ip).delete(delete_primary_ip))
        .route("/server_types", get(list_server_types))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
}

pub(crate) async fn unknown_route() -> Response {
    HetznerError::new(404, "not_found", "not found").into_response()
}

async fn method_not_allowed() -> Response {
    HetznerError::method_not_allowed().into_response()
}

impl Api for Backend {
    type Error = HetznerError;

    fn traffic(&mut self) -> &mut Traffic<HetznerError> {
        &mut self.traffic
    }

    /// `create` is `POST /v1/servers`; `get` the server, action and Primary IP reads;
    /// `delete` both `DELETE`s; `list` both lists. Calls are named by method and path with
    /// ids as `{id}`.
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let op = match (method.as_str(), segs.as_slice()) {
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
        };
        (op, crate::control::route_of(method.as_str(), path))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("Bearer {}", self.cfg.token);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> HetznerError {
        HetznerError::unauthorized()
    }

    fn rate_limited(&self, limit: RateLimit) -> HetznerError {
        HetznerError::rate_limited_at(limit.per_hour)
    }

    fn tick(&mut self) {
        Backend::tick(self)
    }

    /// `RateLimit-Limit`, `-Remaining` and `-Reset` on every answer, read after the call:
    /// a slow fault or a long handler has let the bucket refill. Without an enforced
    /// limit, Hetzner's default with a full bucket.
    fn decorate(&mut self, resp: &mut Response) {
        let now = std::time::Instant::now();
        let (limit, remaining, full_in) = match self.traffic.limits.bucket("", now) {
            Some(l) => {
                (u64::from(l.spec().per_hour), l.remaining(now), l.until_full(now).as_secs())
            }
            None => (RATE_LIMIT, RATE_LIMIT, 0),
        };
        let headers = resp.headers_mut();
        headers.entry("ratelimit-limit").or_insert(HeaderValue::from(limit));
        headers.entry("ratelimit-remaining").or_insert(HeaderValue::from(remaining));
        headers.entry("ratelimit-reset").or_insert(HeaderValue::from(now_secs() + full_in));
    }
}

/// The Hetzner-only control routes: `POST /_emulator/errors` (any Hetzner error for the
/// next calls of an operation) and `GET /_emulator/requests`.
pub(crate) fn control_extras() -> Router<Shared_> {
    Router::new().route("/_emulator/errors", post(errors)).route(
        "/_emulator/requests",
        get(|State(s): State<Shared_>| async move {
            Json(json!({ "requests": s.lock().traffic.requests }))
        }),
    )
}

/// Any Hetzner error for the next calls of an operation, for codes the shared fault
/// kinds do not cover.
#[derive(Deserialize)]
struct ErrorBody {
    op: FaultOp,
    status: u16,
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Option<Value>,
    count: u32,
}

async fn errors(State(s): State<Shared_>, Json(b): Json<ErrorBody>) -> Response {
    let mut e = HetznerError::new(b.status, b.code, b.message);
    if let Some(d) = b.details {
        e = e.with_details(d);
    }
    s.lock().inject_error(b.op, e, b.count);
    StatusCode::NO_CONTENT.into_response()
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

async fn create_server(State(state): State<Shared_>, body: Bytes) -> Response {
    reply(state.lock().create_server(&body), StatusCode::CREATED)
}

async fn list_servers(
    State(state): State<Shared_>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    listing(state.lock().list_servers(&query))
}

async fn get_server(State(state): State<Shared_>, Path(id): Path<String>) -> Response {
    reply(state.lock().get_server(&id), StatusCode::OK)
}

async fn delete_server(State(state): State<Shared_>, Path(id): Path<String>) -> Response {
    reply(state.lock().delete_server(&id), StatusCode::OK)
}

async fn get_action(State(state): State<Shared_>, Path(id): Path<String>) -> Response {
    reply(state.lock().get_action(&id), StatusCode::OK)
}

async fn get_server_action(
    State(state): State<Shared_>,
    Path((id, action_id)): Path<(String, String)>,
) -> Response {
    reply(state.lock().get_server_action(&id, &action_id), StatusCode::OK)
}

async fn list_primary_ips(
    State(state): State<Shared_>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    listing(state.lock().list_primary_ips(&query))
}

async fn list_server_types(
    State(state): State<Shared_>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    Json(state.lock().list_server_types(&query)).into_response()
}

async fn get_primary_ip(State(state): State<Shared_>, Path(id): Path<String>) -> Response {
    reply(state.lock().get_primary_ip(&id), StatusCode::OK)
}

async fn delete_primary_ip(State(state): State<Shared_>, Path(id): Path<String>) -> Response {
    match state.lock().delete_primary_ip(&id) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}
