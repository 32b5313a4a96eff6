//! A thin client for the EC2 Query API: form-encoded POSTs to `/`, signed with SigV4,
//! answered in XML. It turns every failure into one [`Ec2Error`], and [`classify`] is the
//! one place that turns those into the operator's error classes.

use crate::config::Endpoint;
use crate::sigv4::{self, Credentials};
use crate::wire::{self, ApiError, Page};
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{HttpError, Request, Timeouts};
use egress_guest_sdk::{ProviderError, debug, warn};
use std::fmt;
use std::time::Duration;

/// The API version every parameter name and answer shape here follows.
const API_VERSION: &str = "2016-11-15";

/// Bounds per request. Create makes a few requests plus a bounded wait for visibility, all
/// inside the host's per-call budget (60 s by default); a hung backend must fail one
/// request, not the whole budget.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(5)),
    first_byte: Some(Duration::from_secs(15)),
    between_bytes: Some(Duration::from_secs(10)),
};

/// Credentials come from the provider's secrets under these keys.
pub const SECRET_ACCESS_KEY_ID: &str = "accessKeyId";
pub const SECRET_SECRET_ACCESS_KEY: &str = "secretAccessKey";
pub const SECRET_SESSION_TOKEN: &str = "sessionToken";

/// Read the credentials now: secrets are re-read on every call so rotation needs no restart.
pub fn credentials() -> Result<Credentials, ProviderError> {
    let session_token = match egress_guest_sdk::secret_string(SECRET_SESSION_TOKEN) {
        Ok(t) => Some(t).filter(|t| !t.is_empty()),
        // Optional: long-term keys have none, so the entry may name no such secret, or
        // name a key the mounted Secret does not have (no file). A Secret mount swaps all
        // its files at once, so a token file never lags the keys it belongs to.
        Err(e)
            if matches!(
                e.code.as_deref(),
                Some("SecretNotConfigured" | "SecretMissing")
            ) =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    let access_key_id = egress_guest_sdk::secret_string(SECRET_ACCESS_KEY_ID)?;
    let secret_access_key = egress_guest_sdk::secret_string(SECRET_SECRET_ACCESS_KEY)?;
    if access_key_id.is_empty() || secret_access_key.is_empty() {
        // An optional Secret mount that exists but is still empty: wait for it.
        return Err(ProviderError::transient(
            "AWS credentials are empty (secrets accessKeyId / secretAccessKey)",
        )
        .with_code("SecretEmpty"));
    }
    Ok(Credentials {
        access_key_id,
        secret_access_key,
        session_token,
    })
}

/// One region's API.
pub struct Ec2 {
    pub region: String,
    pub endpoint: Endpoint,
    creds: Credentials,
}

/// Why a call failed.
#[derive(Debug)]
pub enum Ec2Error {
    /// No answer (the host's or the network's error code).
    Transport { call: String, error: HttpError },
    /// EC2 refused, with its own code.
    Api {
        call: String,
        status: u16,
        error: ApiError,
    },
    /// An answer that is not what EC2 sends: a proxy's error page, a truncated body.
    Unexpected {
        call: String,
        status: u16,
        what: String,
    },
}

impl Ec2Error {
    /// EC2's error code, if EC2 gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Api { error, .. } => Some(&error.code),
            _ => None,
        }
    }

    /// A health-check reason: the shared words of the contract.
    pub fn reason(&self) -> &'static str {
        match self {
            Ec2Error::Transport { error, .. } => error.reason(),
            Ec2Error::Api { status, error, .. } => EC2.reason(*status, Some(&error.code)),
            Ec2Error::Unexpected { .. } => "APIError",
        }
    }
}

impl fmt::Display for Ec2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ec2Error::Transport { call, error } => write!(f, "EC2 {call}: {error}"),
            Ec2Error::Api {
                call,
                status,
                error,
            } => {
                write!(f, "EC2 {call}: {} (HTTP {status})", error.code)?;
                if !error.message.is_empty() {
                    write!(f, ": {}", error.message)?;
                }
                if !error.request_id.is_empty() {
                    write!(f, " [request {}]", error.request_id)?;
                }
                Ok(())
            }
            Ec2Error::Unexpected { call, status, what } => {
                write!(f, "EC2 {call}: unexpected answer (HTTP {status}): {what}")
            }
        }
    }
}

impl Ec2 {
    pub fn new(region: &str, endpoint: Endpoint, creds: Credentials) -> Ec2 {
        Ec2 {
            region: region.to_string(),
            endpoint,
            creds,
        }
    }

    /// Call `action` and return the body of a 2xx answer.
    pub fn call(&self, action: &str, params: &[(String, String)]) -> Result<String, Ec2Error> {
        let call = format!("{action} in {}", self.region);
        let body = form_body(action, params);
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let headers = [("content-type", content_type)];
        let signed = sigv4::sign(
            &sigv4::Request {
                method: "POST",
                authority: &self.endpoint.authority,
                path: "/",
                query: "",
                headers: &headers,
                body: body.as_bytes(),
            },
            &self.creds,
            &self.region,
            "ec2",
            &sigv4::amz_date(egress_guest_sdk::time::now().seconds),
        );
        let mut req = Request::post(format!("{}/", self.endpoint.base))
            .header("content-type", content_type)
            .timeouts(TIMEOUTS)
            .body(body);
        for (name, value) in signed {
            req = req.header(name, value);
        }
        let resp = match req.send() {
            Ok(r) => r,
            Err(error) => {
                warn!("EC2 {call}: no answer: {error}");
                return Err(Ec2Error::Transport { call, error });
            }
        };
        let status = resp.status;
        debug!("EC2 {call}: HTTP {status}, {} bytes", resp.body.len());
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        if resp.is_success() {
            return Ok(text);
        }
        let err = match wire::parse_error(&text) {
            Some(error) => Ec2Error::Api {
                call,
                status,
                error,
            },
            None => Ec2Error::Unexpected {
                call,
                status,
                what: snippet(&text),
            },
        };
        // "Not found" is an expected answer (polling for visibility, get after delete).
        if err.code() == Some("InvalidInstanceID.NotFound") {
            debug!("{err}");
        } else {
            warn!("{err}");
        }
        Err(err)
    }

    /// Call an action that answers with instances, and parse them.
    pub fn instances(&self, action: &str, params: &[(String, String)]) -> Result<Page, Ec2Error> {
        let body = self.call(action, params)?;
        wire::parse_instances(&body).map_err(|what| self.unexpected(action, what))
    }

    /// A 2xx answer to `action` that is not what EC2 sends (`what` says how).
    pub fn unexpected(&self, action: &str, what: String) -> Ec2Error {
        Ec2Error::Unexpected {
            call: format!("{action} in {}", self.region),
            status: 200,
            what,
        }
    }
}

/// `Action=..&Version=..&k=v..`, every key and value RFC 3986-encoded: the bytes that are
/// sent are the bytes that are signed.
pub fn form_body(action: &str, params: &[(String, String)]) -> String {
    let mut body = format!("Action={action}&Version={API_VERSION}");
    for (k, v) in params {
        body.push('&');
        body.push_str(&sigv4::uri_encode(k));
        body.push('=');
        body.push_str(&sigv4::uri_encode(v));
    }
    body
}

fn snippet(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        return "empty body".to_string();
    }
    t.chars().take(200).collect()
}

/// EC2's error codes onto kinds, first match wins. EC2 answers in XML, so the table is
/// used through [`Classifier::kind`] with the code `wire` parsed; an answer that is not
/// EC2's (`Ec2Error::Unexpected`) has no code and goes by status.
#[rustfmt::skip] // a table: one row per kind reads better than one code per line
const EC2: Classifier = Classifier {
    backend: "EC2",
    code_at: "",
    message_at: "",
    rules: &[
        // The one code that means "this instance does not exist".
        Rule::code("InvalidInstanceID.NotFound", Kind::Gone),
        // A state transition is in progress (the emulator's lock): try again.
        Rule::codes(&["IncorrectInstanceState", "IncorrectState"], Kind::Conflict),
        // The clock is off; NTP may fix it.
        Rule::codes(&["RequestExpired", "RequestTimeTooSkewed"], Kind::Retryable),
        // Quota, rate limit or capacity: the operator waits instead of backing off.
        Rule::codes(&["RequestLimitExceeded", "Throttling", "ThrottlingException"], Kind::RateLimited),
        Rule::codes(
            &[
                "InstanceLimitExceeded", "VcpuLimitExceeded", "ResourceLimitExceeded", "MaxIOPSLimitExceeded",
                "VolumeLimitExceeded", "AddressLimitExceeded", "InsufficientFreeAddressesInSubnet",
                "Insufficient*Capacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow",
            ],
            Kind::Quota,
        ),
        // The credentials themselves are refused: a fixed key or Secret is needed.
        Rule::codes(
            &[
                "AuthFailure", "SignatureDoesNotMatch", "InvalidClientTokenId", "UnrecognizedClientException",
                "MissingAuthenticationToken", "ExpiredToken", "RequestExpiredToken",
            ],
            Kind::Auth,
        ),
        // The credentials are fine but may not do this: an IAM or account change is needed.
        Rule::codes(
            &[
                "UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired", "Blocked",
                "PendingVerification",
            ],
            Kind::Forbidden,
        ),
        Rule::codes(&["InternalError", "InternalFailure", "Unavailable", "ServiceUnavailable"], Kind::Retryable),
        // Retrying the same request can never succeed: fix the placement, the config, IAM.
        Rule::codes(
            &[
                "MissingParameter", "UnknownParameter", "Unsupported", "UnsupportedOperation", "OperationNotPermitted",
                "IdempotentParameterMismatch", "IncompleteSignature", "InvalidAction", "DryRunOperation", "Invalid*",
                "*.Malformed",
            ],
            Kind::Invalid,
        ),
        // Codes not listed, and answers that are not EC2's: by status, transient when in
        // doubt.
        Rule::status(429, Kind::RateLimited),
        Rule::status(401, Kind::Auth),
        Rule::status(403, Kind::Forbidden),
    ],
};

/// The one place that maps EC2 failures onto the operator's error classes. Put EC2's own
/// code (or the transport error's name) in `code`.
pub fn classify(err: &Ec2Error) -> ProviderError {
    let msg = err.to_string();
    let (class, code) = match err {
        Ec2Error::Transport { error, .. } => (Kind::Retryable.class(), error.code_name()),
        Ec2Error::Unexpected { status, .. } => (
            EC2.kind(Some(*status), None).class(),
            format!("HTTP{status}"),
        ),
        Ec2Error::Api { status, error, .. } => (
            EC2.kind(Some(*status), Some(&error.code)).class(),
            error.code.clone(),
        ),
    };
    ProviderError::new(class, msg).with_code(code)
}
