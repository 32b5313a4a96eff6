//! OAuth 2.0 access tokens for the Compute API: from a service-account JSON key (a JWT signed here with RS256 and
//! exchanged at the key's `token_uri`), or from the metadata server (workload identity). A token is kept in the host
//! cache until a minute before it expires, so calls do not exchange again; [`forget`] drops it when the API refuses
//! it, and the caller asks once more within the same call.

use crate::config::{Config, TokenSource};
use crate::rs256;
use data_encoding::BASE64URL_NOPAD;
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{ErrorCode, HttpError, Request, encode_component};
use egress_guest_sdk::{self as sdk, ProviderError};
use serde::Deserialize;
use serde_json::json;

pub const SCOPE: &str = "https://www.googleapis.com/auth/compute";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const METADATA_TOKEN: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// Google's token endpoint answers `{"error": "invalid_grant", "error_description": ...}`. A key it refuses (bad
/// signature, deleted key, disabled account) will not start working by itself: permanent.
#[rustfmt::skip]
const TOKEN: Classifier = Classifier {
    backend: "Google OAuth2",
    code_at: "/error",
    message_at: "/error_description",
    rules: &[
        Rule::codes(&["invalid_grant", "invalid_client", "unauthorized_client", "invalid_scope", "access_denied"], Kind::Auth),
        Rule::status(429, Kind::RateLimited),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::status(404, Kind::Invalid),
        Rule::statuses(400, 499, Kind::Auth),
    ],
};

/// The fields of a service-account key this plugin uses.
#[derive(Deserialize)]
struct Key {
    #[serde(rename = "type")]
    kind: String,
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: String,
    token_uri: String,
}

#[derive(Deserialize)]
struct Grant {
    access_token: String,
    #[serde(default)]
    expires_in: u64,
}

fn bad_key(secret: &str, why: &str) -> ProviderError {
    let msg = format!("secret {secret:?} is not a usable service-account JSON key: {why}");
    ProviderError::permanent(msg).with_code("InvalidKey")
}

/// The key from its secret, read on every call. Never the serde message: it may quote the key.
fn read_key(secret: &str) -> Result<Key, ProviderError> {
    let key = serde_json::from_slice::<Key>(&sdk::secret(secret)?).ok().filter(|k| k.kind == "service_account");
    key.ok_or_else(|| bad_key(secret, "want JSON of type service_account with client_email, private_key, token_uri"))
}

/// The signed JWT of RFC 7523 that Google's token endpoint takes for a service account.
fn assertion(key: &Key, secret: &str, now: u64) -> Result<String, ProviderError> {
    let body: String = key.private_key.lines().filter(|l| !l.starts_with("-----")).map(str::trim).collect();
    let der = data_encoding::BASE64.decode(body.as_bytes()).ok();
    let private = der.and_then(|der| rs256::Key::from_pkcs8_der(&der));
    let private = private.ok_or_else(|| bad_key(secret, "private_key is not a PEM PKCS#8 RSA key"))?;
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": key.private_key_id});
    let claims = json!({"iss": key.client_email, "scope": SCOPE, "aud": key.token_uri, "iat": now, "exp": now + 3600});
    let [h, c] = [header, claims].map(|v| BASE64URL_NOPAD.encode(v.to_string().as_bytes()));
    // PKCS#1 v1.5 signatures are deterministic: no randomness needed inside the sandbox.
    let signature = private.sign(format!("{h}.{c}").as_bytes());
    let why = "private_key cannot make an RS256 signature (a modulus too short, or parts that do not fit together)";
    let signature = signature.ok_or_else(|| bad_key(secret, why))?;
    Ok(format!("{h}.{c}.{}", BASE64URL_NOPAD.encode(&signature)))
}

/// Where the token is cached (per key, so a rotated key gets a fresh token; or per metadata server), and the key.
fn cache_key(cfg: &Config) -> Result<(String, Option<Key>), ProviderError> {
    if cfg.token_source == TokenSource::Metadata {
        return Ok((format!("token:metadata:{}", cfg.metadata_endpoint), None));
    }
    let key = read_key(&cfg.credentials_secret)?;
    Ok((format!("token:key:{}:{}:{}", key.client_email, key.private_key_id, key.token_uri), Some(key)))
}

/// An access token: the cached one, or a fresh one (cached until a minute before it expires).
pub fn token(cfg: &Config) -> Result<String, ProviderError> {
    let (cache, key) = cache_key(cfg)?;
    if let Some(t) = sdk::cache_get(&cache).and_then(|t| String::from_utf8(t).ok()) {
        return Ok(t);
    }
    let (what, req) = match &key {
        Some(key) => {
            let jwt = assertion(key, &cfg.credentials_secret, sdk::time::now().seconds)?;
            let form = format!("grant_type={}&assertion={jwt}", encode_component(JWT_BEARER));
            let req = Request::post(&key.token_uri).header("content-type", "application/x-www-form-urlencoded");
            (format!("service-account token exchange at {}", key.token_uri), req.body(form))
        }
        None => {
            let url = format!("{}{METADATA_TOKEN}", cfg.metadata_endpoint);
            ("metadata server token".into(), Request::get(url).header("metadata-flavor", "Google"))
        }
    };
    let grant = match req.send_json::<Grant>() {
        Ok(g) => g,
        // The host refused the address: only the operator's providers file can open it, so retrying cannot help.
        Err(HttpError::Transport(ErrorCode::HttpRequestDenied)) => {
            let (host, code) = match &key {
                Some(k) => (k.token_uri.as_str(), "TokenUriNotAllowed"),
                None => (cfg.metadata_endpoint.as_str(), "MetadataNotAllowed"),
            };
            let msg = format!("{what}: {host} is not allowed; list it in the provider's allowedHosts");
            return Err(ProviderError::permanent(msg).with_code(code));
        }
        Err(e) => {
            let err = TOKEN.classify(e);
            return Err(ProviderError { message: format!("{what}: {}", err.message), ..err });
        }
    };
    let ttl = grant.expires_in.saturating_sub(60).min(u64::from(u32::MAX)) as u32;
    sdk::cache_set(&cache, grant.access_token.as_bytes(), ttl);
    Ok(grant.access_token)
}

/// Drop the cached token (the API refused it: expired early or revoked).
pub fn forget(cfg: &Config) -> Result<(), ProviderError> {
    sdk::cache_set(&cache_key(cfg)?.0, b"", 0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_errors_are_classified() {
        use egress_guest_sdk::ErrorClass::*;
        let answer = |status: u16, body: &str| HttpError::Status { status, body: body.into(), retry_after: None };
        let cases = [
            (
                answer(400, r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#),
                Permanent,
                "invalid_grant",
            ),
            (
                answer(401, r#"{"error":"invalid_client","error_description":"The OAuth client was not found."}"#),
                Permanent,
                "invalid_client",
            ),
            (answer(429, "{}"), QuotaExceeded, "HTTP429"),
            (answer(503, "<html>"), Transient, "HTTP503"),
            (HttpError::Transport(ErrorCode::ConnectionRefused), Transient, "ConnectionRefused"),
        ];
        for (e, class, code) in cases {
            let err = TOKEN.classify(e);
            assert_eq!((err.class, err.code.as_deref()), (class, Some(code)), "{}", err.message);
        }
    }

    #[test]
    fn bad_keys_are_permanent_and_quote_nothing() {
        let key = |pem: &str| Key {
            kind: "service_account".into(),
            client_email: "a@b".into(),
            private_key: pem.into(),
            private_key_id: "k1".into(),
            token_uri: "https://oauth2.googleapis.com/token".into(),
        };
        for pem in [
            "-----BEGIN PRIVATE KEY-----\nnot base64 SECRETBITS\n-----END PRIVATE KEY-----\n",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
        ] {
            let e = assertion(&key(pem), "sa", 0).unwrap_err();
            assert_eq!((e.class, e.code.as_deref()), (egress_guest_sdk::ErrorClass::Permanent, Some("InvalidKey")));
            assert!(!e.message.contains("SECRETBITS") && e.message.contains("\"sa\""), "{}", e.message);
        }
    }
}
