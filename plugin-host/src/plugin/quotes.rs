//! The plugin's `quote` answers, kept per placement for an hour.
//!
//! Why a cache: a price is asked for every Proxy that goes Running, and a pool of a
//! thousand Proxies has one placement; prices change on the scale of days. Each quote is a
//! backend request that costs request budget like any other, so one per placement per hour
//! is what the budget pays. A failed quote is kept as "no price" for the same hour: the
//! reconciler asks on every pass of a running Proxy without a price, and a plugin whose
//! quote keeps failing must not cost a plugin call each time.

use crate::provider::{Capacity, Placement, Price};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an answer (a price, or "none published") is used.
pub const TTL: Duration = Duration::from_secs(3600);
/// Placements kept at once: a provider's pools rarely name more than a few dozen, and a
/// hostile spec naming thousands of machine types must not grow the operator's memory.
pub const MAX_ENTRIES: usize = 1024;

type Key = (String, String, String, String, Capacity);

/// `placement -> (answer, when)`.
#[derive(Default)]
pub struct QuoteCache {
    entries: HashMap<Key, (Option<Price>, Instant)>,
}

fn key(p: &Placement) -> Key {
    (
        p.region.clone(),
        p.zone.clone(),
        p.machine_type.clone(),
        p.image.clone(),
        p.capacity,
    )
}

impl QuoteCache {
    /// The answer for `placement` if one younger than [`TTL`] is kept.
    pub fn get(&self, placement: &Placement, now: Instant) -> Option<Option<Price>> {
        self.entries
            .get(&key(placement))
            .filter(|(_, at)| now.saturating_duration_since(*at) < TTL)
            .map(|(price, _)| price.clone())
    }

    /// Keeps an answer. When full, expired answers go first; if none has expired the
    /// answer is not kept (asked again next time) rather than evicting a fresh one.
    pub fn put(&mut self, placement: &Placement, price: Option<Price>, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < TTL);
        }
        if self.entries.len() < MAX_ENTRIES || self.entries.contains_key(&key(placement)) {
            self.entries.insert(key(placement), (price, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(m: u64) -> Option<Price> {
        Some(Price {
            currency: "EUR".into(),
            micros_per_hour: m,
        })
    }

    #[test]
    fn answers_are_kept_an_hour_and_the_cache_stays_bounded() {
        let t0 = Instant::now();
        let mut c = QuoteCache::default();
        let a = Placement::new("fsn1", "", "cx22", "debian");
        let spot = Placement {
            capacity: Capacity::Spot,
            ..a.clone()
        };
        c.put(&a, price(5), t0);
        c.put(&spot, None, t0);
        assert_eq!(c.get(&a, t0 + TTL / 2), Some(price(5)));
        assert_eq!(
            c.get(&spot, t0),
            Some(None),
            "'none published' is an answer too"
        );
        assert_eq!(c.get(&a, t0 + TTL), None, "expired");

        for i in 0..MAX_ENTRIES * 2 {
            c.put(
                &Placement::new("r", "", &format!("m{i}"), "i"),
                price(1),
                t0,
            );
        }
        assert_eq!(c.entries.len(), MAX_ENTRIES);
        // Once they expire, new answers take their place.
        let later = t0 + TTL;
        c.put(&Placement::new("r", "", "fresh", "i"), price(2), later);
        assert_eq!(c.entries.len(), 1);
    }
}
