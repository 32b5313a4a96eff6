//! `proxy-operator provider lifecycle`: one instance's whole life against any endpoint, real
//! cloud included, with cleanup.

use crate::cli::args::TargetArgs;
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
    println!(
        "lifecycle: provider {} ({} {}), uid {}",
        p.name(),
        p.info().type_name,
        p.info().version,
        opts.uid
    );
    match lifecycle::run(&p, &opts, |s| println!("{s}")).await {
        Ok(_) => {}
        Err(lifecycle::LifecycleError::Step {
            step,
            message,
            cleanup,
        }) => {
            println!("FAIL  {step}: {message}");
            println!("      cleanup: {cleanup}");
            anyhow::bail!("lifecycle failed at {step}");
        }
        Err(e) => {
            println!("FAIL  {e}");
            anyhow::bail!("lifecycle failed: {e}");
        }
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
