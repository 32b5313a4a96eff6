//! The configured providers, by name, as the loops see them.
//!
//! The set is swapped as a whole when the providers file or the plugin directory changes.
//! Every swap is announced on [`ProviderRegistry::changes`]: the reconciler re-runs every
//! Proxy on it, so a Proxy waiting for a provider that was not configured picks it up
//! without a restart or a spec edit.

use crate::provider::Provider;
use futures::Stream;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

type Providers = Arc<BTreeMap<String, Arc<dyn Provider>>>;

/// Cheap to clone; clones share the set.
#[derive(Clone)]
pub struct ProviderRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    providers: RwLock<Providers>,
    generation: watch::Sender<u64>,
}

impl ProviderRegistry {
    /// A registry holding `providers`, keyed by [`Provider::name`].
    pub fn new(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        ProviderRegistry {
            inner: Arc::new(Inner {
                providers: RwLock::new(Arc::new(index(providers))),
                generation: watch::Sender::new(0),
            }),
        }
    }

    /// The provider configured under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.snapshot().get(name).cloned()
    }

    /// Every provider, by name. A snapshot: a concurrent swap does not change it.
    pub fn snapshot(&self) -> Providers {
        self.inner
            .providers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the whole set and announces the change.
    pub fn replace(&self, providers: impl IntoIterator<Item = Arc<dyn Provider>>) {
        let next = Arc::new(index(providers));
        *self
            .inner
            .providers
            .write()
            .unwrap_or_else(|e| e.into_inner()) = next;
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

fn index(
    providers: impl IntoIterator<Item = Arc<dyn Provider>>,
) -> BTreeMap<String, Arc<dyn Provider>> {
    providers
        .into_iter()
        .map(|p| (p.name().to_string(), p))
        .collect()
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
}
