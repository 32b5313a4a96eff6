//! In-process emulators of provider backends.
//!
//! Plugins are tested against these instead of real clouds: they run on 127.0.0.1 in
//! the test process, start in milliseconds, and have a control surface to force the
//! states, faults and delays that a real backend only shows by accident.

pub mod control;
pub mod framework;
pub mod time;

/// The mark keys of the provider contract (the guest SDK and the host define the same
/// constants; emulators use them to plant instances as a plugin would).
pub const MARK_MANAGED: &str = "egress.proxy-operator.dev/managed";
pub const MARK_MANAGED_YES: &str = "true";
pub const MARK_UID: &str = "egress.proxy-operator.dev/uid";
pub const MARK_INSTALLATION: &str = "egress.proxy-operator.dev/installation";
pub mod digitalocean;
pub mod ec2;
pub mod echo;
pub mod example;
pub mod gce;
pub mod hetzner;
pub mod linode;
pub mod rate_limit;
pub mod real_proxy;
pub mod scaleway;
mod server;
pub mod vultr;
