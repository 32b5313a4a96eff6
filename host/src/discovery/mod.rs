//! The discovery API: what clients call to find proxies to use.
//!
//! An axum [`Router`] answering from a kube-runtime reflector [`Store`] of Proxies, so no
//! request costs an API-server call (except the briefly cached auth reviews):
//!
//! - `GET /v1/proxies`: the Ready proxies, filtered by `namespace`, `provider`, `region`,
//!   `zone` and `labelSelector` ([`query`]).
//! - `GET /v1/proxies:pick`: one of them, least-recently-given ([`pick`]).
//! - `GET /v1/proxies/{namespace}/{name}`: one Proxy, Ready or not (`ready: false` with a
//!   reason, rather than 404: a client can tell "not there" from "not usable yet").
//! - `GET /openapi.json`: the OpenAPI document ([`openapi`]), without auth.
//! - `GET /status` and `GET /status/fragment`: a read-only HTML status page of every Proxy
//!   and provider ([`status_page`]); the page itself carries no data when auth is on.
//!
//! Auth is TokenReview + SubjectAccessReview ([`auth`]); [`Auth::DisabledInsecure`] turns
//! it off for local development and says so loudly. A Proxy's credentials come with it only
//! for callers also allowed `get` on `proxies/credentials` ([`credentials`]); with auth off,
//! never. See docs/discovery.md.

pub mod caller_auth;
pub mod credentials;
pub mod openapi;
pub mod pick;
pub mod query;
pub mod render;
pub use egress_contract::selector;
pub mod status_page;
pub mod view;

use crate::api::{ProviderHealth, Proxy};
pub use crate::proxy_cache::ProxyCache;
use crate::proxy_cache::Synced;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use caller_auth::{AuthError, Authenticator, Identity};
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use query::{BadParameter, Filters};
use serde_json::{Value, json};
use std::future::Future;
use std::sync::Arc;

pub use caller_auth::AuthSettings;

/// How callers are checked.
pub enum Auth {
    /// TokenReview + SubjectAccessReview through this client (the operator's own identity;
    /// it needs `create` on tokenreviews and subjectaccessreviews, as granted by the
    /// ClusterRole `system:auth-delegator`).
    Kubernetes(kube::Client, AuthSettings),
    /// No authentication and no authorisation: anyone who can reach the port can list
    /// every proxy in every namespace. For local development only; logged as a warning.
    DisabledInsecure,
}

const REALM: &str = "Bearer realm=\"proxy-operator\"";
const REALM_INVALID: &str = "Bearer realm=\"proxy-operator\", error=\"invalid_token\"";

struct Shared {
    store: Store<Proxy>,
    /// ProviderHealth objects for the status page; None when the caller keeps none.
    providers: Option<Store<ProviderHealth>>,
    synced: Synced,
    auth: Option<Authenticator>,
    picker: pick::Picker,
    rendered: render::RenderCache,
    /// Reads credentials Secrets for callers allowed them; None with auth off.
    credentials: Option<credentials::CredentialStore>,
}

/// The discovery API over `cache` (fill it with [`proxy_reflector`], or any reflector of
/// Proxies across all namespaces); it answers 503 until the cache has listed once.
pub fn router(cache: ProxyCache, auth: Auth) -> Router {
    router_with_providers(cache, None, auth)
}

/// [`router`], with a reflector store of ProviderHealth objects (fill it with
/// [`provider_health_reflector`]) whose targets the status page shows.
pub fn router_with_providers(
    cache: ProxyCache,
    providers: Option<Store<ProviderHealth>>,
    auth: Auth,
) -> Router {
    let mut store = None;
    let auth = match auth {
        Auth::Kubernetes(client, settings) => {
            store = Some(credentials::CredentialStore::new(
                client.clone(),
                settings.ttl,
                settings.max_entries,
            ));
            Some(Authenticator::new(client, settings))
        }
        Auth::DisabledInsecure => {
            tracing::warn!(
                "!!! DISCOVERY API AUTHENTICATION IS DISABLED !!! Anyone who can reach its \
                 port can list every proxy in every namespace. Use this for local \
                 development only."
            );
            None
        }
    };
    let shared = Arc::new(Shared {
        store: cache.store,
        providers,
        synced: cache.synced,
        auth,
        picker: pick::Picker::default(),
        rendered: render::RenderCache::default(),
        credentials: store,
    });
    Router::new()
        .route("/v1/proxies", get(list))
        .route("/v1/proxies:pick", get(pick))
        .route("/v1/proxies/{namespace}/{name}", get(get_one))
        .route("/openapi.json", get(openapi_json))
        .route("/status", get(status_page))
        .route("/status/fragment", get(status_fragment))
        .fallback(not_found)
        .with_state(shared)
}

/// A cache of every Proxy in the cluster and the future that keeps it filled (run it for
/// as long as the API serves; it retries with backoff on watch errors): the operator's one
/// Proxy cache ([`crate::proxy_cache::watch_proxies`]) without its feed.
pub fn proxy_reflector(
    client: kube::Client,
) -> (ProxyCache, impl Future<Output = ()> + Send + 'static) {
    let (cache, _feed, fut) = crate::proxy_cache::watch_proxies(client);
    (cache, fut)
}

/// A reflector store of every ProviderHealth object (cluster-scoped) and the future that
/// keeps it filled, for the status page; like [`proxy_reflector`].
pub fn provider_health_reflector(
    client: kube::Client,
) -> (
    Store<ProviderHealth>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (store, writer) = reflector::store::<ProviderHealth>();
    let api = kube::Api::<ProviderHealth>::all(client);
    let stream = watcher(api, crate::watched::watcher_config())
        .default_backoff()
        .modify(|p: &mut ProviderHealth| p.managed_fields_mut().clear())
        .reflect(writer);
    let fut = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "status page: ProviderHealth watch failed; retrying");
            }
        }
    };
    (store, fut)
}

/// Serves `router` on `listener` until `shutdown` completes, under the default
/// connection limits ([`crate::http_server`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::http_server::serve(listener, router, shutdown, Default::default()).await
}

// ---------------------------------------------------------------------------------------
// Answers

struct ApiError {
    status: StatusCode,
    message: String,
    extra: Vec<(&'static str, String)>,
    www_authenticate: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            extra: Vec::new(),
            www_authenticate: None,
        }
    }
    fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.extra.push((key, value.into()));
        self
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::NoToken(m) => {
                let mut e = ApiError::new(StatusCode::UNAUTHORIZED, m);
                e.www_authenticate = Some(REALM);
                e
            }
            AuthError::InvalidToken => {
                let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid bearer token");
                e.www_authenticate = Some(REALM_INVALID);
                e
            }
            AuthError::Forbidden { message, reason } => {
                ApiError::new(StatusCode::FORBIDDEN, message).with("reason", reason)
            }
            AuthError::Unavailable(m) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m),
        }
    }
}

impl From<BadParameter> for ApiError {
    fn from(b: BadParameter) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, b.message)
            .with("parameter", b.parameter)
            .with("value", b.value)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = match self.status {
            StatusCode::BAD_REQUEST => "BadRequest",
            StatusCode::UNAUTHORIZED => "Unauthorized",
            StatusCode::FORBIDDEN => "Forbidden",
            StatusCode::NOT_FOUND => "NotFound",
            _ => "ServiceUnavailable",
        };
        let mut body = json!({
            "code": self.status.as_u16(),
            "error": error,
            "message": self.message,
        });
        for (k, v) in self.extra {
            body[k] = Value::String(v);
        }
        let mut resp = json_response(self.status, serde_json::to_vec(&body).unwrap_or_default());
        if let Some(w) = self.www_authenticate {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(w));
        }
        resp
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Answers are per caller and change with the cluster: no shared or stale caching.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

// ---------------------------------------------------------------------------------------
// Handlers

type AppState = State<Arc<Shared>>;

impl Shared {
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Identity>, ApiError> {
        match &self.auth {
            None => Ok(None),
            Some(a) => Ok(Some(a.authenticate(headers).await?)),
        }
    }

    async fn authorize(
        &self,
        who: &Option<Identity>,
        verb: &'static str,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        match (&self.auth, who) {
            (Some(a), Some(who)) => Ok(a.authorize(who, verb, namespace, name).await?),
            _ => Ok(()),
        }
    }

    /// 503 until the reflector has listed once: an empty answer before that would be a lie.
    fn check_synced(&self) -> Result<(), ApiError> {
        if self.synced.is_synced() {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the proxy cache has not synced with the API server yet; retry shortly",
        ))
    }

    /// Whether `who` gets credentials for proxies in `namespace` ("" = every namespace), or
    /// for the one named `name`: never with auth off.
    async fn may_see_credentials(
        &self,
        who: &Option<Identity>,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<bool, ApiError> {
        match (&self.auth, who, &self.credentials) {
            (Some(a), Some(who), Some(_)) => Ok(a
                .allows(who, "get", credentials::SUBRESOURCE, namespace, name)
                .await?),
            _ => Ok(false),
        }
    }

    /// `items` as comma-separated JSON objects, with their credentials (never cached:
    /// the pre-rendered JSON is shared by every caller).
    async fn write_with_credentials(&self, items: &[Arc<Proxy>], out: &mut Vec<u8>) {
        let Some(store) = &self.credentials else {
            return self.rendered.write_items(items, out, &self.store);
        };
        for (i, p) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let creds = store.of(p).await;
            serde_json::to_writer(
                &mut *out,
                &credentials::WithCredentials {
                    view: view::ProxyView::of(p),
                    credentials: creds.as_deref(),
                },
            )
            .expect("writing JSON to a Vec cannot fail");
        }
    }

    /// The common path of the collection endpoints: authenticate, parse the filters,
    /// authorise `list` in their namespace, and return the matching Ready proxies (in no
    /// particular order), with the caller and the namespace it asked about.
    async fn ready_matching(
        &self,
        headers: &HeaderMap,
        query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    ) -> Result<Matching, ApiError> {
        let who = self.authenticate(headers).await?;
        let Query(pairs) = query.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("malformed query string: {e}"),
            )
        })?;
        let filters = Filters::parse(&pairs)?;
        self.authorize(
            &who,
            "list",
            filters.namespace.as_deref().unwrap_or(""),
            None,
        )
        .await?;
        self.check_synced()?;
        Ok(Matching {
            hits: self
                .store
                .state_filter(|p| filters.matches(p) && view::readiness(p).is_ok()),
            namespace: filters.namespace.unwrap_or_default(),
            who,
        })
    }

    /// One Proxy as a JSON answer, with its credentials when `who` may see them in
    /// `namespace` ("" = all), or for the Proxy `name` there.
    async fn one(
        &self,
        who: &Option<Identity>,
        p: &Arc<Proxy>,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<Response, ApiError> {
        let mut body = Vec::with_capacity(256);
        if self.may_see_credentials(who, namespace, name).await? {
            self.write_with_credentials(std::slice::from_ref(p), &mut body)
                .await;
        } else {
            self.rendered
                .write_items(std::slice::from_ref(p), &mut body, &self.store);
        }
        Ok(json_response(StatusCode::OK, body))
    }
}

/// What the collection endpoints found, and for whom.
struct Matching {
    hits: Vec<Arc<Proxy>>,
    /// The `namespace` filter, "" for all.
    namespace: String,
    who: Option<Identity>,
}

/// Answers `{"items": [...]}`, sorted by namespace/name (schema `ProxyList`).
async fn list(
    State(s): AppState,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Matching {
        mut hits,
        namespace,
        who,
    } = match s.ready_matching(&headers, query).await {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    // Credentials in a list only for callers allowed them in the whole namespace (or
    // cluster) asked about; a grant for single Proxies shows in their own answers.
    let with_credentials = match s.may_see_credentials(&who, &namespace, None).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    hits.sort_unstable_by(|a, b| view::sort_key(a).cmp(&view::sort_key(b)));
    let mut body = Vec::with_capacity(16 + hits.len() * 256);
    body.extend_from_slice(br#"{"items":["#);
    if with_credentials {
        s.write_with_credentials(&hits, &mut body).await;
    } else {
        s.rendered.write_items(&hits, &mut body, &s.store);
    }
    body.extend_from_slice(b"]}");
    json_response(StatusCode::OK, body)
}

async fn pick(
    State(s): AppState,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Matching {
        hits,
        who,
        namespace,
    } = match s.ready_matching(&headers, query).await {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match s.picker.pick(&hits, s.store.len(), || s.store.state()) {
        Some(p) => {
            tracing::debug!(proxy = %view::display_name(p), "picked");
            // Like a list: credentials for callers allowed them where they picked from (one
            // cached review per namespace, not one per proxy handed out).
            s.one(&who, p, &namespace, None)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        None => ApiError::new(StatusCode::NOT_FOUND, "no Ready proxy matches the filters")
            .into_response(),
    }
}

async fn get_one(
    State(s): AppState,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Response {
    let result = async {
        let who = s.authenticate(&headers).await?;
        let Path((namespace, name)) = path
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed path: {e}")))?;
        if let Some(q) = uri.query().filter(|q| !q.is_empty()) {
            let param = q.split('&').next().unwrap_or(q);
            let (k, v) = param.split_once('=').unwrap_or((param, ""));
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "this endpoint takes no query parameters",
            )
            .with("parameter", k)
            .with("value", v));
        }
        s.authorize(&who, "get", &namespace, Some(&name)).await?;
        s.check_synced()?;
        let key = ObjectRef::<Proxy>::new(&name).within(&namespace);
        match s.store.get(&key) {
            Some(p) => s.one(&who, &p, &namespace, Some(&name)).await,
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("proxy {namespace}/{name} not found"),
            )),
        }
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn openapi_json() -> Response {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(openapi::document_text);
    let mut resp = (StatusCode::OK, TEXT.as_str()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn html_response(body: String, csp: Option<String>) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Some(csp) = csp.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    resp
}

/// The status page. With auth on it is a shell without data (its script fetches
/// `/status/fragment` with the user's token); with auth off it embeds the content.
async fn status_page(State(s): AppState) -> Response {
    static CSP: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(status_page::content_security_policy);
    let content = match s.auth {
        Some(_) => None,
        None => Some(s.status_content()),
    };
    html_response(status_page::page(content.as_deref()), Some(CSP.clone()))
}

/// The status page's content, behind the API's auth: `list` on proxies in every namespace.
async fn status_fragment(State(s): AppState, headers: HeaderMap) -> Response {
    let result = async {
        let who = s.authenticate(&headers).await?;
        s.authorize(&who, "list", "", None).await?;
        s.check_synced()?;
        Ok::<_, ApiError>(html_response(s.status_content(), None))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

impl Shared {
    fn status_content(&self) -> String {
        if self.check_synced().is_err() {
            return r#"<p class="empty">The proxy cache has not synced yet.</p>"#.to_string();
        }
        status_page::fragment(&self.store, self.providers.as_ref())
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {method} {}; see /openapi.json", uri.path()),
    )
    .into_response()
}
