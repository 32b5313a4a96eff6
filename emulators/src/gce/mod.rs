//! An emulator of the Google Compute Engine API v1 for VM instances, and of the two places
//! access tokens come from, after Google's published reference (the Compute discovery
//! document and docs.cloud.google.com/compute/docs/reference/rest/v1, the OAuth 2.0
//! service-account flow, the metadata server's token path).
//!
//! What it serves:
//! - `POST /token` (form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=`):
//!   the JWT's RS256 signature is checked against the public key of its `iss` (a service
//!   account the emulator knows, [`GceConfig::accounts`]), then `aud` (this URL + `/token`),
//!   `scope` and the `iat`/`exp` window. Answers `{access_token, expires_in, token_type}`, or
//!   `400 {"error": "invalid_grant", "error_description": ...}`.
//! - `GET /computeMetadata/v1/instance/service-accounts/default/token` with
//!   `Metadata-Flavor: Google` (else `403`): the metadata server's token, same answer.
//! - Under `/compute/v1/projects/{project}` (`Authorization: Bearer <issued token>`, else
//!   `401 authError`): `POST zones/{z}/instances` (insert), `GET`/`DELETE
//!   zones/{z}/instances/{name}`, `GET zones/{z}/operations/{op}`, `GET zones/{z}` and `GET
//!   aggregated/instances?filter=&maxResults=&pageToken=` (filter: `(labels.K = "V")` terms).
//!
//! Errors are `{"error": {"code", "message", "errors": [{"message", "domain", "reason"}],
//! "status"}}`. Inserts and deletes answer a zonal operation. An insert with an unknown image,
//! or one queued with [`GceEmulator::fail_next_insert`], creates no instance: its operation
//! runs for the given number of reads, then ends `DONE` with `error.errors[{code, message}]`
//! (`ZONE_RESOURCE_POOL_EXHAUSTED`, `RESOURCE_NOT_FOUND`, ...), as GCE reports capacity and
//! image failures. An unknown machine type is refused at once (`400 invalid`).
//!
//! # Lifecycle
//!
//! A new instance is `PROVISIONING` without an external address; it becomes `RUNNING` with
//! `networkInterfaces[0].accessConfigs[0].natIP` from 203.0.113.0/24 on the [`Schedule`]. A
//! slow delete shows it `STOPPING`; a `DELETE` of a locked instance answers `400
//! resourceNotReady`. A failing scope (zone) is reported by the aggregated list in
//! `unreachables` and as that zone's `UNREACHABLE` warning.
//!
//! # Tokens
//!
//! Tokens live [`GceConfig::token_lifetime`] seconds; [`GceEmulator::expire_tokens`] makes
//! every issued one refused (`401`), as an expired or revoked token is. The keys are
//! throwaway test keys ([`test_keys`]).
//!
//! # Verified against the reference, and assumed
//!
//! From the reference: paths, the instance, operation, zone and aggregated-list fields, the
//! error envelope and its reasons, `natIP`, the status values, label syntax, `maxResults` up
//! to 500, the token answer and `invalid_grant`. From captured answers: the
//! `ZONE_RESOURCE_POOL_EXHAUSTED` operation error. Assumed: that a failed insert leaves no
//! instance visible, the `resourceNotReady` answer to a delete during another operation, the
//! filter grammar beyond `(labels.K = "V")` terms (refused), page tokens' form.

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
use crate::framework::{
    Adapter, Cloud, Deletion, Effect, Fleet, Record, Schedule, Served, Shared, States,
};
use crate::real_proxy::RealProxies;

pub const EMULATOR_PROJECT: &str = "emulator-project";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

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
        GceConfig {
            project: EMULATOR_PROJECT.into(),
            zones: s(&["europe-west1-b", "europe-west1-c", "us-central1-a"]),
            machine_types: s(&["e2-micro", "e2-small"]),
            images: s(&[
                "projects/debian-cloud/global/images/family/debian-12",
                "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
            ]),
            accounts: vec![(
                test_keys::TEST_CLIENT_EMAIL.into(),
                test_keys::TEST_KEY_PEM.into(),
            )],
            token_lifetime: 3599,
            schedule: Schedule::AfterReads(1),
            rate_limit: None,
            real_proxies: None,
        }
    }
}

/// The Compute API's error answer.
#[derive(Debug, Clone)]
pub struct GceError {
    pub status: StatusCode,
    pub reason: String,
    pub message: String,
}

impl GceError {
    pub fn new(status: u16, reason: &str, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        GceError {
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        let status = match self.status.as_u16() {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ALREADY_EXISTS",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        let errors = json!([{"message": self.message, "domain": "global", "reason": self.reason}]);
        json!({"error": {"code": self.status.as_u16(), "message": self.message, "errors": errors, "status": status}})
    }

    fn not_found(resource: &str) -> Self {
        GceError::new(
            404,
            "notFound",
            format!("The resource '{resource}' was not found"),
        )
    }

    fn invalid(message: impl Into<String>) -> Self {
        GceError::new(400, "invalid", message)
    }
}

impl IntoResponse for GceError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<GceError> for Refusal {
    fn from(e: GceError) -> Refusal {
        Refusal {
            status: e.status.as_u16(),
            body: e.body(),
        }
    }
}

fn oauth_error(error: &str, description: &str) -> Response {
    let body = json!({"error": error, "error_description": description});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// What an instance holds beyond the framework's record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extra {
    pub machine_type: String,
    pub image: String,
    /// The GCE labels exactly as written (the record's `labels` hold the decoded marks).
    pub labels: BTreeMap<String, String>,
    pub network: String,
    pub tags: Vec<String>,
}

/// A zonal operation.
#[derive(Clone, Debug)]
struct Op {
    name: String,
    zone: String,
    kind: &'static str,
    target: String,
    insert_time: u64,
    /// Reads still answered `RUNNING`.
    running_for: u32,
    error: Option<(String, String)>,
}

/// GCE's side of the framework.
pub struct Gce {
    config: GceConfig,
    url: String,
    keys: Vec<(String, VerifyingKey<Sha256>)>,
    tokens: BTreeMap<String, Instant>,
    grants: u32,
    ops: BTreeMap<String, Op>,
    op_seq: u64,
    failing_inserts: VecDeque<(String, String, u32)>,
}

impl Gce {
    fn base(&self) -> String {
        format!("{}/compute/v1/projects/{}", self.url, self.config.project)
    }

    fn op(
        &mut self,
        zone: &str,
        kind: &'static str,
        target: &str,
        error: Option<(String, String)>,
        reads: u32,
    ) -> Value {
        self.op_seq += 1;
        let name = format!(
            "operation-{}-{:013x}",
            crate::time::now_secs() * 1000 + self.op_seq,
            self.op_seq
        );
        let op = Op {
            name: name.clone(),
            zone: zone.into(),
            kind,
            target: target.into(),
            insert_time: crate::time::now_secs(),
            running_for: reads,
            error,
        };
        let mut v = self.render_op(&op);
        v["status"] = "RUNNING".into();
        v.as_object_mut().map(|o| o.remove("error"));
        self.ops.insert(name, op);
        v
    }

    fn render_op(&self, op: &Op) -> Value {
        let zone = format!("{}/zones/{}", self.base(), op.zone);
        let mut v = json!({
            "kind": "compute#operation", "name": op.name, "zone": zone, "operationType": op.kind,
            "targetLink": format!("{zone}/instances/{}", op.target), "progress": 100,
            "status": if op.running_for > 0 { "RUNNING" } else { "DONE" },
            "insertTime": crate::time::rfc3339(op.insert_time), "selfLink": format!("{zone}/operations/{}", op.name),
        });
        if let (0, Some((code, message))) = (op.running_for, &op.error) {
            v["error"] = json!({"errors": [{"code": code, "message": message}]});
            v["httpErrorStatusCode"] = 400.into();
        }
        v
    }

    fn issue(&mut self) -> Response {
        self.grants += 1;
        let token = format!(
            "ya29.emulator-{}-{:08x}",
            self.grants,
            crate::time::now_secs() as u32
        );
        let lifetime = self.config.token_lifetime;
        self.tokens.insert(
            token.clone(),
            Instant::now() + Duration::from_secs(lifetime),
        );
        Json(json!({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}))
            .into_response()
    }

    /// The RFC 7523 checks of a service-account assertion, with Google's descriptions.
    fn verify(&self, assertion: &str) -> Result<(), &'static str> {
        const MALFORMED: &str = "Invalid JWT: malformed";
        let parts: Vec<&str> = assertion.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            return Err(MALFORMED);
        };
        let decode = |s: &str| {
            data_encoding::BASE64URL_NOPAD
                .decode(s.as_bytes())
                .map_err(|_| MALFORMED)
        };
        let json = |s: &str| {
            decode(s).and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| MALFORMED))
        };
        if json(header)?["alg"] != "RS256" {
            return Err("Invalid JWT: unsupported algorithm");
        }
        let c = json(claims)?;
        let key = self
            .keys
            .iter()
            .find(|(email, _)| c["iss"] == email.as_str());
        let Some((_, key)) = key else {
            return Err("Invalid grant: account not found");
        };
        let sig = Signature::try_from(decode(signature)?.as_slice()).map_err(|_| MALFORMED)?;
        if key
            .verify(format!("{header}.{claims}").as_bytes(), &sig)
            .is_err()
        {
            return Err("Invalid JWT Signature.");
        }
        if c["aud"] != format!("{}/token", self.url).as_str() {
            return Err(
                "Invalid JWT: Failed audience check. The expected audience is the token endpoint.",
            );
        }
        if !c["scope"]
            .as_str()
            .is_some_and(|s| s.contains("https://www.googleapis.com/auth/compute"))
        {
            return Err("Invalid JWT: no compute scope");
        }
        let (now, iat, exp) = (
            crate::time::now_secs(),
            c["iat"].as_u64().unwrap_or(0),
            c["exp"].as_u64().unwrap_or(0),
        );
        if exp <= now || iat > now + 60 || exp.saturating_sub(iat) > 3600 {
            return Err(
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.",
            );
        }
        Ok(())
    }

    fn find(&self, fleet: &Fleet<Extra>, zone: &str, name: &str) -> Option<String> {
        fleet
            .iter()
            .find(|r| r.scope == zone && r.name == name)
            .map(|r| r.id.clone())
    }

    fn render(&self, r: &Record<Extra>) -> Value {
        let zone = format!("{}/zones/{}", self.base(), r.scope);
        let mut access =
            json!({"type": "ONE_TO_ONE_NAT", "name": "External NAT", "networkTier": "PREMIUM"});
        if let Some(ip) = &r.ip {
            access["natIP"] = ip.as_str().into();
        }
        let n: u64 = r.id.parse().unwrap_or(0);
        json!({
            "kind": "compute#instance", "id": r.id, "name": r.name, "zone": zone, "status": r.state,
            "creationTimestamp": crate::time::rfc3339(r.created_at),
            "machineType": format!("{zone}/machineTypes/{}", r.extra.machine_type),
            "labels": r.extra.labels, "labelFingerprint": "42WmSpB8rSM=",
            "metadata": {"kind": "compute#metadata", "items": [{"key": "user-data", "value": String::from_utf8_lossy(&r.user_data)}]},
            "networkInterfaces": [{"network": format!("{}/{}", self.base(), r.extra.network), "name": "nic0",
                "networkIP": format!("10.132.{}.{}", n / 250 % 250, n % 250 + 2), "accessConfigs": [access]}],
            "disks": [{"boot": true, "autoDelete": true, "deviceName": "persistent-disk-0",
                "source": format!("{zone}/disks/{}", r.name), "licenses": [r.extra.image]}],
            "tags": {"items": r.extra.tags}, "selfLink": format!("{zone}/instances/{}", r.name),
        })
    }
}

impl Adapter for Gce {
    type Extra = Extra;
    type Error = GceError;
    const STATES: States = States {
        provisioning: "PROVISIONING",
        running: "RUNNING",
        deleting: "STOPPING",
    };

    fn id(&self, n: u64) -> String {
        (4_200_000_000_000_000_000 + n).to_string()
    }

    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", 10 + (n - 1) % 240)
    }

    fn default_scope(&self) -> String {
        self.config.zones[0].clone()
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Extra, GceError> {
        if !self.config.zones.iter().any(|z| z == scope) {
            return Err(GceError::not_found(&format!(
                "projects/{}/zones/{scope}",
                self.config.project
            )));
        }
        if !is_name(&plant.name) {
            return Err(GceError::invalid(format!(
                "Invalid value for field 'resource.name': '{}'.",
                plant.name
            )));
        }
        let labels = crate::framework::marks(plant)
            .iter()
            .filter_map(|(k, v)| labels::encode(k, v))
            .collect();
        Ok(Extra {
            machine_type: self.config.machine_types[0].clone(),
            image: self.config.images[0].clone(),
            labels,
            network: "global/networks/default".into(),
            tags: Vec::new(),
        })
    }

    fn name_taken(&self) -> GceError {
        GceError::new(
            409,
            "alreadyExists",
            "The resource already exists (emulator control surface)",
        )
    }

    fn fault(&self, kind: &FaultKind) -> GceError {
        match kind {
            FaultKind::Quota => GceError::new(
                403,
                "quotaExceeded",
                "Quota 'INSTANCES' exceeded.  Limit: 24.0 in region europe-west1.",
            ),
            FaultKind::RateLimit => rate_limited(),
            FaultKind::Auth => unauthorized(),
            FaultKind::ServerError | FaultKind::Slow { .. } => GceError::new(
                503,
                "backendError",
                "Internal error. Please try again or contact Google Support.",
            ),
        }
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let parts: Vec<&str> = path
            .trim_start_matches("/compute/v1/projects/")
            .split('/')
            .collect();
        let (op, call) = match (method.as_str(), &parts[1..]) {
            ("POST", ["zones", _, "instances"]) => (Some(FaultOp::Create), "instances.insert"),
            ("GET", ["zones", _, "instances", _]) => (Some(FaultOp::Get), "instances.get"),
            ("DELETE", ["zones", _, "instances", _]) => (Some(FaultOp::Delete), "instances.delete"),
            ("GET", ["aggregated", "instances"]) => {
                (Some(FaultOp::List), "instances.aggregatedList")
            }
            ("GET", ["zones", _, "operations", _]) => (None, "zoneOperations.get"),
            ("GET", ["zones", _]) => (None, "zones.get"),
            _ => (None, "unknown"),
        };
        (op, format!("{method} {call}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        token
            .and_then(|t| self.tokens.get(t))
            .is_some_and(|exp| *exp > Instant::now())
    }

    fn unauthorized(&self) -> GceError {
        unauthorized()
    }

    fn rate_limited(&self, _limit: RateLimit) -> GceError {
        rate_limited()
    }

    fn reset(&mut self) {
        self.ops.clear();
        self.failing_inserts.clear();
    }
}

fn unauthorized() -> GceError {
    GceError::new(
        401,
        "authError",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
    )
}

fn rate_limited() -> GceError {
    GceError::new(
        403,
        "rateLimitExceeded",
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service 'compute.googleapis.com'",
    )
}

/// An RFC 1035 label of at most 63 characters: GCE's instance names, label keys and tags.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The contract's marks as the gce plugin writes them (docs/providers/gce.md): keys
/// `egress-<name>`, values with lowercase letters, digits and `-` kept and every other byte
/// `_xx`; an installation too long for a label as `__` plus base32 of its SHA-256.
pub mod labels {
    use sha2::{Digest, Sha256};
    const MARK_PREFIX: &str = "egress.proxy-operator.dev/";

    fn escape(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
                _ => format!("_{b:02x}"),
            })
            .collect()
    }

    /// The label of a mark; `None` for a key that is not the operator's.
    pub fn encode(key: &str, value: &str) -> Option<(String, String)> {
        let name = key.strip_prefix(MARK_PREFIX)?;
        let mut v = escape(value);
        if v.len() > 63 {
            let hash = data_encoding::BASE32_NOPAD.encode(&Sha256::digest(value.as_bytes())[..20]);
            v = format!("__{}", hash.to_ascii_lowercase());
        }
        Some((format!("egress-{name}"), v))
    }

    /// The mark a label stands for (a hashed value stays hashed); `None` for other labels.
    pub fn decode(key: &str, value: &str) -> Option<(String, String)> {
        let name = key.strip_prefix("egress-")?;
        if value.starts_with("__") {
            return Some((format!("{MARK_PREFIX}{name}"), value.to_string()));
        }
        let (mut out, mut rest) = (Vec::new(), value.as_bytes());
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'_' {
                out.push(u8::from_str_radix(std::str::from_utf8(tail.get(..2)?).ok()?, 16).ok()?);
                rest = &tail[2..];
            } else {
                out.push(b);
                rest = tail;
            }
        }
        Some((format!("{MARK_PREFIX}{name}"), String::from_utf8(out).ok()?))
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
        let keys = config
            .accounts
            .iter()
            .map(|(email, pem)| {
                let key = rsa::RsaPrivateKey::from_pkcs8_pem(pem).expect("a PKCS#8 RSA key");
                (email.clone(), VerifyingKey::new(key.to_public_key()))
            })
            .collect();
        let fleet = Fleet::new(Gce::STATES, config.schedule, config.real_proxies.clone());
        let limit = config.rate_limit;
        let gce = Gce {
            config,
            url,
            keys,
            tokens: BTreeMap::new(),
            grants: 0,
            ops: BTreeMap::new(),
            op_seq: 0,
            failing_inserts: VecDeque::new(),
        };
        let state = Shared::new(Cloud::new(gce, fleet, limit));
        let api = Router::new()
            .route("/compute/v1/projects/{p}/zones/{z}", get(zone))
            .route("/compute/v1/projects/{p}/zones/{z}/instances", post(insert))
            .route(
                "/compute/v1/projects/{p}/zones/{z}/instances/{n}",
                get(get_instance).delete(delete_instance),
            )
            .route(
                "/compute/v1/projects/{p}/zones/{z}/operations/{o}",
                get(get_operation),
            )
            .route(
                "/compute/v1/projects/{p}/aggregated/instances",
                get(aggregated),
            );
        let app = crate::framework::gated(api, &state)
            .route("/token", post(token))
            .route(
                "/computeMetadata/v1/instance/service-accounts/default/token",
                get(metadata_token),
            )
            .fallback(unknown);
        Ok(Served::serve("gce-emulator", listener, state, app))
    }

    /// A service-account JSON key for `email` and `pem` whose `token_uri` is this emulator.
    pub fn key_json(&self, email: &str, pem: &str) -> String {
        json!({
            "type": "service_account", "project_id": EMULATOR_PROJECT, "private_key_id": "0123456789abcdef",
            "private_key": pem, "client_email": email, "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": format!("{}/token", self.url()),
        })
        .to_string()
    }

    /// The key of the account the emulator knows.
    pub fn test_key_json(&self) -> String {
        self.key_json(test_keys::TEST_CLIENT_EMAIL, test_keys::TEST_KEY_PEM)
    }

    /// Every token issued so far is refused from now on, as an expired or revoked one is.
    pub fn expire_tokens(&self) {
        let now = Instant::now();
        self.lock()
            .backend
            .tokens
            .values_mut()
            .for_each(|t| *t = now);
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

    /// The instance as `instances.get` shows it, by provider ID or backend id, without
    /// counting as a read.
    pub fn instance(&self, id: &str) -> Option<Value> {
        let b = self.lock();
        let name = id.rsplit('/').next()?;
        let r = b.fleet.iter().find(|r| r.name == name || r.id == name)?;
        Some(b.backend.render(r))
    }

    /// The next `count` calls of `op` answer `error`.
    pub fn inject_error(&self, op: FaultOp, error: GceError, count: u32) {
        self.lock()
            .traffic
            .faults
            .push(op, Effect::fail(error), count);
    }
}

async fn unknown() -> Response {
    GceError::new(
        404,
        "notFound",
        "The requested URL was not found on this server.",
    )
    .into_response()
}

/// `application/x-www-form-urlencoded` values.
fn form(body: &str) -> BTreeMap<String, String> {
    let decode = |s: &str| {
        let (mut out, mut b) = (Vec::new(), s.as_bytes());
        while let Some((&c, rest)) = b.split_first() {
            b = rest;
            match c {
                b'+' => out.push(b' '),
                b'%' if rest.len() >= 2 => {
                    match u8::from_str_radix(std::str::from_utf8(&rest[..2]).unwrap_or("zz"), 16) {
                        Ok(x) => {
                            out.push(x);
                            b = &rest[2..];
                        }
                        Err(_) => out.push(c),
                    }
                }
                _ => out.push(c),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

async fn token(State(state): State<Shared<Backend>>, body: String) -> Response {
    let f = form(&body);
    if f.get("grant_type").map(String::as_str) != Some(JWT_BEARER) {
        return oauth_error("unsupported_grant_type", "Invalid grant_type");
    }
    let mut b = state.lock();
    match b
        .backend
        .verify(f.get("assertion").map_or("", String::as_str))
    {
        Ok(()) => b.backend.issue(),
        Err(why) => oauth_error("invalid_grant", why),
    }
}

async fn metadata_token(State(state): State<Shared<Backend>>, headers: HeaderMap) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.",
        )
            .into_response();
    }
    state.lock().backend.issue()
}

fn project(b: &Backend, p: &str) -> Result<(), GceError> {
    match p == b.backend.config.project {
        true => Ok(()),
        false => Err(GceError::not_found(&format!("projects/{p}"))),
    }
}

fn known_zone(b: &Backend, p: &str, z: &str) -> Result<(), GceError> {
    project(b, p)?;
    match b.backend.config.zones.iter().any(|x| x == z) {
        true => Ok(()),
        false => Err(GceError::not_found(&format!("projects/{p}/zones/{z}"))),
    }
}

fn answer(r: Result<Value, GceError>) -> Response {
    r.map_or_else(IntoResponse::into_response, |v| Json(v).into_response())
}

async fn zone(
    State(state): State<Shared<Backend>>,
    Path((p, z)): Path<(String, String)>,
) -> Response {
    let b = state.lock();
    answer(known_zone(&b, &p, &z).map(|()| {
        let region = z.rsplit_once('-').map_or("", |(r, _)| r);
        let base = b.backend.base();
        json!({"kind": "compute#zone", "name": z, "status": "UP", "region": format!("{base}/regions/{region}"),
               "selfLink": format!("{base}/zones/{z}")})
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
}

async fn insert(
    State(state): State<Shared<Backend>>,
    Path((p, z)): Path<(String, String)>,
    body: Result<Json<InsertBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(body)) = body else {
        return GceError::invalid("Invalid JSON payload received.").into_response();
    };
    let mut b = state.lock();
    answer(known_zone(&b, &p, &z).and_then(|()| do_insert(&mut b, &z, body)))
}

/// The checks of an insert, in the order the API reports them, and its operation.
fn do_insert(b: &mut Backend, zone: &str, body: InsertBody) -> Result<Value, GceError> {
    if !is_name(&body.name) {
        let msg = format!(
            "Invalid value for field 'resource.name': '{}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'",
            body.name
        );
        return Err(GceError::invalid(msg));
    }
    let c = &b.backend.config;
    let machine = body
        .machine_type
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    if !c.machine_types.contains(&machine)
        || !body
            .machine_type
            .contains(&format!("zones/{zone}/machineTypes/"))
    {
        let msg = format!(
            "Invalid value for field 'resource.machineType': '{}'. Machine type with name '{machine}' does not exist in zone '{zone}'.",
            body.machine_type
        );
        return Err(GceError::invalid(msg));
    }
    let bad_label = |s: &str| {
        s.len() > 63
            || !s
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b))
    };
    if let Some((k, v)) = body
        .labels
        .iter()
        .find(|(k, v)| !is_name(k) || bad_label(v))
    {
        return Err(GceError::invalid(format!(
            "Invalid value for field 'resource.labels': '{k}={v}'."
        )));
    }
    if b.backend.find(&b.fleet, zone, &body.name).is_some() {
        let resource = format!(
            "projects/{}/zones/{zone}/instances/{}",
            c.project, body.name
        );
        return Err(GceError::new(
            409,
            "alreadyExists",
            format!("The resource '{resource}' already exists"),
        ));
    }
    let image = body
        .disks
        .pointer("/0/initializeParams/sourceImage")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !c.images.iter().any(|i| i == image) {
        let error = (
            "RESOURCE_NOT_FOUND".to_string(),
            format!("The resource '{image}' was not found"),
        );
        return Ok(b.backend.op(zone, "insert", &body.name, Some(error), 0));
    }
    if let Some((code, message, reads)) = b.backend.failing_inserts.pop_front() {
        return Ok(b
            .backend
            .op(zone, "insert", &body.name, Some((code, message)), reads));
    }
    let items = body.metadata["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let user_data = items
        .iter()
        .find(|i| i["key"] == "user-data")
        .and_then(|i| i["value"].as_str());
    let extra = Extra {
        machine_type: machine,
        image: image.to_string(),
        labels: body.labels.clone(),
        network: body
            .network_interfaces
            .pointer("/0/network")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        tags: serde_json::from_value(body.tags["items"].clone()).unwrap_or_default(),
    };
    let mut record = Record::new(b.new_id(), body.name.clone(), zone.to_string(), extra);
    record.labels = body
        .labels
        .iter()
        .filter_map(|(k, v)| labels::decode(k, v))
        .collect();
    record.user_data = user_data.unwrap_or_default().as_bytes().to_vec();
    b.create(record);
    Ok(b.backend.op(zone, "insert", &body.name, None, 0))
}

async fn get_instance(
    State(state): State<Shared<Backend>>,
    Path((p, z, n)): Path<(String, String, String)>,
) -> Response {
    let mut b = state.lock();
    if let Err(e) = known_zone(&b, &p, &z) {
        return e.into_response();
    }
    let Some(id) = b.backend.find(&b.fleet, &z, &n) else {
        return GceError::not_found(&format!("projects/{p}/zones/{z}/instances/{n}"))
            .into_response();
    };
    let v = b.fleet.get(&id).map(|r| b.backend.render(r));
    b.saw(&id);
    Json(v).into_response()
}

async fn delete_instance(
    State(state): State<Shared<Backend>>,
    Path((p, z, n)): Path<(String, String, String)>,
) -> Response {
    let mut b = state.lock();
    if let Err(e) = known_zone(&b, &p, &z) {
        return e.into_response();
    }
    let resource = format!("projects/{p}/zones/{z}/instances/{n}");
    let id = b.backend.find(&b.fleet, &z, &n).unwrap_or_default();
    match b.fleet.delete(&id) {
        Deletion::NotFound => GceError::not_found(&resource).into_response(),
        Deletion::Locked => GceError::new(
            400,
            "resourceNotReady",
            format!("The resource '{resource}' is not ready"),
        )
        .into_response(),
        Deletion::InProgress(_) | Deletion::Done(_) => {
            Json(b.backend.op(&z, "delete", &n, None, 0)).into_response()
        }
    }
}

async fn get_operation(
    State(state): State<Shared<Backend>>,
    Path((p, z, o)): Path<(String, String, String)>,
) -> Response {
    let mut b = state.lock();
    if let Err(e) = known_zone(&b, &p, &z) {
        return e.into_response();
    }
    let Some(op) = b.backend.ops.get_mut(&o).filter(|op| op.zone == z) else {
        return GceError::not_found(&format!("projects/{p}/zones/{z}/operations/{o}"))
            .into_response();
    };
    let seen = op.clone();
    op.running_for = op.running_for.saturating_sub(1);
    Json(b.backend.render_op(&seen)).into_response()
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
    terms
        .map(|t| {
            let (k, v) = t.strip_prefix('(')?.split_once('=')?;
            let k = k.trim().strip_prefix("labels.")?;
            Some((k.to_string(), v.trim().trim_matches('"').to_string()))
        })
        .collect()
}

async fn aggregated(
    State(state): State<Shared<Backend>>,
    Path(p): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    let b = state.lock();
    answer(project(&b, &p).and_then(|()| list(&b, q)))
}

fn list(b: &Backend, q: ListQuery) -> Result<Value, GceError> {
    let terms = label_terms(&q.filter).ok_or_else(|| {
        GceError::invalid(format!("Invalid value for field 'filter': '{}'.", q.filter))
    })?;
    let per_page = q.max_results.unwrap_or(500);
    if !(1..=500).contains(&per_page) {
        return Err(GceError::invalid(
            "Invalid value for field 'maxResults': must be between 0 and 500.",
        ));
    }
    let start = match q.page_token.as_str() {
        "" => 0,
        t => t
            .strip_prefix("emu-")
            .and_then(|n| usize::from_str_radix(n, 16).ok())
            .ok_or_else(|| GceError::invalid("Invalid value for field 'pageToken'."))?,
    };
    let mut matched: Vec<&Record<Extra>> = b
        .fleet
        .iter()
        .filter(|r| terms.iter().all(|(k, v)| r.extra.labels.get(k) == Some(v)))
        .collect();
    matched.sort_by(|x, y| (&x.scope, &x.name).cmp(&(&y.scope, &y.name)));
    let mut items = serde_json::Map::new();
    let zones = &b.backend.config.zones;
    let down: Vec<String> = zones
        .iter()
        .filter(|z| b.fleet.failing_scope(std::iter::once(z.as_str())).is_some())
        .map(|z| format!("zones/{z}"))
        .collect();
    for z in zones {
        let key = format!("zones/{z}");
        let warning = match down.contains(&key) {
            true => {
                json!({"code": "UNREACHABLE", "message": format!("Scope {key} is unreachable")})
            }
            false => {
                json!({"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope on this page."})
            }
        };
        items.insert(key, json!({"warning": warning}));
    }
    for r in matched
        .iter()
        .skip(start)
        .take(per_page)
        .filter(|r| !down.contains(&format!("zones/{}", r.scope)))
    {
        let scoped = items
            .entry(format!("zones/{}", r.scope))
            .or_insert_with(|| json!({}));
        scoped.as_object_mut().map(|o| o.remove("warning"));
        let list = scoped.as_object_mut().and_then(|o| {
            o.entry("instances")
                .or_insert_with(|| json!([]))
                .as_array_mut()
        });
        list.map(|l| l.push(b.backend.render(r)));
    }
    let mut out = json!({"kind": "compute#instanceAggregatedList", "items": items, "unreachables": down,
                         "selfLink": format!("{}/aggregated/instances", b.backend.base())});
    if start + per_page < matched.len() {
        out["nextPageToken"] = format!("emu-{:x}", start + per_page).into();
    }
    Ok(out)
}
