//! The egress proxy operator: keeps forward proxies running on disposable cloud instances,
//! with every cloud backend a sandboxed WebAssembly plugin.

pub mod api;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod installation;
pub mod plugin;
pub mod provider;
pub mod registry;
pub mod telemetry;
pub mod testing;
