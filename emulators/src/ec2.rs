//! An emulator of the AWS EC2 Query API (version 2016-11-15), close enough on the wire that
//! an EC2 plugin cannot tell it from the real service.
//!
//! Why not just moto: moto skips signature checks by default, ignores `ClientToken`, goes
//! straight to `running` and has no way to hold an instance in a state, lock it, fail one
//! region or inject quota and throttling errors. The conformance suite needs all of that,
//! and needs it in-process and in milliseconds.
//!
//! What a plugin sees:
//! - `POST /` with an `application/x-www-form-urlencoded` body (or `GET /?...`) carrying
//!   `Action=...&Version=2016-11-15`; answers are XML in EC2's namespace with a
//!   `requestId`, errors are `<Response><Errors><Error><Code/><Message/></Error></Errors>
//!   <RequestID/></Response>` with EC2's HTTP status for the code.
//! - Every call must carry a valid SigV4 `Authorization` header for service `ec2`. The
//!   region of the credential scope selects the region the call acts on, so one emulator
//!   serves every configured region (like moto).
//! - Actions: RunInstances, DescribeInstances, TerminateInstances, DescribeVolumes,
//!   DescribeInstanceAttribute, DescribeAvailabilityZones, DescribeRegions.
//! - Lifecycle: `pending` (private IP only) -> `running` (public IP [`Ec2Config::public_ip`])
//!   per [`Ec2Config::launch`]; TerminateInstances -> `shutting-down` -> `terminated` per
//!   [`Ec2Config::shutdown`]; terminated instances stay listed for
//!   [`Ec2Config::terminated_visible_for`] and then answer `InvalidInstanceID.NotFound`.
//! - Volumes: a root volume on [`Ec2Config::root_device_name`] plus one per extra
//!   `BlockDeviceMapping.N`. DeleteOnTermination defaults to **false** (real EC2 takes the
//!   AMI's default, usually true), so a plugin that forgets to set it leaks a volume that
//!   [`Emulator::dump`] and DescribeVolumes show.
//!
//! The control surface ([`crate::control`]) maps onto EC2 like this:
//! - faults answer as EC2 does: server-error alternates `InternalError` (500) and
//!   `Unavailable` (503), starting with 500; quota is `InstanceLimitExceeded` (400; EC2's
//!   other capacity answers are `InsufficientInstanceCapacity`, 500, and
//!   `VcpuLimitExceeded`, 400); rate-limit is `RequestLimitExceeded` (503); auth is
//!   `AuthFailure` (401). Create is RunInstances, Get is DescribeInstances with
//!   `InstanceId.N` (and DescribeInstanceAttribute), List is DescribeInstances without ids
//!   (and DescribeVolumes), Delete is TerminateInstances.
//! - `fail_scope(region)` answers every call signed for that region with 503 `Unavailable`.
//! - `set_locked`: EC2 has no locks, so a locked instance is one whose state transition is
//!   in progress: its state is frozen (no schedule moves it) and TerminateInstances on it
//!   answers 400 `IncorrectInstanceState`, which a plugin must treat as transient.
//! - `set_backend_state`: the raw state name; `running` assigns the public IP, any other
//!   state removes it, `terminated` also releases the volumes. A forced state is kept (no
//!   automatic transition) until the next TerminateInstances.
//! - `start_slow_delete`: TerminateInstances whose `shutting-down` lasts until
//!   [`Emulator::finish_deletes`].
//! - `plant`: a `running` instance tagged `Name` plus the marks of
//!   [`crate::MARK_MANAGED`] / `MARK_UID` / `MARK_INSTALLATION`, with a root
//!   volume that is deleted on termination.
//! - `dump`: instances not yet `terminated`, and every volume as a secondary resource.
//!
//! Real-proxy mode: with [`Ec2Config::real_proxies`] set, an instance that enters
//! `running` gets a real forward proxy on 127.0.0.1 (port from its user data, see
//! [`crate::real_proxy`]) and 127.0.0.1 as its public IP; the proxy stops when the instance
//! leaves `running` (TerminateInstances, a forced state, a hold, a reset) and when the
//! emulator is dropped.
//!
//! Rate limit: off by default. With [`Ec2Config::rate_limit`] (or `POST
//! /_emulator/rate-limit`) every signed call of a valid action takes a token from the
//! bucket of its action and region (EC2's "request rate limiting", per API, account and
//! Region); a call without one answers 503 `RequestLimitExceeded` ("Request limit
//! exceeded.") and does nothing. EC2 sends no rate-limit headers and no `Retry-After`.
//!
//! HTTP control routes (no SigV4) follow [`crate::control`], plus
//! `POST /_emulator/finish-deletes` and `GET /_emulator/requests`.

mod api;
mod model;
mod sigv4;
mod xml;

#[cfg(test)]
mod tests;

pub use sigv4::{Credential, SignatureMismatch};

use crate::control::{
    Dump, DumpInstance, DumpSecondary, Emulator, Fault, FaultKind, Plant, ScopeFailure,
};
use api::{ApiError, Params};
use axum::Router;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, extract::rejection::JsonRejection};
use model::{DiskSpec, LaunchSpec, State, unix_now};
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What one region offers. Anything outside it is refused with EC2's error codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionCatalog {
    pub name: String,
    /// The first zone is where instances land when the request names none.
    pub zones: Vec<String>,
    /// AMI ids; AMIs are regional in EC2, so the same id in another region is unknown.
    pub images: Vec<String>,
    pub instance_types: Vec<String>,
}

impl RegionCatalog {
    /// Zones `{name}a`, `{name}b`, ...; the given AMIs and instance types.
    pub fn new(name: &str, zone_letters: &str, images: &[&str], instance_types: &[&str]) -> Self {
        RegionCatalog {
            name: name.to_string(),
            zones: zone_letters.chars().map(|c| format!("{name}{c}")).collect(),
            images: images.iter().map(|s| s.to_string()).collect(),
            instance_types: instance_types.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// When an instance leaves `pending` (or `shutting-down`) by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// After this many DescribeInstances answers have shown it in the state: with 1, the
    /// first Describe shows `pending` and the next `running`, like a fast real launch;
    /// with 0, every call after the one that entered the state sees the next one.
    AfterDescribes(u32),
    /// After this much time in the state.
    After(Duration),
    /// Only through the control surface.
    Manual,
}

#[derive(Debug, Clone)]
pub struct Ec2Config {
    pub credentials: Vec<Credential>,
    pub regions: Vec<RegionCatalog>,
    /// `pending` -> `running`.
    pub launch: Transition,
    /// `shutting-down` -> `terminated`.
    pub shutdown: Transition,
    /// How long terminated instances stay listed (EC2: "usually less than one hour").
    pub terminated_visible_for: Duration,
    /// Eventual consistency: a new instance is invisible to DescribeInstances (and answers
    /// `InvalidInstanceID.NotFound`) for this long after RunInstances. Zero turns it off.
    pub eventual_consistency: Duration,
    /// The public IP a running instance gets. Loopback by default so health probes and
    /// clients in the test process can reach a proxy listening there.
    pub public_ip: String,
    pub root_device_name: String,
    /// Instances (not shutting down or terminated) allowed per region; RunInstances past it
    /// answers `InstanceLimitExceeded`. `None` is unlimited.
    pub instance_limit: Option<u32>,
    pub owner_id: String,
    /// How far `x-amz-date` may be from the emulator's clock (EC2: 15 minutes).
    pub max_clock_skew: Duration,
    pub signature_mismatch: SignatureMismatch,
    /// Real-proxy mode (see the module documentation); `None` by default.
    pub real_proxies: Option<Arc<crate::real_proxy::RealProxies>>,
    /// EC2's request rate limiting, enforced: one bucket per action and region (as EC2
    /// keeps one per API per account and Region); a call past it answers 503
    /// `RequestLimitExceeded`. `None` (the default): never limited.
    pub rate_limit: Option<crate::rate_limit::RateLimit>,
}

/// The access key from AWS's documentation examples.
pub const EXAMPLE_ACCESS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
/// The secret key from AWS's documentation examples.
pub const EXAMPLE_SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

impl Default for Ec2Config {
    /// us-east-1 and eu-west-1 with three zones each, one AMI each, four instance types,
    /// and AWS's documented example key pair.
    fn default() -> Self {
        let types = ["t3.micro", "t3.small", "t3.medium", "m5.large"];
        Ec2Config {
            credentials: vec![Credential {
                access_key: EXAMPLE_ACCESS_KEY.into(),
                secret_key: EXAMPLE_SECRET_KEY.into(),
                session_token: None,
            }],
            regions: vec![
                RegionCatalog::new("us-east-1", "abc", &["ami-0abcdef1234567890"], &types),
                RegionCatalog::new("eu-west-1", "abc", &["ami-0fedcba9876543210"], &types),
            ],
            launch: Transition::AfterDescribes(1),
            shutdown: Transition::AfterDescribes(1),
            terminated_visible_for: Duration::from_secs(3600),
            eventual_consistency: Duration::ZERO,
            public_ip: "127.0.0.1".into(),
            root_device_name: "/dev/xvda".into(),
            instance_limit: None,
            owner_id: "123456789012".into(),
            max_clock_skew: Duration::from_secs(15 * 60),
            signature_mismatch: SignatureMismatch::AuthFailure,
            real_proxies: None,
            rate_limit: None,
        }
    }
}

impl Ec2Config {
    /// Also accept a long-term key pair.
    pub fn with_credential(mut self, access_key: &str, secret_key: &str) -> Self {
        self.credentials.push(Credential {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            session_token: None,
        });
        self
    }

    /// Also accept session credentials, which must send `x-amz-security-token`.
    pub fn with_session_credential(
        mut self,
        access_key: &str,
        secret_key: &str,
        session_token: &str,
    ) -> Self {
        self.credentials.push(Credential {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            session_token: Some(session_token.into()),
        });
        self
    }

    pub(crate) fn region(&self, name: &str) -> Option<&RegionCatalog> {
        self.regions.iter().find(|r| r.name == name)
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    // A test that panicked while holding the lock must not hide the real failure behind
    // a poison error in every later call.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running EC2 emulator on 127.0.0.1. Stops (closing every connection) when dropped.
pub struct Ec2Emulator {
    server: crate::server::ServerThread,
    state: Shared,
}

impl Ec2Emulator {
    /// Start on an OS-chosen port.
    ///
    /// The server runs on its own thread and runtime, so it works from sync and async tests
    /// alike and keeps answering while the test's runtime is blocked in a synchronous
    /// plugin call.
    ///
    /// # Panics
    /// When the config has no region or a region has no zone: every call needs both.
    pub fn start(config: Ec2Config) -> Ec2Emulator {
        assert!(!config.regions.is_empty(), "Ec2Config needs a region");
        assert!(
            config.regions.iter().all(|r| !r.zones.is_empty()),
            "every region needs a zone"
        );
        let state: Shared = Arc::new(Mutex::new(State::new(Arc::new(config))));
        let (listener, _) = crate::server::bind();
        let app = router(state.clone());
        let server = crate::server::ServerThread::spawn("ec2-emulator", listener, app);
        Ec2Emulator { server, state }
    }

    /// `http://127.0.0.1:PORT`, the plugin's endpoint for every region.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The `Action` of every API call so far, in order (control calls excluded; calls that
    /// failed authentication included, with `""` when there was no Action).
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }
}

impl Drop for Ec2Emulator {
    /// Real-proxy mode: the proxies of this emulator's instances stop with it.
    fn drop(&mut self) {
        lock(&self.state).stop_all_proxies();
    }
}

impl Emulator for Ec2Emulator {
    fn url(&self) -> String {
        Ec2Emulator::url(self)
    }

    fn hold_provisioning(&self, id: &str, hold: bool) {
        hold_provisioning(&self.state, id, hold);
    }

    fn set_backend_state(&self, id: &str, state: &str) {
        lock(&self.state).force_state(id, state, Instant::now());
    }

    fn set_address(&self, id: &str, ip: Option<&str>) {
        set_address(&self.state, id, ip);
    }

    fn start_slow_delete(&self, id: &str) {
        start_slow_delete(&self.state, id);
    }

    fn finish_deletes(&self) {
        finish_deletes(&self.state);
    }

    fn set_locked(&self, id: &str, locked: bool) {
        set_locked(&self.state, id, locked);
    }

    fn plant(&self, plant: Plant) -> String {
        plant_instance(&self.state, plant)
    }

    fn inject(&self, fault: Fault) {
        lock(&self.state)
            .faults
            .push(model::ActiveFault { fault, served: 0 });
    }

    fn fail_scope(&self, scope: &str, fail: bool) {
        fail_scope(&self.state, scope, fail);
    }

    fn dump(&self) -> Dump {
        dump(&lock(&self.state))
    }

    fn reset(&self) {
        reset(&self.state);
    }

    fn stats(&self) -> crate::control::RequestStats {
        lock(&self.state).stats.clone()
    }

    fn set_rate_limit(&self, limit: Option<crate::rate_limit::RateLimit>) {
        let mut st = lock(&self.state);
        st.rate_limit = limit;
        st.rate_buckets.clear();
    }
}

// ---------------------------------------------------------------------------------------
// Control operations shared by the Rust API and the HTTP routes. Those that take an id
// return whether the instance exists, which the HTTP routes turn into 204 or 404.

fn hold_provisioning(s: &Shared, id: &str, hold: bool) -> bool {
    lock(s).set_hold(id, hold, Instant::now())
}

fn set_address(s: &Shared, id: &str, ip: Option<&str>) -> bool {
    match lock(s).instances.get_mut(id) {
        Some(inst) => {
            inst.public_ip = ip.map(str::to_string);
            true
        }
        None => false,
    }
}

fn start_slow_delete(s: &Shared, id: &str) -> bool {
    let mut st = lock(s);
    if !st.instances.contains_key(id) {
        return false;
    }
    st.begin_terminate(id, Instant::now());
    if let Some(inst) = st.instances.get_mut(id)
        && inst.state == "shutting-down"
    {
        inst.slow_delete = true;
    }
    true
}

fn finish_deletes(s: &Shared) {
    let mut st = lock(s);
    let now = Instant::now();
    let slow: Vec<String> = st
        .instances
        .values()
        .filter(|i| i.slow_delete)
        .map(|i| i.id.clone())
        .collect();
    for id in slow {
        st.enter_terminated(&id, now);
    }
}

fn set_locked(s: &Shared, id: &str, locked: bool) -> bool {
    let mut st = lock(s);
    match st.instances.get_mut(id) {
        Some(inst) => {
            inst.locked = locked;
            true
        }
        None => false,
    }
}

/// Forget everything but the configuration.
fn reset(s: &Shared) {
    let mut st = lock(s);
    st.stop_all_proxies();
    let cfg = st.cfg.clone();
    // The rate limit is configuration: it stays, with full buckets.
    let rate_limit = st.rate_limit;
    *st = State::new(cfg);
    st.rate_limit = rate_limit;
}

fn fail_scope(s: &Shared, scope: &str, fail: bool) {
    let mut st = lock(s);
    if fail {
        st.failing_scopes.insert(scope.to_string());
    } else {
        st.failing_scopes.remove(scope);
    }
}

fn plant_instance(s: &Shared, plant: Plant) -> String {
    let mut st = lock(s);
    let cfg = st.cfg.clone();
    let catalog = cfg
        .region(&plant.scope)
        .unwrap_or_else(|| &cfg.regions[0])
        .clone();
    let mut tags = vec![("Name".to_string(), plant.name.clone())];
    if plant.managed {
        tags.push((crate::MARK_MANAGED.into(), crate::MARK_MANAGED_YES.into()));
    }
    if let Some(uid) = plant.uid {
        tags.push((crate::MARK_UID.into(), uid));
    }
    if let Some(inst) = plant.installation {
        tags.push((crate::MARK_INSTALLATION.into(), inst));
    }
    let reservation = st.launch(
        LaunchSpec {
            region: catalog.name.clone(),
            zone: catalog.zones[0].clone(),
            image_id: catalog.images.first().cloned().unwrap_or_default(),
            instance_type: catalog.instance_types.first().cloned().unwrap_or_default(),
            count: 1,
            user_data: None,
            client_token: String::new(),
            subnet_id: None,
            security_groups: Vec::new(),
            instance_tags: tags,
            volume_tags: Vec::new(),
            disks: vec![DiskSpec {
                device: cfg.root_device_name.clone(),
                size: 8,
                volume_type: "gp3".into(),
                delete_on_termination: true,
            }],
            launch_time: plant.created_at.unwrap_or_else(unix_now),
            planted: true,
        },
        Instant::now(),
    );
    st.reservations[&reservation].instance_ids[0].clone()
}

fn dump(st: &State) -> Dump {
    let instances = st
        .instances
        .values()
        .filter(|i| i.state != "terminated" && !i.expired)
        .map(|i| DumpInstance {
            id: i.id.clone(),
            name: i.tag("Name").unwrap_or("").to_string(),
            scope: i.region.clone(),
            state: i.state.clone(),
            ip: i.public_ip.clone().unwrap_or_default(),
            labels: i.tags.clone(),
            user_data: i.user_data.clone().unwrap_or_default(),
        })
        .collect();
    let secondary = st
        .volumes
        .values()
        .map(|v| DumpSecondary {
            kind: "volume".into(),
            id: v.id.clone(),
            attached_to: v.attachment.as_ref().map(|a| a.instance_id.clone()),
        })
        .collect();
    Dump {
        instances,
        secondary,
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(api_call).post(api_call))
        .route("/_emulator/dump", get(control_dump))
        .route("/_emulator/hold", post(control_hold))
        .route("/_emulator/state", post(control_state))
        .route("/_emulator/address", post(control_address))
        .route("/_emulator/deleting", post(control_deleting))
        .route("/_emulator/finish-deletes", post(control_finish_deletes))
        .route("/_emulator/lock", post(control_lock))
        .route("/_emulator/plant", post(control_plant))
        .route("/_emulator/faults", post(control_faults))
        .route("/_emulator/scope", post(control_scope))
        .route("/_emulator/reset", post(control_reset))
        .route("/_emulator/requests", get(control_requests))
        .route("/_emulator/stats", get(control_stats))
        .route("/_emulator/rate-limit", post(control_rate_limit))
        .with_state(state)
}

async fn control_rate_limit(
    AxState(s): AxState<Shared>,
    body: Result<Json<Option<crate::rate_limit::RateLimit>>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(limit)) => {
            let mut st = lock(&s);
            st.rate_limit = limit;
            st.rate_buckets.clear();
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => bad_json(e),
    }
}

fn error_response(err: &ApiError, request_id: &str) -> Response {
    let body = xml::error_document(&err.code, &err.message, request_id);
    xml_response(
        StatusCode::from_u16(err.status).unwrap_or(StatusCode::BAD_REQUEST),
        body,
        request_id,
    )
}

fn xml_response(status: StatusCode, body: String, request_id: &str) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/xml;charset=UTF-8"),
    );
    h.insert(header::SERVER, HeaderValue::from_static("AmazonEC2"));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-amzn-requestid", v);
    }
    resp
}

/// Largest request body read; EC2's own limit for a Query request is far below this.
const MAX_BODY: usize = 1 << 20;

/// One API call: record it, verify the signature, apply scope failures and injected
/// faults, then run the action.
async fn api_call(AxState(shared): AxState<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let query = parts.uri.query().unwrap_or("");
    let is_form = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    let params = Params::parse(query, is_form.then_some(&body[..]));
    let action = params.get("Action").unwrap_or("").to_string();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();

    let (request_id, verified, fault) = {
        let mut st = lock(&shared);
        st.requests.push(action.clone());
        let call = if action.is_empty() { "(none)" } else { &action };
        st.stats.record(api::fault_op(&action, &params), call);
        let request_id = st.request_id();
        let cfg = st.cfg.clone();
        let known = |r: &str| cfg.region(r).is_some();
        let signed = sigv4::SignedRequest {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query,
            headers,
            body: &body,
        };
        let verified = sigv4::verify(
            &signed,
            &sigv4::Policy {
                credentials: &cfg.credentials,
                known_region: &known,
                service: "ec2",
                now: unix_now(),
                max_skew: cfg.max_clock_skew,
                mismatch: cfg.signature_mismatch,
            },
        );
        let verified = match verified {
            Ok(v) => v,
            Err(e) => {
                let err = ApiError::new(e.status, e.code, e.message);
                return error_response(&err, &request_id);
            }
        };
        if action.is_empty() {
            let err = ApiError::new(
                400,
                "MissingAction",
                "The request must contain the parameter Action",
            );
            return error_response(&err, &request_id);
        }
        if !api::ACTIONS.contains(&action.as_str()) {
            let err = ApiError::new(
                400,
                "InvalidAction",
                format!("The action {action} is not valid for this web service."),
            );
            return error_response(&err, &request_id);
        }
        if let Some(limit) = st.rate_limit {
            let now = Instant::now();
            let bucket = st
                .rate_buckets
                .entry((verified.region.clone(), action.clone()))
                .or_insert_with(|| crate::rate_limit::Limiter::new(limit, now));
            if !bucket.take(now) {
                st.stats.rate_limited += 1;
                let err = ApiError::new(503, "RequestLimitExceeded", "Request limit exceeded.");
                return error_response(&err, &request_id);
            }
        }
        if st.failing_scopes.contains(&verified.region) {
            let err = ApiError::new(
                503,
                "Unavailable",
                "The service is unavailable. Please try again shortly.",
            );
            return error_response(&err, &request_id);
        }
        let fault = st.take_fault(api::fault_op(&action, &params));
        (request_id, verified, fault)
    };

    if let Some((fault, index)) = fault {
        let err = match fault.kind {
            FaultKind::Slow { delay_ms } => {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                None
            }
            FaultKind::ServerError if index % 2 == 0 => Some(ApiError::new(
                500,
                "InternalError",
                "An internal error has occurred",
            )),
            FaultKind::ServerError => Some(ApiError::new(
                503,
                "Unavailable",
                "The server is overloaded and can't handle the request.",
            )),
            FaultKind::Quota => Some(api::instance_limit_exceeded(1, 0)),
            FaultKind::RateLimit => {
                lock(&shared).stats.rate_limited += 1;
                Some(ApiError::new(
                    503,
                    "RequestLimitExceeded",
                    "Request limit exceeded.",
                ))
            }
            FaultKind::Auth => Some(ApiError::new(
                401,
                "AuthFailure",
                sigv4::AUTH_FAILURE_MESSAGE,
            )),
        };
        if let Some(err) = err {
            return error_response(&err, &request_id);
        }
    }

    let mut st = lock(&shared);
    let now = Instant::now();
    st.advance(now);
    match api::dispatch(
        &mut st,
        &action,
        &params,
        &verified.region,
        &request_id,
        now,
    ) {
        Ok(body) => xml_response(StatusCode::OK, body, &request_id),
        Err(err) => error_response(&err, &request_id),
    }
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": "no such instance"})),
    )
        .into_response()
}

fn bad_json(e: JsonRejection) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": e.body_text()})),
    )
        .into_response()
}

fn done(found: bool) -> Response {
    if found {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found()
    }
}

async fn control_dump(AxState(s): AxState<Shared>) -> Response {
    Json(dump(&lock(&s))).into_response()
}

async fn control_stats(AxState(s): AxState<Shared>) -> Response {
    Json(lock(&s).stats.clone()).into_response()
}

async fn control_requests(AxState(s): AxState<Shared>) -> Response {
    Json(lock(&s).requests.clone()).into_response()
}

#[derive(Deserialize)]
struct HoldBody {
    id: String,
    hold: bool,
}

async fn control_hold(
    AxState(s): AxState<Shared>,
    body: Result<Json<HoldBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => done(hold_provisioning(&s, &b.id, b.hold)),
        Err(e) => bad_json(e),
    }
}

#[derive(Deserialize)]
struct StateBody {
    id: String,
    state: String,
}

async fn control_state(
    AxState(s): AxState<Shared>,
    body: Result<Json<StateBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => {
            let mut st = lock(&s);
            if !st.instances.contains_key(&b.id) {
                return not_found();
            }
            st.force_state(&b.id, &b.state, Instant::now());
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => bad_json(e),
    }
}

#[derive(Deserialize)]
struct IdBody {
    id: String,
}

#[derive(Deserialize)]
struct AddressBody {
    id: String,
    ip: Option<String>,
}

async fn control_address(
    AxState(s): AxState<Shared>,
    body: Result<Json<AddressBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => done(set_address(&s, &b.id, b.ip.as_deref())),
        Err(e) => bad_json(e),
    }
}

async fn control_deleting(
    AxState(s): AxState<Shared>,
    body: Result<Json<IdBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => done(start_slow_delete(&s, &b.id)),
        Err(e) => bad_json(e),
    }
}

async fn control_finish_deletes(AxState(s): AxState<Shared>) -> Response {
    finish_deletes(&s);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct LockBody {
    id: String,
    locked: bool,
}

async fn control_lock(
    AxState(s): AxState<Shared>,
    body: Result<Json<LockBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => done(set_locked(&s, &b.id, b.locked)),
        Err(e) => bad_json(e),
    }
}

async fn control_plant(
    AxState(s): AxState<Shared>,
    body: Result<Json<Plant>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(p)) => Json(json!({"id": plant_instance(&s, p)})).into_response(),
        Err(e) => bad_json(e),
    }
}

async fn control_faults(
    AxState(s): AxState<Shared>,
    body: Result<Json<Fault>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(fault)) => {
            lock(&s)
                .faults
                .push(model::ActiveFault { fault, served: 0 });
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => bad_json(e),
    }
}

async fn control_scope(
    AxState(s): AxState<Shared>,
    body: Result<Json<ScopeFailure>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(b)) => {
            fail_scope(&s, &b.scope, b.fail);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => bad_json(e),
    }
}

async fn control_reset(AxState(s): AxState<Shared>) -> Response {
    reset(&s);
    StatusCode::NO_CONTENT.into_response()
}
