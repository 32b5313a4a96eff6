//! The Proxy reconciler.
//!
//! Decisions are pure ([`decide()`], [`spec_hash()`], [`status::apply`]) and table-tested;
//! the Kubernetes and provider calls live in a thin shell around them.

pub mod decide;
pub mod events;
pub mod input;
pub mod proxy_auth;
pub mod secret_cache;
pub mod secrets;
mod spec_hash;
pub mod status;
pub mod template;
pub mod turns;

pub use decide::{Answer, Call, Decision, Input, Next, Observed, Timings, decide};
pub use spec_hash::{keyed as keyed_spec_hash, spec_hash};
mod bounds;
mod context;
mod pricing;
mod reconcile;
mod wiring;
pub(crate) use bounds::{CONDITION_MESSAGE_MAX, EVENT_NOTE_MAX, truncate};

pub use context::{
    Context, FIELD_MANAGER, FINALIZER, HealthHook, ReconcileError, ReconcileMetrics, Settings,
};
pub use reconcile::{observe, reconcile};
pub use wiring::{backoff, run};
