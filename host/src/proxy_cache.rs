//! The process's one cache of Proxies, and "has this reflector finished its first list?"
//! for any number of waiters.
//!
//! One watch and one store serve everything: the discovery API, the proxy gauges, the
//! inventory and, on the leader, the reconciler, which subscribes to the same watch for
//! its triggers ([`ProxyFeed`]). Two caches of every Proxy (the reconciler's own and the
//! API's) cost twice the memory and twice the watch traffic; at 10,000 Proxies that was
//! the difference between fitting the Deployment's limit and not.
//!
//! kube-runtime's `Store::wait_until_ready` waits on a oneshot channel that keeps one
//! waker. When two tasks wait on clones of one store (kube's `Controller` waits on its own
//! clone before its first reconcile), only the last to poll is woken: the other waits
//! forever. Polling it with `now_or_never` is no way round, since that swaps the registered
//! waker for a no-op one and strands the real waiter. Seen as a drift inventory that never
//! listed after a controller restart, one run in three. Every reader of a store in this
//! crate asks a [`Synced`] instead, set from the reflector's own event stream.

use crate::api::Proxy;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};

/// A store of Proxies and whether it has listed once (until then, an empty store means
/// "not known yet", not "none").
#[derive(Clone)]
pub struct ProxyCache {
    pub store: Store<Proxy>,
    pub synced: Synced,
}

/// The reader half: cheap to clone, any number of waiters.
#[derive(Clone, Debug)]
pub struct Synced(watch::Receiver<bool>);

/// The writer half, fed the reflector's events (see [`MarkSynced::observe`]).
#[derive(Debug)]
pub struct MarkSynced(watch::Sender<bool>);

/// Every Proxy the watch applies (listed, created or changed), after the store has it, to
/// whoever subscribed. The reconciler subscribes for each term of leadership.
#[derive(Default)]
pub struct ProxyFeed {
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Proxy>>>,
}

impl ProxyFeed {
    /// The Proxies applied from now on. Those already in the store are not replayed: a
    /// subscriber reads them from the store (after subscribing, so none is missed).
    pub fn subscribe(&self) -> impl Stream<Item = Proxy> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().push(tx);
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::UnboundedSender<Proxy>>> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, p: &Proxy) {
        // A subscriber that went away (a term of leadership ended) is dropped here.
        self.lock().retain(|tx| tx.send(p.clone()).is_ok());
    }
}

/// Watches every Proxy in the cluster into one store: the cache, the feed of applied
/// Proxies, and the future that keeps both going (run it for the life of the process; it
/// retries with backoff on watch errors).
pub fn watch_proxies(
    client: kube::Client,
) -> (
    ProxyCache,
    Arc<ProxyFeed>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (store, writer) = reflector::store::<Proxy>();
    let (mark, synced) = channel();
    let feed = Arc::new(ProxyFeed::default());
    let api = kube::Api::<Proxy>::all(client);
    let events = watcher(api, crate::watched::watcher_config())
        .default_backoff()
        .modify(trim_for_cache)
        .reflect(writer)
        .inspect(move |ev| mark.observe(ev));
    let stream = applied_once_cached(events, store.clone());
    let sink = feed.clone();
    let fut = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(p) => sink.send(&p),
                Err(e) => tracing::warn!(error = %e, "Proxy watch failed; retrying"),
            }
        }
    };
    (ProxyCache { store, synced }, feed, fut)
}

/// The Proxies a reflector's events apply, each passed on only once `store` holds it.
///
/// A change seen by the watch is in the store as soon as it comes out of the reflector,
/// but a (re-)list is not: kube's store keeps the list's objects aside and takes them all
/// at its end (so readers never see half a list). Passing a listed object on at once (as
/// `applied_objects` does) hands the controller a trigger for an object its store does
/// not have yet (created while the watch was down) or has in an older version: kube's
/// runner drops the first (the Proxy, with no status, then waits for a change that never
/// comes) and reconciles the second from a stale copy. So a list's objects are remembered
/// by reference and passed on, as the store has them, when the list ends.
pub fn applied_once_cached<S>(
    events: S,
    store: Store<Proxy>,
) -> impl Stream<Item = Result<Proxy, watcher::Error>> + Send + 'static
where
    S: Stream<Item = Result<watcher::Event<Proxy>, watcher::Error>> + Send + 'static,
{
    type Listed = Vec<reflector::ObjectRef<Proxy>>;
    type Out = Box<dyn Iterator<Item = Result<Proxy, watcher::Error>> + Send>;
    events
        .scan(Listed::new(), move |listed, ev| {
            let out: Out = match ev {
                Ok(watcher::Event::Apply(p)) => Box::new(std::iter::once(Ok(p))),
                Ok(watcher::Event::Delete(_)) => Box::new(std::iter::empty()),
                Ok(watcher::Event::Init) => {
                    listed.clear();
                    Box::new(std::iter::empty())
                }
                Ok(watcher::Event::InitApply(p)) => {
                    listed.push(reflector::ObjectRef::from_obj(&p));
                    Box::new(std::iter::empty())
                }
                // One at a time, as the consumer takes them: a list of 10,000 Proxies is
                // not copied all at once.
                Ok(watcher::Event::InitDone) => {
                    let store = store.clone();
                    Box::new(
                        std::mem::take(listed)
                            .into_iter()
                            .filter_map(move |r| store.get(&r))
                            .map(|p| Ok((*p).clone())),
                    )
                }
                Err(e) => Box::new(std::iter::once(Err(e))),
            };
            futures::future::ready(Some(futures::stream::iter(out)))
        })
        .flatten()
}

/// Keeps of a Proxy's metadata what the operator reads, each part bounded
/// ([`crate::watched::trim_metadata`]): no `managedFields` (status is applied with `force`;
/// the field goes, not only its entries, since a cleared vector keeps its capacity), no
/// annotation but the skip-cleanup and placement ones (kubectl's last-applied copy alone is
/// as large as the spec), at most 32 labels. A tenant's Proxy with 256 KiB of annotations
/// costs the cache what an ordinary one does.
pub fn trim_for_cache(proxy: &mut Proxy) {
    use crate::watched::{Keep, trim_metadata};
    let cut = trim_metadata(
        &mut proxy.metadata,
        Keep {
            annotations: &[
                crate::api::ANNOTATION_SKIP_CLEANUP,
                crate::pool::ANNOTATION_PLACEMENT,
            ],
            labels_first: &[crate::api::LABEL_POOL],
            finalizer: Some(crate::controller::FINALIZER),
        },
    );
    if cut.any() {
        tracing::warn!(
            namespace = proxy.metadata.namespace.as_deref().unwrap_or_default(),
            name = proxy.metadata.name.as_deref().unwrap_or_default(),
            labels_cut = cut.labels,
            annotations_cut = cut.annotations,
            finalizers_cut = cut.finalizers,
            owner_references_cut = cut.owners,
            "Proxy metadata is over the operator's bounds (labels {}, owner references {}, finalizers {} kept whole, values of its annotations {} bytes); the cached copy keeps what fits",
            crate::watched::MAX_LABELS,
            crate::watched::MAX_OWNERS,
            crate::watched::MAX_FINALIZERS,
            crate::watched::MAX_ANNOTATION_VALUE,
        );
    }
}

/// A new, not yet synced pair.
pub fn channel() -> (MarkSynced, Synced) {
    let (tx, rx) = watch::channel(false);
    (MarkSynced(tx), Synced(rx))
}

impl MarkSynced {
    /// Marks synced once `event` ends the first list. Call it on the stream that comes out
    /// of `reflector(..)`, so that the store already holds that list when waiters wake.
    pub fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            self.0
                .send_if_modified(|synced| !std::mem::replace(synced, true));
        }
    }
}

impl Synced {
    /// Whether the first list has been seen; never blocks, never disturbs a waiter.
    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits for the first list. False if the reflector went away before it.
    pub async fn wait(&self) -> bool {
        self.0.clone().wait_for(|s| *s).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use std::time::Duration;

    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

    type Event = Result<watcher::Event<String>, watcher::Error>;

    /// The bug this module exists for: two waiters on one signal are both woken.
    #[tokio::test]
    async fn every_waiter_wakes() {
        let (mark, synced) = channel();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let s = synced.clone();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!synced.is_synced());
        mark.observe(&Event::Ok(watcher::Event::Init));
        mark.observe(&Event::Ok(watcher::Event::InitApply("a".into())));
        assert!(!synced.is_synced(), "not before the list ends");
        mark.observe(&Event::Ok(watcher::Event::InitDone));
        for w in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(matches!(woke, Ok(Ok(true))), "{woke:?}");
        }
        assert!(synced.is_synced());
        // A relist later does not un-sync it.
        mark.observe(&Event::Ok(watcher::Event::Init));
        assert!(synced.is_synced());
    }

    fn proxy(name: &str, version: &str) -> Proxy {
        let spec =
            serde_json::json!({"provider": "p", "placement": {}, "cloudInit": {}, "port": 3128});
        let mut p = Proxy::new(name, serde_json::from_value(spec).unwrap());
        p.metadata.namespace = Some("ns".into());
        p.metadata.resource_version = Some(version.into());
        p
    }

    /// Every object the stream passes on is in the store, in the version passed on, when
    /// the consumer sees it: a trigger for an object the store lacks is dropped by kube's
    /// runner. `applied_objects` fails this for lists (their objects enter the store at the
    /// list's end).
    #[tokio::test]
    async fn listed_objects_are_passed_on_once_the_store_has_them() {
        use watcher::Event as E;
        let (store, writer) = reflector::store::<Proxy>();
        let events = vec![
            // The first list.
            Ok(E::Init),
            Ok(E::InitApply(proxy("a", "1"))),
            Ok(E::InitDone),
            Ok(E::Apply(proxy("a", "2"))),
            // A re-list (after 410 Gone): "a" changed and "b" was created meanwhile.
            Ok(E::Init),
            Ok(E::InitApply(proxy("a", "5"))),
            Ok(E::InitApply(proxy("b", "4"))),
            Ok(E::InitDone),
        ];
        let stream =
            applied_once_cached(futures::stream::iter(events).reflect(writer), store.clone());
        let mut stream = std::pin::pin!(stream);
        let mut seen = Vec::new();
        while let Some(p) = stream.next().await {
            let p = p.unwrap();
            let cached = store.get(&reflector::ObjectRef::from_obj(&p));
            assert_eq!(
                cached.and_then(|c| c.resource_version()),
                p.resource_version(),
                "{} passed on before the store had that version",
                p.name_any()
            );
            seen.push(format!(
                "{}@{}",
                p.name_any(),
                p.resource_version().unwrap()
            ));
        }
        assert_eq!(seen, ["a@1", "a@2", "a@5", "b@4"]);
    }

    #[tokio::test]
    async fn a_reflector_gone_before_its_first_list_is_not_synced() {
        let (mark, synced) = channel();
        drop(mark);
        assert!(!synced.wait().await);
    }

    /// What the cache keeps of a Proxy: no managedFields at all (not an empty vector that
    /// keeps its capacity), no last-applied copy, no annotation the operator does not read.
    #[test]
    fn the_cached_copy_drops_managed_fields_and_the_last_applied_copy() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut p = proxy("a", "1");
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default(); 3]);
        p.metadata.annotations = Some(
            [
                (LAST_APPLIED, "{\"spec\":{}}"),
                ("team", "edge"),
                (crate::api::ANNOTATION_SKIP_CLEANUP, "true"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        trim_for_cache(&mut p);
        assert_eq!(p.metadata.managed_fields, None);
        let kept: Vec<_> = p.annotations().keys().cloned().collect();
        assert_eq!(kept, [crate::api::ANNOTATION_SKIP_CLEANUP]);
    }
}
