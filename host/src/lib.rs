//! The egress proxy operator: keeps forward proxies running on disposable cloud instances,
//! with every cloud backend a sandboxed WebAssembly plugin.

pub mod config;
pub mod conformance;
pub mod health;
pub mod plugin;
pub mod provider;
pub mod provider_health;
pub mod reload;
pub mod telemetry;
pub mod testing;
