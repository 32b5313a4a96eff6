//! Serves one backend emulator on 127.0.0.1 until Ctrl-C, for trying a plugin or running
//! `proxy-operator conformance` by hand:
//!
//! ```sh
//! cargo run -p egress-emulators --example emulator -- hetzner   # or: ec2
//! ```
//!
//! It prints the base URL (the API and the `/_emulator/` control surface) and the
//! credentials it accepts.

use egress_emulators::ec2::{EXAMPLE_ACCESS_KEY, EXAMPLE_SECRET_KEY, Ec2Config, Ec2Emulator};
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};

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
        "hetzner" => {
            let e = HetznerEmulator::start(HetznerConfig::new(HETZNER_TOKEN));
            println!("Hetzner emulator at {} (API under /v1)", e.url());
            println!("token: {HETZNER_TOKEN}");
            Box::new(e)
        }
        other => {
            eprintln!("usage: emulator ec2|hetzner (got {other:?})");
            std::process::exit(2);
        }
    };
    println!("control surface under /_emulator/; Ctrl-C stops it");
    // The emulator runs on its own thread; this one only waits to be interrupted.
    loop {
        std::thread::park();
    }
}
