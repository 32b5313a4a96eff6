//! ARM's error envelope: `{"error": {"code", "message", "target", "details"}}` (the
//! `ErrorResponse` / `ErrorDetail` of `common-types/resource-management/v5/types.json`, the
//! `CloudError` of the Compute and Network specs), with the status each code travels with.
//!
//! Codes and statuses are the real ones (read from the specs where they name them, from
//! captured answers quoted in public issue trackers otherwise); messages follow the captured
//! wording where one was found and are paraphrased elsewhere. A plugin must classify on the
//! status and the code, never on the message.

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::control::Refusal;

/// One ARM error answer. Public so tests can inject codes the shared fault kinds do not
/// cover ([`AzureEmulator::inject_error`](super::AzureEmulator::inject_error)).
#[derive(Debug, Clone, PartialEq)]
pub struct ArmError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// `target`, `details` and headers, rarely set (boxed: errors travel in `Result`s).
    extra: Option<Box<Extra>>,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct Extra {
    target: Option<String>,
    /// Network's `CloudError` always carries `details` (often `[]`); Compute and ARM itself
    /// leave it out when empty.
    details: Option<Vec<Value>>,
    /// Headers the answer carries (`WWW-Authenticate`, `Retry-After`).
    headers: Vec<(String, String)>,
}

impl ArmError {
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        ArmError { status, code: code.into(), message: message.into(), extra: None }
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.extra().target = Some(target.into());
        self
    }

    /// The headers the answer carries.
    pub fn headers(&self) -> &[(String, String)] {
        self.extra.as_ref().map(|e| e.headers.as_slice()).unwrap_or_default()
    }

    /// The Network RP's shape: `details` is always there.
    pub fn network(mut self) -> Self {
        self.extra().details.get_or_insert_with(Vec::new);
        self
    }

    pub fn with_detail(mut self, code: &str, message: &str) -> Self {
        let detail = json!({"code": code, "message": message});
        self.extra().details.get_or_insert_with(Vec::new).push(detail);
        self
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.extra().headers.push((name.to_string(), value.into()));
        self
    }

    /// The `error` object alone (what an operation status carries).
    pub fn detail(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(x) = &self.extra {
            if let Some(t) = &x.target {
                e["target"] = t.as_str().into();
            }
            if let Some(d) = &x.details {
                e["details"] = Value::Array(d.clone());
            }
        }
        e
    }

    /// The body exactly as sent.
    pub fn body(&self) -> Value {
        json!({ "error": self.detail() })
    }

    // ---- ARM itself -----------------------------------------------------------------------

    pub(crate) fn missing_api_version() -> Self {
        // Captured: MicrosoftDocs/feedback#2279, cloudquery#6626.
        Self::new(
            400,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        )
    }

    /// ARM's own types (resource lists): captured in azure-sdk-for-python#975.
    pub(crate) fn invalid_api_version(given: &str, supported: &[String]) -> Self {
        Self::new(
            400,
            "InvalidApiVersionParameter",
            format!(
                "The api-version '{given}' is invalid. The supported versions are '{}'.",
                supported.join(",")
            ),
        )
    }

    /// A resource provider's types: captured in azure-cli#28496.
    pub(crate) fn no_registered_provider(
        location: &str,
        given: &str,
        ty: &str,
        supported: &[String],
        locations: &[String],
    ) -> Self {
        Self::new(
            400,
            "NoRegisteredProviderFound",
            format!(
                "No registered resource provider found for location '{location}' and API version \
                 '{given}' for type '{ty}'. The supported api-versions are '{}'. The supported \
                 locations are '{}'.",
                supported.join(", "),
                locations.join(", ")
            ),
        )
    }

    pub(crate) fn subscription_not_found(sub: &str) -> Self {
        Self::new(
            404,
            "SubscriptionNotFound",
            format!("The subscription '{sub}' could not be found."),
        )
    }

    pub(crate) fn resource_group_not_found(rg: &str) -> Self {
        Self::new(
            404,
            "ResourceGroupNotFound",
            format!("Resource group '{rg}' could not be found."),
        )
    }

    /// Captured: Azure/SAP-on-Azure-Scripts-and-Utilities#126.
    pub(crate) fn resource_not_found(full_type: &str, name: &str, rg: &str) -> Self {
        Self::new(
            404,
            "ResourceNotFound",
            format!(
                "The Resource '{full_type}/{name}' under resource group '{rg}' was not found. For \
                 more details please go to https://aka.ms/ARMResourceNotFoundFix"
            ),
        )
    }

    pub(crate) fn invalid_resource_type(ns: &str, ty: &str, version: &str) -> Self {
        Self::new(
            400,
            "InvalidResourceType",
            format!(
                "The resource type '{ty}' could not be found in the namespace '{ns}' for api \
                 version '{version}'."
            ),
        )
    }

    pub(crate) fn invalid_request_content(why: &str) -> Self {
        Self::new(
            400,
            "InvalidRequestContent",
            format!("The request content was invalid and could not be deserialized: '{why}'."),
        )
    }

    pub(crate) fn location_required() -> Self {
        Self::new(400, "LocationRequired", "The location property is required for this definition.")
    }

    pub(crate) fn location_not_available(location: &str, ty: &str, available: &[String]) -> Self {
        Self::new(
            400,
            "LocationNotAvailableForResourceType",
            format!(
                "The provided location '{location}' is not available for resource type '{ty}'. \
                 List of available regions for the resource type is '{}'.",
                available.join(",")
            ),
        )
    }

    /// Captured: azure-cli#7674, azure-powershell#293.
    pub(crate) fn invalid_filter(filter: &str) -> Self {
        Self::new(
            400,
            "InvalidFilterInQueryString",
            format!("Invalid $filter '{filter}' specified in the query string."),
        )
    }

    pub(crate) fn invalid_query(name: &str, value: &str) -> Self {
        Self::new(
            400,
            "InvalidQueryParameterValue",
            format!("The value '{value}' of query parameter '{name}' is not valid."),
        )
    }

    /// Tag names may not contain `<>%&\?/` (ARM's tag rules).
    pub(crate) fn invalid_tag_name(names: &[&str]) -> Self {
        Self::new(
            400,
            "InvalidTagNameCharacters",
            format!(
                "The tag names '{}' have reserved characters '<,>,%,&,\\,?,/' or control \
                 characters.",
                names.join(",")
            ),
        )
    }

    pub(crate) fn invalid_tag_value(name: &str) -> Self {
        Self::new(
            400,
            "InvalidTagValueLength",
            format!("The tag value for tag name '{name}' exceeds the maximum length of 256."),
        )
    }

    pub(crate) fn invalid_tag_name_length(name: &str) -> Self {
        Self::new(
            400,
            "InvalidTagNameLength",
            format!("The tag name '{name}' exceeds the maximum length of 512."),
        )
    }

    pub(crate) fn too_many_tags() -> Self {
        Self::new(400, "InvalidTagCount", "The number of tags on a resource must not exceed 50.")
    }

    pub(crate) fn invalid_resource_name(name: &str, ty: &str) -> Self {
        Self::new(
            400,
            "InvalidResourceName",
            format!("Resource name {name} is invalid for type '{ty}'."),
        )
    }

    /// ARM's internal error, as a failing scope answers.
    pub(crate) fn internal(sub: &str, tracking: &str) -> Self {
        Self::new(
            500,
            "InternalServerError",
            format!(
                "Encountered internal server error. Diagnostic information: timestamp '{}', \
                 subscription id '{sub}', tracking id '{tracking}', request correlation id \
                 '{tracking}'.",
                crate::time::rfc3339(crate::time::now_secs())
            ),
        )
    }

    /// The Compute RP's transient server error.
    pub(crate) fn internal_execution() -> Self {
        Self::new(
            500,
            "InternalExecutionError",
            "An internal execution error occurred. Please retry later.",
        )
    }

    /// Missing `Authorization` header; captured in msgraph-sdk-javascript#1562.
    pub(crate) fn auth_missing(authority: &str) -> Self {
        Self::new(
            401,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing.",
        )
        .with_header(
            "www-authenticate",
            www_authenticate(
                authority,
                "The authentication failed because of missing 'Authorization' header.",
            ),
        )
    }

    /// An `Authorization` header that is not `Bearer <token>`; captured in
    /// azure-sdk-for-python#4124.
    pub(crate) fn auth_invalid_header(authority: &str) -> Self {
        Self::new(
            401,
            "AuthenticationFailedInvalidHeader",
            "Authentication failed. The 'Authorization' header is provided in an invalid format.",
        )
        .with_header(
            "www-authenticate",
            www_authenticate(
                authority,
                "The authentication failed because of invalid 'Authorization' header.",
            ),
        )
    }

    pub(crate) fn invalid_token(authority: &str) -> Self {
        Self::new(401, "InvalidAuthenticationToken", "The access token is invalid.").with_header(
            "www-authenticate",
            www_authenticate(authority, "The access token is invalid."),
        )
    }

    pub(crate) fn expired_token(authority: &str, expired: u64) -> Self {
        let (exp, now) = (expired, crate::time::now_secs());
        Self::new(
            401,
            "ExpiredAuthenticationToken",
            format!(
                "The access token expiry UTC time '{}' is earlier than current UTC time '{}'.",
                us_time(exp),
                us_time(now)
            ),
        )
        .with_header(
            "www-authenticate",
            www_authenticate(
                authority,
                "The access token expiry UTC time is earlier than current UTC time.",
            ),
        )
    }

    /// A call past the enforced limit: ARM's throttling answer, 429 with `Retry-After`.
    pub(crate) fn throttled(kind: &str, sub: &str, client: &str, retry_after: u64) -> Self {
        Self::new(
            429,
            "SubscriptionRequestsThrottled",
            format!(
                "Number of '{kind}' requests for subscription '{sub}' actor '{client}' exceeded. \
                 Please try again after '{retry_after}' seconds after additional tokens are \
                 available. Refer to https://aka.ms/arm-throttling"
            ),
        )
        .with_header("retry-after", retry_after.to_string())
    }

    /// The Compute RP's core-quota refusal (409 `OperationNotAllowed`); captured in
    /// karpenter-provider-azure#192 and cb-spider#1558.
    pub(crate) fn quota(location: &str, limit: usize, usage: usize) -> Self {
        Self::new(
            409,
            "OperationNotAllowed",
            format!(
                "Operation could not be completed as it results in exceeding approved Total \
                 Regional Cores quota. Additional details - Deployment Model: Resource Manager, \
                 Location: {location}, Current Limit: {limit}, Current Usage: {usage}, Additional \
                 Required: 1, (Minimum) New Limit Required: {}. Submit a request for Quota \
                 increase at https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView",
                usage + 1
            ),
        )
    }

    /// What a resource with an operation in progress answers a conflicting write (the
    /// Network RP's wording, used for every type here).
    pub(crate) fn another_operation(op_url: &str) -> Self {
        Self::new(
            409,
            "AnotherOperationInProgress",
            format!(
                "Another operation on this or dependent resource is in progress. To retrieve \
                 status of the operation use uri: {op_url}."
            ),
        )
    }

    pub(crate) fn invalid_parameter(message: impl Into<String>, target: &str) -> Self {
        Self::new(400, "InvalidParameter", message).with_target(target)
    }
}

impl IntoResponse for ArmError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.body())).into_response();
        for (k, v) in self.headers() {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v)) {
                resp.headers_mut().insert(k, v);
            }
        }
        resp
    }
}

impl From<ArmError> for Refusal {
    fn from(e: ArmError) -> Self {
        Refusal { status: e.status, body: e.body() }
    }
}

fn www_authenticate(authority: &str, description: &str) -> String {
    format!(
        "Bearer authorization_uri=\"{authority}\", error=\"invalid_token\", \
         error_description=\"{description}\""
    )
}

/// `M/D/YYYY h:mm:ss AM` as ARM writes times in token messages.
fn us_time(secs: u64) -> String {
    let t = crate::time::rfc3339(secs); // YYYY-MM-DDTHH:MM:SSZ
    let (date, time) = t.trim_end_matches('Z').split_once('T').unwrap_or((&t, "00:00:00"));
    let mut d = date.split('-').map(|p| p.parse::<u32>().unwrap_or(0));
    let (y, m, day) = (d.next().unwrap_or(0), d.next().unwrap_or(0), d.next().unwrap_or(0));
    let mut tp = time.split(':').map(|p| p.parse::<u32>().unwrap_or(0));
    let (h, mi, s) = (tp.next().unwrap_or(0), tp.next().unwrap_or(0), tp.next().unwrap_or(0));
    let (h12, ampm) = match h {
        0 => (12, "AM"),
        1..=11 => (h, "AM"),
        12 => (12, "PM"),
        _ => (h - 12, "PM"),
    };
    format!("{m}/{day}/{y} {h12}:{mi:02}:{s:02} {ampm}")
}
