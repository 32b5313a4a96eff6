//! The Hetzner Cloud API v1 as this plugin uses it: the JSON shapes it reads, the one
//! function that turns failures into error classes, and the few requests every operation
//! shares.

use egress_guest_sdk::ProviderError;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Timeouts, encode_component};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::{Bounds, Page};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Hetzner's largest page: GC lists as few pages as possible.
pub const PER_PAGE: u32 = 50;
/// A ceiling on pages per list (50 000 servers): a backend whose `next_page` never ends
/// must fail the list, not pin GC.
const PAGES: Bounds = Bounds {
    what: "Hetzner server list",
    max_pages: 1000,
    max_items: 1000 * PER_PAGE as usize,
};

/// Per-request bounds, well inside the host's per-call deadline and the 10 s poll: a
/// connect that takes 5 s is a dead endpoint, and Hetzner answers reads in well under a
/// second, so 20 s to the first byte only passes a struggling but live API.
pub const TIMEOUTS: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(5)),
    first_byte: Some(Duration::from_secs(20)),
    between_bytes: Some(Duration::from_secs(10)),
};

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Server {
    pub id: u64,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub status: String,
    #[serde(deserialize_with = "nullable")]
    pub created: String,
    #[serde(deserialize_with = "nullable")]
    pub public_net: PublicNet,
    /// Servers carry `location` since the datacenter phase-out; older answers (and the
    /// emulator) only have `datacenter.location`.
    pub location: Option<Named>,
    pub datacenter: Option<Datacenter>,
    #[serde(deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    pub locked: bool,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct PublicNet {
    pub ipv4: Option<IpRef>,
    pub ipv6: Option<IpRef>,
}

/// A server's Primary IP as the server shows it (`id` is the Primary IP's ID).
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct IpRef {
    pub id: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub ip: String,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Named {
    #[serde(deserialize_with = "nullable")]
    pub name: String,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Datacenter {
    pub location: Option<Named>,
}

impl Server {
    pub fn location(&self) -> Option<&str> {
        let from_dc = self.datacenter.as_ref().and_then(|d| d.location.as_ref());
        self.location
            .as_ref()
            .or(from_dc)
            .map(|l| l.name.as_str())
            .filter(|n| !n.is_empty())
    }

    pub fn ipv4(&self) -> &str {
        self.public_net
            .ipv4
            .as_ref()
            .map(|i| i.ip.as_str())
            .unwrap_or_default()
    }

    /// The server's IPv6 address, or empty. Hetzner assigns a /64 (`public_net.ipv6.ip`
    /// is the network, `2a01:4f8:c17:1a2b::/64`) and its images configure the network's
    /// first address, `::1`, on the server: that is where clients reach it.
    pub fn ipv6(&self) -> String {
        let Some(net) = self.public_net.ipv6.as_ref().map(|i| i.ip.as_str()) else {
            return String::new();
        };
        let prefix = net.split_once('/').map_or(net, |(p, _)| p);
        match prefix.parse::<std::net::Ipv6Addr>() {
            Ok(p) => std::net::Ipv6Addr::from(u128::from(p) | 1).to_string(),
            Err(_) => String::new(),
        }
    }

    /// The IDs of the server's Primary IPs (IPv4 and IPv6), which must not outlive it.
    pub fn primary_ip_ids(&self) -> Vec<u64> {
        [&self.public_net.ipv4, &self.public_net.ipv6]
            .into_iter()
            .flatten()
            .filter_map(|i| i.id)
            .collect()
    }
}

#[derive(Deserialize)]
pub struct ServerEnvelope {
    pub server: Server,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ServerList {
    #[serde(deserialize_with = "nullable")]
    pub servers: Vec<Server>,
    pub meta: Option<Meta>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Meta {
    pub pagination: Option<Pagination>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Pagination {
    pub page: u64,
    pub next_page: Option<u64>,
    pub total_entries: Option<u64>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Action {
    pub id: u64,
    #[serde(deserialize_with = "nullable")]
    pub command: String,
    /// `running`, `success` or `error`.
    #[serde(deserialize_with = "nullable")]
    pub status: String,
    pub error: Option<ActionError>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct ActionError {
    #[serde(deserialize_with = "nullable")]
    pub code: String,
    #[serde(deserialize_with = "nullable")]
    pub message: String,
}

#[derive(Deserialize)]
pub struct ActionEnvelope {
    pub action: Action,
}

/// The `201` answer of `POST /servers`.
#[derive(Deserialize)]
pub struct Created {
    pub server: Server,
    #[serde(default)]
    pub action: Option<Action>,
    #[serde(default, deserialize_with = "nullable")]
    pub next_actions: Vec<Action>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PrimaryIp {
    pub id: u64,
    pub auto_delete: bool,
}

#[derive(Deserialize)]
pub struct PrimaryIpEnvelope {
    pub primary_ip: PrimaryIp,
}

/// The one place that decides classes, from the API reference's error table. Hetzner's
/// errors are `{"error": {"code", "message", "details"}}`; its code is more precise than
/// the status (`resource_limit_exceeded` is a 403 but means quota), so codes come first,
/// then the status for codes this table does not know. An answer without the envelope
/// (a proxy's HTML page, an empty 502) is classified by status alone, and its 404 is
/// "cannot tell", never "gone". Anything unrecognised is transient: retrying is the safe
/// default, and the permanent cases are the ones the table names.
#[rustfmt::skip] // a table: one row per kind reads better than one code per line
pub const HZ: Classifier = Classifier {
    backend: "Hetzner",
    code_at: "/error/code",
    message_at: "/error/message",
    rules: &[
        Rule::status_code(404, "not_found", Kind::Gone),
        // Rate limit, account limits and "no capacity here right now": waiting helps,
        // backing off fast does not.
        Rule::code("rate_limit_exceeded", Kind::RateLimited),
        Rule::codes(
            &["resource_limit_exceeded", "resource_unavailable", "placement_error", "no_space_left_in_location"],
            Kind::Quota,
        ),
        // The server is busy or the API is: passes by itself. `uniqueness_error` is handled
        // in create (a concurrent create won the race); anywhere else it is a race too.
        Rule::codes(&["locked", "conflict", "uniqueness_error"], Kind::Conflict),
        Rule::codes(
            &[
                "maintenance", "server_error", "service_error", "unavailable", "timeout", "bad_gateway",
                "robot_unavailable", "unknown_error", "action_failed",
            ],
            Kind::Retryable,
        ),
        // Fixing the token, its permissions, the config or the Proxy spec is needed.
        Rule::code("unauthorized", Kind::Auth),
        Rule::codes(&["forbidden", "token_readonly"], Kind::Forbidden),
        Rule::codes(
            &[
                "invalid_input", "json_error", "protected", "resource_locked", "method_not_allowed",
                "unsupported_error", "deprecated_api_endpoint", "invalid_server_type", "primary_ip_assigned",
                "primary_ip_datacenter_mismatch", "primary_ip_version_mismatch", "networks_overlap",
                "firewall_resource_not_found", "incompatible_network_type",
            ],
            Kind::Invalid,
        ),
        // Codes not listed: by status.
        Rule::status(404, Kind::Gone).from_backend(),
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::status(400, Kind::Invalid),
        Rule::status(405, Kind::Invalid),
        Rule::status(422, Kind::Invalid),
    ],
};

/// Turn any failed request into a provider error, through [`HZ`].
pub fn classify(e: HttpError) -> ProviderError {
    HZ.classify(e)
}

/// For requests where "not found" cannot mean "the instance is gone" (lists, the create
/// call): see [`ProviderError::not_found_is_permanent`]. `hint` says what to check.
pub fn not_gone(e: HttpError, hint: &str) -> ProviderError {
    classify(e).not_found_is_permanent(hint)
}

/// [`not_gone`] for `GET /servers?...`: a collection that does not exist means a wrong
/// endpoint.
pub fn collection_error(e: HttpError) -> ProviderError {
    not_gone(e, "the API has no such collection: check config.endpoint")
}

/// A client for the configured endpoint. The token is read on every call, so a rotated
/// Secret takes effect at the next call without a restart.
/// `GET /server_types?name=...`, as far as a price reader needs it.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct ServerTypes {
    pub server_types: Vec<ServerType>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct ServerType {
    pub name: String,
    /// One entry per location that offers the type.
    pub prices: Vec<LocationPrice>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct LocationPrice {
    pub location: String,
    pub price_hourly: Amount,
}

/// Hetzner writes amounts as decimal strings with ten decimals (`"0.0080000000"`).
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct Amount {
    /// Without VAT: what the contract's price is (before taxes).
    pub net: String,
}

pub fn client(endpoint: &str) -> Result<Client, ProviderError> {
    let token = egress_guest_sdk::secret_string("token")?;
    Ok(Client::new(endpoint)
        .bearer_auth(&token)
        .timeouts(TIMEOUTS)
        .header("accept", "application/json"))
}

/// Whether a failed answer is Hetzner saying the addressed resource does not exist.
pub fn is_not_found(e: &HttpError) -> bool {
    HZ.is_gone(e)
}

/// `GET /servers/{id}`; `None` when Hetzner says the server does not exist.
pub fn fetch_server(api: &Client, id: u64) -> Result<Option<Server>, ProviderError> {
    let result = api
        .get(&format!("/servers/{id}"))
        .send_ok()
        .and_then(|r| r.json::<ServerEnvelope>());
    match result {
        Ok(env) => Ok(Some(env.server)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(classify(e)),
    }
}

/// The server called `name`, if any (names are unique per project).
pub fn find_by_name(api: &Client, name: &str) -> Result<Option<Server>, ProviderError> {
    let path = format!("/servers?name={}", encode_component(name));
    let list: ServerList = api.get_json(&path).map_err(collection_error)?;
    // Filtered again here: a proxy that dropped the parameter must not make us adopt the
    // first server of the project.
    Ok(list.servers.into_iter().find(|s| s.name == name))
}

/// Every server matching `selector`, following `meta.pagination.next_page` to the end,
/// each converted by `keep` page by page: at 10,000 servers, holding every `Server` until
/// the end took several MiB of the plugin's memory. Fails whole: a list with a page
/// missing would vouch for nothing, and Hetzner lists are global anyway (one API, every
/// location).
///
/// With `since` (seconds since the epoch), the newest first (`sort=created:desc`), ending
/// with the first page whose last server was created before that second: every server
/// created since is on a page read before it, and the older ones after it are left out.
pub fn list_servers<T>(
    api: &Client,
    selector: &str,
    since: Option<u64>,
    keep: impl FnMut(Server) -> Option<T>,
) -> Result<Vec<T>, ProviderError> {
    let sel = encode_component(selector);
    let sort = if since.is_some() {
        "&sort=created:desc"
    } else {
        ""
    };
    let fetch = |page: &u64| {
        let path = format!("/servers?label_selector={sel}{sort}&per_page={PER_PAGE}&page={page}");
        let list: ServerList = api.get_json(&path).map_err(collection_error)?;
        let next = list
            .meta
            .and_then(|m| m.pagination)
            .and_then(|p| p.next_page)
            .filter(|_| !ends_before(&list.servers, since));
        Ok(Page {
            items: list.servers,
            next,
        })
    };
    PAGES.collect(1, fetch, keep)
}

/// Whether a page sorted newest first ends with a server created before second `since`:
/// the pages after it hold only older ones. A time that does not parse proves nothing.
fn ends_before(page: &[Server], since: Option<u64>) -> bool {
    let (Some(since), Some(last)) = (since, page.last()) else {
        return false;
    };
    egress_guest_sdk::time::parse_rfc3339(&last.created).is_some_and(|t| t.seconds < since)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_guest_sdk::ErrorClass;
    use egress_guest_sdk::http::ErrorCode;

    fn status(s: u16, body: &str) -> HttpError {
        HttpError::Status {
            status: s,
            body: body.as_bytes().to_vec(),
            retry_after: None,
        }
    }

    fn hz(s: u16, code: &str, message: &str) -> HttpError {
        let body = serde_json::json!({"error": {"code": code, "message": message, "details": {}}});
        status(s, &body.to_string())
    }

    /// Real bodies where one was captured (the emulator's `error.rs` lists which), the
    /// documented code and status for the rest.
    #[test]
    fn classify_table() {
        use ErrorClass::*;
        let cases: Vec<(HttpError, ErrorClass, &str)> = vec![
            (
                hz(404, "not_found", "server with ID '4200001' not found"),
                NotFound,
                "not_found",
            ),
            // Captured: 429 with `details: null`.
            (
                status(
                    429,
                    r#"{"error":{"code":"rate_limit_exceeded","message":"limit of 3600 requests per hour reached","details":null}}"#,
                ),
                QuotaExceeded,
                "rate_limit_exceeded",
            ),
            // Captured: the quota is a 403, which would read as "forbidden" by status alone.
            (
                status(
                    403,
                    r#"{"error":{"code":"resource_limit_exceeded","message":"server limit exceeded","details":{"limits":[{"name":"server_limit"}]}}}"#,
                ),
                QuotaExceeded,
                "resource_limit_exceeded",
            ),
            // Captured: a location that stopped taking orders.
            (
                hz(412, "resource_unavailable", "server location disabled"),
                QuotaExceeded,
                "resource_unavailable",
            ),
            (
                hz(
                    422,
                    "placement_error",
                    "An error during the placement occurred",
                ),
                QuotaExceeded,
                "placement_error",
            ),
            (hz(423, "locked", "server is locked"), Transient, "locked"),
            (
                hz(
                    409,
                    "conflict",
                    "The resource has changed during the request, please retry",
                ),
                Transient,
                "conflict",
            ),
            // Captured.
            (
                status(
                    409,
                    r#"{"error":{"code":"uniqueness_error","message":"server name is already used","details":{"fields":[{"name":"name"}]}}}"#,
                ),
                Transient,
                "uniqueness_error",
            ),
            // Captured.
            (
                hz(401, "unauthorized", "unable to authenticate"),
                Permanent,
                "unauthorized",
            ),
            (
                hz(
                    403,
                    "forbidden",
                    "insufficient permissions for this request",
                ),
                Permanent,
                "forbidden",
            ),
            (
                hz(
                    403,
                    "token_readonly",
                    "The token is only allowed to perform GET requests",
                ),
                Permanent,
                "token_readonly",
            ),
            // Captured (`image not found`, `unsupported location for server type`).
            (
                hz(422, "invalid_input", "image not found"),
                Permanent,
                "invalid_input",
            ),
            (
                hz(422, "invalid_input", "unsupported location for server type"),
                Permanent,
                "invalid_input",
            ),
            (
                hz(400, "json_error", "invalid JSON in request body"),
                Permanent,
                "json_error",
            ),
            (
                hz(500, "server_error", "Error within the API backend"),
                Transient,
                "server_error",
            ),
            (
                hz(
                    503,
                    "unavailable",
                    "A service or product is currently not available",
                ),
                Transient,
                "unavailable",
            ),
            (
                hz(
                    503,
                    "maintenance",
                    "Cannot perform operation due to maintenance",
                ),
                Transient,
                "maintenance",
            ),
            (
                hz(504, "timeout", "The request could not be answered in time"),
                Transient,
                "timeout",
            ),
            // Unknown codes fall back to the status.
            (hz(422, "brand_new_code", "x"), Permanent, "brand_new_code"),
            (hz(409, "brand_new_code", "x"), Transient, "brand_new_code"),
            (
                hz(429, "brand_new_code", "x"),
                QuotaExceeded,
                "brand_new_code",
            ),
            // Not a Hetzner answer at all: a load balancer's page, a bare status.
            (
                status(502, "<html>Bad Gateway</html>"),
                Transient,
                "HTTP502",
            ),
            (status(404, "<html>nope</html>"), Transient, "HTTP404"),
            (status(401, ""), Permanent, "HTTP401"),
            (status(429, ""), QuotaExceeded, "HTTP429"),
            (
                HttpError::Transport(ErrorCode::ConnectionRefused),
                Transient,
                "ConnectionRefused",
            ),
            (
                HttpError::Transport(ErrorCode::ConnectionReadTimeout),
                Transient,
                "ConnectionReadTimeout",
            ),
            (
                HttpError::Transport(ErrorCode::HttpRequestDenied),
                Transient,
                "HttpRequestDenied",
            ),
            (
                HttpError::Json("expected value".into()),
                Transient,
                "InvalidJson",
            ),
            (
                HttpError::InvalidUrl("no scheme".into()),
                Permanent,
                "InvalidUrl",
            ),
        ];
        for (e, class, code) in cases {
            let shown = e.to_string();
            let err = classify(e);
            assert_eq!(err.class, class, "{shown}");
            assert_eq!(err.code.as_deref(), Some(code), "{shown}");
        }
        let e = classify(hz(423, "locked", "server is locked"));
        assert_eq!(
            e.message,
            "Hetzner API answered HTTP 423 locked: server is locked"
        );
    }

    #[test]
    fn not_found_only_from_the_api() {
        assert!(is_not_found(&hz(
            404,
            "not_found",
            "server with ID '1' not found"
        )));
        assert!(!is_not_found(&status(404, "not found")));
        assert!(!is_not_found(&hz(400, "not_found", "x")));
        let e = collection_error(hz(404, "not_found", "not found"));
        assert_eq!(e.class, ErrorClass::Permanent);
        assert!(e.message.contains("config.endpoint"), "{}", e.message);
        assert_eq!(
            collection_error(hz(503, "unavailable", "x")).class,
            ErrorClass::Transient
        );
    }

    /// A server as Hetzner sends it now (`location`, no `datacenter`) and as older answers
    /// and the emulator do (`datacenter.location`, `null`s).
    #[test]
    fn server_shapes() {
        let new: ServerEnvelope = serde_json::from_str(
            r#"{"server":{"id":1,"name":"proxy-a","status":"running","created":"2024-05-01T12:00:00+00:00",
                "public_net":{"ipv4":{"id":9,"ip":"203.0.113.10","blocked":false},"ipv6":null},
                "location":{"id":1,"name":"fsn1"},"labels":{"a":"b"},"locked":false}}"#,
        )
        .unwrap();
        assert_eq!(new.server.location(), Some("fsn1"));
        assert_eq!(new.server.ipv4(), "203.0.113.10");
        assert_eq!(new.server.primary_ip_ids(), vec![9]);

        let old: ServerEnvelope = serde_json::from_str(
            r#"{"server":{"id":2,"name":"proxy-b","status":"off","created":"2024-05-01T12:00:00+00:00",
                "public_net":{"ipv4":null,"ipv6":{"id":10,"ip":"2001:db8::/64"}},
                "datacenter":{"name":"nbg1-dc3","location":{"name":"nbg1"}},"labels":null,"locked":true}}"#,
        )
        .unwrap();
        assert_eq!(old.server.location(), Some("nbg1"));
        assert_eq!(old.server.ipv4(), "");
        assert_eq!(old.server.ipv6(), "2001:db8::1");
        assert_eq!(new.server.ipv6(), "");
        assert_eq!(old.server.primary_ip_ids(), vec![10]);
        assert!(old.server.labels.is_empty() && old.server.locked);
    }
}
