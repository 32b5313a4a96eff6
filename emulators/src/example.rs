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
//! Control surface (no token, never faulted, not recorded as API calls): the shared one of
//! [`crate::control`] (`/_emulator/dump`, `hold`, `state` (POST), `address`, `deleting`,
//! `finish-deletes`, `lock`, `plant`, `faults`, `scope`, `reset`), which is what
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
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, extract::rejection::JsonRejection};
use data_encoding::BASE64;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::control::{
    Dump, DumpInstance, Emulator, Fault, FaultKind, FaultOp, Plant, ScopeFailure,
};

/// Where a planted instance without a scope goes.
pub const DEFAULT_REGION: &str = "r1";

/// The token the emulator binary (`cargo run -p egress-emulators --example emulator --
/// example`) accepts, and `docs/writing-a-provider.md` writes into its secret.
pub const EMULATOR_TOKEN: &str = "emulator-token";

/// An instance as the backend stores and returns it.
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
    /// Base64, exactly as received.
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
}

/// An error answer: status, `code` and `error` (the message) in the body.
#[derive(Debug, Clone)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn not_found() -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such instance")
    }

    /// The error a status stands for, for the older fault route that gives only a status.
    fn for_status(status: u16) -> Self {
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
        ApiError::new(status, code, "injected fault")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": self.message, "code": self.code}));
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            (self.status, [("retry-after", "1")], body).into_response()
        } else {
            (self.status, body).into_response()
        }
    }
}

/// What an injected fault does to one call: wait, then fail (or go on normally).
#[derive(Debug, Clone)]
struct Effect {
    delay: Duration,
    fail: Option<ApiError>,
}

#[derive(Debug)]
struct Backend {
    token: String,
    instances: BTreeMap<String, Instance>,
    next_id: u64,
    auto_run: bool,
    faults: crate::control::FaultQueue<Effect>,
    requests: Vec<String>,
    /// Counted calls (`GET /_emulator/stats`).
    stats: crate::control::RequestStats,
    /// Held in `starting` until released.
    held: BTreeSet<String>,
    /// Locked by a backend action: DELETE answers 409 `locked`.
    locked: BTreeSet<String>,
    /// Deletes in progress, completed only by `finish_deletes`.
    deleting: BTreeSet<String>,
    /// Regions whose listing fails.
    failing_regions: BTreeSet<String>,
}

impl Backend {
    fn new(token: String) -> Self {
        Backend {
            token,
            instances: BTreeMap::new(),
            next_id: 1,
            auto_run: true,
            faults: Default::default(),
            requests: Vec::new(),
            stats: Default::default(),
            held: BTreeSet::new(),
            locked: BTreeSet::new(),
            deleting: BTreeSet::new(),
            failing_regions: BTreeSet::new(),
        }
    }

    /// Forget everything but the token. The ID counter keeps counting, so an ID a test
    /// still holds from before the reset never names a new instance.
    fn reset(&mut self) {
        let next_id = self.next_id;
        *self = Backend::new(std::mem::take(&mut self.token));
        self.next_id = next_id;
    }

    fn allocate_id(&mut self) -> String {
        loop {
            let id = format!("i-{:08x}", self.next_id);
            self.next_id += 1;
            if !self.instances.contains_key(&id) {
                return id;
            }
        }
    }

    /// The oldest fault that applies to a call of `op`, consuming one of its uses.
    fn take_fault(&mut self, op: Option<FaultOp>) -> Option<Effect> {
        self.faults.take(op)
    }

    fn inject(&mut self, fault: &Fault) {
        let fail = |status, code, message: &str| Some(ApiError::new(status, code, message));
        let effect = match &fault.kind {
            FaultKind::ServerError => Effect {
                delay: Duration::ZERO,
                fail: fail(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                ),
            },
            FaultKind::Slow { delay_ms } => Effect {
                delay: Duration::from_millis(*delay_ms),
                fail: None,
            },
            FaultKind::Quota => Effect {
                delay: Duration::ZERO,
                fail: fail(
                    StatusCode::FORBIDDEN,
                    "quota_exceeded",
                    "instance limit reached",
                ),
            },
            FaultKind::RateLimit => Effect {
                delay: Duration::ZERO,
                fail: fail(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "too many requests",
                ),
            },
            FaultKind::Auth => Effect {
                delay: Duration::ZERO,
                fail: fail(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing or wrong bearer token",
                ),
            },
        };
        self.faults.push(fault.op, effect, fault.count);
    }

    /// The older single-fault API: replaces whatever was injected before.
    fn replace_fault(&mut self, effect: Effect, count: u32) {
        self.faults.clear();
        self.faults.push(FaultOp::Any, effect, count);
    }

    fn with<R>(&mut self, id: &str, f: impl FnOnce(&mut Backend, String) -> R) -> Option<R> {
        let key = backend_id(id).to_string();
        if self.instances.contains_key(&key) {
            Some(f(self, key))
        } else {
            None
        }
    }

    fn hold(&mut self, id: &str, hold: bool) -> bool {
        self.with(id, |b, key| {
            if b.deleting.contains(&key) {
                return;
            }
            if hold {
                b.held.insert(key.clone());
                if let Some(i) = b.instances.get_mut(&key) {
                    i.status = "starting".into();
                    i.ip.clear();
                }
            } else {
                b.held.remove(&key);
            }
        })
        .is_some()
    }

    /// A raw state; `running` also gives an instance without an address one.
    fn set_state(&mut self, id: &str, state: &str) -> bool {
        self.with(id, |b, key| {
            b.held.remove(&key);
            if let Some(i) = b.instances.get_mut(&key) {
                i.status = state.to_string();
                if state == "running" && i.ip.is_empty() {
                    i.ip = RUNNING_IP.into();
                }
            }
        })
        .is_some()
    }

    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        self.with(id, |b, key| {
            if let Some(i) = b.instances.get_mut(&key) {
                i.ip = ip.unwrap_or_default().to_string();
            }
        })
        .is_some()
    }

    fn slow_delete(&mut self, id: &str) -> bool {
        self.with(id, |b, key| {
            b.held.remove(&key);
            if let Some(i) = b.instances.get_mut(&key) {
                i.status = "deleting".into();
            }
            b.deleting.insert(key);
        })
        .is_some()
    }

    fn finish_deletes(&mut self) {
        for key in std::mem::take(&mut self.deleting) {
            self.forget(&key);
        }
    }

    fn forget(&mut self, key: &str) {
        self.instances.remove(key);
        self.held.remove(key);
        self.locked.remove(key);
        self.deleting.remove(key);
    }

    fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        self.with(id, |b, key| {
            if locked {
                b.locked.insert(key);
            } else {
                b.locked.remove(&key);
            }
        })
        .is_some()
    }

    fn plant(&mut self, p: &Plant) -> Result<String, ApiError> {
        if p.name.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "name is required",
            ));
        }
        if self.instances.values().any(|i| i.name == p.name) {
            return Err(name_taken());
        }
        let mut labels = BTreeMap::new();
        if p.managed {
            labels.insert(crate::MARK_MANAGED.into(), crate::MARK_MANAGED_YES.into());
        }
        if let Some(uid) = &p.uid {
            labels.insert(crate::MARK_UID.into(), uid.clone());
        }
        if let Some(inst) = &p.installation {
            labels.insert(crate::MARK_INSTALLATION.into(), inst.clone());
        }
        let region = if p.scope.is_empty() {
            DEFAULT_REGION.to_string()
        } else {
            p.scope.clone()
        };
        let id = self.allocate_id();
        let instance = Instance {
            id: id.clone(),
            name: p.name.clone(),
            ip: RUNNING_IP.into(),
            status: "running".into(),
            labels,
            created_at: crate::time::rfc3339(p.created_at.unwrap_or_else(now_secs)),
            user_data: String::new(),
            region,
            zone: String::new(),
            machine_type: String::new(),
            image: String::new(),
            port: 0,
        };
        self.instances.insert(id.clone(), instance);
        Ok(id)
    }

    fn fail_region(&mut self, region: &str, fail: bool) {
        if fail {
            self.failing_regions.insert(region.to_string());
        } else {
            self.failing_regions.remove(region);
        }
    }

    fn dump(&self) -> Dump {
        let instances = self
            .instances
            .values()
            .map(|i| DumpInstance {
                id: i.id.clone(),
                name: i.name.clone(),
                scope: i.region.clone(),
                state: i.status.clone(),
                ip: i.ip.clone(),
                labels: i
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                user_data: i.user_data_bytes(),
            })
            .collect();
        // Instances are all this backend makes: no volumes, no addresses of their own.
        Dump {
            instances,
            secondary: Vec::new(),
        }
    }
}

/// The address a running instance gets.
const RUNNING_IP: &str = "127.0.0.1";

/// `i-00000001`, also from a plugin's `r1/i-00000001`.
fn backend_id(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn name_taken() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        "an instance with this name exists",
    )
}

type Shared = Arc<Mutex<Backend>>;

fn lock(s: &Shared) -> MutexGuard<'_, Backend> {
    // A test that panicked while holding the lock must not hide the real failure behind
    // a poison error in every later call.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running example backend. Stops (closing every connection) when dropped.
pub struct ExampleBackend {
    server: crate::server::ServerThread,
    state: Shared,
}

impl ExampleBackend {
    /// Start on 127.0.0.1 with an OS-chosen port, requiring `Authorization: Bearer
    /// <token>`.
    ///
    /// The server runs on its own thread and runtime, so it works from sync and async
    /// tests alike and keeps answering while the test's runtime is blocked in a
    /// synchronous plugin call.
    pub fn start(token: impl Into<String>) -> ExampleBackend {
        let (listener, _) = crate::server::bind();
        Self::serve(listener, token.into())
    }

    /// Start on `127.0.0.1:port` (0: OS-chosen), for a backend a person points a
    /// providers file at by hand.
    pub fn start_on_port(token: impl Into<String>, port: u16) -> std::io::Result<ExampleBackend> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        Ok(Self::serve(listener, token.into()))
    }

    fn serve(listener: std::net::TcpListener, token: String) -> ExampleBackend {
        let state: Shared = Arc::new(Mutex::new(Backend::new(token)));
        let app = router(state.clone());
        let server = crate::server::ServerThread::spawn("example-backend", listener, app);
        ExampleBackend { server, state }
    }

    /// `http://127.0.0.1:PORT`, the plugin config's `endpoint`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// A snapshot of every instance, ordered by ID.
    pub fn instances(&self) -> Vec<Instance> {
        lock(&self.state).instances.values().cloned().collect()
    }

    pub fn instance(&self, id: &str) -> Option<Instance> {
        lock(&self.state).instances.get(id).cloned()
    }

    /// Every API call so far as `METHOD /path?query` (control calls excluded), e.g. to
    /// assert that a plugin rejected bad input without calling the backend.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }

    /// The next `count` API calls answer `status` with a JSON error body (replacing any
    /// fault injected before).
    pub fn inject_fault(&self, status: u16, count: u32) {
        let effect = Effect {
            delay: Duration::ZERO,
            fail: Some(ApiError::for_status(status)),
        };
        lock(&self.state).replace_fault(effect, count);
    }

    /// The next `count` API calls are answered normally, after `delay` (replacing any
    /// fault injected before).
    pub fn inject_delay(&self, delay: Duration, count: u32) {
        let effect = Effect { delay, fail: None };
        lock(&self.state).replace_fault(effect, count);
    }

    /// Force an instance's status (`running` also sets the IP, anything else clears it).
    /// Returns false when there is no such instance.
    pub fn set_status(&self, id: &str, status: &str) -> bool {
        let ip = (status == "running").then(|| RUNNING_IP.to_string());
        set_status(&mut lock(&self.state), id, status, ip)
    }

    /// Whether `starting` instances become `running` after their first GET (default on).
    pub fn set_auto_run(&self, enabled: bool) {
        lock(&self.state).auto_run = enabled;
    }

    /// Put an instance in as is (e.g. an old orphan, or another installation's), keeping
    /// its ID; allocation skips IDs in use.
    pub fn insert(&self, instance: Instance) {
        lock(&self.state)
            .instances
            .insert(instance.id.clone(), instance);
    }

    /// Forget all instances, requests and faults; keep the token.
    pub fn reset(&self) {
        lock(&self.state).reset();
    }
}

impl Emulator for ExampleBackend {
    fn url(&self) -> String {
        ExampleBackend::url(self)
    }

    /// Unknown IDs are ignored here (the HTTP surface answers 404).
    fn hold_provisioning(&self, id: &str, hold: bool) {
        lock(&self.state).hold(id, hold);
    }

    fn set_backend_state(&self, id: &str, state: &str) {
        lock(&self.state).set_state(id, state);
    }

    fn set_address(&self, id: &str, ip: Option<&str>) {
        lock(&self.state).set_address(id, ip);
    }

    fn start_slow_delete(&self, id: &str) {
        lock(&self.state).slow_delete(id);
    }

    fn finish_deletes(&self) {
        lock(&self.state).finish_deletes();
    }

    fn set_locked(&self, id: &str, locked: bool) {
        lock(&self.state).set_locked(id, locked);
    }

    /// Panics when the backend would refuse the instance (empty or taken name).
    fn plant(&self, plant: Plant) -> String {
        match lock(&self.state).plant(&plant) {
            Ok(id) => id,
            Err(e) => panic!("cannot plant {plant:?}: {}", e.message),
        }
    }

    fn inject(&self, fault: Fault) {
        lock(&self.state).inject(&fault);
    }

    /// Any list whose matches include an instance in `scope` fails whole with 503.
    fn fail_scope(&self, scope: &str, fail: bool) {
        lock(&self.state).fail_region(scope, fail);
    }

    fn dump(&self) -> Dump {
        lock(&self.state).dump()
    }

    fn reset(&self) {
        lock(&self.state).reset();
    }

    fn stats(&self) -> crate::control::RequestStats {
        lock(&self.state).stats.clone()
    }
}

fn set_status(b: &mut Backend, id: &str, status: &str, ip: Option<String>) -> bool {
    match b.instances.get_mut(id) {
        Some(i) => {
            i.status = status.to_string();
            i.ip = ip.unwrap_or_default();
            true
        }
        None => false,
    }
}

fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/instances", get(list_instances).post(create_instance))
        .route(
            "/v1/instances/{id}",
            get(get_instance).delete(delete_instance),
        )
        .layer(middleware::from_fn_with_state(state.clone(), gate));
    let control = Router::new()
        // The shared control surface (`crate::control`).
        .route("/_emulator/dump", get(control_dump))
        .route("/_emulator/hold", post(control_hold))
        .route("/_emulator/state", get(dump_state).post(control_state))
        .route("/_emulator/address", post(control_address))
        .route("/_emulator/deleting", post(control_deleting))
        .route("/_emulator/finish-deletes", post(control_finish_deletes))
        .route("/_emulator/lock", post(control_lock))
        .route("/_emulator/plant", post(control_plant))
        .route("/_emulator/faults", post(control_faults))
        .route("/_emulator/scope", post(control_scope))
        .route("/_emulator/reset", post(control_reset))
        .route("/_emulator/stats", get(control_stats))
        // The example's own, older routes.
        .route("/_emulator/fault", post(set_fault))
        .route("/_emulator/instances/{id}/status", post(control_status))
        .route("/_emulator/auto-run", post(control_auto_run));
    api.merge(control).with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    let code = ApiError::for_status(status.as_u16()).code;
    ApiError::new(status, code, message).into_response()
}

/// The operation a call belongs to, for faults aimed at one.
fn operation(method: &Method, path: &str) -> Option<FaultOp> {
    let rest = path.strip_prefix("/v1/instances")?;
    match (method.as_str(), rest.is_empty()) {
        ("POST", true) => Some(FaultOp::Create),
        ("GET", true) => Some(FaultOp::List),
        ("GET", false) => Some(FaultOp::Get),
        ("DELETE", false) => Some(FaultOp::Delete),
        _ => None,
    }
}

/// Records the call, applies an injected fault or delay, then checks the token: a fault
/// stands for a failure in front of the API (proxy, load balancer), so it wins over auth.
async fn gate(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let line = match req.uri().query() {
        Some(q) => format!("{} {}?{}", req.method(), req.uri().path(), q),
        None => format!("{} {}", req.method(), req.uri().path()),
    };
    let op = operation(req.method(), req.uri().path());
    let (fault, authorized) = {
        let mut b = lock(&state);
        b.requests.push(line);
        let path = req.uri().path();
        let route = if path.starts_with("/v1/instances/") {
            "/v1/instances/{id}"
        } else {
            path
        };
        b.stats.record(op, &format!("{} {route}", req.method()));
        let fault = b.take_fault(op);
        let want = format!("Bearer {}", b.token);
        let authorized = bearer(req.headers()) == Some(want.as_str());
        (fault, authorized)
    };
    if let Some(f) = fault {
        if !f.delay.is_zero() {
            tokio::time::sleep(f.delay).await;
        }
        if let Some(e) = f.fail {
            let resp = e.into_response();
            if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                lock(&state).stats.rate_limited += 1;
            }
            return resp;
        }
    }
    if !authorized {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    next.run(req).await
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    h.get("authorization").and_then(|v| v.to_str().ok())
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
    State(state): State<Shared>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Response {
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    if body.name.is_empty() {
        return error(StatusCode::BAD_REQUEST, "name is required");
    }
    if BASE64.decode(body.user_data.as_bytes()).is_err() {
        return error(StatusCode::BAD_REQUEST, "user_data is not base64");
    }
    let mut b = lock(&state);
    if b.instances.values().any(|i| i.name == body.name) {
        return name_taken().into_response();
    }
    let id = b.allocate_id();
    let instance = Instance {
        id: id.clone(),
        name: body.name,
        ip: String::new(),
        status: "starting".into(),
        labels: body.labels,
        created_at: crate::time::rfc3339(now_secs()),
        user_data: body.user_data,
        region: body.region,
        zone: body.zone,
        machine_type: body.machine_type,
        image: body.image,
        port: body.port,
    };
    b.instances.insert(id, instance.clone());
    (StatusCode::CREATED, Json(instance)).into_response()
}

async fn list_instances(
    State(state): State<Shared>,
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
                None => return error(StatusCode::BAD_REQUEST, "label filter must be k=v"),
            },
            _ => return error(StatusCode::BAD_REQUEST, &format!("unknown filter {k:?}")),
        }
    }
    let b = lock(&state);
    let instances: Vec<&Instance> = b
        .instances
        .values()
        .filter(|i| name.as_ref().is_none_or(|n| &i.name == n))
        .filter(|i| region.as_ref().is_none_or(|r| &i.region == r))
        .filter(|i| labels.iter().all(|(k, v)| i.labels.get(k) == Some(v)))
        .collect();
    if let Some(down) = instances
        .iter()
        .find(|i| b.failing_regions.contains(&i.region))
    {
        let msg = format!("region {:?} is unavailable", down.region);
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg).into_response();
    }
    Json(json!({ "instances": instances })).into_response()
}

async fn get_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut b = lock(&state);
    let Some(instance) = b.instances.get(&id).cloned() else {
        return ApiError::not_found().into_response();
    };
    // The first GET shows `starting`; the next one finds it running, like a fast cloud.
    if b.auto_run && instance.status == "starting" && !b.held.contains(&id) {
        set_status(&mut b, &id, "running", Some(RUNNING_IP.into()));
    }
    Json(instance).into_response()
}

async fn delete_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut b = lock(&state);
    let Some(instance) = b.instances.get(&id).cloned() else {
        return ApiError::not_found().into_response();
    };
    if b.locked.contains(&id) {
        let msg = "the instance is locked by another action";
        return ApiError::new(StatusCode::CONFLICT, "locked", msg).into_response();
    }
    if b.deleting.contains(&id) {
        return (StatusCode::ACCEPTED, Json(instance)).into_response();
    }
    b.forget(&id);
    StatusCode::NO_CONTENT.into_response()
}

// ---- control surface --------------------------------------------------------------------

fn done(found: bool) -> Response {
    if found {
        StatusCode::NO_CONTENT.into_response()
    } else {
        ApiError::not_found().into_response()
    }
}

fn yes() -> bool {
    true
}

async fn control_dump(State(state): State<Shared>) -> Response {
    Json(lock(&state).dump()).into_response()
}

async fn control_stats(State(state): State<Shared>) -> Response {
    Json(lock(&state).stats.clone()).into_response()
}

#[derive(Deserialize)]
struct HoldBody {
    id: String,
    #[serde(default = "yes")]
    hold: bool,
}

async fn control_hold(State(state): State<Shared>, Json(b): Json<HoldBody>) -> Response {
    done(lock(&state).hold(&b.id, b.hold))
}

#[derive(Deserialize)]
struct StateBody {
    id: String,
    state: String,
}

async fn control_state(State(state): State<Shared>, Json(b): Json<StateBody>) -> Response {
    done(lock(&state).set_state(&b.id, &b.state))
}

#[derive(Deserialize)]
struct AddressBody {
    id: String,
    ip: Option<String>,
}

async fn control_address(State(state): State<Shared>, Json(b): Json<AddressBody>) -> Response {
    done(lock(&state).set_address(&b.id, b.ip.as_deref()))
}

#[derive(Deserialize)]
struct IdBody {
    id: String,
}

async fn control_deleting(State(state): State<Shared>, Json(b): Json<IdBody>) -> Response {
    done(lock(&state).slow_delete(&b.id))
}

async fn control_finish_deletes(State(state): State<Shared>) -> Response {
    lock(&state).finish_deletes();
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct LockBody {
    id: String,
    #[serde(default = "yes")]
    locked: bool,
}

async fn control_lock(State(state): State<Shared>, Json(b): Json<LockBody>) -> Response {
    done(lock(&state).set_locked(&b.id, b.locked))
}

async fn control_plant(State(state): State<Shared>, Json(p): Json<Plant>) -> Response {
    match lock(&state).plant(&p) {
        Ok(id) => Json(json!({ "id": id })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn control_faults(State(state): State<Shared>, Json(f): Json<Fault>) -> Response {
    lock(&state).inject(&f);
    StatusCode::NO_CONTENT.into_response()
}

async fn control_scope(State(state): State<Shared>, Json(b): Json<ScopeFailure>) -> Response {
    lock(&state).fail_region(&b.scope, b.fail);
    StatusCode::NO_CONTENT.into_response()
}

async fn dump_state(State(state): State<Shared>) -> Response {
    let b = lock(&state);
    let instances: Vec<&Instance> = b.instances.values().collect();
    Json(json!({
        "instances": instances,
        "requests": b.requests,
        "auto_run": b.auto_run,
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

async fn set_fault(State(state): State<Shared>, Json(fault): Json<LegacyFault>) -> Response {
    let effect = Effect {
        delay: Duration::from_millis(fault.delay_ms),
        fail: fault.status.map(ApiError::for_status),
    };
    lock(&state).replace_fault(effect, fault.count);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct StatusBody {
    status: String,
    #[serde(default)]
    ip: Option<String>,
}

async fn control_status(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Json(body): Json<StatusBody>,
) -> Response {
    let ip = body
        .ip
        .or_else(|| (body.status == "running").then(|| RUNNING_IP.to_string()));
    if set_status(&mut lock(&state), &id, &body.status, ip) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        ApiError::not_found().into_response()
    }
}

#[derive(Deserialize)]
struct AutoRunBody {
    enabled: bool,
}

async fn control_auto_run(State(state): State<Shared>, Json(body): Json<AutoRunBody>) -> Response {
    lock(&state).auto_run = body.enabled;
    StatusCode::NO_CONTENT.into_response()
}

async fn control_reset(State(state): State<Shared>) -> Response {
    lock(&state).reset();
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
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
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
        let text = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
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
        call(
            be,
            "POST",
            "/v1/instances",
            Some(TOKEN),
            Some(&body.to_string()),
        )
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

        let (st, first) = call(
            &be,
            "GET",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!((st, first["status"].as_str()), (200, Some("starting")));
        let (_, second) = call(
            &be,
            "GET",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!(second["status"], "running");
        assert_eq!(second["ip"], "127.0.0.1");
        assert_eq!(be.instances()[0].user_data_bytes(), b"#cloud-config\n");

        let (st, _) = call(
            &be,
            "DELETE",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!(st, 204);
        let (st, _) = call(
            &be,
            "DELETE",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!(st, 404);
        let (st, _) = call(
            &be,
            "GET",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
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
        assert_eq!(
            call(&be, "POST", "/v1/instances", Some(TOKEN), Some(&bad)).0,
            400
        );
        assert_eq!(
            call(&be, "POST", "/v1/instances", Some(TOKEN), Some("{")).0,
            400
        );
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
        assert_eq!(
            call(&be, "GET", "/v1/instances?label=nokv", Some(TOKEN), None).0,
            400
        );
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
            let (_, i) = call(
                &be,
                "GET",
                &format!("/v1/instances/{id}"),
                Some(TOKEN),
                None,
            );
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
            assert_eq!(
                (i["status"].as_str(), i["ip"].as_str()),
                (Some("starting"), Some(""))
            );
        }
        assert_eq!(
            control(
                &be,
                "hold",
                json!({"id": format!("r1/{id}"), "hold": false})
            ),
            204
        );
        get_status(&be, &id);
        assert_eq!(get_status(&be, &id).1["status"], "running");

        // Raw state and address, independently of each other.
        assert_eq!(
            control(&be, "state", json!({"id": id, "state": "weird"})),
            204
        );
        assert_eq!(get_status(&be, &id).1["status"], "weird");
        assert_eq!(
            control(&be, "state", json!({"id": id, "state": "running"})),
            204
        );
        assert_eq!(control(&be, "address", json!({"id": id, "ip": null})), 204);
        let (_, i) = get_status(&be, &id);
        assert_eq!(
            (i["status"].as_str(), i["ip"].as_str()),
            (Some("running"), Some(""))
        );
        assert_eq!(
            control(&be, "address", json!({"id": "i-nope", "ip": null})),
            404
        );

        // Locked: reads work, DELETE answers 409 `locked`.
        assert_eq!(control(&be, "lock", json!({"id": id, "locked": true})), 204);
        assert_eq!(get_status(&be, &id).0, 200);
        let (st, err) = call(
            &be,
            "DELETE",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!((st, err["code"].as_str()), (409, Some("locked")));
        assert_eq!(
            control(&be, "lock", json!({"id": id, "locked": false})),
            204
        );

        // A delete in progress: still readable as `deleting`, the name stays taken, a
        // repeat DELETE is accepted; finish-deletes ends it.
        assert_eq!(control(&be, "deleting", json!({"id": id})), 204);
        assert_eq!(get_status(&be, &id).1["status"], "deleting");
        assert_eq!(create(&be, "a", json!({})).0, 409);
        let (st, _) = call(
            &be,
            "DELETE",
            &format!("/v1/instances/{id}"),
            Some(TOKEN),
            None,
        );
        assert_eq!(st, 202);
        let (_, dump) = call(&be, "GET", "/_emulator/dump", None, None);
        assert_eq!(dump["instances"][0]["state"], "deleting");
        assert_eq!(dump["instances"][0]["scope"], "r1");
        assert_eq!(dump["secondary"], json!([]));
        assert_eq!(
            call(&be, "POST", "/_emulator/finish-deletes", None, None).0,
            204
        );
        let (st, err) = get_status(&be, &id);
        assert_eq!((st, err["code"].as_str()), (404, Some("not_found")));
        assert!(be.dump().instances.is_empty());
    }

    #[test]
    fn plant_faults_scopes_and_reset() {
        let be = ExampleBackend::start(TOKEN);
        let plant = json!({"name": "old", "scope": "r2", "managed": true, "uid": "",
                           "installation": "inst", "created_at": 1_600_000_000});
        let (st, planted) = call(
            &be,
            "POST",
            "/_emulator/plant",
            None,
            Some(&plant.to_string()),
        );
        assert_eq!(st, 200);
        let id = planted["id"].as_str().unwrap().to_string();
        let i = be.instance(&id).unwrap();
        assert_eq!((i.region.as_str(), i.status.as_str()), ("r2", "running"));
        assert_eq!(i.created_at, "2020-09-13T12:26:40Z");
        assert_eq!(i.labels.get(crate::MARK_UID).map(String::as_str), Some(""));
        assert_eq!(
            i.labels.get(crate::MARK_MANAGED).map(String::as_str),
            Some("true")
        );
        let dup = call(
            &be,
            "POST",
            "/_emulator/plant",
            None,
            Some(&plant.to_string()),
        );
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
        assert_eq!(
            control(&be, "scope", json!({"scope": "r2", "fail": true})),
            204
        );
        let (st, err) = call(&be, "GET", "/v1/instances", Some(TOKEN), None);
        assert_eq!((st, err["code"].as_str()), (503, Some("unavailable")));
        assert_eq!(
            call(&be, "GET", "/v1/instances?region=r1", Some(TOKEN), None).0,
            200
        );
        assert_eq!(
            control(&be, "scope", json!({"scope": "r2", "fail": false})),
            204
        );
        assert_eq!(call(&be, "GET", "/v1/instances", Some(TOKEN), None).0, 200);

        // Reset forgets everything, and IDs are never reused afterwards.
        let before: Vec<String> = be.instances().into_iter().map(|i| i.id).collect();
        assert_eq!(call(&be, "POST", "/_emulator/reset", None, None).0, 204);
        assert!(be.instances().is_empty());
        let (_, inst) = create(&be, "again", json!({}));
        assert!(
            !before.contains(&inst["id"].as_str().unwrap().to_string()),
            "{inst} reuses an id"
        );
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
