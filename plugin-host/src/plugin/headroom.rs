//! The pod's room that the fit leaves over, lent to providers for calls beyond their
//! `limits.concurrency`.
//!
//! The fit ([`crate::config::fit`]) counts every provider at `limits.concurrency` calls,
//! each at its limits in full, and what is left of the pod is idle. A provider whose
//! budget allows more calls than its own slots carry (ec2 at 20 requests a second needs
//! 11 slots for calls of half a second) may borrow from that rest: one more call at a time,
//! each only when the rest still holds that call's worst case (memory, `/tmp`,
//! descriptors, and an instance slot of the pool), given back when the call ends. So the
//! pod's worst case never grows past what the fit checked, whoever borrows, and a
//! provider's own slots never depend on another provider's borrowing.

use std::sync::{Mutex, Weak};

/// What one call may take of the pod at worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub memory: u64,
    pub scratch: u64,
    pub descriptors: u64,
}

/// What is left of the pod after the fit: `None` where the pod's size is not known (no
/// memory limit, no `/tmp` size, no open-file limit), which bounds nothing, as in the fit.
/// `instances` is always known: the pool's slots that no provider's own slots reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Room {
    pub memory: Option<u64>,
    pub scratch: Option<u64>,
    pub descriptors: Option<u64>,
    pub instances: u64,
}

#[derive(Default)]
struct Lent {
    memory: u64,
    scratch: u64,
    descriptors: u64,
    instances: u64,
}

/// The room, and what of it is lent now. Shared by the runtime's providers.
#[derive(Default)]
pub struct Headroom {
    state: Mutex<(Room, Lent)>,
    /// Slots that may wait for room, told when some comes back.
    borrowers: Mutex<Vec<Weak<super::slots::Slots>>>,
}

fn fits(room: Option<u64>, lent: u64, more: u64) -> bool {
    room.is_none_or(|r| lent.saturating_add(more) <= r)
}

impl Headroom {
    /// Sets the room, after a providers file is applied. What is lent stays lent; while it
    /// is more than the new room, nothing more is lent.
    pub fn set_room(&self, room: Room) {
        self.lock().0 = room;
        self.wake_borrowers();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Room, Lent)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lends `cost` and an instance slot if the room holds them all; all or nothing.
    pub fn take(&self, cost: &Cost) -> bool {
        let mut s = self.lock();
        let (room, lent) = &mut *s;
        let ok = fits(room.memory, lent.memory, cost.memory)
            && fits(room.scratch, lent.scratch, cost.scratch)
            && fits(room.descriptors, lent.descriptors, cost.descriptors)
            && lent.instances < room.instances;
        if ok {
            lent.memory += cost.memory;
            lent.scratch += cost.scratch;
            lent.descriptors += cost.descriptors;
            lent.instances += 1;
        }
        ok
    }

    /// Takes back what [`take`](Self::take) lent. The caller then calls
    /// [`wake_borrowers`](Self::wake_borrowers), outside its own locks.
    pub fn give(&self, cost: &Cost) {
        let mut s = self.lock();
        let lent = &mut s.1;
        lent.memory = lent.memory.saturating_sub(cost.memory);
        lent.scratch = lent.scratch.saturating_sub(cost.scratch);
        lent.descriptors = lent.descriptors.saturating_sub(cost.descriptors);
        lent.instances = lent.instances.saturating_sub(1);
    }

    /// Remembers `slots` as one that may borrow, to be told when room comes back.
    pub fn register(&self, slots: Weak<super::slots::Slots>) {
        let mut all = self.borrowers.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(slots);
    }

    /// Lets every borrower's waiting calls try the room again. Takes no lock of a
    /// [`Slots`](super::slots::Slots) while holding one of its own.
    pub fn wake_borrowers(&self) {
        let all: Vec<_> = self
            .borrowers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for slots in all {
            slots.lend_to_waiters();
        }
    }

    /// Calls lent now.
    pub fn lent_calls(&self) -> u64 {
        self.lock().1.instances
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Cost = Cost {
        memory: 10,
        scratch: 4,
        descriptors: 3,
    };

    #[test]
    fn lends_only_what_every_resource_still_holds() {
        // (room, calls lent before the next is refused)
        let cases = [
            (
                Room {
                    memory: Some(25),
                    scratch: None,
                    descriptors: None,
                    instances: 10,
                },
                2,
            ),
            (
                Room {
                    memory: None,
                    scratch: Some(12),
                    descriptors: None,
                    instances: 10,
                },
                3,
            ),
            (
                Room {
                    memory: None,
                    scratch: None,
                    descriptors: Some(7),
                    instances: 10,
                },
                2,
            ),
            (
                Room {
                    memory: None,
                    scratch: None,
                    descriptors: None,
                    instances: 4,
                },
                4,
            ),
            (
                Room {
                    memory: Some(0),
                    scratch: None,
                    descriptors: None,
                    instances: 4,
                },
                0,
            ),
        ];
        for (room, calls) in cases {
            let h = Headroom::default();
            h.set_room(room);
            for i in 0..calls {
                assert!(h.take(&C), "{room:?}: call {i}");
            }
            assert!(!h.take(&C), "{room:?}: one more than {calls}");
            assert_eq!(h.lent_calls(), calls, "{room:?}");
            if calls > 0 {
                h.give(&C);
                assert!(h.take(&C), "{room:?}: given back, lent again");
            }
        }
    }

    #[test]
    fn a_smaller_room_lends_nothing_until_enough_comes_back() {
        let h = Headroom::default();
        h.set_room(Room {
            memory: Some(30),
            instances: 8,
            ..Room::default()
        });
        for _ in 0..3 {
            assert!(h.take(&C));
        }
        h.set_room(Room {
            memory: Some(15),
            instances: 8,
            ..Room::default()
        });
        h.give(&C);
        assert!(!h.take(&C), "20 lent of 15");
        h.give(&C);
        assert!(!h.take(&C), "10 lent of 15: one more would be 20");
        h.give(&C);
        assert!(h.take(&C), "nothing lent: one fits in 15");
        assert!(!h.take(&C));
    }
}
