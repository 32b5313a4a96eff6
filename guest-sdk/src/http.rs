//! A blocking HTTP client over `wasi:http/outgoing-handler`.
//!
//! Written on the raw `wasip2` bindings because the host's error codes must reach the
//! plugin intact (a denied host, a blocked IP, a size cap, a timeout each mean something
//! different to `classify`), and because the request body is finished *before* the
//! request is handed to the host: a client that uploads and waits at the same time turns
//! a denied request into a misleading "connection reset".
//!
//! Every call to the backend goes through [`Request::send`], which either returns the
//! backend's answer (any status) or a transport [`HttpError`]. The JSON helpers add
//! "non-2xx is an error" on top.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::Duration;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, IncomingBody, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

pub use wasip2::http::types::{ErrorCode, HeaderError, Method};

/// Per-request transport timeouts, passed to the host as `wasi:http` request options.
///
/// The host clamps them to its own limits, so these are the plugin's wishes; `None`
/// leaves the host's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Option<Duration>,
    pub first_byte: Option<Duration>,
    pub between_bytes: Option<Duration>,
}

impl Default for Timeouts {
    /// Short enough that a hung backend fails a reconcile well inside the host's per-call
    /// deadline, long enough for a slow cloud API to start answering.
    fn default() -> Self {
        Timeouts {
            connect: Some(Duration::from_secs(5)),
            first_byte: Some(Duration::from_secs(30)),
            between_bytes: Some(Duration::from_secs(30)),
        }
    }
}

/// Why a request got no usable answer.
#[derive(Debug)]
pub enum HttpError {
    /// No answer: the host refused the request or the connection failed. Carries the
    /// `wasi:http` error code the host gave.
    Transport(ErrorCode),
    /// The backend answered, with a status the caller did not accept. `retry_after` is
    /// the answer's `Retry-After` in seconds, when it gave one as a number (rate limits).
    Status {
        status: u16,
        body: Vec<u8>,
        retry_after: Option<u64>,
    },
    /// The URL cannot be sent: no or unknown scheme, no host, user info.
    InvalidUrl(String),
    /// The host refused a header (`Forbidden` for e.g. `Host`, which follows the URL).
    Header { name: String, error: HeaderError },
    /// A body could not be encoded or a success answer could not be decoded as JSON.
    Json(String),
}

impl HttpError {
    /// A short CamelCase name for the error, used as the provider error's `code`: the bare
    /// `wasi:http` variant for transport errors (`HttpRequestDenied`, ...).
    pub fn code_name(&self) -> String {
        match self {
            HttpError::Transport(code) => error_code_name(code).to_string(),
            HttpError::Status { status, .. } => format!("HTTP{status}"),
            HttpError::InvalidUrl(_) => "InvalidUrl".to_string(),
            HttpError::Header { error, .. } => match error {
                HeaderError::InvalidSyntax => "HeaderInvalidSyntax",
                HeaderError::Forbidden => "HeaderForbidden",
                HeaderError::Immutable => "HeaderImmutable",
            }
            .to_string(),
            HttpError::Json(_) => "InvalidJson".to_string(),
        }
    }

    /// The conventional `target-status.reason` for this failure in a health check:
    /// `Timeout`, `Unreachable`, `Unauthorized`, `Forbidden` or `APIError`.
    pub fn reason(&self) -> &'static str {
        match self {
            HttpError::Transport(code) if is_timeout(code) => "Timeout",
            HttpError::Transport(_) => "Unreachable",
            HttpError::Status { status: 401, .. } => "Unauthorized",
            HttpError::Status { status: 403, .. } => "Forbidden",
            _ => "APIError",
        }
    }

    /// The HTTP status, when the backend answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Transport(code) => {
                write!(f, "HTTP request failed: {}", error_code_name(code))?;
                match code {
                    ErrorCode::DnsError(p) => {
                        if let Some(rcode) = &p.rcode {
                            write!(f, " ({rcode})")?;
                        }
                    }
                    ErrorCode::TlsAlertReceived(p) => {
                        if let Some(m) = &p.alert_message {
                            write!(f, " ({m})")?;
                        }
                    }
                    ErrorCode::HttpResponseBodySize(Some(n))
                    | ErrorCode::HttpRequestBodySize(Some(n)) => write!(f, " ({n} bytes)")?,
                    ErrorCode::InternalError(Some(m)) => write!(f, " ({m})")?,
                    _ => {}
                }
                Ok(())
            }
            HttpError::Status { status, body, .. } => {
                write!(f, "backend answered HTTP {status}")?;
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                if !text.is_empty() {
                    // Enough to show the backend's own message; bodies can be large.
                    let cut: String = text.chars().take(300).collect();
                    write!(f, ": {cut}")?;
                }
                Ok(())
            }
            HttpError::InvalidUrl(why) => write!(f, "invalid URL: {why}"),
            HttpError::Header { name, error } => {
                let why = match error {
                    HeaderError::InvalidSyntax => "invalid syntax",
                    HeaderError::Forbidden => "forbidden",
                    HeaderError::Immutable => "immutable",
                };
                write!(f, "header {name:?} refused: {why}")
            }
            HttpError::Json(why) => write!(f, "JSON: {why}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// The bare variant name of a `wasi:http` error code, e.g. `DestinationIpProhibited`.
pub fn error_code_name(code: &ErrorCode) -> &'static str {
    use ErrorCode as E;
    match code {
        E::DnsTimeout => "DnsTimeout",
        E::DnsError(_) => "DnsError",
        E::DestinationNotFound => "DestinationNotFound",
        E::DestinationUnavailable => "DestinationUnavailable",
        E::DestinationIpProhibited => "DestinationIpProhibited",
        E::DestinationIpUnroutable => "DestinationIpUnroutable",
        E::ConnectionRefused => "ConnectionRefused",
        E::ConnectionTerminated => "ConnectionTerminated",
        E::ConnectionTimeout => "ConnectionTimeout",
        E::ConnectionReadTimeout => "ConnectionReadTimeout",
        E::ConnectionWriteTimeout => "ConnectionWriteTimeout",
        E::ConnectionLimitReached => "ConnectionLimitReached",
        E::TlsProtocolError => "TlsProtocolError",
        E::TlsCertificateError => "TlsCertificateError",
        E::TlsAlertReceived(_) => "TlsAlertReceived",
        E::HttpRequestDenied => "HttpRequestDenied",
        E::HttpRequestLengthRequired => "HttpRequestLengthRequired",
        E::HttpRequestBodySize(_) => "HttpRequestBodySize",
        E::HttpRequestMethodInvalid => "HttpRequestMethodInvalid",
        E::HttpRequestUriInvalid => "HttpRequestUriInvalid",
        E::HttpRequestUriTooLong => "HttpRequestUriTooLong",
        E::HttpRequestHeaderSectionSize(_) => "HttpRequestHeaderSectionSize",
        E::HttpRequestHeaderSize(_) => "HttpRequestHeaderSize",
        E::HttpRequestTrailerSectionSize(_) => "HttpRequestTrailerSectionSize",
        E::HttpRequestTrailerSize(_) => "HttpRequestTrailerSize",
        E::HttpResponseIncomplete => "HttpResponseIncomplete",
        E::HttpResponseHeaderSectionSize(_) => "HttpResponseHeaderSectionSize",
        E::HttpResponseHeaderSize(_) => "HttpResponseHeaderSize",
        E::HttpResponseBodySize(_) => "HttpResponseBodySize",
        E::HttpResponseTrailerSectionSize(_) => "HttpResponseTrailerSectionSize",
        E::HttpResponseTrailerSize(_) => "HttpResponseTrailerSize",
        E::HttpResponseTransferCoding(_) => "HttpResponseTransferCoding",
        E::HttpResponseContentCoding(_) => "HttpResponseContentCoding",
        E::HttpResponseTimeout => "HttpResponseTimeout",
        E::HttpUpgradeFailed => "HttpUpgradeFailed",
        E::HttpProtocolError => "HttpProtocolError",
        E::LoopDetected => "LoopDetected",
        E::ConfigurationError => "ConfigurationError",
        E::InternalError(_) => "InternalError",
    }
}

/// Whether a transport error is a timeout (for `check` reasons like `Timeout`).
pub fn is_timeout(code: &ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::DnsTimeout
            | ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout
    )
}

/// Percent-encode a query or path component (everything but RFC 3986 unreserved
/// characters), e.g. a label filter `k=v` whose key holds `/` and `.`.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The backend's answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of a header, matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The answer, or [`HttpError::Status`] when it is not 2xx.
    pub fn error_for_status(self) -> Result<Response, HttpError> {
        if self.is_success() {
            return Ok(self);
        }
        // Only the delta-seconds form: backends send it for rate limits, and an HTTP date
        // would need a date parser for a value that only goes into a message.
        let retry_after = self
            .header("retry-after")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse().ok());
        Err(HttpError::Status {
            status: self.status,
            body: self.body,
            retry_after,
        })
    }

    /// Decode the body as JSON (whatever the status).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| HttpError::Json(e.to_string()))
    }
}

/// One request, built up and then sent with [`Request::send`].
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    body_error: Option<String>,
    timeouts: Timeouts,
}

impl Request {
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Request {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            body_error: None,
            timeouts: Timeouts::default(),
        }
    }

    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }

    pub fn post(url: impl Into<String>) -> Self {
        Self::new(Method::Post, url)
    }

    pub fn put(url: impl Into<String>) -> Self {
        Self::new(Method::Put, url)
    }

    pub fn patch(url: impl Into<String>) -> Self {
        Self::new(Method::Patch, url)
    }

    pub fn delete(url: impl Into<String>) -> Self {
        Self::new(Method::Delete, url)
    }

    /// Add a header. A name the host refuses (e.g. `Host`) fails at [`send`](Self::send)
    /// with [`HttpError::Header`].
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// The raw body, sent byte for byte.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// A JSON body with `content-type: application/json`. An encoding failure is reported
    /// by `send`, so the builder stays chainable.
    pub fn json<B: Serialize + ?Sized>(mut self, body: &B) -> Self {
        match serde_json::to_vec(body) {
            Ok(bytes) => self.body = bytes,
            Err(e) => self.body_error = Some(e.to_string()),
        }
        self.header("content-type", "application/json")
    }

    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.timeouts.connect = Some(d);
        self
    }

    pub fn first_byte_timeout(mut self, d: Duration) -> Self {
        self.timeouts.first_byte = Some(d);
        self
    }

    pub fn between_bytes_timeout(mut self, d: Duration) -> Self {
        self.timeouts.between_bytes = Some(d);
        self
    }

    /// Send and decode a 2xx JSON answer; any other status is [`HttpError::Status`].
    pub fn send_json<T: DeserializeOwned>(self) -> Result<T, HttpError> {
        self.header("accept", "application/json")
            .send()?
            .error_for_status()?
            .json()
    }

    /// Send, and accept only a 2xx answer ([`Response::error_for_status`]): for calls
    /// whose answer body does not matter (a delete, an update).
    pub fn send_ok(self) -> Result<Response, HttpError> {
        self.send()?.error_for_status()
    }

    /// Send the request and read the whole answer. Any status is `Ok`; only a request that
    /// got no answer (or could not be built) is an error.
    pub fn send(self) -> Result<Response, HttpError> {
        if let Some(e) = self.body_error {
            return Err(HttpError::Json(e));
        }
        let target = split_url(&self.url)?;

        let fields = Fields::new();
        for (name, value) in &self.headers {
            fields
                .append(name, value)
                .map_err(|error| HttpError::Header {
                    name: name.clone(),
                    error,
                })?;
        }
        let request = OutgoingRequest::new(fields);
        let invalid = |what: &str| HttpError::InvalidUrl(format!("host refused the {what}"));
        request
            .set_method(&self.method)
            .map_err(|()| invalid("method"))?;
        request
            .set_scheme(Some(&target.scheme))
            .map_err(|()| invalid("scheme"))?;
        request
            .set_authority(Some(&target.authority))
            .map_err(|()| invalid("authority"))?;
        request
            .set_path_with_query(Some(&target.path_and_query))
            .map_err(|()| invalid("path"))?;

        let options = RequestOptions::new();
        // A host that does not support a timeout keeps its own; nothing to do about it.
        let ns = |d: Option<Duration>| d.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
        let _ = options.set_connect_timeout(ns(self.timeouts.connect));
        let _ = options.set_first_byte_timeout(ns(self.timeouts.first_byte));
        let _ = options.set_between_bytes_timeout(ns(self.timeouts.between_bytes));

        let body = request
            .body()
            .map_err(|()| internal("request body taken twice"))?;
        let mut request = Some(request);
        let mut options = Some(options);
        let mut future = None;
        {
            let out = body
                .write()
                .map_err(|()| internal("body stream taken twice"))?;
            let mut rest: &[u8] = &self.body;
            while !rest.is_empty() {
                let permit = match out.check_write() {
                    Ok(n) => n,
                    // The host dropped the body: the real reason comes with the response.
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => return Err(io_error(&e)),
                };
                if permit == 0 {
                    // The host buffers only a little before the request is dispatched;
                    // dispatch now and stream the rest.
                    if let Some(req) = request.take() {
                        future = Some(
                            outgoing_handler::handle(req, options.take())
                                .map_err(HttpError::Transport)?,
                        );
                    }
                    out.subscribe().block();
                    continue;
                }
                let n = rest
                    .len()
                    .min(usize::try_from(permit).unwrap_or(usize::MAX));
                match out.write(&rest[..n]) {
                    Ok(()) => rest = &rest[n..],
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => return Err(io_error(&e)),
                }
            }
        }
        OutgoingBody::finish(body, None).map_err(HttpError::Transport)?;
        let future = match (future, request) {
            (Some(f), _) => f,
            (None, Some(req)) => {
                outgoing_handler::handle(req, options.take()).map_err(HttpError::Transport)?
            }
            (None, None) => return Err(internal("request neither sent nor pending")),
        };

        let response = loop {
            match future.get() {
                Some(Ok(Ok(r))) => break r,
                Some(Ok(Err(code))) => return Err(HttpError::Transport(code)),
                Some(Err(())) => return Err(internal("response already taken")),
                None => future.subscribe().block(),
            }
        };

        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| (n, v.to_vec()))
            .collect();
        let incoming = response
            .consume()
            .map_err(|()| internal("response body taken twice"))?;
        let mut bytes = Vec::new();
        {
            let stream = incoming
                .stream()
                .map_err(|()| internal("response stream taken twice"))?;
            loop {
                match stream.blocking_read(64 * 1024) {
                    Ok(chunk) => bytes.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => return Err(io_error(&e)),
                }
            }
        }
        let _trailers = IncomingBody::finish(incoming);
        Ok(Response {
            status,
            headers,
            body: bytes,
        })
    }
}

fn internal(what: &str) -> HttpError {
    HttpError::Transport(ErrorCode::InternalError(Some(what.to_string())))
}

fn io_error(e: &wasip2::io::error::Error) -> HttpError {
    let code = wasip2::http::types::http_error_code(e)
        .unwrap_or_else(|| ErrorCode::InternalError(Some(e.to_debug_string())));
    HttpError::Transport(code)
}

/// A base URL plus the headers and timeouts every request to one API shares (auth,
/// content negotiation).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    headers: Vec<(String, Vec<u8>)>,
    timeouts: Timeouts,
}

impl Client {
    /// `base` is joined with each request's path (`http://host:port` + `/v1/x`).
    pub fn new(base: impl Into<String>) -> Self {
        Client {
            base: base.into().trim_end_matches('/').to_string(),
            headers: Vec::new(),
            timeouts: Timeouts::default(),
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// A request to `base + path` carrying the client's headers and timeouts.
    pub fn request(&self, method: Method, path: &str) -> Request {
        let mut req =
            Request::new(method, format!("{}{}", self.base, path)).timeouts(self.timeouts);
        req.headers.extend(self.headers.iter().cloned());
        req
    }

    pub fn get(&self, path: &str) -> Request {
        self.request(Method::Get, path)
    }

    pub fn post(&self, path: &str) -> Request {
        self.request(Method::Post, path)
    }

    pub fn put(&self, path: &str) -> Request {
        self.request(Method::Put, path)
    }

    pub fn delete(&self, path: &str) -> Request {
        self.request(Method::Delete, path)
    }

    /// GET and decode a 2xx JSON answer.
    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, HttpError> {
        self.get(path).send_json()
    }

    /// POST a JSON body and decode a 2xx JSON answer.
    pub fn post_json<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, HttpError> {
        self.post(path).json(body).send_json()
    }
}

/// GET `url` and decode a 2xx JSON answer.
pub fn get_json<T: DeserializeOwned>(url: &str) -> Result<T, HttpError> {
    Request::get(url).send_json()
}

/// POST a JSON body to `url` and decode a 2xx JSON answer.
pub fn post_json<B: Serialize + ?Sized, T: DeserializeOwned>(
    url: &str,
    body: &B,
) -> Result<T, HttpError> {
    Request::post(url).json(body).send_json()
}

#[derive(Debug)]
struct Target {
    scheme: Scheme,
    authority: String,
    path_and_query: String,
}

fn split_url(url: &str) -> Result<Target, HttpError> {
    let bad = |why: &str| HttpError::InvalidUrl(format!("{why}: {url:?}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(bad("scheme is not http or https")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    // Credentials in URLs end up in logs; secrets go in headers, read from secret files.
    if authority.contains('@') {
        return Err(bad("user info in URL"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("whitespace in URL"));
    }
    let tail = rest[end..].split('#').next().unwrap_or_default();
    let path_and_query = if tail.is_empty() {
        "/".to_string()
    } else if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_string()
    };
    Ok(Target {
        scheme,
        authority: authority.to_string(),
        path_and_query,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> (String, String, String) {
        let t = split_url(url).unwrap();
        let scheme = match t.scheme {
            Scheme::Http => "http".to_string(),
            Scheme::Https => "https".to_string(),
            Scheme::Other(s) => s,
        };
        (scheme, t.authority, t.path_and_query)
    }

    #[test]
    fn splits_urls() {
        assert_eq!(
            parts("http://127.0.0.1:8080/v1/instances?name=a"),
            (
                "http".into(),
                "127.0.0.1:8080".into(),
                "/v1/instances?name=a".into()
            )
        );
        assert_eq!(
            parts("HTTPS://api.example.com"),
            ("https".into(), "api.example.com".into(), "/".into())
        );
        assert_eq!(
            parts("http://h?x=1#frag"),
            ("http".into(), "h".into(), "/?x=1".into())
        );
        assert_eq!(parts("http://[::1]:80/a#b").2, "/a");
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "127.0.0.1:80/x",
            "ftp://h/x",
            "http:///x",
            "http://user:pw@h/x",
            "http://h/a b",
        ] {
            assert!(
                matches!(split_url(bad), Err(HttpError::InvalidUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn code_names_are_bare_variants() {
        let name = |c| HttpError::Transport(c).code_name();
        assert_eq!(name(ErrorCode::HttpRequestDenied), "HttpRequestDenied");
        assert_eq!(
            name(ErrorCode::DestinationIpProhibited),
            "DestinationIpProhibited"
        );
        assert_eq!(
            name(ErrorCode::HttpResponseBodySize(Some(10))),
            "HttpResponseBodySize"
        );
        assert_eq!(
            name(ErrorCode::ConnectionReadTimeout),
            "ConnectionReadTimeout"
        );
        let header = HttpError::Header {
            name: "host".into(),
            error: HeaderError::Forbidden,
        };
        assert_eq!(header.code_name(), "HeaderForbidden");
    }

    #[test]
    fn check_reasons() {
        let reason = |e: HttpError| e.reason();
        assert_eq!(
            reason(HttpError::Transport(ErrorCode::ConnectionTimeout)),
            "Timeout"
        );
        assert_eq!(
            reason(HttpError::Transport(ErrorCode::ConnectionRefused)),
            "Unreachable"
        );
        let status = |s| HttpError::Status {
            status: s,
            body: vec![],
            retry_after: None,
        };
        assert_eq!(reason(status(401)), "Unauthorized");
        assert_eq!(reason(status(403)), "Forbidden");
        assert_eq!(reason(status(500)), "APIError");
    }

    #[test]
    fn display_is_readable() {
        let e = HttpError::Transport(ErrorCode::HttpResponseBodySize(Some(1024)));
        assert_eq!(
            e.to_string(),
            "HTTP request failed: HttpResponseBodySize (1024 bytes)"
        );
        let e = HttpError::Status {
            status: 503,
            body: b" busy \n".to_vec(),
            retry_after: None,
        };
        assert_eq!(e.to_string(), "backend answered HTTP 503: busy");
        assert_eq!(e.status(), Some(503));
    }

    #[test]
    fn encodes_components() {
        assert_eq!(
            encode_component("egress.proxy-operator.dev/uid=a b"),
            "egress.proxy-operator.dev%2Fuid%3Da%20b"
        );
    }

    #[test]
    fn response_helpers() {
        let r = Response {
            status: 404,
            headers: vec![("Content-Type".into(), b"application/json".to_vec())],
            body: br#"{"error":"gone"}"#.to_vec(),
        };
        assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["error"], "gone");
        assert!(matches!(
            r.clone().error_for_status(),
            Err(HttpError::Status {
                status: 404,
                retry_after: None,
                ..
            })
        ));
        let limited = |value: &str| Response {
            status: 429,
            headers: vec![("Retry-After".into(), value.as_bytes().to_vec())],
            body: vec![],
        };
        for (value, want) in [
            ("30", Some(30)),
            (" 7 ", Some(7)),
            ("Wed, 21 Oct 2015 07:28:00 GMT", None),
            ("-1", None),
        ] {
            match limited(value).error_for_status() {
                Err(HttpError::Status { retry_after, .. }) => {
                    assert_eq!(retry_after, want, "{value}")
                }
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn client_joins_paths() {
        let c = Client::new("http://h:1/").bearer_auth("t");
        let r = c.get("/v1/x");
        assert_eq!(r.url, "http://h:1/v1/x");
        assert_eq!(r.headers[0].0, "authorization");
    }
}
