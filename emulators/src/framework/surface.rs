//! The control surface over HTTP: one router for every emulator, over the [`Emulator`]
//! trait, with the wire types of `egress-emulator-protocol`. No token, never faulted,
//! never counted as an API call.
//!
//! Bodies that do not parse answer `400 {"error": ...}`; an unknown id `404 {"error":
//! "no such instance", "id": ..}`; a refused plant the backend's own error answer; a
//! `reclaim` of an on-demand instance `409`, and `reclaim` or `spot-capacity` on an
//! emulator without spot `501`, each `{"error": ...}` saying why.

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Json, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::control::{
    Emulator, Fault, Plant, RateLimit, Reclaim, Refusal, ScopeFailure, SpotCapacity,
};

/// `/_emulator/*` over `emu`: the table of `egress-emulator-protocol`.
pub fn router<E: Emulator + Clone + 'static>(emu: E) -> Router {
    Router::new()
        .route("/_emulator/dump", get(dump::<E>))
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
        .route("/_emulator/reclaim", post(reclaim::<E>))
        .route("/_emulator/spot-capacity", post(spot_capacity::<E>))
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

/// The dump, each instance with its `spot` key (`DumpCapacity` in the protocol).
async fn dump<E: Emulator>(State(e): State<E>) -> Response {
    let spot = e.spot_instances();
    let mut dump = serde_json::to_value(e.dump()).unwrap_or_default();
    if let Some(instances) = dump["instances"].as_array_mut() {
        for i in instances {
            let id = i["id"].as_str().unwrap_or_default();
            i["spot"] = spot.iter().any(|s| s == id).into();
        }
    }
    Json(dump).into_response()
}

fn refused(Refusal { status, body }: Refusal) -> Response {
    (StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST), Json(body)).into_response()
}

async fn plant<E: Emulator>(State(e): State<E>, b: Body<Plant>) -> Response {
    with(b, |p| match e.try_plant(p) {
        Ok(id) => Json(json!({ "id": id })).into_response(),
        Err(r) => refused(r),
    })
}

async fn reclaim<E: Emulator>(State(e): State<E>, b: Body<Reclaim>) -> Response {
    with(b, |r| match e.reclaim(&r.id) {
        Ok(exists) => found(&r.id, exists),
        Err(refusal) => refused(refusal),
    })
}

async fn spot_capacity<E: Emulator>(State(e): State<E>, b: Body<SpotCapacity>) -> Response {
    with(b, |c| match e.set_spot_capacity(c.available) {
        true => StatusCode::NO_CONTENT.into_response(),
        false => refused(Refusal::unsupported("spot-capacity")),
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

#[cfg(test)]
mod tests {
    use crate::control::{DumpCapacities, Emulator, Plant};
    use crate::example::ExampleBackend;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// One control call over a blocking socket: the status and the body.
    fn post(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (raw[9..12].parse().unwrap(), body)
    }

    /// An emulator that never learnt spot (the example backend, on the trait's defaults)
    /// says so with `501`, and its dump marks nothing as spot.
    #[test]
    fn an_emulator_without_spot_answers_501_and_dumps_no_spot() {
        let be = ExampleBackend::start("t");
        let id = be.plant(Plant { name: "a".into(), managed: true, ..Plant::default() });
        let (status, body) =
            post(be.addr(), "POST", "/_emulator/reclaim", &format!(r#"{{"id":"{id}"}}"#));
        assert_eq!(status, 501, "{body}");
        assert!(body.contains("reclaim is not supported by this emulator"), "{body}");
        let (status, body) =
            post(be.addr(), "POST", "/_emulator/spot-capacity", r#"{"available":false}"#);
        assert!(status == 501 && body.contains("spot-capacity"), "{status} {body}");
        let (status, _) = post(be.addr(), "POST", "/_emulator/spot-capacity", r#"{"up":1}"#);
        assert_eq!(status, 400, "a body that does not parse");
        let (status, body) = post(be.addr(), "GET", "/_emulator/dump", "");
        assert_eq!(status, 200);
        let caps: DumpCapacities = serde_json::from_str(&body).unwrap();
        assert_eq!(caps.instances.len(), 1);
        assert!(!caps.instances[0].spot && caps.instances[0].id == id, "{body}");
        assert!(be.spot_instances().is_empty() && !be.set_spot_capacity(true));
    }

    /// A dump from an emulator that never writes `spot` (one in another language, older):
    /// every instance reads as on-demand, and the body still reads as a `Dump`.
    #[test]
    fn a_dump_without_spot_keys_reads_as_on_demand() {
        let body = r#"{"instances": [{"id": "i-2", "name": "b", "scope": "r", "state": "running",
            "ip": "", "labels": [], "user_data": []}], "secondary": []}"#;
        let caps: DumpCapacities = serde_json::from_str(body).unwrap();
        assert_eq!((caps.instances[0].id.as_str(), caps.instances[0].spot), ("i-2", false));
        let dump: crate::control::Dump = serde_json::from_str(body).unwrap();
        assert_eq!(dump.instances[0].name, "b");
    }
}
