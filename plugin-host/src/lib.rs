//! The provider plugin runtime: loads WebAssembly provider components and runs each call in a
//! sandbox of its own. It knows nothing of Kubernetes; the operator drives it through the
//! [`provider::Provider`] trait.

/// The providers file, its limits, and their fit to the pod's resources.
pub mod config;
/// The open-file limit: raised at start, and the descriptors the providers may use.
pub mod fdlimit;
/// The wasmtime runtime: engine, compile and cache, loading, the per-call sandbox.
pub mod plugin;
/// The `Provider` trait the operator calls, its types and errors, and its metrics.
pub mod provider;
