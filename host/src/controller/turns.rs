//! Reconciles take their turn in the order they came due, news before routine.
//!
//! kube-runtime's runner bounds the reconciles in flight itself, but when every worker is
//! busy it parks the requests that come due in a hash set, and each time a worker frees
//! it takes whichever entry that set iterates first. Under sustained load (more work due
//! than the workers finish, as when a fleet is created against a backend's rate limit, or
//! instances stay provisioning and are polled) the entries early in the set's order run
//! again and again and the others wait without end: at 10,000 Proxies, 1,344 had their
//! finalizer and no instance after 40 minutes, and the test
//! `controller::a_saturated_controller_starves_no_proxy` saw 20 of 30 never created.
//!
//! So the runner is left unbounded and [`Turns`] bounds the work instead: `concurrency`
//! reconciles at a time, the others queued first come, first served. There are two queues:
//! [`Lane::News`] for a Proxy something happened to (the user changed it, a list found its
//! instance gone, a probe changed its verdict, its Secret changed) and [`Lane::Routine`]
//! for timers (polls, the drift requeue) and the re-run of every Proxy after a reload.
//! News goes first: a fleet of 10,000 being created, or requeued every drift poll, must
//! not make a user's edit or a vanished instance wait behind all of it. Routine work
//! cannot starve for long: news comes from events, which are few next to the fleet.
//!
//! A request waits as a small future holding only the Proxy's reference; the reconcile
//! proper is built once its turn comes, from the cache's copy of that moment. Closing (at
//! shutdown) turns every waiter away at once, so a graceful shutdown waits for the
//! reconciles that run, not for the whole queue.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Which queue a request waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Something happened to this Proxy: served first.
    News,
    /// Timers and bulk re-runs.
    Routine,
}

/// The queues of turns; cheap to clone.
#[derive(Clone, Debug)]
pub struct Turns {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    free: usize,
    closed: bool,
    news: VecDeque<oneshot::Sender<()>>,
    routine: VecDeque<oneshot::Sender<()>>,
}

/// Held for the length of a reconcile; the next waiter goes when it drops.
#[derive(Debug)]
pub struct Turn {
    inner: Arc<Mutex<Inner>>,
}

impl Turns {
    /// `concurrency` reconciles at a time (0 is taken as 1: a controller that never runs
    /// anything is not a setting anyone means).
    pub fn new(concurrency: u16) -> Self {
        Turns {
            inner: Arc::new(Mutex::new(Inner {
                free: usize::from(concurrency.max(1)),
                closed: false,
                news: VecDeque::new(),
                routine: VecDeque::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Waits for this caller's turn: after everyone who asked before it in its lane, and
    /// (for routine work) after all news. `None` once [`Turns::close`] was called.
    pub async fn take(&self, lane: Lane) -> Option<Turn> {
        let rx = {
            let mut inner = self.lock();
            if inner.closed {
                return None;
            }
            let queued = !inner.news.is_empty() || !inner.routine.is_empty();
            if inner.free > 0 && !queued {
                inner.free -= 1;
                return Some(Turn {
                    inner: self.inner.clone(),
                });
            }
            let (tx, rx) = oneshot::channel();
            match lane {
                Lane::News => inner.news.push_back(tx),
                Lane::Routine => inner.routine.push_back(tx),
            }
            rx
        };
        // A turn handed over travels as the channel's message; a closed queue drops the
        // sender. If this future is dropped after the hand-over, the turn is passed on by
        // `Handed`'s drop below.
        let handed = Handed {
            rx: Some(rx),
            inner: self.inner.clone(),
        };
        handed.wait().await
    }

    /// Turns every waiter (and every later caller) away.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.news.clear();
        inner.routine.clear();
    }

    /// Reconciles running now (a turn is held) and waiting, for tests and metrics.
    pub fn counts(&self, concurrency: u16) -> (usize, usize) {
        let inner = self.lock();
        (
            usize::from(concurrency.max(1)) - inner.free,
            inner.news.len() + inner.routine.len(),
        )
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A waiter's side of a hand-over; gives the turn on if it is dropped holding one.
struct Handed {
    rx: Option<oneshot::Receiver<()>>,
    inner: Arc<Mutex<Inner>>,
}

impl Handed {
    async fn wait(mut self) -> Option<Turn> {
        let rx = self.rx.as_mut().expect("waited once");
        let got = rx.await.is_ok();
        self.rx = None;
        got.then(|| Turn {
            inner: self.inner.clone(),
        })
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        // Dropped while waiting: refuse later hand-overs, and pass on one that arrived.
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                release(&self.inner);
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        release(&self.inner);
    }
}

/// One turn is over: to the first live waiter, news first, or back to the pool.
fn release(inner: &Mutex<Inner>) {
    let mut inner = lock(inner);
    loop {
        let next = match inner.news.pop_front() {
            Some(tx) => Some(tx),
            None => inner.routine.pop_front(),
        };
        match next {
            // A waiter that went away (its request was dropped) does not take it.
            Some(tx) => {
                if tx.send(()).is_ok() {
                    return;
                }
            }
            None => {
                inner.free += 1;
                return;
            }
        }
    }
}

/// Which Proxies have news: the trigger streams mark them, the reconcile's turn takes the
/// mark (so one piece of news promotes one reconcile).
#[derive(Debug)]
pub struct NewsMarks<K> {
    marked: Mutex<HashSet<K>>,
}

impl<K: Hash + Eq> Default for NewsMarks<K> {
    fn default() -> Self {
        NewsMarks {
            marked: Mutex::new(HashSet::new()),
        }
    }
}

impl<K: Hash + Eq> NewsMarks<K> {
    pub fn mark(&self, key: K) {
        self.marked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
    }

    /// The lane for `key`'s reconcile, taking its mark.
    pub fn lane(&self, key: &K) -> Lane {
        let had = self
            .marked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if had { Lane::News } else { Lane::Routine }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spawns a waiter that records `id` in `order` when its turn comes and holds the
    /// turn for 1 ms; returns once it is queued.
    async fn waiter(
        turns: &Turns,
        lane: Lane,
        id: usize,
        order: &Arc<Mutex<Vec<usize>>>,
        peak: &Arc<Mutex<usize>>,
    ) -> tokio::task::JoinHandle<()> {
        let (turns2, order, peak) = (turns.clone(), order.clone(), peak.clone());
        let h = tokio::spawn(async move {
            let _turn = turns2.take(lane).await.unwrap();
            order.lock().unwrap().push(id);
            {
                let mut p = peak.lock().unwrap();
                *p = (*p).max(turns2.counts(2).0);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        });
        // Queued before the next one is spawned.
        while turns.counts(2).1 < 1 && !h.is_finished() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        h
    }

    /// Each lane is served in arrival order, news before routine, and never more than the
    /// concurrency at once: the properties kube-runtime's parked set lacks.
    #[tokio::test]
    async fn news_first_then_routine_each_in_arrival_order() {
        let turns = Turns::new(2);
        let order = Arc::new(Mutex::new(Vec::new()));
        let peak = Arc::new(Mutex::new(0usize));
        let busy = [
            turns.take(Lane::Routine).await.unwrap(),
            turns.take(Lane::Routine).await.unwrap(),
        ];
        let mut handles = Vec::new();
        for id in 0..20 {
            let lane = if id % 4 == 3 {
                Lane::News
            } else {
                Lane::Routine
            };
            handles.push(waiter(&turns, lane, id, &order, &peak).await);
        }
        assert_eq!(turns.counts(2), (2, 20));
        drop(busy);
        for h in handles {
            h.await.unwrap();
        }
        let news: Vec<usize> = (0..20).filter(|i| i % 4 == 3).collect();
        let routine: Vec<usize> = (0..20).filter(|i| i % 4 != 3).collect();
        assert_eq!(*order.lock().unwrap(), [news, routine].concat());
        assert!(*peak.lock().unwrap() <= 2, "{}", peak.lock().unwrap());
        assert_eq!(turns.counts(2), (0, 0));
    }

    /// A waiter whose request is dropped neither takes a turn nor loses one.
    #[tokio::test]
    async fn a_dropped_waiter_does_not_lose_the_turn() {
        let turns = Turns::new(1);
        let running = turns.take(Lane::Routine).await.unwrap();
        let gone = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Lane::News).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        gone.abort();
        let _ = gone.await;
        let next = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Lane::Routine).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(running);
        let got = tokio::time::timeout(Duration::from_secs(5), next).await;
        assert!(matches!(got, Ok(Ok(true))), "{got:?}");
        assert_eq!(turns.counts(1), (0, 0));
    }

    #[tokio::test]
    async fn closing_turns_waiters_away_and_the_running_finish() {
        let turns = Turns::new(1);
        let running = turns.take(Lane::Routine).await.unwrap();
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Lane::News).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        turns.close();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(got, Ok(Ok(false))), "{got:?}");
        assert!(turns.take(Lane::Routine).await.is_none());
        drop(running);
    }

    #[test]
    fn zero_concurrency_still_runs_one() {
        assert_eq!(Turns::new(0).counts(0), (0, 0));
        assert_eq!(Turns::new(0).lock().free, 1);
    }

    #[test]
    fn a_mark_promotes_one_reconcile() {
        let marks = NewsMarks::default();
        marks.mark("a");
        assert_eq!(marks.lane(&"a"), Lane::News);
        assert_eq!(marks.lane(&"a"), Lane::Routine);
        assert_eq!(marks.lane(&"b"), Lane::Routine);
    }
}
