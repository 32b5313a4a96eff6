//! The DigitalOcean API v2 as this plugin uses it: the JSON it reads, its one classify function, the shared requests.

use egress_guest_sdk::ProviderError;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Request, Response, encode_component};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::{Bounds, Page};
use serde::Deserialize;
use serde_json::Value;

/// DigitalOcean's largest page (`per_page` maximum 200), so GC lists as few pages as possible; at most 250 pages
/// (50,000 Droplets), so a `next` link that never ends fails the list instead of pinning GC.
pub const PER_PAGE: u32 = 200;
const PAGES: Bounds = Bounds { what: "DigitalOcean droplet list", max_pages: 250, max_items: 250 * PER_PAGE as usize };
/// The size catalogue is about 150 sizes; ten pages of 200 leave room for growth and still end a looping `next`.
const SIZE_PAGES: Bounds = Bounds { what: "DigitalOcean size list", max_pages: 10, max_items: 10 * PER_PAGE as usize };

/// A Droplet as far as the plugin reads it: `status` is `new`, `active`, `off` or `archive`; `networks.v4` holds
/// `{ip_address, type: public|private}`; `region.slug` names the region.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Droplet {
    pub id: u64,
    pub name: String,
    pub status: String,
    pub locked: bool,
    pub created_at: String,
    pub networks: Value,
    pub region: Value,
    #[serde(deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

impl Droplet {
    /// The public IPv4 address, `""` until `networks.v4` has a `public` entry. Never a private (VPC) address: neither
    /// the operator nor the clients could reach it.
    pub fn public_ipv4(&self) -> &str {
        let v4 = self.networks.get("v4").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let public = v4.iter().find(|n| n["type"] == "public").and_then(|n| n["ip_address"].as_str());
        public.unwrap_or_default()
    }

    pub fn region(&self) -> Option<&str> {
        self.region["slug"].as_str().filter(|s| crate::config::is_region(s))
    }
}

#[derive(Deserialize)]
pub struct DropletEnvelope {
    pub droplet: Droplet,
}

/// A list page: `droplets`, `links.pages.next` and `meta.total`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct DropletList {
    #[serde(deserialize_with = "nullable")]
    pub droplets: Vec<Droplet>,
    pub links: Value,
    pub meta: Value,
}

/// The page number of a list's `links.pages.next`, `None` on the last page. A `next` link without a readable `page`
/// fails the list (`what`): guessing could skip a page.
fn next_page(links: &Value, what: &str) -> Result<Option<u64>, ProviderError> {
    let Some(next) = links.pointer("/pages/next").and_then(Value::as_str) else {
        return Ok(None);
    };
    let query = next.split_once('?').map_or("", |(_, q)| q);
    match query.split('&').find_map(|kv| kv.strip_prefix("page=")).and_then(|p| p.parse().ok()) {
        Some(p) => Ok(Some(p)),
        None => Err(bad_pagination(what, format!("unreadable next link {next:?}"))),
    }
}

/// A list whose pages do not add up to its `meta.total` (`held` items on pages up to this last one): one went
/// missing, and the list vouches for nothing.
fn check_total(meta: &Value, held: u64, what: &str) -> Result<(), ProviderError> {
    match meta["total"].as_u64().filter(|t| *t != held) {
        Some(total) => Err(bad_pagination(what, format!("meta.total says {total} items, the pages held {held}"))),
        None => Ok(()),
    }
}

fn bad_pagination(what: &str, why: String) -> ProviderError {
    ProviderError::transient(format!("{what}: {why}")).with_code("BadPagination")
}

/// The hourly price of size `slug` in `region`, in millionths of a dollar, from the size catalogue (`GET /v2/sizes`,
/// the specification's `size.yml`: `price_hourly` a float in US dollars, `regions` the slugs it can be created in,
/// `available` whether it can be created at all, true by default). `None` where the size cannot be created, since no
/// Droplet of it would be billed there. Read as JSON values: the plugin already parses those (error bodies), and a
/// typed size would add its own parser to the plugin.
pub fn size_price(api: &Client, slug: &str, region: &str) -> Result<Option<u64>, ProviderError> {
    let what = SIZE_PAGES.what;
    let fetch = |page: &u64| {
        let path = format!("/sizes?per_page={PER_PAGE}&page={page}");
        let mut list: Value = json(api.get(&path)).map_err(|e| not_gone(e, "check config.endpoint"))?;
        let next = next_page(&list["links"], what)?;
        let items = match list["sizes"].take() {
            Value::Array(sizes) => sizes,
            _ => Vec::new(),
        };
        if next.is_none() {
            check_total(&list["meta"], (page - 1) * u64::from(PER_PAGE) + items.len() as u64, what)?;
        }
        Ok(Page { items, next })
    };
    let found = SIZE_PAGES.collect(1, fetch, |s| (s["slug"] == slug).then(|| hourly_micros(&s, region)))?;
    Ok(found.into_iter().flatten().next())
}

/// A size's hourly price in `region` (see [`size_price`]).
pub fn hourly_micros(size: &Value, region: &str) -> Option<u64> {
    let regions = size["regions"].as_array().map_or(&[][..], Vec::as_slice);
    let offered = size["available"] != false && regions.iter().any(|r| r == region);
    size["price_hourly"].as_f64().filter(|_| offered).and_then(egress_guest_sdk::money::micros_from_float)
}

/// The one place that decides classes, from the API reference: errors are `{"id", "message", "request_id"}`, where
/// `id` names the status (`not_found`, `too_many_requests`, `unprocessable_entity`). A 404 counts as gone only with
/// the API's envelope; anything unknown is transient. [`classify`] refines `422`, which DigitalOcean uses for quota
/// and locks as well as for bad input, by its message.
#[rustfmt::skip]
pub const DO: Classifier = Classifier {
    backend: "DigitalOcean",
    code_at: "/id",
    message_at: "/message",
    rules: &[
        Rule::status_code(404, "not_found", Kind::Gone),
        Rule::code("too_many_requests", Kind::RateLimited),
        Rule::code("unauthorized", Kind::Auth),
        Rule::code("forbidden", Kind::Forbidden),
        Rule::codes(&["conflict", "locked"], Kind::Conflict),
        Rule::codes(&["server_error", "service_unavailable", "internal_server_error", "timeout"], Kind::Retryable),
        Rule::codes(&["unprocessable_entity", "bad_request", "invalid_argument", "method_not_allowed"], Kind::Invalid),
        Rule::status(404, Kind::Gone).from_backend(),
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

/// Messages of `422 unprocessable_entity` that are not about the request itself: the account's Droplet limit and a
/// size or region out of stock wait for capacity; a Droplet with an action running ("pending event") passes by
/// itself. Matched in lowercase.
const MESSAGES: &[(&str, Kind)] = &[
    ("droplet limit", Kind::Quota),
    ("is not available in this region", Kind::Quota),
    ("region is not available", Kind::Quota),
    ("pending event", Kind::Conflict),
];

/// Turn any failed request into a provider error: [`DO`], refined by [`MESSAGES`].
pub fn classify(e: HttpError) -> ProviderError {
    let message = DO.backend_error(&e).map(|b| b.message.to_ascii_lowercase()).unwrap_or_default();
    let refined = MESSAGES.iter().find(|(text, _)| message.contains(text));
    let mut err = DO.classify(e);
    err.class = refined.map_or(err.class, |(_, kind)| kind.class());
    err
}

/// For requests where "not found" cannot mean "the Droplet is gone" (lists, create): permanent, with `hint`.
pub fn not_gone(e: HttpError, hint: &str) -> ProviderError {
    classify(e).not_found_is_permanent(hint)
}

/// A client for the configured endpoint, with the SDK's per-request timeouts (connect 5 s, first byte and between
/// bytes 30 s). The token is read on every call, so a rotated Secret takes effect at the next call.
pub fn client(endpoint: &str) -> Result<Client, ProviderError> {
    let token = egress_guest_sdk::secret_string("token")?;
    Ok(Client::new(endpoint).bearer_auth(&token).header("accept", "application/json"))
}

/// Send, accepting only 2xx. DigitalOcean's 429 has no `Retry-After`; its `ratelimit-reset` (Unix time when the
/// oldest counted request expires) says when to try again, so it is carried as the error's retry-after and ends up in
/// the message.
pub fn send(req: Request) -> Result<Response, HttpError> {
    let r = req.send()?;
    let reset = r.header("ratelimit-reset").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    match r.error_for_status() {
        Err(HttpError::Status { status: 429, body, retry_after: None }) => {
            let after = reset.map(|at| at.saturating_sub(egress_guest_sdk::time::now().seconds));
            Err(HttpError::Status { status: 429, body, retry_after: after })
        }
        other => other,
    }
}

fn json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, HttpError> {
    send(req)?.json()
}

/// `GET /droplets/{id}`; `None` when DigitalOcean says it does not exist.
pub fn fetch(api: &Client, id: u64) -> Result<Option<Droplet>, ProviderError> {
    match json::<DropletEnvelope>(api.get(&format!("/droplets/{id}"))) {
        Ok(env) => Ok(Some(env.droplet)),
        Err(e) if DO.is_gone(&e) => Ok(None),
        Err(e) => Err(classify(e)),
    }
}

/// Every Droplet matching `filter` (`name=...` or `tag_name=...`), page by page through `links.pages.next`, converted
/// by `keep` as each page arrives. Fails whole, also when the pages do not add up to `meta.total`: a list with a page
/// missing vouches for nothing.
pub fn list<T>(api: &Client, filter: &str, keep: impl FnMut(Droplet) -> Option<T>) -> Result<Vec<T>, ProviderError> {
    let fetch = |page: &u64| {
        let path = format!("/droplets?{filter}&per_page={PER_PAGE}&page={page}");
        let list: DropletList = json(api.get(&path)).map_err(|e| not_gone(e, "check config.endpoint"))?;
        let next = next_page(&list.links, PAGES.what)?;
        if next.is_none() {
            check_total(&list.meta, (page - 1) * u64::from(PER_PAGE) + list.droplets.len() as u64, PAGES.what)?;
        }
        Ok(Page { items: list.droplets, next })
    };
    PAGES.collect(1, fetch, keep)
}

/// Every Droplet called `name` (not unique on DigitalOcean), filtered again here: the API ignores case, and a proxy
/// that dropped the parameter must not make create adopt the first Droplet of the account.
pub fn by_name(api: &Client, name: &str) -> Result<Vec<Droplet>, ProviderError> {
    list(api, &format!("name={}", encode_component(name)), |d| (d.name == name).then_some(d))
}

/// `tag_name=<tag>`, for lists and the health check.
pub fn tag_filter(tag: &str) -> String {
    format!("tag_name={}", encode_component(tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_guest_sdk::ErrorClass::{self, *};
    use egress_guest_sdk::http::ErrorCode;

    fn answer(status: u16, body: &str) -> HttpError {
        HttpError::Status { status, body: body.as_bytes().to_vec(), retry_after: None }
    }

    fn api(status: u16, id: &str, message: &str) -> HttpError {
        answer(status, &serde_json::json!({"id": id, "message": message, "request_id": "r"}).to_string())
    }

    /// Bodies as the API reference documents them, and the droplet-limit 422 as captured
    /// from the real API (quoted in public bug reports).
    #[test]
    fn classify_table() {
        let cases: Vec<(HttpError, ErrorClass, &str)> = vec![
            (api(404, "not_found", "The resource you requested could not be found."), NotFound, "not_found"),
            (answer(404, "<html>404</html>"), Permanent, "HTTP404"),
            (api(429, "too_many_requests", "API rate limit exceeded."), QuotaExceeded, "too_many_requests"),
            (answer(429, ""), QuotaExceeded, "HTTP429"),
            (
                answer(
                    422,
                    r#"{"id":"unprocessable_entity","message":"creating this/these droplet(s) will exceed your droplet limit"}"#,
                ),
                QuotaExceeded,
                "unprocessable_entity",
            ),
            (
                api(422, "unprocessable_entity", "Size is not available in this region."),
                QuotaExceeded,
                "unprocessable_entity",
            ),
            (
                api(422, "unprocessable_entity", "Droplet already has a pending event."),
                Transient,
                "unprocessable_entity",
            ),
            (
                api(422, "unprocessable_entity", "You specified an invalid image for Droplet creation."),
                Permanent,
                "unprocessable_entity",
            ),
            (api(400, "bad_request", "error parsing request body"), Permanent, "bad_request"),
            (api(401, "unauthorized", "Unable to authenticate you."), Permanent, "unauthorized"),
            (api(403, "forbidden", "You do not have permission to perform this action."), Permanent, "forbidden"),
            (api(409, "conflict", "The request could not be completed due to a conflict."), Transient, "conflict"),
            (api(500, "server_error", "Unexpected server-side error"), Transient, "server_error"),
            (api(503, "service_unavailable", "down"), Transient, "service_unavailable"),
            (answer(502, "<html>Bad Gateway</html>"), Transient, "HTTP502"),
            (HttpError::Transport(ErrorCode::ConnectionRefused), Transient, "ConnectionRefused"),
            (HttpError::Json("eof".into()), Transient, "InvalidJson"),
        ];
        for (e, class, code) in cases {
            let shown = e.to_string();
            let err = classify(e);
            assert_eq!((err.class, err.code.as_deref()), (class, Some(code)), "{shown}");
        }
        let e = classify(HttpError::Status {
            status: 429,
            body: br#"{"id":"too_many_requests","message":"API rate limit exceeded."}"#.to_vec(),
            retry_after: Some(42),
        });
        assert!(e.message.ends_with("(retry after 42 s)"), "{}", e.message);
    }

    #[test]
    fn droplets_pages_and_addresses() {
        let d: Droplet = serde_json::from_str(
            r#"{"id":7,"name":"proxy-a","status":"active","locked":false,"created_at":"2020-07-21T18:37:44Z",
                "networks":{"v4":[{"ip_address":"10.128.192.124","type":"private"},{"ip_address":"192.241.165.154","type":"public"}],"v6":[]},
                "region":{"slug":"nyc3"},"tags":null}"#,
        )
        .unwrap();
        assert_eq!((d.public_ipv4(), d.region()), ("192.241.165.154", Some("nyc3")));
        let private_only: Droplet = serde_json::from_str(
            r#"{"id":8,"networks":{"v4":[{"ip_address":"10.0.0.2","type":"private"}]},"region":null}"#,
        )
        .unwrap();
        assert_eq!((private_only.public_ipv4(), private_only.region()), ("", None));

        let page = |links: &str| next_page(&serde_json::from_str(links).unwrap(), "DigitalOcean droplet list");
        let next = r#"{"pages":{"next":"https://api.digitalocean.com/v2/droplets?page=3&per_page=200","last":"x"}}"#;
        assert_eq!(page(next).unwrap(), Some(3));
        assert_eq!(page("{}").unwrap(), None);
        assert_eq!(page(r#"{"pages":{"prev":"x?page=1"}}"#).unwrap(), None);
        let e = page(r#"{"pages":{"next":"https://x/v2/droplets?per_page=2"}}"#).unwrap_err();
        assert!(e.message.starts_with("DigitalOcean droplet list: unreadable next link"), "{}", e.message);
        assert!(check_total(&serde_json::json!({"total": 3}), 3, "l").is_ok());
        let e = check_total(&serde_json::json!({"total": 4}), 3, "DigitalOcean size list").unwrap_err();
        assert_eq!(e.message, "DigitalOcean size list: meta.total says 4 items, the pages held 3");
    }
}
