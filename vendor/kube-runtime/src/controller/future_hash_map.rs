use futures::{Stream, StreamExt, stream::FuturesUnordered};
use std::{
    collections::HashSet,
    hash::Hash,
    pin::Pin,
    task::{Context, Poll},
};

/// Variant of [`tokio_stream::StreamMap`](https://docs.rs/tokio-stream/0.1.3/tokio_stream/struct.StreamMap.html)
/// that only runs [`Future`]s, keyed, with (amortized) O(1) insertion and membership checks.
///
/// egress-proxies-operator patch (see PATCHES.md): the futures run in a
/// [`FuturesUnordered`], which polls only the futures that were woken, and the keys are in
/// a set that gives back its room once a quarter full. The original kept the futures in a
/// `HashMap` and polled every one of them at each wake until one was ready: with every
/// object of a rollout due at once (unbounded concurrency), each wake cost a poll of
/// thousands of waiting futures, and the table kept its largest size for good.
///
/// NOTE: Contrary to `StreamMap`, `FutureHashMap` does *not* try to be fair.
pub struct FutureHashMap<K, F> {
    keys: HashSet<K>,
    futures: FuturesUnordered<Keyed<K, F>>,
}

impl<K, F> std::fmt::Debug for FutureHashMap<K, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FutureHashMap").field("len", &self.futures.len()).finish()
    }
}

/// A future and its key, handed back with its output.
struct Keyed<K, F> {
    key: Option<K>,
    future: F,
}

impl<K: Unpin, F: Future + Unpin> Future for Keyed<K, F> {
    type Output = (K, F::Output);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match Pin::new(&mut this.future).poll(cx) {
            Poll::Ready(out) => Poll::Ready((this.key.take().expect("polled after completion"), out)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<K, F> Default for FutureHashMap<K, F> {
    fn default() -> Self {
        Self {
            keys: HashSet::new(),
            futures: FuturesUnordered::new(),
        }
    }
}

impl<K, F> FutureHashMap<K, F>
where
    K: Hash + Eq + Clone,
{
    /// Runs `future` under `key`; `false` (and `future` is dropped) if a future runs under
    /// `key` already: the runner never replaces a running future.
    pub fn insert(&mut self, key: K, future: F) -> bool {
        if !self.keys.insert(key.clone()) {
            return false;
        }
        self.futures.push(Keyed {
            key: Some(key),
            future,
        });
        true
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.keys.contains(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

impl<K, F> Stream for FutureHashMap<K, F>
where
    K: Hash + Clone + Eq + Unpin,
    F: Future + Unpin,
    Self: Unpin,
{
    type Item = F::Output;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.futures.poll_next_unpin(cx) {
            Poll::Ready(Some((key, msg))) => {
                self.keys.remove(&key);
                crate::utils::shrink_sparse_set(&mut self.keys);
                Poll::Ready(Some(msg))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future, task::Poll};

    use super::FutureHashMap;
    use futures::{StreamExt, channel::mpsc, poll};

    #[tokio::test]
    async fn fhm_should_forward_all_values_and_shut_down() {
        let mut fhm = FutureHashMap::default();
        let count = 100;
        for i in 0..count {
            fhm.insert(i, future::ready(i));
        }
        let mut values = fhm.collect::<Vec<u16>>().await;
        values.sort_unstable();
        assert_eq!(values, (0..count).collect::<Vec<u16>>());
    }

    #[tokio::test]
    async fn fhm_should_stay_alive_until_all_sources_finish() {
        // egress-proxies-operator patch: the receivers outlive the map (a
        // `FuturesUnordered` drops its futures in its own `Drop`).
        let (tx0, mut rx0) = mpsc::unbounded::<()>();
        let (tx1, mut rx1) = mpsc::unbounded::<()>();
        let mut fhm = FutureHashMap::default();
        fhm.insert(0, rx0.next());
        fhm.insert(1, rx1.next());
        assert_eq!(poll!(fhm.next()), Poll::Pending);
        drop(tx0);
        assert_eq!(poll!(fhm.next()), Poll::Ready(Some(None)));
        assert_eq!(poll!(fhm.next()), Poll::Pending);
        drop(tx1);
        assert_eq!(poll!(fhm.next()), Poll::Ready(Some(None)));
        assert_eq!(poll!(fhm.next()), Poll::Ready(None));
    }
}
