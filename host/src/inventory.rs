//! The inventory: what each provider's last ListByTag said, so that drift detection costs
//! one list per provider per drift interval instead of one Get per Running Proxy.
//!
//! The core is pure: [`Inventory`] keeps, per provider, `ID -> Instance` and the time the
//! list was taken; [`Inventory::lookup`] answers only from a fresh list (younger than
//! `max_age`, two drift intervals by default) taken from the provider that is configured
//! now. A list that fails leaves the previous one in place, which then ages out: a stale
//! inventory is never used, and the reconciler falls back to Get.
//!
//! An ID missing from a list proves nothing (the contract lets only Get conclude
//! not-found): [`to_recheck`] names the Running Proxies a new list does not confirm, and
//! the loop ([`run`]) has them reconciled at once, which makes them Get. An instance
//! deleted behind the operator's back is therefore noticed within one drift interval plus
//! one list.

use crate::api::Proxy;
use crate::cache::ProxyCache;
use crate::provider::priority::{Priority, scope};
use crate::provider::{Instance, Provider, State};
use crate::registry::ProviderRegistry;
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

/// One provider's last successful list.
#[derive(Debug, Clone)]
pub struct Listing {
    /// When the list was started: it shows the backend at least as new as this.
    pub at: SystemTime,
    /// The provider that answered ([`provider_key`]): a reloaded provider starts empty.
    provider: usize,
    pub instances: HashMap<String, Instance>,
}

impl Listing {
    pub fn age(&self, now: SystemTime) -> Duration {
        // A clock that went back makes a list look new, never old enough to be dropped
        // early; it still ages out from then on.
        now.duration_since(self.at).unwrap_or_default()
    }
}

/// Identity of a configured provider object: a registry swap that rebuilds a provider
/// (new configuration, new plugin) gives it a new key, so its old list is not used.
pub fn provider_key(p: &Arc<dyn Provider>) -> usize {
    Arc::as_ptr(p) as *const () as usize
}

/// Per provider name, the last successful list. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Inventory {
    max_age: Duration,
    lists: RwLock<BTreeMap<String, Arc<Listing>>>,
}

impl Inventory {
    /// An empty inventory whose lists are used for at most `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Inventory {
            max_age,
            lists: RwLock::new(BTreeMap::new()),
        }
    }

    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Records a successful list of `provider` (configured under `name`), started at `at`.
    pub fn record(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        at: SystemTime,
        instances: Vec<Instance>,
    ) -> Arc<Listing> {
        let listing = Arc::new(Listing {
            at,
            provider: provider_key(provider),
            instances: instances.into_iter().map(|i| (i.id.clone(), i)).collect(),
        });
        let mut lists = self.lists.write().unwrap_or_else(|e| e.into_inner());
        // A slower, older list never replaces a newer one.
        match lists.get(name) {
            Some(old) if old.at > at && old.provider == listing.provider => old.clone(),
            _ => {
                lists.insert(name.to_string(), listing.clone());
                listing
            }
        }
    }

    /// The fresh list of `provider` (configured under `name`), if there is one.
    pub fn listing(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        now: SystemTime,
    ) -> Option<Arc<Listing>> {
        let lists = self.lists.read().unwrap_or_else(|e| e.into_inner());
        let l = lists.get(name)?;
        (l.provider == provider_key(provider) && l.age(now) <= self.max_age).then(|| l.clone())
    }

    /// What a fresh list says about instance `id`: `None` when there is no fresh list or
    /// it lacks the ID (only Get can tell then).
    pub fn lookup(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        id: &str,
        now: SystemTime,
    ) -> Option<Instance> {
        self.listing(name, provider, now)?
            .instances
            .get(id)
            .cloned()
    }

    /// Forgets providers no longer configured.
    pub fn retain(&self, names: &[&str]) {
        self.lists
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(&k.as_str()));
    }
}

/// A Running Proxy as [`to_recheck`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningView {
    pub id: String,
    pub ip: String,
}

/// The Running view of a Proxy of provider `name`: not being deleted, `Running` with an
/// ID and an address in its status.
pub fn running_view(p: &Proxy, name: &str) -> Option<RunningView> {
    if p.spec.provider != name || p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let s = p.status.as_ref()?;
    if s.state.as_deref() != Some(State::Running.as_str()) {
        return None;
    }
    Some(RunningView {
        id: s.provider_id.clone().filter(|i| !i.is_empty())?,
        ip: s.ip.clone().filter(|i| !i.is_empty())?,
    })
}

/// Whether `listing` confirms a Running Proxy as it is: its instance listed, Running, at
/// the same address. Anything else (missing, stopped, another address) needs a Get.
pub fn confirms(listing: &Listing, view: &RunningView) -> bool {
    listed_running_at(listing.instances.get(&view.id), &view.ip)
}

/// Whether a listed instance runs at `ip`.
pub fn listed_running_at(listed: Option<&Instance>, ip: &str) -> bool {
    listed.is_some_and(|i| i.state == State::Running && !i.ip.is_empty() && i.ip == ip)
}

/// The Proxies (keys) among `running` a new list does not confirm.
pub fn to_recheck<'a, K: Clone + 'a>(
    listing: &Listing,
    running: impl IntoIterator<Item = (&'a K, &'a RunningView)>,
) -> Vec<K> {
    running
        .into_iter()
        .filter(|(_, v)| !confirms(listing, v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Lists every configured provider once, records each success, and returns the Proxies of
/// `store` the new lists do not confirm.
pub async fn list_all(
    inventory: &Inventory,
    registry: &ProviderRegistry,
    installation: &str,
    store: &Store<Proxy>,
) -> Vec<ObjectRef<Proxy>> {
    let providers = registry.snapshot();
    let names: Vec<&str> = providers.keys().map(String::as_str).collect();
    inventory.retain(&names);
    let lists = futures::future::join_all(providers.iter().map(|(name, p)| async move {
        let at = SystemTime::now();
        (
            name,
            p,
            at,
            scope(Priority::Background, p.list_by_tag(installation)).await,
        )
    }))
    .await;
    let mut recheck = Vec::new();
    for (name, provider, at, result) in lists {
        match result {
            Ok(instances) => {
                debug!(
                    provider.name = name.as_str(),
                    instances = instances.len(),
                    "listed"
                );
                let listing = inventory.record(name, provider, at, instances);
                let running: Vec<(ObjectRef<Proxy>, RunningView)> = store
                    .state()
                    .iter()
                    .filter_map(|p| Some((ObjectRef::from_obj(p.as_ref()), running_view(p, name)?)))
                    .collect();
                recheck.extend(to_recheck(&listing, running.iter().map(|(k, v)| (k, v))));
            }
            Err(e) => {
                warn!(provider.name = name.as_str(), error = %e, "listing for the inventory failed; Running Proxies of this provider fall back to Get once the last list is stale");
            }
        }
    }
    if !recheck.is_empty() {
        debug!(
            proxies = recheck.len(),
            "not confirmed by the list: reconciling (Get)"
        );
    }
    recheck
}

/// Lists every provider every `interval` (the first at once, once `proxies` has listed)
/// until `stop`, and sends the Proxies a list does not confirm to `recheck`.
pub async fn run(
    inventory: Arc<Inventory>,
    registry: ProviderRegistry,
    installation: String,
    proxies: ProxyCache,
    interval: Duration,
    recheck: impl Fn(ObjectRef<Proxy>),
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // The first list waits for the Proxy cache, so its rechecks see every Proxy.
        let ready = tokio::select! {
            _ = stop.cancelled() => return,
            ready = proxies.synced.wait() => ready,
        };
        if !ready {
            return;
        }
        let refs = tokio::select! {
            _ = stop.cancelled() => return,
            refs = list_all(&inventory, &registry, &installation, &proxies.store) => refs,
        };
        for r in refs {
            recheck(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_provider::FakeProvider;

    fn inst(id: &str, state: State, ip: &str) -> Instance {
        Instance {
            id: id.into(),
            ip: ip.into(),
            state,
            uid: format!("uid-{id}"),
            created_at: None,
        }
    }

    fn provider(name: &str) -> Arc<dyn Provider> {
        Arc::new(FakeProvider::new(name))
    }

    #[test]
    fn lookup_answers_only_from_a_fresh_list_of_the_configured_provider() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let inv = Inventory::new(Duration::from_secs(240));
        let a = provider("a");
        let a_reloaded = provider("a");
        assert_eq!(inv.lookup("a", &a, "i-1", t0), None, "nothing listed yet");
        inv.record("a", &a, t0, vec![inst("i-1", State::Running, "192.0.2.1")]);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            inv.lookup("a", &a, "i-1", at(10)).map(|i| i.ip),
            Some("192.0.2.1".into())
        );
        assert_eq!(inv.lookup("a", &a, "i-2", at(10)), None, "missing: ask Get");
        assert!(
            inv.lookup("a", &a, "i-1", at(240)).is_some(),
            "max age is inclusive"
        );
        assert_eq!(inv.lookup("a", &a, "i-1", at(241)), None, "stale");
        assert_eq!(
            inv.lookup("a", &a_reloaded, "i-1", at(10)),
            None,
            "a reloaded provider does not read its predecessor's list"
        );
        assert_eq!(inv.lookup("b", &a, "i-1", at(10)), None);
        // A clock that went back: the list counts as new.
        assert!(
            inv.lookup("a", &a, "i-1", t0 - Duration::from_secs(5))
                .is_some()
        );
        // An older list finishing late does not replace a newer one.
        inv.record("a", &a, at(100), vec![]);
        inv.record("a", &a, at(50), vec![inst("i-1", State::Running, "x")]);
        assert_eq!(inv.lookup("a", &a, "i-1", at(110)), None);
        inv.retain(&["b"]);
        assert!(
            inv.listing("a", &a, at(110)).is_none(),
            "unconfigured: forgotten"
        );
    }

    #[test]
    fn recheck_table() {
        let listing = Listing {
            at: SystemTime::UNIX_EPOCH,
            provider: 0,
            instances: [
                inst("running", State::Running, "192.0.2.1"),
                inst("moved", State::Running, "192.0.2.9"),
                inst("stopped", State::Stopped, "192.0.2.3"),
                inst("booting", State::Running, ""),
            ]
            .into_iter()
            .map(|i| (i.id.clone(), i))
            .collect(),
        };
        let view = |id: &str, ip: &str| RunningView {
            id: id.into(),
            ip: ip.into(),
        };
        for (name, v, confirmed) in [
            (
                "listed, Running, same address",
                view("running", "192.0.2.1"),
                true,
            ),
            (
                "missing from the list: Get decides",
                view("gone", "192.0.2.2"),
                false,
            ),
            (
                "listed at another address",
                view("moved", "192.0.2.2"),
                false,
            ),
            ("listed Stopped", view("stopped", "192.0.2.3"), false),
            (
                "listed without an address",
                view("booting", "192.0.2.4"),
                false,
            ),
        ] {
            assert_eq!(confirms(&listing, &v), confirmed, "{name}");
        }
        let running = [(1, view("running", "192.0.2.1")), (2, view("gone", "x"))];
        assert_eq!(
            to_recheck(&listing, running.iter().map(|(k, v)| (k, v))),
            vec![2]
        );
    }

    #[test]
    fn running_view_needs_running_with_id_and_address_and_not_deleting() {
        use crate::api::{CloudInit, ProxySpec, ProxyStatus};
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "a".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 3128,
            },
        );
        assert_eq!(running_view(&p, "a"), None, "no status");
        p.status = Some(ProxyStatus {
            provider_id: Some("i-1".into()),
            ip: Some("192.0.2.1".into()),
            state: Some("Running".into()),
            ..Default::default()
        });
        assert_eq!(
            running_view(&p, "a"),
            Some(RunningView {
                id: "i-1".into(),
                ip: "192.0.2.1".into()
            })
        );
        assert_eq!(running_view(&p, "b"), None, "another provider's");
        let mut q = p.clone();
        q.status.as_mut().unwrap().state = Some("Provisioning".into());
        assert_eq!(running_view(&q, "a"), None, "in transition");
        let mut q = p.clone();
        q.status.as_mut().unwrap().ip = None;
        assert_eq!(running_view(&q, "a"), None);
        let mut q = p.clone();
        q.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_eq!(running_view(&q, "a"), None, "deleting");
    }
}
