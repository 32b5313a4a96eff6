//! The bookkeeping of API calls every emulator keeps: the request log, the counters of
//! `GET /_emulator/stats`, the queue of injected faults and the enforced rate limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::control::{FaultOp, FaultQueue, RateLimit, RequestStats};
use crate::rate_limit::Limiter;

/// What an injected fault does to one call: wait, then answer `fail` (or go on normally).
/// `E` is the emulator's error answer.
#[derive(Debug, Clone)]
pub struct Effect<E> {
    pub delay: Duration,
    pub fail: Option<E>,
}

impl<E> Effect<E> {
    pub fn fail(error: E) -> Self {
        Effect { delay: Duration::ZERO, fail: Some(error) }
    }

    pub fn delay(delay: Duration) -> Self {
        Effect { delay, fail: None }
    }
}

/// The enforced rate limit: one token bucket per key (a backend with one limit uses one
/// key; EC2 keeps one per action and region). Off (every call passes) until set.
#[derive(Debug, Clone, Default)]
pub struct RateLimits {
    spec: Option<RateLimit>,
    buckets: HashMap<String, Limiter>,
}

impl RateLimits {
    pub fn new(spec: Option<RateLimit>) -> Self {
        RateLimits { spec, buckets: HashMap::new() }
    }

    pub fn spec(&self) -> Option<RateLimit> {
        self.spec
    }

    /// A new limit (or none), with full buckets.
    pub fn set(&mut self, spec: Option<RateLimit>) {
        *self = RateLimits::new(spec);
    }

    /// The bucket of `key`, full when first used; `None` while no limit is set.
    pub fn bucket(&mut self, key: &str, now: Instant) -> Option<&mut Limiter> {
        let spec = self.spec?;
        Some(self.buckets.entry(key.to_string()).or_insert_with(|| Limiter::new(spec, now)))
    }

    /// Takes a token of `key`'s bucket: `Some(limit)` when the call is over it.
    pub fn take(&mut self, key: &str, now: Instant) -> Option<RateLimit> {
        let spec = self.spec?;
        let bucket = self.bucket(key, now)?;
        (!bucket.take(now)).then_some(spec)
    }
}

/// The API calls of one emulator. `E` is what a failing fault answers.
#[derive(Debug)]
pub struct Traffic<E> {
    /// Every API call, as the emulator writes it (`METHOD /path?query`, or an action).
    pub requests: Vec<String>,
    pub stats: RequestStats,
    pub faults: FaultQueue<Effect<E>>,
    /// Faults for one call by its name ([`Api::classify`](super::gate::Api::classify)'s),
    /// each with the number of calls it still hits: a test's way to fail one step of a
    /// multi-call operation (the power-on after a create) that no shared operation names.
    pub call_faults: Vec<(String, u32, Effect<E>)>,
    /// A fault on every n-th call, for as long as it is set: chaos at an exact rate, so a
    /// test's share of failed calls does not depend on how its calls bunch up in time.
    pub every: Option<EveryNth<E>>,
    pub limits: RateLimits,
}

/// Every `period`-th call that reaches the faults gets the next of `effects`, in turn.
#[derive(Debug, Clone)]
pub struct EveryNth<E> {
    period: u64,
    effects: Vec<Effect<E>>,
    calls: u64,
    hits: u64,
}

impl<E: Clone> EveryNth<E> {
    /// `None` when there is nothing to inject (`period` 0 or no effects).
    pub fn new(period: u32, effects: Vec<Effect<E>>) -> Option<Self> {
        (period > 0 && !effects.is_empty()).then(|| EveryNth {
            period: u64::from(period),
            effects,
            calls: 0,
            hits: 0,
        })
    }

    /// How many calls it has hit so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    fn take(&mut self) -> Option<Effect<E>> {
        self.calls += 1;
        if !self.calls.is_multiple_of(self.period) {
            return None;
        }
        let len = self.effects.len() as u64;
        let effect = self.effects[(self.hits % len) as usize].clone();
        self.hits += 1;
        Some(effect)
    }
}

impl<E: Clone> Traffic<E> {
    pub fn new(limit: Option<RateLimit>) -> Self {
        Traffic {
            requests: Vec::new(),
            stats: RequestStats::default(),
            faults: FaultQueue::default(),
            call_faults: Vec::new(),
            every: None,
            limits: RateLimits::new(limit),
        }
    }

    /// Logs and counts one call: `line` for the log, `op` and `call` for the counters.
    pub fn record(&mut self, line: String, op: Option<FaultOp>, call: &str) {
        self.requests.push(line);
        self.stats.record(op, call);
    }

    /// The fault that hits a call of `op` named `call`, if any: an injected fault of the
    /// operation first, then one for the call by name, then the every-n-th one (which
    /// counts only the calls the others left alone).
    pub fn take_fault(&mut self, op: Option<FaultOp>, call: &str) -> Option<Effect<E>> {
        if let Some(effect) = self.faults.take(op) {
            return Some(effect);
        }
        let Some(i) = self.call_faults.iter().position(|(c, n, _)| c == call && *n > 0) else {
            return self.every.as_mut().and_then(EveryNth::take);
        };
        let (_, left, effect) = &mut self.call_faults[i];
        *left -= 1;
        let effect = effect.clone();
        if *left == 0 {
            self.call_faults.remove(i);
        }
        Some(effect)
    }

    /// Forgets calls and faults. The rate limit is configuration: it stays, with full
    /// buckets.
    pub fn reset(&mut self) {
        *self = Traffic::new(self.limits.spec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_per_key_and_reset_keeps_the_limit() {
        let now = Instant::now();
        let mut t: Traffic<&str> = Traffic::new(Some(RateLimit { per_hour: 3600, burst: 1 }));
        assert_eq!(t.limits.take("a", now), None);
        assert!(t.limits.take("a", now).is_some());
        assert_eq!(t.limits.take("b", now), None);
        t.record("GET /x".into(), Some(FaultOp::Get), "GET /x");
        t.faults.push(FaultOp::Any, Effect::fail("boom"), 1);
        t.reset();
        assert!(t.requests.is_empty() && t.stats.total == 0);
        assert!(t.faults.take(None).is_none());
        assert_eq!(t.limits.take("a", now), None, "refilled");
        assert!(t.limits.take("a", now).is_some(), "still limited");
        t.limits.set(None);
        assert_eq!(t.limits.take("a", now), None);
        assert!(t.limits.bucket("a", now).is_none());
    }

    #[test]
    fn every_nth_call_gets_the_next_effect_in_turn() {
        let mut t: Traffic<&str> = Traffic::new(None);
        assert!(EveryNth::<&str>::new(0, vec![Effect::fail("a")]).is_none());
        assert!(EveryNth::<&str>::new(3, vec![]).is_none());
        t.every = EveryNth::new(3, vec![Effect::fail("a"), Effect::fail("b")]);
        let got: Vec<Option<&str>> =
            (0..9).map(|_| t.take_fault(None, "GET /x").and_then(|e| e.fail)).collect();
        let want = [None, None, Some("a"), None, None, Some("b"), None, None, Some("a")];
        assert_eq!(got, want);
        // A queued fault takes its call without counting towards the period.
        t.faults.push(FaultOp::Any, Effect::fail("q"), 1);
        assert_eq!(t.take_fault(None, "GET /x").and_then(|e| e.fail), Some("q"));
        assert_eq!(t.take_fault(None, "GET /x").and_then(|e| e.fail), None);
        assert_eq!(t.every.as_ref().map(EveryNth::hits), Some(3));
        t.reset();
        assert!(t.every.is_none(), "a reset forgets the chaos");
    }
}
