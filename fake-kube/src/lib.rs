//! An in-memory, stateful Kubernetes API server for tests.
//!
//! There is no cluster, kind or Docker on our build machines, and `kube-fake-client` cannot
//! drive a kube-runtime `Controller` because it has no watch. This crate answers the real
//! HTTP API instead, so the production code paths run unchanged: kube-rs clients
//! (in-process, through [`FakeApi::client`], with no socket), kube-runtime watchers and
//! controllers, kube-lease-manager, and kubectl (over TCP, through [`FakeApi::serve`]).
//! Both ways in share one state.
//!
//! What it models, because operators depend on it: discovery; built-in kinds (Namespace,
//! Secret, ConfigMap, Event in core/v1 and events.k8s.io/v1, Lease, CustomResourceDefinition)
//! and custom resources registered by creating a CRD; every verb including watch with
//! resume, bookmarks and 410 Gone; resourceVersion conflicts; the status and scale
//! subresources and generation rules; finalizers and deletionTimestamp; server-side apply
//! with field ownership; schema pruning and validation of custom resources; namespace, CRD
//! and owner-reference cleanup; programmable TokenReview and SubjectAccessReview answers.
//! See `README.md` in this crate for kubectl usage and the known gaps.

mod auth;
mod error;
mod managed;
mod patch;
mod protobuf;
mod registry;
mod scale;
mod schema;
mod selector;
mod server;
mod store;

pub use auth::{AccessRule, UserInfo};
pub use error::ApiError;

use auth::AuthConfig;
use kube::config::Kubeconfig;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::Store;

/// One API call as the server saw it, for tests that check what an operator does (e.g.
/// that every call is covered by its RBAC rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The RBAC verb: get, list, watch, create, update, patch, delete, deletecollection;
    /// for non-resource paths (discovery, /version) the lower-case HTTP method.
    pub verb: String,
    pub group: Option<String>,
    pub version: Option<String>,
    /// The plural, e.g. `configmaps`; None for non-resource paths.
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub user_agent: Option<String>,
    pub field_manager: Option<String>,
    /// The user a bearer token maps to through [`FakeApi::add_token`].
    pub user: Option<String>,
    /// HTTP status of the answer (200 for a watch that started).
    pub code: u16,
    /// The client asked for metadata only (`Accept: application/json;as=PartialObjectMetadata...`,
    /// what kube's `Api<PartialObjectMeta<K>>` sends): the answer carried no spec, data or
    /// status.
    pub metadata_only: bool,
}

impl RequestRecord {
    /// `resource` or `resource/subresource`, the way RBAC rules name it.
    pub fn rbac_resource(&self) -> Option<String> {
        let r = self.resource.as_ref()?;
        Some(match &self.subresource {
            Some(s) => format!("{r}/{s}"),
            None => r.clone(),
        })
    }
}

struct Injection {
    verbs: Vec<&'static str>,
    resource: String,
    name: Option<String>,
    error: ApiError,
    remaining: usize,
}

struct Inner {
    store: Mutex<Store>,
    auth: Mutex<AuthConfig>,
    requests: Mutex<Vec<RequestRecord>>,
    injections: Mutex<Vec<Injection>>,
    /// (verb, resource, delay) of [`FakeApi::delay`].
    delays: Mutex<Vec<(&'static str, String, Duration)>>,
    bookmark_interval: Mutex<Duration>,
}

/// The fake API server. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Inner>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self::new()
    }
}

/// One of the RBAC verbs requests are recorded with (panics on anything else: a typo in a
/// test).
fn static_verb(verb: &str) -> &'static str {
    match verb {
        "get" => "get",
        "list" => "list",
        "watch" => "watch",
        "create" => "create",
        "update" => "update",
        "patch" => "patch",
        "delete" => "delete",
        "deletecollection" => "deletecollection",
        "watch-event" => "watch-event",
        other => panic!("unknown verb {other:?}"),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not wedge every other user of the fake.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeApi {
    /// A fresh server with the namespaces `default`, `kube-system`, `kube-public` and
    /// `kube-node-lease`.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new()),
                auth: Mutex::new(AuthConfig::default()),
                requests: Mutex::new(Vec::new()),
                injections: Mutex::new(Vec::new()),
                delays: Mutex::new(Vec::new()),
                bookmark_interval: Mutex::new(Duration::from_secs(5)),
            }),
        }
    }

    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.inner.store)
    }

    pub(crate) fn auth(&self) -> MutexGuard<'_, AuthConfig> {
        lock(&self.inner.auth)
    }

    pub(crate) fn record(&self, r: RequestRecord) {
        lock(&self.inner.requests).push(r);
    }

    pub(crate) fn bookmark_interval(&self) -> Duration {
        *lock(&self.inner.bookmark_interval)
    }

    fn router(&self) -> axum::Router {
        let api = self.clone();
        axum::Router::new().fallback(move |req: http::Request<axum::body::Body>| {
            let api = api.clone();
            async move { server::handle(api, req).await }
        })
    }

    /// A client that talks to this server in-process (no socket), with `default` as its
    /// default namespace. Must be called inside a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.router(), "default")
    }

    /// Serves the API over plain HTTP on `addr` (e.g. `127.0.0.1:0`) until the runtime
    /// shuts down; returns the bound address.
    pub async fn serve(&self, addr: &str) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let router = self.router();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::warn!("fake-kube server stopped: {e}");
            }
        });
        Ok(local)
    }

    /// A kubeconfig for a server started with [`FakeApi::serve`] (context `fake-kube`,
    /// namespace `default`, no credentials).
    pub fn kubeconfig(&self, addr: SocketAddr) -> Kubeconfig {
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake-kube", "cluster": {"server": format!("http://{addr}")}}],
            "users": [{"name": "fake-kube", "user": {}}],
            "contexts": [{"name": "fake-kube", "context": {"cluster": "fake-kube", "user": "fake-kube", "namespace": "default"}}],
            "current-context": "fake-kube",
        });
        serde_json::from_value(doc).expect("a well-formed kubeconfig")
    }

    /// Writes [`FakeApi::kubeconfig`] as YAML, for `kubectl --kubeconfig PATH`.
    pub fn write_kubeconfig(
        &self,
        addr: SocketAddr,
        path: &std::path::Path,
    ) -> std::io::Result<()> {
        let yaml = serde_yaml::to_string(&self.kubeconfig(addr)).map_err(std::io::Error::other)?;
        std::fs::write(path, yaml)
    }

    /// A client that talks to a served address over HTTP, built from the kubeconfig the way
    /// an operator builds its own: for tests that run several replicas.
    pub async fn http_client(&self, addr: SocketAddr) -> Result<kube::Client, kube::Error> {
        let config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig(addr), &Default::default())
                .await
                .map_err(kube::Error::InferKubeconfig)?;
        kube::Client::try_from(config)
    }

    /// Every stored object of a resource, named by plural, `plural.group`, kind or short
    /// name (`"configmaps"`, `"proxies.egress.proxy-operator.dev"`, `"Lease"`, `"cm"`).
    /// Unknown resources give an empty list.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let store = self.store();
        match store.registry.find(resource) {
            Some(rt) => server::present_all(&store, rt),
            None => Vec::new(),
        }
    }

    /// What `read` takes from each stored object of `resource` (as stored: `apiVersion`
    /// and `kind` may be absent), read in place under the store's lock. For drivers that
    /// poll a large store: [`FakeApi::objects`] copies every object under that lock, and
    /// at 10,000 Proxies every API request waited about 100 ms for each such poll.
    pub fn scan<T>(&self, resource: &str, read: impl FnMut(&Value) -> Option<T>) -> Vec<T> {
        let store = self.store();
        match store.registry.find(resource) {
            Some(rt) => store.stored(&rt.key()).filter_map(read).collect(),
            None => Vec::new(),
        }
    }

    /// Every stored object of a typed resource, deserialized.
    pub fn objects_of<K>(&self) -> Vec<K>
    where
        K: kube::Resource + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let dt = K::DynamicType::default();
        let group = K::group(&dt);
        let plural = K::plural(&dt);
        let name = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        self.objects(&name)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// One stored object, or None.
    pub fn object(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let store = self.store();
        let rt = store.registry.find(resource)?;
        let obj = store.get(rt, namespace, name).ok()?;
        Some(store.present(rt, &obj, &rt.versions[0]))
    }

    /// Creates an object directly (no request is logged), e.g. to seed a CRD or a Secret.
    /// The kind is taken from `apiVersion` and `kind`.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (group, version) = av.rsplit_once('/').unwrap_or(("", &av));
        let mut store = self.store();
        let rt = store
            .registry
            .types()
            .find(|t| t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version))
            .cloned()
            .ok_or_else(|| ApiError::new(404, "NotFound", format!("no kind {kind} in {av}")))?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| rt.namespaced.then(|| "default".to_string()));
        let mut ctx = store::WriteCtx {
            default_manager: "fake-kube".into(),
            version: version.to_string(),
            ..Default::default()
        };
        let created = store.create(&rt, ns.as_deref(), obj, &mut ctx)?;
        Ok(store.present(&rt, &created, version))
    }

    /// The next update or patch (apply included) of that object fails with 409 Conflict,
    /// as if another writer got there first. `resource` is a plural, kind or short name.
    pub fn inject_conflict_once(&self, resource: &str, name: &str) {
        let (group, plural) = self.resolve(resource);
        lock(&self.inner.injections).push(Injection {
            verbs: vec!["update", "patch"],
            resource: resource.to_string(),
            name: Some(name.to_string()),
            error: ApiError::stale(&group, &plural, name),
            remaining: 1,
        });
    }

    /// The next `times` requests with `verb` (get, list, watch, create, update, patch,
    /// delete, deletecollection) on `resource` fail with `error`.
    pub fn inject_error(&self, verb: &str, resource: &str, error: ApiError, times: usize) {
        let verb = static_verb(verb);
        lock(&self.inner.injections).push(Injection {
            verbs: vec![verb],
            resource: resource.to_string(),
            name: None,
            error,
            remaining: times,
        });
    }

    fn resolve(&self, resource: &str) -> (String, String) {
        let store = self.store();
        match store.registry.find(resource) {
            Some(rt) => (rt.group.clone(), rt.plural.clone()),
            None => match resource.split_once('.') {
                Some((p, g)) => (g.to_string(), p.to_string()),
                None => (String::new(), resource.to_string()),
            },
        }
    }

    /// Every later request with `verb` on `resource` (as for [`FakeApi::inject_error`])
    /// waits `by` before it is served, like a slow API server: for tests of what
    /// concurrent callers do while a request is in flight. `Duration::ZERO` removes it.
    ///
    /// The pseudo-verb `watch-event` holds every event a watch on `resource` sends by
    /// `by` instead (one after the other, so a watch lags its writes by at least `by`): a
    /// watch cache that is behind the server, as informers are under load.
    pub fn delay(&self, verb: &str, resource: &str, by: Duration) {
        let verb = static_verb(verb);
        let mut delays = lock(&self.inner.delays);
        delays.retain(|(v, r, _)| !(*v == verb && r == resource));
        if !by.is_zero() {
            delays.push((verb, resource.to_string(), by));
        }
    }

    pub(crate) fn delay_for(&self, verb: &str, rt: &registry::ResourceType) -> Option<Duration> {
        let full = format!("{}.{}", rt.plural, rt.group);
        lock(&self.inner.delays)
            .iter()
            .find(|(v, r, _)| {
                *v == verb
                    && (*r == rt.plural
                        || *r == full
                        || r.eq_ignore_ascii_case(&rt.kind)
                        || rt.short_names.contains(r))
            })
            .map(|(_, _, d)| *d)
    }

    pub(crate) fn take_injection(
        &self,
        verb: &str,
        rt: &registry::ResourceType,
        name: Option<&str>,
    ) -> Option<ApiError> {
        let mut injections = lock(&self.inner.injections);
        let full = format!("{}.{}", rt.plural, rt.group);
        let pos = injections.iter().position(|i| {
            i.verbs.contains(&verb)
                && (i.resource == rt.plural
                    || i.resource == full
                    || i.resource.eq_ignore_ascii_case(&rt.kind)
                    || rt.short_names.contains(&i.resource))
                && i.name.as_deref().is_none_or(|n| Some(n) == name)
        })?;
        let inj = &mut injections[pos];
        inj.remaining -= 1;
        let err = inj.error.clone();
        if inj.remaining == 0 {
            injections.remove(pos);
        }
        Some(err)
    }

    /// Every request served so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.inner.requests).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
    }

    /// TokenReview answers `user` for `token`; requests bearing it are logged as that user.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.auth().tokens.insert(token.to_string(), user);
    }

    /// SubjectAccessReview allows what any added rule matches, and denies the rest.
    pub fn allow(&self, rule: AccessRule) {
        self.auth().rules.push(rule);
    }

    /// Drops the watch history: a watch resuming from an older resourceVersion gets
    /// `410 Gone` (reason `Expired`) and a watcher must re-list, as after etcd compaction.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// How many events watches can resume over (default 10,000).
    pub fn set_history_limit(&self, events: usize) {
        self.store().history_limit = events.max(1);
    }

    /// Ends every open watch stream, as an API server restart would.
    pub fn close_watches(&self) {
        self.store().close_watches();
    }

    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK (default 5 s).
    pub fn set_bookmark_interval(&self, every: Duration) {
        *lock(&self.inner.bookmark_interval) = every.max(Duration::from_millis(10));
    }

    /// Turns owner-reference garbage collection on or off (on by default).
    pub fn set_garbage_collection(&self, on: bool) {
        let mut store = self.store();
        store.garbage_collection = on;
        store.quiet = false;
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }
}
