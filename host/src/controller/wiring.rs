//! The reconciler's wiring: the kube-runtime controller over the Proxy cache, its triggers,
//! its turns and its error policy. Each reconcile itself is [`super::reconcile()`].

use crate::api::Proxy;
use crate::controller::context::{Context, ReconcileError};
use crate::controller::reconcile::reconcile;
use crate::controller::secret_cache;
use crate::controller::secret_cache::SecretCache;
use crate::controller::turns::{Kind, Turns};
use crate::proxy_cache::{ProxyCache, trim_for_cache};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

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
        let suspects = ctx.clone();
        tokio::spawn(async move {
            engine
                .run(stop, move |report| {
                    // A first failure of a healthy proxy (and its turn to unhealthy): the
                    // instance may be gone (a spot instance reclaimed), which the last list
                    // cannot tell; the next reconcile Gets it. Not a proxy that was never
                    // healthy (still booting, or never serving): its failures say nothing
                    // about the instance, and suspecting each new one cost a Get per
                    // Proxy of a rollout (2,000 of 2,296 Gets at 2,000 Proxies). The drift
                    // lists find such an instance gone.
                    let failing = report.verdict.failures() > 0;
                    let first = report.verdict.healthy && report.verdict.failures() == 1;
                    if first || (report.flipped && failing) {
                        suspects.suspect(&report.key);
                    }
                    // Only changes: a status write per probe would be one write per proxy
                    // per interval. The drift poll refreshes lastProbe (see health_view).
                    if !report.changed && !first {
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
            crate::inventory::Polls {
                drift: ctx.settings.timings.drift_poll,
                provisioning: ctx.settings.timings.provisioning_poll,
                probe_refresh: ctx.health.as_ref().map(|h| h.probe_refresh),
            },
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
    // Proxies whose price a background quote just brought (see `pricing`).
    let priced = futures::stream::unfold(ctx.pricing.attach(), |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });
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
        .reconcile_on(priced)
        .graceful_shutdown_on(async move {
            shutdown.await;
            close.close();
        })
        .run(
            // Boxed because kube's runner takes only futures it can move (`Unpin`). With
            // every due Proxy in the runner at once (`concurrency(0)`), a rollout holds one
            // per Proxy: `in_turn` keeps that small until the turn comes, and the runner
            // gives their room back (patched: vendor/kube-runtime/PATCHES.md).
            move |proxy, ctx| Box::pin(in_turn(turns.clone(), store.clone(), proxy, ctx)),
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
    let (mark_synced, synced) = crate::proxy_cache::channel();
    let events = reflector(
        writer,
        watcher(proxies, crate::watched::watcher_config()).modify(trim_for_cache),
    )
    .inspect(move |ev| mark_synced.observe(ev));
    let applied = crate::proxy_cache::applied_once_cached(events, store.clone()).boxed();
    (ProxyCache { store, synced }, applied)
}

/// Every `every`, once the Proxy cache has synced: drops the data of Secrets no Proxy
/// references any more.
async fn prune_secrets(
    secrets: Arc<SecretCache>,
    proxies: crate::proxy_cache::ProxyCache,
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

/// Whether a reconcile of `proxy` is expected to create: it has no instance, is not being
/// deleted (a new Proxy's reconcile adds the finalizer and goes on to create), and its
/// provider is `configured` (so the create permits are keyed by configured providers only,
/// not by any name a user writes).
fn expected_kind(proxy: &Proxy, configured: bool) -> Kind {
    let creating = proxy.metadata.deletion_timestamp.is_none()
        && proxy
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_none_or(str::is_empty);
    if creating && configured {
        Kind::Create(proxy.spec.provider.clone())
    } else {
        Kind::Other
    }
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
    // The newest copy the cache has: the one kube handed over may be older.
    let current = store.get(&ObjectRef::from_obj(&*proxy)).unwrap_or(proxy);
    let uid = current.metadata.uid.as_deref().unwrap_or_default();
    let kind = match expected_kind(&current, ctx.registry.get(&current.spec.provider).is_some()) {
        Kind::Create(_) if ctx.returned.lately(uid) => Kind::Other,
        Kind::Create(p) => Kind::Create(p),
        Kind::Other => {
            ctx.returned.forget(uid);
            Kind::Other
        }
    };
    let Some(_turn) = turns.take(kind).await else {
        // Shutting down: the next leader (or this process's next term) reconciles it.
        return Ok(Action::await_change());
    };
    // Gone from the cache: deleted and released meanwhile; nothing left to do.
    let Some(fresh) = store.get(&ObjectRef::from_obj(&*current)) else {
        return Ok(Action::await_change());
    };
    Box::pin(reconcile(fresh, ctx)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProxyStatus;

    #[test]
    fn only_a_proxy_with_no_instance_is_expected_to_create() {
        let with = |finalizer: bool, id: Option<&str>, deleting: bool| {
            let mut p: Proxy = serde_json::from_value(serde_json::json!({
                "apiVersion": "egress.proxy-operator.dev/v1alpha1",
                "kind": "Proxy",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {
                    "provider": "fake",
                    "placement": {"region": "r1", "zone": "z1", "size": "s", "image": "i"},
                    "cloudInit": {"inline": "#cloud-config"},
                    "port": 3128,
                },
            }))
            .unwrap();
            if finalizer {
                p.metadata.finalizers = Some(vec![crate::controller::FINALIZER.into()]);
            }
            if deleting {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
            }
            p.status = Some(ProxyStatus {
                provider_id: id.map(str::to_string),
                ..Default::default()
            });
            expected_kind(&p, true)
        };
        let cases = [
            ((true, None, false), Kind::Create("fake".into())),
            ((true, Some(""), false), Kind::Create("fake".into())),
            // A new Proxy: its reconcile adds the finalizer and creates.
            ((false, None, false), Kind::Create("fake".into())),
            ((true, Some("i-1"), false), Kind::Other),
            ((true, None, true), Kind::Other),
            ((true, Some("i-1"), true), Kind::Other),
        ];
        for ((finalizer, id, deleting), want) in cases {
            assert_eq!(
                with(finalizer, id, deleting),
                want,
                "{finalizer} {id:?} {deleting}"
            );
        }
    }
}

/// What kube's controller keeps after a rollout: with every Proxy due at once (the runner
/// is unbounded, see [`run`]), its runner and scheduler grow a slot per Proxy; the patched
/// kube-runtime (vendor/kube-runtime/PATCHES.md) gives that room back once they are done.
#[cfg(test)]
mod queue_memory {
    use super::*;
    use egress_plugin_host::thread_heap::live;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn proxy(i: usize) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": format!("p{i:05}"), "namespace": "tenant-a",
                         "uid": format!("00000000-0000-0000-0000-{i:012}"),
                         "resourceVersion": format!("{}", 1000 + i)},
            "spec": {
                "provider": "fake",
                "placement": {"region": "r1", "zone": "z1", "size": "s", "image": "i"},
                "cloudInit": {"inline": "#cloud-config"},
                "port": 3128,
            },
        }))
        .expect("a valid Proxy")
    }

    #[test]
    fn a_rollouts_room_in_the_runner_and_scheduler_is_given_back() {
        const N: usize = 20_000;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let (peak, after, polls) = rt.block_on(async {
            let (reader, mut writer) = reflector::store::<Proxy>();
            writer.apply_watcher_event(&watcher::Event::Init);
            for i in 0..N {
                writer.apply_watcher_event(&watcher::Event::InitApply(proxy(i)));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            // Every reconcile waits at the gate until all N have started: a rollout, whose
            // reconciles wait for their turn.
            let (open, gate) = tokio::sync::watch::channel(false);
            let started = Arc::new(AtomicUsize::new(0));
            let before = live();
            let polls = Arc::new(AtomicUsize::new(0));
            let counted = (started.clone(), polls.clone());
            let mut results = Controller::for_stream(
                futures::stream::pending::<Result<Proxy, watcher::Error>>(),
                reader,
            )
            .with_config(ControllerConfig::default().concurrency(0))
            .reconcile_all_on(futures::stream::once(async {}))
            .run(
                move |_proxy, _ctx: Arc<()>| {
                    counted.0.fetch_add(1, Ordering::Relaxed);
                    let (mut gate, polls) = (gate.clone(), counted.1.clone());
                    Box::pin(async move {
                        let mut open = Box::pin(gate.wait_for(|open| *open));
                        let _ = std::future::poll_fn(|cx| {
                            polls.fetch_add(1, Ordering::Relaxed);
                            open.as_mut().poll(cx)
                        })
                        .await;
                        Ok::<_, std::convert::Infallible>(Action::await_change())
                    })
                },
                |_, _: &std::convert::Infallible, _| Action::await_change(),
                Arc::new(()),
            )
            .boxed();
            let watcher = tokio::spawn({
                let started = started.clone();
                async move {
                    while started.load(Ordering::Relaxed) < N {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let peak = live();
                    let _ = open.send(true);
                    peak
                }
            });
            for _ in 0..N {
                results.next().await.expect("a result").expect("reconciled");
            }
            let peak = watcher.await.expect("the gate") - before;
            // The runner's last removal happens on its next poll.
            let _ = tokio::time::timeout(Duration::from_millis(50), results.next()).await;
            (peak, live() - before, polls.load(Ordering::Relaxed))
        });
        // A waiting reconcile is polled when it is woken, not at every wake of the runner:
        // kube's own polled all of them each time, N * N polls in all.
        assert!(polls < 4 * N, "{polls} polls of {N} reconciles");
        // Each Proxy held a slot in the runner and the scheduler at the peak; after, the
        // controller keeps a few KiB, not a slot per Proxy.
        assert!(
            peak > (N * 256) as isize,
            "the peak held a slot per Proxy: {peak} bytes"
        );
        assert!(
            after < (N * 64) as isize,
            "the controller kept {after} bytes after all {N} reconciles (peak {peak})"
        );
    }
}
