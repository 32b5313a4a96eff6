//! The egress proxy operator: keeps forward proxies running on disposable cloud instances,
//! with every cloud backend a sandboxed WebAssembly plugin.

pub mod api;
pub mod cache;
pub mod conformance;
pub mod controller;
pub mod discovery;
pub mod endpoints;
pub mod gc;
pub mod http_server;
pub mod installation;
pub mod inventory;
pub mod leader;
pub mod metrics;
pub mod pool;
pub mod probe;
pub mod provider_check;
pub mod rbac;
pub mod registry;
pub mod reload;

pub mod telemetry;
/// Test support (fakes, a span recorder, a headless-browser driver): for tests and the
/// demo only, behind the `test-support` feature, so the operator never ships it.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
