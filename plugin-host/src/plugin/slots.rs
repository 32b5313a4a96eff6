//! A provider's call slots (`limits.concurrency`), shared among the priority classes.
//!
//! With a plain semaphore a user's create could wait behind a queue of background drift
//! checks for a free slot; with strict priority (before issue 29) the inventory's lists and
//! the provider checks waited behind every create of a rollout. Here a freed slot goes to
//! a waiting class by its share ([`Shares`]: Urgent 5, Transition 3, Background 2), and
//! within a class in arrival order, so every class's wait is bounded whatever the backlog
//! of the others, and the request budget ([`crate::rate`]) shares its tokens the same way.

use crate::provider::priority::{Priority, Shares, class_keys};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Counting slots with a priority queue of waiters. Shared as `Arc<Slots>`.
pub struct Slots {
    inner: Mutex<Inner>,
}

struct Inner {
    free: usize,
    seq: u64,
    /// Waiting calls by (priority, arrival).
    waiting: BTreeMap<(Priority, u64), Arc<Waiter>>,
    shares: Shares,
}

impl Inner {
    fn has_waiting(&self, p: Priority) -> bool {
        self.waiting.range(class_keys(p)).next().is_some()
    }

    /// The waiter the next free slot goes to: the first of the class whose turn it is.
    fn pop_next(&mut self) -> Option<Arc<Waiter>> {
        let class = self.shares.next(|p| self.has_waiting(p))?;
        self.shares.charge(class);
        let key = *self.waiting.range(class_keys(class)).next()?.0;
        self.waiting.remove(&key)
    }
}

#[derive(Default)]
struct Waiter {
    /// Set under the lock when a released slot is handed to this waiter.
    granted: std::sync::atomic::AtomicBool,
    notify: Notify,
}

/// A held slot; dropping it frees the slot for the next waiter.
pub struct Slot {
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release();
    }
}

impl Slots {
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Slots {
            inner: Mutex::new(Inner {
                free: n,
                seq: 0,
                waiting: BTreeMap::new(),
                shares: Shares::default(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot. Cancel-safe: a waiter dropped before it got a slot leaves the
    /// queue, and one dropped just after a slot was handed to it passes the slot on.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Slot {
        let (key, waiter) = {
            let mut inner = self.lock();
            if inner.free > 0 && inner.waiting.is_empty() {
                inner.free -= 1;
                return Slot {
                    slots: self.clone(),
                };
            }
            inner.seq += 1;
            let key = (priority, inner.seq);
            let waiter = Arc::new(Waiter::default());
            inner.waiting.insert(key, waiter.clone());
            (key, waiter)
        };
        let mut pending = Pending {
            slots: self.clone(),
            key,
            waiter: waiter.clone(),
            done: false,
        };
        loop {
            let notified = waiter.notify.notified();
            if waiter.granted.load(std::sync::atomic::Ordering::Acquire) {
                pending.done = true;
                return Slot {
                    slots: self.clone(),
                };
            }
            notified.await;
        }
    }

    /// Hands the slot to the next waiter by the classes' shares, or puts it back.
    fn release(&self) {
        let mut inner = self.lock();
        match inner.pop_next() {
            Some(w) => {
                w.granted.store(true, std::sync::atomic::Ordering::Release);
                w.notify.notify_one();
            }
            None => inner.free += 1,
        }
    }

    /// Whether a create, delete or transition waits for a slot now.
    pub fn above_background_waiting(&self) -> bool {
        let inner = self.lock();
        inner.has_waiting(Priority::Urgent) || inner.has_waiting(Priority::Transition)
    }

    /// Slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.lock().free
    }
}

/// A waiting `acquire`; cleans up when dropped before it returned a [`Slot`].
struct Pending {
    slots: Arc<Slots>,
    key: (Priority, u64),
    waiter: Arc<Waiter>,
    done: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let granted = {
            let mut inner = self.slots.lock();
            inner.waiting.remove(&self.key);
            self.waiter
                .granted
                .load(std::sync::atomic::Ordering::Acquire)
        };
        if granted {
            // Handed a slot it will never use: pass it on.
            self.slots.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn freed_slots_go_by_share_then_by_arrival() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Background).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, p) in [
            ("bg1", Priority::Background),
            ("tr1", Priority::Transition),
            ("bg2", Priority::Background),
            ("urgent", Priority::Urgent),
            ("tr2", Priority::Transition),
        ] {
            let (slots, order) = (slots.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = slots.acquire(p).await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        // Urgent first (ties go up), then each class by its pass: Transition's stride is 10,
        // Background's 15, Urgent's 6; within a class by arrival.
        assert_eq!(
            *order.lock().unwrap(),
            ["urgent", "tr1", "bg1", "tr2", "bg2"]
        );
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_neither_keeps_nor_loses_a_slot() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Urgent).await;
        // Cancelled while queued: leaves the queue.
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move {
                let _ = slots.acquire(Priority::Urgent).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        assert_eq!(slots.free(), 1);
        // Granted, then dropped before it ran: the slot is passed on, not lost.
        let held = slots.acquire(Priority::Urgent).await;
        let mut fut = Box::pin(slots.acquire(Priority::Background));
        assert!(futures::poll!(&mut fut).is_pending());
        drop(held); // grants `fut`
        drop(fut);
        assert_eq!(slots.free(), 1);
        let _a = tokio::time::timeout(Duration::from_secs(1), slots.acquire(Priority::Background))
            .await
            .expect("the slot is free again");
    }

    #[tokio::test]
    async fn a_background_call_behind_a_rollout_waits_a_few_calls_not_the_rollout() {
        // Two slots, 200 creates queued, then a list: it gets a slot within a few grants
        // instead of after the 200th create.
        let slots = Slots::new(2);
        let held = [
            slots.acquire(Priority::Urgent).await,
            slots.acquire(Priority::Urgent).await,
        ];
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let list_at = Arc::new(Mutex::new(None));
        let mut tasks = Vec::new();
        for i in 0..201 {
            let (slots, served, list_at) = (slots.clone(), served.clone(), list_at.clone());
            let p = if i == 200 {
                Priority::Background
            } else {
                Priority::Urgent
            };
            tasks.push(tokio::spawn(async move {
                let _slot = slots.acquire(p).await;
                let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if p == Priority::Background {
                    *list_at.lock().unwrap() = Some(n);
                }
                tokio::task::yield_now().await;
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let at = list_at.lock().unwrap().unwrap();
        assert!(at <= 3, "the list was served {at}th, behind the rollout");
        assert_eq!(slots.free(), 2);
    }
}
