//! The example backend: a small JSON REST API that `providers-wasm/example` (and the plugin
//! written in `docs/writing-a-provider.md`) talks to.
//!
//! It is deliberately shaped like a real cloud API (allocated IDs, names as labels,
//! server-side label filters, asynchronous start, error codes in the body) so the example
//! plugin exercises every rule of the provider contract, and the conformance suite can
//! force the awkward cases.
//!
//! API (all under a bearer token; 401 otherwise). Every error is
//! `{"error": message, "code": code}` with one of the codes below.
//! - `POST /v1/instances` `{name, labels, user_data (base64), region, zone, machine_type,
//!   image, port}` -> 201 instance; 409 `conflict` when the name exists (instances being
//!   deleted included); 400 `invalid_request` on a bad body (also for bodies over axum's
//!   2 MB default limit; real clouds cap user data far lower).
//! - `GET /v1/instances?name=N&region=R&label=k=v` (label repeatable, all must match)
//!   -> `{"instances": [...]}`; 503 `unavailable` when a match lies in a region whose
//!   store is down (the list fails whole, it is never silently short).
//! - `GET /v1/instances/{id}` -> instance, 404 `not_found` when gone. A `starting`
//!   instance becomes `running` (ip `127.0.0.1`) after the first GET, unless auto-run is
//!   off or it is held. An instance being deleted shows status `deleting`.
//! - `DELETE /v1/instances/{id}` -> 204; 202 with the instance while a delete of it is
//!   already in progress; 409 `locked` while it is locked; 404 `not_found` when unknown.
//!
//! Faults answer as this backend does: `server-error` 500 `internal`, `quota` 403
//! `quota_exceeded`, `rate-limit` 429 `rate_limited` with `Retry-After: 1`, `auth` 401
//! `unauthorized`, `slow` a normal answer after the delay. The operations are `create`
//! (`POST /v1/instances`), `get` (`GET /v1/instances/{id}`), `delete` (`DELETE`) and
//! `list` (`GET /v1/instances`).
//!
//! Built on [`crate::framework::Cloud`], and its worked example: this module is the wire
//! types, the [`Adapter`] and the four routes; instances, faults, holds, locks, slow
//! deletes, the rate limit (off unless set; 429 `rate_limited`) and the control surface
//! are the framework's.
//!
//! Control surface (no token, never faulted, not recorded as API calls): the shared one
//! (`/_emulator/dump`, `hold`, `state` (POST), `address`, `deleting`, `finish-deletes`,
//! `lock`, `plant`, `faults`, `scope`, `reset`, `rate-limit`, `stats`), which is what
//! `proxy-operator conformance` drives, and the older example-only routes:
//! - `GET /_emulator/state` -> `{instances, requests, auto_run}`.
//! - `POST /_emulator/fault` `{status?, count, delay_ms?}`: the next `count` API calls
//!   wait `delay_ms`, then answer `status` (or proceed normally when no status).
//! - `POST /_emulator/instances/{id}/status` `{status, ip?}`.
//! - `POST /_emulator/auto-run` `{enabled}`.
//!
//! Control-surface ids are the backend's (`i-00000001`); a plugin's `r1/i-00000001` is
//! accepted too. Regions are free-form: any region a create names exists; a planted
//! instance without a scope goes to [`DEFAULT_REGION`].

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, extract::rejection::JsonRejection};
use data_encoding::BASE64;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

#[cfg(test)]
use crate::control::{Emulator, Fault};
use crate::control::{FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{
    Adapter, Cloud, Deletion, Effect, EveryNth, Fleet, Record, Schedule, Served, Shared, States,
};
use crate::tls::TestCa;

/// Where a planted instance without a scope goes.
pub const DEFAULT_REGION: &str = "r1";

/// The token the emulator binary (`cargo run -p egress-emulators --example emulator --
/// example`) accepts, and `docs/writing-a-provider.md` writes into its secret.
pub const EMULATOR_TOKEN: &str = "emulator-token";

/// The address a running instance gets.
const RUNNING_IP: &str = "127.0.0.1";

/// An instance as the backend returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub name: String,
    /// `""` until the instance runs, then `127.0.0.1`.
    pub ip: String,
    /// `starting`, `running`, `stopping`, `stopped` or `deleting` (or anything set through
    /// the control surface, to test how a plugin maps unknown states).
    pub status: String,
    pub labels: BTreeMap<String, String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Base64.
    pub user_data: String,
    pub region: String,
    pub zone: String,
    pub machine_type: String,
    pub image: String,
    pub port: u16,
}

impl Instance {
    /// The user data as the backend would hand it to the guest.
    pub fn user_data_bytes(&self) -> Vec<u8> {
        BASE64.decode(self.user_data.as_bytes()).unwrap_or_default()
    }

    fn of(r: &Record<Placement>) -> Self {
        Instance {
            id: r.id.clone(),
            name: r.name.clone(),
            ip: r.ip.clone().unwrap_or_default(),
            status: r.state.clone(),
            labels: r.labels.clone(),
            created_at: crate::time::rfc3339(r.created_at),
            user_data: BASE64.encode(&r.user_data),
            region: r.scope.clone(),
            zone: r.extra.zone.clone(),
            machine_type: r.extra.machine_type.clone(),
            image: r.extra.image.clone(),
            port: r.extra.port,
        }
    }

    fn into_record(self) -> Record<Placement> {
        let extra = Placement {
            zone: self.zone.clone(),
            machine_type: self.machine_type.clone(),
            image: self.image.clone(),
            port: self.port,
        };
        let mut r = Record::new(self.id.clone(), self.name.clone(), self.region.clone(), extra);
        r.user_data = self.user_data_bytes();
        r.ip = (!self.ip.is_empty()).then_some(self.ip);
        r.state = self.status;
        r.labels = self.labels;
        r.created_at = crate::time::parse_rfc3339(&self.created_at).unwrap_or(r.created_at);
        r
    }
}

/// What an instance holds beyond the fields every emulator's records have.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    zone: String,
    machine_type: String,
    image: String,
    port: u16,
}

/// An error answer: status, `code` and `error` (the message) in the body.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    fn not_found() -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such instance")
    }

    /// A status with the code it stands for, for the older fault route that gives only a
    /// status, and for rejected requests.
    fn for_status(status: u16, message: &str) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = match status.as_u16() {
            400 => "invalid_request",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            409 => "conflict",
            429 => "rate_limited",
            503 => "unavailable",
            _ => "internal",
        };
        ApiError::new(status, code, message)
    }

    fn bad_request(message: &str) -> Self {
        ApiError::for_status(400, message)
    }

    fn body(&self) -> serde_json::Value {
        json!({"error": self.message, "code": self.code})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            (self.status, [("retry-after", "1")], body).into_response()
        } else {
            (self.status, body).into_response()
        }
    }
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal { status: e.status.as_u16(), body: e.body() }
    }
}

/// The example backend's side of the framework: its token, state names, id format and
/// error answers.
pub struct Example {
    token: String,
}

impl Adapter for Example {
    type Extra = Placement;
    type Error = ApiError;
    const STATES: States =
        States { provisioning: "starting", running: "running", deleting: "deleting" };

    fn id(&self, n: u64) -> String {
        format!("i-{n:08x}")
    }

    fn address(&self, _n: u64) -> String {
        RUNNING_IP.into()
    }

    fn default_scope(&self) -> String {
        DEFAULT_REGION.into()
    }

    fn plant(&self, plant: &Plant, _scope: &str) -> Result<Placement, ApiError> {
        if plant.name.is_empty() {
            return Err(ApiError::bad_request("name is required"));
        }
        Ok(Placement::default())
    }

    fn name_taken(&self) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", "an instance with this name exists")
    }

    fn fault(&self, kind: &FaultKind) -> ApiError {
        let (status, code, message) = match kind {
            FaultKind::Quota => (403, "quota_exceeded", "instance limit reached"),
            FaultKind::RateLimit => (429, "rate_limited", "too many requests"),
            FaultKind::Auth => (401, "unauthorized", "missing or wrong bearer token"),
            FaultKind::ServerError | FaultKind::Slow { .. } => (500, "internal", "internal error"),
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::new(status, code, message)
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let rest = path.strip_prefix("/v1/instances");
        let op = match (method.as_str(), rest.map(str::is_empty)) {
            ("POST", Some(true)) => Some(FaultOp::Create),
            ("GET", Some(true)) => Some(FaultOp::List),
            ("GET", Some(false)) => Some(FaultOp::Get),
            ("DELETE", Some(false)) => Some(FaultOp::Delete),
            _ => None,
        };
        let route = if path.starts_with("/v1/instances/") { "/v1/instances/{id}" } else { path };
        (op, format!("{method} {route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("Bearer {}", self.token);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> ApiError {
        ApiError::for_status(401, "missing or wrong bearer token")
    }

    fn rate_limited(&self, _limit: RateLimit) -> ApiError {
        ApiError::for_status(429, "too many requests")
    }
}

type Backend = Cloud<Example>;

/// A running example backend. Stops (closing every connection) when dropped.
pub type ExampleBackend = Served<Backend>;

impl Served<Backend> {
    /// Start on 127.0.0.1 with an OS-chosen port, requiring `Authorization: Bearer
    /// <token>`.
    ///
    /// The server runs on its own thread and runtime, so it works from sync and async
    /// tests alike and keeps answering while the test's runtime is blocked in a
    /// synchronous plugin call.
    pub fn start(token: impl Into<String>) -> ExampleBackend {
        Self::start_on_port(token, 0).expect("bind 127.0.0.1:0")
    }

    /// Start on `127.0.0.1:port` (0: OS-chosen), for a backend a person points a
    /// providers file at by hand.
    pub fn start_on_port(token: impl Into<String>, port: u16) -> std::io::Result<ExampleBackend> {
        Self::start_with(token, port, None)
    }

    /// Start over HTTPS with a certificate `ca` signed, as a backend on a private network
    /// would answer: for the host's per-provider trust (`tls.caFile`).
    pub fn start_tls(token: impl Into<String>, ca: &TestCa) -> ExampleBackend {
        Self::start_with(token, 0, Some(ca)).expect("bind 127.0.0.1:0")
    }

    fn start_with(
        token: impl Into<String>,
        port: u16,
        ca: Option<&TestCa>,
    ) -> std::io::Result<ExampleBackend> {
        let (listener, _) = crate::framework::bind(port)?;
        let fleet = Fleet::new(Example::STATES, Schedule::AfterReads(1), None);
        let adapter = Example { token: token.into() };
        let state = Shared::new(Cloud::new(adapter, fleet, None));
        let api = Router::new()
            .route("/v1/instances", get(list_instances).post(create_instance))
            .route("/v1/instances/{id}", get(get_instance).delete(delete_instance));
        let app = crate::framework::gated(api, &state)
            .route("/_emulator/state", get(dump_state))
            .route("/_emulator/fault", post(set_fault))
            .route("/_emulator/instances/{id}/status", post(control_status))
            .route("/_emulator/auto-run", post(control_auto_run));
        Ok(match ca {
            None => Served::serve("example-backend", listener, state, app),
            Some(ca) => Served::serve_tls("example-backend", listener, state, app, ca),
        })
    }

    /// A snapshot of every instance, ordered by ID.
    pub fn instances(&self) -> Vec<Instance> {
        self.lock().fleet.iter().map(Instance::of).collect()
    }

    pub fn instance(&self, id: &str) -> Option<Instance> {
        self.lock().fleet.get(id).map(Instance::of)
    }

    /// The next `count` API calls answer `status` with a JSON error body (replacing any
    /// fault injected before).
    pub fn inject_fault(&self, status: u16, count: u32) {
        let effect = Effect::fail(ApiError::for_status(status, "injected fault"));
        replace_fault(&mut self.lock(), effect, count);
    }

    /// The next `count` API calls are answered normally, after `delay` (replacing any
    /// fault injected before).
    pub fn inject_delay(&self, delay: Duration, count: u32) {
        replace_fault(&mut self.lock(), Effect::delay(delay), count);
    }

    /// From now on every `period`-th API call gets the next of `faults`, in turn, until
    /// [`reset`](Self::reset) (replacing any such cycle set before). Chaos at an exact
    /// rate: unlike a fault injected when a watcher sees calls go by, the share of calls
    /// hit does not depend on how they bunch up in time.
    pub fn inject_every(&self, period: u32, faults: &[Injected]) {
        let effects = faults
            .iter()
            .map(|f| match *f {
                Injected::Status(status) => {
                    Effect::fail(ApiError::for_status(status, "injected fault"))
                }
                Injected::Delay(delay) => Effect::delay(delay),
            })
            .collect();
        self.lock().traffic.every = EveryNth::new(period, effects);
    }

    /// How many calls [`inject_every`](Self::inject_every)'s cycle has hit.
    pub fn every_hits(&self) -> u64 {
        self.lock().traffic.every.as_ref().map_or(0, EveryNth::hits)
    }

    /// Force an instance's status (`running` also sets the IP, anything else clears it).
    /// Returns false when there is no such instance.
    pub fn set_status(&self, id: &str, status: &str) -> bool {
        let ip = (status == "running").then(|| RUNNING_IP.to_string());
        set_status(&mut self.lock(), id, status, ip)
    }

    /// Whether `starting` instances become `running` after their first GET (default on).
    pub fn set_auto_run(&self, enabled: bool) {
        set_auto_run(&mut self.lock(), enabled);
    }

    /// Instances become `running` once `after` has passed since their create (checked on
    /// every API call, lists included), whoever reads them: as a real cloud boots. The
    /// default (`AfterReads(1)`) moves an instance only when it is read by itself, so an
    /// operator that confirms creates by list would never see it run.
    pub fn set_boot_time(&self, after: std::time::Duration) {
        self.lock().fleet.schedule = Schedule::After(after);
    }

    /// Put an instance in as is (e.g. an old orphan, or another installation's), keeping
    /// its ID; allocation skips IDs in use.
    pub fn insert(&self, instance: Instance) {
        self.lock().fleet.insert(instance.into_record());
    }

    /// Forget all instances, requests and faults; keep the token.
    pub fn reset(&self) {
        crate::framework::Model::reset(&mut *self.lock());
    }
}

/// One fault of [`ExampleBackend::inject_every`]'s cycle.
#[derive(Debug, Clone, Copy)]
pub enum Injected {
    /// An error answer with this status, as [`ExampleBackend::inject_fault`] gives.
    Status(u16),
    /// A normal answer, this late.
    Delay(Duration),
}

/// The older single-fault API: replaces whatever was injected before.
fn replace_fault(b: &mut Backend, effect: Effect<ApiError>, count: u32) {
    b.traffic.faults.clear();
    b.traffic.faults.push(FaultOp::Any, effect, count);
}

fn set_auto_run(b: &mut Backend, enabled: bool) {
    b.fleet.schedule = if enabled { Schedule::AfterReads(1) } else { Schedule::Manual };
}

fn set_status(b: &mut Backend, id: &str, status: &str, ip: Option<String>) -> bool {
    match b.fleet.get_mut(id) {
        Some(i) => {
            i.state = status.to_string();
            i.ip = ip;
            true
        }
        None => false,
    }
}

#[derive(Deserialize)]
struct CreateBody {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    user_data: String,
    #[serde(default)]
    region: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    machine_type: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    port: u16,
}

async fn create_instance(
    State(state): State<Shared<Backend>>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Response {
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return ApiError::bad_request(&e.body_text()).into_response(),
    };
    if body.name.is_empty() {
        return ApiError::bad_request("name is required").into_response();
    }
    let Ok(user_data) = BASE64.decode(body.user_data.as_bytes()) else {
        return ApiError::bad_request("user_data is not base64").into_response();
    };
    let mut b = state.lock();
    if b.fleet.name_taken(&body.name) {
        return b.backend.name_taken().into_response();
    }
    let extra = Placement {
        zone: body.zone,
        machine_type: body.machine_type,
        image: body.image,
        port: body.port,
    };
    let mut record = Record::new(b.new_id(), body.name, body.region, extra);
    record.labels = body.labels;
    record.user_data = user_data;
    let record = b.create(record);
    (StatusCode::CREATED, Json(Instance::of(&record))).into_response()
}

async fn list_instances(
    State(state): State<Shared<Backend>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let mut name = None;
    let mut region = None;
    let mut labels = Vec::new();
    for (k, v) in query {
        match k.as_str() {
            "name" => name = Some(v),
            "region" => region = Some(v),
            "label" => match v.split_once('=') {
                Some((lk, lv)) => labels.push((lk.to_string(), lv.to_string())),
                None => return ApiError::bad_request("label filter must be k=v").into_response(),
            },
            _ => return ApiError::bad_request(&format!("unknown filter {k:?}")).into_response(),
        }
    }
    let b = state.lock();
    let matched: Vec<&Record<Placement>> = b
        .fleet
        .iter()
        .filter(|i| name.as_ref().is_none_or(|n| &i.name == n))
        .filter(|i| region.as_ref().is_none_or(|r| &i.scope == r))
        .filter(|i| labels.iter().all(|(k, v)| i.labels.get(k) == Some(v)))
        .collect();
    if let Some(down) = b.fleet.failing_scope(matched.iter().map(|i| i.scope.as_str())) {
        let msg = format!("region {down:?} is unavailable");
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg).into_response();
    }
    let instances: Vec<Instance> = matched.into_iter().map(Instance::of).collect();
    Json(json!({ "instances": instances })).into_response()
}

async fn get_instance(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    let mut b = state.lock();
    let Some(instance) = b.fleet.get(&id).map(Instance::of) else {
        return ApiError::not_found().into_response();
    };
    // The first GET shows `starting`; the next one finds it running, like a fast cloud.
    b.saw(&instance.id);
    Json(instance).into_response()
}

async fn delete_instance(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    match state.lock().fleet.delete(&id) {
        Deletion::NotFound => ApiError::not_found().into_response(),
        Deletion::Locked => {
            let msg = "the instance is locked by another action";
            ApiError::new(StatusCode::CONFLICT, "locked", msg).into_response()
        }
        Deletion::InProgress(r) => (StatusCode::ACCEPTED, Json(Instance::of(&r))).into_response(),
        Deletion::Done(_) => StatusCode::NO_CONTENT.into_response(),
    }
}

// ---- the example's own control routes ----------------------------------------------------

async fn dump_state(State(state): State<Shared<Backend>>) -> Response {
    let b = state.lock();
    let instances: Vec<Instance> = b.fleet.iter().map(Instance::of).collect();
    Json(json!({
        "instances": instances,
        "requests": b.traffic.requests,
        "auto_run": b.fleet.schedule != Schedule::Manual,
    }))
    .into_response()
}

#[derive(Debug, Default, Clone, Deserialize)]
struct LegacyFault {
    #[serde(default)]
    status: Option<u16>,
    count: u32,
    #[serde(default)]
    delay_ms: u64,
}

async fn set_fault(State(state): State<Shared<Backend>>, Json(f): Json<LegacyFault>) -> Response {
    let effect = Effect {
        delay: Duration::from_millis(f.delay_ms),
        fail: f.status.map(|s| ApiError::for_status(s, "injected fault")),
    };
    replace_fault(&mut state.lock(), effect, f.count);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct StatusBody {
    status: String,
    #[serde(default)]
    ip: Option<String>,
}

async fn control_status(
    State(state): State<Shared<Backend>>,
    Path(id): Path<String>,
    Json(body): Json<StatusBody>,
) -> Response {
    let ip = body.ip.or_else(|| (body.status == "running").then(|| RUNNING_IP.to_string()));
    if set_status(&mut state.lock(), &id, &body.status, ip) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        ApiError::not_found().into_response()
    }
}

#[derive(Deserialize)]
struct AutoRunBody {
    enabled: bool,
}

async fn control_auto_run(
    State(state): State<Shared<Backend>>,
    Json(body): Json<AutoRunBody>,
) -> Response {
    set_auto_run(&mut state.lock(), body.enabled);
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    const TOKEN: &str = "t0ken";

    /// A minimal HTTP/1.1 client: the crate has no client dependency, and the server runs
    /// on its own thread so a blocking socket is fine.
    fn call(
        be: &ExampleBackend,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let mut s = TcpStream::connect(be.addr()).unwrap();
        let body = body.unwrap_or("");
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status: u16 = raw[9..12].parse().unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
        let text = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    fn dechunk(mut s: &str) -> String {
        let mut out = String::new();
        loop {
            let (size, rest) = s.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                return out;
            }
            out.push_str(&rest[..n]);
            s = &rest[n + 2..];
        }
    }

    fn create(
        be: &ExampleBackend,
        name: &str,
        labels: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let body = json!({
            "name": name, "labels": labels, "user_data": BASE64.encode(b"#cloud-config\n"),
            "region": "r1", "zone": "z", "machine_type": "small", "image": "img", "port": 3128,
        });
        call(be, "POST", "/v1/instances", Some(TOKEN), Some(&body.to_string()))
    }

    #[test]
    fn create_get_run_delete() {
        let be = ExampleBackend::start(TOKEN);
        let (st, inst) = create(&be, "proxy-a", json!({"k": "v"}));
        assert_eq!(st, 201);
        let id = inst["id"].as_str().unwrap().to_string();
        assert_eq!(inst["status"], "starting");
        assert_eq!(inst["ip"], "");
        assert!(crate::time::parse_rfc3339(inst["created_at"].as_str().unwrap()).is_some());

        let (st, _) = create(&be, "proxy-a", json!({}));
        assert_eq!(st, 409);

        let (st, first) = call(&be, "GET", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!((st, first["status"].as_str()), (200, Some("starting")));
        let (_, second) = call(&be, "GET", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!(second["status"], "running");
        assert_eq!(second["ip"], "127.0.0.1");
        assert_eq!(be.instances()[0].user_data_bytes(), b"#cloud-config\n");

        let (st, _) = call(&be, "DELETE", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!(st, 204);
        let (st, _) = call(&be, "DELETE", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!(st, 404);
        let (st, _) = call(&be, "GET", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!(st, 404);
        assert!(be.instances().is_empty());
    }

    #[test]
    fn token_is_required() {
        let be = ExampleBackend::start(TOKEN);
        assert_eq!(call(&be, "GET", "/v1/instances", None, None).0, 401);
        assert_eq!(call(&be, "GET", "/v1/instances", Some("nope"), None).0, 401);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);
    }

    #[test]
    fn bad_bodies_are_rejected() {
        let be = ExampleBackend::start(TOKEN);
        let bad = json!({"name": "x", "user_data": "not base64!"}).to_string();
        assert_eq!(call(&be, "POST", "/v1/instances", Some(TOKEN), Some(&bad)).0, 400);
        assert_eq!(call(&be, "POST", "/v1/instances", Some(TOKEN), Some("{")).0, 400);
        assert!(be.instances().is_empty());
    }

    #[test]
    fn list_filters_by_name_region_and_every_label() {
        let be = ExampleBackend::start(TOKEN);
        create(&be, "a", json!({"m": "true", "inst": "one"}));
        create(&be, "b", json!({"m": "true", "inst": "two"}));
        create(&be, "c", json!({"inst": "one"}));

        let names = |q: &str| -> Vec<String> {
            let (st, v) = call(&be, "GET", &format!("/v1/instances{q}"), Some(TOKEN), None);
            assert_eq!(st, 200, "{q}");
            v["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(""), ["a", "b", "c"]);
        assert_eq!(names("?name=b"), ["b"]);
        assert_eq!(names("?label=m%3Dtrue"), ["a", "b"]);
        assert_eq!(names("?label=m=true&label=inst=one"), ["a"]);
        assert_eq!(names("?label=inst=one&region=r1"), ["a", "c"]);
        assert!(names("?region=r2").is_empty());
        assert_eq!(call(&be, "GET", "/v1/instances?label=nokv", Some(TOKEN), None).0, 400);
    }

    #[test]
    fn faults_hit_the_next_calls_only() {
        let be = ExampleBackend::start(TOKEN);
        be.inject_fault(503, 2);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 503);
        assert_eq!(call(&be, "GET", "/v1/instances", None, None).0, 503);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);

        // Same through the control surface, which is itself never faulted.
        let f = json!({"status": 429, "count": 1}).to_string();
        assert_eq!(call(&be, "POST", "/_emulator/fault", None, Some(&f)).0, 204);
        assert_eq!(call(&be, "GET", "/_emulator/state", None, None).0, 200);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 429);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);
        assert_eq!(be.requests().len(), 5);
    }

    #[test]
    fn delays_slow_the_answer() {
        let be = ExampleBackend::start(TOKEN);
        be.inject_delay(Duration::from_millis(200), 1);
        let t = std::time::Instant::now();
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn control_surface_sets_states_and_dumps() {
        let be = ExampleBackend::start(TOKEN);
        be.set_auto_run(false);
        let (_, inst) = create(&be, "a", json!({}));
        let id = inst["id"].as_str().unwrap();
        for _ in 0..2 {
            let (_, i) = call(&be, "GET", &format!("/v1/instances/{id}"), Some(TOKEN), None);
            assert_eq!(i["status"], "starting");
        }
        let body = json!({"status": "stopping"}).to_string();
        let path = format!("/_emulator/instances/{id}/status");
        assert_eq!(call(&be, "POST", &path, None, Some(&body)).0, 204);
        assert_eq!(be.instance(id).unwrap().status, "stopping");
        assert!(be.set_status(id, "running"));
        assert_eq!(be.instance(id).unwrap().ip, "127.0.0.1");
        assert!(!be.set_status("i-nope", "running"));

        let (_, dump) = call(&be, "GET", "/_emulator/state", None, None);
        assert_eq!(dump["instances"][0]["status"], "running");
        assert_eq!(dump["auto_run"], false);

        let mut orphan = be.instance(id).unwrap();
        orphan.id = "i-orphan".into();
        orphan.name = "old".into();
        orphan.created_at = "2020-01-01T00:00:00Z".into();
        be.insert(orphan);
        assert_eq!(be.instances().len(), 2);
        let (_, inst) = create(&be, "b", json!({}));
        assert_ne!(inst["id"], "i-orphan");

        assert_eq!(call(&be, "POST", "/_emulator/reset", None, None).0, 204);
        assert!(be.instances().is_empty());
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);
    }

    fn get_status(be: &ExampleBackend, id: &str) -> (u16, serde_json::Value) {
        call(be, "GET", &format!("/v1/instances/{id}"), Some(TOKEN), None)
    }

    fn control(be: &ExampleBackend, route: &str, body: serde_json::Value) -> u16 {
        let path = format!("/_emulator/{route}");
        call(be, "POST", &path, None, Some(&body.to_string())).0
    }

    /// The shared control surface, as `proxy-operator conformance` drives it over HTTP.
    #[test]
    fn shared_control_surface_holds_states_addresses_and_deletes() {
        let be = ExampleBackend::start(TOKEN);
        let (_, inst) = create(&be, "a", json!({"k": "v"}));
        let id = inst["id"].as_str().unwrap().to_string();

        // Held: stays starting without an IP on every read; released: runs.
        assert_eq!(control(&be, "hold", json!({"id": id, "hold": true})), 204);
        for _ in 0..3 {
            let (_, i) = get_status(&be, &id);
            assert_eq!((i["status"].as_str(), i["ip"].as_str()), (Some("starting"), Some("")));
        }
        assert_eq!(control(&be, "hold", json!({"id": format!("r1/{id}"), "hold": false})), 204);
        get_status(&be, &id);
        assert_eq!(get_status(&be, &id).1["status"], "running");

        // Raw state and address, independently of each other.
        assert_eq!(control(&be, "state", json!({"id": id, "state": "weird"})), 204);
        assert_eq!(get_status(&be, &id).1["status"], "weird");
        assert_eq!(control(&be, "state", json!({"id": id, "state": "running"})), 204);
        assert_eq!(control(&be, "address", json!({"id": id, "ip": null})), 204);
        let (_, i) = get_status(&be, &id);
        assert_eq!((i["status"].as_str(), i["ip"].as_str()), (Some("running"), Some("")));
        assert_eq!(control(&be, "address", json!({"id": "i-nope", "ip": null})), 404);

        // Locked: reads work, DELETE answers 409 `locked`.
        assert_eq!(control(&be, "lock", json!({"id": id, "locked": true})), 204);
        assert_eq!(get_status(&be, &id).0, 200);
        let (st, err) = call(&be, "DELETE", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!((st, err["code"].as_str()), (409, Some("locked")));
        assert_eq!(control(&be, "lock", json!({"id": id, "locked": false})), 204);

        // A delete in progress: still readable as `deleting`, the name stays taken, a
        // repeat DELETE is accepted; finish-deletes ends it.
        assert_eq!(control(&be, "deleting", json!({"id": id})), 204);
        assert_eq!(get_status(&be, &id).1["status"], "deleting");
        assert_eq!(create(&be, "a", json!({})).0, 409);
        let (st, _) = call(&be, "DELETE", &format!("/v1/instances/{id}"), Some(TOKEN), None);
        assert_eq!(st, 202);
        let (_, dump) = call(&be, "GET", "/_emulator/dump", None, None);
        assert_eq!(dump["instances"][0]["state"], "deleting");
        assert_eq!(dump["instances"][0]["scope"], "r1");
        assert_eq!(dump["secondary"], json!([]));
        assert_eq!(call(&be, "POST", "/_emulator/finish-deletes", None, None).0, 204);
        let (st, err) = get_status(&be, &id);
        assert_eq!((st, err["code"].as_str()), (404, Some("not_found")));
        assert!(be.dump().instances.is_empty());
    }

    #[test]
    fn plant_faults_scopes_and_reset() {
        let be = ExampleBackend::start(TOKEN);
        let plant = json!({"name": "old", "scope": "r2", "managed": true, "uid": "",
                           "installation": "inst", "created_at": 1_600_000_000});
        let (st, planted) = call(&be, "POST", "/_emulator/plant", None, Some(&plant.to_string()));
        assert_eq!(st, 200);
        let id = planted["id"].as_str().unwrap().to_string();
        let i = be.instance(&id).unwrap();
        assert_eq!((i.region.as_str(), i.status.as_str()), ("r2", "running"));
        assert_eq!(i.created_at, "2020-09-13T12:26:40Z");
        assert_eq!(i.labels.get(crate::MARK_UID).map(String::as_str), Some(""));
        assert_eq!(i.labels.get(crate::MARK_MANAGED).map(String::as_str), Some("true"));
        let dup = call(&be, "POST", "/_emulator/plant", None, Some(&plant.to_string()));
        assert_eq!(dup.0, 409);

        // Faults hit their operation only, with this backend's statuses and codes.
        let fault = |op: &str, kind: &str| json!({"op": op, "kind": kind, "count": 1});
        assert_eq!(control(&be, "faults", fault("get", "quota")), 204);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);
        let (st, err) = get_status(&be, &id);
        assert_eq!((st, err["code"].as_str()), (403, Some("quota_exceeded")));
        assert_eq!(get_status(&be, &id).0, 200);
        for (kind, status, code) in [
            ("server-error", 500, "internal"),
            ("rate-limit", 429, "rate_limited"),
            ("auth", 401, "unauthorized"),
        ] {
            assert_eq!(control(&be, "faults", fault("list", kind)), 204);
            let (st, err) = call(&be, "GET", "/v1/instances", Some(TOKEN), None);
            assert_eq!((st, err["code"].as_str()), (status, Some(code)), "{kind}");
        }
        be.inject(Fault::slow(FaultOp::Create, Duration::from_millis(200), 1));
        let t = std::time::Instant::now();
        assert_eq!(create(&be, "new", json!({})).0, 201);
        assert!(t.elapsed() >= Duration::from_millis(200));

        // A region down: lists touching it fail whole, others answer.
        assert_eq!(control(&be, "scope", json!({"scope": "r2", "fail": true})), 204);
        let (st, err) = call(&be, "GET", "/v1/instances", Some(TOKEN), None);
        assert_eq!((st, err["code"].as_str()), (503, Some("unavailable")));
        assert_eq!(call(&be, "GET", "/v1/instances?region=r1", Some(TOKEN), None).0, 200);
        assert_eq!(control(&be, "scope", json!({"scope": "r2", "fail": false})), 204);
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);

        // Reset forgets everything, and IDs are never reused afterwards.
        let before: Vec<String> = be.instances().into_iter().map(|i| i.id).collect();
        assert_eq!(call(&be, "POST", "/_emulator/reset", None, None).0, 204);
        assert!(be.instances().is_empty());
        let (_, inst) = create(&be, "again", json!({}));
        assert!(!before.contains(&inst["id"].as_str().unwrap().to_string()), "{inst} reuses an id");
    }

    #[test]
    fn drop_stops_the_server() {
        let be = ExampleBackend::start(TOKEN);
        let addr = be.addr();
        assert!(be.url().starts_with("http://127.0.0.1:"));
        drop(be);
        assert!(TcpStream::connect(addr).is_err());
    }
}
