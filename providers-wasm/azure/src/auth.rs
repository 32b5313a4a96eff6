//! Access tokens for Azure Resource Manager from the Microsoft identity platform's v2.0 token endpoint, client
//! credentials grant (`POST {authorityHost}/{tenantId}/oauth2/v2.0/token`, scope
//! `https://management.azure.com/.default`): with the service principal's client secret, or with a federated token
//! (workload identity) sent as `client_assertion`. Both secrets are read when a token is needed, never before: the
//! federated token file rotates (AKS projects a new one every hour or so), and a cached access token outlives it.
//!
//! A token is kept in the host cache until five minutes before it expires, so calls do not exchange again; [`forget`]
//! drops it when ARM refuses it, and the caller asks once more within the same call.

use crate::config::{Config, Credential};
use egress_guest_sdk::classify::{Classifier, Kind, Rule};
use egress_guest_sdk::http::{ErrorCode, HttpError, Request, encode_component};
use egress_guest_sdk::{self as sdk, ProviderError};
use serde_json::Value;

pub const SCOPE: &str = "https://management.azure.com/.default";
/// RFC 7523's client assertion type, the one Entra ID takes for a federated credential.
pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The entry's secret holding the service principal's client secret.
pub const CLIENT_SECRET: &str = "clientSecret";
/// The entry's secret holding the federated token (workload identity's projected service-account token).
pub const FEDERATED_TOKEN: &str = "federatedToken";
/// A token is renewed this long before Entra ID says it expires: a call that starts with it must finish with it.
const EARLY: u64 = 300;

/// Entra ID answers `{"error": "invalid_client", "error_description": "AADSTS7000215: ..."}`. A credential it refuses
/// (wrong secret, unknown application or tenant, no federated credential for the assertion) will not start working by
/// itself: permanent. Throttling and its own failures pass.
#[rustfmt::skip]
pub const TOKEN: Classifier = Classifier {
    backend: "Microsoft identity platform",
    code_at: "/error",
    message_at: "/error_description",
    rules: &[
        Rule::code("temporarily_unavailable", Kind::Retryable),
        Rule::codes(&["invalid_client", "unauthorized_client", "invalid_grant", "invalid_request", "invalid_scope",
            "invalid_resource", "unsupported_grant_type", "access_denied"], Kind::Auth),
        Rule::status(429, Kind::RateLimited),
        Rule::statuses(500, 599, Kind::Retryable),
        Rule::statuses(400, 499, Kind::Auth),
    ],
};

fn cache_key(cfg: &Config) -> String {
    format!("arm-token:{:?}:{}:{}:{}", cfg.credential, cfg.authority_host, cfg.tenant_id, cfg.client_id)
}

/// The form body of the token request, and which secret it carries (for messages).
fn form(cfg: &Config) -> Result<(String, &'static str), ProviderError> {
    let common = format!(
        "grant_type=client_credentials&client_id={}&scope={}",
        encode_component(&cfg.client_id),
        encode_component(SCOPE)
    );
    let (key, field) = match cfg.credential {
        Credential::ClientSecret => (CLIENT_SECRET, "client_secret"),
        Credential::WorkloadIdentity => (FEDERATED_TOKEN, "client_assertion"),
    };
    let secret = sdk::secret_string(key)?;
    if secret.is_empty() {
        let msg = format!("secret {key:?} is empty: config.credential {:?} needs it", cfg.credential);
        return Err(ProviderError::permanent(msg).with_code("SecretEmpty"));
    }
    let assertion_type = match cfg.credential {
        Credential::ClientSecret => String::new(),
        Credential::WorkloadIdentity => format!("&client_assertion_type={}", encode_component(ASSERTION_TYPE)),
    };
    Ok((format!("{common}{assertion_type}&{field}={}", encode_component(&secret)), key))
}

/// The first line of an AADSTS description (the rest is trace and correlation IDs and a timestamp).
pub fn first_line(description: &str) -> &str {
    description.lines().next().unwrap_or_default().trim()
}

/// Seconds a grant is valid for, from a number or a numeric string; 0 when unreadable (then it is not cached).
pub fn lifetime(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())).unwrap_or(0)
}

/// The host-cache lifetime of a token valid for `expires_in` seconds.
pub fn cache_ttl(expires_in: u64) -> u32 {
    expires_in.saturating_sub(EARLY).min(u64::from(u32::MAX)) as u32
}

/// What the host must scrub of a token: its signature (a JWT's last part), without which the rest is useless to
/// anyone; ARM tokens are often longer than the host's 2 KiB limit for one sensitive value, their signature never is.
/// The whole token when it is no JWT and short enough.
pub fn sensitive_part(token: &str) -> Option<&str> {
    let part = match token.matches('.').count() {
        2 => token.rsplit('.').next().unwrap_or_default(),
        _ => token,
    };
    (8..=2048).contains(&part.len()).then_some(part)
}

/// Tells the host to scrub the token's [`sensitive_part`] from everything this provider emits.
fn mark(token: &str) {
    if let Some(part) = sensitive_part(token) {
        #[cfg(target_arch = "wasm32")]
        sdk::mark_sensitive(part.as_bytes());
        // Native unit tests have no host to tell.
        #[cfg(not(target_arch = "wasm32"))]
        let _ = part;
    }
}

/// An access token: the cached one, or a fresh one (cached until five minutes before it expires).
pub fn token(cfg: &Config) -> Result<String, ProviderError> {
    let key = cache_key(cfg);
    if let Some(t) = sdk::cache_get(&key).and_then(|t| String::from_utf8(t).ok()).filter(|t| !t.is_empty()) {
        mark(&t);
        return Ok(t);
    }
    let (body, secret) = form(cfg)?;
    let url = format!("{}/{}/oauth2/v2.0/token", cfg.authority_host, cfg.tenant_id);
    let req = Request::post(&url).header("content-type", "application/x-www-form-urlencoded").body(body);
    // `expires_in` is a number in v2.0 answers; some endpoints (v1.0, older proxies) send it as a string.
    let grant: Value = match req.send_json() {
        Ok(g) => g,
        // The host refused the address: only the operator's providers file can open it.
        Err(HttpError::Transport(ErrorCode::HttpRequestDenied)) => {
            let msg = format!(
                "token request: config.authorityHost {:?} is not allowed; list it in the provider's allowedHosts",
                cfg.authority_host
            );
            return Err(ProviderError::permanent(msg).with_code("AuthorityNotAllowed"));
        }
        Err(e) => return Err(refused(cfg, secret, e)),
    };
    let Some(token) = grant["access_token"].as_str().filter(|t| !t.is_empty()).map(str::to_string) else {
        let msg = format!("token request to config.authorityHost {:?} answered no access_token", cfg.authority_host);
        return Err(ProviderError::transient(msg).with_code("InvalidJson"));
    };
    mark(&token);
    sdk::cache_set(&key, token.as_bytes(), cache_ttl(lifetime(&grant["expires_in"])));
    Ok(token)
}

/// A failed token request, classified, its message naming the fields involved and never a secret.
pub fn refused(cfg: &Config, secret: &str, e: HttpError) -> ProviderError {
    let said = TOKEN.backend_error(&e).map(|b| format!("{}: {}", b.code, first_line(&b.message)));
    let err = TOKEN.classify(e);
    let why = said.unwrap_or_else(|| err.message.clone());
    let message = format!(
        "token request for config.clientId {:?} in config.tenantId {:?} with secret {secret:?} ({:?}) failed: {why}",
        cfg.client_id, cfg.tenant_id, cfg.credential
    );
    ProviderError { message, ..err }
}

/// Drop the cached token (ARM refused it: expired early or revoked).
pub fn forget(cfg: &Config) {
    sdk::cache_set(&cache_key(cfg), b"", 0);
}
