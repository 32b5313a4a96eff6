//! The Compute Engine API v1 as this plugin uses it: the JSON it reads, its one classify function, and the client that
//! renews a refused access token once within the call.

use crate::auth;
use crate::config::Config;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{Client, HttpError, Method};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::paging::Page;
use egress_guest_sdk::{ErrorClass, ProviderError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The one place that decides classes. API errors are `{"error": {"code", "message", "errors": [{"reason", ...}],
/// "status"}}`; operation errors are `{"errors": [{"code", "message"}]}` and come without an HTTP status. Codes go
/// first (a quota comes as a 403), then statuses; anything unknown is transient.
#[rustfmt::skip]
pub const GCE: Classifier = Classifier {
    backend: "Compute Engine",
    code_at: "/error/errors/0/reason",
    message_at: "/error/message",
    rules: &[
        Rule::status_code(404, "notFound", Kind::Gone),
        Rule::codes(&["rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"], Kind::RateLimited),
        Rule::codes(&["quotaExceeded", "QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED*", "REGION_RESOURCE_POOL_EXHAUSTED*",
            "RESOURCE_POOL_EXHAUSTED*", "RESOURCE_EXHAUSTED"], Kind::Quota),
        Rule::codes(&["authError", "required"], Kind::Auth),
        Rule::codes(&["forbidden", "accessNotConfigured", "insufficientPermissions", "PERMISSION_DENIED"], Kind::Forbidden),
        Rule::codes(&["resourceNotReady", "alreadyExists", "conflict", "RESOURCE_NOT_READY", "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"], Kind::Conflict),
        Rule::codes(&["backendError", "internalError", "INTERNAL_ERROR", "TIMEOUT", "UNAVAILABLE"], Kind::Retryable),
        Rule::codes(&["RESOURCE_NOT_FOUND", "INVALID_FIELD_VALUE", "INVALID_USAGE", "BAD_REQUEST", "UNSUPPORTED_OPERATION",
            "CONDITION_NOT_MET"], Kind::Invalid),
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

pub fn classify(e: HttpError) -> ProviderError {
    GCE.classify(e)
}

/// A VM instance as far as the plugin reads it.
#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Vm {
    pub name: String,
    /// `provisioningModel`, `preemptible`, `instanceTerminationAction`, ...
    pub scheduling: Value,
    /// A URL ending in `/zones/<zone>`.
    pub zone: String,
    pub status: String,
    pub creation_timestamp: String,
    #[serde(deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    pub network_interfaces: Value,
}

impl Vm {
    /// The external address: `networkInterfaces[0].accessConfigs[0].natIP`, `""` until assigned.
    pub fn nat_ip(&self) -> &str {
        self.network_interfaces.pointer("/0/accessConfigs/0/natIP").and_then(Value::as_str).unwrap_or_default()
    }

    pub fn zone_name(&self) -> &str {
        self.zone.rsplit('/').next().unwrap_or_default()
    }

    /// A Spot VM (`scheduling.provisioningModel` SPOT) or a legacy preemptible one: Compute Engine may preempt it.
    pub fn is_spot(&self) -> bool {
        self.scheduling["provisioningModel"] == "SPOT" || self.scheduling["preemptible"] == true
    }
}

/// A zonal operation.
#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    pub name: String,
    /// `PENDING`, `RUNNING` or `DONE`.
    pub status: String,
    pub insert_time: String,
    pub error: Value,
    /// `insert`, `delete`, `compute.instances.preempted`, ...
    pub operation_type: String,
    /// The URL of the resource it acts on; its host varies (`www.googleapis.com`), its path does not.
    pub target_link: String,
}

impl Operation {
    /// It acts on the instance at `path` (`/projects/p/zones/z/instances/n`, see `marks::Id::path`).
    pub fn targets(&self, path: &str) -> bool {
        self.target_link.ends_with(path)
    }
}

impl Operation {
    /// A finished operation's first error, classified by its code (`ZONE_RESOURCE_POOL_EXHAUSTED` waits for
    /// capacity, `RESOURCE_NOT_FOUND` for a bad image or machine type is permanent, unknown codes are transient).
    pub fn failure(&self, what: &str) -> Option<ProviderError> {
        let e = self.error.pointer("/errors/0")?;
        let code = e["code"].as_str().unwrap_or("UNKNOWN");
        let message =
            format!("{what} failed (operation {}): {code}: {}", self.name, e["message"].as_str().unwrap_or(""));
        Some(ProviderError::new(GCE.kind(None, Some(code)).class(), message).with_code(code))
    }
}

/// One page of `instances.aggregatedList`: its instances, its next page token, and the scopes it could not read
/// (`unreachables`, or a scope whose warning is `UNREACHABLE`).
pub fn aggregated_page(page: Value) -> Result<(Page<Vm, String>, Vec<String>), ProviderError> {
    let scopes = page["items"].as_object().cloned().unwrap_or_default();
    let mut down: Vec<String> =
        page["unreachables"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    down.extend(scopes.iter().filter(|(_, s)| s["warning"]["code"] == "UNREACHABLE").map(|(k, _)| k.clone()));
    let vms =
        scopes.into_values().flat_map(|mut s| s["instances"].as_array_mut().map(std::mem::take).unwrap_or_default());
    let vms = vms.map(serde_json::from_value).collect::<Result<Vec<Vm>, _>>();
    let vms =
        vms.map_err(|e| ProviderError::transient(format!("unreadable instance list: {e}")).with_code("InvalidJson"))?;
    let next = page["nextPageToken"].as_str().filter(|t| !t.is_empty()).map(str::to_string);
    Ok((Page { items: vms, next }, down))
}

/// The API with an access token; the per-request timeouts are the SDK's (connect 5 s, first byte and between bytes
/// 30 s).
pub struct Api<'a> {
    pub cfg: &'a Config,
    token: RefCell<String>,
}

impl<'a> Api<'a> {
    pub fn new(cfg: &'a Config) -> Result<Self, ProviderError> {
        Ok(Api { cfg, token: RefCell::new(auth::token(cfg)?) })
    }

    /// Send; the outer error is a token that could not be had, the inner the API's answer. A 401 (the token expired
    /// early or was revoked) drops the cached token and sends once more with a fresh one.
    pub fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Result<T, HttpError>, ProviderError> {
        let send = || {
            let mut req = Client::new(&self.cfg.endpoint).request(method.clone(), path);
            req = req.bearer_auth(&self.token.borrow());
            if let Some(b) = body {
                req = req.json(b);
            }
            req.send_json::<T>()
        };
        match send() {
            Err(HttpError::Status { status: 401, .. }) => {
                auth::forget(self.cfg)?;
                *self.token.borrow_mut() = auth::token(self.cfg)?;
                Ok(send())
            }
            other => Ok(other),
        }
    }

    pub fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ProviderError> {
        self.send(method, path, body)?.map_err(classify)
    }

    /// `GET`, with the API's not-found as `None`.
    pub fn find<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, ProviderError> {
        match self.call(Method::Get, path, None) {
            Err(e) if e.class == ErrorClass::NotFound => Ok(None),
            other => other.map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_guest_sdk::ErrorClass::{self, *};
    use egress_guest_sdk::http::ErrorCode;

    fn api(status: u16, reason: &str, message: &str) -> HttpError {
        let body = serde_json::json!({"error": {"code": status, "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}]}});
        HttpError::Status { status, body: body.to_string().into_bytes(), retry_after: None }
    }

    /// Bodies as the Compute API documents and answers them (errors[].reason), and transport failures.
    #[test]
    fn classify_table() {
        let cases: Vec<(HttpError, ErrorClass, &str)> = vec![
            (api(404, "notFound", "The resource 'projects/p/zones/z/instances/x' was not found"), NotFound, "notFound"),
            (
                HttpError::Status { status: 404, body: b"<html>404</html>".to_vec(), retry_after: None },
                Permanent,
                "HTTP404",
            ),
            (
                api(429, "rateLimitExceeded", "Quota exceeded for quota metric 'Queries'"),
                QuotaExceeded,
                "rateLimitExceeded",
            ),
            (api(403, "rateLimitExceeded", "Rate Limit Exceeded"), QuotaExceeded, "rateLimitExceeded"),
            (
                api(403, "quotaExceeded", "Quota 'CPUS' exceeded. Limit: 24.0 in region us-central1."),
                QuotaExceeded,
                "quotaExceeded",
            ),
            (api(401, "authError", "Invalid Credentials"), Permanent, "authError"),
            (api(403, "forbidden", "Required 'compute.instances.create' permission"), Permanent, "forbidden"),
            (
                api(403, "accessNotConfigured", "Compute Engine API has not been used in project"),
                Permanent,
                "accessNotConfigured",
            ),
            (api(400, "resourceNotReady", "The resource is not ready"), Transient, "resourceNotReady"),
            (api(409, "alreadyExists", "The resource already exists"), Transient, "alreadyExists"),
            (api(400, "invalid", "Invalid value for field 'resource.machineType'"), Permanent, "invalid"),
            (api(500, "backendError", "Internal error. Please try again."), Transient, "backendError"),
            (api(503, "backendError", "Service unavailable"), Transient, "backendError"),
            (HttpError::Status { status: 502, body: Vec::new(), retry_after: None }, Transient, "HTTP502"),
            (HttpError::Transport(ErrorCode::ConnectionRefused), Transient, "ConnectionRefused"),
            (HttpError::Json("eof".into()), Transient, "InvalidJson"),
        ];
        for (e, class, code) in cases {
            let shown = e.to_string();
            let err = classify(e);
            assert_eq!((err.class, err.code.as_deref()), (class, Some(code)), "{shown}");
        }
    }

    /// Operation errors as captured from real failed inserts.
    #[test]
    fn operation_failures() {
        let op = |code: &str| Operation {
            name: "operation-1-a".into(),
            status: "DONE".into(),
            error: serde_json::json!({"errors": [{"code": code, "message": "m"}]}),
            ..Operation::default()
        };
        for (code, class) in [
            ("ZONE_RESOURCE_POOL_EXHAUSTED", QuotaExceeded),
            ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", QuotaExceeded),
            ("QUOTA_EXCEEDED", QuotaExceeded),
            ("RESOURCE_NOT_FOUND", Permanent),
            ("INVALID_FIELD_VALUE", Permanent),
            ("PERMISSION_DENIED", Permanent),
            ("INTERNAL_ERROR", Transient),
            ("SOMETHING_NEW", Transient),
        ] {
            let e = op(code).failure("insert of x").unwrap();
            assert_eq!((e.class, e.code.as_deref()), (class, Some(code)));
            assert!(e.message.contains("operation-1-a") && e.message.contains(code), "{}", e.message);
        }
        assert!(Operation::default().failure("x").is_none());
    }

    #[test]
    fn instances_and_lists_read() {
        let vm: Vm = serde_json::from_value(
            serde_json::json!({"name": "a", "zone": "https://x/compute/v1/projects/p/zones/europe-west1-b",
            "networkInterfaces": [{"accessConfigs": [{"natIP": "203.0.113.5"}]}], "labels": null}),
        )
        .unwrap();
        assert_eq!((vm.nat_ip(), vm.zone_name()), ("203.0.113.5", "europe-west1-b"));
        assert_eq!(Vm::default().nat_ip(), "");
        let page = serde_json::json!({"items": {"zones/a-b1-c": {"warning": {"code": "UNREACHABLE"}},
            "zones/a-b1-d": {"instances": [{"name": "x"}]}}, "unreachables": ["zones/x-y1-z"], "nextPageToken": "t"});
        let (page, down) = aggregated_page(page).unwrap();
        assert_eq!(
            (page.items.len(), page.next.as_deref(), down),
            (1, Some("t"), vec!["zones/x-y1-z".to_string(), "zones/a-b1-c".into()])
        );
    }
}
