//! The token bucket behind an emulator's optional rate limit ([`RateLimit`]): real time,
//! `burst` tokens, refilled at `per_hour / 3600` a second, one token per call.

pub use egress_emulator_protocol::RateLimit;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Limiter {
    spec: RateLimit,
    tokens: f64,
    last: Instant,
}

impl Limiter {
    /// A full bucket.
    pub fn new(spec: RateLimit, now: Instant) -> Self {
        Limiter { spec, tokens: f64::from(spec.burst), last: now }
    }

    pub fn spec(&self) -> RateLimit {
        self.spec
    }

    fn rate(&self) -> f64 {
        f64::from(self.spec.per_hour.max(1)) / 3600.0
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let dt = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate()).min(f64::from(self.spec.burst));
            self.last = now;
        }
    }

    /// Takes a token for one call; `false`: the call is over the limit.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whole tokens left (what `RateLimit-Remaining` says).
    pub fn remaining(&mut self, now: Instant) -> u64 {
        self.refill(now);
        self.tokens.floor() as u64
    }

    /// How long until the bucket is full again (what `RateLimit-Reset` counts to), rounded
    /// up to whole seconds.
    pub fn until_full(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let missing = f64::from(self.spec.burst) - self.tokens;
        Duration::from_secs((missing / self.rate()).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let t0 = Instant::now();
        // 7200/h: two tokens a second.
        let mut l = Limiter::new(RateLimit { per_hour: 7200, burst: 3 }, t0);
        assert_eq!(l.remaining(t0), 3);
        assert_eq!(l.until_full(t0), Duration::ZERO);
        assert!(l.take(t0) && l.take(t0) && l.take(t0));
        assert!(!l.take(t0));
        assert_eq!(l.remaining(t0), 0);
        assert_eq!(l.until_full(t0), Duration::from_secs(2));
        let later = t0 + Duration::from_millis(500);
        assert!(l.take(later));
        assert!(!l.take(later));
        assert_eq!(l.remaining(t0 + Duration::from_secs(100)), 3);
    }
}
