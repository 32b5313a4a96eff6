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
//!
//! **Creates never hold every turn.** A reconcile that creates waits for the provider's
//! budget inside its turn (a token a second at Hetzner's 3,600/h). In one queue, a
//! rollout's Pending Proxies took every turn for as long as their creates lasted, and the
//! Proxies whose instances a list had already confirmed (a status write each, no call)
//! waited behind all of them: at 2,000 Proxies on 3,600/h the first ran after 8,748 s of
//! the 9,161 the rollout took. So a reconcile expected to create ([`Kind::Create`]) first
//! takes one of its provider's create permits, half the turns rounded up, in arrival
//! order, and only then a turn: at most that many creates of a provider hold or wait for a
//! turn, and every other reconcile waits behind at most those. Half, not all but one: with
//! one turn left, confirmations (a status write each, milliseconds on a busy machine) kept
//! up with creates at 60 a second no better than those did, and a rollout of 2,000
//! Proxies at x60 had hundreds listed running and still waiting for a turn; a provider
//! sends at most its call slots (two by default) at once anyway. Per provider, so that a provider
//! whose creates hang holds up no other provider's creates beyond the turns it holds. The creates keep the budget busy all the same, since each
//! one in flight already waits for the next token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The queue of turns; cheap to clone.
#[derive(Clone, Debug)]
pub struct Turns {
    permits: Arc<Semaphore>,
    /// Per configured provider, the creates that may hold or wait for a turn at once (see
    /// the module's doc). Keyed by configured providers only ([`Kind::Create`]), so it
    /// holds one small semaphore per provider ever configured in this term.
    creates: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    per_provider: usize,
}

/// What a reconcile is expected to do, from the copy it was asked with (a guess that only
/// orders the queue: the reconcile decides from the copy of its turn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Its Proxy has no instance and its provider is configured: it will create, and wait
    /// for that provider's budget.
    Create(String),
    /// Anything else: a finalizer, a status write, a Get, a Delete.
    Other,
}

/// Held for the length of a reconcile; the next waiter goes when it drops.
#[derive(Debug)]
pub struct Turn {
    _turn: OwnedSemaphorePermit,
    _create: Option<OwnedSemaphorePermit>,
}

/// Proxies (UIDs) whose create returned in this process lately. A copy of such a Proxy
/// without an instance is the cache lagging the status write that recorded one, not a
/// create to come: taken for one, its reconcile waited behind the rollout's whole queue of
/// creates (at 2,000 Proxies and x60, Proxies listed running waited 37 s for their turn,
/// while lists every few seconds kept reading them). The record only orders the queue: a
/// Proxy it misclassifies still gets its turn and decides from the copy of that moment.
#[derive(Debug, Default)]
pub struct Returned(Mutex<HashMap<String, std::time::Instant>>);

/// How long a returned create is remembered, at most; the cache catches up in seconds.
pub const RETURNED_KEPT: std::time::Duration = std::time::Duration::from_secs(600);
/// How many are remembered at once (about 100 bytes each); past it the oldest go.
pub const RETURNED_MAX: usize = 16_384;

impl Returned {
    /// The create of Proxy `uid` returned an instance.
    pub fn note(&self, uid: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= RETURNED_MAX {
            m.retain(|_, at| at.elapsed() < RETURNED_KEPT);
            if m.len() >= RETURNED_MAX
                && let Some(oldest) = m.iter().min_by_key(|(_, at)| **at).map(|(k, _)| k.clone())
            {
                m.remove(&oldest);
            }
        }
        m.insert(uid.to_string(), std::time::Instant::now());
    }

    /// Whether Proxy `uid`'s create returned lately.
    pub fn lately(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .is_some_and(|at| at.elapsed() < RETURNED_KEPT)
    }

    /// The cache shows Proxy `uid`'s instance: nothing left to remember.
    pub fn forget(&self, uid: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !m.is_empty() {
            m.remove(uid);
        }
    }
}

impl Turns {
    /// `concurrency` reconciles at a time (0 is taken as 1: a controller that never runs
    /// anything is not a setting anyone means). With one, creates take it too.
    pub fn new(concurrency: u16) -> Self {
        let n = usize::from(concurrency.max(1));
        Turns {
            permits: Arc::new(Semaphore::new(n)),
            creates: Default::default(),
            per_provider: n.div_ceil(2),
        }
    }

    /// Waits for this caller's turn, after everyone of its kind who asked before it (and,
    /// for a create, behind at most half the turns' worth of creates). `None` once
    /// [`Turns::close`] was called.
    pub async fn take(&self, kind: Kind) -> Option<Turn> {
        let create = match kind {
            Kind::Create(provider) => {
                let permits = {
                    let mut creates = self.creates.lock().unwrap_or_else(|e| e.into_inner());
                    if self.permits.is_closed() {
                        return None;
                    }
                    creates
                        .entry(provider)
                        .or_insert_with(|| Arc::new(Semaphore::new(self.per_provider)))
                        .clone()
                };
                Some(permits.acquire_owned().await.ok()?)
            }
            Kind::Other => None,
        };
        let turn = self.permits.clone().acquire_owned().await.ok()?;
        Some(Turn {
            _turn: turn,
            _create: create,
        })
    }

    /// Turns every waiter (and every later caller) away.
    pub fn close(&self) {
        let creates = self.creates.lock().unwrap_or_else(|e| e.into_inner());
        for permits in creates.values() {
            permits.close();
        }
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

    #[test]
    fn returned_creates_are_remembered_until_the_cache_shows_them_and_stay_bounded() {
        let r = Returned::default();
        assert!(!r.lately("a"));
        r.note("a");
        assert!(r.lately("a"));
        r.forget("a");
        assert!(!r.lately("a"), "the cache caught up");
        for i in 0..RETURNED_MAX + 10 {
            r.note(&format!("u{i}"));
        }
        assert!(r.0.lock().unwrap().len() <= RETURNED_MAX);
        assert!(
            r.lately(&format!("u{}", RETURNED_MAX + 9)),
            "the newest stay"
        );
    }
    use std::sync::Mutex;
    use std::time::Duration;

    /// Waiters are served in the order they arrived, whatever else keeps arriving: the
    /// property kube-runtime's parked set lacks.
    #[tokio::test]
    async fn waiters_go_in_arrival_order_and_no_more_than_the_concurrency_run() {
        let turns = Turns::new(2);
        let order = Arc::new(Mutex::new(Vec::new()));
        let peak = Arc::new(Mutex::new(0usize));
        let first = turns.take(Kind::Other).await.unwrap();
        let second = turns.take(Kind::Other).await.unwrap();
        let mut waiters = Vec::new();
        for i in 0..20 {
            let (turns, order, peak) = (turns.clone(), order.clone(), peak.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.take(Kind::Other).await.unwrap();
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
        let running = turns.take(Kind::Other).await.unwrap();
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Kind::Other).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        turns.close();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(got, Ok(Ok(false))), "{got:?}");
        assert!(turns.take(Kind::Other).await.is_none());
        drop(running);
    }

    #[test]
    fn zero_concurrency_still_runs_one() {
        let turns = Turns::new(0);
        assert_eq!(turns.permits.available_permits(), 1);
        assert_eq!(turns.per_provider, 1);
    }

    /// A rollout's creates queued first, each holding its turn a while (waiting for the
    /// budget), then one status write: it runs after at most half the turns' creates,
    /// not after all of them. Under one FIFO queue it ran after all of them.
    #[tokio::test]
    async fn a_reconcile_behind_a_rollout_waits_for_a_free_turn_not_the_rollout() {
        let turns = Turns::new(3);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..40 {
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.take(Kind::Create("p".into())).await.unwrap();
                order.lock().unwrap().push(format!("create {i}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let queued_at = order.lock().unwrap().len();
        let other = tokio::spawn({
            let (turns, order) = (turns.clone(), order.clone());
            async move {
                let _turn = turns.take(Kind::Other).await.unwrap();
                order.lock().unwrap().push("status write".to_string());
            }
        });
        other.await.unwrap();
        let at = order
            .lock()
            .unwrap()
            .iter()
            .position(|s| s == "status write")
            .unwrap();
        // The creates holding their turns when it came (two) may start first, no more.
        assert!(
            at <= queued_at + 2,
            "queued after {queued_at} creates, ran after {at}: {:?}",
            order.lock().unwrap()
        );
        // The creates still go in their order, two at a time.
        for w in waiters {
            w.await.unwrap();
        }
        let creates: Vec<String> = order
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.starts_with("create"))
            .cloned()
            .collect();
        assert_eq!(
            creates,
            (0..40).map(|i| format!("create {i}")).collect::<Vec<_>>()
        );
        assert_eq!(turns.running(3), 0);
    }

    /// A provider whose creates hang (holding its create permits and their turns) leaves
    /// another provider's create the remaining turn.
    #[tokio::test]
    async fn a_providers_hung_creates_hold_up_no_other_providers_create() {
        let turns = Turns::new(3);
        let a1 = turns.take(Kind::Create("a".into())).await.unwrap();
        let a2 = turns.take(Kind::Create("a".into())).await.unwrap();
        let b = tokio::time::timeout(Duration::from_secs(5), turns.take(Kind::Create("b".into())))
            .await;
        assert!(matches!(b, Ok(Some(_))), "b's create waited for a's");
        drop((a1, a2));
    }

    #[tokio::test]
    async fn with_one_turn_creates_and_the_rest_share_it() {
        let turns = Turns::new(1);
        let create = turns.take(Kind::Create("p".into())).await.unwrap();
        let other = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Kind::Other).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!other.is_finished(), "two reconciles at once with one turn");
        drop(create);
        assert!(other.await.unwrap());
    }

    #[tokio::test]
    async fn closing_turns_away_a_create_waiting_for_its_permit() {
        let turns = Turns::new(2);
        let first = turns.take(Kind::Create("p".into())).await.unwrap();
        let second = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Kind::Create("p".into())).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        turns.close();
        let got = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert!(matches!(got, Ok(Ok(false))), "{got:?}");
        drop(first);
    }
}
