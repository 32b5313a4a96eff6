//! The plugin layer's integration tests, one binary so the operator links once: loading
//! and caching plugins, the conformance suite, each shipped provider against its emulator
//! (and EC2 against moto), the request budget, hot reload and the plugin author's guide.
//!
//! Run one part with a filter: `cargo test -p proxy-operator --features test-support --test
//! plugins provider_vultr::`.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod budget;
mod conformance;
mod example;
mod guide;
mod lifecycle_cleanup;
mod loading;
mod provider_azure;
mod provider_digitalocean;
mod provider_ec2;
mod provider_ec2_moto;
mod provider_gce;
mod provider_hetzner;
mod provider_linode;
mod provider_proxmox;
mod provider_scaleway;
mod provider_vultr;
mod reload;
mod tls;
mod versions;
