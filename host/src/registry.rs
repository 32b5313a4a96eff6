//! The configured providers, by name, as the loops see them.
//!
//! The set is swapped as a whole when the providers file or the plugin directory changes.
//! Every swap is announced on [`ProviderRegistry::changes`]: the reconciler re-runs every
//! Proxy on it, so a Proxy waiting for a provider that was not configured picks it up
//! without a restart or a spec edit.
//!
//! Each entry carries its provider's plugin type (`hetzner`, `ec2`, ...) next to the
//! provider, swapped with it, so whoever reports on providers (the `ProviderHealth`
//! objects) reads both from one snapshot instead of a second map kept in step by hand.

use egress_plugin_host::provider::Provider;
use futures::Stream;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

type Providers = Arc<BTreeMap<String, Arc<dyn Provider>>>;

/// One configured provider and what it was built from.
#[derive(Clone)]
pub struct Entry {
    pub provider: Arc<dyn Provider>,
    /// The plugin's type name (`PluginInfo::type_name`); empty when the provider is not a
    /// plugin (the tests' fakes).
    pub plugin_type: String,
}

impl From<Arc<dyn Provider>> for Entry {
    fn from(provider: Arc<dyn Provider>) -> Self {
        Entry {
            provider,
            plugin_type: String::new(),
        }
    }
}

/// Cheap to clone; clones share the set.
#[derive(Clone)]
pub struct ProviderRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRegistry").finish_non_exhaustive()
    }
}

struct Inner {
    set: RwLock<Arc<Set>>,
    generation: watch::Sender<u64>,
}

/// The set swapped as a whole: the providers by name (what the loops iterate, shared
/// with every snapshot) and each one's plugin type.
struct Set {
    providers: Providers,
    plugin_types: BTreeMap<String, String>,
}

impl Set {
    fn of(entries: impl IntoIterator<Item = Entry>) -> Arc<Set> {
        let (mut providers, mut plugin_types) = (BTreeMap::new(), BTreeMap::new());
        for e in entries {
            let name = e.provider.name().to_string();
            plugin_types.insert(name.clone(), e.plugin_type);
            providers.insert(name, e.provider);
        }
        Arc::new(Set {
            providers: Arc::new(providers),
            plugin_types,
        })
    }
}

impl ProviderRegistry {
    /// A registry holding `providers`, keyed by [`Provider::name`], without plugin types.
    pub fn new(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Self::with_entries(providers.into_iter().map(Entry::from))
    }

    /// A registry holding `entries`, keyed by their provider's [`Provider::name`].
    pub fn with_entries(entries: impl IntoIterator<Item = Entry>) -> Self {
        ProviderRegistry {
            inner: Arc::new(Inner {
                set: RwLock::new(Set::of(entries)),
                generation: watch::Sender::new(0),
            }),
        }
    }

    fn set(&self) -> Arc<Set> {
        self.inner
            .set
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The provider configured under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.set().providers.get(name).cloned()
    }

    /// Every provider, by name. A snapshot: a concurrent swap does not change it.
    pub fn snapshot(&self) -> Providers {
        self.set().providers.clone()
    }

    /// Every provider's plugin type, by provider name (empty for providers that are not
    /// plugins), from the same set as a [`ProviderRegistry::snapshot`] taken with it.
    pub fn plugin_types(&self) -> BTreeMap<String, String> {
        self.set().plugin_types.clone()
    }

    /// Replaces the whole set and announces the change (no plugin types).
    pub fn replace(&self, providers: impl IntoIterator<Item = Arc<dyn Provider>>) {
        self.replace_entries(providers.into_iter().map(Entry::from));
    }

    /// Replaces the whole set, providers and plugin types together, and announces the
    /// change.
    pub fn replace_entries(&self, entries: impl IntoIterator<Item = Entry>) {
        let next = Set::of(entries);
        *self.inner.set.write().unwrap_or_else(|e| e.into_inner()) = next;
        self.inner.generation.send_modify(|g| *g += 1);
    }

    /// One item per [`ProviderRegistry::replace`] after the call (changes in quick
    /// succession may be reported once). Ends only when the registry is dropped.
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.inner.generation.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_provider::FakeProvider;
    use futures::StreamExt;
    use std::time::Duration;

    #[tokio::test]
    async fn swap_is_visible_and_announced() {
        let a: Arc<dyn Provider> = Arc::new(FakeProvider::new("a"));
        let b: Arc<dyn Provider> = Arc::new(FakeProvider::new("b"));
        let reg = ProviderRegistry::new([a.clone()]);
        assert!(reg.get("a").is_some() && reg.get("b").is_none());
        let before = reg.snapshot();
        let mut changes = Box::pin(reg.changes());
        reg.replace([a, b]);
        tokio::time::timeout(Duration::from_secs(1), changes.next())
            .await
            .expect("announced")
            .expect("stream open");
        assert!(reg.get("b").is_some());
        assert_eq!(before.len(), 1, "an old snapshot does not change");
        assert_eq!(
            reg.snapshot().keys().cloned().collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[test]
    fn plugin_types_are_swapped_with_their_providers() {
        let entry = |name: &str, plugin_type: &str| Entry {
            provider: Arc::new(FakeProvider::new(name)),
            plugin_type: plugin_type.into(),
        };
        let reg = ProviderRegistry::with_entries([entry("a", "hetzner")]);
        assert_eq!(reg.plugin_types(), [("a".into(), "hetzner".into())].into());
        reg.replace_entries([entry("a", "ec2"), entry("b", "example")]);
        assert_eq!(
            reg.plugin_types(),
            [("a".into(), "ec2".into()), ("b".into(), "example".into())].into()
        );
        reg.replace([Arc::new(FakeProvider::new("c")) as Arc<dyn Provider>]);
        assert_eq!(reg.plugin_types(), [("c".into(), String::new())].into());
        assert!(
            reg.get("a").is_none(),
            "the types went with their providers"
        );
    }
}
