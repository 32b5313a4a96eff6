//! Azure Resource Manager as this plugin uses it: the JSON it reads, its one classify table, the client that renews a
//! refused access token once within the call, long-running operations (`Azure-AsyncOperation`, then `Location`,
//! honouring `Retry-After`) and `nextLink` paging.

use crate::auth;
use crate::config::Config;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{HttpError, Method, Request, Response};
use egress_guest_sdk::paging::{Bounds, Page};
use egress_guest_sdk::{ErrorClass, ProviderError};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The api-versions this plugin speaks, per resource provider.
pub const COMPUTE: &str = "2024-07-01";
pub const NETWORK: &str = "2024-05-01";
pub const RESOURCES: &str = "2021-04-01";

/// Azure's answers to a create that found no capacity (for Spot: no Spot capacity), in the PUT's answer or in its
/// operation's error.
pub const CAPACITY: [&str; 5] = [
    "SkuNotAvailable",
    "AllocationFailed",
    "OverconstrainedAllocationRequest",
    "ZonalAllocationFailed",
    "OverconstrainedZonalAllocationRequest",
];

/// The one place that decides classes. ARM errors are `{"error": {"code", "message", "target"?, "details"?}}`;
/// operation errors carry the same `error` and no HTTP status. Codes first (a quota comes as a 409, a throttle as a
/// 429), then statuses; anything unknown is transient. `OperationNotAllowed` is the Compute RP's core-quota refusal
/// (it also says "VM marked for deletion", which passes after the same wait).
#[rustfmt::skip]
pub const ARM: Classifier = Classifier {
    backend: "Azure Resource Manager",
    code_at: "/error/code",
    message_at: "/error/message",
    rules: &[
        Rule::status_code(404, "ResourceNotFound", Kind::Gone),
        Rule::codes(&["SubscriptionRequestsThrottled", "ResourceGroupRequestsThrottled", "TooManyRequests"], Kind::RateLimited),
        Rule::codes(&["OperationNotAllowed", "QuotaExceeded", "SkuNotAvailable", "AllocationFailed",
            "OverconstrainedAllocationRequest", "ZonalAllocationFailed", "OverconstrainedZonalAllocationRequest",
            "PublicIPCountLimitReached"], Kind::Quota),
        Rule::codes(&["AuthenticationFailed", "AuthenticationFailedInvalidHeader", "InvalidAuthenticationToken",
            "ExpiredAuthenticationToken", "InvalidAuthenticationTokenTenant"], Kind::Auth),
        Rule::codes(&["AuthorizationFailed", "LinkedAuthorizationFailed", "RequestDisallowedByPolicy"], Kind::Forbidden),
        Rule::codes(&["AnotherOperationInProgress", "OperationPreempted", "RetryableError", "Conflict", "NicInUse",
            "PublicIPAddressInUse", "PublicIPAddressCannotBeDeleted", "ReferencedResourceNotProvisioned"], Kind::Conflict),
        Rule::codes(&["InternalServerError", "InternalExecutionError", "InternalOperationError", "ServerTimeout",
            "GatewayTimeout", "ServiceUnavailable"], Kind::Retryable),
        Rule::codes(&["ResourceGroupNotFound", "SubscriptionNotFound", "InvalidParameter", "InvalidResourceReference",
            "InvalidRequestFormat", "InvalidRequestContent", "LocationNotAvailableForResourceType", "LocationRequired",
            "InvalidResourceName", "InvalidResourceType", "NoRegisteredProviderFound", "MissingSubscriptionRegistration",
            "InvalidApiVersionParameter", "MissingApiVersionParameter", "PropertyChangeNotAllowed", "InvalidTag*",
            "StandardSkuPublicIPAddressesMustBeStatic", "ImageNotFound", "PlatformImageNotFound", "NotFound"], Kind::Invalid),
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
        Rule::status(409, Kind::Conflict),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::statuses(400, 499, Kind::Invalid),
    ],
};

pub fn classify(e: HttpError) -> ProviderError {
    ARM.classify(e)
}

/// An ARM error object (`error` of an answer or of an operation) as a provider error, classified by its code.
pub fn op_failure(what: &str, error: &Value) -> ProviderError {
    let code = error["code"].as_str().filter(|c| !c.is_empty()).unwrap_or("Failed");
    let message = error["message"].as_str().unwrap_or_default();
    let msg = format!("{what} failed: {code}: {message}");
    ProviderError::new(ARM.kind(None, Some(code)).class(), msg).with_code(code)
}

/// An ARM resource as it was answered. Read through accessors rather than derived structs: one JSON reader for every
/// shape keeps the plugin small (each derived reader is code of its own in the component).
#[derive(Debug, Clone, Default)]
pub struct Res(pub Value);

/// A VM (`$expand=instanceView`), a public IP, a `Resources_List` entry (`GenericResourceExpanded`): all [`Res`].
pub type Vm = Res;
pub type PublicIp = Res;
pub type Generic = Res;

impl Res {
    fn text(&self, pointer: &str) -> &str {
        self.0.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.text("/name")
    }

    /// `type`: `Microsoft.Compute/virtualMachines`, ...
    pub fn kind(&self) -> &str {
        self.text("/type")
    }

    pub fn location(&self) -> &str {
        self.text("/location")
    }

    /// The string tags (`null` or absent: none).
    pub fn tags(&self) -> BTreeMap<String, String> {
        let tags = self.0.get("tags").and_then(Value::as_object);
        tags.into_iter().flatten().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect()
    }

    /// `createdTime` of a generic list entry (`$expand=createdTime`).
    pub fn created_time(&self) -> &str {
        self.text("/createdTime")
    }

    pub fn provisioning_state(&self) -> &str {
        self.text("/properties/provisioningState")
    }

    /// A VM's `timeCreated`.
    pub fn time_created(&self) -> &str {
        self.text("/properties/timeCreated")
    }

    fn statuses(&self) -> impl Iterator<Item = (&str, &str)> {
        let all = self.0.pointer("/properties/instanceView/statuses").and_then(Value::as_array);
        all.into_iter()
            .flatten()
            .map(|s| (s["code"].as_str().unwrap_or_default(), s["message"].as_str().unwrap_or_default()))
    }

    /// The code after `PowerState/` in the instance view (`running`, `deallocated`, ...); `None` while Azure shows none.
    pub fn power(&self) -> Option<&str> {
        self.statuses().find_map(|(c, _)| c.strip_prefix("PowerState/"))
    }

    /// Why the creation failed: the code after `ProvisioningState/failed/` and its message.
    pub fn failure(&self) -> Option<(&str, &str)> {
        self.statuses().find_map(|(c, m)| c.strip_prefix("ProvisioningState/failed/").map(|c| (c, m)))
    }

    /// `priority` `Spot`, or `Low` (its old name).
    pub fn is_spot(&self) -> bool {
        matches!(self.text("/properties/priority"), "Spot" | "Low")
    }

    pub fn size(&self) -> &str {
        self.text("/properties/hardwareProfile/vmSize")
    }

    /// A public IP's `properties.ipAddress`, `""` until Azure assigned it.
    pub fn address(&self) -> &str {
        self.text("/properties/ipAddress")
    }
}

/// Where a long-running operation's outcome is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// `Azure-AsyncOperation`: an operation status `{"status": "InProgress" | "Succeeded" | "Failed" | "Canceled"}`.
    Status(String),
    /// `Location`: `202` while it runs, then the outcome.
    Location(String),
}

/// The operation an answer started, if any: `Azure-AsyncOperation` first (ARM's rule when both are given), else a
/// `Location` of a `201` or `202`. Without either the request finished with its answer.
pub fn poll_of(r: &Response) -> Option<Poll> {
    let header =
        |n: &str| r.header(n).and_then(|v| std::str::from_utf8(v).ok()).map(str::trim).filter(|v| !v.is_empty());
    match (header("azure-asyncoperation"), header("location")) {
        (Some(u), _) => Some(Poll::Status(u.to_string())),
        (None, Some(u)) if matches!(r.status, 201 | 202) => Some(Poll::Location(u.to_string())),
        _ => None,
    }
}

/// How long to wait before the next poll: the answer's `Retry-After` in seconds (at most [`MAX_PAUSE`]), else
/// [`DEFAULT_PAUSE`]. Zero is honoured as a short pause, never a busy loop.
pub fn pause_of(r: &Response) -> Duration {
    let secs =
        r.header("retry-after").and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.trim().parse::<u64>().ok());
    match secs {
        Some(0) => MIN_PAUSE,
        Some(s) => Duration::from_secs(s).min(MAX_PAUSE),
        None => DEFAULT_PAUSE,
    }
}

/// ARM asks for 10 s between polls at most times; a longer ask is cut so one call can see its operation end.
pub const MAX_PAUSE: Duration = Duration::from_secs(15);
/// The pause of an answer without `Retry-After` (an operation that was over when it was named, most often).
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(2);
const MIN_PAUSE: Duration = Duration::from_millis(50);

/// Whether an operation status is final.
pub fn finished(status: &str) -> bool {
    matches!(status.to_ascii_lowercase().as_str(), "succeeded" | "failed" | "canceled" | "cancelled")
}

/// ARM with an access token, and the end of this call's waiting.
pub struct Arm<'a> {
    pub cfg: &'a Config,
    token: RefCell<String>,
    deadline: Instant,
}

impl<'a> Arm<'a> {
    pub fn new(cfg: &'a Config) -> Result<Self, ProviderError> {
        let deadline = Instant::now() + Duration::from_secs(cfg.wait().into());
        Ok(Arm { cfg, token: RefCell::new(auth::token(cfg)?), deadline })
    }

    /// `{armEndpoint}{path}?api-version={version}{query}`.
    pub fn url(&self, path: &str, version: &str, query: &str) -> String {
        format!("{}{path}?api-version={version}{query}", self.cfg.arm_endpoint)
    }

    /// A URL ARM handed out (an operation, a next page) is followed only to the configured endpoint: an answer must
    /// not steer the plugin's token anywhere else, whatever the allow-list holds.
    fn own(&self, url: &str) -> Result<(), ProviderError> {
        let base = &self.cfg.arm_endpoint;
        let ok = url.len() > base.len()
            && url[..base.len()].eq_ignore_ascii_case(base)
            && url[base.len()..].starts_with('/');
        if ok {
            return Ok(());
        }
        let msg = format!("ARM named the URL {url:?}, which is not under config.armEndpoint {base:?}: not followed");
        Err(ProviderError::transient(msg).with_code("ForeignUrl"))
    }

    /// Send; the outer error is a token that could not be had, the inner the answer (non-2xx as `Status`). A 401 (the
    /// token expired early or was revoked) drops the cached token and sends once more with a fresh one.
    pub fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Result<Response, HttpError>, ProviderError> {
        let send = || {
            let mut req = Request::new(method.clone(), url)
                .bearer_auth(&self.token.borrow())
                .header("accept", "application/json");
            if let Some(b) = body {
                req = req.json(b);
            }
            req.send().and_then(Response::error_for_status)
        };
        match send() {
            Err(HttpError::Status { status: 401, .. }) => {
                auth::forget(self.cfg);
                *self.token.borrow_mut() = auth::token(self.cfg)?;
                Ok(send())
            }
            other => Ok(other),
        }
    }

    pub fn call(&self, method: Method, url: &str, body: Option<&Value>) -> Result<Response, ProviderError> {
        self.send(method, url, body)?.map_err(classify)
    }

    /// `GET`, with ARM's `ResourceNotFound` as `None`.
    pub fn find(&self, url: &str) -> Result<Option<Res>, ProviderError> {
        match self.send(Method::Get, url, None)? {
            Ok(r) => json(&r).map(|v| Some(Res(v))),
            Err(e) if ARM.is_gone(&e) => Ok(None),
            Err(e) => Err(classify(e)),
        }
    }

    /// `PUT`, then wait for its operation to end.
    pub fn put(&self, url: &str, body: &Value, what: &str) -> Result<(), ProviderError> {
        let r = self.call(Method::Put, url, Some(body))?;
        self.wait(&r, what)
    }

    /// `DELETE`: `None` when there was nothing to delete (`204`, or `404`), else the answer (`202` with an operation, or
    /// `200` when it is gone already).
    pub fn delete(&self, url: &str) -> Result<Option<Response>, ProviderError> {
        match self.send(Method::Delete, url, None)? {
            Ok(r) if r.status == 204 => Ok(None),
            Ok(r) => Ok(Some(r)),
            Err(e) if ARM.is_gone(&e) => Ok(None),
            Err(e) => Err(classify(e)),
        }
    }

    /// `DELETE` and wait for it; `false` when there was nothing to delete.
    pub fn delete_wait(&self, url: &str, what: &str) -> Result<bool, ProviderError> {
        match self.delete(url)? {
            None => Ok(false),
            Some(r) => self.wait(&r, what).map(|()| true),
        }
    }

    /// Wait for the operation `first` started, polling where it says and as often as it asks, until it ends or this
    /// call's wait (`config.waitSeconds`) runs out: then transient `OperationInProgress`, and the next call takes over
    /// (every write of this plugin may be repeated). A failed operation is its error, classified by its code.
    pub fn wait(&self, first: &Response, what: &str) -> Result<(), ProviderError> {
        let Some(poll) = poll_of(first) else { return Ok(()) };
        let url = match &poll {
            Poll::Status(u) | Poll::Location(u) => u.clone(),
        };
        self.own(&url)?;
        let mut pause = pause_of(first);
        loop {
            // The last poll comes at the end of the wait, not after it: an operation that ended meanwhile is seen.
            let left = self.deadline.saturating_duration_since(Instant::now());
            let last = pause >= left;
            std::thread::sleep(pause.min(left));
            let still = || {
                let msg = format!(
                    "{what} is still running after {} s (config.waitSeconds); the next call goes on",
                    self.cfg.wait()
                );
                ProviderError::transient(msg).with_code("OperationInProgress")
            };
            let answer = self.send(Method::Get, &url, None)?;
            match (&poll, answer) {
                (Poll::Status(_), Ok(r)) => {
                    let status = json(&r)?;
                    let s = status["status"].as_str().unwrap_or_default();
                    if s.eq_ignore_ascii_case("Succeeded") {
                        return Ok(());
                    }
                    if finished(s) {
                        let error = if status["error"].is_object() {
                            status["error"].clone()
                        } else {
                            serde_json::json!({"code": s})
                        };
                        return Err(op_failure(what, &error));
                    }
                    if last {
                        return Err(still());
                    }
                    pause = pause_of(&r);
                }
                (Poll::Location(_), Ok(r)) if r.status == 202 && last => return Err(still()),
                (Poll::Location(_), Ok(r)) if r.status == 202 => pause = pause_of(&r),
                (Poll::Location(_), Ok(_)) => return Ok(()),
                // The operation's own failure comes as an error answer of the Location URL.
                (_, Err(e)) => {
                    let err = classify(e);
                    return Err(ProviderError { message: format!("{what}: {}", err.message), ..err });
                }
            }
        }
    }

    /// Every item of an ARM list starting at `url`, following `nextLink` (bounded), each passed through `keep` as its
    /// page arrives.
    pub fn list<U>(
        &self,
        url: String,
        bounds: Bounds,
        keep: impl FnMut(Res) -> Option<U>,
    ) -> Result<Vec<U>, ProviderError> {
        let fetch = |cursor: &String| {
            let target = if cursor.is_empty() { url.clone() } else { cursor.clone() };
            self.own(&target)?;
            let mut page = json(&self.call(Method::Get, &target, None)?)?;
            let items = match page["value"].take() {
                Value::Array(items) => items.into_iter().map(Res).collect(),
                _ => Vec::new(),
            };
            let next = page["nextLink"].as_str().filter(|n| !n.is_empty()).map(str::to_string);
            Ok(Page { items, next })
        };
        bounds.collect(String::new(), fetch, keep)
    }
}

/// A 2xx answer's JSON body; one that does not read is transient (a proxy's page, a cut answer).
pub fn json(r: &Response) -> Result<Value, ProviderError> {
    r.json().map_err(|e| ProviderError::transient(format!("unreadable ARM answer: {e}")).with_code("InvalidJson"))
}

/// A not-found from a request that does not address the instance (a create, a list) is never "the instance is
/// gone": it is a wrong resource group, subscription or reference, which retrying cannot fix.
pub fn not_gone(e: ProviderError, hint: &str) -> ProviderError {
    match e.class {
        ErrorClass::NotFound => e.not_found_is_permanent(hint),
        _ => e,
    }
}
