//! An emulator of the DigitalOcean API v2 for Droplets, from the vendor's published
//! OpenAPI specification (github.com/digitalocean/openapi, `specification/`).
//!
//! What it serves (`Authorization: Bearer <token>`; `401 unauthorized` otherwise):
//! - `POST /v2/droplets` (one `name`; `names` is refused) -> `202 {droplet, links:
//!   {actions}}`. Names are not unique, as on DigitalOcean: two creates with one name make
//!   two Droplets.
//! - `GET /v2/droplets?page=&per_page=&tag_name=&name=&type=` -> `{droplets, links: {pages},
//!   meta: {total}}`. `per_page` defaults to 20 and is capped at 200; `links.pages` has
//!   `first`/`prev` after the first page and `next`/`last` before the last, as absolute
//!   URLs keeping the filters. `name` matches exactly without regard to case, `tag_name`
//!   too (tags are case stable); they cannot be combined (`400`).
//! - `GET /v2/droplets/{id}`, `DELETE /v2/droplets/{id}` (`204`, no body).
//! - `GET /v2/sizes?page=&per_page=` -> `{sizes, links: {pages}, meta: {total}}`, paged as the
//!   Droplet list (`sizes/sizes_list.yml`, `responses/all_sizes.yml`): every size of
//!   [`DigitalOceanConfig::catalogue`] in slug order, each with every field `size.yml`
//!   requires; `price_hourly` (US dollars, a JSON float), `regions` (where the size can be
//!   created) and `available` are the catalogue's, so a test knows the exact price. A create
//!   of a catalogued size in a region it does not list, or of an unavailable one, answers
//!   `422` "Size is not available in this region." (the message DigitalOcean sends).
//!
//! Every error is `{"id", "message", "request_id"}`, `id` naming the status (`not_found`,
//! `unauthorized`, `too_many_requests`, `unprocessable_entity`, `server_error`,
//! `bad_request`). Every answer carries `ratelimit-limit` (requests per hour),
//! `ratelimit-remaining` and `ratelimit-reset` (Unix time when the oldest counted request
//! expires).
//!
//! # Lifecycle
//!
//! A new Droplet is `new` with only a private (VPC) IPv4 in `networks.v4`; it becomes
//! `active` with a `public` IPv4 from 203.0.113.0/24 (TEST-NET-3) on the [`Schedule`]
//! (default: after the first GET that shows it). `DELETE` removes it at once; a slow delete
//! of the control surface shows it as `archive` until `finish-deletes`. A plugin that takes
//! the private address, or reports `active` without a public one as running, is caught.
//!
//! # Rate limit
//!
//! DigitalOcean allows 5,000 requests an hour and 250 a minute per token. Off by default;
//! [`DigitalOceanConfig::rate_limit`] (or `POST /_emulator/rate-limit`) enforces a token
//! bucket ([`documented_rate_limit`]: 5,000/h, 250 deep, which approximates both windows),
//! past which calls answer `429 too_many_requests` ("API rate limit exceeded.") and do
//! nothing. Without a limit the headers say 5,000 with all of it left.
//!
//! # Control surface
//!
//! The framework's: [`DigitalOceanEmulator`] is [`Served`] over [`Cloud`]`<Do>`. Faults
//! answer as DigitalOcean does: `server-error` 500 `server_error`, `quota` 422
//! `unprocessable_entity` "creating this/these droplet(s) will exceed your droplet limit"
//! (the real message), `rate-limit` 429 `too_many_requests`, `auth` 401 `unauthorized`. The
//! operations are `create` (`POST`), `get` (`GET /v2/droplets/{id}`), `delete` and `list`.
//! `lock` sets `locked`; a `DELETE` of a locked Droplet, or of one being destroyed, answers
//! `422` "Droplet already has a pending event.". A failing scope (region) makes every list
//! whose matches include a Droplet there answer `500 server_error`: the list is global and
//! never short. Plants carry the marks as the plugin's tags (`egress:uid:<escaped>`).
//!
//! # Verified against the specification, and assumed
//!
//! From the specification: paths, methods and status codes (`202` create, `204` delete),
//! the Droplet, networks and region fields, every field `droplet.yml`, `size.yml` and
//! `region.yml` mark required (the size's `memory`, `vcpus`, `disk`, `transfer`,
//! `price_monthly`, `price_hourly`, `regions`, `available`, `description`; the Droplet's own
//! figures are its size's), the image's `distribution` spelled as its enum (`Debian`,
//! `Ubuntu`; `Unknown` otherwise) and its `type` and `status` enums, `status` values, the
//! error body, the three rate-limit headers, the tag charset and length, `per_page` 1-200
//! and `page`, `links.pages` and `meta.total`, `tag_name`/`name` and that they exclude each
//! other, `user_data` as plain text of at most 64 KiB; `GET /v2/sizes` with `per_page` and
//! `page` (`sizes/sizes_list.yml`), its `sizes`/`links`/`meta` answer
//! (`sizes/responses/all_sizes.yml`) and the size's `price_hourly` as a float in US dollars,
//! `regions` as the slugs it can be created in and `available` (default true)
//! (`sizes/models/size.yml`, github.com/digitalocean/openapi at 7c1300c4). From public
//! captures: the droplet-limit 422 and "Size is not available in this region.". From
//! DigitalOcean's price list, not the specification: the sizes' figures and prices, the
//! hourly price being a 672-hour month's share (as in the specification's example). The
//! sizes route, like every route here, wants the token (the specification's security is
//! `bearer_auth` with `sizes:read`). Assumed: the other 422 messages, the image's dates and sizes,
//! the 400 for bad paging parameters and combined filters, capping `per_page` rather than
//! refusing it, a 404 for non-numeric IDs, the pending-event 422 for locked Droplets, no
//! `Retry-After` on a 429.

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::{FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{
    Adapter, Cloud, Deletion, Effect, Fleet, Record, Schedule, Served, Shared, States,
};
use crate::rate_limit::Limiter;
use crate::real_proxy::RealProxies;

/// The token the emulator binary accepts.
pub const EMULATOR_TOKEN: &str = "emulator-token";
/// DigitalOcean's documented limit per token: 5,000 requests an hour.
pub const REQUESTS_PER_HOUR: u32 = 5000;
/// ... and 250 a minute, the deepest burst the hourly bucket may allow.
pub const REQUESTS_PER_MINUTE: u32 = 250;
/// `user_data` is plain text of at most 64 KiB.
pub const USER_DATA_MAX: usize = 64 * 1024;
/// The droplet-limit answer, as captured from the real API.
pub const DROPLET_LIMIT: &str = "creating this/these droplet(s) will exceed your droplet limit";
const PENDING_EVENT: &str = "Droplet already has a pending event.";

/// DigitalOcean's documented limit as the emulator's token bucket.
pub fn documented_rate_limit() -> RateLimit {
    RateLimit { per_hour: REQUESTS_PER_HOUR, burst: REQUESTS_PER_MINUTE }
}

/// Everything configurable; `DigitalOceanConfig::new(token)` gives the defaults.
#[derive(Clone, Debug)]
pub struct DigitalOceanConfig {
    pub token: String,
    /// Region slugs; a create without `region` goes to the first.
    pub regions: Vec<String>,
    pub sizes: Vec<String>,
    /// Image ID and slug; a create names either.
    pub images: Vec<(u64, String)>,
    /// `GET /v2/sizes`: prices and where each size is offered. The default lists every size
    /// of `sizes` (and the other Basic sizes) in every region, at a 672-hour month's share of
    /// DigitalOcean's monthly price.
    pub catalogue: Vec<SizeOffer>,
    /// Creates beyond this many Droplets answer the droplet-limit 422.
    pub droplet_limit: Option<usize>,
    pub schedule: Schedule,
    pub rate_limit: Option<RateLimit>,
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl DigitalOceanConfig {
    pub fn new(token: impl Into<String>) -> Self {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let regions = s(&["nyc1", "nyc3", "sfo3", "ams3", "fra1", "lon1", "sgp1"]);
        let catalogue = BASIC
            .iter()
            .map(|(slug, .., monthly)| SizeOffer::new(slug, monthly / 672.0, &regions))
            .collect();
        DigitalOceanConfig {
            token: token.into(),
            regions,
            sizes: s(&["s-1vcpu-512mb-10gb", "s-1vcpu-1gb", "s-2vcpu-2gb"]),
            catalogue,
            images: vec![
                (165_064_040, "debian-12-x64".into()),
                (165_064_077, "ubuntu-24-04-x64".into()),
            ],
            droplet_limit: None,
            schedule: Schedule::AfterReads(1),
            rate_limit: None,
            real_proxies: None,
        }
    }
}

/// A size of the catalogue `GET /v2/sizes` shows.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeOffer {
    pub slug: String,
    /// US dollars an hour, sent as it is (a JSON float).
    pub price_hourly: f64,
    /// Region slugs where the size can be created.
    pub regions: Vec<String>,
    pub available: bool,
}

impl SizeOffer {
    pub fn new(slug: &str, price_hourly: f64, regions: &[impl AsRef<str>]) -> Self {
        let regions = regions.iter().map(|r| r.as_ref().to_string()).collect();
        SizeOffer { slug: slug.into(), price_hourly, regions, available: true }
    }
}

/// DigitalOcean's error answer.
#[derive(Debug, Clone)]
pub struct DoError {
    pub status: StatusCode,
    pub id: String,
    pub message: String,
}

impl DoError {
    pub fn new(status: u16, id: &str, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        DoError { status, id: id.into(), message: message.into() }
    }

    fn body(&self) -> Value {
        json!({"id": self.id, "message": self.message, "request_id": "00000000-0000-4000-8000-000000000000"})
    }

    fn not_found() -> Self {
        DoError::new(404, "not_found", "The resource you requested could not be found.")
    }

    fn unprocessable(message: impl Into<String>) -> Self {
        DoError::new(422, "unprocessable_entity", message)
    }

    fn bad_request(message: impl Into<String>) -> Self {
        DoError::new(400, "bad_request", message)
    }
}

impl IntoResponse for DoError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<DoError> for Refusal {
    fn from(e: DoError) -> Refusal {
        Refusal { status: e.status.as_u16(), body: e.body() }
    }
}

/// What a Droplet holds beyond the framework's record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extra {
    pub size: String,
    pub image: (u64, String),
    /// Exactly as created (marks included).
    pub tags: Vec<String>,
    pub private_ip: String,
}

/// DigitalOcean's side of the framework.
pub struct Do {
    config: DigitalOceanConfig,
    url: String,
    private: u64,
}

impl Do {
    fn extra(&mut self, size: String, image: (u64, String), tags: Vec<String>) -> Extra {
        self.private += 1;
        let n = self.private;
        Extra { size, image, tags, private_ip: format!("10.110.{}.{}", n / 250 % 250, n % 250 + 2) }
    }

    fn image(&self, v: &Value) -> Option<(u64, String)> {
        self.config
            .images
            .iter()
            .find(|(id, slug)| v.as_str() == Some(slug) || v.as_u64() == Some(*id))
            .cloned()
    }
}

impl Adapter for Do {
    type Extra = Extra;
    type Error = DoError;
    const STATES: States = States { provisioning: "new", running: "active", deleting: "archive" };

    fn id(&self, n: u64) -> String {
        (300_000_000 + n).to_string()
    }

    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", 10 + (n - 1) % 240)
    }

    fn default_scope(&self) -> String {
        self.config.regions[0].clone()
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Extra, DoError> {
        if !self.config.regions.iter().any(|r| r == scope) {
            return Err(DoError::unprocessable(
                "You specified an invalid region for Droplet creation.",
            ));
        }
        if !is_name(&plant.name) {
            return Err(DoError::unprocessable(NAME_RULE));
        }
        let tags =
            crate::framework::marks(plant).iter().filter_map(|(k, v)| tags::encode(k, v)).collect();
        let private_ip = format!("10.111.0.{}", plant.name.len() % 250 + 2);
        let image = self.config.images[0].clone();
        Ok(Extra { size: self.config.sizes[0].clone(), image, tags, private_ip })
    }

    fn name_taken(&self) -> DoError {
        // Only plants refuse a taken name (the framework's rule); the API does not.
        DoError::unprocessable("a Droplet with this name exists (emulator control surface)")
    }

    fn fault(&self, kind: &FaultKind) -> DoError {
        match kind {
            FaultKind::Quota => DoError::unprocessable(DROPLET_LIMIT),
            FaultKind::RateLimit => rate_limited(),
            FaultKind::Auth => unauthorized(),
            FaultKind::ServerError | FaultKind::Slow { .. } => server_error(),
        }
    }

    /// `GET /v2/sizes` is no instance operation: only `any` faults reach it.
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let rest = path.strip_prefix("/v2/droplets");
        let op = match (method.as_str(), rest) {
            ("POST", Some("")) => Some(FaultOp::Create),
            ("GET", Some("")) => Some(FaultOp::List),
            ("GET", Some(r)) if r.starts_with('/') => Some(FaultOp::Get),
            ("DELETE", Some(r)) if r.starts_with('/') => Some(FaultOp::Delete),
            _ => None,
        };
        let route = if path.starts_with("/v2/droplets/") { "/v2/droplets/{id}" } else { path };
        (op, format!("{method} {route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("Bearer {}", self.config.token);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> DoError {
        unauthorized()
    }

    fn rate_limited(&self, _limit: RateLimit) -> DoError {
        rate_limited()
    }

    fn decorate(&self, resp: &mut Response, bucket: Option<&mut Limiter>) {
        let now = Instant::now();
        let (limit, left, full_in) = match bucket {
            Some(l) => {
                (u64::from(l.spec().per_hour), l.remaining(now), l.until_full(now).as_secs())
            }
            None => (u64::from(REQUESTS_PER_HOUR), u64::from(REQUESTS_PER_HOUR), 0),
        };
        let reset = crate::time::now_secs() + full_in;
        let h = resp.headers_mut();
        for (name, value) in
            [("ratelimit-limit", limit), ("ratelimit-remaining", left), ("ratelimit-reset", reset)]
        {
            h.insert(name, HeaderValue::from(value));
        }
    }
}

fn unauthorized() -> DoError {
    DoError::new(401, "unauthorized", "Unable to authenticate you.")
}

fn rate_limited() -> DoError {
    DoError::new(429, "too_many_requests", "API rate limit exceeded.")
}

fn server_error() -> DoError {
    DoError::new(500, "server_error", "Unexpected server-side error")
}

const NAME_RULE: &str = "Name Only valid hostname characters are allowed. (a-z, A-Z, 0-9, . and -)";

/// The specification's name pattern `^[a-zA-Z0-9]?[a-z0-9A-Z.\-]*[a-z0-9A-Z]$`, at most 255.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=255).contains(&b.len())
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-'))
}

/// The specification's tag pattern `^[a-zA-Z0-9_\-\:]+$`, at most 255.
fn is_tag(s: &str) -> bool {
    (1..=255).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'))
}

/// The contract's marks as the digitalocean plugin writes them (docs/providers/digitalocean.md):
/// `egress:<name>:<value>`, both escaped to `[a-z0-9-]` plus `_xx` for every other byte.
pub mod tags {
    use crate::MARK_PREFIX;

    fn escape(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
                _ => format!("_{b:02x}"),
            })
            .collect()
    }

    fn unescape(s: &str) -> Option<String> {
        let (mut out, mut rest) = (Vec::new(), s.as_bytes());
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'_' {
                let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &tail[2..];
            } else {
                out.push(b);
                rest = tail;
            }
        }
        String::from_utf8(out).ok()
    }

    /// The tag of a mark; `None` for a key that is not the operator's.
    pub fn encode(key: &str, value: &str) -> Option<String> {
        let name = key.strip_prefix(MARK_PREFIX)?;
        Some(format!("egress:{}:{}", escape(name), escape(value)))
    }

    /// The mark a tag stands for; `None` for other tags.
    pub fn decode(tag: &str) -> Option<(String, String)> {
        let t = tag.to_ascii_lowercase();
        let (name, value) = t.strip_prefix("egress:")?.split_once(':')?;
        Some((format!("{MARK_PREFIX}{}", unescape(name)?), unescape(value)?))
    }
}

type Backend = Cloud<Do>;

/// A running DigitalOcean emulator on 127.0.0.1. Stops, closing every connection, when
/// dropped.
pub type DigitalOceanEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on an OS-chosen port. Synchronous: the server has its own thread and runtime.
    pub fn start(config: DigitalOceanConfig) -> DigitalOceanEmulator {
        Self::start_on_port(config, 0).expect("bind 127.0.0.1:0")
    }

    /// Start on `127.0.0.1:port` (0: OS-chosen).
    pub fn start_on_port(
        config: DigitalOceanConfig,
        port: u16,
    ) -> std::io::Result<DigitalOceanEmulator> {
        let (listener, url) = crate::framework::bind(port)?;
        let fleet = Fleet::new(Do::STATES, config.schedule, config.real_proxies.clone());
        let limit = config.rate_limit;
        let state = Shared::new(Cloud::new(Do { config, url, private: 0 }, fleet, limit));
        let api = Router::new()
            .route("/v2/droplets", get(list_droplets).post(create_droplet))
            .route("/v2/droplets/{id}", get(get_droplet).delete(delete_droplet))
            .route("/v2/sizes", get(list_sizes))
            .fallback(unknown);
        let app = crate::framework::gated(api, &state).fallback(unknown);
        Ok(Served::serve("digitalocean-emulator", listener, state, app))
    }

    /// The Droplet as `GET /v2/droplets/{id}` shows it, without counting as a read.
    pub fn droplet(&self, id: &str) -> Option<Value> {
        let b = self.lock();
        b.fleet.get(id).map(|r| render(&b.backend, r))
    }

    /// The next `count` calls of `op` answer `error`, for answers the shared fault kinds do
    /// not cover (a size out of stock, a 403).
    pub fn inject_error(&self, op: FaultOp, error: DoError, count: u32) {
        self.lock().traffic.faults.push(op, Effect::fail(error), count);
    }
}

async fn unknown() -> Response {
    DoError::not_found().into_response()
}

/// DigitalOcean's Basic Droplets: slug, memory (MiB), vCPUs, disk (GB), transfer (TB) and
/// the monthly price (USD).
const BASIC: [(&str, u64, u64, u64, f64, f64); 5] = [
    ("s-1vcpu-512mb-10gb", 512, 1, 10, 0.5, 4.0),
    ("s-1vcpu-1gb", 1024, 1, 25, 1.0, 6.0),
    ("s-1vcpu-2gb", 2048, 1, 50, 2.0, 12.0),
    ("s-2vcpu-2gb", 2048, 2, 60, 3.0, 18.0),
    ("s-2vcpu-4gb", 4096, 2, 80, 4.0, 24.0),
];

/// A size's figures: memory (MiB), vCPUs, disk (GB), transfer (TB) and the monthly price
/// (USD) of DigitalOcean's Basic Droplets; a slug not in the table gets its vCPUs and memory
/// read from the slug (`s-2vcpu-4gb`) and the smallest size's other figures.
fn size_figures(slug: &str) -> (u64, u64, u64, f64, f64) {
    if let Some(&(_, memory, vcpus, disk, transfer, monthly)) = BASIC.iter().find(|s| s.0 == slug) {
        return (memory, vcpus, disk, transfer, monthly);
    }
    let part =
        |suffix: &str| slug.split('-').find_map(|p| p.strip_suffix(suffix)?.parse::<u64>().ok());
    let memory = part("gb").map(|g| g * 1024).or_else(|| part("mb")).unwrap_or(512);
    (memory.max(8) / 8 * 8, part("vcpu").unwrap_or(1), 10, 0.5, 4.0)
}

/// The `distribution` of a base image, from its slug, as the specification's enum spells it
/// (`shared/attributes/distribution.yml`: `Debian`, `Ubuntu`, ...; anything else `Unknown`).
fn distribution(slug: &str) -> &'static str {
    match slug.split('-').next().unwrap_or_default() {
        "debian" => "Debian",
        "ubuntu" => "Ubuntu",
        "centos" => "CentOS",
        "fedora" => "Fedora",
        "rockylinux" => "Rocky Linux",
        "freebsd" => "FreeBSD",
        _ => "Unknown",
    }
}

/// A Droplet as the API renders it: every field the specification's `droplet.yml`,
/// `size.yml` and `region.yml` require.
fn render(d: &Do, r: &Record<Extra>) -> Value {
    let mut v4 = vec![
        json!({"ip_address": r.extra.private_ip, "netmask": "255.255.240.0", "gateway": null, "type": "private"}),
    ];
    if let Some(ip) = &r.ip {
        v4.push(json!({"ip_address": ip, "netmask": "255.255.255.0", "gateway": "203.0.113.1", "type": "public"}));
    }
    let (image_id, slug) = &r.extra.image;
    let (memory, vcpus, disk, ..) = size_figures(&r.extra.size);
    json!({
        "id": r.id.parse::<u64>().unwrap_or_default(),
        "name": r.name, "memory": memory, "vcpus": vcpus, "disk": disk, "locked": r.locked, "status": r.state,
        "kernel": null, "created_at": crate::time::rfc3339(r.created_at), "features": ["droplet_agent"],
        "backup_ids": [], "next_backup_window": null, "snapshot_ids": [], "volume_ids": [],
        "image": {"id": image_id, "name": slug, "distribution": distribution(slug), "slug": slug,
                  "public": true, "regions": d.config.regions, "type": "base", "status": "available",
                  "created_at": "2024-06-11T15:44:23Z", "min_disk_size": 7, "size_gigabytes": 0.94,
                  "description": "", "tags": [], "error_message": ""},
        "size": size_json(d, &r.extra.size),
        "size_slug": r.extra.size,
        "networks": {"v4": v4, "v6": []},
        "region": {"name": r.scope.to_uppercase(), "slug": r.scope, "available": true,
                   "features": ["metadata", "install_agent"], "sizes": d.config.sizes},
        "tags": r.extra.tags,
        "vpc_uuid": "760e09ef-dc84-11e8-981e-3cfdfeaae000",
    })
}

/// A size as `size.yml` describes it: the catalogue's price, regions and availability when it
/// lists the size (for a size it does not, every region, at a 672-hour month's share of the
/// monthly price: DigitalOcean bills by the hour at that rate, as the reference's example
/// shows, 5.0 a month and 0.00743999984115362 an hour), the figures of [`size_figures`].
fn size_json(d: &Do, slug: &str) -> Value {
    let (memory, vcpus, disk, transfer, monthly) = size_figures(slug);
    let offer = d.config.catalogue.iter().find(|o| o.slug == slug);
    let offer =
        offer.cloned().unwrap_or_else(|| SizeOffer::new(slug, monthly / 672.0, &d.config.regions));
    json!({"slug": slug, "memory": memory, "vcpus": vcpus, "disk": disk, "transfer": transfer,
           "price_monthly": monthly, "price_hourly": offer.price_hourly, "regions": offer.regions,
           "available": offer.available, "description": "Basic",
           "disk_info": [{"type": "local", "size": {"amount": disk, "unit": "gib"}}]})
}

#[derive(Deserialize)]
struct CreateBody {
    name: Option<String>,
    names: Option<Vec<String>>,
    region: Option<String>,
    size: Option<String>,
    image: Option<Value>,
    user_data: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
}

async fn create_droplet(
    State(state): State<Shared<Backend>>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Response {
    let Ok(Json(body)) = body else {
        return DoError::bad_request("error parsing request body").into_response();
    };
    let mut b = state.lock();
    let record = match check_create(&mut b, body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let record = b.create(record);
    let n = b.fleet.iter().count();
    let href = format!("{}/v2/actions/{}", b.backend.url, record.id);
    let links = json!({"actions": [{"id": n, "rel": "create", "href": href}]});
    (StatusCode::ACCEPTED, Json(json!({"droplet": render(&b.backend, &record), "links": links})))
        .into_response()
}

/// The checks of a create, in the order the API reports them, and the new record.
fn check_create(b: &mut Backend, body: CreateBody) -> Result<Record<Extra>, DoError> {
    if body.names.is_some() {
        return Err(DoError::unprocessable(
            "the emulator creates one Droplet per request: send name",
        ));
    }
    let name = body.name.filter(|n| is_name(n)).ok_or_else(|| DoError::unprocessable(NAME_RULE))?;
    let c = &b.backend.config;
    let region = body.region.unwrap_or_else(|| c.regions[0].clone());
    if !c.regions.contains(&region) {
        return Err(DoError::unprocessable(
            "You specified an invalid region for Droplet creation.",
        ));
    }
    let size = body.size.filter(|s| c.sizes.contains(s));
    let size = size.ok_or_else(|| {
        DoError::unprocessable("You specified an invalid size for Droplet creation.")
    })?;
    let offer = c.catalogue.iter().find(|o| o.slug == size);
    if offer.is_some_and(|o| !o.available || !o.regions.contains(&region)) {
        return Err(DoError::unprocessable("Size is not available in this region."));
    }
    let image = body.image.and_then(|i| b.backend.image(&i));
    let image = image.ok_or_else(|| {
        DoError::unprocessable("You specified an invalid image for Droplet creation.")
    })?;
    let user_data = body.user_data.unwrap_or_default();
    if user_data.len() > USER_DATA_MAX {
        return Err(DoError::unprocessable("user_data must not exceed 64 KiB"));
    }
    let tags = body.tags.unwrap_or_default();
    if let Some(bad) = tags.iter().find(|t| !is_tag(t)) {
        return Err(DoError::unprocessable(format!(
            "tag name {bad:?} is invalid: only letters, numbers, colons, dashes and underscores, at most 255"
        )));
    }
    if c.droplet_limit.is_some_and(|max| b.fleet.iter().count() >= max) {
        return Err(DoError::unprocessable(DROPLET_LIMIT));
    }
    let labels = tags.iter().filter_map(|t| tags::decode(t)).collect();
    let extra = b.backend.extra(size, image, tags);
    let mut record = Record::new(b.new_id(), name, region, extra);
    record.labels = labels;
    record.user_data = user_data.into_bytes();
    Ok(record)
}

#[derive(Deserialize)]
struct ListQuery {
    page: Option<String>,
    per_page: Option<String>,
    tag_name: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

fn positive(v: Option<&str>, default: u64, field: &str) -> Result<u64, DoError> {
    match v {
        None => Ok(default),
        Some(s) => s
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| DoError::bad_request(format!("{field} must be a positive integer"))),
    }
}

async fn list_droplets(
    State(state): State<Shared<Backend>>,
    Query(q): Query<ListQuery>,
) -> Response {
    match list(&state.lock(), q) {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn list(b: &Backend, q: ListQuery) -> Result<Value, DoError> {
    let page = positive(q.page.as_deref(), 1, "page")?;
    let per_page = positive(q.per_page.as_deref(), 20, "per_page")?.min(200);
    if q.tag_name.is_some() && (q.name.is_some() || q.kind.is_some()) {
        return Err(DoError::bad_request("tag_name cannot be combined with name or type"));
    }
    let gpus = q.kind.as_deref() == Some("gpus");
    let matched: Vec<&Record<Extra>> = b
        .fleet
        .iter()
        .filter(|_| !gpus)
        .filter(|r| q.name.as_ref().is_none_or(|n| r.name.eq_ignore_ascii_case(n)))
        .filter(|r| {
            q.tag_name
                .as_ref()
                .is_none_or(|t| r.extra.tags.iter().any(|x| x.eq_ignore_ascii_case(t)))
        })
        .collect();
    if let Some(down) = b.fleet.failing_scope(matched.iter().map(|r| r.scope.as_str())) {
        let mut e = server_error();
        e.message = format!("Unexpected server-side error (region {down} unavailable)");
        return Err(e);
    }
    let mut filters = String::new();
    for (k, v) in [("tag_name", &q.tag_name), ("name", &q.name), ("type", &q.kind)] {
        if let Some(v) = v {
            filters.push_str(&format!("&{k}={}", encode(v)));
        }
    }
    let droplets: Vec<Value> = matched.iter().map(|r| render(&b.backend, r)).collect();
    let base = format!("{}/v2/droplets", b.backend.url);
    Ok(page_of("droplets", droplets, page, per_page, &base, &filters))
}

/// Page `page` of `items` under `key`, with `links.pages` (`first`/`prev` after the first
/// page, `next`/`last` before the last, absolute URLs keeping `filters`) and `meta.total`.
fn page_of(
    key: &str,
    items: Vec<Value>,
    page: u64,
    per_page: u64,
    base: &str,
    filters: &str,
) -> Value {
    let total = items.len() as u64;
    let last = total.div_ceil(per_page).max(1);
    let link = |n: u64| format!("{base}?page={n}&per_page={per_page}{filters}");
    let mut pages = serde_json::Map::new();
    if page > 1 {
        pages.insert("first".into(), link(1).into());
        pages.insert("prev".into(), link((page - 1).min(last)).into());
    }
    if page < last {
        pages.insert("next".into(), link(page + 1).into());
        pages.insert("last".into(), link(last).into());
    }
    let start = ((page - 1) * per_page) as usize;
    let items: Vec<Value> = items.into_iter().skip(start).take(per_page as usize).collect();
    json!({key: items, "links": {"pages": pages}, "meta": {"total": total}})
}

/// `GET /v2/sizes`: the catalogue in slug order, paged as the Droplet list.
async fn list_sizes(State(state): State<Shared<Backend>>, Query(q): Query<ListQuery>) -> Response {
    let b = state.lock();
    let paging = positive(q.page.as_deref(), 1, "page")
        .and_then(|p| Ok((p, positive(q.per_page.as_deref(), 20, "per_page")?.min(200))));
    let (page, per_page) = match paging {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut slugs: Vec<&str> = b.backend.config.catalogue.iter().map(|o| o.slug.as_str()).collect();
    slugs.sort_unstable();
    let sizes = slugs.into_iter().map(|s| size_json(&b.backend, s)).collect();
    let base = format!("{}/v2/sizes", b.backend.url);
    Json(page_of("sizes", sizes, page, per_page, &base, "")).into_response()
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Droplet IDs are positive integers; anything else names no Droplet.
fn droplet_id(id: &str) -> Option<&str> {
    (!id.is_empty() && !id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

async fn get_droplet(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    let mut b = state.lock();
    let Some(r) = droplet_id(&id).and_then(|id| b.fleet.get(id)) else {
        return DoError::not_found().into_response();
    };
    let (v, id) = (render(&b.backend, r), r.id.clone());
    // The first GET shows `new`; the next one finds it `active`, like a fast cloud.
    b.saw(&id);
    Json(json!({"droplet": v})).into_response()
}

async fn delete_droplet(State(state): State<Shared<Backend>>, Path(id): Path<String>) -> Response {
    let Some(id) = droplet_id(&id) else {
        return DoError::not_found().into_response();
    };
    match state.lock().fleet.delete(id) {
        Deletion::NotFound => DoError::not_found().into_response(),
        Deletion::Locked | Deletion::InProgress(_) => {
            DoError::unprocessable(PENDING_EVENT).into_response()
        }
        Deletion::Done(_) => {
            (StatusCode::NO_CONTENT, [("content-type", "application/json; charset=utf-8")])
                .into_response()
        }
    }
}
