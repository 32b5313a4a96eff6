//! In-process emulators of provider backends.
//!
//! Plugins are tested against these instead of real clouds: they run on 127.0.0.1 in
//! the test process, start in milliseconds, and have a control surface to force the
//! states, faults and delays that a real backend only shows by accident.

/// The Rust side of the control surface every emulator serves, for the conformance suite.
pub mod control;
/// What every emulator of a cloud API shares; a new one writes only its routes and wire types.
pub mod framework;
/// Timestamps as the emulated backends write them.
pub mod time;

/// The mark keys of the provider contract, from the crate the operator and the guest SDK
/// use: emulators plant instances with them as a plugin would.
pub use egress_contract::{
    MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_PREFIX, MARK_UID,
};
/// Azure Resource Manager (VMs, NICs, public IPs), Entra ID tokens and Retail Prices, per spec.
pub mod azure;
/// DigitalOcean API v2 (Droplets), from the vendor's published OpenAPI specification.
pub mod digitalocean;
/// AWS EC2 Query API (2016-11-15), close enough on the wire for the real SDK's requests.
pub mod ec2;
/// The egress echo: answers with the caller's IP, as a cloud's check-IP service does.
pub mod echo;
/// The example backend the guide's plugin is written against.
pub mod example;
/// Google Compute Engine API v1 (VM instances), and where access tokens come from.
pub mod gce;
/// Hetzner Cloud API v1, close enough on the wire for the plugin's requests.
pub mod hetzner;
/// Linode API v4 (`/v4/linode/instances`), from Akamai's published OpenAPI specification.
pub mod linode;
/// OCI distribution registry (pull side, Distribution Spec v1.1), for `oci://` plugin pulls.
pub mod oci_registry;
/// Proxmox VE API (`/api2/json`) for QEMU VMs, after the API viewer's schema.
pub mod proxmox;
/// The token bucket behind an emulator's optional rate limit ([`RateLimit`]).
pub mod rate_limit;
/// Real-proxy mode: every running emulated instance is a real forward proxy on 127.0.0.1.
pub mod real_proxy;
/// Scaleway Instances API (`/instance/v1/zones/{zone}/...`).
pub mod scaleway;
mod server;
/// HTTPS for emulators of private backends.
pub mod tls;
/// Vultr API v2 instances endpoints, as the published reference describes them.
pub mod vultr;
