//! The one place that turns a backend's failed answer into the contract's error classes,
//! as a table the plugin fills in.
//!
//! Every REST plugin needs the same decision: HTTP status plus the backend's own error
//! code (when its body carries one) to not-found, quota, transient or permanent. Written by
//! hand it is a `match` that drifts between plugins; here it is data, read top to bottom,
//! first match wins, and testable as a table. The class that matters most is not-found:
//! give [`Kind::Gone`] only to the backend's own "no such instance" (a status *and* its
//! code, or [`Rule::from_backend`]), never to a bare 404, which a wrong URL or a proxy
//! also answers.

use crate::http::HttpError;
use crate::{ErrorClass, ProviderError};

/// What a failed answer means. Finer than the four error classes, so health checks can
/// tell bad credentials from missing permissions, and logs can tell a rate limit from a
/// quota; [`class`](Kind::class) is what the operator acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The addressed instance does not exist (not-found). Only from the backend's own
    /// verdict.
    Gone,
    /// Too many requests: waiting helps (quota-exceeded), and the answer may say how long.
    RateLimited,
    /// An account limit or no capacity where asked (quota-exceeded).
    Quota,
    /// The credentials are refused (permanent; check reason `Unauthorized`).
    Auth,
    /// The credentials are fine but may not do this (permanent; reason `Forbidden`).
    Forbidden,
    /// Busy, locked or changed meanwhile: passes by itself (transient).
    Conflict,
    /// Server errors, maintenance, timeouts: passes by itself (transient).
    Retryable,
    /// The request can never succeed as sent: fix the spec or config (permanent).
    Invalid,
}

impl Kind {
    /// The contract's error class for this kind.
    pub fn class(self) -> ErrorClass {
        match self {
            Kind::Gone => ErrorClass::NotFound,
            Kind::RateLimited | Kind::Quota => ErrorClass::QuotaExceeded,
            Kind::Conflict | Kind::Retryable => ErrorClass::Transient,
            Kind::Auth | Kind::Forbidden | Kind::Invalid => ErrorClass::Permanent,
        }
    }
}

/// Which backend codes a rule matches.
#[derive(Clone, Copy, Debug)]
enum Code {
    /// Any answer, with or without a backend code.
    Any,
    /// Only answers whose body carried a backend code (so it came from the API).
    Present,
    /// A backend code equal to the pattern, where one `*` stands for any run of
    /// characters (`Invalid*`, `Insufficient*Capacity`).
    Glob(&'static str),
    /// A backend code equal to any of the patterns.
    AnyOf(&'static [&'static str]),
}

/// One row of the table: a status range and a code pattern, and the kind they mean.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    status: Option<(u16, u16)>,
    code: Code,
    kind: Kind,
}

impl Rule {
    /// A backend code (with at most one `*`), whatever the status. Codes are more precise
    /// than statuses (a quota can come as 403), so they go first.
    pub const fn code(pattern: &'static str, kind: Kind) -> Rule {
        Rule {
            status: None,
            code: Code::Glob(pattern),
            kind,
        }
    }

    /// Any of several backend codes (each with at most one `*`), whatever the status: one
    /// row per kind keeps a backend's long code list readable.
    pub const fn codes(patterns: &'static [&'static str], kind: Kind) -> Rule {
        Rule {
            status: None,
            code: Code::AnyOf(patterns),
            kind,
        }
    }

    /// A status, whether or not the body carried a backend code.
    pub const fn status(status: u16, kind: Kind) -> Rule {
        Rule {
            status: Some((status, status)),
            code: Code::Any,
            kind,
        }
    }

    /// A range of statuses, both ends included.
    pub const fn statuses(from: u16, to: u16, kind: Kind) -> Rule {
        Rule {
            status: Some((from, to)),
            code: Code::Any,
            kind,
        }
    }

    /// A status together with a backend code: how not-found should be written.
    pub const fn status_code(status: u16, pattern: &'static str, kind: Kind) -> Rule {
        Rule {
            status: Some((status, status)),
            code: Code::Glob(pattern),
            kind,
        }
    }

    /// This rule only for answers whose body is the backend's error envelope: a status
    /// from a load balancer's HTML page is not the API's verdict.
    pub const fn from_backend(mut self) -> Rule {
        if let Code::Any = self.code {
            self.code = Code::Present;
        }
        self
    }

    fn matches(&self, status: Option<u16>, code: Option<&str>) -> bool {
        let status_ok = match self.status {
            None => true,
            Some((lo, hi)) => status.is_some_and(|s| (lo..=hi).contains(&s)),
        };
        let code_ok = match self.code {
            Code::Any => true,
            Code::Present => code.is_some(),
            Code::Glob(pattern) => code.is_some_and(|c| glob(pattern, c)),
            Code::AnyOf(patterns) => code.is_some_and(|c| patterns.iter().any(|p| glob(p, c))),
        };
        status_ok && code_ok
    }
}

fn glob(pattern: &str, code: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == code,
        Some((pre, post)) => {
            code.len() >= pre.len() + post.len() && code.starts_with(pre) && code.ends_with(post)
        }
    }
}

/// The backend's own error, read from a failed answer's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    pub code: String,
    pub message: String,
}

/// A backend's classification table, and where its error bodies keep code and message.
pub struct Classifier {
    /// The backend's name in messages: `Hetzner API answered HTTP 423 locked: ...`.
    pub backend: &'static str,
    /// JSON pointer (RFC 6901) to the error code in an error body (`/error/code`); an
    /// answer without a string there is not the backend's envelope.
    pub code_at: &'static str,
    /// JSON pointer to the human message (`/error/message`); may be absent in a body.
    pub message_at: &'static str,
    /// Read top to bottom, first match wins; no match is [`Kind::Retryable`], the safe
    /// default (retrying an unknown failure costs a little; giving up on it costs a Proxy).
    pub rules: &'static [Rule],
}

impl Classifier {
    /// The kind of an answer with this status (`None`: no HTTP answer, e.g. an action's
    /// error) and backend code (`None`: the body was not the backend's).
    pub fn kind(&self, status: Option<u16>, code: Option<&str>) -> Kind {
        let rule = self.rules.iter().find(|r| r.matches(status, code));
        rule.map_or(Kind::Retryable, |r| r.kind)
    }

    /// The backend's error in a failed answer; `None` when the body is not its envelope
    /// (a proxy's HTML page, an empty 502).
    pub fn backend_error(&self, e: &HttpError) -> Option<BackendError> {
        let HttpError::Status { body, .. } = e else {
            return None;
        };
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let text = |at: &str| v.pointer(at).and_then(|x| x.as_str()).map(str::to_string);
        Some(BackendError {
            code: text(self.code_at)?,
            message: text(self.message_at).unwrap_or_default(),
        })
    }

    /// The kind of any failed request: transport failures and undecodable answers are
    /// retryable, a URL or header the host refuses is invalid.
    pub fn kind_of(&self, e: &HttpError) -> Kind {
        match e {
            HttpError::Status { status, .. } => {
                let code = self.backend_error(e).map(|b| b.code);
                self.kind(Some(*status), code.as_deref())
            }
            HttpError::Transport(_) | HttpError::Json(_) => Kind::Retryable,
            HttpError::InvalidUrl(_) | HttpError::Header { .. } => Kind::Invalid,
        }
    }

    /// Whether the backend said the addressed thing does not exist.
    pub fn is_gone(&self, e: &HttpError) -> bool {
        self.kind_of(e) == Kind::Gone
    }

    /// Whether the answer carries this backend code (for a code a call handles itself,
    /// such as a lost race for a name).
    pub fn has_code(&self, e: &HttpError, code: &str) -> bool {
        self.backend_error(e).is_some_and(|b| b.code == code)
    }

    /// The provider error for a failed request. With the backend's envelope the message
    /// is `<backend> API answered HTTP <status> <code>: <message>` and the code is the
    /// backend's; otherwise the transport's or status's description and name
    /// (`ConnectionRefused`, `HTTP502`). A rate limit's `Retry-After` is added to the
    /// message.
    pub fn classify(&self, e: HttpError) -> ProviderError {
        let kind = self.kind_of(&e);
        let (mut message, code) = match (self.backend_error(&e), e.status()) {
            (Some(b), Some(status)) => {
                let mut msg = format!("{} API answered HTTP {status} {}", self.backend, b.code);
                if !b.message.is_empty() {
                    msg = format!("{msg}: {}", b.message);
                }
                (msg, b.code)
            }
            _ => (e.to_string(), e.code_name()),
        };
        if let HttpError::Status {
            retry_after: Some(secs),
            ..
        } = e
        {
            message.push_str(&format!(" (retry after {secs} s)"));
        }
        ProviderError::new(kind.class(), message).with_code(code)
    }

    /// The conventional health-check reason of a backend answer: the kind's for
    /// credentials, else the status's (`Unauthorized`, `Forbidden`, `APIError`).
    pub fn reason(&self, status: u16, code: Option<&str>) -> &'static str {
        match (self.kind(Some(status), code), status) {
            (Kind::Auth, _) => "Unauthorized",
            (Kind::Forbidden, _) => "Forbidden",
            (_, 401) => "Unauthorized",
            (_, 403) => "Forbidden",
            _ => "APIError",
        }
    }

    /// [`reason`](Self::reason) for any failed request (`Timeout`, `Unreachable`, ...).
    pub fn reason_of(&self, e: &HttpError) -> &'static str {
        match e.status() {
            Some(status) => self.reason(status, self.backend_error(e).map(|b| b.code).as_deref()),
            None => e.reason(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ErrorCode;

    /// A backend shaped like most REST APIs: `{"error": {"code", "message"}}`.
    const TABLE: Classifier = Classifier {
        backend: "Test",
        code_at: "/error/code",
        message_at: "/error/message",
        rules: &[
            Rule::status_code(404, "not_found", Kind::Gone),
            Rule::code("rate_limited", Kind::RateLimited),
            Rule::code("Insufficient*Capacity", Kind::Quota),
            Rule::code("locked", Kind::Conflict),
            Rule::code("forbidden_code", Kind::Forbidden),
            Rule::codes(&["Invalid*", "*.Malformed", "bad_request"], Kind::Invalid),
            Rule::status(404, Kind::Gone).from_backend(),
            Rule::status(429, Kind::RateLimited),
            Rule::status(401, Kind::Auth),
            Rule::status(403, Kind::Forbidden),
            Rule::statuses(400, 499, Kind::Invalid),
        ],
    };

    fn answer(status: u16, body: &str, retry_after: Option<u64>) -> HttpError {
        HttpError::Status {
            status,
            body: body.as_bytes().to_vec(),
            retry_after,
        }
    }

    fn api(status: u16, code: &str) -> HttpError {
        answer(
            status,
            &format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#),
            None,
        )
    }

    #[test]
    fn classify_table() {
        use ErrorClass::*;
        let cases = [
            (api(404, "not_found"), Kind::Gone, NotFound, "not_found"),
            // A 404 that is not the backend's verdict is never "gone".
            (
                answer(404, "<html>no</html>", None),
                Kind::Invalid,
                Permanent,
                "HTTP404",
            ),
            (api(404, "brand_new"), Kind::Gone, NotFound, "brand_new"),
            (api(400, "not_found"), Kind::Invalid, Permanent, "not_found"),
            (
                api(403, "rate_limited"),
                Kind::RateLimited,
                QuotaExceeded,
                "rate_limited",
            ),
            (
                api(500, "InsufficientInstanceCapacity"),
                Kind::Quota,
                QuotaExceeded,
                "InsufficientInstanceCapacity",
            ),
            (
                api(500, "InsufficientCapacity"),
                Kind::Quota,
                QuotaExceeded,
                "InsufficientCapacity",
            ),
            (
                api(400, "Insufficient"),
                Kind::Invalid,
                Permanent,
                "Insufficient",
            ),
            (api(423, "locked"), Kind::Conflict, Transient, "locked"),
            (
                api(400, "InvalidParameterValue"),
                Kind::Invalid,
                Permanent,
                "InvalidParameterValue",
            ),
            (
                api(400, "Filter.Malformed"),
                Kind::Invalid,
                Permanent,
                "Filter.Malformed",
            ),
            (
                api(500, "bad_request"),
                Kind::Invalid,
                Permanent,
                "bad_request",
            ),
            (
                api(500, "bad_request_2"),
                Kind::Retryable,
                Transient,
                "bad_request_2",
            ),
            (
                answer(429, "", None),
                Kind::RateLimited,
                QuotaExceeded,
                "HTTP429",
            ),
            (answer(401, "", None), Kind::Auth, Permanent, "HTTP401"),
            (api(403, "whatever"), Kind::Forbidden, Permanent, "whatever"),
            (
                api(503, "unavailable"),
                Kind::Retryable,
                Transient,
                "unavailable",
            ),
            (
                answer(502, "<html>Bad Gateway</html>", None),
                Kind::Retryable,
                Transient,
                "HTTP502",
            ),
            // An envelope without a string code is not the backend's.
            (
                answer(404, r#"{"error":{"code":7}}"#, None),
                Kind::Invalid,
                Permanent,
                "HTTP404",
            ),
            (
                HttpError::Transport(ErrorCode::ConnectionRefused),
                Kind::Retryable,
                Transient,
                "ConnectionRefused",
            ),
            (
                HttpError::Json("eof".into()),
                Kind::Retryable,
                Transient,
                "InvalidJson",
            ),
            (
                HttpError::InvalidUrl("x".into()),
                Kind::Invalid,
                Permanent,
                "InvalidUrl",
            ),
        ];
        for (e, kind, class, code) in cases {
            let shown = e.to_string();
            assert_eq!(TABLE.kind_of(&e), kind, "{shown}");
            assert_eq!(TABLE.is_gone(&e), kind == Kind::Gone, "{shown}");
            let err = TABLE.classify(e);
            assert_eq!(
                (err.class, err.code.as_deref()),
                (class, Some(code)),
                "{shown}"
            );
        }
    }

    #[test]
    fn messages_and_retry_after() {
        let e = TABLE.classify(api(423, "locked"));
        assert_eq!(e.message, "Test API answered HTTP 423 locked: m");
        let e = TABLE.classify(answer(
            429,
            r#"{"error":{"code":"rate_limited"}}"#,
            Some(30),
        ));
        assert_eq!(
            e.message,
            "Test API answered HTTP 429 rate_limited (retry after 30 s)"
        );
        let e = TABLE.classify(answer(503, "busy", None));
        assert_eq!(e.message, "backend answered HTTP 503: busy");
        assert!(TABLE.has_code(&api(409, "uniqueness_error"), "uniqueness_error"));
        assert!(!TABLE.has_code(&answer(409, "uniqueness_error", None), "uniqueness_error"));
    }

    #[test]
    fn kinds_without_an_answer_and_reasons() {
        // An action's error code, with no HTTP status: only code rules apply.
        assert_eq!(TABLE.kind(None, Some("locked")), Kind::Conflict);
        assert_eq!(TABLE.kind(None, Some("not_found")), Kind::Retryable);
        assert_eq!(TABLE.kind(None, None), Kind::Retryable);

        let reasons = [
            (api(401, "x"), "Unauthorized"),
            // The code's kind wins over the status: a forbidden-kind code at 401.
            (api(401, "forbidden_code"), "Forbidden"),
            (api(403, "x"), "Forbidden"),
            (api(400, "InvalidX"), "APIError"),
            (api(500, "x"), "APIError"),
            (
                HttpError::Transport(ErrorCode::ConnectionTimeout),
                "Timeout",
            ),
            (
                HttpError::Transport(ErrorCode::ConnectionRefused),
                "Unreachable",
            ),
        ];
        for (e, want) in reasons {
            assert_eq!(TABLE.reason_of(&e), want, "{e}");
        }
    }
}
