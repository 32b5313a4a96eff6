//! An emulator of the Linode API v4 (`/v4/linode/instances`), from Akamai's published
//! OpenAPI spec (linode/linode-api-docs, `openapi.yaml`) and its rate-limit reference
//! (techdocs.akamai.com/linode-api/reference/rate-limits), for `providers-wasm/linode`.
//!
//! API (under `Authorization: Bearer <token>`; otherwise 401 `Invalid Token`). Every error
//! is `{"errors": [{"reason": ..., "field": ...}]}`, `field` only when a request field is
//! at fault.
//! - `POST /v4/linode/instances` `{label, region, type, image, root_pass, booted, tags,
//!   metadata: {user_data}, authorized_keys, firewall_id}` -> 200 and the Linode, status
//!   `provisioning`. `region` and `type` are required and checked against the config;
//!   `root_pass` is required with an `image` (7-128 characters, and refused as weak when
//!   short or of one character class); each tag 3-50 characters; `metadata.user_data` is
//!   base64 of at most 65,535 bytes and only in a region with the Metadata capability;
//!   a label is unique per account (`Label must be unique among your Linodes`).
//! - `GET /v4/linode/instances?page=&page_size=` with an optional `X-Filter` header ->
//!   `{data, page, pages, results}`, by id. `page_size` 25-500 (default 100). Filters:
//!   `label`, `region`, `id`, `tags` (a Linode matches when one tag equals the value),
//!   values plain or `{"+contains": ..}` / `{"+neq": ..}`, combined with `+and` / `+or`;
//!   any other field is a 400 on `X-Filter`. A match in a failing scope answers 500.
//! - `GET /v4/linode/instances/{id}` -> the Linode; 404 `Not found` when gone. A new
//!   Linode reads `provisioning`, then `booting`, then `running` with its IPv4 (with
//!   [`Schedule::AfterReads`]`(2)`, the default), as the API documents.
//! - `DELETE /v4/linode/instances/{id}` -> 200 `{}`; 400 `Linode busy.` while locked (a
//!   job holds it); 404 `Not found`. A delete already in progress answers 200 again.
//!
//! Faults answer as Linode does (reasons captured from real answers): `server-error` 500
//! `Internal server error`, `quota` 400 `Account Limit reached. Please open a support
//! ticket.`, `rate-limit` 429 `Too Many Requests` with `Retry-After`, `auth` 401 `Invalid
//! Token`. Every answer carries `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix
//! seconds): the enforced general limit when one is set through the control surface, the
//! documented 1,600 a minute otherwise. With [`LinodeConfig::create_limit`] the dedicated
//! limit of `POST /linode/instances` (20 per 15 s) is enforced too, answering 429 with its
//! own headers. Validation reasons other than the captured ones are paraphrases.
//!
//! Tags are how the plugin writes the contract's marks (`egress-managed`,
//! `egress-uid:<uid>`, `egress-inst:<installation>`); the emulator decodes them into the
//! dump's labels, and writes them for planted instances, so the control surface speaks
//! the contract's marks while the API speaks tags.

mod api;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use data_encoding::BASE32_NOPAD;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::control::{FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{Adapter, Cloud, Fleet, Schedule, Served, Shared, States, marks};
use crate::rate_limit::Limiter;
use crate::real_proxy::RealProxies;

/// The documented general limit (requests a minute), sent when none is enforced.
pub const GENERAL_LIMIT_PER_MINUTE: u64 = 1600;
/// The dedicated limit of `POST /linode/instances`: 20 requests per 15 seconds.
pub const CREATE_LIMIT: RateLimit = RateLimit { per_hour: 20 * 4 * 60, burst: 20 };
/// The largest `metadata.user_data`, before base64.
pub const USER_DATA_MAX: usize = 65_535;

/// The managed-mark tag, and the prefixes of the uid and installation tags.
pub const TAG_MANAGED: &str = "egress-managed";
pub const TAG_UID: &str = "egress-uid:";
pub const TAG_INSTALLATION: &str = "egress-inst:";

/// What one emulator accepts.
#[derive(Clone)]
pub struct LinodeConfig {
    pub token: String,
    /// Regions a create may name; the first is where a plant without a scope goes.
    pub regions: Vec<String>,
    /// Regions with the Metadata capability (user data).
    pub metadata_regions: Vec<String>,
    pub types: Vec<String>,
    /// `GET /v4/linode/types/{typeId}`'s prices.
    pub prices: Vec<TypePrice>,
    /// When a new Linode runs by itself.
    pub schedule: Schedule,
    /// Enforce the dedicated create limit (off by default: tests create far faster than
    /// the real API allows, as the host's shipped budgets are off in tests).
    pub create_limit: bool,
    /// The general limit, as `POST /_emulator/rate-limit` sets it.
    pub rate_limit: Option<RateLimit>,
    /// Real-proxy mode: a running Linode gets a real proxy on 127.0.0.1.
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl LinodeConfig {
    pub fn new(token: impl Into<String>) -> Self {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        LinodeConfig {
            token: token.into(),
            regions: s(&["us-east", "eu-central", "se-sto", "us-southeast"]),
            // us-southeast stands for a region without Metadata.
            metadata_regions: s(&["us-east", "eu-central", "se-sto"]),
            types: s(&["g6-nanode-1", "g6-standard-1"]),
            // Linode's published prices (techdocs "List types"): Jakarta and Sao Paulo
            // are priced apart.
            prices: vec![
                TypePrice::new("g6-nanode-1", 0.0075, &[("id-cgk", 0.009), ("br-gru", 0.0105)]),
                TypePrice::new("g6-standard-1", 0.018, &[("id-cgk", 0.0216)]),
            ],
            schedule: Schedule::AfterReads(2),
            create_limit: false,
            rate_limit: None,
            real_proxies: None,
        }
    }
}

/// A Linode type's price: dollars an hour, and the regions priced apart with theirs.
#[derive(Clone, Debug)]
pub struct TypePrice {
    pub linode_type: String,
    pub hourly: f64,
    pub regions: Vec<(String, f64)>,
}

impl TypePrice {
    pub fn new(linode_type: &str, hourly: f64, regions: &[(&str, f64)]) -> Self {
        TypePrice {
            linode_type: linode_type.into(),
            hourly,
            regions: regions.iter().map(|(r, h)| (r.to_string(), *h)).collect(),
        }
    }
}

/// Linode's error answer: a status and one `{reason, field}`.
#[derive(Debug, Clone, PartialEq)]
pub struct LinodeError {
    pub status: u16,
    pub reason: String,
    pub field: Option<String>,
    /// `Retry-After` seconds, for a 429.
    pub retry_after: Option<u64>,
}

impl LinodeError {
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        LinodeError { status, reason: reason.into(), field: None, retry_after: None }
    }

    pub fn field(status: u16, field: &str, reason: impl Into<String>) -> Self {
        LinodeError { field: Some(field.into()), ..Self::new(status, reason) }
    }

    pub fn not_found() -> Self {
        Self::new(404, "Not found")
    }

    pub fn too_many(retry_after: u64) -> Self {
        LinodeError { retry_after: Some(retry_after), ..Self::new(429, "Too Many Requests") }
    }

    pub fn body(&self) -> serde_json::Value {
        match &self.field {
            Some(f) => json!({"errors": [{"reason": self.reason, "field": f}]}),
            None => json!({"errors": [{"reason": self.reason}]}),
        }
    }
}

impl IntoResponse for LinodeError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            let h = resp.headers_mut();
            h.insert("retry-after", HeaderValue::from(secs));
            h.insert("x-ratelimit-remaining", HeaderValue::from(0));
        }
        resp
    }
}

impl From<LinodeError> for Refusal {
    fn from(e: LinodeError) -> Refusal {
        Refusal { status: e.status, body: e.body() }
    }
}

/// What a Linode holds beyond the framework's record.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    pub linode_type: String,
    pub image: String,
    /// The tags as the API shows them.
    pub tags: Vec<String>,
    /// The root password the create sent (the emulator, like the cloud, sees it).
    pub root_pass: String,
    pub authorized_keys: Vec<String>,
    pub firewall_id: Option<u64>,
    /// A read has shown it `provisioning`; the next shows `booting`.
    booting: bool,
}

/// The Linode side of the framework: its configuration, state names, ids and answers.
pub struct Linode {
    cfg: LinodeConfig,
    create_bucket: Option<Limiter>,
}

impl Linode {
    /// The dedicated create limit: `Err` with the 429 when it is spent.
    fn take_create(&mut self) -> Result<(), LinodeError> {
        let Some(bucket) = self.create_bucket.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        if bucket.take(now) {
            return Ok(());
        }
        Err(LinodeError::too_many(bucket.until_full(now).as_secs().max(1)))
    }

    /// The create limit's headers, on the create's own answer.
    fn create_headers(&mut self, resp: &mut Response) {
        if let Some(b) = self.create_bucket.as_mut() {
            let now = Instant::now();
            let reset = crate::time::now_secs() + b.until_full(now).as_secs();
            let h = resp.headers_mut();
            h.insert("x-ratelimit-limit", HeaderValue::from(b.spec().burst));
            h.entry("x-ratelimit-remaining").or_insert(HeaderValue::from(b.remaining(now)));
            h.insert("x-ratelimit-reset", HeaderValue::from(reset));
        }
    }
}

/// The tag value of an installation: as the plugin writes it (verbatim when it fits,
/// else hashed), so planted instances carry the tag the plugin filters on.
pub fn installation_value(installation: &str) -> String {
    let fits = !installation.is_empty()
        && installation.len() + TAG_INSTALLATION.len() <= 50
        && installation.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
        });
    if fits {
        return installation.to_string();
    }
    let digest = Sha256::digest(installation.as_bytes());
    let encoded = BASE32_NOPAD.encode(&digest[..15]).to_ascii_lowercase();
    format!("sha256-{encoded}")
}

/// The tags that carry the contract's marks.
pub fn mark_tags(marks: &[(String, String)]) -> Vec<String> {
    let tag = |(k, v): &(String, String)| match k.as_str() {
        crate::MARK_MANAGED => TAG_MANAGED.to_string(),
        crate::MARK_UID => format!("{TAG_UID}{v}"),
        _ => format!("{TAG_INSTALLATION}{}", installation_value(v)),
    };
    marks.iter().map(tag).collect()
}

/// The contract's marks a Linode's tags carry (the installation as its tag value).
pub fn tag_marks(tags: &[String]) -> Vec<(String, String)> {
    let mark = |t: &String| {
        if t == TAG_MANAGED {
            return Some((crate::MARK_MANAGED.into(), crate::MARK_MANAGED_YES.into()));
        }
        if let Some(uid) = t.strip_prefix(TAG_UID) {
            return Some((crate::MARK_UID.into(), uid.into()));
        }
        let inst = t.strip_prefix(TAG_INSTALLATION)?;
        Some((crate::MARK_INSTALLATION.into(), inst.into()))
    };
    tags.iter().filter_map(mark).collect()
}

/// Linode's label rules: 3-64 characters, starting with a letter, of letters, digits,
/// `-`, `_` and `.`, never two of those in a row, ending alphanumeric.
pub fn valid_label(s: &str) -> bool {
    let b = s.as_bytes();
    (3..=64).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && !["--", "__", ".."].iter().any(|d| s.contains(d))
}

impl Adapter for Linode {
    type Extra = Extra;
    type Error = LinodeError;
    const STATES: States =
        States { provisioning: "provisioning", running: "running", deleting: "deleting" };

    fn id(&self, n: u64) -> String {
        (40_000_000 + n).to_string()
    }

    fn address(&self, n: u64) -> String {
        format!("203.0.113.{}", n % 250 + 1)
    }

    fn default_scope(&self) -> String {
        self.cfg.regions.first().cloned().unwrap_or_default()
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Extra, LinodeError> {
        if !valid_label(&plant.name) {
            return Err(LinodeError::field(400, "label", "Label is invalid"));
        }
        if !self.cfg.regions.iter().any(|r| r == scope) {
            return Err(LinodeError::field(400, "region", "region is not valid"));
        }
        Ok(Extra {
            linode_type: self.cfg.types.first().cloned().unwrap_or_default(),
            image: "linode/debian12".into(),
            tags: mark_tags(&marks(plant)),
            ..Extra::default()
        })
    }

    fn name_taken(&self) -> LinodeError {
        LinodeError::field(400, "label", "Label must be unique among your Linodes")
    }

    fn fault(&self, kind: &FaultKind) -> LinodeError {
        match kind {
            FaultKind::Quota => {
                LinodeError::new(400, "Account Limit reached. Please open a support ticket.")
            }
            FaultKind::RateLimit => LinodeError::too_many(1),
            FaultKind::Auth => LinodeError::new(401, "Invalid Token"),
            FaultKind::ServerError | FaultKind::Slow { .. } => {
                LinodeError::new(500, "Internal server error")
            }
        }
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        if path.starts_with("/v4/linode/types/") {
            return (None, format!("{method} /v4/linode/types/{{typeId}}"));
        }
        let rest = path.strip_prefix("/v4/linode/instances");
        let op = match (method.as_str(), rest) {
            ("POST", Some("")) => Some(FaultOp::Create),
            ("GET", Some("")) => Some(FaultOp::List),
            ("GET", Some(_)) => Some(FaultOp::Get),
            ("DELETE", Some(_)) => Some(FaultOp::Delete),
            _ => None,
        };
        let route = match rest {
            Some(r) if !r.is_empty() => "/v4/linode/instances/{linodeId}",
            _ => path,
        };
        (op, format!("{method} {route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("Bearer {}", self.cfg.token);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> LinodeError {
        LinodeError::new(401, "Invalid Token")
    }

    fn rate_limited(&self, limit: RateLimit) -> LinodeError {
        let per_second = f64::from(limit.per_hour.max(1)) / 3600.0;
        LinodeError::too_many((1.0 / per_second).ceil() as u64)
    }

    fn decorate(&self, resp: &mut Response, bucket: Option<&mut Limiter>) {
        let now = Instant::now();
        let (limit, remaining, full_in) = match bucket {
            Some(b) => (u64::from(b.spec().burst), b.remaining(now), b.until_full(now).as_secs()),
            None => (GENERAL_LIMIT_PER_MINUTE, GENERAL_LIMIT_PER_MINUTE, 60),
        };
        let reset = crate::time::now_secs() + full_in;
        let h = resp.headers_mut();
        h.entry("x-ratelimit-limit").or_insert(HeaderValue::from(limit));
        h.entry("x-ratelimit-remaining").or_insert(HeaderValue::from(remaining));
        h.entry("x-ratelimit-reset").or_insert(HeaderValue::from(reset));
    }
}

type Backend = Cloud<Linode>;

/// A running Linode emulator. Stops (closing every connection) when dropped.
pub type LinodeEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on 127.0.0.1 with an OS-chosen port; the API is under `/v4`.
    pub fn start(cfg: LinodeConfig) -> LinodeEmulator {
        let (listener, _) = crate::framework::bind(0).expect("bind 127.0.0.1:0");
        let fleet = Fleet::new(Linode::STATES, cfg.schedule, cfg.real_proxies.clone());
        let create_bucket = cfg.create_limit.then(|| Limiter::new(CREATE_LIMIT, Instant::now()));
        let limit = cfg.rate_limit;
        let adapter = Linode { cfg, create_bucket };
        let state = Shared::new(Cloud::new(adapter, fleet, limit));
        let app = Router::new().merge(crate::framework::gated(api::routes(), &state));
        Served::serve("linode-emulator", listener, state, app)
    }

    /// The Linode with this id, as the API renders it (no read is counted).
    pub fn linode(&self, id: &str) -> Option<serde_json::Value> {
        self.lock().fleet.get(id).map(api::render)
    }

    /// What the emulator keeps of a Linode beyond the record: its tags, root password,
    /// keys and firewall.
    pub fn extra(&self, id: &str) -> Option<Extra> {
        self.lock().fleet.get(id).map(|r| r.extra.clone())
    }

    /// How long the dedicated create limit takes to refill completely.
    pub fn create_refill(&self) -> Option<Duration> {
        let mut b = self.lock();
        let bucket = b.backend.create_bucket.as_mut()?;
        Some(bucket.until_full(Instant::now()))
    }
}
