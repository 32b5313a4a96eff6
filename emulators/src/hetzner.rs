//! An emulator of the Hetzner Cloud API v1, close enough on the wire that a provider
//! plugin cannot tell it from `https://api.hetzner.cloud/v1`.
//!
//! What it serves (bearer token required; `401 unauthorized` otherwise):
//! - `POST /v1/servers` -> `201 {server, action, next_actions, root_password}`.
//! - `GET /v1/servers/{id}`, `GET /v1/servers?name=&label_selector=&status=&sort=&page=&per_page=`.
//! - `DELETE /v1/servers/{id}` -> `200 {action}`.
//! - `GET /v1/actions/{id}`, `GET /v1/servers/{id}/actions/{action_id}`.
//! - `GET /v1/primary_ips` (same list parameters plus `ip`), `GET` and `DELETE
//!   /v1/primary_ips/{id}`.
//!
//! Servers and Primary IPs say where they are with a top-level `location` and carry no
//! `datacenter`: Hetzner deprecated `datacenter` on both on 16 December 2025 and removed it
//! after 1 July 2026 (its API changelog; hcloud-go v2.45.0's `schema.Server` and
//! `schema.PrimaryIP`). [`HetznerConfig::legacy_datacenter`] answers the old shape instead,
//! `datacenter` with its `location` inside and no top-level one, for clients that must read
//! both. A create still takes `datacenter` as well as `location`.
//!
//! Every error is Hetzner's envelope `{"error": {"code", "message", "details"}}` with the
//! status the reference's error table gives the code (`invalid_input` is 422, not 400;
//! `uniqueness_error` 409; `resource_limit_exceeded` 403; `resource_unavailable` 412;
//! `locked` 423; `rate_limit_exceeded` 429). Lists carry `meta.pagination` and a `Link`
//! header; every answer carries the `RateLimit-*` headers.
//!
//! # Rate limit
//!
//! Off by default. With [`HetznerConfig::rate_limit`] (or `POST /_emulator/rate-limit`)
//! every API call, authenticated or not, takes a token of a bucket of `burst` tokens
//! refilled at `per_hour`; a call without one answers `429 rate_limit_exceeded` ("limit of
//! N requests per hour reached", `details: null`, as captured from the real API) and does
//! nothing. Every answer says `RateLimit-Limit: per_hour`, `RateLimit-Remaining` (whole
//! tokens left) and `RateLimit-Reset` (Unix time when the bucket is full again), as
//! Hetzner documents them; Hetzner's own bucket is 3600 deep and refills one a second.
//!
//! # Lifecycle
//!
//! A new server is `initializing` and already has its Primary IPs (IPv4 and IPv6 unless
//! `public_net` disables them), as on Hetzner, where the address is known before the
//! machine boots. A plugin that reports `Running` because it sees an address is caught by
//! this. It becomes `running` (or `off` with `start_after_create: false`) on the
//! [`RunSchedule`]; the default is "after the first read that sees it", so tests are fast
//! and deterministic. `DELETE` puts it in `deleting` behind a `delete_server` action and
//! it disappears on the [`DeleteSchedule`] (default: right after the answer), taking its
//! auto-delete Primary IPs with it. Hooks for a later "real proxy" mode: [`OnRunning`] is
//! called when a server starts running and may replace its IPv4 address.
//!
//! # Control surface
//!
//! [`HetznerEmulator`] is the framework's [`Served`] over [`Backend`], which implements the
//! framework's [`Model`](crate::framework::Model) (and its gate's
//! [`Api`](crate::framework::Api)), so it is an [`Emulator`] and serves the shared
//! `/_emulator/` surface, plus `POST /_emulator/errors` (any Hetzner error, see
//! [`HetznerEmulator::inject_error`]) and `GET /_emulator/requests`.
//!
//! How the shared operations map here:
//! - faults: `create` is `POST /v1/servers`; `get` is `GET /v1/servers/{id}`, the action
//!   reads and `GET /v1/primary_ips/{id}`; `delete` is both `DELETE`s; `list` is both
//!   lists. Kinds answer as Hetzner does: `server-error` 500 `server_error`, `quota` 403
//!   `resource_limit_exceeded` (`server limit exceeded`), `rate-limit` 429
//!   `rate_limit_exceeded` with `RateLimit-Remaining: 0`, `auth` 401 `unauthorized`,
//!   `slow` a delayed normal answer.
//! - `hold_provisioning` keeps the server `initializing`. Unlike the trait's generic
//!   wording it keeps its IP: a Hetzner server has its address from the start.
//! - `set_locked` sets the server's `locked` flag; mutating calls on it (`DELETE`) answer
//!   `423 locked`. Reads still work, as on Hetzner, where a lock blocks actions, not GETs.
//! - `start_slow_delete` starts a delete that stays `deleting` until `finish_deletes`; a
//!   `DELETE` of a server already being deleted answers `423 locked` (its delete action is
//!   running).
//! - IDs passed to the trait are Hetzner's integer IDs as strings; a plugin's provider ID
//!   ending in `/<id>` is accepted too. Unknown IDs are ignored (the HTTP surface answers
//!   404), so cleanup after a completed delete does not panic.
//!
//! # Partial failures
//!
//! Hetzner lists are global: one `GET /v1/servers` covers every location, and the API
//! never returns part of a list. So [`Emulator::fail_scope`] models a location whose
//! backing store is unreachable: any list whose matches (across all pages, since the
//! answer's `total_entries` needs them all) include a resource in that location fails
//! whole with `503 unavailable`, while lists that touch no such resource still answer.
//! A plugin therefore sees "fail-whole" for its GC listing, never a silently short list.
//!
//! # Verified against the reference and captured answers, and assumed
//!
//! Checked against the API reference: routes, field names, status values, error-code
//! statuses, label and label-selector rules, pagination defaults and `meta`, Primary IP
//! fields and `auto_delete`, action fields, `DELETE` answering 200 with an action and
//! Primary IP `DELETE` answering 204. Captured real answers: `unable to authenticate`,
//! `server name is already used`, `server limit exceeded`, `image not found`,
//! `unsupported location for server type` (all with their codes), `412
//! resource_unavailable "server location disabled"`, and the 429 body. Assumed (the
//! reference does not say): other messages, `k!=v`/`notin` matching resources without the
//! key (Kubernetes semantics), `per_page` above 50 being capped rather than rejected,
//! non-numeric path IDs answering 404, a repeated `DELETE` during deletion answering 423,
//! deleting an assigned Primary IP of a running server answering `422
//! server_not_stopped`, and the name `primary_ip-<id>` for Primary IPs made with a server.

mod api;
mod create;
mod error;
mod labels;
mod query;
mod render;
mod state;
#[cfg(test)]
mod tests;

pub use error::HetznerError;

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

#[cfg(doc)]
use crate::control::Emulator;
use crate::control::FaultOp;
use crate::framework::{Served, Shared};
use state::parse_id;

pub use state::Backend;

/// A location of the catalogue, with the one datacenter servers there are placed in.
#[derive(Debug, Clone, PartialEq)]
pub struct LocationSpec {
    pub id: u64,
    /// `fsn1`, `nbg1`, ...: what `location` names and what the plugin's scope is.
    pub name: String,
    pub description: String,
    pub country: String,
    pub city: String,
    pub latitude: f64,
    pub longitude: f64,
    pub network_zone: String,
    /// `fsn1-dc14`, accepted as `datacenter` in a create.
    pub datacenter: String,
    /// `false`: creates there answer `412 resource_unavailable` ("server location
    /// disabled"), as Hetzner does when a location stops taking orders.
    pub available: bool,
}

impl LocationSpec {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        name: &str,
        datacenter: &str,
        city: &str,
        country: &str,
        network_zone: &str,
        latitude: f64,
        longitude: f64,
    ) -> Self {
        LocationSpec {
            id,
            name: name.into(),
            description: format!("{city} DC Park 1"),
            country: country.into(),
            city: city.into(),
            latitude,
            longitude,
            network_zone: network_zone.into(),
            datacenter: datacenter.into(),
            available: true,
        }
    }

    pub(crate) fn datacenter_id(&self) -> u64 {
        100 + self.id
    }
}

/// A server type of the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTypeSpec {
    pub id: u64,
    pub name: String,
    pub cores: u32,
    pub memory_gb: f64,
    pub disk_gb: u32,
    /// `shared` or `dedicated`.
    pub cpu_type: String,
    /// `x86` or `arm`.
    pub architecture: String,
    /// Locations that offer it; empty means all. A create elsewhere answers
    /// `invalid_input` "unsupported location for server type", as Hetzner does since
    /// server types became per location.
    pub locations: Vec<String>,
    /// The hourly price without VAT, as Hetzner writes it (EUR, ten decimals:
    /// `"0.0080000000"`); the same in every location it is offered in, plus 19% VAT for
    /// the gross.
    pub price_hourly_net: String,
}

impl ServerTypeSpec {
    pub fn new(id: u64, name: &str, cores: u32, memory_gb: f64, disk_gb: u32) -> Self {
        ServerTypeSpec {
            id,
            name: name.into(),
            cores,
            memory_gb,
            disk_gb,
            cpu_type: "shared".into(),
            architecture: "x86".into(),
            locations: Vec::new(),
            // Illustrative, by size: tests that check prices set their own.
            price_hourly_net: format!("{:.10}", 0.0035 * f64::from(cores) + 0.0007 * memory_gb),
        }
    }

    pub fn available_in(&self, location: &str) -> bool {
        self.locations.is_empty() || self.locations.iter().any(|l| l == location)
    }
}

/// A system image of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    pub id: u64,
    pub name: String,
    pub description: String,
    pub os_flavor: String,
    pub os_version: String,
}

impl ImageSpec {
    pub fn new(id: u64, name: &str, os_flavor: &str, os_version: &str) -> Self {
        ImageSpec {
            id,
            name: name.into(),
            description: format!("{os_flavor} {os_version}"),
            os_flavor: os_flavor.into(),
            os_version: os_version.into(),
        }
    }
}

/// When a new server leaves `initializing` (the framework's provisioning schedule; reads
/// are GETs of the server and list pages showing it).
pub use crate::framework::Schedule as RunSchedule;

/// When a deleted server disappears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteSchedule {
    /// Right after the `DELETE` answer (whose action still says `running`, as Hetzner's
    /// does; reading the action afterwards shows `success`). The default.
    Immediate,
    /// After this many reads have shown it `deleting`.
    AfterReads(u32),
    /// Once this long has passed since the `DELETE`.
    After(Duration),
    /// Only [`Emulator::finish_deletes`] completes deletes.
    Manual,
}

/// What the [`OnRunning`] hook learns about a server that has just started running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningServer {
    pub id: u64,
    pub name: String,
    pub location: String,
    pub labels: BTreeMap<String, String>,
    /// The cloud-init it was created with, for a mode that runs it.
    pub user_data: Option<String>,
    pub ipv4: Option<String>,
}

/// Called when a server becomes `running`; `Some(ip)` replaces its IPv4 address (ignored
/// for a server created without one). Meant for a mode that starts a real forward proxy
/// on loopback and points the server's address at it.
///
/// It runs under the emulator's lock, so it sees and sets the state atomically with the
/// transition: keep it quick, and never call back into the emulator from it.
pub type OnRunning = Arc<dyn Fn(&RunningServer) -> Option<Ipv4Addr> + Send + Sync>;

/// Everything configurable. `HetznerConfig::new(token)` gives the defaults: the six public
/// locations, a few server types and images, no server limit, addresses from
/// 203.0.113.0/24 (TEST-NET-3, so nothing real is ever named).
#[derive(Clone)]
pub struct HetznerConfig {
    pub token: String,
    pub locations: Vec<LocationSpec>,
    pub server_types: Vec<ServerTypeSpec>,
    pub images: Vec<ImageSpec>,
    /// Where a create without `location` or `datacenter` goes.
    pub default_location: String,
    /// Creates beyond this many servers answer `403 resource_limit_exceeded`.
    pub server_limit: Option<usize>,
    /// The first IPv4 address handed out; later ones count up from it.
    pub first_ipv4: Ipv4Addr,
    pub run_schedule: RunSchedule,
    pub delete_schedule: DeleteSchedule,
    pub on_running: Option<OnRunning>,
    /// Real-proxy mode (see the module documentation); `None` by default.
    pub real_proxies: Option<Arc<crate::real_proxy::RealProxies>>,
    /// Hetzner's rate limit, enforced: a call past it answers `429 rate_limit_exceeded`,
    /// and every answer's `RateLimit-*` headers show the bucket. `None` (the default):
    /// never limited, and the headers show Hetzner's default 3600/h with a full bucket.
    pub rate_limit: Option<crate::rate_limit::RateLimit>,
    /// Servers and Primary IPs answer in the shape from before the datacenter phase-out:
    /// `datacenter` (with its `location`) and no top-level `location`. `false` (the default):
    /// the current shape, `location` and no `datacenter`.
    pub legacy_datacenter: bool,
}

impl HetznerConfig {
    pub fn new(token: impl Into<String>) -> Self {
        HetznerConfig { token: token.into(), ..HetznerConfig::default() }
    }
}

impl Default for HetznerConfig {
    fn default() -> Self {
        let eu = || vec!["fsn1".to_string(), "nbg1".into(), "hel1".into()];
        let mut cx23 = ServerTypeSpec::new(3, "cx23", 2, 4.0, 40);
        cx23.locations = eu();
        let mut cax11 = ServerTypeSpec::new(4, "cax11", 2, 4.0, 40);
        cax11.architecture = "arm".into();
        cax11.locations = eu();
        let mut ccx13 = ServerTypeSpec::new(5, "ccx13", 2, 8.0, 80);
        ccx13.cpu_type = "dedicated".into();
        HetznerConfig {
            token: String::new(),
            locations: vec![
                LocationSpec::new(
                    1,
                    "fsn1",
                    "fsn1-dc14",
                    "Falkenstein",
                    "DE",
                    "eu-central",
                    50.47612,
                    12.370071,
                ),
                LocationSpec::new(
                    2,
                    "nbg1",
                    "nbg1-dc3",
                    "Nuremberg",
                    "DE",
                    "eu-central",
                    49.452102,
                    11.076665,
                ),
                LocationSpec::new(
                    3,
                    "hel1",
                    "hel1-dc2",
                    "Helsinki",
                    "FI",
                    "eu-central",
                    60.169855,
                    24.938379,
                ),
                LocationSpec::new(
                    4,
                    "ash",
                    "ash-dc1",
                    "Ashburn, VA",
                    "US",
                    "us-east",
                    39.045821,
                    -77.487073,
                ),
                LocationSpec::new(
                    5,
                    "hil",
                    "hil-dc1",
                    "Hillsboro, OR",
                    "US",
                    "us-west",
                    45.54222,
                    -122.951924,
                ),
                LocationSpec::new(
                    6,
                    "sin",
                    "sin-dc1",
                    "Singapore",
                    "SG",
                    "ap-southeast",
                    1.283333,
                    103.833333,
                ),
            ],
            server_types: vec![
                ServerTypeSpec::new(1, "cpx11", 2, 2.0, 40),
                ServerTypeSpec::new(2, "cpx21", 3, 4.0, 80),
                cx23,
                cax11,
                ccx13,
            ],
            images: vec![
                ImageSpec::new(161_547_269, "ubuntu-24.04", "ubuntu", "24.04"),
                ImageSpec::new(67_794_396, "ubuntu-22.04", "ubuntu", "22.04"),
                ImageSpec::new(114_690_387, "debian-12", "debian", "12"),
            ],
            default_location: "fsn1".into(),
            server_limit: None,
            first_ipv4: Ipv4Addr::new(203, 0, 113, 10),
            run_schedule: RunSchedule::AfterReads(1),
            delete_schedule: DeleteSchedule::Immediate,
            on_running: None,
            real_proxies: None,
            rate_limit: None,
            legacy_datacenter: false,
        }
    }
}

impl fmt::Debug for HetznerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HetznerConfig")
            .field("token", &"<redacted>")
            .field("locations", &self.locations)
            .field("server_types", &self.server_types)
            .field("images", &self.images)
            .field("default_location", &self.default_location)
            .field("server_limit", &self.server_limit)
            .field("first_ipv4", &self.first_ipv4)
            .field("run_schedule", &self.run_schedule)
            .field("delete_schedule", &self.delete_schedule)
            .field("on_running", &self.on_running.as_ref().map(|_| "<hook>"))
            .field("real_proxies", &self.real_proxies)
            .field("rate_limit", &self.rate_limit)
            .field("legacy_datacenter", &self.legacy_datacenter)
            .finish()
    }
}

/// A running Hetzner emulator on 127.0.0.1. Stops, closing every connection, when dropped.
pub type HetznerEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on an OS-chosen port; ready to answer when this returns.
    ///
    /// Synchronous on purpose: the server runs on its own thread and runtime, so it works
    /// from sync and async tests alike and keeps answering while the test's runtime is
    /// blocked inside a synchronous plugin call.
    pub fn start(config: HetznerConfig) -> HetznerEmulator {
        let (listener, url) = crate::framework::bind(0).expect("bind 127.0.0.1:0");
        let state = Shared::new(Backend::new(config, url));
        let app = Router::new()
            .nest("/v1", crate::framework::gated(api::router(), &state))
            .merge(api::control_extras())
            .fallback(api::unknown_route);
        Served::serve("hetzner-emulator", listener, state, app)
    }

    /// The server as `GET /v1/servers/{id}` would show it, without counting as a read.
    pub fn server(&self, id: &str) -> Option<serde_json::Value> {
        let b = self.lock();
        let sid = parse_id(id)?;
        b.server_json_by_id(sid)
    }

    /// The next `count` calls of `op` answer `error`: for the codes the shared
    /// [`FaultKind`](crate::control::FaultKind)s do not cover, such as `409 conflict`,
    /// `403 forbidden` or `503 unavailable`.
    pub fn inject_error(&self, op: FaultOp, error: HetznerError, count: u32) {
        self.lock().inject_error(op, error, count);
    }

    /// Creation fails inside Hetzner after the API accepted it: the `create_server` action
    /// ends in `error` and the server disappears. Returns false for an unknown server.
    pub fn fail_create(&self, id: &str) -> bool {
        parse_id(id).is_some_and(|n| self.lock().fail_create(n))
    }

    /// An unassigned Primary IP (`auto_delete: false`) in `location`, for a create with
    /// `public_net.ipv4` / `ipv6` set. Returns its ID; `None` for an unknown location.
    pub fn plant_primary_ip(&self, location: &str, ipv6: bool) -> Option<String> {
        self.lock().plant_primary_ip(location, ipv6).map(|id| id.to_string())
    }
}
