//! Host bindings for `egress:provider@0.1.0`.
//!
//! Kept in a module of their own that rarely changes: regenerating them is the slow part of
//! an incremental build. A future WIT version gets its own module next to this one.

wasmtime::component::bindgen!({
    path: "../wit/v0.1.0",
    world: "provider-plugin",
    exports: { default: async },
});

/// The WIT package version this module binds.
pub const WORLD_VERSION: &str = "0.1.0";
