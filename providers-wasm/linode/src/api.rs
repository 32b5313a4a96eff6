//! The Linode API v4 as this plugin uses it: the JSON it reads, the one function that
//! turns failures into error classes, and the requests every operation shares.

use egress_guest_sdk::ProviderError;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Timeouts};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::{Bounds, Page};
use serde::Deserialize;
use std::time::Duration;

/// Linode's largest page (`page_size` 25 to 500): GC lists as few pages as possible,
/// since paginated collections have the tightest general rate limit (200 a minute).
pub const PAGE_SIZE: u32 = 500;
/// At most 100 pages (50,000 Linodes): a list whose `pages` never ends must fail.
const PAGES: Bounds = Bounds { what: "Linode instance list", max_pages: 100, max_items: 100 * PAGE_SIZE as usize };

/// Per-request bounds, well inside the host's per-call deadline.
pub const TIMEOUTS: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(5)),
    first_byte: Some(Duration::from_secs(20)),
    between_bytes: Some(Duration::from_secs(10)),
};

/// A Linode as the API returns it, as far as the plugin reads it.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Linode {
    pub id: u64,
    pub label: String,
    pub status: String,
    pub region: String,
    /// UTC without an offset (`2018-01-01T00:01:01`): see [`created_rfc3339`].
    pub created: String,
    #[serde(deserialize_with = "nullable")]
    pub ipv4: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

impl Linode {
    /// The public IPv4: the first address outside Linode's private range
    /// (192.168.128.0/17, present when private networking is on).
    pub fn public_ipv4(&self) -> &str {
        let private = |ip: &str| {
            let mut parts = ip.split('.');
            parts.next() == Some("192")
                && parts.next() == Some("168")
                && parts.next().and_then(|o| o.parse::<u8>().ok()).is_some_and(|o| o >= 128)
        };
        self.ipv4.iter().find(|ip| !private(ip)).map_or("", String::as_str)
    }
}

/// A Linode type's prices (`GET /linode/types/{typeId}`), in US dollars: Linode bills in
/// dollars whatever the region.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct LinodeType {
    pub id: String,
    pub price: TypePrice,
    /// Regions priced apart from `price` (Jakarta, Sao Paulo, ...).
    #[serde(deserialize_with = "nullable")]
    pub region_prices: Vec<RegionPrice>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct TypePrice {
    /// Dollars per hour; `null` for a type sold only monthly.
    pub hourly: Option<f64>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct RegionPrice {
    pub id: String,
    pub hourly: Option<f64>,
}

impl LinodeType {
    /// The hourly price in `region`, in millionths of a dollar: the region's own price if
    /// it has one, else the type's; `None` when Linode states none (or states nonsense).
    pub fn hourly_micros(&self, region: &str) -> Option<u64> {
        let hourly = match self.region_prices.iter().find(|r| r.id == region) {
            Some(r) => r.hourly,
            None => self.price.hourly,
        }?;
        egress_guest_sdk::money::micros_from_float(hourly)
    }
}

/// Linode's times are UTC with no offset (`2018-01-01T00:01:01`), which RFC 3339 parsers
/// refuse; add the `Z` the API documents ("all times returned by the API are in UTC").
pub fn created_rfc3339(created: &str) -> String {
    let has_offset = created.ends_with(['Z', 'z']) || created.get(19..).is_some_and(|t| t.contains(['+', '-']));
    if has_offset || created.is_empty() { created.to_string() } else { format!("{created}Z") }
}

/// One page of `GET /linode/instances`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Paged {
    #[serde(deserialize_with = "nullable")]
    pub data: Vec<Linode>,
    pub page: u64,
    pub pages: u64,
    pub results: u64,
}

/// The one place that decides classes. Linode's errors are `{"errors": [{"reason",
/// "field"}]}` with no code: the reason (a sentence) serves as the code, the field as the
/// message. A 404 is gone only with Linode's envelope (a proxy's HTML 404 cannot tell);
/// reasons come first where the status misleads (the account limit is a 400).
#[rustfmt::skip]
pub const LN: Classifier = Classifier {
    backend: "Linode",
    code_at: "/errors/0/reason",
    message_at: "/errors/0/field",
    rules: &[
        Rule::status(404, Kind::Gone).from_backend(),
        Rule::status(429, Kind::RateLimited),
        // Captured: `[400] Account Limit reached. Please open a support ticket.`
        Rule::code("Account Limit reached*", Kind::Quota),
        // Captured: `400: Linode busy.` while a job (boot, resize, ...) holds the Linode.
        Rule::code("Linode busy*", Kind::Conflict),
        // Captured: `408 Please try again` under load.
        Rule::status(408, Kind::Retryable),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

pub fn classify(e: HttpError) -> ProviderError {
    LN.classify(e)
}

/// For requests where not-found cannot mean "the Linode is gone" (lists, create).
pub fn not_gone(e: HttpError, hint: &str) -> ProviderError {
    classify(e).not_found_is_permanent(hint)
}

/// Whether a failed create says the label is taken (a concurrent create won the race).
pub fn label_taken(e: &HttpError) -> bool {
    e.status() == Some(400) && LN.backend_error(e).is_some_and(|b| b.message == "label" && b.code.contains("unique"))
}

/// A client for the configured endpoint. The token is read on every call, so a rotated
/// Secret takes effect at the next call without a restart.
pub fn client(endpoint: &str) -> Result<Client, ProviderError> {
    let token = egress_guest_sdk::secret_string("token")?;
    Ok(Client::new(endpoint).bearer_auth(&token).timeouts(TIMEOUTS).header("accept", "application/json"))
}

/// `GET /linode/instances/{id}`; `None` when Linode says it does not exist.
pub fn fetch(api: &Client, id: u64) -> Result<Option<Linode>, ProviderError> {
    match api.get(&format!("/linode/instances/{id}")).send_ok().and_then(|r| r.json::<Linode>()) {
        Ok(l) => Ok(Some(l)),
        Err(e) if LN.is_gone(&e) => Ok(None),
        Err(e) => Err(classify(e)),
    }
}

/// One page of the Linodes matching `filter` (an `X-Filter` JSON object).
pub fn page(api: &Client, filter: &str, page: u64, size: u32) -> Result<Paged, ProviderError> {
    let path = format!("/linode/instances?page={page}&page_size={size}");
    let answer = api.get(&path).header("x-filter", filter).send_ok().and_then(|r| r.json::<Paged>());
    answer.map_err(|e| not_gone(e, "the API has no such collection: check config.endpoint"))
}

/// The Linode labelled `label`, if any (labels are unique per account). Filtered again
/// here: a proxy that dropped the filter must not make us adopt the first Linode.
pub fn find_by_label(api: &Client, label: &str) -> Result<Option<Linode>, ProviderError> {
    let filter = serde_json::json!({ "label": label }).to_string();
    Ok(page(api, &filter, 1, 25)?.data.into_iter().find(|l| l.label == label))
}

/// Every Linode matching `filter`, page by page to `pages`, each converted by `keep` as
/// its page arrives. Fails whole: Linode lists are global (one API for every region),
/// and a list with a page missing would vouch for nothing.
pub fn list<T>(api: &Client, filter: &str, keep: impl FnMut(Linode) -> Option<T>) -> Result<Vec<T>, ProviderError> {
    let fetch = |n: &u64| {
        let p = page(api, filter, *n, PAGE_SIZE)?;
        let next = (p.page.max(*n) < p.pages).then_some(p.page.max(*n) + 1);
        Ok(Page { items: p.data, next })
    };
    PAGES.collect(1, fetch, keep)
}
