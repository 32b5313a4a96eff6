//! The cloud-init Secret cache: a metadata-only watch of Secrets, the data of the Secrets
//! Proxies reference, and the one GET a read costs when the watch says the copy is stale.
//! The decisions are [`super::secrets`]'s; this is the state and the API calls.
//!
//! * **The watch** lists and watches Secrets in every namespace as `PartialObjectMetadata`
//!   (kube's `Api<PartialObjectMeta<Secret>>`): the API server sends names and
//!   resourceVersions, never values, like cert-manager's metadata informer. Of each
//!   Secret only its namespace, name and resourceVersion are kept ([`Listed`]), not the
//!   object: labels, annotations (kubectl's last-applied copy of a Secret carries its data)
//!   and managedFields are never stored. The watch runs inside `controller::run`, so it
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
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
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
    listed: Listed,
}

/// What the metadata watch lists: each Secret's resourceVersion, by namespace and name.
///
/// Kept here instead of in a kube reflector store: a stored `PartialObjectMeta` is a whole
/// `ObjectMeta` (about 400 bytes with all but four fields empty) plus its reference, about
/// 650 bytes a Secret against about 150 here, and every Proxy with credentials has its own
/// Secret: 6.3 MiB of the operator's peak at 10,000 Proxies.
#[derive(Debug, Default)]
struct Listed {
    versions: HashMap<SecretKey, Option<Box<str>>>,
    /// A relist in progress: it replaces `versions` when it ends (as kube's store does, so
    /// a read never sees half a list).
    relisting: Option<HashMap<SecretKey, Option<Box<str>>>>,
    /// Whether a first list has ended: until then, absence means nothing.
    synced: bool,
}

impl Listed {
    fn apply(&mut self, event: &watcher::Event<SecretMeta>) {
        let entry = |m: &SecretMeta| {
            let (Some(namespace), Some(name)) = (&m.metadata.namespace, &m.metadata.name) else {
                return None;
            };
            let version = m.metadata.resource_version.as_deref().map(Box::from);
            Some((SecretKey::new(namespace, name), version))
        };
        match event {
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(m) => {
                if let Some((k, v)) = entry(m) {
                    self.relisting.get_or_insert_default().insert(k, v);
                }
            }
            watcher::Event::InitDone => {
                self.versions = self.relisting.take().unwrap_or_default();
                self.synced = true;
            }
            watcher::Event::Apply(m) => {
                if let Some((k, v)) = entry(m) {
                    self.versions.insert(k, v);
                }
            }
            watcher::Event::Delete(m) => {
                if let Some((k, _)) = entry(m) {
                    self.versions.remove(&k);
                }
            }
        }
    }
}

#[derive(Default)]
struct State {
    watch: Option<Watch>,
    terms: u64,
    /// The data of referenced Secrets, at the resourceVersion it was read at.
    held: HashMap<SecretKey, Arc<Held>>,
    /// The Proxies (by name, in the Secret's namespace) that reference each Secret, as of
    /// their last reconcile or the last prune; a Secret no Proxy references has no entry.
    refs: HashMap<SecretKey, Referrers>,
    /// The reverse: (namespace, Proxy name) -> the Secrets it references (cloud-init,
    /// credentials).
    by_proxy: HashMap<(String, String), Vec<SecretKey>>,
    /// One gate per Secret, held across plan, GET and record.
    gates: HashMap<SecretKey, Arc<tokio::sync::Mutex<()>>>,
}

/// The Proxies that reference one Secret. Nearly always one (a Proxy's own credentials
/// Secret), so one name is kept inline: a set of one is a whole B-tree node (eleven slots),
/// and at 10,000 Proxies those nodes were about 3 MiB of the operator's memory.
#[derive(Debug)]
enum Referrers {
    One(Box<str>),
    Many(BTreeSet<Box<str>>),
}

impl Referrers {
    fn insert(&mut self, proxy: &str) {
        match self {
            Referrers::One(p) if **p == *proxy => {}
            Referrers::One(p) => {
                let first = std::mem::take(p);
                *self = Referrers::Many(BTreeSet::from([first, proxy.into()]));
            }
            Referrers::Many(set) => {
                if !set.contains(proxy) {
                    set.insert(proxy.into());
                }
            }
        }
    }

    /// Removes `proxy`; whether none is left.
    fn remove(&mut self, proxy: &str) -> bool {
        match self {
            Referrers::One(p) => **p == *proxy,
            Referrers::Many(set) => {
                set.remove(proxy);
                set.is_empty()
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Referrers::One(p) => (Some(&**p), None),
            Referrers::Many(set) => (None, Some(set)),
        };
        one.into_iter()
            .chain(many.into_iter().flatten().map(|p| &**p))
    }
}

impl State {
    fn referenced(&self, key: &SecretKey) -> bool {
        self.refs.contains_key(key)
    }

    fn unreference(&mut self, namespace: &str, proxy: &str) {
        let old = self
            .by_proxy
            .remove(&(namespace.to_string(), proxy.to_string()))
            .unwrap_or_default();
        for key in old {
            if self.refs.get_mut(&key).is_some_and(|r| r.remove(proxy)) {
                self.refs.remove(&key);
            }
        }
    }

    /// `namespace/proxy` references `secrets` now (and nothing else).
    fn reference(&mut self, namespace: &str, proxy: &str, secrets: &[&str]) {
        let same = self
            .by_proxy
            .get(&(namespace.to_string(), proxy.to_string()))
            .map_or(secrets.is_empty(), |keys| {
                keys.len() == secrets.len() && keys.iter().zip(secrets).all(|(k, s)| k.name == *s)
            });
        if same {
            return;
        }
        self.unreference(namespace, proxy);
        let keys: Vec<SecretKey> = secrets
            .iter()
            .map(|name| SecretKey::new(namespace, *name))
            .collect();
        for key in &keys {
            match self.refs.get_mut(key) {
                Some(r) => r.insert(proxy),
                None => {
                    self.refs.insert(key.clone(), Referrers::One(proxy.into()));
                }
            }
        }
        if !keys.is_empty() {
            self.by_proxy
                .insert((namespace.to_string(), proxy.to_string()), keys);
        }
    }

    fn proxies_of(&self, key: &SecretKey) -> Vec<ObjectRef<Proxy>> {
        self.refs
            .get(key)
            .into_iter()
            .flat_map(Referrers::iter)
            .map(|p| ObjectRef::new(p).within(&key.namespace))
            .collect()
    }
}

/// The plan for `key` from the current state (see [`secrets::plan`]).
fn plan_for(st: &State, key: &SecretKey) -> Plan {
    let listed = st
        .watch
        .as_ref()
        .filter(|w| w.listed.synced)
        .map(|w| w.listed.versions.get(key));
    let seen = match listed {
        None => Seen::NotSynced,
        Some(None) => Seen::Absent,
        Some(Some(version)) => Seen::Present {
            resource_version: version.as_deref(),
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

    /// Reads from now on consult what the metadata watch lists ([`SecretCache::observe`]),
    /// once it has listed. Until the returned guard drops; then everything held is forgotten.
    pub fn attach(self: &Arc<Self>) -> Attached {
        let mut st = self.state();
        st.terms += 1;
        let term = st.terms;
        st.watch = Some(Watch {
            term,
            listed: Listed::default(),
        });
        Attached {
            cache: self.clone(),
            term,
        }
    }

    /// Records which Secrets (by name, in its own namespace) the Proxy `namespace/proxy`
    /// references now: its cloud-init Secret, if any, and its credentials Secret, if any.
    pub fn reference(&self, namespace: &str, proxy: &str, secrets: &[&str]) {
        self.state().reference(namespace, proxy, secrets);
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
        if st.watch.is_some() && st.referenced(&key) && held.may_be_held() {
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
    /// attached and it is within [`secrets::MAX_HELD_BYTES`]). An answer without a
    /// resourceVersion is used once and not held.
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
                                if st.watch.is_some() && st.referenced(secret) && h.may_be_held() {
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

    /// Applies one event of the metadata watch (to what it lists, then to the held data)
    /// and returns the Proxies to re-run.
    pub fn observe(&self, event: &watcher::Event<SecretMeta>) -> Vec<ObjectRef<Proxy>> {
        let mut st = self.state();
        if let Some(w) = st.watch.as_mut() {
            w.listed.apply(event);
        }
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
                    .filter(|k| !w.listed.versions.contains_key(*k))
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

    /// Brings who references what in line with the Proxy cache (which must have synced)
    /// and drops the data of Secrets no Proxy references any more. Returns how many copies
    /// went.
    ///
    /// In place, one Proxy at a time: rebuilding both maps beside the old ones held two
    /// copies of every reference at once, 11 MiB of the operator's peak at 10,000 Proxies.
    pub fn prune(&self, proxies: &Store<Proxy>) -> usize {
        let gone: Vec<(String, String)> = self
            .state()
            .by_proxy
            .keys()
            .filter(|(ns, name)| proxies.get(&ObjectRef::new(name).within(ns)).is_none())
            .cloned()
            .collect();
        for (namespace, name) in gone {
            self.state().unreference(&namespace, &name);
        }
        for p in proxies.state() {
            let (Some(namespace), Some(name)) =
                (p.metadata.namespace.as_deref(), p.metadata.name.as_deref())
            else {
                continue;
            };
            let secrets = referenced_secrets(&p);
            let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
            self.state().reference(namespace, name, &secrets);
        }
        let mut st = self.state();
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
    let attached = cache.attach();
    let api: Api<SecretMeta> = Api::all(client);
    let stream = watcher(api, crate::watched::watcher_config())
        .default_backoff()
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
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;

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

    /// What the watch lists, as kube's store would have it: a relist replaces the list only
    /// when it ends (a read meanwhile sees the old one), changes and deletions apply at once,
    /// and nothing counts as absent before the first list ends.
    #[test]
    fn the_listed_versions_follow_the_watch_and_its_relists() {
        use watcher::Event as E;
        let cache = Arc::new(SecretCache::new());
        let _attached = cache.attach();
        let seen = |name: &str| {
            let st = cache.state();
            let w = st.watch.as_ref().unwrap();
            let key = SecretKey::new("a", name);
            match (w.listed.synced, w.listed.versions.get(&key)) {
                (false, _) => "not synced".to_string(),
                (true, None) => "absent".to_string(),
                (true, Some(v)) => v.as_deref().unwrap_or("no version").to_string(),
            }
        };
        cache.observe(&E::Init);
        cache.observe(&E::InitApply(meta("a", "s", "1")));
        assert_eq!(seen("s"), "not synced");
        cache.observe(&E::InitDone);
        assert_eq!(seen("s"), "1");
        assert_eq!(seen("t"), "absent");
        cache.observe(&E::Apply(meta("a", "t", "2")));
        cache.observe(&E::Apply(meta("a", "s", "3")));
        assert_eq!((seen("s"), seen("t")), ("3".into(), "2".into()));
        // A relist (after the watch was down): s was deleted meanwhile, t changed.
        cache.observe(&E::Init);
        cache.observe(&E::InitApply(meta("a", "t", "5")));
        assert_eq!(seen("s"), "3", "the old list stands until the relist ends");
        cache.observe(&E::InitDone);
        assert_eq!((seen("s"), seen("t")), ("absent".into(), "5".into()));
        cache.observe(&E::Delete(meta("a", "t", "6")));
        assert_eq!(seen("t"), "absent");
    }

    /// Events of referenced Secrets re-run exactly their Proxies; references follow the
    /// Proxies' reconciles and the prune.
    #[tokio::test]
    async fn events_map_to_the_referencing_proxies() {
        let cache = Arc::new(SecretCache::new());
        let _attached = cache.attach();
        cache.observe(&watcher::Event::Init);
        cache.observe(&watcher::Event::InitDone);
        cache.reference("a", "p1", &["shared"]);
        cache.reference("a", "p2", &["shared"]);
        cache.reference("a", "p3", &["own"]);
        cache.reference("b", "p1", &["shared"]);

        let apply = |ev: watcher::Event<SecretMeta>| refs(cache.observe(&ev));
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

    /// Who references a Secret, as reconciles and prunes record it: one Proxy, several
    /// (a shared cloud-init Secret), a Proxy that moves to another Secret, one deleted, and
    /// one the cache has that no reconcile has recorded yet.
    #[test]
    fn references_follow_reconciles_and_the_proxy_cache() {
        let cache = SecretCache::new();
        let of = |name: &str| refs(cache.state().proxies_of(&SecretKey::new("a", name)));
        cache.reference("a", "p1", &["shared"]);
        cache.reference("a", "p2", &["shared", "p2-auth"]);
        cache.reference("a", "p2", &["shared", "p2-auth"]);
        assert_eq!(of("shared"), ["a/p1", "a/p2"]);
        assert_eq!(of("p2-auth"), ["a/p2"]);
        // p1 moves to another Secret: the shared one keeps p2 only.
        cache.reference("a", "p1", &["own"]);
        assert_eq!(of("shared"), ["a/p2"]);
        assert_eq!(of("own"), ["a/p1"]);
        // The cache has p1 (now naming "kept") and p3 (never reconciled); p2 was deleted.
        let (proxies, mut pw) = reflector::store::<Proxy>();
        pw.apply_watcher_event(&watcher::Event::Apply(proxy("a", "p1", Some("kept"))));
        pw.apply_watcher_event(&watcher::Event::Apply(proxy("a", "p3", Some("kept"))));
        cache.prune(&proxies);
        assert_eq!(of("kept"), ["a/p1", "a/p3"]);
        for gone in ["shared", "p2-auth", "own"] {
            assert_eq!(of(gone), Vec::<String>::new(), "{gone}");
            assert!(
                !cache.state().referenced(&SecretKey::new("a", gone)),
                "{gone}"
            );
        }
        assert_eq!(cache.state().by_proxy.len(), 2);
        // A Proxy that references nothing any more leaves no entry behind.
        cache.reference("a", "p1", &[]);
        cache.reference("a", "p3", &[]);
        assert!(cache.state().refs.is_empty() && cache.state().by_proxy.is_empty());
    }

    /// A referenced Secret larger than the bound is read at each use and never held; one
    /// within it is held from its first read.
    #[tokio::test]
    async fn a_secret_over_the_bound_is_read_each_time_and_not_held() {
        let fake = fake_kube::FakeApi::new();
        let client = fake.client();
        let secret = |name: &str, bytes: usize| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": "a"},
                "data": {"user-data": data_encoding::BASE64.encode(&vec![b'x'; bytes])},
            })
        };
        let within = secrets::MAX_HELD_BYTES - "user-data".len();
        fake.create(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
        )
        .unwrap();
        fake.create(secret("small", within)).unwrap();
        fake.create(secret("large", within + 1)).unwrap();
        let cache = Arc::new(SecretCache::new());
        let (stream, _attached) = watch(client.clone(), cache.clone());
        let watching = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while stream.next().await.is_some() {}
        });
        cache.reference("a", "p", &["small", "large"]);
        let gets = || {
            fake.requests()
                .iter()
                .filter(|r| r.verb == "get" && r.resource.as_deref() == Some("secrets"))
                .count()
        };
        // Until the watch has listed, every read is a GET; wait for the list.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while cache
            .state()
            .watch
            .as_ref()
            .is_none_or(|w| !w.listed.synced)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the watch never listed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for round in 1..=3 {
            for (name, bytes) in [("small", within), ("large", within + 1)] {
                let value = cache
                    .read(&client, &SecretKey::new("a", name), "user-data")
                    .await
                    .unwrap();
                assert_eq!(value, vec![b'x'; bytes], "{name}");
            }
            // The small one once, the large one at every read.
            assert_eq!(gets(), 1 + round, "after round {round}");
        }
        assert_eq!(cache.held(), 1);
        watching.abort();
    }

    #[tokio::test]
    async fn prune_and_detach_drop_held_data() {
        let cache = Arc::new(SecretCache::new());
        let attached = cache.attach();
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
