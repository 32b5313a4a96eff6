//! AWS Signature Version 4, computed in the guest.
//!
//! The host only moves bytes, so the plugin signs every request itself. Only header
//! signing is implemented (no presigned URLs, no chunked payloads): the EC2 Query API
//! needs nothing else. The computation follows the published algorithm step by step and
//! is pinned by AWS's own test vectors in the tests, because a signer that is only
//! checked against our own verifier (the emulator's) could share its mistakes.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// One set of AWS credentials, read from the provider's secrets on every call.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Present for temporary (STS) credentials; sent and signed as `x-amz-security-token`.
    pub session_token: Option<String>,
}

/// Keep the secret out of any `{:?}` by accident: errors and logs never need it.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("session_token", &self.session_token.as_ref().map(|_| ".."))
            .finish_non_exhaustive()
    }
}

/// What a request looks like to the signer.
pub struct Request<'a> {
    pub method: &'a str,
    /// The URL authority exactly as sent; the host sets `Host` to it.
    pub authority: &'a str,
    /// Already percent-encoded, as sent.
    pub path: &'a str,
    /// The raw query string without `?`, pairs already percent-encoded.
    pub query: &'a str,
    /// Headers besides `host`, `x-amz-date` and `x-amz-security-token`, all of them signed.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// The headers to add to the request: `x-amz-date`, the session token if any, and
/// `authorization`. `amz_date` is `YYYYMMDDTHHMMSSZ`.
pub fn sign(
    req: &Request<'_>,
    creds: &Credentials,
    region: &str,
    service: &str,
    amz_date: &str,
) -> Vec<(&'static str, String)> {
    let mut signed: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), normalize(v)))
        .collect();
    signed.push(("host".into(), req.authority.to_string()));
    signed.push(("x-amz-date".into(), amz_date.to_string()));
    if let Some(token) = &creds.session_token {
        signed.push(("x-amz-security-token".into(), token.clone()));
    }
    signed.sort();

    let names: Vec<&str> = signed.iter().map(|(k, _)| k.as_str()).collect();
    let names = names.join(";");
    let canonical_headers: String = signed.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{names}\n{}",
        req.method,
        if req.path.is_empty() { "/" } else { req.path },
        canonical_query(req.query),
        hex(&Sha256::digest(req.body)),
    );
    let date = &amz_date[..8.min(amz_date.len())];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let key = signing_key(&creds.secret_access_key, date, region, service);
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));

    let mut out = vec![("x-amz-date", amz_date.to_string())];
    if let Some(token) = &creds.session_token {
        out.push(("x-amz-security-token", token.clone()));
    }
    out.push((
        "authorization",
        format!(
            "{ALGORITHM} Credential={}/{scope}, SignedHeaders={names}, Signature={signature}",
            creds.access_key_id
        ),
    ));
    out
}

/// Unix seconds as SigV4's basic ISO 8601 form, `20150830T123600Z`.
pub fn amz_date(unix_seconds: u64) -> String {
    let rfc = egress_guest_sdk::time::format_rfc3339(egress_guest_sdk::Datetime {
        seconds: unix_seconds,
        nanoseconds: 0,
    });
    rfc.replace(['-', ':'], "")
}

/// RFC 3986 encoding of everything but the unreserved characters: the one encoding SigV4
/// accepts, and also a valid form encoding, so the body is signed exactly as sent.
pub fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            // Uppercase hex digits: the canonical form compares bytes.
            out.push('%');
            out.push(HEX_UPPER[usize::from(b >> 4)] as char);
            out.push(HEX_UPPER[usize::from(b & 15)] as char);
        }
    }
    out
}

fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    pairs.sort();
    let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join("&")
}

/// Trim and collapse runs of spaces, as the canonical form requires.
fn normalize(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

const HEX: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Lowercase hex; SigV4 wants lowercase and a crate for it is not worth its bytes.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    //! Vectors from AWS's SigV4 test suite (service `service`, region `us-east-1`,
    //! 2015-08-30T12:36:00Z, key AKIDEXAMPLE) and the worked IAM example of the SigV4
    //! documentation: values computed by AWS, not by this code.

    use super::*;

    const DATE: &str = "20150830T123600Z";

    fn creds(token: Option<&str>) -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: token.map(str::to_string),
        }
    }

    fn authorization(req: &Request<'_>, token: Option<&str>, service: &str) -> String {
        sign(req, &creds(token), "us-east-1", service, DATE)
            .into_iter()
            .find(|(k, _)| *k == "authorization")
            .map(|(_, v)| v)
            .unwrap()
    }

    fn request<'a>(
        method: &'a str,
        authority: &'a str,
        query: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
    ) -> Request<'a> {
        Request {
            method,
            authority,
            path: "/",
            query,
            headers,
            body,
        }
    }

    /// One published test case: the request, then what AWS says it signs and yields.
    struct Vector {
        method: &'static str,
        query: &'static str,
        headers: &'static [(&'static str, &'static str)],
        body: &'static [u8],
        token: Option<&'static str>,
        signed: &'static str,
        signature: &'static str,
    }

    #[test]
    fn aws_test_suite() {
        let vectors = [
            // get-vanilla
            Vector {
                method: "GET",
                query: "",
                headers: &[],
                body: b"",
                token: None,
                signed: "host;x-amz-date",
                signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            },
            // get-vanilla-query-order-key-case
            Vector {
                method: "GET",
                query: "Param2=value2&Param1=value1",
                headers: &[],
                body: b"",
                token: None,
                signed: "host;x-amz-date",
                signature: "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            },
            // post-x-www-form-urlencoded
            Vector {
                method: "POST",
                query: "",
                headers: &[("Content-Type", "application/x-www-form-urlencoded")],
                body: b"Param1=value1",
                token: None,
                signed: "content-type;host;x-amz-date",
                signature: "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
            },
            // post-x-www-form-urlencoded-parameters
            Vector {
                method: "POST",
                query: "",
                headers: &[(
                    "Content-Type",
                    "application/x-www-form-urlencoded; charset=utf8",
                )],
                body: b"Param1=value1",
                token: None,
                signed: "content-type;host;x-amz-date",
                signature: "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe",
            },
            // post-sts-header-before
            Vector {
                method: "POST",
                query: "",
                headers: &[],
                body: b"",
                token: Some(STS_TOKEN),
                signed: "host;x-amz-date;x-amz-security-token",
                signature: "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead",
            },
        ];
        for v in vectors {
            let req = request(
                v.method,
                "example.amazonaws.com",
                v.query,
                v.headers,
                v.body,
            );
            let want = format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                 SignedHeaders={}, Signature={}",
                v.signed, v.signature
            );
            assert_eq!(
                authorization(&req, v.token, "service"),
                want,
                "{} {:?}",
                v.method,
                v.query
            );
        }
    }

    /// The IAM ListUsers example of the SigV4 documentation, with its derived key.
    #[test]
    fn documented_iam_example() {
        assert_eq!(
            hex(&signing_key(
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                "20150830",
                "us-east-1",
                "iam"
            )),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        let headers = [(
            "Content-Type",
            "application/x-www-form-urlencoded; charset=utf-8",
        )];
        let req = request(
            "GET",
            "iam.amazonaws.com",
            "Action=ListUsers&Version=2010-05-08",
            &headers,
            b"",
        );
        assert!(authorization(&req, None, "iam").ends_with(
            "SignedHeaders=content-type;host;x-amz-date, \
                 Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        ));
    }

    #[test]
    fn session_token_is_sent_and_signed() {
        let req = request("POST", "ec2.eu-west-1.amazonaws.com", "", &[], b"");
        let headers = sign(&req, &creds(Some("tok")), "eu-west-1", "ec2", DATE);
        let names: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            ["x-amz-date", "x-amz-security-token", "authorization"]
        );
        assert_eq!(headers[1].1, "tok");
        assert!(headers[2].1.contains("/eu-west-1/ec2/aws4_request"));
        let plain = sign(&req, &creds(None), "eu-west-1", "ec2", DATE);
        assert_eq!(plain.len(), 2);
    }

    #[test]
    fn dates_and_encoding() {
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
        assert_eq!(uri_encode("a b/c~+="), "a%20b%2Fc~%2B%3D");
        assert_eq!(uri_encode("ü"), "%C3%BC");
        assert_eq!(hex(&[0, 15, 255]), "000fff");
        assert!(!format!("{:?}", creds(Some("t"))).contains("wJalr"));
    }

    const STS_TOKEN: &str = "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLW\
        sKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8ph\
        UZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0i\
        PPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
}
