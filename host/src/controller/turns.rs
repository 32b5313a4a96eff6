//! Reconciles take their turn in the order they came due.
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
//! So the runner is left unbounded and [`Turns`] bounds the work instead: a FIFO queue of
//! permits (tokio's semaphore serves waiters in arrival order) that admits `concurrency`
//! reconciles at a time. A request waits as a small future holding only the Proxy's
//! reference; the reconcile proper is built once its turn comes, from the cache's copy of
//! that moment, not from the copy the request was made with.
//!
//! Closing the queue (at shutdown) turns every waiter away at once, so a graceful
//! shutdown waits for the reconciles that run, not for the whole queue.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The queue of turns; cheap to clone.
#[derive(Clone, Debug)]
pub struct Turns {
    permits: Arc<Semaphore>,
}

/// Held for the length of a reconcile; the next waiter goes when it drops.
#[derive(Debug)]
pub struct Turn(#[allow(dead_code)] OwnedSemaphorePermit);

impl Turns {
    /// `concurrency` reconciles at a time (0 is taken as 1: a controller that never runs
    /// anything is not a setting anyone means).
    pub fn new(concurrency: u16) -> Self {
        Turns {
            permits: Arc::new(Semaphore::new(usize::from(concurrency.max(1)))),
        }
    }

    /// Waits for this caller's turn, after everyone who asked before it. `None` once
    /// [`Turns::close`] was called.
    pub async fn take(&self) -> Option<Turn> {
        self.permits.clone().acquire_owned().await.ok().map(Turn)
    }

    /// Turns every waiter (and every later caller) away.
    pub fn close(&self) {
        self.permits.close();
    }

    /// Reconciles running now.
    pub fn running(&self, concurrency: u16) -> usize {
        usize::from(concurrency.max(1)) - self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Waiters are served in the order they arrived, whatever else keeps arriving: the
    /// property kube-runtime's parked set lacks.
    #[tokio::test]
    async fn waiters_go_in_arrival_order_and_no_more_than_the_concurrency_run() {
        let turns = Turns::new(2);
        let order = Arc::new(Mutex::new(Vec::new()));
        let peak = Arc::new(Mutex::new(0usize));
        let first = turns.take().await.unwrap();
        let second = turns.take().await.unwrap();
        let mut waiters = Vec::new();
        for i in 0..20 {
            let (turns, order, peak) = (turns.clone(), order.clone(), peak.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.take().await.unwrap();
                order.lock().unwrap().push(i);
                {
                    let mut p = peak.lock().unwrap();
                    *p = (*p).max(turns.running(2));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }));
            // Each waiter is queued before the next one is spawned.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop((first, second));
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
        assert!(*peak.lock().unwrap() <= 2, "{}", peak.lock().unwrap());
    }

    #[tokio::test]
    async fn closing_turns_waiters_away_and_the_running_finish() {
        let turns = Turns::new(1);
        let running = turns.take().await.unwrap();
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take().await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        turns.close();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(got, Ok(Ok(false))), "{got:?}");
        assert!(turns.take().await.is_none());
        drop(running);
    }

    #[test]
    fn zero_concurrency_still_runs_one() {
        let turns = Turns::new(0);
        assert_eq!(turns.permits.available_permits(), 1);
    }
}
