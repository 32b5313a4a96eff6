//! Which calls go first when a provider's request budget is short.
//!
//! Every call of the [`Provider`](super::Provider) trait carries its priority as an argument
//! (`get_at(id, priority)`); the plain methods (`get(id)`) use the operation's default
//! ([`Priority::of_op`]). The plugin runtime orders the wait for a call slot and for the
//! request budget by it.
//!
//! ```ignore
//! // A Running Proxy's drift check waits behind creates and transitions.
//! let inst = provider.get_at(&id, Priority::Background).await?;
//! ```

use super::Op;

/// A call's place in the queue for its provider's request budget. Ordered: `Urgent` is the
/// smallest, so it sorts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A create or delete of a user's Proxy.
    Urgent,
    /// Proxies in transition: provisioning, replacing, deleting.
    Transition,
    /// Drift checks, GC lists, provider checks: waits while anything else is short.
    Background,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Transition, Priority::Background];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Transition => "transition",
            Priority::Background => "background",
        }
    }

    /// The default of a plain call: create and delete are a user's change
    /// (Urgent), `get` usually follows a Proxy in transition, `list-by-tag` and `check` are
    /// background work. Load-time calls wait in neither queue: they run on the runtime's
    /// own load slot, never a provider's call slots, and make no requests
    /// (`validate-config` may not dial). All `Background`, they take that slot in arrival
    /// order.
    pub fn of_op(op: Op) -> Priority {
        match op {
            Op::Create | Op::Delete => Priority::Urgent,
            Op::Get => Priority::Transition,
            Op::List | Op::Check | Op::Quote | Op::Load => Priority::Background,
        }
    }
}

/// How a provider's call slots and request tokens are shared among the priority classes
/// that are waiting: Urgent 5, Transition 3, Background 2 (half, three tenths and a fifth
/// of the grants while all three wait; a class alone takes everything).
///
/// Strict priority starved the lower classes: during a rollout of thousands of Proxies the
/// creates took every slot and token, so the Gets confirming created instances, the
/// inventory's lists and the provider checks waited until the last create was sent (issue
/// 29: the first list of a 300-Proxy rollout took 390 s, every check timed out). A share
/// bounds each class's wait by its weight, whatever the backlog of the others.
pub const WEIGHTS: [(Priority, u64); 3] = [
    (Priority::Urgent, 5),
    (Priority::Transition, 3),
    (Priority::Background, 2),
];

/// The guaranteed share of a class: its weight over the sum, what it gets at least while
/// every class waits.
pub fn guaranteed_share(p: Priority) -> f64 {
    let total: u64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    WEIGHTS
        .iter()
        .find(|(c, _)| *c == p)
        .map_or(0.0, |(_, w)| *w as f64 / total as f64)
}

/// The keys of class `p` in a queue ordered by `(priority, arrival)`: the range to look up
/// whether it waits and who is its first.
pub fn class_keys(p: Priority) -> std::ops::RangeInclusive<(Priority, u64)> {
    (p, 0)..=(p, u64::MAX)
}

/// Stride scheduling over the classes (Waldspurger and Weihl, 1995): pure, no time. Each
/// class has a pass; the waiting class of the lowest pass is served next (ties go to the
/// higher priority) and its pass advances by its stride, the inverse of its weight. A class
/// that was not waiting rejoins at the current pass, so idling banks no credit: it cannot
/// take a run of grants when it comes back.
#[derive(Debug, Clone, Default)]
pub struct Shares {
    pass: [u64; 3],
    /// The pass of the last class served: where a class rejoins.
    now: u64,
}

impl Shares {
    /// The stride of a class: `STRIDE_UNIT / weight`.
    const STRIDE_UNIT: u64 = 30;

    fn index(p: Priority) -> usize {
        p as usize
    }

    fn stride(p: Priority) -> u64 {
        let w = WEIGHTS.iter().find(|(c, _)| *c == p).map_or(1, |(_, w)| *w);
        Self::STRIDE_UNIT / w
    }

    fn effective(&self, p: Priority) -> u64 {
        self.pass[Self::index(p)].max(self.now)
    }

    /// The class served next among those `waiting`, or `None` when none waits. Changes
    /// nothing: call [`Shares::charge`] once it is served.
    pub fn next(&self, waiting: impl Fn(Priority) -> bool) -> Option<Priority> {
        Priority::ALL
            .into_iter()
            .filter(|p| waiting(*p))
            .min_by_key(|p| (self.effective(*p), *p))
    }

    /// Counts one grant to `p`.
    pub fn charge(&mut self, p: Priority) {
        let base = self.effective(p);
        self.now = base;
        self.pass[Self::index(p)] = base + Self::stride(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_has_its_default() {
        let cases = [
            (Op::Create, Priority::Urgent),
            (Op::Delete, Priority::Urgent),
            (Op::Get, Priority::Transition),
            (Op::List, Priority::Background),
            (Op::Check, Priority::Background),
            (Op::Quote, Priority::Background),
            (Op::Load, Priority::Background),
        ];
        for (op, want) in cases {
            assert_eq!(Priority::of_op(op), want, "{op}");
        }
        assert!(
            Priority::Urgent < Priority::Transition && Priority::Transition < Priority::Background
        );
    }

    /// Serves `n` grants with the given classes always waiting; counts per class.
    fn serve(shares: &mut Shares, waiting: &[Priority], n: usize) -> Vec<Priority> {
        (0..n)
            .map(|_| {
                let p = shares.next(|p| waiting.contains(&p)).unwrap();
                shares.charge(p);
                p
            })
            .collect()
    }

    fn count(order: &[Priority], p: Priority) -> usize {
        order.iter().filter(|x| **x == p).count()
    }

    #[test]
    fn every_waiting_class_gets_its_share_whatever_the_backlog() {
        use Priority::*;
        let cases: &[(&[Priority], [usize; 3])] = &[
            (&[Urgent, Transition, Background], [50, 30, 20]),
            (&[Urgent, Background], [71, 0, 29]),
            (&[Transition, Background], [0, 60, 40]),
            (&[Urgent], [100, 0, 0]),
            (&[Background], [0, 0, 100]),
        ];
        for (waiting, want) in cases {
            let mut shares = Shares::default();
            let order = serve(&mut shares, waiting, 100);
            let got = [
                count(&order, Urgent),
                count(&order, Transition),
                count(&order, Background),
            ];
            for i in 0..3 {
                assert!(
                    got[i].abs_diff(want[i]) <= 1,
                    "{waiting:?}: got {got:?}, want about {want:?}"
                );
            }
        }
        assert_eq!(guaranteed_share(Priority::Background), 0.2);
    }

    #[test]
    fn a_lower_class_waits_a_bounded_number_of_grants() {
        // With every class waiting, Background is served at least once in every 6 grants: its
        // stride (15) spans at most 3 of Urgent's (6) and 2 of Transition's (10).
        let mut shares = Shares::default();
        let order = serve(&mut shares, &Priority::ALL, 1000);
        let mut gap = 0;
        let mut worst = 0;
        for p in order {
            gap = if p == Priority::Background {
                0
            } else {
                gap + 1
            };
            worst = worst.max(gap);
        }
        assert!(worst <= 5, "Background waited {worst} grants in a row");
    }

    #[test]
    fn a_class_coming_back_banks_no_credit() {
        use Priority::*;
        let mut shares = Shares::default();
        // Urgent alone for a long time...
        serve(&mut shares, &[Urgent], 1000);
        // ...then Background joins: it gets its share from now on, not 1000 grants in a row.
        let order = serve(&mut shares, &[Urgent, Background], 14);
        assert_eq!(
            order[0], Background,
            "the newcomer is served at once: {order:?}"
        );
        assert!(count(&order, Background) <= 5, "{order:?}");
        assert!(count(&order, Urgent) >= 9, "{order:?}");
        // Ties go to the higher priority.
        let fresh = Shares::default();
        assert_eq!(fresh.next(|_| true), Some(Urgent));
        assert_eq!(fresh.next(|_| false), None);
    }
}
