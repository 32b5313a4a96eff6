//! `proxy-operator providers`: loads the providers of a providers file as the operator does
//! and reports on each, and on whether they fit the pod, before an admin deploys them.

use super::args::{FitArgs, RuntimeArgs, SourceArgs};
use anyhow::Context;
use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::config::fit::Mib;
use egress_plugin_host::plugin::{Runtime, WasmProvider};
use egress_plugin_host::provider::Provider;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: SourceArgs,
    /// Also run every provider's health check and print its targets.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    fit: FitArgs,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let SourceArgs {
        plugin_dir,
        providers,
    } = &args.source;
    let text = std::fs::read_to_string(providers)
        .with_context(|| format!("reading providers file {}", providers.display()))?;
    let file = ProvidersFile::parse(&text)?;
    let budget = args.fit.budget(&args.runtime);
    let fits = egress_plugin_host::config::fit::check(&file, &budget);
    match &fits {
        Ok(need) => {
            let of = |b: Option<u64>| {
                b.map_or("no limit known".into(), |b| format!("{} available", Mib(b)))
            };
            println!(
                "fit     memory {} ({}), /tmp {} ({})",
                Mib(need.memory.total()),
                of(budget
                    .memory_bytes
                    .map(|m| m.saturating_sub(budget.reserve_bytes))),
                Mib(need.scratch.total()),
                of(budget.scratch_bytes)
            );
        }
        Err(e) => println!("failed  {e}"),
    }
    let rt = Runtime::new(args.runtime.options_within(&file, &budget))?;
    let report = rt.load(plugin_dir, &file).await;
    for p in &report.providers {
        print_provider(p, args.check).await;
    }
    for e in &report.plugin_errors {
        println!("failed  {e}");
    }
    for e in &report.provider_errors {
        println!("failed  {e}");
    }
    if fits.is_err() {
        anyhow::bail!("the providers file does not fit the pod")
    } else if report.provider_errors.is_empty() && report.plugin_errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} provider(s) and {} plugin file(s) failed to load",
            report.provider_errors.len(),
            report.plugin_errors.len()
        )
    }
}

/// One loaded provider's line, and with `check` its health check's targets.
async fn print_provider(p: &WasmProvider, check: bool) {
    println!(
        "ok      {:<20} {} {} (hosts: {})",
        p.name(),
        p.info().type_name,
        p.info().version,
        p.allowed_hosts().join(", ")
    );
    if !check {
        return;
    }
    match p.check().await {
        None => println!("        check: unsupported"),
        Some(targets) => {
            for t in targets {
                println!(
                    "        {:<16} ready={} reason={} {}",
                    t.target, t.ready, t.reason, t.message
                );
            }
        }
    }
}
