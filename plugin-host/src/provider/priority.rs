//! Which calls go first when a provider's request budget is short.
//!
//! The [`Provider`](super::Provider) trait carries no priority: a caller that knows better
//! than the operation's default wraps its call in [`scope`], and the plugin runtime reads
//! it when the call starts ([`current`]), in the caller's task. Without a scope a call gets
//! its operation's default ([`Priority::of_op`]).
//!
//! ```ignore
//! use crate::provider::priority::{self, Priority};
//! // A Proxy being replaced: its `get` goes before drift checks.
//! let inst = priority::scope(Priority::Transition, provider.get(&id)).await?;
//! ```

use super::Op;
use std::future::Future;

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

    /// The default when no [`scope`] is set: create and delete are a user's change
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

tokio::task_local! {
    static PRIORITY: Priority;
}

/// Runs `fut` with every provider call it makes at `priority` (unless an inner scope says
/// otherwise). The reconciler sets it per Proxy (e.g. `Background` for the drift `get` of
/// a Running Proxy), the GC and the provider health monitor set `Background`.
pub async fn scope<F: Future>(priority: Priority, fut: F) -> F::Output {
    PRIORITY.scope(priority, fut).await
}

/// The priority set by the innermost [`scope`] around the current task, if any.
pub fn current() -> Option<Priority> {
    PRIORITY.try_with(|p| *p).ok()
}

/// The priority of a call of `op` made here: the scope's, or the operation's default.
pub fn for_call(op: Op) -> Priority {
    current().unwrap_or_else(|| Priority::of_op(op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn scope_overrides_the_default_and_nests() {
        assert_eq!(for_call(Op::Get), Priority::Transition);
        assert_eq!(for_call(Op::Create), Priority::Urgent);
        assert_eq!(for_call(Op::List), Priority::Background);
        assert_eq!(for_call(Op::Check), Priority::Background);
        scope(Priority::Background, async {
            assert_eq!(for_call(Op::Get), Priority::Background);
            scope(Priority::Urgent, async {
                assert_eq!(for_call(Op::List), Priority::Urgent);
            })
            .await;
            assert_eq!(current(), Some(Priority::Background));
        })
        .await;
        assert_eq!(current(), None);
    }
}
