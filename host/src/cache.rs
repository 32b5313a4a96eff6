//! Reflector caches of Proxies, and "has this reflector finished its first list?" for
//! any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` waits on a oneshot channel that keeps one
//! waker. When two tasks wait on clones of one store (kube's `Controller` waits on its own
//! clone before its first reconcile), only the last to poll is woken: the other waits
//! forever. Polling it with `now_or_never` is no way round, since that swaps the registered
//! waker for a no-op one and strands the real waiter. Seen as a drift inventory that never
//! listed after a controller restart, one run in three. Every reader of a store in this
//! crate asks a [`Synced`] instead, set from the reflector's own event stream.

use crate::api::Proxy;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch;

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
    use std::time::Duration;

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

    #[tokio::test]
    async fn a_reflector_gone_before_its_first_list_is_not_synced() {
        let (mark, synced) = channel();
        drop(mark);
        assert!(!synced.wait().await);
    }
}
