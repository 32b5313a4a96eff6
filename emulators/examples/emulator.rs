//! Serves one backend emulator on 127.0.0.1 until Ctrl-C, for trying a plugin or running
//! `proxy-operator conformance` by hand:
//!
//! ```sh
//! cargo run -p egress-emulators --example emulator -- hetzner   # or: azure, ec2, digitalocean, gce, proxmox, vultr, linode, scaleway
//! cargo run -p egress-emulators --example emulator -- example 8080
//! ```
//!
//! It prints the base URL (the API and the `/_emulator/` control surface) and the
//! credentials it accepts. The example backend (the one `docs/writing-a-provider.md`
//! writes a plugin for) takes an optional port, so a providers file can name it.

use egress_emulators::ec2::{EXAMPLE_ACCESS_KEY, EXAMPLE_SECRET_KEY, Ec2Config, Ec2Emulator};
use egress_emulators::example::{EMULATOR_TOKEN as EXAMPLE_TOKEN, ExampleBackend};
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_emulators::linode::{LinodeConfig, LinodeEmulator};
use egress_emulators::scaleway::{
    EMULATOR_PROJECT, EMULATOR_SECRET_KEY, ScalewayConfig, ScalewayEmulator,
};

const HETZNER_TOKEN: &str = "emulator-token";

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let _keep: Box<dyn std::any::Any> = match which.as_str() {
        "ec2" => {
            let e = Ec2Emulator::start(Ec2Config::default());
            println!("EC2 emulator at {} (regions us-east-1, eu-west-1)", e.url());
            println!("access key id: {EXAMPLE_ACCESS_KEY}");
            println!("secret access key: {EXAMPLE_SECRET_KEY}");
            Box::new(e)
        }
        "azure" => {
            use egress_emulators::azure::{
                AzureConfig, AzureEmulator, EMULATOR_CLIENT_ID, EMULATOR_CLIENT_SECRET,
                EMULATOR_FEDERATED_CLIENT_ID, EMULATOR_RESOURCE_GROUP, EMULATOR_SUBSCRIPTION,
                EMULATOR_TENANT,
            };
            let config = AzureConfig::default();
            let subnet = config.default_subnet();
            let e = AzureEmulator::start(config);
            println!(
                "Azure emulator at {} (ARM under /subscriptions, prices under /api/retail/prices)",
                e.url()
            );
            println!("token endpoint: {}", e.token_url());
            println!("tenant: {EMULATOR_TENANT}\nsubscription: {EMULATOR_SUBSCRIPTION}");
            println!("client id: {EMULATOR_CLIENT_ID}\nclient secret: {EMULATOR_CLIENT_SECRET}");
            println!("federated client id (any client_assertion): {EMULATOR_FEDERATED_CLIENT_ID}");
            println!("resource group: {EMULATOR_RESOURCE_GROUP} (westeurope)\nsubnet: {subnet}");
            Box::new(e)
        }
        "hetzner" => {
            let e = HetznerEmulator::start(HetznerConfig::new(HETZNER_TOKEN));
            println!("Hetzner emulator at {} (API under /v1)", e.url());
            println!("token: {HETZNER_TOKEN}");
            Box::new(e)
        }
        "linode" => {
            let e = LinodeEmulator::start(LinodeConfig::new(HETZNER_TOKEN));
            println!("Linode emulator at {} (API under /v4)", e.url());
            println!("token: {HETZNER_TOKEN}");
            Box::new(e)
        }
        "example" => {
            let port = match std::env::args().nth(2).map(|p| p.parse::<u16>()) {
                None => 0,
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    eprintln!("example: port: {e}");
                    std::process::exit(2);
                }
            };
            let e = ExampleBackend::start_on_port(EXAMPLE_TOKEN, port).unwrap_or_else(|e| {
                eprintln!("example: cannot listen on 127.0.0.1:{port}: {e}");
                std::process::exit(1);
            });
            println!("example backend at {} (API under /v1)", e.url());
            println!("token: {EXAMPLE_TOKEN}");
            Box::new(e)
        }
        "scaleway" => {
            let e = ScalewayEmulator::start(ScalewayConfig::new(EMULATOR_SECRET_KEY));
            println!("Scaleway emulator at {} (API under /instance/v1/zones/{{zone}})", e.url());
            println!("secret key: {EMULATOR_SECRET_KEY}\nproject id: {EMULATOR_PROJECT}");
            Box::new(e)
        }
        "vultr" => {
            use egress_emulators::vultr::{VultrConfig, VultrEmulator};
            let e = VultrEmulator::start(VultrConfig::new("emulator-token"));
            println!("Vultr emulator at {} (API under /v2)\ntoken: emulator-token", e.url());
            Box::new(e)
        }
        "digitalocean" => {
            use egress_emulators::digitalocean::{
                DigitalOceanConfig, DigitalOceanEmulator, EMULATOR_TOKEN,
            };
            let e = DigitalOceanEmulator::start(DigitalOceanConfig::new(EMULATOR_TOKEN));
            println!("DigitalOcean emulator at {} (API under /v2)", e.url());
            println!("token: {EMULATOR_TOKEN}");
            Box::new(e)
        }
        "gce" => {
            use egress_emulators::gce::{GceConfig, GceEmulator};
            let e = GceEmulator::start(GceConfig::default());
            // A throwaway test-only key (emulators/src/gce/test_keys.rs), for the
            // provider entry's serviceAccountKey secret; its token_uri is this emulator.
            let key =
                std::env::temp_dir().join(format!("gce-emulator-key-{}.json", std::process::id()));
            if let Err(err) = std::fs::write(&key, e.test_key_json()) {
                eprintln!("gce: cannot write {}: {err}", key.display());
                std::process::exit(1);
            }
            println!("GCE emulator at {} (API under /compute/v1, token endpoint /token)", e.url());
            println!("project: {}", egress_emulators::gce::EMULATOR_PROJECT);
            println!("service-account key (test-only): {}", key.display());
            Box::new(e)
        }
        "proxmox" => {
            use egress_emulators::proxmox::{
                EMULATOR_TOKEN_ID, EMULATOR_TOKEN_SECRET, ProxmoxConfig, ProxmoxEmulator,
            };
            let e = ProxmoxEmulator::start(ProxmoxConfig::default());
            println!("Proxmox VE emulator at {} (API under /api2/json)", e.url());
            println!("nodes: pve1, pve2; template: 9000 (debian-12-cloud, on pve1)");
            println!("token id: {EMULATOR_TOKEN_ID}\ntoken secret: {EMULATOR_TOKEN_SECRET}");
            Box::new(e)
        }
        other => {
            eprintln!(
                "usage: emulator azure|ec2|hetzner|example|digitalocean|gce|proxmox|vultr|linode|scaleway [PORT] (got {other:?})"
            );
            std::process::exit(2);
        }
    };
    println!("control surface under /_emulator/; Ctrl-C stops it");
    // The emulator runs on its own thread; this one only waits to be interrupted.
    loop {
        std::thread::park();
    }
}
