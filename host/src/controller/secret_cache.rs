//! The cloud-init Secret cache: a metadata-only watch of Secrets, the data of the Secrets
//! Proxies reference, and the one GET a read costs when the watch says the copy is stale.
//! The decisions are [`super::secrets`]'s; this is the state and the API calls.
//!
//! * **The watch** lists and watches Secrets in every namespace as `PartialObjectMetadata`
//!   (kube's `Api<PartialObjectMeta<Secret>>`): the API server sends names and
//!   resourceVersions, never values, like cert-manager's metadata informer. Each object is
//!   trimmed to namespace, name, resourceVersion and UID before it is stored
//!   ([`trim`]): labels, annotations (kubectl's last-applied copy of a Secret carries its
//!   data) and managedFields are dropped. The watch runs inside `controller::run`, so it
//!   lives and stops with leadership.
//! * **The data** of a Secret is read by GET, and only for a Secret a Proxy references;
//!   the copy is kept with the resourceVersion of that answer and used while the watch
//!   shows the same version. Until the watch has finished its first list, every read is a
//!   GET, as before.
//! * **Triggers**: a referenced Secret that changes, appears or goes re-runs the Proxies
//!   referencing it (through `Controller::reconcile_on`), so an edit reaches the instances
//!   at once instead of at the next drift poll.
//! * **Pruning**: copies of Secrets no Proxy references any more are dropped when the watch
//!   shows them deleted or changed, and on every drift poll against the Proxy cache
//!   ([`SecretCache::prune`]).
//!
//! Reads of one Secret are serialised (one gate per Secret): when a shared Secret changes,
//! the Proxies that reference it, reconciled side by side, cost one GET between them.

use super::secrets::{self, Change, CloudInitError, Held, Plan, SecretKey, Seen};
use crate::api::Proxy;
use crate::proxy_cache::Synced;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tracing::{debug, warn};

/// A Secret as the metadata watch keeps it.
pub type SecretMeta = PartialObjectMeta<Secret>;

/// The cache, shared by every reconcile (it lives in the controller's `Context`).
#[derive(Default)]
pub struct SecretCache {
    state: Mutex<State>,
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("SecretCache")
            .field("watching", &st.watch.is_some())
            .field("held", &st.held.len())
            .field("referenced", &st.refs.len())
            .finish()
    }
}

/// The watch of the current leadership term.
struct Watch {
    term: u64,
    store: Store<SecretMeta>,
    synced: Synced,
}

#[derive(Default)]
struct State {
    watch: Option<Watch>,
    terms: u64,
    /// The data of referenced Secrets, at the resourceVersion it was read at.
    held: HashMap<SecretKey, Arc<Held>>,
    /// The Proxies (by name, in the Secret's namespace) that reference each Secret, as of
    /// their last reconcile or the last prune.
    refs: HashMap<SecretKey, BTreeSet<String>>,
    /// The reverse: (namespace, Proxy name) -> the Secrets it references (cloud-init,
    /// credentials).
    by_proxy: HashMap<(String, String), Vec<SecretKey>>,
    /// One gate per Secret, held across plan, GET and record.
    gates: HashMap<SecretKey, Arc<tokio::sync::Mutex<()>>>,
}

impl State {
    fn referenced(&self, key: &SecretKey) -> bool {
        self.refs.get(key).is_some_and(|r| !r.is_empty())
    }

    fn unreference(&mut self, namespace: &str, proxy: &str) {
        let old = self
            .by_proxy
            .remove(&(namespace.to_string(), proxy.to_string()))
            .unwrap_or_default();
        for key in old {
            if let Some(r) = self.refs.get_mut(&key) {
                r.remove(proxy);
                if r.is_empty() {
                    self.refs.remove(&key);
                }
            }
        }
    }

    fn proxies_of(&self, key: &SecretKey) -> Vec<ObjectRef<Proxy>> {
        self.refs
            .get(key)
            .into_iter()
            .flatten()
            .map(|p| ObjectRef::new(p).within(&key.namespace))
            .collect()
    }
}

/// The plan for `key` from the current state (see [`secrets::plan`]).
fn plan_for(st: &State, key: &SecretKey) -> Plan {
    let listed = st.watch.as_ref().filter(|w| w.synced.is_synced()).map(|w| {
        w.store
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    });
    let seen = match &listed {
        None => Seen::NotSynced,
        Some(None) => Seen::Absent,
        Some(Some(m)) => Seen::Present {
            resource_version: m.metadata.resource_version.as_deref(),
        },
    };
    secrets::plan(seen, st.held.get(key))
}

/// Ends a term's attachment when the controller stops (see [`SecretCache::attach`]).
pub struct Attached {
    cache: Arc<SecretCache>,
    term: u64,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut st = self.cache.state();
        if st.watch.as_ref().is_some_and(|w| w.term == self.term) {
            // A replica that is not leading holds no Secret data.
            *st = State {
                terms: st.terms,
                ..State::default()
            };
        }
    }
}

impl SecretCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads from now on consult `store` (fed by a metadata watch) once `synced` says it
    /// has listed. Until the returned guard drops; then everything held is forgotten.
    pub fn attach(self: &Arc<Self>, store: Store<SecretMeta>, synced: Synced) -> Attached {
        let mut st = self.state();
        st.terms += 1;
        let term = st.terms;
        st.watch = Some(Watch {
            term,
            store,
            synced,
        });
        Attached {
            cache: self.clone(),
            term,
        }
    }

    /// Records which Secrets (by name, in its own namespace) the Proxy `namespace/proxy`
    /// references now: its cloud-init Secret, if any, and its credentials Secret, if any.
    pub fn reference(&self, namespace: &str, proxy: &str, secrets: &[&str]) {
        let mut st = self.state();
        st.unreference(namespace, proxy);
        let keys: Vec<SecretKey> = secrets
            .iter()
            .map(|name| SecretKey::new(namespace, *name))
            .collect();
        for key in &keys {
            st.refs
                .entry(key.clone())
                .or_default()
                .insert(proxy.to_string());
        }
        if !keys.is_empty() {
            st.by_proxy
                .insert((namespace.to_string(), proxy.to_string()), keys);
        }
    }

    /// Keeps `secret` as read (the answer of a create, say) for as long as the watch shows
    /// its resourceVersion, when some Proxy references it.
    pub fn hold(&self, secret: &Secret) {
        let (Some(namespace), Some(name), Some(held)) = (
            secret.metadata.namespace.as_deref(),
            secret.metadata.name.as_deref(),
            Held::from_secret(secret),
        ) else {
            return;
        };
        let key = SecretKey::new(namespace, name);
        let mut st = self.state();
        if st.watch.is_some() && st.referenced(&key) {
            st.held.insert(key, Arc::new(held));
        }
    }

    /// How many Secrets' data is held (for tests and debugging).
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// The value of `key` in `secret`: from the held copy when the watch confirms it,
    /// otherwise from one GET (whose answer is then held, if a watch is attached).
    pub async fn read(
        &self,
        client: &kube::Client,
        secret: &SecretKey,
        key: &str,
    ) -> Result<Vec<u8>, CloudInitError> {
        let held = self.read_all(client, secret).await?;
        secrets::value(secret, &held, key)
    }

    /// The whole of `secret` (every key, its UID and owner): from the held copy when the
    /// watch confirms it, otherwise from one GET (whose answer is then held, if a watch is
    /// attached). An answer without a resourceVersion is used once and not held.
    pub async fn read_all(
        &self,
        client: &kube::Client,
        secret: &SecretKey,
    ) -> Result<Arc<Held>, CloudInitError> {
        let gate = self
            .state()
            .gates
            .entry(secret.clone())
            .or_default()
            .clone();
        let _one_at_a_time = gate.lock().await;
        let plan = {
            let mut st = self.state();
            let plan = plan_for(&st, secret);
            if plan == Plan::NotFound {
                st.held.remove(secret);
            }
            plan
        };
        match plan {
            Plan::Use(held) => Ok(held),
            Plan::NotFound => Err(CloudInitError::NotFound {
                secret: secret.clone(),
            }),
            Plan::Get => {
                let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
                match api.get_opt(&secret.name).await {
                    Ok(Some(s)) => {
                        let held = Held::from_secret(&s);
                        debug!(
                            secret = %secret,
                            resource_version = held.as_ref().map(|h| h.resource_version.as_str()),
                            "Secret read"
                        );
                        let mut st = self.state();
                        match held {
                            Some(h) => {
                                let h = Arc::new(h);
                                if st.watch.is_some() && st.referenced(secret) {
                                    st.held.insert(secret.clone(), h.clone());
                                } else {
                                    st.held.remove(secret);
                                }
                                Ok(h)
                            }
                            None => {
                                st.held.remove(secret);
                                // No version to confirm it by later: used this once.
                                Ok(Arc::new(Held::at_version(&s, String::new())))
                            }
                        }
                    }
                    Ok(None) => {
                        self.state().held.remove(secret);
                        Err(CloudInitError::NotFound {
                            secret: secret.clone(),
                        })
                    }
                    Err(source) => Err(CloudInitError::Api {
                        secret: secret.clone(),
                        source,
                    }),
                }
            }
        }
    }

    /// Applies one event of the metadata watch (after the reflector has stored it) and
    /// returns the Proxies to re-run.
    pub fn observe(&self, event: &watcher::Event<SecretMeta>) -> Vec<ObjectRef<Proxy>> {
        let mut st = self.state();
        let (meta, change) = match event {
            watcher::Event::Apply(m) | watcher::Event::InitApply(m) => (
                m,
                Change::Applied {
                    resource_version: m.metadata.resource_version.as_deref(),
                },
            ),
            watcher::Event::Delete(m) => (m, Change::Deleted),
            // A relist replaced the store: Secrets deleted while the watch was down left
            // no event. Whatever is held and no longer listed is treated as deleted.
            watcher::Event::InitDone => {
                let Some(w) = &st.watch else { return vec![] };
                let gone: Vec<SecretKey> = st
                    .held
                    .keys()
                    .filter(|k| {
                        w.store
                            .get(&ObjectRef::new(&k.name).within(&k.namespace))
                            .is_none()
                    })
                    .cloned()
                    .collect();
                let mut out = vec![];
                for k in gone {
                    st.held.remove(&k);
                    out.extend(st.proxies_of(&k));
                }
                return out;
            }
            watcher::Event::Init => return vec![],
        };
        let (Some(namespace), Some(name)) = (&meta.metadata.namespace, &meta.metadata.name) else {
            return vec![];
        };
        let key = SecretKey::new(namespace, name);
        let held = st.held.get(&key).cloned();
        let reaction = secrets::on_change(change, held.as_deref(), st.referenced(&key));
        if reaction.drop {
            st.held.remove(&key);
        }
        if reaction.trigger {
            debug!(secret = %key, change = ?change, "referenced cloud-init Secret changed");
            st.proxies_of(&key)
        } else {
            vec![]
        }
    }

    /// Rebuilds who references what from the Proxy cache (which must have synced) and
    /// drops the data of Secrets no Proxy references any more. Returns how many copies
    /// went.
    pub fn prune(&self, proxies: &Store<Proxy>) -> usize {
        let mut refs: HashMap<SecretKey, BTreeSet<String>> = HashMap::new();
        let mut by_proxy = HashMap::new();
        for p in proxies.state() {
            let (Some(namespace), Some(name)) =
                (p.metadata.namespace.as_deref(), p.metadata.name.as_deref())
            else {
                continue;
            };
            let keys: Vec<SecretKey> = referenced_secrets(&p)
                .into_iter()
                .map(|s| SecretKey::new(namespace, s))
                .collect();
            for key in &keys {
                refs.entry(key.clone())
                    .or_default()
                    .insert(name.to_string());
            }
            if !keys.is_empty() {
                by_proxy.insert((namespace.to_string(), name.to_string()), keys);
            }
        }
        let mut st = self.state();
        st.refs = refs;
        st.by_proxy = by_proxy;
        let State {
            held, gates, refs, ..
        } = &mut *st;
        let before = held.len();
        held.retain(|k, _| refs.contains_key(k));
        // A gate someone holds or waits on stays; the next prune takes it.
        gates.retain(|k, g| refs.contains_key(k) || Arc::strong_count(g) > 1);
        before - held.len()
    }
}

/// The Secrets (names, in the Proxy's namespace) a Proxy's reconcile reads: its cloud-init
/// Secret and its credentials Secret (see [`super::proxy_auth`]), as far as the spec names them.
pub fn referenced_secrets(p: &Proxy) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = &p.spec.cloud_init.secret_key_ref {
        out.push(r.name.clone());
    }
    if let Some(name) = &p.metadata.name
        && let Ok(access) = super::proxy_auth::access(&p.spec.auth, name)
        && let Some(s) = access.source.secret_name()
        && !out.iter().any(|o| o == s)
    {
        out.push(s.to_string());
    }
    out
}

/// Keeps what the cache reads of a Secret's metadata: namespace, name, resourceVersion and
/// UID. Labels, annotations (kubectl's `last-applied-configuration` of a Secret holds its
/// data, base64) and managedFields go before the object is stored.
pub fn trim(secret: &mut SecretMeta) {
    let m = std::mem::take(&mut secret.metadata);
    secret.metadata = ObjectMeta {
        namespace: m.namespace,
        name: m.name,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
    };
}

/// The metadata watch of Secrets in every namespace, attached to `cache` for as long as the
/// returned guard lives: a stream of the Proxies to re-run because a Secret they reference
/// changed. The stream must be polled for the watch to run (the controller does, through
/// `reconcile_on`). Watch errors are logged and retried with backoff; while the watch has
/// not listed (no `list`/`watch` permission on Secrets, say), reads fall back to a GET.
pub fn watch(
    client: kube::Client,
    cache: Arc<SecretCache>,
) -> (
    impl Stream<Item = ObjectRef<Proxy>> + Send + 'static,
    Attached,
) {
    let (store, writer) = reflector::store::<SecretMeta>();
    let (mark_synced, synced) = crate::proxy_cache::channel();
    let attached = cache.attach(store, synced);
    let api: Api<SecretMeta> = Api::all(client);
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(trim),
    )
    .inspect(move |ev| mark_synced.observe(ev))
    .filter_map(move |ev| {
        let out = match ev {
            Ok(ev) => cache.observe(&ev),
            Err(e) => {
                warn!(error = %e, "watching Secrets (metadata only) failed; cloud-init Secrets are read by GET until it lists");
                vec![]
            }
        };
        futures::future::ready((!out.is_empty()).then(|| futures::stream::iter(out)))
    })
    .flatten();
    (stream, attached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, ProxySpec, SecretKeyRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn meta(ns: &str, name: &str, rv: &str) -> SecretMeta {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }

    fn proxy(ns: &str, name: &str, secret: Option<&str>) -> Proxy {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit {
                    inline: secret.is_none().then(|| "x".to_string()),
                    secret_key_ref: secret.map(|s| SecretKeyRef {
                        name: s.into(),
                        key: "user-data".into(),
                    }),
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some(ns.into());
        p
    }

    fn refs(v: Vec<ObjectRef<Proxy>>) -> Vec<String> {
        let mut v: Vec<String> = v
            .iter()
            .map(|r| format!("{}/{}", r.namespace.as_deref().unwrap_or(""), r.name))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn trim_keeps_identity_and_version_only() {
        let mut m = meta("ns", "s", "7");
        m.metadata.uid = Some("u".into());
        m.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        m.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                r#"{"data":{"user-data":"c2VjcmV0"}}"#.to_string(),
            )]
            .into(),
        );
        m.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        trim(&mut m);
        let mut want = meta("ns", "s", "7").metadata;
        want.uid = Some("u".into());
        assert_eq!(m.metadata, want);
    }

    /// Events of referenced Secrets re-run exactly their Proxies; references follow the
    /// Proxies' reconciles and the prune.
    #[tokio::test]
    async fn events_map_to_the_referencing_proxies() {
        let cache = Arc::new(SecretCache::new());
        let (store, mut writer) = reflector::store::<SecretMeta>();
        let (mark, synced) = crate::proxy_cache::channel();
        let _attached = cache.attach(store, synced);
        mark.observe::<SecretMeta>(&Ok(watcher::Event::InitDone));
        cache.reference("a", "p1", &["shared"]);
        cache.reference("a", "p2", &["shared"]);
        cache.reference("a", "p3", &["own"]);
        cache.reference("b", "p1", &["shared"]);

        let mut apply = |ev: watcher::Event<SecretMeta>| {
            writer.apply_watcher_event(&ev);
            refs(cache.observe(&ev))
        };
        assert_eq!(
            apply(watcher::Event::Apply(meta("a", "shared", "5"))),
            ["a/p1", "a/p2"]
        );
        assert!(apply(watcher::Event::Apply(meta("a", "unrelated", "6"))).is_empty());
        // p2 now uses inline cloud-init; p3 switched to the shared Secret.
        cache.reference("a", "p2", &[]);
        cache.reference("a", "p3", &["shared"]);
        assert_eq!(
            apply(watcher::Event::Delete(meta("a", "shared", "8"))).len(),
            2
        );
        assert!(apply(watcher::Event::Apply(meta("a", "own", "9"))).is_empty());

        // The prune rebuilds references from the Proxy cache: p1 in b is gone.
        let (proxies, mut pw) = reflector::store::<Proxy>();
        for p in [
            proxy("a", "p1", Some("shared")),
            proxy("a", "p2", None),
            proxy("a", "p3", Some("own")),
        ] {
            pw.apply_watcher_event(&watcher::Event::Apply(p));
        }
        cache.prune(&proxies);
        assert!(apply(watcher::Event::Apply(meta("b", "shared", "10"))).is_empty());
        assert_eq!(
            apply(watcher::Event::Apply(meta("a", "own", "11"))).len(),
            1
        );
    }

    #[tokio::test]
    async fn prune_and_detach_drop_held_data() {
        let cache = Arc::new(SecretCache::new());
        let (store, _writer) = reflector::store::<SecretMeta>();
        let (_mark, synced) = crate::proxy_cache::channel();
        let attached = cache.attach(store, synced);
        let held = |rv: &str| {
            Arc::new(Held::new(
                rv,
                [("user-data".to_string(), b"x".to_vec())].into(),
            ))
        };
        {
            let mut st = cache.state();
            st.held.insert(SecretKey::new("a", "kept"), held("1"));
            st.held.insert(SecretKey::new("a", "dropped"), held("2"));
        }
        let (proxies, mut pw) = reflector::store::<Proxy>();
        pw.apply_watcher_event(&watcher::Event::Apply(proxy("a", "p", Some("kept"))));
        assert_eq!(cache.prune(&proxies), 1);
        assert_eq!(cache.held(), 1);
        // A deleted Secret's copy goes with the watch event.
        cache.observe(&watcher::Event::Delete(meta("a", "kept", "3")));
        assert_eq!(cache.held(), 0);
        cache
            .state()
            .held
            .insert(SecretKey::new("a", "kept"), held("4"));
        drop(attached);
        assert_eq!(cache.held(), 0, "leadership lost: nothing held");
    }
}
