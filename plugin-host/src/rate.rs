//! A provider's request budget: how many backend requests its plugin may send, in what
//! order when they are short, and what the backend said about its own limit.
//!
//! [`Bucket`] is the pure part (no I/O, time passed in): a token bucket of `burst` tokens
//! refilled at `requestsPerHour`, with a queue per [`Priority`] in arrival order. Only the
//! head of the queue may take a token: the first request of the class whose turn it is by
//! the classes' shares ([`Shares`]: Urgent 5, Transition 3, Background 2), so a list or a
//! check issued during a rollout gets at least a fifth of the tokens instead of waiting for
//! the last create. A class with no higher class waiting must leave a reserve in the
//! bucket ([`Bucket::reserve`]), so background polling never drains what a user's create
//! would need on arrival.
//! What the backend says adapts it ([`Bucket::observe`]): `Retry-After` on a 429 or 503
//! pauses every request of the provider until then; `RateLimit-Remaining` (or Azure
//! Resource Manager's `x-ms-ratelimit-remaining-*`, see [`remaining`]) lowers the tokens to
//! what the backend has left, `RateLimit-Limit` (requests per hour, as Hetzner
//! defines it) lowers the refill rate, and a 429 empties the bucket.
//!
//! [`Budget`] is the async shell the HTTP hooks wait on: one per provider name, shared by
//! all its calls and kept across reloads (see `Runtime::budget`).

pub use crate::provider::priority::Priority;
use crate::provider::priority::{Shares, class_keys};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A budget as configured: `requestsPerHour` refill, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub per_hour: u32,
    pub burst: u32,
}

impl Spec {
    fn rate(self) -> f64 {
        f64::from(self.per_hour) / 3600.0
    }
}

/// The most a plugin's own default budget (`plugin-info.default-budget`, contract 0.2.0)
/// may allow: 100 requests a second, 1,000 at once. A default is the plugin author's
/// reading of the backend's documented limit; a larger claim is taken as this, and only
/// the providers file's `budget` can go beyond it.
pub const MAX_DEFAULT: Spec = Spec {
    per_hour: 360_000,
    burst: 1_000,
};

/// A plugin's declared default, capped at [`MAX_DEFAULT`].
pub fn cap_default(declared: Spec) -> Spec {
    Spec {
        per_hour: declared.per_hour.min(MAX_DEFAULT.per_hour),
        burst: declared.burst.min(MAX_DEFAULT.burst),
    }
}

/// The longest pause a `Retry-After` can impose: a backend (or whatever answers in its
/// name) cannot stop a provider for longer than this in one answer.
pub const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// A waiting request's place: its priority, then its arrival.
pub type Ticket = (Priority, u64);

/// What the head of the queue (or anyone else) should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// A token was taken: send the request.
    Granted,
    /// At the head of the queue, but no token yet: ask again at this instant (or when the
    /// queue changes).
    WaitUntil(Instant),
    /// Someone goes first: ask again when the queue changes.
    Behind,
}

/// What one answer of the backend said about its rate limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Feedback {
    pub status: u16,
    /// `Retry-After`, already turned into a delay.
    pub retry_after: Option<Duration>,
    /// `RateLimit-Limit`: requests per hour.
    pub limit: Option<u64>,
    /// `RateLimit-Remaining`: requests the backend has left now.
    pub remaining: Option<u64>,
}

/// The token bucket and its queue. Starts full.
#[derive(Debug)]
pub struct Bucket {
    spec: Spec,
    /// Tokens per second in force: the configured rate, or lower when the backend says so.
    rate: f64,
    tokens: f64,
    last: Instant,
    paused_until: Option<Instant>,
    waiting: BTreeSet<Ticket>,
    next: u64,
    shares: Shares,
}

impl Bucket {
    pub fn new(spec: Spec, now: Instant) -> Self {
        Bucket {
            spec,
            rate: spec.rate(),
            tokens: f64::from(spec.burst),
            last: now,
            paused_until: None,
            waiting: BTreeSet::new(),
            next: 0,
            shares: Shares::default(),
        }
    }

    pub fn spec(&self) -> Spec {
        self.spec
    }

    /// Tokens a request of `p` must leave in the bucket: none for Urgent, a tenth of the
    /// burst for Transition, a fifth for Background (rounded down, so a burst under 5
    /// reserves nothing).
    pub fn reserve(&self, p: Priority) -> f64 {
        let b = f64::from(self.spec.burst);
        match p {
            Priority::Urgent => 0.0,
            Priority::Transition => (b / 10.0).floor(),
            Priority::Background => (b / 5.0).floor(),
        }
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let dt = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(f64::from(self.spec.burst));
            self.last = now;
        }
    }

    /// Tokens in the bucket at `now`.
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// The refill rate in force, in tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Until when the backend asked for a pause, if it still holds at `now`.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|u| *u > now)
    }

    /// Queues a request of priority `p`.
    pub fn enqueue(&mut self, p: Priority) -> Ticket {
        let t = (p, self.next);
        self.next += 1;
        self.waiting.insert(t);
        t
    }

    /// Takes `t` out of the queue (the request was dropped while waiting).
    pub fn cancel(&mut self, t: Ticket) {
        self.waiting.remove(&t);
    }

    /// Requests waiting, by priority.
    pub fn waiting(&self, p: Priority) -> usize {
        self.waiting.iter().filter(|t| t.0 == p).count()
    }

    fn has_waiting(&self, p: Priority) -> bool {
        self.waiting.range(class_keys(p)).next().is_some()
    }

    /// The request whose turn it is: the first of the class the shares serve next.
    fn head(&self) -> Option<Ticket> {
        let class = self.shares.next(|p| self.has_waiting(p))?;
        self.waiting.range(class_keys(class)).next().copied()
    }

    /// Whether `t` may send now. Only the head of the queue ([`Bucket::head`]) takes a
    /// token; it leaves the queue when it does. It leaves its class's reserve in the
    /// bucket unless a higher class waits: then the shares, not the reserve, protect it.
    pub fn try_take(&mut self, t: Ticket, now: Instant) -> Take {
        if self.head() != Some(t) {
            return Take::Behind;
        }
        if let Some(until) = self.paused_until(now) {
            return Take::WaitUntil(until);
        }
        self.refill(now);
        let higher_waits = Priority::ALL
            .into_iter()
            .any(|p| p < t.0 && self.has_waiting(p));
        let need = 1.0 + if higher_waits { 0.0 } else { self.reserve(t.0) };
        if self.tokens >= need {
            self.tokens -= 1.0;
            self.waiting.remove(&t);
            self.shares.charge(t.0);
            return Take::Granted;
        }
        let secs = (need - self.tokens) / self.rate;
        Take::WaitUntil(now + Duration::from_secs_f64(secs.min(MAX_PAUSE.as_secs_f64())))
    }

    /// Adapts to an answer of the backend.
    pub fn observe(&mut self, now: Instant, fb: &Feedback) {
        self.refill(now);
        if let Some(limit) = fb.limit
            && limit > 0
        {
            self.rate = self.spec.rate().min(limit as f64 / 3600.0);
        }
        if let Some(left) = fb.remaining {
            self.tokens = self.tokens.min(left as f64);
        }
        if fb.status == 429 {
            self.tokens = 0.0;
        }
        if matches!(fb.status, 429 | 503)
            && let Some(after) = fb.retry_after
        {
            let until = now + after.min(MAX_PAUSE);
            self.paused_until = Some(self.paused_until.map_or(until, |u| u.max(until)));
        }
    }
}

/// What the backend has left, from the headers of one answer: the IETF draft's
/// `RateLimit-Remaining`, else the lowest of Azure Resource Manager's
/// `x-ms-ratelimit-remaining-*` (a number, such as `...-subscription-reads: 11999`, or
/// `policy;number` pairs, as Compute writes `...-resource: Microsoft.Compute/PutVM3Min;239`).
/// ARM counts reads and writes apart; one bucket takes the lower of what an answer says,
/// so a backend about to refuse writes slows the reads too rather than be overrun.
pub fn remaining<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<u64> {
    let mut ietf = None;
    let mut arm: Option<u64> = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("ratelimit-remaining") {
            ietf = value.trim().parse::<u64>().ok();
        } else if name.len() > 25 && name[..25].eq_ignore_ascii_case("x-ms-ratelimit-remaining-") {
            let numbers = value.split(',').filter_map(|part| {
                let n = part.rsplit(';').next()?.trim();
                n.parse::<u64>().ok()
            });
            for n in numbers {
                arm = Some(arm.map_or(n, |a| a.min(n)));
            }
        }
    }
    ietf.or(arm)
}

/// `Retry-After` as a delay: delay-seconds, or an HTTP date (IMF-fixdate) relative to
/// `now_unix`. A date in the past is no delay; anything else unreadable is `None`.
pub fn parse_retry_after(value: &str, now_unix: u64) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = parse_http_date(v)?;
    Some(Duration::from_secs(at.saturating_sub(now_unix)))
}

/// Unix seconds of an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 5.6.7).
fn parse_http_date(s: &str) -> Option<u64> {
    let rest = s.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as u32 + 1;
    let day: u32 = day.parse().ok()?;
    let year: i64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || *h > 23 || *m > 59 || *sec > 60 || year < 1970 {
        return None;
    }
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * i64::from(mo) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as u64 * 86_400 + h * 3600 + m * 60 + sec)
}

/// Why a request got no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The call's deadline comes before the token would.
    Deadline,
}

/// A provider's bucket, shared by all its calls' HTTP hooks.
#[derive(Debug)]
pub struct Budget {
    bucket: Mutex<Bucket>,
    changed: tokio::sync::Notify,
}

impl Budget {
    pub fn new(spec: Spec) -> Self {
        Budget {
            bucket: Mutex::new(Bucket::new(spec, Instant::now())),
            changed: tokio::sync::Notify::new(),
        }
    }

    pub fn spec(&self) -> Spec {
        self.lock().spec()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.bucket.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tokens left now.
    pub fn tokens(&self) -> f64 {
        self.lock().tokens(Instant::now())
    }

    /// The refill rate in force (lower than configured when the backend says so), per hour.
    pub fn rate_per_hour(&self) -> f64 {
        self.lock().rate() * 3600.0
    }

    /// Waits for a token in priority order; returns how long it waited. Refuses at once
    /// when the token would only come after `deadline`. Dropping the future leaves the
    /// queue.
    pub async fn acquire(&self, p: Priority, deadline: Instant) -> Result<Duration, Refused> {
        let start = Instant::now();
        let ticket = self.lock().enqueue(p);
        // The head may change (a class whose turn it is has come) and what it needs with it
        // (no reserve once a higher class waits): the waiters look again.
        self.changed.notify_waiters();
        let mut guard = Waiting {
            budget: self,
            ticket,
            done: false,
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let take = self.lock().try_take(ticket, now);
            match take {
                Take::Granted => {
                    guard.done = true;
                    // The next in line is now the head.
                    self.changed.notify_waiters();
                    return Ok(now.duration_since(start));
                }
                Take::WaitUntil(at) if at > deadline => return Err(Refused::Deadline),
                Take::WaitUntil(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                        () = changed => {}
                    }
                }
                Take::Behind => {
                    tokio::select! {
                        () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => return Err(Refused::Deadline),
                        () = changed => {}
                    }
                }
            }
        }
    }

    /// Whether a create, delete or transition waits for a token now.
    pub fn above_background_waiting(&self) -> bool {
        let b = self.lock();
        b.has_waiting(Priority::Urgent) || b.has_waiting(Priority::Transition)
    }

    /// Adapts to an answer of the backend; waiters re-check.
    pub fn observe(&self, fb: &Feedback) {
        self.lock().observe(Instant::now(), fb);
        self.changed.notify_waiters();
    }
}

/// A request in the queue; leaving it (cancelled, refused) lets the next one in.
struct Waiting<'a> {
    budget: &'a Budget,
    ticket: Ticket,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.budget.lock().cancel(self.ticket);
            self.budget.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_backend_has_left_by_its_headers() {
        type Headers<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Headers, Option<u64>)] = &[
            (&[("RateLimit-Remaining", "42")], Some(42)),
            (&[("ratelimit-remaining", " 7 ")], Some(7)),
            (
                &[("x-ms-ratelimit-remaining-subscription-reads", "11999")],
                Some(11999),
            ),
            (
                &[
                    ("x-ms-ratelimit-remaining-subscription-writes", "1199"),
                    (
                        "x-ms-ratelimit-remaining-resource",
                        "Microsoft.Compute/PutVM3Min;239,Microsoft.Compute/PutVM30Min;1199",
                    ),
                ],
                Some(239),
            ),
            // The IETF header wins where a backend sends both.
            (
                &[
                    ("x-ms-ratelimit-remaining-subscription-reads", "3"),
                    ("RateLimit-Remaining", "50"),
                ],
                Some(50),
            ),
            (
                &[("x-ms-ratelimit-remaining-subscription-reads", "lots")],
                None,
            ),
            (&[("x-ms-ratelimit-remaining-", "5")], None),
            (&[("content-type", "application/json")], None),
            (&[], None),
        ];
        for (headers, want) in cases {
            assert_eq!(remaining(headers.iter().copied()), *want, "{headers:?}");
        }
    }
    use Priority::*;

    fn spec(per_hour: u32, burst: u32) -> Spec {
        Spec { per_hour, burst }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_declared_default_is_capped() {
        assert_eq!(cap_default(spec(3600, 100)), spec(3600, 100));
        assert_eq!(
            cap_default(spec(u32::MAX, 5)),
            spec(MAX_DEFAULT.per_hour, 5)
        );
        assert_eq!(cap_default(spec(10, u32::MAX)), spec(10, MAX_DEFAULT.burst));
    }

    #[test]
    fn burst_then_refill_at_the_hourly_rate() {
        let t0 = Instant::now();
        // 3600/h: one token a second.
        let mut b = Bucket::new(spec(3600, 3), t0);
        for _ in 0..3 {
            let t = b.enqueue(Urgent);
            assert_eq!(b.try_take(t, t0), Take::Granted);
        }
        let t = b.enqueue(Urgent);
        assert_eq!(b.try_take(t, t0), Take::WaitUntil(t0 + secs(1.0)));
        assert_eq!(
            b.try_take(t, t0 + secs(0.5)),
            Take::WaitUntil(t0 + secs(1.0))
        );
        assert_eq!(b.try_take(t, t0 + secs(1.0)), Take::Granted);
        // Never more than the burst, however long it rested.
        assert_eq!(b.tokens(t0 + secs(1000.0)), 3.0);
    }

    #[test]
    fn the_class_whose_turn_it_is_goes_first_then_arrival_order() {
        let t0 = Instant::now();
        let mut b = Bucket::new(spec(3600, 1), t0);
        let first = b.enqueue(Urgent);
        assert_eq!(b.try_take(first, t0), Take::Granted);
        // Empty: three gets queue, then a create and a transition.
        let gets: Vec<_> = (0..3).map(|_| b.enqueue(Background)).collect();
        assert!(matches!(b.try_take(gets[0], t0), Take::WaitUntil(_)));
        assert_eq!(b.try_take(gets[1], t0), Take::Behind);
        let create = b.enqueue(Urgent);
        let transition = b.enqueue(Transition);
        // Urgent was just served (its pass is ahead): the transition, then the first get,
        // then the create; a token a second. Nobody waits for a whole queue.
        assert_eq!(b.try_take(gets[0], t0 + secs(1.0)), Take::Behind);
        assert_eq!(b.try_take(create, t0 + secs(1.0)), Take::Behind);
        assert_eq!(b.try_take(transition, t0 + secs(1.0)), Take::Granted);
        assert_eq!(b.try_take(create, t0 + secs(2.0)), Take::Behind);
        assert_eq!(b.try_take(gets[0], t0 + secs(2.0)), Take::Granted);
        assert_eq!(b.try_take(gets[1], t0 + secs(3.0)), Take::Behind);
        assert_eq!(b.try_take(create, t0 + secs(3.0)), Take::Granted);
        // Then the gets, in the order they came.
        assert_eq!(b.try_take(gets[2], t0 + secs(4.0)), Take::Behind);
        assert_eq!(b.try_take(gets[1], t0 + secs(4.0)), Take::Granted);
        assert_eq!(b.waiting(Background), 1);
        b.cancel(gets[2]);
        assert_eq!(b.waiting(Background), 0);
    }

    /// Issue 29: during a rollout larger than the budget, a list's pages still get a fifth
    /// of the tokens, so a list issued mid-rollout ends in a bounded time.
    #[test]
    fn a_list_behind_a_rollout_gets_its_share_of_the_tokens() {
        let t0 = Instant::now();
        // 3,600/h, burst 10: spent by the first creates, then one token a second.
        let mut b = Bucket::new(spec(3600, 10), t0);
        let creates: Vec<_> = (0..1000).map(|_| b.enqueue(Urgent)).collect();
        let mut pages_sent = 0;
        let mut creates_sent = 0;
        let mut page = b.enqueue(Background);
        let mut t = t0;
        let mut next_create = creates.iter();
        let mut create = *next_create.next().unwrap();
        // 100 seconds of one token a second (plus the burst).
        while t < t0 + secs(100.0) {
            if b.try_take(page, t) == Take::Granted {
                pages_sent += 1;
                page = b.enqueue(Background);
            } else if b.try_take(create, t) == Take::Granted {
                creates_sent += 1;
                create = *next_create.next().unwrap();
            } else {
                t += secs(0.25);
            }
        }
        // 110 tokens: about 2 in 7 to the list (5:2), the rest to the creates.
        assert!((28..=34).contains(&pages_sent), "pages {pages_sent}");
        assert!((76..=82).contains(&creates_sent), "creates {creates_sent}");
    }

    #[test]
    fn background_leaves_a_reserve_for_urgent_work() {
        let t0 = Instant::now();
        let mut b = Bucket::new(spec(3600, 10), t0);
        assert_eq!(
            [
                b.reserve(Urgent),
                b.reserve(Transition),
                b.reserve(Background)
            ],
            [0.0, 1.0, 2.0]
        );
        // Background polling alone stops at 2 tokens...
        let mut sent = 0;
        loop {
            let t = b.enqueue(Background);
            match b.try_take(t, t0) {
                Take::Granted => sent += 1,
                other => {
                    assert_eq!(other, Take::WaitUntil(t0 + secs(1.0)));
                    b.cancel(t);
                    break;
                }
            }
        }
        assert_eq!(sent, 8);
        // ...so a create is served at once; a transition alone leaves its reserve of 1.
        let c = b.enqueue(Urgent);
        assert_eq!(b.try_take(c, t0), Take::Granted);
        let tr = b.enqueue(Transition);
        assert_eq!(b.try_take(tr, t0), Take::WaitUntil(t0 + secs(1.0)));
        // With a create waiting, the shares protect it, not the reserve: the transition
        // (whose turn it is) takes the last token, and the create the next one.
        let d = b.enqueue(Urgent);
        assert_eq!(b.try_take(d, t0), Take::Behind);
        assert_eq!(b.try_take(tr, t0), Take::Granted);
        assert_eq!(b.tokens(t0), 0.0);
        assert_eq!(b.try_take(d, t0 + secs(1.0)), Take::Granted);
    }

    #[test]
    fn small_bursts_reserve_nothing() {
        let b = Bucket::new(spec(3600, 4), Instant::now());
        assert_eq!(b.reserve(Background), 0.0);
        assert_eq!(b.reserve(Transition), 0.0);
    }

    #[test]
    fn retry_after_pauses_every_priority() {
        let t0 = Instant::now();
        let mut b = Bucket::new(spec(3600, 10), t0);
        b.observe(
            t0,
            &Feedback {
                status: 503,
                retry_after: Some(secs(30.0)),
                ..Feedback::default()
            },
        );
        let u = b.enqueue(Urgent);
        assert_eq!(
            b.try_take(u, t0 + secs(1.0)),
            Take::WaitUntil(t0 + secs(30.0))
        );
        assert_eq!(b.try_take(u, t0 + secs(30.0)), Take::Granted);
        // A 503 without Retry-After says nothing about the budget; a later, shorter
        // Retry-After does not shorten a pause.
        b.observe(
            t0 + secs(30.0),
            &Feedback {
                status: 503,
                ..Feedback::default()
            },
        );
        assert_eq!(b.paused_until(t0 + secs(30.0)), None);
        b.observe(
            t0 + secs(30.0),
            &Feedback {
                status: 429,
                retry_after: Some(secs(10.0)),
                ..Feedback::default()
            },
        );
        b.observe(
            t0 + secs(31.0),
            &Feedback {
                status: 429,
                retry_after: Some(secs(1.0)),
                ..Feedback::default()
            },
        );
        assert_eq!(b.paused_until(t0 + secs(31.0)), Some(t0 + secs(40.0)));
        // A 200 never pauses, whatever it carries; a pause is capped.
        b.observe(
            t0 + secs(40.0),
            &Feedback {
                status: 200,
                retry_after: Some(secs(99.0)),
                ..Feedback::default()
            },
        );
        assert_eq!(b.paused_until(t0 + secs(40.0)), None);
        b.observe(
            t0 + secs(40.0),
            &Feedback {
                status: 429,
                retry_after: Some(secs(1e9)),
                ..Feedback::default()
            },
        );
        assert_eq!(
            b.paused_until(t0 + secs(40.0)),
            Some(t0 + secs(40.0) + MAX_PAUSE)
        );
    }

    #[test]
    fn a_429_empties_the_bucket() {
        let t0 = Instant::now();
        let mut b = Bucket::new(spec(3600, 10), t0);
        b.observe(
            t0,
            &Feedback {
                status: 429,
                ..Feedback::default()
            },
        );
        assert_eq!(b.tokens(t0), 0.0);
        let u = b.enqueue(Urgent);
        assert_eq!(b.try_take(u, t0), Take::WaitUntil(t0 + secs(1.0)));
    }

    #[test]
    fn ratelimit_headers_lower_the_tokens_and_the_rate() {
        let t0 = Instant::now();
        // Configured for 7200/h, burst 100; the backend allows 3600/h and has 5 left
        // (another client of the same project used the rest).
        let mut b = Bucket::new(spec(7200, 100), t0);
        b.observe(
            t0,
            &Feedback {
                status: 200,
                limit: Some(3600),
                remaining: Some(5),
                ..Feedback::default()
            },
        );
        assert_eq!(b.tokens(t0), 5.0);
        assert_eq!(b.rate(), 1.0);
        assert_eq!(b.tokens(t0 + secs(10.0)), 15.0);
        // More left than we have, or a higher limit than configured: never raises either.
        b.observe(
            t0 + secs(10.0),
            &Feedback {
                status: 200,
                limit: Some(1_000_000),
                remaining: Some(90),
                ..Feedback::default()
            },
        );
        assert_eq!(b.tokens(t0 + secs(10.0)), 15.0);
        assert_eq!(b.rate(), 2.0);
        // Limit 0 is nonsense and ignored.
        b.observe(
            t0 + secs(10.0),
            &Feedback {
                status: 200,
                limit: Some(0),
                ..Feedback::default()
            },
        );
        assert_eq!(b.rate(), 2.0);
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        // 1994-11-06T08:49:37Z
        let date = 784_111_777;
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(date));
        assert_eq!(parse_retry_after("120", 0), Some(secs(120.0)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date - 30),
            Some(secs(30.0))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date + 30),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 23:59:59 GMT"),
            Some(1_835_481_599)
        );
        for bad in [
            "",
            "-1",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 CET",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_retry_after(bad, 0), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_create_waits_for_one_turn_not_for_the_queue() {
        // 36000/h: a token every 100 ms; burst 1, spent at once.
        let budget = std::sync::Arc::new(Budget::new(spec(36_000, 1)));
        let far = Instant::now() + Duration::from_secs(30);
        budget.acquire(Urgent, far).await.unwrap();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, p) in [Background, Background, Background, Urgent]
            .into_iter()
            .enumerate()
        {
            let (b, o) = (budget.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                b.acquire(p, far).await.unwrap();
                o.lock().unwrap().push(i);
            }));
            // The create arrives after the gets have queued.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        // The first get was already due when the create came; the create goes next, before
        // the two other gets.
        let order = order.lock().unwrap().clone();
        assert_eq!(order, [0, 3, 1, 2]);
        // Refused at once when the deadline comes before the token; the queue is left.
        let soon = Instant::now() + Duration::from_millis(1);
        assert_eq!(
            budget.acquire(Background, soon).await,
            Err(Refused::Deadline)
        );
        assert_eq!(budget.lock().waiting(Background), 0);
    }
}
