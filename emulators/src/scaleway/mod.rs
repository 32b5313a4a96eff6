//! An emulator of the Scaleway Instances API (`/instance/v1/zones/{zone}/...`), the part
//! `providers-wasm/scaleway` uses, built on [`crate::framework::Cloud`].
//!
//! Shapes, paths and codes follow Scaleway's published API reference and the OpenAPI-
//! generated Go SDK (`scaleway-sdk-go`, `api/instance/v1`): servers with `tags` (strings),
//! `state` (`running`, `stopped`, `stopped in place`, `starting`, `stopping`, `locked`),
//! `public_ips`, `volumes`, `creation_date`; flexible IPs under `/ips`; user data under
//! `/servers/{id}/user_data/{key}` as `text/plain`; actions as `POST .../action`
//! `{"action": "poweron" | "terminate" | ...}` answering `202 {"task": ...}`.
//!
//! What a plugin must cope with, as the real API does it:
//! - **Servers are created `stopped`.** `poweron` moves one to `starting`; the framework's
//!   schedule then runs it (`AfterReads(1)` by default). `poweron` of a server that is not
//!   stopped answers `412 precondition_failed` "server should be stopped" (captured).
//! - **The public IPv4 is its own resource.** `POST /ips` makes a flexible IP; a create
//!   with `public_ips: [id]` attaches it. Deleting a server detaches its IP and keeps it
//!   (Scaleway: attached flexible IPs are preserved unless released), so an IP the plugin
//!   forgets is a leak: [`ScalewayEmulator::ips`] and the dump (`kind: "ip"`) show it.
//! - **Delete depends on the state.** `DELETE /servers/{id}` needs a powered-off server
//!   (`400 invalid_request_error` "instance should be powered off", captured) and keeps
//!   its local volume (`kind: "volume"` in the dump) until `DELETE /volumes/{id}`;
//!   `terminate` (accepted while `running` or `starting`) removes the server with its
//!   volume.
//! - **Names are not unique.** Two creates with one name make two servers; `name` filters
//!   by substring (`server1` also finds `server10`).
//! - **Paging**: `page` (from 1) and `per_page` (1-100, default 50), `X-Total-Count` and a
//!   `Link` header; `tags=a,b` keeps servers carrying every tag.
//! - **Errors** are `{"type", "message", ...}`: 404 `not_found` (`resource`,
//!   `resource_id`), 401 `denied_authentication`, 403 `permissions_denied` and
//!   `quotas_exceeded`, 400 `invalid_arguments` / `invalid_request_error`, 409 `locked`,
//!   500 `internal_error`, 503 when a zone is down. Scaleway publishes no rate limit for
//!   this API; an enforced limit answers `429 too_many_requests` with `Retry-After`.
//!
//! - **The catalogue**: `GET /products/servers?page=&per_page=` answers `{"servers":
//!   {<commercial type>: <ServerType>}, "total_count"}` (a map, not a list, as the SDK's
//!   `ListServersTypesResponse` has it) with `X-Total-Count` and `Link`, paged like the
//!   server list in commercial-type order. Each `ServerType` carries `hourly_price` (euros,
//!   a JSON float: the SDK's `float32`), the deprecated `monthly_price` (a 730-hour month:
//!   the SDK says "estimated monthly price, for a 30 days month"; 730 hours is the emulator's
//!   choice), `alt_names`, `ncpus`, `ram` (bytes), `gpu`, `arch`, `volumes_constraint`,
//!   `per_volume_constraint`, `capabilities`, `network`, `block_bandwidth` and
//!   `end_of_service`. The prices and the zones each type is sold in are
//!   [`ScalewayConfig::catalogue`]'s, so a test knows the exact price; the other figures
//!   are illustrative. Source: scaleway-sdk-go at 2c5cd81b, `api/instance/v1/instance_sdk.go`
//!   (`ListServersTypes`, `ListServersTypesRequest`, `ListServersTypesResponse`,
//!   `ServerType`) and `scw/client.go` (`doListAll`: pages from 1 while `total_count` says
//!   there are more). Only `any` faults reach it: it is no instance operation.
//!
//! Auth is `X-Auth-Token: <secret key>`; creates must name the configured project.

mod api;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use serde_json::{Value, json};

use crate::control::{DumpSecondary, FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{Adapter, Cloud, Fleet, Schedule, Served, Shared, States};
use crate::real_proxy::RealProxies;

/// The secret key the emulator binary accepts.
pub const EMULATOR_SECRET_KEY: &str = "emulator-secret-key";
/// The project the emulator binary and [`ScalewayConfig::new`] use.
pub const EMULATOR_PROJECT: &str = "11111111-2222-4333-8444-555555555555";

/// What the emulated account offers.
#[derive(Clone)]
pub struct ScalewayConfig {
    pub secret_key: String,
    pub project: String,
    pub zones: Vec<String>,
    pub commercial_types: Vec<String>,
    /// Image labels (`ubuntu_noble`) and IDs a create may name.
    pub images: Vec<String>,
    /// `GET /products/servers`: each commercial type's hourly price and the zones selling it.
    pub catalogue: Vec<ServerTypeOffer>,
    pub schedule: Schedule,
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl ScalewayConfig {
    pub fn new(secret_key: impl Into<String>) -> Self {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let zones = words(&["fr-par-1", "fr-par-2", "nl-ams-1", "pl-waw-1"]);
        // Illustrative prices, every type in every zone but GP1-XS, which pl-waw-1 does not
        // sell (so a test has a type without a price in a known zone).
        let catalogue = vec![
            ServerTypeOffer::new("DEV1-S", 0.0088, &zones),
            ServerTypeOffer::new("DEV1-M", 0.0198, &zones),
            ServerTypeOffer::new("PLAY2-PICO", 0.014, &zones),
            ServerTypeOffer::new("GP1-XS", 0.091, &zones[..3]),
        ];
        ScalewayConfig {
            secret_key: secret_key.into(),
            project: EMULATOR_PROJECT.into(),
            zones,
            catalogue,
            commercial_types: words(&["DEV1-S", "DEV1-M", "PLAY2-PICO", "GP1-XS"]),
            images: words(&["ubuntu_noble", "debian_bookworm"]),
            schedule: Schedule::AfterReads(1),
            real_proxies: None,
        }
    }
}

/// A commercial type of the catalogue: its hourly price (euros) and the zones selling it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerTypeOffer {
    pub commercial_type: String,
    pub hourly_price: f64,
    pub zones: Vec<String>,
}

impl ServerTypeOffer {
    pub fn new(commercial_type: &str, hourly_price: f64, zones: &[impl AsRef<str>]) -> Self {
        let zones = zones.iter().map(|z| z.as_ref().to_string()).collect();
        ServerTypeOffer { commercial_type: commercial_type.into(), hourly_price, zones }
    }
}

/// Scaleway's error answer (`{"type", "message", ...}`): the framework's [`Refusal`].
pub type ScwError = Refusal;

/// Scaleway's errors, by the `type` of their body.
pub mod error {
    use super::ScwError;
    use serde_json::json;

    pub fn new(status: u16, kind: &str, message: &str) -> ScwError {
        ScwError::new(status, json!({"type": kind, "message": message}))
    }

    /// As captured: `{"type": "not_found", "message": "resource is not found", "resource":
    /// "instance_server", "resource_id": ...}`.
    pub fn not_found(resource: &str, id: &str) -> ScwError {
        new(404, "not_found", "resource is not found")
            .with("resource", json!(resource))
            .with("resource_id", json!(id))
    }

    pub fn invalid_argument(name: &str, help: &str) -> ScwError {
        let detail = json!([{"argument_name": name, "reason": "constraint", "help_message": help}]);
        new(400, "invalid_arguments", "invalid argument(s)").with("details", detail)
    }

    pub fn invalid_request(message: &str) -> ScwError {
        new(400, "invalid_request_error", message)
    }

    pub fn internal() -> ScwError {
        new(500, "internal_error", "an internal error occurred")
    }

    pub fn locked(id: &str) -> ScwError {
        new(409, "locked", "resource is locked")
            .with("resource", json!("instance_server"))
            .with("resource_id", json!(id))
    }

    pub fn too_many_requests() -> ScwError {
        new(429, "too_many_requests", "rate limit exceeded")
    }
}

/// What a server holds beyond the framework's record. Tags of the form `k=v` live in the
/// record's labels (so plants and the dump see the marks); any other tag stays here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Server {
    pub commercial_type: String,
    pub image: String,
    pub project: String,
    pub bare_tags: Vec<String>,
    /// The attached flexible IP; `None`: the address (if any) is a dynamic one.
    pub ip_id: Option<String>,
    pub volume_id: Option<String>,
}

/// A flexible IP.
#[derive(Clone, Debug, PartialEq)]
pub struct FlexIp {
    pub id: String,
    pub address: String,
    pub zone: String,
    pub project: String,
    pub tags: Vec<String>,
    pub server: Option<String>,
}

/// The Scaleway side of the framework, and the IPs and volumes it keeps besides servers.
pub struct Scaleway {
    pub config: ScalewayConfig,
    pub ips: BTreeMap<String, FlexIp>,
    /// Local volumes: id -> (zone, server it is attached to).
    pub volumes: BTreeMap<String, (String, Option<String>)>,
    next: u64,
}

/// Scaleway IDs are UUIDs; these count up so that ids sort in creation order.
fn uuid(kind: u16, n: u64) -> String {
    format!("{n:08x}-0000-4000-{kind:04x}-{n:012x}")
}

impl Scaleway {
    /// A fresh id for an IP (kind 1) or a volume (kind 2).
    pub fn new_id(&mut self, kind: u16) -> String {
        self.next += 1;
        uuid(0x8000 + kind, self.next)
    }

    /// A flexible IP in `zone`, unattached.
    pub fn new_ip(&mut self, zone: &str, project: &str, tags: Vec<String>) -> FlexIp {
        let id = self.new_id(1);
        let n = self.next;
        let ip = FlexIp {
            id: id.clone(),
            address: format!("198.51.{}.{}", (n / 250) % 250, n % 250 + 1),
            zone: zone.into(),
            project: project.into(),
            tags,
            server: None,
        };
        self.ips.insert(id, ip.clone());
        ip
    }
}

impl Adapter for Scaleway {
    type Extra = Server;
    type Error = ScwError;
    const STATES: States = States {
        provisioning: "starting",
        running: "running",
        // A terminate in progress shows the server stopping until it is gone.
        deleting: "stopping",
    };

    fn id(&self, n: u64) -> String {
        uuid(0x8000, n)
    }

    /// A dynamic address, for servers that run without their flexible IP (plants, or a
    /// server whose address the control surface removed and the schedule gave back).
    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", n % 250 + 1)
    }

    fn default_scope(&self) -> String {
        self.config.zones[0].clone()
    }

    fn plant(&self, plant: &Plant, zone: &str) -> Result<Server, ScwError> {
        if !self.config.zones.iter().any(|z| z == zone) {
            return Err(error::invalid_argument("zone", "unknown zone"));
        }
        if plant.name.is_empty() {
            return Err(error::invalid_argument("name", "required"));
        }
        Ok(Server {
            commercial_type: self.config.commercial_types[0].clone(),
            image: self.config.images[0].clone(),
            project: self.config.project.clone(),
            ..Server::default()
        })
    }

    /// Scaleway does not refuse a name in use; a plant does, so tests stay unambiguous.
    fn name_taken(&self) -> ScwError {
        error::invalid_argument("name", "a planted server needs a name of its own")
    }

    fn fault(&self, kind: &FaultKind) -> ScwError {
        match kind {
            FaultKind::Quota => {
                error::new(403, "quotas_exceeded", "quota(s) exceeded for this resource").with(
                    "details",
                    json!([{"resource": "compute_instances", "quota": 10, "current": 10}]),
                )
            }
            FaultKind::RateLimit => error::too_many_requests(),
            FaultKind::Auth => self.unauthorized(),
            FaultKind::ServerError | FaultKind::Slow { .. } => error::internal(),
        }
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        // instance / v1 / zones / {zone} / collection / {id} / ...
        let rest = if parts.len() >= 5 { &parts[4..] } else { &[][..] };
        let m = method.as_str();
        let (op, route) = match rest {
            ["servers"] if m == "POST" => (Some(FaultOp::Create), "/servers"),
            ["servers"] => (Some(FaultOp::List), "/servers"),
            ["servers", _] if m == "DELETE" => (Some(FaultOp::Delete), "/servers/{id}"),
            ["servers", _] => (Some(FaultOp::Get), "/servers/{id}"),
            ["servers", _, "action"] => (None, "/servers/{id}/action"),
            ["servers", _, "user_data", ..] => {
                (Some(FaultOp::Create), "/servers/{id}/user_data/{key}")
            }
            ["ips"] if m == "POST" => (Some(FaultOp::Create), "/ips"),
            ["ips"] => (Some(FaultOp::List), "/ips"),
            ["ips", _] if m == "DELETE" => (Some(FaultOp::Delete), "/ips/{id}"),
            ["volumes", _] if m == "DELETE" => (Some(FaultOp::Delete), "/volumes/{id}"),
            ["products", "servers"] => (None, "/products/servers"),
            _ => (None, "other"),
        };
        (op, format!("{m} /instance/v1/zones/{{zone}}{route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        headers.get("x-auth-token").and_then(|v| v.to_str().ok())
            == Some(self.config.secret_key.as_str())
    }

    fn unauthorized(&self) -> ScwError {
        error::new(401, "denied_authentication", "authentication is denied")
            .with("method", json!("api_key"))
            .with("reason", json!("not_found"))
    }

    fn rate_limited(&self, _limit: RateLimit) -> ScwError {
        error::too_many_requests()
    }

    fn secondary(&self) -> Vec<DumpSecondary> {
        let ips = self.ips.values().map(|ip| DumpSecondary {
            kind: "ip".into(),
            id: ip.id.clone(),
            attached_to: ip.server.clone(),
        });
        let volumes = self.volumes.iter().map(|(id, (_, server))| DumpSecondary {
            kind: "volume".into(),
            id: id.clone(),
            attached_to: server.clone(),
        });
        ips.chain(volumes).collect()
    }

    fn reset(&mut self) {
        self.ips.clear();
        self.volumes.clear();
    }
}

pub type Backend = Cloud<Scaleway>;

/// A running Scaleway emulator. Stops when dropped.
pub type ScalewayEmulator = Served<Backend>;

impl Served<Backend> {
    pub fn start(config: ScalewayConfig) -> ScalewayEmulator {
        let (listener, _) = crate::framework::bind(0).expect("bind 127.0.0.1:0");
        let fleet = Fleet::new(Scaleway::STATES, config.schedule, config.real_proxies.clone());
        let adapter = Scaleway { config, ips: BTreeMap::new(), volumes: BTreeMap::new(), next: 0 };
        let state = Shared::new(Cloud::new(adapter, fleet, None));
        let app = api::router(&state);
        Served::serve("scaleway-emulator", listener, state, app)
    }

    /// A server as the API renders it (`GET .../servers/{id}`).
    pub fn server(&self, id: &str) -> Option<Value> {
        self.lock().fleet.get(id).map(api::render)
    }

    /// Every flexible IP, attached or not.
    pub fn ips(&self) -> Vec<FlexIp> {
        self.lock().backend.ips.values().cloned().collect()
    }

    /// Every local volume left (attached or not).
    pub fn volumes(&self) -> Vec<String> {
        self.lock().backend.volumes.keys().cloned().collect()
    }
}
