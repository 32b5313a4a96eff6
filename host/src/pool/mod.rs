//! The ProxyPool controller: keeps `replicas` Proxies like the pool's template, spread over
//! its placements, rotated by age, away from failing placements.
//!
//! It only creates and deletes Proxy objects (owned by the pool, labelled with its name) and
//! writes the pool's status; the Proxy reconciler does every provider call, under its
//! budget. The decisions are pure ([`plan::plan`]); this module reads the Proxy cache, acts,
//! and waits until the cache shows what it did before the next decision, so a second pass
//! never counts a Proxy it just created as missing.

pub mod plan;
mod reconcile;

pub use reconcile::{PoolSettings, run};

/// On a Proxy a pool created: the name of the placement it was created for.
pub const ANNOTATION_PLACEMENT: &str = "egress.proxy-operator.dev/placement";
