//! AWS Signature Version 4, verified the way EC2 verifies it.
//!
//! The emulator checks every signature for real because signing is where EC2 plugins break
//! first: a wrong canonical query, an unsigned `host`, a session token left out, a region
//! taken from config instead of the endpoint. A verifier that accepted anything would let
//! all of that through to production.
//!
//! The computation is the documented one (canonical request -> string to sign -> key
//! derived from the secret, date, region and service -> HMAC), checked against AWS's
//! published test vectors in the tests below.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::time::Duration;

type HmacSha256 = Hmac<Sha256>;

pub(crate) const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key the emulator accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub access_key: String,
    pub secret_key: String,
    /// Session credentials (STS) must send this as `x-amz-security-token`; long-term keys
    /// must send none.
    pub session_token: Option<String>,
}

/// What EC2 answers when the signature itself is wrong (wrong secret, tampered request).
///
/// EC2 answered `SignatureDoesNotMatch` (HTTP 403) in captures up to about 2014 (aws-cli
/// issue 134) and `AuthFailure` (HTTP 401) in later ones (aws-sdk-java-v2 issue 2981), so a
/// plugin has to classify both as an authentication failure; this lets a test pick either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SignatureMismatch {
    #[default]
    AuthFailure,
    SignatureDoesNotMatch,
}

/// Why a request was refused, as the EC2 error it turns into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

pub(crate) const AUTH_FAILURE_MESSAGE: &str =
    "AWS was not able to validate the provided access credentials";

impl AuthError {
    pub(crate) fn auth_failure() -> Self {
        AuthError { status: 401, code: "AuthFailure", message: AUTH_FAILURE_MESSAGE.into() }
    }

    fn incomplete(message: String) -> Self {
        AuthError { status: 400, code: "IncompleteSignature", message }
    }

    fn mismatch(kind: SignatureMismatch) -> Self {
        match kind {
            SignatureMismatch::AuthFailure => AuthError::auth_failure(),
            SignatureMismatch::SignatureDoesNotMatch => AuthError {
                status: 403,
                code: "SignatureDoesNotMatch",
                message: "The request signature we calculated does not match the signature \
                          you provided. Check your AWS Secret Access Key and signing method. \
                          Consult the service documentation for details."
                    .into(),
            },
        }
    }
}

/// The parts of an HTTP request a signature covers.
pub(crate) struct SignedRequest<'a> {
    pub method: &'a str,
    /// The path exactly as sent (already percent-encoded by the client).
    pub path: &'a str,
    /// The raw query string, without `?`.
    pub query: &'a str,
    /// Header names and values as received (any case; repeated names allowed).
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
}

impl SignedRequest<'_> {
    fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.header_values(name).into_iter().next()
    }
}

/// Who signed an accepted request, and for which region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    pub access_key: String,
    pub region: String,
}

/// What the verifier needs besides the request.
pub(crate) struct Policy<'a> {
    pub credentials: &'a [Credential],
    pub known_region: &'a dyn Fn(&str) -> bool,
    pub service: &'a str,
    /// Unix seconds.
    pub now: u64,
    pub max_skew: Duration,
    pub mismatch: SignatureMismatch,
}

/// Check `req` as EC2 would, returning the signer and the region from the credential scope.
pub(crate) fn verify(req: &SignedRequest<'_>, policy: &Policy<'_>) -> Result<Verified, AuthError> {
    let Some(auth) = req.header("authorization") else {
        // Presigned (query-string) requests are not supported: EC2 plugins sign headers.
        return Err(AuthError {
            status: 403,
            code: "MissingAuthenticationToken",
            message: "The request must contain either a valid (registered) AWS access key ID \
                      or X.509 certificate."
                .into(),
        });
    };
    let parsed = parse_authorization(auth)?;
    let amz_date = req.header("x-amz-date");

    let mut missing = Vec::new();
    if parsed.credential.is_none() {
        missing.push("Authorization header requires 'Credential' parameter.".to_string());
    }
    if parsed.signature.is_none() {
        missing.push("Authorization header requires 'Signature' parameter.".to_string());
    }
    if parsed.signed_headers.is_none() {
        missing.push("Authorization header requires 'SignedHeaders' parameter.".to_string());
    }
    if amz_date.is_none() {
        missing.push(
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' \
             header."
                .to_string(),
        );
    }
    if !missing.is_empty() {
        missing.push(format!("Authorization={auth}"));
        return Err(AuthError::incomplete(missing.join(" ")));
    }
    let (Some(credential), Some(signature), Some(signed_headers), Some(amz_date)) =
        (parsed.credential, parsed.signature, parsed.signed_headers, amz_date)
    else {
        unreachable!("checked above");
    };

    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 {
        return Err(AuthError::incomplete(format!(
            "Credential should have exactly 5 slash-delimited elements, e.g. \
             keyid/date/region/service/term, got '{credential}'"
        )));
    }
    let (access_key, scope_date, region, service, terminator) =
        (scope[0], scope[1], scope[2], scope[3], scope[4]);

    let Some(signed_at) = parse_amz_date(amz_date) else {
        return Err(AuthError::incomplete(format!(
            "Date must be in ISO-8601 'basic format'. Got '{amz_date}'. See \
             http://en.wikipedia.org/wiki/ISO_8601"
        )));
    };
    let signed: Vec<String> =
        signed_headers.split(';').map(|h| h.trim().to_ascii_lowercase()).collect();
    if !signed.iter().any(|h| h == "host") {
        return Err(AuthError::incomplete(
            "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.".into(),
        ));
    }
    if !signed.iter().any(|h| h == "x-amz-date") {
        return Err(AuthError::incomplete(
            "'X-Amz-Date' must be a 'SignedHeader' in the AWS Authorization.".into(),
        ));
    }

    let Some(cred) = policy.credentials.iter().find(|c| c.access_key == access_key) else {
        return Err(AuthError::auth_failure());
    };
    // A key scoped to another service or a region this endpoint does not serve is refused
    // the way a real regional endpoint refuses it.
    if service != policy.service || terminator != "aws4_request" || !(policy.known_region)(region) {
        return Err(AuthError::auth_failure());
    }
    if scope_date != &amz_date[..8] {
        return Err(AuthError::mismatch(policy.mismatch));
    }
    if signed_at.abs_diff(policy.now) > policy.max_skew.as_secs() {
        return Err(AuthError {
            status: 400,
            code: "RequestExpired",
            message: "Request has expired.".into(),
        });
    }
    let token = req.header("x-amz-security-token");
    if token != cred.session_token.as_deref() {
        return Err(AuthError::auth_failure());
    }

    let canonical = canonical_request(req, &signed);
    let string_to_sign = string_to_sign(amz_date, scope_date, region, service, &canonical);
    let key = signing_key(&cred.secret_key, scope_date, region, service);
    let Ok(provided) = hex::decode(signature) else {
        return Err(AuthError::mismatch(policy.mismatch));
    };
    let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length");
    mac.update(string_to_sign.as_bytes());
    // The crate's comparison is constant-time; not needed on loopback, but free.
    if mac.verify_slice(&provided).is_err() {
        return Err(AuthError::mismatch(policy.mismatch));
    }
    Ok(Verified { access_key: access_key.to_string(), region: region.to_string() })
}

struct ParsedAuthorization<'a> {
    credential: Option<&'a str>,
    signed_headers: Option<&'a str>,
    signature: Option<&'a str>,
}

fn parse_authorization(auth: &str) -> Result<ParsedAuthorization<'_>, AuthError> {
    let Some(rest) = auth.strip_prefix(ALGORITHM).filter(|r| r.starts_with(' ') || r.is_empty())
    else {
        let algorithm = auth.split_whitespace().next().unwrap_or("");
        return Err(AuthError::incomplete(format!("Unsupported AWS 'algorithm': '{algorithm}'")));
    };
    let mut parsed =
        ParsedAuthorization { credential: None, signed_headers: None, signature: None };
    for part in rest.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            continue;
        };
        match k.trim() {
            "Credential" => parsed.credential = Some(v.trim()),
            "SignedHeaders" => parsed.signed_headers = Some(v.trim()),
            "Signature" => parsed.signature = Some(v.trim()),
            _ => {}
        }
    }
    Ok(parsed)
}

/// `20150830T123600Z` as Unix seconds.
pub(crate) fn parse_amz_date(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    if !b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit) {
        return None;
    }
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    );
    crate::time::parse_rfc3339(&rfc)
}

/// Unix seconds as `20150830T123600Z` (test-side signing).
#[cfg(test)]
pub(crate) fn format_amz_date(secs: u64) -> String {
    let rfc = crate::time::rfc3339(secs);
    rfc.replace(['-', ':'], "")
}

pub(crate) fn canonical_request(req: &SignedRequest<'_>, signed: &[String]) -> String {
    let mut sorted: Vec<&String> = signed.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut headers = String::new();
    for name in &sorted {
        let values: Vec<String> =
            req.header_values(name).into_iter().map(normalize_header_value).collect();
        headers.push_str(name);
        headers.push(':');
        headers.push_str(&values.join(","));
        headers.push('\n');
    }
    let path = if req.path.is_empty() { "/" } else { req.path };
    let signed_list: Vec<&str> = sorted.iter().map(|s| s.as_str()).collect();
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        path,
        canonical_query(req.query),
        headers,
        signed_list.join(";"),
        hex::encode(Sha256::digest(req.body))
    )
}

fn normalize_header_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decode each key and value, re-encode them the one way SigV4 allows, sort.
pub(crate) fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (uri_encode(&percent_decode(k, false)), uri_encode(&percent_decode(v, false)))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// RFC 3986 encoding of everything but the unreserved characters, as SigV4 requires.
pub(crate) fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decoding; `+` is a space only in form bodies, never in a canonical query.
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hi = (b[i + 1] as char).to_digit(16);
                let lo = (b[i + 2] as char).to_digit(16);
                match (hi, lo) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn string_to_sign(
    amz_date: &str,
    date: &str,
    region: &str,
    service: &str,
    canonical: &str,
) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

pub(crate) fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

/// The signature over `req` with the headers named in `signed` (test-side signing).
#[cfg(test)]
pub(crate) fn signature(
    req: &SignedRequest<'_>,
    signed: &[String],
    secret: &str,
    amz_date: &str,
    region: &str,
    service: &str,
) -> String {
    let canonical = canonical_request(req, signed);
    let sts = string_to_sign(amz_date, &amz_date[..8], region, service, &canonical);
    hex::encode(hmac(&signing_key(secret, &amz_date[..8], region, service), sts.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AKID: &str = "AKIDEXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn req<'a>(
        method: &'a str,
        path: &'a str,
        query: &'a str,
        headers: &[(&str, &str)],
        body: &'a [u8],
    ) -> SignedRequest<'a> {
        SignedRequest {
            method,
            path,
            query,
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// AWS SigV4 test suite, `get-vanilla` and `get-vanilla-query-order-key-case`
    /// (service `service`, region us-east-1, 2015-08-30T12:36:00Z).
    #[test]
    fn aws_test_suite_vectors() {
        let headers = [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")];
        let signed = names(&["host", "x-amz-date"]);
        let r = req("GET", "/", "", &headers, b"");
        assert_eq!(
            signature(&r, &signed, SECRET, "20150830T123600Z", "us-east-1", "service"),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        let r = req("GET", "/", "Param2=value2&Param1=value1", &headers, b"");
        assert_eq!(
            signature(&r, &signed, SECRET, "20150830T123600Z", "us-east-1", "service"),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
    }

    /// The worked example of the SigV4 documentation (IAM ListUsers over GET), whose
    /// derived key, canonical request hash and signature are all published.
    #[test]
    fn documented_iam_example() {
        let key = signing_key(SECRET, "20150830", "us-east-1", "iam");
        assert_eq!(
            hex::encode(key),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        let headers = [
            ("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
            ("Host", "iam.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ];
        let r = req("GET", "/", "Action=ListUsers&Version=2010-05-08", &headers, b"");
        let signed = names(&["content-type", "host", "x-amz-date"]);
        assert_eq!(
            hex::encode(Sha256::digest(canonical_request(&r, &signed).as_bytes())),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        assert_eq!(
            signature(&r, &signed, SECRET, "20150830T123600Z", "us-east-1", "iam"),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    fn policy<'a>(creds: &'a [Credential], now: u64) -> Policy<'a> {
        Policy {
            credentials: creds,
            known_region: &|r| r == "us-east-1",
            service: "service",
            now,
            max_skew: Duration::from_secs(15 * 60),
            mismatch: SignatureMismatch::AuthFailure,
        }
    }

    /// The verifier accepts the published get-vanilla request at its own time and refuses
    /// it a day later.
    #[test]
    fn verifier_accepts_the_published_request() {
        let creds = [Credential {
            access_key: AKID.into(),
            secret_key: SECRET.into(),
            session_token: None,
        }];
        let auth = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/\
                    aws4_request, SignedHeaders=host;x-amz-date, \
                    Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        let headers = [
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
            ("Authorization", auth),
        ];
        let r = req("GET", "/", "", &headers, b"");
        let t = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(
            verify(&r, &policy(&creds, t + 60)),
            Ok(Verified { access_key: AKID.into(), region: "us-east-1".into() })
        );
        assert_eq!(verify(&r, &policy(&creds, t + 86_400)).unwrap_err().code, "RequestExpired");
    }

    #[test]
    fn dates_and_encoding() {
        let t = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(format_amz_date(t), "20150830T123600Z");
        assert_eq!(parse_amz_date("2015-08-30T12:36:00Z"), None);
        assert_eq!(parse_amz_date("20151330T123600Z"), None);
        assert_eq!(uri_encode("a b/c~"), "a%20b%2Fc~");
        assert_eq!(percent_decode("a+b%2Fc%zz", true), "a b/c%zz");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(canonical_query("b=2&a=%2F&a=1"), "a=%2F&a=1&b=2");
    }
}
