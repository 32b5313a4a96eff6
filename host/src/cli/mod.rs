//! The `proxy-operator` command line: one module per subcommand, each with its arguments
//! and its `run`; `args` holds the argument groups several of them share.

pub mod args;
pub mod conformance;
pub mod crds;
mod load;
pub mod openapi;
pub mod plugin;
pub mod provider;
pub mod providers;
pub mod rbac;
pub mod run;
