//! An emulator of the Google Compute Engine API v1 for VM instances, and of the two places
//! access tokens come from, after Google's reference (the Compute discovery document and
//! docs.cloud.google.com/compute/docs/reference/rest/v1, the OAuth 2.0 service-account flow,
//! the metadata server's token path).
//!
//! What it serves:
//! - `POST /token` (form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=`):
//!   the JWT's RS256 signature is checked against the public key of its `iss` (a service
//!   account of [`GceConfig::accounts`]), then `aud` (this URL + `/token`), the compute
//!   scope and the `iat`/`exp` window; `{access_token, expires_in, token_type}`, or `400
//!   {"error": "invalid_grant", "error_description"}`.
//! - `GET /computeMetadata/v1/instance/service-accounts/default/token` with
//!   `Metadata-Flavor: Google` (else `403`): the metadata server's token.
//! - Under `/compute/v1/projects/{project}` (`Authorization: Bearer <issued token>`, else
//!   `401 authError`): `POST zones/{z}/instances`, `GET`/`DELETE zones/{z}/instances/{name}`,
//!   `GET zones/{z}/operations/{op}`, `GET zones/{z}/operations?filter=&maxResults=&
//!   pageToken=&orderBy=` (filter: AIP-160 `field = "value"` terms on `operationType`,
//!   `targetLink`, `targetId`, `status`, `name`), `GET zones/{z}` and `GET
//!   aggregated/instances?filter=&maxResults=&pageToken=` (filter: `(labels.K = "V")` terms).
//!
//! Errors are Google's envelope (`error.code`, `message`, `errors[].reason`, `status`).
//! Inserts and deletes answer a zonal operation. An insert with an unknown image, or one
//! queued with [`GceEmulator::fail_next_insert`], creates no instance: its operation runs for
//! the given number of reads, then ends `DONE` with `error.errors[{code, message}]`
//! (`ZONE_RESOURCE_POOL_EXHAUSTED`, `RESOURCE_NOT_FOUND`). An unknown machine type is `400`.
//! A new instance is `PROVISIONING`, then `RUNNING` with a `natIP` (203.0.113.0/24) on the
//! [`Schedule`]; a slow delete shows it `STOPPING`; a `DELETE` of a locked one answers `400
//! resourceNotReady`; a failing zone is in the list's `unreachables`. Tokens live
//! [`GceConfig::token_lifetime`] s; [`GceEmulator::expire_tokens`] refuses every issued one.
//! Assumed, not verified: a failed insert leaves no instance visible; the
//! `resourceNotReady` answer; page tokens' form. Keys: throwaway ([`test_keys`]).
//!
//! Spot VMs, after the v1 discovery document (`compute/v1/compute-api.json` of
//! googleapis/google-api-go-client and google-api-python-client: the `Scheduling` schema,
//! `zoneOperations.list` and its `filter`, `Operation.operationType`) and Google's
//! preemption-history sample: an insert's `scheduling` is checked and kept with its
//! defaults ([`scheduling`]): `provisioningModel` `SPOT` (or `preemptible`) needs
//! `onHostMaintenance` `TERMINATE` and `automaticRestart` false, and takes an
//! `instanceTerminationAction` of `STOP` (the default) or `DELETE`. The control surface:
//! - `reclaim` (Spot VMs only, `409` otherwise): a finished `compute.instances.preempted`
//!   operation (`systemevent-...`, `statusMessage` "Instance was preempted.", by `system`)
//!   on the instance's `targetLink`, then the VM is deleted (`DELETE`) or `TERMINATED`
//!   without its ephemeral address (`STOP`). `zoneOperations.list` with `filter=
//!   operationType="compute.instances.preempted"` finds it.
//! - `spot-capacity` off: a Spot insert answers its operation, which ends `DONE` with
//!   `ZONE_RESOURCE_POOL_EXHAUSTED` at the first read and creates nothing, as a stockout
//!   of an insert does; standard inserts are untouched. A reset turns capacity back on.
//! - the dump's `spot` is true for Spot and preemptible VMs.
//!
//! Assumed, not verified: the filter grammar beyond `=`/`!=` terms (refused as `400`),
//! that a stockout always comes in the operation (GCE may also answer it at once).

pub mod test_keys;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::Verifier;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::control::{FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{Adapter, Cloud, Deletion, Fleet, Record, Schedule, Served};
use crate::framework::{Shared, States};
use crate::real_proxy::RealProxies;

pub const EMULATOR_PROJECT: &str = "emulator-project";
const METADATA_TOKEN: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// An insert that fails: its operation's error code and message, and reads answered `RUNNING`.
type Failure = (String, String, u32);
/// Google's `error.status` names of the HTTP statuses the emulator answers.
#[rustfmt::skip]
const STATUSES: [(u16, &str); 6] = [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"),
    (403, "PERMISSION_DENIED"), (404, "NOT_FOUND"), (409, "ALREADY_EXISTS"), (503, "UNAVAILABLE")];
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const TAKEN: &str = "The resource already exists (control surface)";
const NO_FLAVOR: &str = "Missing Metadata-Flavor:Google header.";
const QUOTA: &str = "Quota 'INSTANCES' exceeded.  Limit: 24.0 in region europe-west1.";
const RATE: &str = "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'";
const BACKEND: &str = "Internal error. Please try again or contact Google Support.";
const AUTH: &str = "Request had invalid authentication credentials. Expected OAuth 2 access \
    token, login cookie or other valid authentication credential.";
const SHORT_LIVED: &str = "Invalid JWT: Token must be a short-lived token (60 minutes) and in a \
    reasonable timeframe. Check your iat and exp values in the JWT claim.";

/// Everything configurable; `GceConfig::default()` knows the test service account.
#[derive(Clone, Debug)]
pub struct GceConfig {
    pub project: String,
    pub zones: Vec<String>,
    pub machine_types: Vec<String>,
    /// Image paths an insert may name as `sourceImage` (`projects/.../global/images/...`).
    pub images: Vec<String>,
    /// Service accounts (client email, private key PEM) whose JWTs are accepted.
    pub accounts: Vec<(String, String)>,
    /// `expires_in` of every issued token, in seconds.
    pub token_lifetime: u64,
    pub schedule: Schedule,
    pub rate_limit: Option<RateLimit>,
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl Default for GceConfig {
    fn default() -> Self {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        let debian = "projects/debian-cloud/global/images/family/debian-12";
        let ubuntu = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64";
        let account = (test_keys::TEST_CLIENT_EMAIL, test_keys::TEST_KEY_PEM);
        GceConfig {
            project: EMULATOR_PROJECT.into(),
            zones: s(&["europe-west1-b", "europe-west1-c", "us-central1-a"]),
            machine_types: s(&["e2-micro", "e2-small"]),
            images: s(&[debian, ubuntu]),
            accounts: vec![(account.0.into(), account.1.into())],
            token_lifetime: 3599,
            schedule: Schedule::AfterReads(1),
            rate_limit: None,
            real_proxies: None,
        }
    }
}

/// The Compute API's error answer: status, `errors[0].reason`, message.
#[derive(Debug, Clone)]
pub struct GceError(pub StatusCode, pub String, pub String);

impl GceError {
    pub fn new(status: u16, reason: &str, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        GceError(status, reason.into(), message.into())
    }

    fn body(&self) -> Value {
        let GceError(code, reason, message) = self;
        let status = STATUSES.iter().find(|(c, _)| *c == code.as_u16());
        let status = status.map_or("INTERNAL", |(_, s)| s);
        let errors = json!([{"message": message, "domain": "global", "reason": reason}]);
        let code = code.as_u16();
        json!({"error": {"code": code, "message": message, "errors": errors, "status": status}})
    }

    fn not_found(resource: &str) -> Self {
        let message = format!("The resource '{resource}' was not found");
        GceError::new(404, "notFound", message)
    }

    fn invalid(field: &str, value: &str) -> Self {
        let message = format!("Invalid value for field '{field}': '{value}'.");
        GceError::new(400, "invalid", message)
    }
}

impl IntoResponse for GceError {
    fn into_response(self) -> Response {
        (self.0, Json(self.body())).into_response()
    }
}

impl From<GceError> for Refusal {
    fn from(e: GceError) -> Refusal {
        let (status, body) = (e.0.as_u16(), e.body());
        Refusal { status, body }
    }
}

fn oauth_error(error: &str, description: &str) -> Response {
    let body = json!({"error": error, "error_description": description});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// GCE's side of the framework. A record's `extra` holds the insert's own fields as GCE
/// renders them (`machineType`, `labels` exactly as written, `disks`, `networkInterfaces`,
/// `tags`); the record's `labels` hold the decoded marks.
pub struct Gce {
    config: GceConfig,
    url: String,
    keys: Vec<(String, VerifyingKey<Sha256>)>,
    tokens: BTreeMap<String, Instant>,
    grants: u32,
    /// Operation name -> (zone, the finished operation, reads still answered `RUNNING`).
    ops: BTreeMap<String, (String, Value, u32)>,
    failing_inserts: VecDeque<(String, String, u32)>,
    /// Control surface `spot-capacity`: while false, Spot inserts fail with
    /// `ZONE_RESOURCE_POOL_EXHAUSTED`. A reset makes capacity available again.
    spot_capacity: bool,
}

impl Gce {
    fn zone_url(&self, zone: &str) -> String {
        let (url, project) = (&self.url, &self.config.project);
        format!("{url}/compute/v1/projects/{project}/zones/{zone}")
    }

    /// A new operation on `target`, as the insert or delete call answers it (`RUNNING`).
    fn op(&mut self, zone: &str, kind: &str, target: &str, fail: Option<Failure>) -> Value {
        let (zone_url, now) = (self.zone_url(zone), crate::time::now_secs());
        let name = format!("operation-{}-{:013x}", now * 1000, self.ops.len() + 1);
        let mut done = json!({
            "kind": "compute#operation", "name": name, "zone": zone_url, "operationType": kind,
            "targetLink": format!("{zone_url}/instances/{target}"), "progress": 100,
            "status": "DONE", "insertTime": op_time(),
            "selfLink": format!("{zone_url}/operations/{name}"),
        });
        let mut answer = done.clone();
        answer["status"] = "RUNNING".into();
        let (error, reads) = fail.map_or((None, 0), |(c, m, r)| (Some((c, m)), r));
        if let Some((code, message)) = error {
            done["error"] = json!({"errors": [{"code": code, "message": message}]});
        }
        self.ops.insert(name, (zone.into(), done, reads));
        answer
    }

    /// The system event Compute Engine records when it preempts a VM: a finished
    /// operation of type `compute.instances.preempted` on the instance, by `system`.
    fn preempted(&mut self, zone: &str, name: &str, id: &str) {
        let (zone_url, now) = (self.zone_url(zone), crate::time::now_secs());
        let op = format!("systemevent-{}-{:013x}", now * 1000, self.ops.len() + 1);
        let at = op_time();
        let done = json!({
            "kind": "compute#operation", "name": op, "zone": zone_url,
            "operationType": "compute.instances.preempted", "targetId": id,
            "targetLink": format!("{zone_url}/instances/{name}"), "status": "DONE",
            "statusMessage": "Instance was preempted.", "user": "system", "progress": 100,
            "insertTime": at, "startTime": at, "endTime": at,
            "selfLink": format!("{zone_url}/operations/{op}"),
        });
        self.ops.insert(op, (zone.into(), done, 0));
    }

    fn issue(&mut self) -> Response {
        self.grants += 1;
        let (n, now) = (self.grants, crate::time::now_secs());
        let token = format!("ya29.emulator-{n}-{now:08x}");
        let lifetime = self.config.token_lifetime;
        let expiry = Instant::now() + Duration::from_secs(lifetime);
        self.tokens.insert(token.clone(), expiry);
        let body = json!({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"});
        Json(body).into_response()
    }

    /// The RFC 7523 checks of a service-account assertion, with Google's descriptions.
    fn verify(&self, assertion: &str) -> Result<(), &'static str> {
        const MALFORMED: &str = "Invalid JWT: malformed";
        let parts: Vec<&str> = assertion.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            return Err(MALFORMED);
        };
        let decode = |s: &str| data_encoding::BASE64URL_NOPAD.decode(s.as_bytes()).ok();
        let json = |s: &str| decode(s).and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let (Some(h), Some(c)) = (json(header), json(claims)) else {
            return Err(MALFORMED);
        };
        let iss = &c["iss"];
        let key = self.keys.iter().find(|(email, _)| iss == email.as_str());
        let Some((_, key)) = key.filter(|_| h["alg"] == "RS256") else {
            return Err("Invalid grant: account not found");
        };
        let sig = decode(signature).and_then(|s| Signature::try_from(s.as_slice()).ok());
        let signed = format!("{header}.{claims}");
        if sig.is_none_or(|sig| key.verify(signed.as_bytes(), &sig).is_err()) {
            return Err("Invalid JWT Signature.");
        }
        if c["aud"] != format!("{}/token", self.url).as_str() {
            return Err("Invalid JWT: Failed audience check.");
        }
        let scope = c["scope"].as_str().unwrap_or_default();
        if !scope.contains("https://www.googleapis.com/auth/compute") {
            return Err("Invalid JWT: no compute scope");
        }
        let now = crate::time::now_secs();
        let at = |k: &str| c[k].as_u64().unwrap_or(0);
        if at("exp") <= now || at("iat") > now + 60 || at("exp").saturating_sub(at("iat")) > 3600 {
            return Err(SHORT_LIVED);
        }
        Ok(())
    }

    fn render(&self, r: &Record<Value>) -> Value {
        let zone = self.zone_url(&r.scope);
        let mut v = r.extra.clone();
        if let Some(ip) = &r.ip {
            v["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = ip.as_str().into();
        }
        let user_data = String::from_utf8_lossy(&r.user_data);
        v["metadata"] = json!({"items": [{"key": "user-data", "value": user_data}]});
        for (k, val) in [("kind", json!("compute#instance")), ("id", json!(r.id))] {
            v[k] = val;
        }
        v["name"] = r.name.as_str().into();
        v["zone"] = zone.as_str().into();
        v["status"] = r.state.as_str().into();
        v["creationTimestamp"] = crate::time::rfc3339(r.created_at).into();
        v["selfLink"] = format!("{zone}/instances/{}", r.name).into();
        v
    }

    /// What an insert or a plant stores: the fields GCE renders from the request.
    fn extra(&self, zone: &str, machine: &str, image: &str, labels: Value, tags: Value) -> Value {
        let zone_url = self.zone_url(zone);
        let nic = json!({"name": "nic0", "network": "global/networks/default",
                         "networkIP": "10.132.0.2", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]});
        json!({
            "machineType": format!("{zone_url}/machineTypes/{machine}"), "labels": labels,
            "disks": [{"boot": true, "autoDelete": true, "licenses": [image]}],
            "networkInterfaces": [nic], "tags": {"items": tags},
            "scheduling": scheduling(&Value::Null).expect("the defaults are valid"),
        })
    }
}

fn find(b: &Backend, zone: &str, name: &str) -> Option<String> {
    let r = b.fleet.iter().find(|r| r.scope == zone && r.name == name);
    r.map(|r| r.id.clone())
}

impl Adapter for Gce {
    type Extra = Value;
    type Error = GceError;
    const STATES: States =
        States { provisioning: "PROVISIONING", running: "RUNNING", deleting: "STOPPING" };

    fn id(&self, n: u64) -> String {
        (4_200_000_000_000_000_000 + n).to_string()
    }

    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", 10 + (n - 1) % 240)
    }

    fn default_scope(&self) -> String {
        self.config.zones[0].clone()
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Value, GceError> {
        let c = &self.config;
        if !c.zones.iter().any(|z| z == scope) {
            let zone = format!("projects/{}/zones/{scope}", c.project);
            return Err(GceError::not_found(&zone));
        }
        if !is_name(&plant.name) {
            return Err(GceError::invalid("resource.name", &plant.name));
        }
        let marks = crate::framework::marks(plant);
        let labels: BTreeMap<_, _> =
            marks.iter().filter_map(|(k, v)| labels::encode(k, v)).collect();
        let (machine, image) = (&c.machine_types[0], &c.images[0]);
        Ok(self.extra(scope, machine, image, json!(labels), json!([])))
    }

    fn name_taken(&self) -> GceError {
        GceError::new(409, "alreadyExists", TAKEN)
    }

    fn fault(&self, kind: &FaultKind) -> GceError {
        match kind {
            FaultKind::Quota => GceError::new(403, "quotaExceeded", QUOTA),
            FaultKind::RateLimit => GceError::new(403, "rateLimitExceeded", RATE),
            FaultKind::Auth => GceError::new(401, "authError", AUTH),
            FaultKind::ServerError | FaultKind::Slow { .. } => {
                GceError::new(503, "backendError", BACKEND)
            }
        }
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let path = path.trim_start_matches("/compute/v1/projects/");
        let parts: Vec<&str> = path.split('/').skip(1).collect();
        let (op, call) = match (method.as_str(), &parts[..]) {
            ("POST", ["zones", _, "instances"]) => (Some(FaultOp::Create), "instances.insert"),
            ("GET", ["zones", _, "instances", _]) => (Some(FaultOp::Get), "instances.get"),
            ("DELETE", ["zones", _, "instances", _]) => (Some(FaultOp::Delete), "instances.delete"),
            ("GET", ["aggregated", _]) => (Some(FaultOp::List), "instances.aggregatedList"),
            ("GET", ["zones", _, "operations", _]) => (None, "zoneOperations.get"),
            ("GET", ["zones", _, "operations"]) => (None, "zoneOperations.list"),
            ("GET", ["zones", _]) => (None, "zones.get"),
            _ => (None, "unknown"),
        };
        (op, format!("{method} {call}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        let token = auth.and_then(|v| v.strip_prefix("Bearer "));
        let expiry = token.and_then(|t| self.tokens.get(t));
        expiry.is_some_and(|exp| *exp > Instant::now())
    }

    fn unauthorized(&self) -> GceError {
        self.fault(&FaultKind::Auth)
    }

    fn rate_limited(&self, _limit: RateLimit) -> GceError {
        self.fault(&FaultKind::RateLimit)
    }

    fn reset(&mut self) {
        self.ops.clear();
        self.failing_inserts.clear();
        self.spot_capacity = true;
    }

    /// Compute Engine preempts the VM: a `compute.instances.preempted` operation, then, by
    /// its `instanceTerminationAction`, the VM is deleted (`DELETE`) or stopped
    /// (`TERMINATED`, its ephemeral address released; `STOP`, the default).
    fn reclaim(&mut self, fleet: &mut Fleet<Value>, id: &str) -> Result<bool, Refusal> {
        let Some(r) = fleet.get(id) else {
            return Ok(false);
        };
        if !self.is_spot(r) {
            let model = r.extra["scheduling"]["provisioningModel"].as_str().unwrap_or("STANDARD");
            return Err(Refusal::conflict(
                id,
                format!(
                    "instance {} is not a Spot VM (scheduling.provisioningModel {model}): Compute \
                 Engine preempts only Spot and preemptible VMs",
                    r.name
                ),
            ));
        }
        let (rid, zone, name) = (r.id.clone(), r.scope.clone(), r.name.clone());
        let delete = r.extra["scheduling"]["instanceTerminationAction"] == "DELETE";
        self.preempted(&zone, &name, &rid);
        if delete {
            fleet.remove(&rid);
        } else {
            fleet.set_state(&rid, "TERMINATED", String::new);
            fleet.set_address(&rid, None);
        }
        Ok(true)
    }

    fn set_spot_capacity(&mut self, available: bool) -> bool {
        self.spot_capacity = available;
        true
    }

    /// `scheduling.provisioningModel` SPOT, or a legacy preemptible VM.
    fn is_spot(&self, r: &Record<Value>) -> bool {
        let s = &r.extra["scheduling"];
        s["provisioningModel"] == "SPOT" || s["preemptible"] == true
    }
}

/// An insert's `scheduling` as the instance keeps it, with the defaults filled in, or the
/// API's `400` naming the field. After the `Scheduling` schema of the v1 discovery document:
/// `provisioningModel` is `SPOT` or `STANDARD`; a Spot (or `preemptible`) VM cannot restart
/// automatically and its only `onHostMaintenance` is `TERMINATE`; `instanceTerminationAction`
/// is `STOP` (the default) or `DELETE`. Assumed, not verified: that GCE refuses a
/// termination action on a standard VM without `maxRunDuration` or `terminationTime`, and
/// the explanations after the API's "Invalid value" sentence.
fn scheduling(body: &Value) -> Result<Value, GceError> {
    let field = |k: &str| body.get(k).filter(|v| !v.is_null());
    let invalid = |k: &str, v: &Value, why: &str| {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        let message = format!("Invalid value for field 'resource.scheduling.{k}': '{v}'. {why}");
        GceError::new(400, "invalid", message)
    };
    let model = match field("provisioningModel") {
        None => "STANDARD",
        Some(v) if v == "SPOT" || v == "STANDARD" => v.as_str().unwrap_or_default(),
        Some(v) => return Err(invalid("provisioningModel", v, "Expected SPOT or STANDARD.")),
    };
    let preemptible = match field("preemptible") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid("preemptible", v, "Expected a boolean.")),
    };
    let spot = model == "SPOT" || preemptible;
    let maintenance = match (field("onHostMaintenance"), spot) {
        (None, true) => "TERMINATE",
        (None, false) => "MIGRATE",
        (Some(v), true) if v != "TERMINATE" => {
            let why = "Spot and preemptible VMs must use TERMINATE.";
            return Err(invalid("onHostMaintenance", v, why));
        }
        (Some(v), _) if v == "MIGRATE" || v == "TERMINATE" => v.as_str().unwrap_or_default(),
        (Some(v), _) => {
            return Err(invalid("onHostMaintenance", v, "Expected MIGRATE or TERMINATE."));
        }
    };
    let restart = match (field("automaticRestart"), spot) {
        (None, spot) => !spot,
        (Some(Value::Bool(true)), true) => {
            let why = "Spot and preemptible VMs cannot be restarted automatically.";
            return Err(invalid("automaticRestart", &json!(true), why));
        }
        (Some(Value::Bool(b)), _) => *b,
        (Some(v), _) => return Err(invalid("automaticRestart", v, "Expected a boolean.")),
    };
    let timed = field("maxRunDuration").or(field("terminationTime")).is_some();
    let action = match field("instanceTerminationAction") {
        None if spot => Some("STOP"),
        None => None,
        Some(v) if !spot && !timed => {
            let why = "A termination action needs a Spot VM, maxRunDuration or terminationTime.";
            return Err(invalid("instanceTerminationAction", v, why));
        }
        Some(v) if v == "STOP" || v == "DELETE" => v.as_str(),
        Some(v) => return Err(invalid("instanceTerminationAction", v, "Expected STOP or DELETE.")),
    };
    let mut out = json!({"onHostMaintenance": maintenance, "automaticRestart": restart,
                         "preemptible": preemptible, "provisioningModel": model});
    if let Some(action) = action {
        out["instanceTerminationAction"] = action.into();
    }
    Ok(out)
}

/// Now as an operation's `insertTime`: RFC 3339 with milliseconds, as GCE writes it, so
/// that an insert and a preemption in the same second are still ordered.
fn op_time() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let ms = now.unwrap_or_default().as_millis();
    let secs = crate::time::rfc3339((ms / 1000) as u64);
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), ms % 1000)
}

/// An RFC 1035 label of at most 63 characters: GCE's instance names, label keys and tags.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter().all(ok)
}

/// The contract's marks as the gce plugin writes them (docs/providers/gce.md): keys
/// `egress-<name>`, values with lowercase letters, digits and `-` kept and every other byte
/// `_xx`; an installation too long for a label as `__` plus base32 of its SHA-256.
pub mod labels {
    use sha2::{Digest, Sha256};
    const MARK_PREFIX: &str = "egress.proxy-operator.dev/";

    /// The label of a mark; `None` for a key that is not the operator's.
    pub fn encode(key: &str, value: &str) -> Option<(String, String)> {
        let name = key.strip_prefix(MARK_PREFIX)?;
        let escape = |b: u8| match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
            _ => format!("_{b:02x}"),
        };
        let mut v: String = value.bytes().map(escape).collect();
        if v.len() > 63 {
            let hash = data_encoding::BASE32_NOPAD.encode(&Sha256::digest(value)[..20]);
            v = format!("__{}", hash.to_ascii_lowercase());
        }
        Some((format!("egress-{name}"), v))
    }

    /// The mark a label stands for (a hashed value stays hashed); `None` for other labels.
    pub fn decode(key: &str, value: &str) -> Option<(String, String)> {
        let key = format!("{MARK_PREFIX}{}", key.strip_prefix("egress-")?);
        if value.starts_with("__") {
            return Some((key, value.to_string()));
        }
        let (mut out, mut rest) = (Vec::new(), value.as_bytes());
        while let Some((&b, tail)) = rest.split_first() {
            rest = tail;
            if b == b'_' {
                let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &tail[2..];
            } else {
                out.push(b);
            }
        }
        Some((key, String::from_utf8(out).ok()?))
    }
}

type Backend = Cloud<Gce>;

/// A running GCE emulator on 127.0.0.1. Stops, closing every connection, when dropped.
pub type GceEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on an OS-chosen port. Synchronous: the server has its own thread and runtime.
    pub fn start(config: GceConfig) -> GceEmulator {
        Self::start_on_port(config, 0).expect("bind 127.0.0.1:0")
    }

    pub fn start_on_port(config: GceConfig, port: u16) -> std::io::Result<GceEmulator> {
        let (listener, url) = crate::framework::bind(port)?;
        let key = |(email, pem): &(String, String)| {
            let key = rsa::RsaPrivateKey::from_pkcs8_pem(pem).expect("a PKCS#8 RSA key");
            (email.clone(), VerifyingKey::new(key.to_public_key()))
        };
        let keys = config.accounts.iter().map(key).collect();
        let fleet = Fleet::new(Gce::STATES, config.schedule, config.real_proxies.clone());
        let limit = config.rate_limit;
        let (tokens, ops, failing_inserts) = Default::default();
        let spot_capacity = true;
        let gce = Gce { config, url, keys, tokens, grants: 0, ops, failing_inserts, spot_capacity };
        let state = Shared::new(Cloud::new(gce, fleet, limit));
        let zone = "/compute/v1/projects/{p}/zones/{z}";
        let [vms, vm, ops, op] = ["instances", "instances/{n}", "operations", "operations/{n}"]
            .map(|p| format!("{zone}/{p}"));
        let api = Router::new()
            .route(zone, get(get_zone))
            .route(&vms, post(insert))
            .route(&vm, get(get_vm).delete(delete_vm))
            .route(&op, get(get_operation))
            .route(&ops, get(list_operations))
            .route("/compute/v1/projects/{p}/aggregated/instances", get(aggregated));
        let unknown = || async { GceError::not_found("the requested URL").into_response() };
        let app = crate::framework::gated(api, &state)
            .route("/token", post(token))
            .route(METADATA_TOKEN, get(metadata))
            .fallback(unknown);
        Ok(Served::serve("gce-emulator", listener, state, app))
    }

    /// A service-account JSON key for `email` and `pem` whose `token_uri` is this emulator,
    /// pretty-printed like the keys Google hands out.
    pub fn key_json(&self, email: &str, pem: &str) -> String {
        let token_uri = format!("{}/token", self.url());
        let key = json!({
            "type": "service_account", "project_id": EMULATOR_PROJECT,
            "private_key_id": "0123456789abcdef", "private_key": pem, "client_email": email,
            "client_id": "100000000000000000001", "token_uri": token_uri,
        });
        serde_json::to_string_pretty(&key).expect("JSON")
    }

    /// The key of the account the emulator knows.
    pub fn test_key_json(&self) -> String {
        self.key_json(test_keys::TEST_CLIENT_EMAIL, test_keys::TEST_KEY_PEM)
    }

    /// Every token issued so far is refused from now on, as an expired or revoked one is.
    pub fn expire_tokens(&self) {
        let now = Instant::now();
        let mut b = self.lock();
        b.backend.tokens.values_mut().for_each(|t| *t = now);
    }

    /// Tokens issued so far (token endpoint and metadata server).
    pub fn grants(&self) -> u32 {
        self.lock().backend.grants
    }

    /// Every access token issued so far (for tests that check none leaks).
    pub fn issued_tokens(&self) -> Vec<String> {
        self.lock().backend.tokens.keys().cloned().collect()
    }

    /// The next insert creates nothing: its operation runs for `reads` reads, then ends with
    /// `code` and `message` in `error.errors`.
    pub fn fail_next_insert(&self, code: &str, message: &str, reads: u32) {
        let f = (code.to_string(), message.to_string(), reads);
        self.lock().backend.failing_inserts.push_back(f);
    }

    /// The instance as `instances.get` shows it (by name, provider ID or backend id),
    /// without counting as a read.
    pub fn instance(&self, id: &str) -> Option<Value> {
        let b = self.lock();
        let name = id.rsplit('/').next()?;
        let r = b.fleet.iter().find(|r| r.name == name || r.id == name)?;
        Some(b.backend.render(r))
    }
}

/// `application/x-www-form-urlencoded`: the value of `key`, decoded.
fn form_value(body: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    let raw = body.split('&').find_map(|kv| kv.strip_prefix(&prefix))?;
    let (mut out, mut b) = (Vec::new(), raw.as_bytes());
    while let Some((&c, rest)) = b.split_first() {
        let hex = rest.get(..2).and_then(|h| std::str::from_utf8(h).ok());
        match (c, hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(x)) => (out.push(x), b = &rest[2..]),
            (b'+', _) => (out.push(b' '), b = rest),
            _ => (out.push(c), b = rest),
        };
    }
    String::from_utf8(out).ok()
}

async fn token(State(state): State<Shared<Backend>>, body: String) -> Response {
    if form_value(&body, "grant_type").as_deref() != Some(JWT_BEARER) {
        return oauth_error("unsupported_grant_type", "Invalid grant_type");
    }
    let mut b = state.lock();
    let assertion = form_value(&body, "assertion").unwrap_or_default();
    match b.backend.verify(&assertion) {
        Ok(()) => b.backend.issue(),
        Err(why) => oauth_error("invalid_grant", why),
    }
}

async fn metadata(State(state): State<Shared<Backend>>, headers: HeaderMap) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (StatusCode::FORBIDDEN, NO_FLAVOR).into_response();
    }
    state.lock().backend.issue()
}

/// The project and zone of a path exist.
fn known(b: &Backend, p: &str, z: Option<&str>) -> Result<(), GceError> {
    let c = &b.backend.config;
    match (p == c.project, z) {
        (false, _) => Err(GceError::not_found(&format!("projects/{p}"))),
        (true, Some(z)) if !c.zones.iter().any(|x| x == z) => {
            Err(GceError::not_found(&format!("projects/{p}/zones/{z}")))
        }
        _ => Ok(()),
    }
}

fn answer(r: Result<Value, GceError>) -> Response {
    r.map_or_else(IntoResponse::into_response, |v| Json(v).into_response())
}

type ZonePath = Path<(String, String)>;
type ItemPath = Path<(String, String, String)>;

async fn get_zone(State(state): State<Shared<Backend>>, Path((p, z)): ZonePath) -> Response {
    let b = state.lock();
    answer(known(&b, &p, Some(&z)).map(|()| {
        let region = z.rsplit_once('-').map_or("", |(r, _)| r);
        let url = b.backend.zone_url(&z);
        let region = url.replace(&format!("zones/{z}"), &format!("regions/{region}"));
        json!({"kind": "compute#zone", "name": z, "status": "UP", "region": region, "selfLink": url})
    }))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct InsertBody {
    name: String,
    machine_type: String,
    labels: BTreeMap<String, String>,
    metadata: Value,
    disks: Value,
    network_interfaces: Value,
    tags: Value,
    scheduling: Value,
}

async fn insert(
    State(state): State<Shared<Backend>>,
    Path((p, z)): ZonePath,
    body: Result<Json<InsertBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(body)) = body else {
        return GceError::new(400, "parseError", "Invalid JSON payload received.").into_response();
    };
    let mut b = state.lock();
    answer(known(&b, &p, Some(&z)).and_then(|()| do_insert(&mut b, &z, body)))
}

/// The checks of an insert, in the order the API reports them, and its operation.
fn do_insert(b: &mut Backend, zone: &str, body: InsertBody) -> Result<Value, GceError> {
    if !is_name(&body.name) {
        return Err(GceError::invalid("resource.name", &body.name));
    }
    let (c, mt) = (&b.backend.config, &body.machine_type);
    let machine = mt.rsplit('/').next().unwrap_or_default().to_string();
    if !c.machine_types.contains(&machine) || !mt.contains(&format!("zones/{zone}/machineTypes/")) {
        return Err(GceError::invalid("resource.machineType", mt));
    }
    let label_ok = |v: &String| v.len() <= 63 && !v.bytes().any(|b| b.is_ascii_uppercase());
    if let Some((k, v)) = body.labels.iter().find(|(k, v)| !is_name(k) || !label_ok(v)) {
        return Err(GceError::invalid("resource.labels", &format!("{k}={v}")));
    }
    let sched = scheduling(&body.scheduling)?;
    let spot = sched["provisioningModel"] == "SPOT" || sched["preemptible"] == true;
    let name = body.name.clone();
    if find(b, zone, &name).is_some() {
        let what = format!("projects/{}/zones/{zone}/instances/{name}", c.project);
        return Err(GceError::new(
            409,
            "alreadyExists",
            format!("The resource '{what}' already exists"),
        ));
    }
    let image = body.disks.pointer("/0/initializeParams/sourceImage");
    let image = image.and_then(Value::as_str).unwrap_or_default();
    let missing = format!("The resource '{image}' was not found");
    let stockout = format!(
        "The zone 'projects/{}/zones/{zone}' does not have enough resources available to \
         fulfill the request.  Try a different zone, or try again later.",
        c.project
    );
    let failure = match c.images.iter().any(|i| i == image) {
        false => Some(("RESOURCE_NOT_FOUND".into(), missing, 0)),
        true if spot && !b.backend.spot_capacity => {
            Some(("ZONE_RESOURCE_POOL_EXHAUSTED".into(), stockout, 0))
        }
        true => b.backend.failing_inserts.pop_front(),
    };
    if failure.is_some() {
        return Ok(b.backend.op(zone, "insert", &name, failure));
    }
    let items = body.metadata["items"].as_array().cloned().unwrap_or_default();
    let user_data = items.iter().find(|i| i["key"] == "user-data");
    let user_data = user_data.and_then(|i| i["value"].as_str()).unwrap_or("");
    let (labels, tags) = (json!(body.labels), body.tags["items"].clone());
    let mut extra = b.backend.extra(zone, &machine, image, labels, tags);
    let network = body.network_interfaces.pointer("/0/network").cloned();
    extra["networkInterfaces"][0]["network"] = network.into();
    extra["scheduling"] = sched;
    let mut record = Record::new(b.new_id(), name.clone(), zone.to_string(), extra);
    let marks = body.labels.iter().filter_map(|(k, v)| labels::decode(k, v));
    record.labels = marks.collect();
    record.user_data = user_data.as_bytes().to_vec();
    b.create(record);
    Ok(b.backend.op(zone, "insert", &name, None))
}

async fn get_vm(State(state): State<Shared<Backend>>, Path((p, z, n)): ItemPath) -> Response {
    let mut b = state.lock();
    let found = known(&b, &p, Some(&z)).map(|()| find(&b, &z, &n));
    let what = format!("projects/{p}/zones/{z}/instances/{n}");
    match found {
        Err(e) => e.into_response(),
        Ok(None) => GceError::not_found(&what).into_response(),
        Ok(Some(id)) => {
            let v = b.fleet.get(&id).map(|r| b.backend.render(r));
            b.saw(&id);
            Json(v).into_response()
        }
    }
}

async fn delete_vm(State(state): State<Shared<Backend>>, Path((p, z, n)): ItemPath) -> Response {
    let mut b = state.lock();
    if let Err(e) = known(&b, &p, Some(&z)) {
        return e.into_response();
    }
    let what = format!("projects/{p}/zones/{z}/instances/{n}");
    let id = find(&b, &z, &n).unwrap_or_default();
    let e = match b.fleet.delete(&id) {
        Deletion::NotFound => GceError::not_found(&what),
        Deletion::Locked => GceError::new(400, "resourceNotReady", format!("{what} is not ready")),
        Deletion::InProgress(_) | Deletion::Done(_) => {
            return Json(b.backend.op(&z, "delete", &n, None)).into_response();
        }
    };
    e.into_response()
}

async fn get_operation(
    State(state): State<Shared<Backend>>,
    Path((p, z, o)): ItemPath,
) -> Response {
    let mut b = state.lock();
    let known = known(&b, &p, Some(&z));
    let op = b.backend.ops.get_mut(&o).filter(|op| op.0 == z);
    let (Ok(()), Some((_, done, running_for))) = (&known, op) else {
        return known.err().unwrap_or_else(|| GceError::not_found(&o)).into_response();
    };
    let mut v = done.clone();
    if *running_for > 0 {
        *running_for -= 1;
        v["status"] = "RUNNING".into();
        v.as_object_mut().and_then(|o| o.remove("error"));
    }
    Json(v).into_response()
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct OpsQuery {
    filter: String,
    max_results: Option<usize>,
    page_token: String,
    order_by: String,
}

/// An AIP-160 filter of `field = "value"` (or `!=`) terms, each alone or in parentheses,
/// joined by spaces or `AND`: what the discovery document's `filter` describes for the
/// fields an operation list is searched by. `None` for anything else (`OR`, regular
/// expressions, other fields), which the emulator refuses rather than half-understands.
fn op_terms(filter: &str) -> Option<Vec<(String, bool, String)>> {
    const FIELDS: [&str; 5] = ["operationType", "targetLink", "targetId", "status", "name"];
    let mut terms = Vec::new();
    let mut rest = filter.trim();
    while !rest.is_empty() {
        let (term, tail) = match rest.strip_prefix('(') {
            Some(inner) => inner.split_once(')')?,
            None => {
                let end = rest.find(" AND ").unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        let (field, eq, value) = match term.split_once("!=") {
            Some((f, v)) => (f, false, v),
            None => term.split_once('=').map(|(f, v)| (f, true, v))?,
        };
        let (field, value) = (field.trim(), value.trim());
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
        if !FIELDS.contains(&field) || value.contains('"') {
            return None;
        }
        terms.push((field.to_string(), eq, value.to_string()));
        rest = tail.trim_start();
        rest = rest.strip_prefix("AND ").unwrap_or(rest).trim_start();
    }
    Some(terms)
}

/// `zoneOperations.list`: the zone's operations that match the filter, by name or (with
/// `orderBy=creationTimestamp desc`) newest first; no `items` when none match.
async fn list_operations(
    State(state): State<Shared<Backend>>,
    Path((p, z)): ZonePath,
    Query(q): Query<OpsQuery>,
) -> Response {
    let b = state.lock();
    answer(known(&b, &p, Some(&z)).and_then(|()| {
        let terms = op_terms(&q.filter).ok_or_else(|| GceError::invalid("filter", &q.filter))?;
        // 0 to 500; 0 and none mean the default, 500.
        let per_page = match q.max_results {
            None | Some(0) => 500,
            Some(n) if n <= 500 => n,
            Some(n) => return Err(GceError::invalid("maxResults", &n.to_string())),
        };
        let start = match q.page_token.strip_prefix("emu-") {
            _ if q.page_token.is_empty() => Some(0),
            Some(n) => usize::from_str_radix(n, 16).ok(),
            None => None,
        };
        let start = start.ok_or_else(|| GceError::invalid("pageToken", &q.page_token))?;
        let shown = |(done, running_for): (&Value, u32)| {
            let mut v = done.clone();
            if running_for > 0 {
                v["status"] = "RUNNING".into();
                v.as_object_mut().and_then(|o| o.remove("error"));
            }
            v
        };
        let matches = |v: &Value| {
            terms.iter().all(|(f, eq, want)| (v[f.as_str()].as_str() == Some(want.as_str())) == *eq)
        };
        let ops = b.backend.ops.values().filter(|(zone, ..)| *zone == z);
        let mut ops: Vec<Value> = ops.map(|(_, d, r)| shown((d, *r))).filter(matches).collect();
        match q.order_by.as_str() {
            "" | "name" => ops.sort_by(|x, y| x["name"].as_str().cmp(&y["name"].as_str())),
            "creationTimestamp desc" => ops.sort_by(|x, y| {
                let key = |v: &Value| (v["insertTime"].to_string(), v["name"].to_string());
                key(y).cmp(&key(x))
            }),
            other => return Err(GceError::invalid("orderBy", other)),
        }
        let url = format!("{}/operations", b.backend.zone_url(&z));
        let mut out = json!({"kind": "compute#operationList", "id": format!("projects/{p}/zones/{z}/operations"), "selfLink": url});
        let page: Vec<Value> = ops.iter().skip(start).take(per_page).cloned().collect();
        if !page.is_empty() {
            out["items"] = page.into();
        }
        if start + per_page < ops.len() {
            out["nextPageToken"] = format!("emu-{:x}", start + per_page).into();
        }
        Ok(out)
    }))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ListQuery {
    filter: String,
    max_results: Option<usize>,
    page_token: String,
}

/// `(labels.K = "V") (labels.K2 = "V2")`; `None` for anything else.
fn label_terms(filter: &str) -> Option<Vec<(String, String)>> {
    let terms = filter.split(')').map(str::trim).filter(|t| !t.is_empty());
    let term = |t: &str| {
        let (k, v) = t.strip_prefix("(labels.")?.split_once('=')?;
        Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
    };
    terms.map(term).collect()
}

async fn aggregated(
    State(state): State<Shared<Backend>>,
    Path(p): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    let b = state.lock();
    answer(known(&b, &p, None).and_then(|()| list(&b, q)))
}

fn list(b: &Backend, q: ListQuery) -> Result<Value, GceError> {
    let terms = label_terms(&q.filter).ok_or_else(|| GceError::invalid("filter", &q.filter))?;
    let per_page = q.max_results.unwrap_or(500);
    let start = match q.page_token.strip_prefix("emu-") {
        _ if q.page_token.is_empty() => Some(0),
        Some(n) => usize::from_str_radix(n, 16).ok(),
        None => None,
    };
    let start = start.ok_or_else(|| GceError::invalid("pageToken", &q.page_token))?;
    if !(1..=500).contains(&per_page) {
        return Err(GceError::invalid("maxResults", &per_page.to_string()));
    }
    let labels = |r: &&Record<Value>| terms.iter().all(|(k, v)| r.extra["labels"][k] == **v);
    let mut matched: Vec<&Record<Value>> = b.fleet.iter().filter(labels).collect();
    matched.sort_by(|x, y| (&x.scope, &x.name).cmp(&(&y.scope, &y.name)));
    let zones = &b.backend.config.zones;
    let is_down = |z: &str| b.fleet.failing_scope(std::iter::once(z)).is_some();
    let (mut items, mut down) = (serde_json::Map::new(), Vec::new());
    for z in zones {
        down.extend(is_down(z).then(|| format!("zones/{z}")));
        let code = ["NO_RESULTS_ON_PAGE", "UNREACHABLE"][usize::from(is_down(z))];
        let message = format!("There are no results for scope 'zones/{z}' on this page.");
        let warning = json!({"warning": {"code": code, "message": message}});
        items.insert(format!("zones/{z}"), warning);
    }
    let page = matched.iter().skip(start).take(per_page);
    for r in page.filter(|r| !is_down(&r.scope)) {
        let scoped = &mut items[&format!("zones/{}", r.scope)];
        if scoped.get("warning").is_some() {
            *scoped = json!({"instances": []});
        }
        let list = scoped["instances"].as_array_mut().expect("an array");
        list.push(b.backend.render(r));
    }
    let kind = "compute#instanceAggregatedList";
    let mut out = json!({"kind": kind, "items": items, "unreachables": down});
    if start + per_page < matched.len() {
        out["nextPageToken"] = format!("emu-{:x}", start + per_page).into();
    }
    Ok(out)
}
