//! The control surface over HTTP (`/_emulator/...`), the table in `crate::control` plus
//! the Hetzner-only extras. No token, never faulted, never logged as an API call.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::error::HetznerError;
use super::state::{Shared, lock, parse_id};
use crate::control::{Fault, FaultOp, Plant, ScopeFailure};

pub(crate) fn router() -> Router<Shared> {
    Router::new()
        .route("/_emulator/dump", get(dump))
        .route("/_emulator/hold", post(hold))
        .route("/_emulator/state", post(state))
        .route("/_emulator/address", post(address))
        .route("/_emulator/deleting", post(deleting))
        .route("/_emulator/finish-deletes", post(finish_deletes))
        .route("/_emulator/lock", post(set_lock))
        .route("/_emulator/plant", post(plant))
        .route("/_emulator/faults", post(faults))
        .route("/_emulator/errors", post(errors))
        .route("/_emulator/scope", post(scope))
        .route("/_emulator/reset", post(reset))
        .route("/_emulator/requests", get(requests))
        .route("/_emulator/stats", get(stats))
        .route("/_emulator/rate-limit", post(rate_limit))
}

async fn rate_limit(
    State(s): State<Shared>,
    Json(limit): Json<Option<crate::rate_limit::RateLimit>>,
) -> Response {
    lock(&s).set_rate_limit(limit);
    StatusCode::NO_CONTENT.into_response()
}

fn done(found: bool, id: &str) -> Response {
    if found {
        StatusCode::NO_CONTENT.into_response()
    } else {
        HetznerError::not_found("server", id).into_response()
    }
}

fn with_id(
    state: &Shared,
    id: &str,
    f: impl FnOnce(&mut super::state::Backend, u64) -> bool,
) -> Response {
    let found = parse_id(id).is_some_and(|n| f(&mut lock(state), n));
    done(found, id)
}

async fn dump(State(s): State<Shared>) -> Response {
    Json(lock(&s).dump()).into_response()
}

async fn stats(State(s): State<Shared>) -> Response {
    Json(lock(&s).stats.clone()).into_response()
}

async fn requests(State(s): State<Shared>) -> Response {
    Json(json!({ "requests": lock(&s).requests })).into_response()
}

#[derive(Deserialize)]
struct HoldBody {
    id: String,
    #[serde(default = "yes")]
    hold: bool,
}

fn yes() -> bool {
    true
}

async fn hold(State(s): State<Shared>, Json(b): Json<HoldBody>) -> Response {
    with_id(&s, &b.id, |be, id| be.hold(id, b.hold))
}

#[derive(Deserialize)]
struct StateBody {
    id: String,
    state: String,
}

async fn state(State(s): State<Shared>, Json(b): Json<StateBody>) -> Response {
    with_id(&s, &b.id, |be, id| be.set_state(id, &b.state))
}

#[derive(Deserialize)]
struct AddressBody {
    id: String,
    ip: Option<String>,
}

async fn address(State(s): State<Shared>, Json(b): Json<AddressBody>) -> Response {
    with_id(&s, &b.id, |be, id| be.set_address(id, b.ip.as_deref()))
}

#[derive(Deserialize)]
struct IdBody {
    id: String,
}

async fn deleting(State(s): State<Shared>, Json(b): Json<IdBody>) -> Response {
    with_id(&s, &b.id, |be, id| be.slow_delete(id))
}

async fn finish_deletes(State(s): State<Shared>) -> Response {
    lock(&s).finish_deletes();
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct LockBody {
    id: String,
    #[serde(default = "yes")]
    locked: bool,
}

async fn set_lock(State(s): State<Shared>, Json(b): Json<LockBody>) -> Response {
    with_id(&s, &b.id, |be, id| be.set_locked(id, b.locked))
}

async fn plant(State(s): State<Shared>, Json(p): Json<Plant>) -> Response {
    match lock(&s).plant(&p) {
        Ok(id) => Json(json!({ "id": id.to_string() })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn faults(State(s): State<Shared>, Json(f): Json<Fault>) -> Response {
    lock(&s).inject(f.op, &f.kind, f.count);
    StatusCode::NO_CONTENT.into_response()
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
    details: Option<serde_json::Value>,
    count: u32,
}

async fn errors(State(s): State<Shared>, Json(b): Json<ErrorBody>) -> Response {
    let mut e = HetznerError::new(b.status, b.code, b.message);
    if let Some(d) = b.details {
        e = e.with_details(d);
    }
    lock(&s).inject_error(b.op, e, b.count);
    StatusCode::NO_CONTENT.into_response()
}

async fn scope(State(s): State<Shared>, Json(b): Json<ScopeFailure>) -> Response {
    lock(&s).fail_scope(&b.scope, b.fail);
    StatusCode::NO_CONTENT.into_response()
}

async fn reset(State(s): State<Shared>) -> Response {
    lock(&s).reset();
    StatusCode::NO_CONTENT.into_response()
}
