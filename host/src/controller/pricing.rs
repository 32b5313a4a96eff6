//! Prices for Proxy status without a reconcile waiting on a plugin call.
//!
//! Why: a running Proxy's `hourlyPrice` comes from the providers file's `prices` or the
//! plugin's `quote`. A quote is a plugin call at background priority; awaited inside the
//! reconcile, it held one of the reconciler's few turns behind every create of a rollout,
//! and a thousand Proxies turning Running at once asked the same placement's price a
//! thousand times before the first answer was kept. So the reconcile reads only what is
//! already known ([`Provider::known_price`], no call) and, when nothing is, asks for it
//! here: one quote per provider and placement at a time, whoever else needs it waiting
//! on that one, each of them reconciled again once it brings a price.
//!
//! Bounds: at most [`MAX_ASKING`] placements asked at once (beyond, the Proxy simply has
//! no price until a later reconcile asks again) and each Proxy waits at most once per
//! placement, so the waiters are bounded by the Proxies that exist.

use crate::api::Proxy;
use egress_plugin_host::provider::{Placement, Provider};
use kube::runtime::reflector::ObjectRef;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{Instrument, debug};

/// Placements whose quote may be under way at once.
pub const MAX_ASKING: usize = 256;

type Key = (String, Placement);

/// The quotes under way and who waits on each.
#[derive(Default)]
pub struct Pricing {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    asking: HashMap<Key, HashSet<ObjectRef<Proxy>>>,
    /// Where a Proxy whose price arrived is sent to be reconciled again; set while a
    /// controller runs (see [`Pricing::attach`]).
    wake: Option<UnboundedSender<ObjectRef<Proxy>>>,
}

/// What [`Pricing::join`] decided.
#[derive(Debug, PartialEq, Eq)]
enum Joined {
    /// The first to ask: the caller starts the quote.
    Start,
    /// A quote for the placement is under way; the Proxy is woken with it.
    Waiting,
    /// Too many placements asked at once: no quote now.
    Full,
}

impl Pricing {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream of Proxies to reconcile because their price arrived. A new call replaces
    /// the previous stream (a controller restarted after a lost lease).
    pub fn attach(&self) -> tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Proxy>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.lock().wake = Some(tx);
        rx
    }

    fn join(&self, key: &Key, proxy: ObjectRef<Proxy>) -> Joined {
        let mut state = self.lock();
        if let Some(waiting) = state.asking.get_mut(key) {
            waiting.insert(proxy);
            return Joined::Waiting;
        }
        if state.asking.len() >= MAX_ASKING {
            return Joined::Full;
        }
        state.asking.insert(key.clone(), HashSet::from([proxy]));
        Joined::Start
    }

    /// The quote for `key` ended: who waited on it, to wake if it found a price.
    fn finish(
        &self,
        key: &Key,
    ) -> (
        Vec<ObjectRef<Proxy>>,
        Option<UnboundedSender<ObjectRef<Proxy>>>,
    ) {
        let mut state = self.lock();
        let waiting = state.asking.remove(key).unwrap_or_default();
        (waiting.into_iter().collect(), state.wake.clone())
    }

    /// Asks `provider_name`'s price of `placement` in the background, unless it is being
    /// asked already, and reconciles `proxy` again when a price comes back. A quote that
    /// finds none (or fails: the provider keeps that as "none" for a while) wakes nobody,
    /// or each reconcile would ask again at once.
    pub fn ask(
        self: &Arc<Self>,
        provider_name: &str,
        provider: Arc<dyn Provider>,
        placement: Placement,
        proxy: ObjectRef<Proxy>,
    ) {
        let key = (provider_name.to_string(), placement);
        if self.join(&key, proxy) != Joined::Start {
            return;
        }
        let this = self.clone();
        let span = tracing::debug_span!("quote", provider.name = provider_name);
        tokio::spawn(
            async move {
                let found = match provider.quote(&key.1).await {
                    Ok(p) => p.is_some(),
                    Err(e) => {
                        debug!(error = %e, "no price for the placement");
                        false
                    }
                };
                let (waiting, wake) = this.finish(&key);
                if let (true, Some(wake)) = (found, wake) {
                    for proxy in waiting {
                        let _ = wake.send(proxy);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Placements being asked now (for tests).
    #[cfg(test)]
    fn asking(&self) -> usize {
        self.lock().asking.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_provider::FakeProvider;
    use egress_plugin_host::provider::Price;
    use std::time::Duration;

    fn proxy(name: &str) -> ObjectRef<Proxy> {
        ObjectRef::new(name).within("default")
    }

    #[test]
    fn one_quote_per_placement_at_a_time_and_the_placements_are_bounded() {
        let p = Pricing::default();
        let a = ("ex".to_string(), Placement::new("r1", "", "small", "img"));
        assert_eq!(p.join(&a, proxy("p1")), Joined::Start);
        assert_eq!(p.join(&a, proxy("p2")), Joined::Waiting);
        assert_eq!(p.join(&a, proxy("p2")), Joined::Waiting, "counted once");
        let other_provider = ("ex2".to_string(), a.1.clone());
        assert_eq!(p.join(&other_provider, proxy("p1")), Joined::Start);
        let (waiting, _) = p.finish(&a);
        assert_eq!(waiting.len(), 2);
        assert_eq!(
            p.join(&a, proxy("p3")),
            Joined::Start,
            "asked again once over"
        );

        for i in 0..MAX_ASKING * 2 {
            let k = (
                "ex".to_string(),
                Placement::new("r", "", &format!("m{i}"), "i"),
            );
            p.join(&k, proxy("p"));
        }
        assert_eq!(p.asking(), MAX_ASKING);
        let k = ("ex".to_string(), Placement::new("r", "", "one-more", "i"));
        assert_eq!(p.join(&k, proxy("p")), Joined::Full);
    }

    /// Many Proxies of one placement: one quote, every one of them woken when the price
    /// comes; a placement without a price wakes nobody.
    #[tokio::test]
    async fn waiters_are_woken_once_the_price_arrives() {
        let pricing = Arc::new(Pricing::default());
        let mut woken = pricing.attach();
        let fake = Arc::new(FakeProvider::new("ex"));
        fake.set_quote(
            "z1",
            Price {
                currency: "EUR".into(),
                micros_per_hour: 11_000,
            },
        );
        fake.hold_quotes(true);
        let provider: Arc<dyn Provider> = fake.clone();
        let priced = Placement::new("r1", "z1", "small", "img");
        for name in ["p1", "p2", "p3"] {
            pricing.ask("ex", provider.clone(), priced.clone(), proxy(name));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        fake.hold_quotes(false);
        let mut got = Vec::new();
        for _ in 0..3 {
            let r = tokio::time::timeout(Duration::from_secs(5), woken.recv())
                .await
                .expect("woken")
                .expect("open");
            got.push(r.name);
        }
        got.sort();
        assert_eq!(got, ["p1", "p2", "p3"]);
        assert_eq!(fake.quote_calls(), 1, "one quote for three Proxies");

        pricing.ask(
            "ex",
            provider.clone(),
            Placement::new("r1", "z9", "small", "img"),
            proxy("p4"),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(woken.try_recv().is_err(), "no price, nobody woken");
        assert_eq!(pricing.asking(), 0);
    }
}
