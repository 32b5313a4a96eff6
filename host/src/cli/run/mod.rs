//! `proxy-operator run`: the composition root of the running operator. It builds the
//! parts the library provides and starts their loops; each loop lives with its part
//! (`Reloader::run`, `Monitor::run`, `controller::run`, `Sweeper::run`, ...).
//!
//! On every replica: the reload loop, the discovery API with `/metrics`, `/healthz` and
//! `/readyz`, and the Proxy and ProviderHealth caches. On the elected leader only: the
//! reconciler (with the probe engine and the inventory inside it), the ProxyPool
//! controller, orphan GC and the provider checks, started on every gain of leadership and cancelled on its loss.

mod args;

pub use args::Args;

use anyhow::Context as _;
use egress_plugin_host::config::{PodResources, ProvidersFile};
use egress_plugin_host::plugin::Runtime;
use proxy_operator::controller::{self, Context, HealthHook, Settings, Timings};
use proxy_operator::discovery::{Auth, AuthSettings};
use proxy_operator::gc::{GcSettings, Sweeper};
use proxy_operator::inventory::Inventory;
use proxy_operator::leader::{Leadership, LeaseSettings};
use proxy_operator::metrics::OperatorMetrics;
use proxy_operator::probe::{EngineConfig, ProbeEngine, Thresholds};
use proxy_operator::provider_check::{Monitor, publish_rounds};
use proxy_operator::readiness::Readiness;
use proxy_operator::reload::{Reloader, Serving};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How stale `status.lastProbe` may get while the health verdict does not change: a refresh
/// is a status write, and at rest a Proxy should cost next to none.
const PROBE_REFRESH: Duration = Duration::from_secs(30 * 60);

pub async fn run(args: Args) -> anyhow::Result<()> {
    // A providers file that cannot fit the pod is refused before anything starts.
    let (file, budget) = providers_that_fit(&args)?;

    let config = kube::Config::infer()
        .await
        .context("connecting to the Kubernetes API")?;
    let client =
        proxy_operator::kube_client::client(config).context("connecting to the Kubernetes API")?;
    let installation = match &args.installation {
        Some(id) => id.clone(),
        None => proxy_operator::installation::default_identity(client.clone(), &args.namespace)
            .await
            .context("deriving the installation identity (or pass --installation)")?,
    };
    tracing::info!(
        installation = installation.as_str(),
        open_file_limit = egress_plugin_host::fdlimit::nofile_limit(),
        "starting"
    );

    // The one Proxy cache: the discovery API, the gauges (read at scrape), and the
    // reconciler on the leader.
    let (cache, proxy_feed, reflect) = proxy_operator::proxy_cache::watch_proxies(client.clone());
    let metrics = OperatorMetrics::new(cache.store.clone());
    let readiness = Readiness::default();

    // Providers come from the reloader: a provider that fails to load is left out (its
    // Proxies report ProviderNotConfigured), the others run, and later changes on disk
    // swap the set without a restart.
    let rt = Runtime::new(args.runtime.options_within(&file, &budget))?;
    rt.set_metrics(metrics.plugin.clone());
    let mut reloader = Reloader::new(
        rt.clone(),
        &args.source.plugin_dir,
        &args.source.providers,
        metrics.reload.clone(),
    )
    .with_budget(budget)
    .with_registries(proxy_operator::reload::Registries {
        store: proxy_operator::oci::store::Store::open(&args.registry.plugin_store_dir)
            .with_context(|| {
                format!(
                    "opening the plugin store {}",
                    args.registry.plugin_store_dir.display()
                )
            })?,
        auth_file: args.registry.registry_auth_file.clone(),
        retry: args.registry.plugin_pull_retry,
    });

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone(), args.shutdown_grace, rt));
    tokio::spawn(ready_once_synced(cache.synced.clone(), readiness.clone()));
    tokio::spawn(proxy_operator::heap_trim::run(shutdown.clone()));

    // Discovery API, metrics and probes on one port, serving before the first plugin load:
    // compiling the plugins may take a while (each within its compile limits), and
    // `/healthz` must answer meanwhile (`/readyz` says the plugins are not loaded yet).
    let auth = if args.discovery_insecure_no_auth {
        Auth::DisabledInsecure
    } else {
        Auth::Kubernetes(client.clone(), AuthSettings::default())
    };
    let (provider_health, reflect_health) =
        proxy_operator::discovery::provider_health_reflector(client.clone());
    let (metrics_gc, metrics_monitor) = (metrics.gc.clone(), metrics.monitor.clone());
    let (metrics_reconcile, metrics_provider) =
        (metrics.reconcile.clone(), metrics.provider.clone());
    let health = health_hook(&args, &metrics)?;
    let router = proxy_operator::discovery::router_with_providers(
        cache.clone(),
        Some(provider_health),
        auth,
    )
    .merge(proxy_operator::endpoints::router(
        Arc::new(metrics),
        readiness.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "serving the discovery API, /metrics, /healthz, /readyz");
    let server = tokio::spawn(proxy_operator::http_server::serve(
        listener,
        router,
        shutdown.clone().cancelled_owned(),
        proxy_operator::http_server::Limits {
            max_connections: args.http_max_connections as usize,
            max_per_client: args.http_max_connections_per_client as usize,
            header_timeout: args.http_header_timeout,
        },
    ));

    reloader.poll().await;
    let serving = Serving::first(&reloader, readiness.clone(), metrics_provider);
    let registry = serving.registry.clone();

    // Drift detection and GC share one list per provider per drift poll; a list older than
    // two drift polls (the lists failed) is not used.
    let inventory = Arc::new(Inventory::new(args.drift_poll.saturating_mul(2)));
    let ctx = Context::new(
        client.clone(),
        registry.clone(),
        settings(&args, installation.clone()),
    )
    .with_inventory(inventory.clone())
    .with_health(health)
    .with_metrics(metrics_reconcile)
    .with_proxy_cache(cache.clone(), proxy_feed.clone());
    let pool_settings = proxy_operator::pool::PoolSettings {
        instance_name: args.pod_name.clone(),
        registry: Some(registry.clone()),
        ..Default::default()
    };
    let pool_cache = cache.clone();
    let gc_settings = GcSettings {
        interval: args.gc_interval,
        min_age: args.gc_min_age,
        installation,
    };

    let reload_run = reloader.run(args.reload_interval, shutdown.clone(), serving);
    let reflect = {
        let token = shutdown.clone();
        async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = reflect => {}
                _ = reflect_health => {}
            }
        }
    };

    let leadership = leadership(&args, &client)?;
    let monitor = Arc::new(Monitor::new(args.provider_check_timeout, metrics_monitor));
    let ctx = Arc::new(ctx);
    let check_interval = args.provider_check_interval;
    let leader_only = {
        let leader = leadership.subscribe();
        let (token, grace) = (shutdown.clone(), args.lease_renew);
        async move {
            proxy_operator::leader::run_while_leader(leader, token, grace, |term| {
                let sweeper = Sweeper::new(
                    client.clone(),
                    registry.clone(),
                    gc_settings.clone(),
                    metrics_gc.clone(),
                )
                .with_inventory(inventory.clone());
                let (ctx, monitor) = (ctx.clone(), monitor.clone());
                let (client, registry, readiness) =
                    (client.clone(), registry.clone(), readiness.clone());
                let pools = proxy_operator::pool::run(
                    client.clone(),
                    pool_cache.clone(),
                    proxy_feed.clone(),
                    pool_settings.clone(),
                    term.clone().cancelled_owned(),
                );
                async move {
                    tracing::info!("leading: starting the reconciler, GC and health checks");
                    tokio::join!(
                        // The reconciler, with its health engine, inventory loop and the
                        // metadata watch of cloud-init Secrets (see controller::secret_cache):
                        // all of them stop with leadership, and the Secret data held goes.
                        controller::run(ctx, term.clone().cancelled_owned()),
                        // ProxyPools: create and delete Proxies, never a provider call.
                        pools,
                        sweeper.run(term.cancelled()),
                        publish_rounds(
                            &monitor,
                            check_interval,
                            term.clone(),
                            &client,
                            &registry,
                            &readiness
                        ),
                    );
                    tracing::info!("leader-only loops stopped");
                }
            })
            .await;
            leadership.stop().await;
        }
    };
    let (served, ..) = tokio::join!(server, leader_only, reload_run, reflect);
    served
        .context("the discovery API's server task")?
        .context("serving the discovery API")?;
    Ok(())
}

/// The providers file, and the budget it was checked against: an error when it does not
/// parse or does not fit the pod.
fn providers_that_fit(args: &Args) -> anyhow::Result<(ProvidersFile, PodResources)> {
    use egress_plugin_host::config::fit::{self, Mib};
    let path = &args.source.providers;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading providers file {}", path.display()))?;
    let file = ProvidersFile::parse(&text)?;
    let budget = args.fit.budget(&args.runtime);
    let need =
        fit::check(&file, &budget).with_context(|| format!("providers file {}", path.display()))?;
    let known = |b: Option<u64>| b.map_or_else(|| "unknown".into(), |b| Mib(b).to_string());
    tracing::info!(
        memory_need = %Mib(need.memory.total()),
        memory_available = %known(budget.memory_bytes.map(|m| m.saturating_sub(budget.reserve_bytes))),
        tmp_need = %Mib(need.scratch.total()),
        tmp_available = %known(budget.scratch_bytes),
        "providers fit the pod"
    );
    Ok((file, budget))
}

/// The reconciler's settings from the flags.
fn settings(args: &Args, installation: String) -> Settings {
    let mut settings = Settings::new(installation);
    settings.timings = Timings {
        provisioning_poll: args.provisioning_poll,
        deletion_poll: args.deletion_poll,
        drift_poll: args.drift_poll,
        requeue_now: args.requeue_now,
        quota_retry: args.quota_retry,
        input_retry: args.input_retry,
    };
    settings.concurrency = args.concurrency;
    settings.instance_name = args.pod_name.clone();
    settings
}

/// The health engine and how it probes (a real CONNECT through each proxy).
fn health_hook(args: &Args, metrics: &OperatorMetrics) -> anyhow::Result<HealthHook> {
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: args.probe_interval,
            concurrency: 16,
            thresholds: Thresholds {
                failure: args.probe_failure_threshold,
                success: 1,
            },
        },
        Some(metrics.health.clone()),
    );
    let tls = egress_plugin_host::plugin::tls_config(None, false).map_err(anyhow::Error::msg)?;
    Ok(HealthHook {
        engine,
        target: args.probe_target.clone(),
        egress_echo: args.egress_echo_url.clone(),
        timeout: args.probe_timeout,
        tls: Some(tls),
        probe_refresh: PROBE_REFRESH.max(args.drift_poll),
    })
}

/// Leader election over the Lease, or (with `--leader-election=false`) always leading.
fn leadership(args: &Args, client: &kube::Client) -> anyhow::Result<Leadership> {
    if !args.leader_election {
        tracing::warn!("leader election is off: run a single replica only");
        return Ok(Leadership::always());
    }
    let identity = args.pod_name.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "proxy-operator".into());
        format!("{host}-{}", std::process::id())
    });
    Leadership::new(
        client.clone(),
        LeaseSettings {
            namespace: args.namespace.clone(),
            lease_name: args.lease_name.clone(),
            identity,
            duration: args.lease_duration,
            renew: args.lease_renew,
        },
    )
    .context("--lease-duration / --lease-renew")
}

/// On SIGINT or SIGTERM: cancels `shutdown`, so the loops stop; reconciles in flight get
/// `grace` to finish their plugin calls, then the calls still running are cut short, so
/// the loops can stop before Kubernetes kills us.
async fn stop_on_signal(shutdown: CancellationToken, grace: Duration, rt: Arc<Runtime>) {
    shutdown_signal().await;
    tracing::info!(grace = %humantime::format_duration(grace), "shutting down: finishing reconciles in flight");
    shutdown.cancel();
    tokio::time::sleep(grace).await;
    tracing::warn!("shutdown grace period over: cancelling plugin calls in flight");
    rt.cancel_calls();
}

/// Marks the replica ready (as far as the cache goes) once the Proxy cache has synced.
async fn ready_once_synced(synced: proxy_operator::proxy_cache::Synced, readiness: Readiness) {
    if synced.wait().await {
        tracing::info!("proxy cache synced");
        readiness.set_cache_synced();
    }
}

/// SIGINT or SIGTERM (what Kubernetes sends on pod deletion).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
