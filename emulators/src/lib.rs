//! In-process emulators of provider backends.
//!
//! Plugins are tested against these instead of real clouds: they run on 127.0.0.1 in
//! the test process, start in milliseconds, and have a control surface to force the
//! states, faults and delays that a real backend only shows by accident.

pub mod control;
pub mod framework;
pub mod time;

/// The mark keys of the provider contract, from the crate the operator and the guest SDK
/// use: emulators plant instances with them as a plugin would.
pub use egress_contract::{
    MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_PREFIX, MARK_UID,
};
pub mod digitalocean;
pub mod ec2;
pub mod echo;
pub mod example;
pub mod gce;
pub mod hetzner;
pub mod linode;
pub mod proxmox;
pub mod rate_limit;
pub mod real_proxy;
pub mod scaleway;
mod server;
pub mod tls;
pub mod vultr;
