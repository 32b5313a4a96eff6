//! A call's wall-clock limit, not counting the time it waited for the request budget.
//!
//! `limits.timeout` bounds what a plugin does with its time. Waiting for a token of the
//! provider's request budget is the host's doing: a list of 200 pages paced at one request
//! a second must not be cut off for being paced, or the budget would make the inventory of
//! a large fleet impossible. So a call's deadline moves back by the time during which at
//! least one of its requests waited for a token, up to an allowance
//! ([`budget_wait_allowance`]), so that no call, however paced, holds its slot for ever.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much budget waiting may add to a call: ten times its own time, at most an hour.
/// With the defaults (60 s) that is 10 minutes: a Hetzner list of 600 pages at 3,600
/// requests an hour.
pub fn budget_wait_allowance(timeout: Duration) -> Duration {
    (timeout * 10).min(Duration::from_secs(3600))
}

/// The clock of one call, shared by its driver, its epoch callback and its HTTP hooks.
#[derive(Debug)]
pub struct CallClock {
    started: Instant,
    own: Duration,
    allowance: Duration,
    waits: Mutex<Waits>,
}

#[derive(Debug, Default)]
struct Waits {
    /// Requests waiting for a token now.
    waiting: usize,
    /// When the current stretch of waiting began (valid while `waiting > 0`).
    since: Option<Instant>,
    /// Finished stretches of waiting.
    waited: Duration,
}

impl CallClock {
    pub fn new(started: Instant, own: Duration, allowance: Duration) -> Self {
        CallClock {
            started,
            own,
            allowance,
            waits: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waits> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time spent waiting for the budget so far (overlapping waits count once).
    pub fn waited(&self, now: Instant) -> Duration {
        let w = self.lock();
        w.waited
            + w.since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// When the call is out of time, as things stand at `now`: its own time plus the
    /// budget waits so far, at most the allowance.
    pub fn deadline(&self, now: Instant) -> Instant {
        self.started + self.own + self.waited(now).min(self.allowance)
    }

    /// Asked on every epoch tick while the guest runs: within its own time, no lock.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.started + self.own && now >= self.deadline(now)
    }

    /// Whether a request of the call is waiting for a token now.
    pub fn is_waiting(&self) -> bool {
        self.lock().waiting > 0
    }

    /// The latest a token may come and still be of use: waiting until then costs the
    /// whole allowance, and the call's own time is what it was.
    pub fn last_token_at(&self) -> Instant {
        self.started + self.own + self.allowance
    }

    /// Marks a request as waiting for a token until the guard is dropped.
    pub fn wait(&self) -> WaitGuard<'_> {
        let mut w = self.lock();
        if w.waiting == 0 {
            w.since = Some(Instant::now());
        }
        w.waiting += 1;
        WaitGuard(self)
    }
}

pub struct WaitGuard<'a>(&'a CallClock);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut w = self.0.lock();
        w.waiting -= 1;
        if w.waiting == 0
            && let Some(since) = w.since.take()
        {
            w.waited += since.elapsed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn waits_move_the_deadline_up_to_the_allowance() {
        let t0 = Instant::now();
        let c = CallClock::new(t0, 10 * S, 30 * S);
        assert_eq!(c.deadline(t0), t0 + 10 * S);
        assert_eq!(c.last_token_at(), t0 + 40 * S);
        {
            let _a = c.wait();
            // Two requests waiting at once count once.
            let _b = c.wait();
            assert!(c.is_waiting());
            let later = Instant::now() + 5 * S;
            let moved = c.deadline(later);
            assert!(moved >= t0 + 15 * S && moved < t0 + 16 * S, "{moved:?}");
            assert!(!c.expired(later));
            // While waiting, the deadline keeps pace, until the allowance is spent.
            assert_eq!(c.deadline(t0 + 100 * S), t0 + 40 * S);
            assert!(c.expired(t0 + 100 * S));
        }
        assert!(!c.is_waiting());
        // After the wait, what it cost stays added (a few microseconds here).
        let d = c.deadline(t0 + 100 * S);
        assert!(d > t0 + 10 * S && d < t0 + 11 * S, "{d:?}");
    }

    #[test]
    fn the_allowance_is_ten_times_the_timeout_at_most_an_hour() {
        assert_eq!(budget_wait_allowance(60 * S), 600 * S);
        assert_eq!(budget_wait_allowance(3600 * S), 3600 * S);
    }
}
