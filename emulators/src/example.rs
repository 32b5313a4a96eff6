//! The example backend: a small JSON REST API that `providers-wasm/example` talks to.
//!
//! It is deliberately shaped like a real cloud API (allocated IDs, names as labels,
//! server-side label filters, asynchronous start) so the example plugin exercises every
//! rule of the provider contract, and the conformance suite can force the awkward cases.
//!
//! API (all under a bearer token; 401 otherwise):
//! - `POST /v1/instances` `{name, labels, user_data (base64), region, zone, machine_type,
//!   image, port}` -> 201 instance, 409 when the name exists, 400 on a bad body (also
//!   for bodies over axum's 2 MB default limit; real clouds cap user data far lower).
//! - `GET /v1/instances?name=N&region=R&label=k=v` (label repeatable, all must match)
//!   -> `{"instances": [...]}`.
//! - `GET /v1/instances/{id}` -> instance, 404 when gone. A `starting` instance becomes
//!   `running` (ip `127.0.0.1`) after the first GET, unless auto-run is off.
//! - `DELETE /v1/instances/{id}` -> 204, 404 when unknown.
//!
//! Control surface (no token, never faulted):
//! - `GET /_emulator/state` -> `{instances, requests, auto_run}`.
//! - `POST /_emulator/fault` `{status?, count, delay_ms?}`: the next `count` API calls
//!   wait `delay_ms`, then answer `status` (or proceed normally when no status).
//! - `POST /_emulator/instances/{id}/status` `{status, ip?}`.
//! - `POST /_emulator/auto-run` `{enabled}`.
//! - `POST /_emulator/reset`.

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, extract::rejection::JsonRejection};
use data_encoding::BASE64;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// An instance as the backend stores and returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub name: String,
    /// `""` until the instance runs, then `127.0.0.1`.
    pub ip: String,
    /// `starting`, `running`, `stopping` or `stopped` (or anything set through the
    /// control surface, to test how a plugin maps unknown states).
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

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Fault {
    #[serde(default)]
    status: Option<u16>,
    count: u32,
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Debug)]
struct Backend {
    token: String,
    instances: BTreeMap<String, Instance>,
    next_id: u64,
    auto_run: bool,
    fault: Fault,
    requests: Vec<String>,
}

impl Backend {
    fn new(token: String) -> Self {
        Backend {
            token,
            instances: BTreeMap::new(),
            next_id: 1,
            auto_run: true,
            fault: Fault::default(),
            requests: Vec::new(),
        }
    }

    fn reset(&mut self) {
        *self = Backend::new(std::mem::take(&mut self.token));
    }
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
        let state: Shared = Arc::new(Mutex::new(Backend::new(token.into())));
        let (listener, _) = crate::server::bind();
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

    /// The next `count` API calls answer `status` with a JSON error body.
    pub fn inject_fault(&self, status: u16, count: u32) {
        lock(&self.state).fault = Fault {
            status: Some(status),
            count,
            delay_ms: 0,
        };
    }

    /// The next `count` API calls are answered normally, after `delay`.
    pub fn inject_delay(&self, delay: Duration, count: u32) {
        lock(&self.state).fault = Fault {
            status: None,
            count,
            delay_ms: delay.as_millis() as u64,
        };
    }

    /// Force an instance's status (`running` also sets the IP, anything else clears it).
    /// Returns false when there is no such instance.
    pub fn set_status(&self, id: &str, status: &str) -> bool {
        let ip = (status == "running").then(|| "127.0.0.1".to_string());
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
        .route("/_emulator/state", get(dump_state))
        .route("/_emulator/fault", post(set_fault))
        .route("/_emulator/instances/{id}/status", post(control_status))
        .route("/_emulator/auto-run", post(control_auto_run))
        .route("/_emulator/reset", post(control_reset));
    api.merge(control).with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

/// Records the call, applies an injected fault or delay, then checks the token: a fault
/// stands for a failure in front of the API (proxy, load balancer), so it wins over auth.
async fn gate(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let line = match req.uri().query() {
        Some(q) => format!("{} {}?{}", req.method(), req.uri().path(), q),
        None => format!("{} {}", req.method(), req.uri().path()),
    };
    let (fault, authorized) = {
        let mut b = lock(&state);
        b.requests.push(line);
        let fault = if b.fault.count > 0 {
            b.fault.count -= 1;
            Some(b.fault.clone())
        } else {
            None
        };
        let want = format!("Bearer {}", b.token);
        let authorized = bearer(req.headers()) == Some(want.as_str());
        (fault, authorized)
    };
    if let Some(f) = fault {
        if f.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
        }
        if let Some(code) = f.status {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(status, "injected fault");
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
        return error(StatusCode::CONFLICT, "an instance with this name exists");
    }
    let id = loop {
        let id = format!("i-{:08x}", b.next_id);
        b.next_id += 1;
        if !b.instances.contains_key(&id) {
            break id;
        }
    };
    let instance = Instance {
        id: id.clone(),
        name: body.name,
        ip: String::new(),
        status: "starting".into(),
        labels: body.labels,
        created_at: crate::time::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
        ),
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
    Json(json!({ "instances": instances })).into_response()
}

async fn get_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut b = lock(&state);
    let Some(instance) = b.instances.get(&id).cloned() else {
        return error(StatusCode::NOT_FOUND, "no such instance");
    };
    // The first GET shows `starting`; the next one finds it running, like a fast cloud.
    if b.auto_run && instance.status == "starting" {
        set_status(&mut b, &id, "running", Some("127.0.0.1".into()));
    }
    Json(instance).into_response()
}

async fn delete_instance(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut b = lock(&state);
    match b.instances.remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => error(StatusCode::NOT_FOUND, "no such instance"),
    }
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

async fn set_fault(State(state): State<Shared>, Json(fault): Json<Fault>) -> Response {
    lock(&state).fault = fault;
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
        .or_else(|| (body.status == "running").then(|| "127.0.0.1".to_string()));
    if set_status(&mut lock(&state), &id, &body.status, ip) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error(StatusCode::NOT_FOUND, "no such instance")
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

    #[test]
    fn drop_stops_the_server() {
        let be = ExampleBackend::start(TOKEN);
        let addr = be.addr();
        assert!(be.url().starts_with("http://127.0.0.1:"));
        drop(be);
        assert!(TcpStream::connect(addr).is_err());
    }
}
