//! The shell around [`decide`]: reads what it needs, writes status, publishes events, adds
//! and removes the finalizer, and makes the provider calls. No branching on outcomes here;
//! that is all in `decide.rs`.

use super::auth::{self, Credentials};
use super::decide::{
    Answer, Call, CondView, Decision, DeletePurpose, EventNote, Failure, GetPurpose, Input, Next,
    Observed, Timings, decide,
};
use super::secret_cache::SecretCache;
use super::secrets::CloudInitError;
use super::secrets::SecretKey;
use super::template;
use super::turns::Turns;
use super::{input, keyed_spec_hash, secret_cache, spec_hash, status};
use crate::api::{Proxy, ProxyStatus, condition};
use crate::cache::{ProxyCache, ProxyFeed, trim_for_cache};
use crate::inventory::Inventory;
use crate::probe::{ProbeEngine, ProbeSpec};
use crate::registry::ProviderRegistry;
use egress_plugin_host::provider::State;
use egress_plugin_host::provider::priority::{Priority, scope};
use egress_plugin_host::provider::{
    Class, CreateRequest, Op, Placement, Provider, ProviderError, name_from_uid,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Instrument, debug, info, warn};

/// Our finalizer on every Proxy: the instance is deleted before the Proxy goes.
pub const FINALIZER: &str = "egress.proxy-operator.dev/instance";
/// The one field manager every status write is applied under.
pub const FIELD_MANAGER: &str = "proxy-operator";

/// Upper bound on decide/act rounds in one reconcile. The longest path is
/// Get (NotFound) -> Create, or AddFinalizer -> Create; anything longer is a bug, and
/// the reconcile then just comes back after RequeueNow.
const MAX_STEPS: usize = 6;
/// Events carry at most 1 kB of note; conditions get a generous but bounded message.
pub(crate) const EVENT_NOTE_MAX: usize = 1024;
pub(crate) const CONDITION_MESSAGE_MAX: usize = 4096;

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
    fn spec(
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
struct ReconcileLabels {
    /// `ok`, or what failed: `provider_<class>`, `input`, `kube` or `metadata`.
    result: String,
}

/// `proxy_operator_reconciles_total{result}` and
/// `proxy_operator_reconcile_duration_seconds{result}`.
#[derive(Clone)]
pub struct ReconcileMetrics {
    count: prometheus_client::metrics::family::Family<
        ReconcileLabels,
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
        m
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
    client: kube::Client,
    registry: ProviderRegistry,
    recorder: super::events::Events,
    settings: Settings,
    /// Consecutive failures per Proxy UID, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    health: Option<HealthHook>,
    metrics: ReconcileMetrics,
    /// Drift detection by list (see [`crate::inventory`]); without it, one Get per Running
    /// Proxy per drift poll.
    inventory: Option<Arc<Inventory>>,
    /// Cloud-init Secrets: read once per change, not once per reconcile (see
    /// [`secret_cache`]); the controller attaches its metadata watch while it runs.
    secrets: Arc<SecretCache>,
    /// The process's Proxy cache and its feed (see [`crate::cache`]); without it, the
    /// controller watches Proxies into a cache of its own.
    proxies: Option<(ProxyCache, Arc<ProxyFeed>)>,
}

impl Context {
    pub fn new(client: kube::Client, registry: ProviderRegistry, settings: Settings) -> Self {
        let recorder = super::events::Events::new(
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
            health: None,
            metrics: ReconcileMetrics::default(),
            inventory: None,
            secrets: Arc::new(SecretCache::new()),
            proxies: None,
        }
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

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the Proxy controller until `shutdown` resolves (then finishes the reconciles in
/// flight). Every Proxy is reconciled again whenever the provider registry changes.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let proxies: Api<Proxy> = Api::all(ctx.client.clone());
    let concurrency = ctx.settings.concurrency;
    // Every probe result re-runs that Proxy's reconcile, which folds the verdict into its
    // status: the status keeps one writer.
    let (probed_tx, probed_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Proxy>>();
    let probed = futures::stream::unfold(probed_rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });
    let mut recheck_rx = None;
    let stop_probes = tokio_util::sync::CancellationToken::new();
    if let Some(hook) = &ctx.health {
        let engine = hook.engine.clone();
        let stop = stop_probes.clone();
        tokio::spawn(async move {
            engine
                .run(stop, move |report| {
                    // Only changes: a status write per probe would be one write per proxy
                    // per interval. The drift poll refreshes lastProbe (see health_view).
                    if !report.changed {
                        return;
                    }
                    if let Some((ns, name)) = report.key.split_once('/') {
                        let _ = probed_tx.send(ObjectRef::new(name).within(ns));
                    }
                })
                .await
        });
    }
    let _stop_probes = stop_probes.drop_guard();
    let (
        ProxyCache {
            store: reader,
            synced,
        },
        applied,
    ) = proxy_source(&ctx, proxies);
    let stop_inventory = tokio_util::sync::CancellationToken::new();
    if let Some(inventory) = &ctx.inventory {
        // Proxies a new list does not confirm are reconciled at once (and so Get).
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Proxy>>();
        recheck_rx = Some(rx);
        tokio::spawn(crate::inventory::run(
            inventory.clone(),
            ctx.registry.clone(),
            ctx.settings.installation.clone(),
            ProxyCache {
                store: reader.clone(),
                synced: synced.clone(),
            },
            ctx.settings.timings.drift_poll,
            move |r| {
                let _ = tx.send(r);
            },
            stop_inventory.clone(),
        ));
    }
    let _stop_inventory = stop_inventory.drop_guard();
    // Cloud-init Secrets: a metadata-only watch says when a held copy is stale, and re-runs
    // the Proxies referencing a Secret that changed. It stops with this controller (and so
    // with leadership); the held data goes with it.
    let (secret_changes, _secrets_attached) =
        secret_cache::watch(ctx.client.clone(), ctx.secrets.clone());
    let stop_prune = tokio_util::sync::CancellationToken::new();
    tokio::spawn(prune_secrets(
        ctx.secrets.clone(),
        ProxyCache {
            store: reader.clone(),
            synced,
        },
        ctx.settings.timings.drift_poll,
        stop_prune.clone(),
    ));
    let _stop_prune = stop_prune.drop_guard();
    let rechecks = futures::stream::unfold(recheck_rx, |rx| async move {
        let mut rx = rx?;
        rx.recv().await.map(|r| (r, Some(rx)))
    });
    // The watch triggers a reconcile only when something the reconciler reads changed
    // (see `trigger_hash`): the operator's own status writes come back through the watch
    // and would otherwise each cost one more reconcile with a provider call.
    let changes = applied.predicate_filter(trigger_hash, PredicateConfig::default());
    // kube's runner is unbounded; `turns` admits `concurrency` reconciles at a time, in
    // the order they came due (see `turns` for why).
    let turns = Turns::new(concurrency);
    let close = turns.clone();
    let store = reader.clone();
    Controller::for_stream(changes, reader)
        .with_config(ControllerConfig::default().concurrency(0))
        .reconcile_all_on(ctx.registry.changes())
        .reconcile_on(probed)
        .reconcile_on(rechecks)
        .reconcile_on(secret_changes)
        .graceful_shutdown_on(async move {
            shutdown.await;
            close.close();
        })
        .run(
            move |proxy, ctx| in_turn(turns.clone(), store.clone(), proxy, ctx),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                // Reconcile errors were logged by error_policy; these are watch/queue errors.
                debug!(error = %e, "controller");
            }
        })
        .await;
}

/// The Proxy cache the controller reads and the Proxies it is triggered by: the process's
/// shared cache and a subscription to its feed (the Proxies already known first, read
/// after subscribing so that none falls between; the predicate drops the repeats), or a
/// watch of its own.
fn proxy_source(
    ctx: &Context,
    proxies: Api<Proxy>,
) -> (
    ProxyCache,
    futures::stream::BoxStream<'static, Result<Proxy, watcher::Error>>,
) {
    if let Some((cache, feed)) = &ctx.proxies {
        let live = feed.subscribe();
        let known: Vec<Proxy> = cache.store.state().iter().map(|p| (**p).clone()).collect();
        let applied = futures::stream::iter(known).chain(live).map(Ok).boxed();
        return (cache.clone(), applied);
    }
    let (store, writer) = reflector::store();
    let (mark_synced, synced) = crate::cache::channel();
    let events = reflector(
        writer,
        watcher(proxies, watcher::Config::default()).modify(trim_for_cache),
    )
    .inspect(move |ev| mark_synced.observe(ev));
    let applied = crate::cache::applied_once_cached(events, store.clone()).boxed();
    (ProxyCache { store, synced }, applied)
}

/// Every `every`, once the Proxy cache has synced: drops the data of Secrets no Proxy
/// references any more.
async fn prune_secrets(
    secrets: Arc<SecretCache>,
    proxies: crate::cache::ProxyCache,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let every = every.max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if proxies.synced.is_synced() {
            let dropped = secrets.prune(&proxies.store);
            if dropped > 0 {
                debug!(dropped, "cloud-init Secrets no Proxy references any more");
            }
        }
    }
}

/// What of a Proxy, when it changes, needs a reconcile: the generation (the spec, and the
/// API server's bump when deletion starts), the deletion timestamp itself (not every API
/// server bumps the generation for it), the finalizers (ours may have been removed) and
/// the annotations (skip-cleanup). Not the status: the reconciler is its only writer, and
/// everything else it reads (the provider, the instance, the health verdict) arrives by
/// timer (drift and provisioning polls), by registry swap or by probe.
pub fn trigger_hash(proxy: &Proxy) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = &proxy.metadata;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    meta.finalizers.hash(&mut h);
    meta.annotations.hash(&mut h);
    Some(h.finish())
}

/// Backoff after a failed reconcile: base * 2^(n-1), capped.
pub fn backoff(failures: u32, base: Duration, max: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(max)
}

fn error_policy(proxy: Arc<Proxy>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    let key = proxy.uid().unwrap_or_else(|| proxy.name_any());
    let n = {
        let mut failures = ctx.failures();
        let n = failures.entry(key).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(n, ctx.settings.backoff_base, ctx.settings.backoff_max);
    warn!(
        proxy.namespace = proxy.namespace().unwrap_or_default(),
        proxy.name = proxy.name_any(),
        error = %err,
        failures = n,
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Waits for a turn, then reconciles the Proxy as the cache has it by then (a request can
/// wait minutes behind a large queue). Kept small while it waits: the reconcile's own
/// future is only built (and boxed) once the turn comes.
async fn in_turn(
    turns: Turns,
    store: Store<Proxy>,
    proxy: Arc<Proxy>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let Some(_turn) = turns.take().await else {
        // Shutting down: the next leader (or this process's next term) reconciles it.
        return Ok(Action::await_change());
    };
    // Gone from the cache: deleted and released meanwhile; nothing left to do.
    let Some(fresh) = store.get(&ObjectRef::from_obj(&*proxy)) else {
        return Ok(Action::await_change());
    };
    Box::pin(reconcile(fresh, ctx)).await
}

/// One reconcile of one Proxy.
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let span = tracing::info_span!(
        "reconcile",
        proxy.namespace = proxy.namespace().unwrap_or_default(),
        proxy.name = proxy.name_any(),
        proxy.uid = proxy.uid().unwrap_or_default(),
        provider.name = proxy.spec.provider.as_str(),
        generation = proxy.metadata.generation.unwrap_or_default(),
        trace_id = tracing::field::Empty,
    );
    if let Some(id) = crate::telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    let started = std::time::Instant::now();
    let result = match Shell::new(&proxy, &ctx) {
        Ok(shell) => shell.run().instrument(span).await,
        Err(e) => Err(e),
    };
    ctx.metrics.observe(&result, started.elapsed());
    if result.is_ok()
        && let Some(uid) = proxy.uid()
    {
        ctx.failures().remove(&uid);
    }
    result
}

/// The cloud-init and port the provider gets, and the credentials the probe sends.
struct Resolved {
    cloud_init: Vec<u8>,
    port: u16,
    credentials: Option<Credentials>,
}

struct Shell<'a> {
    proxy: &'a Proxy,
    ctx: &'a Context,
    api: Api<Proxy>,
    namespace: String,
    name: String,
    uid: String,
    provider: Option<Arc<dyn Provider>>,
    /// The object's resourceVersion as of our last write, for the finalizer patch's
    /// optimistic lock (a status write in the same reconcile moves it).
    resource_version: Option<String>,
}

impl<'a> Shell<'a> {
    fn new(proxy: &'a Proxy, ctx: &'a Context) -> Result<Self, ReconcileError> {
        let namespace = proxy
            .namespace()
            .ok_or(ReconcileError::Metadata("namespace"))?;
        let name = proxy
            .metadata
            .name
            .clone()
            .ok_or(ReconcileError::Metadata("name"))?;
        let uid = proxy.uid().ok_or(ReconcileError::Metadata("uid"))?;
        Ok(Shell {
            proxy,
            ctx,
            api: Api::namespaced(ctx.client.clone(), &namespace),
            provider: ctx.registry.get(&proxy.spec.provider),
            resource_version: proxy.resource_version(),
            namespace,
            name,
            uid,
        })
    }

    async fn run(mut self) -> Result<Action, ReconcileError> {
        let timings = &self.ctx.settings.timings;
        let deleting = self.proxy.metadata.deletion_timestamp.is_some();
        // A missing Secret must never block deletion, so it is not even read then.
        let (input, resolved) = if deleting {
            (
                Input::Unavailable {
                    message: "not resolved while deleting".into(),
                },
                None,
            )
        } else {
            self.resolve().await
        };
        let mut status = self.proxy.status.clone().unwrap_or_default();
        let has_finalizer = self.proxy.finalizers().iter().any(|f| f == FINALIZER);
        let listed = self.listed(&status);
        let list_pending = listed.is_none() && self.list_pending();
        let mut answer: Option<Answer> = None;
        for _ in 0..MAX_STEPS {
            let observed = observe(
                self.proxy,
                &status,
                has_finalizer,
                self.provider.is_some(),
                input.clone(),
                listed.clone(),
                list_pending,
            );
            let Decision {
                status: change,
                events,
                next,
            } = decide(&observed, answer.take().as_ref(), timings);
            debug!(next = ?next, status_change = ?change, "decided");
            if !change.is_empty() || self.health_view(&status).is_some() {
                status = self.write_status(&status, &change).await?;
            }
            self.sync_health(&status, deleting, resolved.as_ref());
            for e in events {
                self.publish(e).await;
            }
            match next {
                Next::Call(call) => answer = Some(self.call(call, resolved.as_ref()).await),
                Next::AddFinalizer => {
                    // End here: the patch triggers the next reconcile, which then sees the
                    // object as the server has it (finalizer included). Carrying on with
                    // this copy would let that next reconcile start from a status older
                    // than the one this one is about to write.
                    self.add_finalizer().await?;
                    return Ok(Action::requeue(timings.requeue_now));
                }
                Next::ReleaseFinalizer => {
                    // Not left to owner-reference garbage collection alone: the Secret
                    // goes before the Proxy does, even where nothing collects garbage.
                    self.delete_generated_secret().await?;
                    self.remove_finalizer().await?;
                    // Its instance is gone: what it made sensitive may go when room is
                    // needed (kept a while: see `egress_plugin_host::sensitive`).
                    if let Some(p) = &self.provider {
                        p.forget(&self.uid);
                    }
                    info!("finalizer released");
                    return Ok(Action::await_change());
                }
                Next::Requeue(after) => return Ok(Action::requeue(after)),
                Next::AwaitChange => return Ok(Action::await_change()),
                Next::Fail(f) => return Err(f.into()),
            }
        }
        warn!("reconcile did not settle; coming back shortly");
        Ok(Action::requeue(timings.requeue_now))
    }

    /// What the provider's last fresh list says about the recorded instance.
    fn listed(&self, status: &ProxyStatus) -> Option<egress_plugin_host::provider::Instance> {
        let inventory = self.ctx.inventory.as_ref()?;
        let provider = self.provider.as_ref()?;
        let id = status.provider_id.as_deref().filter(|s| !s.is_empty())?;
        inventory.lookup(
            &self.proxy.spec.provider,
            provider,
            id,
            std::time::SystemTime::now(),
        )
    }

    /// Whether the provider's list under way will answer for this Proxy (no fresh one yet).
    fn list_pending(&self) -> bool {
        let (Some(inventory), Some(provider)) = (&self.ctx.inventory, &self.provider) else {
            return false;
        };
        inventory.pending(
            &self.proxy.spec.provider,
            provider,
            std::time::SystemTime::now(),
        )
    }

    /// Cloud-init bytes (the template rendered), port and credentials, and the [`Input`]
    /// decide sees.
    async fn resolve(&self) -> (Input, Option<Resolved>) {
        let spec = &self.proxy.spec;
        let port = match input::port(spec) {
            Ok(p) => p,
            Err(message) => return (Input::Invalid { message }, None),
        };
        let access = auth::access(&spec.auth, &self.name);
        let source = input::source(&spec.cloud_init);
        let mut referenced = vec![];
        if let Ok(input::Source::Secret { name, .. }) = &source {
            referenced.push(*name);
        }
        if let Some(name) = access.as_ref().ok().and_then(|a| a.source.secret_name())
            && !referenced.contains(&name)
        {
            referenced.push(name);
        }
        self.ctx
            .secrets
            .reference(&self.namespace, &self.name, &referenced);
        let access = match access {
            Ok(a) => a,
            Err(e) => {
                return (
                    Input::Invalid {
                        message: e.to_string(),
                    },
                    None,
                );
            }
        };
        let template = match source {
            Err(message) => return (Input::Invalid { message }, None),
            Ok(input::Source::Inline(text)) => text.as_bytes().to_vec(),
            Ok(input::Source::Secret { name, key }) => {
                let secret = SecretKey::new(&self.namespace, name);
                let held = match self.ctx.secrets.read_all(&self.ctx.client, &secret).await {
                    Ok(held) => held,
                    Err(e) => return (unavailable(&e, e.to_string()), None),
                };
                // Only a Secret meant for cloud-init, never any Secret of the namespace
                // (see `auth::CLOUD_INIT_LABEL`); labelling it re-runs this Proxy at once.
                if !held.labelled_for_cloud_init {
                    let refused = auth::Refused::CloudInitNotLabelled {
                        namespace: self.namespace.clone(),
                        name: name.to_string(),
                    };
                    return (
                        Input::Unavailable {
                            message: refused.to_string(),
                        },
                        None,
                    );
                }
                match super::secrets::value(&secret, &held, key) {
                    Ok(bytes) => bytes,
                    Err(e) => return (unavailable(&e, e.to_string()), None),
                }
            }
        };
        let (credentials, key) = match self.credentials(&access.source).await {
            Ok(Some((c, key))) => (Some(c), key),
            Ok(None) => (None, None),
            Err(input) => return (input, None),
        };
        // Sensitive as values of their own, in every encoding, before anything is rendered
        // or called: every later call of this provider, for any Proxy, is scrubbed of them
        // and no ID it returns may hold them (not only as part of this cloud-init).
        // Refused when the redactor has no room left (`--redaction-memory`): the Proxy
        // then waits, saying so, and nothing is handed to the plugin.
        if let (Some(p), Some(c)) = (&self.provider, &credentials)
            && let Err(e) = p.remember_credentials(&self.uid, &c.username, &c.password)
        {
            return (
                Input::Unavailable {
                    message: e.to_string(),
                },
                None,
            );
        }
        let values = template::Values {
            port,
            name: &self.name,
            credentials: credentials
                .as_ref()
                .map(|c| (c.username.as_str(), c.password.as_str())),
            allowed_clients: &access.allowed_clients,
        };
        let rendered = match template::render(&template, &values) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Input::Invalid {
                        message: e.to_string(),
                    },
                    None,
                );
            }
        };
        let cloud_init = rendered.bytes.clone();
        // Every call of this provider scrubs this document from then on, not only Create.
        if let Some(p) = &self.provider
            && let Err(e) = p.remember_cloud_init(&self.uid, &cloud_init)
        {
            return (
                Input::Unavailable {
                    message: e.to_string(),
                },
                None,
            );
        }
        let mut hash = spec_hash(&spec.placement, &cloud_init, port);
        if rendered.has_credentials() {
            // Never an unkeyed hash of a password into the status (see `keyed`).
            hash = keyed_spec_hash(&hash, key.as_deref().unwrap_or_default());
        }
        (
            Input::Resolved { hash },
            Some(Resolved {
                cloud_init,
                port,
                credentials,
            }),
        )
    }

    /// The Proxy's credentials and the UID of the Secret they are in; for
    /// `type: Generated`, the Secret is created first when it does not exist.
    async fn credentials(
        &self,
        source: &auth::Source,
    ) -> Result<Option<(Credentials, Option<String>)>, Input> {
        let Some(name) = source.secret_name() else {
            return Ok(None);
        };
        let field = source.field();
        let key = SecretKey::new(&self.namespace, name);
        let held = match self.ctx.secrets.read_all(&self.ctx.client, &key).await {
            Ok(h) => h,
            Err(CloudInitError::NotFound { .. })
                if matches!(source, auth::Source::Generated(_)) =>
            {
                match self.create_generated_secret(name).await? {
                    Generated::Created(c, uid) => return Ok(Some((c, uid))),
                    Generated::Exists(held) => held,
                }
            }
            Err(CloudInitError::NotFound { .. }) => {
                return Err(Input::Unavailable {
                    message: format!("Secret {key} not found ({field})"),
                });
            }
            Err(e) => return Err(unavailable(&e, format!("{e} ({field})"))),
        };
        // Only a Secret meant for this Proxy's credentials: never adopted, never any
        // Secret of the namespace (see `auth::may_use`). Checked before a value is read.
        auth::may_use(
            source,
            &self.namespace,
            name,
            held.labelled_for_proxies,
            held.controller.as_deref(),
            &self.uid,
        )
        .map_err(|refused| match refused {
            // The Proxy's own name is taken: only a spec change (or removing that
            // Secret) helps.
            auth::Refused::NotOwned { .. } => Input::Invalid {
                message: refused.to_string(),
            },
            // Labelling the Secret fixes it, and its change re-runs this Proxy at once.
            auth::Refused::NotLabelled { .. } | auth::Refused::CloudInitNotLabelled { .. } => {
                Input::Unavailable {
                    message: refused.to_string(),
                }
            }
        })?;
        // A Secret the user can fix by editing it: a condition, retried (its change
        // re-runs this Proxy at once).
        let credentials = auth::from_values(
            &key.to_string(),
            field,
            held.value(auth::USERNAME_KEY),
            held.value(auth::PASSWORD_KEY),
        )
        .map_err(|e| Input::Unavailable {
            message: e.to_string(),
        })?;
        Ok(Some((credentials, held.uid.clone())))
    }

    /// Creates the Secret of generated credentials, owned by the Proxy (so it goes with it
    /// wherever owner references are collected) and labelled with its name.
    async fn create_generated_secret(&self, name: &str) -> Result<Generated, Input> {
        let credentials = auth::generate().map_err(|e| Input::Unreadable {
            message: format!("generating credentials: the random number generator failed: {e}"),
        })?;
        let secret = k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(auth::PROXY_LABEL.to_string(), self.name.clone())].into()),
                owner_references: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: Proxy::api_version(&()).into_owned(),
                        kind: Proxy::kind(&()).into_owned(),
                        name: self.name.clone(),
                        uid: self.uid.clone(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    },
                ]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            string_data: Some(
                [
                    (auth::USERNAME_KEY.to_string(), credentials.username.clone()),
                    (auth::PASSWORD_KEY.to_string(), credentials.password.clone()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        match api.create(&kube::api::PostParams::default(), &secret).await {
            Ok(created) => {
                info!(secret = name, "generated the Proxy's credentials");
                self.ctx.secrets.hold(&created);
                Ok(Generated::Created(credentials, created.metadata.uid))
            }
            // Created meanwhile (by the reconcile before this one, whose answer the Secret
            // watch has not shown yet, or by hand): read it.
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                Ok(Some(found)) => {
                    self.ctx.secrets.hold(&found);
                    let rv = found.metadata.resource_version.clone().unwrap_or_default();
                    Ok(Generated::Exists(Arc::new(
                        super::secrets::Held::at_version(&found, rv),
                    )))
                }
                Ok(None) => Err(Input::Unreadable {
                    message: format!(
                        "Secret {}/{name} (spec.auth.type Generated) was created and deleted \
                         meanwhile; retrying",
                        self.namespace
                    ),
                }),
                Err(e) => Err(Input::Unreadable {
                    message: format!("reading Secret {}/{name}: {e}", self.namespace),
                }),
            },
            Err(e) => Err(Input::Unreadable {
                message: format!(
                    "creating Secret {}/{name} (spec.auth.type Generated): {e}",
                    self.namespace
                ),
            }),
        }
    }

    /// Deletes the Secret of generated credentials, if there is one and this Proxy owns
    /// it (a user's Secret of the same name stays).
    async fn delete_generated_secret(&self) -> Result<(), ReconcileError> {
        let name = auth::generated_secret_name(&self.name);
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let Some(secret) = api.get_opt(&name).await? else {
            return Ok(());
        };
        let owned = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == self.uid);
        if !owned {
            return Ok(());
        }
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: secret.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                info!(
                    secret = name.as_str(),
                    "deleted the Proxy's generated credentials"
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn call(&self, call: Call, resolved: Option<&Resolved>) -> Answer {
        // decide asks for calls only with a configured provider, and for Create only with
        // resolved inputs; should that ever break, the call fails (and is retried) rather
        // than panicking a worker.
        let missing = |op, id: &str, what: &str| {
            ProviderError::new(
                Class::Transient,
                op,
                &self.proxy.spec.provider,
                id,
                format!("internal: {what}"),
            )
        };
        let Some(provider) = &self.provider else {
            let e = missing(Op::Get, "", "no provider for this call");
            return match call {
                Call::Create => Answer::Created(Err(e)),
                Call::Get { purpose, .. } => Answer::Got(purpose, Err(e)),
                Call::Delete { purpose, .. } => Answer::Deleted(purpose, Err(e)),
            };
        };
        match call {
            Call::Create => {
                let Some(r) = resolved else {
                    return Answer::Created(Err(missing(
                        Op::Create,
                        "",
                        "inputs not resolved for Create",
                    )));
                };
                let p = &self.proxy.spec.placement;
                let req = CreateRequest {
                    name: name_from_uid(&self.uid),
                    uid: self.uid.clone(),
                    namespace: self.namespace.clone(),
                    proxy_name: self.name.clone(),
                    installation: self.ctx.settings.installation.clone(),
                    placement: Placement {
                        region: p.region.clone(),
                        zone: p.zone.clone(),
                        machine_type: p.machine_type.clone(),
                        image: p.image.clone(),
                        capacity: Default::default(),
                    },
                    cloud_init: r.cloud_init.clone(),
                    port: r.port,
                    ip_family: Default::default(),
                };
                let result = scope(Priority::Urgent, provider.create(&req)).await;
                log_call("create", &req.name, result.as_ref().err());
                Answer::Created(result)
            }
            Call::Get { id, purpose } => {
                // A Running Proxy's Get is a drift check: background work that waits while
                // the provider's request budget is short. Anything else is in transition.
                let running = self.proxy.status.as_ref().and_then(|s| s.state.as_deref())
                    == Some(State::Running.as_str());
                let priority = match purpose {
                    GetPurpose::Observe if running => Priority::Background,
                    _ => Priority::Transition,
                };
                let result = scope(priority, provider.get(&id)).await;
                log_call("get", &id, result.as_ref().err());
                Answer::Got(purpose, result)
            }
            Call::Delete { id, purpose } => {
                // Deleting a user's Proxy is theirs to wait for; replacing is transition.
                let priority = match purpose {
                    DeletePurpose::Finalize | DeletePurpose::FinalizeAfterPermanentGet => {
                        Priority::Urgent
                    }
                    DeletePurpose::Replace | DeletePurpose::Stopped => Priority::Transition,
                };
                let result = scope(priority, provider.delete(&id)).await;
                log_call("delete", &id, result.as_ref().err());
                Answer::Deleted(purpose, result)
            }
        }
    }

    /// Applies the whole status (current + change) under our field manager. Skipped when
    /// nothing would change, so steady-state polling does not write.
    async fn write_status(
        &mut self,
        current: &ProxyStatus,
        change: &super::decide::StatusChange,
    ) -> Result<ProxyStatus, ReconcileError> {
        let generation = self.proxy.metadata.generation.unwrap_or_default();
        let mut next = status::apply(current, change, generation, &now());
        if let Some(h) = self.health_view(&next) {
            next = status::apply_health(&next, &h, generation, &now());
        }
        for c in &mut next.conditions {
            truncate(&mut c.message, CONDITION_MESSAGE_MAX);
        }
        if next == *current {
            return Ok(next);
        }
        let patch = serde_json::json!({
            "apiVersion": Proxy::api_version(&()),
            "kind": Proxy::kind(&()),
            "status": next,
        });
        let written = self
            .api
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await?;
        self.resource_version = written.resource_version();
        Ok(next)
    }

    /// The key the probe engine knows this Proxy by.
    fn health_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The address in `status`, when the instance runs there.
    fn running_at(status: &ProxyStatus) -> Option<SocketAddr> {
        if status.state.as_deref() != Some(State::Running.as_str()) {
            return None;
        }
        let ip: IpAddr = status.ip.as_deref()?.parse().ok()?;
        let port = u16::try_from(status.port?).ok()?;
        Some(SocketAddr::new(ip, port))
    }

    /// The engine's verdict about the address in `status`, when it differs from what the
    /// status says (so a reconcile with nothing else to do still writes it).
    fn health_view(&self, status: &ProxyStatus) -> Option<status::HealthView> {
        let hook = self.ctx.health.as_ref()?;
        let addr = Self::running_at(status)?;
        let v = hook.engine.verdict_at(&self.health_key(), addr)?;
        let probed_at = v.probed_at?;
        let view = status::HealthView {
            healthy: v.healthy,
            reason: v.reason,
            message: v.message,
            probed_at: Time(k8s_openapi::jiff::Timestamp::try_from(probed_at).ok()?),
            latency_ms: v.latency.map(|d| d.as_millis() as i64),
        };
        let healthy = status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::HEALTHY);
        let same = healthy.is_some_and(|c| {
            c.status == if view.healthy { "True" } else { "False" } && c.reason == view.reason
        });
        // lastProbe is refreshed when the verdict changes, and otherwise at most once per
        // `probe_refresh`, so steady probing does not write the status every interval.
        let fresh = status.last_probe.as_ref().is_some_and(|p| {
            let age = view.probed_at.0.duration_since(p.time.0);
            age.is_negative() || age.unsigned_abs() < hook.probe_refresh
        });
        (!(same && fresh)).then_some(view)
    }

    /// Registers the running address with the probe engine, or stops probing it. Without
    /// resolved inputs this reconcile (a credentials Secret briefly unreadable), the probe
    /// keeps the credentials it had.
    fn sync_health(&self, status: &ProxyStatus, deleting: bool, resolved: Option<&Resolved>) {
        let Some(hook) = &self.ctx.health else { return };
        let allow_internal = self
            .provider
            .as_ref()
            .is_some_and(|p| p.private_addresses_allowed());
        match Self::running_at(status).filter(|_| !deleting) {
            Some(addr) => {
                let key = self.health_key();
                let credentials = match resolved {
                    Some(r) => r.credentials.clone(),
                    None => hook
                        .engine
                        .credentials(&key)
                        .map(|(username, password)| Credentials { username, password }),
                };
                hook.engine.upsert(
                    &key,
                    hook.spec(addr, allow_internal, credentials.as_ref()),
                    &addr.ip().to_string(),
                )
            }
            None => hook.engine.remove(&self.health_key()),
        }
    }

    /// Merge patch of the whole finalizer list, guarded by the resourceVersion it was read
    /// at: a concurrent change fails with a conflict (and is retried) instead of being lost.
    async fn add_finalizer(&self) -> Result<(), ReconcileError> {
        let mut finalizers = self.proxy.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        self.patch_finalizers(finalizers).await
    }

    async fn remove_finalizer(&self) -> Result<(), ReconcileError> {
        let finalizers = self
            .proxy
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        self.patch_finalizers(finalizers).await
    }

    async fn patch_finalizers(&self, finalizers: Vec<String>) -> Result<(), ReconcileError> {
        let patch = serde_json::json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": self.resource_version,
            }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(()),
            // Released and already gone: nothing left to do.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn publish(&self, e: EventNote) {
        let mut note = e.note;
        truncate(&mut note, EVENT_NOTE_MAX);
        if e.warning {
            warn!(reason = e.reason, note = note.as_str(), "event");
        } else {
            info!(reason = e.reason, note = note.as_str(), "event");
        }
        let event = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(note),
            action: e.reason.to_string(),
            secondary: None,
        };
        // An event that cannot be published must not fail the reconcile.
        if let Err(err) = self
            .ctx
            .recorder
            .publish(&event, &self.proxy.object_ref(&()))
            .await
        {
            warn!(error = %err, reason = e.reason, "publishing event failed");
        }
    }
}

fn log_call(op: &'static str, id: &str, err: Option<&ProviderError>) {
    match err {
        None => debug!(op, provider.id = id, "provider call ok"),
        Some(e) => {
            debug!(op, provider.id = id, class = e.class.as_str(), error = %e, "provider call failed")
        }
    }
}

/// What decide looks at, from the Proxy and its (in-memory, latest) status.
pub fn observe(
    proxy: &Proxy,
    status: &ProxyStatus,
    has_finalizer: bool,
    provider_configured: bool,
    input: Input,
    listed: Option<egress_plugin_host::provider::Instance>,
    list_pending: bool,
) -> Observed {
    Observed {
        generation: proxy.metadata.generation.unwrap_or_default(),
        deleting: proxy.metadata.deletion_timestamp.is_some(),
        has_finalizer,
        skip_cleanup: proxy.skip_cleanup(),
        provider_configured,
        provider: proxy.spec.provider.clone(),
        input,
        provider_id: status.provider_id.clone().filter(|s| !s.is_empty()),
        stored_hash: status.spec_hash.clone().filter(|s| !s.is_empty()),
        port: proxy.spec.port,
        ip: status.ip.clone().filter(|s| !s.is_empty()),
        listed,
        list_pending,
        open: proxy
            .metadata
            .name
            .as_deref()
            .and_then(|name| auth::access(&proxy.spec.auth, name).ok())
            .is_some_and(|a| a.is_open()),
        provisioned: status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::PROVISIONED)
            .map(|c| CondView {
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: c.observed_generation,
            }),
    }
}

/// What creating the Secret of generated credentials came to.
enum Generated {
    /// Created, with these credentials, as the Secret with this UID.
    Created(Credentials, Option<String>),
    /// It existed already (its owner is still to be checked).
    Exists(Arc<super::secrets::Held>),
}

/// A Secret that could not be read: a condition when the user can fix it (missing Secret
/// or key), else an API failure retried with backoff.
fn unavailable(e: &CloudInitError, message: String) -> Input {
    if e.is_unavailable() {
        Input::Unavailable { message }
    } else {
        Input::Unreadable { message }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, ProxySpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    #[test]
    fn backoff_doubles_and_caps() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(300);
        let got: Vec<u64> = [1, 2, 3, 4, 9, 10, 40]
            .iter()
            .map(|n| backoff(*n, base, max).as_secs())
            .collect();
        assert_eq!(got, [1, 2, 4, 8, 256, 300, 300]);
        assert_eq!(backoff(0, base, max), base);
    }

    #[test]
    fn observe_reads_metadata_and_status() {
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
            },
        );
        p.metadata.generation = Some(3);
        p.metadata.annotations = Some(
            [(
                crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                "True".to_string(),
            )]
            .into(),
        );
        let status = ProxyStatus {
            provider_id: Some(String::new()),
            spec_hash: Some("h".into()),
            conditions: vec![Condition {
                type_: condition::PROVISIONED.into(),
                status: "False".into(),
                reason: "PermanentError".into(),
                message: "refused".into(),
                observed_generation: Some(3),
                last_transition_time: now(),
            }],
            ..Default::default()
        };
        let o = observe(
            &p,
            &status,
            true,
            false,
            Input::Resolved { hash: "h".into() },
            None,
            false,
        );
        assert_eq!(o.generation, 3);
        assert!(o.skip_cleanup && o.has_finalizer && !o.deleting && !o.provider_configured);
        assert_eq!(o.provider_id, None, "an empty ID counts as none");
        assert_eq!(o.stored_hash.as_deref(), Some("h"));
        assert_eq!(o.port, 8080);
        assert_eq!(
            o.provisioned,
            Some(CondView {
                status: "False".into(),
                reason: "PermanentError".into(),
                message: "refused".into(),
                observed_generation: Some(3)
            })
        );
    }

    #[test]
    fn only_what_the_reconciler_reads_triggers_it() {
        let mut base = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
            },
        );
        base.metadata.generation = Some(1);
        base.metadata.resource_version = Some("10".into());
        let h = trigger_hash(&base);
        let changed = |f: &dyn Fn(&mut Proxy)| {
            let mut p = base.clone();
            f(&mut p);
            trigger_hash(&p) != h
        };
        // Our own writes: status (and with it resourceVersion, managedFields).
        assert!(!changed(&|p| {
            p.status = Some(ProxyStatus {
                ip: Some("192.0.2.1".into()),
                ..Default::default()
            });
            p.metadata.resource_version = Some("11".into());
        }));
        assert!(!changed(&|p| {
            p.metadata.labels = Some([("team".to_string(), "a".to_string())].into())
        }));
        // What the reconciler reads.
        assert!(changed(&|p| p.metadata.generation = Some(2)));
        assert!(changed(&|p| p.metadata.deletion_timestamp = Some(now())));
        assert!(changed(
            &|p| p.metadata.finalizers = Some(vec![FINALIZER.into()])
        ));
        assert!(changed(&|p| {
            p.metadata.annotations = Some(
                [(
                    crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                    "true".to_string(),
                )]
                .into(),
            )
        }));
    }

    #[test]
    fn the_cache_keeps_what_the_reconciler_reads() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
            },
        );
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }]);
        p.metadata.annotations = Some(
            [
                (
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    "{...}".to_string(),
                ),
                (
                    crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
        );
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        trim_for_cache(&mut p);
        assert!(p.managed_fields().is_empty());
        assert_eq!(
            p.annotations().keys().collect::<Vec<_>>(),
            [crate::api::ANNOTATION_SKIP_CLEANUP]
        );
        assert!(p.skip_cleanup());
        assert_eq!(p.finalizers(), [FINALIZER]);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        let mut s = "ééé".to_string();
        truncate(&mut s, 3);
        assert_eq!(s, "é");
        let mut s = "abc".to_string();
        truncate(&mut s, 10);
        assert_eq!(s, "abc");
    }
}
