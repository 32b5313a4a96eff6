//! The Microsoft identity platform's v2.0 token endpoint, client credentials grant
//! (learn.microsoft.com/entra/identity-platform/v2-oauth2-client-creds-grant-flow):
//! `POST /{tenant}/oauth2/v2.0/token` with a form body `grant_type=client_credentials`,
//! `client_id`, `scope=https://management.azure.com/.default` and either `client_secret` or
//! `client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer` with
//! `client_assertion` (a federated credential: workload identity). The answer is
//! `{"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token"}`;
//! errors are `{"error", "error_description": "AADSTSnnnn: ...", "error_codes", "timestamp",
//! "trace_id", "correlation_id", "error_uri"}` with the AADSTS codes Entra ID sends.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::model::Backend;
use crate::framework::Shared;

/// RFC 7523's client assertion type, the one Entra ID accepts.
pub const CLIENT_ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// Resources whose `/.default` scope gives an ARM token.
const ARM_RESOURCES: [&str; 3] = [
    "https://management.azure.com",
    "https://management.azure.com/",
    "https://management.core.windows.net/",
];

fn aadsts(status: u16, error: &str, code: u32, message: &str, b: &mut Backend) -> Response {
    let (trace, correlation) = (b.guid(), b.guid());
    let now = crate::time::rfc3339(crate::time::now_secs()).replace('T', " ");
    let description = format!(
        "AADSTS{code}: {message}\r\nTrace ID: {trace}\r\nCorrelation ID: {correlation}\r\nTimestamp: {now}"
    );
    let body = json!({
        "error": error,
        "error_description": description,
        "error_codes": [code],
        "timestamp": now,
        "trace_id": trace,
        "correlation_id": correlation,
        "error_uri": format!("{}/error?code={code}", b.base_url),
    });
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(body)).into_response()
}

/// `application/x-www-form-urlencoded` pairs, decoded.
fn form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (super::percent::decode(k, true), super::percent::decode(v, true))
        })
        .collect()
}

pub(crate) async fn token(
    State(state): State<Shared<Backend>>,
    Path(tenant): Path<String>,
    body: String,
) -> Response {
    let mut b = state.lock();
    let fields = form(&body);
    let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if !tenant.eq_ignore_ascii_case(&b.cfg.tenant_id) {
        let msg = format!(
            "Tenant '{tenant}' not found. Check to make sure you have the correct tenant ID and are \
             signing into the correct cloud. Check with your subscription administrator, this may \
             happen if there are no active subscriptions for the tenant."
        );
        return aadsts(400, "invalid_request", 90002, &msg, &mut b);
    }
    let Some(grant) = get("grant_type") else {
        let msg = "The request body must contain the following parameter: 'grant_type'.";
        return aadsts(400, "invalid_request", 900144, msg, &mut b);
    };
    if grant != "client_credentials" {
        let msg = format!("The app requested an unsupported grant type '{grant}'.");
        return aadsts(400, "unsupported_grant_type", 70003, &msg, &mut b);
    }
    let Some(client_id) = get("client_id") else {
        let msg = "The request body must contain the following parameter: 'client_id'.";
        return aadsts(400, "invalid_request", 900144, msg, &mut b);
    };
    let Some(client) =
        b.cfg.clients.iter().find(|c| c.client_id.eq_ignore_ascii_case(&client_id)).cloned()
    else {
        let msg = format!(
            "Application with identifier '{client_id}' was not found in the directory '{tenant}'. \
             This can happen if the application has not been installed by the administrator of the \
             tenant or consented to by any user in the tenant. You may have sent your \
             authentication request to the wrong tenant."
        );
        return aadsts(400, "unauthorized_client", 700016, &msg, &mut b);
    };
    let scope = get("scope").unwrap_or_default();
    let Some(resource) = scope.strip_suffix("/.default").filter(|_| !scope.contains(' ')) else {
        let msg = format!(
            "The provided value for scope {scope} is not valid. Client credential flows must have \
             a scope value with /.default suffixed to the resource identifier (application ID URI)."
        );
        return aadsts(400, "invalid_scope", 1002012, &msg, &mut b);
    };
    if !ARM_RESOURCES.iter().any(|r| r.trim_end_matches('/') == resource.trim_end_matches('/')) {
        let msg = format!(
            "The resource principal named {resource} was not found in the tenant named {tenant}. \
             This can happen if the application has not been installed by the administrator of the \
             tenant or consented to by any user in the tenant."
        );
        return aadsts(400, "invalid_resource", 500011, &msg, &mut b);
    }
    match (get("client_secret"), get("client_assertion_type"), get("client_assertion")) {
        (Some(secret), _, _) => {
            if client.secret.as_deref() != Some(secret.as_str()) {
                let msg = format!(
                    "Invalid client secret provided. Ensure the secret being sent in the request \
                     is the client secret value, not the client secret ID, for a secret added to \
                     app '{client_id}'."
                );
                return aadsts(401, "invalid_client", 7000215, &msg, &mut b);
            }
        }
        (None, Some(kind), assertion) => {
            if kind != CLIENT_ASSERTION_TYPE {
                let msg = format!(
                    "The client_assertion_type '{kind}' is not supported. Use \
                     '{CLIENT_ASSERTION_TYPE}'."
                );
                return aadsts(400, "invalid_request", 50027, &msg, &mut b);
            }
            let assertion = assertion.unwrap_or_default();
            let accepted = match &client.federated {
                None => false,
                Some(list) if list.is_empty() => !assertion.is_empty(),
                Some(list) => list.contains(&assertion),
            };
            if !accepted {
                let msg = "No matching federated identity record found for presented assertion. \
                           Check the issuer, subject and audience of the federated credential.";
                return aadsts(401, "invalid_client", 700213, msg, &mut b);
            }
        }
        (None, None, _) => {
            let msg = "The request body must contain the following parameter: 'client_assertion' \
                       or 'client_secret'.";
            return aadsts(401, "invalid_client", 7000218, msg, &mut b);
        }
    }
    b.issue(&client_id)
}

impl Backend {
    /// A new access token for `client_id`, JWT-shaped (header and claims readable, the
    /// signature a placeholder), valid for the configured lifetime.
    fn issue(&mut self, client_id: &str) -> Response {
        self.grants += 1;
        let now = crate::time::now_secs();
        let lifetime = self.cfg.token_lifetime;
        let b64 =
            |v: serde_json::Value| data_encoding::BASE64URL_NOPAD.encode(v.to_string().as_bytes());
        let tenant = self.cfg.tenant_id.clone();
        let header = b64(json!({"typ": "JWT", "alg": "RS256", "kid": "emulator"}));
        let claims = b64(json!({
            "aud": "https://management.azure.com/",
            "iss": format!("https://sts.windows.net/{tenant}/"),
            "iat": now, "nbf": now, "exp": now + lifetime,
            "appid": client_id, "tid": tenant, "oid": client_id, "sub": client_id,
            "uti": self.guid(), "ver": "1.0",
        }));
        let token = format!(
            "{header}.{claims}.{}",
            data_encoding::BASE64URL_NOPAD.encode(self.guid().as_bytes())
        );
        self.tokens.insert(token.clone(), now + lifetime);
        let body = json!({
            "token_type": "Bearer",
            "expires_in": lifetime,
            "ext_expires_in": lifetime,
            "access_token": token,
        });
        Json(body).into_response()
    }
}
