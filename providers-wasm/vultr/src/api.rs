//! The Vultr API v2 as this plugin uses it: the instance as it reads it, the one place that
//! classifies failures, marks in tags, and the paged list.

use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Timeouts, encode_component};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::{Bounds, Page};
use egress_guest_sdk::{ErrorClass, ProviderError};
use serde::Deserialize;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Vultr's largest page (`per_page` max 500): GC lists as few pages as possible.
pub const PER_PAGE: u32 = 500;
const PAGES: Bounds = Bounds { what: "Vultr instance list", max_pages: 200, max_items: 200 * PER_PAGE as usize };
/// Vultr sells a few hundred plans; ten pages of 500 leave room and still end a cursor that loops.
const PLAN_PAGES: Bounds = Bounds { what: "Vultr plan list", max_pages: 10, max_items: 10 * PER_PAGE as usize };

/// Per-request bounds, well inside the host's per-call deadline and the 10 s poll.
pub const TIMEOUTS: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(5)),
    first_byte: Some(Duration::from_secs(20)),
    between_bytes: Some(Duration::from_secs(10)),
};

/// An instance, as far as the plugin reads it. Every field may be absent or `null`.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Wire {
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    #[serde(deserialize_with = "nullable")]
    pub label: String,
    #[serde(deserialize_with = "nullable")]
    pub region: String,
    /// `0.0.0.0` while the instance is `pending`.
    #[serde(deserialize_with = "nullable")]
    pub main_ip: String,
    /// `pending`, `active`, `suspended`, `resizing`.
    #[serde(deserialize_with = "nullable")]
    pub status: String,
    /// `running`, `stopped`.
    #[serde(deserialize_with = "nullable")]
    pub power_status: String,
    /// `none`, `locked`, `installingbooting`, `ok`.
    #[serde(deserialize_with = "nullable")]
    pub server_status: String,
    #[serde(deserialize_with = "nullable")]
    pub date_created: String,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

#[derive(Deserialize)]
pub struct One {
    pub instance: Wire,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct List {
    #[serde(deserialize_with = "nullable")]
    pub instances: Vec<Wire>,
    pub meta: Meta,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Meta {
    pub total: u64,
    pub links: Links,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Links {
    #[serde(deserialize_with = "nullable")]
    pub next: String,
}

impl Wire {
    /// The value of mark `key` (tag `key=value`), if the instance carries it.
    pub fn mark(&self, key: &str) -> Option<&str> {
        self.tags.iter().find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
    }

    /// The public IPv4 address, or `None` while there is none worth reporting: Vultr shows
    /// `0.0.0.0` until the instance has its address, and an unspecified, private,
    /// link-local, broadcast or multicast address is never a proxy's egress address.
    /// (Loopback passes: no Vultr instance has it, and it is what an emulator's real-proxy
    /// mode reports; the host's connect-time IP check still guards it.)
    pub fn public_ip(&self) -> Option<String> {
        let ip: Ipv4Addr = self.main_ip.trim().parse().ok()?;
        let unusable = ip.is_unspecified() || ip.is_private() || ip.is_link_local() || ip.is_broadcast();
        (!unusable && !ip.is_multicast()).then(|| ip.to_string())
    }
}

/// Vultr's errors are `{"error": "<message>", "status": <code>}`: no error code, so the
/// message stands in for one, and only an answer carrying it is Vultr's own verdict.
pub const VULTR: Classifier = Classifier {
    backend: "Vultr",
    code_at: "/error",
    message_at: "/message",
    rules: &[
        // Only Vultr's own 404 (with its envelope) says the instance is gone; a bare 404
        // (a proxy, a wrong path) cannot tell.
        Rule::status(404, Kind::Gone).from_backend(),
        Rule::status(404, Kind::Retryable),
        // The documented rate limit (30 requests a second per source IP) answers 429.
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::status(408, Kind::Retryable),
        Rule::status(409, Kind::Conflict),
        Rule::status(423, Kind::Conflict),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

/// Vultr refuses a create over the account's instance limit with a plain 400 whose
/// message says so ("Server add failed: You have reached the maximum number of active
/// instances for this account."): the message is the only quota signal it gives.
pub fn is_quota_message(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["maximum number of", "quota"].iter().any(|w| m.contains(w))
}

/// The provider error for a failed request: [`VULTR`]'s class, QuotaExceeded for the
/// quota message, and `HTTP<status>` as the code (Vultr has no codes; its message is in
/// the text).
pub fn classify(e: HttpError) -> ProviderError {
    let status = e.status();
    let quota = matches!(status, Some(400..=428 | 430..=499))
        && VULTR.backend_error(&e).is_some_and(|b| is_quota_message(&b.code));
    let mut err = VULTR.classify(e);
    if quota {
        err.class = ErrorClass::QuotaExceeded;
    }
    if let Some(s) = status {
        err.code = Some(format!("HTTP{s}"));
    }
    err
}

/// A client for the configured endpoint with the token read now (a rotated Secret takes
/// effect at the next call).
pub fn client(endpoint: &str) -> Result<Client, ProviderError> {
    let token = egress_guest_sdk::secret_string("token")?;
    Ok(Client::new(endpoint).bearer_auth(token.trim()).timeouts(TIMEOUTS))
}

/// The instance `key`, or `None` when Vultr says it is gone.
pub fn fetch(api: &Client, key: &str) -> Result<Option<Wire>, ProviderError> {
    match api.get_json::<One>(&format!("/instances/{key}")) {
        Ok(one) => Ok(Some(one.instance)),
        Err(e) if VULTR.is_gone(&e) => Ok(None),
        Err(e) => Err(classify(e)),
    }
}

/// Every instance matching `filter` (`label=...`, `region=...`, already encoded; empty for
/// all), all pages, each passed through `keep` as its page arrives. Any failed page fails
/// the list. The reference's filters are `label`, `main_ip` and `region` (`tag` is
/// deprecated), and none of them is trusted to have been applied: `keep` checks.
pub fn list<T>(api: &Client, filter: &str, keep: impl FnMut(Wire) -> Option<T>) -> Result<Vec<T>, ProviderError> {
    list_reason(api, filter, keep).map_err(|(_, e)| e)
}

/// [`list`], and for a failed request also its health-check reason (`Unauthorized`, ...).
pub fn list_reason<T>(
    api: &Client,
    filter: &str,
    keep: impl FnMut(Wire) -> Option<T>,
) -> Result<Vec<T>, (&'static str, ProviderError)> {
    let reason = std::cell::Cell::new("APIError");
    let fetch = |cursor: &String| {
        let mut path = match filter {
            "" => format!("/instances?per_page={PER_PAGE}"),
            f => format!("/instances?{f}&per_page={PER_PAGE}"),
        };
        if !cursor.is_empty() {
            path.push_str(&format!("&cursor={}", encode_component(cursor)));
        }
        let page: List = api.get_json(&path).map_err(|e| {
            reason.set(VULTR.reason_of(&e));
            classify(e)
        })?;
        let next = Some(page.meta.links.next).filter(|n| !n.is_empty());
        Ok(Page { items: page.instances, next })
    };
    let listed = PAGES.collect(String::new(), fetch, keep);
    listed.map_err(|e| (reason.get(), e.not_found_is_permanent("check config.endpoint")))
}

/// The hourly price of `plan` in `region`, in millionths of a dollar, from the plan catalogue (`GET /v2/plans` of
/// every type, following the `meta.links.next` cursor); `None` when the catalogue has no such plan or it is not
/// valid for use in the region. Read as JSON values: the plugin already parses those (error bodies), and a typed
/// plan would add its own parser to the plugin.
pub fn plan_price(api: &Client, plan: &str, region: &str) -> Result<Option<u64>, ProviderError> {
    let fetch = |cursor: &String| {
        let mut path = format!("/plans?type=all&per_page={PER_PAGE}");
        if !cursor.is_empty() {
            path.push_str(&format!("&cursor={}", encode_component(cursor)));
        }
        let mut page: serde_json::Value = api.get_json(&path).map_err(classify)?;
        let next = page.pointer("/meta/links/next").and_then(|n| n.as_str()).filter(|n| !n.is_empty());
        let next = next.map(str::to_string);
        let items = match page["plans"].take() {
            serde_json::Value::Array(plans) => plans,
            _ => Vec::new(),
        };
        Ok(Page { items, next })
    };
    let found = PLAN_PAGES.collect(String::new(), fetch, |p| (p["id"] == plan).then(|| hourly_micros(&p, region)));
    let found = found.map_err(|e| e.not_found_is_permanent("check config.endpoint"))?;
    Ok(found.into_iter().flatten().next())
}

/// A plan's hourly price in `region` (see [`plan_price`]). The reference's `plans` schema has no hourly field, only
/// `monthly_cost` (US dollars; an integer there, a `float32` in Vultr's Go client) and `locations` (where the plan is
/// valid for use). Vultr bills by the hour up to the monthly price, the hourly rate being the monthly price over the
/// hours of that cap (docs.vultr.com, "How Am I Billed for My Servers?": 730 hours for GPU instances, type `vcg`;
/// 672 for every other server). Rounded half up once, at the end, from the monthly price in billionths (exact for
/// any price in cents); `None` for a negative price or one of a million dollars or more.
pub fn hourly_micros(plan: &serde_json::Value, region: &str) -> Option<u64> {
    let hours: u64 = if plan["type"] == "vcg" { 730 } else { 672 };
    let offered = plan["locations"].as_array().is_some_and(|l| l.iter().any(|r| r == region));
    let monthly = plan["monthly_cost"].as_f64().filter(|m| offered && (0.0..1e6).contains(m))?;
    Some(((monthly * 1e9).round() as u64 + hours * 500) / (hours * 1000))
}
