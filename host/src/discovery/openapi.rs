//! The OpenAPI 3.0 document of the discovery API, written by hand with `serde_json` (the
//! API is five operations; a derive crate would add a dependency and macros for little).
//! Served at `/openapi.json` and committed as `docs/openapi/discovery.json`; a test fails
//! when the two differ, and another checks real answers against these schemas.

use super::query::PARAMETERS;
use serde_json::{Value, json};

/// Where the committed copy lives, relative to the repository root.
pub const COMMITTED_PATH: &str = "docs/openapi/discovery.json";

/// How to rewrite the committed copy: the CLI, or the drift test itself (which reuses the
/// test build, so nothing else gets compiled).
pub const REGENERATE: &str = "cargo run -p proxy-operator -- openapi > docs/openapi/discovery.json \
     (or UPDATE_OPENAPI=1 cargo test --workspace --test operator discovery::committed_openapi)";

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn param_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/parameters/{name}")})
}

/// The document.
pub fn document() -> Value {
    let filters: Vec<Value> = PARAMETERS.iter().map(|p| param_ref(p)).collect();
    let auth_errors = |ok: Value, extra: &[(&str, Value)]| {
        let mut r = json!({
            "200": ok,
            "400": error_response("A query parameter is unknown, repeated or malformed; `parameter` and `value` name it."),
            "401": {
                "description": "No bearer token, or one the TokenReview does not authenticate. Carries `WWW-Authenticate: Bearer`.",
                "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer realm=\"proxy-operator\"`, with `error=\"invalid_token\"` for a rejected token."}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
            },
            "403": error_response("The SubjectAccessReview did not allow the request; `reason` is the review's reason."),
            "503": error_response("The proxy cache has not synced yet, or the API server could not be asked for a review. Retry later."),
        });
        for (code, v) in extra {
            r[*code] = v.clone();
        }
        r
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "proxy-operator discovery API",
            "version": "v1",
            "description": "Read-only view of the egress proxies the operator runs, answered from its informer cache (no API-server call per request).\n\nAuthentication is a Kubernetes bearer token (e.g. a service-account token), checked with a TokenReview; authorisation is a SubjectAccessReview for `list` (collection and pick) or `get` (one Proxy) on `proxies` in API group `egress.proxy-operator.dev`, in the requested namespace, or across all namespaces when no `namespace` filter is given. Answers are cached for a few seconds per token.\n\nCredentials: a Proxy's `credentials` (the username and password its proxy requires) are included only for callers a SubjectAccessReview also allows `get` on the subresource `proxies/credentials`: for one Proxy (get, pick) on that Proxy, for a list in the requested namespace (or all namespaces). Every other caller gets `ip` and `port` only. With authentication disabled, credentials are never included.",
            "license": {"name": "Apache-2.0"}
        },
        "security": [{"bearerAuth": []}],
        "paths": {
            "/v1/proxies": {
                "get": {
                    "operationId": "listProxies",
                    "summary": "The Ready proxies, sorted by namespace and name",
                    "description": "Only Ready proxies are listed: Ready condition True, an IP in the status and not being deleted. Filters combine with AND. Needs `list` on proxies in `namespace`, or at the cluster scope without it.",
                    "parameters": filters,
                    "responses": auth_errors(json!({
                        "description": "The matching Ready proxies (possibly none).",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProxyList"}}}
                    }), &[]),
                }
            },
            "/v1/proxies:pick": {
                "get": {
                    "operationId": "pickProxy",
                    "summary": "One Ready proxy, spreading load over the matching set",
                    "description": "Least-recently-given: the matching Ready proxy handed out longest ago (or never) wins, ties broken by namespace and name, so repeated picks over a fixed set go round-robin and a new proxy is given next. Needs `list` on proxies, like the collection.",
                    "parameters": filters,
                    "responses": auth_errors(json!({
                        "description": "The chosen proxy.",
                        "headers": {"Cache-Control": {"schema": {"type": "string"}, "description": "`no-store`"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Proxy"}}}
                    }), &[("404", error_response("No Ready proxy matches the filters."))]),
                }
            },
            "/v1/proxies/{namespace}/{name}": {
                "get": {
                    "operationId": "getProxy",
                    "summary": "One Proxy, Ready or not",
                    "description": "Answers for any existing Proxy: `ready` says whether clients may use it, and `reason`/`message` say why not. 404 only when no such Proxy exists. Needs `get` on that Proxy. Takes no query parameters.",
                    "parameters": [
                        {"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}},
                        {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}
                    ],
                    "responses": auth_errors(json!({
                        "description": "The Proxy.",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Proxy"}}}
                    }), &[("404", error_response("No such Proxy."))]),
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object"}}}}}
                }
            },
            "/status": {
                "get": {
                    "operationId": "statusPage",
                    "summary": "The status page (HTML)",
                    "description": "A self-contained, self-refreshing HTML page of every Proxy (Ready or not: state, health, probe latency, age) and every provider's ProviderHealth targets. With auth on, the page itself carries no cluster data: its script fetches `/status/fragment` with a bearer token passed in the URL fragment (`/status#token=...`) or pasted into its form, kept in the tab's sessionStorage. With auth off, the content is embedded.",
                    "security": [],
                    "responses": {"200": {"description": "The page.", "content": {"text/html": {"schema": {"type": "string"}}}}}
                }
            },
            "/status/fragment": {
                "get": {
                    "operationId": "statusFragment",
                    "summary": "The status page's content (HTML fragment)",
                    "description": "What `/status` shows, as an HTML fragment with every cluster-supplied text escaped. Needs `list` on proxies across all namespaces.",
                    "responses": {
                        "200": {"description": "The fragment.", "content": {"text/html": {"schema": {"type": "string"}}}},
                        "401": error_response("No bearer token, or one the TokenReview does not authenticate."),
                        "403": error_response("The SubjectAccessReview did not allow `list` on proxies in all namespaces."),
                        "503": error_response("The API server could not be asked for a review. Retry later.")
                    }
                }
            }
        },
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A Kubernetes bearer token, reviewed with TokenReview (authentication.k8s.io/v1)."
                }
            },
            "parameters": {
                "namespace": {"name": "namespace", "in": "query", "required": false, "schema": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}, "description": "Only proxies in this namespace; also the namespace of the access review. Empty: all namespaces."},
                "provider": {"name": "provider", "in": "query", "required": false, "schema": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}, "description": "Only proxies of this provider (`spec.provider`)."},
                "region": {"name": "region", "in": "query", "required": false, "schema": {"type": "string"}, "description": "Only proxies in this region (`spec.placement.region`)."},
                "zone": {"name": "zone", "in": "query", "required": false, "schema": {"type": "string"}, "description": "Only proxies in this zone (`spec.placement.zone`)."},
                "pool": {"name": "pool", "in": "query", "required": false, "schema": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}, "description": "Only proxies of this ProxyPool (the `egress.proxy-operator.dev/pool` label)."},
                "labelSelector": {"name": "labelSelector", "in": "query", "required": false, "schema": {"type": "string"}, "example": "tier in (gold,silver),!canary", "description": "A Kubernetes label selector on the Proxy's labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>N`, `k<N`, comma-separated (all must hold). A malformed one is refused with 400."}
            },
            "schemas": {
                "ProxyList": {
                    "type": "object",
                    "required": ["items"],
                    "additionalProperties": false,
                    "properties": {
                        "items": {"type": "array", "items": {"$ref": "#/components/schemas/Proxy"}}
                    }
                },
                "Proxy": {
                    "type": "object",
                    "required": ["namespace", "name", "provider", "region", "zone", "ip", "port", "address", "ipFamily", "ready", "healthy", "state", "lastProbe"],
                    "additionalProperties": false,
                    "properties": {
                        "namespace": {"type": "string"},
                        "name": {"type": "string"},
                        "provider": {"type": "string", "description": "`spec.provider`"},
                        "region": {"type": "string", "description": "`spec.placement.region` (may be empty)"},
                        "zone": {"type": "string", "description": "`spec.placement.zone` (may be empty)"},
                        "ip": {"type": "string", "nullable": true, "description": "Connect here: an address of the Proxy's `ipFamily`. Null only when not Ready and no IP is known."},
                        "port": {"type": "integer", "format": "int32", "description": "The status port, else the spec port."},
                        "address": {"type": "string", "nullable": true, "example": "[2001:db8::7]:3128", "description": "`ip` and `port` as a proxy URL writes them (`http://ADDRESS`): an IPv6 address in brackets. Null when `ip` is."},
                        "ipFamily": {"type": "string", "enum": ["IPv4", "IPv6"], "description": "`spec.ipFamily`: the family of `ip`."},
                        "ready": {"type": "boolean", "description": "Clients may use it: Ready condition True, an IP, not being deleted. Always true in lists and picks."},
                        "healthy": {"type": "boolean", "description": "The Healthy condition is True (the last CONNECT probe through the proxy succeeded)."},
                        "state": {"type": "string", "nullable": true, "description": "Instance state: Provisioning, Running, Stopped or Terminated."},
                        "reason": {"type": "string", "description": "Only when not Ready: why, as a CamelCase word (the Ready condition's reason, or Deleting, NotReconciled, NoAddress)."},
                        "message": {"type": "string", "description": "Only when not Ready, and when there is one: a human-readable explanation."},
                        "lastProbe": {"allOf": [{"$ref": "#/components/schemas/LastProbe"}], "nullable": true},
                        "credentials": {"$ref": "#/components/schemas/Credentials"}
                    }
                },
                "Credentials": {
                    "type": "object",
                    "required": ["username", "password"],
                    "additionalProperties": false,
                    "description": "Only for callers allowed `get` on `proxies/credentials`, and only for a Proxy that has credentials (`spec.auth.type` Generated or Secret). Send them as Basic proxy authentication (`Proxy-Authorization`, or `http://username:password@ip:port`).",
                    "properties": {
                        "username": {"type": "string"},
                        "password": {"type": "string", "format": "password"}
                    }
                },
                "LastProbe": {
                    "type": "object",
                    "required": ["time", "latencyMs"],
                    "additionalProperties": false,
                    "properties": {
                        "time": {"type": "string", "format": "date-time"},
                        "latencyMs": {"type": "integer", "format": "int64", "nullable": true, "description": "Round trip of the CONNECT probe; null when it failed."},
                        "error": {"type": "string", "description": "Why the probe failed; absent when it succeeded."}
                    }
                },
                "Error": {
                    "type": "object",
                    "required": ["code", "error", "message"],
                    "additionalProperties": false,
                    "properties": {
                        "code": {"type": "integer", "description": "The HTTP status."},
                        "error": {"type": "string", "enum": ["BadRequest", "Unauthorized", "Forbidden", "NotFound", "ServiceUnavailable"]},
                        "message": {"type": "string"},
                        "reason": {"type": "string", "description": "403 only: the SubjectAccessReview's reason (may be empty)."},
                        "parameter": {"type": "string", "description": "400 only: the offending query parameter."},
                        "value": {"type": "string", "description": "400 only: its value."}
                    }
                }
            }
        }
    })
}

/// The document as committed: pretty-printed, with a final newline.
pub fn document_text() -> String {
    let mut s = serde_json::to_string_pretty(&document()).expect("a JSON value serializes");
    s.push('\n');
    s
}
