//! `proxy-operator conformance`: the provider conformance suite, one provider against an
//! emulator of its backend.

use super::args::TargetArgs;
use proxy_operator::conformance::{self, Control, Options, Subject};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The providers file (YAML) whose entry points the plugin at the emulator.
    #[arg(long, alias = "config")]
    providers: PathBuf,
    /// The provider entry to test.
    #[arg(long)]
    provider: String,
    /// The emulator's base URL (its control surface lives under `/_emulator/`).
    #[arg(long)]
    emulator: String,
    #[command(flatten)]
    target: TargetArgs,
    /// Run only the cases whose name contains this (repeatable).
    #[arg(long)]
    only: Vec<String>,
    /// How long to wait for the backend to move (running, gone).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// List the cases and exit.
    #[arg(long)]
    list: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.list {
        for name in conformance::case_names() {
            println!("{name}");
        }
        return Ok(());
    }
    let control = Control::new(&args.emulator)?;
    // Against an emulator, far faster than a real backend allows: the shipped plugins'
    // default budgets are off (a `budget` in the entry still applies).
    let p = super::load::provider(
        &args.providers,
        &args.provider,
        &args.target.plugin_dir,
        &args.target.runtime,
        false,
    )
    .await?;
    let mut opts = Options::new(args.target.placement.clone());
    opts.only = args.only;
    opts.wait = args.wait;
    println!(
        "conformance: provider {} ({} {}) against {}",
        p.name(),
        p.info().type_name,
        p.info().version,
        args.emulator
    );
    let report = conformance::run(&Subject::wasm(&p), &control, &opts, |r| println!("{r}")).await;
    println!("{}", report.total());
    anyhow::ensure!(
        report.passed(),
        "{} conformance case(s) failed",
        report.failed().len()
    );
    Ok(())
}
