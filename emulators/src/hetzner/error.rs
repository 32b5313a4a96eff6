//! Hetzner's error envelope, `{"error": {"code", "message", "details"}}`, with the status
//! each code travels with in the API reference's error table.
//!
//! Plugins classify on the code (and sometimes the status), so both must be the real ones;
//! messages are copied from captured real answers where one was found and paraphrased
//! otherwise, and no plugin should match on them.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One Hetzner API error. Public so tests can inject codes the shared [`FaultKind`]s do not
/// cover (`conflict`, `forbidden`, `maintenance`, ...) with
/// [`HetznerEmulator::inject_error`](super::HetznerEmulator::inject_error).
///
/// [`FaultKind`]: crate::control::FaultKind
#[derive(Debug, Clone, PartialEq)]
pub struct HetznerError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// `{}` when the code has no details; Hetzner sends an object (sometimes `null`).
    pub details: Value,
}

impl HetznerError {
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        HetznerError { status, code: code.into(), message: message.into(), details: json!({}) }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The body exactly as the API sends it.
    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message, "details": self.details}})
    }

    pub(crate) fn unauthorized() -> Self {
        // Message captured from the real API.
        Self::new(401, "unauthorized", "unable to authenticate")
    }

    pub(crate) fn json_error(reason: &str) -> Self {
        Self::new(400, "json_error", format!("invalid JSON in request body: {reason}"))
    }

    pub(crate) fn not_found(kind: &str, id: &str) -> Self {
        Self::new(404, "not_found", format!("{kind} with ID '{id}' not found"))
    }

    /// `invalid_input` for a value that fails a lookup (`image not found`, captured), which
    /// Hetzner sends without field details.
    pub(crate) fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(422, "invalid_input", message)
    }

    /// `invalid_input` naming fields, in the shape of the reference's example (one field)
    /// and of a captured answer (several fields).
    pub(crate) fn invalid_fields(fields: &[(String, String)]) -> Self {
        let message = match fields {
            [(name, msg)] => format!("invalid input in field '{name}': {msg}"),
            _ => {
                let names: Vec<String> = fields.iter().map(|(n, _)| format!("'{n}'")).collect();
                format!("invalid input in fields {}", names.join(", "))
            }
        };
        let details: Vec<Value> =
            fields.iter().map(|(name, msg)| json!({"name": name, "messages": [msg]})).collect();
        Self::new(422, "invalid_input", message).with_details(json!({ "fields": details }))
    }

    pub(crate) fn name_taken() -> Self {
        // Message captured from the real API.
        Self::new(409, "uniqueness_error", "server name is already used")
            .with_details(json!({"fields": [{"name": "name"}]}))
    }

    pub(crate) fn server_limit() -> Self {
        // Message captured from the real API; details in the reference's documented shape.
        Self::new(403, "resource_limit_exceeded", "server limit exceeded")
            .with_details(json!({"limits": [{"name": "server_limit"}]}))
    }

    pub(crate) fn rate_limited() -> Self {
        Self::rate_limited_at(3600)
    }

    /// Message and `details: null` captured from the real API (at its default 3600).
    pub(crate) fn rate_limited_at(per_hour: u32) -> Self {
        Self::new(
            429,
            "rate_limit_exceeded",
            format!("limit of {per_hour} requests per hour reached"),
        )
        .with_details(Value::Null)
    }

    pub(crate) fn locked(what: &str) -> Self {
        Self::new(423, "locked", format!("{what} is locked"))
    }

    pub(crate) fn server_error() -> Self {
        Self::new(500, "server_error", "Error within the API backend")
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "unavailable", message)
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(405, "method_not_allowed", "The request method is not allowed")
    }
}

impl IntoResponse for HetznerError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let rate_limited = self.code == "rate_limit_exceeded";
        let mut resp = (status, Json(self.body())).into_response();
        if rate_limited {
            // The gate fills the rate-limit headers on every other answer; a 429 must say
            // that nothing is left.
            resp.headers_mut().insert("ratelimit-remaining", HeaderValue::from_static("0"));
        }
        resp
    }
}

impl From<HetznerError> for crate::control::Refusal {
    fn from(e: HetznerError) -> Self {
        crate::control::Refusal { status: e.status, body: e.body() }
    }
}
