//! Error codes the operator acts on, which every plugin must spell the same way.
//!
//! A plugin's error class says how to retry; these codes say what happened, where the
//! operator does something particular about it. Written once here: a plugin that spelled
//! one differently would have its spot refusals retried forever instead of falling back,
//! and its reclaimed instances reported as lost.

/// QuotaExceeded: the backend has no spot capacity for this create now. A ProxyPool's spot
/// placement backs off and its `fallback` placement fills in.
pub const SPOT_CAPACITY_UNAVAILABLE: &str = "SpotCapacityUnavailable";
/// NotFound from `get`: the backend reclaimed the (spot) instance and has removed it. The
/// Proxy is replaced and the event says `Interrupted`, not `InstanceLost`.
pub const INTERRUPTED: &str = "Interrupted";
/// Permanent: the request asks for something this plugin cannot give (an IPv6 address, spot
/// capacity), refused before anything is made.
pub const UNSUPPORTED: &str = "Unsupported";
