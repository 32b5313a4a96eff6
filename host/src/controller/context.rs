//! What the reconciler is configured with and shares between reconciles: its settings, its
//! context (clients, registry, caches, metrics) and its error type.

use crate::controller::decide::{Failure, Timings};
use crate::controller::proxy_auth::Credentials;
use crate::controller::secret_cache::SecretCache;
use crate::inventory::Inventory;
use crate::probe::{ProbeEngine, ProbeSpec};
use crate::proxy_cache::{ProxyCache, ProxyFeed};
use crate::registry::ProviderRegistry;
use egress_plugin_host::provider::ProviderError;

use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Our finalizer on every Proxy: the instance is deleted before the Proxy goes.
pub const FINALIZER: &str = "egress.proxy-operator.dev/instance";
/// The one field manager every status write is applied under.
pub const FIELD_MANAGER: &str = "proxy-operator";

/// What the reconciler is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub timings: Timings,
    /// Written on every instance at Create; see [`crate::installation`].
    pub installation: String,
    /// Proxies reconciled at once.
    pub concurrency: u16,
    /// First retry after a failed reconcile; doubles per consecutive failure.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// `reportingInstance` of events (the pod name).
    pub instance_name: Option<String>,
}

impl Settings {
    pub fn new(installation: impl Into<String>) -> Self {
        Settings {
            timings: Timings::default(),
            installation: installation.into(),
            concurrency: 3,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            instance_name: None,
        }
    }
}

/// Why a reconcile failed. All of them are retried with exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("resolving the Proxy's inputs (cloud-init and credentials Secrets): {0}")]
    CloudInit(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Proxy has no {0}")]
    Metadata(&'static str),
}

impl From<Failure> for ReconcileError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Provider(e) => ReconcileError::Provider(e),
            Failure::Input(m) => ReconcileError::CloudInit(m),
        }
    }
}

/// How running proxies are probed: the engine and what every probe looks like.
#[derive(Clone)]
pub struct HealthHook {
    pub engine: Arc<ProbeEngine>,
    /// `host:port` each CONNECT asks for.
    pub target: String,
    /// An echo URL fetched through the tunnel to check the egress address.
    pub egress_echo: Option<http::Uri>,
    pub timeout: Duration,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// How stale `lastProbe` may get while the verdict does not change.
    pub probe_refresh: Duration,
}

impl HealthHook {
    /// The probe of one proxy; with its credentials when it has any, so the CONNECT (and
    /// the egress check through its tunnel) passes a proxy that requires them.
    pub(super) fn spec(
        &self,
        proxy: SocketAddr,
        allow_internal: bool,
        credentials: Option<&Credentials>,
    ) -> ProbeSpec {
        ProbeSpec {
            proxy,
            allow_internal,
            target: self.target.clone(),
            auth: credentials.map(|c| (c.username.clone(), c.password.clone())),
            egress_echo: self.egress_echo.clone(),
            timeout: self.timeout,
            tls: self.tls.clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReconcileLabels {
    /// `ok`, or what failed: `provider_<class>`, `input`, `kube` or `metadata`.
    result: String,
}

/// `proxy_operator_reconciles_total{result}`,
/// `proxy_operator_reconcile_duration_seconds{result}` and
/// `proxy_operator_instance_interruptions_total{provider}`.
#[derive(Clone)]
pub struct ReconcileMetrics {
    count: prometheus_client::metrics::family::Family<
        ReconcileLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Instances the cloud reclaimed (spot interruptions), by provider.
    interruptions: prometheus_client::metrics::family::Family<
        ProviderLabel,
        prometheus_client::metrics::counter::Counter,
    >,
    duration: prometheus_client::metrics::family::Family<
        ReconcileLabels,
        prometheus_client::metrics::histogram::Histogram,
    >,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        ReconcileMetrics {
            count: Default::default(),
            interruptions: Default::default(),
            duration: prometheus_client::metrics::family::Family::new_with_constructor(|| {
                prometheus_client::metrics::histogram::Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ])
            }),
        }
    }
}

impl ReconcileMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = ReconcileMetrics::default();
        registry.register(
            "proxy_operator_reconciles",
            "Proxy reconciles by result",
            m.count.clone(),
        );
        registry.register(
            "proxy_operator_reconcile_duration_seconds",
            "Time one Proxy reconcile took, provider calls included, by result",
            m.duration.clone(),
        );
        registry.register(
            "proxy_operator_instance_interruptions",
            "Instances the cloud reclaimed (spot interruptions), each replaced, by provider",
            m.interruptions.clone(),
        );
        m
    }

    /// One instance of `provider` was found reclaimed (said by an `Interrupted` Event).
    pub(crate) fn interrupted(&self, provider: &str) {
        self.interruptions
            .get_or_create(&ProviderLabel {
                provider: provider.to_string(),
            })
            .inc();
    }

    pub(crate) fn observe(&self, result: &Result<Action, ReconcileError>, took: Duration) {
        let labels = ReconcileLabels {
            result: match result {
                Ok(_) => "ok".into(),
                Err(ReconcileError::Provider(e)) => {
                    format!("provider_{}", e.class.as_str())
                }
                Err(ReconcileError::CloudInit(_)) => "input".into(),
                Err(ReconcileError::Kube(_)) => "kube".into(),
                Err(ReconcileError::Metadata(_)) => "metadata".into(),
            },
        };
        self.count.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub(super) client: kube::Client,
    pub(super) registry: ProviderRegistry,
    pub(super) recorder: crate::controller::events::Events,
    pub(super) settings: Settings,
    /// Consecutive failures per Proxy UID, for the backoff.
    pub(super) failures: Mutex<HashMap<String, u32>>,
    /// Running Proxies (`namespace/name`) whose probe just failed: their next reconcile
    /// asks the provider (Get) instead of trusting the last list, so an instance the cloud
    /// reclaimed or stopped is found within a probe interval, not a drift poll.
    pub(super) suspects: Mutex<std::collections::HashSet<String>>,
    /// Prices asked in the background, one quote per placement (see [`super::pricing`]).
    pub(super) pricing: Arc<super::pricing::Pricing>,
    pub(super) health: Option<HealthHook>,
    pub(super) metrics: ReconcileMetrics,
    /// Drift detection by list (see [`crate::inventory`]); without it, one Get per Running
    /// Proxy per drift poll.
    pub(super) inventory: Option<Arc<Inventory>>,
    /// Cloud-init Secrets: read once per change, not once per reconcile (see
    /// [`secret_cache`]); the controller attaches its metadata watch while it runs.
    pub(super) secrets: Arc<SecretCache>,
    /// The process's Proxy cache and its feed (see [`crate::proxy_cache`]); without it, the
    /// controller watches Proxies into a cache of its own.
    pub(super) proxies: Option<(ProxyCache, Arc<ProxyFeed>)>,
    /// Proxies whose create returned lately, for ordering the queue of turns (see
    /// [`super::turns::Returned`]).
    pub(super) returned: super::turns::Returned,
}

impl Context {
    pub fn new(client: kube::Client, registry: ProviderRegistry, settings: Settings) -> Self {
        let recorder = crate::controller::events::Events::new(
            client.clone(),
            Reporter {
                controller: "proxy-operator".into(),
                instance: settings.instance_name.clone(),
            },
        );
        Context {
            client,
            registry,
            recorder,
            settings,
            failures: Mutex::new(HashMap::new()),
            suspects: Mutex::new(Default::default()),
            pricing: Default::default(),
            health: None,
            metrics: ReconcileMetrics::default(),
            inventory: None,
            secrets: Arc::new(SecretCache::new()),
            proxies: None,
            returned: Default::default(),
        }
    }

    /// The probe of `key` (`namespace/name`) failed where it had succeeded: its next
    /// reconcile asks the provider.
    pub(super) fn suspect(&self, key: &str) {
        self.suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string());
    }

    /// Whether `key` is suspect, clearing it: one Get per failure that raised it.
    pub(super) fn take_suspect(&self, key: &str) -> bool {
        self.suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    /// Detect drift of Running Proxies from one ListByTag per provider per drift poll,
    /// kept in `inventory` (shared with orphan GC), instead of one Get per Proxy. The
    /// controller runs the listing loop.
    pub fn with_inventory(mut self, inventory: Arc<Inventory>) -> Self {
        self.inventory = Some(inventory);
        self
    }

    /// Reconciles from the process's one Proxy cache instead of a watch of its own.
    pub fn with_proxy_cache(mut self, cache: ProxyCache, feed: Arc<ProxyFeed>) -> Self {
        self.proxies = Some((cache, feed));
        self
    }

    /// The inventory this context keeps, if any.
    pub fn inventory(&self) -> Option<Arc<Inventory>> {
        self.inventory.clone()
    }

    /// Count reconciles and their durations into `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: ReconcileMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Probe running proxies with `hook`: `Healthy`, `lastProbe` and so `Ready` follow its
    /// verdicts. Without it `Healthy` stays unknown and no Proxy becomes Ready.
    pub fn with_health(mut self, hook: HealthHook) -> Self {
        self.health = Some(hook);
        self
    }

    /// The cloud-init Secret cache.
    pub fn secret_cache(&self) -> Arc<SecretCache> {
        self.secrets.clone()
    }

    pub(super) fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}
