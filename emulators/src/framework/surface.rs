//! The control surface over HTTP: one router for every emulator, over the [`Emulator`]
//! trait, with the wire types of `egress-emulator-protocol`. No token, never faulted,
//! never counted as an API call.
//!
//! Bodies that do not parse answer `400 {"error": ...}`; an unknown id `404 {"error":
//! "no such instance", "id": ..}`; a refused plant the backend's own error answer.

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Json, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::control::{Emulator, Fault, Plant, RateLimit, Refusal, ScopeFailure};

/// `/_emulator/*` over `emu`: the table of `egress-emulator-protocol`.
pub fn router<E: Emulator + Clone + 'static>(emu: E) -> Router {
    Router::new()
        .route("/_emulator/dump", get(|State(e): State<E>| async move { Json(e.dump()) }))
        .route("/_emulator/stats", get(|State(e): State<E>| async move { Json(e.stats()) }))
        .route("/_emulator/hold", post(hold::<E>))
        .route("/_emulator/state", post(state::<E>))
        .route("/_emulator/address", post(address::<E>))
        .route("/_emulator/deleting", post(deleting::<E>))
        .route("/_emulator/lock", post(lock::<E>))
        .route("/_emulator/plant", post(plant::<E>))
        .route("/_emulator/faults", post(faults::<E>))
        .route("/_emulator/scope", post(scope::<E>))
        .route("/_emulator/rate-limit", post(rate_limit::<E>))
        .route(
            "/_emulator/finish-deletes",
            post(|State(e): State<E>| async move {
                e.finish_deletes();
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/_emulator/reset",
            post(|State(e): State<E>| async move {
                e.reset();
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(emu)
}

type Body<T> = Result<Json<T>, JsonRejection>;

/// Runs `f` on a parsed body: 400 when it does not parse.
fn with<T: DeserializeOwned>(body: Body<T>, f: impl FnOnce(T) -> Response) -> Response {
    match body {
        Ok(Json(b)) => f(b),
        Err(e) => (StatusCode::BAD_REQUEST, Json(json!({"error": e.body_text()}))).into_response(),
    }
}

/// 204 when the instance exists, 404 when it does not.
fn found(id: &str, found: bool) -> Response {
    if found {
        StatusCode::NO_CONTENT.into_response()
    } else {
        let body = json!({"error": "no such instance", "id": id});
        (StatusCode::NOT_FOUND, Json(body)).into_response()
    }
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct HoldBody {
    id: String,
    #[serde(default = "yes")]
    hold: bool,
}

async fn hold<E: Emulator>(State(e): State<E>, b: Body<HoldBody>) -> Response {
    with(b, |b| found(&b.id, e.hold_provisioning(&b.id, b.hold)))
}

#[derive(Deserialize)]
struct StateBody {
    id: String,
    state: String,
}

async fn state<E: Emulator>(State(e): State<E>, b: Body<StateBody>) -> Response {
    with(b, |b| found(&b.id, e.set_backend_state(&b.id, &b.state)))
}

#[derive(Deserialize)]
struct AddressBody {
    id: String,
    ip: Option<String>,
}

async fn address<E: Emulator>(State(e): State<E>, b: Body<AddressBody>) -> Response {
    with(b, |b| found(&b.id, e.set_address(&b.id, b.ip.as_deref())))
}

#[derive(Deserialize)]
struct IdBody {
    id: String,
}

async fn deleting<E: Emulator>(State(e): State<E>, b: Body<IdBody>) -> Response {
    with(b, |b| found(&b.id, e.start_slow_delete(&b.id)))
}

#[derive(Deserialize)]
struct LockBody {
    id: String,
    #[serde(default = "yes")]
    locked: bool,
}

async fn lock<E: Emulator>(State(e): State<E>, b: Body<LockBody>) -> Response {
    with(b, |b| found(&b.id, e.set_locked(&b.id, b.locked)))
}

async fn plant<E: Emulator>(State(e): State<E>, b: Body<Plant>) -> Response {
    with(b, |p| match e.try_plant(p) {
        Ok(id) => Json(json!({ "id": id })).into_response(),
        Err(Refusal { status, body }) => {
            (StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST), Json(body))
                .into_response()
        }
    })
}

async fn faults<E: Emulator>(State(e): State<E>, b: Body<Fault>) -> Response {
    with(b, |f| {
        e.inject(f);
        StatusCode::NO_CONTENT.into_response()
    })
}

async fn scope<E: Emulator>(State(e): State<E>, b: Body<ScopeFailure>) -> Response {
    with(b, |s| {
        e.fail_scope(&s.scope, s.fail);
        StatusCode::NO_CONTENT.into_response()
    })
}

async fn rate_limit<E: Emulator>(State(e): State<E>, b: Body<Option<RateLimit>>) -> Response {
    with(b, |l| {
        e.set_rate_limit(l);
        StatusCode::NO_CONTENT.into_response()
    })
}
