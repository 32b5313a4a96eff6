//! A provider's call slots (`limits.concurrency`), shared among the priority classes.
//!
//! With a plain semaphore a user's create could wait behind a queue of background drift
//! checks for a free slot; with strict priority (before issue 29) the inventory's lists and
//! the provider checks waited behind every create of a rollout. Here a freed slot goes to
//! a waiting class by its share ([`Shares`]: Urgent 5, Transition 3, Background 2), and
//! within a class in arrival order, so every class's wait is bounded whatever the backlog
//! of the others, and the request budget ([`crate::rate`]) shares its tokens the same way.

use super::headroom::{Cost, Headroom};
use crate::provider::priority::{Priority, Shares, class_keys};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Counting slots with a priority queue of waiters. Shared as `Arc<Slots>`.
///
/// A provider owns `limits.concurrency` slots, which the pod's fit counts. With a
/// [`Lender`], it may also run calls on room borrowed from the pod ([`Headroom`]), up to
/// `limits.maxConcurrency` and up to what its request budget calls for ([`Slots::set_want`]):
/// a slot whose call ends goes back to the room when the provider holds more than it
/// wants, or nobody waits for it.
pub struct Slots {
    inner: Mutex<Inner>,
    lend: Option<Lender>,
}

/// Where a provider borrows calls beyond its own slots, and what each costs.
pub struct Lender {
    pub headroom: Arc<Headroom>,
    /// One call's worst case, as the fit counts it.
    pub cost: Cost,
    /// Most calls at once, own and borrowed (`limits.maxConcurrency`).
    pub most: usize,
}

struct Inner {
    /// Slots of the provider's own (`limits.concurrency`).
    own: usize,
    /// Slots held now, own and borrowed.
    held: usize,
    /// Of those, borrowed from the headroom.
    borrowed: usize,
    /// Most slots the provider's budget calls for now (at least `own`).
    want: usize,
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

    /// Takes one of the provider's own slots, if one is free.
    fn take_own(&mut self) -> bool {
        let ok = self.held - self.borrowed < self.own;
        if ok {
            self.held += 1;
        }
        ok
    }

    /// Borrows a slot, if the budget wants more than are held and the room holds a call.
    fn borrow(&mut self, lend: Option<&Lender>) -> bool {
        let Some(l) = lend else { return false };
        let ok = self.held < self.want.min(l.most) && l.headroom.take(&l.cost);
        if ok {
            self.held += 1;
            self.borrowed += 1;
        }
        ok
    }
}

#[derive(Default)]
struct Waiter {
    /// Set under the lock when a released slot is handed to this waiter.
    granted: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl Waiter {
    fn grant(&self) {
        self.granted
            .store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }
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
    /// `n` slots of the provider's own, nothing borrowed.
    pub fn new(n: usize) -> Arc<Self> {
        Self::build(n, None)
    }

    /// `own` slots, and calls borrowed from `lend.headroom` up to `lend.most` in all.
    pub fn lending(own: usize, lend: Lender) -> Arc<Self> {
        let headroom = lend.headroom.clone();
        let slots = Self::build(own, Some(lend));
        headroom.register(Arc::downgrade(&slots));
        slots
    }

    fn build(own: usize, lend: Option<Lender>) -> Arc<Self> {
        Arc::new(Slots {
            inner: Mutex::new(Inner {
                own,
                held: 0,
                borrowed: 0,
                want: own,
                seq: 0,
                waiting: BTreeMap::new(),
                shares: Shares::default(),
            }),
            lend,
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
            if inner.waiting.is_empty() && (inner.take_own() || inner.borrow(self.lend.as_ref())) {
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

    /// Gives a borrowed slot back to the room when more are held than wanted, or nobody
    /// waits; else hands the slot to the next waiter by the classes' shares, or puts it back.
    fn release(&self) {
        let gave = {
            let mut inner = self.lock();
            match &self.lend {
                Some(l)
                    if inner.borrowed > 0
                        && (inner.held > inner.want || inner.waiting.is_empty()) =>
                {
                    inner.borrowed -= 1;
                    inner.held -= 1;
                    l.headroom.give(&l.cost);
                    Some(l.headroom.clone())
                }
                _ => {
                    match inner.pop_next() {
                        Some(w) => w.grant(),
                        None => inner.held -= 1,
                    }
                    None
                }
            }
        };
        if let Some(headroom) = gave {
            headroom.wake_borrowers();
        }
    }

    /// Borrows for waiting calls while the budget wants more slots and the room has them.
    pub fn lend_to_waiters(&self) {
        let mut inner = self.lock();
        while !inner.waiting.is_empty() && inner.borrow(self.lend.as_ref()) {
            if let Some(w) = inner.pop_next() {
                w.grant();
            }
        }
    }

    /// Sets how many slots the provider's budget calls for now, within its own slots and
    /// `limits.maxConcurrency`; more are borrowed at once for waiting calls, fewer are
    /// given back as calls end.
    /// Returns the want as set.
    pub fn set_want(&self, want: usize) -> usize {
        let set = {
            let mut inner = self.lock();
            let most = self
                .lend
                .as_ref()
                .map_or(inner.own, |l| l.most.max(inner.own));
            inner.want = want.clamp(inner.own, most);
            inner.want
        };
        self.lend_to_waiters();
        set
    }

    /// Slots held now, and of those borrowed.
    pub fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.held, inner.borrowed)
    }

    /// Whether a create, delete or transition waits for a slot now.
    pub fn above_background_waiting(&self) -> bool {
        let inner = self.lock();
        inner.has_waiting(Priority::Urgent) || inner.has_waiting(Priority::Transition)
    }

    /// Own slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        let inner = self.lock();
        inner.own - (inner.held - inner.borrowed)
    }
}

/// Slots that keep a request budget of `per_second` busy when a request takes
/// `secs_per_request` of a call's time (Little's law: requests in flight = rate x time),
/// plus one for the inventory's list, which holds its slot across all its pages.
pub fn budget_slots(per_second: f64, secs_per_request: f64) -> usize {
    let busy = (per_second * secs_per_request).ceil();
    if busy.is_finite() && busy >= 0.0 {
        // At most 256 (the bound of limits.maxConcurrency); the caller clamps further.
        (busy as usize).min(256) + 1
    } else {
        1
    }
}

/// A moving average of the seconds a request takes: each sample weighs a fifth, so a
/// few slow calls move it, one does not.
#[derive(Debug, Default)]
pub struct Average(Option<f64>);

impl Average {
    /// Adds a sample; returns the average.
    pub fn add(&mut self, sample: f64) -> f64 {
        let avg = match self.0 {
            Some(a) => a + (sample - a) / 5.0,
            None => sample,
        };
        self.0 = Some(avg);
        avg
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

    /// A headroom holding `room`.
    fn headroom(room: super::super::headroom::Room) -> Arc<Headroom> {
        let headroom = Arc::new(Headroom::default());
        headroom.set_room(room);
        headroom
    }

    /// Borrowing from `headroom`, 10 bytes of memory a call, up to `most` calls.
    fn lender(headroom: &Arc<Headroom>, most: usize) -> Lender {
        Lender {
            headroom: headroom.clone(),
            cost: Cost {
                memory: 10,
                scratch: 1,
                descriptors: 1,
            },
            most,
        }
    }

    fn room(memory: u64) -> super::super::headroom::Room {
        super::super::headroom::Room {
            memory: Some(memory),
            instances: 100,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn calls_beyond_the_own_slots_borrow_only_what_the_budget_wants_and_the_room_holds() {
        // 2 own slots, up to 8 in all, room for 3 calls.
        let headroom = headroom(room(30));
        let slots = Slots::lending(2, lender(&headroom, 8));
        let mut held = vec![
            slots.acquire(Priority::Urgent).await,
            slots.acquire(Priority::Urgent).await,
        ];
        // The budget wants no more than the own slots: a third call waits.
        let mut third = Box::pin(slots.acquire(Priority::Urgent));
        assert!(futures::poll!(&mut third).is_pending());
        assert_eq!(headroom.lent_calls(), 0);
        // The budget wants 6: the waiting call borrows at once, and so do the next two;
        // the room holds 3, so the sixth call waits though the budget wants it.
        slots.set_want(6);
        held.push(
            tokio::time::timeout(Duration::from_secs(1), &mut third)
                .await
                .expect("borrowed"),
        );
        held.push(slots.acquire(Priority::Urgent).await);
        held.push(slots.acquire(Priority::Urgent).await);
        assert_eq!(slots.held(), (5, 3));
        assert_eq!(headroom.lent_calls(), 3);
        let mut sixth = Box::pin(slots.acquire(Priority::Urgent));
        assert!(futures::poll!(&mut sixth).is_pending());
        // A call ends while another waits: its slot goes to the waiter, nothing is given
        // back (5 held, 6 wanted).
        held.pop();
        let sixth = tokio::time::timeout(Duration::from_secs(1), sixth)
            .await
            .expect("handed over");
        assert_eq!(slots.held(), (5, 3));
        // The budget wants fewer: borrowed slots go back as calls end, even with waiters.
        slots.set_want(2);
        let mut seventh = Box::pin(slots.acquire(Priority::Urgent));
        assert!(futures::poll!(&mut seventh).is_pending());
        drop(sixth);
        held.pop();
        held.pop();
        assert_eq!(slots.held(), (2, 0));
        assert_eq!(headroom.lent_calls(), 0);
        assert!(futures::poll!(&mut seventh).is_pending());
        // Own slots serve the waiter as before.
        held.pop();
        let _seventh = tokio::time::timeout(Duration::from_secs(1), seventh)
            .await
            .expect("an own slot");
        assert_eq!(slots.held(), (2, 0));
    }

    #[tokio::test]
    async fn room_given_back_by_one_provider_serves_anothers_waiting_call() {
        let headroom = headroom(room(10));
        let a = Slots::lending(1, lender(&headroom, 4));
        let b = Slots::lending(1, lender(&headroom, 4));
        a.set_want(4);
        b.set_want(4);
        let _a_own = a.acquire(Priority::Urgent).await;
        let a_borrowed = a.acquire(Priority::Urgent).await;
        let _b_own = b.acquire(Priority::Urgent).await;
        let mut b_more = Box::pin(b.acquire(Priority::Urgent));
        assert!(
            futures::poll!(&mut b_more).is_pending(),
            "the room is lent to a"
        );
        drop(a_borrowed);
        let _b_more = tokio::time::timeout(Duration::from_secs(1), b_more)
            .await
            .expect("b borrows what a gave back");
        assert_eq!((a.held(), b.held()), ((1, 0), (2, 1)));
    }

    #[test]
    fn the_slots_a_budget_calls_for() {
        // (requests a second, seconds a request takes, slots)
        let cases = [
            (1.0, 0.3, 2),   // hetzner's 3,600/h: its own 2 slots
            (20.0, 0.3, 7),  // ec2's 72,000/h
            (30.0, 0.5, 16), // vultr's 108,000/h at half a second
            (60.0, 0.08, 6), // the scale run's compressed budget
            // docs/operations.md's table: the shipped default budgets at 0.25 s
            (5000.0 / 3600.0, 0.25, 2),
            (10800.0 / 3600.0, 0.25, 2),
            (12000.0 / 3600.0, 0.25, 2),
            (36000.0 / 3600.0, 0.25, 4),
            (72000.0 / 3600.0, 0.25, 6),
            (84000.0 / 3600.0, 0.25, 7),
            (108000.0 / 3600.0, 0.25, 9),
            (20.0, 0.0, 1),     // instant: the list's slot only
            (1e9, 10.0, 257),   // bounded
            (f64::NAN, 1.0, 1), // never panics
        ];
        for (rate, secs, want) in cases {
            assert_eq!(budget_slots(rate, secs), want, "{rate}/s x {secs} s");
        }
        let mut avg = Average::default();
        assert_eq!(avg.add(1.0), 1.0);
        assert_eq!(avg.add(6.0), 2.0);
    }

    #[tokio::test]
    async fn without_a_lender_the_want_changes_nothing() {
        let slots = Slots::new(1);
        slots.set_want(10);
        let _held = slots.acquire(Priority::Urgent).await;
        let mut second = Box::pin(slots.acquire(Priority::Urgent));
        assert!(futures::poll!(&mut second).is_pending());
        assert_eq!(slots.held(), (1, 0));
    }
}
