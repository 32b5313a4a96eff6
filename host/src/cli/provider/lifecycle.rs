//! `proxy-operator provider lifecycle`: one instance's whole life against any endpoint, real
//! cloud included, with cleanup.

use crate::cli::args::TargetArgs;
use egress_plugin_host::provider::name_from_uid;
use proxy_operator::conformance::{Control, lifecycle};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The providers file (YAML).
    #[arg(long, alias = "providers")]
    config: PathBuf,
    /// The provider entry to use.
    #[arg(long)]
    provider: String,
    #[command(flatten)]
    target: TargetArgs,
    /// Pause between two Gets while waiting.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// How long to wait for Running, and again for NotFound.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// The installation identity to create and list under.
    #[arg(long, default_value = "egress-lifecycle-test")]
    installation: String,
    /// An emulator's base URL: also check its dump for anything left behind.
    #[arg(long)]
    emulator: Option<String>,
    /// The UID to create for (the instance's name derives from it). Give the one a failed
    /// run printed to repeat it: its create adopts, and its cleanup deletes, an instance
    /// that run left. Default: a fresh one.
    #[arg(long, value_parser = parse_uid)]
    uid: Option<String>,
}

/// A UID the operator could have given: not empty, printable, no spaces.
fn parse_uid(s: &str) -> Result<String, String> {
    match s.is_empty() || s.len() > 128 || !s.chars().all(|c| c.is_ascii_graphic()) {
        true => Err(format!(
            "--uid {s:?}: want 1-128 printable ASCII characters without spaces, e.g. the uid a \
             failed run printed"
        )),
        false => Ok(s.to_string()),
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let control = args.emulator.as_deref().map(Control::new).transpose()?;
    let p = crate::cli::load::provider(
        &args.config,
        &args.provider,
        &args.target.plugin_dir,
        &args.target.runtime,
        true,
    )
    .await?;
    let mut opts = lifecycle::LifecycleOptions::new(args.target.placement.clone());
    opts.poll = args.poll;
    opts.wait = args.wait;
    opts.installation = args.installation;
    if let Some(uid) = args.uid {
        opts.uid = uid;
    }
    println!(
        "lifecycle: provider {} ({} {}), uid {}",
        p.name(),
        p.info().type_name,
        p.info().version,
        opts.uid
    );
    let failed = match lifecycle::run(&p, &opts, |s| println!("{s}")).await {
        Ok(_) => None,
        Err(lifecycle::LifecycleError::Step {
            step,
            message,
            cleanup,
        }) => {
            println!("FAIL  {step}: {message}");
            println!("      cleanup: {cleanup}");
            Some(format!("lifecycle failed at {step}"))
        }
        Err(e) => {
            println!("FAIL  {e}");
            Some(format!("lifecycle failed: {e}"))
        }
    };
    if let Some(failed) = failed {
        // The emulator knows every instance by name, also one ListByTag does not list.
        let name = name_from_uid(&opts.uid);
        if let Some(control) = control {
            let dump = control.dump().await?;
            let left: Vec<String> = dump
                .instances
                .iter()
                .filter(|i| i.name == name)
                .map(|i| format!("{} in {}", i.id, i.scope))
                .collect();
            match left.is_empty() {
                true => println!("      emulator holds no instance named {name}"),
                false => println!(
                    "      emulator still holds {name}: {} (repeat with --uid {})",
                    left.join(", "),
                    opts.uid
                ),
            }
        }
        anyhow::bail!("{failed} (uid {})", opts.uid);
    }
    if let Some(control) = control {
        let dump = control.dump().await?;
        anyhow::ensure!(
            dump.instances.is_empty() && dump.secondary.is_empty(),
            "the emulator still holds {} instance(s) and {} secondary resource(s): {dump:?}",
            dump.instances.len(),
            dump.secondary.len()
        );
        println!("ok    emulator holds nothing");
    }
    println!("lifecycle passed");
    Ok(())
}
