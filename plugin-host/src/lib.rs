//! The provider plugin runtime: loads WebAssembly provider components and runs each call in a
//! sandbox of its own. It knows nothing of Kubernetes; the operator drives it through the
//! [`provider::Provider`] trait.
//!
//! Its modules stand in layers, each using only those below it (`xtask/src/layering.rs`
//! checks it): `fdlimit`, `policy` and `redact`; `sensitive`; `provider`; `rate`; `config`;
//! `plugin`.

/// The providers file, its limits, and their fit to the pod's resources.
pub mod config;
/// The open-file limit: raised at start, and the descriptors the providers may use.
pub mod fdlimit;
/// The wasmtime runtime: engine, compile and cache, loading, the per-call sandbox.
pub mod plugin;
/// Where a plugin may send requests: allow-list rules and the address checks.
pub mod policy;
/// The `Provider` trait the operator calls, its types and errors, and its metrics.
pub mod provider;
/// A provider's request budget: a token bucket with priorities, and what the backend said.
pub mod rate;
/// Scrubbing secrets, cloud-init and credentials out of text, in every encoding.
pub mod redact;
/// What is sensitive for each provider, bounded, and the redactor compiled from it.
pub mod sensitive;
