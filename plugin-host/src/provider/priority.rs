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
}
